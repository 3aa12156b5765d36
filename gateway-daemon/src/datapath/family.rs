//! The two address families as the kernel maps hold them: IPv4 addresses as a `u32`,
//! IPv6 ones as `[u32; 4]`, both in network order (the packet's bytes). The userspace
//! view keys everything by `ServiceAddr` and `SocketAddr`; the maps of each family are
//! reached through `ByFamily`, which picks the map an address belongs in.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use gateway_common::{Addr, ServiceKey};

use super::{Protocol, ServiceAddr};

/// An IPv6 address as the maps hold it.
pub type Addr6 = [u32; 4];

/// An address type of the kernel maps.
pub trait MapAddr: Addr + aya::Pod + Ord + std::hash::Hash {
    /// The map form of `ip`, if it is of this family.
    fn of(ip: IpAddr) -> Option<Self>;
    /// The address.
    fn ip(self) -> IpAddr;
}

impl MapAddr for u32 {
    fn of(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V4(a) => Some(u32::from(a).to_be()),
            IpAddr::V6(_) => None,
        }
    }

    fn ip(self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(u32::from_be(self)))
    }
}

impl MapAddr for Addr6 {
    fn of(ip: IpAddr) -> Option<Self> {
        let IpAddr::V6(a) = ip else {
            return None;
        };
        let o = a.octets();
        let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
        Some([word(0), word(4), word(8), word(12)])
    }

    fn ip(self) -> IpAddr {
        let mut o = [0u8; 16];
        for (chunk, word) in o.chunks_exact_mut(4).zip(self) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(o))
    }
}

/// The map key of `(addr, port)` for protocol `proto` (a service, or a backend endpoint
/// in the reply index), if `addr` is of family `A`.
pub fn key<A: MapAddr>(addr: IpAddr, port: u16, proto: u8) -> Option<ServiceKey<A>> {
    Some(ServiceKey {
        addr: A::of(addr)?,
        port: port.to_be(),
        proto,
        pad: 0,
    })
}

/// The service a map key names, if it names a supported protocol.
pub fn service_of<A: MapAddr>(key: &ServiceKey<A>) -> Option<ServiceAddr> {
    Some(ServiceAddr {
        addr: key.addr.ip(),
        protocol: Protocol::from_number(key.proto)?,
        port: u16::from_be(key.port),
    })
}

/// The endpoint a map address and port (network order) name.
pub fn endpoint_of<A: MapAddr>(addr: A, port: u16) -> SocketAddr {
    SocketAddr::new(addr.ip(), u16::from_be(port))
}

impl ServiceAddr {
    /// The service's map key in family `A`'s maps (`None` in the other family's).
    pub fn key<A: MapAddr>(&self) -> Option<ServiceKey<A>> {
        key(self.addr, self.port, self.protocol.number())
    }
}

/// One map (or anything) of each family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ByFamily<M4, M6> {
    /// The IPv4 map.
    pub v4: M4,
    /// The IPv6 map.
    pub v6: M6,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_addresses_are_the_packets_bytes_and_convert_back() {
        let v6: IpAddr = "2001:db8::1:2".parse().unwrap();
        let a = Addr6::of(v6).unwrap();
        let bytes: Vec<u8> = a.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(bytes[..4], [0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!(bytes[12..], [0, 1, 0, 2]);
        assert_eq!(a.ip(), v6);
        assert_eq!(Addr6::of("10.0.0.1".parse().unwrap()), None);
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(u32::of(v4).unwrap().to_ne_bytes(), [10, 0, 0, 1]);
        assert_eq!(u32::of(v4).unwrap().ip(), v4);
    }
}
