//! Backends come and go (issue 30): a TCP connection keeps its backend while the
//! backend is listed in any condition and, after it left its slice, until the
//! connection ends; a UDP flow moves to a live backend; BackendHealthPolicy checks take
//! a dead backend (its process stopped, or its namespace deleted) out of new flows and
//! put it back, and fail open. `berth run` with the
//! XDP datapath in network namespaces, nginx and dnsmasq as backends. Needs root.

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
    berth_tests::topo::fresh_answers(topo, web, n, TIMEOUT)
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

/// Health checks of both teams' Services, four times a second, two in a row to turn.
const POLICIES: &str = "\
apiVersion: berth.dev/v1alpha1
kind: BackendHealthPolicy
metadata: {name: web-health, namespace: team-a}
spec:
  targetRefs: [{group: '', kind: Service, name: web}]
  check: {type: HTTP, http: {path: /, expectedStatuses: [200]}}
  interval: 250ms
  timeout: 200ms
  healthyThreshold: 2
  unhealthyThreshold: 2
---
apiVersion: berth.dev/v1alpha1
kind: BackendHealthPolicy
metadata: {name: dns-health, namespace: team-b}
spec:
  targetRefs: [{kind: Service, name: dns}]
  # A DNS query for `x.` (any answer passes).
  check: {type: UDP, udp: {sendHex: '1234 0100 0001 0000 0000 0000 0178 00 0001 0001'}}
  interval: 250ms
  timeout: 200ms
  healthyThreshold: 2
  unhealthyThreshold: 2
";

/// `berth get backends` as JSON: (namespace, endpoint) → health.
fn health(topo: &Topology) -> Vec<(String, String, String)> {
    let text = topo
        .gateway
        .enter(|| berth::admin::get("127.0.0.1:9470", "/api/v1/backends"))
        .expect("/api/v1/backends");
    let view: berth::admin::backends::BackendsView = serde_json::from_str(&text).expect("rows");
    view.checks
        .into_iter()
        .map(|r| (r.namespace, r.endpoint, r.health))
        .collect()
}

/// The `berth.dev/Healthy` condition of BackendHealthPolicy `name`'s target in the
/// state document: (status, reason, message).
fn healthy_condition(topo: &Topology, name: &str) -> Option<(String, String, String)> {
    let kind = "BackendHealthPolicy";
    berth_tests::daemon::policy_conditions(&topo.gateway, kind, name, "berth.dev/Healthy")?
        .into_iter()
        .next()
}

/// Waits until policy `name`'s target says `reason` in the state document.
fn wait_healthy_reason(topo: &Topology, name: &str, reason: &str) {
    wait_until(
        &format!("{name}'s status to say {reason}"),
        Duration::from_secs(10),
        || healthy_condition(topo, name).is_some_and(|(_, r, _)| r == reason),
    );
}

/// Backend `n`'s firewall accepts what belongs to established connections first (the
/// connections opened before it is stopped, once tracked from their start: a
/// connection the firewall first sees mid-stream counts as new).
fn track_connections(topo: &Topology, n: usize) {
    topo.backends[n - 1].exec(&[
        "iptables",
        "-A",
        "INPUT",
        "-m",
        "conntrack",
        "--ctstate",
        "ESTABLISHED,RELATED",
        "-j",
        "ACCEPT",
    ]);
}

/// Backend `n` refuses new connections to its web port and answers its DNS port with
/// port unreachable (as a stopped process would); its established connections go on
/// (`track_connections`).
fn stop_backend(topo: &Topology, n: usize, stopped: bool) {
    let op = if stopped { "-A" } else { "-D" };
    let ns = &topo.backends[n - 1];
    ns.exec(&[
        "iptables",
        op,
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        "8080",
        "-m",
        "conntrack",
        "--ctstate",
        "NEW",
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    ]);
    ns.exec(&[
        "iptables", op, "INPUT", "-p", "udp", "--dport", "5353", "-j", "REJECT",
    ]);
}

/// Waits until backend 2 is checked unhealthy in both teams, then checks that new flows
/// avoid it: 20 new connections answered by backend 1, 20 new UDP flows by backend 3.
fn backend_2_takes_no_new_flows(topo: &Topology, daemon: &Daemon) {
    wait_until(
        "backend 2 checked unhealthy in both teams",
        Duration::from_secs(15),
        || {
            health(topo)
                .iter()
                .filter(|(_, e, h)| e.starts_with("10.251.12.2") && h == "unhealthy")
                .count()
                == 2
        },
    );
    wait_until(
        "the web route to take new flows on backend 1 only",
        Duration::from_secs(10),
        || web(daemon, topo).backends == 1,
    );
    let fresh = fresh_answers(topo, SocketAddrV4::new(GW, 30000), 20);
    assert!(
        fresh.iter().all(|b| b == "backend-1"),
        "new connections avoid backend 2: {fresh:?}"
    );
    let answers: Vec<usize> = (0..20)
        .filter_map(|_| {
            topo.client
                .enter(|| Flow::new(SocketAddrV4::new(GW, 30053), TIMEOUT).ask())
        })
        .map(backend_of_marker)
        .collect();
    assert!(
        answers.len() == 20 && answers.iter().all(|&b| b == 3),
        "every new UDP flow answered, by backend 3: {answers:?}"
    );
}

