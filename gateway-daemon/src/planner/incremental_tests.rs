//! Incremental plans equal full ones: random histories of route, Service (added,
//! removed, ports changed), EndpointSlice (addresses, families, readiness), claim,
//! time and (now and then) Gateway and Namespace changes, each planned with a memo that
//! plans incrementally, with one that always plans in full, and without a memo. Claims
//! also change behind the planner's back (released, lost, or added for a route that is
//! not there, as another writer would): the memo's claim index must follow.

use std::{collections::BTreeMap, path::Path, time::Duration};

use proptest::prelude::*;

use super::*;
use crate::manifests;

const NAMESPACES: [&str; 3] = ["a", "b", "c"];
const ROUTES: usize = 10;

/// A route: its parent (0: the shared range listener, 1: the fixed listener, 2: the
/// second Gateway), its port request, its Service, its creation time (`None`: ordered
/// by its place in the snapshot).
#[derive(Clone, Debug, PartialEq)]
struct RouteState {
    parent: u8,
    port: Option<u16>,
    service: usize,
    created: Option<u64>,
}

#[derive(Clone, Debug)]
enum Op {
    SetRoute(usize, RouteState),
    Delete(usize),
    /// Service `s`'s endpoint address ends in this.
    Endpoint(usize, u8),
    /// Service `s`'s endpoints are IPv4 (0), IPv6 (1) or both (2).
    Families(usize, u8),
    /// Service `s` has port 80 (0), port 81 only (1: the routes' port 80 is gone),
    /// ports 80 and 443 (2), or is removed (3).
    ServicePorts(usize, u8),
    /// Service `s`'s endpoints are ready (`true`) or not.
    Ready(usize, bool),
    /// The second Gateway is on an IPv4 address (0), an IPv6 one (1) or both (2).
    OtherFamilies(u8),
    Advance(u64),
    /// The next plan reads the claims the last plan read (its writes are not stored).
    Stale,
    /// The store lost claim `i` (of those the last plan wants).
    LoseClaim(usize),
    /// Claim `i` (of those the last plan wants) was released in the store.
    ReleaseClaim(usize),
    /// The store gained a bound claim of port `p` of the shared range listener for a
    /// route that does not exist (in namespace `b`).
    ForeignClaim(u16),
    /// The shared Gateway's range ends lower or higher (a Gateway change).
    Resize,
    /// Namespace `a` is labelled so that the second Gateway refuses its routes.
    Relabel,
    /// The daemon gains or loses the allocator role.
    Allocate,
}

fn route_state() -> impl Strategy<Value = RouteState> {
    let port = prop_oneof![3 => Just(None), 2 => (29999..=30008u16).prop_map(Some)];
    let created = prop_oneof![Just(None), (0..50u64).prop_map(Some)];
    (0..3u8, port, 0..3usize, created).prop_map(|(parent, port, service, created)| RouteState {
        parent,
        port,
        service,
        created,
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..ROUTES, route_state()).prop_map(|(i, r)| Op::SetRoute(i, r)),
        3 => (0..ROUTES).prop_map(Op::Delete),
        2 => (0..3usize, 1..4u8).prop_map(|(s, a)| Op::Endpoint(s, a)),
        2 => (0..3usize, 0..3u8).prop_map(|(s, f)| Op::Families(s, f)),
        2 => (0..3usize, 0..4u8).prop_map(|(s, p)| Op::ServicePorts(s, p)),
        2 => (0..3usize, any::<bool>()).prop_map(|(s, r)| Op::Ready(s, r)),
        1 => (0..3u8).prop_map(Op::OtherFamilies),
        2 => (1..90u64).prop_map(Op::Advance),
        1 => Just(Op::Stale),
        1 => (0..ROUTES).prop_map(Op::LoseClaim),
        1 => (0..ROUTES).prop_map(Op::ReleaseClaim),
        1 => (30000..=30008u16).prop_map(Op::ForeignClaim),
        1 => Just(Op::Resize),
        1 => Just(Op::Relabel),
        1 => Just(Op::Allocate),
    ]
}

#[derive(Default)]
struct World {
    routes: BTreeMap<usize, RouteState>,
    endpoints: [u8; 3],
    /// Per Service: IPv4 (0), IPv6 (1) or both (2).
    families: [u8; 3],
    /// Per Service: its ports (see `Op::ServicePorts`).
    service_ports: [u8; 3],
    /// Per Service: whether its endpoints are not ready.
    not_ready: [bool; 3],
    /// The second Gateway's addresses: IPv4 (0), IPv6 (1) or both (2).
    other_families: u8,
    now: u64,
    small: bool,
    labelled: bool,
    no_allocate: bool,
}

