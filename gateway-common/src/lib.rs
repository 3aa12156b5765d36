//! Types shared by the XDP program (`gateway-ebpf`) and userspace (`gateway-daemon`).
//!
//! Every map key and value is `#[repr(C)]`, `Copy`, free of `bool` and of implicit
//! padding (padding is a named field, always zero). Each field documents its byte order:
//! "network" fields hold the bytes exactly as they appear on the wire, read as a native
//! integer; "host" fields are ordinary native integers.
#![no_std]

/// Sizes a service's Maglev table may have (primes, as the algorithm requires), each
/// about 1.25 times the one before: a service's table is the smallest of them with at
/// least `MAGLEV_ENTRIES_PER_BACKEND` entries per backend taking new flows (capped at
/// the last). The tables of all services share one array (`map_names::MAGLEV`), each a
/// region of it (`Service::table`, `Service::table_size`).
///
/// A backend's share of a table is within one entry of its weight's share (see
/// `maglev::table` in the daemon), so at 100 entries per backend a share is off by at
/// most 1 % of an equal share. Katran fixes every table at 65537 entries, Cilium at
/// 16381 (`--bpf-lb-maglev-table-size`); Berth had 1021 for every service: sized by use,
/// a service of two backends takes 211 entries where it took 1021. A service of one
/// backend takes one entry (`maglev_size`).
pub const MAGLEV_SIZES: [u32; 30] = [
    101, 127, 163, 211, 269, 337, 431, 541, 677, 853, 1069, 1361, 1709, 2137, 2677, 3347, 4201,
    5261, 6577, 8231, 10289, 12889, 16127, 20161, 25219, 31531, 39419, 49277, 61603, 65521,
];

/// Entries of the Maglev pool a backend may need at most: no table is larger than this
/// many entries per backend taking new flows (`maglev_size(n) <= 128 * n`, checked
/// for every `n` by a test), so a pool of this many per `--max-backends` holds the
/// tables of any state that fits the backends.
pub const MAGLEV_POOL_ENTRIES_PER_BACKEND: u32 = 128;

/// Entries a service's Maglev table has at least per backend taking new flows (the
/// Maglev paper's "well above 100 times the backends"), up to the largest size.
pub const MAGLEV_ENTRIES_PER_BACKEND: u32 = 100;

/// The size of the Maglev table of a service with `active` backends taking new flows
/// (0 for none: such a service has no table). One backend takes every new flow
/// whatever the hash, so its table has one entry: 101 would cost 400 bytes and a write
/// of 101 entries at every change for nothing (at 100,000 single-backend routes, 10
/// million entries: a second of the cold start). Going from one backend to two
/// changes the size, and so the whole table, as any change of size does; established
/// flows keep their backend by conntrack.
pub const fn maglev_size(active: u32) -> u32 {
    if active <= 1 {
        return active;
    }
    let want = active.saturating_mul(MAGLEV_ENTRIES_PER_BACKEND);
    let mut i = 0;
    while i < MAGLEV_SIZES.len() {
        if MAGLEV_SIZES[i] >= want {
            return MAGLEV_SIZES[i];
        }
        i += 1;
    }
    MAGLEV_SIZES[MAGLEV_SIZES.len() - 1]
}

/// The largest Maglev table.
pub const MAGLEV_MAX_SIZE: u32 = MAGLEV_SIZES[MAGLEV_SIZES.len() - 1];

