//! What both modes publish after a plan and between plans: the `Published` snapshot
//! the admin endpoint serves (state document, datapath state, counters, traffic), the
//! `effects` of a plan (program the datapath, build the next snapshot) and the traffic
//! refresh between plans. Standalone and Kubernetes mode are two sources of plans; this
//! is what they share downstream of the planner.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::{
    datapath::{Datapath, DesiredState, Limit, ServiceAddr, Traffic},
    planner::Plan,
    state_document::StateDocument,
};

/// What the admin endpoint serves. The parts that come from a plan are shared, so that
/// publishing fresh counters between plans copies none of them.
#[derive(Clone, Debug, Default)]
pub struct Published {
    /// The state document.
    pub state: Option<Arc<StateDocument>>,
    /// The datapath's desired state.
    pub datapath: Arc<DesiredState>,
    /// Errors of broken manifest files.
    pub broken: Vec<String>,
    /// Unknown fields in manifest files (warnings).
    pub warnings: Vec<String>,
    /// Records of the claims journal ignored when it was last read (each logged once;
    /// `berth state check` lists them).
    pub ignored_records: u64,
    /// Plans made.
    pub cycles: u64,
    /// Milliseconds spent in the cycles that made them (objects read, plan, claims
    /// stored, datapath programmed), summed.
    pub cycle_millis: u64,
    /// Datapath counters, when a datapath is attached.
    pub counters: BTreeMap<&'static str, u64>,
    /// Why the last cycle failed, if it did.
    pub last_error: Option<String>,
    /// The route behind each datapath service.
    pub owners: crate::planner::Owners,
    /// Port usage of range listeners.
    pub usage: Vec<crate::planner::ListenerUsage>,
    /// Per-service traffic counted by the XDP program: the services that counted a
    /// packet or have active flows (a service not here counted nothing). Shared: every
    /// plan and every read of the counters publishes anew.
    pub traffic: Arc<BTreeMap<ServiceAddr, Traffic>>,
    /// Per backend of a service (by service and endpoint), what its flows carried: the
    /// backends that counted something or have active flows.
    pub backends: Arc<BTreeMap<(ServiceAddr, std::net::SocketAddr), BackendTraffic>>,
    /// The path of each gateway address's routes together (`Traffic::path`), by address
    /// and protocol.
    pub address_paths: Arc<BTreeMap<(std::net::IpAddr, crate::datapath::Protocol), String>>,
    /// SNAT backends whose traffic leaves out of an interface without Berth's programs:
    /// backend → the interface.
    pub snat_egress: Arc<BTreeMap<std::net::SocketAddr, String>>,
    /// Ports host processes listen on (read with the conntrack scan).
    pub host_listeners: Arc<crate::host_listeners::Listeners>,
    /// How long the last read of the traffic took (reads are spaced by at least
    /// `TRAFFIC_COST` times that).
    pub traffic_read: Duration,
    /// When `traffic` was read.
    pub traffic_at: Option<std::time::Instant>,
    /// When the active flows in `traffic` were counted.
    pub active_at: Option<std::time::Instant>,
    /// Some claim is released and cooling down: plan again when its cool-down ends.
    pub cooling: bool,
    /// The conntrack's occupancy when active flows were last counted (with a datapath).
    pub conntrack: Option<Conntrack>,
    /// Services of the plan the datapath holds back (IPv6, until the kernel program
    /// serves it), in service order.
    pub held_back: Vec<crate::datapath::held_back::HeldBack>,
    /// Whether the node announces its addresses, and what it publishes (none before
    /// the loop first decided).
    pub announce: Option<Arc<crate::announce::Status>>,
    /// Routes whose services wait for room in the datapath (`--max-services`,
    /// `--max-backends`), oldest first.
    pub waiting: Arc<Vec<crate::planner::Waiting>>,
    /// The health checker, when a BackendHealthPolicy asked for checks (`berth get
    /// backends`, `/metrics`).
    pub health: Option<crate::health::Health>,
}

impl Published {
    /// Why the node is not ready, if it is not: the last cycle failed, or no plan was
    /// made yet (what `/readyz` says besides the announce state).
    pub fn not_ready(&self) -> Option<String> {
        match (&self.last_error, self.cycles) {
            (Some(e), _) => Some(e.clone()),
            (None, 0) => Some("no plan yet".into()),
            (None, _) => None,
        }
    }
}