impl World {
    fn text(&self) -> String {
        let end = if self.small { 30005 } else { 30007 };
        let all = "allowedRoutes: {namespaces: {from: All}}";
        let other = match self.other_families {
            0 => "{value: 10.0.0.2}",
            1 => "{value: \"2001:db8::2\"}",
            _ => "{value: 10.0.0.2}, {value: \"2001:db8::2\"}",
        };
        let selected = "allowedRoutes: {namespaces: {from: Selector, selector: \
             {matchExpressions: [{key: closed, operator: DoesNotExist}]}}}";
        let mut s = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: berth}}\n\
             spec: {{controllerName: berth.dev/gateway-controller}}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
             metadata: {{name: gw, namespace: infra, creationTimestamp: \"2026-01-01T00:00:00Z\"}}\n\
             spec:\n  gatewayClassName: berth\n  addresses: [{{value: 10.0.0.1}}]\n  infrastructure:\n    \
             parametersRef: {{group: berth.dev, kind: GatewayConfig, name: cfg}}\n  listeners:\n  \
             - {{name: pool, protocol: TCP, port: 30000, {all}}}\n  \
             - {{name: fixed, protocol: TCP, port: 40000, {all}}}\n---\n\
             apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: cfg, namespace: infra}}\n\
             spec:\n  releaseCooldown: 60s\n  listeners: [{{name: pool, endPort: {end}, maxPortsPerNamespace: 3}}]\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
             metadata: {{name: other, namespace: infra, creationTimestamp: \"2026-01-01T00:00:01Z\"}}\n\
             spec:\n  gatewayClassName: berth\n  addresses: [{other}]\n  infrastructure:\n    \
             parametersRef: {{group: berth.dev, kind: GatewayConfig, name: other}}\n  listeners:\n  \
             - {{name: pool, protocol: TCP, port: 30000, {selected}}}\n---\n\
             apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: other, namespace: infra}}\n\
             spec:\n  releaseCooldown: 30s\n  listeners: [{{name: pool, endPort: 30002}}]\n"
        );
        if self.labelled {
            s.push_str(
                "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {closed: \"yes\"}}\n",
            );
        }
        for ns in NAMESPACES {
            for (svc, last) in self.endpoints.iter().enumerate() {
                let ports = match self.service_ports[svc] {
                    0 => Some("{name: p, port: 80}"),
                    1 => Some("{name: p, port: 81}"),
                    2 => Some("{name: p, port: 80}, {name: q, port: 443}"),
                    _ => None,
                };
                if let Some(ports) = ports {
                    s.push_str(&format!(
                        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{svc}, namespace: {ns}}}\n\
                         spec: {{ports: [{ports}]}}\n"
                    ));
                }
                let ready = if self.not_ready[svc] { "false" } else { "true" };
                let families = self.families[svc];
                let slices = [
                    (families != 1).then(|| ("1", "IPv4", format!("10.1.{svc}.{last}"))),
                    (families != 0).then(|| ("6", "IPv6", format!("\"2001:db8:1:{svc}::{last}\""))),
                ];
                for (suffix, kind, address) in slices.into_iter().flatten() {
                    s.push_str(&format!(
                        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                         metadata: {{name: s{svc}-{suffix}, namespace: {ns}, labels: {{kubernetes.io/service-name: s{svc}}}}}\n\
                         addressType: {kind}\nendpoints: [{{addresses: [{address}], conditions: {{ready: {ready}}}}}]\n\
                         ports: [{{name: p, port: 8080}}]\n"
                    ));
                }
            }
        }
        for (i, r) in &self.routes {
            let port = r.port.map(|p| format!(", port: {p}")).unwrap_or_default();
            let parent = match r.parent {
                0 => format!("{{name: gw, namespace: infra, sectionName: pool{port}}}"),
                1 => "{name: gw, namespace: infra, sectionName: fixed}".to_string(),
                _ => format!("{{name: other, namespace: infra{port}}}"),
            };
            let created = r
                .created
                .map(|t| {
                    let t = time(100 + t);
                    format!(
                        ", creationTimestamp: \"{}\"",
                        humantime::format_rfc3339_seconds(t)
                    )
                })
                .unwrap_or_default();
            s.push_str(&format!(
                "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
                 metadata: {{name: r{i}, namespace: {}{created}}}\n\
                 spec:\n  parentRefs: [{parent}]\n  rules: [{{backendRefs: [{{name: s{}, port: 80}}]}}]\n",
                NAMESPACES[i % NAMESPACES.len()],
                r.service,
            ));
        }
        s
    }

    /// The snapshot; with `last`, holding its unchanged objects as `last`'s own
    /// allocations, as the manifest source does.
    fn snapshot(&self, last: Option<&Snapshot>) -> Snapshot {
        let parsed = manifests::parse_file(Path::new("inc.yaml"), &self.text());
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let mut next = manifests::snapshot([&parsed]);
        if let Some(last) = last {
            fn share<T: PartialEq>(next: &mut [Arc<T>], last: &[Arc<T>]) {
                for x in next {
                    if let Some(same) = last.iter().find(|l| **l == *x) {
                        *x = Arc::clone(same);
                    }
                }
            }
            share(&mut next.routes, &last.routes);
            share(&mut next.services, &last.services);
            share(&mut next.endpoint_slices, &last.endpoint_slices);
        }
        next
    }
}

