//! The planner: objects and existing claims in, claims, statuses and the datapath's
//! desired state out. Pure (no I/O, no clock: the time is an input) and deterministic.
//!
//! Allocation follows DESIGN.md: a bound claim never moves while its route attaches;
//! static requests are served before dynamic ones, each oldest route first; a dynamic
//! route gets the lowest free port not in cool-down; released claims block their port
//! until the cool-down ends (and their own route may take them back until then).

mod addresses;
mod backends;
mod ledger;
mod overlaps;
pub mod status;

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    ops::RangeInclusive,
    sync::Arc,
    time::{Duration, SystemTime},
};

use std::sync::atomic::Ordering::Relaxed;

use serde::{Deserialize, Serialize};

use crate::{
    datapath::{DesiredState, Protocol, ServiceAddr},
    model::*,
};
use addresses::Addresses;
use backends::{resolve_backends, Index, Resolved};
use ledger::Ledger;
use status::*;

/// Listener condition type: some of the listener's ports are among the host's
/// ephemeral ports (present only then; the ports assigned are reserved from them).
pub const EPHEMERAL_PORT_OVERLAP: &str = "berth.dev/EphemeralPortOverlap";

/// Cool-down when a GatewayConfig does not set `releaseCooldown`.
pub const DEFAULT_RELEASE_COOLDOWN: Duration = Duration::from_secs(300);

/// What the planner reads.
pub struct Input<'a> {
    /// All objects.
    pub snapshot: &'a Snapshot,
    /// Claims as stored (shared: the plan keeps unchanged claims as the same
    /// allocations, so that comparing them with the stored ones is cheap).
    pub claims: &'a [Arc<PortClaim>],
    /// The current time.
    pub now: SystemTime,
    /// The address of Gateways whose `spec.addresses` has no IPv4 address (`--address`).
    pub default_address: Option<Ipv4Addr>,
    /// The host's ephemeral ports (`net.ipv4.ip_local_port_range`), when known: a
    /// listener overlapping them says so in its status. `None` in `berth check`.
    pub ephemeral_ports: Option<RangeInclusive<u16>>,
    /// Whether new ports may be assigned. A daemon that does not hold the allocator
    /// role plans with `false`: a route without a claim is reported Pending, and the
    /// plan programs only claims that are stored.
    pub allocate: bool,
}

/// What the planner decides.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Every claim that should exist (bound, or released and cooling down), by name.
    pub claims: Vec<Arc<PortClaim>>,
    /// Status of every Gateway of our classes.
    pub gateways: Vec<GatewayEntry>,
    /// Status of every route with a parent of ours.
    pub routes: Vec<Arc<RouteEntry>>,
    /// The datapath's desired state.
    #[serde(skip)]
    pub datapath: DesiredState,
    /// The route whose backends serve each datapath service.
    #[serde(skip)]
    pub owners: BTreeMap<ServiceAddr, Arc<RouteId>>,
    /// Port usage of every range listener.
    #[serde(skip)]
    pub usage: Vec<ListenerUsage>,
    /// Bound claims this plan released although their route still attaches to their
    /// Gateway, and why (a port outside the listener's range, a second claim of the
    /// route on its listener): worth a warning, since a claim is released only here.
    #[serde(skip)]
    pub released: Vec<String>,
}

/// A route's identity.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct RouteId {
    /// `TCPRoute` or `UDPRoute`.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// How full a range listener is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenerUsage {
    /// Gateway namespace.
    pub namespace: String,
    /// Gateway name.
    pub gateway: String,
    /// Listener name.
    pub listener: String,
    /// Ports in the range.
    pub size: u32,
    /// Ports held by bound claims.
    pub bound: u32,
    /// Ports released and cooling down.
    pub cooling: u32,
}

/// A Gateway's computed status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayEntry {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Status.
    pub status: GatewayStatus,
}

/// A route's computed status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteEntry {
    /// `TCPRoute` or `UDPRoute`.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Status.
    pub status: RouteStatus,
    /// When the route was created (RFC 3339): its creation timestamp, or when Berth
    /// first saw it.
    #[serde(skip)]
    pub created: Option<String>,
}

/// A listener as the planner sees it.
struct ListenerView<'a> {
    spec: &'a Listener,
    protocol: Option<Protocol>,
    /// `port..=end` when a GatewayConfig makes it a range.
    range: Option<(u16, u16)>,
    quota: Option<u32>,
    /// Ports an older Gateway's listener serves on an address this one serves too:
    /// no route gets them here.
    yielded: Vec<overlaps::Yielded>,
}

/// A Gateway of ours.
struct GatewayView<'a> {
    spec: &'a Gateway,
    listeners: Vec<ListenerView<'a>>,
    params_error: Option<String>,
    cooldown: Duration,
    /// The addresses it is served on (and those it is not).
    addresses: Addresses,
    /// Its rank among the plan's Gateways, oldest (0) first.
    age: usize,
}

impl GatewayView<'_> {
    fn key(&self) -> (String, String) {
        (
            self.spec.metadata.ns().to_string(),
            self.spec.metadata.name.clone(),
        )
    }
}

/// What a parentRef attaches to on one Gateway.
#[derive(Clone, Debug)]
enum Attach {
    Refused {
        reason: &'static str,
        message: String,
    },
    /// The Gateway's parameters are invalid: nothing changes for it.
    Frozen { message: String },
    Listeners {
        fixed: Vec<usize>,
        /// Range listeners that may serve the route, in Gateway order.
        ranges: Vec<usize>,
        requested: Option<u16>,
    },
}

/// One (route, parentRef) pair that targets a Gateway of ours.
struct Attachment<'a> {
    route: &'a Route,
    route_index: usize,
    parent: &'a ParentRef,
    /// The index of `parent` in the route's parentRefs.
    parent_index: usize,
    gw: usize,
    /// Borrowed from the memo when the route and the world are unchanged.
    attach: Cow<'a, Attach>,
    /// The claim serving a range attachment, once found or made.
    claim: Option<usize>,
    /// Why a range attachment got no port.
    failure: Option<(&'static str, String)>,
}

fn parse_time(t: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(t).ok()
}

fn format_time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn protocol_of(p: &str) -> Option<Protocol> {
    match p {
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        _ => None,
    }
}

/// A hash map with a fast, non-cryptographic hasher: the planner's keys are names from
/// the objects it plans, and a plan is made often.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

fn route_ref(route: &Route) -> ClaimRoute {
    ClaimRoute::new(
        route.kind.name(),
        route.metadata.ns(),
        &route.metadata.name,
        route.metadata.uid.clone(),
    )
}

/// Whether `claimed` names `route` (a missing uid on either side matches any).
fn holds(claimed: &ClaimRoute, route: &Route) -> bool {
    claimed.kind == route.kind.name()
        && claimed.namespace == route.metadata.ns()
        && claimed.name == route.metadata.name
        && (claimed.uid.is_none()
            || route.metadata.uid.is_none()
            || claimed.uid == route.metadata.uid)
}

