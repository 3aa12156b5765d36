//! What both modes publish after a plan and between plans: the `Published` snapshot
//! the admin endpoint serves (state document, datapath state, counters, traffic), the
//! `effects` of a plan (program the datapath, build the next snapshot) and the traffic
//! refresh between plans. Standalone and Kubernetes mode are two sources of plans; this
//! is what they share downstream of the planner.
//!
//! The traffic reading (`traffic`), the conntrack's occupancy it counts (`conntrack`)
//! and the log lines of lost packets (`losses`) are modules of their own.

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

mod conntrack;
mod losses;
mod traffic;

pub use conntrack::{evictions_estimate, Conntrack};
// The routes a loss's log line names, which the admin tests check.
#[cfg(test)]
pub(crate) use losses::loss_routes;
pub use traffic::{
    refresh_stale_traffic, refresh_traffic, BackendTraffic, ACTIVE_FLOW_REFRESH,
    ACTIVE_FLOW_WINDOW, TRAFFIC_REFRESH, TRAFFIC_STALE,
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

/// Shared between the loop and the admin server: the loop swaps in a new snapshot,
/// readers take a reference to the current one (no copying under the lock).
pub type Shared = Arc<Mutex<Arc<Published>>>;

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
