//! The datapath's maps of services, backends, flows and counters, each with its key and
//! value types (the address filter and reply index are `roles.rs`'s, the SNAT maps
//! `snat.rs`'s).

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    Ebpf,
};
use gateway_common::{map_names, Backend, BackendStats, NextHop, ServiceStats};

use super::{apply::ServiceMap, family::Addr6, load::take, ByFamily, Conntrack, Result};

/// The maps, taken from the loaded object.
pub(super) struct Maps {
    /// (gateway address, protocol, port) → service, per family.
    pub(super) services: ByFamily<ServiceMap<u32>, ServiceMap<Addr6>>,
    /// Gateway address → how many services it has, per family.
    pub(super) addresses: ByFamily<HashMap<MapData, u32, u32>, HashMap<MapData, Addr6, u32>>,
    /// The Maglev tables' pool.
    pub(super) maglev: Array<MapData, u32>,
    /// Backends by id.
    pub(super) backends: Array<MapData, Backend>,
    /// The addresses of IPv6 backends (by backend id, as `backends`).
    pub(super) backends6: Array<MapData, Addr6>,
    /// Each backend's next hop.
    pub(super) backend_hops: Array<MapData, NextHop>,
    /// Flows, per family.
    pub(super) conntrack: ByFamily<Conntrack<u32>, Conntrack<Addr6>>,
    /// Verdict counters by reason, per CPU.
    pub(super) counters: PerCpuArray<MapData, u64>,
    /// Per service id: what its flows carried.
    pub(super) service_stats: PerCpuArray<MapData, ServiceStats>,
    /// Per backend id: what its flows carried (zeroed when an id is given out).
    pub(super) backend_stats: PerCpuArray<MapData, BackendStats>,
}

impl Maps {
    /// Takes the maps out of `ebpf`.
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self> {
        Ok(Maps {
            services: ByFamily {
                v4: take(ebpf, map_names::SERVICES)?,
                v6: take(ebpf, map_names::SERVICES6)?,
            },
            addresses: ByFamily {
                v4: take(ebpf, map_names::ADDRESSES)?,
                v6: take(ebpf, map_names::ADDRESSES6)?,
            },
            maglev: take(ebpf, map_names::MAGLEV)?,
            backends: take(ebpf, map_names::BACKENDS)?,
            backends6: take(ebpf, map_names::BACKENDS6)?,
            backend_hops: take(ebpf, map_names::BACKEND_HOPS)?,
            conntrack: ByFamily {
                v4: take(ebpf, map_names::CONNTRACK)?,
                v6: take(ebpf, map_names::CONNTRACK6)?,
            },
            counters: take(ebpf, map_names::COUNTERS)?,
            service_stats: take(ebpf, map_names::SERVICE_STATS)?,
            backend_stats: take(ebpf, map_names::BACKEND_STATS)?,
        })
    }
}
