//! What one event of the gateway program says (`gateway_common::MonitorEvent`), read
//! from the ring buffer's bytes: pure, no kernel.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use gateway_common::{proto, Counter, MONITOR_BYTES};
use serde::Serialize;

/// An event as read from the ring buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// `CLOCK_MONOTONIC` when sent, in nanoseconds.
    pub time_ns: u64,
    /// What it was counted as.
    pub reason: Counter,
    /// The XDP verdict (the TC program's: drop or pass).
    pub action: u32,
    /// The interface it arrived on (XDP) or leaves by (TC).
    pub ifindex: u32,
    /// The CPU that carried it.
    pub cpu: u32,
    /// Which program saw it (`gateway_common::HOOK_XDP`, `HOOK_TC`).
    pub hook: u16,
    /// The packet's length as it left (Ethernet header included).
    pub len: u32,
    /// Its head as it entered.
    pub entered: Vec<u8>,
    /// Its head as it left.
    pub left: Vec<u8>,
}

/// Offsets of `MonitorEvent`'s fields (`repr(C)`, its size pinned in gateway-common).
const ENTERED: usize = 32;
const LEFT: usize = ENTERED + MONITOR_BYTES;

impl Event {
    /// The event in `bytes` (a ring buffer record), if it is one.
    pub fn parse(bytes: &[u8]) -> Option<Event> {
        if bytes.len() < LEFT + MONITOR_BYTES {
            return None;
        }
        let u32_at = |o: usize| u32::from_ne_bytes(bytes[o..o + 4].try_into().unwrap());
        let u16_at = |o: usize| u16::from_ne_bytes(bytes[o..o + 2].try_into().unwrap());
        let head = |o: usize, len: u16| bytes[o..o + (len as usize).min(MONITOR_BYTES)].to_vec();
        Some(Event {
            time_ns: u64::from_ne_bytes(bytes[0..8].try_into().unwrap()),
            reason: Counter::from_index(u32_at(8))?,
            action: u32_at(12),
            ifindex: u32_at(16),
            cpu: u32::from(u16_at(20)),
            hook: u16_at(22),
            len: u32_at(24),
            entered: head(ENTERED, u16_at(28)),
            left: head(LEFT, u16_at(30)),
        })
    }

    /// Which program saw it: `xdp` (ingress) or `tc` (egress).
    pub fn hook_name(&self) -> &'static str {
        if self.hook == gateway_common::HOOK_TC {
            "tc"
        } else {
            "xdp"
        }
    }

    /// The verdict's name.
    pub fn verdict(&self) -> &'static str {
        match self.action {
            0 => "aborted",
            1 => "drop",
            2 => "pass",
            3 => "tx",
            4 => "redirect",
            _ => "?",
        }
    }
}

/// The headers of a packet's head that say which flow it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Headers {
    /// `tcp`, `udp`, `icmp`, `icmpv6`, or the IP protocol's number.
    #[serde(serialize_with = "proto_name")]
    pub proto: u8,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port (TCP, UDP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sport: Option<u16>,
    /// Destination port (TCP, UDP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dport: Option<u16>,
    /// TCP flags.
    #[serde(skip_serializing_if = "Option::is_none", rename = "tcpFlags")]
    pub tcp_flags: Option<u8>,
}

fn proto_name<S: serde::Serializer>(p: &u8, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&name_of(*p))
}

/// A protocol's name.
fn name_of(p: u8) -> String {
    match p {
        proto::TCP => "tcp".into(),
        proto::UDP => "udp".into(),
        proto::ICMP => "icmp".into(),
        proto::ICMPV6 => "icmpv6".into(),
        n => n.to_string(),
    }
}

impl Headers {
    /// The IPv4 or IPv6 headers of an Ethernet frame's head, if it has them.
    pub fn parse(frame: &[u8]) -> Option<Headers> {
        let ether_type = u16::from_be_bytes(frame.get(12..14)?.try_into().ok()?);
        let (proto, src, dst, l4) = match ether_type {
            0x0800 => {
                let ip = frame.get(14..34)?;
                let ihl = usize::from(ip[0] & 0x0f) * 4;
                let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
                let (src, dst): ([u8; 4], [u8; 4]) =
                    (ip[12..16].try_into().ok()?, ip[16..20].try_into().ok()?);
                // A later fragment has no transport header.
                let l4 = (frag == 0).then(|| frame.get(14 + ihl..)).flatten();
                (
                    ip[9],
                    Ipv4Addr::from(src).into(),
                    Ipv4Addr::from(dst).into(),
                    l4,
                )
            }
            0x86dd => {
                let ip = frame.get(14..54)?;
                let (src, dst): ([u8; 16], [u8; 16]) =
                    (ip[8..24].try_into().ok()?, ip[24..40].try_into().ok()?);
                let l4 = frame.get(54..);
                (
                    ip[6],
                    Ipv6Addr::from(src).into(),
                    Ipv6Addr::from(dst).into(),
                    l4,
                )
            }
            _ => return None,
        };
        let ports = l4
            .filter(|_| proto == proto::TCP || proto == proto::UDP)
            .and_then(|l4| l4.get(0..4))
            .map(|p| {
                (
                    u16::from_be_bytes([p[0], p[1]]),
                    u16::from_be_bytes([p[2], p[3]]),
                )
            });
        let tcp_flags = l4
            .filter(|_| proto == proto::TCP)
            .and_then(|l4| l4.get(13).copied());
        Some(Headers {
            proto,
            src,
            dst,
            sport: ports.map(|p| p.0),
            dport: ports.map(|p| p.1),
            tcp_flags,
        })
    }

