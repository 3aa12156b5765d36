//! The scope of an incremental plan: the routes re-planned (by `Kind/namespace/name`)
//! and the listeners whose waiting and fixed routes are all among them. How it grows
//! from a change is `incremental::plan`'s.

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

/// The routes (by `Kind/namespace/name`) on each listener that a change of it can
/// move: those waiting for a port of a range listener, those attached to a fixed one.
#[derive(Debug, Default)]
pub(super) struct OnListeners {
    waiting: FastMap<ListenerAt, Vec<String>>,
    fixed: FastMap<ListenerAt, Vec<String>>,
}

impl OnListeners {
    /// The routes waiting on, or attached to, each listener after `attachments` were bound.
    pub fn of(attachments: &Attachments) -> Self {
        let mut out = OnListeners::default();
        let mut key = String::new();
        for a in &attachments.list {
            let Attach::Listeners { fixed, ranges, .. } = &*a.attach else {
                continue;
            };
            let waiting = a.claim.is_none() && !ranges.is_empty();
            if fixed.is_empty() && !waiting {
                continue;
            }
            key.clear();
            let m = &a.route.metadata;
            route_key(&mut key, a.route.kind.name(), m.ns(), &m.name);
            for &li in fixed {
                out.fixed.entry((a.gw, li)).or_default().push(key.clone());
            }
            for &li in ranges.iter().filter(|_| waiting) {
                out.waiting.entry((a.gw, li)).or_default().push(key.clone());
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

/// The routes a plan re-plans (by `Kind/namespace/name`) and the listeners whose
/// waiting and fixed routes are all among them.
#[derive(Debug, Default)]
pub(super) struct Scope {
    pub(super) routes: FastSet<String>,
    pub(super) touched: BTreeSet<ListenerAt>,
    /// Listeners touched whose routes are not yet in `routes`.
    pub(super) fresh: Vec<ListenerAt>,
    key: String,
}

impl Scope {
    /// Whether the route `kind/namespace/name` is re-planned.
    pub fn holds(&mut self, kind: &str, namespace: &str, name: &str) -> bool {
        // A few keys are compared faster than one is hashed.
        if self.routes.len() <= 8 {
            return self.routes.iter().any(|k| is_key(k, kind, namespace, name));
        }
        self.key.clear();
        route_key(&mut self.key, kind, namespace, name);
        self.routes.contains(self.key.as_str())
    }

    /// The routes re-planned.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.routes.iter()
    }

    pub(super) fn add_route(&mut self, kind: &str, namespace: &str, name: &str) {
        self.key.clear();
        route_key(&mut self.key, kind, namespace, name);
        if !self.routes.contains(self.key.as_str()) {
            self.routes.insert(self.key.clone());
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
        let r = &c.spec.route;
        self.add_route(&r.kind, &r.namespace, &r.name);
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
    /// returns the routes of `routes` in scope, or `None` past `limit` routes.
    pub(super) fn close(
        &mut self,
        on: &OnListeners,
        routes: &[Arc<Route>],
        gateways: &Gateways,
        snap: &Snapshot,
        limit: usize,
    ) -> Option<Vec<Arc<Route>>> {
        let mut list: Option<Vec<Arc<Route>>> = None;
        loop {
            let before = self.routes.len();
            for at in std::mem::take(&mut self.fresh) {
                let on = [on.waiting.get(&at), on.fixed.get(&at)];
                for key in on.into_iter().flatten().flatten() {
                    self.routes.insert(key.clone());
                }
            }
            if self.routes.len() > limit {
                return None;
            }
            if list.is_some() && self.routes.len() == before {
                break;
            }
            let now: Vec<Arc<Route>> = routes
                .iter()
                .filter(|r| self.holds(r.kind.name(), r.metadata.ns(), &r.metadata.name))
                .cloned()
                .collect();
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

/// Whether `key` is `kind/namespace/name`.
fn is_key(key: &str, kind: &str, namespace: &str, name: &str) -> bool {
    let (k, (a, b)) = (key.as_bytes(), (kind.len(), namespace.len()));
    k.len() == a + b + name.len() + 2
        && k.ends_with(name.as_bytes())
        && k.starts_with(kind.as_bytes())
        && k[a] == b'/'
        && &k[a + 1..a + 1 + b] == namespace.as_bytes()
        && k[a + 1 + b] == b'/'
}
