//! Datapath capacity: which routes the datapath serves when their services do not all
//! fit its maps (`berth run --max-services`, `--max-backends`, and the 256 gateway
//! addresses of each IP family; `datapath::Capacity`).
//!
//! Routes are admitted oldest first, in the order they compete for ports (creation
//! time or first seen, then namespace/name), each whole or not at all: a route is
//! served if its services and their backends fit in what the older routes admitted
//! left, and waits otherwise (a younger, smaller route may still fit). A service
//! several routes share is counted once. A route that waits keeps its claims (nothing
//! here touches a port) and says why in a `Programmed=False` condition of each parent
//! it would be served on; every other route's status is as it would be without a
//! limit. Pure, as the whole planner.

use std::{collections::BTreeSet, net::IpAddr, sync::Arc};

use crate::{
    datapath::{Capacity, Limit, Usage},
    model::ServiceAddr,
    model::*,
};

use super::{condition, gateways::GatewayView, Reason, RouteEntry, RouteKey};

/// Route condition type: whether the route's services are programmed into the
/// datapath. Present only while they are not (`False`, reason `DatapathFull`).
pub const PROGRAMMED: &str = "Programmed";

/// A route whose services wait for room in the datapath.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// The route.
    pub route: Arc<RouteKey>,
    /// The limit it does not fit in.
    pub limit: Limit,
}

/// The datapath services a route would be served by, oldest route first.
pub(super) struct Demand<K> {
    /// The route.
    pub route: K,
    /// Its services, with what each takes.
    pub services: Vec<(ServiceAddr, Usage)>,
}

/// What [`admit`] decided.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Admission<K> {
    /// The routes left out, in the order given, with the limit each met and what it
    /// needed beyond the services already admitted.
    pub waiting: Vec<(K, Limit, Usage)>,
    /// What the services admitted take.
    pub used: Usage,
}

/// Admits `demands` (oldest first) into `capacity`: each route whose services not yet
/// admitted fit in what is left, whole; the others wait.
pub(super) fn admit<K>(
    demands: impl IntoIterator<Item = Demand<K>>,
    capacity: &Capacity,
) -> Admission<K> {
    let mut admitted: BTreeSet<ServiceAddr> = BTreeSet::new();
    // The gateway addresses of the services admitted.
    let mut addresses: BTreeSet<IpAddr> = BTreeSet::new();
    let mut out = Admission {
        waiting: Vec::new(),
        used: Usage::default(),
    };
    for Demand { route, services } in demands {
        let mut need = Usage::default();
        let mut fresh: Vec<ServiceAddr> = Vec::with_capacity(services.len());
        for (service, usage) in services {
            if !admitted.contains(&service) && !fresh.contains(&service) {
                need = need.plus(usage);
                fresh.push(service);
            }
        }
        let mut new_addresses: Vec<IpAddr> = fresh
            .iter()
            .map(|s| s.addr)
            .filter(|a| !addresses.contains(a))
            .collect();
        new_addresses.sort_unstable();
        new_addresses.dedup();
        let over = match out.used.plus(need).exceeds(capacity) {
            None => addresses_over(&addresses, &new_addresses, capacity),
            over => over,
        };
        match over {
            None => {
                out.used = out.used.plus(need);
                admitted.extend(fresh);
                addresses.extend(new_addresses);
            }
            Some(limit) => out.waiting.push((route, limit, need)),
        }
    }
    out
}

/// `Limit::Addresses` if `held` and `more` together hold more gateway addresses of one
/// IP family than the datapath does.
fn addresses_over(held: &BTreeSet<IpAddr>, more: &[IpAddr], capacity: &Capacity) -> Option<Limit> {
    let most = capacity.of_limit(Limit::Addresses) as usize;
    let of = |v6: bool| {
        held.iter()
            .chain(more)
            .filter(|a| a.is_ipv6() == v6)
            .count()
    };
    (of(false) > most || of(true) > most).then_some(Limit::Addresses)
}