/// Resolves a Gateway's listeners against its GatewayConfig.
fn gateway_view<'a>(
    gw: &'a Gateway,
    configs: &'a [Arc<GatewayConfig>],
    default_address: Option<Ipv4Addr>,
) -> GatewayView<'a> {
    let mut listeners: Vec<ListenerView<'a>> = gw
        .spec
        .listeners
        .iter()
        .map(|l| ListenerView {
            spec: l,
            protocol: protocol_of(&l.protocol),
            range: None,
            quota: None,
            yielded: Vec::new(),
        })
        .collect();
    let mut view = GatewayView {
        spec: gw,
        listeners: Vec::new(),
        params_error: None,
        cooldown: DEFAULT_RELEASE_COOLDOWN,
        addresses: Addresses::of(&gw.spec.addresses, default_address),
        age: 0,
    };
    let Some(pref) = gw
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    else {
        view.listeners = listeners;
        return view;
    };
    let ns = gw.metadata.ns();
    let mut errors = Vec::new();
    if pref.group != BERTH_GROUP || pref.kind != "GatewayConfig" {
        errors.push(format!(
            "spec.infrastructure.parametersRef: {}/{} is not a {BERTH_GROUP}/GatewayConfig",
            pref.group, pref.kind
        ));
    } else if let Some(config) = configs
        .iter()
        .find(|c| c.metadata.ns() == ns && c.metadata.name == pref.name)
    {
        let cname = format!("GatewayConfig {ns}/{}", pref.name);
        if let Some(c) = &config.spec.release_cooldown {
            match humantime::parse_duration(c) {
                Ok(d) => view.cooldown = d,
                Err(e) => errors.push(format!("{cname}: spec.releaseCooldown {c:?}: {e}")),
            }
        }
        let mut seen = BTreeSet::new();
        for (i, r) in config.spec.listeners.iter().enumerate() {
            let field = format!("{cname}: spec.listeners[{i}]");
            if !seen.insert(r.name.clone()) {
                errors.push(format!("{field}.name: listener {} is listed twice", r.name));
                continue;
            }
            let Some(l) = listeners.iter_mut().find(|l| l.spec.name == r.name) else {
                errors.push(format!(
                    "{field}.name: the Gateway has no listener {}",
                    r.name
                ));
                continue;
            };
            if l.protocol.is_none() {
                errors.push(format!(
                    "{field}: listener {} has protocol {}; only TCP and UDP take port ranges",
                    r.name, l.spec.protocol
                ));
                continue;
            }
            if r.end_port < l.spec.port {
                errors.push(format!(
                    "{field}.endPort: {} is below the listener's port {}",
                    r.end_port, l.spec.port
                ));
                continue;
            }
            l.range = Some((l.spec.port, r.end_port));
            l.quota = r.max_ports_per_namespace;
        }
        // Ranges of one protocol must not overlap each other or a fixed listener's port.
        for (i, a) in listeners.iter().enumerate() {
            for b in listeners.iter().skip(i + 1) {
                if a.protocol.is_none() || a.protocol != b.protocol {
                    continue;
                }
                let span = |l: &ListenerView| l.range.unwrap_or((l.spec.port, l.spec.port));
                let ((a0, a1), (b0, b1)) = (span(a), span(b));
                if (a.range.is_some() || b.range.is_some()) && a0 <= b1 && b0 <= a1 {
                    errors.push(format!(
                        "{cname}: listeners {} ({a0}-{a1}) and {} ({b0}-{b1}) overlap",
                        a.spec.name, b.spec.name
                    ));
                }
            }
        }
    } else {
        errors.push(format!(
            "spec.infrastructure.parametersRef: GatewayConfig {ns}/{} not found",
            pref.name
        ));
    }
    if !errors.is_empty() {
        view.params_error = Some(errors.join("; "));
        for l in &mut listeners {
            l.range = None;
        }
    }
    view.listeners = listeners;
    view
}

