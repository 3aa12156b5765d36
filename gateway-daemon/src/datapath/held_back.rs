//! What the kernel program serves of a desired state: every service whose backends are
//! of its own family. The planner never plans a service with backends of the other
//! family (there is no NAT64: it refuses the route with `IPFamilyMismatch`); a state
//! built otherwise (a test, a future planner bug) has such services held back here, in
//! one place, logged once per change and counted (`berth get routes`,
//! `berth_services_held_back` on /metrics), never dropped silently.

use std::{borrow::Cow, fmt};

use super::{DesiredState, ServiceAddr};

/// A service of the desired state the datapath does not program, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeldBack {
    /// The service.
    pub service: ServiceAddr,
    /// Why it is held back.
    pub why: Why,
}

/// Why a service is held back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Why {
    /// A service with a backend of the other family (the planner never plans one:
    /// there is no NAT64).
    MixedFamilies,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::MixedFamilies => "a backend of the other IP family (there is no NAT64)",
        })
    }
}

impl fmt::Display for HeldBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.service, self.why)
    }
}

/// Splits `desired` into the state the kernel program serves (`desired` itself when
/// all of it is served) and the services held back, in service order. `before` is the
/// state served last, if any: only the services that differ from it are looked at (a
/// service held back then differs from it still).
pub fn kernel_state<'a>(
    desired: &'a DesiredState,
    before: Option<&DesiredState>,
) -> (Cow<'a, DesiredState>, Vec<HeldBack>) {
    use imbl::ordmap::DiffItem;
    let mixed = |(service, backends): (&ServiceAddr, &super::Backends)| {
        let other = |b: &super::WeightedBackend| b.endpoint.is_ipv4() != service.addr.is_ipv4();
        backends.iter().any(other).then_some(HeldBack {
            service: *service,
            why: Why::MixedFamilies,
        })
    };
    let held: Vec<HeldBack> = match before {
        Some(before) => before
            .services
            .diff(&desired.services)
            .filter_map(|item| match item {
                DiffItem::Add(k, v) | DiffItem::Update { new: (k, v), .. } => mixed((k, v)),
                DiffItem::Remove(..) => None,
            })
            .collect(),
        None => desired.services.iter().filter_map(mixed).collect(),
    };
    if held.is_empty() {
        return (Cow::Borrowed(desired), held);
    }
    let mut served = desired.clone();
    for h in &held {
        served.services.remove(&h.service);
        served.source_nat.remove(&h.service);
    }
    (Cow::Owned(served), held)
}

/// The services held back of each family, as `(family label, count)`: `ipv4`, `ipv6`.
pub fn count_by_family(held: &[HeldBack]) -> [(&'static str, u64); 2] {
    let v6 = held.iter().filter(|h| h.service.addr.is_ipv6()).count() as u64;
    [("ipv4", held.len() as u64 - v6), ("ipv6", v6)]
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::datapath::{Protocol, WeightedBackend};

    fn service(addr: &str, port: u16) -> ServiceAddr {
        ServiceAddr::of(addr, Protocol::Tcp, port)
    }

    fn backend(endpoint: &str) -> WeightedBackend {
        WeightedBackend {
            endpoint: endpoint.parse::<SocketAddr>().expect("endpoint"),
            weight: 1,
        }
    }

    #[test]
    fn an_ipv4_only_state_is_served_as_it_is() {
        let desired = DesiredState::default()
            .with_snat_service(service("10.0.0.1", 80), vec![backend("10.1.0.1:8080")]);
        let (served, held) = kernel_state(&desired, None);
        assert!(matches!(served, Cow::Borrowed(_)));
        assert_eq!(*served, desired);
        assert!(held.is_empty());
    }

    #[test]
    fn services_with_backends_of_the_other_family_are_held_back_and_named() {
        let v6 = service("2001:db8::1", 80);
        let served_state = DesiredState::default()
            .with_service(service("10.0.0.1", 80), vec![backend("10.1.0.1:8080")])
            .with_snat_service(v6, vec![backend("[2001:db8:1::1]:8080")]);
        let desired = served_state
            .clone()
            .with_service(
                service("10.0.0.1", 81),
                vec![backend("[2001:db8:1::1]:8080")],
            )
            .with_snat_service(service("2001:db8::1", 81), vec![backend("10.1.0.1:8080")]);
        let (served, held) = kernel_state(&desired, None);
        assert_eq!(*served, served_state, "both families are served");
        let named = [
            "TCP/10.0.0.1:81 (a backend of the other IP family (there is no NAT64))",
            "TCP/[2001:db8::1]:81 (a backend of the other IP family (there is no NAT64))",
        ];
        assert_eq!(
            held.iter().map(ToString::to_string).collect::<Vec<_>>(),
            named
        );
        assert_eq!(count_by_family(&held), [("ipv4", 1), ("ipv6", 1)]);
        // Looked at again against what was served: the same services, still held back.
        let (again, held_again) = kernel_state(&desired, Some(&served));
        assert_eq!(*again, served_state);
        assert_eq!(held_again, held);
        // A change elsewhere is seen, and the held back stay held back.
        let changed = desired
            .clone()
            .with_service(service("10.0.0.1", 82), vec![backend("10.1.0.2:8080")]);
        let (served_now, held_now) = kernel_state(&changed, Some(&served));
        assert_eq!(served_now.services.len(), served_state.services.len() + 1);
        assert_eq!(held_now, held);
    }
}
