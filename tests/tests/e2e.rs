//! End to end: `berth run` with the XDP datapath in network namespaces, real servers
//! and clients. Needs root.

use std::{
    net::{SocketAddrV4, TcpStream},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Duration,
};

use berth_tests::{
    daemon::{metrics, sample, Daemon, Dirs},
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

/// A TCPRoute in `ns` to the team A web servers' Service copied into `ns`, optionally
/// asking for `port`.
fn web_route(ns: &str, port: Option<u16>, service: &str) -> String {
    let team_a = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/team-a.yaml"),
    )
    .expect("example");
    let mut text = team_a.replace("team-a", ns);
    if let Some(p) = port {
        text = text.replace(
            "    sectionName: tcp-pool\n",
            &format!("    sectionName: tcp-pool\n    port: {p}\n"),
        );
    }
    text.replace(
        "    - name: web\n      port: 80",
        &format!("    - name: {service}\n      port: 80"),
    )
}

/// `berth run`'s flag for the per-route series of /metrics these tests read.
const PER_ROUTE: &[&str] = &["--metrics-per-route"];

fn curl(topo: &Topology, port: u16) -> String {
    curl_url(topo, &format!("http://10.251.0.100:{port}/"))
}

fn row<'a>(rows: &'a [berth::admin::RouteRow], ns: &str) -> &'a berth::admin::RouteRow {
    rows.iter()
        .find(|r| r.namespace == ns)
        .unwrap_or_else(|| panic!("no route in {ns}: {rows:?}"))
}

#[test]
fn teams_get_distinct_ports_static_requests_are_granted_or_refused_without_disturbing_the_holder() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_examples();
    let daemon = Daemon::start_with(&topo.gateway, &topo.gateway_ifaces, &dirs, PER_ROUTE);
    let rows = daemon.routes(&topo.gateway);
    assert_eq!(
        (row(&rows, "team-a").port, row(&rows, "team-b").port),
        (Some(30000), Some(30053))
    );
    // Each port reaches only its team's backends.
    for _ in 0..10 {
        let body = curl(&topo, 30000);
        assert!(
            body == "backend-1" || body == "backend-2",
            "team A's port answered {body:?}"
        );
    }
    let dns = SocketAddrV4::new(GW, 30053);
    let answer = topo.client.enter(|| Flow::new(dns, TIMEOUT).ask());
    assert_eq!(
        answer,
        Some(std::net::Ipv4Addr::new(10, 99, 0, 3)),
        "team B's port reaches backend 3 only"
    );

    // Team C asks for a free port: granted and served. Team D asks for team A's: refused.
    std::fs::write(
        dirs.manifests.join("team-c.yaml"),
        web_route("team-c", Some(30100), "web"),
    )
    .expect("write");
    std::fs::write(
        dirs.manifests.join("team-d.yaml"),
        web_route("team-d", Some(30000), "web"),
    )
    .expect("write");
    wait_until(
        "teams C and D to be planned",
        Duration::from_secs(10),
        || {
            let rows = daemon.routes(&topo.gateway);
            rows.iter().any(|r| r.namespace == "team-c")
                && rows.iter().any(|r| r.namespace == "team-d")
        },
    );
    let rows = daemon.routes(&topo.gateway);
    assert_eq!(row(&rows, "team-c").port, Some(30100));
    assert!(
        row(&rows, "team-d").accepted.contains("PortUnavailable"),
        "{:?}",
        row(&rows, "team-d")
    );
    assert_eq!(
        row(&rows, "team-a").port,
        Some(30000),
        "the holder keeps its port"
    );
    assert!(curl(&topo, 30100).starts_with("backend-"));
    assert!(
        curl(&topo, 30000).starts_with("backend-"),
        "the holder is undisturbed"
    );

    // Per-route packets and active flows reach `berth get routes` and /metrics (read
    // from the kernel every few seconds); a route nobody used has none.
    wait_until(
        "team A's traffic to be counted",
        Duration::from_secs(15),
        || {
            let rows = daemon.routes(&topo.gateway);
            let a = row(&rows, "team-a");
            a.packets > 0 && a.active_flows > 0
        },
    );
    let rows = daemon.routes(&topo.gateway);
    assert!(
        row(&rows, "team-a").active_flows >= 11,
        "eleven curls, eleven flows: {:?}",
        row(&rows, "team-a")
    );
    assert_eq!(row(&rows, "team-d").active_flows, 0);
    let metrics = topo
        .gateway
        .enter(|| berth::admin::get("127.0.0.1:9470", "/metrics"))
        .expect("metrics");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("berth_route_active_flows{") && l.contains("namespace=\"team-a\""))
        .unwrap_or_else(|| panic!("no active flows of team A in /metrics:\n{metrics}"));
    let active: u64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a number");
    assert!(active >= 11, "{line}");
}

