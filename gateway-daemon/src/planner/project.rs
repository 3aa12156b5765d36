//! The fifth stage: the datapath's desired state. Every bound claim of a Gateway, on
//! each of its addresses, plus each fixed listener's oldest route, one route per
//! service. Services of a Gateway in SNAT mode are marked so, and SNAT flows get the
//! configured source ports minus every listener's.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    ops::RangeInclusive,
    sync::Arc,
};

use crate::{
    datapath::{Capacity, Limit, Usage},
    model::*,
    model::{Backends, DesiredState, ServiceAddr},
};

use super::{
    addresses::Family,
    attach::{holds, Attachments},
    backends::{resolve_backends, Index, Resolved},
    capacity::{self, Demand, Left},
    gateways::{GatewayView, Gateways},
    memo::Remembered,
    RouteKey,
};

/// What the datapath stage reads.
pub(super) struct Context<'p, 'a> {
    pub snap: &'a Snapshot,
    pub gateways: &'p Gateways<'a>,
    pub attachments: &'p Attachments<'a>,
    /// The attachments to each fixed listener, by (Gateway, listener), oldest first.
    pub fixed_attached: &'p BTreeMap<(usize, usize), Vec<usize>>,
    pub claims: &'p [Option<Arc<PortClaim>>],
    /// What the memo remembers of each route, by route index.
    pub known: &'p [Option<&'a Remembered>],
    /// The identity of each route planned (as remembered), by route index.
    pub ids: &'p [Option<Arc<RouteKey>>],
    pub index: &'p Index<'a>,
    /// The source ports SNAT flows may be given (`--snat-ports`).
    pub snat_ports: &'p RangeInclusive<u16>,
    /// The datapath's room for services and backends.
    pub capacity: &'p Capacity,
}

/// A datapath service, and who serves it.
#[derive(Clone, Copy)]
struct Serving {
    service: ServiceAddr,
    /// The index of the route whose backends serve it.
    route: usize,
    /// Its Gateway's index.
    gateway: usize,
    /// Its Gateway's age.
    age: usize,
    /// Whether its Gateway is in SNAT mode.
    snat: bool,
}

/// What the datapath stage decides.
pub(super) struct Projected {
    pub datapath: DesiredState,
    pub owners: super::Owners,
    /// Whether two routes contended for a service (one lost).
    pub contested: bool,
    /// Routes left out for want of room, oldest first.
    pub left: Vec<Left>,
    /// What the services of `datapath` take of the room.
    pub used: Usage,
}

/// The datapath's desired state, and the route whose backends serve each service.
/// `backends` (by route index) are those of the routes planned; the others are
/// resolved here when they serve.
pub(super) fn project(cx: &Context, backends: &mut [Option<Arc<Resolved>>]) -> Projected {
    let snap = cx.snap;
    let mut serving: Vec<Serving> = Vec::with_capacity(cx.claims.len());
    claimed(cx, &mut serving);
    fixed(cx, &mut serving);
    // One route per service. Where Gateways still collide (the claims kept for a
    // Gateway with invalid parameters are not checked against other Gateways), the
    // oldest Gateway's entry wins; within one Gateway a later entry wins, as an insert
    // would (the stable sort keeps the reversed order among equals).
    serving.reverse();
    serving.sort_by_key(|s| (s.service, s.age));
    let all = serving.len();
    serving.dedup_by_key(|s| s.service);
    let contested = serving.len() != all;
    // Every port planned, served or waiting for room, is kept from SNAT flows.
    let snat_ports = snat_ports(
        &cx.gateways.views,
        serving.iter().map(|s| s.service.port),
        cx.snat_ports,
    );
    let with_backends: Vec<(Serving, Backends)> = serving
        .into_iter()
        .map(|s| {
            // A claim kept for a frozen Gateway may name a route without attachments.
            let resolved = backends[s.route].get_or_insert_with(|| {
                Arc::new(resolve_backends(&snap.routes[s.route], snap, cx.index))
            });
            // A service of a family is served by the endpoints of that family only.
            let family = Family::of(&s.service.addr);
            (s, resolved.backends(family).clone())
        })
        .collect();
    let (with_backends, left, used) = fit(cx, with_backends);
    let source_nat = with_backends
        .iter()
        .filter(|(s, _)| s.snat)
        .map(|(s, _)| s.service)
        .collect();
    let owners: super::Owners = with_backends
        .iter()
        .map(|(s, _)| {
            let id = match (cx.known[s.route], &cx.ids[s.route]) {
                (Some(k), _) => Arc::clone(&k.id),
                (None, Some(id)) => Arc::clone(id),
                (None, None) => Arc::new(RouteKey::of(&snap.routes[s.route])),
            };
            (s.service, id)
        })
        .collect();
    let services = with_backends
        .into_iter()
        .map(|(s, backends)| (s.service, backends))
        .collect();
    Projected {
        datapath: DesiredState {
            services,
            source_nat,
            snat_ports,
            // Filled once the plan is made (`traffic`).
            traffic: Default::default(),
        },
        owners,
        contested,
        left,
        used,
    }
}

