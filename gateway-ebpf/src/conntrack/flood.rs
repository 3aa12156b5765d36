//! The flood guard: how many new flows this CPU may record in a window
//! (`config::NEW_FLOW_LIMIT`).

use gateway_common::{config, Counter};

use crate::maps::{count, CONFIG, FLOOD};

/// The flood guard's window of coarse time `now` (`fwd::coarse_now`, 2^20 ns): units
/// of 2^30 ns, about a second.
#[inline(always)]
fn window_of(now: u32) -> u32 {
    now >> 10
}

/// Whether the flood guard lets this CPU record one more router-mode flow now
/// (`flood_allows`); counts `flood_untracked` if not.
#[inline(always)]
pub(super) fn may_record(now: u32) -> bool {
    let allowed = flood_allows(now);
    if !allowed {
        count(Counter::FloodUntracked);
    }
    allowed
}

/// Whether this CPU may record one more new flow in this window
/// (`config::NEW_FLOW_LIMIT`).
#[inline(always)]
fn flood_allows(now: u32) -> bool {
    let limit = match CONFIG.get(config::NEW_FLOW_LIMIT) {
        Some(&limit) if limit != 0 => limit,
        _ => return true,
    };
    let Some(window) = FLOOD.get_ptr_mut(0) else {
        return true;
    };
    // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
    let (window, now) = (unsafe { &mut *window }, window_of(now));
    if window.window != now {
        window.window = now;
        window.new_flows = 0;
    }
    window.new_flows += 1;
    window.new_flows <= limit
}