/// The conntrack's occupancy, read with the active flows (`ACTIVE_FLOW_REFRESH`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conntrack {
    /// Entries in the tables (IPv4 and IPv6 together).
    pub entries: u64,
    /// Entries in the fuller of the two.
    pub fullest: u64,
    /// Entries each family's table can hold (`berth run --conntrack-size`).
    pub capacity: u64,
    /// The `ct_created` counter (entries the kernel created) read with `entries`.
    pub created: u64,
    /// The `flood_untracked` counter read with `entries`.
    pub untracked: u64,
    /// Estimated entries the LRU evicted (`evictions_estimate`), never lower than
    /// what this daemon published before.
    pub evictions: u64,
    /// New flows went untracked since the count before (the flood guard is active).
    pub flooding: bool,
}

impl Conntrack {
    /// A table is nearly full (90 % or more): new flows evict established ones.
    pub fn nearly_full(&self) -> bool {
        self.capacity > 0 && self.fullest * 10 >= self.capacity * 9
    }

    /// The occupancy counted now, following `before` (the count before, if any).
    fn counted(
        before: Option<&Conntrack>,
        counters: &BTreeMap<&'static str, u64>,
        (entries, fullest, deleted): (u64, u64, u64),
        capacity: u64,
    ) -> Conntrack {
        use gateway_common::Counter;
        let count = |c: Counter| counters.get(c.name()).copied().unwrap_or(0);
        let (created, untracked) = (count(Counter::CtCreated), count(Counter::FloodUntracked));
        Conntrack {
            entries,
            fullest,
            capacity,
            created,
            untracked,
            // Entries the daemon deleted itself (idle SNAT flows) were not evicted.
            evictions: evictions_estimate(created, entries + deleted)
                .max(before.map_or(0, |b| b.evictions)),
            flooding: before.is_some_and(|b| untracked > b.untracked),
        }
    }
}

/// Entries the conntrack's LRU evicted, estimated: the kernel counts no evictions, so
/// this is the entries created (`ct_created`) less those still in the table or deleted
/// by the daemon (idle SNAT flows), 0 when fewer were counted as created (counters
/// replaced by an upgrade).
pub fn evictions_estimate(created: u64, entries: u64) -> u64 {
    created.saturating_sub(entries)
}

/// A change of the conntrack's state worth one log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConntrackChange {
    /// The table became nearly full (true) or no longer is (false).
    NearlyFull(bool),
    /// The flood guard started (true) or stopped (false) leaving new flows untracked.
    Flooding(bool),
}

/// What changed from the count `before` (none: a fresh daemon, which says what is
/// the case) to `after`.
fn conntrack_changes(before: Option<&Conntrack>, after: &Conntrack) -> Vec<ConntrackChange> {
    let full_before = before.is_some_and(Conntrack::nearly_full);
    let flooding_before = before.is_some_and(|b| b.flooding);
    let mut changes = Vec::new();
    if after.nearly_full() != full_before {
        changes.push(ConntrackChange::NearlyFull(after.nearly_full()));
    }
    if after.flooding != flooding_before {
        changes.push(ConntrackChange::Flooding(after.flooding));
    }
    changes
}

/// Logs, once per change, that the conntrack became nearly full or the flood guard
/// started (and that they ended), naming the option that changes each.
fn log_conntrack(before: Option<&Conntrack>, after: &Conntrack) {
    for change in conntrack_changes(before, after) {
        let Conntrack {
            entries,
            capacity,
            evictions,
            ..
        } = *after;
        match change {
            ConntrackChange::NearlyFull(true) => tracing::warn!(
                entries,
                capacity,
                evictions,
                "the conntrack is 90 % full or more: new flows evict the least recently \
                 used ones, whose next packets are balanced again by Maglev (to another \
                 backend if the backends changed); raise berth run --conntrack-size"
            ),
            ConntrackChange::NearlyFull(false) => {
                tracing::info!(entries, capacity, "the conntrack is below 90 % full again")
            }
            ConntrackChange::Flooding(true) => tracing::warn!(
                untracked = after.untracked - before.map_or(0, |b| b.untracked),
                "flood guard active: a CPU saw more new flows per second than \
                 --new-flow-limit, so new flows are balanced by Maglev alone and not \
                 recorded (flood_untracked); raise berth run --new-flow-limit if this \
                 is legitimate load"
            ),
            ConntrackChange::Flooding(false) => tracing::info!(
                "flood guard inactive: new flows are recorded in the conntrack again"
            ),
        }
    }
}

