//! Incremental planning: when only routes, Services, EndpointSlices, claims and the
//! time changed since the last plan made with a memo, the stages run again for the
//! routes a change can affect, and their results are spliced into the last plan.
//!
//! The routes re-planned (the scope) are, by identity: the routes that changed, the
//! routes named by claims that changed (in the input since the last plan, or in the
//! last plan's own output, or whose cool-down ended meanwhile), the routes whose
//! backends name a Service or EndpointSlice that changed; then, for every listener any
//! of those attaches to (before or after the change) or a changed claim lies on, every
//! route waiting for a port of it (a range listener) or attached to it (a fixed one),
//! until no new listener comes in. Every other route keeps its claims as they are (a
//! bound claim never moves while its route attaches, and a route that waits on an
//! unchanged listener waits on), so the stages see the routes in scope and every
//! claim, and allocation is the full plan's: oldest first, static before dynamic,
//! claims, quotas and cool-downs over the whole ledger. Anything else (a Gateway,
//! GatewayClass, GatewayConfig, Namespace, ReferenceGrant or setting changed, a change
//! too large, two routes contending for a datapath service, routes waiting for room in
//! the datapath before or after the change) falls back to the full plan.

use std::{collections::BTreeMap, ops::RangeInclusive, sync::Arc, time::SystemTime};

use crate::model::*;

use super::{
    backend_index::BackendIndex,
    changes::{claim_pairs, common_ends},
    gateways::Gateways,
    ledger::{claim_key, ClaimIndex},
    scope::{self, OnListeners, Scope},
    splice::{served, splice, Served},
    Input, Memo, Plan,
};

/// A listener in the plan's numbering: (Gateway index, listener index).
pub(super) type ListenerAt = (usize, usize);

/// The last plan made with a memo, and what it was made from.
#[derive(Debug)]
pub(super) struct Last {
    /// The claims the plan changed from its input, but those it made bound for a route
    /// without one: a claim it released frees its port only for the next plan.
    changed: Vec<Arc<PortClaim>>,
    /// Where the plan made bound claims for routes without one: per listener named
    /// by a claim, the lowest and highest port made (a plan at start makes 100,000).
    made: Vec<Made>,
    now: SystemTime,
    settings: Settings,
    plan: Plan,
    /// The plan's claims, indexed.
    held: ClaimIndex,
    on: OnListeners,
    served: Served,
    /// The routes naming each Service, and the Services and slices of each.
    backends: BackendIndex,
    /// Whether two routes contended for a datapath service (only a full plan settles
    /// which one wins once either changes).
    contested: bool,
}

impl Last {
    /// What a plan of `input` leaves for the next one.
    pub fn of(
        input: &Input,
        plan: &Plan,
        on: OnListeners,
        served: Served,
        held: ClaimIndex,
        backends: BackendIndex,
        contested: bool,
    ) -> Self {
        let mut changed = Vec::new();
        let mut made: BTreeMap<(&str, &str, &str, &str), (u16, u16)> = BTreeMap::new();
        for pair in claim_pairs(input.claims, &plan.claims) {
            match pair {
                (None, Some(c)) if c.is_bound() => {
                    let (ns, spec) = (c.metadata.ns(), &c.spec);
                    let key = (
                        ns,
                        spec.gateway.as_str(),
                        spec.listener.as_str(),
                        spec.protocol.as_str(),
                    );
                    let ports = made.entry(key).or_insert((spec.port, spec.port));
                    *ports = (ports.0.min(spec.port), ports.1.max(spec.port));
                }
                (a, b) => changed.extend(a.into_iter().chain(b).cloned()),
            }
        }
        let made = made
            .into_iter()
            .map(|((namespace, gateway, listener, protocol), ports)| Made {
                namespace: namespace.to_string(),
                gateway: gateway.to_string(),
                listener: listener.to_string(),
                protocol: Protocol::parse(protocol),
                ports,
            })
            .collect();
        Last {
            changed,
            made,
            now: input.now,
            settings: Settings::of(input),
            plan: plan.clone(),
            held,
            on,
            served,
            backends,
            contested,
        }
    }

