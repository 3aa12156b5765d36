//! Packet fuzzing of the gateway's XDP and TC programs through `BPF_PROG_TEST_RUN`.
//!
//! A seeded generator makes packets biased toward the programs' deep paths: new and
//! tracked flows to configured services, replies from their backends, first and later
//! fragments, ICMP errors quoting service flows and random flows, TCP options; and
//! mutates a share of them (truncation at every layer, IP total length and IHL too big or too small,
//! IP options, fragment bits, bad L4 lengths and data offsets, corrupted checksums,
//! trailing bytes, VLAN tags, flipped bytes), besides packets of no service and random
//! bytes. Services are configured with `Datapath::apply` (two states taking turns, and
//! the redirect-capable interfaces changing, every phase). Each packet runs through the
//! XDP program and, when its IP header is one the kernel would forward, the TC egress
//! program; invariants are checked on every output, independently of the programs:
//!
//! - the verdict is one the program returns (XDP: PASS, DROP, REDIRECT; TC: "next");
//! - a packet neither to a gateway address, nor of a tracked flow, nor an ICMP error
//!   quoting a tracked flow leaves byte for byte unchanged with XDP_PASS (TC: only
//!   replies and ICMP errors of tracked flows change); only packets to a gateway address
//!   are dropped, and unchanged;
//! - a translated packet keeps its length, differs only in the fields a NAT rewrites
//!   (MACs and TTL when redirected, addresses, ports, checksums, the quoted header of
//!   an ICMP error), and every checksum it carries (IPv4 header; TCP/UDP with the
//!   pseudo-header, also in first fragments; ICMP; the quoted IPv4 header) sums to what
//!   the input's did: a valid checksum stays valid, an invalid one is not made valid. A
//!   UDP checksum of 0 ("none") stays 0;
//! - a forward translation goes to a backend of the service the packet was addressed
//!   to; a reply translation comes from the service whose backend sent it.
//!
//! Run by `tests/tests/fuzz.rs` (10^4 packets) and `cargo xtask fuzz datapath`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{Ipv4Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use berth::datapath::{DesiredState, Protocol, ServiceAddr, WeightedBackend};
use gateway_common::{proto, Flow, FlowKey, NAT_DST, NAT_SRC};

use crate::{
    packet::{checksum, decode, fix_ip_checksum, Packet, ACK, PSH, SYN},
    xdp::{
        net::*, run_gateway, run_tc, verdict_name, Conntrack, FixtureNet, TestDatapath, TC_NEXT,
        XDP_DROP, XDP_PASS, XDP_REDIRECT,
    },
};

/// A second gateway address.
const GW2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 101);
/// Routers that send ICMP errors, one on each side.
const ROUTER_CLIENT_SIDE: Ipv4Addr = Ipv4Addr::new(10, 250, 1, 254);
const ROUTER_BACKEND_SIDE: Ipv4Addr = Ipv4Addr::new(10, 250, 2, 254);
/// Packets per phase (a services state and a set of redirect-capable interfaces).
const PHASE: u64 = 1000;
/// Violations printed in full.
const SHOWN: usize = 5;

/// A small deterministic generator (SplitMix64).
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence is fixed by `seed` (a run is replayed by its seed).
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    /// One of `items` (not empty), each equally likely.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// What a fuzzing run did.
#[derive(Default)]
pub struct Report {
    /// The seed the run started from (pass it again to replay the run).
    pub seed: u64,
    /// Packets run through the XDP program.
    pub packets: u64,
    /// XDP verdict → packets.
    pub verdicts: BTreeMap<u32, u64>,
    /// Packets the XDP program changed.
    pub translated: u64,
    /// Packets also run through the TC program, and those it changed.
    pub tc_packets: u64,
    /// Packets the TC program changed.
    pub tc_translated: u64,
    /// Packets that broke an invariant, and the first few in full.
    pub violations: u64,
    /// The first violations, each described with its packet.
    pub shown: Vec<String>,
    /// The datapath's counters at the end (which paths the packets took).
    pub counters: BTreeMap<&'static str, u64>,
    /// Wall-clock time of the run.
    pub elapsed: Duration,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdicts: Vec<String> = self
            .verdicts
            .iter()
            .map(|(v, n)| format!("{} {n}", verdict_name(*v)))
            .collect();
        let counters: Vec<String> = self
            .counters
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(c, n)| format!("{c} {n}"))
            .collect();
        writeln!(
            f,
            "seed {:#x}: {} packets in {:.1} s ({:.0} packets/s)",
            self.seed,
            self.packets,
            self.elapsed.as_secs_f64(),
            self.packets as f64 / self.elapsed.as_secs_f64().max(1e-9)
        )?;
        writeln!(f, "  xdp verdicts: {}", verdicts.join(", "))?;
        writeln!(
            f,
            "  translated: xdp {}, tc {} of {}",
            self.translated, self.tc_translated, self.tc_packets
        )?;
        writeln!(f, "  counters: {}", counters.join(", "))?;
        write!(f, "  violations: {}", self.violations)?;
        for v in &self.shown {
            write!(f, "\n{v}")?;
        }
        Ok(())
    }
}