/// Gateway addresses of each family among `services` (ordered by address first: one
/// look-up per distinct address, not one per service).
pub(super) fn distinct_addresses<V>(services: &imbl::OrdMap<ServiceAddr, V>) -> [usize; 2] {
    use std::ops::Bound::{Excluded, Unbounded};
    let mut counts = [0, 0];
    let mut next = services.keys().next().copied();
    while let Some(s) = next {
        counts[usize::from(s.addr.is_ipv6())] += 1;
        let last_of_address = ServiceAddr {
            addr: s.addr,
            protocol: crate::model::Protocol::Udp,
            port: u16::MAX,
        };
        next = services
            .range((Excluded(last_of_address), Unbounded))
            .next()
            .map(|(k, _)| *k);
    }
    counts
}

/// A route of the plan left out by [`admit`]: its index in the snapshot, the limit,
/// what it needs, and the Gateways (by index) it would be served on.
pub(super) struct Left {
    pub route: usize,
    pub limit: Limit,
    pub need: Usage,
    pub gateways: Vec<usize>,
}

/// The message of a waiting route's `Programmed` condition.
pub fn message(limit: Limit, capacity: &Capacity, need: Usage) -> String {
    let Some(option) = limit.option() else {
        return format!(
            "not programmed: the datapath holds at most {} gateway addresses of each IP \
             family and older routes' Gateways use them all; this route's Gateway address \
             is served once one is free (it keeps its port)",
            capacity.of_limit(limit)
        );
    };
    format!(
        "not programmed: the datapath holds at most {} {limit} (berth run {}) and older \
         routes leave too few for the {} this route needs; it keeps its port and is served \
         once there is room",
        capacity.of_limit(limit),
        option,
        need.of_limit(limit)
    )
}

