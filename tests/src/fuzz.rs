//! Packet fuzzing of the gateway's XDP and TC programs through `BPF_PROG_TEST_RUN`.
//!
//! A seeded generator makes IPv4 and (about two packets in five) IPv6 packets biased
//! toward the programs' deep paths: new and tracked flows to configured services,
//! replies from their backends (in SNAT mode to the node address and port the flow
//! claimed, learnt from a translated output), first and later fragments (IPv6: a
//! fragment header), ICMP and ICMPv6 errors quoting service flows both ways (as the
//! backend or the client got the packet) and random flows, from backends, clients and
//! routers, backends' packets to node ports of no flow, TCP options, IPv6 extension
//! header chains (hop-by-hop, routing, destination options, AH, fragment; in any order,
//! up to nine, sometimes ending in ESP, no next header or an unknown protocol),
//! neighbour discovery and echo; and mutates a share of them (truncation at every
//! layer, IPv4 total length and IHL, IPv6 payload length (also 0) and extension header
//! lengths too big or too small, IP options, fragment bits, protocol and next header
//! changed, bad L4 lengths and data offsets, corrupted checksums, IPv6 UDP checksums
//! set to 0, trailing bytes, VLAN tags, flipped bytes, the version changed), besides
//! packets of no service and random bytes. Services of both families (a dual-stack port
//! among them) in router and SNAT mode are configured with `Datapath::apply` (two
//! states taking turns, one service switching modes, a SNAT port pool of two ranges
//! and one of six ports that runs out, and the redirect-capable interfaces changing,
//! every phase). Each packet runs through the XDP program and, when its IP header is
//! one the kernel would forward, the TC egress program; so does XDP's output when XDP
//! translated it and handed it to the kernel (a SNAT flow's packet with only its
//! destination half translated), and now and then the ICMP error the kernel would send
//! about that output (time exceeded, fragmentation needed, packet too big). Invariants are checked on every output, independently
//! of the programs (the oracle reads both families through one view, `Ip`, walks IPv6
//! extension headers itself, and knows the node's address toward each backend from the
//! fixture network):
//!
//! - the verdict is one the program returns (XDP: PASS, DROP, REDIRECT; TC: "next", and
//!   "shot" only for an ICMPv6 redirect, which the TC program drops);
//! - a packet neither to a gateway address, nor of a tracked flow, nor a reply whose
//!   flow has no entry but whose tuple Maglev maps to the backend it came from (a flow
//!   begun on another gateway behind ECMP: translated as that service, only as one
//!   whose Maglev maps it so, and its flow recorded, `check_recorded`), nor an ICMP(v6)
//!   error quoting a tracked flow leaves byte for byte unchanged with XDP_PASS (so does one
//!   to the node's address that is no tracked SNAT flow's reply; TC: only replies, SNAT
//!   forward packets the kernel forwarded and ICMP errors of tracked flows change); only
//!   packets to a gateway address are dropped, and replies (or ICMP errors quoting a
//!   packet to a backend) that did not come from where their backend is (its side,
//!   its neighbour MAC: `reply_spoofed`), and all unchanged;
//! - a translated packet keeps its length, differs only in the fields a NAT rewrites
//!   (MACs and TTL or hop limit when redirected, addresses, ports, checksums, the quoted
//!   header of an ICMP error), and every checksum it carries (IPv4 header; TCP/UDP with
//!   the pseudo-header of its family, also in first fragments and when both addresses
//!   and both ports change; ICMP, ICMPv6 with its pseudo-header; the quoted IPv4
//!   header; the quoted TCP/UDP checksum of an ICMPv6 error, which the program keeps
//!   right) sums to what the input's did: a valid checksum stays valid, an invalid one
//!   is not made valid. A UDP checksum of 0 ("none") stays 0; an IPv6 UDP datagram with
//!   checksum 0 (invalid) to a gateway address is never translated;
//! - one checker for both modes (`check_nat`): a forward translation goes to a backend
//!   of the service the packet was addressed to (so of its family); its source changes
//!   only in SNAT mode (XDP only when it sends the packet itself, else TC on egress),
//!   to the node's address toward that backend and the port its flow claimed, or a new
//!   claim from the SNAT ports in force (a new SNAT flow may instead be dropped, counted,
//!   when no port is free); a reply translation comes from the service whose backend
//!   sent it, and a SNAT reply (to the node's address) goes to its flow's client, from
//!   its flow's gateway address and port;
//! - an ICMP error about a tracked flow has its quote and outer addresses translated as
//!   the flow's translation makes them (`check_quote`);
//! - a SNAT forward packet's node address and port are its flow's claim: read after the
//!   run, the reply entry under (backend → node address and port) sends replies to this
//!   packet's client; once the LRU evicts, it may be gone, but is never another flow's
//!   (`check_claim`).
//!
//! Run by `tests/tests/fuzz.rs` (10^4 packets) and `cargo xtask fuzz datapath`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    ops::{Range, RangeInclusive},
    time::{Duration, Instant},
};

use berth::datapath::{DesiredState, MapAddr, Protocol, ServiceAddr, WeightedBackend};
use gateway_common::{proto, NAT_DST, NAT_MASQ, NAT_SRC};

use crate::{
    packet::{
        checksum, decode, fix_ip_checksum, Packet, Packet6, ACK, DEST_OPTS, ESP, FRAGMENT,
        HOP_BY_HOP, PSH, ROUTING, SYN,
    },
    xdp::{
        conntrack_entry, maglev_pick, net::*, run_gateway, run_tc, test_limits, verdict_name,
        Conntrack, FixtureNet, TestDatapath, TC_NEXT, XDP_DROP, XDP_PASS, XDP_REDIRECT,
    },
};

/// A second gateway address of each family.
const GW2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 101);
const GW6_2: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 0x65);
/// An IPv6 backend on fx1's subnet with no neighbour entry.
const B_NO_NEIGH6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 2, 0, 0, 0, 0, 0x20);
/// An IPv6 backend on the client side (fx0; `run` gives it a neighbour entry).
const B_SAME_SIDE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 0x50);
/// A backend the fixture namespace has no route to (SNAT: no node address toward it).
const B_UNROUTED: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);
const B_UNROUTED6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7);
/// IPv6 extension header type: authentication header (length in 4-byte units).
const AUTH: u8 = 51;
/// IPv6 next header "no next header".
const NO_NEXT: u8 = 59;
/// TC verdict "shot" (`TC_ACT_SHOT`).
const TC_SHOT: u32 = 2;
/// Packets per phase (a services state and a set of redirect-capable interfaces).
const PHASE: u64 = 1000;
/// Violations printed in full.
const SHOWN: usize = 5;
/// IPv6 packets in a hundred.
const IPV6_PERCENT: usize = 40;

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
    /// What of it was IPv6.
    pub ipv6: Ipv6Report,
    /// What of it was SNAT flows' (both families).
    pub snat: SnatReport,
    /// Packets that broke an invariant, and the first few in full.
    pub violations: u64,
    /// The first violations, each described with its packet.
    pub shown: Vec<String>,
    /// The datapath's counters at the end (which paths the packets took).
    pub counters: BTreeMap<&'static str, u64>,
    /// Wall-clock time of the run.
    pub elapsed: Duration,
}

/// The IPv6 share of a run (the counters are the families' sum).
#[derive(Default)]
pub struct Ipv6Report {
    /// IPv6 frames run through the XDP program.
    pub packets: u64,
    /// Those it dropped.
    pub dropped: u64,
    /// Those it changed.
    pub translated: u64,
    /// IPv6 frames the TC program changed.
    pub tc_translated: u64,
    /// ICMPv6 errors either program changed.
    pub icmp_translated: u64,
    /// Later fragments (no transport header) either program changed.
    pub later_fragments_translated: u64,
}

/// The packets of SNAT flows either program changed.
#[derive(Default)]
pub struct SnatReport {
    /// Forward packets XDP gave the node source (it sent them itself).
    pub forward: u64,
    /// Replies to the node address XDP translated (sent or handed to the kernel).
    pub replies: u64,
    /// Forward packets the kernel forwarded that TC gave the node source.
    pub masq: u64,
    /// ICMP and ICMPv6 errors quoting a SNAT flow either program translated.
    pub icmp: u64,
    /// Later fragments among the packets above.
    pub later_fragments: u64,
}

impl SnatReport {
    /// Counts a change `program` made to a packet (`facts`), if of a SNAT flow.
    fn changed(&mut self, program: Program, facts: &Facts, output: &[u8]) {
        let (Some(ip), Some(out)) = (facts.ip, Ip::parse(output)) else {
            return;
        };
        let xdp = program == Program::Xdp;
        let counter = if facts.quote_flows.iter().any(|q| q.peer.is_some()) {
            &mut self.icmp
        } else if !matches!(ip.proto, proto::TCP | proto::UDP) || out.src == ip.src && !xdp {
            return;
        } else if facts.to_node && xdp {
            &mut self.replies
        } else if xdp && out.src != ip.src && out.dst != ip.dst {
            &mut self.forward
        } else if !xdp && facts.to_backend {
            &mut self.masq
        } else {
            return;
        };
        *counter += 1;
        self.later_fragments += u64::from(ip.later);
    }
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
        let v6 = &self.ipv6;
        writeln!(
            f,
            "  ipv6: {} packets, {} dropped; translated: xdp {}, tc {}; of them ICMPv6 errors {}, later fragments {}",
            v6.packets, v6.dropped, v6.translated, v6.tc_translated, v6.icmp_translated, v6.later_fragments_translated
        )?;
        let snat = &self.snat;
        writeln!(
            f,
            "  snat: translated: xdp forward {}, replies {}; tc forward {}; ICMP errors {}; of them later fragments {}",
            snat.forward, snat.replies, snat.masq, snat.icmp, snat.later_fragments
        )?;
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
    fx.neighbour(B_SAME_SIDE6.into(), B_SAME_SIDE_MAC, "fx0");
    let mut ct = Tracker {
        v4: t.conntrack(),
        v6: t.conntrack6(),
        evicting: false,
    };
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
                let created = t.dp.counters().expect("counters")["ct_created"];
                ct.evicting = created >= u64::from(test_limits().flows);
            }
            let (side, input) = gen.packet();
            let ifindex = if side == Side::Client { fx.fx0 } else { fx.fx1 };
            // Tuples are looked up before the run, which may record a new flow.
            let mut facts = Facts::of(&input, &ct, &gen);
            facts.from_elsewhere = from_elsewhere(side, &input, gen.model);
            let (verdict, output) = run_gateway(&mut t.dp, ifindex, &input);
            report.packets += 1;
            *report.verdicts.entry(verdict).or_default() += 1;
            report.translated += u64::from(output != input);
            if facts.v6 {
                let v6 = &mut report.ipv6;
                v6.packets += 1;
                v6.dropped += u64::from(verdict == XDP_DROP);
                if output != input {
                    v6.translated += 1;
                    v6.changed(facts.ip);
                }
            }
            if output != input {
                report.snat.changed(Program::Xdp, &facts, &output);
            }
            let mut problems = check(Program::Xdp, &facts, &input, verdict, &output);
            problems.extend(check_claim(&ct, Program::Xdp, &facts, &input, &output));
            problems.extend(check_recorded(&ct, &facts, &input, &output));
            let mut shown = show(Program::Xdp, &problems, &input, verdict, &output);
            let mut broken = !problems.is_empty();
            gen.learn(&input, &output);
            // The TC program sees what the kernel forwards: the packet as it came (a
            // reply XDP left alone, ...) and, handed to the kernel translated, XDP's
            // output (a SNAT flow's packet with its destination half applied).
            let passed = verdict == XDP_PASS && output != input;
            let error = passed.then(|| gen.kernel_error(&output)).flatten();
            // (Only XDP's output went through XDP's checks of its flow: the input, to a
            // backend, may be a client's own packet that only shares the flow's tuple.)
            let frames = [
                Some((&input, false)),
                passed.then_some((&output, true)),
                error.as_ref().map(|e| (e, false)),
            ];
            for (frame, vetted) in frames.into_iter().flatten() {
                let run = (frame.as_slice(), vetted);
                if let Some(problems) = egress(&mut t, &ct, &mut gen, &mut report, run) {
                    shown += &problems;
                    broken = true;
                }
            }
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