/// Names of the maps, which are also their file names under the pin directory.
pub mod map_names {
    /// `ServiceKey` → `Service`.
    pub const SERVICES: &str = "berth_services";
    /// Gateway address (network order) → number of services on it.
    pub const ADDRESSES: &str = "berth_addrs";
    /// The Maglev tables of all services, one array of backend ids: a service's table
    /// is the region `Service::table .. + Service::table_size`.
    pub const MAGLEV: &str = "berth_maglev";
    /// Backend id → `Backend`.
    pub const BACKENDS: &str = "berth_backends";
    /// `FlowKey` → `Flow`, shared across CPUs (LRU).
    pub const CONNTRACK: &str = "berth_ct";
    /// `FragKey` → `FragPorts`: ports of fragmented datagrams seen by their first fragment.
    pub const FRAGMENTS: &str = "berth_frags";
    /// `Counter` index → per-CPU `u64`.
    pub const COUNTERS: &str = "berth_counters";
    /// Service id → per-CPU `ServiceStats`.
    pub const SERVICE_STATS: &str = "berth_svc_stats";
    /// Backend id → per-CPU `BackendStats`.
    pub const BACKEND_STATS: &str = "berth_backend_stats";
    /// Interface index → `XMIT_OK` when the interface accepts XDP frames redirected into it.
    pub const XMIT: &str = "berth_xmit";
    /// Slot 0: id of the loaded gateway program (for the redirect-error tracepoint).
    pub const PROGRAM_ID: &str = "berth_prog";
    /// Backend id → the node's address toward that backend (network order; 0: none
    /// known), the source of SNAT-mode flows to it.
    pub const SNAT_SOURCES: &str = "berth_snat_src";
    /// Slot 0: number of SNAT source ports; slots 1..=n: the ports (network order).
    pub const SNAT_PORTS: &str = "berth_snat_ports";
    /// `config::*` slot → value (host order), written by the daemon at every start.
    pub const CONFIG: &str = "berth_config";
    /// Slot 0 → per-CPU `FloodWindow`: new flows this CPU saw in the current second.
    pub const FLOOD: &str = "berth_flood";
    /// Backend endpoint (`ServiceKey` layout) → `ReplyIndex`: the services it serves,
    /// so a reply finds its flow's forward entry.
    pub const REPLY_INDEX: &str = "berth_reply_index";
    /// `addr_slot(address)` → `ADDR_*` bits: which roles some address hashing there has.
    pub const ADDR_FILTER: &str = "berth_addr_filter";
    /// Backend id → `NextHop` toward that backend (the forward packets of all its flows).
    pub const BACKEND_HOPS: &str = "berth_backend_hops";
    /// Slot → program entered by tail call: slot 0 is the IPv6 gateway program, slot 1
    /// its ICMPv6 part. Pinned, so that IPv6 keeps being served while the daemon
    /// restarts (a program array forgets its programs when no file refers to it).
    pub const PROGRAMS: &str = "berth_progs";
    /// Slot → program the TC egress program enters by tail call: slot 0 is its IPv6
    /// half, slot 1 that half's ICMPv6 part (a TC program cannot enter `PROGRAMS`, an
    /// array of XDP programs). Pinned, as `PROGRAMS`.
    pub const TC_PROGRAMS: &str = "berth_tc_progs";
    /// IPv6: `ServiceKey<[u32; 4]>` → `Service`.
    pub const SERVICES6: &str = "berth_services6";
    /// IPv6 gateway address → number of services on it.
    pub const ADDRESSES6: &str = "berth_addrs6";
    /// IPv6: `FlowKey<[u32; 4]>` → `Flow<[u32; 4]>`, shared across CPUs (LRU).
    pub const CONNTRACK6: &str = "berth_ct6";
    /// IPv6 backend endpoint → `ReplyIndex<[u32; 4]>`.
    pub const REPLY_INDEX6: &str = "berth_reply_index6";
    /// Backend id → the IPv6 address of an IPv6 backend (`Backend::addr` is 0 for it).
    pub const BACKENDS6: &str = "berth_backends6";
    /// Backend id → the node's IPv6 address toward that backend (zero: none known).
    pub const SNAT_SOURCES6: &str = "berth_snat_src6";
    /// `FragKey6` → `FragPorts`: ports of fragmented IPv6 datagrams.
    pub const FRAGMENTS6: &str = "berth_frags6";
    /// `AffinityKey` → `Affinity`: the backend of each client of a service with session
    /// affinity (LRU, `AFFINITY_ENTRIES`).
    pub const AFFINITY: &str = "berth_affinity";
    /// IPv6: `AffinityKey<[u32; 4]>` → `Affinity`.
    pub const AFFINITY6: &str = "berth_affinity6";
    /// Ring buffer of `MonitorEvent`s for `berth monitor` (`config::MONITOR`).
    pub const EVENTS: &str = "berth_events";

    /// Every map, in a fixed order.
    pub const ALL: [&str; 30] = [
        SERVICES,
        ADDRESSES,
        MAGLEV,
        BACKENDS,
        CONNTRACK,
        FRAGMENTS,
        COUNTERS,
        SERVICE_STATS,
        XMIT,
        PROGRAM_ID,
        SNAT_SOURCES,
        SNAT_PORTS,
        CONFIG,
        FLOOD,
        REPLY_INDEX,
        ADDR_FILTER,
        BACKEND_HOPS,
        PROGRAMS,
        TC_PROGRAMS,
        SERVICES6,
        ADDRESSES6,
        CONNTRACK6,
        REPLY_INDEX6,
        BACKENDS6,
        SNAT_SOURCES6,
        FRAGMENTS6,
        AFFINITY,
        AFFINITY6,
        BACKEND_STATS,
        EVENTS,
    ];
}

/// Services of one backend endpoint a reply may belong to (`map_names::REPLY_INDEX`):
/// the services it serves, at most `REPLY_CANDIDATES`. A reply (backend → client)
/// tries the forward entry (client → each service) in turn.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReplyIndex<A: Addr = u32> {
    /// How many of `services` are set, host order.
    pub count: u16,
    /// `REPLY_INDEX_*` bits, host order.
    pub flags: u16,
    /// The services' keys (gateway address, port, protocol).
    pub services: [ServiceKey<A>; REPLY_CANDIDATES as usize],
}

