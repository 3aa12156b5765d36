//! What one plan leaves for the next: the routes it planned, with their attachments,
//! decisions and statuses, so that the next plan rebuilds only what changed.

use std::{
    sync::{atomic::Ordering::Relaxed, Arc},
    time::SystemTime,
};

use crate::model::*;

use super::{
    attach::Attach,
    backends::Resolved,
    incremental::{Last, Pending},
    route_status::Decision,
    scope::Scope,
    FastMap, Input, RouteEntry, RouteKey,
};

/// Everything but the routes: when it is unchanged, an unchanged route with unchanged
/// decisions has an unchanged status.
#[derive(Debug)]
struct World {
    gateway_classes: Vec<Arc<GatewayClass>>,
    gateways: Vec<Arc<Gateway>>,
    reference_grants: Vec<Arc<ReferenceGrant>>,
    services: Vec<Arc<Service>>,
    endpoint_slices: Vec<Arc<EndpointSlice>>,
    namespaces: Vec<Arc<Namespace>>,
    gateway_configs: Vec<Arc<GatewayConfig>>,
    default_addresses: super::DefaultAddresses,
}

impl World {
    fn of(s: &Snapshot, input: &Input) -> Self {
        World {
            gateway_classes: s.gateway_classes.clone(),
            gateways: s.gateways.clone(),
            reference_grants: s.reference_grants.clone(),
            services: s.services.clone(),
            endpoint_slices: s.endpoint_slices.clone(),
            namespaces: s.namespaces.clone(),
            gateway_configs: s.gateway_configs.clone(),
            default_addresses: input.default_addresses,
        }
    }

    /// Makes this the world of `s` and `input`, replacing in each list only what
    /// changed (a Service change touched 200,000 counts when the world was copied).
    fn follow(&mut self, s: &Snapshot, input: &Input) {
        let World {
            gateway_classes,
            gateways,
            reference_grants,
            services,
            endpoint_slices,
            namespaces,
            gateway_configs,
            default_addresses,
        } = self;
        follow_list(gateway_classes, &s.gateway_classes);
        follow_list(gateways, &s.gateways);
        follow_list(reference_grants, &s.reference_grants);
        follow_list(services, &s.services);
        follow_list(endpoint_slices, &s.endpoint_slices);
        follow_list(namespaces, &s.namespaces);
        follow_list(gateway_configs, &s.gateway_configs);
        *default_addresses = input.default_addresses;
    }

    fn is(&self, s: &Snapshot, input: &Input) -> bool {
        self.gateway_classes == s.gateway_classes
            && self.gateways == s.gateways
            && self.reference_grants == s.reference_grants
            && self.services == s.services
            && self.endpoint_slices == s.endpoint_slices
            && self.namespaces == s.namespaces
            && self.gateway_configs == s.gateway_configs
            && self.default_addresses == input.default_addresses
    }
}

/// A route's status as last planned, and what it was planned from.
#[derive(Debug)]
pub(super) struct Remembered {
    /// Shared with the snapshot it was planned from (the next snapshot holds the same
    /// allocation while the route is unchanged). Holding it also keeps its address,
    /// the memo's key, from being reused by another route.
    pub route: Arc<Route>,
    /// Its identity (for the owners of datapath services).
    pub id: Arc<RouteKey>,
    /// Its creation time, parsed.
    pub created: Option<SystemTime>,
    /// What each of its parentRefs to a Gateway of ours attaches to: the parentRef's
    /// index, the Gateway's index in the plan, the listeners (valid while the world is
    /// unchanged).
    pub attaches: Vec<(usize, usize, Attach)>,
    pub decisions: Vec<Decision>,
    pub entry: Arc<RouteEntry>,
    pub backends: Arc<Resolved>,
    /// The last plan that planned this route.
    pub pass: std::sync::atomic::AtomicU64,
}

/// The address the memo knows a key of routes given twice under: no route's (an
/// incremental plan looks for such routes by key).
const TWICE: usize = 0;

/// The memo's key of a route: the address of its shared allocation.
fn address(route: &Arc<Route>) -> usize {
    Arc::as_ptr(route) as usize
}

/// What one plan leaves for the next, so that a plan rebuilds only the statuses of
/// routes whose inputs changed (the rest are shared with the last plan, times and all).
/// A plan with a memo equals a plan without one, except that the conditions of a
/// status rebuilt keep their `lastTransitionTime` while their status is unchanged.
#[derive(Debug)]
pub struct Memo {
    /// Whether to remember (a plan made once need not copy what it planned from).
    pub(super) keep: bool,
    /// Plans made with this memo.
    pass: u64,
    world: Option<World>,
    /// By the address of the route's allocation.
    routes: FastMap<usize, Remembered>,
    /// The address of the route last remembered under each key: a changed route is a
    /// new allocation, and keeps its unchanged conditions' times.
    names: FastMap<RouteKey, usize>,
    /// The last plan and its input, for the next plan to be made incrementally.
    pub(super) last: Option<Last>,
    /// The last plan, if it was a full one not indexed yet into `last`.
    pub(super) pending: Option<Pending>,
    /// The snapshot of the last plan (when the memo keeps), kept by following each
    /// snapshot's changes.
    pub(super) snapshot: Snapshot,
    /// Whether plans may be made incrementally (else every plan is a full one).
    pub(super) incremental: bool,
    /// Plans made incrementally.
    pub(super) incremental_plans: u64,
}

