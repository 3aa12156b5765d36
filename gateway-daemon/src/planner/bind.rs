//! The third stage: the stored claims bound to the attachments that still hold them
//! (the others released, or forgotten once cooled down), then a port for every range
//! attachment without one, through the `Ledger`.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::model::*;

use super::Reason;
use super::{
    attach::{holds, Attach, Attachment, Attachments},
    gateways::{GatewayView, Gateways},
    ledger::{claim_key, ClaimIndex, Ledger},
    overlaps, Input, DEFAULT_RELEASE_COOLDOWN,
};

/// The claims of a plan, by the indexes attachments hold (`None`: forgotten).
pub(super) struct Bound {
    pub claims: Vec<Option<Arc<PortClaim>>>,
    /// Bound claims released although their route still attaches, and why.
    pub released: Vec<String>,
}

/// Binds the stored claims to `attachments` and allocates the ports still missing.
/// With `others` (a plan of some routes only: `input` holds their claims), the claims
/// of every other route, held as they are.
pub(super) fn bind(
    input: &Input,
    gateways: &Gateways,
    attachments: &mut Attachments,
    others: Option<&ClaimIndex>,
) -> Bound {
    let Kept { kept, released } = keep_claims(input, gateways, attachments);
    let mut ledger = Ledger::new(kept, &gateways.views, &gateways.at, others);
    for ai in pending(&attachments.list) {
        let a = &mut attachments.list[ai];
        if !input.allocate {
            a.failure = Some((
                Reason::Pending,
                "waiting for the allocator to assign a port".to_string(),
            ));
            continue;
        }
        match allocate(a, &gateways.views, &mut ledger) {
            Ok(ci) => a.claim = Some(ci),
            Err(f) => a.failure = Some(f),
        }
    }
    Bound {
        claims: ledger.claims,
        released,
    }
}

/// The stored claims, sorted, each kept as it is, released, or forgotten (`None`).
struct Kept {
    kept: Vec<Option<Arc<PortClaim>>>,
    /// Bound claims released although their route still attaches, and why.
    released: Vec<String>,
}

/// The stored claims, sorted, each kept as it is, released, or forgotten; a bound
/// claim still held by an attachment is bound to it.
fn keep_claims(input: &Input, gateways: &Gateways, attachments: &mut Attachments) -> Kept {
    let mut claims: Vec<Arc<PortClaim>> = input.claims.iter().cloned().collect();
    sort_claims(&mut claims);
    let mut kept = Vec::with_capacity(claims.len());
    let mut released = Vec::new();
    for mut claim in claims {
        let Some(gi) = gateways.index(claim.metadata.ns(), claim.spec.gateway.as_str()) else {
            // The Gateway is gone (or no longer ours): release its claims, and forget
            // them after the default cool-down (its GatewayConfig may be gone too).
            if claim.is_released() && cooled_down(&claim, DEFAULT_RELEASE_COOLDOWN, input.now) {
                kept.push(None);
                continue;
            }
            release(&mut claim, input.now);
            kept.push(Some(claim));
            continue;
        };
        let gw = &gateways.views[gi];
        if gw.params_error.is_some() {
            kept.push(Some(claim));
            continue;
        }
        if claim.is_bound() {
            match holder(&claim, gi, gw, attachments) {
                Some(ai) => attachments.list[ai].claim = Some(kept.len()),
                None => {
                    let attached = attachments.named(&claim.spec.route).filter(|&ai| {
                        let a = &attachments.list[ai];
                        a.gw == gi && holds(&claim.spec.route, a.route)
                    });
                    released.extend(
                        unheld(&claim, gw, attached.map(|ai| &attachments.list[ai]))
                            .map(|why| format!("claim {} released: {why}", claim_label(&claim))),
                    );
                    release(&mut claim, input.now)
                }
            }
            kept.push(Some(claim));
        } else if cooled_down(&claim, gw.cooldown, input.now) {
            kept.push(None);
        } else {
            kept.push(Some(claim));
        }
    }
    Kept { kept, released }
}

