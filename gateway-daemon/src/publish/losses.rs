//! Log lines for packets the datapath lost or handed to the kernel to drop: which
//! counters grew since the traffic was last read, and the routes whose packets took
//! that way.

use std::{collections::BTreeMap, sync::Mutex, time::Duration};

use super::Published;
use crate::datapath::ServiceAddr;

/// Logs, at most once a minute per counter, datapath counters that mean lost or
/// misrouted packets, naming the routes whose packets took that way.
pub(super) fn log_losses(before: &Published, after: &Published) {
    use gateway_common::Counter;
    const LOSSES: [Counter; 11] = [
        Counter::DropNoBackend,
        Counter::DropMalformed,
        Counter::DropFragment,
        Counter::KernelForwardingOff,
        Counter::KernelNoRoute,
        Counter::KernelEgressUnknown,
        Counter::RedirectError,
        Counter::TcUntranslated,
        Counter::SnatPortLost,
        Counter::IcmpUntranslated,
        Counter::ReplySpoofed,
    ];
    static LAST: Mutex<BTreeMap<&'static str, std::time::Instant>> = Mutex::new(BTreeMap::new());
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    for c in LOSSES {
        let name = c.name();
        let grew = after
            .counters
            .get(name)
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.counters.get(name).copied().unwrap_or(0));
        if grew == 0
            || last
                .get(name)
                .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
        {
            continue;
        }
        last.insert(name, std::time::Instant::now());
        let routes = loss_routes(before, after, c);
        tracing::warn!(
            counter = name,
            packets = grew,
            routes = %routes,
            "packets lost or handed to the kernel to drop ({}); rate-limited to one line a minute",
            crate::datapath::kernel_reason(c)
        );
    }
}

/// The routes a loss counted as `c` is of, for its log line (at most
/// `LOSS_ROUTES_NAMED`, then how many more): those whose services' packets the kernel
/// carried for that reason since `before`; for `drop_no_backend`, which is counted per
/// node only, the routes with a service none of whose backends takes new flows.
pub(crate) fn loss_routes(
    before: &Published,
    after: &Published,
    c: gateway_common::Counter,
) -> String {
    let services: Vec<&ServiceAddr> = if c == gateway_common::Counter::DropNoBackend {
        after
            .datapath
            .services
            .iter()
            .filter(|(_, b)| b.iter().all(|w| w.weight == 0))
            .map(|(s, _)| s)
            .collect()
    } else {
        after
            .traffic
            .iter()
            .filter(|(s, t)| {
                t.stats.kernel_reason == c as u32 + 1
                    && before
                        .traffic
                        .get(*s)
                        .is_none_or(|b| b.stats.kernel_packets < t.stats.kernel_packets)
            })
            .map(|(s, _)| s)
            .collect()
    };
    let routes: std::collections::BTreeSet<String> = services
        .into_iter()
        .filter_map(|s| after.owners.get(s))
        .map(|o| o.to_string())
        .collect();
    let more = routes.len().saturating_sub(LOSS_ROUTES_NAMED);
    let mut text = routes
        .into_iter()
        .take(LOSS_ROUTES_NAMED)
        .collect::<Vec<_>>()
        .join(" ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

/// Routes a loss's log line names at most.
const LOSS_ROUTES_NAMED: usize = 20;
