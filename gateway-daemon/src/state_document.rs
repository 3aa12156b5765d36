//! The state document: claims and statuses, as DESIGN.md specifies its JSON shape. The
//! admin endpoint serves it (`/api/v1/state`), `berth check -o json` prints it and
//! `berth get` reads it; `output` prints it as tables.

use serde::{Deserialize, Serialize};

use crate::planner::{changes::common_ends, GatewayEntry, Plan, RouteEntry};

/// The state document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDocument {
    /// Gateway statuses.
    pub gateways: Vec<GatewayEntry>,
    /// Route statuses.
    pub routes: Vec<std::sync::Arc<RouteEntry>>,
    /// Claims held (bound or cooling down).
    pub claims: Vec<std::sync::Arc<ClaimEntry>>,
}

/// One claim in the document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimEntry {
    /// Namespace (the Gateway's).
    pub namespace: String,
    /// Name (`<gateway>-<tcp|udp>-<port>`).
    pub name: String,
    /// Gateway.
    pub gateway: String,
    /// Listener.
    pub listener: String,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// Port.
    pub port: u16,
    /// Holder.
    pub route: ClaimRouteEntry,
    /// `Bound`, or `Released` while the port cools down (its route let go of it); absent
    /// from documents of older daemons, which meant bound.
    #[serde(default)]
    pub phase: crate::model::ClaimPhase,
    /// When a released claim was released (RFC 3339): the port is free after the
    /// listener's cool-down.
    #[serde(
        default,
        rename = "releasedAt",
        skip_serializing_if = "Option::is_none"
    )]
    pub released_at: Option<String>,
}

/// The route of a claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRouteEntry {
    /// Kind.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// The document for a plan.
pub fn document(plan: &Plan) -> StateDocument {
    StateDocument::new(plan.gateways.clone(), plan.routes.clone(), &plan.claims)
}

impl StateDocument {
    /// Keeps the transition times of `old`'s conditions that did not change (a plan
    /// stamps every condition with its own time).
    pub fn carry_times_from(&mut self, old: &StateDocument) {
        use crate::planner::status::carry_times;
        let gateways: std::collections::HashMap<(&str, &str), &GatewayEntry> = old
            .gateways
            .iter()
            .map(|g| ((g.namespace.as_str(), g.name.as_str()), g))
            .collect();
        for g in &mut self.gateways {
            let Some(o) = gateways.get(&(g.namespace.as_str(), g.name.as_str())) else {
                continue;
            };
            carry_times(&mut g.status.conditions, &o.status.conditions);
            for l in &mut g.status.listeners {
                if let Some(ol) = o.status.listeners.iter().find(|ol| ol.name == l.name) {
                    carry_times(&mut l.conditions, &ol.conditions);
                }
            }
        }
        // Both lists are sorted by kind, namespace and name: their common ends of
        // shared entries carry the times already, the rest is one merge of the two.
        fn key(r: &RouteEntry) -> (&str, &str, &str) {
            (r.kind.as_str(), r.namespace.as_str(), r.name.as_str())
        }
        let (head, tail) = common_ends(&old.routes, &self.routes, std::sync::Arc::ptr_eq);
        let mut old_routes = old.routes[head..old.routes.len() - tail].iter().peekable();
        let end = self.routes.len() - tail;
        for r in &mut self.routes[head..end] {
            while old_routes.next_if(|o| key(o) < key(r)).is_some() {}
            let Some(o) = old_routes.next_if(|o| key(o) == key(r)) else {
                continue;
            };
            // Shared with the last plan: its times are the ones published.
            if std::sync::Arc::ptr_eq(r, o) {
                continue;
            }
            if let Some(r) = std::sync::Arc::get_mut(r) {
                crate::planner::carry_parent_times(&mut r.status.parents, &o.status.parents);
                continue;
            }
            // Also held by the planner's memo, which carried the times already (copied
            // only if some time still differs).
            let mut parents = r.status.parents.clone();
            if crate::planner::carry_parent_times(&mut parents, &o.status.parents) {
                std::sync::Arc::make_mut(r).status.parents = parents;
            }
        }
    }

    /// The document of a plan's statuses (moved in) and claims.
    pub fn new(
        gateways: Vec<GatewayEntry>,
        routes: Vec<std::sync::Arc<RouteEntry>>,
        claims: &[std::sync::Arc<crate::model::PortClaim>],
    ) -> Self {
        Self::after(gateways, routes, claims, None)
    }

