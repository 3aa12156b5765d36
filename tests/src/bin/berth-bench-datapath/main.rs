//! `cargo xtask bench datapath`: nanoseconds per packet of the gateway program under
//! `BPF_PROG_TEST_RUN`, against an XDP program that returns at once (the floor).
//!
//! Two measurements per case, both taken from the kernel's own duration:
//! - hot: `repeat = 200` on a fresh copy of the packet (caches warm, as under steady
//!   high-pps load). For a repeated packet to take the same path every time, the
//!   benchmark service maps the gateway address to itself (the DNAT rewrites a field to
//!   the value it had) and packets start with TTL 255, so 200 forwarding hops never
//!   expire it. Conntrack, checksum updates, FIB cache, TTL, MACs and counters all run.
//!   A new flow cannot repeat on one packet (its second run would be a conntrack hit),
//!   so for it the benchmark chains 200 services in a ring, each balancing to the next
//!   one's gateway port: every repetition is the first packet of a flow to the next
//!   service (Maglev pick, one conntrack insert; the next hop is the backend's). Each
//!   run starts from a distinct client port. So the hot new-flow cases touch 200
//!   services, tables and backends per run, each once: "hot" for the code, cold for
//!   the per-service data (the worst case for a new flow: a service not seen lately).
//!   The TCP case is the same ring for SYNs (no conntrack lookup); the flood-guard case
//!   the UDP ring over `config::NEW_FLOW_LIMIT` = 1 (Maglev only, nothing recorded).
//! - cold: `repeat = 1` per run (caches disturbed by the syscall in between); for new
//!   flows a distinct 5-tuple per run, all to one service of 9 backends (a DNS-style
//!   load: every query a new flow to the same service).
//!
//! SNAT-mode cases run the same three paths on SNAT services (source rewritten to a
//! node address and a per-flow port claimed from a 64512-port pool). For their hot
//! established and reply cases to repeat on one packet, the source resolver names the
//! client itself as the node address and the benchmark picks the service port and
//! client port whose claimed node port is the client port (found with the kernel's own
//! hash): both rewrites then write the values the fields had. The hot new-flow case has
//! its own ring of SNAT services; each hop's node port becomes the next flow's source
//! port, distinct per backend by the claim, so every repetition is a new flow. The
//! cold new-flow case spreads its flows over many backend endpoints so the pool stays
//! nearly empty (a port claim rarely retries).
//!
//! Two cases measure a flow's packet reaching a gateway without its entry (issue 26:
//! several gateways behind ECMP). "midflow miss": a TCP ACK with no entry (a conntrack
//! miss, then Maglev and one insert, as a new flow); hot, the TCP ring with ACKs (each
//! repetition a miss at the next service), cold, a distinct client per sample to the
//! 9-backend TCP service. "reply miss": a reply with no entry (the reply index, a miss
//! on its flow's forward tuple, Maglev, one insert); hot, the UDP ring walked
//! backwards (a reply from service i+1's address is service i's backend's, translated
//! to service i's address, which is service i-1's backend), cold, a distinct client
//! per sample answered by the backend Maglev maps it to (`maglev_pick`) among the
//! 9-backend UDP service's. The clients of both have no other case's entries.
//!
//! IPv6 cases run the same established, reply, miss and new-flow paths through
//! `berth_v6` (entered from `berth` by tail call), on the IPv6 twins of the IPv4
//! services: an identity service, a 200-service ring for each of UDP and SYNs, a
//! service of 9 backends; hop limit 255.
//!
//! The program runs in a private namespace with routes and static neighbours, so
//! forwarded packets take the FIB-hit redirect path. Figures are medians: each round
//! times every run of a case (`HOT_RUNS` or `COLD_RUNS`) and keeps their median, and a
//! case's figure is the median of its rounds'.
//!
//! A/B (`cargo xtask bench datapath-ab <git-rev>`, or `BERTH_BENCH_AB=<gateway.o>`):
//! two builds of the kernel program compared in one process, as two separately run
//! benches drift by 1-14 % from each other even on byte-identical programs. Both
//! objects are loaded ("A": the one this build embeds; "B": the ELF object at
//! `BERTH_BENCH_AB`, of the same map layout), each as a datapath with its own pins
//! and maps, given the same state and the same fixtures. Every case then runs
//! `AB_ROUNDS` rounds on each, a round of A and one of B in turn, on the same frames,
//! in the order A B, B A, A B, ... (a drift through a pair of rounds weighs on both
//! sides alike, and neither always goes first), in each of `AB_EPOCHS` loads of both
//! (B loaded first in every other: where a program and its maps land moves a new
//! flow's cost by a few percent for the life of the load). Each datapath has its own conntrack,
//! so the new-flow cases' distinct tuples stay new flows on both (`limits` sizes the
//! conntrack for the rounds). Reported per case, hot and cold: A's and B's medians,
//! and B/A as the median of the round pairs' ratios with their lowest and highest
//! (the floor's row is the same comparison of the two objects' empty programs); the
//! JSON line adds `b_<case>` (B's hot median) and `ab_<case>_hot`/`_cold` ([ratio,
//! lowest, highest]). One object A/B'd against itself measures the method's
//! resolution (docs/benchmarks.md, "Comparing two builds").

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use berth::datapath::{Datapath, DesiredState, Limits, PROGRAM};
use berth_tests::xdp::{net::*, FixtureNet, TestDatapath, XDP_REDIRECT};

