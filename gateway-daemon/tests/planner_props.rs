//! Property tests of the allocator: random sequences of route creations, deletions,
//! edits and time steps, each followed by a plan that feeds its claims to the next.

use berth::model::ClaimList;
use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use berth::{
    manifests,
    model::ClaimPhase,
    planner::{self, Input},
    state_document::StateDocument,
};
use proptest::prelude::*;

const FIRST: u16 = 30000;
const LAST: u16 = 30007;
const QUOTA: usize = 3;
const COOLDOWN: u64 = 60;
const NAMESPACES: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Debug)]
enum Op {
    /// Create (or recreate) route `i`, optionally asking for a port (may be outside).
    Create(usize, Option<u16>),
    Delete(usize),
    /// Change route `i`'s port request.
    Edit(usize, Option<u16>),
    Advance(u64),
    /// Add or remove a labelled Namespace (an object other than a route changes): the
    /// label closes the listener to namespace `a`'s routes.
    Relabel,
}

fn op() -> impl Strategy<Value = Op> {
    let port = prop_oneof![3 => Just(None), 2 => (FIRST - 1..=LAST + 1).prop_map(Some)];
    prop_oneof![
        4 => (0..12usize, port.clone()).prop_map(|(i, p)| Op::Create(i, p)),
        2 => (0..12usize).prop_map(Op::Delete),
        1 => (0..12usize, port).prop_map(|(i, p)| Op::Edit(i, p)),
        2 => (1..90u64).prop_map(Op::Advance),
        1 => Just(Op::Relabel),
    ]
}

#[derive(Clone)]
struct RouteState {
    created: u64,
    port: Option<u16>,
}

fn manifests_text(routes: &BTreeMap<usize, RouteState>, labelled: bool) -> String {
    let mut s = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: berth}}\n\
         spec: {{controllerName: berth.dev/gateway-controller}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: infra}}\n\
         spec:\n  gatewayClassName: berth\n  addresses: [{{value: 10.0.0.1}}]\n  infrastructure:\n    \
         parametersRef: {{group: berth.dev, kind: GatewayConfig, name: cfg}}\n  listeners:\n  \
         - {{name: pool, protocol: TCP, port: {FIRST}, allowedRoutes: {{namespaces: {{from: Selector, selector: {{matchExpressions: [{{key: closed, operator: DoesNotExist}}]}}}}}}}}\n---\n\
         apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: cfg, namespace: infra}}\n\
         spec:\n  releaseCooldown: {COOLDOWN}s\n  listeners: [{{name: pool, endPort: {LAST}, maxPortsPerNamespace: {QUOTA}}}]\n"
    );
    if labelled {
        s.push_str(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {closed: \"yes\"}}\n",
        );
    }
    for (i, r) in routes {
        let port = r.port.map(|p| format!(", port: {p}")).unwrap_or_default();
        let created = humantime::format_rfc3339_seconds(time(r.created));
        s.push_str(&format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
             metadata: {{name: r{i}, namespace: {}, creationTimestamp: \"{created}\"}}\n\
             spec:\n  parentRefs: [{{name: gw, namespace: infra{port}}}]\n",
            NAMESPACES[i % NAMESPACES.len()]
        ));
    }
    s
}

fn time(t: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600 + t)
}

fn snapshot(routes: &BTreeMap<usize, RouteState>, labelled: bool) -> berth::model::Snapshot {
    let text = manifests_text(routes, labelled);
    let parsed = manifests::parse_file(std::path::Path::new("props.yaml"), &text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    manifests::snapshot([&parsed])
}

/// `next`, holding the routes that did not change since `prev` as `prev`'s own
/// allocations, as the manifest source does for routes of unchanged files.
fn sharing(
    prev: Option<&berth::model::Snapshot>,
    mut next: berth::model::Snapshot,
) -> berth::model::Snapshot {
    let Some(prev) = prev else {
        return next;
    };
    for r in &mut next.routes {
        if let Some(same) = prev.routes.iter().find(|p| **p == *r) {
            *r = Arc::clone(same);
        }
    }
    next
}

fn input<'a>(snapshot: &'a berth::model::Snapshot, claims: &'a ClaimList, now: u64) -> Input<'a> {
    Input {
        snapshot,
        claims,
        now: time(now),
        default_addresses: berth::planner::DefaultAddresses::default(),
        ephemeral_ports: None,
        snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
        capacity: Default::default(),
        allocate: true,
    }
}

fn run(routes: &BTreeMap<usize, RouteState>, claims: &ClaimList, now: u64) -> ClaimList {
    planner::plan(&input(&snapshot(routes, false), claims, now)).claims
}

/// What a history of operations has made.
struct History<'a> {
    routes: &'a mut BTreeMap<usize, RouteState>,
    now: &'a mut u64,
    labelled: &'a mut bool,
}

