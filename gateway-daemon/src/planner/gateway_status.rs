//! The last stage: the status of every Gateway of ours and of its listeners, and how
//! full each range listener is.

use std::sync::Arc;

use crate::model::*;

use super::Reason;
use super::{
    attach::{Attach, Attachments},
    condition,
    gateways::{GatewayView, Gateways, ListenerView},
    ledger::ClaimIndex,
    overlaps,
    status::*,
    GatewayEntry, Input, ListenerUsage, EPHEMERAL_PORT_OVERLAP,
};

/// What the Gateway status stage reads.
pub(super) struct Context<'p, 'a> {
    pub input: &'p Input<'a>,
    pub gateways: &'p Gateways<'a>,
    pub attachments: &'p Attachments<'a>,
    /// The attachments to each fixed listener, by (Gateway, listener), oldest first.
    pub fixed_attached: &'p std::collections::BTreeMap<(usize, usize), Vec<usize>>,
    pub claims: &'p [Option<Arc<PortClaim>>],
    /// The claims of the routes not planned, when only some are.
    pub others: Option<&'p ClaimIndex>,
    pub now_text: &'p Time,
}

/// The status of every Gateway of ours.
pub(super) fn gateway_statuses(cx: &Context) -> Vec<GatewayEntry> {
    let mut gateway_entries = Vec::new();
    for (gi, gw) in cx.gateways.views.iter().enumerate() {
        let generation = gw.spec.metadata.generation;
        let accepted = gateway_accepted(gw, cx.now_text, generation);
        let accepted_ok = accepted.status == "True";
        let conditions = vec![
            accepted,
            programmed(gw, accepted_ok, cx.now_text, generation),
        ];
        let listeners = gw
            .listeners
            .iter()
            .enumerate()
            .map(|(li, l)| cx.listener_status(gi, gw, li, l))
            .collect();
        // Only the addresses served: the unserved ones are named in `Programmed`.
        let addresses = gw
            .addresses
            .served
            .iter()
            .map(|a| GatewayStatusAddress {
                kind: "IPAddress".to_string(),
                value: a.to_string(),
            })
            .collect();
        let (namespace, name) = gw.key();
        gateway_entries.push(GatewayEntry {
            namespace,
            name,
            status: GatewayStatus {
                addresses,
                conditions,
                listeners,
            },
        });
    }
    gateway_entries
}

impl Context<'_, '_> {
    /// Routes accepted for fixed listener `li` of Gateway `gi` (upstream counts only
    /// accepted routes in `attachedRoutes`).
    fn accepted_on(&self, gi: usize, li: usize) -> usize {
        self.fixed_attached.get(&(gi, li)).map_or(0, |list| {
            list.iter()
                .filter(|&&ai| {
                    let a = &self.attachments.list[ai];
                    let port = a.claim.and_then(|ci| self.claims[ci].as_ref()).is_some();
                    matches!(&*a.attach, Attach::Listeners { fixed, .. }
                        if serves(&self.gateways.views[a.gw], fixed, port))
                })
                .count()
        })
    }

    /// The status of listener `l` (number `li`) of Gateway `gw` (number `gi`).
    fn listener_status(
        &self,
        gi: usize,
        gw: &GatewayView,
        li: usize,
        l: &ListenerView,
    ) -> ListenerStatus {
        let generation = gw.spec.metadata.generation;
        let attached = match l.range {
            Some(_) => {
                self.claims
                    .iter()
                    .flatten()
                    .filter(|c| {
                        c.metadata.ns() == gw.spec.metadata.ns()
                            && c.spec.gateway == gw.spec.metadata.name
                            && c.spec.listener == l.spec.name
                            && c.is_bound()
                    })
                    .count()
                    + self.others.map_or(0, |o| o.counts(gi, li).0 as usize)
            }
            None => self.accepted_on(gi, li),
        };
        let ephemeral = self
            .input
            .ephemeral_ports
            .as_ref()
            .and_then(|e| overlaps::ephemeral_overlap(l, e));
        let kinds = route_kinds(l);
        let mut conditions = listener_conditions(
            l,
            &kinds,
            gw.params_error.is_none(),
            self.now_text,
            generation,
        );
        conditions.extend(ephemeral.map(|(ports, within)| {
            condition(
                EPHEMERAL_PORT_OVERLAP,
                true,
                Reason::OverlapsEphemeralPorts,
                overlaps::ephemeral_message(&ports, &within),
                self.now_text,
                generation,
            )
        }));
        ListenerStatus {
            name: l.spec.name.clone(),
            supported_kinds: kinds.supported,
            attached_routes: attached as i32,
            conditions,
        }
    }
}

