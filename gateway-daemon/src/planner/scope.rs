//! The scope of an incremental plan: the routes re-planned (by key) and the listeners
//! whose waiting and fixed routes are all among them. How it grows from a change is
//! `incremental::plan`'s.

use std::{collections::BTreeSet, sync::Arc};

use crate::model::*;

use super::{
    attach::{self, Attach, Attachments},
    gateways::Gateways,
    incremental::ListenerAt,
    FastMap,
};

/// A hash set with the planner's hasher.
type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// The routes on each listener that a change of it can move: those waiting for a port
/// of a range listener, those attached to a fixed one (as the plan that left them had
/// them: a route changed since is in scope as changed).
#[derive(Debug, Default)]
pub(super) struct OnListeners {
    waiting: FastMap<ListenerAt, Vec<Arc<Route>>>,
    fixed: FastMap<ListenerAt, Vec<Arc<Route>>>,
}

impl OnListeners {
    /// The routes waiting on, or attached to, each listener after `attachments` were bound.
    pub fn of(attachments: &Attachments, routes: &[Arc<Route>]) -> Self {
        let mut out = OnListeners::default();
        for a in &attachments.list {
            let Attach::Listeners { fixed, ranges, .. } = &*a.attach else {
                continue;
            };
            let waiting = a.claim.is_none() && !ranges.is_empty();
            if fixed.is_empty() && !waiting {
                continue;
            }
            let route = &routes[a.route_index];
            for &li in fixed {
                out.fixed
                    .entry((a.gw, li))
                    .or_default()
                    .push(Arc::clone(route));
            }
            for &li in ranges.iter().filter(|_| waiting) {
                out.waiting
                    .entry((a.gw, li))
                    .or_default()
                    .push(Arc::clone(route));
            }
        }
        out
    }

    /// Takes, for each listener of `touched`, its routes from `fresh` (a plan whose
    /// scope held all of them).
    pub fn replace(&mut self, mut fresh: OnListeners, touched: &BTreeSet<ListenerAt>) {
        for at in touched {
            for (map, from) in [
                (&mut self.waiting, &mut fresh.waiting),
                (&mut self.fixed, &mut fresh.fixed),
            ] {
                match from.remove(at) {
                    Some(list) => map.insert(*at, list),
                    None => map.remove(at),
                };
            }
        }
    }
}

/// The routes a plan re-plans (by key) and the listeners whose waiting and fixed
/// routes are all among them.
#[derive(Debug, Default)]
pub(super) struct Scope {
    pub(super) routes: FastSet<RouteKey>,
    /// The allocations of the routes in scope that the snapshot must have: they are
    /// found in it by address, without reading the routes (a scan of 100,000 routes'
    /// names took 2.5 ms a plan, their memory scattered). When one is not there (an
    /// equal route was given again as a new allocation), they are found by key.
    found: FastSet<usize>,
    /// Allocations of the last snapshot that this one has not (changed or gone).
    gone: FastSet<usize>,
    /// Keys not yet looked up in the last plan (`Find`), and whether each came with
    /// an allocation of its own.
    unfound: Vec<(RouteKey, bool)>,
    pub(super) touched: BTreeSet<ListenerAt>,
    /// Listeners touched whose routes are not yet in `routes`.
    pub(super) fresh: Vec<ListenerAt>,
}

/// The address of the route of a key as the last plan had it.
pub(super) type Find<'a> = dyn Fn(&RouteKey) -> Option<usize> + 'a;

/// The address of a route's allocation.
fn address(route: &Arc<Route>) -> usize {
    Arc::as_ptr(route) as usize
}

impl Scope {
    /// The routes re-planned.
    pub fn keys(&self) -> impl Iterator<Item = &RouteKey> {
        self.routes.iter()
    }

    /// A route of the last snapshot that this one has not (it changed or is gone).
    pub(super) fn add_gone(&mut self, route: &Arc<Route>) {
        self.gone.insert(address(route));
        self.add_key(RouteKey::of(route));
    }

    /// A route of the snapshot (or of the last plan's: a route changed since is in
    /// scope by its change).
    pub(super) fn add_route(&mut self, route: &Arc<Route>) {
        let at = address(route);
        if !self.gone.contains(&at) {
            self.found.insert(at);
        }
        let key = RouteKey::of(route);
        if !self.routes.contains(&key) {
            self.unfound.push((key.clone(), true));
            self.routes.insert(key);
        }
    }

    /// A route by key: its allocation is looked up when the scope is closed.
    pub(super) fn add_key(&mut self, key: RouteKey) {
        if !self.routes.contains(&key) {
            self.unfound.push((key.clone(), false));
            self.routes.insert(key);
        }
    }

    pub(super) fn touch(&mut self, at: ListenerAt) {
        if self.touched.insert(at) {
            self.fresh.push(at);
        }
    }

