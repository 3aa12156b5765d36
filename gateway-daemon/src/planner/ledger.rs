//! The claims of one plan, indexed so that allocation stays fast with many routes.
//!
//! Claims are indexed by the plan's own numbering: the gateway's index among the
//! plan's Gateways and the listener's index in that Gateway, so that indexing a claim
//! hashes one name (its route's namespace) instead of copying or hashing all of them.
//!
//! A plan of a few routes (see `incremental`) indexes only their claims: the other
//! routes' claims are in the memo's `ClaimIndex`, which the `Ledger` consults too and
//! which changes claim by claim from one plan to the next.

use std::{
    collections::BTreeMap,
    ops::Bound::{Excluded, Included},
    sync::Arc,
    time::SystemTime,
};

use super::{
    bind::cooldown_end,
    gateways::{GatewayView, Gateways},
    FastMap as HashMap, DEFAULT_RELEASE_COOLDOWN,
};

use crate::model::{ClaimPhase, ClaimRoute, PortClaim, PortClaimStatus, Protocol, RouteKey};

/// Where a claim lies: its Gateway's index, its listener's (if the Gateway has it),
/// its protocol.
type Location = (usize, Option<usize>, Protocol);

/// The gateway and listener indexes of claim `c` among `gateways` (found by
/// `gateway_at`), and its protocol.
fn locate(
    gateways: &[GatewayView],
    gateway_at: &HashMap<(&str, &str), usize>,
    c: &PortClaim,
) -> Option<Location> {
    let (gi, li) = place(gateways, gateway_at, c)?;
    Some((gi, li, Protocol::parse(&c.spec.protocol)?))
}

/// The gateway and listener indexes of claim `c`, whatever its protocol.
fn place(
    gateways: &[GatewayView],
    gateway_at: &HashMap<(&str, &str), usize>,
    c: &PortClaim,
) -> Option<(usize, Option<usize>)> {
    let gi = *gateway_at.get(&(c.metadata.ns(), c.spec.gateway.as_str()))?;
    let li = gateways[gi]
        .listeners
        .iter()
        .position(|l| l.spec.name == c.spec.listener);
    Some((gi, li))
}

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
    /// (gateway, listener, route namespace) → claims bound or cooling down, on listeners
    /// with a quota.
    held: HashMap<(usize, usize, u32), u32>,
    /// (gateway, route kind, route namespace, route name) → released claims.
    released: HashMap<(usize, u32, u32, u32), Vec<usize>>,
    /// (gateway, protocol, first port of a range) → no port of the range below this is
    /// free (ranges do not overlap, ports only fill up within a plan, and the ports
    /// yielded to older Gateways stay so).
    floor: HashMap<(usize, Protocol, u16), u16>,
    /// The last claim located, and where: claims come sorted, mostly many in a row
    /// on one listener.
    located: Option<(Arc<PortClaim>, Option<Location>)>,
    /// The claims of the routes not planned (when only some are), held as they are.
    others: Option<&'g ClaimIndex>,
}

