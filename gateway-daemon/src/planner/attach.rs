//! The second stage: routes in the order they compete (oldest first), and what each of
//! their parentRefs to a Gateway of ours attaches to (reused from the memo while the
//! route and every other object are unchanged).

use std::{
    borrow::Cow,
    collections::{hash_map::Entry, BTreeMap},
    ops::Range,
    time::SystemTime,
};

use crate::model::*;

use super::Reason;
use super::{
    gateways::{GatewayView, Gateways, ListenerView},
    memo::Remembered,
    FastMap,
};

/// The attachments of a plan's routes, and the routes by identity.
pub(super) struct Attachments<'a> {
    /// Route indexes, oldest route first: creation time, then source order, then
    /// namespace/name.
    pub order: Vec<usize>,
    /// Each route's creation time, by route index.
    pub created: Vec<Option<SystemTime>>,
    /// Every (route, parentRef) pair that targets a Gateway of ours.
    pub list: Vec<Attachment<'a>>,
    /// The attachments of each route (contiguous: made route by route), by route index.
    pub of: Vec<Range<usize>>,
    /// The next route of the same identity (a route can be given twice), by route index.
    pub same_next: Vec<Option<usize>>,
    /// Routes whose identity another route of the snapshot has too.
    pub given_twice: Vec<bool>,
    /// Routes by identity: the oldest, the newest (the tail of `same_next`), and the
    /// last in the snapshot.
    pub by_identity: FastMap<(RouteKind, &'a str, &'a str), (usize, usize, usize)>,
}

impl<'a> Attachments<'a> {
    /// Attachments of the route a claim names, oldest route first.
    pub fn named(&self, r: &ClaimRoute) -> impl Iterator<Item = usize> + '_ {
        let head = RouteKind::of_name(&r.kind)
            .and_then(|kind| {
                self.by_identity
                    .get(&(kind, r.namespace.as_str(), r.name.as_str()))
            })
            .map(|&(head, _, _)| head);
        std::iter::successors(head, |&ri| self.same_next[ri]).flat_map(|ri| self.of[ri].clone())
    }

    /// The last route in the snapshot of the identity `r` names, if it is that route.
    pub fn route_named(&self, r: &ClaimRoute, routes: &[std::sync::Arc<Route>]) -> Option<usize> {
        let kind = RouteKind::of_name(&r.kind)?;
        let (_, _, i) = *self
            .by_identity
            .get(&(kind, r.namespace.as_str(), r.name.as_str()))?;
        holds(r, &routes[i]).then_some(i)
    }

    /// The attachments to each fixed listener, by (Gateway, listener), oldest first.
    pub fn fixed_attached(&self) -> BTreeMap<(usize, usize), Vec<usize>> {
        let mut fixed_attached: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
        for (ai, a) in self.list.iter().enumerate() {
            if let Attach::Listeners { fixed, .. } = &*a.attach {
                for &li in fixed {
                    fixed_attached.entry((a.gw, li)).or_default().push(ai);
                }
            }
        }
        fixed_attached
    }
}

/// Orders the snapshot's routes and attaches them to `gateways`. `known` is what the
/// memo remembers of each route; its attachments serve while `world_same`.
pub(super) fn attach_routes<'a>(
    snap: &'a Snapshot,
    known: &[Option<&'a Remembered>],
    world_same: bool,
    gateways: &Gateways<'a>,
) -> Attachments<'a> {
    let created = created(snap, known);
    let order = order(snap, &created);
    let namespaces = namespaces(snap);
    let n = snap.routes.len();
    let mut out = Attachments {
        order: Vec::new(),
        created,
        list: Vec::with_capacity(n),
        of: vec![0..0; n],
        same_next: vec![None; n],
        given_twice: vec![false; n],
        by_identity: FastMap::with_capacity_and_hasher(n, Default::default()),
    };
    for &ri in &order {
        let route = &snap.routes[ri];
        let m = &route.metadata;
        match out.by_identity.entry((route.kind, m.ns(), m.name.as_str())) {
            Entry::Vacant(v) => {
                v.insert((ri, ri, ri));
            }
            Entry::Occupied(mut o) => {
                let (head, tail, last) = o.get_mut();
                out.given_twice[*head] = true;
                out.given_twice[ri] = true;
                out.same_next[*tail] = Some(ri);
                *tail = ri;
                *last = (*last).max(ri);
            }
        }
        let first = out.list.len();
        if let Some(k) = known[ri].filter(|_| world_same) {
            out.list
                .extend(k.attaches.iter().map(|(pi, gi, attach)| Attachment {
                    route,
                    route_index: ri,
                    parent: &route.spec.parent_refs[*pi],
                    parent_index: *pi,
                    gw: *gi,
                    attach: Cow::Borrowed(attach),
                    claim: None,
                    failure: None,
                }));
            out.of[ri] = first..out.list.len();
            continue;
        }
        each_attachment(route, gateways, &namespaces, |pi, parent, gi, attach| {
            out.list.push(Attachment {
                route,
                route_index: ri,
                parent,
                parent_index: pi,
                gw: gi,
                attach: Cow::Owned(attach),
                claim: None,
                failure: None,
            })
        });
        out.of[ri] = first..out.list.len();
    }
    out.order = order;
    out
}

