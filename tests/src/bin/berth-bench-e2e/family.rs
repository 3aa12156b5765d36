//! The address family a load is sent in (`--family`): its addresses on the topology,
//! the modes that run in it, and the comparison of each mode's IPv6 cost with its IPv4
//! cost (a table, Berth's headline, the JSON line's `family_ratios`).

use super::*;

/// The address family of a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    V4,
    V6,
}

/// The IPv6 new-flow load's clients (fd00:250::1-fd00:250::800 of it), routed to the
/// client by the gateway as `NEW_SOURCES` is.
const NEW_SOURCES6: &str = "fd00:250::/64";
const NEW_FIRST_SOURCE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 1);

/// The modes that take no IPv6 load: source NAT (Berth's SNAT, MASQUERADE) and IPVS.
const V4_ONLY: [Mode; 3] = [Mode::Ipvs, Mode::BerthSnat, Mode::IptablesMasq];

impl Family {
    /// The JSON rows' `family`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    /// What labels add: nothing for IPv4 (the labels the bench always had), `/v6`.
    pub(super) fn suffix(self) -> &'static str {
        match self {
            Family::V4 => "",
            Family::V6 => "/v6",
        }
    }

    /// The frame the generator sends: Ethernet + IP + UDP + `PAYLOAD` bytes, without
    /// the FCS (64 bytes with it for IPv4, 84 for IPv6's 40-byte header).
    pub(super) fn frame_bytes(self) -> usize {
        match self {
            Family::V4 => 14 + 20 + 8 + PAYLOAD,
            Family::V6 => 14 + 40 + 8 + PAYLOAD,
        }
    }

    pub(super) fn what(self) -> String {
        match self {
            Family::V4 => format!(
                "IPv4, {}-byte frames (+ FCS: 64), no UDP checksum",
                self.frame_bytes()
            ),
            Family::V6 => format!(
                "IPv6, {}-byte frames (+ FCS: {}; the same {PAYLOAD}-byte payload), UDP checksum kept valid per frame; gateway {GW6}; iptables modes run ip6tables, nftables the ip6 family",
                self.frame_bytes(),
                self.frame_bytes() + 4
            ),
        }
    }

    /// The gateway's address.
    pub(super) fn gateway(self) -> IpAddr {
        match self {
            Family::V4 => GW.into(),
            Family::V6 => GW6.into(),
        }
    }

    /// The backends' addresses on `topo`.
    pub(super) fn backends(self, topo: &Topology) -> Vec<IpAddr> {
        match self {
            Family::V4 => topo.backend_addrs.iter().map(|&a| a.into()).collect(),
            Family::V6 => topo.backend_addrs6.iter().map(|&a| a.into()).collect(),
        }
    }

    /// The long flows' source address.
    pub(super) fn client(self) -> IpAddr {
        match self {
            Family::V4 => CLIENT.into(),
            Family::V6 => CLIENT6.into(),
        }
    }

    /// The new-flow load's first source address.
    pub(super) fn new_first_source(self) -> IpAddr {
        match self {
            Family::V4 => NEW_FIRST_SOURCE.into(),
            Family::V6 => NEW_FIRST_SOURCE6.into(),
        }
    }

    /// Routes the new-flow load's sources to the client in the gateway: one route via
    /// the client's address, so one neighbour entry serves every source.
    pub(super) fn route_new_sources(self, topo: &Topology) {
        let (flag, prefix) = match self {
            Family::V4 => ("-4", NEW_SOURCES),
            Family::V6 => ("-6", NEW_SOURCES6),
        };
        let via = self.client().to_string();
        topo.gateway
            .ip(&[flag, "route", "add", prefix, "via", &via]);
    }

    /// Whether `mode` takes this family's load.
    pub(super) fn runs(self, mode: Mode) -> bool {
        self == Family::V4 || !V4_ONLY.contains(&mode)
    }

    /// `tool` (iptables-legacy, iptables-nft) for this family (ip6tables-...).
    pub(super) fn iptables(self, tool: &'static str) -> String {
        match self {
            Family::V4 => tool.into(),
            Family::V6 => tool.replacen("iptables", "ip6tables", 1),
        }
    }

    /// The nftables family and its address match.
    pub(super) fn nft(self) -> (&'static str, &'static str) {
        match self {
            Family::V4 => ("ip", "ip daddr"),
            Family::V6 => ("ip6", "ip6 daddr"),
        }
    }
}