    /// Like `new`, sharing with `old` (the document made from the claims `old_claims`,
    /// entry by entry) the claim entries that did not change: those of the claims both
    /// lists share at their ends by pointer, and the rest by one merge (both lists are
    /// by namespace, then name).
    pub fn after(
        gateways: Vec<GatewayEntry>,
        routes: Vec<std::sync::Arc<RouteEntry>>,
        claims: &[std::sync::Arc<crate::model::PortClaim>],
        old: Option<(&StateDocument, &[std::sync::Arc<crate::model::PortClaim>])>,
    ) -> Self {
        let (old, old_claims) = old
            .filter(|(doc, made_of)| doc.claims.len() == made_of.len())
            .map_or((&[][..], &[][..]), |(doc, made_of)| {
                (doc.claims.as_slice(), made_of)
            });
        let (head, tail) = common_ends(old_claims, claims, std::sync::Arc::ptr_eq);
        let mut old_middle = old[head..old.len() - tail].iter().peekable();
        let middle = claims[head..claims.len() - tail].iter().map(|c| {
            let key = (c.metadata.ns(), c.metadata.name.as_str());
            while old_middle
                .next_if(|e| (e.namespace.as_str(), e.name.as_str()) < key)
                .is_some()
            {}
            match old_middle.next_if(|e| ClaimEntry::is(e, c)) {
                Some(e) => std::sync::Arc::clone(e),
                None => std::sync::Arc::new(ClaimEntry::of(c)),
            }
        });
        let claims = old[..head]
            .iter()
            .cloned()
            .chain(middle)
            .chain(old[old.len() - tail..].iter().cloned())
            .collect();
        StateDocument {
            gateways,
            routes,
            claims,
        }
    }
}

impl ClaimEntry {
    /// The entry of a claim.
    pub fn of(c: &crate::model::PortClaim) -> Self {
        ClaimEntry {
            namespace: c.metadata.ns().to_string(),
            name: c.metadata.name.clone(),
            gateway: c.spec.gateway.clone(),
            listener: c.spec.listener.clone(),
            protocol: c.spec.protocol.clone(),
            port: c.spec.port,
            route: ClaimRouteEntry {
                kind: c.spec.route.kind.clone(),
                namespace: c.spec.route.namespace.clone(),
                name: c.spec.route.name.clone(),
            },
            phase: phase_of(c),
            released_at: released_at(c),
        }
    }

    /// Whether this is the entry of `c`.
    fn is(&self, c: &crate::model::PortClaim) -> bool {
        let r = &c.spec.route;
        self.namespace == c.metadata.ns()
            && self.name == c.metadata.name
            && self.gateway == c.spec.gateway
            && self.listener == c.spec.listener
            && self.protocol == c.spec.protocol
            && self.port == c.spec.port
            && self.route.kind == r.kind
            && self.route.namespace == r.namespace
            && self.route.name == r.name
            && self.phase == phase_of(c)
            && self.released_at == released_at(c)
    }
}

/// A claim's phase (a claim without a status is bound).
fn phase_of(c: &crate::model::PortClaim) -> crate::model::ClaimPhase {
    match c.is_released() {
        true => crate::model::ClaimPhase::Released,
        false => crate::model::ClaimPhase::Bound,
    }
}

/// When a released claim was released.
fn released_at(c: &crate::model::PortClaim) -> Option<String> {
    c.status.as_ref().and_then(|s| s.released_at.clone())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::{ClaimRoute, PortClaim, PortClaimSpec};

    fn claim(port: u16, route: &str) -> Arc<PortClaim> {
        let route = ClaimRoute::new("TCPRoute", "a", route, None);
        let mut c = PortClaim::bound(
            "infra",
            PortClaimSpec::new("gw", "pool", "TCP", port, route),
        );
        c.metadata.name = format!("gw-tcp-{port}");
        Arc::new(c)
    }

    #[test]
    fn a_document_after_a_change_shares_the_entries_of_unchanged_claims() {
        let before: Vec<Arc<PortClaim>> = (1..=5).map(|p| claim(p, &format!("r{p}"))).collect();
        let old = StateDocument::new(Vec::new(), Vec::new(), &before);
        // Port 3 goes to another route, port 6 is new; the rest are the same claims.
        let mut after = before.clone();
        after[2] = claim(3, "other");
        after.push(claim(6, "r6"));
        let doc = StateDocument::after(Vec::new(), Vec::new(), &after, Some((&old, &before)));
        assert_eq!(doc, StateDocument::new(Vec::new(), Vec::new(), &after));
        for i in [0, 1, 3, 4] {
            assert!(
                Arc::ptr_eq(&doc.claims[i], &old.claims[i]),
                "entry {i} shared"
            );
        }
        assert_eq!(doc.claims[2].route.name, "other");
        // Said to be made of a list that cannot be its own: merged by name alone.
        let doc = StateDocument::after(Vec::new(), Vec::new(), &after, Some((&old, &after[..2])));
        assert_eq!(doc, StateDocument::new(Vec::new(), Vec::new(), &after));
    }
}
