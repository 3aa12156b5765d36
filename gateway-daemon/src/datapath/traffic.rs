//! What the datapath counted: named counters, per-service statistics and the tracked
//! flows, read from the maps in batches.

use std::collections::{BTreeMap, HashMap as StdHashMap};
use std::io;

use gateway_common::{map_names, Counter, Flow, FlowKey, ServiceId, ServiceStats};

use super::{
    family::{Addr6, MapAddr},
    map_err, nr_cpus, retired,
    snat::{expire_idle, SnatFlows, SNAT_IDLE_TCP},
    syscall_err, Conntrack, Datapath, DatapathError, Result, ServiceAddr,
};
use crate::sys::bpf::{lookup_batch_until, read_pod};

/// A service's recently active flows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ActiveFlows {
    /// All of them.
    pub all: u64,
    /// Those in SNAT mode.
    pub snat: u64,
}

/// One scan of the conntrack: each service's recently active flows and the table's
/// occupancy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowScan {
    /// Per service, its recently active flows.
    pub active: BTreeMap<ServiceAddr, ActiveFlows>,
    /// Entries in the tables (every kind, active or not; IPv4 and IPv6 together).
    pub entries: u64,
    /// Entries in the fuller of the two tables (each holds `conntrack_capacity`).
    pub fullest: u64,
    /// Idle SNAT flows whose entries the scan deleted.
    pub snat_expired: usize,
    /// Per TCP service with backends that left it, the connections they still carry
    /// (`retired`).
    pub on_removed_backends: BTreeMap<ServiceAddr, u64>,
    /// Per backend (of a service, or that left one and carries connections), its
    /// recently active flows (those with none are left out).
    pub per_backend: BTreeMap<(ServiceAddr, std::net::SocketAddr), u64>,
}

/// What the datapath counted for one service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Packets, bytes and new flows, summed over CPUs.
    pub stats: ServiceStats,
    /// Tracked flows that forwarded a packet recently.
    pub active_flows: u64,
    /// Of those, the flows in SNAT mode.
    pub snat_flows: u64,
    /// TCP connections still on backends that left the service (they keep them until
    /// they end).
    pub removed_backend_flows: u64,
    /// Since when packets were forwarded to the backends without a reply coming back
    /// (None: replies keep up, or nothing was forwarded).
    pub unanswered_since: Option<std::time::Instant>,
}

impl Traffic {
    /// The traffic of two services together (a route served on several addresses).
    pub fn plus(self, other: &Traffic) -> Traffic {
        Traffic {
            stats: add_stats(self.stats, &other.stats),
            active_flows: self.active_flows + other.active_flows,
            snat_flows: self.snat_flows + other.snat_flows,
            removed_backend_flows: self.removed_backend_flows + other.removed_backend_flows,
            unanswered_since: match (self.unanswered_since, other.unanswered_since) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            },
        }
    }

    /// How this service's packets leave: `None` before any packet, "xdp" while XDP
    /// sends nearly all (the first packet to a backend whose neighbour entry is not
    /// resolved yet goes through the kernel anyway), else "kernel: <why>".
    pub fn path(&self) -> Option<String> {
        let all = self.stats.packets + self.stats.reply_packets;
        if all == 0 {
            return None;
        }
        if self.stats.kernel_packets * 20 <= all {
            return Some("xdp".into());
        }
        let why = self
            .stats
            .kernel_reason
            .checked_sub(1)
            .and_then(Counter::from_index)
            .map_or("unknown", kernel_reason);
        Some(format!("kernel: {why}"))
    }
}

/// Two services' (or CPUs') counters together.
fn add_stats(a: ServiceStats, b: &ServiceStats) -> ServiceStats {
    ServiceStats {
        packets: a.packets + b.packets,
        bytes: a.bytes + b.bytes,
        reply_packets: a.reply_packets + b.reply_packets,
        reply_bytes: a.reply_bytes + b.reply_bytes,
        new_flows: a.new_flows + b.new_flows,
        kernel_packets: a.kernel_packets + b.kernel_packets,
        kernel_reason: min_reason(a.kernel_reason, b.kernel_reason),
        pad: 0,
    }
}

