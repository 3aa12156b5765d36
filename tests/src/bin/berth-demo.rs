//! `cargo xtask demo`: the XDP datapath sharing one gateway address between two teams,
//! in network namespaces on this machine, with real servers and clients. Cleans up
//! after itself.

use std::net::SocketAddrV4;

use berth::datapath::{AttachMode, DesiredState, Protocol, ServiceAddr, WeightedBackend};
use berth_tests::{
    topo::{backend_addr, Topology, DNS_PORT, GW, HTTP_PORT},
    xdp::TestDatapath,
};

fn main() {
    println!("Berth datapath demo: one gateway address shared by two teams, one port each.\n");
    println!("  client 10.251.1.2 ── gateway (XDP) ─┬─ backend 1  10.251.11.2  nginx    (team A)");
    println!("                                       ├─ backend 2  10.251.12.2  nginx    (team A)");
    println!("                                       └─ backend 3  10.251.13.2  dnsmasq  (team B)");
    println!("  gateway address {GW}: on no interface; only the XDP program answers it.\n");

    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let mut dp = TestDatapath::load();
    topo.gateway.enter(|| {
        for iface in &topo.gateway_ifaces {
            dp.dp
                .attach(iface, AttachMode::Auto)
                .unwrap_or_else(|e| panic!("attach {iface}: {e}"));
        }
    });
    let team_a = ServiceAddr {
        addr: GW,
        protocol: Protocol::Tcp,
        port: 30000,
    };
    let team_b = ServiceAddr {
        addr: GW,
        protocol: Protocol::Udp,
        port: 30001,
    };
    let web = |n| WeightedBackend {
        endpoint: SocketAddrV4::new(backend_addr(n), HTTP_PORT),
        weight: 1,
    };
    let dns = WeightedBackend {
        endpoint: SocketAddrV4::new(backend_addr(3), DNS_PORT),
        weight: 1,
    };
    let state = DesiredState::default()
        .with_service(team_a, vec![web(1), web(2)])
        .with_service(team_b, vec![dns]);
    dp.dp.apply(&state).expect("apply");

    println!("{:<8} {:<24} BACKENDS", "TEAM", "GATEWAY PORT");
    for (team, (svc, backends)) in ["A", "B"].iter().zip(&state.services) {
        let list: Vec<String> = backends
            .iter()
            .map(|b| format!("{} (weight {})", b.endpoint, b.weight))
            .collect();
        println!("{team:<8} {:<24} {}", svc.to_string(), list.join(", "));
    }

    println!("\nTeam A's clients: curl http://{GW}:30000/ (new connection each time)");
    for _ in 0..6 {
        let out = topo.client.exec(&[
            "curl",
            "-sS",
            "--max-time",
            "3",
            &format!("http://{GW}:30000/"),
        ]);
        println!("  -> {}", String::from_utf8_lossy(&out.stdout).trim());
    }
    println!("\nTeam B's clients: dig @{GW} -p 30001 whoami.berth.test");
    let out = topo.client.exec(&[
        "dig",
        "+short",
        "+time=2",
        "+tries=2",
        "-p",
        "30001",
        &format!("@{GW}"),
        "whoami.berth.test",
    ]);
    println!(
        "  -> {} (backend 3's dnsmasq answers 10.99.0.3)",
        String::from_utf8_lossy(&out.stdout).trim()
    );

    println!("\nPer-service counters from the XDP program:");
    for (svc, s) in dp.dp.service_stats().expect("stats") {
        println!(
            "  {svc:<22} flows {:>3}  to backends {:>3} pkts {:>6} B  replies {:>3} pkts {:>6} B",
            s.new_flows, s.packets, s.bytes, s.reply_packets, s.reply_bytes
        );
    }
    let counters = dp.dp.counters().expect("counters");
    let nonzero: Vec<String> = counters
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!("  verdicts: {}", nonzero.join(" "));
    println!("  (kernel_forward: first packets to a neighbour not yet resolved go through the kernel, which resolves it)");
    println!("\nCleaning up: servers stopped, namespaces and pinned maps removed.");
}