/// `ReplyIndex::flags` bit: a SNAT-mode service uses the endpoint, so its replies are
/// looked up under their own tuple first (a SNAT flow's reply entry).
pub const REPLY_INDEX_SNAT: u16 = 1;

/// Services one backend endpoint can serve with replies found through the reply index;
/// router-mode flows of further services sharing it record a reply entry
/// (`SERVICE_REPLY_ENTRY`).
pub const REPLY_CANDIDATES: u32 = 4;

/// Entries of the `map_names::ADDR_FILTER` array.
pub const ADDR_FILTER_SLOTS: u32 = 1 << 16;
/// `map_names::ADDR_FILTER` bit: a gateway address hashes to this slot.
pub const ADDR_GATEWAY: u32 = 1;
/// `map_names::ADDR_FILTER` bit: a backend address hashes to this slot.
pub const ADDR_BACKEND: u32 = 2;

/// The `map_names::ADDR_FILTER` slot of an address (network order): a packet none of
/// whose addresses has a role there is not the program's business, known from two
/// array lookups (no hash-map lookup). A sharing address only costs its packets the
/// hash lookups. See `Addr::slot_bits` for each family's slot.
#[inline(always)]
pub fn addr_slot<A: Addr>(addr: A) -> u32 {
    addr.slot_bits() & (ADDR_FILTER_SLOTS - 1)
}

/// An address of one family as map keys and values hold it, network order: `u32`
/// (IPv4) or `[u32; 4]` (IPv6, the 16 bytes as four words). Keys and values generic
/// over it (`FlowKey<A>`, ...) default to IPv4, the layout pinned maps already have.
pub trait Addr: Copy + Eq + Default + core::fmt::Debug {
    /// 32 bits whose low 16 are the address filter's slot (`addr_slot`). IPv4: the
    /// address, host order, so its last 16 bits: the addresses of one subnet up to a
    /// /16 never share a slot, for one byte swap. IPv6: `fold`, a hash of all 128 bits,
    /// because IPv6 hosts of different subnets often end alike (`::1`, `::10`), and
    /// the last 16 bits made a client `fd00:1::10` share a backend `fd00:2::10`'s slot.
    fn slot_bits(self) -> u32;
    /// The address folded to 32 bits for `flow_hash` (an IPv4 address is itself).
    fn fold(self) -> u32;
    /// Whether every bit is zero ("none" in `Flow::peer_addr`).
    fn is_zero(self) -> bool;
}

impl Addr for u32 {
    #[inline(always)]
    fn slot_bits(self) -> u32 {
        u32::from_be(self)
    }
    #[inline(always)]
    fn fold(self) -> u32 {
        self
    }
    #[inline(always)]
    fn is_zero(self) -> bool {
        self == 0
    }
}

impl Addr for [u32; 4] {
    #[inline(always)]
    fn slot_bits(self) -> u32 {
        self.fold()
    }
    #[inline(always)]
    fn fold(self) -> u32 {
        mix(self[0] ^ mix(self[1] ^ mix(self[2] ^ mix(self[3]))))
    }
    #[inline(always)]
    fn is_zero(self) -> bool {
        self[0] | self[1] | self[2] | self[3] == 0
    }
}

/// Slots of the `map_names::CONFIG` array (values host order).
pub mod config {
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
    /// Entries of the array.
    pub const SLOTS: u32 = 16;
}

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

/// Value of the per-CPU `map_names::FLOOD` array: the new flows one CPU saw in one
/// window of 2^30 ns (about a second) of `bpf_ktime_get_coarse_ns`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FloodWindow {
    /// The window: the coarse time in 2^20 ns units, as 32 bits, >> 10 (2^30 ns;
    /// wraps after about 52 days), host order.
    pub window: u32,
    /// New flows seen in it, host order.
    pub new_flows: u32,
}

/// Entries of the `map_names::XMIT` array: interfaces with a higher index are never
/// redirected to (their packets take the kernel's path, counted).
pub const XMIT_SLOTS: u32 = 65536;

/// `berth_xmit` value: the interface accepts redirected XDP frames (the kernel's
/// `NETDEV_XDP_ACT_NDO_XMIT`), so the program may `bpf_redirect` into it.
pub const XMIT_OK: u32 = 1;

/// IP protocol numbers the datapath handles.
pub mod proto {
    /// ICMP.
    pub const ICMP: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;
    /// IPv6 extension headers the datapath walks past.
    pub mod ipv6_ext {
        /// Hop-by-hop options.
        pub const HOP_BY_HOP: u8 = 0;
        /// Routing.
        pub const ROUTING: u8 = 43;
        /// Fragment.
        pub const FRAGMENT: u8 = 44;
        /// Authentication header.
        pub const AUTH: u8 = 51;
        /// Destination options.
        pub const DEST_OPTS: u8 = 60;
    }
}