#[test]
fn bad_input_is_reported_and_other_traffic_is_unaffected() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_examples();
    let daemon = Daemon::start_with(&topo.gateway, &topo.gateway_ifaces, &dirs, PER_ROUTE);
    let dns = SocketAddrV4::new(GW, 30053);
    let mut flow = topo.client.enter(|| Flow::new(dns, TIMEOUT));
    assert!(flow.ask().is_some());

    // A route to a missing Service gets a port but no backends, and says why.
    std::fs::write(
        dirs.manifests.join("team-e.yaml"),
        web_route("team-e", None, "nope"),
    )
    .expect("write");
    // A broken file is reported; nothing else changes.
    std::fs::write(dirs.manifests.join("broken.yaml"), "kind: [\n").expect("write");
    wait_until("team E's route", Duration::from_secs(10), || {
        daemon
            .routes(&topo.gateway)
            .iter()
            .any(|r| r.namespace == "team-e")
    });
    let out = std::process::Command::new(berth_tests::daemon::berth_binary())
        .args(["check", "-o", "json", "--manifests"])
        .arg(&dirs.manifests)
        .output()
        .expect("check");
    assert!(!out.status.success(), "berth check reports the broken file");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("broken.yaml document 1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e = daemon
        .routes(&topo.gateway)
        .into_iter()
        .find(|r| r.namespace == "team-e")
        .expect("team-e");
    assert!(e.port.is_some() && e.backends == 0, "{e:?}");

    // An invalid GatewayConfig freezes the Gateway's assignments: traffic goes on.
    let gateway = std::fs::read_to_string(dirs.manifests.join("gateway.yaml")).expect("read");
    std::fs::write(
        dirs.manifests.join("gateway.yaml"),
        gateway.replace(
            "endPort: 30999\n    maxPortsPerNamespace",
            "endPort: 29999\n    maxPortsPerNamespace",
        ),
    )
    .expect("write");
    wait_until("the Gateway to be refused", Duration::from_secs(10), || {
        daemon
            .routes(&topo.gateway)
            .iter()
            .any(|r| r.accepted.contains("Pending"))
    });
    assert!(flow.ask().is_some(), "team B's flow is unaffected");
    assert!(
        curl(&topo, 30000).starts_with("backend-"),
        "team A's port is unaffected"
    );
}

