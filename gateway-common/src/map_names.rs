//! Names of the maps, which are also their file names under the pin directory.

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
/// `FdbKey` (bridge, MAC) → the bridge port that holds the MAC (host order), for the
/// bridges `berth_xmit` marks `XMIT_TC_BRIDGE`. Written by the daemon from the kernel's
/// forwarding databases.
pub const FDB: &str = "berth_fdb";

/// Every map, in a fixed order.
pub const ALL: [&str; 31] = [
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
    FDB,
];
