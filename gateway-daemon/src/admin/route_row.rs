//! One route's rows of `berth get routes`: a [`RouteRow`] per listener each parent is
//! served on, its claim, services, backends and traffic looked up in the published
//! snapshot, and what the operator should look at about it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{
    datapath::Traffic,
    model::{claim_name, PortClaim, Protocol, RouteKey, ServiceAddr},
    planner::{status::RouteParentStatus, Family, RouteEntry, ServedOn},
    publish::Published,
    state_document::StateDocument,
};

/// One row of `berth get routes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: String,
    /// Gateway.
    pub gateway: String,
    /// Listener (of the claim), if any.
    pub listener: String,
    /// Assigned port, if any.
    pub port: Option<u16>,
    /// The gateway addresses the port is served on (none while it is not in the
    /// datapath).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<std::net::IpAddr>,
    /// Accepted condition status and reason.
    pub accepted: String,
    /// Backend endpoints in the datapath for this port that take new flows (those
    /// not ready or terminating keep their established flows only).
    pub backends: usize,
    /// First seen (RFC 3339), if known.
    pub created: Option<String>,
    /// Packets to and from the route's port, counted by the XDP program.
    #[serde(default)]
    pub packets: u64,
    /// Bytes to and from the route's port.
    #[serde(default)]
    pub bytes: u64,
    /// Tracked flows of the route's port that forwarded a packet in the last minute.
    #[serde(default)]
    pub active_flows: u64,
    /// Of those, the flows in SNAT mode.
    #[serde(default)]
    pub snat_flows: u64,
    /// TCP connections still on backends that left the route's Services (kept until
    /// they end).
    #[serde(default)]
    pub removed_backend_flows: u64,
    /// How the route's services forward: "snat" (GatewayConfig sourceNAT: true) or
    /// "router" (the backends see the client's address).
    #[serde(default)]
    pub mode: String,
    /// The path of the traffic of every route on the route's addresses together, where
    /// it is the route's own (`berth get routes` then leaves the reason to `berth get
    /// addresses`, said once per address); empty otherwise.
    #[serde(default)]
    pub address_path: String,
    /// Packets from the backends back to clients (reverse NAT).
    #[serde(default)]
    pub reply_packets: u64,
    /// Packets the kernel forwarded instead of XDP (either direction).
    #[serde(default)]
    pub kernel_packets: u64,
    /// How the route's packets leave: "xdp", "kernel: <why>", or "-" before any.
    #[serde(default)]
    pub path: String,
    /// Something the operator should look at (e.g. packets forwarded, no replies).
    #[serde(default)]
    pub warning: Option<String>,
}

/// Packets forwarded without any reply for this long make a route flagged.
pub const UNANSWERED_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// The warning of a route whose packets go unanswered, if they do.
/// How long a route's packets have been forwarded without a reply, once that is
/// [`UNANSWERED_AFTER`] or more.
pub fn unanswered_for(t: &crate::datapath::Traffic) -> Option<Duration> {
    let since = t.unanswered_since?.elapsed();
    (since >= UNANSWERED_AFTER).then_some(since)
}

/// What [`unanswered_for`] means for a route in SNAT mode or router mode.
pub fn unanswered(t: &crate::datapath::Traffic, snat: bool) -> Option<String> {
    let since = unanswered_for(t)?;
    let why = if snat {
        "in SNAT mode the backends answer the node's address toward them: are they up, \
         and does their traffic leave and come back through the interfaces Berth is attached to?"
    } else {
        "in router mode the backends must route replies back through the gateway"
    };
    Some(format!(
        "packets forwarded for {}s without a reply through the gateway: {why}",
        since.as_secs()
    ))
}

/// Hands the rows of route `r` to `emit`: one per listener each parent is served on (a
/// range port, a fixed listener), one saying why for a parent served on none.
pub(super) fn rows_of(
    p: &Published,
    state: &StateDocument,
    r: &RouteEntry,
    mut emit: impl FnMut(RouteRow),
) {
    for (i, parent) in r.status.parents.iter().enumerate() {
        match r.served_on.get(i).map(Vec::as_slice).unwrap_or_default() {
            [] => emit(row(p, state, r, parent, None)),
            on => on
                .iter()
                .for_each(|s| emit(row(p, state, r, parent, Some(s)))),
        }
    }
}