    /// Whether the packet is from or to `addr`.
    pub fn has_address(&self, addr: IpAddr) -> bool {
        self.src == addr || self.dst == addr
    }

    /// Whether the packet is from or to `port` (TCP, UDP).
    pub fn has_port(&self, port: u16) -> bool {
        self.sport == Some(port) || self.dport == Some(port)
    }

    /// Whether the packet is from or to `addr`:`port`.
    pub fn has_endpoint(&self, addr: IpAddr, port: u16) -> bool {
        (self.src == addr && self.sport == Some(port))
            || (self.dst == addr && self.dport == Some(port))
    }
}

impl std::fmt::Display for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let end = |addr: IpAddr, port: Option<u16>| match (addr, port) {
            (IpAddr::V6(a), Some(p)) => format!("[{a}]:{p}"),
            (a, Some(p)) => format!("{a}:{p}"),
            (a, None) => a.to_string(),
        };
        write!(
            f,
            "{} {} > {}",
            name_of(self.proto),
            end(self.src, self.sport),
            end(self.dst, self.dport)
        )?;
        if let Some(flags) = self.tcp_flags {
            write!(f, " [{}]", tcp_flags(flags))?;
        }
        Ok(())
    }
}

/// TCP flags as tcpdump writes them (`S`, `S.`, `F.`, `R`, `P.`, `.`).
fn tcp_flags(flags: u8) -> String {
    let mut s: String = [
        (0x02, 'S'),
        (0x01, 'F'),
        (0x04, 'R'),
        (0x08, 'P'),
        (0x20, 'U'),
    ]
    .iter()
    .filter(|(bit, _)| flags & bit != 0)
    .map(|(_, c)| *c)
    .collect();
    if flags & 0x10 != 0 {
        s.push('.');
    }
    if s.is_empty() {
        s.push_str("none");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet frame of IPv4 UDP 10.0.0.2:40000 → 192.0.2.10:30001.
    fn udp4() -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[14 + 9] = proto::UDP;
        f[14 + 12..14 + 16].copy_from_slice(&[10, 0, 0, 2]);
        f[14 + 16..14 + 20].copy_from_slice(&[192, 0, 2, 10]);
        f[34..36].copy_from_slice(&40000u16.to_be_bytes());
        f[36..38].copy_from_slice(&30001u16.to_be_bytes());
        f
    }

    #[test]
    fn an_events_bytes_are_read_as_the_kernel_wrote_them() {
        let mut bytes = vec![0u8; 288];
        bytes[0..8].copy_from_slice(&7u64.to_ne_bytes());
        bytes[8..12].copy_from_slice(&(Counter::DropNoBackend as u32).to_ne_bytes());
        bytes[12..16].copy_from_slice(&1u32.to_ne_bytes());
        bytes[24..28].copy_from_slice(&42u32.to_ne_bytes());
        bytes[28..30].copy_from_slice(&42u16.to_ne_bytes());
        bytes[30..32].copy_from_slice(&42u16.to_ne_bytes());
        bytes[ENTERED..ENTERED + 42].copy_from_slice(&udp4());
        bytes[LEFT..LEFT + 42].copy_from_slice(&udp4());
        let e = Event::parse(&bytes).unwrap();
        assert_eq!(
            (e.time_ns, e.reason, e.verdict(), e.len),
            (7, Counter::DropNoBackend, "drop", 42)
        );
        assert_eq!(e.entered, udp4());
        let h = Headers::parse(&e.left).unwrap();
        assert_eq!(h.to_string(), "udp 10.0.0.2:40000 > 192.0.2.10:30001");
        assert!(h.has_endpoint("192.0.2.10".parse().unwrap(), 30001));
        assert!(!h.has_endpoint("10.0.0.2".parse().unwrap(), 30001));
        assert!(Event::parse(&bytes[..200]).is_none());
    }

    #[test]
    fn a_later_fragment_and_a_cut_head_have_no_ports() {
        let mut f = udp4();
        f[14 + 6..14 + 8].copy_from_slice(&0x0010u16.to_be_bytes());
        assert_eq!(Headers::parse(&f).unwrap().sport, None);
        assert_eq!(Headers::parse(&udp4()[..36]).unwrap().dport, None);
        assert!(Headers::parse(&udp4()[..20]).is_none());
        assert_eq!(tcp_flags(0x12), "S.");
    }
}