/// Runs `frame` through the TC program as the kernel would send it on (if it would),
/// checks the output and learns from it; the problems, shown, if any.
fn egress(
    t: &mut TestDatapath,
    ct: &Tracker,
    gen: &mut Generator,
    report: &mut Report,
    (frame, vetted): (&[u8], bool),
) -> Option<String> {
    let forwarded = as_forwarded(frame)?;
    let facts = Facts::of(forwarded, ct, gen);
    let (verdict, output) = run_tc(&mut t.dp, forwarded);
    report.tc_packets += 1;
    report.tc_translated += u64::from(output != forwarded);
    if output != forwarded {
        report.snat.changed(Program::Tc, &facts, &output);
        if facts.v6 {
            report.ipv6.tc_translated += 1;
            report.ipv6.changed(facts.ip);
        }
    }
    gen.learn(forwarded, &output);
    let mut problems = check(Program::Tc, &facts, forwarded, verdict, &output);
    if vetted {
        problems.extend(check_claim(ct, Program::Tc, &facts, forwarded, &output));
    }
    problems.extend(check_recorded(ct, &facts, forwarded, &output));
    (!problems.is_empty()).then(|| show(Program::Tc, &problems, forwarded, verdict, &output))
}

impl Ipv6Report {
    /// Counts what kind of IPv6 packet a program changed.
    fn changed(&mut self, ip: Option<Ip>) {
        if let Some(ip) = ip {
            self.icmp_translated += u64::from(ip.proto == proto::ICMPV6);
            self.later_fragments_translated += u64::from(ip.later);
        }
    }
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

/// The address family of a generated packet, and the fixture's addresses of it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn of(ip: IpAddr) -> Family {
        if ip.is_ipv6() {
            Family::V6
        } else {
            Family::V4
        }
    }

    /// Client `n`: 0 has a neighbour entry, 1 to 3 are on fx0's subnet without one,
    /// the others have no route.
    fn client(self, n: u8) -> IpAddr {
        match (self, n) {
            (Family::V4, 0) => CLIENT.into(),
            (Family::V4, 1..=3) => Ipv4Addr::new(10, 250, 1, 10 + n).into(),
            (Family::V4, _) => Ipv4Addr::new(192, 0, 2, 1).into(),
            (Family::V6, 0) => CLIENT6.into(),
            (Family::V6, 1..=3) => {
                Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 0x10 + u16::from(n)).into()
            }
            (Family::V6, _) => Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1).into(),
        }
    }

    /// A router on `side`, sending ICMP errors.
    fn router(self, side: Side) -> IpAddr {
        let side = if side == Side::Client { 1 } else { 2 };
        match self {
            Family::V4 => Ipv4Addr::new(10, 250, side, 254).into(),
            Family::V6 => Ipv6Addr::new(0xfd00, 0x250, side.into(), 0, 0, 0, 0, 0xfe).into(),
        }
    }

    /// An address of no service and no role.
    fn elsewhere(self) -> IpAddr {
        match self {
            Family::V4 => Ipv4Addr::new(10, 250, 9, 9).into(),
            Family::V6 => Ipv6Addr::new(0xfd00, 0x250, 9, 0, 0, 0, 0, 9).into(),
        }
    }

    /// The gateway addresses of the model.
    fn gateways(self) -> [IpAddr; 2] {
        match self {
            Family::V4 => [GW.into(), GW2.into()],
            Family::V6 => [GW6.into(), GW6_2.into()],
        }
    }
}

/// The MAC of the neighbour entry the fixture gives `ip`.
fn mac(ip: IpAddr) -> [u8; 6] {
    match ip {
        IpAddr::V4(a) => mac_of(a),
        IpAddr::V6(a) => mac_of6(a),
    }
}

/// The services of the run: two states that take turns.
struct Model {
    states: [DesiredState; 2],
    backends: BTreeSet<IpAddr>,
    /// An address that is no gateway address but shares GW6's address-filter slot: its
    /// packets are walked to their transport header and looked up.
    not_gw6: Ipv6Addr,
}

/// Services as (gateway address, protocol, port, backends as (address, port, weight)).
type Table<'a> = &'a [(Ipv4Addr, Protocol, u16, &'a [(Ipv4Addr, u16, u16)])];

/// The IPv6 twin of each IPv4 address of the model: the IPv6 services are the IPv4
/// ones on the twins (so every port is dual-stack).
const TWINS: [(Ipv4Addr, Ipv6Addr); 8] = [
    (GW, GW6),
    (GW2, GW6_2),
    (B1, B1_6),
    (B2, B2_6),
    (B3, B3_6),
    (B_NO_NEIGH, B_NO_NEIGH6),
    (B_SAME_SIDE, B_SAME_SIDE6),
    (B_UNROUTED, B_UNROUTED6),
];

fn twin(a: Ipv4Addr) -> IpAddr {
    let (_, twin) = TWINS.iter().find(|(v4, _)| *v4 == a).expect("a twin");
    (*twin).into()
}

/// How a service translates: router mode keeps the client's address, SNAT mode gives
/// the backend the node's address toward it and a claimed port.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Router,
    Snat,
}

/// `state` with the services of `table` in `mode`, their addresses mapped by `family`.
fn with(
    mut state: DesiredState,
    (table, mode): (Table, Mode),
    family: fn(Ipv4Addr) -> IpAddr,
) -> DesiredState {
    for &(addr, protocol, port, backends) in table {
        let backends = backends
            .iter()
            .map(|&(ip, port, weight)| WeightedBackend {
                endpoint: SocketAddr::new(family(ip), port),
                weight,
            })
            .collect();
        let service = svc(family(addr), protocol, port);
        state = match mode {
            Mode::Router => state.with_service(service, backends),
            Mode::Snat => state.with_snat_service(service, backends),
        };
    }
    state
}

/// The node's address toward `backend`: the fixture network's address on the subnet
/// the backend is on (fx0's or fx1's, what the kernel's source address selection
/// picks there); none for a backend the namespace has no route to.
fn node_toward(backend: IpAddr) -> Option<IpAddr> {
    let nodes: [IpAddr; 4] = [FX0_4.into(), FX1_4.into(), FX0_6.into(), FX1_6.into()];
    nodes.into_iter().find(|node| match (node, backend) {
        (IpAddr::V4(n), IpAddr::V4(b)) => n.octets()[..3] == b.octets()[..3],
        (IpAddr::V6(n), IpAddr::V6(b)) => n.segments()[..4] == b.segments()[..4],
        _ => false,
    })
}

/// A service's address and port.
fn service_addr(s: &ServiceAddr) -> SocketAddr {
    SocketAddr::new(s.addr, s.port)
}

fn svc(addr: IpAddr, protocol: Protocol, port: u16) -> ServiceAddr {
    ServiceAddr {
        addr,
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
            (GW, Udp, 53, &[(B2, 5353, 1), (B3, 5353, 1)]),
            (GW, Udp, 56, &[(B_NO_NEIGH, 53, 1)]),
            (GW, Udp, 55, &[(B1, 55, 1)]),
        ];
        // GW:80 switches from router to SNAT mode (and back).
        let second_snat: Table = &[(GW, Tcp, 80, &[(B1, 8080, 1), (B3, 8080, 3)])];
        // SNAT services: backend endpoints shared with router services (B1:8080,
        // B2:5353), a backend on the client side (another node address), one the node
        // has no route to, and one with no neighbour entry.
        let snat: Table = &[
            (GW, Tcp, 90, &[(B1, 8080, 1), (B2, 8080, 1)]),
            (GW2, Udp, 91, &[(B2, 5353, 1), (B_SAME_SIDE, 53, 1)]),
            (GW, Udp, 92, &[(B_UNROUTED, 53, 1)]),
            (GW2, Tcp, 93, &[(B_NO_NEIGH, 80, 1), (B3, 80, 1)]),
        ];
        // Both families: the same services on GW, GW2 and on their IPv6 twins.
        let state = |tables: &[(Table, Mode)]| {
            let v4 = tables
                .iter()
                .fold(DesiredState::default(), |s, &t| with(s, t, IpAddr::V4));
            tables.iter().fold(v4, |s, &t| with(s, t, twin))
        };
        use Mode::*;
        // Two source port ranges; then a small pool that runs out (claims retry, and
        // new flows are dropped once every port toward a backend is held).
        let states = [
            state(&[(common, Router), (first, Router), (snat, Snat)])
                .with_snat_ports(vec![40000..=40063, 45000..=45015]),
            state(&[
                (common, Router),
                (second, Router),
                (second_snat, Snat),
                (snat, Snat),
            ])
            .with_snat_ports(vec![41000..=41005]),
        ];
        let all = || states.iter().flat_map(|s| s.services.iter());
        let backends = all()
            .flat_map(|(_, b)| b.iter().map(|b| b.endpoint.ip()))
            .collect();
        let not_gw6 = sharing_slot(Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 0), GW6.into());
        Model {
            backends,
            states,
            not_gw6,
        }
    }

    /// Backends of the service at (`addr`, `proto`, `port`) in state `state`.
    fn backends_of(
        &self,
        state: usize,
        addr: IpAddr,
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

    fn is_gateway(&self, state: usize, addr: IpAddr) -> bool {
        self.states[state].services.keys().any(|s| s.addr == addr)
    }

    fn is_gateway_in_any_state(&self, addr: IpAddr) -> bool {
        (0..self.states.len()).any(|state| self.is_gateway(state, addr))
    }

    /// Whether the service at (`addr`, `proto`, `port`) is in SNAT mode in `state`.
    fn is_snat(&self, state: usize, addr: IpAddr, proto: u8, port: u16) -> bool {
        self.states[state]
            .source_nat
            .iter()
            .any(|s| s.addr == addr && s.protocol.number() == proto && s.port == port)
    }
}

/// A flow the generator saw translated: replies and ICMP errors can be made for it.
#[derive(Clone, Copy)]
struct Seen {
    client: SocketAddr,
    service: SocketAddr,
    backend: SocketAddr,
    /// A SNAT flow's node address and port, once seen (what the backend sees as the
    /// client, and replies to).
    node: Option<SocketAddr>,
    udp: bool,
}

impl Seen {
    /// The address and port the backend sends the flow's replies to.
    fn reply_to(&self) -> SocketAddr {
        self.node.unwrap_or(self.client)
    }
}

/// A packet of either family being built (`Packet`, `Packet6`).
#[derive(Clone)]
enum Pkt {
    V4(Packet),
    V6(Packet6),
}

/// `$body` on the packet of either family bound to `$p`, wrapped again.
macro_rules! each {
    ($pkt:expr, $p:ident => $body:expr) => {
        match $pkt {
            Pkt::V4($p) => Pkt::V4($body),
            Pkt::V6($p) => Pkt::V6($body),
        }
    };
}

impl Pkt {
    /// A TCP segment or UDP datagram from `src` to `dst` (one family).
    fn new(src: SocketAddr, dst: SocketAddr, udp: bool) -> Pkt {
        match (src, dst) {
            (SocketAddr::V4(s), SocketAddr::V4(d)) if udp => Pkt::V4(Packet::udp(s, d)),
            (SocketAddr::V4(s), SocketAddr::V4(d)) => Pkt::V4(Packet::tcp(s, d)),
            (SocketAddr::V6(s), SocketAddr::V6(d)) if udp => Pkt::V6(Packet6::udp(s, d)),
            (SocketAddr::V6(s), SocketAddr::V6(d)) => Pkt::V6(Packet6::tcp(s, d)),
            _ => panic!("{src} and {dst} are of two families"),
        }
    }

