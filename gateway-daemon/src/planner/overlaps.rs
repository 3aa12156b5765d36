//! Listeners of different Gateways on a shared address: one (address, protocol, port)
//! belongs to one route only, so where the ports of two Gateways' listeners overlap
//! on an address both serve, the newer Gateway's listener yields them to the older.
//!
//! Incident: a second Gateway on the same address with an overlapping range gave its
//! route the port a route of the first already held; both routes said Accepted and the
//! datapath entry went to whichever was planned last.

use std::{net::IpAddr, ops::RangeInclusive, time::SystemTime};

use crate::model::Protocol;

use super::gateways::{GatewayView, ListenerView};

/// Ports of a listener that an older Gateway's listener serves on a shared address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Yielded {
    /// The ports, a sub-span of the listener's.
    pub ports: RangeInclusive<u16>,
    /// The first address both Gateways serve.
    pub addr: IpAddr,
    /// The older Gateway, `namespace/name`.
    pub gateway: String,
    /// Its listener.
    pub listener: String,
}

impl ListenerView<'_> {
    /// The protocol and the ports the listener serves: its range, or its one port.
    pub(super) fn span(&self) -> Option<(Protocol, RangeInclusive<u16>)> {
        let protocol = self.protocol?;
        let (first, last) = self.range.unwrap_or((self.spec.port, self.spec.port));
        Some((protocol, first..=last))
    }

    /// What holds `port` instead of this listener, if an older Gateway does.
    pub(super) fn yielded_at(&self, port: u16) -> Option<&Yielded> {
        self.yielded.iter().find(|y| y.ports.contains(&port))
    }

    /// The spans of ports the listener keeps: its own, less those it yields.
    pub(super) fn kept(&self) -> Vec<RangeInclusive<u16>> {
        let Some((_, span)) = self.span() else {
            return Vec::new();
        };
        let mut spans: Vec<&RangeInclusive<u16>> = self.yielded.iter().map(|y| &y.ports).collect();
        spans.sort_by_key(|s| *s.start());
        let mut kept = Vec::new();
        // The first port not yet covered, walking the spans up from the listener's first.
        let mut next = u32::from(*span.start());
        let end = u32::from(*span.end());
        for s in spans {
            let (first, last) = (u32::from(*s.start()), u32::from(*s.end()));
            if first > next {
                kept.push(next..=first - 1);
            }
            next = next.max(last + 1);
        }
        if next <= end {
            kept.push(next..=end);
        }
        // Every bound is a port of the listener's span (u16).
        kept.into_iter()
            .map(|r| *r.start() as u16..=*r.end() as u16)
            .collect()
    }

    /// Whether every port of the listener is yielded.
    pub(super) fn fully_yielded(&self) -> bool {
        self.span().is_some() && self.kept().is_empty()
    }
}

/// Numbers the Gateways by age (`age`: 0 for the oldest) and gives each listener of a
/// newer Gateway the ports it shares with an older one on an address both serve.
/// Age is creation time, then (without one) source order, then namespace/name: the
/// order in which routes compete too.
pub(super) fn mark(gateways: &mut [GatewayView], created: &[Option<SystemTime>], source: &[usize]) {
    let mut order: Vec<usize> = (0..gateways.len()).collect();
    order.sort_by_cached_key(|&gi| {
        let (ns, name) = gateways[gi].key();
        let created = created[gi];
        (
            created.is_none(),
            created,
            if created.is_some() { 0 } else { source[gi] },
            ns,
            name,
        )
    });
    for (age, &gi) in order.iter().enumerate() {
        gateways[gi].age = age;
    }
    let mut found: Vec<(usize, usize, Yielded)> = Vec::new();
    for (k, &newer) in order.iter().enumerate() {
        let (gn, mine) = (&gateways[newer], &gateways[newer].addresses.served);
        for &older in &order[..k] {
            let go = &gateways[older];
            let Some(&addr) = mine.iter().find(|a| go.addresses.served.contains(a)) else {
                continue;
            };
            let (ns, name) = go.key();
            for (li, l) in gn.listeners.iter().enumerate() {
                let Some((protocol, span)) = l.span() else {
                    continue;
                };
                for m in &go.listeners {
                    let Some((p, theirs)) = m.span() else {
                        continue;
                    };
                    let first = *span.start().max(theirs.start());
                    let last = *span.end().min(theirs.end());
                    if p != protocol || first > last {
                        continue;
                    }
                    found.push((
                        newer,
                        li,
                        Yielded {
                            ports: first..=last,
                            addr,
                            gateway: format!("{ns}/{name}"),
                            listener: m.spec.name.clone(),
                        },
                    ));
                }
            }
        }
    }
    for (gi, li, y) in found {
        gateways[gi].listeners[li].yielded.push(y);
    }
}

/// `first-last`, or `port` for a span of one.
pub(super) fn ports_text(ports: &RangeInclusive<u16>) -> String {
    match ports.start() == ports.end() {
        true => format!("port {}", ports.start()),
        false => format!("ports {}-{}", ports.start(), ports.end()),
    }
}

/// Whose `ports` are: `ports P on ADDR belong to listener L of the older Gateway G`.
fn belongs(y: &Yielded, ports: &RangeInclusive<u16>) -> String {
    let verb = match ports.start() == ports.end() {
        true => "belongs",
        false => "belong",
    };
    format!(
        "{} on {} {verb} to listener {} of the older Gateway {}",
        ports_text(ports),
        y.addr,
        y.listener,
        y.gateway
    )
}

