//! [`FrameGenerator`]: the kernel's packet generator (`BPF_PROG_TEST_RUN` with live
//! frames) over a UDP [`Template`] of either family, through [`Flows`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use super::*;
use crate::packet::{Packet6, L4};

/// Frames per `BPF_PROG_TEST_RUN` call (each call swaps the XDP dispatcher, an RCU
/// grace period, so calls are long; stopping waits for the current one).
const FRAMES_PER_CALL: u32 = 1 << 20;

/// Which 5-tuples a [`FrameGenerator`] cycles through. Frame `n` (the generator's
/// count before it) has source port `template's + n % ports`, source address
/// `template's + (n / ports) % addresses` (added to its last 16 bits) and destination
/// `dsts[n % dsts.len()]`: `ports × addresses` distinct 5-tuples before one repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flows {
    /// Source ports, from the template's up.
    pub ports: u32,
    /// Source addresses, from the template's up.
    pub addresses: u32,
}

impl Flows {
    /// Distinct 5-tuples before one repeats.
    pub fn tuples(self) -> u64 {
        u64::from(self.ports) * u64::from(self.addresses)
    }
}

/// What a [`FrameGenerator`] sends: a UDP frame of either family, no IPv4 options or
/// IPv6 extension headers. IPv4's has no UDP checksum (0); IPv6's has one (IPv6 allows
/// no 0), which the generator keeps valid as it varies the frame.
#[derive(Clone, Debug)]
pub enum Template {
    /// Ethernet + IPv4 + UDP.
    V4(Packet),
    /// Ethernet + IPv6 + UDP.
    V6(Packet6),
}

/// Where the fields the generator writes are in a template's frame.
struct Layout {
    /// Ethernet + IP + UDP header bytes.
    headers: usize,
    src_port: i16,
    /// The destination address and its length in 4-byte words.
    dst: i16,
    dst_words: usize,
    /// The source address's last 16 bits.
    src_low: i16,
    /// The checksum over the varied fields: IPv4's header checksum (the addresses),
    /// IPv6's UDP checksum (addresses, by its pseudo-header, and ports).
    checksum: i16,
    /// Whether that checksum covers the ports (then it is UDP's: 0 is sent as 0xffff).
    ports_in_checksum: bool,
}

const V4_LAYOUT: Layout = Layout {
    headers: 14 + 20 + 8,
    src_port: 34,
    dst: 30,
    dst_words: 1,
    src_low: 28,
    checksum: 24,
    ports_in_checksum: false,
};

const V6_LAYOUT: Layout = Layout {
    headers: 14 + 40 + 8,
    src_port: 54,
    dst: 38,
    dst_words: 4,
    src_low: 36,
    checksum: 60,
    ports_in_checksum: true,
};

impl Template {
    /// A UDP frame from `src` to `dst` (one family) between these MACs (source,
    /// destination) carrying `payload`: IPv4 without UDP checksum, IPv6 with.
    pub fn udp(src: SocketAddr, dst: SocketAddr, macs: ([u8; 6], [u8; 6]), payload: &[u8]) -> Self {
        match (src, dst) {
            (SocketAddr::V4(s), SocketAddr::V4(d)) => Template::V4(
                Packet::udp(s, d)
                    .macs(macs.0, macs.1)
                    .payload(payload)
                    .no_udp_checksum(),
            ),
            (SocketAddr::V6(s), SocketAddr::V6(d)) => {
                Template::V6(Packet6::udp(s, d).macs(macs.0, macs.1).payload(payload))
            }
            _ => panic!("a template's addresses are of one family: {src} -> {dst}"),
        }
    }

    /// The frame.
    pub fn frame(&self) -> Vec<u8> {
        match self {
            Template::V4(p) => p.frame(),
            Template::V6(p) => p.frame(),
        }
    }