/// Which listeners of `gw` a parentRef of `route` attaches to.
fn attach(
    route: &Route,
    parent: &ParentRef,
    gw: &GatewayView,
    namespaces: &BTreeMap<&str, &Namespace>,
) -> Attach {
    if let Some(e) = &gw.params_error {
        let (ns, name) = gw.key();
        return Attach::Frozen { message: format!("Gateway {ns}/{name} has invalid parameters ({e}); port assignments are kept as they are") };
    }
    let no_match = |message: String| Attach::Refused {
        reason: "NoMatchingParent",
        message,
    };
    // Which listeners the parentRef names (Gateway API: sectionName, then port); a
    // parentRef naming none is `NoMatchingParent`. Of those, the ones that admit the
    // route (its kind and its namespace) are attached to; if none does, the route is
    // `NotAllowedByListeners`, as upstream conformance expects.
    let mut candidates: Vec<usize> = (0..gw.listeners.len()).collect();
    if let Some(section) = &parent.section_name {
        candidates.retain(|&i| &gw.listeners[i].spec.name == section);
        if candidates.is_empty() {
            return no_match(format!("the Gateway has no listener {section}"));
        }
    }
    if let Some(port) = parent.port {
        candidates.retain(|&i| {
            let l = &gw.listeners[i];
            match l.range {
                Some((a, b)) => (a..=b).contains(&port),
                None => l.spec.port == port,
            }
        });
        if candidates.is_empty() {
            let which = match &parent.section_name {
                Some(section) => format!("listener {section}"),
                None => "a listener".to_string(),
            };
            return no_match(format!(
                "port {port} is neither the port nor in the port range of {which}"
            ));
        }
    }
    let route_ns = route.metadata.ns();
    let gw_ns = gw.spec.metadata.ns();
    let mut refusals = Vec::new();
    candidates.retain(
        |&i| match refusal(&gw.listeners[i], route, route_ns, gw_ns, namespaces) {
            None => true,
            Some(why) => {
                refusals.push(why);
                false
            }
        },
    );
    if candidates.is_empty() {
        // Listeners of the route's protocol say why they refuse it; the others are
        // named only when no listener of its protocol was named.
        let some_own = refusals.iter().any(|(other_protocol, _)| !other_protocol);
        let message = refusals
            .iter()
            .filter(|(other_protocol, _)| !(some_own && *other_protocol))
            .map(|(_, why)| why.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        return Attach::Refused {
            reason: "NotAllowedByListeners",
            message,
        };
    }
    let (ranges, fixed) = candidates
        .into_iter()
        .partition(|&i| gw.listeners[i].range.is_some());
    Attach::Listeners {
        fixed,
        ranges,
        requested: parent.port,
    }
}

/// Why listener `l` does not admit `route` (`None` when it does), and whether that is
/// because it is of another protocol: a listener takes the route kind of its protocol
/// only, narrowed by `allowedRoutes.kinds`, from the namespaces
/// `allowedRoutes.namespaces` allows (`Same` by default).
fn refusal(
    l: &ListenerView,
    route: &Route,
    route_ns: &str,
    gw_ns: &str,
    namespaces: &BTreeMap<&str, &Namespace>,
) -> Option<(bool, String)> {
    let name = &l.spec.name;
    let kind = route.kind.name();
    if l.spec.protocol != route.kind.protocol() {
        return Some((
            true,
            format!(
                "listener {name} (protocol {}) does not take {kind}s",
                l.spec.protocol
            ),
        ));
    }
    let namespaces_rule = l
        .spec
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    let kinds = l
        .spec
        .allowed_routes
        .as_ref()
        .map(|a| a.kinds.as_slice())
        .unwrap_or_default();
    let kind_ok = kinds.is_empty()
        || kinds.iter().any(|k| {
            k.kind == kind && k.group.as_deref().unwrap_or(GATEWAY_GROUP) == GATEWAY_GROUP
        });
    if !kind_ok {
        return Some((
            false,
            format!("listener {name} does not allow {kind}s (allowedRoutes.kinds)"),
        ));
    }
    let from = namespaces_rule
        .and_then(|n| n.from.as_deref())
        .unwrap_or("Same");
    let ns_ok = match from {
        "All" => true,
        "Same" => route_ns == gw_ns,
        "Selector" => {
            let empty = BTreeMap::new();
            let labels = namespaces
                .get(route_ns)
                .map(|n| &n.metadata.labels)
                .unwrap_or(&empty);
            // No selector selects nothing: an operator must say which namespaces.
            namespaces_rule
                .and_then(|n| n.selector.as_ref())
                .is_some_and(|s| s.matches(labels))
        }
        _ => false,
    };
    (!ns_ok).then(|| {
        (
            false,
            format!(
                "listener {name} does not allow routes from namespace {route_ns} \
             (allowedRoutes.namespaces.from: {from})"
            ),
        )
    })
}

fn condition(
    kind: &'static str,
    ok: bool,
    reason: &'static str,
    message: impl Into<String>,
    now: &str,
    generation: Option<i64>,
) -> Condition {
    Condition {
        kind: Cow::Borrowed(kind),
        status: Cow::Borrowed(if ok { "True" } else { "False" }),
        reason: Cow::Borrowed(reason),
        message: message.into(),
        last_transition_time: now.to_string(),
        observed_generation: generation,
    }
}

/// What a route's status for one parent says beyond the route and the other objects.
#[derive(Clone, Debug, PartialEq)]
struct Decision {
    /// The port assigned.
    port: Option<u16>,
    /// Why a range attachment got no port.
    failure: Option<(&'static str, String)>,
    /// Fixed listeners where an older route gets the traffic.
    shadowed: Vec<usize>,
}

/// Everything but the routes: when it is unchanged, an unchanged route with unchanged
/// decisions has an unchanged status.
#[derive(Debug)]
struct World {
    gateway_classes: Vec<Arc<GatewayClass>>,
    gateways: Vec<Arc<Gateway>>,
    reference_grants: Vec<Arc<ReferenceGrant>>,
    services: Vec<Arc<Service>>,
    endpoint_slices: Vec<Arc<EndpointSlice>>,
    namespaces: Vec<Arc<Namespace>>,
    gateway_configs: Vec<Arc<GatewayConfig>>,
    default_address: Option<Ipv4Addr>,
}

impl World {
    fn of(s: &Snapshot, input: &Input) -> Self {
        World {
            gateway_classes: s.gateway_classes.clone(),
            gateways: s.gateways.clone(),
            reference_grants: s.reference_grants.clone(),
            services: s.services.clone(),
            endpoint_slices: s.endpoint_slices.clone(),
            namespaces: s.namespaces.clone(),
            gateway_configs: s.gateway_configs.clone(),
            default_address: input.default_address,
        }
    }

    fn is(&self, s: &Snapshot, input: &Input) -> bool {
        self.gateway_classes == s.gateway_classes
            && self.gateways == s.gateways
            && self.reference_grants == s.reference_grants
            && self.services == s.services
            && self.endpoint_slices == s.endpoint_slices
            && self.namespaces == s.namespaces
            && self.gateway_configs == s.gateway_configs
            && self.default_address == input.default_address
    }
}

/// A route's status as last planned, and what it was planned from.
#[derive(Debug)]
struct Remembered {
    /// Shared with the snapshot it was planned from (the next snapshot holds the same
    /// allocation while the route is unchanged). Holding it also keeps its address,
    /// the memo's key, from being reused by another route.
    route: Arc<Route>,
    /// Its identity (for the owners of datapath services).
    id: Arc<RouteId>,
    /// Its creation time, parsed.
    created: Option<SystemTime>,
    /// What each of its parentRefs to a Gateway of ours attaches to: the parentRef's
    /// index, the Gateway's index in the plan, the listeners (valid while the world is
    /// unchanged).
    attaches: Vec<(usize, usize, Attach)>,
    decisions: Vec<Decision>,
    entry: Arc<RouteEntry>,
    backends: Arc<Resolved>,
    /// The last plan that planned this route.
    pass: std::sync::atomic::AtomicU64,
}

/// The memo's key of a route: the address of its shared allocation.
fn address(route: &Arc<Route>) -> usize {
    Arc::as_ptr(route) as usize
}

/// What one plan leaves for the next, so that a plan rebuilds only the statuses of
/// routes whose inputs changed (the rest are shared with the last plan, times and all).
/// A plan with a memo equals a plan without one, except that the conditions of a
/// status rebuilt keep their `lastTransitionTime` while their status is unchanged.
#[derive(Debug)]
pub struct Memo {
    /// Whether to remember (a plan made once need not copy what it planned from).
    keep: bool,
    /// Plans made with this memo.
    pass: u64,
    world: Option<World>,
    /// By the address of the route's allocation.
    routes: FastMap<usize, Remembered>,
    /// The address of the route last remembered under each `Kind/namespace/name`: a
    /// changed route is a new allocation, and keeps its unchanged conditions' times.
    names: FastMap<String, usize>,
}

impl Memo {
    /// Keeps the routes this plan (`pass`) reused, `kept` of them, and adds `fresh`.
    fn remember(&mut self, fresh: Vec<Remembered>, kept: usize, pass: u64) {
        let mut key = String::new();
        if kept != self.routes.len() {
            let names = &mut self.names;
            self.routes.retain(|&at, r| {
                if r.pass.load(Relaxed) == pass {
                    return true;
                }
                let m = &r.route.metadata;
                key.clear();
                route_key(&mut key, r.route.kind.name(), m.ns(), &m.name);
                if names.get(key.as_str()) == Some(&at) {
                    names.remove(key.as_str());
                }
                false
            });
        }
        for r in fresh {
            let m = &r.route.metadata;
            key.clear();
            route_key(&mut key, r.route.kind.name(), m.ns(), &m.name);
            let at = address(&r.route);
            self.names.insert(key.clone(), at);
            self.routes.insert(at, r);
        }
    }
}

impl Default for Memo {
    fn default() -> Self {
        Memo {
            keep: true,
            pass: 0,
            world: None,
            routes: FastMap::default(),
            names: FastMap::default(),
        }
    }
}

/// Plans claims, statuses and the datapath from `input`.
pub fn plan(input: &Input) -> Plan {
    plan_with(
        input,
        &mut Memo {
            keep: false,
            ..Memo::default()
        },
    )
}

/// Plans like `plan`, reusing from `memo` what did not change since the last plan
/// made with it.
pub fn plan_with(input: &Input, memo: &mut Memo) -> Plan {
    let snap = input.snapshot;
    let now_text = format_time(input.now);
    let classes: BTreeSet<&str> = snap
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == CONTROLLER_NAME)
        .map(|c| c.metadata.name.as_str())
        .collect();
    // Ours, with their position in the snapshot (their age without a creation time).
    let mut gateways: Vec<(GatewayView, usize)> = snap
        .gateways
        .iter()
        .enumerate()
        .filter(|(_, g)| classes.contains(g.spec.gateway_class_name.as_str()))
        .map(|(i, g)| {
            (
                gateway_view(g, &snap.gateway_configs, input.default_address),
                i,
            )
        })
        .collect();
    gateways.sort_by_key(|(g, _)| g.key());
    let (mut gateways, source): (Vec<GatewayView>, Vec<usize>) = gateways.into_iter().unzip();
    let created: Vec<Option<SystemTime>> = gateways
        .iter()
        .map(|g| {
            g.spec
                .metadata
                .creation_timestamp
                .as_deref()
                .and_then(parse_time)
        })
        .collect();
    overlaps::mark(&mut gateways, &created, &source);
    let namespaces: BTreeMap<&str, &Namespace> = snap
        .namespaces
        .iter()
        .map(|n| (n.metadata.name.as_str(), &**n))
        .collect();

    // What the memo remembers of each route (by its allocation), and whether its
    // attachments still hold (they depend on the route and on every other object).
    let world_same = memo.world.as_ref().is_some_and(|w| w.is(snap, input));
    if !world_same && memo.keep {
        memo.world = Some(World::of(snap, input));
    }
    // A source that parses its objects again for each plan (the Kubernetes reflectors)
    // hands over new allocations: an equal route remembered under its name serves too.
    let mut key = String::new();
    let known: Vec<Option<&Remembered>> = snap
        .routes
        .iter()
        .map(|r| {
            memo.routes.get(&address(r)).or_else(|| {
                key.clear();
                route_key(&mut key, r.kind.name(), r.metadata.ns(), &r.metadata.name);
                let old = memo.routes.get(memo.names.get(key.as_str())?)?;
                (old.route == *r).then_some(old)
            })
        })
        .collect();

    // Routes, oldest first: creation time, then source order, then namespace/name.
    let created_of: Vec<Option<SystemTime>> = snap
        .routes
        .iter()
        .zip(&known)
        .map(|(r, k)| match k {
            Some(k) => k.created,
            None => r
                .metadata
                .creation_timestamp
                .as_deref()
                .and_then(parse_time),
        })
        .collect();
    let mut order: Vec<usize> = (0..snap.routes.len()).collect();
    order.sort_by_cached_key(|&i| {
        let m = &snap.routes[i].metadata;
        let created = created_of[i];
        (
            created.is_none(),
            created,
            if created.is_some() { 0 } else { i },
            m.ns(),
            m.name.as_str(),
        )
    });
    let gateway_at: FastMap<(&str, &str), usize> = gateways
        .iter()
        .enumerate()
        .map(|(gi, g)| ((g.spec.metadata.ns(), g.spec.metadata.name.as_str()), gi))
        .collect();

    let mut attachments: Vec<Attachment> = Vec::with_capacity(snap.routes.len());
    // The attachments of each route (contiguous: made route by route), by route index.
    let mut attachments_of: Vec<std::ops::Range<usize>> = vec![0..0; snap.routes.len()];
    // Routes by identity: the oldest, the next of the same identity (a route can be
    // given twice), and the last in the snapshot.
    let mut same_next: Vec<Option<usize>> = vec![None; snap.routes.len()];
    // Routes whose identity another route of the snapshot has too.
    let mut given_twice: Vec<bool> = vec![false; snap.routes.len()];
    let mut by_identity: FastMap<(&str, &str, &str), (usize, usize, usize)> =
        FastMap::with_capacity_and_hasher(snap.routes.len(), Default::default());
    for &ri in &order {
        let route = &snap.routes[ri];
        let m = &route.metadata;
        match by_identity.entry((route.kind.name(), m.ns(), m.name.as_str())) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert((ri, ri, ri));
            }
            std::collections::hash_map::Entry::Occupied(mut o) => {
                let (head, tail, last) = o.get_mut();
                given_twice[*head] = true;
                given_twice[ri] = true;
                same_next[*tail] = Some(ri);
                *tail = ri;
                *last = (*last).max(ri);
            }
        }
        let first = attachments.len();
        if let Some(k) = known[ri].filter(|_| world_same) {
            attachments.extend(k.attaches.iter().map(|(pi, gi, attach)| Attachment {
                route,
                route_index: ri,
                parent: &route.spec.parent_refs[*pi],
                parent_index: *pi,
                gw: *gi,
                attach: Cow::Borrowed(attach),
                claim: None,
                failure: None,
            }));
            attachments_of[ri] = first..attachments.len();
            continue;
        }
        for (pi, parent) in route.spec.parent_refs.iter().enumerate() {
            if parent.group.as_deref().unwrap_or(GATEWAY_GROUP) != GATEWAY_GROUP
                || parent.kind.as_deref().unwrap_or("Gateway") != "Gateway"
            {
                continue;
            }
            let gw_ns = parent.namespace.as_deref().unwrap_or(route.metadata.ns());
            let Some(&gi) = gateway_at.get(&(gw_ns, parent.name.as_str())) else {
                continue;
            };
            let attach = attach(route, parent, &gateways[gi], &namespaces);
            attachments.push(Attachment {
                route,
                route_index: ri,
                parent,
                parent_index: pi,
                gw: gi,
                attach: Cow::Owned(attach),
                claim: None,
                failure: None,
            });
        }
        attachments_of[ri] = first..attachments.len();
    }
    // Attachments of the route a claim names, oldest route first.
    let attachments_named = |r: &ClaimRoute| {
        let head = by_identity
            .get(&(r.kind.as_str(), r.namespace.as_str(), r.name.as_str()))
            .map(|&(head, _, _)| head);
        std::iter::successors(head, |&ri| same_next[ri]).flat_map(|ri| attachments_of[ri].clone())
    };

    // --- Claims ----------------------------------------------------------------------
    let mut claims: Vec<Arc<PortClaim>> = input.claims.to_vec();
    sort_claims(&mut claims);
    let gw_index = &gateway_at;
    let mut kept = Vec::with_capacity(claims.len());
    let mut released = Vec::new();
    for mut claim in claims {
        let Some(&gi) = gw_index.get(&(claim.metadata.ns(), claim.spec.gateway.as_str())) else {
            // The Gateway is gone (or no longer ours): release its claims, and forget
            // them after the default cool-down (its GatewayConfig may be gone too).
            let released = claim.is_released();
            if released && cooled_down(&claim, DEFAULT_RELEASE_COOLDOWN, input.now) {
                kept.push(None);
                continue;
            }
            release(&mut claim, input.now);
            kept.push(Some(claim));
            continue;
        };
        let gw = &gateways[gi];
        if gw.params_error.is_some() {
            kept.push(Some(claim));
            continue;
        }
        let bound = claim.is_bound();
        if bound {
            let holder = {
                attachments_named(&claim.spec.route).find(|&ai| {
                    let a = &attachments[ai];
                    a.gw == gi
                        && a.claim.is_none()
                        && holds(&claim.spec.route, a.route)
                        && matches!(&*a.attach, Attach::Listeners { ranges, requested, .. }
                            if ranges.iter().any(|&li| {
                                let l = &gw.listeners[li];
                                l.spec.name == claim.spec.listener
                                    && l.range.is_some_and(|(x, y)| (x..=y).contains(&claim.spec.port))
                                    // A port an older Gateway serves on a shared address
                                    // is not this listener's to keep.
                                    && l.yielded_at(claim.spec.port).is_none()
                            }) && requested.is_none_or(|p| p == claim.spec.port))
                })
            };
            match holder {
                Some(ai) => attachments[ai].claim = Some(kept.len()),
                None => {
                    let attached = attachments_named(&claim.spec.route).filter(|&ai| {
                        let a = &attachments[ai];
                        a.gw == gi && holds(&claim.spec.route, a.route)
                    });
                    released.extend(
                        unheld(&claim, gw, attached.map(|ai| &attachments[ai]))
                            .map(|why| format!("claim {} released: {why}", claim_label(&claim))),
                    );
                    release(&mut claim, input.now)
                }
            }
            kept.push(Some(claim));
        } else if cooled_down(&claim, gw.cooldown, input.now) {
            kept.push(None);
        } else {
            kept.push(Some(claim));
        }
    }
    let mut ledger = Ledger::new(kept, &gateways, &gateway_at);

    // Unserved range attachments: static requests first, then dynamic, oldest first.
    let pending: Vec<usize> = {
        let mut statics = Vec::new();
        let mut dynamics = Vec::new();
        for (ai, a) in attachments.iter().enumerate() {
            if let Attach::Listeners {
                ranges, requested, ..
            } = &*a.attach
            {
                if a.claim.is_none() && !ranges.is_empty() {
                    if requested.is_some() {
                        statics.push(ai)
                    } else {
                        dynamics.push(ai)
                    }
                }
            }
        }
        statics.into_iter().chain(dynamics).collect()
    };
    for ai in pending {
        if !input.allocate {
            attachments[ai].failure = Some((
                "Pending",
                "waiting for the allocator to assign a port".to_string(),
            ));
            continue;
        }
        match allocate(&attachments[ai], &gateways, &mut ledger) {
            Ok(ci) => attachments[ai].claim = Some(ci),
            Err(f) => attachments[ai].failure = Some(f),
        }
    }
    let claims = ledger.claims;

    // --- Backends, statuses, datapath ------------------------------------------------
    // One entry per route with a parent of ours.
    let mut routes: Vec<Arc<RouteEntry>> = Vec::with_capacity(snap.routes.len());
    let mut datapath = DesiredState::default();
    // (datapath service, index of the route whose backends serve it, its Gateway's age)
    let mut serving: Vec<(ServiceAddr, usize, usize)> = Vec::with_capacity(claims.len());
    let mut fixed_attached: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    for (ai, a) in attachments.iter().enumerate() {
        if let Attach::Listeners { fixed, .. } = &*a.attach {
            for &li in fixed {
                fixed_attached.entry((a.gw, li)).or_default().push(ai);
            }
        }
    }
    let index = Index::new(snap);
    // Backends of the routes that need them, by route index.
    let mut backends_of: Vec<Option<Arc<Resolved>>> = vec![None; snap.routes.len()];

    // What a status says beyond the route and the other objects, per attachment.
    let decision = |ai: usize| {
        let a: &Attachment = &attachments[ai];
        let shadowed = match &*a.attach {
            Attach::Listeners { fixed, .. } => fixed
                .iter()
                .copied()
                .filter(|&li| fixed_attached.get(&(a.gw, li)).and_then(|l| l.first()) != Some(&ai))
                .collect(),
            _ => Vec::new(),
        };
        Decision {
            port: a
                .claim
                .and_then(|ci| claims[ci].as_ref())
                .map(|c| c.spec.port),
            failure: a.failure.clone(),
            shadowed,
        }
    };
    memo.pass += 1;
    let pass = memo.pass;
    // Routes to remember from this plan (added to the memo once nothing borrows it).
    let mut fresh: Vec<Remembered> = Vec::new();
    let mut kept_in_memo = 0;
    for &ri in &order {
        let at = attachments_of[ri].clone();
        if at.is_empty() {
            continue;
        }
        let route = &snap.routes[ri];
        let m = &route.metadata;
        // A route given twice has one entry with the parents of both: not remembered.
        let unique = !given_twice[ri];
        if let Some(old) = known[ri] {
            let same = unique
                && world_same
                && old.decisions.len() == at.len()
                && at
                    .clone()
                    .zip(&old.decisions)
                    .all(|(ai, d)| decision(ai) == *d);
            if same {
                old.pass.store(pass, Relaxed);
                kept_in_memo += 1;
                routes.push(Arc::clone(&old.entry));
                backends_of[ri] = Some(Arc::clone(&old.backends));
                continue;
            }
        }
        let resolved = Arc::new(resolve_backends(route, snap, &index));
        let decisions: Vec<Decision> = at.clone().map(decision).collect();
        let mut parents: Vec<RouteParentStatus> = at
            .clone()
            .zip(&decisions)
            .map(|(ai, d)| {
                parent_status(&attachments[ai], &gateways, d, resolved.status(), &now_text)
            })
            .collect();
        // The same route as planned last time, or an earlier version of it.
        let earlier = known[ri].or_else(|| {
            key.clear();
            route_key(&mut key, route.kind.name(), m.ns(), &m.name);
            memo.routes.get(memo.names.get(key.as_str())?)
        });
        if let Some(old) = earlier {
            carry_parent_times(&mut parents, &old.entry.status.parents);
        }
        let entry = Arc::new(RouteEntry {
            kind: route.kind.name().to_string(),
            namespace: m.ns().to_string(),
            name: m.name.clone(),
            status: RouteStatus { parents },
            created: m.creation_timestamp.clone(),
        });
        if unique && memo.keep {
            fresh.push(Remembered {
                id: Arc::new(route_id(route)),
                route: Arc::clone(route),
                created: created_of[ri],
                attaches: at
                    .clone()
                    .map(|ai| {
                        let a = &attachments[ai];
                        (a.parent_index, a.gw, a.attach.as_ref().clone())
                    })
                    .collect(),
                decisions,
                entry: Arc::clone(&entry),
                backends: Arc::clone(&resolved),
                pass: pass.into(),
            });
        }
        backends_of[ri] = Some(resolved);
        routes.push(entry);
    }

    // Datapath: every bound claim of a gateway, on each of its addresses, plus fixed
    // listeners' oldest route.
    // The backends of a service are those of the last route of the claim's identity.
    let route_by_ref = |r: &ClaimRoute| {
        let (_, _, i) =
            *by_identity.get(&(r.kind.as_str(), r.namespace.as_str(), r.name.as_str()))?;
        holds(r, &snap.routes[i]).then_some(i)
    };
    // The attachment each claim serves (its Gateway and route, without looking them up).
    let mut holder: Vec<Option<usize>> = vec![None; claims.len()];
    for (ai, a) in attachments.iter().enumerate() {
        if let Some(ci) = a.claim {
            holder[ci] = Some(ai);
        }
    }
    for (ci, claim) in claims.iter().enumerate() {
        let Some(claim) = claim else {
            continue;
        };
        if claim.is_released() {
            continue;
        }
        let (gi, route) = match holder[ci].map(|ai| &attachments[ai]) {
            Some(a) if !given_twice[a.route_index] => (
                Some(a.gw),
                holds(&claim.spec.route, a.route).then_some(a.route_index),
            ),
            _ => (
                gw_index
                    .get(&(claim.metadata.ns(), claim.spec.gateway.as_str()))
                    .copied(),
                route_by_ref(&claim.spec.route),
            ),
        };
        let Some(gw) = gi.map(|gi| &gateways[gi]) else {
            continue;
        };
        let (Some(protocol), Some(ri)) = (protocol_of(&claim.spec.protocol), route) else {
            continue;
        };
        for &addr in &gw.addresses.served {
            serving.push((
                ServiceAddr {
                    addr,
                    protocol,
                    port: claim.spec.port,
                },
                ri,
                gw.age,
            ));
        }
    }
    for (&(gi, li), list) in &fixed_attached {
        let gw = &gateways[gi];
        let l = &gw.listeners[li];
        let (Some(protocol), Some(&oldest)) = (l.protocol, list.first()) else {
            continue;
        };
        // Its port belongs to an older Gateway's listener on a shared address.
        if !l.yielded.is_empty() {
            continue;
        }
        for &addr in &gw.addresses.served {
            serving.push((
                ServiceAddr {
                    addr,
                    protocol,
                    port: l.spec.port,
                },
                attachments[oldest].route_index,
                gw.age,
            ));
        }
    }
    // One route per service. Where Gateways still collide (the claims kept for a
    // Gateway with invalid parameters are not checked against other Gateways), the
    // oldest Gateway's entry wins; within one Gateway a later entry wins, as an insert
    // would (the stable sort keeps the reversed order among equals).
    serving.reverse();
    serving.sort_by_key(|&(service, _, age)| (service, age));
    serving.dedup_by_key(|&mut (service, _, _)| service);
    let owners: BTreeMap<ServiceAddr, Arc<RouteId>> = serving
        .iter()
        .map(|&(service, ri, _)| {
            let id = match known[ri] {
                Some(k) => Arc::clone(&k.id),
                None => Arc::new(route_id(&snap.routes[ri])),
            };
            (service, id)
        })
        .collect();
    datapath.services = serving
        .into_iter()
        .map(|(service, ri, _)| {
            // A claim kept for a frozen Gateway may name a route without attachments.
            let resolved = backends_of[ri]
                .get_or_insert_with(|| Arc::new(resolve_backends(&snap.routes[ri], snap, &index)));
            (service, resolved.backends.clone())
        })
        .collect();

    // Gateway statuses.
    // Routes accepted for each fixed listener they attach to (upstream counts only
    // accepted routes in `attachedRoutes`).
    let accepted_on = |gi: usize, li: usize| {
        fixed_attached.get(&(gi, li)).map_or(0, |list| {
            list.iter()
                .filter(|&&ai| {
                    let a = &attachments[ai];
                    let port = a.claim.and_then(|ci| claims[ci].as_ref()).is_some();
                    matches!(&*a.attach, Attach::Listeners { fixed, .. }
                        if serves(&gateways[a.gw], fixed, port))
                })
                .count()
        })
    };
    let mut gateway_entries = Vec::new();
    for (gi, gw) in gateways.iter().enumerate() {
        let generation = gw.spec.metadata.generation;
        let accepted = gateway_accepted(gw, &now_text, generation);
        let accepted_ok = accepted.status == "True";
        let conditions = vec![accepted, programmed(gw, accepted_ok, &now_text, generation)];
        let listeners = gw
            .listeners
            .iter()
            .enumerate()
            .map(|(li, l)| {
                let attached = match l.range {
                    Some(_) => claims
                        .iter()
                        .flatten()
                        .filter(|c| {
                            c.metadata.ns() == gw.spec.metadata.ns()
                                && c.spec.gateway == gw.spec.metadata.name
                                && c.spec.listener == l.spec.name
                                && c.is_bound()
                        })
                        .count(),
                    None => accepted_on(gi, li),
                };
                let ephemeral = input
                    .ephemeral_ports
                    .as_ref()
                    .and_then(|e| overlaps::ephemeral_overlap(l, e));
                let kinds = match l.protocol {
                    Some(Protocol::Tcp) => vec![RouteGroupKind {
                        group: Some(GATEWAY_GROUP.to_string()),
                        kind: "TCPRoute".to_string(),
                    }],
                    Some(Protocol::Udp) => vec![RouteGroupKind {
                        group: Some(GATEWAY_GROUP.to_string()),
                        kind: "UDPRoute".to_string(),
                    }],
                    None => vec![],
                };
                let mut conditions =
                    listener_conditions(l, gw.params_error.is_none(), &now_text, generation);
                conditions.extend(ephemeral.map(|(ports, within)| {
                    condition(
                        EPHEMERAL_PORT_OVERLAP,
                        true,
                        "OverlapsEphemeralPorts",
                        overlaps::ephemeral_message(&ports, &within),
                        &now_text,
                        generation,
                    )
                }));
                ListenerStatus {
                    name: l.spec.name.clone(),
                    supported_kinds: kinds,
                    attached_routes: attached as i32,
                    conditions,
                }
            })
            .collect();
        // Only the addresses served: the unserved ones are named in `Programmed`.
        let addresses = gw
            .addresses
            .served
            .iter()
            .map(|a| GatewayStatusAddress {
                kind: "IPAddress".to_string(),
                value: a.to_string(),
            })
            .collect();
        let (namespace, name) = gw.key();
        gateway_entries.push(GatewayEntry {
            namespace,
            name,
            status: GatewayStatus {
                addresses,
                conditions,
                listeners,
            },
        });
    }

    // The same route twice in the snapshot has one entry with the parents of both.
    routes.sort_by(|a, b| {
        (a.kind.as_str(), a.namespace.as_str(), a.name.as_str()).cmp(&(
            b.kind.as_str(),
            b.namespace.as_str(),
            b.name.as_str(),
        ))
    });
    routes.dedup_by(|later, first| {
        let same = (later.kind == first.kind)
            && later.namespace == first.namespace
            && later.name == first.name;
        if same {
            let parents = std::mem::take(&mut Arc::make_mut(later).status.parents);
            Arc::make_mut(first).status.parents.extend(parents);
        }
        same
    });
    let mut claims: Vec<Arc<PortClaim>> = claims.into_iter().flatten().collect();
    sort_claims(&mut claims);
    let usage = listener_usage(&gateways, &claims);
    drop(attachments);
    drop(known);
    memo.remember(fresh, kept_in_memo, pass);
    Plan {
        claims,
        gateways: gateway_entries,
        routes,
        datapath,
        owners,
        usage,
        released,
    }
}