/// `ports a-b, c-d` (or `port p`) for spans of a listener.
fn spans_text(spans: &[RangeInclusive<u16>]) -> String {
    let text: Vec<String> = spans
        .iter()
        .map(|s| match s.start() == s.end() {
            true => s.start().to_string(),
            false => format!("{}-{}", s.start(), s.end()),
        })
        .collect();
    let one = matches!(spans, [s] if s.start() == s.end());
    format!("{} {}", if one { "port" } else { "ports" }, text.join(", "))
}

/// The message of the `Accepted=False` and `Conflicted=True` conditions of a listener
/// that yields ports: which ports belong to which older Gateway's listener, and which
/// ports of this listener still serve.
pub(super) fn conflict_message(l: &ListenerView) -> String {
    let yields = l
        .yielded
        .iter()
        .map(|y| belongs(y, &y.ports))
        .collect::<Vec<_>>()
        .join("; ");
    let one = matches!(&l.yielded[..], [y] if y.ports.start() == y.ports.end());
    let them = if one { "it" } else { "them" };
    let kept = l.kept();
    match kept.is_empty() {
        true => format!("{yields}; no route of this listener gets {them}"),
        false => format!(
            "{yields}; no route of this listener gets {them}; {} of this listener keep serving their routes",
            spans_text(&kept)
        ),
    }
}

/// The `Programmed` message of a listener that yields some of its ports.
pub(super) fn kept_message(l: &ListenerView) -> String {
    format!(
        "{} programmed; the ports in conflict are not (see Conflicted)",
        spans_text(&l.kept())
    )
}

/// Why a route attached to fixed listener `l`, whose port an older Gateway's listener
/// serves, gets nothing from it.
pub(super) fn taken_message(l: &ListenerView) -> String {
    let port = l.spec.port;
    match l.yielded_at(port) {
        Some(y) => format!(
            "listener {} serves no traffic: {}",
            l.spec.name,
            belongs(y, &(port..=port))
        ),
        None => format!("listener {} serves no traffic", l.spec.name),
    }
}

/// Why a requested `port` of a listener is not available: it belongs to an older
/// Gateway's listener (`None` when it does not).
pub(super) fn requested_message(l: &ListenerView, port: u16) -> Option<String> {
    l.yielded_at(port).map(|y| belongs(y, &(port..=port)))
}

/// The ports of listener `l` among the host's ephemeral ports `ephemeral`, with the
/// ephemeral range itself (for the message).
pub(super) fn ephemeral_overlap(
    l: &ListenerView,
    ephemeral: &RangeInclusive<u16>,
) -> Option<(RangeInclusive<u16>, RangeInclusive<u16>)> {
    let (_, span) = l.span()?;
    let first = *span.start().max(ephemeral.start());
    let last = *span.end().min(ephemeral.end());
    (first <= last).then(|| (first..=last, ephemeral.clone()))
}

/// The message of a listener's `berth.dev/EphemeralPortOverlap` condition.
pub(super) fn ephemeral_message(
    ports: &RangeInclusive<u16>,
    within: &RangeInclusive<u16>,
) -> String {
    let verb = match ports.start() == ports.end() {
        true => "is",
        false => "are",
    };
    format!(
        "{} of this listener {verb} in the host's ephemeral port range {}-{} \
         (net.ipv4.ip_local_port_range): the ports assigned from {} are reserved from it \
         (net.ipv4.ip_local_reserved_ports) while they are programmed, so that local \
         connections do not take them",
        ports_text(ports),
        within.start(),
        within.end(),
        if ports.start() == ports.end() {
            "it"
        } else {
            "them"
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Listener;

    fn yielded(ports: RangeInclusive<u16>) -> Yielded {
        Yielded {
            ports,
            addr: IpAddr::from([10, 0, 0, 1]),
            gateway: "infra/old".to_string(),
            listener: "pool".to_string(),
        }
    }

    fn range_listener(spec: &Listener, yields: Vec<Yielded>) -> ListenerView<'_> {
        ListenerView {
            spec,
            protocol: Some(Protocol::Tcp),
            range: Some((30000, 30009)),
            quota: None,
            yielded: yields,
        }
    }

    #[test]
    fn a_listener_is_fully_yielded_only_when_the_yields_cover_its_whole_span() {
        let spec = Listener {
            name: "pool".to_string(),
            port: 30000,
            protocol: "TCP".to_string(),
            allowed_routes: None,
        };
        let partly = range_listener(&spec, vec![yielded(30005..=30009)]);
        assert!(!partly.fully_yielded());
        assert_eq!(
            partly.yielded_at(30007).map(|y| y.ports.clone()),
            Some(30005..=30009)
        );
        assert!(partly.yielded_at(30004).is_none());
        assert_eq!(partly.kept(), vec![30000..=30004]);
        let gap = range_listener(&spec, vec![yielded(30006..=30009), yielded(30000..=30004)]);
        assert!(!gap.fully_yielded());
        assert_eq!(gap.kept(), vec![30005..=30005]);
        let inner = range_listener(&spec, vec![yielded(30002..=30003), yielded(30003..=30006)]);
        assert_eq!(inner.kept(), vec![30000..=30001, 30007..=30009]);
        let whole = range_listener(&spec, vec![yielded(30004..=30009), yielded(30000..=30004)]);
        assert!(whole.fully_yielded());
        assert!(whole.kept().is_empty());
        assert_eq!(
            conflict_message(&whole),
            "ports 30004-30009 on 10.0.0.1 belong to listener pool of the older Gateway infra/old; \
             ports 30000-30004 on 10.0.0.1 belong to listener pool of the older Gateway infra/old; \
             no route of this listener gets them"
        );
    }
}
