//! Which of a Gateway's `spec.addresses` Berth serves, and why it serves none of the
//! others: the datapath is IPv4 only and serves IP addresses, not names.

use std::{fmt, net::IpAddr, net::Ipv4Addr};

use crate::model::GatewayAddress;

/// The addresses a Gateway is served on, and those it asked for but does not get.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Addresses {
    /// IPv4 addresses served, in `spec.addresses` order without repeats; the default
    /// address (`--address`) when the spec has no IPv4 address.
    pub served: Vec<Ipv4Addr>,
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
    /// An IPv6 address.
    Ipv6,
    /// An `IPAddress` whose value is not an IP address.
    NotAnIp,
}

impl fmt::Display for Unserved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = &self.value;
        match &self.why {
            Why::UnsupportedType(t) => write!(
                f,
                "{value:?} (type {t} is not supported; use an IPv4 IPAddress)"
            ),
            Why::Ipv6 => write!(f, "{value} (IPv6 is not supported yet)"),
            Why::NotAnIp => write!(f, "{value:?} (not an IP address)"),
        }
    }
}

impl Addresses {
    /// Sorts `requested` into served and unserved addresses.
    pub fn of(requested: &[GatewayAddress], default: Option<Ipv4Addr>) -> Self {
        let mut out = Addresses::default();
        for a in requested {
            let kind = a.kind.as_deref().unwrap_or("IPAddress");
            let why = if kind != "IPAddress" {
                Why::UnsupportedType(kind.to_string())
            } else {
                match a.value.parse::<IpAddr>() {
                    Ok(IpAddr::V4(v4)) => {
                        if !out.served.contains(&v4) {
                            out.served.push(v4);
                        }
                        continue;
                    }
                    Ok(IpAddr::V6(_)) => Why::Ipv6,
                    Err(_) => Why::NotAnIp,
                }
            };
            out.unserved.push(Unserved {
                value: a.value.clone(),
                why,
            });
        }
        if out.served.is_empty() {
            out.served.extend(default);
        }
        out
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

    #[test]
    fn ipv4_addresses_are_served_in_order_without_repeats() {
        let a = Addresses::of(
            &[
                address(None, "10.0.0.2"),
                address(Some("IPAddress"), "10.0.0.1"),
                address(None, "10.0.0.2"),
            ],
            Some(Ipv4Addr::new(192, 0, 2, 1)),
        );
        assert_eq!(
            a.served,
            [Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 1)]
        );
        assert!(a.unserved.is_empty());
    }

    #[test]
    fn names_ipv6_and_garbage_are_not_served_and_say_why() {
        let a = Addresses::of(
            &[
                address(Some("Hostname"), "gw.example.com"),
                address(Some("NamedAddress"), "pool-a"),
                address(None, "2001:db8::1"),
                address(None, "10.0.0.300"),
                address(None, "10.0.0.1"),
            ],
            None,
        );
        assert_eq!(a.served, [Ipv4Addr::new(10, 0, 0, 1)]);
        assert_eq!(
            a.unserved_list(),
            "\"gw.example.com\" (type Hostname is not supported; use an IPv4 IPAddress), \
             \"pool-a\" (type NamedAddress is not supported; use an IPv4 IPAddress), \
             2001:db8::1 (IPv6 is not supported yet), \
             \"10.0.0.300\" (not an IP address)"
        );
    }

    #[test]
    fn the_default_address_serves_a_gateway_without_an_ipv4_address() {
        let default = Ipv4Addr::new(192, 0, 2, 1);
        let a = Addresses::of(
            &[address(Some("Hostname"), "gw.example.com")],
            Some(default),
        );
        assert_eq!(a.served, [default]);
        assert_eq!(a.unserved.len(), 1);
        assert_eq!(Addresses::of(&[], Some(default)).served, [default]);
        assert!(Addresses::of(&[], None).served.is_empty());
    }
}
