//! Which of a Gateway's `spec.addresses` Berth serves, and why it serves none of the
//! others: the datapath serves IP addresses (IPv4 and IPv6), not names. Also the IP
//! families: a Gateway serves each family of its addresses, and a route's backends
//! of a family serve that family only (no NAT64).

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use crate::model::GatewayAddress;

/// An IP family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

impl Family {
    /// Both families, IPv4 first.
    pub const ALL: [Family; 2] = [Family::Ipv4, Family::Ipv6];

    /// The family of `ip`.
    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::Ipv4,
            IpAddr::V6(_) => Family::Ipv6,
        }
    }

    /// The family an EndpointSlice's `addressType` names (`IPv4`, `IPv6`), if any.
    pub fn of_address_type(t: &str) -> Option<Family> {
        match t {
            "IPv4" => Some(Family::Ipv4),
            "IPv6" => Some(Family::Ipv6),
            _ => None,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Ipv4 => "IPv4",
            Family::Ipv6 => "IPv6",
        })
    }
}

/// A set of IP families.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Families {
    /// IPv4 is in the set.
    pub ipv4: bool,
    /// IPv6 is in the set.
    pub ipv6: bool,
}

impl Families {
    /// The families of `ips`.
    pub fn of<'a>(ips: impl IntoIterator<Item = &'a IpAddr>) -> Families {
        Families::of_iter(ips.into_iter().map(Family::of))
    }

    /// The set of `families`.
    pub fn of_iter(families: impl IntoIterator<Item = Family>) -> Families {
        let mut out = Families::default();
        for f in families {
            out.insert(f);
        }
        out
    }

    /// Adds `family`.
    pub fn insert(&mut self, family: Family) {
        match family {
            Family::Ipv4 => self.ipv4 = true,
            Family::Ipv6 => self.ipv6 = true,
        }
    }

    /// Whether `family` is in the set.
    pub fn contains(self, family: Family) -> bool {
        match family {
            Family::Ipv4 => self.ipv4,
            Family::Ipv6 => self.ipv6,
        }
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        !self.ipv4 && !self.ipv6
    }

    /// Whether the sets share a family.
    pub fn meets(self, other: Families) -> bool {
        (self.ipv4 && other.ipv4) || (self.ipv6 && other.ipv6)
    }

    /// The families in the set, IPv4 first.
    pub fn iter(self) -> impl Iterator<Item = Family> {
        Family::ALL.into_iter().filter(move |f| self.contains(*f))
    }
}

impl fmt::Display for Families {
    /// `IPv4`, `IPv6`, `IPv4 and IPv6`, or `no IP family`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.ipv4, self.ipv6) {
            (true, true) => f.write_str("IPv4 and IPv6"),
            (true, false) => f.write_str("IPv4"),
            (false, true) => f.write_str("IPv6"),
            (false, false) => f.write_str("no IP family"),
        }
    }
}

/// The addresses Gateways without a served address of their own get (`--address`,
/// given once per family at most).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DefaultAddresses {
    /// The IPv4 default address.
    pub ipv4: Option<Ipv4Addr>,
    /// The IPv6 default address.
    pub ipv6: Option<Ipv6Addr>,
}

/// `--address` given twice for one family.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("--address is given twice for {family} ({first} and {second}): give at most one address per family")]
pub struct TwiceForOneFamily {
    /// The family.
    pub family: Family,
    /// The address given first.
    pub first: IpAddr,
    /// The address given second.
    pub second: IpAddr,
}

impl DefaultAddresses {
    /// The default addresses `list` gives (`--address` repeated), at most one per family.
    pub fn from_list(list: &[IpAddr]) -> Result<Self, TwiceForOneFamily> {
        let mut out = DefaultAddresses::default();
        for &ip in list {
            let first = match ip {
                IpAddr::V4(v4) => out.ipv4.replace(v4).map(IpAddr::V4),
                IpAddr::V6(v6) => out.ipv6.replace(v6).map(IpAddr::V6),
            };
            if let Some(first) = first.filter(|f| *f != ip) {
                return Err(TwiceForOneFamily {
                    family: Family::of(&ip),
                    first,
                    second: ip,
                });
            }
        }
        Ok(out)
    }

    /// The addresses, IPv4 first.
    pub fn iter(&self) -> impl Iterator<Item = IpAddr> {
        let v4 = self.ipv4.map(IpAddr::V4);
        let v6 = self.ipv6.map(IpAddr::V6);
        v4.into_iter().chain(v6)
    }
}

/// The addresses a Gateway is served on, and those it asked for but does not get.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Addresses {
    /// Addresses served (IPv4 and IPv6), in `spec.addresses` order without repeats;
    /// the default address of each family (`--address`) when the spec has no address
    /// Berth can serve.
    pub served: Vec<IpAddr>,
    /// Addresses of the spec that are not served.
    pub unserved: Vec<Unserved>,
}

/// A requested address Berth does not serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unserved {
    /// The value as written.
    pub value: String,
    /// Why it is not served.
    pub why: Why,
}

/// Why a requested address is not served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// A type other than `IPAddress` (`Hostname`, `NamedAddress`, a domain-prefixed one).
    UnsupportedType(String),
    /// An `IPAddress` whose value is not an IP address.
    NotAnIp,
}