/// Key of the service map: a gateway address, protocol and port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey<A: Addr = u32> {
    /// Gateway address, network order.
    pub addr: A,
    /// Gateway port, network order.
    pub port: u16,
    /// IP protocol (`proto::TCP` or `proto::UDP`).
    pub proto: u8,
    /// Always zero.
    pub pad: u8,
}

/// Which service, over the datapath's whole life: a slot and a generation.
///
/// The slot indexes per-service maps (statistics) and is reused once its service is
/// removed; the generation changes every time the slot is given to a service, so a
/// conntrack entry of a removed service never matches the service that took its slot
/// (and the backend slots with it). Host order; the low `ServiceId::SLOT_BITS` bits are
/// the slot, the high `32 - SLOT_BITS` bits the generation (which wraps). Ids written
/// before generations existed are generation 0; ids written by builds of 16 slot bits
/// read as other slots and generations, which no service of theirs holds (the daemon
/// notes every id it finds in the conntrack before handing out any).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceId(u32);

impl ServiceId {
    /// Bits of the slot: 2^20, over a million services.
    pub const SLOT_BITS: u32 = 20;
    /// Number of slots: the most services one datapath can hold.
    pub const SLOTS: u32 = 1 << Self::SLOT_BITS;
    /// Number of generations of a slot (the rest of the 32 bits) before they wrap.
    pub const GENERATIONS: u32 = 1 << (32 - Self::SLOT_BITS);

    /// The id of generation `generation` of slot `slot` (`slot` below `SLOTS`;
    /// `generation` is taken modulo `GENERATIONS`).
    pub const fn new(slot: u32, generation: u16) -> Self {
        let generation = generation as u32 & (Self::GENERATIONS - 1);
        ServiceId((generation << Self::SLOT_BITS) | (slot & (Self::SLOTS - 1)))
    }

    /// Index into per-service maps.
    #[inline(always)]
    pub const fn slot(self) -> u32 {
        self.0 & (Self::SLOTS - 1)
    }

    /// Which of the services that held the slot.
    pub const fn generation(self) -> u16 {
        (self.0 >> Self::SLOT_BITS) as u16
    }
}

/// Value of the service map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Service {
    /// Service id (its slot indexes the service statistics map).
    pub id: ServiceId,
    /// `SERVICE_SNAT`, `SERVICE_REPLY_ENTRY` or 0, host order.
    pub flags: u32,
    /// The service's Maglev table, a region of the pool (`map_names::MAGLEV`): its
    /// first entry in the low 32 bits, its entries (one of `MAGLEV_SIZES`, sized by the
    /// backends that take new flows) in the high 32, host order (`Service::table`).
    /// Size zero: no backend takes new flows, which are dropped
    /// (`Counter::DropNoBackend`). One word, so the kernel program keeps it in one
    /// register (or stack slot). Tables are written before a service points at them,
    /// so switching the backend set is one atomic map update.
    pub table: u64,
}

impl Service {
    /// The `Service::table` word of the region of `size` entries from `start`.
    pub const fn table(start: u32, size: u32) -> u64 {
        ((size as u64) << 32) | start as u64
    }

    /// The first entry of a `Service::table` word's region.
    #[inline(always)]
    pub const fn table_start(table: u64) -> u32 {
        table as u32
    }

    /// The entries of a `Service::table` word's region.
    #[inline(always)]
    pub const fn table_size(table: u64) -> u32 {
        (table >> 32) as u32
    }

    /// The session-affinity timeout (seconds; 0: none) `Service::flags` holds.
    #[inline(always)]
    pub const fn affinity_secs(flags: u32) -> u32 {
        flags >> SERVICE_AFFINITY_SHIFT
    }
}

/// `Service::flags` bit: SNAT mode. New flows also get their source rewritten to the
/// node's address toward the backend (`map_names::SNAT_SOURCES`) and a source port
/// allocated for the flow (`map_names::SNAT_PORTS`), so backends reply to the gateway
/// whatever their routes.
pub const SERVICE_SNAT: u32 = 1;
/// `Service::flags` bit (router mode): a new flow also records a reply entry, because a
/// backend of the service serves more services than the reply index holds.
pub const SERVICE_REPLY_ENTRY: u32 = 2;
/// `Service::flags` bits from this one up: the service's session-affinity timeout in
/// seconds (`Service::affinity_secs`; 0: no affinity). A new flow of such a service
/// goes to the backend its client's last new flow went to (`map_names::AFFINITY`), if
/// that was within the timeout and the backend takes new flows; otherwise Maglev picks
/// by the client's address alone (the same backend on every gateway of a fleet).
pub const SERVICE_AFFINITY_SHIFT: u32 = 8;
/// The longest session-affinity timeout `Service::flags` holds, in seconds.
pub const SERVICE_AFFINITY_MAX_SECS: u32 = u32::MAX >> SERVICE_AFFINITY_SHIFT;