/// Applies `op`; returns the route whose port request it changed, if any.
fn apply(op: &Op, h: &mut History) -> Option<String> {
    match *op {
        Op::Create(i, port) => {
            let created = *h.now;
            h.routes.entry(i).or_insert(RouteState { created, port });
        }
        Op::Delete(i) => {
            h.routes.remove(&i);
        }
        Op::Edit(i, port) => {
            if let Some(r) = h.routes.get_mut(&i) {
                let changed = r.port != port;
                r.port = port;
                if changed {
                    return Some(format!("r{i}"));
                }
            }
        }
        Op::Advance(s) => *h.now += s,
        Op::Relabel => *h.labelled = !*h.labelled,
    }
    None
}

fn bound(claims: &ClaimList) -> BTreeMap<String, u16> {
    claims
        .iter()
        .filter(|c| {
            c.status
                .as_ref()
                .is_none_or(|s| s.phase == ClaimPhase::Bound)
        })
        .map(|c| (c.spec.route.name.to_string(), c.spec.port))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn allocation_invariants_hold_over_random_histories(ops in proptest::collection::vec(op(), 1..40)) {
        let mut routes: BTreeMap<usize, RouteState> = BTreeMap::new();
        let mut claims = ClaimList::new();
        let mut now = 0u64;
        // port -> (route, released at) of releases still cooling down
        let mut released: BTreeMap<u16, (String, u64)> = BTreeMap::new();
        for op in ops {
            let before = bound(&claims);
            let claims_before = claims.clone();
            let changed_request = apply(&op, &mut History { routes: &mut routes, now: &mut now, labelled: &mut false });
            claims = run(&routes, &claims, now);
            let after = bound(&claims);

            // No port is held by two claims; claim names are unique.
            let mut ports = std::collections::BTreeSet::new();
            for c in &claims {
                prop_assert!(ports.insert(c.spec.port), "port {} held twice: {claims:?}", c.spec.port);
                prop_assert!((FIRST..=LAST).contains(&c.spec.port));
            }
            // A bound claim never moves while its route stays and its request is unchanged.
            for (route, port) in &before {
                let stays = routes.iter().any(|(i, _)| &format!("r{i}") == route);
                if stays && changed_request.as_deref() != Some(route.as_str()) {
                    prop_assert_eq!(after.get(route), Some(port), "{} moved", route);
                }
            }
            // A released port is not given to another route within its cool-down.
            for c in &claims {
                if let Some(at) = c.status.as_ref().and_then(|s| s.released_at) {
                    let at = at.system().duration_since(time(0)).expect("after start").as_secs();
                    released.insert(c.spec.port, (c.spec.route.name.to_string(), at));
                }
            }
            released.retain(|_, (_, at)| now < *at + COOLDOWN);
            for (route, port) in &after {
                if let Some((owner, _)) = released.get(port) {
                    prop_assert_eq!(owner, route, "port {} reassigned during its cool-down", port);
                }
            }
            // Quotas hold, counting the ports a namespace released that still cool down
            // (a renamed route must not leave the range cooling for other teams).
            for ns in NAMESPACES {
                let held = claims.iter().filter(|c| c.spec.route.namespace == ns).count();
                prop_assert!(held <= QUOTA, "namespace {} holds {} ports, bound or cooling: {:?}", ns, held, claims);
            }
            // A route that comes back within its claim's cool-down gets that port back,
            // its quota notwithstanding.
            for c in claims_before.iter().filter(|c| c.is_released()) {
                let name = &c.spec.route.name;
                let back = routes.iter().any(|(i, r)| format!("r{i}") == *name && r.port.is_none_or(|p| p == c.spec.port));
                // Still held by its route (bound again, or cooling on): not forgotten.
                let kept = claims.iter().any(|x| x.spec.port == c.spec.port && x.spec.route.name == *name);
                prop_assert!(!(back && kept) || after.contains_key(name.as_str()),
                    "{} came back within the cool-down and got no port: {:?}", name, claims);
            }
        }
        // Replaying the final snapshot from scratch with the surviving claims gives the
        // same assignments.
        let replay = run(&routes, &claims, now);
        prop_assert_eq!(bound(&replay), bound(&claims));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Planning with a memo of the last plan is planning afresh and keeping the times
    /// of conditions that did not change, as the published state does.
    #[test]
    fn a_memo_changes_nothing_but_keeps_times(ops in proptest::collection::vec(op(), 1..40)) {
        let mut routes: BTreeMap<usize, RouteState> = BTreeMap::new();
        let mut labelled = false;
        let mut claims = ClaimList::new();
        let mut now = 0u64;
        let mut memo = planner::Memo::default();
        let mut published: Option<StateDocument> = None;
        let mut last: Option<berth::model::Snapshot> = None;
        for (step, op) in ops.iter().enumerate() {
            apply(op, &mut History { routes: &mut routes, now: &mut now, labelled: &mut labelled });
            // Every other plan gets all routes parsed afresh, as Kubernetes mode does.
            let fresh_objects = snapshot(&routes, labelled);
            let snapshot = match step % 2 {
                0 => sharing(last.as_ref(), fresh_objects),
                _ => fresh_objects,
            };
            let fresh = planner::plan(&input(&snapshot, &claims, now));
            let remembered = planner::plan_with(&input(&snapshot, &claims, now), &mut memo);
            prop_assert_eq!(&fresh.claims, &remembered.claims);
            prop_assert_eq!(&fresh.datapath, &remembered.datapath);
            prop_assert_eq!(&fresh.owners, &remembered.owners);
            prop_assert_eq!(&fresh.gateways, &remembered.gateways);
            let mut want = StateDocument::new(fresh.gateways, fresh.routes, fresh.claims);
            let planned = StateDocument::new(
                remembered.gateways,
                remembered.routes,
                remembered.claims.clone(),
            );
            let mut got = planned.clone();
            if let Some(old) = &published {
                want.carry_times_from(old);
                got.carry_times_from(old);
            }
            prop_assert_eq!(&want, &got);
            // The memo carried the routes' times already (Gateways it does not keep).
            prop_assert_eq!(&planned.routes, &got.routes);
            claims = remembered.claims;
            published = Some(got);
            last = Some(snapshot);
        }
    }
}

/// Up to three Gateways, each on some of 10.0.0.1, 10.0.0.2 and 2001:db8::1 (IPv4,
/// IPv6 or dual-stack), with a TCP range, maybe
/// a UDP range over the same ports and maybe a fixed TCP listener, all drawn from a
/// few ports so that they overlap; they come, go, change and swap ages while TCP and
/// UDP routes come and go.
mod shared_address {
    use super::*;

    pub const GATEWAYS: usize = 3;
    pub const ADDRESSES: [&str; 3] = ["10.0.0.1", "10.0.0.2", "2001:db8::1"];
    /// Ports the listeners are drawn from.
    pub const LOW: u16 = 30000;
    pub const HIGH: u16 = 30015;

    #[derive(Clone, Debug)]
    pub struct GatewayState {
        /// Bit `i` set: served on `ADDRESSES[i]` (never 0).
        pub addresses: u8,
        /// The TCP range `first..=last`.
        pub range: (u16, u16),
        /// A UDP range over the same ports.
        pub udp: bool,
        /// A fixed TCP listener (outside the Gateway's own TCP range).
        pub fixed: Option<u16>,
        pub created: u64,
    }

    #[derive(Clone, Debug)]
    pub struct Route {
        pub gateway: usize,
        pub udp: bool,
        pub port: Option<u16>,
        pub created: u64,
    }

    #[derive(Clone, Debug)]
    pub enum Op {
        /// Create or change Gateway `g` (its age stays when it exists).
        SetGateway(usize, u8, u16, u16, bool, Option<u16>),
        RemoveGateway(usize),
        /// Swap the ages of two Gateways.
        SwapAges(usize, usize),
        CreateRoute(usize, usize, bool, Option<u16>),
        DeleteRoute(usize),
        EditRoute(usize, Option<u16>),
        Advance(u64),
    }

    pub fn op() -> impl Strategy<Value = Op> {
        let port = prop_oneof![3 => Just(None), 2 => (LOW - 1..=HIGH + 1).prop_map(Some)];
        prop_oneof![
            2 => (
                0..GATEWAYS,
                1..=7u8,
                LOW..=HIGH - 4,
                0..6u16,
                any::<bool>(),
                proptest::option::of(LOW..=HIGH),
            )
                .prop_map(|(g, a, first, len, udp, fixed)| Op::SetGateway(g, a, first, first + len, udp, fixed)),
            1 => (0..GATEWAYS).prop_map(Op::RemoveGateway),
            1 => (0..GATEWAYS, 0..GATEWAYS).prop_map(|(a, b)| Op::SwapAges(a, b)),
            5 => (0..12usize, 0..GATEWAYS, prop::bool::weighted(0.25), port.clone())
                .prop_map(|(i, g, udp, p)| Op::CreateRoute(i, g, udp, p)),
            2 => (0..12usize).prop_map(Op::DeleteRoute),
            1 => (0..12usize, port).prop_map(|(i, p)| Op::EditRoute(i, p)),
            2 => (1..90u64).prop_map(Op::Advance),
        ]
    }

    /// What a history has made.
    #[derive(Default)]
    pub struct World {
        pub gateways: [Option<GatewayState>; GATEWAYS],
        pub routes: BTreeMap<usize, Route>,
        pub now: u64,
        /// The next Gateway creation time.
        pub clock: u64,
    }

    impl World {
        pub fn apply(&mut self, op: &Op) {
            match *op {
                Op::SetGateway(g, addresses, first, last, udp, fixed) => {
                    // A fixed port inside its own range would make the parameters
                    // invalid (and freeze the Gateway): it goes just above instead.
                    let fixed = fixed.map(|p| {
                        if (first..=last).contains(&p) {
                            last + 1
                        } else {
                            p
                        }
                    });
                    let created = match &self.gateways[g] {
                        Some(old) => old.created,
                        None => {
                            self.clock += 1;
                            self.clock
                        }
                    };
                    self.gateways[g] = Some(GatewayState {
                        addresses,
                        range: (first, last),
                        udp,
                        fixed,
                        created,
                    });
                }
                Op::RemoveGateway(g) => self.gateways[g] = None,
                Op::SwapAges(a, b) => {
                    let ages = (
                        self.gateways[a].as_ref().map(|g| g.created),
                        self.gateways[b].as_ref().map(|g| g.created),
                    );
                    if let (Some(x), Some(y)) = ages {
                        self.gateways[a].as_mut().expect("a").created = y;
                        self.gateways[b].as_mut().expect("b").created = x;
                    }
                }
                Op::CreateRoute(i, gateway, udp, port) => {
                    let created = self.now;
                    self.routes.entry(i).or_insert(Route {
                        gateway,
                        udp,
                        port,
                        created,
                    });
                }
                Op::DeleteRoute(i) => {
                    self.routes.remove(&i);
                }
                Op::EditRoute(i, port) => {
                    if let Some(r) = self.routes.get_mut(&i) {
                        r.port = port;
                    }
                }
                Op::Advance(s) => self.now += s,
            }
        }

        pub fn manifests_text(&self) -> String {
            let created = |t| humantime::format_rfc3339_seconds(time(t));
            let mut s = String::from(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: berth}\n\
                 spec: {controllerName: berth.dev/gateway-controller}\n",
            );
            let all = "allowedRoutes: {namespaces: {from: All}}";
            for (g, gw) in self.gateways.iter().enumerate() {
                let Some(gw) = gw else { continue };
                let addresses: Vec<String> = ADDRESSES
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| gw.addresses & (1 << i) != 0)
                    .map(|(_, a)| format!("{{value: {a}}}"))
                    .collect();
                let (first, last) = gw.range;
                let mut listeners =
                    format!("  - {{name: pool, protocol: TCP, port: {first}, {all}}}\n");
                let mut ranges = format!("{{name: pool, endPort: {last}}}");
                if gw.udp {
                    listeners.push_str(&format!(
                        "  - {{name: upool, protocol: UDP, port: {first}, {all}}}\n"
                    ));
                    ranges.push_str(&format!(", {{name: upool, endPort: {last}}}"));
                }
                if let Some(p) = gw.fixed {
                    listeners.push_str(&format!(
                        "  - {{name: fixed, protocol: TCP, port: {p}, {all}}}\n"
                    ));
                }
                s.push_str(&format!(
                    "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
                     metadata: {{name: g{g}, namespace: infra, creationTimestamp: \"{}\"}}\n\
                     spec:\n  gatewayClassName: berth\n  addresses: [{}]\n  infrastructure:\n    \
                     parametersRef: {{group: berth.dev, kind: GatewayConfig, name: g{g}}}\n  listeners:\n{listeners}\
                     ---\napiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: g{g}, namespace: infra}}\n\
                     spec:\n  releaseCooldown: {COOLDOWN}s\n  listeners: [{ranges}]\n",
                    created(gw.created),
                    addresses.join(", "),
                ));
            }
            for (i, r) in &self.routes {
                let port = r.port.map(|p| format!(", port: {p}")).unwrap_or_default();
                let (kind, protocol) = match r.udp {
                    true => ("UDPRoute", "UDP"),
                    false => ("TCPRoute", "TCP"),
                };
                let ns = NAMESPACES[i % NAMESPACES.len()];
                // Each route's own Service, with 0 to 3 IPv4 endpoints.
                let endpoints: Vec<String> = (0..i % 4)
                    .map(|k| format!("{{addresses: [10.9.{i}.{k}]}}"))
                    .collect();
                s.push_str(&format!(
                    "---\napiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\n\
                     metadata: {{name: r{i}, namespace: {ns}, creationTimestamp: \"{}\"}}\n\
                     spec:\n  parentRefs: [{{name: g{}, namespace: infra{port}}}]\n  \
                     rules: [{{backendRefs: [{{name: s{i}, port: 80}}]}}]\n\
                     ---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: {ns}}}\n\
                     spec: {{ports: [{{port: 80, protocol: {protocol}}}]}}\n\
                     ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                     metadata: {{name: s{i}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: s{i}}}}}\n\
                     addressType: IPv4\nendpoints: [{}]\nports: [{{port: 8080, protocol: {protocol}}}]\n",
                    created(100 + r.created),
                    r.gateway,
                    endpoints.join(", "),
                ));
            }
            s
        }

        pub fn snapshot(&self) -> berth::model::Snapshot {
            let text = self.manifests_text();
            let parsed = manifests::parse_file(std::path::Path::new("shared.yaml"), &text);
            assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
            manifests::snapshot([&parsed])
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// However Gateways sharing addresses with overlapping ranges and fixed listeners
    /// come, go, change and swap ages, and routes come and go, no (address, protocol,
    /// port) is held by two routes: not in the claims, not in the routes' statuses, not
    /// in the datapath. Every bound claim is served on every address of its Gateway to
    /// its own route; a route whose status says it has a port is served there; nothing
    /// else is served but the fixed listener of a Gateway not in conflict, to a route
    /// that is accepted; a listener is in conflict exactly when it is PortUnavailable.
    ///
    /// With a datapath of little room (`--max-services`, `--max-backends`), the plan is
    /// the same but for which routes are served: the same claims and Gateway statuses,
    /// the services of the routes served as without a limit, the others' routes waiting
    /// and saying so, no more than the room, and a route waiting only when it did not
    /// fit after the older routes served.
    #[test]
    fn no_address_protocol_and_port_is_served_to_two_routes(
        ops in proptest::collection::vec(shared_address::op(), 1..40),
        room in (1..6u32, 1..12u32),
    ) {
        use berth::datapath::{Protocol, ServiceAddr};

        let mut world = shared_address::World { now: 2, ..Default::default() };
        let mut claims = ClaimList::new();
        let mut memo = planner::Memo::default();
        let mut memo_small = planner::Memo::default();
        let room = berth::datapath::Capacity { services: room.0, backends: room.1 };
        for op in ops {
            world.apply(&op);
            let snapshot = world.snapshot();
            let now = world.now + 100;
            let plan = planner::plan(&input(&snapshot, &claims, now));
            let remembered = planner::plan_with(&input(&snapshot, &claims, now), &mut memo);
            prop_assert_eq!(&plan.claims, &remembered.claims);
            prop_assert_eq!(&plan.datapath, &remembered.datapath);
            prop_assert_eq!(&plan.owners, &remembered.owners);
            prop_assert_eq!(&plan.gateways, &remembered.gateways);
            prop_assert!(plan.owners.keys().eq(plan.datapath.services.keys()));
            prop_assert!(plan.waiting.is_empty());
            let small_input = Input { capacity: room, ..input(&snapshot, &claims, now) };
            let small = planner::plan(&small_input);
            let small_remembered = planner::plan_with(&small_input, &mut memo_small);
            prop_assert_eq!(&small.datapath, &small_remembered.datapath);
            prop_assert_eq!(&small.waiting, &small_remembered.waiting);
            prop_assert_eq!(&small.used, &small_remembered.used);
            check_room(&world, &plan, &small, &room)?;

            let addresses = |gateway: &str| -> Vec<std::net::IpAddr> {
                plan.gateways
                    .iter()
                    .find(|g| g.name == gateway)
                    .map(|g| g.status.addresses.iter().map(|a| a.value.parse().expect("an IP address")).collect())
                    .unwrap_or_default()
            };
            let protocol_of = |p: &str| if p == "UDP" { Protocol::Udp } else { Protocol::Tcp };
            // Claims: one route per service, and it is the route served there.
            let mut claimed: BTreeMap<ServiceAddr, String> = BTreeMap::new();
            for c in plan.claims.iter().filter(|c| {
                c.status.as_ref().is_none_or(|s| s.phase == ClaimPhase::Bound)
            }) {
                for addr in addresses(&c.spec.gateway) {
                    let service = ServiceAddr { addr, protocol: protocol_of(&c.spec.protocol), port: c.spec.port };
                    let route = c.spec.route.name.to_string();
                    if let Some(other) = claimed.insert(service, route.clone()) {
                        prop_assert!(false, "{service} claimed by {other} and {route}: {:?}", plan.claims);
                    }
                    prop_assert_eq!(
                        plan.owners.get(&service).map(|o| o.name.as_str()),
                        Some(route.as_str()),
                        "{} is not served to its claim's route", service
                    );
                }
            }
            // Statuses: a port a route is told it has is its alone, and served to it.
            let mut told: BTreeMap<ServiceAddr, String> = BTreeMap::new();
            let mut accepted_on: BTreeMap<(String, String), bool> = BTreeMap::new();
            for r in &plan.routes {
                let protocol = if r.kind == berth::model::RouteKind::Udp { Protocol::Udp } else { Protocol::Tcp };
                for p in &r.status.parents {
                    let accepted = p.conditions.iter().find(|c| c.kind == "Accepted").expect("Accepted");
                    let ok = accepted.status == "True";
                    *accepted_on.entry((r.name.to_string(), p.parent_ref.name.to_string())).or_default() |= ok;
                    if !ok || !accepted.message.starts_with("assigned port") {
                        continue;
                    }
                    let port = p.parent_ref.port.expect("assigned port in parentRef");
                    for addr in addresses(&p.parent_ref.name) {
                        let service = ServiceAddr { addr, protocol, port };
                        if let Some(other) = told.insert(service, r.name.to_string()) {
                            prop_assert!(false, "{service} told to {other} and {}", r.name);
                        }
                        prop_assert_eq!(
                            plan.owners.get(&service).map(|o| o.name.as_str()),
                            Some(r.name.as_str()),
                            "{} is told to {} but not served to it", service, r.name
                        );
                    }
                }
            }
            // Listeners: in conflict exactly when PortUnavailable; what they serve
            // without a claim is a fixed port not in conflict.
            let mut fixed_open: Vec<(String, ServiceAddr)> = Vec::new();
            for g in &plan.gateways {
                for l in &g.status.listeners {
                    let cond = |kind: &str| l.conditions.iter().find(|c| c.kind == kind).expect("condition");
                    let conflicted = cond("Conflicted").status == "True";
                    let unavailable = cond("Accepted").reason == "PortUnavailable";
                    prop_assert_eq!(conflicted, unavailable, "{}/{}: {:?}", g.name, l.name, l.conditions);
                    prop_assert_eq!(conflicted, cond("Conflicted").reason == "ProtocolConflict");
                    if l.name != "fixed" || conflicted {
                        continue;
                    }
                    let i: usize = g.name[1..].parse().expect("g<i>");
                    let port = world.gateways[i].as_ref().and_then(|w| w.fixed).expect("fixed");
                    for addr in addresses(&g.name) {
                        fixed_open.push((g.name.clone(), ServiceAddr { addr, protocol: Protocol::Tcp, port }));
                    }
                }
            }
            for (service, owner) in &plan.owners {
                if claimed.contains_key(service) {
                    continue;
                }
                let gateway = fixed_open.iter().find(|(_, s)| s == service).map(|(g, _)| g);
                prop_assert!(gateway.is_some(), "{} served to {} without a claim", service, owner.name);
                let gateway = gateway.expect("some").clone();
                prop_assert_eq!(
                    accepted_on.get(&(owner.name.to_string(), gateway.clone())),
                    Some(&true),
                    "{} served to {} whose status on {} is not accepted", service, owner.name, gateway
                );
            }
            claims = remembered.claims;
        }
    }
}

/// What a plan with `room` (`small`) must be beside the same plan without a limit
/// (`plan`): see `no_address_protocol_and_port_is_served_to_two_routes`.
fn check_room(
    world: &shared_address::World,
    plan: &planner::Plan,
    small: &planner::Plan,
    room: &berth::datapath::Capacity,
) -> Result<(), TestCaseError> {
    use berth::datapath::{Limit, Usage};

    prop_assert_eq!(&small.claims, &plan.claims, "room never changes a claim");
    prop_assert_eq!(&small.gateways, &plan.gateways);
    prop_assert!(
        small.used.exceeds(room).is_none(),
        "{:?} beyond {:?}",
        small.used,
        room
    );
    prop_assert_eq!(small.used, Usage::of_state(&small.datapath));
    prop_assert_eq!(&small.datapath.snat_ports, &plan.datapath.snat_ports);
    // Each route's services without a limit, and what they take.
    let mut need: BTreeMap<String, Usage> = BTreeMap::new();
    for (service, owner) in &plan.owners {
        let n = need.entry(owner.name.to_string()).or_default();
        *n = n.plus(Usage::of_service(&plan.datapath.services[service]));
    }
    let waiting: BTreeMap<String, Limit> = small
        .waiting
        .iter()
        .map(|w| (w.route.name.to_string(), w.limit))
        .collect();
    for (service, owner) in &plan.owners {
        let served = small.owners.get(service);
        if waiting.contains_key(owner.name.as_str()) {
            prop_assert!(
                served.is_none(),
                "{service} of waiting {} is served",
                owner.name
            );
        } else {
            prop_assert_eq!(served, Some(owner), "{} lost {}", owner.name, service);
            prop_assert_eq!(
                &small.datapath.services[service],
                &plan.datapath.services[service]
            );
        }
    }
    prop_assert!(small.owners.len() <= plan.owners.len());
    // The statuses: those of waiting routes carry Programmed=False on every parent
    // they would be served on; the rest are as without a limit.
    for (r, full) in small.routes.iter().zip(&plan.routes) {
        prop_assert_eq!(
            (&r.kind, &r.namespace, &r.name),
            (&full.kind, &full.namespace, &full.name)
        );
        let mut without = (**r).clone();
        let mut marked = 0;
        for p in &mut without.status.parents {
            let before = p.conditions.len();
            p.conditions.retain(|c| c.kind != "Programmed");
            if p.conditions.len() != before {
                marked += 1;
            }
        }
        prop_assert_eq!(
            &without.status,
            &full.status,
            "{} differs beyond Programmed",
            r.name
        );
        let limit = waiting.get(r.name.as_str());
        prop_assert_eq!(marked > 0, limit.is_some(), "{}: {:?}", r.name, r.status);
        for c in r
            .status
            .parents
            .iter()
            .flat_map(|p| &p.conditions)
            .filter(|c| c.kind == "Programmed")
        {
            prop_assert_eq!((&*c.status, &*c.reason), ("False", "DatapathFull"));
            let says = limit
                .and_then(|l| l.option())
                .unwrap_or("gateway addresses");
            prop_assert!(c.message.contains(says), "{}", c.message);
        }
    }
    // Oldest first: a route waits only when it did not fit beside the routes served,
    // and a younger route served needs less of that limit than an older one waiting.
    let age = |name: &str| {
        let i: usize = name[1..].parse().expect("r<i>");
        let r = &world.routes[&i];
        (
            r.created,
            NAMESPACES[i % NAMESPACES.len()],
            name.to_string(),
        )
    };
    for (name, &limit) in &waiting {
        let n = need.get(name).copied().unwrap_or_default();
        prop_assert!(
            small.used.plus(n).exceeds(room).is_some(),
            "{} waits though it fits: {:?} + {:?} in {:?}",
            name,
            small.used,
            n,
            room
        );
        for (other, m) in &need {
            if waiting.contains_key(other) || age(other) < age(name) {
                continue;
            }
            prop_assert!(
                m.of_limit(limit) < n.of_limit(limit),
                "younger {} ({:?}) served while {} ({:?}) waits for {}",
                other,
                m,
                name,
                n,
                limit
            );
        }
    }
    Ok(())
}
