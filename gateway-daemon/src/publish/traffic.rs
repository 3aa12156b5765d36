//! The traffic reading: between plans and right after one, reads the datapath's
//! counters, per-service and per-backend traffic, active flows, the conntrack's
//! occupancy and the host's listeners into a fresh `Published` when they are due, and
//! publishes it, unless the read gave way to a change that waits.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use gateway_common::ServiceStats;

use super::{conntrack, losses::log_losses, Conntrack, Published, Shared};
use crate::datapath::{Datapath, DesiredState, FlowScan, ServiceAddr, Traffic};

/// A tracked flow counts as active if it forwarded a packet within this time.
pub const ACTIVE_FLOW_WINDOW: Duration = Duration::from_secs(60);

/// How often active flows are counted (and, in SNAT mode, idle SNAT flows expired, in
/// the same pass): that reads the whole conntrack table (measured: 66 ms with all
/// 262,144 entries in use), so not with every traffic refresh.
pub const ACTIVE_FLOW_REFRESH: Duration = Duration::from_secs(10);

/// How often per-service traffic is read from the kernel (the statistics and conntrack
/// maps in batches: a few syscalls, about a millisecond with 10k services).
pub const TRAFFIC_REFRESH: Duration = Duration::from_secs(1);

/// Reads of the traffic are at least this many times their own duration apart, so that
/// they take at most about 5 % of a core while nothing changes (75 ms a read with
/// 100,000 services, measured, was 7 % every second).
const TRAFFIC_COST: u32 = 20;

/// The oldest counters may grow while every read gives way to a change: then a read is
/// made whole (and SNAT flows idle past their time are expired, which the same read
/// does).
const TRAFFIC_STALE_MAX: Duration = Duration::from_secs(30);

/// How old counters may grow while plans follow each other without a pause.
pub const TRAFFIC_STALE: Duration = Duration::from_secs(5);

/// What one backend's flows carried (`ipvsadm --stats` per real server).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendTraffic {
    /// Packets, bytes and flows, summed over CPUs.
    pub stats: gateway_common::BackendStats,
    /// Tracked flows that forwarded a packet recently.
    pub active_flows: u64,
}

/// Between plans (both modes): keeps the SNAT sources current, and publishes fresh
/// counters and traffic when they are due (`TRAFFIC_REFRESH`), sharing everything else
/// with what was published.
/// `stop` says when a read is to give way (see `read_traffic`).
pub fn refresh_traffic(shared: &Shared, dp: &mut Datapath, stop: &dyn Fn() -> bool) {
    dp.keep_snat_sources_current();
    refresh_traffic_older_than(shared, dp, TRAFFIC_REFRESH, stop);
}

/// Right after a plan is published (both modes): counters are read if changes have kept
/// coming for longer than `TRAFFIC_STALE`. Read here, after the plan is out, a read (60
/// ms with 100,000 services) never delays the change that made the plan.
pub fn refresh_stale_traffic(shared: &Shared, dp: &mut Datapath, stop: &dyn Fn() -> bool) {
    refresh_traffic_older_than(shared, dp, TRAFFIC_STALE, stop);
}

/// Whether traffic read `every` ago (or never) is due again.
fn traffic_due(prev: &Published, every: Duration) -> bool {
    prev.traffic_at.is_none_or(|t| t.elapsed() >= every)
}

/// Publishes fresh counters and traffic if those published are older than `age` (or
/// than `TRAFFIC_COST` times the last read took).
fn refresh_traffic_older_than(
    shared: &Shared,
    dp: &mut Datapath,
    age: Duration,
    stop: &dyn Fn() -> bool,
) {
    let prev = Arc::clone(&shared.lock().unwrap_or_else(|e| e.into_inner()));
    if !traffic_due(&prev, age.max(prev.traffic_read * TRAFFIC_COST)) {
        return;
    }
    // Counters never go stale for good: under changes that never pause (a read gives
    // way to each), a read older than `TRAFFIC_STALE_MAX` is made whole.
    let never = || false;
    let stop = match traffic_due(&prev, TRAFFIC_STALE_MAX) {
        true => &never as &dyn Fn() -> bool,
        false => stop,
    };
    let mut p = Published::clone(&prev);
    if !read_traffic(&mut p, dp, stop) {
        tracing::debug!("read of the traffic gave way to a change");
        return;
    }
    log_losses(&prev, &p);
    *shared.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(p);
}