    /// An ICMP (ICMPv6) message quoting `body`.
    fn icmp(src: IpAddr, dst: IpAddr, kind: u8, code: u8, rest: u32, body: &[u8]) -> Pkt {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                Pkt::V4(Packet::icmp_error(s, d, kind, code, rest, body))
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => Pkt::V6(Packet6::icmp(s, d, kind, code, rest, body)),
            _ => panic!("{src} and {dst} are of two families"),
        }
    }

    fn macs(self, src: [u8; 6], dst: [u8; 6]) -> Pkt {
        each!(self, p => p.macs(src, dst))
    }

    fn flags(self, flags: u8) -> Pkt {
        each!(self, p => p.flags(flags))
    }

    fn payload(self, payload: &[u8]) -> Pkt {
        each!(self, p => p.payload(payload))
    }

    fn no_udp_checksum(self) -> Pkt {
        each!(self, p => p.no_udp_checksum())
    }

    /// The same packet with another TTL or hop limit.
    fn hops(self, hops: u8) -> Pkt {
        match self {
            Pkt::V4(p) => Pkt::V4(p.ttl(hops)),
            Pkt::V6(p) => Pkt::V6(p.hop_limit(hops)),
        }
    }

    fn frame(&self) -> Vec<u8> {
        match self {
            Pkt::V4(p) => p.frame(),
            Pkt::V6(p) => p.frame(),
        }
    }

    /// What an error quotes: IPv4 the header and 8 bytes (`whole`: all of it, as
    /// routers may), IPv6 all of it.
    fn quote(&self, whole: bool) -> Vec<u8> {
        match self {
            Pkt::V4(p) if whole => p.ip_bytes(),
            Pkt::V4(p) => p.quote(),
            Pkt::V6(p) => p.quote(),
        }
    }

    /// The length of the transport header.
    fn l4_header_len(&self) -> usize {
        match self {
            Pkt::V4(p) => p.l4_bytes().len() - p.payload.len(),
            Pkt::V6(p) => p.l4_bytes().len() - p.payload.len(),
        }
    }

    /// The frame cut in two fragments, the first carrying `first_len` bytes (a
    /// multiple of 8) of the transport part (IPv6: datagram `id`, `options` after the
    /// fragment header).
    fn fragments(
        &self,
        first_len: usize,
        id: u32,
        options: Option<(u8, &[u8])>,
    ) -> (Vec<u8>, Vec<u8>) {
        match self {
            Pkt::V4(p) => p.fragments(first_len),
            Pkt::V6(p) => fragments6(p, first_len, id, options),
        }
    }
}

/// `p` cut in two fragments as `Packet::fragments` cuts an IPv4 packet: a fragment
/// header of datagram `id` after its extension headers, then `options` (an extension
/// header of the fragmentable part, which only the first fragment carries), the first
/// fragment carrying them and at least `first_len` bytes of the transport part.
fn fragments6(
    p: &Packet6,
    first_len: usize,
    id: u32,
    options: Option<(u8, &[u8])>,
) -> (Vec<u8>, Vec<u8>) {
    let mut header = vec![0; 4];
    header.extend(id.to_be_bytes());
    let mut p = p.clone().ext_raw(FRAGMENT, &header);
    let mut after = 0;
    if let Some((kind, h)) = options {
        p = p.ext_raw(kind, h);
        after = h.len();
    }
    let whole = p.frame();
    // Where the fragmentable part starts, and where the first fragment's part ends.
    let data = whole.len() - p.l4_bytes().len() - after;
    let cut = data + (after + first_len).next_multiple_of(8);
    let fragment = |word: usize, part: Range<usize>| {
        let mut f = whole[..data].to_vec();
        f[data - 6..data - 4].copy_from_slice(&(word as u16).to_be_bytes());
        f.extend(&whole[part]);
        let len = (f.len() - IP - 40) as u16;
        f[IP + 4..IP + 6].copy_from_slice(&len.to_be_bytes());
        f
    };
    // The offset counts 8-byte units in the high 13 bits; more-fragments is bit 0.
    (
        fragment(1, data..cut),
        fragment(cut - data, cut..whole.len()),
    )
}

/// Makes packets; remembers translated flows and first fragments for later ones.
struct Generator<'m> {
    rng: Rng,
    model: &'m Model,
    /// Index of the services state in force.
    state: usize,
    /// The family of the packet being made.
    family: Family,
    /// Flows seen translated, of each family.
    seen: [Vec<Seen>; 2],
    /// Later fragments of datagrams whose first fragment was sent.
    later: Vec<(Side, Vec<u8>)>,
    /// The clients of SNAT flows seen translated.
    snat_clients: BTreeSet<IpAddr>,
}

const SEEN_MAX: usize = 512;

