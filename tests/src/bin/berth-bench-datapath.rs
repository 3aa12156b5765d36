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
//! forwarded packets take the FIB-hit redirect path. Figures are medians.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use aya::programs::{TestRun, TestRunOptions};
use berth::datapath::{
    Datapath, DesiredState, Limits, Protocol, ServiceAddr, WeightedBackend, FLOOR_PROGRAM, PROGRAM,
};
use berth_tests::{
    packet::{Packet, Packet6, ACK, SYN},
    xdp::{maglev_pick, net::*, FixtureNet, TestDatapath, XDP_PASS, XDP_REDIRECT},
};
use gateway_common::{flow_hash, proto, snat_port_slot};

const HOT_REPEAT: u32 = 200;
// Each repeated run swaps the kernel's XDP dispatcher (an RCU grace period, outside the
// timed loop), so hot runs are few and long.
const HOT_RUNS: usize = 40;
const COLD_RUNS: usize = 20_000;
const ROUNDS: usize = 5;
/// Services in the new-flow ring (= repetitions of a hot run).
const RING: u32 = HOT_REPEAT;
const RING_BASE: u16 = 20000;
/// First service port of the SNAT new-flow ring.
const SNAT_RING_BASE: u16 = 21000;
/// The SNAT port pool.
const SNAT_PORTS: std::ops::RangeInclusive<u16> = 1024..=65535;
/// Backend endpoints of the SNAT new-flow service (each has its own port pool).
const SNAT_BACKENDS: u16 = 64;
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

/// A UDP service port in `ports` and a client port for which a SNAT flow from
/// `client` to the gateway gets the client port as its node port on the first try
/// (node address = client): the forward and reply rewrites are then identities.
fn snat_identity(client: Ipv4Addr, ports: std::ops::Range<u16>) -> (u16, u16) {
    let pool: Vec<u16> = SNAT_PORTS.collect();
    ports
        .flat_map(|svc| pool.iter().map(move |&c| (svc, c)))
        .find(|&(svc, c)| {
            let h = flow_hash(
                u32::from(client).to_be(),
                u32::from(GW).to_be(),
                c.to_be(),
                svc.to_be(),
                proto::UDP,
            );
            pool[snat_port_slot(h, 0, pool.len() as u32) as usize - 1] == c
        })
        .expect("a service and client port whose node port is the client port")
}

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

/// Whether case `key` is measured: all by default; `BERTH_BENCH_CASES` (comma-separated
/// keys, for profiling one path) picks some; the floor is always measured.
fn selected(key: &str) -> bool {
    match std::env::var("BERTH_BENCH_CASES") {
        Ok(keys) => key == "floor_ns" || keys.split(',').any(|k| k == key),
        Err(_) => true,
    }
}

/// The 9 backends (3 addresses, 3 ports, weights 1 to 3) of the services on port 54
/// (UDP) and 56 (TCP), of `ips`' family.
fn nine_backends(ips: [IpAddr; 3]) -> Vec<WeightedBackend> {
    ips.iter()
        .flat_map(|&b| {
            (0..3).map(move |i| WeightedBackend {
                endpoint: std::net::SocketAddr::new(b, 8080 + i),
                weight: 1 + i,
            })
        })
        .collect()
}

/// `state` with the IPv6 twins of the router-mode services on `GW6`: the identity
/// service (UDP 53), the 9-backend services (UDP 54, TCP 56) and the UDP and TCP rings.
fn ipv6_services(state: DesiredState) -> DesiredState {
    let gw6 = |port| sa6(GW6, port);
    let svc6 = |protocol, port| ServiceAddr {
        addr: IpAddr::V6(GW6),
        protocol,
        port,
    };
    let one = |e: SocketAddrV6| {
        vec![WeightedBackend {
            endpoint: e.into(),
            weight: 1,
        }]
    };
    let backends = nine_backends([B1_6.into(), B2_6.into(), B3_6.into()]);
    let state = state
        .with_service(svc6(Protocol::Udp, 53), one(gw6(53)))
        .with_service(svc6(Protocol::Udp, 54), backends.clone())
        .with_service(svc6(Protocol::Tcp, 56), backends);
    [Protocol::Udp, Protocol::Tcp]
        .into_iter()
        .flat_map(|p| (0..RING as u16).map(move |i| (p, i)))
        .fold(state, |state, (p, i)| {
            let next = RING_BASE + (i + 1) % RING as u16;
            state.with_service(svc6(p, RING_BASE + i), one(gw6(next)))
        })
}

