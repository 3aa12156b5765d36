//! `berth monitor`'s events: what the programs send through the ring buffer.

/// `MonitorEvent::hook` of the XDP program's events (ingress).
pub const HOOK_XDP: u16 = 0;
/// `MonitorEvent::hook` of the TC program's events (egress).
pub const HOOK_TC: u16 = 1;

/// Bytes of a packet's head a `MonitorEvent` holds, as it entered and as it left.
pub const MONITOR_BYTES: usize = 128;

/// Size of the `map_names::EVENTS` ring buffer: a few thousand events for a reader
/// that falls behind for a moment.
pub const EVENTS_BYTES: u32 = 1 << 20;

/// An event of the gateway program for `berth monitor`: a packet the program dropped,
/// handed to the kernel, or carried otherwise than a tracked flow's packets are
/// (`Counter::is_event`), with its head as it entered and as it left the program.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MonitorEvent {
    /// `bpf_ktime_get_ns` when sent.
    pub time_ns: u64,
    /// The `Counter` it was counted as, host order.
    pub reason: u32,
    /// The program's verdict (`XDP_DROP` 1, `XDP_PASS` 2, `XDP_TX` 3, `XDP_REDIRECT` 4;
    /// the TC program's as the first two: dropped, or on its way).
    pub action: u32,
    /// The interface it arrived on (XDP) or leaves by (TC).
    pub ifindex: u32,
    /// The CPU that carried it.
    pub cpu: u16,
    /// Which program saw it: `HOOK_XDP` or `HOOK_TC`.
    pub hook: u16,
    /// The packet's length as it left (Ethernet header included).
    pub len: u32,
    /// Bytes of `entered` set (its length as it entered, at most `MONITOR_BYTES`).
    pub entered_len: u16,
    /// Bytes of `left` set.
    pub left_len: u16,
    /// The packet's head as it entered.
    pub entered: [u8; MONITOR_BYTES],
    /// The packet's head as it left.
    pub left: [u8; MONITOR_BYTES],
}