mod cases;
mod measure;
mod report;
mod state;

use cases::{Case, Frames};
use measure::{median, rounds, run, selected, Ab};

const HOT_REPEAT: u32 = 200;
// Each repeated run swaps the kernel's XDP dispatcher (an RCU grace period, outside the
// timed loop), so hot runs are few and long.
const HOT_RUNS: usize = 40;
const COLD_RUNS: usize = 20_000;
const ROUNDS: usize = 5;
/// Rounds of each datapath in one epoch of an A/B comparison: even, so that A and B go
/// first in as many round pairs. At most 6: a case's clients (`cases::client_of`) have
/// 120,000 distinct tuples, `COLD_RUNS` a round.
const AB_ROUNDS: usize = 2;
/// Epochs of an A/B comparison, each loading both datapaths afresh, B first in every
/// other one: where a program and its maps land decides a few percent of a new flow's
/// cost for the life of the load (docs/benchmarks.md, "Comparing two builds"), so a
/// comparison spans several.
const AB_EPOCHS: usize = 3;
/// Services in the new-flow ring (= repetitions of a hot run).
const RING: u32 = HOT_REPEAT;
const RING_BASE: u16 = 20000;
/// First service port of the SNAT new-flow ring.
const SNAT_RING_BASE: u16 = 21000;
/// Clients of the cold midflow-miss samples (a TCP ACK of no recorded flow).
const MIDFLOW_CLIENTS: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(10, 250, 1, 110)),
    IpAddr::V4(Ipv4Addr::new(10, 250, 1, 111)),
];
const MIDFLOW_CLIENTS6: [IpAddr; 2] = [
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 0x110)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 0x111)),
];
/// Clients the reply misses go to (given neighbour entries: they are redirected to);
/// the cold samples' are the first two, the hot ring's the third.
const REPLY_CLIENTS: [IpAddr; 3] = [
    IpAddr::V4(Ipv4Addr::new(10, 250, 1, 120)),
    IpAddr::V4(Ipv4Addr::new(10, 250, 1, 121)),
    IpAddr::V4(Ipv4Addr::new(10, 250, 1, 204)),
];
const REPLY_CLIENTS6: [IpAddr; 3] = [
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 0x120)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 0x121)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 0x204)),
];

