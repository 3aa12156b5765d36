//! The claims of one plan, indexed so that allocation stays fast with many routes.
//!
//! Claims are indexed by the plan's own numbering: the gateway's index among the
//! plan's Gateways and the listener's index in that Gateway, so that indexing a claim
//! hashes one name (its route's namespace) instead of copying or hashing all of them.

use std::sync::Arc;

use super::{gateways::GatewayView, FastMap as HashMap};

use crate::model::{ClaimPhase, ClaimRoute, PortClaim, PortClaimStatus, Protocol};

/// Where a claim lies: its Gateway's index, its listener's (if the Gateway has it),
/// its protocol.
type Location = (usize, Option<usize>, Protocol);

/// Claims (a removed claim is `None`, so indexes stay valid) and their indexes.
pub struct Ledger<'g> {
    /// All claims of the plan.
    pub claims: Vec<Option<Arc<PortClaim>>>,
    /// The plan's Gateways, and their index by (namespace, name).
    gateways: &'g [GatewayView<'g>],
    gateway_at: &'g HashMap<(&'g str, &'g str), usize>,
    /// Route names seen (namespaces, kinds, names) → small ids.
    names: HashMap<String, u32>,
    /// (gateway, protocol, port) → claim.
    by_port: HashMap<(usize, Protocol, u16), usize>,
    /// (gateway, listener, route namespace) → bound claims, on listeners with a quota.
    bound: HashMap<(usize, usize, u32), u32>,
    /// (gateway, route kind, route namespace, route name) → released claims.
    released: HashMap<(usize, u32, u32, u32), Vec<usize>>,
    /// (gateway, protocol, first port of a range) → no port of the range below this is
    /// free (ranges do not overlap, ports only fill up within a plan, and the ports
    /// yielded to older Gateways stay so).
    floor: HashMap<(usize, Protocol, u16), u16>,
    /// The last claim located, and where: claims come sorted, mostly many in a row
    /// on one listener.
    located: Option<(Arc<PortClaim>, Option<Location>)>,
}