impl Memo {
    /// Indexes the last full plan for the next one, if not done yet. The next plan
    /// does it first; a caller with a spare thread calls it while the plan's effects
    /// run (at start, 100,000 routes take a third of a second).
    pub fn settle(&mut self) {
        if let Some(pending) = self.pending.take() {
            self.last = Some(pending.settle(&self.snapshot));
        }
    }

    /// A memo for one plan: it remembers nothing (nothing would use it).
    pub(super) fn for_one_plan() -> Self {
        Memo {
            keep: false,
            ..Memo::default()
        }
    }

    /// A memo that makes every plan in full (what incremental plans are tested against).
    #[cfg(test)]
    pub(super) fn full_only() -> Self {
        Memo {
            incremental: false,
            ..Memo::default()
        }
    }

    /// Starts a plan: whether every object but the routes is as in the last plan (then
    /// remembered attachments still hold), and this plan's number. `snap` is the whole
    /// snapshot, also when `input` holds a part of it (an incremental plan's: following
    /// the part made the world one Service at the first change after a start, dropping
    /// 200,000 shared objects' counts there and comparing unequal ever after).
    pub(super) fn begin(&mut self, snap: &Snapshot, input: &Input) -> (bool, u64) {
        let world_same = self.world.as_ref().is_some_and(|w| w.is(snap, input));
        if !world_same && self.keep {
            match &mut self.world {
                Some(world) => world.follow(snap, input),
                None => self.world = Some(World::of(snap, input)),
            }
        }
        self.pass += 1;
        (world_same, self.pass)
    }

    /// What the memo remembers of each route (by its allocation). A source that parses
    /// its objects again for each plan (the Kubernetes reflectors) hands over new
    /// allocations: an equal route remembered under its name serves too.
    pub(super) fn recall(&self, routes: &[Arc<Route>]) -> Vec<Option<&Remembered>> {
        routes
            .iter()
            .map(|r| {
                self.routes.get(&address(r)).or_else(|| {
                    let old = self.routes.get(self.names.get(&RouteKey::of(r))?)?;
                    (old.route == *r).then_some(old)
                })
            })
            .collect()
    }

    /// The route last remembered under the name of `route` (an earlier version of it).
    pub(super) fn earlier(&self, route: &Route) -> Option<&Remembered> {
        self.routes.get(self.names.get(&RouteKey::of(route))?)
    }

    /// The address of the route last remembered under `key`.
    pub(super) fn address_of(&self, key: &RouteKey) -> Option<usize> {
        self.names.get(key).copied()
    }

    /// Keeps the routes this plan (`pass`) reused, `kept` of them, and adds `fresh`.
    /// A plan of the routes in `scope` only forgets those of them it did not reuse.
    /// A key of routes given `twice` is known under address [`TWICE`], which is no
    /// route's.
    pub(super) fn remember(
        &mut self,
        fresh: Vec<Remembered>,
        kept: usize,
        pass: u64,
        scope: Option<&mut Scope>,
        twice: &[RouteKey],
    ) {
        if let Some(scope) = scope {
            for k in scope.keys() {
                let Some(&at) = self.names.get(k) else {
                    continue;
                };
                if self
                    .routes
                    .get(&at)
                    .is_none_or(|r| r.pass.load(Relaxed) != pass)
                {
                    self.routes.remove(&at);
                    self.names.remove(k);
                }
            }
        } else if kept != self.routes.len() {
            let names = &mut self.names;
            self.routes.retain(|&at, r| {
                if r.pass.load(Relaxed) == pass {
                    return true;
                }
                let key = RouteKey::of(&r.route);
                if names.get(&key) == Some(&at) {
                    names.remove(&key);
                }
                false
            });
        }
        // Room for what comes at once: a first plan of 100,000 routes grew both maps by
        // 16 rehashes, each holding the old table beside the new one.
        self.names.reserve(fresh.len());
        self.routes.reserve(fresh.len());
        for r in fresh {
            let at = address(&r.route);
            self.names.insert(RouteKey::of(&r.route), at);
            self.routes.insert(at, r);
        }
        for key in twice {
            self.names.insert(key.clone(), TWICE);
        }
    }
}

impl Default for Memo {
    fn default() -> Self {
        Memo {
            keep: true,
            pass: 0,
            world: None,
            routes: FastMap::default(),
            names: FastMap::default(),
            last: None,
            pending: None,
            snapshot: Snapshot::default(),
            incremental: true,
            incremental_plans: 0,
        }
    }
}