/// Map sizes for `rounds` rounds of every case on one datapath.
fn limits(rounds: usize) -> Limits {
    Limits {
        // Service ids are shared by both families: IPv4's three rings, IPv6's two and
        // a few more.
        services: 5 * RING + 16,
        backends: 2048,
        // Entries for every recorded cold sample (the new-flow cases, a SNAT flow's
        // two, the midflow and reply misses) and hot repetition, with room to spare.
        flows: 10 * (COLD_RUNS * rounds) as u32,
        fragments: 64,
        addresses: 8,
    }
}

/// Gives `t` the bench's state and lets it redirect into the fixture's interfaces.
fn prepare(t: &mut TestDatapath, state: &DesiredState, fx: &FixtureNet) {
    // The source resolver names the client as the node address (see the top).
    t.dp.set_source_resolver(Box::new(|_| Some(CLIENT.into())));
    t.dp.apply(state).expect("apply");
    // Both sides take XDP frames (what the daemon learns from the kernel's xdp-features):
    // forwarded packets take the redirect path.
    t.allow_redirect(&[fx.fx0, fx.fx1]);
    // A hot reply repeats on its own output, whose source MAC is the gateway's egress
    // MAC, not the backend's neighbour's: its later repetitions come "from elsewhere"
    // (`reply_spoofed`). Allowed here, they take the check's whole way (the
    // comparison, then the config slot) and are translated: hot reply figures are an
    // upper bound of the check's cost; cold ones (one run per packet) are exact.
    t.dp.set_reply_origin_any(true).expect("reply origin");
}

/// Opens the established flows (and their reply entries) of `dp` that the selected
/// cases use (an A/B object whose IPv6 differs from this build's is measured on the
/// IPv4 cases alone, `BERTH_BENCH_CASES`). Inside the fixture namespace.
fn open_flows(dp: &mut Datapath, fx0: u32, f: &Frames) {
    let mut out = vec![0u8; 512];
    for (frame, what, cases) in [
        (
            &f.established,
            "established flow setup",
            "established_ns,reply_ns",
        ),
        (
            &f.established6,
            "IPv6 established flow setup",
            "v6_established_ns,v6_reply_ns",
        ),
        (
            &f.snat_established,
            "snat established flow setup",
            "snat_established_ns,snat_reply_ns",
        ),
    ] {
        if !cases.split(',').any(selected) {
            continue;
        }
        let (v, _) = run(dp, PROGRAM, fx0, frame, 1, &mut out);
        assert_eq!(v, XDP_REDIRECT, "{what}");
        if frame == &f.snat_established {
            // Addresses and ports (Ethernet + IPv4 without options + UDP ports).
            assert_eq!(
                out[26..38],
                f.snat_established[26..38],
                "the snat identity flow leaves with its addresses and ports unchanged"
            );
        }
    }
}

/// Round medians of one case, per datapath: hot and cold.
struct Measured {
    hot: Vec<Vec<u64>>,
    cold: Vec<Vec<u64>>,
}

impl Measured {
    /// The rounds of both, per datapath (`a`'s first).
    fn join(a: Option<Measured>, b: Option<Measured>) -> Option<Measured> {
        let (mut a, b) = (a?, b?);
        for (to, from) in [(&mut a.hot, b.hot), (&mut a.cold, b.cold)] {
            for (to, from) in to.iter_mut().zip(from) {
                to.extend(from);
            }
        }
        Some(a)
    }
}

/// Every selected case on every datapath of `dps` (`rounds` rounds each, in turn).
fn measure(dps: &mut [&mut Datapath], cases: &[Case], rounds_each: usize) -> Vec<Option<Measured>> {
    cases
        .iter()
        .map(|c| {
            if !selected(c.key) {
                return None;
            }
            // Only the flood case runs over the new-flow limit (1 per second).
            let limit = u32::from(c.key == "flood_new_flow_ns");
            for dp in dps.iter_mut() {
                dp.set_new_flow_limit(limit).expect("new-flow limit");
            }
            Some(Measured {
                hot: rounds(dps, c, HOT_REPEAT, HOT_RUNS, rounds_each),
                cold: rounds(dps, c, 1, COLD_RUNS, rounds_each),
            })
        })
        .collect()
}

