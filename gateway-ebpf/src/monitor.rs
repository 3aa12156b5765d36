//! Events for `berth monitor`: packets the program dropped, handed to the kernel, or
//! carried otherwise than a tracked flow's packets are (`Counter::is_event`), sent
//! through a ring buffer (`berth_events`) with their heads as they entered and left.
//!
//! A packet that is none of the program's business (a miss) never asks whether anyone
//! listens (`config::MONITOR`); one that is ours asks as it is found to be (`entered`)
//! and at its verdict.
//! With a listener, an ours packet's head is copied as it enters (into this CPU's
//! `berth_monitor_cpu`); a counter that is an event and that the listener asked for
//! (`config::MONITOR_REASONS_*`) notes its reason (`note`, from `maps::count`), and
//! the verdict enters `berth_monitor` by tail call, which samples
//! (`config::MONITOR_SAMPLE`), limits the rate per CPU (`config::MONITOR_RATE`, the
//! rest counted `monitor_lost`) and sends the event. The event's work stays out of the
//! gateway program, whose every path the verifier walks.
//!
//! The TC program on egress does the same with its own packets (`berth_tc_monitor`, in
//! `maps::TC_PROGRAMS`): each egress packet's head is kept while someone listens (TC
//! sees every packet the host sends, and asks at entry), its events are the drops of
//! forged replies and what it could not translate, replies matched by Maglev, stale
//! services. Both use this CPU's one slot: a TC program does not run inside XDP's (nor
//! XDP inside TC's: egress runs with softirqs off).

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_skb_load_bytes, bpf_xdp_load_bytes},
    macros::map,
    maps::{PerCpuArray, ProgramArray, RingBuf},
    programs::{TcContext, XdpContext},
    EbpfContext,
};
use gateway_common::{
    config, Counter, MonitorEvent, EVENTS_BYTES, HOOK_TC, HOOK_XDP, MONITOR_BYTES,
};

use crate::maps::{count, CONFIG, PROGRAMS, PROG_MONITOR, PROG_TC_MONITOR, TC_PROGRAMS};

/// The events, read by `berth monitor`. Pinned.
#[map(name = "berth_events")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// One CPU's monitor state: the packet in hand's head as it entered and the event it
/// makes, and the CPU's sampling and rate counts.
#[repr(C)]
pub struct MonitorCpu {
    /// `Counter` + 1 of the packet in hand's event; 0: none.
    pending: u32,
    /// The verdict `berth_monitor` returns.
    action: u32,
    /// Events seen, for sampling.
    seen: u32,
    /// The listener (`config::MONITOR_SESSION`) and the second (`bpf_ktime_get_ns` >>
    /// 30) `sent` counts for.
    listener: u32,
    window: u32,
    /// Events sent in `window`.
    sent: u32,
    /// Bytes of `entered` set.
    entered_len: u32,
    /// The packet in hand's head as it entered.
    entered: [u8; MONITOR_BYTES],
}

/// This CPU's monitor state. Written by the gateway programs.
#[map(name = "berth_monitor_cpu")]
static MONITOR: PerCpuArray<MonitorCpu> = PerCpuArray::with_max_entries(1, 0);

/// Whether someone listens.
#[inline(always)]
pub fn listening() -> bool {
    CONFIG.get(config::MONITOR).is_some_and(|pid| *pid != 0)
}