/// Entries of the `map_names::SNAT_PORTS` array: slot 0 and up to 65535 ports.
pub const SNAT_PORT_SLOTS: u32 = 65536;

/// Source ports a new SNAT flow tries (each an insert-if-absent of its reply entry)
/// before it is dropped as `Counter::DropSnatPortsExhausted`.
pub const SNAT_PORT_TRIES: u32 = 4;

/// `Backend::flags` bit: the slot holds a live backend.
pub const BACKEND_LIVE: u32 = 1;

/// Value of the backend array, indexed by backend id.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Backend {
    /// Backend IPv4 address, network order; 0 for an IPv6 backend, whose address is in
    /// `map_names::BACKENDS6` under the same id.
    pub addr: u32,
    /// Backend port, network order.
    pub port: u16,
    /// Weight, host order (0: keeps existing flows, gets no new ones).
    pub weight: u16,
    /// Id of the service this backend belongs to (generation included).
    pub service: ServiceId,
    /// `BACKEND_LIVE` or 0, host order.
    pub flags: u32,
}

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

/// Key of the fragment map: identifies one fragmented IPv4 datagram.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragKey {
    /// Source address, network order.
    pub src: u32,
    /// Destination address, network order.
    pub dst: u32,
    /// IP identification, network order.
    pub id: u16,
    /// IP protocol.
    pub proto: u8,
    /// Always zero.
    pub pad: u8,
}

/// Key of the IPv6 fragment map: identifies one fragmented IPv6 datagram.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragKey6 {
    /// Source address, network order.
    pub src: [u32; 4],
    /// Destination address, network order.
    pub dst: [u32; 4],
    /// The fragment header's identification, network order.
    pub id: u32,
    /// The upper-layer protocol (the fragment header's next header).
    pub proto: u8,
    /// Always zero.
    pub pad: [u8; 3],
}

/// Value of the fragment map: the L4 ports of the datagram, as its first fragment had them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragPorts {
    /// Source port, network order.
    pub sport: u16,
    /// Destination port, network order.
    pub dport: u16,
}

/// Per-service counters, one copy per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServiceStats {
    /// Packets client → backend, host order.
    pub packets: u64,
    /// Bytes (IP length) client → backend, host order.
    pub bytes: u64,
    /// Packets backend → client (reverse NAT), host order.
    pub reply_packets: u64,
    /// Bytes backend → client, host order.
    pub reply_bytes: u64,
    /// Flows assigned a backend, host order.
    pub new_flows: u64,
    /// Packets of this service the kernel forwarded instead of XDP (either direction),
    /// host order.
    pub kernel_packets: u64,
    /// Why, the last time: `Counter` index + 1 (0: never), host order.
    pub kernel_reason: u32,
    /// Always zero.
    pub pad: u32,
}

/// Per-CPU value of the backend statistics map, indexed by backend id: what its flows
/// carried (`ipvsadm --stats` per real server). Zeroed when an id is given to a backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// Packets client → backend, host order.
    pub packets: u64,
    /// Bytes (IP length) client → backend, host order.
    pub bytes: u64,
    /// Packets backend → client, host order.
    pub reply_packets: u64,
    /// Bytes backend → client, host order.
    pub reply_bytes: u64,
    /// Flows it was given, host order.
    pub new_flows: u64,
}

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal,)*) => {
        /// Named per-CPU counters: every verdict other than "pass untouched" counts one.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Counter {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Counter {
            /// All counters in index order.
            pub const ALL: &'static [Counter] = &[$(Counter::$variant,)*];
            /// Number of counters (size of the counter map).
            pub const COUNT: u32 = Self::ALL.len() as u32;

            /// Name used in metrics and test output.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Counter::$variant => $name,)*
                }
            }
        }
    };
}