/// Why a bound claim of a route that still attaches to the claim's Gateway holds none
/// of its attachments, when that is not the user's own doing (a route that moved to
/// another listener or asks for another port): its port lies outside the listener's
/// range (a range that shrank, or a record from elsewhere), or every attachment of the
/// route to that listener holds an earlier claim.
fn unheld<'a>(
    claim: &PortClaim,
    gw: &GatewayView,
    attached: impl Iterator<Item = &'a Attachment<'a>>,
) -> Option<String> {
    let li = gw
        .listeners
        .iter()
        .position(|l| l.spec.name == claim.spec.listener)?;
    let l = &gw.listeners[li];
    let port = claim.spec.port;
    // The route's attachments that this listener may serve with this very port.
    let mut on_listener = attached
        .filter(|a| {
            matches!(&*a.attach, Attach::Listeners { ranges, requested, .. }
                if ranges.contains(&li) && requested.is_none_or(|p| p == port))
        })
        .peekable();
    on_listener.peek()?;
    if let Some((first, last)) = l.range.filter(|&(x, y)| !(x..=y).contains(&port)) {
        return Some(format!(
            "port {port} is outside listener {}'s range {first}-{last}",
            l.spec.name
        ));
    }
    if l.yielded_at(port).is_some() {
        // Said by the listener's own conditions (PortUnavailable).
        return None;
    }
    on_listener.all(|a| a.claim.is_some()).then(|| {
        format!(
            "its route already holds another port of listener {}",
            l.spec.name
        )
    })
}