impl<'g> Ledger<'g> {
    /// Indexes `claims` against the plan's `gateways`. A claim of a Gateway that is not
    /// among them is kept but not indexed: no listener of the plan can collide with it.
    /// `others`: the claims of the routes not planned, when only some are.
    pub fn new(
        claims: Vec<Option<Arc<PortClaim>>>,
        gateways: &'g [GatewayView<'g>],
        gateway_at: &'g HashMap<(&'g str, &'g str), usize>,
        others: Option<&'g ClaimIndex>,
    ) -> Self {
        let mut ledger = Ledger {
            // Room for the claims of this plan too.
            claims: Vec::with_capacity(claims.len() + claims.len() / 8 + 16),
            gateways,
            gateway_at,
            names: HashMap::default(),
            by_port: HashMap::default(),
            held: HashMap::default(),
            released: HashMap::default(),
            floor: HashMap::default(),
            located: None,
            others,
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
        locate(self.gateways, self.gateway_at, c)
    }

    fn push_slot(&mut self, claim: Option<Arc<PortClaim>>) -> usize {
        let ci = self.claims.len();
        if let Some((c, (gi, li, protocol))) =
            claim.as_ref().and_then(|c| Some((c, self.locate(c)?)))
        {
            self.by_port.insert((gi, protocol, c.spec.port), ci);
            let r = &c.spec.route;
            // A port cooling down counts against the quota of the namespace that
            // released it: a team renaming its one route ten times once left ten
            // ports cooling and the range exhausted for every other team.
            let quota = li.filter(|&li| self.gateways[gi].listeners[li].quota.is_some());
            if let Some(li) = quota {
                let namespace = self.intern(&r.namespace);
                *self.held.entry((gi, li, namespace)).or_default() += 1;
            }
            if !c.is_bound() {
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
        match self.by_port.get(&(gi, protocol, port)) {
            Some(&ci) => self.claims[ci].as_deref(),
            None => self
                .others?
                .by_port
                .get(&(gi, protocol, port))
                .map(|c| &**c),
        }
    }

    /// Claims of a namespace on listener `li` of Gateway `gi`, bound or cooling down
    /// (what its quota counts).
    pub fn held_in(&self, gi: usize, li: usize, namespace: &str) -> u32 {
        let own = self
            .id(namespace)
            .and_then(|ns| self.held.get(&(gi, li, ns)).copied())
            .unwrap_or(0);
        own + self.others.map_or(0, |o| o.held_in(gi, li, namespace))
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
        // Counted against the quota already, as a claim cooling down.
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
        // The next port from `p` no claim of the routes not planned holds.
        let next = |p: u16| match self.others {
            Some(o) => o.free_from(gi, protocol, p, last),
            None => (p <= last).then_some(p),
        };
        let mut from = Some(start);
        let found = loop {
            let Some(p) = from.and_then(next) else {
                break None;
            };
            if !self.by_port.contains_key(&(gi, protocol, p)) && l.yielded_at(p).is_none() {
                break Some(p);
            }
            from = p.checked_add(1);
        };
        self.floor.insert(key, found.unwrap_or(last));
        found
    }
}

/// The claims of the last plan as a `Ledger` indexes them, kept by the memo and changed
/// claim by claim: a plan of a few routes takes their claims out, and indexes only
/// those, looking up every other claim here (valid while the Gateways are unchanged:
/// it numbers them as the plan does).
#[derive(Debug, Default)]
pub(super) struct ClaimIndex {
    /// By route (`Kind/namespace/name`), sorted by namespace, then name.
    by_route: HashMap<RouteKey, Vec<Arc<PortClaim>>>,
    /// (gateway, protocol, port) → claim, bound or cooling down (ordered: the free
    /// ports are the gaps).
    by_port: BTreeMap<(usize, Protocol, u16), Arc<PortClaim>>,
    /// (gateway, listener) → route namespace → claims bound or cooling down, on
    /// listeners with a quota.
    held: HashMap<(usize, usize), HashMap<String, u32>>,
    /// (gateway, listener) → (bound, released) claims.
    counts: HashMap<(usize, usize), (u32, u32)>,
    /// When its cool-down ends → released claims.
    cooling: BTreeMap<SystemTime, Vec<Arc<PortClaim>>>,
}

impl ClaimIndex {
    /// Indexes `claims` against `gateways`.
    pub fn new(claims: &crate::model::ClaimList, gateways: &Gateways) -> Self {
        let mut index = ClaimIndex::default();
        index.by_route.reserve(claims.len());
        for c in claims {
            index.add(c, gateways);
        }
        index
    }

    /// Whether some claim is released and cooling down.
    pub fn cooling(&self) -> bool {
        !self.cooling.is_empty()
    }

    /// Adds claim `c` (claims are added in order, or after `take` of their route).
    pub fn add(&mut self, c: &Arc<PortClaim>, gateways: &Gateways) {
        self.update(c, gateways, true);
    }

    /// Removes claim `c` (this very allocation).
    pub fn remove(&mut self, c: &Arc<PortClaim>, gateways: &Gateways) {
        self.update(c, gateways, false);
    }

    /// Adds (`add`) or removes claim `c` from every index.
    fn update(&mut self, c: &Arc<PortClaim>, gateways: &Gateways, add: bool) {
        let r = &c.spec.route;
        // A claim of a kind Berth does not serve is no route's (nor in any scope).
        match (r.key(), add) {
            (None, _) => {}
            (Some(key), true) => {
                let list = self.by_route.entry(key).or_default();
                let at = list.partition_point(|x| claim_key(x) <= claim_key(c));
                list.insert(at, Arc::clone(c));
            }
            (Some(key), false) => {
                if let Some(list) = self.by_route.get_mut(&key) {
                    list.retain(|x| !Arc::ptr_eq(x, c));
                    if list.is_empty() {
                        self.by_route.remove(&key);
                    }
                }
            }
        }
        if c.is_released() {
            let gi = gateways.index(c.metadata.ns(), &c.spec.gateway);
            let cooldown = gi.map_or(DEFAULT_RELEASE_COOLDOWN, |gi| gateways.views[gi].cooldown);
            if let Some(end) = cooldown_end(c, cooldown) {
                let list = self.cooling.entry(end).or_default();
                match add {
                    true => list.push(Arc::clone(c)),
                    false => {
                        list.retain(|x| !Arc::ptr_eq(x, c));
                        if list.is_empty() {
                            self.cooling.remove(&end);
                        }
                    }
                }
            }
        }
        let Some((gi, li)) = place(&gateways.views, &gateways.at, c) else {
            return;
        };
        if let Some(protocol) = Protocol::parse(&c.spec.protocol) {
            let at = (gi, protocol, c.spec.port);
            if add {
                self.by_port.insert(at, Arc::clone(c));
            } else if self.by_port.get(&at).is_some_and(|x| Arc::ptr_eq(x, c)) {
                self.by_port.remove(&at);
            }
        }
        let Some(li) = li else {
            return;
        };
        let step = |n: &mut u32| match add {
            true => *n += 1,
            false => *n = n.saturating_sub(1),
        };
        // Counted on every listener of its name, as the statuses count (the quota's
        // count is the ledger's: on the first).
        let listeners = gateways.views[gi].listeners.iter().enumerate();
        for (at, _) in listeners.filter(|(_, l)| l.spec.name == c.spec.listener) {
            let (bound, released) = self.counts.entry((gi, at)).or_default();
            step(if c.is_bound() { bound } else { released });
        }
        if gateways.views[gi].listeners[li].quota.is_some() {
            let namespaces = self.held.entry((gi, li)).or_default();
            match namespaces.get_mut(r.namespace.as_str()) {
                Some(n) => step(n),
                None => {
                    namespaces.insert(r.namespace.to_string(), u32::from(add));
                }
            }
        }
    }

    /// Takes out the claims of the routes `keys`, sorted by namespace, then name.
    pub fn take<'k>(
        &mut self,
        keys: impl Iterator<Item = &'k RouteKey>,
        gateways: &Gateways,
    ) -> Vec<Arc<PortClaim>> {
        let mut out: Vec<Arc<PortClaim>> = keys
            .filter_map(|k| self.by_route.get(k))
            .flatten()
            .cloned()
            .collect();
        for c in &out {
            self.remove(c, gateways);
        }
        out.sort_by(|a, b| claim_key(a).cmp(&claim_key(b)));
        out
    }

    /// The lowest port of `from..=last` of Gateway `gi` that no claim holds.
    fn free_from(&self, gi: usize, protocol: Protocol, from: u16, last: u16) -> Option<u16> {
        if from > last {
            return None;
        }
        let mut free = from;
        for &(_, _, port) in self
            .by_port
            .range((gi, protocol, from)..=(gi, protocol, last))
            .map(|(k, _)| k)
        {
            if port != free {
                break;
            }
            free = free.checked_add(1)?;
        }
        (free <= last).then_some(free)
    }

    /// Claims of a namespace on listener `li` (with a quota) of Gateway `gi`, bound or
    /// cooling down.
    fn held_in(&self, gi: usize, li: usize, namespace: &str) -> u32 {
        self.held
            .get(&(gi, li))
            .and_then(|n| n.get(namespace).copied())
            .unwrap_or(0)
    }

    /// Bound and released claims on listener `li` of Gateway `gi`.
    pub fn counts(&self, gi: usize, li: usize) -> (u32, u32) {
        self.counts.get(&(gi, li)).copied().unwrap_or_default()
    }

    /// The released claims whose cool-down ends after `a` and by `b`, or after `b` and
    /// by `a`: those cooled down at one time and not at the other.
    pub fn cooled_between(
        &self,
        a: SystemTime,
        b: SystemTime,
    ) -> impl Iterator<Item = &Arc<PortClaim>> {
        let (from, to) = if a <= b { (a, b) } else { (b, a) };
        self.cooling
            .range((Excluded(from), Included(to)))
            .flat_map(|(_, list)| list)
    }
}

/// The key claims are sorted by: namespace, then name.
pub(super) fn claim_key(c: &PortClaim) -> (&str, &str) {
    (c.metadata.ns(), c.metadata.name.as_str())
}