/// The row of one route's parent on listener `on` (none: the parent is not served):
/// its claim and datapath service are looked up by the names they must have.
fn row(
    p: &Published,
    state: &StateDocument,
    r: &RouteEntry,
    parent: &RouteParentStatus,
    on: Option<&ServedOn>,
) -> RouteRow {
    let pr = &parent.parent_ref;
    // Rows of fixed listeners once showed no listener, port or traffic: their
    // parentRef has no port, so the port is the listener's.
    let port = on.map(|s| s.port).or(pr.port);
    let names = Names {
        key: RouteKey {
            kind: r.kind,
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        },
        gateway_namespace: pr.namespace.as_deref().unwrap_or(&r.namespace),
        gateway: &pr.name,
        protocol: r.kind.protocol(),
    };
    let claim = port.and_then(|port| claim_of(state, &names, port));
    let (services, shadowed_by) = port
        .and_then(|port| services_of(p, state, &names, port))
        .unwrap_or_default();
    let by_family = endpoints_by_family(p, &services);
    let snat = services.iter().any(|s| p.datapath.source_nat.contains(s));
    let traffic = traffic_of(p, &services);
    let path = traffic.path().unwrap_or_else(|| "-".into());
    let condition = |kind: &str| parent.conditions.iter().find(|c| c.kind == kind);
    let warning = warnings(Warned {
        p,
        services: &services,
        by_family: &by_family,
        traffic: &traffic,
        shadowed_by: shadowed_by.filter(|_| services.is_empty()),
        resolved: condition("ResolvedRefs"),
        programmed: condition(crate::planner::capacity::PROGRAMMED),
    });
    RouteRow {
        namespace: r.namespace.to_string(),
        name: r.name.to_string(),
        kind: r.kind.name().to_string(),
        gateway: pr.name.to_string(),
        listener: on
            .map(|s| s.listener.to_string())
            .or_else(|| claim.map(|c| c.spec.listener.to_string()))
            .or_else(|| pr.section_name.as_ref().map(ToString::to_string))
            .unwrap_or_default(),
        port,
        addresses: services.iter().map(|s| s.addr).collect(),
        accepted: condition("Accepted")
            .map(|c| format!("{} ({})", c.status, c.reason))
            .unwrap_or_default(),
        backends: by_family.iter().map(|(_, n)| n).sum(),
        created: r.created.map(|t| t.to_string()),
        packets: traffic.stats.packets + traffic.stats.reply_packets,
        bytes: traffic.stats.bytes + traffic.stats.reply_bytes,
        active_flows: traffic.active_flows,
        snat_flows: traffic.snat_flows,
        removed_backend_flows: traffic.removed_backend_flows,
        mode: if snat { "snat" } else { "router" }.to_string(),
        reply_packets: traffic.stats.reply_packets,
        kernel_packets: traffic.stats.kernel_packets,
        address_path: address_path(p, &services, &path),
        path,
        warning,
    }
}

/// The names a route's parent is looked up by: its claim's and its services'.
struct Names<'a> {
    /// The route, as the datapath's services' owners name it.
    key: RouteKey,
    gateway_namespace: &'a str,
    gateway: &'a str,
    protocol: Protocol,
}

/// The claim of the parent's `port`, if it is the route's.
fn claim_of<'a>(state: &'a StateDocument, names: &Names, port: u16) -> Option<&'a PortClaim> {
    let name = claim_name(names.gateway, &names.protocol.to_string(), port);
    let i = state
        .claims
        .binary_search_by(|c| {
            (c.metadata.ns(), c.metadata.name.as_str()).cmp(&(names.gateway_namespace, &name))
        })
        .ok()?;
    let c = &state.claims[i];
    (c.spec.route.key().as_ref() == Some(&names.key)).then_some(&**c)
}

/// The route's services on `port`: one per address its Gateway is served on (none
/// without the Gateway); and the route served on one of them instead, if one is.
fn services_of(
    p: &Published,
    state: &StateDocument,
    names: &Names,
    port: u16,
) -> Option<(Vec<ServiceAddr>, Option<String>)> {
    let g = state
        .gateways
        .binary_search_by(|g| {
            (g.namespace.as_str(), g.name.as_str()).cmp(&(names.gateway_namespace, names.gateway))
        })
        .ok()?;
    let mut shadowed_by = None;
    let services = state.gateways[g]
        .status
        .addresses
        .iter()
        .filter_map(|a| a.value.parse().ok())
        .map(|addr| ServiceAddr {
            addr,
            protocol: names.protocol,
            port,
        })
        .filter(|s| match p.owners.get(s) {
            Some(o) if **o == names.key => true,
            Some(o) => {
                shadowed_by.get_or_insert_with(|| format!("{}/{}", o.namespace, o.name));
                false
            }
            None => false,
        })
        .collect();
    Some((services, shadowed_by))
}

