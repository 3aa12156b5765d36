//! Real traffic through the XDP gateway: namespaces joined by veth pairs, nginx and
//! dnsmasq from Debian on the backends, curl, dig and socket clients on the client.
//! Everything stays inside the namespaces these tests create. Needs root.

use std::{
    collections::BTreeMap,
    net::{SocketAddrV4, TcpStream},
    time::Duration,
};

use berth::datapath::{AttachMode, Attached, DesiredState, Protocol, ServiceAddr, WeightedBackend};
use berth_tests::{
    loader::{self, Pins},
    topo::{
        backend_addr, backend_of_marker, http_request, Flow, Servers, Topology, DNS_PORT, GW,
        HTTP_PORT,
    },
    xdp::TestDatapath,
};

const TIMEOUT: Duration = Duration::from_secs(2);

fn tcp_service() -> ServiceAddr {
    ServiceAddr {
        addr: GW.into(),
        protocol: Protocol::Tcp,
        port: 80,
    }
}

fn udp_service() -> ServiceAddr {
    ServiceAddr {
        addr: GW.into(),
        protocol: Protocol::Udp,
        port: 53,
    }
}

/// Both services over backends `1..=weights.len()` with the given weights.
fn state(weights: &[u16]) -> DesiredState {
    let backends = |port| {
        weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| WeightedBackend {
                endpoint: SocketAddrV4::new(backend_addr(i + 1), port).into(),
                weight,
            })
            .collect()
    };
    DesiredState::default()
        .with_service(tcp_service(), backends(HTTP_PORT))
        .with_service(udp_service(), backends(DNS_PORT))
}

struct Lab {
    // Field order is drop order: the datapath (pins, links), then servers, then namespaces.
    dp: TestDatapath,
    _servers: Servers,
    topo: Topology,
}

/// A topology with servers running and the gateway program attached in-process.
fn lab(weights: &[u16]) -> Lab {
    let topo = Topology::new(weights.len());
    let servers = topo.start_servers();
    let mut dp = TestDatapath::load();
    topo.gateway.enter(|| {
        for iface in &topo.gateway_ifaces {
            let how = dp
                .dp
                .attach(iface, AttachMode::Auto)
                .unwrap_or_else(|e| panic!("attach {iface}: {e}"));
            assert_eq!(
                how,
                Attached::New(AttachMode::Native),
                "veth supports native XDP"
            );
        }
    });
    dp.dp.apply(&state(weights)).expect("apply");
    Lab {
        dp,
        _servers: servers,
        topo,
    }
}

fn gw(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(GW, port)
}

#[test]
fn curl_and_dig_reach_backends_through_the_gateway_address() {
    let lab = lab(&[1, 1]);
    let out = lab
        .topo
        .client
        .exec(&["curl", "-sS", "--max-time", "3", "http://10.251.0.100:80/"]);
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        body.starts_with("backend-"),
        "curl through the gateway got {body:?}"
    );

    let out = lab.topo.client.exec(&[
        "dig",
        "+short",
        "+time=2",
        "+tries=2",
        "-p",
        "53",
        "@10.251.0.100",
        "whoami.berth.test",
    ]);
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        answer.trim().starts_with("10.99.0."),
        "dig through the gateway got {answer:?}"
    );

    // Replies must come from the gateway address and port: `Flow` only accepts those,
    // and a TCP handshake only completes with them.
    lab.topo.client.enter(|| {
        assert!(
            Flow::new(gw(53), TIMEOUT).ask().is_some(),
            "udp answer from 10.251.0.100:53"
        );
        let mut s = TcpStream::connect_timeout(&gw(80).into(), TIMEOUT)
            .expect("tcp connect to the gateway");
        assert_eq!(s.peer_addr().expect("peer").to_string(), "10.251.0.100:80");
        s.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        assert!(http_request(&mut s).expect("http").starts_with("backend-"));
    });

    let stats = lab.dp.dp.service_stats().expect("stats");
    assert!(
        stats[&tcp_service()].reply_packets > 0 && stats[&udp_service()].reply_packets > 0,
        "{stats:?}"
    );
    // A read asked to give way stops before its next batch, and says so.
    let interrupted = lab.dp.dp.service_stats_until(&|| true);
    assert!(interrupted.is_err(), "{interrupted:?}");
}