    /// Whether everything but routes, Services, EndpointSlices, claims and the time
    /// is as in `input` (`a` is the snapshot this plan was made from).
    fn same_world(&self, a: &Snapshot, input: &Input) -> bool {
        // Destructured: a new field of `Snapshot` is a compile error here (and of
        // `Input` in `Settings::of`), where a list of fields would forget it silently.
        let Snapshot {
            gateway_classes,
            gateways,
            routes: _,
            reference_grants,
            services: _,
            endpoint_slices: _,
            namespaces,
            gateway_configs,
            // Not the planner's: their results are in the slices (`health`).
            backend_health_policies: _,
            // Read after every plan, full or not (`traffic`).
            route_traffic_policies: _,
        } = input.snapshot;
        a.gateway_classes == *gateway_classes
            && a.gateways == *gateways
            && a.gateway_configs == *gateway_configs
            && a.namespaces == *namespaces
            && a.reference_grants == *reference_grants
            && self.settings == Settings::of(input)
    }
}

/// A full plan as the next plan will need it, before it is indexed (`Memo::settle`):
/// the plan's input but its snapshot (the memo's copy is that snapshot), the plan, and
/// what its stages left for the next plan.
#[derive(Debug)]
pub(super) struct Pending {
    claims: ClaimList,
    now: SystemTime,
    settings: Settings,
    plan: Plan,
    on: OnListeners,
    contested: bool,
}

impl Pending {
    /// What a full plan of `input` leaves to be indexed.
    pub(super) fn of(input: &Input, plan: &Plan, on: OnListeners, contested: bool) -> Self {
        Pending {
            claims: ClaimList::clone(input.claims),
            now: input.now,
            settings: Settings::of(input),
            plan: plan.clone(),
            on,
            contested,
        }
    }

    /// Indexes the plan of `snapshot` (the one it was made from) for the next plan.
    pub(super) fn settle(self, snapshot: &Snapshot) -> Last {
        let input = self.settings.input(snapshot, &self.claims, self.now);
        let served = served(&self.plan.owners);
        let held = ClaimIndex::new(&self.plan.claims, &super::gateways::ours(&input));
        Last::of(
            &input,
            &self.plan,
            self.on,
            served,
            held,
            BackendIndex::of(snapshot),
            self.contested,
        )
    }
}

/// What a plan's input holds besides the objects, the claims and the time: the same in
/// the next input, or the next plan is a full one.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Settings {
    default_addresses: super::DefaultAddresses,
    ephemeral_ports: Option<RangeInclusive<u16>>,
    snat_ports: RangeInclusive<u16>,
    capacity: crate::datapath::Capacity,
    allocate: bool,
}

impl Settings {
    /// `input`'s settings.
    fn of(input: &Input) -> Self {
        // Destructured: a new field of `Input` is a compile error here.
        let Input {
            snapshot: _,
            claims: _,
            now: _,
            default_addresses,
            ephemeral_ports,
            allocate,
            snat_ports,
            capacity,
        } = input;
        Settings {
            default_addresses: *default_addresses,
            ephemeral_ports: ephemeral_ports.clone(),
            snat_ports: snat_ports.clone(),
            capacity: *capacity,
            allocate: *allocate,
        }
    }

    /// An input of `snapshot`, `claims` and `now` with these settings.
    fn input<'a>(
        &self,
        snapshot: &'a Snapshot,
        claims: &'a ClaimList,
        now: SystemTime,
    ) -> Input<'a> {
        Input {
            snapshot,
            claims,
            now,
            default_addresses: self.default_addresses,
            ephemeral_ports: self.ephemeral_ports.clone(),
            allocate: self.allocate,
            snat_ports: self.snat_ports.clone(),
            capacity: self.capacity,
        }
    }
}