impl<'m> Generator<'m> {
    fn new(seed: u64, model: &'m Model) -> Self {
        Generator {
            rng: Rng::new(seed),
            model,
            state: 1,
            family: Family::V4,
            seen: [Vec::new(), Vec::new()],
            later: Vec::new(),
            snat_clients: BTreeSet::new(),
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
        self.family = if self.rng.chance(IPV6_PERCENT) {
            Family::V6
        } else {
            Family::V4
        };
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

    fn client(&mut self) -> SocketAddr {
        // Mostly the client with a neighbour entry.
        let n = match self.rng.below(10) {
            0..=6 => 0,
            7 | 8 => 1 + self.rng.below(3) as u8,
            _ => 4,
        };
        SocketAddr::new(self.family.client(n), 40000 + self.rng.below(64) as u16)
    }

    /// A service of the family and state in force (now and then of the other state).
    fn service(&mut self) -> (ServiceAddr, Vec<WeightedBackend>) {
        let state = if self.rng.chance(10) {
            1 - self.state
        } else {
            self.state
        };
        let family = self.family;
        let services = || {
            self.model.states[state]
                .services
                .iter()
                .filter(move |(s, _)| Family::of(s.addr) == family)
        };
        let (s, b) = services()
            .nth(self.rng.below(services().count()))
            .expect("services");
        (*s, b.to_vec())
    }

    /// A backend of a service of the family.
    fn backend(&mut self) -> (SocketAddr, bool) {
        let (s, b) = self.service();
        (
            b[self.rng.below(b.len())].endpoint,
            s.protocol == Protocol::Udp,
        )
    }

    fn l4(&mut self, src: SocketAddr, dst: SocketAddr, udp: bool) -> Pkt {
        let mut p = Pkt::new(src, dst, udp);
        if udp && self.rng.chance(10) {
            p = p.no_udp_checksum();
        } else if !udp {
            // Now and then flags no TCP sends (none, SYN+FIN): dropped if they would
            // open a flow (`drop_tcp_flags`).
            p = p.flags(self.rng.pick(&[
                SYN,
                ACK | PSH,
                ACK,
                0x01 | ACK,
                0x04,
                SYN,
                0,
                SYN | 0x01,
            ]));
        }
        let len = match self.rng.below(20) {
            0 => 1400 + self.rng.below(200),
            1..=5 => 0,
            _ => self.rng.below(64),
        };
        p = p.payload(&self.rng.bytes(len));
        if self.rng.chance(5) {
            p = p.hops(self.rng.pick(&[0, 1, 2]));
        }
        match p {
            Pkt::V4(mut p) => {
                p.id = self.rng.next_u64() as u16;
                if self.rng.chance(8) {
                    let words = 1 + self.rng.below(10);
                    let mut options = vec![1u8; words * 4];
                    options[words * 4 - 1] = 0;
                    p = p.options(&options);
                }
                Pkt::V4(p)
            }
            Pkt::V6(p) => Pkt::V6(self.extension_headers(p)),
        }
    }

    /// Mostly none, else a chain of extension headers of random kinds, order and
    /// lengths (up to nine: longer than the program walks).
    fn extension_headers(&mut self, mut p: Packet6) -> Packet6 {
        let n = match self.rng.below(20) {
            0..=11 => 0,
            12..=16 => 1 + self.rng.below(2),
            17 | 18 => 3 + self.rng.below(4),
            _ => 7 + self.rng.below(3),
        };
        for _ in 0..n {
            let kind = self
                .rng
                .pick(&[HOP_BY_HOP, ROUTING, DEST_OPTS, AUTH, FRAGMENT]);
            let header = match kind {
                // An atomic fragment (offset 0, no more fragments).
                FRAGMENT => [&[0u8, 0, 0, 0][..], &self.rng.bytes(4)].concat(),
                // 4-byte units after the first 8.
                AUTH => {
                    let len = 1 + self.rng.below(5);
                    let mut h = self.rng.bytes((len + 2) * 4);
                    h[1] = len as u8;
                    h
                }
                _ => {
                    let len = self.rng.below(4);
                    let size = (len + 1) * 8;
                    // One PadN option filling it (routing: type 0, no segments left).
                    let mut h = vec![0; size];
                    h[1] = len as u8;
                    if kind != ROUTING {
                        h[2] = 1;
                        h[3] = (size - 4) as u8;
                    }
                    h
                }
            };
            p = p.ext_raw(kind, &header);
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
            Some(f) if self.rng.chance(85) => (f.backend, f.reply_to(), f.udp),
            _ => {
                let (b, udp) = self.backend();
                (b, self.client(), udp)
            }
        };
        self.l4(backend, client, udp)
            .macs(mac(backend.ip()), FX1_MAC)
            .frame()
    }

    fn seen_flow(&mut self) -> Option<Seen> {
        let seen = &self.seen[self.family as usize];
        (!seen.is_empty()).then(|| seen[self.rng.below(seen.len())])
    }

    /// An ICMP error type, code and the rest of its header: mostly errors the program
    /// translates (IPv4: destination unreachable, fragmentation needed among them, time
    /// exceeded, parameter problem; IPv6: destination unreachable, packet too big, time
    /// exceeded, parameter problem), some messages it does not.
    fn icmp_kind(&mut self) -> (u8, u8, u32) {
        match (self.family, self.rng.below(10)) {
            (Family::V4, 0..=3) => (3, 4, 1280),
            (Family::V4, 4 | 5) => (3, 3, 0),
            (Family::V4, 6) => (3, 1, 0),
            (Family::V4, 7 | 8) => (11, 0, 0),
            (Family::V4, _) => match self.rng.pick(&[0, 5, 8, 12]) {
                12 => (12, 0, (self.rng.below(60) as u32) << 24),
                kind => (kind, 0, 0),
            },
            (Family::V6, 0..=2) => (2, 0, 1280),
            (Family::V6, 3..=5) => (1, self.rng.below(5) as u8, 0),
            (Family::V6, 6 | 7) => (3, self.rng.below(2) as u8, 0),
            (Family::V6, 8) => (4, self.rng.below(3) as u8, self.rng.below(60) as u32),
            (Family::V6, _) => (self.rng.pick(&[0, 127, 128, 129, 255]), 0, 0),
        }
    }

    /// An ICMP error: from the backend side quoting a forwarded packet, from the client
    /// side quoting a reply, or quoting a flow of no service.
    fn icmp_error(&mut self) -> (Side, Vec<u8>) {
        let (kind, code, rest) = self.icmp_kind();
        let flow = self.seen_flow();
        let (side, src, dst, quoted) = match (self.rng.below(3), flow) {
            (0, Some(f)) => {
                let from = self
                    .rng
                    .pick(&[f.backend.ip(), self.family.router(Side::Backend)]);
                // As the backend got it: from the node address in SNAT mode.
                let sent = self.l4(f.reply_to(), f.backend, f.udp).hops(63);
                (Side::Backend, from, f.reply_to().ip(), sent)
            }
            (1, Some(f)) => {
                let from = self
                    .rng
                    .pick(&[f.client.ip(), self.family.router(Side::Client)]);
                let sent = self.l4(f.service, f.client, f.udp).hops(63);
                (Side::Client, from, f.service.ip(), sent)
            }
            _ => {
                let a = self.client();
                let b = SocketAddr::new(self.family.elsewhere(), 80);
                let udp = self.rng.chance(50);
                let side = self.rng.pick(&[Side::Client, Side::Backend]);
                let to = self.rng.pick(&[a.ip(), self.family.gateways()[0]]);
                let from = self.family.router(Side::Client);
                (side, from, to, self.l4(b, a, udp))
            }
        };
        // Routers may quote more than 8 bytes of an IPv4 packet (RFC 1812). An error
        // about an IPv6 fragment quotes it with its fragment header: a first fragment's
        // ports follow that header, a later fragment has none.
        let mut quote = match quoted {
            Pkt::V6(_) if self.rng.chance(20) => {
                let (first, later) = quoted.fragments(8, self.rng.next_u64() as u32, None);
                let fragment = if self.rng.chance(60) { first } else { later };
                fragment[IP..].to_vec()
            }
            _ => quoted.quote(self.rng.chance(20)),
        };
        if self.rng.chance(10) {
            quote.truncate(self.rng.below(quote.len()));
        }
        let mac = if side == Side::Client {
            (CLIENT_MAC, FX0_MAC)
        } else {
            (mac(src), FX1_MAC)
        };
        let frame = Pkt::icmp(src, dst, kind, code, rest, &quote)
            .macs(mac.0, mac.1)
            .frame();
        (side, frame)
    }

    /// Now and then the ICMP error the gateway's kernel sends about a TCP/UDP packet
    /// XDP translated and handed to it (time exceeded; fragmentation needed or packet
    /// too big), from its address toward the packet's source, quoting the packet as it
    /// got it: what only the TC program sees, on egress.
    fn kernel_error(&mut self, passed: &[u8]) -> Option<Vec<u8>> {
        if !self.rng.chance(25) {
            return None;
        }
        let ip = Ip::parse(passed)
            .filter(|ip| matches!(ip.proto, proto::TCP | proto::UDP) && !ip.fragment)?;
        let from = node_toward(ip.src)?;
        let (kind, code, rest) = match (ip.v6, self.rng.chance(50)) {
            (false, true) => (11, 0, 0),
            (false, false) => (3, 4, 1280),
            (true, true) => (3, 0, 0),
            (true, false) => (2, 0, 1280),
        };
        // IPv4 quotes the header and 8 bytes, IPv6 as much as fits in 1280 bytes.
        let end = if ip.v6 {
            ip.end.min(IP + 1232)
        } else {
            (ip.l4 + 8).min(ip.end)
        };
        let error = Pkt::icmp(from, ip.src, kind, code, rest, &passed[IP..end]);
        Some(error.macs(FX0_MAC, CLIENT_MAC).frame())
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
                self.l4(f.backend, f.reply_to(), f.udp)
                    .macs(mac(f.backend.ip()), FX1_MAC),
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
        let first_len = (p.l4_header_len() + 8 * self.rng.below(4)).next_multiple_of(8);
        // Now and then destination options or AH in the fragmentable part.
        let options: Option<(u8, &[u8])> = match self.rng.below(8) {
            0 => Some((DEST_OPTS, &[0, 0, 1, 4, 0, 0, 0, 0])),
            1 => Some((AUTH, &[0, 2, 0, 0, 1, 2, 3, 4, 0, 0, 0, 1, 9, 9, 9, 9])),
            _ => None,
        };
        let (first, later) = p.fragments(first_len, self.rng.next_u64() as u32, options);
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
    /// address, ARP (IPv6: neighbour discovery and echo), a service packet behind a
    /// VLAN tag, a backend's packet of no flow.
    fn not_ours(&mut self) -> Vec<u8> {
        let client = self.client();
        let udp = self.rng.chance(50);
        let [gw, gw2] = self.family.gateways();
        let to = |ip, port| SocketAddr::new(ip, port);
        match self.rng.below(9) {
            0 => {
                let elsewhere = match self.family {
                    Family::V6 if self.rng.chance(50) => self.model.not_gw6.into(),
                    f => f.elsewhere(),
                };
                self.l4(client, to(elsewhere, 80), udp).frame()
            }
            1 => {
                let gw = self.rng.pick(&[gw, gw2]);
                let port = 9000 + self.rng.below(100) as u16;
                self.l4(client, to(gw, port), udp).frame()
            }
            2 => {
                // Another protocol to a gateway address: IPv4 GRE, SCTP, ICMP echo;
                // IPv6 (after any extension headers) ESP, no next header, unknown.
                let dst = self.rng.pick(&[gw, gw2]);
                let mut f = self.l4(client, to(dst, 80), false).frame();
                match self.family {
                    Family::V4 => {
                        f[23] = self.rng.pick(&[47, 132, 1]);
                        fix_ip_checksum(&mut f[14..]);
                    }
                    Family::V6 => {
                        let at = chain6(&f, f.len()).next_at;
                        f[at] = self.rng.pick(&[ESP, NO_NEXT, 47, 132, 253]);
                    }
                }
                f
            }
            3 if self.family == Family::V4 => {
                let mut arp = vec![0xff; 6];
                arp.extend(CLIENT_MAC);
                arp.extend([0x08, 0x06]);
                arp.extend(self.rng.bytes(28));
                arp
            }
            3 | 4 if self.family == Family::V6 => self.neighbour_or_echo(),
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
            6 => {
                // From a backend address to a client, of no flow.
                let (b, udp) = self.backend();
                let to_client = to(client.ip(), 20000 + self.rng.below(1000) as u16);
                self.l4(b, to_client, udp).frame()
            }
            7 => {
                // From a backend to the node's address toward it, mostly to a port of
                // the SNAT pools that may be no flow's (or of another protocol).
                let (b, udp) = self.backend();
                let udp = udp != self.rng.chance(20);
                let node = node_toward(b.ip()).unwrap_or(self.family.router(Side::Backend));
                let port = match self.rng.below(4) {
                    0 => self.rng.next_u64() as u16,
                    1 => 45000 + self.rng.below(16) as u16,
                    _ => 40000 + self.rng.below(64) as u16,
                };
                self.l4(b, to(node, port), udp)
                    .macs(mac(b.ip()), FX1_MAC)
                    .frame()
            }
            _ => {
                // A client's packet to a backend directly.
                let (b, udp) = self.backend();
                self.l4(client, b, udp).frame()
            }
        }
    }

    /// Neighbour discovery (router and neighbour solicitation and advertisement,
    /// redirect) and echo, to and from gateway addresses and others, sometimes after
    /// a hop-by-hop header.
    fn neighbour_or_echo(&mut self) -> Vec<u8> {
        let kind = self.rng.pick(&[128, 129, 133, 134, 135, 136, 137]);
        let client = self.client().ip();
        let [gw, _] = self.family.gateways();
        let solicited: IpAddr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 0x64).into();
        let (src, dst) = match self.rng.below(3) {
            0 => (client, self.rng.pick(&[gw, solicited])),
            1 => (gw, client),
            _ => (self.family.router(Side::Client), client),
        };
        let len = 8 * self.rng.below(4);
        let Pkt::V6(mut p) = Pkt::icmp(src, dst, kind, 0, 0, &self.rng.bytes(len)) else {
            unreachable!("IPv6 addresses make an IPv6 packet")
        };
        p = p.hop_limit(255).macs(CLIENT_MAC, FX0_MAC);
        if self.rng.chance(20) {
            p = p.ext(HOP_BY_HOP);
        }
        p.frame()
    }

    /// Random bytes, mostly with the family's EtherType and version.
    fn noise(&mut self) -> Vec<u8> {
        let len = 14 + self.rng.below(100);
        let mut f = self.rng.bytes(len);
        if self.rng.chance(70) {
            let (ether_type, version, dst) = match self.family {
                Family::V4 => ([0x08, 0x00], 0x40, 30..34),
                Family::V6 => ([0x86, 0xdd], 0x60, 38..54),
            };
            f[12..14].copy_from_slice(&ether_type);
            if len > 14 {
                f[14] = version | (f[14] & 0x0f);
            }
            if len >= dst.end && self.rng.chance(50) {
                let gw = self.rng.pick(&self.family.gateways());
                f[dst].copy_from_slice(&ip_octets(gw));
            }
        }
        f
    }

    /// One mutation of a frame (of either family; harmless to others).
    fn mutate(&mut self, f: &mut Vec<u8>) {
        let ip = IP;
        let v6 = f.len() >= IP && f[12..14] == [0x86, 0xdd];
        if f.len() < ip + if v6 { 40 } else { 20 } {
            return;
        }
        // Where the transport header is (as far as the headers say), and its protocol.
        let chain = v6.then(|| chain6(f, f.len()));
        let (l4, proto) = match &chain {
            Some(c) => (c.l4.min(f.len()), c.proto),
            None => (ip + (usize::from(f[ip] & 0x0f) * 4).max(20), f[ip + 9]),
        };
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
            // Bytes past the IP packet's end (Ethernet padding).
            1 => {
                let n = 1 + self.rng.below(32);
                f.extend(self.rng.bytes(n));
            }
            // IPv4 total length, IPv6 payload length too big, too small, 0 or anything.
            2 => {
                let at = if v6 { ip + 4 } else { ip + 2 };
                let len = u16::from_be_bytes([f[at], f[at + 1]]) as usize;
                let new = match self.rng.below(4) {
                    0 => len + 1 + self.rng.below(64),
                    1 => len.saturating_sub(1 + self.rng.below(len.max(1))),
                    2 => 0,
                    _ => self.rng.below(65536),
                };
                f[at..at + 2].copy_from_slice(&(new as u16).to_be_bytes());
            }
            // IHL anything; an IPv6 extension header's length anything.
            3 => match &chain {
                None => f[ip] = 0x40 | self.rng.below(16) as u8,
                Some(c) if !c.headers.is_empty() => {
                    let at = self.rng.pick(&c.headers);
                    f[at + 1] = self.rng.next_u64() as u8;
                }
                Some(_) => {}
            },
            // The version.
            4 => f[ip] = (self.rng.below(16) as u8) << 4 | (f[ip] & 0x0f),
            // Fragment bits: more fragments, an offset, or both.
            5 => {
                let offset = 1 + self.rng.below(0x1fff) as u16;
                let (more, at) = match &chain {
                    None => (0x2000, ip + 6),
                    Some(c) => match c.fragment {
                        Some(at) => (1, at + 2),
                        None => return,
                    },
                };
                let offset = if v6 { offset << 3 } else { offset };
                let word = match self.rng.below(3) {
                    0 => more,
                    1 => offset,
                    _ => more | offset,
                };
                f[at..at + 2].copy_from_slice(&word.to_be_bytes());
            }
            // Transport lengths: UDP length, TCP data offset.
            6 if f.len() >= l4 + 14 => {
                let v = self.rng.next_u64() as u16;
                if proto == proto::UDP {
                    f[l4 + 4..l4 + 6].copy_from_slice(&v.to_be_bytes());
                } else {
                    f[l4 + 12] = (v as u8) & 0xf0;
                }
            }
            // A corrupted transport checksum; an IPv6 UDP checksum 0 (invalid).
            7 if f.len() >= l4 + 18 => {
                let at = if proto == proto::UDP { 6 } else { 16 };
                if v6 && proto == proto::UDP && self.rng.chance(50) {
                    f[l4 + at..l4 + at + 2].fill(0);
                } else {
                    f[l4 + at] ^= 1 + self.rng.below(255) as u8;
                }
                return;
            }
            // A corrupted IPv4 header checksum.
            8 if !v6 => {
                f[ip + 10] ^= 1 + self.rng.below(255) as u8;
                return;
            }
            // Another protocol; another next header anywhere in the chain.
            8 | 9 => {
                let at = match &chain {
                    None => ip + 9,
                    Some(c) => {
                        let mut at = c.headers.clone();
                        at.push(ip + 6);
                        self.rng.pick(&at)
                    }
                };
                f[at] = self
                    .rng
                    .pick(&[0, 1, 6, 17, 43, 44, 47, 50, 51, 58, 59, 60, 255]);
            }
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
        if fix && !v6 && f.len() >= ip + 20 && f[12..14] == [0x08, 0x00] {
            fix_ip_checksum(&mut f[ip..]);
        }
    }

    /// Remembers a flow that the program translated forward, and the node address and
    /// port of a SNAT flow once a translation shows them: XDP's (both addresses) when it
    /// sends the packet itself, TC's (the source, `NAT_MASQ`) after the kernel forwarded
    /// it with its destination translated.
    fn learn(&mut self, input: &[u8], output: &[u8]) {
        let (Some(i), Some(o)) = (Ip::parse(input), Ip::parse(output)) else {
            return;
        };
        if i.fragment || !matches!(i.proto, proto::TCP | proto::UDP) {
            return;
        }
        let (Some(ip_ports), Some(op)) = (i.ports(input), o.ports(output)) else {
            return;
        };
        let (from, to) = (
            SocketAddr::new(i.src, ip_ports.0),
            SocketAddr::new(i.dst, ip_ports.1),
        );
        let out_from = SocketAddr::new(o.src, op.0);
        let seen_list = &mut self.seen[Family::of(i.src) as usize];
        if i.dst == o.dst {
            // TC: a SNAT forward packet (client → backend) gets its node source.
            if out_from != from && self.model.backends.contains(&i.dst) {
                self.snat_clients.insert(from.ip());
                for s in seen_list
                    .iter_mut()
                    .filter(|s| s.client == from && s.backend == to)
                {
                    s.node = Some(out_from);
                }
            }
            return;
        }
        // (A SNAT reply to the node address changes its destination too.)
        if !self.model.is_gateway_in_any_state(i.dst) {
            return;
        }
        if out_from != from {
            self.snat_clients.insert(from.ip());
        }
        let seen = Seen {
            client: from,
            service: to,
            backend: SocketAddr::new(o.dst, op.1),
            node: (out_from != from).then_some(out_from),
            udp: i.proto == proto::UDP,
        };
        if seen_list.len() >= SEEN_MAX {
            let at = self.rng.below(SEEN_MAX);
            seen_list[at] = seen;
        } else {
            seen_list.push(seen);
        }
    }
}

fn ip_octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}
/// An IP header as the program accepts it, of either family: IPv4 version 4, IHL at
/// least 20, total length at least the header and within the frame; IPv6 version 6, a
/// payload length not 0 (a jumbogram) and within the frame. The transport header is
/// found by walking IPv6's extension headers (`chain6`).
#[derive(Clone, Copy)]
struct Ip {
    v6: bool,
    /// Where the transport header starts in the frame.
    l4: usize,
    /// Where the IP packet ends in the frame.
    end: usize,
    /// The transport protocol (`NO_NEXT` when an IPv6 chain hides it).
    proto: u8,
    /// A fragment: more fragments follow, or an offset.
    fragment: bool,
    /// A fragment with an offset: no transport header.
    later: bool,
    src: IpAddr,
    dst: IpAddr,
}

const IP: usize = 14;

impl Ip {
    fn parse(f: &[u8]) -> Option<Ip> {
        if f.len() < IP + 20 {
            return None;
        }
        match (f[12..14] == [0x08, 0x00], f[12..14] == [0x86, 0xdd]) {
            (true, _) => Ip::parse4(f),
            (_, true) => Ip::parse6(f),
            _ => None,
        }
    }

