//! Turning a route's backendRefs into weighted endpoints, one list per IP family: a
//! service of a family gets the endpoints of that family only (there is no NAT64).

use std::net::{IpAddr, SocketAddr};

use super::addresses::{Families, Family};
use super::FastMap;
use super::{status::Text, Reason};
use crate::{
    model::{BackendRef, Backends, WeightedBackend},
    model::{EndpointSlice, Protocol, Route, Service, ServicePort, Snapshot, GATEWAY_GROUP},
};

/// Share of one backendRef spread over its endpoints (so weights stay integers).
const WEIGHT_SCALE: u32 = 1000;

/// A route's resolved backends and what could not be resolved.
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    /// IPv4 endpoints with weights (terminating endpoints have weight 0).
    pub ipv4: Backends,
    /// IPv6 endpoints with weights (terminating endpoints have weight 0).
    pub ipv6: Backends,
    /// (reason, message) per backendRef that failed.
    pub errors: Vec<(Reason, String)>,
    /// Each Service referenced that has endpoints (`namespace/name`), with their
    /// families: a Gateway's families are checked against them.
    pub families: Vec<(String, Families)>,
    /// What was left out and why (EndpointSlices of type FQDN, addresses that are not
    /// of their slice's type): said in the ResolvedRefs message.
    pub notes: Vec<String>,
    /// The backendRefs (`Service NS/NAME port N`) that resolved to no endpoint at all.
    pub empty: Vec<String>,
}

impl Resolved {
    /// The endpoints of `family`.
    pub fn backends(&self, family: Family) -> &Backends {
        match family {
            Family::Ipv4 => &self.ipv4,
            Family::Ipv6 => &self.ipv6,
        }
    }

    /// The families of all endpoints.
    fn endpoint_families(&self) -> Families {
        Families::of_iter(self.families.iter().flat_map(|(_, f)| f.iter()))
    }