impl fmt::Display for Unserved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = &self.value;
        match &self.why {
            Why::UnsupportedType(t) => {
                write!(f, "{value:?} (type {t} is not supported; use an IPAddress)")
            }
            Why::NotAnIp => write!(f, "{value:?} (not an IP address)"),
        }
    }
}

impl Addresses {
    /// Sorts `requested` into served and unserved addresses.
    pub fn of(requested: &[GatewayAddress], default: DefaultAddresses) -> Self {
        let mut out = Addresses::default();
        for a in requested {
            let kind = a.kind.as_deref().unwrap_or("IPAddress");
            let why = if kind != "IPAddress" {
                Why::UnsupportedType(kind.to_string())
            } else {
                match a.value.parse::<IpAddr>() {
                    Ok(ip) => {
                        // One textual form per address (`2001:DB8::1` is `2001:db8::1`).
                        if !out.served.contains(&ip) {
                            out.served.push(ip);
                        }
                        continue;
                    }
                    Err(_) => Why::NotAnIp,
                }
            };
            out.unserved.push(Unserved {
                value: a.value.clone(),
                why,
            });
        }
        if out.served.is_empty() {
            out.served.extend(default.iter());
        }
        out
    }

    /// The families served.
    pub fn families(&self) -> Families {
        Families::of(&self.served)
    }

    /// The served addresses, comma-separated.
    pub fn served_list(&self) -> String {
        list(&self.served)
    }

    /// The unserved addresses with their reasons, comma-separated.
    pub fn unserved_list(&self) -> String {
        list(&self.unserved)
    }
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(kind: Option<&str>, value: &str) -> GatewayAddress {
        GatewayAddress {
            kind: kind.map(str::to_string),
            value: value.to_string(),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    const V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9);

    #[test]
    fn addresses_of_both_families_are_served_in_order_without_repeats() {
        let a = Addresses::of(
            &[
                address(None, "10.0.0.2"),
                address(Some("IPAddress"), "2001:DB8:0::1"),
                address(Some("IPAddress"), "10.0.0.1"),
                address(None, "10.0.0.2"),
                address(None, "2001:db8::1"),
            ],
            DefaultAddresses {
                ipv4: Some(V4),
                ipv6: None,
            },
        );
        assert_eq!(
            a.served,
            [ip("10.0.0.2"), ip("2001:db8::1"), ip("10.0.0.1")]
        );
        assert_eq!(a.served_list(), "10.0.0.2, 2001:db8::1, 10.0.0.1");
        assert!(a.unserved.is_empty());
        assert_eq!(a.families().to_string(), "IPv4 and IPv6");
    }

    #[test]
    fn names_and_garbage_are_not_served_and_say_why() {
        let a = Addresses::of(
            &[
                address(Some("Hostname"), "gw.example.com"),
                address(Some("NamedAddress"), "pool-a"),
                address(None, "2001:db8::1"),
                address(None, "10.0.0.300"),
                address(None, "10.0.0.1"),
            ],
            DefaultAddresses::default(),
        );
        assert_eq!(a.served, [ip("2001:db8::1"), ip("10.0.0.1")]);
        assert_eq!(
            a.unserved_list(),
            "\"gw.example.com\" (type Hostname is not supported; use an IPAddress), \
             \"pool-a\" (type NamedAddress is not supported; use an IPAddress), \
             \"10.0.0.300\" (not an IP address)"
        );
    }

    #[test]
    fn a_gateway_without_an_address_is_served_on_the_default_address_of_each_family() {
        let both = DefaultAddresses {
            ipv4: Some(V4),
            ipv6: Some(V6),
        };
        let a = Addresses::of(&[address(Some("Hostname"), "gw.example.com")], both);
        assert_eq!(a.served, [IpAddr::V4(V4), IpAddr::V6(V6)]);
        assert_eq!(a.unserved.len(), 1);
        let v6_only = DefaultAddresses {
            ipv4: None,
            ipv6: Some(V6),
        };
        assert_eq!(Addresses::of(&[], v6_only).served, [IpAddr::V6(V6)]);
        assert!(Addresses::of(&[], DefaultAddresses::default())
            .served
            .is_empty());
        // An address of its own, of either family, replaces both defaults.
        let own = Addresses::of(&[address(None, "2001:db8::5")], both);
        assert_eq!(own.served, [ip("2001:db8::5")]);
    }

    #[test]
    fn address_is_accepted_once_per_family() {
        let d = DefaultAddresses::from_list(&[ip("2001:db8::9"), ip("192.0.2.1")]).expect("ok");
        assert_eq!(
            d,
            DefaultAddresses {
                ipv4: Some(V4),
                ipv6: Some(V6)
            }
        );
        assert_eq!(
            d.iter().collect::<Vec<_>>(),
            [IpAddr::V4(V4), IpAddr::V6(V6)]
        );
        let err = DefaultAddresses::from_list(&[ip("192.0.2.1"), ip("192.0.2.2")])
            .expect_err("two IPv4 addresses");
        assert_eq!(
            err.to_string(),
            "--address is given twice for IPv4 (192.0.2.1 and 192.0.2.2): give at most one \
             address per family"
        );
        assert!(DefaultAddresses::from_list(&[ip("fd00::1"), ip("fd00::2")]).is_err());
        assert_eq!(
            DefaultAddresses::from_list(&[]).expect("none"),
            DefaultAddresses::default()
        );
    }
}