    fn parse4(f: &[u8]) -> Option<Ip> {
        let ihl = usize::from(f[IP] & 0x0f) * 4;
        let tot_len = usize::from(u16::from_be_bytes([f[IP + 2], f[IP + 3]]));
        if f[IP] >> 4 != 4 || ihl < 20 || tot_len < ihl || IP + tot_len > f.len() {
            return None;
        }
        let frag = u16::from_be_bytes([f[IP + 6], f[IP + 7]]) & 0x3fff;
        Some(Ip {
            v6: false,
            l4: IP + ihl,
            end: IP + tot_len,
            proto: f[IP + 9],
            fragment: frag != 0,
            later: frag & 0x1fff != 0,
            src: addr_at(f, IP + 12, false),
            dst: addr_at(f, IP + 16, false),
        })
    }

    fn parse6(f: &[u8]) -> Option<Ip> {
        if f.len() < IP + 40 || f[IP] >> 4 != 6 {
            return None;
        }
        let end = IP + 40 + usize::from(u16::from_be_bytes([f[IP + 4], f[IP + 5]]));
        if end == IP + 40 || end > f.len() {
            return None;
        }
        let chain = chain6(f, end);
        // With several fragment headers (RFC 8200 allows one), the last one describes
        // the transport header after it.
        let frag = chain
            .fragment
            .map_or(0, |at| u16::from_be_bytes([f[at + 2], f[at + 3]]));
        Some(Ip {
            v6: true,
            l4: chain.l4,
            end,
            proto: chain.proto,
            fragment: frag & 0xfff9 != 0,
            later: frag & 0xfff8 != 0,
            src: addr_at(f, IP + 8, true),
            dst: addr_at(f, IP + 24, true),
        })
    }

    /// Where the source and destination addresses are (one after the other).
    fn addrs(&self) -> Range<usize> {
        if self.v6 {
            IP + 8..IP + 40
        } else {
            IP + 12..IP + 20
        }
    }

    /// Where the TTL or hop limit is.
    fn hops_at(&self) -> usize {
        if self.v6 {
            IP + 7
        } else {
            IP + 8
        }
    }

    fn icmp_proto(&self) -> u8 {
        if self.v6 {
            proto::ICMPV6
        } else {
            proto::ICMP
        }
    }

    /// Whether ICMP type `kind` is an error quoting the packet it is about.
    fn icmp_error(&self, kind: u8) -> bool {
        if self.v6 {
            (1..=4).contains(&kind)
        } else {
            matches!(kind, 3 | 11 | 12)
        }
    }

    /// The quoted packet's layout, if this is an ICMP message.
    fn quote(&self, f: &[u8]) -> Option<Quoted> {
        if self.proto != self.icmp_proto() || self.fragment {
            return None;
        }
        let at = self.l4 + 8;
        Some(if self.v6 {
            // The quote of a first fragment: its transport header follows the fragment
            // header (RFC 8200 4.5), as a router's packet too big about it quotes it.
            let first_fragment = f.get(at + 6) == Some(&FRAGMENT)
                && f.len() >= at + 48
                && u16::from_be_bytes([f[at + 42], f[at + 43]]) & 0xfff8 == 0
                && matches!(f[at + 40], proto::TCP | proto::UDP);
            let (proto_at, ports) = if first_fragment {
                (at + 40, at + 48)
            } else {
                (at + 6, at + 40)
            };
            Quoted {
                at,
                addrs: at + 8..at + 40,
                proto_at,
                ports,
            }
        } else {
            Quoted {
                at,
                addrs: at + 12..at + 20,
                proto_at: at + 9,
                ports: at + 20,
            }
        })
    }

