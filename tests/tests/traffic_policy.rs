//! RouteTrafficPolicy end to end (issue 30): `berth run` on the example manifests with
//! the XDP datapath in network namespaces, nginx and dnsmasq as backends. A UDP client
//! silent for 10 minutes keeps its SNAT port and backend under a 15-minute idle
//! timeout while one silent for 16 is forgotten (the silence is made by aging the
//! flows' entries in the pinned conntrack: the daemon's scan reads the same clock the
//! kernel program writes); session affinity keeps 100 connections of one client on one
//! backend; a policy with a bad value says so, naming the field, and disturbs nothing.
//! Needs root.

use std::{
    collections::BTreeSet,
    net::{SocketAddrV4, TcpStream},
    time::Duration,
};

use berth_tests::{
    daemon::{Daemon, Dirs},
    netns::{poll, wait_until},
    topo::{backend_of_marker, http_request, Flow, Topology, CLIENT, GW},
    xdp::Conntrack,
};
use gateway_common::{map_names, FlowKey, NAT_SRC};

const TIMEOUT: Duration = Duration::from_secs(2);

/// Team B's DNS route (UDP).
const DNS: SocketAddrV4 = SocketAddrV4::new(GW, 30053);

/// Team A's web route (TCP, backends 1 and 2).
const WEB: SocketAddrV4 = SocketAddrV4::new(GW, 30000);

const PATIENT: &str = "\
apiVersion: berth.dev/v1alpha1
kind: RouteTrafficPolicy
metadata: {name: patient, namespace: team-b}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: UDPRoute, name: dns}]
  udpIdleTimeout: 15m
";

const HASTY: &str = "\
apiVersion: berth.dev/v1alpha1
kind: RouteTrafficPolicy
metadata: {name: hasty, namespace: team-a}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: TCPRoute, name: web}]
  tcpIdleTimeout: -5s
";

const STICKY: &str = "\
apiVersion: berth.dev/v1alpha1
kind: RouteTrafficPolicy
metadata: {name: sticky, namespace: team-a}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: TCPRoute, name: web}]
  sessionAffinity: {type: ClientIP, timeout: 10m}
";

/// The example manifests in SNAT mode, with `policies` in a file of their own.
fn manifests(snat: bool, policies: &str) -> Dirs {
    let dirs = Dirs::with_examples();
    if snat {
        dirs.edit_manifest(
            "gateway.yaml",
            "  releaseCooldown: 300s\n",
            "  releaseCooldown: 300s\n  sourceNAT: true\n",
        );
    }
    std::fs::write(dirs.manifests.join("policies.yaml"), policies).expect("policies");
    dirs
}

/// The pinned IPv4 conntrack.
fn conntrack(dirs: &Dirs) -> Conntrack {
    let path = dirs.pins.join(map_names::CONNTRACK);
    aya::maps::MapData::from_pin(&path)
        .and_then(aya::maps::Map::from_map_data)
        .and_then(Conntrack::try_from)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
}

fn key(src: SocketAddrV4, dst: SocketAddrV4) -> FlowKey {
    FlowKey {
        src: u32::from_ne_bytes(src.ip().octets()),
        dst: u32::from_ne_bytes(dst.ip().octets()),
        sport: src.port().to_be(),
        dport: dst.port().to_be(),
        proto: 17,
        pad: [0; 3],
    }
}

/// The node port of `client`'s SNAT flow to the DNS route (from its reply entry), if
/// the flow is tracked.
fn node_port(ct: &Conntrack, client: SocketAddrV4) -> Option<u16> {
    ct.get(&key(client, DNS), 0).ok()?;
    ct.iter().filter_map(Result::ok).find_map(|(k, f)| {
        let ours = f.kind == NAT_SRC
            && f.peer_addr == u32::from_ne_bytes(client.ip().octets())
            && f.peer_port == client.port().to_be();
        ours.then(|| u16::from_be(k.dport))
    })
}

/// Makes `client`'s flow to the DNS route look silent for `by`: its forward entry's
/// last packet and its reply entry's last reply moved back (the clock the kernel
/// program writes and the daemon's scan reads, in units of 2^20 ns).
fn age(ct: &mut Conntrack, client: SocketAddrV4, by: Duration) {
    let units = (by.as_nanos() >> 20) as u32;
    let k = key(client, DNS);
    let mut forward = ct.get(&k, 0).expect("the forward entry");
    forward.seen = forward.seen.wrapping_sub(units);
    ct.insert(k, forward, 0).expect("age the forward entry");
    let reply = ct.iter().filter_map(Result::ok).find(|(_, f)| {
        f.kind == NAT_SRC
            && f.peer_addr == u32::from_ne_bytes(client.ip().octets())
            && f.peer_port == client.port().to_be()
    });
    let (rk, mut r) = reply.expect("the reply entry");
    if r.next_hop.checked_at != 0 {
        r.next_hop.checked_at = r.next_hop.checked_at.wrapping_sub(units);
    }
    ct.insert(rk, r, 0).expect("age the reply entry");
}

/// The state document's status of RouteTrafficPolicy `name`: per target, (status,
/// reason, message) of its Accepted condition.
fn policy_status(topo: &Topology, name: &str) -> Option<Vec<(String, String, String)>> {
    berth_tests::daemon::policy_conditions(&topo.gateway, "RouteTrafficPolicy", name, "Accepted")
}

