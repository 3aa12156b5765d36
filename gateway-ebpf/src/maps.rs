//! Map definitions. Sizes here are defaults; the loader overrides them (see
//! `gateway_common::map_names` for what each holds). The daemon writes every map
//! except the conntrack, the fragments and the counters, which only the programs write.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray},
};
use gateway_common::{
    config, Addr, Affinity, AffinityKey, Backend, BackendStats, Counter, FdbKey, FloodWindow, Flow,
    FlowKey, FragKey, FragKey6, FragPorts, NextHop, ReplyIndex, Service, ServiceId, ServiceKey,
    ServiceStats, ADDR_BACKEND, ADDR_FILTER_SLOTS, ADDR_GATEWAY, AFFINITY_ENTRIES, FDB_ENTRIES,
    SNAT_PORT_SLOTS, XMIT_SLOTS,
};

const SERVICES_MAX: u32 = 1024;

/// (gateway address, protocol, port) → service. Written by the daemon.
#[map(name = "berth_services")]
pub static SERVICES: HashMap<ServiceKey, Service> = HashMap::with_max_entries(SERVICES_MAX, 0);

/// Gateway address → number of services on it. Written by the daemon.
#[map(name = "berth_addrs")]
pub static ADDRESSES: HashMap<u32, u32> = HashMap::with_max_entries(256, 0);

/// Maglev tables of all services, one pool: entry → backend id. A service's table is
/// the region its `Service` points at. Written by the daemon.
#[map(name = "berth_maglev")]
pub static MAGLEV: Array<u32> = Array::with_max_entries(SERVICES_MAX * 128, 0);

/// Backend id → endpoint and weight. Written by the daemon.
#[map(name = "berth_backends")]
pub static BACKENDS: Array<Backend> = Array::with_max_entries(16384, 0);

/// Backend id → the node's address toward it (SNAT mode's source; 0: none known).
/// Written by the daemon as routes and addresses change.
#[map(name = "berth_snat_src")]
pub static SNAT_SOURCES: Array<u32> = Array::with_max_entries(16384, 0);

/// Slot 0: how many SNAT source ports; slots 1..=n: the ports, network order. Written
/// by the daemon (its `--snat-ports` range minus every listener range).
#[map(name = "berth_snat_ports")]
pub static SNAT_PORTS: Array<u32> = Array::with_max_entries(SNAT_PORT_SLOTS, 0);

/// Conntrack: 5-tuple → translation. Written by the XDP program (new flows).
#[map(name = "berth_ct")]
pub static CONNTRACK: LruHashMap<FlowKey, Flow> = LruHashMap::with_max_entries(65536, 0);

/// A client of a service with session affinity → its backend. Written by the XDP
/// program (new flows).
#[map(name = "berth_affinity")]
pub static AFFINITY: LruHashMap<AffinityKey, Affinity> =
    LruHashMap::with_max_entries(AFFINITY_ENTRIES, 0);

/// Fragmented datagrams → their ports. Written by both programs.
#[map(name = "berth_frags")]
pub static FRAGMENTS: LruHashMap<FragKey, FragPorts> = LruHashMap::with_max_entries(8192, 0);

/// Backend endpoint → the router-mode services it serves. Written by the daemon.
#[map(name = "berth_reply_index")]
pub static REPLY_INDEX: HashMap<ServiceKey, ReplyIndex> = HashMap::with_max_entries(16384, 0);

/// `addr_slot(address)` → `ADDR_*` role bits. Written by the daemon.
#[map(name = "berth_addr_filter")]
pub static ADDR_FILTER: Array<u32> = Array::with_max_entries(ADDR_FILTER_SLOTS, 0);

/// The `ADDR_*` roles some address hashing to `addr`'s slot has (0: none).
#[inline(always)]
fn addr_roles<A: Addr>(addr: A) -> u32 {
    ADDR_FILTER
        .get(gateway_common::addr_slot(addr))
        .copied()
        .unwrap_or(0)
}

/// What a packet's addresses may be, from two array lookups (`berth_addr_filter`): a
/// packet with neither role is none of the program's business, known without any hash
/// lookup. Either role may be a false positive (another address sharing the slot).
#[derive(Clone, Copy)]
pub struct Roles {
    /// The destination may be a gateway address.
    pub to_gateway: bool,
    /// The source may be a backend address.
    pub from_backend: bool,
}