#[test]
fn health_checks_take_a_dead_backend_out_of_new_flows_and_back_and_fail_open() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = teams();
    std::fs::write(dirs.manifests.join("health.yaml"), POLICIES).expect("policies");
    for n in [1, 2] {
        track_connections(&topo, n);
    }
    let daemon = Daemon::start(&topo, &dirs);
    let web_at = SocketAddrV4::new(GW, 30000);
    let row = |ns: &str, endpoint: &str, health: &str| {
        (ns.to_string(), endpoint.to_string(), health.to_string())
    };
    let all_healthy = vec![
        row("team-a", "10.251.11.2:8080", "healthy"),
        row("team-a", "10.251.12.2:8080", "healthy"),
        row("team-b", "10.251.12.2:5353", "healthy"),
        row("team-b", "10.251.13.2:5353", "healthy"),
    ];
    wait_until(
        "every endpoint checked healthy",
        Duration::from_secs(10),
        || health(&topo) == all_healthy,
    );
    wait_healthy_reason(&topo, "web-health", "Healthy");
    // A keep-alive connection on backend 2, and UDP flows spread over 2 and 3.
    let mut kept = (0..32)
        .find_map(|_| {
            let mut c = topo
                .client
                .enter(|| TcpStream::connect_timeout(&web_at.into(), TIMEOUT).expect("connect"));
            c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
            let body = http_request(&mut c).expect("request");
            (body.trim() == "backend-2").then_some(c)
        })
        .expect("a connection on backend 2");

    // Backend 2 stops: unhealthy after two checks, no new flow goes there.
    stop_backend(&topo, 2, true);
    backend_2_takes_no_new_flows(&topo, &daemon);
    wait_healthy_reason(&topo, "web-health", "Unhealthy");
    let (status, _, message) = healthy_condition(&topo, "web-health").expect("condition");
    assert_eq!(status, "False");
    assert!(message.starts_with("1 of 2 endpoints pass"), "{message}");
    let again = http_request(&mut kept).expect("the established connection to backend 2");
    assert_eq!(again.trim(), "backend-2", "it keeps its backend");

    // Backend 2 is back: healthy after two checks, new flows reach it again.
    stop_backend(&topo, 2, false);
    wait_until("backend 2 healthy again", Duration::from_secs(10), || {
        health(&topo) == all_healthy
    });
    wait_until(
        "new connections to reach backend 2 again",
        Duration::from_secs(10),
        || {
            fresh_answers(&topo, web_at, 20)
                .iter()
                .any(|b| b == "backend-2")
        },
    );

    // Both web backends stop: every endpoint unhealthy, so all are served (fail open).
    stop_backend(&topo, 1, true);
    stop_backend(&topo, 2, true);
    wait_until(
        "the web Service to fail open",
        Duration::from_secs(10),
        || {
            health(&topo)
                .iter()
                .filter(|(ns, _, h)| ns == "team-a" && h == "unhealthy (served: fail open)")
                .count()
                == 2
        },
    );
    assert_eq!(web(&daemon, &topo).backends, 2, "both served");
    wait_healthy_reason(&topo, "web-health", "FailOpen");
    stop_backend(&topo, 1, false);
    stop_backend(&topo, 2, false);
    drop(daemon);
}

/// A backend's namespace deleted while its slices still list it (as a node's pods can
/// vanish): its link goes with it. Without a check a share of new flows would be lost
/// until the slices change; with BackendHealthPolicies it turns unhealthy after two
/// checks and new TCP and UDP flows avoid it.
#[test]
fn a_backend_whose_namespace_is_deleted_is_taken_out_by_its_health_checks() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = teams();
    std::fs::write(dirs.manifests.join("health.yaml"), POLICIES).expect("policies");
    let daemon = Daemon::start(&topo, &dirs);
    wait_until(
        "every endpoint checked healthy",
        Duration::from_secs(10),
        || {
            health(&topo)
                .iter()
                .filter(|(_, _, h)| h == "healthy")
                .count()
                == 4
        },
    );
    // Backend 2's namespace goes: its end of the link, and with it the pair.
    topo.backends[1].ip(&["link", "del", "eth0"]);
    backend_2_takes_no_new_flows(&topo, &daemon);
    drop(daemon);
}