#[test]
fn on_a_fixed_port_listener_only_the_oldest_route_ever_answers() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_examples();
    let single = |name: &str, addr: &str| {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: team-f}}\n\
             spec: {{ports: [{{name: http, port: 80, protocol: TCP}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {name}-1, namespace: team-f, labels: {{kubernetes.io/service-name: {name}}}}}\n\
             addressType: IPv4\nendpoints: [{{addresses: [{addr}]}}]\nports: [{{name: http, port: 8080, protocol: TCP}}]\n"
        )
    };
    let route = |name: &str, service: &str, created: &str| {
        format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
             metadata: {{name: {name}, namespace: team-f, creationTimestamp: \"{created}\"}}\n\
             spec:\n  parentRefs: [{{name: shared, namespace: infra, sectionName: tcp-8443}}]\n  \
             rules: [{{backendRefs: [{{name: {service}, port: 80}}]}}]\n"
        )
    };
    // A fixed listener next to the ranges, and two routes on it: the newer one is
    // accepted too, but only the older one's backend (backend 1) may answer.
    let gateway = std::fs::read_to_string(dirs.manifests.join("gateway.yaml")).expect("read");
    let fixed = "  - name: tcp-8443\n    protocol: TCP\n    port: 8443\n    allowedRoutes:\n      namespaces:\n        from: All\n---\napiVersion: berth.dev/v1alpha1";
    std::fs::write(
        dirs.manifests.join("gateway.yaml"),
        gateway.replacen("---\napiVersion: berth.dev/v1alpha1", fixed, 1),
    )
    .expect("write");
    let team_f = [
        single("one", "10.251.11.2"),
        single("two", "10.251.12.2"),
        route("newer", "two", "2025-06-01T00:00:00Z"),
        route("older", "one", "2025-01-01T00:00:00Z"),
    ];
    std::fs::write(dirs.manifests.join("team-f.yaml"), team_f.concat()).expect("write");
    let daemon = Daemon::start(&topo, &dirs);
    let rows = daemon.routes(&topo.gateway);
    let f: Vec<_> = rows.iter().filter(|r| r.namespace == "team-f").collect();
    assert_eq!(f.len(), 2, "{rows:?}");
    assert!(
        f.iter().all(|r| r.accepted.starts_with("True")),
        "both routes are accepted: {f:?}"
    );
    let answers: std::collections::BTreeSet<String> = (0..100).map(|_| curl(&topo, 8443)).collect();
    assert_eq!(
        answers.into_iter().collect::<Vec<_>>(),
        ["backend-1"],
        "only the oldest route's backend answers"
    );
}

fn set_team_a_endpoints(dirs: &Dirs, addrs: &[&str]) {
    let path = dirs.manifests.join("team-a.yaml");
    let text = std::fs::read_to_string(&path).expect("read");
    let start = text.find("endpoints:\n").expect("endpoints");
    let end = text[start..]
        .find("ports:\n")
        .map(|i| start + i)
        .expect("ports");
    let list: String = addrs
        .iter()
        .map(|a| format!("- addresses: [{a}]\n"))
        .collect();
    std::fs::write(
        &path,
        format!("{}endpoints:\n{list}{}", &text[..start], &text[end..]),
    )
    .expect("write");
}

#[test]
fn live_backend_and_route_changes_move_new_flows_and_keep_established_ones() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_examples();
    let daemon = Daemon::start(&topo, &dirs);
    let web = SocketAddrV4::new(GW, 30000);
    let connect = || {
        topo.client.enter(|| {
            let c = TcpStream::connect_timeout(&web.into(), TIMEOUT).expect("connect");
            c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
            c
        })
    };
    // Established connections, spread over backends 1 and 2.
    let mut conns: Vec<(TcpStream, String)> = (0..12)
        .map(|_| {
            let mut c = connect();
            let body = http_request(&mut c).expect("request").trim().to_string();
            (c, body)
        })
        .collect();
    let bodies: Vec<&str> = conns.iter().map(|(_, b)| b.as_str()).collect();
    assert!(
        bodies.contains(&"backend-1") && bodies.contains(&"backend-2"),
        "both backends in use: {bodies:?}"
    );

    // Backend 2 leaves, backend 3 joins.
    set_team_a_endpoints(&dirs, &["10.251.11.2", "10.251.13.2"]);
    wait_until("the new backend set", Duration::from_secs(10), || {
        (0..20)
            .map(|_| curl(&topo, 30000))
            .any(|b| b == "backend-3")
    });
    for (c, body) in conns.iter_mut().filter(|(_, b)| b == "backend-1") {
        let again = http_request(c).expect("established connection to a remaining backend");
        assert_eq!(again.trim(), body);
    }
    let fresh: std::collections::BTreeSet<String> = (0..30).map(|_| curl(&topo, 30000)).collect();
    assert!(
        !fresh.contains("backend-2"),
        "new flows avoid the removed backend: {fresh:?}"
    );

    // The route goes: its port stops answering, team B is untouched.
    std::fs::remove_file(dirs.manifests.join("team-a.yaml")).expect("remove");
    wait_until(
        "team A's port to stop answering",
        Duration::from_secs(10),
        || curl(&topo, 30000).is_empty(),
    );
    let dns = SocketAddrV4::new(GW, 30053);
    assert!(
        topo.client
            .enter(|| Flow::new(dns, TIMEOUT).ask())
            .is_some(),
        "team B still answers"
    );
    drop(daemon);
}

