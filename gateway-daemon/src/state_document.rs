//! The state document: claims and statuses, in the JSON shape the README promises. The
//! admin endpoint serves it (`/api/v1/state`), `berth check -o json` prints it and
//! `berth get` reads it; `output` prints it as tables.

use serde::{Deserialize, Serialize};

use crate::{
    model::{common_ends_of, ClaimList},
    planner::{GatewayEntry, Plan, RouteEntry},
};

/// The state document.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StateDocument {
    /// Gateway statuses.
    pub gateways: Vec<GatewayEntry>,
    /// Route statuses.
    pub routes: crate::planner::RouteList,
    /// Claims held (bound or cooling down): the plan's claims themselves (shared, not
    /// copied: a copy took ten strings per claim), each written as its flat
    /// [`ClaimView`].
    #[serde(with = "claim_views")]
    pub claims: ClaimList,
    /// Statuses of Berth's policies (RouteTrafficPolicy, BackendHealthPolicy), by kind,
    /// namespace and name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<crate::planner::traffic::PolicyEntry>,
}

impl PartialEq for StateDocument {
    /// Claims compare as the document shows them.
    fn eq(&self, other: &Self) -> bool {
        self.gateways == other.gateways
            && self.routes == other.routes
            && self.policies == other.policies
            && self.claims.len() == other.claims.len()
            && self
                .claims
                .iter()
                .zip(&other.claims)
                .all(|(a, b)| ClaimView::of(a) == ClaimView::of(b))
    }
}

impl Eq for StateDocument {}

/// The claims of the document as a list of [`ClaimView`]s (read back as claims
/// holding just what the view shows).
mod claim_views {
    use serde::{ser::SerializeSeq, Deserialize, Deserializer, Serializer};

    use super::{ClaimList, ClaimRecord, ClaimView};

    pub fn serialize<S: Serializer>(claims: &ClaimList, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(claims.len()))?;
        for c in claims {
            seq.serialize_element(&ClaimView::of(c))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ClaimList, D::Error> {
        let records = Vec::<ClaimRecord>::deserialize(d)?;
        Ok(records
            .into_iter()
            .map(|r| std::sync::Arc::new(r.into_claim()))
            .collect())
    }
}

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
    pub released_at: Option<crate::model::Time>,
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
    released_at: Option<crate::model::Time>,
}

#[derive(Deserialize)]
struct ClaimRouteRecord {
    kind: String,
    namespace: String,
    name: String,
}

impl<'a> ClaimView<'a> {
    /// The claim as the document shows it.
    pub fn of(c: &'a crate::model::PortClaim) -> Self {
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
            released_at: c.status.as_ref().and_then(|s| s.released_at),
        }
    }
}

impl ClaimRecord {
    /// The claim holding what the record shows.
    fn into_claim(self) -> crate::model::PortClaim {
        use crate::model::{ClaimRoute, Meta, PortClaim, PortClaimSpec, PortClaimStatus};
        let c = self;
        let route = ClaimRoute {
            group: crate::model::Str::const_new(crate::model::GATEWAY_GROUP),
            kind: c.route.kind.into(),
            namespace: c.route.namespace.into(),
            name: c.route.name.into(),
            uid: None,
        };
        PortClaim {
            metadata: Meta {
                name: c.name.into(),
                namespace: Some(c.namespace.into()),
                ..Meta::default()
            },
            spec: PortClaimSpec {
                gateway: c.gateway.into(),
                listener: c.listener.into(),
                protocol: c.protocol.into(),
                port: c.port,
                route,
            },
            status: Some(PortClaimStatus {
                phase: c.phase,
                released_at: c.released_at,
            }),
        }
    }
}

/// The document for a plan.
pub fn document(plan: &Plan) -> StateDocument {
    let mut doc = StateDocument::new(
        plan.gateways.clone(),
        plan.routes.clone(),
        plan.claims.clone(),
    );
    doc.policies = plan.policies.clone();
    doc
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
        fn key(r: &RouteEntry) -> (crate::model::RouteKind, &str, &str) {
            r.key()
        }
        let (head, tail) = common_ends_of(&old.routes, &self.routes, std::sync::Arc::ptr_eq);
        let mut old_routes = old
            .routes
            .focus()
            .narrow(head..old.routes.len() - tail)
            .into_iter()
            .peekable();
        let end = self.routes.len() - tail;
        let mut carried = Vec::new();
        for (i, r) in self
            .routes
            .focus()
            .narrow(head..end)
            .into_iter()
            .enumerate()
        {
            while old_routes.next_if(|o| key(o) < key(r)).is_some() {}
            let Some(o) = old_routes.next_if(|o| key(o) == key(r)) else {
                continue;
            };
            // Shared with the last plan: its times are the ones published.
            if std::sync::Arc::ptr_eq(r, o) {
                continue;
            }
            // The memo may have carried the times already (copied only if some time
            // still differs).
            let mut parents = r.status.parents.clone();
            if crate::planner::carry_parent_times(&mut parents, &o.status.parents) {
                carried.push((head + i, parents));
            }
        }
        for (i, parents) in carried {
            std::sync::Arc::make_mut(&mut self.routes[i]).status.parents = parents;
        }
        for p in &mut self.policies {
            let Some(o) = old
                .policies
                .iter()
                .find(|o| (&o.kind, &o.namespace, &o.name) == (&p.kind, &p.namespace, &p.name))
            else {
                continue;
            };
            for a in &mut p.status.ancestors {
                if let Some(oa) = o
                    .status
                    .ancestors
                    .iter()
                    .find(|oa| oa.ancestor_ref == a.ancestor_ref)
                {
                    carry_times(&mut a.conditions, &oa.conditions);
                }
            }
        }
    }

    /// The document of a plan's statuses (moved in) and claims.
    pub fn new(
        gateways: Vec<GatewayEntry>,
        routes: crate::planner::RouteList,
        claims: ClaimList,
    ) -> Self {
        StateDocument {
            gateways,
            routes,
            claims,
            policies: Vec::new(),
        }
    }
}
