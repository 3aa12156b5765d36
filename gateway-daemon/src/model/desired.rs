//! The desired state of the datapath, the planner's output and the datapath's input:
//! which gateway ports go to which weighted backends.

use std::{
    collections::BTreeSet,
    fmt,
    net::{IpAddr, SocketAddr},
};

use serde::{Deserialize, Serialize};

use super::Protocol;

/// A gateway address, protocol and port: what clients connect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServiceAddr {
    /// Gateway address (IPv4 or IPv6).
    pub addr: IpAddr,
    /// Protocol.
    pub protocol: Protocol,
    /// Gateway port.
    pub port: u16,
}

#[cfg(test)]
impl ServiceAddr {
    /// A service of tests: `addr` (an IP address's text), `protocol`, `port`.
    pub(crate) fn of(addr: &str, protocol: Protocol, port: u16) -> Self {
        ServiceAddr {
            addr: addr.parse().expect("an IP address"),
            protocol,
            port,
        }
    }
}

impl fmt::Display for ServiceAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `[2001:db8::1]:80` for IPv6, as `SocketAddr` writes it.
        write!(
            f,
            "{}/{}",
            self.protocol,
            SocketAddr::new(self.addr, self.port)
        )
    }
}

/// A backend endpoint with its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightedBackend {
    /// Backend address and port (of the service's family).
    pub endpoint: SocketAddr,
    /// Relative share of new flows; 0 keeps existing flows but takes no new ones.
    pub weight: u16,
}

/// Services and their backends, as the control plane wants them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredState {
    /// Backends of every service (shared: the planner hands over a route's backends
    /// without copying them, and a service whose backends are the same allocation as
    /// in the state applied before is unchanged without looking further).
    #[serde(with = "service_list")]
    pub services: Services,
    /// Services whose flows are source-NATed (`GatewayConfig.spec.sourceNAT`): the
    /// backend sees the node's address toward it and a port allocated per flow.
    #[serde(default, skip_serializing_if = "imbl::OrdSet::is_empty")]
    pub source_nat: imbl::OrdSet<ServiceAddr>,
    /// The source ports SNAT flows are given (the `--snat-ports` range minus every
    /// listener's ports), in ascending non-overlapping ranges.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snat_ports: Vec<std::ops::RangeInclusive<u16>>,
    /// Flow settings of the services whose route a RouteTrafficPolicy governs (the
    /// others have the defaults).
    #[serde(default, skip_serializing_if = "imbl::OrdMap::is_empty")]
    pub traffic: imbl::OrdMap<ServiceAddr, FlowSettings>,
}

/// A service's flow settings (from a RouteTrafficPolicy of its route).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowSettings {
    /// Whole seconds after which a flow without a packet either way is over (the
    /// service's protocol's timeout; `None`: the default, `SNAT_IDLE_UDP`/`SNAT_IDLE_TCP`
    /// in SNAT mode, none in router mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_secs: Option<u32>,
    /// Session affinity by client address: whole seconds a client's backend is kept
    /// after its last new flow (`None`: no affinity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_secs: Option<u32>,
}

/// The backends of one service.
pub type Backends = std::sync::Arc<Vec<WeightedBackend>>;

/// Services and their backends, in service order: a persistent map, so that a plan
/// copies, compares and drops only the services it changed, however many it holds.
pub type Services = imbl::OrdMap<ServiceAddr, Backends>;

/// JSON/YAML form: a list of `{service, backends}` (map keys must be strings there).
mod service_list {
    use super::*;
    use serde::{Deserializer, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Entry {
        service: ServiceAddr,
        backends: Backends,
    }

    pub fn serialize<S: Serializer>(map: &Services, s: S) -> Result<S::Ok, S::Error> {
        let list: Vec<Entry> = map
            .iter()
            .map(|(service, backends)| Entry {
                service: *service,
                backends: backends.clone(),
            })
            .collect();
        list.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Services, D::Error> {
        let list = Vec::<Entry>::deserialize(d)?;
        Ok(list.into_iter().map(|e| (e.service, e.backends)).collect())
    }
}

/// Every port of the desired state, TCP and UDP together: the ports to reserve from
/// the host's ephemeral ports (`net.ipv4.ip_local_reserved_ports` knows no protocol).
pub fn reserved_ports(state: &DesiredState) -> BTreeSet<u16> {
    state.services.keys().map(|s| s.port).collect()
}

impl DesiredState {
    /// Adds a service, replacing any previous backends of the same address.
    pub fn with_service(mut self, service: ServiceAddr, backends: Vec<WeightedBackend>) -> Self {
        self.services.insert(service, backends.into());
        self
    }

    /// Adds a service in SNAT mode (see `source_nat`).
    pub fn with_snat_service(
        mut self,
        service: ServiceAddr,
        backends: Vec<WeightedBackend>,
    ) -> Self {
        self.source_nat.insert(service);
        self.with_service(service, backends)
    }

    /// Sets the SNAT source ports.
    pub fn with_snat_ports(mut self, ports: Vec<std::ops::RangeInclusive<u16>>) -> Self {
        self.snat_ports = ports;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_ports_are_the_ports_of_every_service_whatever_the_address_or_protocol() {
        let service = |addr: [u8; 4], protocol, port| ServiceAddr {
            addr: IpAddr::from(addr),
            protocol,
            port,
        };
        let state = DesiredState::default()
            .with_service(service([10, 0, 0, 1], Protocol::Tcp, 30000), vec![])
            .with_service(service([10, 0, 0, 2], Protocol::Tcp, 30000), vec![])
            .with_service(service([10, 0, 0, 1], Protocol::Udp, 30053), vec![])
            .with_service(service([10, 0, 0, 1], Protocol::Tcp, 80), vec![]);
        assert_eq!(reserved_ports(&state), BTreeSet::from([80, 30000, 30053]));
    }
}