    /// Source and destination ports, if the transport header starts in this packet.
    fn ports(&self, f: &[u8]) -> Option<(u16, u16)> {
        let l4 = self.l4;
        (!self.later && f.len() >= l4 + 4).then(|| (port_at(f, l4), port_at(f, l4 + 2)))
    }
}

/// Where an ICMP error's quoted packet has what a translation rewrites (offsets in
/// the frame; the quoted IPv4 header has no options).
struct Quoted {
    /// The quoted network header.
    at: usize,
    /// Its addresses.
    addrs: Range<usize>,
    /// Its protocol (IPv6: next header).
    proto_at: usize,
    /// The quoted transport header's ports.
    ports: usize,
}

impl Quoted {
    /// Where the quoted TCP/UDP checksum is, if its header is TCP or UDP and the
    /// checksum within `end`.
    fn check_at(&self, f: &[u8], end: usize) -> Option<usize> {
        let at = self.ports
            + match f.get(self.proto_at) {
                Some(&proto::UDP) => 6,
                Some(&proto::TCP) => 16,
                _ => return None,
            };
        (at + 2 <= end.min(f.len())).then_some(at)
    }
}

/// An IPv6 packet's extension headers, walked to the transport header.
struct Chain {
    /// Where the transport header starts.
    l4: usize,
    /// Its protocol, `NO_NEXT` if the chain is cut (by `end`) before it.
    proto: u8,
    /// The byte that names it (the last next-header field).
    next_at: usize,
    /// Where each extension header starts.
    headers: Vec<usize>,
    /// Where the last fragment header starts.
    fragment: Option<usize>,
}

/// Walks the extension headers of the IPv6 packet in `f` that ends at `end`.
fn chain6(f: &[u8], end: usize) -> Chain {
    let mut c = Chain {
        l4: IP + 40,
        proto: f[IP + 6],
        next_at: IP + 6,
        headers: Vec::new(),
        fragment: None,
    };
    while matches!(c.proto, HOP_BY_HOP | ROUTING | DEST_OPTS | AUTH | FRAGMENT) {
        let (at, kind) = (c.l4, c.proto);
        if at + 8 > end {
            c.proto = NO_NEXT;
            return c;
        }
        let size = match kind {
            FRAGMENT => 8,
            // 4-byte units after the first 8.
            AUTH => (usize::from(f[at + 1]) + 2) * 4,
            _ => (usize::from(f[at + 1]) + 1) * 8,
        };
        c.headers.push(at);
        c.next_at = at;
        c.proto = f[at];
        c.l4 = at + size;
        if kind == FRAGMENT {
            c.fragment = Some(at);
            // After a later fragment's header comes the datagram's continuation, not
            // a header: the headers of the fragmentable part are in the first fragment
            // (RFC 8200 4.5).
            if port_at(f, at + 2) & 0xfff8 != 0 {
                break;
            }
        }
    }
    if c.l4 > end {
        c.proto = NO_NEXT;
    }
    c
}

fn addr_at(f: &[u8], at: usize, v6: bool) -> IpAddr {
    if v6 {
        let o: [u8; 16] = f[at..at + 16].try_into().expect("16 bytes");
        Ipv6Addr::from(o).into()
    } else {
        Ipv4Addr::new(f[at], f[at + 1], f[at + 2], f[at + 3]).into()
    }
}

fn port_at(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

/// The conntrack maps of both families.
struct Tracker {
    v4: Conntrack,
    v6: Conntrack<[u32; 4]>,
    /// The programs have created as many entries as a map holds: the LRU may evict any
    /// entry to make room, even one a packet just recorded.
    evicting: bool,
}

/// A conntrack entry as the oracle needs it: its kind, the endpoint it writes, and a
/// SNAT flow's other end (`Flow::peer_*`: a forward entry's node address and port, a
/// reply entry's client; a `NAT_MASQ` entry's gateway address and port).
#[derive(Clone, Copy)]
struct Tracked {
    kind: u8,
    nat: SocketAddr,
    peer: Option<SocketAddr>,
}

impl Tracked {
    /// Whether the TC program applies this entry: a router reply's (source becomes the
    /// gateway) or a SNAT forward packet's the kernel forwarded (`NAT_MASQ`).
    fn on_egress(&self) -> bool {
        (self.kind == NAT_SRC && self.peer.is_none()) || self.kind == NAT_MASQ
    }

    /// A SNAT flow's reply entry (under backend → node address and port).
    fn snat_reply(&self) -> bool {
        self.kind == NAT_SRC && self.peer.is_some()
    }
}

impl Tracker {
    /// The entry of tuple (`src`, `dst`, `proto`).
    fn get(&self, src: SocketAddr, dst: SocketAddr, proto: u8) -> Option<Tracked> {
        match src {
            SocketAddr::V4(_) => entry(&self.v4, src, dst, proto),
            SocketAddr::V6(_) => entry(&self.v6, src, dst, proto),
        }
    }
}

fn entry<A: MapAddr>(
    map: &Conntrack<A>,
    src: SocketAddr,
    dst: SocketAddr,
    proto: u8,
) -> Option<Tracked> {
    let flow = conntrack_entry(map, src, dst, proto)?;
    Some(Tracked {
        kind: flow.kind,
        nat: SocketAddr::new(flow.nat_addr.ip(), u16::from_be(flow.nat_port)),
        peer: flow
            .is_snat()
            .then(|| SocketAddr::new(flow.peer_addr.ip(), u16::from_be(flow.peer_port))),
    })
}

/// What is known about an input before it runs: what may change it.
struct Facts {
    /// An IPv6 frame (by its EtherType).
    v6: bool,
    /// The IP header, if the program accepts it.
    ip: Option<Ip>,
    /// Sent to an address that has services (in the state in force).
    to_gateway: bool,
    /// An IPv6 UDP datagram (not a later fragment) with checksum 0.
    udp6_no_checksum: bool,
    /// Its tuple is tracked (its flow entry), or (a reply with none) matched by Maglev.
    tracked: Option<Tracked>,
    /// A reply whose flow has no entry: the router-mode services whose Maglev maps its
    /// tuple to the backend it came from (`maglev_replies`), one of which it is
    /// translated as, and recorded for.
    maglev: Vec<SocketAddr>,
    /// A later fragment (whose flow only the fragment map knows).
    later_fragment: bool,
    /// Sent from an address that is a backend in some state.
    from_backend: bool,
    /// Sent to an address that is a backend in some state.
    to_backend: bool,
    /// Sent to the node's own address toward some backend (SNAT replies are).
    to_node: bool,
    /// An ICMP error's quoted flow: the entries that may translate it (none: not
    /// quoting a tracked flow).
    quote_flows: Vec<Tracked>,
    /// What the generator's model says about the translation.
    model: Expect,
    /// XDP: a packet from a backend address, or an ICMP error quoting a packet to one,
    /// that did not arrive from where that backend is (its interface and neighbour
    /// MAC): it may be dropped as forged (`reply_spoofed`), also when to no gateway
    /// address. Set by `run` (`from_elsewhere`), which knows the ingress.
    from_elsewhere: bool,
}

/// Whether frame `f`, received on `side`, is a packet from a backend address (or an
/// ICMP error quoting a packet to one) that did not come from where that backend is:
/// the side its route leaves by and the MAC of its neighbour entry. (A necessary
/// condition for a `reply_spoofed` drop, not a sufficient one: where the gateway knows
/// no route or neighbour it does not check.)
fn from_elsewhere(side: Side, f: &[u8], model: &Model) -> bool {
    let Some(ip) = Ip::parse(f) else {
        return false;
    };
    let backend = match ip.quote(f) {
        Some(q) if f.len() >= q.ports + 4 && ip.icmp_error(f[ip.l4]) => {
            let half = (q.addrs.end - q.addrs.start) / 2;
            addr_at(f, q.addrs.start + half, ip.v6)
        }
        _ => ip.src,
    };
    if !model.backends.contains(&backend) {
        return false;
    }
    let same_side = [IpAddr::from(B_SAME_SIDE), IpAddr::from(B_SAME_SIDE6)].contains(&backend);
    let (home, neighbour) = if same_side {
        (Side::Client, B_SAME_SIDE_MAC)
    } else {
        (Side::Backend, mac(backend))
    };
    side != home || f.get(6..12) != Some(&neighbour[..])
}

/// Services of the state in force, and every service a backend belonged to.
struct Expect {
    /// Backends of the service the packet is addressed to (state in force).
    backends: Vec<SocketAddr>,
    /// A TCP service's backends in any state: a connection keeps a backend that left
    /// its service until it ends (issue 30).
    kept_backends: Vec<SocketAddr>,
    /// Backend addresses of any service on the packet's destination (for fragments).
    backend_addrs: BTreeSet<IpAddr>,
    /// Services (address, port) whose backend the source is, in any state.
    services_of_source: BTreeSet<SocketAddr>,
    /// The service addressed is in SNAT mode (state in force).
    snat: bool,
    /// The SNAT source ports of the state in force (a new flow's claim).
    snat_ports: Vec<RangeInclusive<u16>>,
    /// The SNAT source ports of either state (a flow keeps the port it claimed).
    any_snat_ports: Vec<RangeInclusive<u16>>,
    /// A later fragment to the node address: the clients of the SNAT flows seen (it
    /// carries no ports to tell which flow it is of).
    snat_clients: BTreeSet<IpAddr>,
}

/// The entries that may translate tuple (`src`, `dst`, `proto`), as the program finds
/// them: the tuple's own entry, then (a router reply, which has none of its own) the
/// forward entry of its flow to any service of either state, as the program finds it
/// through the reply index, seen as the reply's `NAT_SRC` translation. (Two flows may
/// claim one tuple: one client port to two services sharing a backend endpoint.)
fn flows<'a>(
    ct: &'a Tracker,
    model: &'a Model,
    src: SocketAddr,
    dst: SocketAddr,
    proto: u8,
) -> impl Iterator<Item = Tracked> + 'a {
    let replies = model
        .states
        .iter()
        .flat_map(|s| s.services.keys())
        .filter(move |svc| svc.protocol.number() == proto && svc.addr.is_ipv6() == src.is_ipv6())
        .filter_map(move |svc| {
            let service = service_addr(svc);
            let f = ct.get(dst, service, proto)?;
            // A SNAT flow's replies go to the node address instead.
            (f.kind == NAT_DST && f.nat == src && f.peer.is_none()).then_some(Tracked {
                kind: NAT_SRC,
                nat: service,
                peer: None,
            })
        });
    ct.get(src, dst, proto).into_iter().chain(replies)
}

/// A packet from `src` to `dst` whose tuple has no entry, taken for a reply as the
/// programs take it (issue 26: its flow may have begun on another gateway): the
/// router-mode services of the state in force that list `src` as a backend, whose
/// forward tuple (`dst` → service) has no entry (another backend's flow is not
/// taken over), and whose Maglev table maps that tuple to `src`.
fn maglev_replies(
    ct: &Tracker,
    model: &Model,
    state: usize,
    src: SocketAddr,
    dst: SocketAddr,
    proto: u8,
) -> Vec<SocketAddr> {
    model.states[state]
        .services
        .iter()
        .filter(|(svc, backends)| {
            svc.protocol.number() == proto
                && !model.is_snat(state, svc.addr, proto, svc.port)
                && backends.iter().any(|b| b.endpoint == src)
        })
        .map(|(svc, backends)| (service_addr(svc), backends))
        .filter(|&(service, backends)| {
            service.is_ipv6() == src.is_ipv6()
                && ct.get(dst, service, proto).is_none()
                && maglev_pick(backends, dst, service, proto) == Some(src)
        })
        .map(|(service, _)| service)
        .collect()
}

/// The destination address of a frame of either family, if its header is there.
fn destination(f: &[u8]) -> Option<IpAddr> {
    match f.get(12..14)? {
        [0x08, 0x00] if f.len() >= IP + 20 => Some(addr_at(f, IP + 16, false)),
        [0x86, 0xdd] if f.len() >= IP + 40 => Some(addr_at(f, IP + 24, true)),
        _ => None,
    }
}

impl Facts {
    fn of(f: &[u8], ct: &Tracker, gen: &Generator) -> Facts {
        let (model, state) = (gen.model, gen.state);
        let ip = Ip::parse(f);
        let lookup = |src, dst, proto| flows(ct, model, src, dst, proto).next();
        let mut facts = Facts {
            v6: f.get(12..14) == Some(&[0x86, 0xdd]),
            ip,
            to_gateway: destination(f).is_some_and(|dst| model.is_gateway(state, dst)),
            udp6_no_checksum: false,
            tracked: None,
            maglev: Vec::new(),
            later_fragment: false,
            from_backend: false,
            to_backend: false,
            to_node: false,
            quote_flows: Vec::new(),
            from_elsewhere: false,
            model: Expect {
                backends: Vec::new(),
                kept_backends: Vec::new(),
                backend_addrs: BTreeSet::new(),
                services_of_source: BTreeSet::new(),
                snat: false,
                snat_ports: model.states[state].snat_ports.clone(),
                any_snat_ports: model
                    .states
                    .iter()
                    .flat_map(|s| s.snat_ports.iter().cloned())
                    .collect(),
                snat_clients: BTreeSet::new(),
            },
        };
        let Some(ip) = ip else {
            return facts;
        };
        let l4 = ip.l4;
        facts.later_fragment = ip.later;
        facts.from_backend = model.backends.contains(&ip.src);
        facts.to_backend = model.backends.contains(&ip.dst);
        facts.to_node = node_toward(ip.dst) == Some(ip.dst);
        if ip.later && facts.to_node {
            facts.model.snat_clients = gen.snat_clients.clone();
        }
        facts.udp6_no_checksum = ip.v6
            && ip.proto == proto::UDP
            && !ip.later
            && f.len() >= l4 + 8
            && f[l4 + 6..l4 + 8] == [0, 0];
        if let Some((sport, dport)) = ip.ports(f) {
            if matches!(ip.proto, proto::TCP | proto::UDP) {
                let (src, dst) = (
                    SocketAddr::new(ip.src, sport),
                    SocketAddr::new(ip.dst, dport),
                );
                facts.tracked = lookup(src, dst, ip.proto);
                if facts.tracked.is_none() {
                    facts.maglev = maglev_replies(ct, model, state, src, dst, ip.proto);
                    facts.tracked = facts.maglev.first().map(|&service| Tracked {
                        kind: NAT_SRC,
                        nat: service,
                        peer: None,
                    });
                }
                facts.model.snat = model.is_snat(state, ip.dst, ip.proto, dport);
                facts.model.backends = model
                    .backends_of(state, ip.dst, ip.proto, dport)
                    .unwrap_or_default()
                    .iter()
                    .map(|b| b.endpoint)
                    .collect();
                for s in &model.states {
                    for (service, backends) in &s.services {
                        if service.protocol.number() == ip.proto
                            && backends.iter().any(|b| b.endpoint == src)
                        {
                            facts.model.services_of_source.insert(service_addr(service));
                        }
                        if ip.proto == proto::TCP && service_addr(service) == dst {
                            facts
                                .model
                                .kept_backends
                                .extend(backends.iter().map(|b| b.endpoint));
                        }
                    }
                }
            }
        }
        // (A later IPv6 fragment whose fragment header names an extension header
        // does not show its transport protocol.)
        let any_proto = ip.later && !matches!(ip.proto, proto::TCP | proto::UDP);
        for (service, backends) in &model.states[state].services {
            if service.addr == ip.dst && (any_proto || service.protocol.number() == ip.proto) {
                facts
                    .model
                    .backend_addrs
                    .extend(backends.iter().map(|b| b.endpoint.ip()));
            }
        }
        if let Some(q) = ip.quote(f) {
            if f.len() >= q.ports + 4 && ip.icmp_error(f[l4]) {
                let v6 = ip.v6;
                let addr = |at: usize| addr_at(f, at, v6);
                let half = (q.addrs.end - q.addrs.start) / 2;
                let quoted_src = SocketAddr::new(addr(q.addrs.start), port_at(f, q.ports));
                let quoted_dst =
                    SocketAddr::new(addr(q.addrs.start + half), port_at(f, q.ports + 2));
                facts.quote_flows =
                    flows(ct, model, quoted_dst, quoted_src, f[q.proto_at]).collect();
            }
        }
        facts
    }