    /// The ResolvedRefs condition for a parent, Gateway `gateway` (namespace, name)
    /// that serves `served`: (ok, reason, message). Endpoints of no family the Gateway
    /// serves are refused (`IPFamilyMismatch`); a family served without endpoints is
    /// named in the message.
    pub fn status(&self, gateway: (&str, &str), served: Families) -> (bool, Reason, Text) {
        let endpoints = self.endpoint_families();
        let mut errors: Vec<(Reason, String)> = Vec::new();
        let mut notes: Vec<String> = Vec::new();
        if !served.is_empty() && !endpoints.is_empty() {
            let services = |pick: &dyn Fn(Families) -> bool, what: &dyn Fn(Families) -> String| {
                self.families
                    .iter()
                    .filter(|(_, f)| pick(*f))
                    .map(|(name, f)| format!("Service {name} has {}", what(*f)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if !served.meets(endpoints) {
                errors.push((
                    Reason::IPFamilyMismatch,
                    format!(
                        "Gateway {}/{} serves {served} only; {} (there is no NAT64)",
                        gateway.0,
                        gateway.1,
                        services(&|_| true, &|f| format!("only {f} endpoints"))
                    ),
                ));
            } else {
                for family in served.iter().filter(|f| !endpoints.contains(*f)) {
                    notes.push(format!(
                        "served on {} only: {} ({family} clients get no backend)",
                        Families::of_iter(served.iter().filter(|f| *f != family)),
                        services(&|f| !f.contains(family), &|_| format!(
                            "no {family} endpoints"
                        ))
                    ));
                }
            }
        }
        // A Service without endpoints still resolves (upstream keeps ResolvedRefs True),
        // but a route left with no backend at all must say so: it once went silent when
        // a Service's unnamed port did not match its EndpointSlice's port named "".
        if !self.empty.is_empty() && self.ipv4.is_empty() && self.ipv6.is_empty() {
            notes.push(format!(
                "no backends: no ready or serving endpoint for {}",
                self.empty.join(", ")
            ));
        }
        notes.extend(self.notes.iter().cloned());
        let errors: Vec<&(Reason, String)> = self.errors.iter().chain(&errors).collect();
        if errors.is_empty() {
            const RESOLVED: &str = "all backend references resolved";
            if notes.is_empty() {
                return (true, Reason::ResolvedRefs, Text::const_new(RESOLVED));
            }
            let mut message = RESOLVED.to_string();
            for n in &notes {
                message.push_str("; ");
                message.push_str(n);
            }
            return (true, Reason::ResolvedRefs, message.into());
        }
        // Report the most serious reason; list every problem.
        let rank = |r: Reason| match r {
            Reason::RefNotPermitted => 0,
            Reason::InvalidKind => 1,
            _ => 2,
        };
        let reason = errors
            .iter()
            .map(|(r, _)| *r)
            .min_by_key(|&r| rank(r))
            .unwrap_or(Reason::BackendNotFound);
        let message = errors
            .iter()
            .map(|(_, m)| m.as_str())
            .chain(notes.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("; ");
        (false, reason, message.into())
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
    let (mut ipv4, mut ipv6) = (Vec::new(), Vec::new());
    for (ri, rule) in route.spec.rules.iter().enumerate() {
        for (bi, b) in rule.backend_refs.iter().enumerate() {
            let field = format!("spec.rules[{ri}].backendRefs[{bi}]");
            let target = match Target::of(route, b, &field, snap, index) {
                Ok(target) => target,
                Err(error) => {
                    out.errors.push(error);
                    continue;
                }
            };
            let weight = b.weight.unwrap_or(1);
            if weight == 0 {
                continue;
            }
            let endpoints = target.endpoints(index, &mut out.notes);
            if endpoints.is_empty() {
                out.empty.push(format!(
                    "Service {}/{} port {}",
                    target.ns, target.name, target.port
                ));
            }
            let families = Families::of_iter(endpoints.iter().map(|(e, _)| Family::of(&e.ip())));
            target.list_families(families, &mut out.families);
            spread(&endpoints, families, weight, &mut ipv4, &mut ipv6);
        }
    }
    finish(out, ipv4, ipv6)
}

/// The Service port a backendRef names, once the ref is checked.
struct Target<'a> {
    /// The Service's namespace.
    ns: &'a str,
    /// The Service's name.
    name: &'a str,
    /// The Service port named.
    sp: &'a ServicePort,
    /// Its number.
    port: u16,
    /// The route's protocol.
    protocol: Protocol,
}

impl<'a> Target<'a> {
    /// The Service port that backendRef `b` (at `field`) of `route` names, or why it
    /// names none.
    fn of(
        route: &'a Route,
        b: &'a BackendRef,
        field: &str,
        snap: &Snapshot,
        index: &Index<'a>,
    ) -> Result<Self, (Reason, String)> {
        let route_ns = route.metadata.ns();
        let group = b.group.as_deref().unwrap_or("");
        let kind = b.kind.as_deref().unwrap_or("Service");
        if !group.is_empty() || kind != "Service" {
            return Err((
                Reason::InvalidKind,
                format!("{field}: {group}/{kind} is not a Service"),
            ));
        }
        let ns = b.namespace.as_deref().unwrap_or(route_ns);
        if ns != route_ns && !granted(snap, route, ns, &b.name) {
            return Err((
                Reason::RefNotPermitted,
                format!("{field}: Service {ns}/{} needs a ReferenceGrant in {ns} for {} from {route_ns}", b.name, route.kind.name()),
            ));
        }
        let Some(svc) = index.services.get(&(ns, b.name.as_str())).copied() else {
            return Err((
                Reason::BackendNotFound,
                format!("{field}: Service {ns}/{} not found", b.name),
            ));
        };
        let Some(port) = b.port else {
            return Err((Reason::BackendNotFound, format!("{field}.port is required")));
        };
        let protocol = route.kind.protocol();
        let Some(sp) = svc.spec.ports.iter().find(|p| {
            p.port == port
                && Protocol::parse(p.protocol.as_deref().unwrap_or("TCP")) == Some(protocol)
        }) else {
            return Err((
                Reason::BackendNotFound,
                format!(
                    "{field}: Service {ns}/{} has no {protocol} port {port}",
                    b.name
                ),
            ));
        };
        Ok(Target {
            ns,
            name: b.name.as_str(),
            sp,
            port,
            protocol,
        })
    }

    /// The endpoints the Service's EndpointSlices give for this port, each with whether
    /// it is ready; what is left out, and why, goes to `notes`.
    fn endpoints(&self, index: &Index, notes: &mut Vec<String>) -> Vec<(SocketAddr, bool)> {
        let Target {
            ns,
            name,
            sp,
            port,
            protocol,
        } = *self;
        let mut endpoints: Vec<(SocketAddr, bool)> = Vec::new();
        let slices = index
            .slices
            .get(&(ns, name))
            .map(Vec::as_slice)
            .unwrap_or_default();
        for slice in slices {
            let slice_name = &slice.metadata.name;
            let Some(family) = Family::of_address_type(&slice.address_type) else {
                notes.push(format!(
                    "EndpointSlice {ns}/{slice_name} has addressType {:?}, which Berth \
                     does not serve (left out)",
                    slice.address_type
                ));
                continue;
            };
            let Some(target) = slice_port(slice, sp, protocol) else {
                if !slice.endpoints.is_empty() {
                    notes.push(format!(
                        "EndpointSlice {ns}/{slice_name} has no {protocol} port named {:?} \
                         for port {port} of Service {ns}/{} (left out)",
                        port_name(sp.name.as_deref()),
                        name
                    ));
                }
                continue;
            };
            let wrong = read_slice(slice, family, target, protocol, &mut endpoints);
            if let Some(first) = wrong.first() {
                notes.push(format!(
                    "EndpointSlice {ns}/{slice_name}: {} address(es) that are not {family} \
                     addresses left out (first: {first:?})",
                    wrong.len()
                ));
            }
        }
        endpoints
    }

    /// Lists the Service in `listed` with `families`, those of its endpoints (unless it
    /// has none).
    fn list_families(&self, families: Families, listed: &mut Vec<(String, Families)>) {
        let (ns, name) = (self.ns, self.name);
        // A Service named by two backendRefs (or rules) is listed once.
        let same = |s: &String| s.strip_prefix(ns).and_then(|n| n.strip_prefix('/')) == Some(name);
        if !families.is_empty() && !listed.iter().any(|(s, _)| same(s)) {
            listed.push((format!("{ns}/{name}"), families));
        }
    }
}

/// Adds the endpoints of `slice` (of `family`) that may take flows of `protocol`, on
/// port `target`, to `endpoints`, each with whether it is ready. Returns the addresses
/// that are not of `family`.
fn read_slice<'s>(
    slice: &'s EndpointSlice,
    family: Family,
    target: u16,
    protocol: Protocol,
    endpoints: &mut Vec<(SocketAddr, bool)>,
) -> Vec<&'s str> {
    let mut wrong: Vec<&str> = Vec::new();
    for e in &slice.endpoints {
        let c = &e.conditions;
        let ready = c.ready != Some(false);
        // Not ready: no new flows (weight 0), but established ones stay.
        // A TCP connection keeps its backend while the backend is listed
        // in any condition, as kube-proxy keeps established connections
        // (they were reset here when a readiness probe failed); a UDP flow
        // moves to a live backend, unless its backend is terminating and
        // still serving (draining).
        let draining = !ready
            && (protocol == Protocol::Tcp
                || (c.terminating == Some(true) && c.serving != Some(false)));
        if !ready && !draining {
            continue;
        }
        for a in &e.addresses {
            match a.parse::<IpAddr>() {
                Ok(ip) if Family::of(&ip) == family => {
                    endpoints.push((SocketAddr::new(ip, target), ready));
                }
                _ => wrong.push(a),
            }
        }
    }
    wrong
}

/// Adds `endpoints` of each of `families` to their family's list (`ipv4`, `ipv6`):
/// `weight` is shared by the ready ones, the others get weight 0.
fn spread(
    endpoints: &[(SocketAddr, bool)],
    families: Families,
    weight: u32,
    ipv4: &mut Vec<WeightedBackend>,
    ipv6: &mut Vec<WeightedBackend>,
) {
    for family in families.iter() {
        let of_family = || {
            endpoints
                .iter()
                .filter(|(e, _)| Family::of(&e.ip()) == family)
        };
        let live = of_family().filter(|(_, r)| *r).count().max(1) as u32;
        let share =
            (weight.saturating_mul(WEIGHT_SCALE) / live).clamp(1, u32::from(u16::MAX)) as u16;
        let list = match family {
            Family::Ipv4 => &mut *ipv4,
            Family::Ipv6 => &mut *ipv6,
        };
        list.extend(of_family().map(|&(endpoint, ready)| WeightedBackend {
            endpoint,
            weight: if ready { share } else { 0 },
        }));
    }
}

/// `out` with its endpoints, `ipv4` and `ipv6`.
fn finish(mut out: Resolved, ipv4: Vec<WeightedBackend>, ipv6: Vec<WeightedBackend>) -> Resolved {
    out.ipv4 = backends(ipv4);
    out.ipv6 = backends(ipv6);
    // Kept with the route's status until it changes: no spare room.
    out.errors.shrink_to_fit();
    out.families.shrink_to_fit();
    out.notes.shrink_to_fit();
    out.empty.shrink_to_fit();
    out
}

/// `list` as kept with a route's status: without spare room, and the one shared empty
/// list when empty (most routes have endpoints of one family only).
fn backends(mut list: Vec<WeightedBackend>) -> Backends {
    static EMPTY: std::sync::LazyLock<Backends> = std::sync::LazyLock::new(Backends::default);
    if list.is_empty() {
        return Backends::clone(&EMPTY);
    }
    list.shrink_to_fit();
    list.into()
}

/// A port's name as Kubernetes compares it: an absent name is the empty name.
fn port_name(name: Option<&str>) -> &str {
    name.unwrap_or("")
}

/// The port number `slice` gives for Service port `sp` of `protocol`, matched as
/// kube-proxy matches them: by name (an unnamed Service port is the slice port named
/// `""` or without a name, as the EndpointSlice controller writes it) and protocol. A
/// slice port without a number (Kubernetes: "not restricted") takes the Service's
/// numeric `targetPort`, else its `port`; a named `targetPort` has no number without
/// the slice's.
fn slice_port(slice: &EndpointSlice, sp: &ServicePort, protocol: Protocol) -> Option<u16> {
    let name = port_name(sp.name.as_deref());
    let p = slice.ports.iter().find(|p| {
        port_name(p.name.as_deref()) == name
            && Protocol::parse(p.protocol.as_deref().unwrap_or("TCP")) == Some(protocol)
    })?;
    if let Some(number) = p.port {
        return Some(number);
    }
    match &sp.target_port {
        None => Some(sp.port),
        Some(v) => v.as_u64().and_then(|n| u16::try_from(n).ok()),
    }
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
