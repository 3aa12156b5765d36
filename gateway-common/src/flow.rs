//! The conntrack's entries: a flow's key (its 5-tuple), what it is translated to, its
//! next hop, its TCP state and times; and client affinity's entries.

use crate::{Addr, ServiceId};

/// Key of the conntrack map: a packet's 5-tuple exactly as seen on the wire.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey<A: Addr = u32> {
    /// Source address, network order.
    pub src: A,
    /// Destination address, network order.
    pub dst: A,
    /// Source port, network order.
    pub sport: u16,
    /// Destination port, network order.
    pub dport: u16,
    /// IP protocol.
    pub proto: u8,
    /// Always zero.
    pub pad: [u8; 3],
}

/// `Flow::kind`: rewrite the destination (client → gateway becomes client → backend).
pub const NAT_DST: u8 = 1;
/// `Flow::kind`: rewrite the source (backend → client becomes gateway → client).
pub const NAT_SRC: u8 = 2;
/// `Flow::kind`: a SNAT-mode forward packet the kernel forwards: XDP rewrote its
/// destination (client → backend); the TC program rewrites its source to the node's
/// address and port (`nat_*`) as it leaves. Keyed by (client, backend); `peer_*` holds
/// the gateway address and port. XDP never translates with it.
pub const NAT_MASQ: u8 = 3;

/// A next hop learnt from the kernel's FIB and cached in a flow, so established
/// packets skip `bpf_fib_lookup`. Written by the kernel program only.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NextHop {
    /// Egress interface index, host order; 0: nothing cached.
    pub ifindex: u32,
    /// When the FIB was last asked (answered or not), in units of 2^20 ns of
    /// `bpf_ktime_get_coarse_ns`, host order.
    pub checked_at: u32,
    /// Largest IP packet length the FIB accepted for this hop's MTU, host order.
    pub fit_len: u16,
    /// Destination MAC.
    pub dmac: [u8; 6],
    /// Source MAC.
    pub smac: [u8; 6],
    /// Always zero.
    pub pad: u16,
}

/// A cached next hop is asked again after this many 2^20 ns units (about a second), so
/// route and neighbour changes are picked up.
pub const NEXT_HOP_REFRESH: u32 = 1024;

/// Value of the conntrack map: how to rewrite packets of this tuple.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow<A: Addr = u32> {
    /// Address written into the packet, network order.
    pub nat_addr: A,
    /// Port written into the packet, network order.
    pub nat_port: u16,
    /// `NAT_DST`, `NAT_SRC` or `NAT_MASQ`.
    pub kind: u8,
    /// `FLOW_*` bits.
    pub flags: u8,
    /// Backend id the flow was assigned to, host order. Checked on every hit: the
    /// entry applies while this backend slot holds the flow's backend for `service`.
    pub backend: u32,
    /// Id of the service that balanced the flow (generation included): an entry of a
    /// removed service never applies to the service given its ids later.
    pub service: ServiceId,
    /// The next hop toward the client: of this entry's packets (a reply entry), or of
    /// the replies of this flow (a forward entry, whose replies find it through the
    /// reply index). Forward packets use their backend's (`map_names::BACKEND_HOPS`).
    pub next_hop: NextHop,
    /// SNAT mode: the other end's translation, network order. A forward entry's new
    /// source (the node's address and the flow's allocated port), a reply entry's new
    /// destination (the client). 0: none (router mode). A `NAT_MASQ` entry holds the
    /// gateway address and port here.
    pub peer_addr: A,
    /// Port of `peer_addr`, network order.
    pub peer_port: u16,
    /// Always zero.
    pub pad2: u16,
    /// A forward entry: when it last forwarded a packet, in the units of
    /// `NextHop::checked_at`, updated about once a second (`NEXT_HOP_REFRESH`).
    pub seen: u32,
    /// A TCP forward entry: when its flow ended (`FLOW_RST`, or `FLOW_FIN_FORWARD` and
    /// `FLOW_FIN_REPLY`), in the units of `NextHop::checked_at` (never 0 once ended);
    /// 0 while it lives.
    pub ended: u32,
}

/// `Flow::flags` bit: the flow records a reply entry too (`SERVICE_REPLY_ENTRY`).
pub const FLOW_REPLY_ENTRY: u8 = 1;

/// `Flow::flags` bit of a TCP forward entry: the client sent FIN.
pub const FLOW_FIN_FORWARD: u8 = 2;

/// `Flow::flags` bit of a TCP forward entry: the backend sent FIN.
pub const FLOW_FIN_REPLY: u8 = 4;

/// `Flow::flags` bit of a TCP forward entry: either end sent RST.
pub const FLOW_RST: u8 = 8;