/// The snapshot's Namespaces by name (for listeners' namespace selectors).
pub(super) fn namespaces(snap: &Snapshot) -> BTreeMap<&str, &Namespace> {
    snap.namespaces
        .iter()
        .map(|n| (n.metadata.name.as_str(), &**n))
        .collect()
}

/// Calls `f` with each parentRef of `route` to a Gateway of ours (its index, the
/// parentRef, the Gateway's index) and what it attaches to.
pub(super) fn each_attachment<'a>(
    route: &'a Route,
    gateways: &Gateways,
    namespaces: &BTreeMap<&str, &Namespace>,
    mut f: impl FnMut(usize, &'a ParentRef, usize, Attach),
) {
    for (pi, parent) in route.spec.parent_refs.iter().enumerate() {
        if parent.group.as_deref().unwrap_or(GATEWAY_GROUP) != GATEWAY_GROUP
            || parent.kind.as_deref().unwrap_or("Gateway") != "Gateway"
        {
            continue;
        }
        let gw_ns = parent.namespace.as_deref().unwrap_or(route.metadata.ns());
        let Some(gi) = gateways.index(gw_ns, parent.name.as_str()) else {
            continue;
        };
        f(
            pi,
            parent,
            gi,
            attach(route, parent, &gateways.views[gi], namespaces),
        );
    }
}

/// Each route's creation time, as remembered or parsed.
fn created(snap: &Snapshot, known: &[Option<&Remembered>]) -> Vec<Option<SystemTime>> {
    snap.routes
        .iter()
        .zip(known)
        .map(|(r, k)| match k {
            Some(k) => k.created,
            None => r.created().map(|t| t.system()),
        })
        .collect()
}

/// Routes, oldest first: creation time, then source order, then namespace/name.
fn order(snap: &Snapshot, created_of: &[Option<SystemTime>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..snap.routes.len()).collect();
    order.sort_by_cached_key(|&i| {
        let m = &snap.routes[i].metadata;
        let created = created_of[i];
        (
            created.is_none(),
            created,
            if created.is_some() { 0 } else { i },
            m.ns(),
            m.name.as_str(),
        )
    });
    order
}

/// What a parentRef attaches to on one Gateway.
#[derive(Clone, Debug)]
pub(super) enum Attach {
    Refused {
        reason: Reason,
        message: String,
    },
    /// The Gateway's parameters are invalid: nothing changes for it.
    Frozen {
        message: String,
    },
    Listeners {
        fixed: Vec<usize>,
        /// Range listeners that may serve the route, in Gateway order.
        ranges: Vec<usize>,
        requested: Option<u16>,
    },
}

/// One (route, parentRef) pair that targets a Gateway of ours.
pub(super) struct Attachment<'a> {
    pub route: &'a Route,
    pub route_index: usize,
    pub parent: &'a ParentRef,
    /// The index of `parent` in the route's parentRefs.
    pub parent_index: usize,
    pub gw: usize,
    /// Borrowed from the memo when the route and the world are unchanged.
    pub attach: Cow<'a, Attach>,
    /// The claim serving a range attachment, once found or made.
    pub claim: Option<usize>,
    /// Why a range attachment got no port.
    pub failure: Option<(Reason, String)>,
}

/// Whether `claimed` names `route` (a missing uid on either side matches any).
pub(super) fn holds(claimed: &ClaimRoute, route: &Route) -> bool {
    RouteKind::of_name(&claimed.kind) == Some(route.kind)
        && claimed.namespace == route.metadata.ns()
        && claimed.name == route.metadata.name
        && (claimed.uid.is_none()
            || route.metadata.uid.is_none()
            || claimed.uid.as_deref() == route.metadata.uid.as_deref())
}