/// Of two `ServiceStats::kernel_reason`s the one to show: the forward path's reasons
/// (lower indices) over TC's, any over an unresolved neighbour (a flow's first packets
/// only: a CPU keeps it while it sends nothing else through the kernel), any over none
/// (0).
fn min_reason(a: u32, b: u32) -> u32 {
    let transient = Counter::KernelNoNeighbour as u32 + 1;
    match (a, b) {
        (0, r) | (r, 0) => r,
        (r, t) | (t, r) if t == transient => r,
        (x, y) => x.min(y),
    }
}

/// Why a packet took the kernel's path, in words.
pub fn kernel_reason(c: Counter) -> &'static str {
    match c {
        Counter::KernelNoXdpEgress => "egress takes no XDP frames",
        Counter::KernelNoNeighbour => "no neighbour entry yet",
        Counter::KernelFragNeeded => "longer than the egress MTU",
        Counter::KernelTtl => "TTL expired",
        Counter::KernelNoRoute => "no usable route",
        Counter::KernelForwardingOff => "forwarding disabled (dropped)",
        Counter::KernelEgressUnknown => "egress interface index beyond the map",
        Counter::TcReply => "replies arrive where XDP does not run (translated by TC)",
        Counter::TcRedirect => {
            "replies arrive where XDP does not run (translated by TC); forward packets \
             are sent by TC (egress takes no XDP frames)"
        }
        Counter::ReplySpoofed => {
            "a reply or ICMP error with a backend's address arrived from elsewhere than \
             that backend (dropped: forged by another host)"
        }
        other => other.name(),
    }
}