/// Adds the `Programmed=False` condition to the parents of each route `left` out that
/// it would be served on (`entries` sorted by kind, namespace and name); returns the
/// routes, oldest first.
pub(super) fn mark_waiting(
    entries: &mut [Arc<RouteEntry>],
    left: &[Left],
    snap: &Snapshot,
    gateways: &[GatewayView],
    capacity: &Capacity,
    now_text: &Time,
) -> Vec<Waiting> {
    let mut waiting = Vec::with_capacity(left.len());
    for l in left {
        let route = &snap.routes[l.route];
        let m = &route.metadata;
        let key = (route.kind, m.ns(), m.name.as_str());
        let found = entries.binary_search_by(|e| e.key().cmp(&key));
        waiting.push(Waiting {
            route: Arc::new(RouteKey::of(route)),
            limit: l.limit,
        });
        let Ok(at) = found else {
            continue;
        };
        let on: Vec<(&str, &str)> = l
            .gateways
            .iter()
            .map(|&gi| {
                let g = &gateways[gi].spec.metadata;
                (g.ns(), g.name.as_str())
            })
            .collect();
        let entry = Arc::make_mut(&mut entries[at]);
        for p in &mut entry.status.parents {
            let gw = (
                p.parent_ref.namespace.as_deref().unwrap_or(m.ns()),
                p.parent_ref.name.as_str(),
            );
            if !on.contains(&gw) || p.conditions.iter().any(|c| c.kind == PROGRAMMED) {
                continue;
            }
            p.conditions.push(condition(
                PROGRAMMED,
                false,
                Reason::DatapathFull,
                message(l.limit, capacity, l.need),
                now_text,
                m.generation,
            ));
        }
    }
    waiting
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    fn service(port: u16) -> ServiceAddr {
        ServiceAddr {
            addr: "10.0.0.1".parse().expect("ip"),
            protocol: Protocol::Tcp,
            port,
        }
    }

    /// A route (by name) asking for services (port, backends each).
    fn demand(route: &'static str, services: &[(u16, u64)]) -> Demand<&'static str> {
        Demand {
            route,
            services: services
                .iter()
                .map(|&(port, backends)| {
                    (
                        service(port),
                        Usage {
                            services: 1,
                            backends,
                        },
                    )
                })
                .collect(),
        }
    }

    fn waiting(a: &Admission<&'static str>) -> Vec<(&'static str, Limit)> {
        a.waiting.iter().map(|&(r, l, _)| (r, l)).collect()
    }

    #[test]
    fn the_oldest_routes_that_fit_are_admitted_whole_and_the_rest_wait_naming_the_limit() {
        let capacity = Capacity {
            services: 3,
            backends: 100,
        };
        // Oldest first: "a" takes two services (a dual-stack Gateway), "b" one; "c"
        // finds the services full, and so does "d" after it.
        let a = admit(
            [
                demand("a", &[(1, 2), (2, 2)]),
                demand("b", &[(3, 1)]),
                demand("c", &[(4, 1)]),
                demand("d", &[(5, 1)]),
            ],
            &capacity,
        );
        assert_eq!(
            waiting(&a),
            [("c", Limit::Services), ("d", Limit::Services)]
        );
        assert_eq!(
            a.used,
            Usage {
                services: 3,
                backends: 5
            }
        );
        // A route is admitted whole or not at all: "a" needs two services, one is left.
        let a = admit(
            [
                demand("x", &[(1, 1), (2, 1)]),
                demand("a", &[(3, 1), (4, 1)]),
            ],
            &capacity,
        );
        assert_eq!(waiting(&a), [("a", Limit::Services)]);
        assert_eq!(
            a.used.services, 2,
            "nothing of the route left out is counted"
        );
    }

    #[test]
    fn a_service_shared_by_several_routes_is_counted_once() {
        let capacity = Capacity {
            services: 2,
            backends: 100,
        };
        // "b" shares service 1 with "a" (and lists it twice itself): it needs only
        // service 2, which fits; "c" would be a third service.
        let a = admit(
            [
                demand("a", &[(1, 3)]),
                demand("b", &[(1, 3), (2, 1), (1, 3)]),
                demand("c", &[(3, 1)]),
                demand("d", &[(2, 1), (1, 3)]),
            ],
            &capacity,
        );
        assert_eq!(waiting(&a), [("c", Limit::Services)]);
        assert_eq!(
            a.used,
            Usage {
                services: 2,
                backends: 4
            },
            "the shared service and its backends count once"
        );
    }

    #[test]
    fn the_backends_limit_leaves_out_a_large_route_while_younger_smaller_ones_fit() {
        let capacity = Capacity {
            services: 100,
            backends: 10,
        };
        let a = admit(
            [
                demand("a", &[(1, 6)]),
                demand("big", &[(2, 5)]),
                demand("small", &[(3, 4)]),
                demand("none", &[(4, 0)]),
                demand("more", &[(5, 1)]),
            ],
            &capacity,
        );
        assert_eq!(
            waiting(&a),
            [("big", Limit::Backends), ("more", Limit::Backends)]
        );
        assert_eq!(a.waiting[0].2.backends, 5, "what it needed is kept");
        assert_eq!(
            a.used,
            Usage {
                services: 3,
                backends: 10
            }
        );
        // Exactly full fits; the services limit is named first when both are passed.
        let both = Capacity {
            services: 1,
            backends: 6,
        };
        let a = admit([demand("a", &[(1, 6)]), demand("b", &[(2, 7)])], &both);
        assert_eq!(waiting(&a), [("b", Limit::Services)]);
    }

    #[test]
    fn the_message_names_the_limit_and_the_option_that_raises_it() {
        let capacity = Capacity {
            services: 2,
            backends: 8,
        };
        let need = Usage {
            services: 1,
            backends: 3,
        };
        let m = message(Limit::Services, &capacity, need);
        assert!(
            m.contains("at most 2 services (berth run --max-services)")
                && m.contains("too few for the 1 this route needs"),
            "{m}"
        );
        let m = message(Limit::Backends, &capacity, need);
        assert!(
            m.contains("at most 8 backends (berth run --max-backends)")
                && m.contains("too few for the 3 this route needs"),
            "{m}"
        );
    }
}