/// The backend endpoints in the datapath that take new flows, per family of `services`
/// served.
fn endpoints_by_family<'a>(
    p: &Published,
    services: &'a [ServiceAddr],
) -> Vec<(&'a ServiceAddr, usize)> {
    // The endpoints of each family (those of its first address: every address of a
    // family has the same).
    let of_family = |family: Family| {
        services
            .iter()
            .find(|s| Family::of(&s.addr) == family)
            .map(|s| {
                (
                    s,
                    p.datapath
                        .services
                        .get(s)
                        .map_or(0, |b| b.iter().filter(|w| w.weight > 0).count()),
                )
            })
    };
    Family::ALL.into_iter().filter_map(of_family).collect()
}

/// The traffic of `services`, together.
fn traffic_of(p: &Published, services: &[ServiceAddr]) -> Traffic {
    services
        .iter()
        .filter_map(|s| p.traffic.get(s))
        .fold(Traffic::default(), |a, t| a.plus(t))
}

/// `path` where the traffic of every route on the route's addresses together takes it
/// (`berth get routes` then leaves the reason to `berth get addresses`), else empty.
fn address_path(p: &Published, services: &[ServiceAddr], path: &str) -> String {
    services
        .iter()
        .all(|s| {
            let together = p.address_paths.get(&(s.addr, s.protocol));
            together.is_some_and(|t| t == path)
        })
        .then(|| path.to_string())
        .filter(|_| !services.is_empty())
        .unwrap_or_default()
}

/// What [`warnings`] looks at for one row.
struct Warned<'a> {
    p: &'a Published,
    services: &'a [ServiceAddr],
    by_family: &'a [(&'a ServiceAddr, usize)],
    traffic: &'a crate::datapath::Traffic,
    /// The older route served on the row's port instead (GEP-2644), if one is.
    shadowed_by: Option<String>,
    /// The parent's ResolvedRefs condition.
    resolved: Option<&'a crate::planner::status::Condition>,
    /// The parent's Programmed condition (present while the datapath has no room).
    programmed: Option<&'a crate::planner::status::Condition>,
}

/// What the operator should look at about a route's services, if anything: not
/// programmed for want of room in the datapath, an older route served on its port
/// instead, no backend at all, those the datapath holds back, a family served without
/// endpoints beside one with, packets unanswered.
fn warnings(w: Warned) -> Option<String> {
    let Warned {
        p,
        services,
        by_family,
        traffic,
        shadowed_by,
        resolved,
        programmed,
    } = w;
    let mut out: Vec<String> = Vec::new();
    // Its message says which limit, and the option that raises it.
    out.extend(
        programmed
            .filter(|c| c.status == "False")
            .map(|c| c.message.to_string()),
    );
    if let Some(older) = shadowed_by {
        out.push(format!(
            "an older route, {older}, gets the traffic of this port (only the oldest route \
             of a listener is served)"
        ));
    }
    // A served route without a single backend was once silent (an unnamed Service port
    // unmatched): its packets are dropped, so it is always said.
    if !services.is_empty() && by_family.iter().all(|&(_, n)| n == 0) {
        let why = resolved.map_or("", |c| &*c.message);
        out.push(format!("no backends: packets to it are dropped ({why})"));
    }
    out.extend(services.iter().filter_map(|s| {
        let i = p.held_back.binary_search_by(|h| h.service.cmp(s)).ok()?;
        Some(format!("{s} is held back: {}", p.held_back[i].why))
    }));
    if by_family.iter().any(|&(_, n)| n > 0) {
        out.extend(by_family.iter().filter(|&&(_, n)| n == 0).map(|(s, _)| {
            let family = Family::of(&s.addr);
            format!("no {family} endpoints: {family} clients of {s} get no backend")
        }));
    }
    out.extend(services.iter().flat_map(|s| {
        let backends = p
            .datapath
            .services
            .get(s)
            .map(|b| b.as_slice())
            .unwrap_or_default();
        backends.iter().filter_map(|b| {
            let iface = p.snat_egress.get(&b.endpoint)?;
            Some(format!(
                "SNAT traffic to {} leaves out of {iface}, which refused Berth's programs (the \
                 daemon's log says why): packets the kernel forwards there keep the client's \
                 source",
                b.endpoint
            ))
        })
    }));
    let snat = services.iter().any(|s| p.datapath.source_nat.contains(s));
    out.extend(unanswered(traffic, snat));
    out.extend(services.iter().filter_map(|s| {
        crate::host_listeners::conflict(&p.host_listeners, s.protocol, s.addr, s.port)
    }));
    (!out.is_empty()).then(|| out.join("; "))
}