counters! {
    /// NATed and sent out with `bpf_redirect` into another interface (XDP_REDIRECT).
    Redirect = "redirect",
    /// NATed and sent back out of the receiving interface (XDP_REDIRECT to itself).
    Tx = "tx",
    /// Handed to the kernel to forward: the egress interface takes no XDP frames
    /// (a veth whose peer has neither XDP nor GRO, a bridge, a tunnel, ...).
    KernelNoXdpEgress = "kernel_forward_no_xdp_egress",
    /// Handed to the kernel to forward: the next hop's neighbour entry is not resolved yet.
    KernelNoNeighbour = "kernel_forward_no_neighbour",
    /// Handed to the kernel to forward: longer than the egress MTU (the kernel fragments
    /// it or answers ICMP fragmentation-needed, which is translated back).
    KernelFragNeeded = "kernel_forward_frag_needed",
    /// Handed to the kernel: TTL 1 (the kernel answers ICMP time-exceeded).
    KernelTtl = "kernel_forward_ttl",
    /// Handed to the kernel: the FIB has no usable route (unreachable, blackhole,
    /// prohibited, local); the kernel answers or drops it as its routes say.
    KernelNoRoute = "kernel_forward_no_route",
    /// Handed to the kernel, which will drop it: forwarding is disabled on the ingress
    /// interface (`net.ipv4.conf.*.forwarding=0`).
    KernelForwardingOff = "kernel_forward_disabled",
    /// Handed to the kernel: the egress interface's index is beyond `XMIT_SLOTS`.
    KernelEgressUnknown = "kernel_forward_egress_unknown",
    /// A new flow to a service none of whose backends takes new flows (XDP_DROP).
    DropNoBackend = "drop_no_backend",
    /// A packet to a gateway address whose headers are truncated or invalid (XDP_DROP).
    DropMalformed = "drop_malformed",
    /// A non-first fragment to a gateway address whose first fragment was not seen (XDP_DROP).
    DropFragment = "drop_fragment",
    /// A flow was assigned a backend by Maglev and recorded.
    NewFlow = "new_flow",
    /// A tracked flow whose backend was removed was balanced again.
    BackendGone = "backend_gone",
    /// An ICMP error about a NATed flow was translated by XDP.
    IcmpTranslated = "icmp_translated",
    /// A non-first fragment followed its first fragment's flow.
    FragmentTranslated = "fragment_translated",
    /// A reply the kernel forwarded was translated on egress by the TC program.
    TcReply = "tc_reply_translated",
    /// An ICMP error about a NATed flow (also one the gateway itself sent, such as
    /// fragmentation-needed) was translated on egress by the TC program.
    TcIcmp = "tc_icmp_translated",
    /// A reply (or ICMP error) of a tracked flow the TC program could not rewrite (an
    /// skb helper failed): it left untranslated, and its receiver will drop it.
    TcUntranslated = "tc_untranslated",
    /// A redirect the kernel refused after the program returned (tracepoint
    /// `xdp:xdp_redirect_err`): the frame was lost.
    RedirectError = "redirect_error",
    /// A conntrack entry of a removed service (whose ids another service may hold now)
    /// was not used: a forward packet is balanced afresh by the service it addresses
    /// now (or passes untouched if there is none), a reply (or ICMP error) passes
    /// untranslated. Each program that sees such a packet counts it.
    CtStaleService = "ct_stale_service",
    /// A SNAT-mode flow was given a node source port and recorded.
    SnatNewFlow = "snat_new_flow",
    /// A SNAT source port a new flow tried was taken; it tried the next.
    SnatPortRetry = "snat_port_retry",
    /// A new SNAT flow found no free source port in `SNAT_PORT_TRIES` tries (XDP_DROP):
    /// the port range is too small for the flows toward that backend.
    DropSnatPortsExhausted = "drop_snat_ports_exhausted",
    /// A new SNAT flow to a backend with no known node address toward it (no route, or
    /// the daemon has not resolved it yet) (XDP_DROP).
    DropSnatNoSource = "drop_snat_no_source",
    /// A SNAT-mode forward packet the kernel forwarded got its node source address
    /// and port on egress by the TC program.
    TcMasq = "tc_masq_translated",
    /// A new flow above the new-flow limit of its CPU (`config::NEW_FLOW_LIMIT`) was
    /// balanced by Maglev and forwarded without a conntrack entry: its packets keep going
    /// to the same backend while the backends do not change. So was a reply matched by
    /// Maglev (`ct_miss_reply`): a SYN flood's SYN-ACKs evict no established flow.
    FloodUntracked = "flood_untracked",
    /// A packet from a backend endpoint of a service (one the reply index lists) matched
    /// no flow, and Maglev maps its tuple to another backend (the backend set changed
    /// since its flow began, or it is not a reply through the gateway): it passed
    /// untranslated.
    ReplyUntracked = "reply_untracked",
    /// A conntrack entry was created (forward, reply or kernel-path entry). Created minus
    /// live entries is what the LRU evicted (the kernel does not count evictions).
    CtCreated = "ct_created",
    /// An IPv6 packet passed untouched because an IPv6 program (`berth_v6`,
    /// `berth_icmp6`, `berth_tc_v6`) could not be entered (its tail-call slot was empty:
    /// a loader that did not fill it).
    Ipv6NoProgram = "ipv6_no_program",
    /// An ICMPv6 redirect the host sent out of an `--interface` was dropped by the TC
    /// program: it would tell a backend to reach its client directly, around the
    /// gateway's NAT (a one-armed gateway). IPv4's redirects are turned off
    /// (`send_redirects`); IPv6 has no such switch.
    TcRedirectDropped = "tc_icmp6_redirect_dropped",
    /// A SNAT flow's node port was claimed by another flow after the full conntrack
    /// evicted the flow's reply entry (the port's lock): the flow was balanced again and
    /// leaves from another port, which breaks a TCP connection. The conntrack is too
    /// small for the flows (`--conntrack-size`).
    SnatPortLost = "snat_port_lost",
    /// An ICMP error addressed to a gateway address that XDP left untranslated: its
    /// quote cannot be read (IP options, IPv6 extension headers other than a first
    /// fragment's fragment header, a later fragment, cut short) or is of no tracked
    /// flow. It goes to the kernel, and the quoted packet's sender never learns of it.
    IcmpUntranslated = "icmp_untranslated",
    /// A TCP segment without SYN to a service found no conntrack entry (its flow began
    /// on another gateway behind the same ECMP route, or its entry was evicted, or its
    /// backend removed): balanced by Maglev like a new flow (counted as `new_flow` too)
    /// and recorded, so any node carries any packet of a flow while the backends do not
    /// change (Katran's `TCP_NONSYN_LRUMISS`). A UDP datagram without an entry cannot be
    /// told from a new flow's first: it is a `new_flow` only.
    CtMissMidflow = "ct_miss_midflow",
    /// A reply from a backend with no conntrack entry whose tuple Maglev maps to that
    /// backend (its flow began on another gateway, or its entry was evicted): translated
    /// and its flow recorded (not a `new_flow`; over the new-flow limit not recorded,
    /// and counted as `flood_untracked` too).
    CtMissReply = "ct_miss_reply",
    /// A reply (or an ICMP error about a packet sent to a backend) of a tracked flow, or
    /// one Maglev matched, that did not arrive from where the gateway sends its backend's
    /// packets: another interface than the backend's egress, or (XDP, neighbour known)
    /// another source MAC than the backend's next hop. A tenant's backend forging
    /// another tenant's backend address (XDP_DROP; TC: shot).
    ReplySpoofed = "reply_spoofed",
    /// A TCP segment to a service that would open a flow with flags no TCP sends: none,
    /// SYN+FIN, SYN+RST, or FIN+PSH+URG (Xmas) (XDP_DROP).
    DropTcpFlags = "drop_tcp_flags",
    /// A packet to a service that would open a flow whose source is a gateway address
    /// (one Berth serves): forged, or looping (XDP_DROP).
    DropGatewaySource = "drop_gateway_source",
    /// An event `berth monitor` asked for that was not sent: over its CPU's rate
    /// (`config::MONITOR_RATE`) or the ring buffer was full.
    MonitorLost = "monitor_lost",
}