/// `namespace/name (protocol port)` of a claim, for messages.
fn claim_label(c: &PortClaim) -> String {
    format!(
        "{}/{} ({} {})",
        c.metadata.ns(),
        c.metadata.name,
        c.spec.protocol,
        c.spec.port
    )
}

/// A Gateway's `Programmed` condition: served on at least one address, or why not.
/// Addresses it asked for but cannot have are named in the message either way.
fn programmed(gw: &GatewayView, accepted: bool, now: &str, generation: Option<i64>) -> Condition {
    let a = &gw.addresses;
    if !accepted {
        let message = "the Gateway is not accepted";
        return condition("Programmed", false, "Invalid", message, now, generation);
    }
    if a.served.is_empty() && a.unserved.is_empty() {
        let message = "spec.addresses has no IPv4 address";
        return condition(
            "Programmed",
            false,
            "AddressNotAssigned",
            message,
            now,
            generation,
        );
    }
    if a.served.is_empty() {
        let message = format!(
            "no address of spec.addresses can be served: {}; give the Gateway an IPv4 address (type IPAddress)",
            a.unserved_list()
        );
        return condition(
            "Programmed",
            false,
            "AddressNotUsable",
            message,
            now,
            generation,
        );
    }
    let mut message = format!("serving on {}", a.served_list());
    if !a.unserved.is_empty() {
        message.push_str(&format!("; not serving on {}", a.unserved_list()));
    }
    condition("Programmed", true, "Programmed", message, now, generation)
}

