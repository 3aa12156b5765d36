//! IP families: a Gateway serves each family from the endpoints of that family only
//! (there is no NAT64), and says when a family has none.

use std::collections::BTreeSet;

use super::test_support::{find, gateway_status, plan_of, route_accepted, ALL, CLASS};
use super::*;
use crate::model::Protocol;

/// A Gateway `gw` in `infra` on `addresses` with one TCP and one UDP range listener
/// (30000-30009), a route of each kind in `team` on it, and Services `web` (TCP 80)
/// and `dns` (UDP 53) with endpoints `web` and `dns` (each `(addressType, address)`).
fn families_world(addresses: &[&str], web: &[(&str, &str)], dns: &[(&str, &str)]) -> String {
    let addrs: Vec<String> = addresses
        .iter()
        .map(|a| format!("{{value: \"{a}\"}}"))
        .collect();
    let mut s = format!(
        "{CLASS}---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
         metadata: {{name: gw, namespace: infra}}\n\
         spec:\n  gatewayClassName: berth\n  addresses: [{}]\n  infrastructure:\n    \
         parametersRef: {{group: berth.dev, kind: GatewayConfig, name: gw}}\n  listeners:\n  \
         - {{name: tcp, protocol: TCP, port: 30000, {ALL}}}\n  \
         - {{name: udp, protocol: UDP, port: 30000, {ALL}}}\n---\n\
         apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: gw, namespace: infra}}\n\
         spec: {{listeners: [{{name: tcp, endPort: 30009}}, {{name: udp, endPort: 30009}}]}}\n",
        addrs.join(", ")
    );
    for (kind, name, protocol, port, endpoints) in [
        ("TCPRoute", "web", "TCP", 80, web),
        ("UDPRoute", "dns", "UDP", 53, dns),
    ] {
        s.push_str(&format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\n\
             metadata: {{name: {name}, namespace: team}}\n\
             spec:\n  parentRefs: [{{name: gw, namespace: infra}}]\n  \
             rules: [{{backendRefs: [{{name: {name}, port: {port}}}]}}]\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: team}}\n\
             spec: {{ports: [{{name: p, port: {port}, protocol: {protocol}}}]}}\n"
        ));
        for (i, (kind, address)) in endpoints.iter().enumerate() {
            s.push_str(&format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                 metadata: {{name: {name}-{i}, namespace: team, labels: {{kubernetes.io/service-name: {name}}}}}\n\
                 addressType: {kind}\nendpoints: [{{addresses: [\"{address}\"]}}]\n\
                 ports: [{{name: p, port: 8000, protocol: {protocol}}}]\n"
            ));
        }
    }
    s
}

fn resolved_refs<'a>(plan: &'a Plan, name: &str) -> &'a Condition {
    let r = plan.routes.iter().find(|r| r.name == name).expect("route");
    find(&r.status.parents[0].conditions, "ResolvedRefs")
}

/// The backends of the datapath service at `addr`, protocol, port 30000.
fn backends_at(plan: &Plan, addr: &str, protocol: Protocol) -> Vec<String> {
    let service = ServiceAddr {
        addr: addr.parse().expect("ip"),
        protocol,
        port: 30000,
    };
    plan.datapath
        .services
        .get(&service)
        .unwrap_or_else(|| panic!("no service {service} in {:?}", plan.datapath))
        .iter()
        .map(|b| b.endpoint.to_string())
        .collect()
}

#[test]
fn an_ipv6_gateway_refuses_a_route_with_only_ipv4_endpoints_and_serves_the_other() {
    let plan = plan_of(
        &families_world(
            &["2001:db8::1"],
            &[("IPv6", "2001:db8:1::1")],
            &[("IPv4", "10.1.0.53")],
        ),
        &[],
    );
    let dns = resolved_refs(&plan, "dns");
    assert_eq!((&*dns.status, &*dns.reason), ("False", "IPFamilyMismatch"));
    assert_eq!(
        dns.message,
        "Gateway infra/gw serves IPv6 only; Service team/dns has only IPv4 endpoints \
         (there is no NAT64)"
    );
    // The refusal is the route's own: it keeps its port, the other route is served.
    assert_eq!(route_accepted(&plan, "dns").status, "True");
    let web = resolved_refs(&plan, "web");
    assert_eq!(
        (&*web.status, &*web.message),
        ("True", "all backend references resolved")
    );
    assert_eq!(
        backends_at(&plan, "2001:db8::1", Protocol::Tcp),
        ["[2001:db8:1::1]:8000"]
    );
    assert!(backends_at(&plan, "2001:db8::1", Protocol::Udp).is_empty());
    assert_eq!(plan.datapath.services.len(), 2, "{:?}", plan.datapath);
}