/// The frames' sizes with the FCS, e.g. "64-byte" or "64-byte (IPv4) and 84-byte (IPv6)".
pub(super) fn frame_sizes(sections: &[Section]) -> String {
    let mut families: Vec<Family> = sections.iter().map(|s| s.family).collect();
    families.dedup();
    let size = |f: Family| format!("{}-byte", f.frame_bytes() + 4);
    match families[..] {
        [Family::V4] => size(Family::V4),
        [f] => format!("{} ({})", size(f), f.name()),
        _ => format!(
            "{} (IPv4) and {} (IPv6)",
            size(Family::V4),
            size(Family::V6)
        ),
    }
}

/// Each mode's IPv6 rows against its IPv4 rows on the same topology and load.
pub(super) struct Pair<'a> {
    pub(super) backends: Backends,
    pub(super) flows: FlowLoad,
    pub(super) v4: &'a Row,
    pub(super) v6: &'a Row,
}

impl Pair<'_> {
    /// IPv6's gateway ns per packet over IPv4's (> 1: IPv6 costs more).
    fn cpu(&self) -> Option<f64> {
        Some(self.v6.ns()? / self.v4.ns()?)
    }
}

/// The pairs of rows measured in both families.
pub(super) fn pairs(sections: &[Section]) -> Vec<Pair<'_>> {
    let mut pairs = Vec::new();
    for s4 in sections.iter().filter(|s| s.family == Family::V4) {
        let Some(s6) = sections
            .iter()
            .find(|s| s.family == Family::V6 && s.backends == s4.backends && s.flows == s4.flows)
        else {
            continue;
        };
        for v4 in &s4.rows {
            if let Some(v6) = s6.rows.iter().find(|r| r.mode == v4.mode) {
                pairs.push(Pair {
                    backends: s4.backends,
                    flows: s4.flows,
                    v4,
                    v6,
                });
            }
        }
    }
    pairs
}

/// IPv4 and IPv6 side by side, a line per mode, load and topology.
pub(super) fn family_table(sections: &[Section]) -> String {
    let pairs = pairs(sections);
    if pairs.is_empty() {
        return String::new();
    }
    let mut t = format!(
        "{:<14} {:<10} {:>11} {:>11} {:>10} {:>10} {:>9}\n",
        "mode", "load", "v4 dlv kpps", "v6 dlv kpps", "v4 ns/pkt", "v6 ns/pkt", "v6/v4 ns"
    );
    let num = |v: Option<f64>, scale: f64, digits: usize| {
        v.map_or("-".into(), |v| format!("{:.*}", digits, v / scale))
    };
    for p in &pairs {
        let _ = writeln!(
            t,
            "{:<14} {:<10} {:>11} {:>11} {:>10} {:>10} {:>9}",
            p.v4.mode.name(),
            format!("{}@{}", p.flows.name(), p.backends.name()),
            num(p.v4.pps(), 1e3, 1),
            num(p.v6.pps(), 1e3, 1),
            num(p.v4.ns(), 1.0, 0),
            num(p.v6.ns(), 1.0, 0),
            num(p.cpu(), 1.0, 2),
        );
    }
    t
}

/// "Berth IPv6 vs IPv4: ..." for the IPv6 section `section`, if its IPv4 twin ran.
pub(super) fn family_headline(section: &Section, sections: &[Section]) -> Option<String> {
    if section.family != Family::V6 {
        return None;
    }
    let p = pairs(sections).into_iter().find(|p| {
        p.v4.mode == Mode::Berth && p.backends == section.backends && p.flows == section.flows
    })?;
    Some(format!(
        "Berth IPv6 vs IPv4 ({}@{}): {:.0} against {:.0} ns of gateway CPU per packet ({:.2}x)",
        p.flows.name(),
        p.backends.name(),
        p.v6.ns()?,
        p.v4.ns()?,
        p.cpu()?
    ))
}

/// The JSON line's `family_ratios`: per mode, load and topology, IPv6 against IPv4.
pub(super) fn family_json(sections: &[Section]) -> Vec<Value> {
    pairs(sections)
        .iter()
        .map(|p| {
            let r = |v: Option<f64>, digits| v.map(|v| round(v, digits));
            json!({
                "mode": p.v4.mode.name(),
                "backends": p.backends.name(),
                "flows": p.flows.name(),
                "ipv4_gateway_ns_per_packet": r(p.v4.ns(), 1),
                "ipv6_gateway_ns_per_packet": r(p.v6.ns(), 1),
                "ipv6_over_ipv4_ns": r(p.cpu(), 3),
                "ipv4_delivered_pps": r(p.v4.pps(), 0),
                "ipv6_delivered_pps": r(p.v6.pps(), 0),
            })
        })
        .collect()
}
