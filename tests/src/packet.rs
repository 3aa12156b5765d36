//! Packets built field by field, with checksums computed from scratch (independently of
//! the kernel program's incremental updates), and decoded for failure messages.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

/// Transport part of a packet.
#[derive(Clone, Debug)]
pub enum L4 {
    /// TCP with the given flags byte.
    Tcp {
        /// Source port.
        sport: u16,
        /// Destination port.
        dport: u16,
        /// Sequence number.
        seq: u32,
        /// Acknowledgement number.
        ack: u32,
        /// Flags byte (`SYN`, `ACK`, `PSH`).
        flags: u8,
    },
    /// UDP; `checksum: false` sends 0 ("no checksum").
    Udp {
        /// Source port.
        sport: u16,
        /// Destination port.
        dport: u16,
        /// Whether the checksum is computed (else 0).
        checksum: bool,
    },
    /// ICMP header (ICMPv6 in an IPv6 packet); the payload follows.
    Icmp {
        /// ICMP type (3 destination unreachable, 11 time exceeded, ...; ICMPv6: 1
        /// destination unreachable, 2 packet too big, 3 time exceeded, ...).
        kind: u8,
        /// ICMP code within the type.
        code: u8,
        /// The header's last four bytes (e.g. the next-hop MTU of "fragmentation needed").
        rest: u32,
    },
}

/// TCP flag SYN: opens a connection.
pub const SYN: u8 = 0x02;
/// TCP flag ACK: the acknowledgement number is valid.
pub const ACK: u8 = 0x10;
/// TCP flag PSH: deliver the data at once.
pub const PSH: u8 = 0x08;

/// The builders `Packet` and `Packet6` share (`$sock`: the family's socket address).
macro_rules! builders {
    ($sock:ty) => {
        /// A TCP segment (ACK+PSH unless changed with `flags`).
        pub fn tcp(src: $sock, dst: $sock) -> Self {
            let l4 = L4::Tcp {
                sport: src.port(),
                dport: dst.port(),
                seq: 1000,
                ack: 2000,
                flags: ACK | PSH,
            };
            Self::new(*src.ip(), *dst.ip(), l4)
        }

        /// A UDP datagram with a checksum.
        pub fn udp(src: $sock, dst: $sock) -> Self {
            let l4 = L4::Udp {
                sport: src.port(),
                dport: dst.port(),
                checksum: true,
            };
            Self::new(*src.ip(), *dst.ip(), l4)
        }

        /// The same packet with other Ethernet source and destination MACs.
        pub fn macs(mut self, src: [u8; 6], dst: [u8; 6]) -> Self {
            self.eth_src = src;
            self.eth_dst = dst;
            self
        }
        /// The same packet with TCP flags `f` (no change to other protocols).
        pub fn flags(mut self, f: u8) -> Self {
            if let L4::Tcp { flags, .. } = &mut self.l4 {
                *flags = f;
            }
            self
        }
        /// The same packet with another payload.
        pub fn payload(mut self, payload: &[u8]) -> Self {
            self.payload = payload.to_vec();
            self
        }
        /// The same packet with UDP checksum 0 ("no checksum", invalid in IPv6; no
        /// change to other protocols).
        pub fn no_udp_checksum(mut self) -> Self {
            if let L4::Udp { checksum, .. } = &mut self.l4 {
                *checksum = false;
            }
            self
        }
        /// The same packet with another source address and port (what NAT should
        /// produce).
        pub fn with_src(mut self, src: $sock) -> Self {
            self.src = *src.ip();
            self.l4.set_src_port(src.port());
            self
        }
        /// The same packet with another destination address and port (what NAT should
        /// produce).
        pub fn with_dst(mut self, dst: $sock) -> Self {
            self.dst = *dst.ip();
            self.l4.set_dst_port(dst.port());
            self
        }
    };
}

/// An Ethernet + IPv4 packet.
#[derive(Clone, Debug)]
pub struct Packet {
    /// Ethernet source MAC.
    pub eth_src: [u8; 6],
    /// Ethernet destination MAC.
    pub eth_dst: [u8; 6],
    /// IPv4 source address.
    pub src: Ipv4Addr,
    /// IPv4 destination address.
    pub dst: Ipv4Addr,
    /// IPv4 time to live.
    pub ttl: u8,
    /// IPv4 identification (what fragments of one datagram share).
    pub id: u16,
    /// IPv4 options (a multiple of 4 bytes, at most 40).
    pub options: Vec<u8>,
    /// The transport header.
    pub l4: L4,
    /// Bytes after the transport header.
    pub payload: Vec<u8>,
}

impl Packet {
    builders!(SocketAddrV4);