fn time(t: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600 + t)
}

fn input<'a>(snapshot: &'a Snapshot, claims: &'a ClaimList, w: &World) -> Input<'a> {
    Input {
        snapshot,
        claims,
        now: time(1000 + w.now),
        default_addresses: DefaultAddresses::default(),
        ephemeral_ports: Some(32768..=60999),
        allocate: !w.no_allocate,
        snat_ports: DEFAULT_SNAT_PORTS,
        capacity: Default::default(),
    }
}

/// `plan` with every route condition's time set to one value.
fn timeless(mut plan: Plan) -> Plan {
    for r in &mut plan.routes {
        for p in &mut Arc::make_mut(r).status.parents {
            for c in &mut p.conditions {
                c.last_transition_time = Time::at(std::time::UNIX_EPOCH);
            }
        }
    }
    plan
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn incremental_plans_equal_full_plans(ops in proptest::collection::vec(op(), 1..50)) {
        let mut world = World::default();
        let mut incremental = Memo::default();
        let mut full = Memo::full_only();
        let mut last: Option<Snapshot> = None;
        let mut claims = ClaimList::new();
        let mut read = ClaimList::new();
        for (step, op) in ops.iter().enumerate() {
            let mut next_claims = None;
            match op {
                Op::SetRoute(i, r) => {
                    world.routes.insert(*i, r.clone());
                }
                Op::Delete(i) => {
                    world.routes.remove(i);
                }
                Op::Endpoint(s, a) => world.endpoints[*s] = *a,
                Op::Families(s, f) => world.families[*s] = *f,
                Op::ServicePorts(s, p) => world.service_ports[*s] = *p,
                Op::Ready(s, r) => world.not_ready[*s] = !*r,
                Op::OtherFamilies(f) => world.other_families = *f,
                Op::Advance(s) => world.now += s,
                Op::Stale => next_claims = Some(read.clone()),
                Op::LoseClaim(i) => {
                    let mut c = claims.clone();
                    if *i < c.len() {
                        c.remove(*i);
                    }
                    next_claims = Some(c);
                }
                Op::ReleaseClaim(i) => {
                    let mut c = claims.clone();
                    if let Some(claim) = c.get_mut(*i) {
                        Arc::make_mut(claim).status = Some(PortClaimStatus {
                            phase: ClaimPhase::Released,
                            released_at: Some(Time::at(time(1000 + world.now))),
                        });
                    }
                    next_claims = Some(c);
                }
                Op::ForeignClaim(port) => {
                    let mut c = claims.clone();
                    let spec = PortClaimSpec {
                        gateway: "gw".into(),
                        listener: "pool".into(),
                        protocol: "TCP".into(),
                        port: *port,
                        route: ClaimRoute::new(crate::model::RouteKind::Tcp, "b", "gone", None),
                    };
                    let foreign = Arc::new(PortClaim::bound("infra", spec));
                    if !c.iter().any(|x| x.metadata.name == foreign.metadata.name) {
                        c.push_back(foreign);
                    }
                    let mut c: Vec<Arc<PortClaim>> = c.into_iter().collect();
                    bind::sort_claims(&mut c);
                    next_claims = Some(c.into());
                }
                Op::Resize => world.small = !world.small,
                Op::Relabel => world.labelled = !world.labelled,
                Op::Allocate => world.no_allocate = !world.no_allocate,
            }
            let claims_in = next_claims.unwrap_or_else(|| claims.clone());
            // Every other plan gets all objects parsed afresh, as Kubernetes mode does.
            let snapshot = world.snapshot(last.as_ref().filter(|_| step % 2 == 0));
            let inc = plan_with(&input(&snapshot, &claims_in, &world), &mut incremental);
            let reference = plan_with(&input(&snapshot, &claims_in, &world), &mut full);
            let fresh = plan(&input(&snapshot, &claims_in, &world));
            prop_assert_eq!(&inc, &reference, "step {} ({:?})", step, op);
            prop_assert_eq!(timeless(inc.clone()), timeless(fresh), "step {} ({:?})", step, op);
            read = claims_in;
            claims = inc.claims;
            last = Some(snapshot);
        }
    }
}

