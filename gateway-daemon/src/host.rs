//! The host's port settings: the ephemeral port range (`net.ipv4.ip_local_port_range`)
//! and the ports reserved from it (`net.ipv4.ip_local_reserved_ports`). Gateway ports
//! inside the ephemeral range are reserved while programmed: otherwise, when a gateway
//! address is also an address of the host, the reply to one of the host's own
//! connections from such a port would be taken for client traffic and sent to a backend.

use std::{collections::BTreeSet, fs, io, ops::RangeInclusive};

const PORT_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
const RESERVED: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";

/// The host's ephemeral port range (of this network namespace), if readable.
pub fn ephemeral_ports() -> Option<RangeInclusive<u16>> {
    let text = fs::read_to_string(PORT_RANGE).ok()?;
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    match (it.next(), it.next()) {
        (Some(Ok(lo)), Some(Ok(hi))) if lo <= hi => Some(lo..=hi),
        _ => None,
    }
}

/// Updates the reserved ports: removes `release`, adds `reserve`, keeps every other
/// entry (the operator's) as it was. Writes only when something changes.
pub fn update_reserved_ports(release: &BTreeSet<u16>, reserve: &BTreeSet<u16>) -> io::Result<()> {
    let text = fs::read_to_string(RESERVED)?;
    let have = parse_ports(&text);
    let mut want: BTreeSet<u16> = have.difference(release).copied().collect();
    want.extend(reserve);
    if want != have {
        fs::write(RESERVED, format_ports(&want))?;
    }
    Ok(())
}

/// Turns off ICMP redirects on `ifaces` (and `all`, which the kernel ORs in): a NAT
/// gateway that forwards a packet back out of the interface it came in on (one-arm)
/// would otherwise tell the backend to reach the client directly, and the backend's
/// replies would then bypass the gateway untranslated (measured: a UDP stream stopped
/// after ten replies). Returns the settings it changed.
pub fn disable_icmp_redirects(ifaces: &[String]) -> io::Result<Vec<String>> {
    let mut changed = Vec::new();
    for name in std::iter::once("all").chain(ifaces.iter().map(String::as_str)) {
        let path = format!("/proc/sys/net/ipv4/conf/{name}/send_redirects");
        if fs::read_to_string(&path)?.trim() != "0" {
            fs::write(&path, "0\n")?;
            changed.push(format!("net.ipv4.conf.{name}.send_redirects"));
        }
    }
    Ok(changed)
}

/// Turns `proxy_ndp` on for `ifaces`, so that the proxy neighbour entries of the IPv6
/// gateway addresses are answered there (as the host answers ARP for the IPv4 ones on
/// the dummy interface). Returns the settings it changed.
pub fn enable_proxy_ndp(ifaces: &[String]) -> io::Result<Vec<String>> {
    let mut changed = Vec::new();
    for name in ifaces {
        let path = format!("/proc/sys/net/ipv6/conf/{name}/proxy_ndp");
        match fs::read_to_string(&path) {
            Ok(v) if v.trim() == "1" => {}
            Ok(_) => {
                fs::write(&path, "1\n")?;
                changed.push(format!("net.ipv6.conf.{name}.proxy_ndp"));
            }
            // IPv6 disabled on the interface (or in the kernel): nothing to answer.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(changed)
}

/// Whether the kernel forwards IPv6 on interface `iface` (`all` for the default).
pub fn ipv6_forwarding(iface: &str) -> io::Result<bool> {
    Ok(fs::read_to_string(format!("/proc/sys/net/ipv6/conf/{iface}/forwarding"))?.trim() == "1")
}

/// Parses the kernel's list format: `1,2,10-20` (empty: none). Bad items are skipped.
fn parse_ports(text: &str) -> BTreeSet<u16> {
    let mut out = BTreeSet::new();
    for item in text.trim().split(',').filter(|s| !s.is_empty()) {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        if let (Ok(lo), Ok(hi)) = (lo.trim().parse::<u16>(), hi.trim().parse::<u16>()) {
            out.extend(lo..=hi);
        }
    }
    out
}

/// Formats ports as the kernel's list, runs joined: `1,2,10-20`.
fn format_ports(ports: &BTreeSet<u16>) -> String {
    let mut runs: Vec<(u16, u16)> = Vec::new();
    for &p in ports {
        match runs.last_mut() {
            Some((_, hi)) if hi.checked_add(1) == Some(p) => *hi = p,
            _ => runs.push((p, p)),
        }
    }
    let items: Vec<String> = runs
        .iter()
        .map(|&(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect();
    format!("{}\n", items.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_port_lists_round_trip_with_runs_joined() {
        let ports = parse_ports("30000-30002,8080, 9000\n");
        assert_eq!(ports, BTreeSet::from([8080, 9000, 30000, 30001, 30002]));
        assert_eq!(format_ports(&ports), "8080,9000,30000-30002\n");
        assert!(parse_ports("\n").is_empty());
        assert_eq!(format_ports(&BTreeSet::new()), "\n");
    }
}