/// Which listeners of `gw` a parentRef of `route` attaches to.
fn attach(
    route: &Route,
    parent: &ParentRef,
    gw: &GatewayView,
    namespaces: &BTreeMap<&str, &Namespace>,
) -> Attach {
    if let Some(e) = &gw.params_error {
        let (ns, name) = gw.key();
        return Attach::Frozen { message: format!("Gateway {ns}/{name} has invalid parameters ({e}); port assignments are kept as they are") };
    }
    let no_match = |message: String| Attach::Refused {
        reason: Reason::NoMatchingParent,
        message,
    };
    // Which listeners the parentRef names (Gateway API: sectionName, then port); a
    // parentRef naming none is `NoMatchingParent`. Of those, the ones that admit the
    // route (its kind and its namespace) are attached to; if none does, the route is
    // `NotAllowedByListeners`, as upstream conformance expects.
    let mut candidates: Vec<usize> = (0..gw.listeners.len()).collect();
    if let Some(section) = &parent.section_name {
        candidates.retain(|&i| gw.listeners[i].spec.name == section.as_str());
        if candidates.is_empty() {
            return no_match(format!("the Gateway has no listener {section}"));
        }
    }
    if let Some(port) = parent.port {
        candidates.retain(|&i| {
            let l = &gw.listeners[i];
            match l.range {
                Some((a, b)) => (a..=b).contains(&port),
                None => l.spec.port == port,
            }
        });
        if candidates.is_empty() {
            let which = match &parent.section_name {
                Some(section) => format!("listener {section}"),
                None => "a listener".to_string(),
            };
            return no_match(format!(
                "port {port} is neither the port nor in the port range of {which}"
            ));
        }
    }
    let route_ns = route.metadata.ns();
    let gw_ns = gw.spec.metadata.ns();
    let mut refusals = Vec::new();
    candidates.retain(
        |&i| match refusal(&gw.listeners[i], route, route_ns, gw_ns, namespaces) {
            None => true,
            Some(why) => {
                refusals.push(why);
                false
            }
        },
    );
    if candidates.is_empty() {
        // Listeners of the route's protocol say why they refuse it; the others are
        // named only when no listener of its protocol was named.
        let some_own = refusals.iter().any(|(other_protocol, _)| !other_protocol);
        let message = refusals
            .iter()
            .filter(|(other_protocol, _)| !(some_own && *other_protocol))
            .map(|(_, why)| why.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        return Attach::Refused {
            reason: Reason::NotAllowedByListeners,
            message,
        };
    }
    let (ranges, fixed) = candidates
        .into_iter()
        .partition(|&i| gw.listeners[i].range.is_some());
    Attach::Listeners {
        fixed,
        ranges,
        requested: parent.port,
    }
}

/// Why listener `l` does not admit `route` (`None` when it does), and whether that is
/// because it is of another protocol: a listener takes the route kind of its protocol
/// only, narrowed by `allowedRoutes.kinds`, from the namespaces
/// `allowedRoutes.namespaces` allows (`Same` by default).
fn refusal(
    l: &ListenerView,
    route: &Route,
    route_ns: &str,
    gw_ns: &str,
    namespaces: &BTreeMap<&str, &Namespace>,
) -> Option<(bool, String)> {
    let name = &l.spec.name;
    let kind = route.kind.name();
    if Protocol::parse(&l.spec.protocol) != Some(route.kind.protocol()) {
        return Some((
            true,
            format!(
                "listener {name} (protocol {}) does not take {kind}s",
                l.spec.protocol
            ),
        ));
    }
    let namespaces_rule = l
        .spec
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    let kinds = l.spec.allowed_kinds();
    let kind_ok = kinds.is_empty()
        || kinds.iter().any(|k| {
            k.kind == kind && k.group.as_deref().unwrap_or(GATEWAY_GROUP) == GATEWAY_GROUP
        });
    if !kind_ok {
        return Some((
            false,
            format!("listener {name} does not allow {kind}s (allowedRoutes.kinds)"),
        ));
    }
    let from = namespaces_rule
        .and_then(|n| n.from.as_deref())
        .unwrap_or("Same");
    let ns_ok = match from {
        "All" => true,
        "Same" => route_ns == gw_ns,
        "Selector" => {
            let empty = Labels::default();
            let labels = namespaces
                .get(route_ns)
                .map(|n| &n.metadata.labels)
                .unwrap_or(&empty);
            // No selector selects nothing: an operator must say which namespaces.
            namespaces_rule
                .and_then(|n| n.selector.as_ref())
                .is_some_and(|s| s.matches(labels))
        }
        _ => false,
    };
    (!ns_ok).then(|| {
        (
            false,
            format!(
                "listener {name} does not allow routes from namespace {route_ns} \
             (allowedRoutes.namespaces.from: {from})"
            ),
        )
    })
}