/// Shared between the loop and the admin server: the loop swaps in a new snapshot,
/// readers take a reference to the current one (no copying under the lock).
pub type Shared = Arc<Mutex<Arc<Published>>>;

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

/// Whether traffic read `every` ago (or never) is due again.
fn traffic_due(prev: &Published, every: Duration) -> bool {
    prev.traffic_at.is_none_or(|t| t.elapsed() >= every)
}

/// Reads the datapath's counters and per-route traffic into `p` (which holds what was
/// read before); active flows only every `ACTIVE_FLOW_REFRESH`, else kept. Gives way
/// (returns `false`, `p`'s traffic as it was) once `stop` says something more urgent
/// waits: a read of 100,000 services' statistics (40 ms) or of the conntrack (up to
/// 100 ms) delayed a change that came meanwhile by as much.
fn read_traffic(p: &mut Published, dp: &mut Datapath, stop: &dyn Fn() -> bool) -> bool {
    let started = std::time::Instant::now();
    p.counters = dp.counters().unwrap_or_default();
    if *p.snat_egress != *dp.snat_egress_without_tc() {
        p.snat_egress = Arc::new(dp.snat_egress_without_tc().clone());
    }
    let stats = match dp.service_stats_until(stop) {
        Ok(stats) => stats,
        Err(_) if stop() => return false,
        Err(_) => Default::default(),
    };
    let due = p
        .active_at
        .is_none_or(|t| t.elapsed() >= ACTIVE_FLOW_REFRESH);
    let active = match due.then(|| dp.scan_flows_until(ACTIVE_FLOW_WINDOW, stop)) {
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
    };
    // Every backend's counters and flows, with the conntrack scan (every
    // `ACTIVE_FLOW_REFRESH`): a read of the per-CPU counters of every backend id
    // (5 MiB at the default --max-backends on 2 CPUs) every second was not worth it.
    if let Some(scan) = &active {
        let stats = match dp.backend_stats_until(stop) {
            Ok(stats) => stats,
            Err(_) if stop() => return false,
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
        p.backends = Arc::new(backends);
    }
    if active.is_some() {
        if let Ok(Some(pid)) = dp.forget_gone_monitor() {
            tracing::info!(
                pid,
                "berth monitor ended without turning the datapath's events off: turned off"
            );
        }
    }
    let now = std::time::Instant::now();
    if active.is_some() && !p.datapath.services.is_empty() {
        if let Some(listeners) = crate::host_listeners::read() {
            log_host_listeners(&p.datapath, &p.host_listeners, &listeners);
            p.host_listeners = Arc::new(listeners);
        }
    }
    if let Some(scan) = &active {
        p.active_at = Some(now);
        let capacity = u64::from(dp.conntrack_capacity());
        let counted = Conntrack::counted(
            p.conntrack.as_ref(),
            &p.counters,
            (scan.entries, scan.fullest, dp.conntrack_deleted()),
            capacity,
        );
        log_conntrack(p.conntrack.as_ref(), &counted);
        p.conntrack = Some(counted);
    }
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
    if let Some(scan) = &active {
        for (service, flows) in &scan.active {
            let t = traffic.entry(*service).or_default();
            (t.active_flows, t.snat_flows) = (flows.all, flows.snat);
        }
        for (service, &n) in &scan.on_removed_backends {
            traffic.entry(*service).or_default().removed_backend_flows = n;
        }
    }
    // Both in service order: what was read before is found by one merge, not by a
    // lookup per service.
    let before = Arc::clone(&p.traffic);
    let mut before = before.iter().peekable();
    for (service, t) in &mut traffic {
        while before.next_if(|(s, _)| *s < service).is_some() {}
        let before = before.next_if(|(s, _)| *s == service).map(|(_, t)| t);
        if active.is_none() {
            // Not scanned this time: as counted before.
            if let Some(b) = before {
                (t.active_flows, t.snat_flows) = (b.active_flows, b.snat_flows);
                t.removed_backend_flows = b.removed_backend_flows;
            }
        }
        t.unanswered_since = unanswered_since(before, &t.stats, now);
    }
    p.traffic = Arc::new(traffic);
    // Each address's path, for the route rows: a reason all of an address's routes
    // share is said once, by `berth get addresses`.
    p.address_paths = Arc::new(
        crate::admin::addresses::sums(p)
            .into_iter()
            .filter_map(|((addr, protocol), s)| Some(((addr, protocol), s.traffic.path()?)))
            .collect(),
    );
    p.traffic_at = Some(now);
    p.traffic_read = started.elapsed();
    tracing::debug!(took = ?started.elapsed(), "read traffic");
    true
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

/// What one backend's flows carried (`ipvsadm --stats` per real server).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendTraffic {
    /// Packets, bytes and flows, summed over CPUs.
    pub stats: gateway_common::BackendStats,
    /// Tracked flows that forwarded a packet recently.
    pub active_flows: u64,
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

/// Logs, at most once a minute per counter, datapath counters that mean lost or
/// misrouted packets, naming the routes whose packets took that way.
fn log_losses(before: &Published, after: &Published) {
    use gateway_common::Counter;
    const LOSSES: [Counter; 11] = [
        Counter::DropNoBackend,
        Counter::DropMalformed,
        Counter::DropFragment,
        Counter::KernelForwardingOff,
        Counter::KernelNoRoute,
        Counter::KernelEgressUnknown,
        Counter::RedirectError,
        Counter::TcUntranslated,
        Counter::SnatPortLost,
        Counter::IcmpUntranslated,
        Counter::ReplySpoofed,
    ];
    static LAST: Mutex<BTreeMap<&'static str, std::time::Instant>> = Mutex::new(BTreeMap::new());
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    for c in LOSSES {
        let name = c.name();
        let grew = after
            .counters
            .get(name)
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.counters.get(name).copied().unwrap_or(0));
        if grew == 0
            || last
                .get(name)
                .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
        {
            continue;
        }
        last.insert(name, std::time::Instant::now());
        let routes = loss_routes(before, after, c);
        tracing::warn!(
            counter = name,
            packets = grew,
            routes = %routes,
            "packets lost or handed to the kernel to drop ({}); rate-limited to one line a minute",
            crate::datapath::kernel_reason(c)
        );
    }
}

/// The routes a loss counted as `c` is of, for its log line (at most
/// `LOSS_ROUTES_NAMED`, then how many more): those whose services' packets the kernel
/// carried for that reason since `before`; for `drop_no_backend`, which is counted per
/// node only, the routes with a service none of whose backends takes new flows.
pub(crate) fn loss_routes(
    before: &Published,
    after: &Published,
    c: gateway_common::Counter,
) -> String {
    let services: Vec<&ServiceAddr> = if c == gateway_common::Counter::DropNoBackend {
        after
            .datapath
            .services
            .iter()
            .filter(|(_, b)| b.iter().all(|w| w.weight == 0))
            .map(|(s, _)| s)
            .collect()
    } else {
        after
            .traffic
            .iter()
            .filter(|(s, t)| {
                t.stats.kernel_reason == c as u32 + 1
                    && before
                        .traffic
                        .get(*s)
                        .is_none_or(|b| b.stats.kernel_packets < t.stats.kernel_packets)
            })
            .map(|(s, _)| s)
            .collect()
    };
    let routes: std::collections::BTreeSet<String> = services
        .into_iter()
        .filter_map(|s| after.owners.get(s))
        .map(|o| o.to_string())
        .collect();
    let more = routes.len().saturating_sub(LOSS_ROUTES_NAMED);
    let mut text = routes
        .into_iter()
        .take(LOSS_ROUTES_NAMED)
        .collect::<Vec<_>>()
        .join(" ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

/// Routes a loss's log line names at most.
const LOSS_ROUTES_NAMED: usize = 20;

/// Logs each route whose services lost their last backend, or came without any, once
/// when it happens: a route served with no backend drops its packets, and once went
/// unnoticed (an unnamed Service port that matched no EndpointSlice port).
fn log_routes_without_backends(
    prev: &Published,
    desired: &DesiredState,
    owners: &crate::planner::Owners,
) {
    use imbl::ordmap::DiffItem;
    // What changed since the last plan (the maps' diff skips what they share).
    let routes: std::collections::BTreeSet<&crate::model::RouteKey> = prev
        .datapath
        .services
        .diff(&desired.services)
        .filter_map(|item| match item {
            DiffItem::Add(s, b) if b.is_empty() => Some(s),
            DiffItem::Update { old, new: (s, b) } if b.is_empty() && !old.1.is_empty() => Some(s),
            _ => None,
        })
        .filter_map(|s| owners.get(s).map(|o| &**o))
        .collect();
    for r in routes {
        tracing::warn!(
            route = %format_args!("{}/{}/{}", r.kind.name(), r.namespace, r.name),
            "route has no backends: no ready endpoint of its Services matches its ports; \
             its packets are dropped (see berth get routes and its ResolvedRefs message)"
        );
    }
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

/// The effects of a plan that every mode shares: programs the datapath (when there is
/// one) and returns what to publish next, following `prev` (counters, traffic, cycles).
/// The caller fills in `broken` and `warnings`.
pub fn effects(
    plan: Plan,
    datapath: Option<&mut Datapath>,
    prev: &Published,
) -> Result<Published, crate::datapath::DatapathError> {
    let started = std::time::Instant::now();
    let mut held_back = Vec::new();
    let Plan {
        claims,
        gateways,
        routes,
        datapath: desired,
        owners,
        usage,
        released: _,
        waiting,
        used: _,
        cooling,
        policies,
    } = plan;
    // Shared with the datapath, which keeps it as the state last applied.
    let desired = Arc::new(desired);
    if let Some(dp) = datapath {
        dp.apply_shared(&desired)?;
        let applied = started.elapsed();
        held_back = dp.held_back().to_vec();
        dp.keep_snat_sources_current();
        // Counters are read between plans, and after one (`refresh_stale_traffic`).
        tracing::debug!(apply = ?applied, "datapath");
    }
    let t_datapath = started.elapsed();

    log_routes_without_backends(prev, &desired, &owners);
    log_waiting(&prev.waiting, &waiting);
    log_nearly_full(&prev.usage, &usage);
    let t_logs = started.elapsed();
    let mut state = StateDocument::new(gateways, routes, claims);
    state.policies = policies;
    let t_document = started.elapsed();
    if let Some(old) = &prev.state {
        state.carry_times_from(old);
    }
    tracing::debug!(
        datapath = ?t_datapath,
        logs = ?(t_logs - t_datapath),
        document = ?(t_document - t_logs),
        carry_times = ?(started.elapsed() - t_document),
        "effects"
    );
    Ok(Published {
        state: Some(Arc::new(state)),
        datapath: desired,
        broken: Vec::new(),
        warnings: Vec::new(),
        ignored_records: 0,
        cycles: prev.cycles + 1,
        // The caller adds the cycle's own.
        cycle_millis: prev.cycle_millis,
        counters: prev.counters.clone(),
        last_error: None,
        owners,
        usage,
        traffic: Arc::clone(&prev.traffic),
        snat_egress: Arc::clone(&prev.snat_egress),
        address_paths: Arc::clone(&prev.address_paths),
        backends: Arc::clone(&prev.backends),
        host_listeners: Arc::clone(&prev.host_listeners),
        traffic_at: prev.traffic_at,
        traffic_read: prev.traffic_read,
        active_at: prev.active_at,
        cooling,
        conntrack: prev.conntrack,
        held_back,
        announce: prev.announce.clone(),
        waiting: Arc::new(waiting),
        health: prev.health.clone(),
    })
}

/// Logs a range listener passing `NEARLY_FULL_PERCENT` % of its ports bound or cooling
/// down (a warning), and one falling back below it.
fn log_nearly_full(
    before: &[crate::planner::ListenerUsage],
    after: &[crate::planner::ListenerUsage],
) {
    use crate::planner::NEARLY_FULL_PERCENT as LIMIT;
    for u in after {
        let was = before
            .iter()
            .find(|b| {
                (&b.namespace, &b.gateway, &b.listener) == (&u.namespace, &u.gateway, &u.listener)
            })
            .is_some_and(|b| b.percent() >= LIMIT);
        let is = u.percent() >= LIMIT;
        let listener = format!("{}/{}/{}", u.namespace, u.gateway, u.listener);
        let used = u.bound + u.cooling;
        match (was, is) {
            (false, true) => tracing::warn!(
                listener,
                used,
                size = u.size,
                "a range listener is {} % full (bound or cooling down): routes will wait \
                 with PortRangeExhausted once it is full",
                u.percent()
            ),
            (true, false) => tracing::info!(
                listener,
                used,
                size = u.size,
                "a range listener is below {LIMIT} % full again"
            ),
            _ => {}
        }
    }
}

/// How many routes wait for room in the datapath, by the limit they meet.
pub fn waiting_by_limit(waiting: &[crate::planner::Waiting]) -> [(Limit, u64); 3] {
    Limit::ALL.map(|l| (l, waiting.iter().filter(|w| w.limit == l).count() as u64))
}

/// Logs, once per change of how many routes wait for room in the datapath (by limit),
/// how many do, the first of them, and the option that makes room.
fn log_waiting(before: &[crate::planner::Waiting], after: &[crate::planner::Waiting]) {
    let counts = waiting_by_limit(after);
    if counts == waiting_by_limit(before) {
        return;
    }
    if after.is_empty() {
        tracing::info!("every route is programmed: none waits for room in the datapath any more");
        return;
    }
    // The first ones, oldest first: a line, not a page, with thousands waiting.
    const NAMED: usize = 10;
    let mut first: Vec<String> = after
        .iter()
        .take(NAMED)
        .map(|w| w.route.to_string())
        .collect();
    if after.len() > NAMED {
        first.push(format!("and {} more", after.len() - NAMED));
    }
    let remedies: Vec<String> = counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(l, _)| match l.option() {
            Some(option) => format!("raise berth run {option}"),
            None => format!(
                "use at most {} gateway addresses of each IP family",
                crate::datapath::Limits::ADDRESSES
            ),
        })
        .collect();
    tracing::warn!(
        waiting = after.len(),
        services = counts[0].1,
        backends = counts[1].1,
        addresses = counts[2].1,
        routes = %first.join(", "),
        "routes wait for room in the datapath: they keep their ports and say so in their \
         status (Programmed=False, DatapathFull), older routes are served \
         (berth_routes_waiting_for_capacity); {}",
        remedies.join(" and ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(created: u64, untracked: u64) -> BTreeMap<&'static str, u64> {
        [("ct_created", created), ("flood_untracked", untracked)]
            .into_iter()
            .collect()
    }

    #[test]
    fn evictions_are_entries_created_less_those_in_the_table_never_decreasing() {
        assert_eq!(evictions_estimate(5000, 1024), 3976);
        assert_eq!(evictions_estimate(100, 100), 0);
        // Counters replaced (an upgrade) while the table kept its entries.
        assert_eq!(evictions_estimate(10, 1024), 0);
        let first = Conntrack::counted(None, &counters(5000, 0), (1024, 1024, 0), 1024);
        assert_eq!(first.evictions, 3976);
        let later = Conntrack::counted(Some(&first), &counters(10, 0), (1024, 1024, 0), 1024);
        assert_eq!(later.evictions, 3976, "a counter never goes back");
        let more = Conntrack::counted(Some(&later), &counters(9000, 0), (1000, 1000, 0), 1024);
        assert_eq!(more.evictions, 8000);
        // Entries the daemon deleted (idle SNAT flows) were not evicted.
        let deleted = Conntrack::counted(Some(&more), &counters(9500, 0), (1000, 1000, 500), 1024);
        assert_eq!((deleted.evictions, deleted.entries), (8000, 1000));
    }

    #[test]
    fn nearly_full_and_flooding_are_reported_once_per_change() {
        use ConntrackChange::{Flooding, NearlyFull};
        let count = |before: Option<&Conntrack>, untracked, entries| {
            Conntrack::counted(before, &counters(0, untracked), (entries, entries, 0), 1000)
        };
        let quiet = count(None, 0, 100);
        assert_eq!(conntrack_changes(None, &quiet), vec![]);
        let full = count(Some(&quiet), 0, 900);
        assert!(full.nearly_full() && !count(None, 0, 899).nearly_full());
        assert_eq!(
            conntrack_changes(Some(&quiet), &full),
            vec![NearlyFull(true)]
        );
        let flood = count(Some(&full), 7, 1000);
        assert!(flood.flooding);
        assert_eq!(conntrack_changes(Some(&full), &flood), vec![Flooding(true)]);
        let still = count(Some(&flood), 9, 1000);
        assert_eq!(conntrack_changes(Some(&flood), &still), vec![]);
        let calm = count(Some(&still), 9, 10);
        assert!(!calm.flooding, "flood_untracked did not grow");
        assert_eq!(
            conntrack_changes(Some(&still), &calm),
            vec![NearlyFull(false), Flooding(false)]
        );
        // A daemon that starts on a full table says so; a first count is never a flood.
        let restarted = count(None, 50, 950);
        assert!(!restarted.flooding);
        assert_eq!(conntrack_changes(None, &restarted), vec![NearlyFull(true)]);
    }
}