    fn new(src: Ipv4Addr, dst: Ipv4Addr, l4: L4) -> Self {
        Packet {
            eth_src: [2, 0, 0, 0, 0, 0xaa],
            eth_dst: [2, 0, 0, 0, 0, 0xbb],
            src,
            dst,
            ttl: 64,
            id: 0x1234,
            options: Vec::new(),
            l4,
            payload: b"berth".to_vec(),
        }
    }

    /// An ICMP error quoting `quoted` (an IP packet, cut to its header + 8 bytes).
    pub fn icmp_error(
        src: Ipv4Addr,
        dst: Ipv4Addr,
        kind: u8,
        code: u8,
        rest: u32,
        quoted: &[u8],
    ) -> Self {
        let mut p = Self::new(src, dst, L4::Icmp { kind, code, rest });
        p.payload = quoted.to_vec();
        p
    }

    /// The same packet with another IPv4 TTL.
    pub fn ttl(mut self, ttl: u8) -> Self {
        self.ttl = ttl;
        self
    }
    /// The same packet with IPv4 options (a multiple of 4 bytes, at most 40).
    pub fn options(mut self, options: &[u8]) -> Self {
        assert!(options.len().is_multiple_of(4) && options.len() <= 40);
        self.options = options.to_vec();
        self
    }

    fn proto(&self) -> u8 {
        self.l4.proto(1)
    }

    /// Transport header and payload, checksum included.
    pub fn l4_bytes(&self) -> Vec<u8> {
        transport(&self.l4, &self.payload, 1, |proto, len| {
            // ICMP's checksum covers no pseudo-header.
            (proto != 1).then(|| {
                let mut pseudo = Vec::new();
                pseudo.extend(self.src.octets());
                pseudo.extend(self.dst.octets());
                pseudo.extend([0, proto]);
                pseudo.extend((len as u16).to_be_bytes());
                pseudo
            })
        })
    }

    /// IPv4 header for a packet carrying `len` bytes after it.
    fn ip_header(&self, len: usize, more_fragments: bool, offset: usize) -> Vec<u8> {
        let ihl = 20 + self.options.len();
        let mut h = Vec::with_capacity(ihl);
        h.push(0x40 | (ihl / 4) as u8);
        h.push(0);
        h.extend(((ihl + len) as u16).to_be_bytes());
        h.extend(self.id.to_be_bytes());
        assert!(offset.is_multiple_of(8));
        let frag = ((offset / 8) as u16) | if more_fragments { 0x2000 } else { 0 };
        h.extend(frag.to_be_bytes());
        h.extend([self.ttl, self.proto(), 0, 0]);
        h.extend(self.src.octets());
        h.extend(self.dst.octets());
        h.extend(&self.options);
        let c = checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h
    }

    fn eth(&self) -> Vec<u8> {
        let mut e = Vec::new();
        e.extend(self.eth_dst);
        e.extend(self.eth_src);
        e.extend([0x08, 0x00]);
        e
    }

    /// The IP packet (no Ethernet header).
    pub fn ip_bytes(&self) -> Vec<u8> {
        let l4 = self.l4_bytes();
        let mut b = self.ip_header(l4.len(), false, 0);
        b.extend(l4);
        b
    }

    /// The whole frame.
    pub fn frame(&self) -> Vec<u8> {
        let mut f = self.eth();
        f.extend(self.ip_bytes());
        f
    }

    /// The frame cut in two IP fragments: the first carries `first_len` bytes of the
    /// transport part (a multiple of 8), the second the rest.
    pub fn fragments(&self, first_len: usize) -> (Vec<u8>, Vec<u8>) {
        let l4 = self.l4_bytes();
        let mut first = self.eth();
        first.extend(self.ip_header(first_len, true, 0));
        first.extend(&l4[..first_len]);
        let mut later = self.eth();
        later.extend(self.ip_header(l4.len() - first_len, false, first_len));
        later.extend(&l4[first_len..]);
        (first, later)
    }

    /// What an ICMP error quotes of this packet: its IP header and 8 bytes.
    pub fn quote(&self) -> Vec<u8> {
        let ip = self.ip_bytes();
        ip[..20 + self.options.len() + 8].to_vec()
    }
}

impl L4 {
    /// The protocol number (`icmp`: ICMP's, 1 or 58).
    fn proto(&self, icmp: u8) -> u8 {
        match self {
            L4::Tcp { .. } => 6,
            L4::Udp { .. } => 17,
            L4::Icmp { .. } => icmp,
        }
    }

    fn set_src_port(&mut self, port: u16) {
        if let L4::Tcp { sport, .. } | L4::Udp { sport, .. } = self {
            *sport = port;
        }
    }

