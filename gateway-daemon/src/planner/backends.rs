//! Turning a route's backendRefs into weighted endpoints.

use std::net::{Ipv4Addr, SocketAddrV4};

use super::FastMap;
use super::Reason;
use crate::{
    datapath::WeightedBackend,
    model::{EndpointSlice, Protocol, Route, Service, Snapshot, GATEWAY_GROUP},
};

/// Share of one backendRef spread over its endpoints (so weights stay integers).
const WEIGHT_SCALE: u32 = 1000;

/// A route's resolved backends and what could not be resolved.
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    /// Endpoints with weights (terminating endpoints have weight 0).
    pub backends: crate::datapath::Backends,
    /// (reason, message) per backendRef that failed.
    pub errors: Vec<(Reason, String)>,
}

impl Resolved {
    /// The ResolvedRefs condition: (ok, reason, message).
    pub fn status(&self) -> (bool, Reason, String) {
        if self.errors.is_empty() {
            return (
                true,
                Reason::ResolvedRefs,
                "all backend references resolved".to_string(),
            );
        }
        // Report the most serious reason; list every problem.
        let rank = |r: Reason| match r {
            Reason::RefNotPermitted => 0,
            Reason::InvalidKind => 1,
            _ => 2,
        };
        let reason = self
            .errors
            .iter()
            .map(|(r, _)| *r)
            .min_by_key(|&r| rank(r))
            .unwrap_or(Reason::BackendNotFound);
        let message = self
            .errors
            .iter()
            .map(|(_, m)| m.clone())
            .collect::<Vec<_>>()
            .join("; ");
        (false, reason, message)
    }
}

/// Services and EndpointSlices indexed by namespace and (service) name.
pub struct Index<'a> {
    services: FastMap<(&'a str, &'a str), &'a Service>,
    slices: FastMap<(&'a str, &'a str), Vec<&'a EndpointSlice>>,
}

impl<'a> Index<'a> {
    /// Indexes a snapshot.
    pub fn new(snap: &'a Snapshot) -> Self {
        let services = snap
            .services
            .iter()
            .map(|s| ((s.metadata.ns(), s.metadata.name.as_str()), &**s))
            .collect();
        let mut slices: FastMap<(&str, &str), Vec<&EndpointSlice>> = FastMap::default();
        for s in &snap.endpoint_slices {
            if let Some(svc) = s.metadata.labels.get("kubernetes.io/service-name") {
                slices
                    .entry((s.metadata.ns(), svc.as_str()))
                    .or_default()
                    .push(s);
            }
        }
        Index { services, slices }
    }
}

/// Resolves the backends of every rule of `route`.
pub fn resolve_backends(route: &Route, snap: &Snapshot, index: &Index) -> Resolved {
    let mut out = Resolved::default();
    let mut backends = Vec::new();
    let route_ns = route.metadata.ns();
    for (ri, rule) in route.spec.rules.iter().enumerate() {
        for (bi, b) in rule.backend_refs.iter().enumerate() {
            let field = format!("spec.rules[{ri}].backendRefs[{bi}]");
            let group = b.group.as_deref().unwrap_or("");
            let kind = b.kind.as_deref().unwrap_or("Service");
            if !group.is_empty() || kind != "Service" {
                out.errors.push((
                    Reason::InvalidKind,
                    format!("{field}: {group}/{kind} is not a Service"),
                ));
                continue;
            }
            let ns = b.namespace.as_deref().unwrap_or(route_ns);
            if ns != route_ns && !granted(snap, route, ns, &b.name) {
                out.errors.push((
                    Reason::RefNotPermitted,
                    format!("{field}: Service {ns}/{} needs a ReferenceGrant in {ns} for {} from {route_ns}", b.name, route.kind.name()),
                ));
                continue;
            }
            let Some(svc) = index.services.get(&(ns, b.name.as_str())).copied() else {
                out.errors.push((
                    Reason::BackendNotFound,
                    format!("{field}: Service {ns}/{} not found", b.name),
                ));
                continue;
            };
            let Some(port) = b.port else {
                out.errors
                    .push((Reason::BackendNotFound, format!("{field}.port is required")));
                continue;
            };
            let protocol = route.kind.protocol();
            let Some(sp) = svc.spec.ports.iter().find(|p| {
                p.port == port
                    && Protocol::parse(p.protocol.as_deref().unwrap_or("TCP")) == Some(protocol)
            }) else {
                out.errors.push((
                    Reason::BackendNotFound,
                    format!(
                        "{field}: Service {ns}/{} has no {protocol} port {port}",
                        b.name
                    ),
                ));
                continue;
            };
            let weight = b.weight.unwrap_or(1);
            if weight == 0 {
                continue;
            }
            let mut endpoints: Vec<(SocketAddrV4, bool)> = Vec::new();
            let slices = index
                .slices
                .get(&(ns, b.name.as_str()))
                .map(Vec::as_slice)
                .unwrap_or_default();
            for slice in slices.iter().filter(|s| s.address_type == "IPv4") {
                let Some(target) = slice
                    .ports
                    .iter()
                    .find(|p| {
                        p.name == sp.name
                            && Protocol::parse(p.protocol.as_deref().unwrap_or("TCP"))
                                == Some(protocol)
                    })
                    .and_then(|p| p.port)
                else {
                    continue;
                };
                for e in &slice.endpoints {
                    let c = &e.conditions;
                    let ready = c.ready != Some(false);
                    let draining =
                        !ready && c.terminating == Some(true) && c.serving != Some(false);
                    if !ready && !draining {
                        continue;
                    }
                    for a in &e.addresses {
                        if let Ok(ip) = a.parse::<Ipv4Addr>() {
                            endpoints.push((SocketAddrV4::new(ip, target), ready));
                        }
                    }
                }
            }
            let live = endpoints.iter().filter(|(_, r)| *r).count().max(1) as u32;
            let share =
                (weight.saturating_mul(WEIGHT_SCALE) / live).clamp(1, u32::from(u16::MAX)) as u16;
            for (endpoint, ready) in endpoints {
                backends.push(WeightedBackend {
                    endpoint,
                    weight: if ready { share } else { 0 },
                });
            }
        }
    }
    out.backends = backends.into();
    out
}

/// Whether a ReferenceGrant in `ns` lets `route` refer to Service `name`.
fn granted(snap: &Snapshot, route: &Route, ns: &str, name: &str) -> bool {
    snap.reference_grants
        .iter()
        .filter(|g| g.metadata.ns() == ns)
        .any(|g| {
            g.spec.from.iter().any(|f| {
                f.group == GATEWAY_GROUP
                    && f.kind == route.kind.name()
                    && f.namespace == route.metadata.ns()
            }) && g.spec.to.iter().any(|t| {
                t.group.is_empty()
                    && t.kind == "Service"
                    && t.name.as_deref().is_none_or(|n| n == name)
            })
        })
}