    /// Whether `program` may change this packet at all.
    fn may_change(&self, program: Program) -> bool {
        let from_backend = self.from_backend;
        match program {
            // A `NAT_MASQ` entry is the TC program's.
            Program::Xdp => {
                let xdp = |f: Tracked| f.kind != NAT_MASQ;
                self.to_gateway
                    || self.tracked.is_some_and(xdp)
                    || self.quote_flows.iter().copied().any(xdp)
                    || (self.later_fragment && from_backend)
            }
            Program::Tc => {
                let tc = |f: Tracked| f.on_egress();
                self.tracked.is_some_and(tc)
                    || self.quote_flows.iter().copied().any(tc)
                    || (self.later_fragment && (from_backend || self.to_backend))
            }
        }
    }
}

/// The packet as the kernel would forward it (and TC see it on egress): its IP header
/// accepted (an IPv4 header's checksum included), and the frame cut to the IP packet's
/// end.
fn as_forwarded(f: &[u8]) -> Option<&[u8]> {
    let ip = Ip::parse(f)?;
    (ip.v6 || checksum(&f[IP..ip.l4]) == 0).then(|| &f[..ip.end])
}

/// Whether the frame is an ICMPv6 redirect (right after the IPv6 header), which the TC
/// program drops.
fn icmp6_redirect(f: &[u8]) -> bool {
    f.len() > IP + 40
        && f[12..14] == [0x86, 0xdd]
        && f[IP + 6] == proto::ICMPV6
        && f[IP + 40] == 137
}

/// The one's-complement sum of `bytes` (as `checksum` folds it), 0 and 0xffff alike.
fn sum(bytes: &[u8]) -> u16 {
    match checksum(bytes) {
        0xffff => 0,
        c => c,
    }
}

/// A TCP/UDP segment (or first fragment), or an ICMPv6 message (`proto`), behind its
/// pseudo-header: written as IPv4's, which sums as IPv6's (a 32-bit length and three
/// zero bytes before the next header: the same 16-bit words, but zeros).
fn with_pseudo_header(f: &[u8], ip: &Ip, proto: u8) -> Vec<u8> {
    let mut p = Vec::with_capacity(40 + ip.end - ip.l4);
    p.extend(&f[ip.addrs()]);
    p.extend([0, proto]);
    p.extend(((ip.end - ip.l4) as u16).to_be_bytes());
    p.extend(&f[ip.l4..ip.end]);
    p
}

/// The sum of a TCP/UDP segment (or first fragment) with its pseudo-header.
fn l4_sum(f: &[u8], ip: &Ip) -> u16 {
    sum(&with_pseudo_header(f, ip, ip.proto))
}

