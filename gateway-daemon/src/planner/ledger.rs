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

/// Claims (a removed claim is `None`, so indexes stay valid) and their indexes. The
/// indexes are keyed by interned names, so that indexing and looking up copy no strings.
#[derive(Default)]
pub struct Ledger {
    /// All claims of the plan.
    pub claims: Vec<Option<PortClaim>>,
    /// Names seen (gateway namespaces and names, protocols, listeners, route kinds,
    /// namespaces and names) → small ids.
    names: HashMap<String, u32>,
    /// (gateway, protocol, port) → claim.
    by_port: HashMap<(Gw, u32, u16), usize>,
    /// (gateway, listener, route namespace) → bound claims.
    bound: HashMap<(Gw, u32, u32), u32>,
    /// (gateway, route kind, route namespace, route name) → released claims.
    released: HashMap<(Gw, u32, u32, u32), Vec<usize>>,
    /// (gateway, protocol, first port of a range) → no port of the range below this is
    /// free (ranges do not overlap, and ports only fill up within a plan).
    floor: HashMap<(Gw, u32, u16), u16>,
}

/// A gateway as interned (namespace, name).
type Gw = (u32, u32);

impl Ledger {
    /// Indexes `claims`.
    pub fn new(claims: Vec<Option<PortClaim>>) -> Self {
        let mut ledger = Ledger::default();
        // Room for the claims of this plan too: a claim is large, regrowing copies all.
        ledger.claims.reserve(claims.len() + claims.len() / 8 + 16);
        for c in claims {
            ledger.push_slot(c);
        }
        ledger
    }

    /// The id of `name`, interning it if new.
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.names.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.insert(name.to_string(), id);
        id
    }

    /// The id of `name` if it was ever interned (no claim names it otherwise).
    fn id(&self, name: &str) -> Option<u32> {
        self.names.get(name).copied()
    }

    fn gw_id(&self, gw: &GwKey) -> Option<Gw> {
        Some((self.id(&gw.0)?, self.id(&gw.1)?))
    }

    fn push_slot(&mut self, claim: Option<PortClaim>) -> usize {
        let ci = self.claims.len();
        if let Some(c) = &claim {
            let gw = (self.intern(c.metadata.ns()), self.intern(&c.spec.gateway));
            let protocol = self.intern(&c.spec.protocol);
            self.by_port.insert((gw, protocol, c.spec.port), ci);
            let r = &c.spec.route;
            let namespace = self.intern(&r.namespace);
            if is_bound(c) {
                let listener = self.intern(&c.spec.listener);
                *self.bound.entry((gw, listener, namespace)).or_default() += 1;
            } else {
                let (kind, name) = (self.intern(&r.kind), self.intern(&r.name));
                self.released
                    .entry((gw, kind, namespace, name))
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
        let key = (self.gw_id(gw)?, self.id(protocol)?, port);
        self.claims[*self.by_port.get(&key)?].as_ref()
    }

    /// Bound claims of a namespace on a listener.
    pub fn bound_in(&self, gw: &GwKey, listener: &str, namespace: &str) -> u32 {
        (|| {
            let key = (self.gw_id(gw)?, self.id(listener)?, self.id(namespace)?);
            self.bound.get(&key).copied()
        })()
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
        let gw_id = self.gw_id(gw)?;
        let namespace = self.id(&route.namespace)?;
        let key = (
            gw_id,
            self.id(&route.kind)?,
            namespace,
            self.id(&route.name)?,
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
        let listener = self.intern(listener);
        *self.bound.entry((gw_id, listener, namespace)).or_default() += 1;
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
        let gw = (self.intern(&gw.0), self.intern(&gw.1));
        let protocol = self.intern(protocol);
        let key = (gw, protocol, first);
        let start = self.floor.get(&key).copied().unwrap_or(first);
        let found = (start..=last).find(|&p| !self.by_port.contains_key(&(gw, protocol, p)));
        self.floor.insert(key, found.unwrap_or(last));
        found
    }
}