/// The services of the routes that fit the datapath (`capacity::admit`, oldest route
/// first), the routes left out, and what the services kept take.
fn fit(
    cx: &Context,
    serving: Vec<(Serving, Backends)>,
) -> (Vec<(Serving, Backends)>, Vec<Left>, Usage) {
    let usage: Vec<Usage> = serving.iter().map(|(_, b)| Usage::of_service(b)).collect();
    let total = usage.iter().fold(Usage::default(), |a, &u| a.plus(u));
    let addresses: BTreeSet<IpAddr> = serving.iter().map(|(s, _)| s.service.addr).collect();
    let most = cx.capacity.of_limit(Limit::Addresses) as usize;
    let addresses_fit = [false, true]
        .iter()
        .all(|&v6| addresses.iter().filter(|a| a.is_ipv6() == v6).count() <= most);
    if total.exceeds(cx.capacity).is_none() && addresses_fit {
        return (serving, Vec::new(), total);
    }
    // The services of each route together, oldest route first.
    let mut rank = vec![usize::MAX; cx.snap.routes.len()];
    for (i, &ri) in cx.attachments.order.iter().enumerate() {
        rank[ri] = i;
    }
    let mut by_age: Vec<usize> = (0..serving.len()).collect();
    by_age.sort_by_key(|&i| (rank[serving[i].0.route], i));
    let routes: Vec<&[usize]> = by_age
        .chunk_by(|&a, &b| serving[a].0.route == serving[b].0.route)
        .collect();
    let demands = routes.iter().enumerate().map(|(at, chunk)| Demand {
        route: at,
        services: chunk
            .iter()
            .map(|&i| (serving[i].0.service, usage[i]))
            .collect(),
    });
    let admission = capacity::admit(demands, cx.capacity);
    let mut waits = vec![false; cx.snap.routes.len()];
    let left = admission
        .waiting
        .iter()
        .map(|&(at, limit, need)| {
            let chunk = routes[at];
            let ri = serving[chunk[0]].0.route;
            waits[ri] = true;
            let mut gateways: Vec<usize> = chunk.iter().map(|&i| serving[i].0.gateway).collect();
            gateways.sort_unstable();
            gateways.dedup();
            Left {
                route: ri,
                limit,
                need,
                gateways,
            }
        })
        .collect();
    let kept = serving
        .into_iter()
        .filter(|(s, _)| !waits[s.route])
        .collect();
    (kept, left, admission.used)
}