impl Counter {
    /// Whether a packet counted so is an event for `berth monitor`: what the XDP and TC
    /// programs count but the ordinary course of a flow (sent by XDP, recorded,
    /// translated by TC) and the monitor's own loss.
    pub const fn is_event(self) -> bool {
        !matches!(
            self,
            Counter::Redirect
                | Counter::Tx
                | Counter::NewFlow
                | Counter::FragmentTranslated
                | Counter::TcReply
                | Counter::TcMasq
                | Counter::TcIcmp
                | Counter::SnatNewFlow
                | Counter::CtCreated
                | Counter::RedirectError
                | Counter::MonitorLost
        )
    }

    /// The counter with index `i`, if any.
    pub fn from_index(i: u32) -> Option<Counter> {
        Counter::ALL.get(i as usize).copied()
    }
}

/// Hash of a flow's 5-tuple, used to pick its Maglev entry. Shared by the kernel
/// program and userspace so tests can predict a flow's backend.
///
/// Inputs are the raw (network order) values as read from the packet. It must stay a
/// pure function of the 5-tuple (no per-node or per-boot seed): gateways sharing one
/// address behind ECMP pick a flow's backend independently and must agree, whichever
/// of them a packet reaches (`Counter::CtMissMidflow`, `Counter::CtMissReply`).
#[inline(always)]
pub fn flow_hash<A: Addr>(src: A, dst: A, sport: u16, dport: u16, proto: u8) -> u32 {
    let ports = ((sport as u32) << 16) | dport as u32;
    let mut h = mix(src.fold() ^ 0x9e37_79b9);
    h = mix(h ^ dst.fold());
    h = mix(h ^ ports);
    mix(h ^ proto as u32)
}

/// Which slot of the SNAT port list (1..=`ports`) a new flow with Maglev hash `hash`
/// tries at attempt `attempt` (0-based): another mix of the flow hash than Maglev's
/// slot, different per attempt. Shared so tests can predict a flow's source port.
#[inline(always)]
pub fn snat_port_slot(hash: u32, attempt: u32, ports: u32) -> u32 {
    let h = mix(hash ^ attempt.wrapping_mul(0x9e37_79b9));
    1 + h % ports
}

/// Murmur3's 32-bit finaliser: cheap and well spread.
#[inline(always)]
const fn mix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

