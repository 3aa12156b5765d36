//! End to end: `berth run` with the XDP datapath in network namespaces, real servers
//! and clients. Needs root.

use std::{
    net::{SocketAddrV4, TcpStream},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Duration,
};

use berth_tests::{
    daemon::{Daemon, Dirs},
    netns::wait_until,
    topo::{http_request, Flow, Topology, GW},
};

const TIMEOUT: Duration = Duration::from_secs(2);

fn ports(rows: &[berth::admin::RouteRow]) -> Vec<(String, String, Option<u16>)> {
    let mut p: Vec<_> = rows
        .iter()
        .map(|r| (r.namespace.clone(), r.name.clone(), r.port))
        .collect();
    p.sort();
    p
}

#[test]
fn kill_9_and_restart_keeps_ports_an_open_tcp_connection_and_every_udp_packet() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_examples();
    let mut daemon = Daemon::start(&topo, &dirs);
    let before = ports(&daemon.routes(&topo.gateway));
    assert!(
        before.iter().all(|(_, _, p)| p.is_some()),
        "every example route has a port: {before:?}"
    );

    let web = SocketAddrV4::new(GW, 30000);
    let dns = SocketAddrV4::new(GW, 30053);
    let (sent, answered, stop) = (AtomicU64::new(0), AtomicU64::new(0), AtomicBool::new(false));
    std::thread::scope(|s| {
        // A steady UDP stream on one flow, counted query by query.
        s.spawn(|| {
            topo.client.enter(|| {
                let mut flow = Flow::new(dns, TIMEOUT);
                while !stop.load(Ordering::Relaxed) {
                    sent.fetch_add(1, Ordering::Relaxed);
                    if flow.ask().is_some() {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        });
        let mut conn = topo.client.enter(|| {
            let c = TcpStream::connect_timeout(&web.into(), TIMEOUT).expect("tcp connect");
            c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
            c
        });
        let body = http_request(&mut conn).expect("first request");
        let progress = |n: u64| {
            let target = answered.load(Ordering::Relaxed) + n;
            wait_until(
                "the UDP stream to progress",
                Duration::from_secs(10),
                || answered.load(Ordering::Relaxed) >= target,
            );
        };
        progress(20);

        daemon.kill9();
        progress(20); // the pinned program keeps serving with no daemon at all
        assert_eq!(
            http_request(&mut conn).expect("request with the daemon dead"),
            body
        );

        daemon = Daemon::start(&topo, &dirs);
        progress(20);
        assert_eq!(
            http_request(&mut conn).expect("request after the restart"),
            body,
            "same connection, same backend"
        );
        stop.store(true, Ordering::Relaxed);
    });
    let (sent, answered) = (sent.into_inner(), answered.into_inner());
    assert_eq!(
        answered,
        sent,
        "UDP queries lost across kill -9 and restart: {} of {sent}",
        sent - answered
    );
    assert_eq!(
        ports(&daemon.routes(&topo.gateway)),
        before,
        "same ports after the restart"
    );
}