    /// A claim that changed: its route, its listener, and any range listener of its
    /// Gateway and protocol holding its port.
    pub(super) fn add_claim(&mut self, c: &PortClaim, gateways: &Gateways) {
        if let Some(key) = c.spec.route.key() {
            self.add_key(key);
        }
        self.touch_claim(c, gateways);
    }

    /// A claim's listener, and any range listener of its Gateway and protocol holding
    /// its port.
    pub(super) fn touch_claim(&mut self, c: &PortClaim, gateways: &Gateways) {
        let (port, protocol) = (c.spec.port, Protocol::parse(&c.spec.protocol));
        let (ns, gateway, listener) = (c.metadata.ns(), &c.spec.gateway, &c.spec.listener);
        self.touch_ports(ns, gateway, listener, protocol, (port, port), gateways);
    }

    /// Listener `listener` of Gateway `namespace/gateway`, and any range listener of
    /// that Gateway and `protocol` holding a port of `ports` (lowest, highest).
    pub(super) fn touch_ports(
        &mut self,
        namespace: &str,
        gateway: &str,
        listener: &str,
        protocol: Option<Protocol>,
        (lo, hi): (u16, u16),
        gateways: &Gateways,
    ) {
        let Some(gi) = gateways.index(namespace, gateway) else {
            return;
        };
        for (li, l) in gateways.views[gi].listeners.iter().enumerate() {
            let holds_port =
                l.protocol == protocol && l.range.is_some_and(|(x, y)| x <= hi && lo <= y);
            if l.spec.name == listener || holds_port {
                self.touch((gi, li));
            }
        }
    }

    /// Adds every route waiting on, or fixed to, a touched listener (`on`, as the last
    /// plan left them), and the listeners those attach to, until no listener comes in;
    /// returns the routes of `routes` in scope, or `None` past `limit` routes. `find`
    /// gives the address of the route of a key as the last plan had it (a route
    /// unchanged since is that allocation; one changed is in scope by its change).
    pub(super) fn close(
        &mut self,
        on: &OnListeners,
        routes: &[Arc<Route>],
        gateways: &Gateways,
        snap: &Snapshot,
        limit: usize,
        find: Option<&Find>,
    ) -> Option<Vec<Arc<Route>>> {
        let mut list: Option<Vec<Arc<Route>>> = None;
        // Without `find` (the routes are not the allocations the last plan had), or
        // with a key the last plan had no route of and that came without one (a route
        // it never planned, or given twice), routes are found by key.
        let mut by_key = find.is_none();
        loop {
            let before = self.routes.len();
            for at in std::mem::take(&mut self.fresh) {
                let on = [on.waiting.get(&at), on.fixed.get(&at)];
                for route in on.into_iter().flatten().flatten() {
                    self.add_route(route);
                }
            }
            if self.routes.len() > limit {
                return None;
            }
            if list.is_some() && self.routes.len() == before {
                break;
            }
            for (key, addressed) in std::mem::take(&mut self.unfound) {
                // The route the last plan had under the key, unless it changed or went:
                // unchanged, the snapshot has it (beside any new one of the same key).
                match find.and_then(|find| find(&key)) {
                    Some(at) if !self.gone.contains(&at) => _ = self.found.insert(at),
                    Some(_) => {}
                    None => by_key |= !addressed,
                }
            }
            let mut now: Vec<Arc<Route>> = Vec::new();
            if !by_key {
                let found = &self.found;
                let by_address = routes.iter().filter(|r| found.contains(&address(r)));
                now = by_address.cloned().collect();
                // Each allocation expected is there, or some route was given again.
                by_key = now.len() != found.len();
            }
            if by_key {
                // Correct, at the cost of reading every route's names: said, so that a
                // change that always takes this way shows in the log.
                tracing::debug!(
                    in_scope = self.routes.len(),
                    routes = routes.len(),
                    "incremental plan: routes found by key (some route not by address)"
                );
                let keys = &self.routes;
                let by_key = routes.iter().filter(|r| keys.contains(&RouteKey::of(r)));
                now = by_key.cloned().collect();
            }
            for r in &now {
                self.add_listeners_of(r, gateways, snap);
            }
            list = Some(now);
            if self.fresh.is_empty() {
                break;
            }
        }
        list
    }

    /// The listeners `route` attaches to.
    pub(super) fn add_listeners_of(&mut self, route: &Route, gateways: &Gateways, snap: &Snapshot) {
        let namespaces = attach::namespaces(snap);
        attach::each_attachment(route, gateways, &namespaces, |_, _, gi, attach| {
            if let Attach::Listeners { fixed, ranges, .. } = &attach {
                for &li in fixed.iter().chain(ranges) {
                    self.touch((gi, li));
                }
            }
        });
    }
}
