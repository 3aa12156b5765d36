//! The host's port settings: the ephemeral port range (`net.ipv4.ip_local_port_range`)
//! and the ports reserved from it (`net.ipv4.ip_local_reserved_ports`). Gateway ports
//! inside the ephemeral range are reserved while programmed: otherwise, when a gateway
//! address is also an address of the host, the reply to one of the host's own
//! connections from such a port would be taken for client traffic and sent to a backend.

use std::{fs, io, ops::RangeInclusive};

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

/// A set of ports: one bit per port (8 KiB), so that sets of tens of thousands of
/// gateway ports are compared, merged and listed in microseconds (as sorted trees,
/// each change of 100,000 routes spent milliseconds rebuilding them).
#[derive(Clone, PartialEq, Eq)]
pub struct PortSet(Box<[u64; 1024]>);

impl Default for PortSet {
    fn default() -> Self {
        PortSet(Box::new([0; 1024]))
    }
}

impl std::fmt::Debug for PortSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl PortSet {
    /// Adds `port`.
    pub fn insert(&mut self, port: u16) {
        self.0[usize::from(port / 64)] |= 1 << (port % 64);
    }

    /// Whether `port` is in the set.
    pub fn contains(&self, port: u16) -> bool {
        self.0[usize::from(port / 64)] & (1 << (port % 64)) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    /// The ports, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            (0..64u16)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| i as u16 * 64 + b)
        })
    }

    /// The ports of `self` not in `other`.
    pub fn minus(&self, other: &PortSet) -> PortSet {
        let mut out = self.clone();
        for (w, o) in out.0.iter_mut().zip(other.0.iter()) {
            *w &= !o;
        }
        out
    }

    /// The ports of either set.
    pub fn union(&self, other: &PortSet) -> PortSet {
        let mut out = self.clone();
        for (w, o) in out.0.iter_mut().zip(other.0.iter()) {
            *w |= o;
        }
        out
    }
}

impl FromIterator<u16> for PortSet {
    fn from_iter<I: IntoIterator<Item = u16>>(ports: I) -> Self {
        let mut out = PortSet::default();
        ports.into_iter().for_each(|p| out.insert(p));
        out
    }
}

/// Updates the reserved ports: removes `release`, adds `reserve`, keeps every other
/// entry (the operator's) as it was. Writes only when something changes.
pub fn update_reserved_ports(release: &PortSet, reserve: &PortSet) -> io::Result<()> {
    let text = fs::read_to_string(RESERVED)?;
    let have = parse_ports(&text);
    let want = have.minus(release).union(reserve);
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
fn parse_ports(text: &str) -> PortSet {
    let mut out = PortSet::default();
    for item in text.trim().split(',').filter(|s| !s.is_empty()) {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        if let (Ok(lo), Ok(hi)) = (lo.trim().parse::<u16>(), hi.trim().parse::<u16>()) {
            (lo..=hi).for_each(|p| out.insert(p));
        }
    }
    out
}

/// Formats ports as the kernel's list, runs joined: `1,2,10-20`.
fn format_ports(ports: &PortSet) -> String {
    let mut runs: Vec<(u16, u16)> = Vec::new();
    for p in ports.iter() {
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
        let ports = parse_ports("30000-30002,8080, 9000,0,65535\n");
        let want = [0, 8080, 9000, 30000, 30001, 30002, 65535];
        assert_eq!(ports, PortSet::from_iter(want));
        assert_eq!(ports.iter().collect::<Vec<_>>(), want);
        assert!(ports.contains(65535) && !ports.contains(65534));
        assert_eq!(format_ports(&ports), "0,8080,9000,30000-30002,65535\n");
        assert!(parse_ports("\n").is_empty());
        assert_eq!(format_ports(&PortSet::default()), "\n");
        let release = PortSet::from_iter([8080, 30001]);
        assert_eq!(
            ports
                .minus(&release)
                .union(&PortSet::from_iter([1]))
                .iter()
                .collect::<Vec<_>>(),
            [0, 1, 9000, 30000, 30002, 65535]
        );
    }
}