    fn layout(&self) -> &'static Layout {
        match self {
            Template::V4(_) => &V4_LAYOUT,
            Template::V6(_) => &V6_LAYOUT,
        }
    }

    /// The UDP ports, checking the template is what the generator can vary.
    fn ports(&self) -> (u16, u16) {
        let (l4, plain) = match self {
            Template::V4(p) => (&p.l4, p.options.is_empty()),
            Template::V6(p) => (&p.l4, p.ext.is_empty()),
        };
        let v6 = matches!(self, Template::V6(_));
        match *l4 {
            L4::Udp {
                sport,
                dport,
                checksum,
            } if plain && checksum == v6 => (sport, dport),
            _ => panic!(
                "the generator's template must be UDP without options (IPv4: no checksum, IPv6: with one)"
            ),
        }
    }

    /// The source address's last 16 bits, as a number.
    fn src_low(&self) -> u32 {
        match self {
            Template::V4(p) => u32::from(p.src) & 0xffff,
            Template::V6(p) => (u128::from(p.src) & 0xffff) as u32,
        }
    }

    /// The same frame from source address + `offset`, port `port`.
    fn with_src(&self, offset: u32, port: u16) -> Self {
        match self {
            Template::V4(p) => {
                let src = Ipv4Addr::from(u32::from(p.src) + offset);
                Template::V4(p.clone().with_src(SocketAddrV4::new(src, port)))
            }
            Template::V6(p) => {
                let src = Ipv6Addr::from(u128::from(p.src) + u128::from(offset));
                Template::V6(p.clone().with_src(SocketAddrV6::new(src, port, 0, 0)))
            }
        }
    }

    /// The same frame to `dst` (its port unchanged).
    fn with_dst(&self, dst: IpAddr) -> Self {
        let (_, dport) = self.ports();
        match (self, dst) {
            (Template::V4(p), IpAddr::V4(d)) => {
                Template::V4(p.clone().with_dst(SocketAddrV4::new(d, dport)))
            }
            (Template::V6(p), IpAddr::V6(d)) => {
                Template::V6(p.clone().with_dst(SocketAddrV6::new(d, dport, 0, 0)))
            }
            _ => panic!("destination {dst} is not of the template's family"),
        }
    }

    /// The frame as a receiving stack may leave its page: TTL (hop limit) 1, other MACs.
    fn spoiled(&self) -> Vec<u8> {
        match self {
            Template::V4(p) => p.clone().ttl(1).macs([0; 6], [0xff; 6]).frame(),
            Template::V6(p) => p.clone().hop_limit(1).macs([0; 6], [0xff; 6]).frame(),
        }
    }
}

/// The frame [`FrameGenerator`] sends as its `n`th (0-based), built from scratch: what
/// its program must write.
pub fn generated_frame(template: &Template, flows: Flows, dsts: &[IpAddr], n: u64) -> Vec<u8> {
    let (sport, _) = template.ports();
    let ports = u64::from(flows.ports);
    let port = u64::from(sport) + n % ports;
    let offset = (n / ports) % u64::from(flows.addresses);
    let dst = dsts[(n % dsts.len() as u64) as usize];
    template
        .with_dst(dst)
        .with_src(offset as u32, port as u16)
        .frame()
}

/// The frames the generator's program writes when its count is at each of `counts`
/// (run once each by `BPF_PROG_TEST_RUN` without live frames, over `template` with
/// its TTL and MACs spoiled, as a receiving stack leaves a page).
pub fn generator_output(
    template: &Template,
    flows: Flows,
    dsts: &[IpAddr],
    counts: &[u64],
) -> Vec<Vec<u8>> {
    let counter = Counter::new();
    let prog = load_xdp(
        "generator",
        &generator_program(template, flows, dsts, &counter, 1),
    );
    let mut input = template.spoiled();
    counts
        .iter()
        .map(|&n| {
            counter.set(n);
            let mut out = vec![0u8; input.len() + 256];
            let mut attr = Attr::default();
            put_u32(&mut attr, 0, prog.as_raw_fd() as u32);
            put_u32(&mut attr, 8, input.len() as u32);
            put_u32(&mut attr, 12, out.len() as u32);
            attr[2] = input.as_mut_ptr() as u64;
            attr[3] = out.as_mut_ptr() as u64;
            put_u32(&mut attr, 32, 1); // repeat
            bpf(BPF_PROG_TEST_RUN, &mut attr).expect("BPF_PROG_TEST_RUN of the generator");
            let len = (attr[1] >> 32) as usize; // data_size_out
            out.truncate(len);
            out
        })
        .collect()
}

/// Instructions that set the port (and r8, the checksum's delta, to the port's
/// offset where the checksum covers ports), then r1 to the destination's index.
const PORT_LEN: i16 = 8;
/// Instructions that add the address offset (also to r8).
const ADDRESS_LEN: i16 = 8;