/// A Gateway's `Programmed` condition: served on at least one address, or why not.
/// Addresses it asked for but cannot have are named in the message either way.
fn programmed(gw: &GatewayView, accepted: bool, now: &Time, generation: Option<i64>) -> Condition {
    let a = &gw.addresses;
    if !accepted {
        let message = "the Gateway is not accepted";
        return condition(
            "Programmed",
            false,
            Reason::Invalid,
            message,
            now,
            generation,
        );
    }
    if a.served.is_empty() && a.unserved.is_empty() {
        let message = "spec.addresses has no IP address, and --address gives no default";
        return condition(
            "Programmed",
            false,
            Reason::AddressNotAssigned,
            message,
            now,
            generation,
        );
    }
    if a.served.is_empty() {
        let message = format!(
            "no address of spec.addresses can be served: {}; give the Gateway an IP address (type IPAddress)",
            a.unserved_list()
        );
        return condition(
            "Programmed",
            false,
            Reason::AddressNotUsable,
            message,
            now,
            generation,
        );
    }
    let mut message = format!("serving on {}", a.served_list());
    if !a.unserved.is_empty() {
        message.push_str(&format!("; not serving on {}", a.unserved_list()));
    }
    if !gw.listeners.iter().any(listener_serves) {
        message.push_str("; no listener Berth serves (TCP or UDP), so no port is open");
    }
    condition(
        "Programmed",
        true,
        Reason::Programmed,
        message,
        now,
        generation,
    )
}

/// Whether a listener is accepted: its protocol is supported and no port of it is
/// in conflict with an older Gateway's listener on a shared address.
fn listener_accepted(l: &ListenerView) -> bool {
    l.protocol.is_some() && l.yielded.is_empty()
}

/// Whether a listener serves some port: its protocol is supported and not every port
/// of it belongs to an older Gateway's listener.
fn listener_serves(l: &ListenerView) -> bool {
    l.protocol.is_some() && !l.fully_yielded()
}

/// A Gateway's `Accepted` condition. Gateway API: a Gateway with listeners that are not
/// accepted (conflicted, or of an unsupported protocol) says `ListenersNotValid`, and
/// naming them; it is accepted while some listener still serves, and rejected as a
/// whole when none does.
fn gateway_accepted(gw: &GatewayView, now: &Time, generation: Option<i64>) -> Condition {
    if let Some(e) = &gw.params_error {
        return condition(
            "Accepted",
            false,
            Reason::InvalidParameters,
            e.clone(),
            now,
            generation,
        );
    }
    let invalid: Vec<String> = gw
        .listeners
        .iter()
        .filter(|l| !listener_accepted(l))
        .map(|l| {
            let why = match (l.protocol.is_some(), listener_serves(l)) {
                (false, _) => format!("protocol {} is not supported", l.spec.protocol),
                (true, false) => "its ports belong to an older Gateway".to_string(),
                (true, true) => {
                    "some ports belong to an older Gateway; the others still serve".to_string()
                }
            };
            format!("{} ({why})", l.spec.name)
        })
        .collect();
    if invalid.is_empty() {
        return condition(
            "Accepted",
            true,
            Reason::Accepted,
            "accepted by Berth",
            now,
            generation,
        );
    }
    // Rejected as a whole only when its conflicts leave no listener (Gateway API: at
    // least one distinct listener must be present). Listeners of a protocol Berth does
    // not serve do not reject it: the conformance suite's base Gateways have only HTTP
    // listeners and must be Accepted and Programmed before any TCP or UDP test starts.
    let serving = gw.listeners.iter().any(listener_serves);
    let conflicted = gw
        .listeners
        .iter()
        .any(|l| l.protocol.is_some() && !l.yielded.is_empty());
    let ok = serving || !conflicted;
    let mut message = format!(
        "listeners not accepted (see their conditions): {}",
        invalid.join(", ")
    );
    let valid: Vec<&str> = gw
        .listeners
        .iter()
        .filter(|l| listener_accepted(l))
        .map(|l| l.spec.name.as_str())
        .collect();
    if !valid.is_empty() {
        message.push_str(&format!("; accepted: {}", valid.join(", ")));
    }
    if !serving {
        message.push_str("; no listener serves");
    }
    condition(
        "Accepted",
        ok,
        Reason::ListenersNotValid,
        message,
        now,
        generation,
    )
}