const _: () = {
    assert!(core::mem::size_of::<ServiceId>() == 4);
    assert!(core::mem::size_of::<ServiceKey>() == 8);
    assert!(core::mem::size_of::<Service>() == 16);
    assert!(core::mem::size_of::<Backend>() == 16);
    assert!(core::mem::size_of::<FlowKey>() == 16);
    assert!(core::mem::size_of::<FlowKey<[u32; 4]>>() == 40);
    assert!(core::mem::size_of::<Flow<[u32; 4]>>() == 80);
    assert!(core::mem::size_of::<ServiceKey<[u32; 4]>>() == 20);
    assert!(core::mem::size_of::<ReplyIndex<[u32; 4]>>() == 84);
    assert!(core::mem::size_of::<NextHop>() == 24);
    assert!(core::mem::size_of::<FragKey6>() == 40);
    assert!(core::mem::size_of::<Flow>() == 56);
    assert!(core::mem::size_of::<ReplyIndex>() == 36);
    assert!(core::mem::size_of::<FragKey>() == 12);
    assert!(core::mem::size_of::<FragPorts>() == 4);
    assert!(core::mem::size_of::<ServiceStats>() == 56);
    assert!(core::mem::size_of::<FloodWindow>() == 8);
    assert!(core::mem::size_of::<AffinityKey>() == 8);
    assert!(core::mem::size_of::<AffinityKey<[u32; 4]>>() == 20);
    assert!(core::mem::size_of::<Affinity>() == 8);
    assert!(core::mem::size_of::<BackendStats>() == 40);
    assert!(core::mem::size_of::<MonitorEvent>() == 288);
    // The monitor's reasons are two 32-bit masks (`config::MONITOR_REASONS_LO`).
    assert!(Counter::COUNT <= 64);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;

    macro_rules! pod {
        ($($t:ty),*) => {$(
            // SAFETY: a `repr(C)`, `Copy` map type with no implicit padding (padding is a
            // named field) and no invalid bit patterns; its size is pinned above.
            unsafe impl aya::Pod for $t {}
        )*};
    }

    // The same for the types generic over the address (both instances' sizes are
    // pinned above).
    macro_rules! pod_addr {
        ($($t:ident),*) => {$(
            // SAFETY: as for `pod!`, for either address type.
            unsafe impl<A: Addr + aya::Pod> aya::Pod for $t<A> {}
        )*};
    }

    pod_addr!(ServiceKey, FlowKey, Flow, ReplyIndex, AffinityKey);
    pod!(
        Service,
        Affinity,
        Backend,
        BackendStats,
        NextHop,
        FragKey,
        FragKey6,
        FragPorts,
        ServiceStats,
        FloodWindow
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maglev_sizes_are_increasing_primes_with_100_entries_per_backend() {
        let prime = |n: u32| {
            n > 1
                && (2..)
                    .take_while(|d| d * d <= n)
                    .all(|d| !n.is_multiple_of(d))
        };
        assert!(MAGLEV_SIZES.iter().all(|&n| prime(n)), "{MAGLEV_SIZES:?}");
        assert!(MAGLEV_SIZES.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(maglev_size(0), 0);
        assert_eq!(maglev_size(1), 1);
        assert_eq!(maglev_size(2), 211);
        for n in 2..=1000 {
            let size = maglev_size(n);
            assert!(size >= (100 * n).min(MAGLEV_MAX_SIZE), "{n}: {size}");
        }
        assert_eq!(maglev_size(u32::MAX), MAGLEV_MAX_SIZE);
    }

    #[test]
    fn a_service_table_word_holds_its_start_and_size() {
        let word = Service::table(0x1fff_ffff, MAGLEV_MAX_SIZE);
        assert_eq!(Service::table_start(word), 0x1fff_ffff);
        assert_eq!(Service::table_size(word), MAGLEV_MAX_SIZE);
    }

    /// `flow_hash` must give every node the same value for a tuple (see its doc): these
    /// values were computed outside this code, from the definition.
    #[test]
    fn the_flow_hash_is_the_same_on_every_node_and_boot() {
        let v4 = |a: [u8; 4]| u32::from_ne_bytes(a);
        let port = |p: u16| p.to_be();
        assert_eq!(
            flow_hash(
                v4([10, 0, 0, 1]),
                v4([10, 0, 0, 2]),
                port(40000),
                port(80),
                6
            ),
            0xc1df_8121
        );
        let v6 = |last: u8| {
            let mut bytes = [0u8; 16];
            (bytes[0], bytes[15]) = (0xfd, last);
            core::array::from_fn::<u32, 4, _>(|i| {
                u32::from_ne_bytes([
                    bytes[4 * i],
                    bytes[4 * i + 1],
                    bytes[4 * i + 2],
                    bytes[4 * i + 3],
                ])
            })
        };
        assert_eq!(
            flow_hash(v6(1), v6(2), port(40000), port(80), 17),
            0xb25e_2640
        );
    }
}