#[test]
fn a_full_range_and_a_quota_say_why_and_a_freed_port_goes_to_the_oldest_waiting_route() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_examples();
    let gateway = std::fs::read_to_string(dirs.manifests.join("gateway.yaml")).expect("read");
    let small = gateway
        .replace(
            "endPort: 30999\n    maxPortsPerNamespace: 50",
            "endPort: 30002\n    maxPortsPerNamespace: 1",
        )
        .replace("releaseCooldown: 300s", "releaseCooldown: 2s");
    std::fs::write(dirs.manifests.join("gateway.yaml"), small).expect("write");
    let daemon = Daemon::start(&topo, &dirs);
    // Explicit creation times: c and d are older than f, which is older than e.
    let with_time = |ns: &str, t: &str| {
        web_route(ns, None, "web").replacen(
            &format!("namespace: {ns}\n"),
            &format!("namespace: {ns}\n  creationTimestamp: \"{t}\"\n"),
            1,
        )
    };
    for (ns, t) in [
        ("team-c", "2024-01-01T00:00:00Z"),
        ("team-d", "2024-02-01T00:00:00Z"),
        ("team-f", "2025-01-01T00:00:00Z"),
        ("team-e", "2025-06-01T00:00:00Z"),
    ] {
        std::fs::write(dirs.manifests.join(format!("{ns}.yaml")), with_time(ns, t)).expect("write");
    }
    // The route alone: team A's Service and EndpointSlice are defined in team-a.yaml
    // already, and an object defined in two files is an error.
    let extra = web_route("team-a", None, "web")
        .split("---\n")
        .next()
        .expect("the route document")
        .replace(
            "name: web\n  namespace: team-a",
            "name: extra\n  namespace: team-a",
        );
    std::fs::write(dirs.manifests.join("team-a-extra.yaml"), extra).expect("write");
    wait_until("all routes planned", Duration::from_secs(10), || {
        daemon.routes(&topo.gateway).len() == 7
    });
    let rows = daemon.routes(&topo.gateway);
    let by = |ns: &str, name: &str| {
        rows.iter()
            .find(|r| r.namespace == ns && r.name == name)
            .cloned()
            .expect("route")
    };
    assert_eq!(by("team-a", "web").port, Some(30000));
    assert_eq!(by("team-c", "web").port, Some(30001));
    assert_eq!(by("team-d", "web").port, Some(30002));
    assert!(
        by("team-e", "web").accepted.contains("PortRangeExhausted"),
        "{:?}",
        by("team-e", "web")
    );
    assert!(
        by("team-f", "web").accepted.contains("PortRangeExhausted"),
        "{:?}",
        by("team-f", "web")
    );
    assert!(
        by("team-a", "extra").accepted.contains("QuotaExceeded"),
        "{:?}",
        by("team-a", "extra")
    );

    // Team C leaves: its port cools down, then goes to the oldest waiting route (f, not e).
    std::fs::remove_file(dirs.manifests.join("team-c.yaml")).expect("remove");
    wait_until("team C to go", Duration::from_secs(10), || {
        daemon
            .routes(&topo.gateway)
            .iter()
            .all(|r| r.namespace != "team-c")
    });
    wait_until(
        "team F to get the freed port",
        Duration::from_secs(10),
        || {
            daemon
                .routes(&topo.gateway)
                .iter()
                .any(|r| r.namespace == "team-f" && r.port == Some(30001))
        },
    );
    let rows = daemon.routes(&topo.gateway);
    let e = rows
        .iter()
        .find(|r| r.namespace == "team-e")
        .expect("team-e");
    assert!(
        e.accepted.contains("PortRangeExhausted"),
        "the newer waiting route still waits: {e:?}"
    );
    assert!(
        curl(&topo, 30001).starts_with("backend-"),
        "team F is served on its new port"
    );
}