/// The object to compare this build's with (`BERTH_BENCH_AB`), if any.
fn other_object() -> Option<(std::path::PathBuf, Vec<u8>)> {
    let path = std::path::PathBuf::from(std::env::var_os("BERTH_BENCH_AB")?);
    let object = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("reading BERTH_BENCH_AB={}: {e}", path.display()));
    Some((path, object))
}

/// This build's datapath and, for an A/B, the other object's, loaded afresh and given
/// the bench's state; B first when `b_first`.
fn load(
    limits: Limits,
    other: Option<&[u8]>,
    b_first: bool,
    desired: &DesiredState,
    fx: &FixtureNet,
) -> (TestDatapath, Option<TestDatapath>) {
    let load_b = || other.map(|object| TestDatapath::load_object(limits, object.to_vec()));
    let (mut a, mut b) = if b_first {
        let b = load_b();
        (TestDatapath::load_with(limits), b)
    } else {
        (TestDatapath::load_with(limits), load_b())
    };
    prepare(&mut a, desired, fx);
    if let Some(b) = &mut b {
        prepare(b, desired, fx);
    }
    (a, b)
}

fn main() {
    let other = other_object();
    if let Some((path, _)) = &other {
        println!("A/B: B is {}", path.display());
    }
    let (epochs, rounds_each) = match other {
        Some(_) => (AB_EPOCHS, AB_ROUNDS),
        None => (1, ROUNDS),
    };
    let limits = limits(rounds_each);
    let fx = state::fixture();
    let snat = state::snat_identity(CLIENT, 100..1000);
    let desired = state::desired_state(snat);
    let frames = Frames::new(snat);
    let cases = cases::cases(fx.fx0, fx.fx1, &frames);
    let mut results: Vec<Option<Measured>> = Vec::new();
    let mut loaded = None;
    for epoch in 0..epochs {
        // The last epoch's datapaths go (their maps freed) before the next load.
        drop(loaded.take());
        let object = other.as_ref().map(|(_, o)| o.as_slice());
        let (mut a, mut b) = load(limits, object, epoch % 2 == 1, &desired, &fx);
        let measured = fx.ns.enter(|| {
            let mut dps: Vec<&mut Datapath> = std::iter::once(&mut a.dp)
                .chain(b.as_mut().map(|b| &mut b.dp))
                .collect();
            for dp in dps.iter_mut() {
                open_flows(dp, fx.fx0, &frames);
            }
            measure(&mut dps, &cases, rounds_each)
        });
        results = if results.is_empty() {
            measured
        } else {
            results
                .into_iter()
                .zip(measured)
                .map(|(r, m)| Measured::join(r, m))
                .collect()
        };
        loaded = Some((a, b));
    }
    let (a, b) = loaded.expect("at least one epoch");
    let rounds_each = rounds_each * epochs;

    // This build's (A's) figures, as without A/B.
    let medians: Vec<(u64, u64)> = results
        .iter()
        .map(|m| {
            m.as_ref().map_or((0, 0), |m| {
                (median(m.hot[0].clone()), median(m.cold[0].clone()))
            })
        })
        .collect();
    let mut headline = report::table(&cases, &medians, rounds_each);
    let label = if b.is_some() { "A " } else { "" };
    report::counters(&a.dp, label);
    if let Some(b) = &b {
        report::counters(&b.dp, "B ");
        let abs: Vec<Option<(Ab, Ab)>> = results
            .iter()
            .map(|m| m.as_ref().map(|m| (Ab::of(&m.hot), Ab::of(&m.cold))))
            .collect();
        headline.extend(report::ab_table(&cases, &abs, rounds_each, epochs));
    }
    println!("{{{}}}", headline.join(","));
}
