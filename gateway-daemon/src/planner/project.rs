//! The fifth stage: the datapath's desired state. Every bound claim of a Gateway, on
//! each of its addresses, plus each fixed listener's oldest route, one route per
//! service. Services of a Gateway in SNAT mode are marked so, and SNAT flows get the
//! configured source ports minus every listener's.

use std::{collections::BTreeMap, ops::RangeInclusive, sync::Arc};

use crate::{
    datapath::{DesiredState, ServiceAddr},
    model::*,
};

use super::{
    addresses::Family,
    attach::{holds, Attachments},
    backends::{resolve_backends, Index, Resolved},
    gateways::{GatewayView, Gateways},
    memo::Remembered,
    route_status::route_id,
    RouteId,
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
    pub index: &'p Index<'a>,
    /// The source ports SNAT flows may be given (`--snat-ports`).
    pub snat_ports: &'p RangeInclusive<u16>,
}

/// (datapath service, index of the route whose backends serve it, its Gateway's age,
/// whether its Gateway is in SNAT mode)
type Serving = (ServiceAddr, usize, usize, bool);

/// What the datapath stage decides.
pub(super) struct Projected {
    pub datapath: DesiredState,
    pub owners: BTreeMap<ServiceAddr, Arc<RouteId>>,
    /// Whether two routes contended for a service (one lost).
    pub contested: bool,
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
    serving.sort_by_key(|&(service, _, age, _)| (service, age));
    let all = serving.len();
    serving.dedup_by_key(|&mut (service, _, _, _)| service);
    let contested = serving.len() != all;
    let source_nat = serving
        .iter()
        .filter(|&&(_, _, _, snat)| snat)
        .map(|&(service, _, _, _)| service)
        .collect();
    let snat_ports = snat_ports(
        &cx.gateways.views,
        serving.iter().map(|(service, _, _, _)| service.port),
        cx.snat_ports,
    );
    let owners: BTreeMap<ServiceAddr, Arc<RouteId>> = serving
        .iter()
        .map(|&(service, ri, _, _)| {
            let id = match cx.known[ri] {
                Some(k) => Arc::clone(&k.id),
                None => Arc::new(route_id(&snap.routes[ri])),
            };
            (service, id)
        })
        .collect();
    let services = serving
        .into_iter()
        .map(|(service, ri, _, _)| {
            // A claim kept for a frozen Gateway may name a route without attachments.
            let resolved = backends[ri].get_or_insert_with(|| {
                Arc::new(resolve_backends(&snap.routes[ri], snap, cx.index))
            });
            // A service of a family is served by the endpoints of that family only.
            let family = Family::of(&service.addr);
            (service, resolved.backends(family).clone())
        })
        .collect();
    Projected {
        datapath: DesiredState {
            services,
            source_nat,
            snat_ports,
        },
        owners,
        contested,
    }
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
        let Some(gw) = gi.map(|gi| &cx.gateways.views[gi]) else {
            continue;
        };
        let (Some(protocol), Some(ri)) = (Protocol::parse(&claim.spec.protocol), route) else {
            continue;
        };
        serve(serving, gw, protocol, claim.spec.port, ri);
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
            gw,
            protocol,
            l.spec.port,
            cx.attachments.list[oldest].route_index,
        );
    }
}

/// `port` on each address `gw` serves, by route `ri`.
fn serve(serving: &mut Vec<Serving>, gw: &GatewayView, protocol: Protocol, port: u16, ri: usize) {
    for &addr in &gw.addresses.served {
        serving.push((
            ServiceAddr {
                addr,
                protocol,
                port,
            },
            ri,
            gw.age,
            gw.source_nat,
        ));
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