/// A program whose packets make events: XDP on ingress, TC on egress.
pub trait Watched: EbpfContext {
    /// `MonitorEvent::hook`.
    const HOOK: u16;
    /// The tail-call array and slot of this kind's monitor program.
    fn monitor() -> (&'static ProgramArray, u32);
    /// The packet's length (Ethernet header included).
    fn packet_len(&self) -> usize;
    /// The interface it arrived on (XDP) or leaves by (TC).
    fn ifindex(&self) -> u32;
    /// Copies `len` (1..=`MONITOR_BYTES`) bytes of the packet's head to `buf`; 0 on
    /// success.
    ///
    /// # Safety
    /// `buf` must have room for `len` bytes.
    unsafe fn load(&self, buf: *mut u8, len: u32) -> i64;
}

impl Watched for XdpContext {
    const HOOK: u16 = HOOK_XDP;
    fn monitor() -> (&'static ProgramArray, u32) {
        (&PROGRAMS, PROG_MONITOR)
    }
    fn packet_len(&self) -> usize {
        self.data_end() - self.data()
    }
    fn ifindex(&self) -> u32 {
        self.ingress_ifindex() as u32
    }
    unsafe fn load(&self, buf: *mut u8, len: u32) -> i64 {
        // SAFETY: the caller's.
        unsafe { bpf_xdp_load_bytes(self.ctx, 0, buf.cast(), len) }
    }
}

impl Watched for TcContext {
    const HOOK: u16 = HOOK_TC;
    fn monitor() -> (&'static ProgramArray, u32) {
        (&TC_PROGRAMS, PROG_TC_MONITOR)
    }
    fn packet_len(&self) -> usize {
        self.len() as usize
    }
    fn ifindex(&self) -> u32 {
        // SAFETY: the program's own context, valid while it runs.
        unsafe { (*self.skb.skb).ifindex }
    }
    unsafe fn load(&self, buf: *mut u8, len: u32) -> i64 {
        // SAFETY: the caller's.
        unsafe { bpf_skb_load_bytes(self.as_ptr(), 0, buf.cast(), len) }
    }
}

/// Copies up to `MONITOR_BYTES` of the packet's head to `buf`; returns how many.
///
/// # Safety
/// `buf` must have room for `MONITOR_BYTES`.
#[inline(always)]
unsafe fn head<C: Watched>(ctx: &C, buf: *mut u8) -> u32 {
    // Bounded in 64 bits, as the verifier reads the register the helper is given.
    let len = ctx.packet_len().min(MONITOR_BYTES);
    if len == 0 {
        return 0;
    }
    // SAFETY: `buf` has room for `len` <= `MONITOR_BYTES` bytes.
    if unsafe { ctx.load(buf, len as u32) } == 0 {
        len as u32
    } else {
        0
    }
}

/// A packet found to be ours, before anything in it changed: with a listener, its head
/// is kept.
#[inline(always)]
pub fn entered<C: Watched>(ctx: &C) {
    if !listening() {
        return;
    }
    let Some(m) = MONITOR.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot, only this CPU writes it while the program runs.
    unsafe {
        (*m).pending = 0;
        (*m).entered_len = head(ctx, (&raw mut (*m).entered).cast());
    }
}

/// Whether the listener asked for `counter`'s events.
#[inline(always)]
fn wanted(counter: Counter) -> bool {
    let bit = counter as u32;
    let (slot, bit) = if bit < 32 {
        (config::MONITOR_REASONS_LO, bit)
    } else {
        (config::MONITOR_REASONS_HI, bit - 32)
    };
    CONFIG.get(slot).is_some_and(|mask| mask & (1 << bit) != 0)
}

/// `counter` counted the packet in hand: its event, if the listener wants it. The first
/// event of a packet is its event.
#[inline(always)]
pub fn note(counter: Counter) {
    if !listening() || !wanted(counter) {
        return;
    }
    let Some(m) = MONITOR.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: as in `entered`.
    unsafe {
        if (*m).pending == 0 {
            (*m).pending = counter as u32 + 1;
        }
    }
}

/// The verdict of a packet while someone listens: its event, if it has one, is sent by
/// the monitor program (entered by tail call, which returns `action`: an XDP verdict,
/// for TC dropped or passed).
#[inline(always)]
pub fn flush<C: Watched>(ctx: &C, action: u32) -> u32 {
    let Some(m) = MONITOR.get_ptr_mut(0) else {
        return action;
    };
    // SAFETY: as in `entered`.
    unsafe {
        if (*m).pending == 0 {
            return action;
        }
        (*m).action = action;
        // Returns only if it failed (an empty slot): no event.
        let (programs, slot) = C::monitor();
        programs.tail_call(ctx, slot);
        (*m).pending = 0;
    }
    action
}

/// A packet dropped as `reason`: its event, if someone listens (its head is as it
/// entered). Returns `XDP_DROP`.
#[inline(always)]
pub fn dropped(ctx: &XdpContext, reason: Counter) -> u32 {
    let action = xdp_action::XDP_DROP;
    if !listening() || !wanted(reason) {
        return action;
    }
    let Some(m) = MONITOR.get_ptr_mut(0) else {
        return action;
    };
    // SAFETY: as in `entered`.
    unsafe {
        (*m).pending = reason as u32 + 1;
        (*m).action = action;
        PROGRAMS.tail_call(ctx, PROG_MONITOR);
        (*m).pending = 0;
    }
    action
}

/// `berth_monitor`: sends the packet in hand's event, sampled and within the rate;
/// returns the gateway program's verdict.
#[inline(always)]
pub fn send<C: Watched>(ctx: &C) -> u32 {
    let Some(m) = MONITOR.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: as in `entered`; the ring buffer entry is ours until submitted.
    unsafe {
        let (reason, action) = ((*m).pending.wrapping_sub(1), (*m).action);
        (*m).pending = 0;
        (*m).seen = (*m).seen.wrapping_add(1);
        let every = CONFIG.get(config::MONITOR_SAMPLE).copied().unwrap_or(1);
        if every > 1 && (*m).seen % every != 0 {
            return action;
        }
        let now = bpf_ktime_get_ns();
        let window = (now >> 30) as u32;
        let listener = CONFIG.get(config::MONITOR_SESSION).copied().unwrap_or(0);
        if (*m).window != window || (*m).listener != listener {
            (*m).window = window;
            (*m).listener = listener;
            (*m).sent = 0;
        }
        let rate = CONFIG.get(config::MONITOR_RATE).copied().unwrap_or(0);
        if (*m).sent >= rate {
            count(Counter::MonitorLost);
            return action;
        }
        let Some(mut event) = EVENTS.reserve::<MonitorEvent>(0) else {
            count(Counter::MonitorLost);
            return action;
        };
        (*m).sent += 1;
        let e = event.as_mut_ptr();
        (*e).time_ns = now;
        (*e).reason = reason;
        (*e).action = action;
        (*e).ifindex = ctx.ifindex();
        (*e).cpu = bpf_get_smp_processor_id() as u16;
        (*e).hook = C::HOOK;
        (*e).len = ctx.packet_len() as u32;
        (*e).left_len = head(ctx, (&raw mut (*e).left).cast()) as u16;
        // A dropped packet left as it entered (and may not have been `entered`).
        if action == xdp_action::XDP_DROP {
            (*e).entered_len = (*e).left_len;
            (*e).entered = (*e).left;
        } else {
            (*e).entered_len = (*m).entered_len as u16;
            (*e).entered = (*m).entered;
        }
        event.submit(0);
        action
    }
}
