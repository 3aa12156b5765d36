//! The desired state of the datapath: which gateway ports go to which weighted backends.

use std::{
    collections::BTreeMap,
    fmt,
    net::{Ipv4Addr, SocketAddrV4},
};

use gateway_common::{proto, ServiceKey};
use serde::{Deserialize, Serialize};

/// Transport protocol of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Protocol {
    /// IP protocol number.
    pub const fn number(self) -> u8 {
        match self {
            Protocol::Tcp => proto::TCP,
            Protocol::Udp => proto::UDP,
        }
    }

    fn from_number(n: u8) -> Option<Self> {
        match n {
            proto::TCP => Some(Protocol::Tcp),
            proto::UDP => Some(Protocol::Udp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        })
    }
}

/// A gateway address, protocol and port: what clients connect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServiceAddr {
    /// Gateway address.
    pub addr: Ipv4Addr,
    /// Protocol.
    pub protocol: Protocol,
    /// Gateway port.
    pub port: u16,
}

impl ServiceAddr {
    /// The map key for this service.
    pub fn key(&self) -> ServiceKey {
        ServiceKey {
            addr: u32::from(self.addr).to_be(),
            port: self.port.to_be(),
            proto: self.protocol.number(),
            pad: 0,
        }
    }

    /// The service a map key names, if it names a supported protocol.
    pub fn from_key(key: &ServiceKey) -> Option<Self> {
        Some(ServiceAddr {
            addr: Ipv4Addr::from(u32::from_be(key.addr)),
            protocol: Protocol::from_number(key.proto)?,
            port: u16::from_be(key.port),
        })
    }
}

impl fmt::Display for ServiceAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.protocol, self.addr, self.port)
    }
}

/// A backend endpoint with its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightedBackend {
    /// Backend address and port.
    pub endpoint: SocketAddrV4,
    /// Relative share of new flows; 0 keeps existing flows but takes no new ones.
    pub weight: u16,
}

/// Services and their backends, as the control plane wants them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredState {
    /// Backends of every service.
    #[serde(with = "service_list")]
    pub services: BTreeMap<ServiceAddr, Vec<WeightedBackend>>,
}

/// JSON/YAML form: a list of `{service, backends}` (map keys must be strings there).
mod service_list {
    use super::*;
    use serde::{Deserializer, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Entry {
        service: ServiceAddr,
        backends: Vec<WeightedBackend>,
    }

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<ServiceAddr, Vec<WeightedBackend>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let list: Vec<Entry> = map
            .iter()
            .map(|(service, backends)| Entry {
                service: *service,
                backends: backends.clone(),
            })
            .collect();
        list.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<ServiceAddr, Vec<WeightedBackend>>, D::Error> {
        let list = Vec::<Entry>::deserialize(d)?;
        Ok(list.into_iter().map(|e| (e.service, e.backends)).collect())
    }
}

/// Backends of one service keyed by endpoint (duplicates merged by adding weights).
pub(crate) type BackendSet = BTreeMap<SocketAddrV4, u16>;

impl DesiredState {
    /// Adds a service, replacing any previous backends of the same address.
    pub fn with_service(mut self, service: ServiceAddr, backends: Vec<WeightedBackend>) -> Self {
        self.services.insert(service, backends);
        self
    }

    pub(crate) fn normalized(&self) -> BTreeMap<ServiceKey, BackendSet> {
        self.services
            .iter()
            .map(|(service, backends)| {
                let mut set = BackendSet::new();
                for b in backends {
                    let w = set.entry(b.endpoint).or_default();
                    *w = w.saturating_add(b.weight);
                }
                (service.key(), set)
            })
            .collect()
    }
}