/// Every bound claim of a Gateway, on each of its addresses. The backends of a service
/// are those of the last route of the claim's identity.
fn claimed(cx: &Context, serving: &mut Vec<Serving>) {
    let attachments = &cx.attachments.list;
    // The attachment each claim serves (its Gateway and route, without looking them up).
    let mut holder: Vec<Option<usize>> = vec![None; cx.claims.len()];
    for (ai, a) in attachments.iter().enumerate() {
        if let Some(ci) = a.claim {
            holder[ci] = Some(ai);
        }
    }
    for (ci, claim) in cx.claims.iter().enumerate() {
        let Some(claim) = claim else {
            continue;
        };
        if claim.is_released() {
            continue;
        }
        let (gi, route) = match holder[ci].map(|ai| &attachments[ai]) {
            Some(a) if !cx.attachments.given_twice[a.route_index] => (
                Some(a.gw),
                holds(&claim.spec.route, a.route).then_some(a.route_index),
            ),
            _ => (
                cx.gateways
                    .index(claim.metadata.ns(), claim.spec.gateway.as_str()),
                cx.attachments
                    .route_named(&claim.spec.route, &cx.snap.routes),
            ),
        };
        let (Some(gi), Some(protocol), Some(ri)) =
            (gi, Protocol::parse(&claim.spec.protocol), route)
        else {
            continue;
        };
        serve(serving, cx, gi, protocol, claim.spec.port, ri);
    }
}

/// Each fixed listener's oldest route, on each address of its Gateway.
fn fixed(cx: &Context, serving: &mut Vec<Serving>) {
    for (&(gi, li), list) in cx.fixed_attached {
        let gw = &cx.gateways.views[gi];
        let l = &gw.listeners[li];
        let (Some(protocol), Some(&oldest)) = (l.protocol, list.first()) else {
            continue;
        };
        // Its port belongs to an older Gateway's listener on a shared address.
        if !l.yielded.is_empty() {
            continue;
        }
        serve(
            serving,
            cx,
            gi,
            protocol,
            l.spec.port,
            cx.attachments.list[oldest].route_index,
        );
    }
}

/// `port` on each address Gateway `gi` serves, by route `ri`.
fn serve(
    serving: &mut Vec<Serving>,
    cx: &Context,
    gi: usize,
    protocol: Protocol,
    port: u16,
    ri: usize,
) {
    let gw = &cx.gateways.views[gi];
    for &addr in &gw.addresses.served {
        serving.push(Serving {
            service: ServiceAddr {
                addr,
                protocol,
                port,
            },
            route: ri,
            gateway: gi,
            age: gw.age,
            snat: gw.source_nat,
        });
    }
}

/// The configured SNAT ports (`snat`) minus the ports of every listener of every
/// Gateway (a range listener's whole range, TCP and UDP alike, whatever its address)
/// and of every service `served` (a claim kept for a Gateway whose ranges are void), as
/// ascending non-overlapping ranges: a node port never takes a listener's.
/// The ports listener `l` serves: its range, or its port.
pub(super) fn ports_of(l: &super::gateways::ListenerView) -> RangeInclusive<u16> {
    let (first, last) = l.range.unwrap_or((l.spec.port, l.spec.port));
    first..=last
}

pub(super) fn snat_ports(
    gateways: &[GatewayView],
    served: impl Iterator<Item = u16>,
    snat: &RangeInclusive<u16>,
) -> Vec<RangeInclusive<u16>> {
    // One bit per port.
    let mut taken = vec![0u64; 1 << 10];
    let mut take = |p: u16| taken[usize::from(p >> 6)] |= 1 << (p & 63);
    served.for_each(&mut take);
    for l in gateways.iter().flat_map(|gw| &gw.listeners) {
        ports_of(l).for_each(&mut take);
    }
    let is_taken = |p: u16| taken[usize::from(p >> 6)] & (1 << (p & 63)) != 0;
    let mut free = Vec::new();
    let mut run: Option<(u16, u16)> = None;
    for p in snat.clone() {
        match (is_taken(p), &mut run) {
            (false, Some((_, end))) => *end = p,
            (false, None) => run = Some((p, p)),
            (true, _) => free.extend(run.take().map(|(a, b)| a..=b)),
        }
    }
    free.extend(run.map(|(a, b)| a..=b));
    free
}