/// Whether a listener is accepted: its protocol is supported and no port of it is
/// in conflict with an older Gateway's listener on a shared address.
fn listener_accepted(l: &ListenerView) -> bool {
    l.protocol.is_some() && l.yielded.is_empty()
}

/// Whether a listener serves some port: its protocol is supported and not every port
/// of it belongs to an older Gateway's listener.
fn listener_serves(l: &ListenerView) -> bool {
    l.protocol.is_some() && !l.fully_yielded()
}

/// A Gateway's `Accepted` condition. Gateway API: a Gateway with listeners that are not
/// accepted (conflicted, or of an unsupported protocol) says `ListenersNotValid`, and
/// naming them; it is accepted while some listener still serves, and rejected as a
/// whole when none does.
fn gateway_accepted(gw: &GatewayView, now: &str, generation: Option<i64>) -> Condition {
    if let Some(e) = &gw.params_error {
        return condition(
            "Accepted",
            false,
            "InvalidParameters",
            e.clone(),
            now,
            generation,
        );
    }
    let invalid: Vec<String> = gw
        .listeners
        .iter()
        .filter(|l| !listener_accepted(l))
        .map(|l| {
            let why = match (l.protocol.is_some(), listener_serves(l)) {
                (false, _) => format!("protocol {} is not supported", l.spec.protocol),
                (true, false) => "its ports belong to an older Gateway".to_string(),
                (true, true) => {
                    "some ports belong to an older Gateway; the others still serve".to_string()
                }
            };
            format!("{} ({why})", l.spec.name)
        })
        .collect();
    if invalid.is_empty() {
        return condition(
            "Accepted",
            true,
            "Accepted",
            "accepted by Berth",
            now,
            generation,
        );
    }
    let ok = gw.listeners.iter().any(listener_serves);
    let mut message = format!(
        "listeners not accepted (see their conditions): {}",
        invalid.join(", ")
    );
    let valid: Vec<&str> = gw
        .listeners
        .iter()
        .filter(|l| listener_accepted(l))
        .map(|l| l.spec.name.as_str())
        .collect();
    if !valid.is_empty() {
        message.push_str(&format!("; accepted: {}", valid.join(", ")));
    }
    if !ok {
        message.push_str("; no listener serves");
    }
    condition(
        "Accepted",
        ok,
        "ListenersNotValid",
        message,
        now,
        generation,
    )
}