/// Reads the datapath's counters and per-route traffic into `p` (which holds what was
/// read before); active flows only every `ACTIVE_FLOW_REFRESH`, else kept. Gives way
/// (returns `false`, `p`'s traffic as it was) once `stop` says something more urgent
/// waits: a read of 100,000 services' statistics (40 ms) or of the conntrack (up to
/// 100 ms) delayed a change that came meanwhile by as much.
fn read_traffic(p: &mut Published, dp: &mut Datapath, stop: &dyn Fn() -> bool) -> bool {
    let started = Instant::now();
    read_counters(p, dp);
    let Some(stats) = service_stats(dp, stop) else {
        return false;
    };
    let active = scan_flows_if_due(p, dp, stop);
    // Every backend's counters and flows, with the conntrack scan (every
    // `ACTIVE_FLOW_REFRESH`): a read of the per-CPU counters of every backend id
    // (5 MiB at the default --max-backends on 2 CPUs) every second was not worth it.
    if let Some(scan) = &active {
        let Some(backends) = backend_traffic(dp, scan, stop) else {
            return false;
        };
        p.backends = Arc::new(backends);
        turn_off_gone_monitor(dp);
    }
    let now = Instant::now();
    if let Some(scan) = &active {
        if !p.datapath.services.is_empty() {
            read_host_listeners(p);
        }
        p.active_at = Some(now);
        count_conntrack(p, dp, scan);
    }
    let mut traffic = service_traffic(stats, active.as_ref());
    follow_earlier_read(&mut traffic, &p.traffic, active.is_some(), now);
    p.traffic = Arc::new(traffic);
    p.address_paths = Arc::new(address_paths(p));
    p.traffic_at = Some(now);
    p.traffic_read = started.elapsed();
    tracing::debug!(
        took = ?started.elapsed(),
        "read traffic"
    );
    true
}

/// Reads the datapath's counters into `p`, and the SNAT backends whose traffic leaves
/// out of an interface without Berth's programs.
fn read_counters(p: &mut Published, dp: &Datapath) {
    p.counters = dp.counters().unwrap_or_default();
    if *p.snat_egress != *dp.snat_egress_without_tc() {
        p.snat_egress = Arc::new(dp.snat_egress_without_tc().clone());
    }
}

/// Every service's statistics (none if the read failed); `None` once the read gave
/// way to `stop`.
fn service_stats(
    dp: &Datapath,
    stop: &dyn Fn() -> bool,
) -> Option<BTreeMap<ServiceAddr, ServiceStats>> {
    match dp.service_stats_until(stop) {
        Ok(stats) => Some(stats),
        Err(_) if stop() => None,
        Err(_) => Some(Default::default()),
    }
}

/// The conntrack scanned for active flows (and idle SNAT flows expired), when the last
/// scan of `p` is `ACTIVE_FLOW_REFRESH` old; `None` if it is not due or gave way. A
/// failed scan counts as one that found nothing.
fn scan_flows_if_due(
    p: &Published,
    dp: &mut Datapath,
    stop: &dyn Fn() -> bool,
) -> Option<FlowScan> {
    let due = p
        .active_at
        .is_none_or(|t| t.elapsed() >= ACTIVE_FLOW_REFRESH);
    match due.then(|| dp.scan_flows_until(ACTIVE_FLOW_WINDOW, stop)) {
        None => None,
        Some(Ok(scan)) => Some(scan),
        // Given way: counted again at the next read.
        Some(Err(_)) if stop() => None,
        Some(Err(e)) => {
            // Every `ACTIVE_FLOW_REFRESH` at most: a failed scan also leaves idle SNAT
            // flows holding their ports, so it is said.
            tracing::warn!(
                error = %crate::error_chain(&e),
                "reading the conntrack (active flows, idle SNAT flows) failed"
            );
            Some(Default::default())
        }
    }
}

/// Every backend's counters and, from `scan`, its active flows; `None` once the read
/// gave way to `stop`.
fn backend_traffic(
    dp: &Datapath,
    scan: &FlowScan,
    stop: &dyn Fn() -> bool,
) -> Option<BTreeMap<(ServiceAddr, std::net::SocketAddr), BackendTraffic>> {
    let stats = match dp.backend_stats_until(stop) {
        Ok(stats) => stats,
        Err(_) if stop() => return None,
        Err(_) => Default::default(),
    };
    let mut backends: BTreeMap<_, BackendTraffic> = stats
        .into_iter()
        .map(|(at, stats)| {
            (
                at,
                BackendTraffic {
                    stats,
                    active_flows: 0,
                },
            )
        })
        .collect();
    for (at, &n) in &scan.per_backend {
        backends.entry(*at).or_default().active_flows = n;
    }
    Some(backends)
}

/// Turns the datapath's events off if the `berth monitor` that turned them on ended
/// without doing so.
fn turn_off_gone_monitor(dp: &mut Datapath) {
    if let Ok(Some(pid)) = dp.forget_gone_monitor() {
        tracing::info!(
            pid,
            "berth monitor ended without turning the datapath's events off: turned off"
        );
    }
}