/// What the client's `curl URL` prints (trimmed; empty when it fails).
fn curl_url(topo: &Topology, url: &str) -> String {
    let out = topo
        .client
        .try_exec(&["curl", "-sS", "--max-time", "3", url]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The examples, with `second` as the example Gateway's second address.
fn with_second_address(second: &str) -> Dirs {
    let dirs = Dirs::with_examples();
    dirs.edit_manifest(
        "gateway.yaml",
        "    value: 10.251.0.100\n",
        &format!("    value: 10.251.0.100\n  - type: IPAddress\n    value: {second}\n"),
    );
    dirs
}

#[test]
fn a_gateway_with_two_addresses_serves_each_route_on_both_and_counts_them_together() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = with_second_address("10.251.0.101");
    let daemon = Daemon::start_with(&topo.gateway, &topo.gateway_ifaces, &dirs, PER_ROUTE);
    let get = |addr: &str| curl_url(&topo, &format!("http://{addr}:30000/"));
    for addr in ["10.251.0.100", "10.251.0.101"] {
        wait_until(
            &format!("team A's web servers on {addr}"),
            Duration::from_secs(10),
            || get(addr).starts_with("backend-"),
        );
    }
    // Each address is its own service with its own counters; the route's row adds them.
    let reply_series = |addr: &str| {
        format!(
            "berth_route_packets_total{{kind=\"TCPRoute\",namespace=\"team-a\",name=\"web\",\
             address=\"{addr}\",port=\"30000\",direction=\"reply\"}}"
        )
    };
    wait_until(
        "team A's row to count the replies of both addresses",
        Duration::from_secs(10),
        || {
            // Read the row first: counters only grow, so a row equal to the sum read
            // after it is one that counted both.
            let row_replies = row(&daemon.routes(&topo.gateway), "team-a").reply_packets;
            let m = metrics(&topo.gateway);
            let first = sample(&m, &reply_series("10.251.0.100")).unwrap_or(0);
            let second = sample(&m, &reply_series("10.251.0.101")).unwrap_or(0);
            first > 0 && second > 0 && row_replies == first + second
        },
    );
}

#[test]
fn a_dual_stack_gateway_with_only_ipv4_endpoints_serves_ipv4_and_says_ipv6_gets_no_backend() {
    let topo = Topology::new(2);
    let _servers = topo.start_servers();
    let dirs = with_second_address("2001:db8:251::100");
    let daemon = Daemon::start(&topo, &dirs);
    // IPv4 is served exactly as on an IPv4-only Gateway.
    wait_until(
        "team A's web servers on IPv4",
        Duration::from_secs(10),
        || curl(&topo, 30000).starts_with("backend-"),
    );
    // The IPv6 services are programmed (nothing held back), and the route's row says
    // that IPv6 clients find no backend (the endpoints are IPv4 only).
    let web = row(&daemon.routes(&topo.gateway), "team-a").clone();
    let warning = web.warning.clone().unwrap_or_default();
    let want = "no IPv6 endpoints: IPv6 clients of TCP/[2001:db8:251::100]:30000 get no backend";
    assert!(warning.contains(want), "no {want:?} in {web:?}");
    assert!(!warning.contains("held back"), "{web:?}");
    assert_eq!(web.backends, 2, "the two IPv4 endpoints: {web:?}");
    let m = metrics(&topo.gateway);
    for family in ["ipv4", "ipv6"] {
        assert_eq!(
            sample(
                &m,
                &format!("berth_services_held_back{{family=\"{family}\"}}")
            ),
            Some(0),
            "no {family} service held back:\n{m}"
        );
    }
}