/// The generator's program: counts the frame, takes the count before as `n`, writes
/// the headers of `template` afresh (the stack that received the frame may have
/// changed them: TTL, MACs, NAT, and the page comes back as it was left), then flow
/// `n`'s fields (see [`Flows`]): source port, destination (with the checksum of the
/// template sent there), source address; updates the checksum by what the port and
/// address add to it (RFC 1624: sum' = sum + delta, folded; the sum is ~checksum),
/// and redirects the frame out of `ifindex`.
fn generator_program(
    template: &Template,
    flows: Flows,
    dsts: &[IpAddr],
    counter: &Counter,
    ifindex: u32,
) -> Vec<u64> {
    assert!(!dsts.is_empty());
    let l = template.layout();
    let (base_port, _) = template.ports();
    assert!(flows.ports >= 1 && u32::from(base_port) + flows.ports <= 1 << 16);
    let base_low = template.src_low();
    assert!(flows.addresses >= 1 && base_low + flows.addresses <= 1 << 16);
    let frame = template.frame();
    let header = &frame[..l.headers];
    assert_eq!(header.len() % 4, 2, "header words, then a half word");
    // What changes the checksum: the address; under UDP's, the port too.
    let update = flows.addresses > 1 || (l.ports_in_checksum && flows.ports > 1);
    let blocks = 16 + (header.len() / 4 + 1) as i16 + PORT_LEN;
    let block = 3 + l.dst_words as i16;
    let vary = blocks + block * dsts.len() as i16;
    let vary_len = if flows.addresses > 1 { ADDRESS_LEN } else { 0 };
    let sum = checksum_update(l);
    let send = vary + vary_len + if update { sum.len() as i16 } else { 0 };
    let mut p = vec![insn(MOV, 6, 1, 0, 0)]; // 0: r6 = ctx
    p.extend(lookup_counter(&counter.0, 1, send)); // 1-7: r0 = &counter
    p.extend([
        insn(MOVI, 1, 0, 0, 1),                     // 8: r1 = 1
        insn(ATOMIC_DW, 0, 1, 0, ATOMIC_FETCH_ADD), // 9: r1 = (*r0)++
        insn(MOV, 7, 1, 0, 0),                      // 10: r7 = n
        insn(LDXW, 2, 6, 0, 0),                     // 11: r2 = data
        insn(LDXW, 3, 6, 4, 0),                     // 12: r3 = data_end
        insn(MOV, 4, 2, 0, 0),                      // 13: r4 = data
        insn(ADDI, 4, 0, 0, header.len() as i32),   // 14: r4 += headers
        insn(JGT, 4, 3, send - 16, 0),              // 15: too short: send as is
    ]);
    let last = header.len() - 2;
    for (i, w) in header[..last].chunks(4).enumerate() {
        p.push(insn(STW, 2, 0, 4 * i as i16, word(w))); // headers
    }
    let half = i32::from(u16::from_le_bytes([header[last], header[last + 1]]));
    p.push(insn(STH, 2, 0, last as i16, half));
    p.extend([
        insn(MOV, 5, 7, 0, 0),                   // r5 = n
        insn(MODI, 5, 0, 0, flows.ports as i32), // r5 = n % ports
        if l.ports_in_checksum {
            insn(MOV, 8, 5, 0, 0) // r8 = the port's offset
        } else {
            insn(MOVI, 8, 0, 0, 0) // r8 = 0
        },
        insn(ADDI, 5, 0, 0, i32::from(base_port)), // r5 += first port
        insn(TO_BE, 5, 0, 0, 16),                  // r5 = htons(r5)
        insn(STXH, 2, 5, l.src_port, 0),           // UDP source port = r5
        insn(MOV, 1, 7, 0, 0),                     // r1 = n
        insn(MODI, 1, 0, 0, dsts.len() as i32),    // r1 = destination index
    ]);
    assert_eq!(p.len() as i16, blocks);
    for (i, dst) in dsts.iter().enumerate() {
        let f = template.with_dst(*dst).frame();
        let at = blocks + block * i as i16;
        p.push(insn(JNEI, 1, 0, block - 1, i as i32)); // not this one: next
        for k in 0..l.dst_words {
            let o = l.dst as usize + 4 * k;
            p.push(insn(STW, 2, 0, o as i16, word(&f[o..o + 4])));
        }
        let c = l.checksum as usize;
        let c = i32::from(u16::from_le_bytes([f[c], f[c + 1]]));
        p.push(insn(STH, 2, 0, l.checksum, c)); // its checksum
        p.push(insn(JA, 0, 0, vary - (at + block), 0));
    }
    if flows.addresses > 1 {
        p.extend([
            insn(MOV, 5, 7, 0, 0),                       // r5 = n
            insn(DIVI, 5, 0, 0, flows.ports as i32),     // r5 /= ports
            insn(MODI, 5, 0, 0, flows.addresses as i32), // r5 = a
            insn(MOV, 4, 5, 0, 0),                       // r4 = a
            insn(ADDI, 4, 0, 0, base_low as i32),        // r4 += the address's last 16 bits
            insn(TO_BE, 4, 0, 0, 16),                    // r4 = htons(r4)
            insn(STXH, 2, 4, l.src_low, 0),              // source address, last 16 bits
            insn(ADD, 8, 5, 0, 0),                       // r8 += a
        ]);
    }
    if update {
        p.extend(sum);
    }
    assert_eq!(p.len() as i16, send);
    p.extend([
        insn(MOVI, 1, 0, 0, ifindex as i32),  // r1 = the interface
        insn(MOVI, 2, 0, 0, 0),               // r2 = 0
        insn(CALL, 0, 0, 0, HELPER_REDIRECT), // r0 = XDP_REDIRECT
        insn(EXIT, 0, 0, 0, 0),
    ]);
    p
}