/// The first attachment without a claim that may keep bound `claim` of Gateway `gi`.
fn holder(
    claim: &PortClaim,
    gi: usize,
    gw: &GatewayView,
    attachments: &Attachments,
) -> Option<usize> {
    attachments.named(&claim.spec.route).find(|&ai| {
        let a = &attachments.list[ai];
        a.gw == gi
            && a.claim.is_none()
            && holds(&claim.spec.route, a.route)
            && matches!(&*a.attach, Attach::Listeners { ranges, requested, .. }
                if ranges.iter().any(|&li| {
                    let l = &gw.listeners[li];
                    l.spec.name == claim.spec.listener
                        && l.range.is_some_and(|(x, y)| (x..=y).contains(&claim.spec.port))
                        // A port an older Gateway serves on a shared address
                        // is not this listener's to keep.
                        && l.yielded_at(claim.spec.port).is_none()
                }) && requested.is_none_or(|p| p == claim.spec.port))
    })
}

/// Unserved range attachments: static requests first, then dynamic, oldest first.
fn pending(attachments: &[Attachment]) -> Vec<usize> {
    let mut statics = Vec::new();
    let mut dynamics = Vec::new();
    for (ai, a) in attachments.iter().enumerate() {
        if let Attach::Listeners {
            ranges, requested, ..
        } = &*a.attach
        {
            if a.claim.is_none() && !ranges.is_empty() {
                if requested.is_some() {
                    statics.push(ai)
                } else {
                    dynamics.push(ai)
                }
            }
        }
    }
    statics.into_iter().chain(dynamics).collect()
}

fn route_ref(route: &Route) -> ClaimRoute {
    ClaimRoute::new(
        route.kind,
        route.metadata.ns(),
        &route.metadata.name,
        route.metadata.uid.clone(),
    )
}

/// Why a bound claim of a route that still attaches to the claim's Gateway holds none
/// of its attachments, when that is not the user's own doing (a route that moved to
/// another listener or asks for another port): its port lies outside the listener's
/// range (a range that shrank, or a record from elsewhere), or every attachment of the
/// route to that listener holds an earlier claim.
fn unheld<'a>(
    claim: &PortClaim,
    gw: &GatewayView,
    attached: impl Iterator<Item = &'a Attachment<'a>>,
) -> Option<String> {
    let li = gw
        .listeners
        .iter()
        .position(|l| l.spec.name == claim.spec.listener)?;
    let l = &gw.listeners[li];
    let port = claim.spec.port;
    // The route's attachments that this listener may serve with this very port.
    let mut on_listener = attached
        .filter(|a| {
            matches!(&*a.attach, Attach::Listeners { ranges, requested, .. }
                if ranges.contains(&li) && requested.is_none_or(|p| p == port))
        })
        .peekable();
    on_listener.peek()?;
    if let Some((first, last)) = l.range.filter(|&(x, y)| !(x..=y).contains(&port)) {
        return Some(format!(
            "port {port} is outside listener {}'s range {first}-{last}",
            l.spec.name
        ));
    }
    if l.yielded_at(port).is_some() {
        // Said by the listener's own conditions (PortUnavailable).
        return None;
    }
    on_listener.all(|a| a.claim.is_some()).then(|| {
        format!(
            "its route already holds another port of listener {}",
            l.spec.name
        )
    })
}

/// `namespace/name (protocol port)` of a claim, for messages.
fn claim_label(c: &PortClaim) -> String {
    format!(
        "{}/{} ({} {})",
        c.metadata.ns(),
        c.metadata.name,
        c.spec.protocol,
        c.spec.port
    )
}
/// Sorts claims by namespace, then name (they mostly come sorted: checked first).
pub(super) fn sort_claims(claims: &mut [Arc<PortClaim>]) {
    if !claims.is_sorted_by(|a, b| claim_key(a) <= claim_key(b)) {
        claims.sort_by(|a, b| claim_key(a).cmp(&claim_key(b)));
    }
}

fn release(claim: &mut Arc<PortClaim>, now: SystemTime) {
    if claim.is_released() {
        return;
    }
    Arc::make_mut(claim).status = Some(PortClaimStatus {
        phase: ClaimPhase::Released,
        released_at: Some(Time::at(now)),
    });
}

