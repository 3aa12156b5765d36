//! Types shared by the XDP program (`gateway-ebpf`) and userspace (`gateway-daemon`).
//!
//! Every map key and value is `#[repr(C)]`, `Copy`, free of `bool` and of implicit
//! padding (padding is a named field, always zero). Each field documents its byte order:
//! "network" fields hold the bytes exactly as they appear on the wire, read as a native
//! integer; "host" fields are ordinary native integers.
#![no_std]

mod addr;
mod counters;
mod flow;
mod monitor;
mod xmit;

pub use addr::*;
pub use counters::Counter;
pub use flow::*;
pub use monitor::*;
pub use xmit::*;

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

pub mod map_names;

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

pub mod config;

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

pub mod proto;

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
pub(crate) const fn mix(mut h: u32) -> u32 {
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
    assert!(core::mem::size_of::<FdbKey>() == 12);
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
        FdbKey,
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
