//! Slots of the `map_names::CONFIG` array (values host order).

/// New flows per second per CPU above which the program stops recording new flows
/// (and replies matched by Maglev, `Counter::CtMissReply`) in the conntrack and
/// balances them by Maglev alone (`Counter::FloodUntracked`),
/// so that a flood of new 5-tuples cannot evict every established flow. 0: no limit.
pub const NEW_FLOW_LIMIT: u32 = 0;
// Slot 1 held the last window some CPU went over `NEW_FLOW_LIMIT` in, while replies
// without an entry were matched by Maglev only during floods; they always are now.
/// Where replies of a flow may come from: 0 (default), only from where the gateway
/// sends its backend's packets (else dropped, `Counter::ReplySpoofed`); 1, from any
/// interface and neighbour (backends whose replies come back asymmetrically, as
/// through a router spreading them over a tier of gateways).
pub const REPLY_ORIGIN: u32 = 2;
/// `REPLY_ORIGIN`: replies must come from where their backend is.
pub const REPLY_ORIGIN_BACKEND: u32 = 0;
/// `REPLY_ORIGIN`: replies may come from anywhere.
pub const REPLY_ORIGIN_ANY: u32 = 1;
/// The process id of the `berth monitor` reading `map_names::EVENTS` (as its PID
/// namespace sees it); 0: nobody listens, and the program records no event.
pub const MONITOR: u32 = 3;
/// Which counters are events (`Counter::is_event`) the monitor wants: bit `i` of
/// `MONITOR_REASONS_LO` (`i` < 32) or of `MONITOR_REASONS_HI` (`i - 32`).
pub const MONITOR_REASONS_LO: u32 = 4;
/// See `MONITOR_REASONS_LO`.
pub const MONITOR_REASONS_HI: u32 = 5;
/// One event in this many is sent (0 and 1: every one), per CPU.
pub const MONITOR_SAMPLE: u32 = 6;
/// Events sent a second, per CPU, at most; the rest are counted
/// (`Counter::MonitorLost`).
pub const MONITOR_RATE: u32 = 7;
/// A number the listener picks anew each time it starts: a CPU's count of events
/// sent in the current second starts again for a new listener.
pub const MONITOR_SESSION: u32 = 8;
/// `CLOCK_MONOTONIC` in seconds when the listener last said it is there (it says so
/// a few times a second): a listener silent for `MONITOR_STALE_SECS` is gone (killed),
/// whatever PID namespace it ran in, and the daemon turns the events off.
pub const MONITOR_ALIVE: u32 = 9;
/// See `MONITOR_ALIVE`.
pub const MONITOR_STALE_SECS: u32 = 15;
/// The datapath's secret for the hand-off from XDP to TC (random, non-zero, set by the
/// daemon when it first loads the program on these pins): TC takes only a shim that
/// carries it, so a frame from the wire cannot forge one. 0: nothing is handed off.
pub const HANDOFF_NONCE: u32 = 10;
/// Entries of the array.
pub const SLOTS: u32 = 16;
