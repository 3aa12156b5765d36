//! Repair: fixing drift between PortClaims and routes. Claims whose route is gone, and
//! routes that lack a claim, are the planner's ordinary input (it releases the first
//! and requests ports for the second). What the planner cannot know is which port a
//! route held before its claim vanished (deleted by hand, lost in a restore): the
//! route's own status still says so. Each such port, if still free, is offered back
//! to the route as a claim, so the route keeps its port instead of getting the lowest
//! free one.

use std::collections::BTreeSet;

use serde_json::Value;

use super::sources::View;
use crate::{
    model::{
        claim_name, ClaimRoute, PortClaim, PortClaimSpec, Protocol, BERTH_GROUP, CONTROLLER_NAME,
    },
    planner::status::RouteParentStatus,
};

/// Claims to offer the planner for routes whose status shows a port on a range
/// listener that no stored claim holds, and that hold no claim on that listener.
pub fn hints(view: &View) -> Vec<PortClaim> {
    let mut out = Vec::new();
    let mut offered = BTreeSet::new();
    let held = |ns: &str, name: &str| {
        view.held
            .claims
            .contains_key(&(ns.to_string(), name.to_string()))
    };
    for ((kind, ns, name), obj) in &view.routes {
        let parents = obj
            .data
            .pointer("/status/parents")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for p in parents {
            let Ok(p) = serde_json::from_value::<RouteParentStatus>(p) else {
                continue;
            };
            let accepted = p
                .conditions
                .iter()
                .any(|c| c.kind == "Accepted" && c.status == "True");
            let (Some(port), true) = (
                p.parent_ref.port,
                accepted && p.controller_name == CONTROLLER_NAME,
            ) else {
                continue;
            };
            let gw_ns = p
                .parent_ref
                .namespace
                .clone()
                .unwrap_or_else(|| ns.as_str().into());
            let gw_name = &p.parent_ref.name;
            let protocol = kind.protocol();
            let Some(listener) = range_listener(view, &gw_ns, gw_name, protocol, port) else {
                continue;
            };
            let route_holds = view.held.claims.values().any(|(c, _)| {
                c.metadata.ns() == gw_ns
                    && c.spec.gateway == *gw_name
                    && c.spec.listener == listener
                    && crate::model::RouteKind::of_name(&c.spec.route.kind) == Some(*kind)
                    && c.spec.route.namespace == *ns
                    && c.spec.route.name == *name
            });
            let claim = claim_name(gw_name, protocol.as_str(), port);
            if route_holds || held(&gw_ns, &claim) || !offered.insert((gw_ns.clone(), claim)) {
                continue;
            }
            let uid = view
                .snapshot
                .routes
                .iter()
                .find(|r| r.kind == *kind && r.metadata.ns() == ns && r.metadata.name == *name)
                .and_then(|r| r.metadata.uid.clone());
            out.push(PortClaim::bound(
                &gw_ns,
                PortClaimSpec {
                    gateway: gw_name.as_str().into(),
                    listener: listener.into(),
                    protocol: protocol.to_string().into(),
                    port,
                    route: ClaimRoute::new(*kind, ns, name, uid),
                },
            ));
        }
    }
    out
}

/// The name of the range listener of a Gateway whose range holds `port`.
fn range_listener(
    view: &View,
    ns: &str,
    gateway: &str,
    protocol: Protocol,
    port: u16,
) -> Option<String> {
    let gw = view
        .snapshot
        .gateways
        .iter()
        .find(|g| g.metadata.ns() == ns && g.metadata.name == gateway)?;
    let pref = gw.spec.infrastructure.as_ref()?.parameters_ref.as_ref()?;
    if pref.group != BERTH_GROUP || pref.kind != "GatewayConfig" {
        return None;
    }
    let config = view
        .snapshot
        .gateway_configs
        .iter()
        .find(|c| c.metadata.ns() == ns && c.metadata.name == pref.name)?;
    config.spec.listeners.iter().find_map(|r| {
        let l = gw.spec.listeners.iter().find(|l| l.name == r.name)?;
        (Protocol::parse(&l.protocol) == Some(protocol) && (l.port..=r.end_port).contains(&port))
            .then(|| l.name.clone())
    })
}
