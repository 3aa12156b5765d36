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
//!   service (Maglev pick, two conntrack inserts, a full FIB lookup). Each run starts
//!   from a distinct client port.
//! - cold: `repeat = 1` per run (caches disturbed by the syscall in between); for new
//!   flows a distinct 5-tuple per run.
//!
//! The program runs in a private namespace with routes and static neighbours, so
//! forwarded packets take the FIB-hit redirect path. Figures are medians.

use std::net::Ipv4Addr;

use aya::programs::{TestRun, TestRunOptions};
use berth::datapath::{
    Datapath, DesiredState, Limits, Protocol, ServiceAddr, WeightedBackend, FLOOR_PROGRAM, PROGRAM,
};
use berth_tests::{
    packet::Packet,
    xdp::{net::*, FixtureNet, TestDatapath, XDP_PASS, XDP_REDIRECT},
};

const HOT_REPEAT: u32 = 200;
// Each repeated run swaps the kernel's XDP dispatcher (an RCU grace period, outside the
// timed loop), so hot runs are few and long.
const HOT_RUNS: usize = 40;
const COLD_RUNS: usize = 20_000;
const ROUNDS: usize = 5;
/// Services in the new-flow ring (= repetitions of a hot run).
const RING: u32 = HOT_REPEAT;
const RING_BASE: u16 = 20000;

