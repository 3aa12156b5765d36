//! The namespace quota counts the ports a namespace holds, bound or cooling down.

use std::{path::Path, time::Duration};

use super::*;
use crate::manifests;

/// A range 30000-30003 with a quota of 2 per namespace, a cool-down of 300 s, and
/// `routes` as (namespace, name).
fn world(routes: &[(&str, &str)]) -> String {
    let mut s = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\n\
        metadata: {name: berth}\nspec: {controllerName: berth.dev/gateway-controller}\n\
        ---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
        metadata: {name: gw, namespace: infra}\n\
        spec:\n  gatewayClassName: berth\n  addresses: [{value: 10.0.0.1}]\n  \
        infrastructure:\n    parametersRef: {group: berth.dev, kind: GatewayConfig, name: cfg}\n  \
        listeners:\n  - {name: pool, protocol: TCP, port: 30000, allowedRoutes: {namespaces: {from: All}}}\n\
        ---\napiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {name: cfg, namespace: infra}\n\
        spec:\n  releaseCooldown: 300s\n  listeners: [{name: pool, endPort: 30003, maxPortsPerNamespace: 2}]\n"
        .to_string();
    for (i, (namespace, name)) in routes.iter().enumerate() {
        s.push_str(&format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
             metadata: {{name: {name}, namespace: {namespace}, creationTimestamp: \"2026-01-01T00:00:{i:02}Z\"}}\n\
             spec:\n  parentRefs: [{{name: gw, namespace: infra}}]\n"
        ));
    }
    s
}

/// Plans `text` over `claims` at `seconds` after 2026-01-01T01:00:00Z.
fn plan_at<'c>(
    text: &str,
    claims: impl IntoIterator<Item = &'c Arc<PortClaim>>,
    seconds: u64,
) -> Plan {
    let claims: ClaimList = claims.into_iter().cloned().collect();
    let parsed = manifests::parse_file(Path::new("quota.yaml"), text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let snapshot = manifests::snapshot([&parsed]);
    let start = humantime::parse_rfc3339("2026-01-01T01:00:00Z").expect("time");
    plan(&Input {
        snapshot: &snapshot,
        claims: &claims,
        now: start + Duration::from_secs(seconds),
        default_addresses: DefaultAddresses::default(),
        ephemeral_ports: None,
        snat_ports: DEFAULT_SNAT_PORTS,
        capacity: Default::default(),
        allocate: true,
    })
}

/// The reason of route `name`'s Accepted condition, and its port if it has one.
fn outcome(plan: &Plan, name: &str) -> (String, Option<u16>) {
    let r = plan.routes.iter().find(|r| r.name == name).expect("route");
    let parent = &r.status.parents[0];
    let accepted = parent
        .conditions
        .iter()
        .find(|c| c.kind == "Accepted")
        .expect("Accepted");
    (accepted.reason.to_string(), parent.parent_ref.port)
}

#[test]
fn a_team_renaming_its_route_hits_its_quota_and_leaves_the_range_to_others() {
    // Team a renames its one route ten times, a second apart: each name releases the
    // last one's port into its cool-down.
    let mut claims = ClaimList::new();
    for i in 0..10 {
        let name = format!("r{i}");
        let p = plan_at(&world(&[("a", &name)]), &claims, i);
        claims = p.claims.clone();
        let (reason, port) = outcome(&p, &name);
        if i < 2 {
            assert_eq!(
                (reason.as_str(), port),
                ("Accepted", Some(30000 + i as u16))
            );
        } else {
            assert_eq!(reason, "QuotaExceeded", "rename {i}: {:?}", p.routes);
        }
    }
    let held = |ns: &str| {
        claims
            .iter()
            .filter(|c| c.spec.route.namespace == ns)
            .count()
    };
    assert_eq!(
        held("a"),
        2,
        "cooling or bound, at most the quota: {claims:?}"
    );

    // Team b, arriving meanwhile, gets the lowest port left.
    let p = plan_at(&world(&[("a", "r9"), ("b", "web")]), &claims, 10);
    assert_eq!(outcome(&p, "web"), ("Accepted".to_string(), Some(30002)));
    assert_eq!(outcome(&p, "r9").0, "QuotaExceeded");

    // Once team a's ports have cooled down, its route gets one.
    let p = plan_at(&world(&[("a", "r9"), ("b", "web")]), &p.claims, 400);
    assert_eq!(outcome(&p, "r9"), ("Accepted".to_string(), Some(30000)));
}

#[test]
fn a_route_at_its_quota_gets_its_own_cooling_claim_back() {
    let both = world(&[("a", "one"), ("a", "two")]);
    let p = plan_at(&both, &[], 0);
    assert_eq!(outcome(&p, "two"), ("Accepted".to_string(), Some(30001)));
    // Route two goes: its claim cools down, and counts against the quota...
    let p = plan_at(&world(&[("a", "one"), ("a", "three")]), &p.claims, 1);
    assert_eq!(outcome(&p, "three").0, "QuotaExceeded");
    // ...yet route two, back within the cool-down, gets its own port again.
    let p = plan_at(&both, &p.claims, 2);
    assert_eq!(outcome(&p, "two"), ("Accepted".to_string(), Some(30001)));
    assert_eq!(outcome(&p, "one"), ("Accepted".to_string(), Some(30000)));
}