fn main() {
    // Entries for every recorded cold sample (the new-flow cases, a SNAT flow's two,
    // the midflow and reply misses) and hot repetition, with room to spare.
    let flows = 10 * (COLD_RUNS * ROUNDS) as u32;
    let limits = Limits {
        // Service ids are shared by both families: IPv4's three rings, IPv6's two and
        // a few more.
        services: 5 * RING + 16,
        backends: 2048,
        flows,
        fragments: 64,
        addresses: 8,
    };
    let mut t = TestDatapath::load_with(limits);
    let fx = FixtureNet::new();
    // The gateway address routes out of fx1, like a backend.
    fx.ns.ip(&["route", "add", "10.250.0.100/32", "dev", "fx1"]);
    // And the IPv6 gateway address.
    fx.ns
        .ip(&["-6", "route", "add", &format!("{GW6}/128"), "dev", "fx1"]);
    let gw_mac = [2, 0, 0, 0, 0, 0x64];
    fx.neighbour(GW.into(), gw_mac, "fx1");
    fx.neighbour(GW6.into(), gw_mac, "fx1");
    // The clients the reply misses go to: on fx0, resolved.
    for ip in REPLY_CLIENTS.into_iter().chain(REPLY_CLIENTS6) {
        fx.neighbour(ip, CLIENT_MAC, "fx0");
    }
    let gw = |port| sa(GW, port);
    let identity = vec![WeightedBackend {
        endpoint: gw(53).into(),
        weight: 1,
    }];
    let backends = nine_backends([B1.into(), B2.into(), B3.into()]);
    let backends6 = nine_backends([B1_6.into(), B2_6.into(), B3_6.into()]);
    let udp54 = backends.clone();
    let state = DesiredState::default()
        .with_service(
            ServiceAddr {
                addr: GW.into(),
                protocol: Protocol::Udp,
                port: 53,
            },
            identity,
        )
        .with_service(
            ServiceAddr {
                addr: GW.into(),
                protocol: Protocol::Udp,
                port: 54,
            },
            backends.clone(),
        )
        .with_service(
            ServiceAddr {
                addr: GW.into(),
                protocol: Protocol::Tcp,
                port: 56,
            },
            backends,
        );
    // The new-flow ring: service RING_BASE + i balances to RING_BASE + (i + 1) % RING.
    let udp_gw = |port| ServiceAddr {
        addr: GW.into(),
        protocol: Protocol::Udp,
        port,
    };
    let state = (0..RING as u16).fold(state, |state, i| {
        let next = RING_BASE + (i + 1) % RING as u16;
        state.with_service(
            udp_gw(RING_BASE + i),
            vec![WeightedBackend {
                endpoint: gw(next).into(),
                weight: 1,
            }],
        )
    });
    // The same ring for TCP SYNs.
    let state = (0..RING as u16).fold(state, |state, i| {
        let next = RING_BASE + (i + 1) % RING as u16;
        state.with_service(
            ServiceAddr {
                addr: GW.into(),
                protocol: Protocol::Tcp,
                port: RING_BASE + i,
            },
            vec![WeightedBackend {
                endpoint: gw(next).into(),
                weight: 1,
            }],
        )
    });
    // SNAT services beside them. The node address is the client's (see the top).
    let (snat_svc, snat_client_port) = snat_identity(CLIENT, 100..1000);
    let state = state
        .with_snat_service(
            udp_gw(snat_svc),
            vec![WeightedBackend {
                endpoint: gw(snat_svc).into(),
                weight: 1,
            }],
        )
        .with_snat_service(
            udp_gw(55),
            [B1, B2, B3]
                .iter()
                .flat_map(|&b| {
                    (0..SNAT_BACKENDS / 3).map(move |i| WeightedBackend {
                        endpoint: sa(b, 9000 + i).into(),
                        weight: 1,
                    })
                })
                .collect(),
        )
        .with_snat_ports(vec![SNAT_PORTS]);
    let state = (0..RING as u16).fold(state, |state, i| {
        let next = SNAT_RING_BASE + (i + 1) % RING as u16;
        state.with_snat_service(
            udp_gw(SNAT_RING_BASE + i),
            vec![WeightedBackend {
                endpoint: gw(next).into(),
                weight: 1,
            }],
        )
    });
    let state = ipv6_services(state);
    t.dp.set_source_resolver(Box::new(|_| Some(CLIENT.into())));
    t.dp.apply(&state).expect("apply");
    // Both sides take XDP frames (what the daemon learns from the kernel's xdp-features):
    // forwarded packets take the redirect path.
    t.allow_redirect(&[fx.fx0, fx.fx1]);
    // A hot reply repeats on its own output, whose source MAC is the gateway's egress
    // MAC, not the backend's neighbour's: its later repetitions come "from elsewhere"
    // (`reply_spoofed`). Allowed here, they take the check's whole way (the
    // comparison, then the config slot) and are translated: hot reply figures are an
    // upper bound of the check's cost; cold ones (one run per packet) are exact.
    t.dp.set_reply_origin_any(true).expect("reply origin");

    let udp = |src, dst| Packet::udp(src, dst).payload(&[0u8; 18]).ttl(255);
    let syn = |src, dst| Packet::tcp(src, dst).flags(SYN).ttl(255);
    let established = udp(sa(CLIENT, 40000), gw(53))
        .macs(CLIENT_MAC, FX0_MAC)
        .frame();
    let reply = udp(gw(53), sa(CLIENT, 40000))
        .macs([2, 0, 0, 0, 0, 0x64], FX1_MAC)
        .frame();
    let miss = udp(sa(CLIENT, 40000), sa(Ipv4Addr::new(10, 250, 9, 9), 53))
        .macs(CLIENT_MAC, FX0_MAC)
        .frame();
    let snat_established = udp(sa(CLIENT, snat_client_port), gw(snat_svc))
        .macs(CLIENT_MAC, FX0_MAC)
        .frame();
    let snat_reply = udp(gw(snat_svc), sa(CLIENT, snat_client_port))
        .macs([2, 0, 0, 0, 0, 0x64], FX1_MAC)
        .frame();
    // A distinct client address and port per sample: every one is a new flow.
    let new_client = |n: usize| -> SocketAddrV4 {
        sa(
            Ipv4Addr::new(10, 250, 1, 100 + (n / 60000) as u8),
            1024 + (n % 60000) as u16,
        )
    };
    let udp6 = |src, dst| Packet6::udp(src, dst).payload(&[0u8; 18]).hop_limit(255);
    let syn6 = |src, dst| Packet6::tcp(src, dst).flags(SYN).hop_limit(255);
    let gw6 = |port| sa6(GW6, port);
    let established6 = udp6(sa6(CLIENT6, 40000), gw6(53))
        .macs(CLIENT_MAC, FX0_MAC)
        .frame();
    let reply6 = udp6(gw6(53), sa6(CLIENT6, 40000))
        .macs([2, 0, 0, 0, 0, 0x64], FX1_MAC)
        .frame();
    let miss6 = udp6(
        sa6(CLIENT6, 40000),
        sa6(Ipv6Addr::new(0xfd00, 0x250, 9, 0, 0, 0, 0, 0x909), 53),
    )
    .macs(CLIENT_MAC, FX0_MAC)
    .frame();
    let new_client6 = |n: usize| -> SocketAddrV6 {
        let host = 0x100 + (n / 60000) as u16;
        sa6(
            Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, host),
            1024 + (n % 60000) as u16,
        )
    };
    let ring_client6 = |host: u16, n: usize| {
        sa6(
            Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, host),
            1024 + n as u16,
        )
    };
    let (fx0, fx1) = (fx.fx0, fx.fx1);
    // A packet the same every sample: one flow's, or a miss's.
    let one = |name, key, ingress, verdict, frame: &Vec<u8>| {
        let frame = frame.clone();
        Case {
            name,
            key,
            program: PROGRAM,
            ingress,
            verdict,
            frame: Box::new(move |_| frame.clone()),
            hot_frame: None,
        }
    };
    // A new flow every sample, redirected; hot runs go to the next of a ring's services.
    fn new_flow(
        name: &'static str,
        key: &'static str,
        ingress: u32,
        cold: impl Fn(usize) -> Vec<u8> + Send + Sync + 'static,
        hot: impl Fn(usize) -> Vec<u8> + Send + Sync + 'static,
    ) -> Case {
        Case {
            name,
            key,
            program: PROGRAM,
            ingress,
            verdict: XDP_REDIRECT,
            frame: Box::new(cold),
            hot_frame: Some(Box::new(hot)),
        }
    }
    let ring4 = |host: u8, n: usize| sa(Ipv4Addr::new(10, 250, 1, host), 1024 + n as u16);
    let ack = |src, dst| Packet::tcp(src, dst).flags(ACK).ttl(255);
    let ack6 = |src, dst| Packet6::tcp(src, dst).flags(ACK).hop_limit(255);
    // Clients of no other case: 60000 ports on each of two addresses.
    let client_of = |ips: &[IpAddr], n: usize| {
        std::net::SocketAddr::new(ips[(n / 60000) % 2], 1024 + (n % 60000) as u16)
    };
    let midflow_client = move |n| v4(client_of(&MIDFLOW_CLIENTS, n));
    let midflow_client6 = move |n| v6(client_of(&MIDFLOW_CLIENTS6, n));
    let reply_client = move |n| client_of(&REPLY_CLIENTS, n);
    let reply_client6 = move |n| client_of(&REPLY_CLIENTS6, n);
    // A reply from the backend Maglev maps the flow (client `n` → `service`) to.
    fn answer(
        backends: &[WeightedBackend],
        client: std::net::SocketAddr,
        service: std::net::SocketAddr,
    ) -> std::net::SocketAddr {
        maglev_pick(backends, client, service, proto::UDP).expect("a backend with weight")
    }
    let from_backend = |p: Packet| {
        let mac = mac_of(p.src);
        p.macs(mac, FX1_MAC).frame()
    };
    let from_backend6 = |p: Packet6| {
        let mac = mac_of6(p.src);
        p.macs(mac, FX1_MAC).frame()
    };
    // A reply from a ring service's address, as its predecessor's backend.
    let ring_reply = |p: Packet| p.macs([2, 0, 0, 0, 0, 0x64], FX1_MAC).frame();
    let ring_reply6 = |p: Packet6| p.macs([2, 0, 0, 0, 0, 0x64], FX1_MAC).frame();
    let reply_ring_client6 = move |n| ring_client6(0x204, n);
    let to_gw = |p: Packet| p.macs(CLIENT_MAC, FX0_MAC).frame();
    let to_gw6 = |p: Packet6| p.macs(CLIENT_MAC, FX0_MAC).frame();
    let cases = [
        Case {
            program: FLOOR_PROGRAM,
            ..one(
                "floor (empty XDP program)",
                "floor_ns",
                fx0,
                XDP_PASS,
                &established,
            )
        },
        one(
            "established flow (conntrack hit, DNAT, redirect)",
            "established_ns",
            fx0,
            XDP_REDIRECT,
            &established,
        ),
        one(
            "reply (reverse NAT, redirect)",
            "reply_ns",
            fx1,
            XDP_REDIRECT,
            &reply,
        ),
        one(
            "miss (not a service, passes untouched)",
            "miss_ns",
            fx0,
            XDP_PASS,
            &miss,
        ),
        new_flow(
            "new flow (Maglev, 1 conntrack insert, FIB, DNAT)",
            "new_flow_ns",
            fx0,
            move |n| to_gw(udp(new_client(n), gw(54))),
            move |n| to_gw(udp(ring4(200, n), gw(RING_BASE))),
        ),
        new_flow(
            "new TCP flow (SYN: no conntrack lookup, 1 insert)",
            "syn_new_flow_ns",
            fx0,
            move |n| to_gw(syn(new_client(n), gw(56))),
            move |n| to_gw(syn(ring4(203, n), gw(RING_BASE))),
        ),
        new_flow(
            "new flow over the flood guard (not recorded)",
            "flood_new_flow_ns",
            fx0,
            move |n| to_gw(udp(new_client(n), gw(54))),
            move |n| to_gw(udp(ring4(202, n), gw(RING_BASE))),
        ),
        new_flow(
            "midflow miss (TCP ACK, no entry: Maglev, 1 insert)",
            "midflow_miss_ns",
            fx0,
            move |n| to_gw(ack(midflow_client(n), gw(56))),
            move |n| to_gw(ack(ring4(204, n), gw(RING_BASE))),
        ),
        new_flow(
            "reply miss (no entry: Maglev match, 1 insert)",
            "reply_miss_ns",
            fx1,
            move |n| {
                let client = v4(reply_client(n));
                let backend = v4(answer(&udp54, client.into(), gw(54).into()));
                from_backend(udp(backend, client))
            },
            move |n| ring_reply(udp(gw(RING_BASE + 1), ring4(204, n))),
        ),
        one(
            "SNAT established flow (conntrack hit, DNAT+SNAT)",
            "snat_established_ns",
            fx0,
            XDP_REDIRECT,
            &snat_established,
        ),
        one(
            "SNAT reply (reverse NAT of both ends, redirect)",
            "snat_reply_ns",
            fx1,
            XDP_REDIRECT,
            &snat_reply,
        ),
        new_flow(
            "SNAT new flow (Maglev, port claim, 2 inserts, FIB)",
            "snat_new_flow_ns",
            fx0,
            move |n| to_gw(udp(new_client(n), gw(55))),
            move |n| to_gw(udp(ring4(201, n), gw(SNAT_RING_BASE))),
        ),
        one(
            "IPv6 established flow (conntrack hit, DNAT, redirect)",
            "v6_established_ns",
            fx0,
            XDP_REDIRECT,
            &established6,
        ),
        one(
            "IPv6 reply (reverse NAT, redirect)",
            "v6_reply_ns",
            fx1,
            XDP_REDIRECT,
            &reply6,
        ),
        one(
            "IPv6 miss (not a service, passes untouched)",
            "v6_miss_ns",
            fx0,
            XDP_PASS,
            &miss6,
        ),
        new_flow(
            "IPv6 new flow (Maglev, 1 conntrack insert, FIB, DNAT)",
            "v6_new_flow_ns",
            fx0,
            move |n| to_gw6(udp6(new_client6(n), gw6(54))),
            move |n| to_gw6(udp6(ring_client6(0x200, n), gw6(RING_BASE))),
        ),
        new_flow(
            "IPv6 new TCP flow (SYN: no conntrack lookup, 1 insert)",
            "v6_syn_new_flow_ns",
            fx0,
            move |n| to_gw6(syn6(new_client6(n), gw6(56))),
            move |n| to_gw6(syn6(ring_client6(0x203, n), gw6(RING_BASE))),
        ),
        new_flow(
            "IPv6 midflow miss (TCP ACK, no entry: Maglev, 1 insert)",
            "v6_midflow_miss_ns",
            fx0,
            move |n| to_gw6(ack6(midflow_client6(n), gw6(56))),
            move |n| to_gw6(ack6(ring_client6(0x204, n), gw6(RING_BASE))),
        ),
        new_flow(
            "IPv6 reply miss (no entry: Maglev match, 1 insert)",
            "v6_reply_miss_ns",
            fx1,
            move |n| {
                let client = v6(reply_client6(n));
                let backend = v6(answer(&backends6, client.into(), gw6(54).into()));
                from_backend6(udp6(backend, client))
            },
            move |n| ring_reply6(udp6(gw6(RING_BASE + 1), reply_ring_client6(n))),
        ),
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
        let (v, _) = run(
            &mut t.dp,
            PROGRAM,
            fx.fx0,
            &established6,
            1,
            &mut vec![0u8; 512],
        );
        assert_eq!(v, XDP_REDIRECT, "IPv6 established flow setup");
        let mut out = vec![0u8; 512];
        let (v, _) = run(&mut t.dp, PROGRAM, fx.fx0, &snat_established, 1, &mut out);
        assert_eq!(v, XDP_REDIRECT, "snat established flow setup");
        // Addresses and ports (Ethernet + IPv4 without options + UDP ports).
        assert_eq!(
            out[26..38],
            snat_established[26..38],
            "the snat identity flow leaves with its addresses and ports unchanged"
        );
        cases
            .iter()
            .map(|c| {
                if !selected(c.key) {
                    return (0, 0);
                }
                // Only the flood case runs over the new-flow limit (1 per second).
                let limit = u32::from(c.key == "flood_new_flow_ns");
                t.dp.set_new_flow_limit(limit).expect("new-flow limit");
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
        if !selected(case.key) {
            continue;
        }
        let (hot_over, cold_over) = (*hot as i64 - hot_floor, *cold as i64 - cold_floor);
        println!(
            "{:<52} {hot:>6} {hot_over:>+7} {cold:>6} {cold_over:>+7}",
            case.name
        );
        headline.push(format!("\"{}\":{}", case.key, hot));
    }
    // Each IPv6 case beside its IPv4 twin, over the floor, measured in this run.
    let over = |key: &str| {
        let i = cases.iter().position(|c| c.key == key)?;
        let (hot, cold) = results[i];
        selected(key).then_some((hot as i64 - hot_floor, cold as i64 - cold_floor))
    };
    println!("IPv6 beside IPv4, ns over the floor (hot / cold)");
    for case in cases.iter().filter(|c| c.key.starts_with("v6_")) {
        let (Some(v6), Some(v4)) = (over(case.key), over(&case.key[3..])) else {
            continue;
        };
        println!(
            "  {:<22} IPv6 {:>+6} / {:>+6}   IPv4 {:>+6} / {:>+6}",
            &case.key[3..case.key.len() - 3],
            v6.0,
            v6.1,
            v4.0,
            v4.1
        );
    }
    let c = t.dp.counters().expect("counters");
    println!(
        "counters: new_flow {} redirect {} kernel_forward_no_xdp_egress {}",
        c["new_flow"], c["redirect"], c["kernel_forward_no_xdp_egress"]
    );
    println!(
        "miss counters: ct_miss_midflow {} ct_miss_reply {} reply_untracked {}",
        c["ct_miss_midflow"], c["ct_miss_reply"], c["reply_untracked"]
    );
    println!(
        "snat counters: snat_new_flow {} snat_port_retry {} drop_snat_ports_exhausted {}",
        c["snat_new_flow"], c["snat_port_retry"], c["drop_snat_ports_exhausted"]
    );
    println!("{{{}}}", headline.join(","));
}