/// Reads the ports host processes listen on into `p`, logging the services a host
/// listener newly shares a port with.
fn read_host_listeners(p: &mut Published) {
    if let Some(listeners) = crate::host_listeners::read() {
        log_host_listeners(&p.datapath, &p.host_listeners, &listeners);
        p.host_listeners = Arc::new(listeners);
    }
}

/// Counts the conntrack's occupancy from `scan` into `p`, logging what changed.
fn count_conntrack(p: &mut Published, dp: &Datapath, scan: &FlowScan) {
    let capacity = u64::from(dp.conntrack_capacity());
    let counted = Conntrack::counted(
        p.conntrack.as_ref(),
        &p.counters,
        (scan.entries, scan.fullest, dp.conntrack_deleted()),
        capacity,
    );
    conntrack::log_conntrack(p.conntrack.as_ref(), &counted);
    p.conntrack = Some(counted);
}

/// Each service's traffic as read: its statistics and, when the conntrack was
/// scanned (`active`), its active flows.
fn service_traffic(
    stats: BTreeMap<ServiceAddr, ServiceStats>,
    active: Option<&FlowScan>,
) -> BTreeMap<ServiceAddr, Traffic> {
    // The services that counted a packet and (when the conntrack was scanned) those
    // with active flows: the others are all zero and left out, so what is held grows
    // with the services in use, not with those installed.
    let mut traffic: BTreeMap<ServiceAddr, Traffic> = stats
        .into_iter()
        .map(|(service, stats)| {
            let t = Traffic {
                stats,
                ..Traffic::default()
            };
            (service, t)
        })
        .collect();
    if let Some(scan) = active {
        for (service, flows) in &scan.active {
            let t = traffic.entry(*service).or_default();
            (t.active_flows, t.snat_flows) = (flows.all, flows.snat);
        }
        for (service, &n) in &scan.on_removed_backends {
            traffic.entry(*service).or_default().removed_backend_flows = n;
        }
    }
    traffic
}

/// Follows what was read `before`: since when each service went unanswered, and (when
/// the conntrack was not `scanned` this time) its flows as counted before.
fn follow_earlier_read(
    traffic: &mut BTreeMap<ServiceAddr, Traffic>,
    before: &BTreeMap<ServiceAddr, Traffic>,
    scanned: bool,
    now: Instant,
) {
    // Both in service order: what was read before is found by one merge, not by a
    // lookup per service.
    let mut before = before.iter().peekable();
    for (service, t) in traffic {
        while before.next_if(|(s, _)| *s < service).is_some() {}
        let before = before.next_if(|(s, _)| *s == service).map(|(_, t)| t);
        if !scanned {
            // Not scanned this time: as counted before.
            if let Some(b) = before {
                (t.active_flows, t.snat_flows) = (b.active_flows, b.snat_flows);
                t.removed_backend_flows = b.removed_backend_flows;
            }
        }
        t.unanswered_since = unanswered_since(before, &t.stats, now);
    }
}

/// Each address's path, for the route rows: a reason all of an address's routes
/// share is said once, by `berth get addresses`.
fn address_paths(p: &Published) -> BTreeMap<(std::net::IpAddr, crate::datapath::Protocol), String> {
    crate::admin::addresses::sums(p)
        .into_iter()
        .filter_map(|((addr, protocol), s)| Some(((addr, protocol), s.traffic.path()?)))
        .collect()
}

/// Logs each service that a host listener newly shares a port with (see
/// `host_listeners`).
fn log_host_listeners(
    datapath: &DesiredState,
    before: &crate::host_listeners::Listeners,
    now: &crate::host_listeners::Listeners,
) {
    use crate::host_listeners::conflict;
    for s in datapath.services.keys() {
        let Some(said) = conflict(now, s.protocol, s.addr, s.port) else {
            continue;
        };
        if conflict(before, s.protocol, s.addr, s.port).is_none() {
            tracing::warn!(service = %s, "{said}");
        }
    }
}

/// Since when a service's forwarded packets went unanswered, given what was read
/// before: replies that moved clear it, forward packets that moved without them start it.
fn unanswered_since(
    before: Option<&crate::datapath::Traffic>,
    now_stats: &gateway_common::ServiceStats,
    now: std::time::Instant,
) -> Option<std::time::Instant> {
    let before = before?;
    if now_stats.reply_packets > before.stats.reply_packets {
        return None;
    }
    if now_stats.packets > before.stats.packets {
        return Some(before.unanswered_since.unwrap_or(now));
    }
    before.unanswered_since
}
