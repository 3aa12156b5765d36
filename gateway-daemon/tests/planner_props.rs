//! Property tests of the allocator: random sequences of route creations, deletions,
//! edits and time steps, each followed by a plan that feeds its claims to the next.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use berth::{
    check::StateDocument,
    manifests,
    model::{ClaimPhase, PortClaim},
    planner::{self, Input},
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

fn input<'a>(
    snapshot: &'a berth::model::Snapshot,
    claims: &'a [Arc<PortClaim>],
    now: u64,
) -> Input<'a> {
    Input {
        snapshot,
        claims,
        now: time(now),
        default_address: None,
        ephemeral_ports: None,
        allocate: true,
    }
}

fn run(
    routes: &BTreeMap<usize, RouteState>,
    claims: &[Arc<PortClaim>],
    now: u64,
) -> Vec<Arc<PortClaim>> {
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

fn bound(claims: &[Arc<PortClaim>]) -> BTreeMap<String, u16> {
    claims
        .iter()
        .filter(|c| {
            c.status
                .as_ref()
                .is_none_or(|s| s.phase == ClaimPhase::Bound)
        })
        .map(|c| (c.spec.route.name.clone(), c.spec.port))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn allocation_invariants_hold_over_random_histories(ops in proptest::collection::vec(op(), 1..40)) {
        let mut routes: BTreeMap<usize, RouteState> = BTreeMap::new();
        let mut claims: Vec<Arc<PortClaim>> = Vec::new();
        let mut now = 0u64;
        // port -> (route, released at) of releases still cooling down
        let mut released: BTreeMap<u16, (String, u64)> = BTreeMap::new();
        for op in ops {
            let before = bound(&claims);
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
                if let Some(at) = c.status.as_ref().and_then(|s| s.released_at.as_deref()) {
                    let at = humantime::parse_rfc3339(at).expect("releasedAt");
                    let at = at.duration_since(time(0)).expect("after start").as_secs();
                    released.insert(c.spec.port, (c.spec.route.name.clone(), at));
                }
            }
            released.retain(|_, (_, at)| now < *at + COOLDOWN);
            for (route, port) in &after {
                if let Some((owner, _)) = released.get(port) {
                    prop_assert_eq!(owner, route, "port {} reassigned during its cool-down", port);
                }
            }
            // Quotas hold.
            for ns in NAMESPACES {
                let held = claims.iter().filter(|c| c.spec.route.namespace == ns
                    && c.status.as_ref().is_none_or(|s| s.phase == ClaimPhase::Bound)).count();
                prop_assert!(held <= QUOTA, "namespace {} holds {} ports", ns, held);
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
        let mut claims: Vec<Arc<PortClaim>> = Vec::new();
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
            let mut want = StateDocument::new(fresh.gateways, fresh.routes, &fresh.claims);
            // Claim entries shared with the last published state where unchanged.
            let planned = StateDocument::after(
                remembered.gateways,
                remembered.routes,
                &remembered.claims,
                published.as_ref(),
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

/// Two Gateways on a shared address: `a` (10.0.0.1, range 30000-30007) and `b`
/// (10.0.0.1 and 10.0.0.2, range 30004-30011 and a fixed listener on 30002). Even
/// routes attach to `a`, odd ones to `b`; `Flip` swaps which Gateway is older.
mod shared_address {
    use super::*;

    pub const A: (u16, u16) = (30000, 30007);
    pub const B: (u16, u16) = (30004, 30011);
    pub const FIXED: u16 = 30002;

    #[derive(Clone, Debug)]
    pub enum Op {
        Create(usize, Option<u16>),
        Delete(usize),
        Edit(usize, Option<u16>),
        Advance(u64),
        Flip,
    }

    pub fn op() -> impl Strategy<Value = Op> {
        let port = prop_oneof![3 => Just(None), 2 => (A.0 - 1..=B.1 + 1).prop_map(Some)];
        prop_oneof![
            4 => (0..10usize, port.clone()).prop_map(|(i, p)| Op::Create(i, p)),
            2 => (0..10usize).prop_map(Op::Delete),
            1 => (0..10usize, port).prop_map(|(i, p)| Op::Edit(i, p)),
            2 => (1..90u64).prop_map(Op::Advance),
            1 => Just(Op::Flip),
        ]
    }

    pub fn gateway_of(i: usize) -> &'static str {
        ["a", "b"][i % 2]
    }

    pub fn manifests_text(routes: &BTreeMap<usize, RouteState>, flipped: bool) -> String {
        let (a_created, b_created) = match flipped {
            false => (time(0), time(1)),
            true => (time(1), time(0)),
        };
        let created = |t| humantime::format_rfc3339_seconds(t);
        let mut s = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: berth}}\n\
             spec: {{controllerName: berth.dev/gateway-controller}}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
             metadata: {{name: a, namespace: infra, creationTimestamp: \"{}\"}}\n\
             spec:\n  gatewayClassName: berth\n  addresses: [{{value: 10.0.0.1}}]\n  infrastructure:\n    \
             parametersRef: {{group: berth.dev, kind: GatewayConfig, name: a}}\n  listeners:\n  \
             - {{name: pool, protocol: TCP, port: {}, allowedRoutes: {{namespaces: {{from: All}}}}}}\n---\n\
             apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: a, namespace: infra}}\n\
             spec:\n  releaseCooldown: {COOLDOWN}s\n  listeners: [{{name: pool, endPort: {}}}]\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
             metadata: {{name: b, namespace: infra, creationTimestamp: \"{}\"}}\n\
             spec:\n  gatewayClassName: berth\n  addresses: [{{value: 10.0.0.2}}, {{value: 10.0.0.1}}]\n  infrastructure:\n    \
             parametersRef: {{group: berth.dev, kind: GatewayConfig, name: b}}\n  listeners:\n  \
             - {{name: pool, protocol: TCP, port: {}, allowedRoutes: {{namespaces: {{from: All}}}}}}\n  \
             - {{name: fixed, protocol: TCP, port: {FIXED}, allowedRoutes: {{namespaces: {{from: All}}}}}}\n---\n\
             apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: b, namespace: infra}}\n\
             spec:\n  releaseCooldown: {COOLDOWN}s\n  listeners: [{{name: pool, endPort: {}}}]\n",
            created(a_created),
            A.0,
            A.1,
            created(b_created),
            B.0,
            B.1,
        );
        for (i, r) in routes {
            let port = r.port.map(|p| format!(", port: {p}")).unwrap_or_default();
            s.push_str(&format!(
                "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
                 metadata: {{name: r{i}, namespace: {}, creationTimestamp: \"{}\"}}\n\
                 spec:\n  parentRefs: [{{name: {}, namespace: infra{port}}}]\n",
                NAMESPACES[i % NAMESPACES.len()],
                created(time(r.created)),
                gateway_of(*i),
            ));
        }
        s
    }

    pub fn snapshot(routes: &BTreeMap<usize, RouteState>, flipped: bool) -> berth::model::Snapshot {
        let text = manifests_text(routes, flipped);
        let parsed = manifests::parse_file(std::path::Path::new("shared.yaml"), &text);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        manifests::snapshot([&parsed])
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// However routes come and go and whichever Gateway is older, no (address,
    /// protocol, port) is given to two routes: every bound claim is served on every
    /// address of its Gateway to its own route, and nothing else is served but the
    /// fixed listener of a Gateway that does not yield its port.
    #[test]
    fn no_address_protocol_and_port_is_served_to_two_routes(
        ops in proptest::collection::vec(shared_address::op(), 1..40)
    ) {
        use berth::datapath::{Protocol, ServiceAddr};
        use shared_address::{Op, FIXED};

        let mut routes: BTreeMap<usize, RouteState> = BTreeMap::new();
        let mut claims: Vec<Arc<PortClaim>> = Vec::new();
        let mut now = 2u64;
        let mut flipped = false;
        let mut memo = planner::Memo::default();
        for op in ops {
            match op {
                Op::Create(i, port) => {
                    routes.entry(i).or_insert(RouteState { created: now, port });
                }
                Op::Delete(i) => {
                    routes.remove(&i);
                }
                Op::Edit(i, port) => {
                    if let Some(r) = routes.get_mut(&i) {
                        r.port = port;
                    }
                }
                Op::Advance(s) => now += s,
                Op::Flip => flipped = !flipped,
            }
            let snapshot = shared_address::snapshot(&routes, flipped);
            let plan = planner::plan(&input(&snapshot, &claims, now));
            let remembered = planner::plan_with(&input(&snapshot, &claims, now), &mut memo);
            prop_assert_eq!(&plan.claims, &remembered.claims);
            prop_assert_eq!(&plan.datapath, &remembered.datapath);
            prop_assert_eq!(&plan.owners, &remembered.owners);
            prop_assert_eq!(&plan.gateways, &remembered.gateways);

            let addresses = |gateway: &str| -> Vec<std::net::Ipv4Addr> {
                plan.gateways
                    .iter()
                    .find(|g| g.name == gateway)
                    .map(|g| g.status.addresses.iter().map(|a| a.value.parse().expect("ipv4")).collect())
                    .unwrap_or_default()
            };
            let mut claimed: BTreeMap<ServiceAddr, String> = BTreeMap::new();
            for c in plan.claims.iter().filter(|c| {
                c.status.as_ref().is_none_or(|s| s.phase == ClaimPhase::Bound)
            }) {
                for addr in addresses(&c.spec.gateway) {
                    let service = ServiceAddr { addr, protocol: Protocol::Tcp, port: c.spec.port };
                    let route = c.spec.route.name.clone();
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
            let fixed_yields = plan.gateways.iter().find(|g| g.name == "b").is_some_and(|g| {
                g.status.listeners.iter().any(|l| l.name == "fixed"
                    && l.conditions.iter().any(|c| c.kind == "Conflicted" && c.status == "True"))
            });
            for (service, owner) in &plan.owners {
                let fixed = service.port == FIXED && !fixed_yields;
                prop_assert!(
                    claimed.contains_key(service) || fixed,
                    "{} served to {} without a claim", service, owner.name
                );
            }
            prop_assert_eq!(plan.owners.len(), plan.datapath.services.len());
            claims = remembered.claims;
        }
    }
}
