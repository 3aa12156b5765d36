//! RouteTrafficPolicies: the flow settings of their routes' services and their status.

use super::{
    test_support::{gateway, plan_of, route, ALL, CLASS},
    traffic::PolicyEntry,
    Plan,
};
use crate::model::FlowSettings;

/// A Gateway with a UDP and a TCP listener, a UDPRoute `game` and a TCPRoute
/// `shop` on them, and `policies` (YAML documents).
fn world(policies: &str) -> Plan {
    let udp = format!("{{name: udp, protocol: UDP, port: 40000, {ALL}}}");
    let tcp = format!("{{name: tcp, protocol: TCP, port: 30000, {ALL}}}");
    let mut text = format!("{CLASS}{}", gateway("gw", 0, &[&udp, &tcp], None));
    text.push_str(&route(
        "UDPRoute",
        "game",
        1,
        "name: gw, namespace: infra, sectionName: udp",
    ));
    text.push_str(&route(
        "TCPRoute",
        "shop",
        2,
        "name: gw, namespace: infra, sectionName: tcp",
    ));
    text.push_str(policies);
    plan_of(&text, [])
}

fn policy(name: &str, created: u64, spec: &str) -> String {
    format!(
        "---\napiVersion: berth.dev/v1alpha1\nkind: RouteTrafficPolicy\n\
         metadata: {{name: {name}, namespace: team, creationTimestamp: \"2026-01-01T00:02:{created:02}Z\"}}\n\
         spec:\n{spec}\n"
    )
}

fn status<'a>(plan: &'a Plan, name: &str) -> &'a PolicyEntry {
    plan.policies
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no status for {name}: {:?}", plan.policies))
}

/// The Accepted condition of a policy's `i`th target: (status, reason, message).
fn accepted(plan: &Plan, name: &str, i: usize) -> (String, String, String) {
    let c = &status(plan, name).status.ancestors[i].conditions[0];
    assert_eq!(c.kind, "Accepted");
    (
        c.status.to_string(),
        c.reason.to_string(),
        c.message.to_string(),
    )
}

/// The flow settings of every service of the route on `port`.
fn settings_on(plan: &Plan, port: u16) -> Vec<FlowSettings> {
    plan.datapath
        .traffic
        .iter()
        .filter(|(s, _)| s.port == port)
        .map(|(_, t)| *t)
        .collect()
}

#[test]
fn a_policy_sets_its_routes_idle_timeout_and_affinity_and_says_accepted() {
    let plan = world(&policy(
        "slow-clients",
        0,
        "  targetRefs: [{group: gateway.networking.k8s.io, kind: UDPRoute, name: game}]\n  \
         udpIdleTimeout: 15m\n  sessionAffinity: {type: ClientIP, timeout: 1h}",
    ));
    assert_eq!(
        settings_on(&plan, 40000),
        vec![FlowSettings {
            idle_secs: Some(900),
            affinity_secs: Some(3600)
        }]
    );
    // The TCPRoute has no policy: the defaults, so no entry.
    assert!(settings_on(&plan, 30000).is_empty());
    let (ok, reason, message) = accepted(&plan, "slow-clients", 0);
    assert_eq!((ok.as_str(), reason.as_str()), ("True", "Accepted"));
    assert!(message.contains("idle timeout 15m"), "{message}");
}

#[test]
fn bad_values_are_invalid_naming_the_field_and_leave_other_policies_alone() {
    let plan = world(&format!(
        "{}{}{}",
        policy(
            "bad-timeout",
            0,
            "  targetRefs: [{group: gateway.networking.k8s.io, kind: UDPRoute, name: game}]\n  \
             udpIdleTimeout: soon",
        ),
        policy(
            "bad-affinity",
            1,
            "  targetRefs: [{group: gateway.networking.k8s.io, kind: UDPRoute, name: game}]\n  \
             sessionAffinity: {type: Cookie}",
        ),
        policy(
            "good",
            2,
            "  targetRefs: [{group: gateway.networking.k8s.io, kind: TCPRoute, name: shop}]\n  \
             tcpIdleTimeout: 2h\n  udpIdleTimeout: 48h",
        ),
    ));
    let (ok, reason, message) = accepted(&plan, "bad-timeout", 0);
    assert_eq!((ok.as_str(), reason.as_str()), ("False", "Invalid"));
    assert!(
        message.contains("spec.udpIdleTimeout \"soon\""),
        "{message}"
    );
    let (_, reason, message) = accepted(&plan, "bad-affinity", 0);
    assert_eq!(reason, "Invalid");
    assert!(
        message.contains("spec.sessionAffinity.type \"Cookie\""),
        "{message}"
    );
    // Out of range, though for another protocol: the whole policy is refused.
    let (ok, _, message) = accepted(&plan, "good", 0);
    assert_eq!(ok, "False");
    assert!(
        message.contains("spec.udpIdleTimeout \"48h\": between 1s and 24h"),
        "{message}"
    );
    assert!(plan.datapath.traffic.is_empty());
}

#[test]
fn the_oldest_policy_of_a_route_wins_and_the_others_say_conflicted() {
    let plan = world(&format!(
        "{}{}",
        policy(
            "newer",
            5,
            "  targetRefs: [{group: gateway.networking.k8s.io, kind: TCPRoute, name: shop}]\n  \
             tcpIdleTimeout: 1h",
        ),
        policy(
            "older",
            1,
            "  targetRefs:\n  - {group: gateway.networking.k8s.io, kind: TCPRoute, name: shop}\n  \
             - {group: gateway.networking.k8s.io, kind: TCPRoute, name: gone}\n  \
             - {group: \"\", kind: Service, name: shop}\n  \
             tcpIdleTimeout: 30m",
        ),
    ));
    assert_eq!(
        settings_on(&plan, 30000),
        vec![FlowSettings {
            idle_secs: Some(1800),
            affinity_secs: None
        }]
    );
    assert_eq!(accepted(&plan, "older", 0).0, "True");
    assert_eq!(accepted(&plan, "older", 1).1, "TargetNotFound");
    assert_eq!(accepted(&plan, "older", 2).1, "Invalid");
    let (ok, reason, message) = accepted(&plan, "newer", 0);
    assert_eq!((ok.as_str(), reason.as_str()), ("False", "Conflicted"));
    assert!(message.contains("RouteTrafficPolicy older"), "{message}");
}