/// Runs `packets` packets from `seed`. Needs root (namespaces, BPF).
pub fn run(packets: u64, seed: u64) -> Report {
    let mut t = TestDatapath::load();
    let fx = FixtureNet::new();
    let ct = t.conntrack();
    let model = Model::new();
    let mut gen = Generator::new(seed, &model);
    let mut report = Report {
        seed,
        ..Report::default()
    };
    let start = Instant::now();
    fx.ns.enter(|| {
        for n in 0..packets {
            if n % PHASE == 0 {
                gen.next_phase(&mut t, &fx);
            }
            let (side, input) = gen.packet();
            let ifindex = if side == Side::Client { fx.fx0 } else { fx.fx1 };
            // Tuples are looked up before the run, which may record a new flow.
            let facts = Facts::of(&input, &ct, &model, gen.state);
            let (verdict, output) = run_gateway(&mut t.dp, ifindex, &input);
            report.packets += 1;
            *report.verdicts.entry(verdict).or_default() += 1;
            report.translated += u64::from(output != input);
            let problems = check(Program::Xdp, &facts, &input, verdict, &output);
            let mut shown = show(Program::Xdp, &problems, &input, verdict, &output);
            let mut broken = !problems.is_empty();
            if let Some(forwarded) = facts.as_forwarded(&input) {
                let tc_facts = Facts::of(forwarded, &ct, &model, gen.state);
                let (tc_verdict, tc_output) = run_tc(&mut t.dp, forwarded);
                report.tc_packets += 1;
                report.tc_translated += u64::from(tc_output != forwarded);
                let problems = check(Program::Tc, &tc_facts, forwarded, tc_verdict, &tc_output);
                shown += &show(Program::Tc, &problems, forwarded, tc_verdict, &tc_output);
                broken |= !problems.is_empty();
            }
            gen.learn(&input, &output);
            if broken {
                report.violations += 1;
                if report.shown.len() < SHOWN {
                    report.shown.push(format!(
                        "✗ packet {n} of seed {seed:#x} (ingress {side:?}, services state {}){shown}",
                        gen.state,
                    ));
                }
            }
        }
    });
    report.elapsed = start.elapsed();
    report.counters = t.dp.counters().expect("counters");
    report
}