impl Datapath {
    /// Named counters summed over CPUs.
    pub fn counters(&self) -> Result<BTreeMap<&'static str, u64>> {
        Counter::ALL
            .iter()
            .map(|c| {
                let values = self
                    .maps
                    .counters
                    .get(&(*c as u32), 0)
                    .map_err(map_err(map_names::COUNTERS))?;
                Ok((c.name(), values.iter().sum()))
            })
            .collect()
    }

    /// Statistics of the installed services that counted something, summed over CPUs
    /// (a service without a packet is left out: its statistics are all zero).
    pub fn service_stats(&self) -> Result<BTreeMap<ServiceAddr, ServiceStats>> {
        self.service_stats_until(&|| false)
    }

    /// `service_stats`, given up (an `Interrupted` error) once `stop` says so.
    ///
    /// What it holds grows with the services that saw packets, not with those
    /// installed: at 100,000 idle services, a read that kept a value per slot and one
    /// per service held 20 MiB more while it ran, every few seconds.
    pub fn service_stats_until(
        &self,
        stop: &dyn Fn() -> bool,
    ) -> Result<BTreeMap<ServiceAddr, ServiceStats>> {
        use aya::maps::IterableMap as _;
        // Per-CPU values come as one 8-byte-aligned slot per possible CPU.
        let slot = std::mem::size_of::<ServiceStats>().next_multiple_of(8);
        let cpus = nr_cpus()?;
        // The slots that counted something, in the order the array gives them
        // (ascending, sorted again in case a kernel does otherwise).
        let mut counted: Vec<(u32, ServiceStats)> = Vec::new();
        let fd = std::os::fd::AsFd::as_fd(self.maps.service_stats.map().fd());
        lookup_batch_until(fd, 4, slot * cpus, stop, |key, value| {
            let index = u32::from_ne_bytes(key.try_into().unwrap_or_default());
            let sum = value
                .chunks_exact(slot)
                .fold(ServiceStats::default(), |a, v| {
                    // Each slot starts with a ServiceStats.
                    let s: ServiceStats = read_pod(v);
                    add_stats(a, &s)
                });
            if sum != ServiceStats::default() {
                counted.push((index, sum));
            }
        })
        .map_err(batch_err(map_names::SERVICE_STATS))?;
        counted.sort_unstable_by_key(|(index, _)| *index);
        if counted.is_empty() {
            return Ok(BTreeMap::new());
        }
        Ok(self
            .installed
            .iter()
            .filter_map(|(service, svc)| {
                let slot = svc.id.slot();
                let at = counted.binary_search_by_key(&slot, |(i, _)| *i).ok()?;
                Some((*service, counted[at].1))
            })
            .collect())
    }

    /// Statistics of the backends that counted something (those of the installed
    /// services, and those that left a service and still carry connections), summed
    /// over CPUs, by service and endpoint; given up (an `Interrupted` error) once
    /// `stop` says so.
    pub fn backend_stats_until(
        &self,
        stop: &dyn Fn() -> bool,
    ) -> Result<BTreeMap<(ServiceAddr, std::net::SocketAddr), gateway_common::BackendStats>> {
        use aya::maps::IterableMap as _;
        use gateway_common::BackendStats;
        let slot = std::mem::size_of::<BackendStats>().next_multiple_of(8);
        let cpus = nr_cpus()?;
        let mut counted: StdHashMap<u32, BackendStats> = StdHashMap::new();
        let fd = std::os::fd::AsFd::as_fd(self.maps.backend_stats.map().fd());
        lookup_batch_until(fd, 4, slot * cpus, stop, |key, value| {
            let bid = u32::from_ne_bytes(key.try_into().unwrap_or_default());
            let sum = value
                .chunks_exact(slot)
                .fold(BackendStats::default(), |a, v| {
                    let s: BackendStats = read_pod(v);
                    BackendStats {
                        packets: a.packets + s.packets,
                        bytes: a.bytes + s.bytes,
                        reply_packets: a.reply_packets + s.reply_packets,
                        reply_bytes: a.reply_bytes + s.reply_bytes,
                        new_flows: a.new_flows + s.new_flows,
                    }
                });
            if sum != BackendStats::default() {
                counted.insert(bid, sum);
            }
        })
        .map_err(batch_err(map_names::BACKEND_STATS))?;
        if counted.is_empty() {
            return Ok(BTreeMap::new());
        }
        Ok(self
            .backends_by_id()
            .filter_map(|(bid, at)| Some((at, *counted.get(&bid)?)))
            .collect())
    }

    /// Every backend id in use with its service and endpoint: the installed services'
    /// backends and those that left a service and still carry connections.
    fn backends_by_id(
        &self,
    ) -> impl Iterator<Item = (u32, (ServiceAddr, std::net::SocketAddr))> + '_ {
        let installed = self.installed.iter().flat_map(|(s, svc)| {
            svc.backends
                .iter()
                .map(move |(&endpoint, &(bid, _))| (bid, (*s, endpoint)))
        });
        installed.chain(self.retirees.all().map(|(s, r)| (r.bid, (*s, r.endpoint))))
    }

    /// Tracked IPv4 flows, client → gateway direction only.
    pub fn flows(&self) -> Result<Vec<(FlowKey, Flow)>> {
        let mut out = Vec::new();
        self.each_flow(|k, f| {
            if f.kind == gateway_common::NAT_DST {
                out.push((*k, *f));
            }
        })?;
        Ok(out)
    }

    /// One pass over the conntrack: per service, the tracked flows (client → gateway)
    /// that forwarded a packet within about `window` (`Flow::seen`, rewritten about
    /// every second while its packets flow), and how many of them are SNAT flows; the
    /// entries in the table; and, while some service is in SNAT mode, the idle SNAT
    /// flows it deleted (`expire_idle_snat_flows`: their node ports are free again).
    pub fn scan_flows(&mut self, window: std::time::Duration) -> Result<FlowScan> {
        self.scan_flows_until(window, &|| false)
    }

    /// `scan_flows`, given up (an `Interrupted` error, nothing expired) once `stop`
    /// says so.
    pub fn scan_flows_until(
        &mut self,
        window: std::time::Duration,
        stop: &dyn Fn() -> bool,
    ) -> Result<FlowScan> {
        let now = coarse_clock_units();
        let window = u32::try_from(window.as_nanos() >> 20).unwrap_or(u32::MAX);
        let mut per_id: StdHashMap<ServiceId, ActiveFlows> = StdHashMap::new();
        let snat = self.installed.values().any(|svc| svc.snat);
        let (mut snat4, mut snat6) = (
            snat.then(SnatFlows::<u32>::default),
            snat.then(SnatFlows::<Addr6>::default),
        );
        let installed = &self.installed;
        // The idle timeouts a RouteTrafficPolicy sets, by service id, in clock units.
        let idle_of: StdHashMap<ServiceId, u32> = self
            .traffic
            .iter()
            .filter_map(|(s, t)| Some((installed.get(s)?.id, secs_to_units(t.idle_secs?))))
            .collect();
        let mut retired = self
            .retirees
            .scan_begins(|s| installed.get(s).map(|svc| svc.id));
        let mut per_bid: StdHashMap<u32, u64> = StdHashMap::new();
        let mut seen = Seen {
            now,
            window,
            per_id: &mut per_id,
            per_bid: &mut per_bid,
            retired: &mut retired,
            idle_of: &idle_of,
        };
        let (mut idle4, mut idle6) = (Vec::new(), Vec::new());
        let entries = [
            scan(
                &self.maps.conntrack.v4,
                &mut seen,
                snat4.as_mut(),
                &mut idle4,
                stop,
            )?,
            scan(
                &self.maps.conntrack.v6,
                &mut seen,
                snat6.as_mut(),
                &mut idle6,
                stop,
            )?,
        ];
        let idle_expired = expire_router_flows(&mut self.maps.conntrack.v4, idle4)
            + expire_router_flows(&mut self.maps.conntrack.v6, idle6);
        if idle_expired > 0 {
            tracing::debug!(
                flows = idle_expired,
                "router-mode flows past their route's idle timeout were forgotten"
            );
        }
        let on_removed_backends = self.flows_on_retired(&retired);
        if let Err(e) = self.release_idle_retired(&retired) {
            tracing::warn!(
                error = %crate::error_chain(&e),
                "releasing backends that left their services failed"
            );
        }
        let (e4, d4) = snat4.map_or((0, 0), |seen| {
            expire_idle(&mut self.maps.conntrack.v4, seen, &idle_of)
        });
        let (e6, d6) = snat6.map_or((0, 0), |seen| {
            expire_idle(&mut self.maps.conntrack.v6, seen, &idle_of)
        });
        self.snat.deleted += d4 + d6;
        let snat_expired = e4 + e6;
        if snat_expired > 0 {
            tracing::debug!(
                flows = snat_expired,
                "idle SNAT flows gave their node ports back"
            );
        }
        let active = self
            .installed
            .iter()
            .filter_map(|(service, svc)| Some((*service, *per_id.get(&svc.id)?)))
            .collect();
        let per_backend = match per_bid.is_empty() {
            true => BTreeMap::new(),
            false => self
                .backends_by_id()
                .filter_map(|(bid, at)| Some((at, *per_bid.get(&bid)?)))
                .collect(),
        };
        Ok(FlowScan {
            active,
            entries: entries.iter().sum(),
            fullest: entries.iter().copied().max().unwrap_or(0),
            snat_expired,
            on_removed_backends,
            per_backend,
        })
    }

    /// Entries the conntrack of each family can hold (its `max_entries`, checked at
    /// load against a pinned table).
    pub fn conntrack_capacity(&self) -> u32 {
        self.limits.flows
    }

    /// Calls `f` on every IPv4 conntrack entry (see `each_flow_in`).
    pub(super) fn each_flow(&self, f: impl FnMut(&FlowKey, &Flow)) -> Result<()> {
        each_flow_in(&self.maps.conntrack.v4, f)
    }
}