/// Turns the first 12 payload bytes of a whole TCP segment into options (MSS, SACK
/// permitted, window scale), its checksum recomputed.
fn tcp_options(f: &mut [u8]) {
    let Some(ip) = Ip::parse(f) else {
        return;
    };
    let l4 = ip.l4;
    if ip.proto != proto::TCP || ip.fragment || ip.end < l4 + 32 {
        return;
    }
    f[l4 + 12] = 8 << 4;
    f[l4 + 20..l4 + 32].copy_from_slice(&[2, 4, 5, 180, 4, 2, 1, 1, 3, 3, 7, 0]);
    f[l4 + 16..l4 + 18].fill(0);
    let c = checksum(&with_pseudo_header(f, &ip, ip.proto));
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
        Program::Tc => verdict == TC_NEXT || (verdict == TC_SHOT && icmp6_redirect(input)),
    };
    if !expected {
        problems.push(format!(
            "unexpected verdict {verdict:#x} ({})",
            verdict_name(verdict)
        ));
    }
    if xdp && verdict == XDP_DROP && !facts.to_gateway && !facts.from_elsewhere {
        problems.push(
            "dropped a packet not sent to a gateway address (nor a reply from elsewhere \
             than its backend)"
                .into(),
        );
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
    if facts.to_gateway && facts.udp6_no_checksum {
        problems.push("translated an IPv6 UDP datagram with checksum 0 (invalid)".into());
    }
    let Some(ip) = facts.ip else {
        problems.push("changed a packet whose IP header it cannot accept".into());
        return problems;
    };
    let redirected = xdp && verdict == XDP_REDIRECT;
    check_fields(&ip, redirected, input, output, &mut problems);
    check_checksums(&ip, input, output, &mut problems);
    check_quote(
        program,
        redirected,
        facts,
        (&ip, input),
        output,
        &mut problems,
    );
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

/// Only the fields a NAT rewrites differ: MACs and TTL (hop limit) when redirected,
/// addresses (and the IPv4 header checksum), ports, checksums, and the quoted header of
/// an ICMP error (IPv6: with the quoted transport checksum).
fn check_fields(
    ip: &Ip,
    redirected: bool,
    input: &[u8],
    output: &[u8],
    problems: &mut Vec<String>,
) {
    let l4 = ip.l4;
    let mut allowed = vec![false; input.len()];
    let mut allow = |r: Range<usize>| {
        for a in allowed.iter_mut().take(r.end).skip(r.start) {
            *a = true;
        }
    };
    if redirected {
        allow(0..12);
        allow(ip.hops_at()..ip.hops_at() + 1);
    }
    if !ip.v6 {
        allow(IP + 10..IP + 12);
    }
    allow(ip.addrs());
    match (ip.proto, ip.quote(input)) {
        (proto::TCP | proto::UDP, _) if !ip.later => {
            allow(l4..l4 + 4);
            let check = if ip.proto == proto::UDP { 6 } else { 16 };
            allow(l4 + check..l4 + check + 2);
        }
        (_, Some(q)) => {
            allow(l4 + 2..l4 + 4);
            if !ip.v6 {
                allow(q.at + 10..q.at + 12);
            }
            allow(q.addrs.clone());
            allow(q.ports..q.ports + 4);
            if let Some(at) = q.check_at(input, ip.end).filter(|_| ip.v6) {
                allow(at..at + 2);
            }
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
    if redirected && output[ip.hops_at()] != input[ip.hops_at()].wrapping_sub(1) {
        problems.push("redirected without decrementing the TTL (hop limit)".into());
    }
}

/// Every checksum sums as the input's did (a valid one stays valid); a UDP checksum of
/// 0 ("none") stays 0 and no other becomes 0.
fn check_checksums(ip: &Ip, input: &[u8], output: &[u8], problems: &mut Vec<String>) {
    let l4 = ip.l4;
    let end = ip.end;
    let region = |f: &[u8], r: Range<usize>| sum(&f[r.start.min(f.len())..r.end.min(f.len())]);
    if !ip.v6 && region(input, IP..l4) != region(output, IP..l4) {
        problems.push("IPv4 header checksum broken".into());
    }
    match (ip.proto, ip.quote(input)) {
        (proto::TCP | proto::UDP, _) if !ip.later && end >= l4 + 8 => {
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
                problems.push("translated a TCP header cut by the IP packet's end".into());
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
        (_, Some(q)) => {
            // ICMPv6's checksum covers the pseudo-header, ICMP's does not.
            let icmp_sum = |f: &[u8]| {
                if ip.v6 {
                    sum(&with_pseudo_header(f, ip, proto::ICMPV6))
                } else {
                    region(f, l4..end)
                }
            };
            if icmp_sum(input) != icmp_sum(output) {
                problems.push(format!(
                    "ICMP checksum broken (the IP packet ends {} bytes into the ICMP message)",
                    end.saturating_sub(l4)
                ));
            }
            if !ip.v6 && region(input, q.at..q.at + 20) != region(output, q.at..q.at + 20) {
                problems.push("quoted IPv4 header checksum broken".into());
            }
            // What the quoted transport checksum covers and a translation rewrites
            // (the quoted addresses and ports) sums with it as before.
            if let Some(at) = q.check_at(input, end).filter(|_| ip.v6) {
                let part =
                    |f: &[u8]| sum(&[&f[q.addrs.start..q.ports + 4], &f[at..at + 2]].concat());
                if part(input) != part(output) {
                    problems.push("quoted TCP/UDP checksum broken".into());
                }
            }
        }
        _ => {}
    }
}

/// One checker for both modes and families. Forward translations (XDP) go to a backend
/// of the service addressed; a SNAT forward packet (XDP when it sends it itself, else
/// TC on egress) leaves from the node's address toward that backend and a port its flow
/// claimed, or a new claim from the SNAT ports in force. Replies come from a service the
/// source is a backend of; a SNAT reply (to the node's address) goes to its flow's
/// client, from the flow's gateway address and port. XDP rewrites a source only when it
/// sends the packet itself, TC never rewrites a destination.
fn check_nat(
    program: Program,
    redirected: bool,
    facts: &Facts,
    (ip, input): (&Ip, &[u8]),
    (out, output): (&Ip, &[u8]),
    problems: &mut Vec<String>,
) {
    let (in_ports, out_ports) = (ip.ports(input), out.ports(output));
    let dst_changed = out.dst != ip.dst || in_ports.map(|p| p.1) != out_ports.map(|p| p.1);
    let src_changed = out.src != ip.src || in_ports.map(|p| p.0) != out_ports.map(|p| p.0);
    // A SNAT flow's reply entry, under the input's own tuple.
    let snat_reply = facts.tracked.filter(|t| facts.to_node && t.snat_reply());
    if dst_changed {
        if program == Program::Tc {
            problems.push("the TC program rewrote a destination".into());
        }
        if facts.to_node {
            check_snat_reply_destination(facts, snat_reply, out, out_ports, problems);
        } else {
            check_forward_destination(facts, ip, out, out_ports, problems);
        }
    }
    if !src_changed {
        return;
    }
    if program == Program::Xdp && !redirected {
        problems.push("a source translated but handed to the kernel".into());
    }
    // XDP translates a forward packet's destination with its source; TC sees it with
    // its destination translated already, to a backend.
    let forward = match program {
        Program::Xdp => dst_changed && !facts.to_node,
        Program::Tc => facts.to_backend,
    };
    if forward {
        check_snat_source(program, facts, out, out_ports, problems);
        return;
    }
    let Some((sport, _)) = out_ports else {
        if !Family::of(out.src).gateways().contains(&out.src) {
            problems.push(format!(
                "reply fragment rewritten to come from {}, no gateway address",
                out.src
            ));
        }
        return;
    };
    let from = SocketAddr::new(out.src, sport);
    if let Some(r) = snat_reply.filter(|r| r.nat != from) {
        problems.push(format!(
            "SNAT reply rewritten to come from {from}, not its flow's service {}",
            r.nat
        ));
    }
    if !facts.model.services_of_source.contains(&from) {
        problems.push(format!(
            "reply rewritten to come from {from}, not a service of the backend (services {:?})",
            facts.model.services_of_source
        ));
    }
    if !facts.maglev.is_empty() && !facts.maglev.contains(&from) {
        problems.push(format!(
            "a reply with no entry rewritten to come from {from}, whose Maglev does not map \
             it to its backend (services that do: {:?})",
            facts.maglev
        ));
    }
}

/// A reply with no entry that a program translated as one matched by Maglev recorded
/// its flow's forward entry (client → service, to the backend it came from), so that
/// the flow's next packets are tracked; once the LRU evicts, it may be gone.
fn check_recorded(ct: &Tracker, facts: &Facts, input: &[u8], output: &[u8]) -> Option<String> {
    let (ip, out) = (facts.ip?, Ip::parse(output)?);
    if facts.maglev.is_empty() || out.src == ip.src || ct.evicting {
        return None;
    }
    let ((sport, dport), (service_port, _)) = (ip.ports(input)?, out.ports(output)?);
    let (backend, client) = (
        SocketAddr::new(ip.src, sport),
        SocketAddr::new(ip.dst, dport),
    );
    let service = SocketAddr::new(out.src, service_port);
    let entry = ct.get(client, service, ip.proto);
    let recorded = entry.is_some_and(|f| f.kind == NAT_DST && f.nat == backend && f.peer.is_none());
    (!recorded).then(|| {
        format!(
            "the reply matched by Maglev recorded no forward entry {client} → {service} to \
             {backend}: it is {:?}",
            entry.map(|f| (f.kind, f.nat, f.peer))
        )
    })
}

/// An ICMP error about a tracked flow (either mode) has its quote translated as the
/// flow's packets the other way are: the half of the translation that rewrites the
/// error's destination rewrites the quote's source (XDP, however the error leaves), the
/// half that rewrites the error's source the quote's destination (XDP when it sends the
/// error itself; TC on egress, the only half it applies); an outer address that names
/// the quoted endpoint follows it, any other stays.
fn check_quote(
    program: Program,
    redirected: bool,
    facts: &Facts,
    (ip, input): (&Ip, &[u8]),
    output: &[u8],
    problems: &mut Vec<String>,
) {
    let Some(q) = ip.quote(input).filter(|_| !facts.quote_flows.is_empty()) else {
        return;
    };
    let half = (q.addrs.end - q.addrs.start) / 2;
    let quoted = |f: &[u8]| {
        let end = |i: usize| {
            let addr = addr_at(f, q.addrs.start + i * half, ip.v6);
            SocketAddr::new(addr, port_at(f, q.ports + 2 * i))
        };
        (end(0), end(1))
    };
    let outer = |f: &[u8]| {
        let at = ip.addrs().start;
        (addr_at(f, at, ip.v6), addr_at(f, at + half, ip.v6))
    };
    let (src, dst) = quoted(input);
    let (outer_src, outer_dst) = outer(input);
    let follow = |outer: IpAddr, was: SocketAddr, now: SocketAddr| {
        if outer == was.ip() {
            now.ip()
        } else {
            outer
        }
    };
    // What each entry makes of the error: its quote's ends, and the outer addresses.
    let translated = |t: &Tracked| {
        // The halves of the error's direction (the quoted packet travelled the other way).
        let (to_dst, to_src) = match t.kind {
            NAT_DST => (Some(t.nat), t.peer),
            NAT_MASQ => (None, Some(t.nat)),
            _ => (t.peer, Some(t.nat)),
        };
        let quote = match program {
            Program::Xdp if redirected => (to_dst.unwrap_or(src), to_src.unwrap_or(dst)),
            Program::Xdp => (to_dst.unwrap_or(src), dst),
            Program::Tc => (src, to_src.unwrap_or(dst)),
        };
        let outer = (
            follow(outer_src, dst, quote.1),
            follow(outer_dst, src, quote.0),
        );
        (quote, outer)
    };
    let got = (quoted(output), outer(output));
    let wanted: Vec<_> = facts.quote_flows.iter().map(translated).collect();
    if !wanted.contains(&got) {
        let ((q_src, q_dst), (o_src, o_dst)) = got;
        let wanted: Vec<String> = wanted
            .iter()
            .map(|((a, b), (c, d))| format!("{c} → {d} quoting {a} → {b}"))
            .collect();
        problems.push(format!(
            "the error became {o_src} → {o_dst} quoting {q_src} → {q_dst}, not as its flow's \
             translation makes it: {}",
            wanted.join(" or ")
        ));
    }
}

/// A SNAT forward packet's new source shows the claim its flow holds: the conntrack's
/// entry under (backend → node address and port), read after the run, must send the
/// replies back to this packet's client (XDP: from the service it addressed). So a
/// reply's translation, checked against that entry, goes where the flow came from.
/// Once the LRU evicts, the entry may be gone (evicted right after it was recorded:
/// the kernel's LRU is approximate), but never another flow's: two flows sharing a node
/// port toward one backend get each other's replies.
fn check_claim(
    ct: &Tracker,
    program: Program,
    facts: &Facts,
    input: &[u8],
    output: &[u8],
) -> Option<String> {
    let (ip, out) = (facts.ip?, Ip::parse(output)?);
    let forward = match program {
        Program::Xdp => out.dst != ip.dst && !facts.to_node,
        Program::Tc => facts.to_backend,
    };
    if !forward || out.src == ip.src || !matches!(ip.proto, proto::TCP | proto::UDP) {
        return None;
    }
    let ((sport, dport), (node_port, backend_port)) = (ip.ports(input)?, out.ports(output)?);
    let client = SocketAddr::new(ip.src, sport);
    let node = SocketAddr::new(out.src, node_port);
    let backend = SocketAddr::new(out.dst, backend_port);
    let service = (program == Program::Xdp).then_some(SocketAddr::new(ip.dst, dport));
    let reply = ct.get(backend, node, ip.proto);
    let holds = match reply {
        Some(r) => r.snat_reply() && r.peer == Some(client) && service.is_none_or(|s| r.nat == s),
        None => ct.evicting,
    };
    (!holds).then(|| {
        format!(
            "the SNAT claim {node} toward {backend} is not recorded for client {client} \
             (service {service:?}): its reply entry is {:?}",
            reply.map(|r| (r.kind, r.nat, r.peer))
        )
    })
}

/// A forward packet goes to a backend of the service addressed (a later fragment: of
/// a service on the address).
fn check_forward_destination(
    facts: &Facts,
    ip: &Ip,
    out: &Ip,
    out_ports: Option<(u16, u16)>,
    problems: &mut Vec<String>,
) {
    match out_ports {
        Some((_, dport)) => {
            let to = SocketAddr::new(out.dst, dport);
            // A TCP flow's entry keeps a backend that left its service.
            let kept = facts
                .tracked
                .is_some_and(|t| t.kind == NAT_DST && t.nat == to)
                && facts.model.kept_backends.contains(&to);
            if !facts.model.backends.contains(&to) && !kept {
                problems.push(format!(
                    "forwarded to {to}, not a backend of the service addressed (backends {:?})",
                    facts.model.backends
                ));
            }
        }
        None => {
            if !facts.model.backend_addrs.contains(&out.dst) {
                problems.push(format!(
                    "fragment forwarded to {}, no backend of a service on {}",
                    out.dst, ip.dst
                ));
            }
        }
    }
}

/// A SNAT reply goes to the client of the flow whose reply entry it matched (a later
/// fragment: to a client of a SNAT flow seen).
fn check_snat_reply_destination(
    facts: &Facts,
    snat_reply: Option<Tracked>,
    out: &Ip,
    out_ports: Option<(u16, u16)>,
    problems: &mut Vec<String>,
) {
    match (snat_reply.and_then(|r| r.peer), out_ports) {
        (Some(client), Some((_, dport))) => {
            let to = SocketAddr::new(out.dst, dport);
            if to != client {
                problems.push(format!(
                    "SNAT reply sent to {to}, not its flow's client {client}"
                ));
            }
        }
        (None, Some(_)) => {
            problems.push("a packet to the node address of no SNAT flow was rewritten".into());
        }
        (_, None) => {
            if !facts.model.snat_clients.contains(&out.dst) {
                problems.push(format!(
                    "SNAT reply fragment sent to {}, no client of a SNAT flow seen",
                    out.dst
                ));
            }
        }
    }
}

/// A SNAT forward packet's new source: the node's address toward its backend, and the
/// port its flow claimed (XDP: a tracked flow's, or a new claim from the ports in force;
/// TC: its `NAT_MASQ` entry's, from the ports of either state).
fn check_snat_source(
    program: Program,
    facts: &Facts,
    out: &Ip,
    out_ports: Option<(u16, u16)>,
    problems: &mut Vec<String>,
) {
    let node = node_toward(out.dst);
    if node != Some(out.src) {
        problems.push(format!(
            "forward packet rewritten to come from {}, not the node's address toward {} ({node:?})",
            out.src, out.dst
        ));
    }
    let Some((sport, _)) = out_ports else {
        return;
    };
    let from = SocketAddr::new(out.src, sport);
    let claimed = facts.tracked.and_then(|t| match t.kind {
        NAT_DST => t.peer,
        NAT_MASQ => Some(t.nat),
        _ => None,
    });
    let in_ports = |ranges: &[RangeInclusive<u16>]| ranges.iter().any(|r| r.contains(&sport));
    let ok = match program {
        Program::Xdp => {
            claimed == Some(from) || (facts.model.snat && in_ports(&facts.model.snat_ports))
        }
        Program::Tc => claimed == Some(from) && in_ports(&facts.model.any_snat_ports),
    };
    if ok {
        return;
    }
    problems.push(match program {
        Program::Xdp => format!(
            "forward packet rewritten to come from {from}: neither its flow's claim ({claimed:?}) \
             nor a new claim of a SNAT service (SNAT mode: {}, ports {:?})",
            facts.model.snat, facts.model.snat_ports
        ),
        Program::Tc => format!(
            "forward packet rewritten on egress to come from {from}: not its NAT_MASQ entry's \
             claim ({claimed:?}) from the SNAT ports {:?}",
            facts.model.any_snat_ports
        ),
    });
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
    fn tcp_options_keep_the_segment_valid_in_both_families() {
        let frames = [
            Packet::tcp(sa(CLIENT, 40000), sa(GW, 80))
                .payload(&[0xab; 20])
                .frame(),
            Packet6::tcp(sa6(CLIENT6, 40000), sa6(GW6, 80))
                .ext(DEST_OPTS)
                .payload(&[0xab; 20])
                .frame(),
        ];
        for mut f in frames {
            let before = f.clone();
            tcp_options(&mut f);
            let ip = Ip::parse(&f).expect("an IP packet");
            assert_eq!(f[ip.l4 + 12], 0x80, "data offset of 8 words");
            assert_ne!(f, before);
            assert_eq!(l4_sum(&f, &ip), 0, "TCP checksum valid");
        }
    }

    #[test]
    fn the_oracle_walks_ipv6_extension_headers_to_the_transport_header() {
        let auth = [0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let f = Packet6::udp(sa6(CLIENT6, 40000), sa6(GW6, 53))
            .ext(HOP_BY_HOP)
            .ext_raw(AUTH, &auth)
            .ext(DEST_OPTS)
            .frame();
        let ip = Ip::parse(&f).expect("an IPv6 packet");
        assert_eq!(ip.l4, IP + 40 + 8 + 12 + 8, "AH counts 4-byte units");
        assert_eq!(ip.proto, proto::UDP);
        assert_eq!(ip.ports(&f), Some((40000, 53)));
        assert_eq!(
            l4_sum(&f, &ip),
            0,
            "UDP checksum valid with the IPv6 pseudo-header"
        );
        let cut = &f[..IP + 40 + 8 + 4];
        assert!(Ip::parse(cut).is_none(), "payload length past the frame");
    }

    #[test]
    fn ipv6_fragments_carry_the_transport_header_in_the_first_only() {
        let p = Packet6::tcp(sa6(CLIENT6, 40000), sa6(GW6, 80)).payload(&[7; 40]);
        let (first, later) = fragments6(&p, 32, 9, None);
        let a = Ip::parse(&first).expect("first fragment");
        let b = Ip::parse(&later).expect("later fragment");
        assert!(a.fragment && !a.later, "first fragment");
        assert!(b.fragment && b.later, "later fragment");
        assert_eq!(a.ports(&first), Some((40000, 80)));
        assert_eq!((a.end - a.l4) + (b.end - b.l4), 60, "20 + 40 bytes in all");
        // With options after the fragment header, only the first fragment has them:
        // the later one's continuation is not walked as headers.
        let options: &[u8] = &[0, 0, 1, 4, 0, 0, 0, 0];
        let (first, later) = fragments6(&p, 32, 9, Some((DEST_OPTS, options)));
        let a = Ip::parse(&first).expect("first fragment");
        let b = Ip::parse(&later).expect("later fragment");
        assert_eq!((a.proto, a.l4), (proto::TCP, IP + 40 + 8 + 8));
        assert_eq!(
            (b.proto, b.l4),
            (DEST_OPTS, IP + 40 + 8),
            "{}",
            decode(&later)
        );
        assert_eq!((a.end - a.l4) + (b.end - b.l4), 60);
    }
}