/// One test run; returns (verdict, kernel-measured ns per repetition).
fn run(
    dp: &mut Datapath,
    program: &'static str,
    ifindex: u32,
    frame: &[u8],
    repeat: u32,
    out: &mut [u8],
) -> (u32, u64) {
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
    let prog = dp.program_mut(program).expect("program");
    let opts = TestRunOptions {
        data_in: Some(frame),
        data_out: Some(out),
        ctx_in: Some(&ctx),
        repeat,
        ..TestRunOptions::default()
    };
    let r = prog.test_run(opts).expect("test_run");
    (r.return_value, r.duration.as_nanos() as u64)
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

struct Case {
    name: &'static str,
    key: &'static str,
    program: &'static str,
    ingress: u32,
    verdict: u32,
    /// Frame for sample `n` (distinct per sample only for new flows).
    frame: Box<dyn Fn(usize) -> Vec<u8> + Send + Sync>,
    /// Frame for hot run `n`, when it differs from the cold one.
    hot_frame: Option<Box<dyn Fn(usize) -> Vec<u8> + Send + Sync>>,
}

fn measure(dp: &mut Datapath, case: &Case, repeat: u32, runs: usize) -> u64 {
    let mut out = vec![0u8; 512];
    let mut round_medians = Vec::new();
    let frame = match (&case.hot_frame, repeat > 1) {
        (Some(hot), true) => hot,
        _ => &case.frame,
    };
    for r in 0..ROUNDS {
        // Frames are built first so that only the program is timed.
        let frames: Vec<Vec<u8>> = (0..runs).map(|i| frame(r * runs + i)).collect();
        let mut times = Vec::with_capacity(runs);
        for f in &frames {
            let (v, ns) = run(dp, case.program, case.ingress, f, repeat, &mut out);
            assert_eq!(v, case.verdict, "{}: unexpected verdict", case.name);
            times.push(ns);
        }
        round_medians.push(median(times));
    }
    median(round_medians)
}

fn main() {
    let flows = 4 * (COLD_RUNS * ROUNDS) as u32;
    let limits = Limits {
        services: RING + 8,
        backends: 256,
        flows,
        fragments: 64,
        addresses: 8,
    };
    let mut t = TestDatapath::load_with(limits);
    let fx = FixtureNet::new();
    // The gateway address routes out of fx1, like a backend.
    fx.ns.ip(&["route", "add", "10.250.0.100/32", "dev", "fx1"]);
    fx.ns.ip(&[
        "neigh",
        "replace",
        "10.250.0.100",
        "lladdr",
        "02:00:00:00:00:64",
        "dev",
        "fx1",
        "nud",
        "permanent",
    ]);
    let gw = |port| sa(GW, port);
    let identity = vec![WeightedBackend {
        endpoint: gw(53),
        weight: 1,
    }];
    let backends: Vec<WeightedBackend> = [B1, B2, B3]
        .iter()
        .flat_map(|&b| {
            (0..3).map(move |i| WeightedBackend {
                endpoint: sa(b, 8080 + i),
                weight: 1 + i,
            })
        })
        .collect();
    let state = DesiredState::default()
        .with_service(
            ServiceAddr {
                addr: GW,
                protocol: Protocol::Udp,
                port: 53,
            },
            identity,
        )
        .with_service(
            ServiceAddr {
                addr: GW,
                protocol: Protocol::Udp,
                port: 54,
            },
            backends,
        );
    // The new-flow ring: service RING_BASE + i balances to RING_BASE + (i + 1) % RING.
    let udp_gw = |port| ServiceAddr {
        addr: GW,
        protocol: Protocol::Udp,
        port,
    };
    let state = (0..RING as u16).fold(state, |state, i| {
        let next = RING_BASE + (i + 1) % RING as u16;
        state.with_service(
            udp_gw(RING_BASE + i),
            vec![WeightedBackend {
                endpoint: gw(next),
                weight: 1,
            }],
        )
    });
    t.dp.apply(&state).expect("apply");
    // Both sides take XDP frames (what the daemon learns from the kernel's xdp-features):
    // forwarded packets take the redirect path.
    t.allow_redirect(&[fx.fx0, fx.fx1]);

    let udp = |src, dst| Packet::udp(src, dst).payload(&[0u8; 18]).ttl(255);
    let established = udp(sa(CLIENT, 40000), gw(53))
        .macs(CLIENT_MAC, FX0_MAC)
        .frame();
    let reply = udp(gw(53), sa(CLIENT, 40000))
        .macs([2, 0, 0, 0, 0, 0x64], FX1_MAC)
        .frame();
    let miss = udp(sa(CLIENT, 40000), sa(Ipv4Addr::new(10, 250, 9, 9), 53))
        .macs(CLIENT_MAC, FX0_MAC)
        .frame();
    let fixed = |f: Vec<u8>| -> Box<dyn Fn(usize) -> Vec<u8> + Send + Sync> {
        Box::new(move |_| f.clone())
    };
    let cases = [
        Case {
            name: "floor (empty XDP program)",
            key: "floor_ns",
            program: FLOOR_PROGRAM,
            ingress: fx.fx0,
            verdict: XDP_PASS,
            frame: fixed(established.clone()),
            hot_frame: None,
        },
        Case {
            name: "established flow (conntrack hit, DNAT, redirect)",
            key: "established_ns",
            program: PROGRAM,
            ingress: fx.fx0,
            verdict: XDP_REDIRECT,
            frame: fixed(established.clone()),
            hot_frame: None,
        },
        Case {
            name: "reply (reverse NAT, redirect)",
            key: "reply_ns",
            program: PROGRAM,
            ingress: fx.fx1,
            verdict: XDP_REDIRECT,
            frame: fixed(reply),
            hot_frame: None,
        },
        Case {
            name: "miss (not a service, passes untouched)",
            key: "miss_ns",
            program: PROGRAM,
            ingress: fx.fx0,
            verdict: XDP_PASS,
            frame: fixed(miss),
            hot_frame: None,
        },
        Case {
            name: "new flow (Maglev, 2 conntrack inserts, FIB, DNAT)",
            key: "new_flow_ns",
            program: PROGRAM,
            ingress: fx.fx0,
            verdict: XDP_REDIRECT,
            // A distinct client address and port per sample: every one is a new flow.
            frame: Box::new(move |n| {
                let src = sa(
                    Ipv4Addr::new(10, 250, 1, 100 + (n / 60000) as u8),
                    1024 + (n % 60000) as u16,
                );
                udp(src, gw(54)).macs(CLIENT_MAC, FX0_MAC).frame()
            }),
            hot_frame: Some(Box::new(move |n| {
                let src = sa(Ipv4Addr::new(10, 250, 1, 200), 1024 + n as u16);
                udp(src, gw(RING_BASE)).macs(CLIENT_MAC, FX0_MAC).frame()
            })),
        },
    ];

    let results: Vec<(u64, u64)> = fx.ns.enter(|| {
        // Open the established flow (and its reply entry) first.
        let (v, _) = run(
            &mut t.dp,
            PROGRAM,
            fx.fx0,
            &established,
            1,
            &mut vec![0u8; 512],
        );
        assert_eq!(v, XDP_REDIRECT, "established flow setup");
        cases
            .iter()
            .map(|c| {
                let hot = measure(&mut t.dp, c, HOT_REPEAT, HOT_RUNS);
                (hot, measure(&mut t.dp, c, 1, COLD_RUNS))
            })
            .collect()
    });

    let (hot_floor, cold_floor) = (results[0].0 as i64, results[0].1 as i64);
    println!("XDP datapath, ns per packet under BPF_PROG_TEST_RUN (medians of {ROUNDS} rounds)");
    println!("  hot: repeat={HOT_REPEAT} x {HOT_RUNS} runs; cold: repeat=1 x {COLD_RUNS} runs");
    println!(
        "{:<52} {:>6} {:>7} {:>6} {:>7}",
        "case", "hot", "+floor", "cold", "+floor"
    );
    let mut headline = Vec::new();
    for (case, (hot, cold)) in cases.iter().zip(&results) {
        let (hot_over, cold_over) = (*hot as i64 - hot_floor, *cold as i64 - cold_floor);
        println!(
            "{:<52} {hot:>6} {hot_over:>+7} {cold:>6} {cold_over:>+7}",
            case.name
        );
        headline.push(format!("\"{}\":{}", case.key, hot));
    }
    let c = t.dp.counters().expect("counters");
    println!(
        "counters: new_flow {} redirect {} kernel_forward_no_xdp_egress {}",
        c["new_flow"], c["redirect"], c["kernel_forward_no_xdp_egress"]
    );
    println!("{{{}}}", headline.join(","));
}