/// A one-route change of a plan with many routes is planned incrementally, as the
/// full plan would.
#[test]
fn a_one_route_change_is_planned_incrementally() {
    let mut world = World::default();
    for i in 0..ROUTES - 1 {
        world.routes.insert(
            i,
            RouteState {
                parent: (i % 2) as u8,
                port: None,
                service: i % 3,
                created: None,
            },
        );
    }
    let mut memo = Memo::default();
    let first = world.snapshot(None);
    let planned = plan_with(&input(&first, &ClaimList::new(), &world), &mut memo);
    let claims = planned.claims;
    let planned = plan_with(&input(&first, &claims, &world), &mut memo);
    assert_eq!(
        memo.incremental_plans, 1,
        "nothing changed: the last plan again"
    );
    world.routes.insert(
        ROUTES - 1,
        RouteState {
            parent: 0,
            port: None,
            service: 0,
            created: None,
        },
    );
    let second = world.snapshot(Some(&first));
    let inc = plan_with(&input(&second, &planned.claims, &world), &mut memo);
    assert_eq!(memo.incremental_plans, 2);
    let mut full = Memo::full_only();
    plan_with(&input(&first, &ClaimList::new(), &world), &mut full);
    plan_with(&input(&first, &claims, &world), &mut full);
    let reference = plan_with(&input(&second, &planned.claims, &world), &mut full);
    assert_eq!(inc, reference);
    assert!(inc.claims.iter().any(|c| c.spec.route.name == "r9"));
}

/// A world of `n` routes, route `i` on `parent(i)` (see `RouteState`), to Service `i % 3`.
fn with_routes(n: usize, parent: impl Fn(usize) -> u8) -> World {
    let mut world = World::default();
    for i in 0..n {
        let state = RouteState {
            parent: parent(i),
            port: None,
            service: i % 3,
            created: None,
        };
        world.routes.insert(i, state);
    }
    world
}

/// The first plan at a start makes every claim; the next plan (of a change, with the
/// claims it made stored) is an incremental one: it once was a full plan, which at
/// 100k routes took seconds.
#[test]
fn the_first_change_after_a_start_is_planned_incrementally() {
    let mut world = with_routes(ROUTES - 1, |i| (i % 2) as u8);
    let mut memo = Memo::default();
    let first = world.snapshot(None);
    let planned = plan_with(&input(&first, &ClaimList::new(), &world), &mut memo);
    assert_eq!(memo.incremental_plans, 0);
    world.endpoints[1] = 7;
    let second = world.snapshot(Some(&first));
    let inc = plan_with(&input(&second, &planned.claims, &world), &mut memo);
    assert_eq!(
        memo.incremental_plans, 1,
        "a slice changed: an incremental plan"
    );
    assert_eq!(inc, plan(&input(&second, &planned.claims, &world)));
}

/// A changed Service or EndpointSlice re-plans the routes naming it: a route to a
/// Service whose endpoints turned not ready loses its backends, in the incremental
/// plan as in a full one.
#[test]
fn a_service_change_replans_the_routes_naming_it() {
    let mut world = with_routes(ROUTES, |_| 0);
    let mut memo = Memo::default();
    let first = world.snapshot(None);
    let claims = plan_with(&input(&first, &ClaimList::new(), &world), &mut memo).claims;
    let before = plan_with(&input(&first, &claims, &world), &mut memo);
    let backends = |p: &Plan| {
        p.datapath
            .services
            .values()
            .filter(|b| b.iter().any(|w| w.weight > 0))
            .count()
    };
    let served = backends(&before);
    assert!(served > 0, "routes are served");
    let mut plans = memo.incremental_plans;
    let mut current = first;
    for (what, change) in [
        (
            "not ready",
            (|w: &mut World| w.not_ready[0] = true) as fn(&mut World),
        ),
        ("port gone", |w| w.service_ports[1] = 1),
        ("removed", |w| w.service_ports[2] = 3),
        ("back", |w| {
            *w = World {
                routes: w.routes.clone(),
                ..World::default()
            }
        }),
    ] {
        change(&mut world);
        // Unchanged objects are the planned snapshot's allocations, as the manifest
        // source hands them over.
        let next = world.snapshot(Some(&current));
        let inc = plan_with(&input(&next, &claims, &world), &mut memo);
        plans += 1;
        assert_eq!(memo.incremental_plans, plans, "{what}: an incremental plan");
        assert_eq!(inc, plan(&input(&next, &claims, &world)), "{what}");
        if what == "not ready" {
            assert!(
                backends(&inc) < served,
                "the routes to s0 lost their backends taking new flows"
            );
        }
        current = next;
    }
}