/// A 4-byte word of a frame as an immediate (stored as the bytes are).
fn word(w: &[u8]) -> i32 {
    i32::from_le_bytes([w[0], w[1], w[2], w[3]])
}

/// The checksum at `l.checksum` plus r8 (up to 2 x 0xffff: two folds), UDP's 0 sent
/// as 0xffff.
fn checksum_update(l: &Layout) -> Vec<u64> {
    let fold = [
        insn(MOV, 4, 3, 0, 0),       // r4 = r3
        insn(RSHI, 4, 0, 0, 16),     // r4 = carry
        insn(ANDI, 3, 0, 0, 0xffff), // r3 &= 0xffff
        insn(ADD, 3, 4, 0, 0),       // r3 += carry
    ];
    let mut p = vec![
        insn(LDXH, 3, 2, l.checksum, 0), // r3 = checksum as sent
        insn(TO_BE, 3, 0, 0, 16),        // r3 = ntohs(r3)
        insn(XORI, 3, 0, 0, 0xffff),     // r3 = sum
        insn(ADD, 3, 8, 0, 0),           // r3 += delta
    ];
    p.extend(fold);
    p.extend(fold);
    p.push(insn(XORI, 3, 0, 0, 0xffff)); // r3 = ~sum
    if l.ports_in_checksum {
        p.extend([
            insn(JNEI, 3, 0, 1, 0),      // UDP: 0 means "none"
            insn(MOVI, 3, 0, 0, 0xffff), // so 0xffff
        ]);
    }
    p.extend([
        insn(TO_BE, 3, 0, 0, 16),        // r3 = htons(r3)
        insn(STXH, 2, 3, l.checksum, 0), // checksum = r3
    ]);
    p
}

/// The kernel sending frames as fast as one CPU can, from a thread of this process in
/// the client namespace; stopped on drop.
pub struct FrameGenerator {
    counter: Counter,
    sender: super::Sender,
}

impl FrameGenerator {
    /// Starts sending `template` (a frame from the client to the gateway's MAC) out of
    /// `iface` of `ns`, on `cpu`, through `flows` (destinations: `dsts`, of the
    /// template's family; the port is `template`'s).
    pub fn start(
        ns: &Netns,
        iface: &str,
        template: &Template,
        flows: Flows,
        dsts: &[IpAddr],
        cpu: usize,
    ) -> Self {
        let frame = template.frame();
        let counter = Counter::new();
        let p = generator_program(template, flows, dsts, &counter, ns.ifindex(iface));
        let prog = load_xdp("generator", &p);
        let sender = super::Sender::spawn("frame generator", ns, move |stopped| {
            pin(0, cpu);
            // xdp_md: data, data_end, data_meta, ingress_ifindex (0: loopback, whose
            // namespace resolves the redirect), rx_queue_index, egress_ifindex.
            let ctx: [u32; 6] = [0, frame.len() as u32, 0, 0, 0, 0];
            while !super::Sender::stopping(stopped) {
                let mut attr = Attr::default();
                put_u32(&mut attr, 0, prog.as_raw_fd() as u32);
                put_u32(&mut attr, 8, frame.len() as u32);
                attr[2] = frame.as_ptr() as u64;
                put_u32(&mut attr, 32, FRAMES_PER_CALL);
                put_u32(&mut attr, 40, std::mem::size_of_val(&ctx) as u32);
                attr[6] = ctx.as_ptr() as u64;
                put_u32(&mut attr, 64, BPF_F_TEST_XDP_LIVE_FRAMES);
                put_u32(&mut attr, 72, 64); // frames per batch
                if let Err(e) = bpf(BPF_PROG_TEST_RUN, &mut attr) {
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        panic!("BPF_PROG_TEST_RUN with live frames: {e}");
                    }
                }
            }
        });
        FrameGenerator { counter, sender }
    }

    /// Frames sent so far.
    pub fn sent(&self) -> u64 {
        self.counter.get()
    }

    /// Panics if the sending thread has stopped.
    pub fn assert_running(&mut self) {
        self.sender.assert_running();
    }
}