/// Claims a plan made on one listener: the listener (by Gateway namespace and name,
/// listener name, protocol) and the lowest and highest port made.
#[derive(Debug)]
struct Made {
    namespace: String,
    gateway: String,
    listener: String,
    protocol: Option<Protocol>,
    ports: (u16, u16),
}

/// The largest scope planned incrementally for `routes` routes: beyond it, a full plan
/// costs little more.
fn scope_limit(routes: usize) -> usize {
    routes / 8 + 16
}

/// The plan of `input` made from the last plan in `memo` (made from `before`), or
/// `None` when the change since is not small and local (then `memo` holds no last plan).
pub(super) fn plan(input: &Input, before: &Snapshot, memo: &mut Memo) -> Option<Plan> {
    let mut last = reusable_last(input, before, memo)?;
    let snap = input.snapshot;
    let gateways = super::gateways::ours(input);
    let mut held = std::mem::take(&mut last.held);
    follow_claims(&mut held, &last.plan.claims, input.claims, &gateways)?;
    let changed = ChangedRoutes::between(&before.routes, &snap.routes)?;
    let mut scope = Scope::default();
    changed.add_to(&mut scope, &gateways, before);
    let mut backends = std::mem::take(&mut last.backends);
    backends.follow_routes(changed.old, changed.new);
    add_changed_claims(&mut scope, &last, &held, input, &gateways);
    add_changed_backends(&mut scope, &mut backends, before, snap)?;
    let routes = close_scope(&mut scope, &last.on, changed.shared, &gateways, snap, memo)?;
    let planned = plan_part(
        input, routes, &backends, &mut scope, &mut held, &gateways, memo,
    )?;
    let Last {
        plan: last_plan,
        mut on,
        mut served,
        ..
    } = last;
    let mut plan = splice(
        last_plan,
        &mut served,
        planned.plan,
        &scope,
        &gateways,
        input,
    )?;
    if overflows(&plan, &input.capacity) {
        // Some route must wait: which one, a full plan decides.
        return None;
    }
    // The touched listeners' waiting and fixed routes are all in scope: as planned now.
    on.replace(planned.on, &scope.touched);
    // `held` indexes the plan's claims.
    plan.cooling = held.cooling();
    memo.last = Some(Last::of(input, &plan, on, served, held, backends, false));
    Some(plan)
}

/// The last plan in `memo`, taken out of it, when the next plan may be made from it:
/// made from `before`, whose world is `input`'s.
fn reusable_last(input: &Input, before: &Snapshot, memo: &mut Memo) -> Option<Last> {
    let last = memo.last.take().filter(|_| memo.incremental)?;
    // Which routes fit the datapath is decided over all of them, oldest first: while
    // some wait, every plan is a full one.
    if last.contested || !last.plan.waiting.is_empty() || !last.same_world(before, input) {
        return None;
    }
    Some(last)
}

/// The routes that changed from one snapshot to the next: those between the longest
/// common head and tail of their routes.
struct ChangedRoutes<'a> {
    /// The changed routes of the last snapshot.
    old: &'a [Arc<Route>],
    /// The changed routes of this one.
    new: &'a [Arc<Route>],
    /// Whether the routes outside the changes are the same allocations in both.
    shared: bool,
}