#[test]
fn a_flow_sticks_to_its_backend_and_new_flows_follow_the_weights() {
    let lab = lab(&[1, 3]);
    let (sticky, split) = lab.topo.client.enter(|| {
        let mut flow = Flow::new(gw(53), TIMEOUT);
        let sticky: Vec<_> = (0..50).map(|_| flow.ask().expect("answer")).collect();
        let mut split = BTreeMap::new();
        for _ in 0..4000 {
            let marker = Flow::new(gw(53), TIMEOUT).ask().expect("answer");
            *split.entry(backend_of_marker(marker)).or_insert(0u32) += 1;
        }
        (sticky, split)
    });
    assert!(
        sticky.iter().all(|m| *m == sticky[0]),
        "one 5-tuple, several backends: {sticky:?}"
    );
    let total: u32 = split.values().sum();
    let share = f64::from(split.get(&2).copied().unwrap_or(0)) / f64::from(total);
    assert!(
        (share - 0.75).abs() < 0.03,
        "weights 1:3, backend 2 got {:.1}% of {total} flows ({split:?})",
        share * 100.0
    );
}

#[test]
fn removing_a_backend_moves_only_its_own_flows() {
    let mut lab = lab(&[1, 1, 1]);
    let mut flows = lab.topo.client.enter(|| {
        (0..300)
            .map(|_| Flow::new(gw(53), TIMEOUT))
            .collect::<Vec<_>>()
    });
    let before: Vec<usize> = lab.topo.client.enter(|| {
        flows
            .iter_mut()
            .map(|f| backend_of_marker(f.ask().expect("answer")))
            .collect()
    });
    let on_third = before.iter().filter(|&&b| b == 3).count();
    assert!(on_third > 50, "only {on_third} of 300 flows on backend 3");

    lab.dp.dp.apply(&state(&[1, 1])).expect("remove backend 3");

    let after: Vec<usize> = lab.topo.client.enter(|| {
        flows
            .iter_mut()
            .map(|f| backend_of_marker(f.ask().expect("answer")))
            .collect()
    });
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        if *b == 3 {
            assert!(*a != 3, "flow {i} still reaches the removed backend");
        } else {
            assert_eq!(
                b,
                a,
                "flow {i} (port {}) moved from backend {b} to {a}",
                flows[i].port()
            );
        }
    }
}

/// The loader binary.
const LOADER: &str = env!("CARGO_BIN_EXE_berth-dp-loader");

#[test]
fn killing_and_restarting_the_loader_keeps_established_flows() {
    let topo = Topology::new(2);
    let _servers = topo.start_servers();
    let pins = Pins::new();
    pins.write_state(&state(&[1, 1]));

    let (mut loader, report) = loader::start(LOADER, &topo, &pins);
    assert!(
        report.contains("\"adopted\":0") && report.contains("\"added\":2"),
        "first start: {report}"
    );

    let (mut conn, first_body, mut flow, first_backend) = topo.client.enter(|| {
        let mut conn = TcpStream::connect_timeout(&gw(80).into(), TIMEOUT).expect("connect");
        conn.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        let body = http_request(&mut conn).expect("first request");
        let mut flow = Flow::new(gw(53), TIMEOUT);
        let backend = flow.ask().expect("udp answer");
        (conn, body, flow, backend)
    });

    loader.kill(); // SIGKILL: no chance to clean up.
                   // With no loader running, the pinned program keeps serving the established flows.
    assert_eq!(
        http_request(&mut conn).expect("request while the loader is down"),
        first_body
    );
    assert_eq!(
        flow.ask(),
        Some(first_backend),
        "udp flow while the loader is down"
    );

    let (_loader, report) = loader::start(LOADER, &topo, &pins);
    assert!(
        report.contains("\"adopted\":2") && report.contains("\"unchanged\":2"),
        "restart adopts the maps: {report}"
    );
    assert!(
        report.contains("\"c0\":\"replaced\""),
        "restart replaces the program in the pinned link: {report}"
    );
    for _ in 0..5 {
        assert_eq!(
            http_request(&mut conn).expect("request after the restart"),
            first_body,
            "same connection, same backend"
        );
        assert_eq!(
            flow.ask(),
            Some(first_backend),
            "udp flow after the restart"
        );
    }
}