/// `Flow::flags` bit of a new forward entry: its service keeps clients on their
/// backend, so recording the flow notes its client's backend (`map_names::AFFINITY`).
pub const FLOW_AFFINITY: u8 = 16;

/// Key of the session-affinity maps: a client (its address, network order) of a
/// service.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AffinityKey<A: Addr = u32> {
    /// The service's id (generation included: a removed service's clients are not
    /// another's).
    pub service: ServiceId,
    /// The client's address, network order.
    pub client: A,
}

/// Value of the session-affinity maps: the backend a client's last new flow went to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Affinity {
    /// Backend id, host order.
    pub backend: u32,
    /// When, in the units of `NextHop::checked_at`.
    pub at: u32,
}

/// Entries of each session-affinity map (clients of every service with affinity; the
/// least recently used are forgotten beyond, and go where Maglev says).
pub const AFFINITY_ENTRIES: u32 = 65536;

/// A TCP flow that ended (`Flow::ended`) is over this many units of
/// `NextHop::checked_at` later (about 10 s: the last ACK and retransmissions of the
/// FINs pass meanwhile). Until then a backend that left its service keeps serving it.
pub const FLOW_LINGER: u32 = (10_000_000_000u64 >> 20) as u32;

/// TCP flags byte (byte 13 of the header) bits that change a flow's state
/// (`Flow::note_tcp`): FIN, SYN, RST.
pub const TCP_STATE_FLAGS: u8 = 0x07;

impl<A: Addr> Flow<A> {
    /// An entry of `kind` that writes `nat` (address, port; network order) for a flow
    /// of `backend` and `service`: no flags, no SNAT peer, no next hop cached yet.
    #[inline(always)]
    pub fn entry(kind: u8, nat: (A, u16), backend: u32, service: ServiceId) -> Self {
        Flow {
            nat_addr: nat.0,
            nat_port: nat.1,
            kind,
            flags: 0,
            backend,
            service,
            next_hop: NextHop {
                ifindex: 0,
                checked_at: 0,
                fit_len: 0,
                dmac: [0; 6],
                smac: [0; 6],
                pad: 0,
            },
            peer_addr: A::default(),
            peer_port: 0,
            pad2: 0,
            seen: 0,
            ended: 0,
        }
    }

    /// The same with a SNAT peer (`peer_addr`, `peer_port`).
    #[inline(always)]
    pub fn with_peer(mut self, peer: (A, u16)) -> Self {
        self.peer_addr = peer.0;
        self.peer_port = peer.1;
        self
    }

    /// Whether the flow is in SNAT mode (both ends translated).
    #[inline(always)]
    pub fn is_snat(&self) -> bool {
        !self.peer_addr.is_zero()
    }

    /// Notes a TCP segment of this forward entry's flow with flags `tcp_flags` (byte 13
    /// of its header) from the client (`reply` false) or the backend, at coarse time
    /// `now`. A FIN or RST marks the flow, and the flow ends (`ended`) with an RST, or
    /// a FIN each way; a SYN from the client (the tuple opens a new connection) clears
    /// the marks. Only segments with one of `TCP_STATE_FLAGS` change anything.
    #[inline(always)]
    pub fn note_tcp(&mut self, tcp_flags: u8, reply: bool, now: u32) {
        const FIN: u8 = 0x01;
        const SYN: u8 = 0x02;
        const RST: u8 = 0x04;
        const ACK: u8 = 0x10;
        let marks = FLOW_FIN_FORWARD | FLOW_FIN_REPLY | FLOW_RST;
        if !reply && tcp_flags & (SYN | ACK) == SYN {
            if self.flags & marks != 0 || self.ended != 0 {
                self.flags &= !marks;
                self.ended = 0;
            }
            return;
        }
        let mut bits = 0;
        if tcp_flags & RST != 0 {
            bits |= FLOW_RST;
        }
        if tcp_flags & FIN != 0 {
            bits |= if reply {
                FLOW_FIN_REPLY
            } else {
                FLOW_FIN_FORWARD
            };
        }
        if bits == 0 || self.flags & bits == bits {
            return;
        }
        self.flags |= bits;
        let fins = FLOW_FIN_FORWARD | FLOW_FIN_REPLY;
        if self.ended == 0 && (self.flags & FLOW_RST != 0 || self.flags & fins == fins) {
            self.ended = if now == 0 { 1 } else { now };
        }
    }

    /// Whether this forward entry's flow is over at coarse time `now`: ended more than
    /// `FLOW_LINGER` ago, or idle (no forward packet, `seen`) for more than `idle`
    /// units.
    pub fn is_over(&self, now: u32, idle: u32) -> bool {
        (self.ended != 0 && now.wrapping_sub(self.ended) > FLOW_LINGER)
            || now.wrapping_sub(self.seen) > idle
    }
}