impl<'a> ChangedRoutes<'a> {
    /// The routes that changed from `old` to `new`, or `None` when they are too many to
    /// plan incrementally.
    fn between(old: &'a [Arc<Route>], new: &'a [Arc<Route>]) -> Option<Self> {
        let (head, tail) = common_ends(old, new, |a, b| a == b);
        let (old_changed, new_changed) =
            (&old[head..old.len() - tail], &new[head..new.len() - tail]);
        if old_changed.len() + new_changed.len() > scope_limit(new.len()) {
            return None;
        }
        // The routes outside the changes are the allocations the last plan had (as the
        // manifest source keeps them), or equal ones parsed again (as the Kubernetes
        // source gives them): then routes are found in the snapshot by key, not address.
        let shared = old[..head]
            .iter()
            .zip(&new[..head])
            .all(|(a, b)| Arc::ptr_eq(a, b))
            && old[old.len() - tail..]
                .iter()
                .zip(&new[new.len() - tail..])
                .all(|(a, b)| Arc::ptr_eq(a, b));
        Some(ChangedRoutes {
            old: old_changed,
            new: new_changed,
            shared,
        })
    }

    /// Adds the changed routes to `scope`, and the listeners the old ones attached to
    /// in `before`.
    fn add_to(&self, scope: &mut Scope, gateways: &Gateways, before: &Snapshot) {
        for r in self.new {
            scope.add_route(r);
        }
        for r in self.old {
            scope.add_gone(r);
        }
        for r in self.old {
            // The world is unchanged: it attached where it would attach now.
            scope.add_listeners_of(r, gateways, before);
        }
    }
}

/// Adds to `scope` the routes of the claims that changed since `last` (`held` indexes
/// the claims of `input`).
fn add_changed_claims(
    scope: &mut Scope,
    last: &Last,
    held: &ClaimIndex,
    input: &Input,
    gateways: &Gateways,
) {
    // Claims changed in the input since the last plan, or by the last plan itself.
    for (have, want) in claim_pairs(&last.plan.claims, input.claims) {
        for c in have.into_iter().chain(want) {
            scope.add_claim(c, gateways);
        }
    }
    for c in &last.changed {
        scope.add_claim(c, gateways);
    }
    // A claim the last plan made for its route is that route's plan again: only the
    // routes waiting on its listener may be planned otherwise now (a quota is full, a
    // port taken). Re-planning their routes made the first change after a start (whose
    // plan made every claim) a full plan again.
    for m in &last.made {
        scope.touch_ports(
            &m.namespace,
            &m.gateway,
            &m.listener,
            m.protocol,
            m.ports,
            gateways,
        );
    }
    // Released claims whose cool-down ended since the last plan.
    for c in held.cooled_between(last.now, input.now) {
        scope.add_claim(c, gateways);
    }
}

/// Adds to `scope` the routes naming a Service whose object or EndpointSlices changed
/// from `before` to `snap` (`backends` follows them). `None` when `backends` cannot
/// tell.
fn add_changed_backends(
    scope: &mut Scope,
    backends: &mut BackendIndex,
    before: &Snapshot,
    snap: &Snapshot,
) -> Option<()> {
    for k in backends.follow(before, snap)? {
        for r in backends.users(&k) {
            scope.add_route(r);
        }
    }
    Some(())
}

/// Closes `scope`: every route waiting on, or fixed to, a touched listener, until no
/// listener comes in. The routes of `snap` to plan, found by address when `shared`;
/// `None` when the scope grows too large.
fn close_scope(
    scope: &mut Scope,
    on: &OnListeners,
    shared: bool,
    gateways: &Gateways,
    snap: &Snapshot,
    memo: &Memo,
) -> Option<Vec<Arc<Route>>> {
    let find = |k: &RouteKey| memo.address_of(k);
    let find = shared.then_some(&find as &scope::Find);
    let routes = &snap.routes;
    scope.close(on, routes, gateways, snap, scope_limit(routes.len()), find)
}