#[test]
fn a_dual_stack_gateway_serves_one_claim_on_both_families_with_their_own_endpoints() {
    let plan = plan_of(
        &families_world(
            &["10.0.0.1", "2001:db8::1"],
            &[("IPv4", "10.1.0.1"), ("IPv6", "2001:db8:1::1")],
            &[("IPv4", "10.1.0.53")],
        ),
        &[],
    );
    assert_eq!(
        plan.claims.len(),
        2,
        "one claim per route: {:?}",
        plan.claims
    );
    assert_eq!(
        gateway_status(&plan, "gw")
            .addresses
            .iter()
            .map(|a| a.value.as_str())
            .collect::<Vec<_>>(),
        ["10.0.0.1", "2001:db8::1"]
    );
    assert_eq!(
        backends_at(&plan, "10.0.0.1", Protocol::Tcp),
        ["10.1.0.1:8000"]
    );
    assert_eq!(
        backends_at(&plan, "2001:db8::1", Protocol::Tcp),
        ["[2001:db8:1::1]:8000"]
    );
    let owners: BTreeSet<&str> = plan.owners.values().map(|o| o.name.as_str()).collect();
    assert_eq!(owners, BTreeSet::from(["dns", "web"]));
    // dns has IPv4 endpoints only: served on IPv4, and the IPv6 side says why not.
    assert_eq!(
        backends_at(&plan, "10.0.0.1", Protocol::Udp),
        ["10.1.0.53:8000"]
    );
    assert!(backends_at(&plan, "2001:db8::1", Protocol::Udp).is_empty());
    let dns = resolved_refs(&plan, "dns");
    assert_eq!(dns.status, "True");
    assert!(
        dns.message.contains(
            "served on IPv4 only: Service team/dns has no IPv6 endpoints (IPv6 clients get \
             no backend)"
        ),
        "{}",
        dns.message
    );
}

#[test]
fn an_ipv6_endpoint_slice_is_read_and_its_weights_split_over_its_endpoints() {
    let plan = plan_of(
        &families_world(
            &["2001:db8::1"],
            &[("IPv6", "2001:db8:1::1"), ("IPv6", "2001:DB8:1::2")],
            &[],
        ),
        &[],
    );
    let service = ServiceAddr {
        addr: "2001:db8::1".parse().expect("ip"),
        protocol: Protocol::Tcp,
        port: 30000,
    };
    let backends: Vec<(String, u16)> = plan.datapath.services[&service]
        .iter()
        .map(|b| (b.endpoint.to_string(), b.weight))
        .collect();
    assert_eq!(
        backends,
        [
            ("[2001:db8:1::1]:8000".to_string(), 500),
            ("[2001:db8:1::2]:8000".to_string(), 500)
        ],
        "the backendRef's share is split over its IPv6 endpoints, whatever their slice"
    );
    assert_eq!(service.to_string(), "TCP/[2001:db8::1]:30000");
}

#[test]
fn a_service_named_twice_is_named_once_in_a_family_mismatch() {
    let text = families_world(&["2001:db8::1"], &[], &[("IPv4", "10.1.0.53")]).replace(
        "backendRefs: [{name: dns, port: 53}]",
        "backendRefs: [{name: dns, port: 53}, {name: dns, port: 53, weight: 2}]",
    );
    let plan = plan_of(&text, &[]);
    let dns = resolved_refs(&plan, "dns");
    assert_eq!(dns.reason, "IPFamilyMismatch");
    assert_eq!(
        dns.message.matches("Service team/dns").count(),
        1,
        "{}",
        dns.message
    );
}
