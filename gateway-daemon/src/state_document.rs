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
    pub claims: Vec<ClaimEntry>,
}

/// One claim in the document: the plan's claim itself (shared, not copied: a copy
/// took ten strings per claim), written as its flat [`ClaimView`].
#[derive(Clone)]
pub struct ClaimEntry(std::sync::Arc<crate::model::PortClaim>);

/// A claim as the document shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClaimView<'a> {
    /// Namespace (the Gateway's).
    pub namespace: &'a str,
    /// Name (`<gateway>-<tcp|udp>-<port>`).
    pub name: &'a str,
    /// Gateway.
    pub gateway: &'a str,
    /// Listener.
    pub listener: &'a str,
    /// `TCP` or `UDP`.
    pub protocol: &'a str,
    /// Port.
    pub port: u16,
    /// Holder.
    pub route: ClaimRouteView<'a>,
    /// `Bound`, or `Released` while the port cools down (its route let go of it).
    pub phase: crate::model::ClaimPhase,
    /// When a released claim was released (RFC 3339): the port is free after the
    /// listener's cool-down.
    #[serde(rename = "releasedAt", skip_serializing_if = "Option::is_none")]
    pub released_at: Option<&'a str>,
}

/// The route of a claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClaimRouteView<'a> {
    /// Kind.
    pub kind: &'a str,
    /// Namespace.
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
}

/// A claim as a document read back holds it (`berth get`).
#[derive(Deserialize)]
struct ClaimRecord {
    namespace: String,
    name: String,
    gateway: String,
    listener: String,
    protocol: String,
    port: u16,
    route: ClaimRouteRecord,
    /// Absent from documents of older daemons, which meant bound.
    #[serde(default)]
    phase: crate::model::ClaimPhase,
    #[serde(default, rename = "releasedAt")]
    released_at: Option<String>,
}

#[derive(Deserialize)]
struct ClaimRouteRecord {
    kind: String,
    namespace: String,
    name: String,
}

impl ClaimEntry {
    /// The entry of a claim.
    pub fn of(c: &std::sync::Arc<crate::model::PortClaim>) -> Self {
        ClaimEntry(std::sync::Arc::clone(c))
    }

    /// The claim as the document shows it.
    pub fn view(&self) -> ClaimView<'_> {
        let c = &*self.0;
        let r = &c.spec.route;
        ClaimView {
            namespace: c.metadata.ns(),
            name: &c.metadata.name,
            gateway: &c.spec.gateway,
            listener: &c.spec.listener,
            protocol: &c.spec.protocol,
            port: c.spec.port,
            route: ClaimRouteView {
                kind: &r.kind,
                namespace: &r.namespace,
                name: &r.name,
            },
            phase: match c.is_released() {
                true => crate::model::ClaimPhase::Released,
                false => crate::model::ClaimPhase::Bound,
            },
            released_at: c.status.as_ref().and_then(|s| s.released_at.as_deref()),
        }
    }
}

impl PartialEq for ClaimEntry {
    fn eq(&self, other: &Self) -> bool {
        self.view() == other.view()
    }
}

impl Eq for ClaimEntry {}

impl std::fmt::Debug for ClaimEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.view().fmt(f)
    }
}

impl Serialize for ClaimEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.view().serialize(s)
    }
}

impl<'de> Deserialize<'de> for ClaimEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use crate::model::{ClaimRoute, Meta, PortClaim, PortClaimSpec, PortClaimStatus};
        let c = ClaimRecord::deserialize(d)?;
        let route = ClaimRoute {
            group: crate::model::GATEWAY_GROUP.to_string(),
            kind: c.route.kind,
            namespace: c.route.namespace,
            name: c.route.name,
            uid: None,
        };
        Ok(ClaimEntry(std::sync::Arc::new(PortClaim {
            metadata: Meta {
                name: c.name,
                namespace: Some(c.namespace),
                ..Meta::default()
            },
            spec: PortClaimSpec {
                gateway: c.gateway,
                listener: c.listener,
                protocol: c.protocol,
                port: c.port,
                route,
            },
            status: Some(PortClaimStatus {
                phase: c.phase,
                released_at: c.released_at,
            }),
        })))
    }
}

/// The document for a plan.
pub fn document(plan: &Plan) -> StateDocument {
    StateDocument::new(
        plan.gateways.clone(),
        plan.routes.clone(),
        plan.claims.clone(),
    )
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
        claims: Vec<std::sync::Arc<crate::model::PortClaim>>,
    ) -> Self {
        StateDocument {
            gateways,
            routes,
            // Moved in: an entry is the claim itself, without touching its count.
            claims: claims.into_iter().map(ClaimEntry).collect(),
        }
    }
}