impl<'g> Ledger<'g> {
    /// Indexes `claims` against the plan's `gateways`. A claim of a Gateway that is not
    /// among them is kept but not indexed: no listener of the plan can collide with it.
    pub fn new(
        claims: Vec<Option<Arc<PortClaim>>>,
        gateways: &'g [GatewayView<'g>],
        gateway_at: &'g HashMap<(&'g str, &'g str), usize>,
    ) -> Self {
        let mut ledger = Ledger {
            // Room for the claims of this plan too.
            claims: Vec::with_capacity(claims.len() + claims.len() / 8 + 16),
            gateways,
            gateway_at,
            names: HashMap::default(),
            by_port: HashMap::default(),
            bound: HashMap::default(),
            released: HashMap::default(),
            floor: HashMap::default(),
            located: None,
        };
        ledger.by_port.reserve(claims.len());
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

    /// The gateway and listener indexes of a claim, and its protocol.
    fn locate(&mut self, c: &Arc<PortClaim>) -> Option<Location> {
        if let Some((last, at)) = &self.located {
            let same = last.metadata.ns() == c.metadata.ns()
                && last.spec.gateway == c.spec.gateway
                && last.spec.listener == c.spec.listener
                && last.spec.protocol == c.spec.protocol;
            if same {
                return *at;
            }
        }
        let at = self.locate_anew(c);
        self.located = Some((Arc::clone(c), at));
        at
    }

    /// `locate` without the last claim to go by.
    fn locate_anew(&self, c: &PortClaim) -> Option<Location> {
        let gi = *self
            .gateway_at
            .get(&(c.metadata.ns(), c.spec.gateway.as_str()))?;
        let protocol = Protocol::parse(&c.spec.protocol)?;
        let li = self.gateways[gi]
            .listeners
            .iter()
            .position(|l| l.spec.name == c.spec.listener);
        Some((gi, li, protocol))
    }

    fn push_slot(&mut self, claim: Option<Arc<PortClaim>>) -> usize {
        let ci = self.claims.len();
        if let Some((c, (gi, li, protocol))) =
            claim.as_ref().and_then(|c| Some((c, self.locate(c)?)))
        {
            self.by_port.insert((gi, protocol, c.spec.port), ci);
            let r = &c.spec.route;
            if c.is_bound() {
                let quota = li.filter(|&li| self.gateways[gi].listeners[li].quota.is_some());
                if let Some(li) = quota {
                    let namespace = self.intern(&r.namespace);
                    *self.bound.entry((gi, li, namespace)).or_default() += 1;
                }
            } else {
                let namespace = self.intern(&r.namespace);
                let (kind, name) = (self.intern(&r.kind), self.intern(&r.name));
                self.released
                    .entry((gi, kind, namespace, name))
                    .or_default()
                    .push(ci);
            }
        }
        self.claims.push(claim);
        ci
    }

    /// Adds a new bound claim.
    pub fn push(&mut self, claim: PortClaim) -> usize {
        self.push_slot(Some(Arc::new(claim)))
    }

    /// The claim holding a port of Gateway `gi`, bound or cooling down.
    pub fn holder(&self, gi: usize, protocol: Protocol, port: u16) -> Option<&PortClaim> {
        self.claims[*self.by_port.get(&(gi, protocol, port))?].as_deref()
    }

    /// Bound claims of a namespace on listener `li` of Gateway `gi`.
    pub fn bound_in(&self, gi: usize, li: usize, namespace: &str) -> u32 {
        self.id(namespace)
            .and_then(|ns| self.bound.get(&(gi, li, ns)).copied())
            .unwrap_or(0)
    }

    /// Binds again a route's own released claim on listener `li` of Gateway `gi` (and
    /// `requested` port, if any), returning it.
    pub fn rebind(
        &mut self,
        gi: usize,
        li: usize,
        route: &ClaimRoute,
        requested: Option<u16>,
    ) -> Option<usize> {
        let namespace = self.id(&route.namespace)?;
        let key = (gi, self.id(&route.kind)?, namespace, self.id(&route.name)?);
        let listener = self.gateways[gi].listeners[li].spec.name.as_str();
        let list = self.released.get_mut(&key)?;
        let yields = &self.gateways[gi].listeners[li];
        let pos = list.iter().position(|&ci| {
            self.claims[ci].as_ref().is_some_and(|c| {
                c.spec.listener == listener
                    && requested.is_none_or(|p| p == c.spec.port)
                    && yields.yielded_at(c.spec.port).is_none()
                    // Not a port outside the range (a claim loaded from a journal).
                    && yields.range.is_some_and(|(x, y)| (x..=y).contains(&c.spec.port))
            })
        })?;
        let ci = list.remove(pos);
        let c = Arc::make_mut(self.claims[ci].as_mut()?);
        c.status = Some(PortClaimStatus {
            phase: ClaimPhase::Bound,
            released_at: None,
        });
        // The route may be a new object of the same name (deleted and created again):
        // the claim names the object that holds it now.
        c.spec.route = route.clone();
        *self.bound.entry((gi, li, namespace)).or_default() += 1;
        Some(ci)
    }

    /// The lowest port of `first..=last` of listener `li` of Gateway `gi` held by no
    /// claim and not yielded to an older Gateway.
    pub fn lowest_free(
        &mut self,
        gi: usize,
        li: usize,
        protocol: Protocol,
        first: u16,
        last: u16,
    ) -> Option<u16> {
        let key = (gi, protocol, first);
        let start = self.floor.get(&key).copied().unwrap_or(first);
        let l = &self.gateways[gi].listeners[li];
        let found = (start..=last)
            .find(|&p| !self.by_port.contains_key(&(gi, protocol, p)) && l.yielded_at(p).is_none());
        self.floor.insert(key, found.unwrap_or(last));
        found
    }
}