/// A listener's `Accepted`, `Programmed`, `ResolvedRefs` and `Conflicted` conditions.
/// A listener some of whose ports an older Gateway's listener serves on a shared
/// address is `Conflicted=True, ProtocolConflict` and `Accepted=False, PortUnavailable`
/// (see `overlaps`); the ports outside the conflict keep serving their routes (a bound
/// claim does not move while its route attaches), and `Programmed` says so.
fn listener_conditions(
    l: &ListenerView,
    gateway_ok: bool,
    now: &str,
    generation: Option<i64>,
) -> Vec<Condition> {
    let range_note = l
        .range
        .map(|(a, b)| format!(" (ports {a}-{b})"))
        .unwrap_or_default();
    let accepted = if l.protocol.is_none() {
        condition(
            "Accepted",
            false,
            "UnsupportedProtocol",
            format!(
                "protocol {} is not supported; use TCP or UDP",
                l.spec.protocol
            ),
            now,
            generation,
        )
    } else if !l.yielded.is_empty() {
        condition(
            "Accepted",
            false,
            "PortUnavailable",
            overlaps::conflict_message(l),
            now,
            generation,
        )
    } else {
        condition(
            "Accepted",
            true,
            "Accepted",
            format!("listener accepted{range_note}"),
            now,
            generation,
        )
    };
    let programmed = match (gateway_ok && listener_serves(l), l.yielded.is_empty()) {
        (true, true) => condition("Programmed", true, "Programmed", "", now, generation),
        (true, false) => condition(
            "Programmed",
            true,
            "Programmed",
            overlaps::kept_message(l),
            now,
            generation,
        ),
        (false, _) => condition("Programmed", false, "Invalid", "", now, generation),
    };
    let conflicted = match l.yielded.is_empty() {
        true => condition("Conflicted", false, "NoConflicts", "", now, generation),
        // Upstream's reasons are HostnameConflict and ProtocolConflict; TCP and UDP
        // listeners are told apart by port alone, so a port two of them share is a
        // ProtocolConflict (as Envoy Gateway reports it for layer-4 listeners).
        false => condition(
            "Conflicted",
            true,
            "ProtocolConflict",
            overlaps::conflict_message(l),
            now,
            generation,
        ),
    };
    let resolved = condition("ResolvedRefs", true, "ResolvedRefs", "", now, generation);
    vec![accepted, programmed, resolved, conflicted]
}

/// Whether a route attached to fixed listeners `fixed` of `gw`, with a range port
/// (`port`) or not, is served: by its port, or by a fixed listener not in conflict.
fn serves(gw: &GatewayView, fixed: &[usize], port: bool) -> bool {
    port || fixed.iter().any(|&li| gw.listeners[li].yielded.is_empty())
}