impl Roles {
    /// The roles of a packet from `src` to `dst` (network order).
    #[inline(always)]
    pub fn of<A: Addr>(src: A, dst: A) -> Self {
        Roles {
            to_gateway: addr_roles(dst) & ADDR_GATEWAY != 0,
            from_backend: addr_roles(src) & ADDR_BACKEND != 0,
        }
    }

    /// Whether `addr` may be a gateway address (the filter's answer: a false positive
    /// is possible, a false negative is not).
    #[inline(always)]
    pub fn may_be_gateway<A: Addr>(addr: A) -> bool {
        addr_roles(addr) & ADDR_GATEWAY != 0
    }

    /// Neither role: the packet passes untouched.
    #[inline(always)]
    pub fn none(self) -> bool {
        !self.to_gateway && !self.from_backend
    }
}

/// Backend id → the next hop toward it, shared by the forward packets of all its flows
/// (a new flow needs no FIB lookup of its own). Written by the XDP program; cleared by
/// the daemon when it gives the id to a backend.
#[map(name = "berth_backend_hops")]
pub static BACKEND_HOPS: Array<NextHop> = Array::with_max_entries(16384, 0);

/// The next-hop cache of backend `id`.
#[inline(always)]
pub fn backend_hop(id: u32) -> Option<*mut NextHop> {
    BACKEND_HOPS.get_ptr_mut(id)
}

/// Per-CPU scratch space for the flow a packet is translated with (a new flow before
/// it is recorded, a reply's translation): too large for the 512-byte stack beside the
/// rest. Written and read by the XDP program within one run.
#[map(name = "berth_scratch")]
pub static SCRATCH: PerCpuArray<Flow> = PerCpuArray::with_max_entries(1, 0);

/// `config::*` slot → value. Written by the daemon at start.
#[map(name = "berth_config")]
pub static CONFIG: Array<u32> = Array::with_max_entries(config::SLOTS, 0);

/// New flows this CPU saw in the current second. Written by the XDP program.
#[map(name = "berth_flood")]
pub static FLOOD: PerCpuArray<FloodWindow> = PerCpuArray::with_max_entries(1, 0);

/// Named counters, per CPU. Written by both programs.
#[map(name = "berth_counters")]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// Service slot → packet counters, per CPU. Written by both programs.
#[map(name = "berth_svc_stats")]
pub static SERVICE_STATS: PerCpuArray<ServiceStats> =
    PerCpuArray::with_max_entries(SERVICES_MAX, 0);

/// Backend id → what its flows carried (per CPU). Written by the programs (zeroed by the
/// daemon when it gives an id to a backend).
#[map(name = "berth_backend_stats")]
pub static BACKEND_STATS: PerCpuArray<BackendStats> = PerCpuArray::with_max_entries(16384, 0);

/// Interface index → `XMIT_OK` if it accepts redirected XDP frames. Written by the
/// daemon as the kernel announces link and `xdp-features` changes.
#[map(name = "berth_xmit")]
pub static XMIT: Array<u32> = Array::with_max_entries(XMIT_SLOTS, 0);

/// (bridge, MAC) → the bridge port holding the MAC, for the bridges `XMIT` marks
/// `XMIT_TC_BRIDGE`. Written by the daemon from the kernel's forwarding databases.
#[map(name = "berth_fdb")]
pub static FDB: HashMap<FdbKey, u32> = HashMap::with_max_entries(FDB_ENTRIES, 0);

/// Adds one to a named counter on this CPU.
#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe { *slot += 1 };
    }
    if counter.is_event() {
        crate::monitor::note(counter);
    }
}

/// Whether `addr` (network order) is a gateway address of some service.
#[inline(always)]
pub fn is_gateway_address<A: crate::family::Family>(addr: A) -> bool {
    // SAFETY: the value is only tested for presence.
    unsafe { A::addresses().get(addr).is_some() }
}

/// Direction of a NATed packet, for statistics.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client → backend.
    Forward,
    /// Backend → client.
    Reply,
}

