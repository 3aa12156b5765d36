//! Backends come and go (issue 30): a TCP connection keeps its backend while the
//! backend is listed in any condition and, after it left its slice, until the
//! connection ends; a UDP flow moves to a live backend. `berth run` with the XDP
//! datapath in network namespaces, nginx and dnsmasq as backends. Needs root.

use std::{
    net::{SocketAddrV4, TcpStream},
    time::Duration,
};

use berth_tests::{
    daemon::{metrics, sample, Daemon, Dirs},
    netns::wait_until,
    topo::{backend_of_marker, http_request, Flow, Topology, GW},
};

const TIMEOUT: Duration = Duration::from_secs(2);

/// A scan of the conntrack (every 10 s), the linger after a connection ends (10 s) and
/// the next scan, with room.
const RELEASED_WITHIN: Duration = Duration::from_secs(45);

/// Team A's web route (TCP, backends 1 and 2) and team B's DNS route (UDP, backends 2
/// and 3): backend 2 serves both.
fn teams() -> Dirs {
    let dirs = Dirs::with_examples();
    dirs.edit_manifest(
        "team-b.yaml",
        "- addresses: [10.251.13.2]",
        "- addresses: [10.251.12.2]\n- addresses: [10.251.13.2]",
    );
    dirs
}

/// Sets the conditions of backend 2's endpoint in `file` (`None`: leaves the slice).
fn set_backend_2(dirs: &Dirs, file: &str, conditions: Option<&str>) {
    let path = dirs.manifests.join(file);
    let text = std::fs::read_to_string(&path).expect("read manifest");
    let start = text
        .find("- addresses: [10.251.12.2]")
        .expect("backend 2 listed");
    let rest = &text[start..];
    // The endpoint's lines: its address line and any indented lines below it.
    let len = rest
        .split_inclusive('\n')
        .enumerate()
        .take_while(|(i, l)| *i == 0 || l.starts_with("  "))
        .map(|(_, l)| l.len())
        .sum::<usize>();
    let endpoint = match conditions {
        Some(c) => format!("- addresses: [10.251.12.2]\n  conditions: {c}\n"),
        None => String::new(),
    };
    let text = format!("{}{endpoint}{}", &text[..start], &rest[len..]);
    std::fs::write(&path, text).expect("write manifest");
}

/// The web route's row in `berth get routes`.
fn web(daemon: &Daemon, topo: &Topology) -> berth::admin::RouteRow {
    daemon
        .routes(&topo.gateway)
        .into_iter()
        .find(|r| r.namespace == "team-a")
        .expect("team A's route")
}

/// Backends the answers of `n` new connections came from.
fn fresh_answers(topo: &Topology, web: SocketAddrV4, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            topo.client.enter(|| {
                let mut c = TcpStream::connect_timeout(&web.into(), TIMEOUT).expect("connect");
                c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
                http_request(&mut c)
                    .map(|b| b.trim().to_string())
                    .unwrap_or_default()
            })
        })
        .collect()
}

#[test]
fn a_backend_turning_not_ready_then_leaving_keeps_its_tcp_connections_and_udp_moves() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = teams();
    let daemon = Daemon::start(&topo, &dirs);
    let web_at = SocketAddrV4::new(GW, 30000);
    let dns_at = SocketAddrV4::new(GW, 30053);

    // Keep-alive connections over backends 1 and 2, and UDP flows, one on backend 2.
    let mut conns: Vec<(TcpStream, String)> = (0..16)
        .map(|_| {
            let mut c = topo.client.enter(|| {
                let c = TcpStream::connect_timeout(&web_at.into(), TIMEOUT).expect("connect");
                c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
                c
            });
            let body = http_request(&mut c).expect("request").trim().to_string();
            (c, body)
        })
        .collect();
    assert!(
        conns.iter().any(|(_, b)| b == "backend-2"),
        "some connection on backend 2: {:?}",
        conns.iter().map(|(_, b)| b).collect::<Vec<_>>()
    );
    let mut udp = (0..64)
        .map(|_| topo.client.enter(|| Flow::new(dns_at, TIMEOUT)))
        .find_map(|mut f| {
            let m = f.ask()?;
            (backend_of_marker(m) == 2).then_some(f)
        })
        .expect("a UDP flow on backend 2");

    // Backend 2 turns not ready in both slices (a failed readiness probe).
    set_backend_2(&dirs, "team-a.yaml", Some("{ready: false}"));
    set_backend_2(&dirs, "team-b.yaml", Some("{ready: false}"));
    wait_until(
        "the web route to have one backend taking new flows",
        Duration::from_secs(10),
        || web(&daemon, &topo).backends == 1,
    );
    for (c, body) in &mut conns {
        let again = http_request(c).unwrap_or_else(|e| {
            panic!("a connection to {body} broke when backend 2 turned not ready: {e}")
        });
        assert_eq!(again.trim(), body, "the connection kept its backend");
    }
    wait_until(
        "the UDP flow to move off the not-ready backend",
        Duration::from_secs(10),
        || udp.ask().is_some_and(|m| backend_of_marker(m) != 2),
    );
    let fresh = fresh_answers(&topo, web_at, 20);
    assert!(
        fresh.iter().all(|b| b == "backend-1"),
        "new connections go to the ready backend only: {fresh:?}"
    );

    // Backend 2 leaves the web route's slice: its connections stay until they end,
    // and say so.
    set_backend_2(&dirs, "team-a.yaml", None);
    let on_2 = conns.iter().filter(|(_, b)| b == "backend-2").count() as u64;
    wait_until(
        "the route to show its connections on the removed backend",
        RELEASED_WITHIN,
        || web(&daemon, &topo).removed_backend_flows == on_2,
    );
    for (c, body) in &mut conns {
        let again = http_request(c).unwrap_or_else(|e| {
            panic!("a connection to {body} broke when backend 2 left the slice: {e}")
        });
        assert_eq!(again.trim(), body, "the connection kept its backend");
    }
    let series =
        format!("berth_address_removed_backend_flows{{address=\"{GW}\",protocol=\"TCP\"}}");
    assert_eq!(
        sample(&metrics(&topo.gateway), &series),
        Some(on_2),
        "the metric counts them"
    );
    let fresh = fresh_answers(&topo, web_at, 20);
    assert!(
        fresh.iter().all(|b| b == "backend-1"),
        "new connections never go to the removed backend: {fresh:?}"
    );

    // The connections end (FIN both ways): the removed backend is released.
    conns.retain(|(_, b)| b != "backend-2");
    wait_until(
        "the removed backend to be released once its connections ended",
        RELEASED_WITHIN,
        || web(&daemon, &topo).removed_backend_flows == 0,
    );
    for (c, body) in &mut conns {
        let again = http_request(c).expect("a connection to backend 1");
        assert_eq!(again.trim(), body);
    }
    drop(daemon);
}