/// What one scan counts, at coarse time `now`: per service, the flows that forwarded
/// a packet within `window`; the live flows of retired backends.
struct Seen<'a> {
    now: u32,
    window: u32,
    per_id: &'a mut StdHashMap<ServiceId, ActiveFlows>,
    /// The same per backend id.
    per_bid: &'a mut StdHashMap<u32, u64>,
    retired: &'a mut retired::ScanOf,
    /// The idle timeouts a RouteTrafficPolicy sets, by service id (clock units).
    idle_of: &'a StdHashMap<ServiceId, u32>,
}

/// A TCP flow's idle timeout in coarse clock units (a flow on a backend that left its
/// service is over after it).
const TCP_IDLE_UNITS: u32 = (SNAT_IDLE_TCP.as_nanos() >> 20) as u32;

/// One family's part of `Datapath::scan_flows`: counts into `seen`, notes SNAT entries
/// into `snat` and the router-mode flows past their service's idle timeout into
/// `idle`; returns the entries seen.
fn scan<A: MapAddr>(
    conntrack: &Conntrack<A>,
    seen: &mut Seen,
    mut snat: Option<&mut SnatFlows<A>>,
    idle: &mut Vec<(FlowKey<A>, Flow<A>)>,
    stop: &dyn Fn() -> bool,
) -> Result<u64> {
    let mut entries = 0;
    let now = seen.now;
    each_flow_until(conntrack, stop, |k, f| {
        entries += 1;
        let forward = f.kind == gateway_common::NAT_DST;
        if forward && now.wrapping_sub(f.seen) <= seen.window {
            let counted = seen.per_id.entry(f.service).or_default();
            counted.all += 1;
            counted.snat += u64::from(f.is_snat());
            *seen.per_bid.entry(f.backend).or_default() += 1;
        }
        let limit = match seen.idle_of.is_empty() {
            true => None,
            false => seen.idle_of.get(&f.service).copied(),
        };
        seen.retired.see(f, now, limit.unwrap_or(TCP_IDLE_UNITS));
        // Quiet both ways: forward packets by `seen`, replies by the hop they refresh.
        let quiet = |limit: u32| {
            [f.seen, f.next_hop.checked_at]
                .iter()
                .all(|&t| now.wrapping_sub(t) > limit)
        };
        if limit.is_some_and(|l| forward && !f.is_snat() && quiet(l)) {
            idle.push((*k, *f));
        }
        if let Some(snat) = snat.as_deref_mut() {
            snat.see(k, f);
        }
    })?;
    Ok(entries)
}