    fn set_dst_port(&mut self, port: u16) {
        if let L4::Tcp { dport, .. } | L4::Udp { dport, .. } = self {
            *dport = port;
        }
    }
}

/// Transport header `l4` and `payload`, checksum included; `icmp` is the family's ICMP
/// protocol number, `pseudo(proto, len)` gives the pseudo-header the checksum covers
/// (None: none).
fn transport(
    l4: &L4,
    payload: &[u8],
    icmp: u8,
    pseudo: impl Fn(u8, usize) -> Option<Vec<u8>>,
) -> Vec<u8> {
    let mut b = Vec::new();
    let proto = l4.proto(icmp);
    let check_at = match *l4 {
        L4::Tcp {
            sport,
            dport,
            seq,
            ack,
            flags,
        } => {
            b.extend(sport.to_be_bytes());
            b.extend(dport.to_be_bytes());
            b.extend(seq.to_be_bytes());
            b.extend(ack.to_be_bytes());
            b.extend([5 << 4, flags]);
            b.extend(64240u16.to_be_bytes());
            b.extend([0, 0, 0, 0]);
            Some(16)
        }
        L4::Udp {
            sport,
            dport,
            checksum,
        } => {
            b.extend(sport.to_be_bytes());
            b.extend(dport.to_be_bytes());
            b.extend(((8 + payload.len()) as u16).to_be_bytes());
            b.extend([0, 0]);
            checksum.then_some(6)
        }
        L4::Icmp { kind, code, rest } => {
            b.extend([kind, code, 0, 0]);
            b.extend(rest.to_be_bytes());
            Some(2)
        }
    };
    b.extend(payload);
    if let Some(at) = check_at {
        let covered = match pseudo(proto, b.len()) {
            None => b.clone(),
            Some(mut p) => {
                p.extend(&b);
                p
            }
        };
        let mut c = checksum(&covered);
        if c == 0 && proto == 17 {
            c = 0xffff;
        }
        b[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }
    b
}

/// IPv6 extension header type: hop-by-hop options.
pub const HOP_BY_HOP: u8 = 0;
/// IPv6 extension header type: routing.
pub const ROUTING: u8 = 43;
/// IPv6 extension header type: fragment.
pub const FRAGMENT: u8 = 44;
/// IPv6 next header: ESP (no transport header can be found behind it).
pub const ESP: u8 = 50;
/// IPv6 extension header type: destination options.
pub const DEST_OPTS: u8 = 60;

/// An Ethernet + IPv6 packet, built like `Packet`.
#[derive(Clone, Debug)]
pub struct Packet6 {
    /// Ethernet source MAC.
    pub eth_src: [u8; 6],
    /// Ethernet destination MAC.
    pub eth_dst: [u8; 6],
    /// IPv6 source address.
    pub src: Ipv6Addr,
    /// IPv6 destination address.
    pub dst: Ipv6Addr,
    /// IPv6 hop limit.
    pub hop_limit: u8,
    /// Extension headers before the transport header: (type, whole header); each
    /// header's first byte (its next header) is filled in when the packet is built.
    pub ext: Vec<(u8, Vec<u8>)>,
    /// The transport header (ICMPv6 for `L4::Icmp`).
    pub l4: L4,
    /// Bytes after the transport header.
    pub payload: Vec<u8>,
}

impl Packet6 {
    builders!(SocketAddrV6);

    fn new(src: Ipv6Addr, dst: Ipv6Addr, l4: L4) -> Self {
        Packet6 {
            eth_src: [2, 0, 0, 0, 0, 0xaa],
            eth_dst: [2, 0, 0, 0, 0, 0xbb],
            src,
            dst,
            hop_limit: 64,
            ext: Vec::new(),
            l4,
            payload: b"berth".to_vec(),
        }
    }

    /// An ICMPv6 message of type `kind` whose header ends in `rest` (an error's MTU or
    /// pointer, an echo's identifier and sequence), followed by `body` (an error's
    /// quoted packet, see `quote`).
    pub fn icmp(src: Ipv6Addr, dst: Ipv6Addr, kind: u8, code: u8, rest: u32, body: &[u8]) -> Self {
        let mut p = Self::new(src, dst, L4::Icmp { kind, code, rest });
        p.payload = body.to_vec();
        p
    }

    /// The same packet with another hop limit.
    pub fn hop_limit(mut self, hop_limit: u8) -> Self {
        self.hop_limit = hop_limit;
        self
    }
    /// The same packet with one more 8-byte extension header of type `kind` (hop-by-hop
    /// and destination options: one PadN option; routing: type 0, no segments left).
    pub fn ext(self, kind: u8) -> Self {
        let body = match kind {
            HOP_BY_HOP | DEST_OPTS => [0, 0, 1, 4, 0, 0, 0, 0],
            _ => [0; 8],
        };
        self.ext_raw(kind, &body)
    }
    /// The same packet with one more extension header of type `kind`, given whole (its
    /// first byte is replaced by the next header's type).
    pub fn ext_raw(mut self, kind: u8, header: &[u8]) -> Self {
        self.ext.push((kind, header.to_vec()));
        self
    }

    /// Transport header and payload, checksum included (ICMPv6's too covers the
    /// pseudo-header).
    pub fn l4_bytes(&self) -> Vec<u8> {
        transport(&self.l4, &self.payload, 58, |proto, len| {
            let mut pseudo = Vec::new();
            pseudo.extend(self.src.octets());
            pseudo.extend(self.dst.octets());
            pseudo.extend((len as u32).to_be_bytes());
            pseudo.extend([0, 0, 0, proto]);
            Some(pseudo)
        })
    }

    /// The IP packet (no Ethernet header).
    pub fn ip_bytes(&self) -> Vec<u8> {
        let l4 = self.l4_bytes();
        let mut rest = Vec::new();
        let mut kinds = self.ext.iter().map(|(kind, _)| *kind).skip(1);
        for (_, header) in &self.ext {
            let mut header = header.clone();
            header[0] = kinds.next().unwrap_or(self.l4.proto(58));
            rest.extend(header);
        }
        rest.extend(l4);
        let first = self
            .ext
            .first()
            .map_or(self.l4.proto(58), |(kind, _)| *kind);
        let mut b = vec![0x60, 0, 0, 0];
        b.extend((rest.len() as u16).to_be_bytes());
        b.extend([first, self.hop_limit]);
        b.extend(self.src.octets());
        b.extend(self.dst.octets());
        b.extend(rest);
        b
    }

    /// The whole frame.
    pub fn frame(&self) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend(self.eth_dst);
        f.extend(self.eth_src);
        f.extend([0x86, 0xdd]);
        f.extend(self.ip_bytes());
        f
    }

    /// What an ICMPv6 error quotes of this packet: all of it (RFC 4443 quotes as much
    /// as fits in the minimum MTU).
    pub fn quote(&self) -> Vec<u8> {
        self.ip_bytes()
    }
}