/// Accounts one packet of `len` bytes to a service and to its backend (`backend`: its
/// id).
#[inline(always)]
pub fn account(service: ServiceId, backend: u32, dir: Direction, len: u64, new_flow: bool) {
    if let Some(stats) = SERVICE_STATS.get_ptr_mut(service.slot()) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        let stats = unsafe { &mut *stats };
        match dir {
            Direction::Forward => {
                stats.packets += 1;
                stats.bytes += len;
            }
            Direction::Reply => {
                stats.reply_packets += 1;
                stats.reply_bytes += len;
            }
        }
        stats.new_flows += u64::from(new_flow);
    }
    if let Some(stats) = BACKEND_STATS.get_ptr_mut(backend) {
        // SAFETY: as above.
        let stats = unsafe { &mut *stats };
        match dir {
            Direction::Forward => {
                stats.packets += 1;
                stats.bytes += len;
            }
            Direction::Reply => {
                stats.reply_packets += 1;
                stats.reply_bytes += len;
            }
        }
        stats.new_flows += u64::from(new_flow);
    }
}

/// Notes that a forward packet of a service was handed to TC (`handoff.rs`): not a
/// packet the kernel forwards, but the reason its replies' kernel path is shown with
/// (it replaces a reason the flow's first packets left, such as an unresolved
/// neighbour, which no longer holds).
#[inline(always)]
pub fn account_handoff(service: ServiceId) {
    if let Some(stats) = SERVICE_STATS.get_ptr_mut(service.slot()) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe { (*stats).kernel_reason = Counter::TcRedirect as u32 + 1 };
    }
}

/// Accounts one packet of a service that the kernel forwards instead of XDP, and why.
/// `TcReply` (replies translated on egress) is only a reason while XDP gave none: the
/// forward path's reason says more.
#[inline(always)]
pub fn account_kernel(service: ServiceId, reason: Counter) {
    let Some(stats) = SERVICE_STATS.get_ptr_mut(service.slot()) else {
        return;
    };
    // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
    let stats = unsafe { &mut *stats };
    stats.kernel_packets += 1;
    if reason != Counter::TcReply || stats.kernel_reason == 0 {
        stats.kernel_reason = reason as u32 + 1;
    }
}

/// Slot 0: the id of the loaded gateway XDP program (written by the daemon), so that
/// the redirect-error tracepoint counts only its errors.
#[map(name = "berth_prog")]
pub static PROGRAM_ID: Array<u32> = Array::with_max_entries(1, 0);

/// Whether `id` is the gateway program's id.
#[inline(always)]
pub fn is_gateway_program(id: u32) -> bool {
    PROGRAM_ID
        .get(0)
        .is_some_and(|&ours| ours != 0 && ours == id)
}

/// A conntrack entry being inserted, with its key: built here rather than on the
/// stack (see `conntrack::entry::insert_staged`).
#[repr(C)]
pub struct Pending<A: Addr> {
    pub key: FlowKey<A>,
    pub flow: Flow<A>,
}

/// This CPU's pending entry (IPv4). Written and read by the program within one run.
#[map(name = "berth_pending")]
pub static PENDING: PerCpuArray<Pending<u32>> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's pending entry (IPv6).
#[map(name = "berth_pending6")]
pub static PENDING6: PerCpuArray<Pending<Addr6>> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's `bpf_fib_lookup` parameters (see `fwd::fib`). Written and read by the
/// programs within one run.
#[map(name = "berth_fib")]
pub static FIB_PARAMS: PerCpuArray<aya_ebpf::bindings::bpf_fib_lookup> =
    PerCpuArray::with_max_entries(1, 0);

/// A per-CPU word a value goes through so that the verifier forgets its bounds
/// (`opaque`).
#[map(name = "berth_opaque")]
pub static OPAQUE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// `value`, stored to and loaded from this CPU's scratch word (`OPAQUE`): the verifier
/// forgets what it knew of it, so that paths which differ only in it are checked once
/// from there on, not once per value (see where it is used).
#[inline(always)]
pub fn opaque(value: u64) -> u64 {
    let Some(slot) = OPAQUE.get_ptr_mut(0) else {
        return value;
    };
    // SAFETY: per-CPU slot, used only by this CPU while the program runs.
    unsafe {
        core::ptr::write_volatile(slot, value);
        core::ptr::read_volatile(slot)
    }
}

/// An IPv6 address as the IPv6 maps hold it (16 bytes, network order).
pub type Addr6 = [u32; 4];

/// IPv6: (gateway address, protocol, port) → service. Written by the daemon.
#[map(name = "berth_services6")]
pub static SERVICES6: HashMap<ServiceKey<Addr6>, Service> =
    HashMap::with_max_entries(SERVICES_MAX, 0);