fn cooled_down(claim: &PortClaim, cooldown: Duration, now: SystemTime) -> bool {
    // A released claim without a readable time cools down from now on: never lose a port early.
    cooldown_end(claim, cooldown).is_some_and(|end| end <= now)
}

/// When the cool-down of released `claim` ends, if its release time is readable.
pub(super) fn cooldown_end(claim: &PortClaim, cooldown: Duration) -> Option<SystemTime> {
    let released = claim.status.as_ref()?.released_at?;
    Some(released.system() + cooldown)
}

/// Finds or makes the claim for a range attachment.
fn allocate(
    a: &Attachment,
    gateways: &[GatewayView],
    ledger: &mut Ledger,
) -> Result<usize, (Reason, String)> {
    let Attach::Listeners {
        ranges, requested, ..
    } = &*a.attach
    else {
        return Err((Reason::NoMatchingParent, "no range listener".to_string()));
    };
    let gw = &gateways[a.gw];
    let me = route_ref(a.route);
    let route_ns = a.route.metadata.ns();

    let mut quota_hit = None;
    for &li in ranges {
        let l = &gw.listeners[li];
        let (Some((first, last)), Some(protocol)) = (l.range, l.protocol) else {
            continue;
        };
        // Its own released claim on this listener, still cooling down, comes back to
        // it; before the quota, which counts that claim already.
        if let Some(ci) = ledger.rebind(a.gw, li, &me, *requested) {
            return Ok(ci);
        }
        if let Some(quota) = l.quota {
            let held = ledger.held_in(a.gw, li, route_ns);
            if held >= quota {
                quota_hit = Some(format!(
                    "namespace {route_ns} already holds {held} of its {quota} ports on \
                     listener {} (bound, or released and cooling down)",
                    l.spec.name
                ));
                continue;
            }
        }
        if let Some(m) = requested.and_then(|p| overlaps::requested_message(l, p)) {
            return Err((Reason::PortUnavailable, m));
        }
        let port = match requested {
            Some(p) => {
                if let Some(h) = ledger.holder(a.gw, protocol, *p) {
                    let who = if h.spec.route.namespace == route_ns {
                        format!(
                            "{} {}/{}",
                            h.spec.route.kind, h.spec.route.namespace, h.spec.route.name
                        )
                    } else {
                        "a route in another namespace".to_string()
                    };
                    let state = if h.is_released() {
                        " (released, cooling down)"
                    } else {
                        ""
                    };
                    return Err((
                        Reason::PortUnavailable,
                        format!("port {p} is held by {who}{state}"),
                    ));
                }
                *p
            }
            None => match ledger.lowest_free(a.gw, li, protocol, first, last) {
                Some(p) => p,
                None => continue,
            },
        };
        let (gw_ns, gw_name) = gw.key();
        let spec = PortClaimSpec {
            gateway: gw_name.into(),
            listener: l.spec.name.as_str().into(),
            protocol: Str::const_new(protocol.as_str()),
            port,
            route: me.clone(),
        };
        let claim = PortClaim::bound(&gw_ns, spec);
        return Ok(ledger.push(claim));
    }
    match quota_hit {
        Some(m) => Err((Reason::QuotaExceeded, m)),
        None => {
            let spans: Vec<String> = ranges
                .iter()
                .filter_map(|&li| {
                    let l = &gw.listeners[li];
                    let (x, y) = l.range?;
                    let yielded: Vec<String> = l
                        .yielded
                        .iter()
                        .map(|y| overlaps::ports_text(&y.ports))
                        .collect();
                    Some(match yielded.is_empty() {
                        true => format!("{x}-{y}"),
                        false => format!(
                            "{x}-{y} ({} served by an older Gateway on a shared address)",
                            yielded.join(", ")
                        ),
                    })
                })
                .collect();
            Err((
                Reason::PortRangeExhausted,
                format!("no free port in {}", spans.join(", ")),
            ))
        }
    }
}
