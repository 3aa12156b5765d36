//! What the planner's tests share: objects written as YAML, the plan of them, and the
//! conditions and owners read back from it.

use std::{net::Ipv4Addr, ops::RangeInclusive, path::Path};

use super::*;
use crate::{datapath::Capacity, manifests, model::Protocol};

pub(super) const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\n\
    metadata: {name: berth}\nspec: {controllerName: berth.dev/gateway-controller}\n";

pub(super) const ALL: &str = "allowedRoutes: {namespaces: {from: All}}";

/// A Gateway `name` in `infra` on 10.0.0.1, created at `created` (seconds), with
/// `listeners` (YAML flow items) and, for `range = Some((listener, end))`, a
/// GatewayConfig making that listener a range.
pub(super) fn gateway(
    name: &str,
    created: u64,
    listeners: &[&str],
    range: Option<(&str, u16)>,
) -> String {
    let params = match range {
        Some(_) => format!(
            "  infrastructure:\n    parametersRef: {{group: berth.dev, kind: GatewayConfig, name: {name}}}\n"
        ),
        None => String::new(),
    };
    let mut s = format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
         metadata: {{name: {name}, namespace: infra, creationTimestamp: \"2026-01-01T00:00:{created:02}Z\"}}\n\
         spec:\n  gatewayClassName: berth\n  addresses: [{{value: 10.0.0.1}}]\n{params}  listeners:\n"
    );
    for l in listeners {
        s.push_str(&format!("  - {l}\n"));
    }
    if let Some((listener, end)) = range {
        s.push_str(&format!(
            "---\napiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\n\
             metadata: {{name: {name}, namespace: infra}}\n\
             spec: {{listeners: [{{name: {listener}, endPort: {end}}}]}}\n"
        ));
    }
    s
}

/// A Gateway `name` with one TCP range listener `listener` (`first..=last`) that
/// takes routes from every namespace.
pub(super) fn range_gateway(
    name: &str,
    created: u64,
    listener: &str,
    first: u16,
    last: u16,
) -> String {
    let spec = format!("{{name: {listener}, protocol: TCP, port: {first}, {ALL}}}");
    gateway(name, created, &[&spec], Some((listener, last)))
}

/// A route `kind/team/name` with one parentRef (YAML flow mapping body).
pub(super) fn route(kind: &str, name: &str, created: u64, parent: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\n\
         metadata: {{name: {name}, namespace: team, creationTimestamp: \"2026-01-01T00:01:{created:02}Z\"}}\n\
         spec:\n  parentRefs: [{{{parent}}}]\n"
    )
}

/// The plan of `text` (YAML documents) with `claims` stored.
pub(super) fn plan_of<'c>(
    text: &str,
    claims: impl IntoIterator<Item = &'c Arc<PortClaim>>,
) -> Plan {
    plan_for(text, claims, DEFAULT_SNAT_PORTS, Capacity::default())
}

/// The plan of `text` (YAML documents) with `claims` stored, `snat_ports` as the
/// configured SNAT source ports and a datapath of room `capacity`.
pub(super) fn plan_for<'c>(
    text: &str,
    claims: impl IntoIterator<Item = &'c Arc<PortClaim>>,
    snat_ports: RangeInclusive<u16>,
    capacity: Capacity,
) -> Plan {
    let claims: ClaimList = claims.into_iter().cloned().collect();
    let parsed = manifests::parse_file(Path::new("test.yaml"), text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let snapshot = manifests::snapshot([&parsed]);
    plan(&Input {
        snapshot: &snapshot,
        claims: &claims,
        now: humantime::parse_rfc3339("2026-01-01T01:00:00Z").expect("time"),
        default_addresses: DefaultAddresses::default(),
        ephemeral_ports: None,
        snat_ports,
        allocate: true,
        capacity,
    })
}

pub(super) fn find<'a>(conditions: &'a [Condition], kind: &str) -> &'a Condition {
    conditions
        .iter()
        .find(|c| c.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} in {conditions:?}"))
}

pub(super) fn gateway_status<'a>(plan: &'a Plan, name: &str) -> &'a GatewayStatus {
    &plan
        .gateways
        .iter()
        .find(|g| g.name == name)
        .expect("gateway")
        .status
}

pub(super) fn listener<'a>(plan: &'a Plan, gateway: &str, name: &str) -> &'a ListenerStatus {
    gateway_status(plan, gateway)
        .listeners
        .iter()
        .find(|l| l.name == name)
        .expect("listener")
}

pub(super) fn route_accepted<'a>(plan: &'a Plan, name: &str) -> &'a Condition {
    let r = plan.routes.iter().find(|r| r.name == name).expect("route");
    find(&r.status.parents[0].conditions, "Accepted")
}

pub(super) fn owner(plan: &Plan, port: u16) -> Option<&str> {
    let service = ServiceAddr {
        addr: Ipv4Addr::new(10, 0, 0, 1).into(),
        protocol: Protocol::Tcp,
        port,
    };
    plan.owners.get(&service).map(|r| r.name.as_str())
}

pub(super) fn claim(gateway: &str, listener: &str, port: u16, route: &str) -> Arc<PortClaim> {
    Arc::new(PortClaim::bound(
        "infra",
        PortClaimSpec {
            gateway: gateway.into(),
            listener: listener.into(),
            protocol: "TCP".into(),
            port,
            route: ClaimRoute::new(crate::model::RouteKind::Tcp, "team", route, None),
        },
    ))
}