/// The problems `program` had with one packet, with its input and output decoded.
fn show(
    program: Program,
    problems: &[String],
    input: &[u8],
    verdict: u32,
    output: &[u8],
) -> String {
    if problems.is_empty() {
        return String::new();
    }
    let (name, verdict) = match program {
        Program::Xdp => ("xdp", verdict_name(verdict).to_string()),
        Program::Tc => ("tc", format!("verdict {verdict:#x}")),
    };
    format!(
        "\n  {name}: {}\n  {name} input:\n    {}\n  {name} output, {verdict}:\n    {}",
        problems.join("; "),
        decode(input).replace('\n', "\n    "),
        decode(output).replace('\n', "\n    "),
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Client,
    Backend,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Program {
    Xdp,
    Tc,
}

/// The services of the run: two states that take turns.
struct Model {
    states: [DesiredState; 2],
    backends: BTreeSet<Ipv4Addr>,
}

/// Services as (gateway address, protocol, port, backends as (address, port, weight)).
type Table<'a> = &'a [(Ipv4Addr, Protocol, u16, &'a [(Ipv4Addr, u16, u16)])];

fn state(table: Table) -> DesiredState {
    let mut state = DesiredState::default();
    for &(addr, protocol, port, backends) in table {
        let backends = backends
            .iter()
            .map(|&(ip, port, weight)| WeightedBackend {
                endpoint: sa(ip, port).into(),
                weight,
            })
            .collect();
        state = state.with_service(svc(addr, protocol, port), backends);
    }
    state
}

/// A service's address and port (the fuzz model is IPv4 only).
fn service_addr(s: &ServiceAddr) -> SocketAddrV4 {
    v4(std::net::SocketAddr::new(s.addr, s.port))
}

fn svc(addr: Ipv4Addr, protocol: Protocol, port: u16) -> ServiceAddr {
    ServiceAddr {
        addr: addr.into(),
        protocol,
        port,
    }
}

impl Model {
    fn new() -> Self {
        use Protocol::*;
        let common: Table = &[
            (GW, Tcp, 81, &[(B1, 8081, 0), (B3, 8081, 1)]),
            (GW, Tcp, 83, &[(B_SAME_SIDE, 80, 1)]),
            (GW2, Tcp, 443, &[(B3, 8443, 1), (B1, 8443, 2)]),
            (GW2, Udp, 500, &[(B1, 5000, 1)]),
        ];
        let first: Table = &[
            (GW, Tcp, 80, &[(B1, 8080, 1), (B2, 8080, 1)]),
            (GW, Udp, 53, &[(B2, 5353, 1)]),
            (GW, Udp, 54, &[(B_NO_NEIGH, 53, 1)]),
            (GW, Udp, 55, &[(B1, 55, 0)]),
        ];
        // Backends removed and added, a service removed and another one with its
        // backend added, weights changed.
        let second: Table = &[
            (GW, Tcp, 80, &[(B1, 8080, 1), (B3, 8080, 3)]),
            (GW, Udp, 53, &[(B2, 5353, 1), (B3, 5353, 1)]),
            (GW, Udp, 56, &[(B_NO_NEIGH, 53, 1)]),
            (GW, Udp, 55, &[(B1, 55, 1)]),
        ];
        let first = state(&[common, first].concat());
        let second = state(&[common, second].concat());
        let states = [first, second];
        let all = || states.iter().flat_map(|s| s.services.iter());
        let backends = all()
            .flat_map(|(_, b)| b.iter().map(|b| *v4(b.endpoint).ip()))
            .collect();
        Model { backends, states }
    }

    /// Backends of the service at (`addr`, `proto`, `port`) in state `state`.
    fn backends_of(
        &self,
        state: usize,
        addr: Ipv4Addr,
        proto: u8,
        port: u16,
    ) -> Option<&[WeightedBackend]> {
        let protocol = match proto {
            proto::TCP => Protocol::Tcp,
            proto::UDP => Protocol::Udp,
            _ => return None,
        };
        self.states[state]
            .services
            .get(&svc(addr, protocol, port))
            .map(|b| b.as_slice())
    }

    fn is_gateway(&self, state: usize, addr: Ipv4Addr) -> bool {
        self.states[state].services.keys().any(|s| s.addr == addr)
    }
}

/// A flow the generator saw translated: replies and ICMP errors can be made for it.
#[derive(Clone, Copy)]
struct Seen {
    client: SocketAddrV4,
    service: SocketAddrV4,
    backend: SocketAddrV4,
    udp: bool,
}

/// Makes packets; remembers translated flows and first fragments for later ones.
struct Generator<'m> {
    rng: Rng,
    model: &'m Model,
    /// Index of the services state in force.
    state: usize,
    seen: Vec<Seen>,
    /// Later fragments of datagrams whose first fragment was sent.
    later: Vec<(Side, Vec<u8>)>,
}

const SEEN_MAX: usize = 512;

impl<'m> Generator<'m> {
    fn new(seed: u64, model: &'m Model) -> Self {
        Generator {
            rng: Rng::new(seed),
            model,
            state: 1,
            seen: Vec::new(),
            later: Vec::new(),
        }
    }

    /// Switches to the other services state and a random set of interfaces that take
    /// XDP frames (mostly both).
    fn next_phase(&mut self, t: &mut TestDatapath, fx: &FixtureNet) {
        self.state = 1 - self.state;
        t.dp.apply(&self.model.states[self.state])
            .unwrap_or_else(|e| panic!("applying services state {}: {e}", self.state));
        let xmit: &[u32] = match self.rng.below(6) {
            0 => &[fx.fx0],
            1 => &[fx.fx1],
            2 => &[],
            _ => &[fx.fx0, fx.fx1],
        };
        t.allow_redirect(xmit);
    }

    /// One packet and the side it arrives on.
    fn packet(&mut self) -> (Side, Vec<u8>) {
        let r = self.rng.below(100);
        let (side, mut frame) = match r {
            0..=29 => (Side::Client, self.forward()),
            30..=44 => (Side::Backend, self.reply()),
            45..=59 => self.icmp_error(),
            60..=71 => self.fragment(),
            72..=91 => (Side::Client, self.not_ours()),
            _ => return (Side::Client, self.noise()),
        };
        if self.rng.chance(15) {
            tcp_options(&mut frame);
        }
        if self.rng.chance(35) {
            for _ in 0..1 + self.rng.below(2) {
                self.mutate(&mut frame);
            }
        }
        // Now and then on the other interface.
        let side = match (self.rng.chance(5), side) {
            (true, Side::Client) => Side::Backend,
            (true, Side::Backend) => Side::Client,
            (false, s) => s,
        };
        (side, frame)
    }

    fn client(&mut self) -> SocketAddrV4 {
        // CLIENT has a neighbour entry; the others are on fx0's subnet without one, or
        // have no route at all.
        let ip = match self.rng.below(10) {
            0..=6 => CLIENT,
            7 | 8 => Ipv4Addr::new(10, 250, 1, 11 + self.rng.below(3) as u8),
            _ => Ipv4Addr::new(192, 0, 2, 1),
        };
        sa(ip, 40000 + self.rng.below(64) as u16)
    }

    /// A service of the state in force (now and then of the other state).
    fn service(&mut self) -> (ServiceAddr, Vec<WeightedBackend>) {
        let state = if self.rng.chance(10) {
            1 - self.state
        } else {
            self.state
        };
        let services = &self.model.states[state].services;
        let (s, b) = services
            .iter()
            .nth(self.rng.below(services.len()))
            .expect("services");
        (*s, b.to_vec())
    }

    fn l4(&mut self, src: SocketAddrV4, dst: SocketAddrV4, udp: bool) -> Packet {
        let mut p = if udp {
            let p = Packet::udp(src, dst);
            if self.rng.chance(10) {
                p.no_udp_checksum()
            } else {
                p
            }
        } else {
            let flags = self.rng.pick(&[SYN, ACK | PSH, ACK, 0x01 | ACK, 0x04]);
            Packet::tcp(src, dst).flags(flags)
        };
        let len = match self.rng.below(20) {
            0 => 1400 + self.rng.below(200),
            1..=5 => 0,
            _ => self.rng.below(64),
        };
        p = p.payload(&self.rng.bytes(len));
        p.id = self.rng.next_u64() as u16;
        if self.rng.chance(5) {
            p = p.ttl(self.rng.pick(&[0, 1, 2]));
        }
        if self.rng.chance(8) {
            let words = 1 + self.rng.below(10);
            let mut options = vec![1u8; words * 4];
            options[words * 4 - 1] = 0;
            p = p.options(&options);
        }
        p
    }

    /// A packet to a service, from a client.
    fn forward(&mut self) -> Vec<u8> {
        let (s, _) = self.service();
        let client = self.client();
        let udp = s.protocol == Protocol::Udp;
        self.l4(client, service_addr(&s), udp)
            .macs(CLIENT_MAC, FX0_MAC)
            .frame()
    }

    /// A reply from a backend: of a flow seen translated, or of none.
    fn reply(&mut self) -> Vec<u8> {
        let (backend, client, udp) = match self.seen_flow() {
            Some(f) if self.rng.chance(85) => (f.backend, f.client, f.udp),
            _ => {
                let (s, b) = self.service();
                let b = v4(b[self.rng.below(b.len())].endpoint);
                (b, self.client(), s.protocol == Protocol::Udp)
            }
        };
        self.l4(backend, client, udp)
            .macs(mac_of(*backend.ip()), FX1_MAC)
            .frame()
    }

    fn seen_flow(&mut self) -> Option<Seen> {
        (!self.seen.is_empty()).then(|| self.seen[self.rng.below(self.seen.len())])
    }

    /// An ICMP error: from the backend side quoting a forwarded packet, from the client
    /// side quoting a reply, or quoting a flow of no service.
    fn icmp_error(&mut self) -> (Side, Vec<u8>) {
        let (kind, code) = match self.rng.below(10) {
            0..=3 => (3, 4),
            4 | 5 => (3, 3),
            6 => (3, 1),
            7 | 8 => (11, 0),
            _ => (self.rng.pick(&[0, 5, 8, 12]), 0),
        };
        let rest = if code == 4 { 1280 } else { 0 };
        let flow = self.seen_flow();
        let (side, src, dst, quoted) = match (self.rng.below(3), flow) {
            (0, Some(f)) => {
                let from = self.rng.pick(&[*f.backend.ip(), ROUTER_BACKEND_SIDE]);
                let sent = self.l4(f.client, f.backend, f.udp).ttl(63);
                (Side::Backend, from, *f.client.ip(), sent)
            }
            (1, Some(f)) => {
                let from = self.rng.pick(&[*f.client.ip(), ROUTER_CLIENT_SIDE]);
                let sent = self.l4(f.service, f.client, f.udp).ttl(63);
                (Side::Client, from, *f.service.ip(), sent)
            }
            _ => {
                let a = self.client();
                let b = sa(Ipv4Addr::new(10, 250, 9, 9), 80);
                let udp = self.rng.chance(50);
                let side = self.rng.pick(&[Side::Client, Side::Backend]);
                let to = self.rng.pick(&[*a.ip(), GW]);
                (side, ROUTER_CLIENT_SIDE, to, self.l4(b, a, udp))
            }
        };
        let mut quote = quoted.quote();
        if self.rng.chance(10) {
            quote.truncate(self.rng.below(quote.len()));
        } else if self.rng.chance(20) {
            // Routers may quote more than 8 bytes (RFC 1812).
            quote = quoted.ip_bytes();
        }
        let mac = if side == Side::Client {
            (CLIENT_MAC, FX0_MAC)
        } else {
            (mac_of(src), FX1_MAC)
        };
        let frame = Packet::icmp_error(src, dst, kind, code, rest, &quote)
            .macs(mac.0, mac.1)
            .frame();
        (side, frame)
    }

    /// A first fragment of a datagram to a service or from a backend (its later
    /// fragment kept for later), or a later fragment.
    fn fragment(&mut self) -> (Side, Vec<u8>) {
        if !self.later.is_empty() && self.rng.chance(50) {
            let i = self.rng.below(self.later.len());
            return self.later.swap_remove(i);
        }
        let (side, p) = match self.seen_flow() {
            Some(f) if self.rng.chance(30) => (
                Side::Backend,
                self.l4(f.backend, f.client, f.udp)
                    .macs(mac_of(*f.backend.ip()), FX1_MAC),
            ),
            _ => {
                let (s, _) = self.service();
                let udp = s.protocol == Protocol::Udp;
                let client = self.client();
                (
                    Side::Client,
                    self.l4(client, service_addr(&s), udp)
                        .macs(CLIENT_MAC, FX0_MAC),
                )
            }
        };
        let len = 40 + self.rng.below(60);
        let p = p.payload(&self.rng.bytes(len));
        let header = p.l4_bytes().len() - p.payload.len();
        let first_len = (header + 8 * self.rng.below(4)).next_multiple_of(8);
        let (first, later) = p.fragments(first_len);
        if self.rng.chance(90) {
            self.later.push((side, later));
            if self.later.len() > 64 {
                self.later.remove(0);
            }
            (side, first)
        } else {
            // A later fragment whose first fragment is never seen.
            (side, later)
        }
    }

    /// Packets of no service: other addresses, unknown ports and protocols of a gateway
    /// address, ARP, IPv6, a service packet behind a VLAN tag.
    fn not_ours(&mut self) -> Vec<u8> {
        let client = self.client();
        let udp = self.rng.chance(50);
        let to = |ip, port| sa(ip, port);
        match self.rng.below(7) {
            0 => self
                .l4(client, to(Ipv4Addr::new(10, 250, 9, 9), 80), udp)
                .frame(),
            1 => {
                let gw = self.rng.pick(&[GW, GW2]);
                let port = 9000 + self.rng.below(100) as u16;
                self.l4(client, to(gw, port), udp).frame()
            }
            2 => {
                // Another protocol (GRE, SCTP, ICMP echo) to a gateway address.
                let mut f = self.l4(client, to(GW, 80), false).frame();
                f[23] = self.rng.pick(&[47, 132, 1]);
                fix_ip_checksum(&mut f[14..]);
                f
            }
            3 => {
                let mut arp = vec![0xff; 6];
                arp.extend(CLIENT_MAC);
                arp.extend([0x08, 0x06]);
                arp.extend(self.rng.bytes(28));
                arp
            }
            4 => {
                let mut ipv6 = FX0_MAC.to_vec();
                ipv6.extend(CLIENT_MAC);
                ipv6.extend([0x86, 0xdd, 0x60]);
                ipv6.extend(self.rng.bytes(39));
                ipv6
            }
            5 => {
                let mut f = self.forward();
                let tag = [0x81, 0x00, 0, self.rng.below(16) as u8];
                f.splice(12..12, tag);
                f
            }
            _ => {
                // From a backend address to a client, of no flow.
                let (s, b) = self.service();
                let b = v4(b[self.rng.below(b.len())].endpoint);
                let to_client = sa(*client.ip(), 20000 + self.rng.below(1000) as u16);
                self.l4(b, to_client, s.protocol == Protocol::Udp).frame()
            }
        }
    }

    /// Random bytes, mostly with an IPv4 EtherType and version.
    fn noise(&mut self) -> Vec<u8> {
        let len = 14 + self.rng.below(100);
        let mut f = self.rng.bytes(len);
        if self.rng.chance(70) {
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            if len > 14 {
                f[14] = 0x40 | (f[14] & 0x0f);
            }
            if len >= 34 && self.rng.chance(50) {
                f[30..34].copy_from_slice(&GW.octets());
            }
        }
        f
    }

    /// One mutation of a frame (assumed IPv4; harmless otherwise).
    fn mutate(&mut self, f: &mut Vec<u8>) {
        let ip = 14;
        if f.len() < ip + 20 {
            return;
        }
        let ihl = usize::from(f[ip] & 0x0f) * 4;
        let l4 = ip + ihl.max(20);
        let fix = self.rng.chance(80);
        match self.rng.below(12) {
            // Cut anywhere, mostly inside the headers.
            0 => {
                let end = if self.rng.chance(70) {
                    (l4 + 24).min(f.len())
                } else {
                    f.len()
                };
                let cut = 14 + self.rng.below(end - 14);
                f.truncate(cut);
            }
            // Bytes past the IP total length (Ethernet padding).
            1 => {
                let n = 1 + self.rng.below(32);
                f.extend(self.rng.bytes(n));
            }
            // IP total length too big, too small, or anything.
            2 => {
                let tot = u16::from_be_bytes([f[ip + 2], f[ip + 3]]) as usize;
                let new = match self.rng.below(3) {
                    0 => tot + 1 + self.rng.below(64),
                    1 => tot.saturating_sub(1 + self.rng.below(tot.max(1))),
                    _ => self.rng.below(65536),
                };
                f[ip + 2..ip + 4].copy_from_slice(&(new as u16).to_be_bytes());
            }
            // IHL anything; or the version.
            3 => f[ip] = 0x40 | self.rng.below(16) as u8,
            4 => f[ip] = (self.rng.below(16) as u8) << 4 | (f[ip] & 0x0f),
            // Fragment bits: MF, an offset, or both.
            5 => {
                let frag = match self.rng.below(3) {
                    0 => 0x2000,
                    1 => 1 + self.rng.below(0x1fff) as u16,
                    _ => 0x2000 | (1 + self.rng.below(0x1fff) as u16),
                };
                f[ip + 6..ip + 8].copy_from_slice(&frag.to_be_bytes());
            }
            // Transport lengths: UDP length, TCP data offset.
            6 if f.len() >= l4 + 14 => {
                let v = self.rng.next_u64() as u16;
                if f[ip + 9] == proto::UDP {
                    f[l4 + 4..l4 + 6].copy_from_slice(&v.to_be_bytes());
                } else {
                    f[l4 + 12] = (v as u8) & 0xf0;
                }
            }
            // A corrupted transport or IP checksum.
            7 if f.len() >= l4 + 18 => {
                let at = if f[ip + 9] == proto::UDP { 6 } else { 16 };
                f[l4 + at] ^= 1 + self.rng.below(255) as u8;
                return;
            }
            8 => {
                f[ip + 10] ^= 1 + self.rng.below(255) as u8;
                return;
            }
            // Another protocol.
            9 => f[ip + 9] = self.rng.pick(&[0, 1, 6, 17, 47, 255]),
            // A few flipped bytes, mostly in the headers.
            10 => {
                for _ in 0..1 + self.rng.below(4) {
                    let span = if self.rng.chance(80) {
                        (l4 + 28).min(f.len())
                    } else {
                        f.len()
                    };
                    let at = self.rng.below(span);
                    f[at] ^= 1 << self.rng.below(8);
                }
                return;
            }
            // A VLAN tag.
            _ => {
                f.splice(12..12, [0x81, 0x00, 0, 7]);
                return;
            }
        }
        if fix && f.len() >= ip + 20 && f[12..14] == [0x08, 0x00] {
            fix_ip_checksum(&mut f[ip..]);
        }
    }

    /// Remembers a flow that the program translated forward.
    fn learn(&mut self, input: &[u8], output: &[u8]) {
        let (Some(i), Some(o)) = (Ip::parse(input), Ip::parse(output)) else {
            return;
        };
        if i.frag != 0 || !matches!(i.proto, proto::TCP | proto::UDP) || i.dst == o.dst {
            return;
        }
        let (Some(ip_ports), Some(op)) = (i.ports(input), o.ports(output)) else {
            return;
        };
        let seen = Seen {
            client: sa(i.src, ip_ports.0),
            service: sa(i.dst, ip_ports.1),
            backend: sa(o.dst, op.1),
            udp: i.proto == proto::UDP,
        };
        if self.seen.len() >= SEEN_MAX {
            let at = self.rng.below(SEEN_MAX);
            self.seen[at] = seen;
        } else {
            self.seen.push(seen);
        }
    }
}

/// An IPv4 header as the program accepts it: version 4, IHL at least 20, total length
/// at least the header and within the frame.
#[derive(Clone, Copy)]
struct Ip {
    ihl: usize,
    tot_len: usize,
    proto: u8,
    /// Fragment offset and MF (flags masked).
    frag: u16,
    src: Ipv4Addr,
    dst: Ipv4Addr,
}

const IP: usize = 14;

impl Ip {
    fn parse(f: &[u8]) -> Option<Ip> {
        if f.len() < IP + 20 || f[12..14] != [0x08, 0x00] || f[IP] >> 4 != 4 {
            return None;
        }
        let ihl = usize::from(f[IP] & 0x0f) * 4;
        let tot_len = usize::from(u16::from_be_bytes([f[IP + 2], f[IP + 3]]));
        if ihl < 20 || tot_len < ihl || IP + tot_len > f.len() {
            return None;
        }
        Some(Ip {
            ihl,
            tot_len,
            proto: f[IP + 9],
            frag: u16::from_be_bytes([f[IP + 6], f[IP + 7]]) & 0x3fff,
            src: addr_at(f, IP + 12),
            dst: addr_at(f, IP + 16),
        })
    }

    fn l4(&self) -> usize {
        IP + self.ihl
    }

    fn later_fragment(&self) -> bool {
        self.frag & 0x1fff != 0
    }

    /// Source and destination ports, if the transport header starts in this packet.
    fn ports(&self, f: &[u8]) -> Option<(u16, u16)> {
        let l4 = self.l4();
        (!self.later_fragment() && f.len() >= l4 + 4).then(|| (port_at(f, l4), port_at(f, l4 + 2)))
    }
}

fn addr_at(f: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(f[at], f[at + 1], f[at + 2], f[at + 3])
}

fn port_at(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

/// The conntrack key of a tuple (fields in network order, as the program reads them).
fn flow_key(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, proto: u8) -> FlowKey {
    FlowKey {
        src: u32::from(src).to_be(),
        dst: u32::from(dst).to_be(),
        sport: sport.to_be(),
        dport: dport.to_be(),
        proto,
        pad: [0; 3],
    }
}

/// What is known about an input before it runs: what may change it.
struct Facts {
    /// The IPv4 header, if the program accepts it.
    ip: Option<Ip>,
    /// Sent to an address that has services (in the state in force).
    to_gateway: bool,
    /// Its tuple is tracked (its flow entry), or it is a later fragment (whose flow
    /// only the fragment map knows).
    tracked: Option<Flow>,
    later_fragment: bool,
    /// Sent from an address that is a backend in some state.
    from_backend: bool,
    /// An ICMP error (destination unreachable, time exceeded) quoting a tracked flow.
    quote_tracked: Option<Flow>,
    /// What the generator's model says about the translation.
    model: Expect,
}

/// Services of the state in force, and every service a backend belonged to.
struct Expect {
    /// Backends of the service the packet is addressed to (state in force).
    backends: Vec<SocketAddrV4>,
    /// Backend addresses of any service on the packet's destination (for fragments).
    backend_addrs: BTreeSet<Ipv4Addr>,
    /// Services (address, port) whose backend the source is, in any state.
    services_of_source: BTreeSet<SocketAddrV4>,
}

impl Facts {
    fn of(f: &[u8], ct: &Conntrack, model: &Model, state: usize) -> Facts {
        let ip = Ip::parse(f);
        // A tuple's entry, or (a router reply, which has none of its own) the forward
        // entry of its flow to some service of either state, found as the program finds
        // it through the reply index; seen as the reply's `NAT_SRC` translation.
        let lookup = |k: FlowKey| {
            ct.get(&k, 0).ok().or_else(|| {
                model
                    .states
                    .iter()
                    .flat_map(|s| s.services.keys())
                    .filter(|svc| svc.protocol.number() == k.proto)
                    .find_map(|svc| {
                        let key = svc.key().expect("the fuzz model is IPv4");
                        let fwd = FlowKey {
                            src: k.dst,
                            dst: key.addr,
                            sport: k.dport,
                            dport: key.port,
                            ..k
                        };
                        let f = ct.get(&fwd, 0).ok()?;
                        (f.kind == NAT_DST && f.nat_addr == k.src && f.nat_port == k.sport)
                            .then_some(Flow {
                                kind: NAT_SRC,
                                nat_addr: key.addr,
                                nat_port: key.port,
                                ..f
                            })
                    })
            })
        };
        let mut facts = Facts {
            ip,
            to_gateway: f.len() >= IP + 20
                && f[12..14] == [0x08, 0x00]
                && model.is_gateway(state, addr_at(f, IP + 16)),
            tracked: None,
            later_fragment: false,
            from_backend: false,
            quote_tracked: None,
            model: Expect {
                backends: Vec::new(),
                backend_addrs: BTreeSet::new(),
                services_of_source: BTreeSet::new(),
            },
        };
        let Some(ip) = ip else {
            return facts;
        };
        let l4 = ip.l4();
        facts.later_fragment = ip.later_fragment();
        facts.from_backend = model.backends.contains(&ip.src);
        if let Some((sport, dport)) = ip.ports(f) {
            if matches!(ip.proto, proto::TCP | proto::UDP) {
                facts.tracked = lookup(flow_key(ip.src, ip.dst, sport, dport, ip.proto));
                facts.model.backends = model
                    .backends_of(state, ip.dst, ip.proto, dport)
                    .unwrap_or_default()
                    .iter()
                    .map(|b| v4(b.endpoint))
                    .collect();
                for s in &model.states {
                    for (service, backends) in &s.services {
                        if service.protocol.number() == ip.proto
                            && backends
                                .iter()
                                .any(|b| b.endpoint == sa(ip.src, sport).into())
                        {
                            facts.model.services_of_source.insert(service_addr(service));
                        }
                    }
                }
            }
        }
        for (service, backends) in &model.states[state].services {
            if service.addr == ip.dst && service.protocol.number() == ip.proto {
                facts
                    .model
                    .backend_addrs
                    .extend(backends.iter().map(|b| *v4(b.endpoint).ip()));
            }
        }
        if ip.proto == proto::ICMP
            && ip.frag == 0
            && f.len() >= l4 + 8 + 24
            && matches!(f[l4], 3 | 11)
        {
            let inner = l4 + 8;
            facts.quote_tracked = lookup(flow_key(
                addr_at(f, inner + 16),
                addr_at(f, inner + 12),
                port_at(f, inner + 22),
                port_at(f, inner + 20),
                f[inner + 9],
            ));
        }
        facts
    }

    /// The packet as the kernel would forward it (and TC see it on egress): its IPv4
    /// header accepted, checksum included, and the frame cut to the IP total length.
    fn as_forwarded<'f>(&self, f: &'f [u8]) -> Option<&'f [u8]> {
        let ip = self.ip?;
        (checksum(&f[IP..ip.l4()]) == 0).then(|| &f[..IP + ip.tot_len])
    }

    /// Whether `program` may change this packet at all.
    fn may_change(&self, program: Program) -> bool {
        let from_backend = self.from_backend;
        match program {
            Program::Xdp => {
                self.to_gateway
                    || self.tracked.is_some()
                    || self.quote_tracked.is_some()
                    || (self.later_fragment && from_backend)
            }
            Program::Tc => {
                self.tracked.is_some_and(|f| f.kind == NAT_SRC)
                    || self.quote_tracked.is_some_and(|f| f.kind == NAT_SRC)
                    || (self.later_fragment && from_backend)
            }
        }
    }
}

/// The one's-complement sum of `bytes` (as `checksum` folds it), 0 and 0xffff alike.
fn sum(bytes: &[u8]) -> u16 {
    match checksum(bytes) {
        0xffff => 0,
        c => c,
    }
}

/// A TCP/UDP segment (or first fragment) behind its pseudo-header.
fn with_pseudo_header(f: &[u8], ip: &Ip) -> Vec<u8> {
    let mut p = Vec::with_capacity(12 + ip.tot_len);
    p.extend(&f[IP + 12..IP + 20]);
    p.extend([0, ip.proto]);
    p.extend(((ip.tot_len - ip.ihl) as u16).to_be_bytes());
    p.extend(&f[ip.l4()..IP + ip.tot_len]);
    p
}

/// The sum of a TCP/UDP segment (or first fragment) with its pseudo-header.
fn l4_sum(f: &[u8], ip: &Ip) -> u16 {
    sum(&with_pseudo_header(f, ip))
}

/// Turns the first 12 payload bytes of a whole TCP segment into options (MSS, SACK
/// permitted, window scale), its checksum recomputed.
fn tcp_options(f: &mut [u8]) {
    let Some(ip) = Ip::parse(f) else {
        return;
    };
    let l4 = ip.l4();
    if ip.proto != proto::TCP || ip.frag != 0 || IP + ip.tot_len < l4 + 32 {
        return;
    }
    f[l4 + 12] = 8 << 4;
    f[l4 + 20..l4 + 32].copy_from_slice(&[2, 4, 5, 180, 4, 2, 1, 1, 3, 3, 7, 0]);
    f[l4 + 16..l4 + 18].fill(0);
    let c = checksum(&with_pseudo_header(f, &ip));
    f[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
}

/// The invariants of one run of `program` on `input` (see the module's doc).
fn check(
    program: Program,
    facts: &Facts,
    input: &[u8],
    verdict: u32,
    output: &[u8],
) -> Vec<String> {
    let mut problems = Vec::new();
    let xdp = program == Program::Xdp;
    let expected = match program {
        Program::Xdp => [XDP_PASS, XDP_DROP, XDP_REDIRECT].contains(&verdict),
        Program::Tc => verdict == TC_NEXT,
    };
    if !expected {
        problems.push(format!(
            "unexpected verdict {verdict:#x} ({})",
            verdict_name(verdict)
        ));
    }
    if xdp && verdict == XDP_DROP && !facts.to_gateway {
        problems.push("dropped a packet not sent to a gateway address".into());
    }
    if output.len() != input.len() {
        problems.push(format!("length {} became {}", input.len(), output.len()));
        return problems;
    }
    if output == input {
        if xdp && verdict == XDP_REDIRECT {
            problems.push("redirected without a new TTL and MACs".into());
        }
        return problems;
    }
    if !facts.may_change(program) {
        problems.push("changed a packet of no service, no backend and no tracked flow".into());
        return problems;
    }
    if xdp && verdict == XDP_DROP {
        problems.push("changed a packet it dropped".into());
    }
    let Some(ip) = facts.ip else {
        problems.push("changed a packet whose IP header it cannot accept".into());
        return problems;
    };
    let redirected = xdp && verdict == XDP_REDIRECT;
    check_fields(&ip, redirected, input, output, &mut problems);
    check_checksums(&ip, input, output, &mut problems);
    if let (proto::TCP | proto::UDP, Some(out)) = (ip.proto, Ip::parse(output)) {
        check_nat(
            program,
            redirected,
            facts,
            (&ip, input),
            (&out, output),
            &mut problems,
        );
    }
    problems
}

/// Only the fields a NAT rewrites differ: MACs and TTL when redirected, addresses,
/// ports, checksums, and the quoted header of an ICMP error.
fn check_fields(
    ip: &Ip,
    redirected: bool,
    input: &[u8],
    output: &[u8],
    problems: &mut Vec<String>,
) {
    let l4 = ip.l4();
    let mut allowed = vec![false; input.len()];
    let mut allow = |from: usize, to: usize| {
        for a in allowed.iter_mut().take(to).skip(from) {
            *a = true;
        }
    };
    if redirected {
        allow(0, 12);
        allow(IP + 8, IP + 9);
    }
    allow(IP + 10, IP + 20);
    match ip.proto {
        proto::TCP | proto::UDP if !ip.later_fragment() => {
            allow(l4, l4 + 4);
            let check = if ip.proto == proto::UDP { 6 } else { 16 };
            allow(l4 + check, l4 + check + 2);
        }
        proto::ICMP => {
            allow(l4 + 2, l4 + 4);
            allow(l4 + 8 + 10, l4 + 8 + 24);
        }
        _ => {}
    }
    let changed: Vec<usize> = (0..input.len())
        .filter(|&i| input[i] != output[i] && !allowed[i])
        .collect();
    if !changed.is_empty() {
        problems.push(format!(
            "bytes a NAT does not rewrite changed at {changed:?}"
        ));
    }
    if redirected && output[IP + 8] != input[IP + 8].wrapping_sub(1) {
        problems.push("redirected without decrementing the TTL".into());
    }
}

/// Every checksum sums as the input's did (a valid one stays valid); a UDP checksum of
/// 0 ("none") stays 0 and no other becomes 0.
fn check_checksums(ip: &Ip, input: &[u8], output: &[u8], problems: &mut Vec<String>) {
    let l4 = ip.l4();
    let end = IP + ip.tot_len;
    let region = |f: &[u8], from: usize, to: usize| sum(&f[from.min(f.len())..to.min(f.len())]);
    if region(input, IP, l4) != region(output, IP, l4) {
        problems.push("IPv4 header checksum broken".into());
    }
    match ip.proto {
        proto::TCP | proto::UDP if !ip.later_fragment() && end >= l4 + 8 => {
            let udp = ip.proto == proto::UDP;
            let field = |f: &[u8]| f[l4 + 6..l4 + 8] == [0, 0];
            if udp && field(input) {
                if !field(output) {
                    problems.push("UDP checksum 0 (none) was filled in".into());
                }
                return;
            }
            if udp && field(output) {
                problems.push("UDP checksum became 0 (none)".into());
            }
            if !udp && end < l4 + 18 {
                problems.push("translated a TCP header cut by the IP total length".into());
            } else if l4_sum(input, ip) != l4_sum(output, ip) {
                problems.push(format!(
                    "{} checksum broken (the input's was {})",
                    if udp { "UDP" } else { "TCP" },
                    if l4_sum(input, ip) == 0 {
                        "valid"
                    } else {
                        "invalid"
                    }
                ));
            }
        }
        proto::ICMP => {
            if region(input, l4, end) != region(output, l4, end) {
                problems.push(format!(
                    "ICMP checksum broken (total length {} ends {} bytes into the ICMP message)",
                    ip.tot_len,
                    end.saturating_sub(l4)
                ));
            }
            if region(input, l4 + 8, l4 + 28) != region(output, l4 + 8, l4 + 28) {
                problems.push("quoted IPv4 header checksum broken".into());
            }
        }
        _ => {}
    }
}

/// Forward translations go to a backend of the service addressed (XDP only), replies
/// come from a service the source is a backend of (XDP only when it redirects them).
fn check_nat(
    program: Program,
    redirected: bool,
    facts: &Facts,
    (ip, input): (&Ip, &[u8]),
    (out, output): (&Ip, &[u8]),
    problems: &mut Vec<String>,
) {
    let dst_changed = out.dst != ip.dst;
    let src_changed = out.src != ip.src;
    if dst_changed && src_changed {
        problems.push("both addresses rewritten".into());
    }
    if dst_changed {
        if program == Program::Tc {
            problems.push("the TC program rewrote a destination".into());
        }
        match (ip.ports(input), out.ports(output)) {
            (Some(_), Some((_, dport))) => {
                if !facts.model.backends.contains(&sa(out.dst, dport)) {
                    problems.push(format!(
                        "forwarded to {}:{dport}, not a backend of the service addressed (backends {:?})",
                        out.dst, facts.model.backends
                    ));
                }
            }
            _ => {
                if !facts.model.backend_addrs.contains(&out.dst) {
                    problems.push(format!(
                        "fragment forwarded to {}, no backend of a service on {}",
                        out.dst, ip.dst
                    ));
                }
            }
        }
    }
    if src_changed {
        if program == Program::Xdp && !redirected {
            problems.push("a reply translated but handed to the kernel".into());
        }
        if let Some((sport, _)) = out.ports(output) {
            if !facts.model.services_of_source.contains(&sa(out.src, sport)) {
                problems.push(format!(
                    "reply rewritten to come from {}:{sport}, not a service of the backend (services {:?})",
                    out.src, facts.model.services_of_source
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_packets_and_another_seed_others() {
        let model = Model::new();
        let frames = |seed| {
            let mut gen = Generator::new(seed, &model);
            (0..2000).map(|_| gen.packet()).collect::<Vec<_>>()
        };
        let a = frames(7);
        assert!(a == frames(7), "seed 7 gave two sequences");
        assert!(a != frames(8), "seeds 7 and 8 gave one sequence");
    }

    #[test]
    fn tcp_options_keep_the_segment_valid() {
        let mut f = Packet::tcp(sa(CLIENT, 40000), sa(GW, 80))
            .payload(&[0xab; 20])
            .frame();
        let before = f.clone();
        tcp_options(&mut f);
        let ip = Ip::parse(&f).expect("an IPv4 packet");
        assert_eq!(f[ip.l4() + 12], 0x80, "data offset of 8 words");
        assert_ne!(f, before);
        assert_eq!(l4_sum(&f, &ip), 0, "TCP checksum valid");
    }
}