/// A route's status for the parent of attachment `a`.
fn parent_status(
    a: &Attachment,
    gateways: &[GatewayView],
    decision: &Decision,
    (refs_ok, refs_reason, refs_message): (bool, &'static str, String),
    now_text: &str,
) -> RouteParentStatus {
    let gw = &gateways[a.gw];
    let generation = a.route.metadata.generation;
    let mut parent_ref = a.parent.clone();
    let accepted = match &*a.attach {
        Attach::Refused { reason, message } => condition(
            "Accepted",
            false,
            reason,
            message.clone(),
            now_text,
            generation,
        ),
        Attach::Frozen { message } => condition(
            "Accepted",
            false,
            "Pending",
            message.clone(),
            now_text,
            generation,
        ),
        Attach::Listeners { fixed, ranges, .. } => {
            let names = |ls: &[usize]| {
                ls.iter()
                    .map(|&i| gw.listeners[i].spec.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            // Fixed listeners whose port an older Gateway serves give the route no port,
            // as a range without a free port does.
            let (open, taken): (Vec<usize>, Vec<usize>) = fixed
                .iter()
                .partition(|&&li| gw.listeners[li].yielded.is_empty());
            let mut parts = Vec::new();
            let mut failure = None;
            if let Some(port) = decision.port {
                parts.push(format!("assigned port {port}"));
                parent_ref.port = Some(port);
            } else if !ranges.is_empty() {
                let (r, m) = decision
                    .failure
                    .clone()
                    .unwrap_or(("PortRangeExhausted", "no port".to_string()));
                failure = Some(r);
                parts.push(m);
            }
            if !open.is_empty() {
                parts.push(format!("attached to listener {}", names(&open)));
                // GEP-2644: every route is accepted; only the oldest gets traffic.
                let shadowed: Vec<usize> = decision
                    .shadowed
                    .iter()
                    .copied()
                    .filter(|li| open.contains(li))
                    .collect();
                if !shadowed.is_empty() {
                    parts.push(format!(
                        "an older route gets the traffic of listener {}",
                        names(&shadowed)
                    ));
                }
            }
            for &li in &taken {
                failure.get_or_insert("PortUnavailable");
                parts.push(overlaps::taken_message(&gw.listeners[li]));
            }
            let ok = serves(gw, fixed, decision.port.is_some());
            let reason = match ok {
                true => "Accepted",
                false => failure.unwrap_or("PortUnavailable"),
            };
            let message = match parts.len() {
                1 => parts.pop().unwrap_or_default(),
                _ => parts.join("; "),
            };
            condition("Accepted", ok, reason, message, now_text, generation)
        }
    };
    let resolved = condition(
        "ResolvedRefs",
        refs_ok,
        refs_reason,
        refs_message,
        now_text,
        generation,
    );
    RouteParentStatus {
        parent_ref,
        controller_name: Cow::Borrowed(CONTROLLER_NAME),
        conditions: vec![accepted, resolved],
    }
}

/// Keeps the condition times of `old` parents in `new` ones of the same parent;
/// returns whether that changed any.
pub fn carry_parent_times(new: &mut [RouteParentStatus], old: &[RouteParentStatus]) -> bool {
    let mut changed = false;
    for p in new {
        let same_parent = |op: &&RouteParentStatus| {
            op.parent_ref.name == p.parent_ref.name
                && op.parent_ref.namespace == p.parent_ref.namespace
                && op.parent_ref.section_name == p.parent_ref.section_name
        };
        if let Some(op) = old.iter().find(same_parent) {
            changed |= carry_times(&mut p.conditions, &op.conditions);
        }
    }
    changed
}

fn route_id(r: &Route) -> RouteId {
    RouteId {
        kind: r.kind.name().to_string(),
        namespace: r.metadata.ns().to_string(),
        name: r.metadata.name.clone(),
    }
}

/// Sorts claims by namespace, then name (they mostly come sorted: checked first).
fn sort_claims(claims: &mut [Arc<PortClaim>]) {
    fn key(c: &PortClaim) -> (&str, &str) {
        (c.metadata.ns(), c.metadata.name.as_str())
    }
    if !claims.is_sorted_by(|a, b| key(a) <= key(b)) {
        claims.sort_by(|a, b| key(a).cmp(&key(b)));
    }
}

fn listener_usage(gateways: &[GatewayView], claims: &[Arc<PortClaim>]) -> Vec<ListenerUsage> {
    let mut out = Vec::new();
    for gw in gateways {
        let (namespace, gateway) = gw.key();
        for l in &gw.listeners {
            let Some((first, last)) = l.range else {
                continue;
            };
            let mut u = ListenerUsage {
                namespace: namespace.clone(),
                gateway: gateway.clone(),
                listener: l.spec.name.clone(),
                size: u32::from(last - first) + 1,
                ..ListenerUsage::default()
            };
            for c in claims.iter().filter(|c| {
                c.metadata.ns() == namespace
                    && c.spec.gateway == gateway
                    && c.spec.listener == l.spec.name
            }) {
                match c.is_bound() {
                    true => u.bound += 1,
                    false => u.cooling += 1,
                }
            }
            out.push(u);
        }
    }
    out
}

fn release(claim: &mut Arc<PortClaim>, now: SystemTime) {
    if claim.is_released() {
        return;
    }
    Arc::make_mut(claim).status = Some(PortClaimStatus {
        phase: ClaimPhase::Released,
        released_at: Some(format_time(now)),
    });
}

fn cooled_down(claim: &PortClaim, cooldown: Duration, now: SystemTime) -> bool {
    let released = claim
        .status
        .as_ref()
        .and_then(|s| s.released_at.as_deref())
        .and_then(parse_time);
    // A released claim without a readable time cools down from now on: never lose a port early.
    released.is_some_and(|t| t + cooldown <= now)
}

/// Finds or makes the claim for a range attachment.
fn allocate(
    a: &Attachment,
    gateways: &[GatewayView],
    ledger: &mut Ledger,
) -> Result<usize, (&'static str, String)> {
    let Attach::Listeners {
        ranges, requested, ..
    } = &*a.attach
    else {
        return Err(("NoMatchingParent", "no range listener".to_string()));
    };
    let gw = &gateways[a.gw];
    let me = route_ref(a.route);
    let route_ns = a.route.metadata.ns();

    let mut quota_hit = None;
    for &li in ranges {
        let l = &gw.listeners[li];
        let (Some((first, last)), Some(protocol)) = (l.range, l.protocol) else {
            continue;
        };
        if let Some(quota) = l.quota {
            let held = ledger.bound_in(a.gw, li, route_ns);
            if held >= quota {
                quota_hit = Some(format!(
                    "namespace {route_ns} already holds {held} of its {quota} ports on listener {}",
                    l.spec.name
                ));
                continue;
            }
        }
        if let Some(m) = requested.and_then(|p| overlaps::requested_message(l, p)) {
            return Err(("PortUnavailable", m));
        }
        // Its own released claim on this listener, still cooling down, comes back to it.
        if let Some(ci) = ledger.rebind(a.gw, li, &me, *requested) {
            return Ok(ci);
        }
        let port = match requested {
            Some(p) => {
                if let Some(h) = ledger.holder(a.gw, protocol, *p) {
                    let who = if h.spec.route.namespace == route_ns {
                        format!(
                            "{} {}/{}",
                            h.spec.route.kind, h.spec.route.namespace, h.spec.route.name
                        )
                    } else {
                        "a route in another namespace".to_string()
                    };
                    let cooling = h.is_released();
                    let state = if cooling {
                        " (released, cooling down)"
                    } else {
                        ""
                    };
                    return Err((
                        "PortUnavailable",
                        format!("port {p} is held by {who}{state}"),
                    ));
                }
                *p
            }
            None => match ledger.lowest_free(a.gw, li, protocol, first, last) {
                Some(p) => p,
                None => continue,
            },
        };
        let (gw_ns, gw_name) = gw.key();
        let spec = PortClaimSpec {
            gateway: gw_name,
            listener: l.spec.name.clone(),
            protocol: protocol.to_string(),
            port,
            route: me.clone(),
        };
        let claim = PortClaim::bound(&gw_ns, spec);
        return Ok(ledger.push(claim));
    }
    match quota_hit {
        Some(m) => Err(("QuotaExceeded", m)),
        None => {
            let spans: Vec<String> = ranges
                .iter()
                .filter_map(|&li| {
                    let l = &gw.listeners[li];
                    let (x, y) = l.range?;
                    let yielded: Vec<String> = l
                        .yielded
                        .iter()
                        .map(|y| overlaps::ports_text(&y.ports))
                        .collect();
                    Some(match yielded.is_empty() {
                        true => format!("{x}-{y}"),
                        false => format!(
                            "{x}-{y} ({} served by an older Gateway on a shared address)",
                            yielded.join(", ")
                        ),
                    })
                })
                .collect();
            Err((
                "PortRangeExhausted",
                format!("no free port in {}", spans.join(", ")),
            ))
        }
    }
}

#[cfg(test)]
mod tests;
