//! Splicing an incremental plan into the last one: the routes planned again replace
//! theirs, every other route keeps what the last plan gave it.

use crate::{datapath::Usage, model::ServiceAddr, model::*};

use super::{gateways::Gateways, project, scope::Scope, FastMap, Input, Owners, Plan, RouteEntry};

/// The key routes are sorted by in a plan.
fn entry_key(e: &RouteEntry) -> (RouteKind, &str, &str) {
    e.key()
}

/// The datapath services each route serves.
pub(super) type Served = FastMap<RouteKey, Vec<ServiceAddr>>;

/// The datapath services each route of `owners` serves.
pub(super) fn served(owners: &Owners) -> Served {
    // About one service a route: sized at once, not grown by rehashing.
    let mut out = Served::with_capacity_and_hasher(owners.len(), Default::default());
    for (service, id) in owners {
        match out.get_mut(&**id) {
            Some(list) => list.push(*service),
            None => {
                out.insert(RouteKey::clone(id), vec![*service]);
            }
        }
    }
    out
}

/// The plan of the whole input: `part` (planned for the routes in scope, with every
/// claim) spliced into the last plan, `last`, whose services each route served are
/// `served` (updated). `None` when a service the scope's routes serve is served to a
/// route outside it (a contest only a full plan settles).
pub(super) fn splice(
    last: Plan,
    served: &mut Served,
    mut part: Plan,
    scope: &Scope,
    gateways: &Gateways,
    input: &Input,
) -> Option<Plan> {
    // Route entries: the last plan's outside the scope, and the scope's as planned now,
    // each where it belongs by key (the last plan's list is shared, not copied).
    let mut routes = last.routes;
    for k in &scope.routes {
        let key = (k.kind, k.namespace.as_str(), k.name.as_str());
        if let Ok(i) = routes.binary_search_by(|e| entry_key(e).cmp(&key)) {
            routes.remove(i);
        }
    }
    for e in std::mem::take(&mut part.routes) {
        let i = routes
            .binary_search_by(|x| entry_key(x).cmp(&entry_key(&e)))
            .unwrap_or_else(|i| i);
        routes.insert(i, e);
    }
    part.routes = routes;

    // Datapath services: the last plan's served to routes outside the scope, and the
    // scope's as planned now.
    let (mut services, mut source_nat) = (last.datapath.services, last.datapath.source_nat);
    let mut owners = last.owners;
    let mut used = last.used;
    // A port of a listener is never a SNAT port: while only such ports are served or
    // no longer served, the SNAT ports are as they were.
    let on_listener = |p: u16| {
        let mut listeners = gateways.views.iter().flat_map(|gw| &gw.listeners);
        listeners.any(|l| project::ports_of(l).contains(&p))
    };
    let mut snat_same = true;
    for key in &scope.routes {
        for service in served.remove(key).unwrap_or_default() {
            snat_same &= on_listener(service.port);
            if let Some(gone) = services.remove(&service) {
                used = used.minus(Usage::of_service(&gone));
            }
            owners.remove(&service);
            source_nat.remove(&service);
        }
    }
    for (service, backends) in std::mem::take(&mut part.datapath.services) {
        if owners.contains_key(&service) {
            return None;
        }
        snat_same &= on_listener(service.port);
        used = used.plus(Usage::of_service(&backends));
        if let Some(was) = services.insert(service, backends) {
            used = used.minus(Usage::of_service(&was));
        }
    }
    for (key, list) in self::served(&part.owners) {
        served.insert(key, list);
    }
    // One by one: `append` rebuilds the whole map.
    owners.extend(std::mem::take(&mut part.owners));
    source_nat.extend(std::mem::take(&mut part.datapath.source_nat));
    part.datapath.snat_ports = match snat_same {
        true => last.datapath.snat_ports,
        false => project::snat_ports(
            &gateways.views,
            services.keys().map(|s| s.port),
            &input.snat_ports,
        ),
    };
    part.datapath.services = services;
    part.datapath.source_nat = source_nat;
    part.owners = owners;
    part.used = used;

    // A fixed listener's attached routes are counted from its routes: those of an
    // untouched listener (none in scope) are as counted last time.
    for (gi, (entry, view)) in part.gateways.iter_mut().zip(&gateways.views).enumerate() {
        for (li, (status, l)) in entry
            .status
            .listeners
            .iter_mut()
            .zip(&view.listeners)
            .enumerate()
        {
            if l.range.is_none() && !scope.touched.contains(&(gi, li)) {
                status.attached_routes = last.gateways[gi].status.listeners[li].attached_routes;
            }
        }
    }
    Some(part)
}