/// A listener's `Accepted`, `Programmed`, `ResolvedRefs` and `Conflicted` conditions.
/// A listener some of whose ports an older Gateway's listener serves on a shared
/// address is `Conflicted=True, ProtocolConflict` and `Accepted=False, PortUnavailable`
/// (see `overlaps`); the ports outside the conflict keep serving their routes (a bound
/// claim does not move while its route attaches), and `Programmed` says so.
fn listener_conditions(
    l: &ListenerView,
    kinds: &RouteKinds,
    gateway_ok: bool,
    now: &Time,
    generation: Option<i64>,
) -> Vec<Condition> {
    let range_note = l
        .range
        .map(|(a, b)| format!(" (ports {a}-{b})"))
        .unwrap_or_default();
    let accepted = if l.protocol.is_none() {
        condition(
            "Accepted",
            false,
            Reason::UnsupportedProtocol,
            format!(
                "protocol {} is not supported; use TCP or UDP",
                l.spec.protocol
            ),
            now,
            generation,
        )
    } else if !l.yielded.is_empty() {
        condition(
            "Accepted",
            false,
            Reason::PortUnavailable,
            overlaps::conflict_message(l),
            now,
            generation,
        )
    } else {
        condition(
            "Accepted",
            true,
            Reason::Accepted,
            format!("listener accepted{range_note}"),
            now,
            generation,
        )
    };
    let programmed = match (gateway_ok && listener_serves(l), l.yielded.is_empty()) {
        _ if l.protocol.is_some() && kinds.supported.is_empty() => condition(
            "Programmed",
            false,
            Reason::Invalid,
            "allowedRoutes.kinds allows no route kind this listener can serve",
            now,
            generation,
        ),
        (true, true) => condition("Programmed", true, Reason::Programmed, "", now, generation),
        (true, false) => condition(
            "Programmed",
            true,
            Reason::Programmed,
            overlaps::kept_message(l),
            now,
            generation,
        ),
        (false, _) => {
            let why = match (l.protocol.is_some(), gateway_ok) {
                (false, _) => format!("protocol {} is not served", l.spec.protocol),
                (true, false) => "the Gateway is not accepted".to_string(),
                (true, true) => "its ports belong to an older Gateway".to_string(),
            };
            condition("Programmed", false, Reason::Invalid, why, now, generation)
        }
    };
    let conflicted = match l.yielded.is_empty() {
        true => condition(
            "Conflicted",
            false,
            Reason::NoConflicts,
            "",
            now,
            generation,
        ),
        // Upstream's reasons are HostnameConflict and ProtocolConflict; TCP and UDP
        // listeners are told apart by port alone, so a port two of them share is a
        // ProtocolConflict (as Envoy Gateway reports it for layer-4 listeners).
        false => condition(
            "Conflicted",
            true,
            Reason::ProtocolConflict,
            overlaps::conflict_message(l),
            now,
            generation,
        ),
    };
    let resolved = match kinds.invalid.is_empty() {
        true => condition(
            "ResolvedRefs",
            true,
            Reason::ResolvedRefs,
            "",
            now,
            generation,
        ),
        false => condition(
            "ResolvedRefs",
            false,
            Reason::InvalidRouteKinds,
            format!(
                "allowedRoutes.kinds names kinds a {} listener cannot serve: {}",
                l.spec.protocol,
                kinds.invalid.join(", ")
            ),
            now,
            generation,
        ),
    };
    vec![accepted, programmed, resolved, conflicted]
}

