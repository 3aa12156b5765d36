//! Which `Host` the admin endpoint answers: an IP literal, `localhost`, or the host of
//! `--admin-addr`. A web page whose name an attacker re-points at 127.0.0.1 (DNS
//! rebinding) reaches the endpoint with its own name as `Host` (`evil.example`), and
//! read the state API, every route, claim and backend, as a page of the same origin;
//! the endpoint never looked at `Host` until a tenant-safety campaign found it so.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The `Host` values a listener answers.
#[derive(Clone, Debug)]
pub struct AllowedHosts {
    /// The host part of the configured address (`--admin-addr`), lowercase.
    configured: String,
}

impl AllowedHosts {
    /// IP literals, `localhost` and the host of `admin_addr` (`HOST:PORT`).
    pub fn new(admin_addr: &str) -> Self {
        AllowedHosts {
            configured: host_part(admin_addr).to_ascii_lowercase(),
        }
    }

    /// Whether a request with `host` (the `Host` header, or the authority of an
    /// absolute URI) is answered. A request without one (HTTP/1.0) is: every browser
    /// sends it.
    pub fn allows(&self, host: Option<&str>) -> bool {
        let Some(host) = host else {
            return true;
        };
        let name = host_part(host);
        if name.starts_with('[') {
            return name
                .strip_prefix('[')
                .and_then(|n| n.strip_suffix(']'))
                .is_some_and(|ip| ip.parse::<Ipv6Addr>().is_ok());
        }
        name.parse::<Ipv4Addr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || (!self.configured.is_empty() && name.eq_ignore_ascii_case(&self.configured))
    }
}

/// `host` of `host:port` (`[v6]` of `[v6]:port`), or all of it without a port.
fn host_part(authority: &str) -> &str {
    let port = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) if authority[end + 1..].strip_prefix(':').is_some_and(port) => {
                &authority[..=end]
            }
            // Anything else after the brackets is no IPv6 literal: left whole.
            _ => authority,
        };
    }
    match authority.rsplit_once(':') {
        Some((host, p)) if port(p) => host,
        _ => authority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_literals_localhost_and_the_configured_host_are_allowed_and_others_not() {
        let hosts = AllowedHosts::new("berth-admin.internal:9470");
        for ok in [
            "127.0.0.1",
            "127.0.0.1:9470",
            "10.1.2.3:80",
            "[::1]",
            "[::1]:9470",
            "localhost",
            "LocalHost:9470",
            "berth-admin.internal",
            "berth-admin.internal:9470",
        ] {
            assert!(hosts.allows(Some(ok)), "{ok} refused");
        }
        for bad in [
            "evil.example",
            "evil.example:9470",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "[::1].evil",
            "[evil]",
            "",
            "berth",
        ] {
            assert!(!hosts.allows(Some(bad)), "{bad} allowed");
        }
        assert!(hosts.allows(None), "an HTTP/1.0 request without Host");
        // An IP address as --admin-addr names no other host.
        assert!(!AllowedHosts::new("127.0.0.1:9470").allows(Some("evil.example")));
    }
}