/// IPv6 gateway address → number of services on it. Written by the daemon.
#[map(name = "berth_addrs6")]
pub static ADDRESSES6: HashMap<Addr6, u32> = HashMap::with_max_entries(256, 0);

/// IPv6 conntrack: 5-tuple → translation. Written by the XDP program (new flows);
/// sized by the daemon as the IPv4 one (`--conntrack-size`).
#[map(name = "berth_ct6")]
pub static CONNTRACK6: LruHashMap<FlowKey<Addr6>, Flow<Addr6>> =
    LruHashMap::with_max_entries(1024, 0);

/// IPv6 backend endpoint → the router-mode services it serves. Written by the daemon.
#[map(name = "berth_reply_index6")]
pub static REPLY_INDEX6: HashMap<ServiceKey<Addr6>, ReplyIndex<Addr6>> =
    HashMap::with_max_entries(16384, 0);

/// Backend id → its IPv6 address (for the backends of IPv6 services; `Backend::addr`
/// holds IPv4 ones). Written by the daemon.
#[map(name = "berth_backends6")]
pub static BACKENDS6: Array<Addr6> = Array::with_max_entries(16384, 0);

/// Backend id → the node's IPv6 address toward it (SNAT mode; zero: none known).
/// Written by the daemon.
#[map(name = "berth_snat_src6")]
pub static SNAT_SOURCES6: Array<Addr6> = Array::with_max_entries(16384, 0);

/// IPv6: a client of a service with session affinity → its backend.
#[map(name = "berth_affinity6")]
pub static AFFINITY6: LruHashMap<AffinityKey<Addr6>, Affinity> =
    LruHashMap::with_max_entries(AFFINITY_ENTRIES, 0);

/// Fragmented IPv6 datagrams → their ports. Written by the programs.
#[map(name = "berth_frags6")]
pub static FRAGMENTS6: LruHashMap<FragKey6, FragPorts> = LruHashMap::with_max_entries(8192, 0);

/// The IPv6 program's per-CPU flow slot (see `SCRATCH`).
#[map(name = "berth_scratch6")]
pub static SCRATCH6: PerCpuArray<Flow<Addr6>> = PerCpuArray::with_max_entries(1, 0);

/// The IPv6 program's per-CPU slot for the packet's tuple: on the stack it took the
/// 40 bytes `berth_v6` needed to note TCP state (issue 30).
#[map(name = "berth_tuple6")]
pub static TUPLE6: PerCpuArray<FlowKey<Addr6>> = PerCpuArray::with_max_entries(1, 0);

/// Programs entered by tail call, filled by the loader: slot `PROG_V6` is `berth_v6`,
/// which the gateway program enters for IPv6 frames (its own 512-byte stack), slot
/// `PROG_ICMP6` is `berth_icmp6`, which `berth_v6` enters for ICMPv6 (the error
/// translation does not fit beside the rest of `berth_v6` in one stack).
/// Slot `PROG_MONITOR` is `berth_monitor`, which sends an event (`monitor.rs`).
#[map(name = "berth_progs")]
pub static PROGRAMS: ProgramArray = ProgramArray::with_max_entries(3, 0);

/// `berth_progs` slot of the IPv6 gateway program.
pub const PROG_V6: u32 = 0;
/// `berth_progs` slot of the ICMPv6 program.
pub const PROG_ICMP6: u32 = 1;
/// `berth_progs` slot of the monitor's program.
pub const PROG_MONITOR: u32 = 2;

/// The TC program's tail-call slots, filled by the loader: slot `PROG_V6` is
/// `berth_tc_v6`, which `berth_tc` enters for IPv6 frames (a TC program cannot enter
/// the XDP programs' array); slot `PROG_TC_MONITOR` is `berth_tc_monitor`.
#[map(name = "berth_tc_progs")]
pub static TC_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(3, 0);

/// `berth_tc_progs` slot of the TC monitor program (`monitor::send`).
pub const PROG_TC_MONITOR: u32 = 2;

/// `berth_tc_progs` slot of the TC program's ICMPv6 part (`berth_tc_icmp6`), which
/// `berth_tc_v6` enters for ICMPv6 (its header copies need a stack of their own).
pub const PROG_TC_ICMP6: u32 = 1;