/// The route kinds of a listener: those it serves (`supportedKinds`) and those its
/// `allowedRoutes.kinds` names but it cannot serve.
struct RouteKinds {
    supported: Vec<RouteGroupKind>,
    /// `group/kind` of each kind named that the listener cannot serve.
    invalid: Vec<String>,
}

/// The route kinds of listener `l`: its protocol's kind (TCPRoute for TCP, UDPRoute for
/// UDP, none for any other), narrowed by `allowedRoutes.kinds`. Gateway API: kinds
/// named that are not supported make `ResolvedRefs=False, InvalidRouteKinds` and are
/// left out of `supportedKinds`, which lists the valid ones only (none if none is).
fn route_kinds(l: &ListenerView) -> RouteKinds {
    let native = match l.protocol {
        Some(Protocol::Tcp) => Some("TCPRoute"),
        Some(Protocol::Udp) => Some("UDPRoute"),
        None => None,
    };
    let kind = |k: &str| RouteGroupKind {
        group: Some(GATEWAY_GROUP.to_string()),
        kind: k.to_string(),
    };
    let named = l.spec.allowed_kinds();
    if named.is_empty() {
        return RouteKinds {
            supported: native.map(kind).into_iter().collect(),
            invalid: Vec::new(),
        };
    }
    let mut out = RouteKinds {
        supported: Vec::new(),
        invalid: Vec::new(),
    };
    for k in named {
        let group = k.group.as_deref().unwrap_or(GATEWAY_GROUP);
        if group == GATEWAY_GROUP && Some(k.kind.as_str()) == native {
            if out.supported.is_empty() {
                out.supported.push(kind(&k.kind));
            }
            continue;
        }
        let group = if group.is_empty() { "core" } else { group };
        out.invalid.push(format!("{group}/{}", k.kind));
    }
    out
}

/// Whether a route attached to fixed listeners `fixed` of `gw`, with a range port
/// (`port`) or not, is served: by its port, or by a fixed listener not in conflict.
pub(super) fn serves(gw: &GatewayView, fixed: &[usize], port: bool) -> bool {
    port || fixed.iter().any(|&li| gw.listeners[li].yielded.is_empty())
}

/// How full each range listener is with `claims`, and `others` (the claims of the
/// routes not planned, when only some are).
pub(super) fn listener_usage(
    gateways: &[GatewayView],
    claims: &[Arc<PortClaim>],
    others: Option<&ClaimIndex>,
) -> Vec<ListenerUsage> {
    let mut out = Vec::new();
    for (gi, gw) in gateways.iter().enumerate() {
        let (namespace, gateway) = gw.key();
        for (li, l) in gw.listeners.iter().enumerate() {
            let Some((first, last)) = l.range else {
                continue;
            };
            let (bound, cooling) = others.map_or((0, 0), |o| o.counts(gi, li));
            let mut u = ListenerUsage {
                namespace: namespace.clone(),
                gateway: gateway.clone(),
                listener: l.spec.name.clone(),
                first,
                size: u32::from(last - first) + 1,
                bound,
                cooling,
            };
            for c in claims.iter().filter(|c| {
                c.metadata.ns() == namespace
                    && c.spec.gateway == gateway
                    && c.spec.listener == l.spec.name
            }) {
                match c.is_bound() {
                    true => u.bound += 1,
                    false => u.cooling += 1,
                }
            }
            out.push(u);
        }
    }
    out
}