/// The Internet checksum of `bytes`, computed from scratch.
pub fn checksum(bytes: &[u8]) -> u16 {
    let mut sum = 0u32;
    for chunk in bytes.chunks(2) {
        let word = if chunk.len() == 2 {
            u16::from_be_bytes([chunk[0], chunk[1]])
        } else {
            u16::from(chunk[0]) << 8
        };
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Recomputes the checksum of the IPv4 header at the start of `ip` (its IHL clamped
/// to what a header and `ip` can hold).
pub fn fix_ip_checksum(ip: &mut [u8]) {
    ip[10] = 0;
    ip[11] = 0;
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let c = checksum(&ip[..ihl.clamp(20, ip.len())]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// A one-line-per-layer rendering of a frame, with checksums verified from scratch.
pub fn decode(frame: &[u8]) -> String {
    let hex: Vec<String> = frame
        .chunks(16)
        .map(|c| {
            c.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    format!("{}\n    {}", summary(frame), hex.join("\n    "))
}

fn mac(m: &[u8]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The headers of a frame in one line each.
pub fn summary(f: &[u8]) -> String {
    if f.len() < 14 {
        return format!("truncated frame ({} bytes)", f.len());
    }
    let mut s = format!(
        "eth {} -> {} type {:02x}{:02x}",
        mac(&f[6..12]),
        mac(&f[0..6]),
        f[12],
        f[13]
    );
    if f[12..14] == [0x86, 0xdd] {
        return s + &summary6(&f[14..]);
    }
    if f[12..14] != [0x08, 0x00] || f.len() < 34 {
        return s;
    }
    let ip = &f[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ihl < 20 || ip.len() < ihl {
        return s + &format!("\n  ipv4 bad ihl {ihl}");
    }
    let ok = |good: bool| if good { "ok" } else { "BAD" };
    let src = std::net::Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = std::net::Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    s += &format!(
        "\n  ipv4 {src} -> {dst} ttl {} proto {} len {} id {:04x} frag {:04x} ihl {ihl} csum {}",
        ip[8],
        ip[9],
        u16::from_be_bytes([ip[2], ip[3]]),
        u16::from_be_bytes([ip[4], ip[5]]),
        frag,
        ok(checksum(&ip[..ihl]) == 0)
    );
    let l4 = &ip[ihl..];
    if frag & 0x1fff != 0 || l4.len() < 8 {
        return s;
    }
    let ports = format!(
        "{} -> {}",
        u16::from_be_bytes([l4[0], l4[1]]),
        u16::from_be_bytes([l4[2], l4[3]])
    );
    // (Clamped into the frame and past the header: fuzzed lengths are anything.)
    let tot = usize::from(u16::from_be_bytes([ip[2], ip[3]]))
        .min(ip.len())
        .max(ihl);
    let whole = frag & 0x2000 == 0;
    let pseudo_ok = |data: &[u8]| {
        let mut p = Vec::new();
        p.extend(&ip[12..20]);
        p.extend([0, ip[9]]);
        p.extend((data.len() as u16).to_be_bytes());
        p.extend(data);
        checksum(&p) == 0
    };
    match ip[9] {
        6 => {
            s += &format!(
                "\n  tcp {ports} csum {}",
                if whole {
                    ok(pseudo_ok(&ip[ihl..tot]))
                } else {
                    "n/a (fragment)"
                }
            )
        }
        17 => {
            let c = u16::from_be_bytes([l4[6], l4[7]]);
            let v = if c == 0 {
                "none"
            } else if whole {
                ok(pseudo_ok(&ip[ihl..tot]))
            } else {
                "n/a (fragment)"
            };
            s += &format!("\n  udp {ports} csum {v}");
        }
        1 => {
            s += &format!(
                "\n  icmp type {} code {} csum {}",
                l4[0],
                l4[1],
                ok(checksum(&ip[ihl..tot]) == 0)
            );
            if l4.len() >= 8 + 28 {
                s += &format!(
                    "\n  quoted:{}",
                    summary(&[&f[..14], &l4[8..]].concat()).replace("\n", "\n  ")
                );
            }
        }
        _ => {}
    }
    s
}

/// The IPv6 headers of `ip` in one line each, transport checksums verified.
fn summary6(ip: &[u8]) -> String {
    if ip.len() < 40 {
        return format!("\n  ipv6 truncated ({} bytes)", ip.len());
    }
    let addr = |b: &[u8]| Ipv6Addr::from(<[u8; 16]>::try_from(b).expect("16 bytes"));
    let (src, dst) = (addr(&ip[8..24]), addr(&ip[24..40]));
    let len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let mut s = format!(
        "\n  ipv6 {src} -> {dst} hop limit {} payload {len} next {}",
        ip[7], ip[6]
    );
    let end = (40 + len).min(ip.len());
    let (mut next, mut off) = (ip[6], 40);
    while matches!(next, HOP_BY_HOP | ROUTING | DEST_OPTS | FRAGMENT) && off + 8 <= end {
        let size = if next == FRAGMENT {
            8
        } else {
            (usize::from(ip[off + 1]) + 1) * 8
        };
        s += &format!("\n  ext {next} ({size} bytes) next {}", ip[off]);
        (next, off) = (ip[off], off + size);
    }
    if off + 8 > end {
        return s;
    }
    let l4 = &ip[off..end];
    let mut p = Vec::new();
    p.extend(&ip[8..40]);
    p.extend((l4.len() as u32).to_be_bytes());
    p.extend([0, 0, 0, next]);
    p.extend(l4);
    let ok = if checksum(&p) == 0 { "ok" } else { "BAD" };
    let port = |i: usize| u16::from_be_bytes([l4[i], l4[i + 1]]);
    match next {
        6 | 17 => s += &format!("\n  {next} {} -> {} csum {ok}", port(0), port(2)),
        58 => {
            s += &format!("\n  icmpv6 type {} code {} csum {ok}", l4[0], l4[1]);
            if l4.len() >= 8 + 40 && l4[0] < 128 {
                s += &format!("\n  quoted:{}", summary6(&l4[8..]).replace("\n", "\n  "));
            }
        }
        _ => {}
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_udp_checksum_covers_the_pseudo_header() {
        let src = SocketAddrV6::new("fd00:250:1::a".parse().unwrap(), 40000, 0, 0);
        let dst = SocketAddrV6::new("fd00:250::64".parse().unwrap(), 53, 0, 0);
        let ip = Packet6::udp(src, dst).ext(DEST_OPTS).ip_bytes();
        // Computed apart (Python, RFC 8200 8.1 pseudo-header).
        assert_eq!(ip[6], DEST_OPTS);
        assert_eq!(ip[40], 17, "the extension header's next header is UDP");
        assert_eq!(&ip[48 + 6..48 + 8], &[0x27, 0x74]);
    }
}