/// Calls `f` on every entry of a conntrack, reading them in batches (a few syscalls for
/// the whole table, not two per entry).
pub(super) fn each_flow_in<A: MapAddr>(
    conntrack: &Conntrack<A>,
    f: impl FnMut(&FlowKey<A>, &Flow<A>),
) -> Result<()> {
    each_flow_until(conntrack, &|| false, f)
}

/// `each_flow_in`, given up once `stop` says so.
fn each_flow_until<A: MapAddr>(
    conntrack: &Conntrack<A>,
    stop: &dyn Fn() -> bool,
    mut f: impl FnMut(&FlowKey<A>, &Flow<A>),
) -> Result<()> {
    use aya::maps::IterableMap as _;
    let fd = std::os::fd::AsFd::as_fd(conntrack.map().fd());
    let (key_size, value_size) = (
        std::mem::size_of::<FlowKey<A>>(),
        std::mem::size_of::<Flow<A>>(),
    );
    lookup_batch_until(fd, key_size, value_size, stop, |k, v| {
        // The map's key and value are a FlowKey and a Flow (sizes checked at load).
        let (k, v): (FlowKey<A>, Flow<A>) = (read_pod(k), read_pod(v));
        f(&k, &v)
    })
    .map_err(batch_err(map_names::CONNTRACK))
}

/// Forgets router-mode flows past their route's idle timeout (`scan`): their forward
/// entries, and their reply entries where they have one. The next packet of such a
/// flow is balanced again. Returns how many flows.
fn expire_router_flows<A: MapAddr>(
    conntrack: &mut Conntrack<A>,
    idle: Vec<(FlowKey<A>, Flow<A>)>,
) -> usize {
    let mut forgotten = 0;
    for (k, f) in idle {
        if f.flags & gateway_common::FLOW_REPLY_ENTRY != 0 {
            // Keyed as the kernel program records it: backend → client.
            let reply = FlowKey {
                src: f.nat_addr,
                sport: f.nat_port,
                dst: k.src,
                dport: k.sport,
                proto: k.proto,
                pad: [0; 3],
            };
            let _ = conntrack.remove(&reply);
        }
        forgotten += usize::from(conntrack.remove(&k).is_ok());
    }
    forgotten
}

/// Whole seconds in the units of the coarse clock (2^20 ns).
pub(super) fn secs_to_units(secs: u32) -> u32 {
    u32::try_from((u64::from(secs) * 1_000_000_000) >> 20).unwrap_or(u32::MAX)
}

/// `bpf_ktime_get_coarse_ns() >> 20` as the program computes it (CLOCK_MONOTONIC_COARSE).
fn coarse_clock_units() -> u32 {
    (crate::sys::clock::monotonic_coarse_ns() >> 20) as u32
}

/// A failed batch lookup of the map `name`.
fn batch_err(name: &'static str) -> impl FnOnce(io::Error) -> DatapathError {
    syscall_err(name, "bpf_map_lookup_batch")
}