#[test]
fn a_udp_client_silent_for_10_minutes_keeps_its_snat_port_under_a_15_minute_timeout() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = manifests(true, &format!("{PATIENT}---\n{HASTY}"));
    let daemon = Daemon::start(&topo, &dirs);
    wait_until("the policy to be accepted", Duration::from_secs(10), || {
        policy_status(&topo, "patient").is_some_and(|s| s.len() == 1 && s[0].0 == "True")
    });

    // A policy with a bad value says so and disturbs nothing.
    let hasty = policy_status(&topo, "hasty").expect("hasty's status");
    assert_eq!(hasty[0].0, "False", "{hasty:?}");
    assert_eq!(hasty[0].1, "Invalid", "{hasty:?}");
    assert!(
        hasty[0].2.contains("spec.tcpIdleTimeout \"-5s\""),
        "{hasty:?}"
    );
    let mut web = topo
        .client
        .enter(|| TcpStream::connect_timeout(&WEB.into(), TIMEOUT).expect("connect"));
    web.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    assert!(http_request(&mut web).is_ok(), "team A's route serves");

    // Two UDP clients; one silent for 10 minutes, one for 16.
    let quiet = SocketAddrV4::new(CLIENT, 45010);
    let gone = SocketAddrV4::new(CLIENT, 45016);
    let (mut quiet_flow, mut gone_flow) = topo.client.enter(|| {
        (
            Flow::bound(quiet, DNS, TIMEOUT),
            Flow::bound(gone, DNS, TIMEOUT),
        )
    });
    let backend = backend_of_marker(quiet_flow.ask().expect("an answer"));
    gone_flow.ask().expect("an answer");
    let mut ct = conntrack(&dirs);
    let port = node_port(&ct, quiet).expect("the quiet client's node port");
    age(&mut ct, quiet, Duration::from_secs(600));
    age(&mut ct, gone, Duration::from_secs(960));

    // The scan (every 10 s) forgets the flow silent past the timeout, and only it.
    wait_until(
        "the scan to forget the client silent for 16 minutes",
        Duration::from_secs(30),
        || node_port(&ct, gone).is_none(),
    );
    assert_eq!(
        node_port(&ct, quiet),
        Some(port),
        "the client silent for 10 minutes keeps its node port"
    );
    let again = quiet_flow.ask().expect("an answer after the silence");
    assert_eq!(backend_of_marker(again), backend, "and its backend");
    assert_eq!(
        node_port(&ct, quiet),
        Some(port),
        "the same port after it spoke"
    );
    drop(daemon);
}

/// Flows given to each of team A's web backends so far (`berth get backends`), by
/// endpoint.
fn web_flows(topo: &Topology) -> std::collections::BTreeMap<String, u64> {
    let text = topo
        .gateway
        .enter(|| berth::admin::get("127.0.0.1:9470", "/api/v1/backends"))
        .expect("/api/v1/backends");
    let view: berth::admin::backends::BackendsView = serde_json::from_str(&text).expect("view");
    view.backends
        .into_iter()
        .filter(|r| r.route == "TCPRoute/web")
        .inspect(|r| assert!(r.weight > 0 && r.state == "serving", "{r:?}"))
        .map(|r| (r.endpoint, r.new_flows))
        .collect()
}

/// The backends that answered `n` new connections of the client.
fn answers(topo: &Topology, n: usize) -> Vec<String> {
    berth_tests::topo::fresh_answers(topo, WEB, n, TIMEOUT)
}

#[test]
fn session_affinity_keeps_100_connections_of_a_client_on_one_backend() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = manifests(false, "");
    let daemon = Daemon::start(&topo, &dirs);
    // Every connection the test makes, to know when the counters have them all.
    let made = std::cell::Cell::new(0u64);
    let connect = |n: usize| {
        made.set(made.get() + n as u64);
        answers(&topo, n)
    };
    let spread: BTreeSet<String> = poll(
        "connections spread over both web backends",
        Duration::from_secs(10),
        || {
            let seen: BTreeSet<String> = connect(20).into_iter().collect();
            match seen.len() {
                2 => Ok(seen),
                _ => Err(format!("{seen:?}")),
            }
        },
    );
    assert_eq!(spread.len(), 2);

    std::fs::write(dirs.manifests.join("policies.yaml"), STICKY).expect("policy");
    wait_until("the policy to be accepted", Duration::from_secs(10), || {
        policy_status(&topo, "sticky").is_some_and(|s| s.len() == 1 && s[0].0 == "True")
    });
    // The backends' counters are read every 10 s: settled once they count every
    // connection made.
    let settled = || {
        poll("the backends' counters", Duration::from_secs(30), || {
            let flows = web_flows(&topo);
            match flows.values().sum::<u64>() == made.get() && flows.len() == 2 {
                true => Ok(flows),
                false => Err(format!("{flows:?}, {} connections made", made.get())),
            }
        })
    };
    let before = settled();
    let sticky = connect(100);
    let backends: BTreeSet<&String> = sticky.iter().collect();
    assert_eq!(
        backends.len(),
        1,
        "100 connections of one client, one backend: {backends:?}"
    );
    assert!(sticky[0].starts_with("backend-"), "{sticky:?}");
    // `berth get backends` counts them on that backend alone.
    let after = settled();
    let added: Vec<u64> = after.iter().map(|(e, n)| n - before[e]).collect();
    let mut sorted = added.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec![0, 100],
        "new flows per backend: {before:?} -> {after:?}"
    );
    drop(daemon);
}
