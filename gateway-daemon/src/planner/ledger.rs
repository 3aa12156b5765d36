//! The claims of one plan, indexed so that allocation stays fast with many routes.

use super::FastMap as HashMap;

use crate::model::{ClaimPhase, ClaimRoute, PortClaim, PortClaimStatus};

/// (gateway namespace, gateway name).
pub type GwKey = (String, String);

fn is_bound(c: &PortClaim) -> bool {
    c.status
        .as_ref()
        .is_none_or(|s| s.phase == ClaimPhase::Bound)
}

/// Claims (a removed claim is `None`, so indexes stay valid) and their indexes.
#[derive(Default)]
pub struct Ledger {
    /// All claims of the plan.
    pub claims: Vec<Option<PortClaim>>,
    /// (gateway, protocol, port) → claim.
    by_port: HashMap<(GwKey, String, u16), usize>,
    /// (gateway, listener, route namespace) → bound claims.
    bound: HashMap<(GwKey, String, String), u32>,
    /// (gateway, route kind, route namespace, route name) → released claims.
    released: HashMap<(GwKey, String, String, String), Vec<usize>>,
    /// (gateway, protocol, first port of a range) → no port of the range below this is
    /// free (ranges do not overlap, and ports only fill up within a plan).
    floor: HashMap<(GwKey, String, u16), u16>,
}

fn gw_of(c: &PortClaim) -> GwKey {
    (c.metadata.ns().to_string(), c.spec.gateway.clone())
}

impl Ledger {
    /// Indexes `claims`.
    pub fn new(claims: Vec<Option<PortClaim>>) -> Self {
        let mut ledger = Ledger::default();
        for c in claims {
            ledger.push_slot(c);
        }
        ledger
    }

    fn push_slot(&mut self, claim: Option<PortClaim>) -> usize {
        let ci = self.claims.len();
        if let Some(c) = &claim {
            let gw = gw_of(c);
            self.by_port
                .insert((gw.clone(), c.spec.protocol.clone(), c.spec.port), ci);
            if is_bound(c) {
                *self
                    .bound
                    .entry((gw, c.spec.listener.clone(), c.spec.route.namespace.clone()))
                    .or_default() += 1;
            } else {
                let r = &c.spec.route;
                self.released
                    .entry((gw, r.kind.clone(), r.namespace.clone(), r.name.clone()))
                    .or_default()
                    .push(ci);
            }
        }
        self.claims.push(claim);
        ci
    }

    /// Adds a new bound claim.
    pub fn push(&mut self, claim: PortClaim) -> usize {
        self.push_slot(Some(claim))
    }

    /// The claim holding a port, bound or cooling down.
    pub fn holder(&self, gw: &GwKey, protocol: &str, port: u16) -> Option<&PortClaim> {
        let ci = *self
            .by_port
            .get(&(gw.clone(), protocol.to_string(), port))?;
        self.claims[ci].as_ref()
    }

    /// Bound claims of a namespace on a listener.
    pub fn bound_in(&self, gw: &GwKey, listener: &str, namespace: &str) -> u32 {
        self.bound
            .get(&(gw.clone(), listener.to_string(), namespace.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Binds again a route's own released claim on `listener` (and `requested` port, if
    /// any), returning it.
    pub fn rebind(
        &mut self,
        gw: &GwKey,
        listener: &str,
        route: &ClaimRoute,
        requested: Option<u16>,
    ) -> Option<usize> {
        let key = (
            gw.clone(),
            route.kind.clone(),
            route.namespace.clone(),
            route.name.clone(),
        );
        let list = self.released.get_mut(&key)?;
        let pos = list.iter().position(|&ci| {
            self.claims[ci].as_ref().is_some_and(|c| {
                c.spec.listener == listener && requested.is_none_or(|p| p == c.spec.port)
            })
        })?;
        let ci = list.remove(pos);
        let c = self.claims[ci].as_mut()?;
        c.status = Some(PortClaimStatus {
            phase: ClaimPhase::Bound,
            released_at: None,
        });
        *self
            .bound
            .entry((gw.clone(), listener.to_string(), route.namespace.clone()))
            .or_default() += 1;
        Some(ci)
    }

    /// The lowest port of `first..=last` held by no claim.
    pub fn lowest_free(
        &mut self,
        gw: &GwKey,
        protocol: &str,
        first: u16,
        last: u16,
    ) -> Option<u16> {
        let key = (gw.clone(), protocol.to_string(), first);
        let start = self.floor.get(&key).copied().unwrap_or(first);
        let found = (start..=last).find(|&p| {
            !self
                .by_port
                .contains_key(&(gw.clone(), protocol.to_string(), p))
        });
        self.floor.insert(key, found.unwrap_or(last));
        found
    }
}