/// Plans `routes` (the routes in `scope`) with their claims and every other claim
/// (`held`, then made the index of the planned claims too): their plan, its claims
/// among the input's. `None` when the part cannot be planned alone.
fn plan_part(
    input: &Input,
    routes: Vec<Arc<Route>>,
    backends: &BackendIndex,
    scope: &mut Scope,
    held: &mut ClaimIndex,
    gateways: &Gateways,
    memo: &mut Memo,
) -> Option<super::Run> {
    let snap = input.snapshot;
    let part = part_of(snap, routes, backends);
    // The routes in scope are planned with their claims, and every other claim held.
    let claims = held.take(scope.keys(), gateways);
    let held_claims: ClaimList = claims.iter().cloned().collect();
    let part_input = Settings::of(input).input(&part, &held_claims, input.now);
    let mut planned = super::run(&part_input, snap, memo, Some(scope), Some(&*held));
    if planned.contested || !planned.plan.waiting.is_empty() {
        return None;
    }
    for c in planned.plan.claims.iter() {
        held.add(c, gateways);
    }
    let fresh = std::mem::take(&mut planned.plan.claims);
    planned.plan.claims = replace_claims(input.claims, &claims, fresh)?;
    Some(planned)
}

/// The snapshot `routes` are planned from: `snap` with those routes only.
fn part_of(snap: &Snapshot, routes: Vec<Arc<Route>>, backends: &BackendIndex) -> Snapshot {
    // Only the Services and slices the routes planned name: resolving their backends
    // indexes what it is given.
    let (services, endpoint_slices) = backends.named_by_all(&routes);
    Snapshot {
        routes,
        gateway_classes: snap.gateway_classes.clone(),
        gateways: snap.gateways.clone(),
        reference_grants: snap.reference_grants.clone(),
        services,
        endpoint_slices,
        namespaces: snap.namespaces.clone(),
        gateway_configs: snap.gateway_configs.clone(),
        backend_health_policies: Vec::new(),
        route_traffic_policies: Vec::new(),
    }
}

/// Whether `plan` needs more room than `capacity` gives.
fn overflows(plan: &Plan, capacity: &crate::datapath::Capacity) -> bool {
    let most = capacity.of_limit(crate::datapath::Limit::Addresses) as usize;
    plan.used.exceeds(capacity).is_some()
        || super::capacity::distinct_addresses(&plan.datapath.services)
            .iter()
            .any(|&n| n > most)
}

/// Makes `held`, the index of the claims `was`, the index of `is`: the claims between
/// their longest common head and tail changed. `None` when `is` is not sorted there
/// (the plan's claims are sorted; a full plan sorts them).
fn follow_claims(
    held: &mut ClaimIndex,
    was: &ClaimList,
    is: &ClaimList,
    gateways: &Gateways,
) -> Option<()> {
    let (head, tail) = common_ends_of(was, is, Arc::ptr_eq);
    let window = is
        .focus()
        .narrow(head.saturating_sub(1)..(is.len() - tail + 1).min(is.len()));
    if !window
        .into_iter()
        .is_sorted_by(|a, b| claim_key(a) <= claim_key(b))
    {
        return None;
    }
    for c in was.focus().narrow(head..was.len() - tail) {
        held.remove(c, gateways);
    }
    for c in is.focus().narrow(head..is.len() - tail) {
        held.add(c, gateways);
    }
    Some(())
}

/// The claims of a plan: `all` (the input's, sorted) without `taken` (each one of
/// `all`: those of the routes planned) and with `fresh` (what the plan made of them),
/// each where it belongs (`all` is shared, not copied). `None` when a claim of `taken`
/// is not found in `all` (then `all` is not sorted: a full plan sorts it).
fn replace_claims(
    all: &ClaimList,
    taken: &[Arc<PortClaim>],
    fresh: ClaimList,
) -> Option<ClaimList> {
    let mut out = all.clone();
    let at = |list: &ClaimList, c: &PortClaim| {
        list.binary_search_by(|x| claim_key(x).cmp(&claim_key(c)))
    };
    for c in taken {
        let i = at(&out, c).ok()?;
        if !Arc::ptr_eq(&out[i], c) {
            return None;
        }
        out.remove(i);
    }
    for c in fresh {
        let i = at(&out, &c).unwrap_or_else(|i| i);
        out.insert(i, c);
    }
    Some(out)
}
