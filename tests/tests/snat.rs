//! SNAT mode with real traffic, driven by `berth-dp-loader` (the daemon's own datapath
//! API) in the gateway namespace:
//! - backends whose default route is another router that also reaches the clients:
//!   router mode cannot serve them (their replies go around the gateway, from their own
//!   address), SNAT mode serves curl (nginx) and dig (dnsmasq), and a backend sees the
//!   gateway node's address as the source;
//! - a kept-alive TCP connection and a UDP stream through SNAT mode survive `kill -9`
//!   of the loader and its restart;
//! - a Kubernetes-like cluster: pods behind a bridge on two nodes, the gateway on node
//!   1, one SNAT service over pods of both nodes: 1000 flows split by weight, every
//!   reply from the gateway address and port, every pod sees node 1's address; TCP,
//!   DNS, ICMP errors and fragmented datagrams to pods of both nodes; pods as
//!   clients (hairpin included); a port pool too small drops and counts, never
//!   giving one port to two flows;
//! - a route switched between router and SNAT mode keeps the flows of either mode.
//!
//! Devices as the kernel makes them (veths with GRO off and checksum offload on,
//! Linux bridges), nothing tuned. Needs root.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket},
    ops::RangeInclusive,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use berth::datapath::{DesiredState, Protocol, ServiceAddr, WeightedBackend};
use berth_tests::{
    loader::{self, Pins},
    netns::{wait_until, Netns, Proc},
    topo::{
        bridge, enslave, http_request, veth, Flow, Servers, Topology, Veth, DNS_PORT, GW, HTTP_PORT,
    },
};
use gateway_common::Counter;

const TIMEOUT: Duration = Duration::from_secs(2);
/// The source ports SNAT flows get (no service port is among them).
const SNAT_PORTS: RangeInclusive<u16> = 40000..=60999;

fn svc(protocol: Protocol, port: u16) -> ServiceAddr {
    ServiceAddr {
        addr: GW.into(),
        protocol,
        port,
    }
}

fn gw(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(GW, port)
}

/// Every backend of `topo` on `port`, with the given weights (1 each if empty).
fn backends(topo: &Topology, port: u16, weights: &[u16]) -> Vec<WeightedBackend> {
    topo.backend_addrs
        .iter()
        .enumerate()
        .map(|(i, &a)| WeightedBackend {
            endpoint: SocketAddrV4::new(a, port).into(),
            weight: weights.get(i).copied().unwrap_or(1),
        })
        .collect()
}

/// The loader binary.
const LOADER: &str = env!("CARGO_BIN_EXE_berth-dp-loader");

// --- Backends that route around the gateway --------------------------------------------

/// The gateway node's address on the backends' LAN: what SNAT mode gives their flows.
const NODE_B: Ipv4Addr = Ipv4Addr::new(10, 251, 10, 1);
/// Router mode: TCP 80 and UDP 53. SNAT mode: TCP 81 and UDP 54. Same backends.
const ROUTED_TCP: u16 = 80;
const ROUTED_UDP: u16 = 53;
const SNAT_TCP: u16 = 81;
const SNAT_UDP: u16 = 54;

/// Two LANs on bridges in a switch namespace: the clients' (client .2, gateway .1,
/// router .254 of 10.251.1.0/24) and the backends' (gateway .1, router .254, backend
/// n at .1n of 10.251.10.0/24). The client's default route is the gateway, the
/// backends' the router: a backend answers a client directly, around the gateway.
///
/// ```text
///  client ─┬─ gateway (XDP on c0, b0) ─┬─ backend 1, 2
///          └──────── router ───────────┘
/// ```
fn routed_around(n: usize) -> Topology {
    let switch = Netns::new("sw");
    bridge(&switch, "lanc", &[]);
    bridge(&switch, "lanb", &[]);
    let client = Netns::new("cl");
    let gateway = Netns::new("gw");
    let router = Netns::new("rt");
    let plug = |port: &str, lan: &str, ns: &Netns, dev: &str, addr: &str, how: Veth| {
        veth(&switch, port, &[], ns, dev, &[addr], how);
        enslave(&switch, port, lan);
    };
    plug(
        "pc",
        "lanc",
        &client,
        "eth0",
        "10.251.1.2/24",
        Veth::default(),
    );
    plug(
        "pg0",
        "lanc",
        &gateway,
        "c0",
        "10.251.1.1/24",
        Veth::default(),
    );
    plug(
        "pg1",
        "lanb",
        &gateway,
        "b0",
        "10.251.10.1/24",
        Veth::default(),
    );
    plug(
        "pr0",
        "lanc",
        &router,
        "c0",
        "10.251.1.254/24",
        Veth::default(),
    );
    plug(
        "pr1",
        "lanb",
        &router,
        "b0",
        "10.251.10.254/24",
        Veth::default(),
    );
    client.ip(&["route", "add", "default", "via", "10.251.1.1"]);
    let mut backends = Vec::new();
    let mut backend_addrs = Vec::new();
    for i in 1..=n {
        let b = Netns::new("be");
        let addr = Ipv4Addr::new(10, 251, 10, 10 + i as u8);
        plug(
            &format!("pb{i}"),
            "lanb",
            &b,
            "eth0",
            &format!("{addr}/24"),
            Veth::default(),
        );
        b.ip(&["route", "add", "default", "via", "10.251.10.254"]);
        backends.push(b);
        backend_addrs.push(addr);
    }
    gateway.sysctl("net.ipv4.ip_forward", "1");
    router.sysctl("net.ipv4.ip_forward", "1");
    Topology {
        client,
        gateway,
        backends,
        gateway_ifaces: vec!["c0".into(), "b0".into()],
        backend_addrs,
        backend_addrs6: Vec::new(),
        others: vec![switch, router],
    }
}

/// `routed_around` with servers and the loader. Fields drop in order: the loader
/// (killed), the pins (programs detached), the servers, the namespaces.
struct Lab {
    loader: Proc,
    pins: Pins,
    _servers: Servers,
    topo: Topology,
}

impl Lab {
    fn start() -> Lab {
        let topo = routed_around(2);
        let servers = topo.start_servers();
        let pins = Pins::new();
        let state = DesiredState::default()
            .with_service(
                svc(Protocol::Tcp, ROUTED_TCP),
                backends(&topo, HTTP_PORT, &[]),
            )
            .with_service(
                svc(Protocol::Udp, ROUTED_UDP),
                backends(&topo, DNS_PORT, &[]),
            )
            .with_snat_service(
                svc(Protocol::Tcp, SNAT_TCP),
                backends(&topo, HTTP_PORT, &[]),
            )
            .with_snat_service(svc(Protocol::Udp, SNAT_UDP), backends(&topo, DNS_PORT, &[]))
            .with_snat_ports(vec![SNAT_PORTS]);
        pins.write_state(&state);
        let (loader, report) = loader::start(LOADER, &topo, &pins);
        assert!(
            report.contains("\"adopted\":0") && report.contains("\"added\":4"),
            "first start: {report}"
        );
        Lab {
            loader,
            pins,
            _servers: servers,
            topo,
        }
    }

    /// IPv4 packets the router has forwarded (`Ip: ForwDatagrams`): only backends'
    /// answers that go around the gateway take it.
    fn router_forwarded(&self) -> u64 {
        let out = self.topo.others[1].exec(&["cat", "/proc/net/snmp"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let mut ip = text.lines().filter(|l| l.starts_with("Ip:"));
        let (names, values) = (ip.next().unwrap_or(""), ip.next().unwrap_or(""));
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == "ForwDatagrams")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no Ip ForwDatagrams in the router's /proc/net/snmp: {text}"))
    }

    /// Runs a command on the client; returns its exit code and what it printed.
    fn client(&self, cmd: &[&str]) -> (Option<i32>, String) {
        let out = self.topo.client.try_exec(cmd);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    }
}

fn curl(port: u16) -> Vec<String> {
    ["curl", "-sS", "--max-time", "2"]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("http://{GW}:{port}/")])
        .collect()
}

fn dig(port: u16) -> Vec<String> {
    ["dig", "+short", "+time=1", "+tries=1", "-p"]
        .iter()
        .map(|s| s.to_string())
        .chain([
            port.to_string(),
            format!("@{GW}"),
            berth_tests::topo::WHOAMI.into(),
        ])
        .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn backends_routing_around_the_gateway_fail_in_router_mode_and_are_served_in_snat_mode() {
    let lab = Lab::start();

    // Router mode: the backend answers the client from its own address by way of its
    // default router; the client's TCP answers the unknown SYN-ACK with a reset and
    // curl never connects, dig sees a reply from an unexpected source. This is the
    // network SNAT mode exists for.
    let around = || lab.router_forwarded();
    let before = around();
    let (code, out) = lab.client(&strs(&curl(ROUTED_TCP)));
    assert_eq!(
        code,
        Some(28),
        "router mode with backends routing around the gateway: curl should time out, got {out}"
    );
    let went_around = around() - before;
    assert!(
        went_around > 0,
        "the backend's answers went to the client by way of the router: {went_around} packets"
    );
    let (code, out) = lab.client(&strs(&dig(ROUTED_UDP)));
    assert!(
        code != Some(0) || !out.contains("10.99.0."),
        "router mode: dig should get no answer from the gateway address, got {code:?}: {out}"
    );
    eprintln!("router mode, dig: {code:?}: {}", out.trim());

    eprintln!("router mode: {went_around} answers forwarded by the router");

    // SNAT mode: the same backends serve, and their answers come back to the gateway.
    let before = around();
    let (code, out) = lab.client(&strs(&curl(SNAT_TCP)));
    assert!(
        code == Some(0) && out.starts_with("backend-"),
        "curl through SNAT mode: {code:?}: {out}"
    );
    let (code, out) = lab.client(&strs(&dig(SNAT_UDP)));
    assert!(
        code == Some(0) && out.trim().starts_with("10.99.0."),
        "dig through SNAT mode: {code:?}: {out}"
    );

    assert_eq!(
        around(),
        before,
        "in SNAT mode no answer goes around the gateway"
    );

    // The backend sees the node's address, not the client's: a kept-alive connection
    // as `ss` on the backend shows it.
    let mut conn = lab.topo.client.enter(|| {
        let c = TcpStream::connect_timeout(&gw(SNAT_TCP).into(), TIMEOUT).expect("connect");
        c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        c
    });
    let body = http_request(&mut conn).expect("request through SNAT mode");
    let n: usize = body
        .trim()
        .strip_prefix("backend-")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected body {body:?}"));
    let peers = nginx_peers(&lab.topo.backends[n - 1]);
    assert_eq!(peers.len(), 1, "one connection on backend {n}: {peers:?}");
    let peer = peers[0];
    assert_eq!(
        *peer.ip(),
        NODE_B,
        "backend {n} sees the gateway node's address as the source, not the client's"
    );
    assert!(
        SNAT_PORTS.contains(&peer.port()),
        "and a port from the SNAT range: {peer}"
    );
    let new_flows = lab.pins.counter(Counter::SnatNewFlow);
    assert!(
        new_flows >= 3,
        "curl, dig and the kept-alive connection are SNAT flows: {new_flows}"
    );
    eprintln!(
        "snat_new_flow {new_flows}, tc_masq_translated {}, kernel_forward_no_xdp_egress {}",
        lab.pins.counter(Counter::TcMasq),
        lab.pins.counter(Counter::KernelNoXdpEgress)
    );
}

/// Sets an `AtomicBool` when dropped: stops a helper thread also when the test panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn a_kept_alive_connection_and_a_udp_stream_through_snat_mode_survive_kill_9_and_restart() {
    let mut lab = Lab::start();
    let (sent, answered, stop) = (AtomicU64::new(0), AtomicU64::new(0), AtomicBool::new(false));
    let client = &lab.topo.client;
    let mut conn = client.enter(|| {
        let c = TcpStream::connect_timeout(&gw(SNAT_TCP).into(), TIMEOUT).expect("connect");
        c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        c
    });
    let body = http_request(&mut conn).expect("first request on the kept-alive connection");
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        // A steady UDP stream on one flow, counted query by query.
        s.spawn(|| {
            client.enter(|| {
                let mut flow = Flow::new(gw(SNAT_UDP), TIMEOUT);
                while !stop.load(Ordering::Relaxed) {
                    sent.fetch_add(1, Ordering::Relaxed);
                    if flow.ask().is_some() {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    // Pacing, not synchronisation: about 150 queries a second.
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        });
        let progress = |what: &str| {
            let target = answered.load(Ordering::Relaxed) + 20;
            wait_until(
                &format!("the UDP stream to progress {what}"),
                Duration::from_secs(10),
                || answered.load(Ordering::Relaxed) >= target,
            );
        };
        progress("before the kill");
        // Two flows so far (the connection and the stream); neither gets a new port.
        let flows = lab.pins.counter(Counter::SnatNewFlow);
        assert_eq!(
            flows, 2,
            "one SNAT flow each for the connection and the stream"
        );

        lab.loader.kill(); // SIGKILL: no chance to clean up.
        progress("with no loader");
        assert_eq!(
            http_request(&mut conn).expect("request with the loader dead"),
            body
        );
        let (loader, report) = loader::start(LOADER, &lab.topo, &lab.pins);
        lab.loader = loader;
        assert!(
            report.contains("\"adopted\":4") && report.contains("\"unchanged\":4"),
            "the restart adopts the pinned maps: {report}"
        );
        progress("after the restart");
        assert_eq!(
            http_request(&mut conn).expect("request after the restart"),
            body,
            "same connection, same backend"
        );
        assert_eq!(
            lab.pins.counter(Counter::SnatNewFlow),
            flows,
            "both flows kept their node ports across the restart"
        );
    });
    let (sent, answered) = (sent.into_inner(), answered.into_inner());
    eprintln!("UDP stream: {answered} of {sent} answered");
    assert_eq!(
        answered,
        sent,
        "UDP queries lost across kill -9 and restart: {} of {sent}",
        sent - answered
    );
}

// --- A Kubernetes-like cluster -----------------------------------------------------------

/// The nodes' LAN, 10.251.2.0/24: node 1 .1, node 2 .2, the client .100.
const NODE1: Ipv4Addr = Ipv4Addr::new(10, 251, 2, 1);
const K8S_CLIENT: Ipv4Addr = Ipv4Addr::new(10, 251, 2, 100);
/// Pod `j` (1-based) of node `k` is 10.251.2k.1j; node k's cni0 is 10.251.2k.1.
fn pod_addr(node: u8, j: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 251, 20 + node, 10 + j)
}
/// The whoami port on every pod.
const WHOAMI_PORT: u16 = 7000;
/// Requests up to this long get a short whoami answer.
const WHOAMI_SMALL: usize = 64;
/// The SNAT service of the cluster.
const K8S_UDP: u16 = 7000;

/// Two nodes and a client on a LAN (a bridge in a switch namespace); on each node pods
/// behind bridge `cni0`, the node routing the other node's pod subnet via it. The
/// gateway runs on node 1 (`Topology::gateway`, on `eth0` and `cni0`); the backends are
/// the pods, node 1's first. Node 2 reaches the client directly: a pod of node 2
/// answering a client's address would reach it around the gateway.
fn cluster(pods_per_node: u8) -> Topology {
    let switch = Netns::new("sw");
    bridge(&switch, "lan", &[]);
    let client = Netns::new("cl");
    let node1 = Netns::new("n1");
    let node2 = Netns::new("n2");
    let plug = |port: &str, ns: &Netns, addr: &str, how: Veth| {
        veth(&switch, port, &[], ns, "eth0", &[addr], how);
        enslave(&switch, port, "lan");
    };
    plug("pc", &client, &format!("{K8S_CLIENT}/24"), Veth::default());
    plug("pn1", &node1, "10.251.2.1/24", Veth::default());
    plug("pn2", &node2, "10.251.2.2/24", Veth::default());
    client.ip(&["route", "add", &GW.to_string(), "via", "10.251.2.1"]);
    let mut backends = Vec::new();
    let mut backend_addrs = Vec::new();
    for (k, node, other) in [(1u8, &node1, "10.251.2.2"), (2, &node2, "10.251.2.1")] {
        bridge(node, "cni0", &[&format!("10.251.2{k}.1/24")]);
        let remote = if k == 1 { 2 } else { 1 };
        node.ip(&[
            "route",
            "add",
            &format!("10.251.2{remote}.0/24"),
            "via",
            other,
        ]);
        node.sysctl("net.ipv4.ip_forward", "1");
        for j in 1..=pods_per_node {
            let pod = Netns::new("pod");
            let addr = pod_addr(k, j);
            let port = format!("vp{j}");
            veth(
                node,
                &port,
                &[],
                &pod,
                "eth0",
                &[&format!("{addr}/24")],
                Veth::default(),
            );
            enslave(node, &port, "cni0");
            pod.ip(&["route", "add", "default", "via", &format!("10.251.2{k}.1")]);
            backends.push(pod);
            backend_addrs.push(addr);
        }
    }
    Topology {
        client,
        gateway: node1,
        backends,
        gateway_ifaces: vec!["eth0".into(), "cni0".into()],
        backend_addrs,
        backend_addrs6: Vec::new(),
        others: vec![switch, node2],
    }
}

/// UDP servers on the pods that answer each datagram with `pod-<n> <peer address>`:
/// who answered and what source it saw; a datagram longer than `WHOAMI_SMALL` gets
/// an answer as long, the rest after a newline filler. Stopped and joined on drop.
struct Whoami {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Whoami {
    fn start(topo: &Topology) -> Whoami {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = topo
            .backends
            .iter()
            .zip(&topo.backend_addrs)
            .enumerate()
            .map(|(i, (pod, &addr))| {
                // Bound inside the pod's namespace; the socket stays there.
                let sock = pod
                    .enter(|| UdpSocket::bind((addr, WHOAMI_PORT)))
                    .unwrap_or_else(|e| panic!("whoami on {addr}: {e}"));
                sock.set_read_timeout(Some(Duration::from_millis(100)))
                    .expect("timeout");
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 65536];
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok((n, peer)) = sock.recv_from(&mut buf) {
                            let mut reply = format!("pod-{} {peer}", i + 1).into_bytes();
                            if n > WHOAMI_SMALL {
                                reply.push(b'\n');
                                reply.resize(n, b'.');
                            }
                            let _ = sock.send_to(&reply, peer);
                        }
                    }
                })
            })
            .collect();
        Whoami { stop, threads }
    }
}

impl Drop for Whoami {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One new flow from `from` to the cluster's service: a datagram, sent again on the
/// same socket (the same flow) up to `tries` times while no reply comes within
/// `wait`. Returns where the reply came from and the reply.
fn whoami_flow(
    from: SocketAddrV4,
    tries: u32,
    wait: Duration,
) -> Result<(SocketAddr, String), String> {
    let sock = UdpSocket::bind(from).map_err(|e| format!("bind {from}: {e}"))?;
    sock.set_read_timeout(Some(wait))
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 128];
    for _ in 0..tries {
        sock.send_to(b"who", gw(K8S_UDP))
            .map_err(|e| format!("send from {from}: {e}"))?;
        if let Ok((n, peer)) = sock.recv_from(&mut buf) {
            return Ok((peer, String::from_utf8_lossy(&buf[..n]).to_string()));
        }
    }
    Err(format!("flow from {from}: no reply in {tries} tries"))
}

/// A cluster with whoami servers on the pods and the loader on node 1 serving one
/// SNAT route. Fields drop in order: the loader, the pins, the servers, the network.
struct ClusterLab {
    _loader: Proc,
    pins: Pins,
    _whoami: Whoami,
    topo: Topology,
}

impl ClusterLab {
    /// Starts whoami on `topo`'s pods and the loader with route `K8S_UDP` over
    /// `endpoints` (pod indices, 0-based, with weights) and node ports `ports`.
    fn start(topo: Topology, endpoints: &[(usize, u16)], ports: RangeInclusive<u16>) -> Self {
        let whoami = Whoami::start(&topo);
        let pins = Pins::new();
        let all = backends(&topo, WHOAMI_PORT, &[]);
        let chosen = endpoints
            .iter()
            .map(|&(i, weight)| WeightedBackend { weight, ..all[i] })
            .collect();
        pins.write_state(
            &DesiredState::default()
                .with_snat_service(svc(Protocol::Udp, K8S_UDP), chosen)
                .with_snat_ports(vec![ports]),
        );
        let (loader, report) = loader::start(LOADER, &topo, &pins);
        assert!(report.contains("\"added\":1"), "first start: {report}");
        ClusterLab {
            _loader: loader,
            pins,
            _whoami: whoami,
            topo,
        }
    }
}

#[test]
fn a_route_over_pods_on_two_nodes_splits_1000_snat_flows_by_weight_and_replies_from_the_gateway() {
    const FLOWS: u16 = 1000;
    // Pods 1, 2 on node 1 with weight 1; pods 3, 4 on node 2 with weight 3.
    let weights = [1u16, 1, 3, 3];
    let lab = ClusterLab::start(cluster(2), &[(0, 1), (1, 1), (2, 3), (3, 3)], SNAT_PORTS);
    let (topo, pins) = (&lab.topo, &lab.pins);

    let started = Instant::now();
    let replies: Vec<(SocketAddr, String)> = topo.client.enter(|| {
        (0..FLOWS)
            .map(|i| {
                whoami_flow(SocketAddrV4::new(K8S_CLIENT, 20000 + i), 2, TIMEOUT)
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect()
    });
    let elapsed = started.elapsed();

    // The node address each pod must see: node 1's cni0 address toward its own pods,
    // its LAN address toward node 2's.
    let node_source = |pod: usize| {
        if pod <= 2 {
            Ipv4Addr::new(10, 251, 21, 1)
        } else {
            NODE1
        }
    };
    let mut per_pod: BTreeMap<usize, u32> = BTreeMap::new();
    let mut ports: BTreeMap<usize, BTreeSet<u16>> = BTreeMap::new();
    for (i, (from, text)) in replies.iter().enumerate() {
        assert_eq!(
            *from,
            SocketAddr::V4(gw(K8S_UDP)),
            "flow {i}: the reply came from {from}, not the gateway address and port ({text})"
        );
        let (pod, peer) = text
            .strip_prefix("pod-")
            .and_then(|t| t.split_once(' '))
            .and_then(|(p, a)| Some((p.parse::<usize>().ok()?, a.parse::<SocketAddrV4>().ok()?)))
            .unwrap_or_else(|| panic!("flow {i}: unexpected reply {text:?}"));
        assert_eq!(
            *peer.ip(),
            node_source(pod),
            "flow {i}: pod {pod} saw {peer}, not node 1's address toward it"
        );
        assert!(
            SNAT_PORTS.contains(&peer.port()),
            "flow {i}: pod {pod} saw port {} outside the SNAT range",
            peer.port()
        );
        assert!(
            ports.entry(pod).or_default().insert(peer.port()),
            "flow {i}: pod {pod} saw node port {} twice",
            peer.port()
        );
        *per_pod.entry(pod).or_default() += 1;
    }
    let total: u32 = weights.iter().map(|&w| u32::from(w)).sum();
    for (pod, &w) in weights.iter().enumerate() {
        let got = per_pod.get(&(pod + 1)).copied().unwrap_or(0);
        let share = f64::from(got) / f64::from(FLOWS);
        let want = f64::from(w) / f64::from(total);
        assert!(
            (share - want).abs() <= 0.05,
            "pod {} (weight {w}) got {:.1}% of {FLOWS} flows, want {:.1}% ± 5: {per_pod:?}",
            pod + 1,
            share * 100.0,
            want * 100.0
        );
    }
    let counters: BTreeMap<&str, u64> = [
        Counter::SnatNewFlow,
        Counter::SnatPortRetry,
        Counter::DropSnatPortsExhausted,
        Counter::DropSnatNoSource,
        Counter::TcMasq,
        Counter::Redirect,
        Counter::Tx,
        Counter::KernelNoXdpEgress,
    ]
    .iter()
    .map(|&c| (c.name(), pins.counter(c)))
    .collect();
    eprintln!("{FLOWS} flows in {elapsed:?}: per pod {per_pod:?}, counters {counters:?}");
    assert_eq!(
        counters["snat_new_flow"],
        u64::from(FLOWS),
        "one SNAT flow per client flow: {counters:?}"
    );
    assert_eq!(counters["drop_snat_ports_exhausted"], 0, "{counters:?}");
    assert_eq!(counters["drop_snat_no_source"], 0, "{counters:?}");
}

#[test]
fn tcp_dns_and_icmp_errors_reach_pods_on_both_nodes_through_snat_mode() {
    // Pod 1 on node 1, pod 2 on node 2, both serving nginx and dnsmasq; a UDP port
    // nothing listens on, whose ICMP port-unreachable must come back translated.
    const CLOSED: u16 = 5999;
    let topo = cluster(1);
    let _servers = topo.start_servers();
    let pins = Pins::new();
    pins.write_state(
        &DesiredState::default()
            .with_snat_service(svc(Protocol::Tcp, 80), backends(&topo, HTTP_PORT, &[]))
            .with_snat_service(svc(Protocol::Udp, 53), backends(&topo, DNS_PORT, &[]))
            .with_snat_service(svc(Protocol::Udp, 54), backends(&topo, CLOSED, &[]))
            .with_snat_ports(vec![SNAT_PORTS]),
    );
    let (_loader, report) = loader::start(LOADER, &topo, &pins);
    assert!(report.contains("\"added\":3"), "first start: {report}");

    // New TCP connections reach both pods; each gets its page.
    let bodies: BTreeSet<String> = topo.client.enter(|| {
        (0..40)
            .map(|i| {
                berth_tests::topo::http_get(gw(80))
                    .unwrap_or_else(|e| panic!("connection {i} through SNAT mode: {e}"))
            })
            .collect()
    });
    assert_eq!(
        bodies,
        BTreeSet::from(["backend-1\n".to_string(), "backend-2\n".to_string()]),
        "40 connections reach the pods of both nodes"
    );
    // Ten megabytes from a pod, four times: the pods send partial checksums
    // (offload on), node 2's segments cross the LAN to node 1.
    for _ in 0..4 {
        let out = topo.client.exec(&[
            "curl",
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{size_download}",
            &format!("http://{GW}:80/big"),
        ]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            berth_tests::topo::BIG_FILE.to_string(),
            "the whole file through SNAT mode"
        );
    }
    // DNS through SNAT mode, answered from the gateway address (Flow ignores others).
    let markers: BTreeSet<Ipv4Addr> = topo.client.enter(|| {
        (0..20)
            .map(|i| {
                Flow::new(gw(53), TIMEOUT)
                    .ask()
                    .unwrap_or_else(|| panic!("DNS query {i}: no answer from {GW}:53"))
            })
            .collect()
    });
    assert_eq!(markers.len(), 2, "both pods answer DNS: {markers:?}");

    // A closed port: the pod's ICMP port-unreachable (to node 1's address and port)
    // reaches the client as one about its own flow to the gateway address.
    let icmp_before = pins.counter(Counter::IcmpTranslated) + pins.counter(Counter::TcIcmp);
    topo.client.enter(|| {
        for i in 0..10 {
            let sock = UdpSocket::bind((K8S_CLIENT, 21000 + i)).expect("bind");
            sock.connect(gw(54)).expect("connect");
            sock.set_read_timeout(Some(TIMEOUT)).expect("timeout");
            sock.send(b"anyone?").expect("send");
            let err = sock
                .recv(&mut [0u8; 16])
                .expect_err("nothing listens: no answer");
            assert_eq!(
                err.kind(),
                std::io::ErrorKind::ConnectionRefused,
                "flow {i}: the port-unreachable came back translated (got {err})"
            );
        }
    });
    let icmp = pins.counter(Counter::IcmpTranslated) + pins.counter(Counter::TcIcmp) - icmp_before;
    assert!(icmp >= 10, "ten ICMP errors translated, counted {icmp}");
    eprintln!(
        "cluster tcp/dns/icmp: icmp translated {icmp} (icmp_translated {}, tc_icmp_translated {}), snat_new_flow {}, tc_masq {}",
        pins.counter(Counter::IcmpTranslated),
        pins.counter(Counter::TcIcmp),
        pins.counter(Counter::SnatNewFlow),
        pins.counter(Counter::TcMasq)
    );
}

#[test]
fn a_port_pool_too_small_drops_and_counts_new_flows_but_never_shares_a_port() {
    // Four node ports for one pod: at most four flows toward it at a time.
    const POOL: RangeInclusive<u16> = 40000..=40003;
    const FLOWS: u16 = 20;
    let lab = ClusterLab::start(cluster(1), &[(0, 1)], POOL);
    let pins = &lab.pins;
    let results: Vec<Option<String>> = lab.topo.client.enter(|| {
        (0..FLOWS)
            .map(|i| {
                let from = SocketAddrV4::new(K8S_CLIENT, 22000 + i);
                whoami_flow(from, 1, Duration::from_millis(500))
                    .ok()
                    .map(|(_, text)| text)
            })
            .collect()
    });
    let answered: Vec<&String> = results.iter().flatten().collect();
    let ports: BTreeSet<&str> = answered
        .iter()
        .filter_map(|t| t.rsplit(':').next())
        .collect();
    let (new, exhausted) = (
        pins.counter(Counter::SnatNewFlow),
        pins.counter(Counter::DropSnatPortsExhausted),
    );
    eprintln!(
        "pool of 4: {} of {FLOWS} flows answered on ports {ports:?}; snat_new_flow {new}, \
         drop_snat_ports_exhausted {exhausted}, retries {}",
        answered.len(),
        pins.counter(Counter::SnatPortRetry)
    );
    assert!(
        (1..=4).contains(&answered.len()),
        "between one and four flows get a port: {answered:?}"
    );
    assert_eq!(
        ports.len(),
        answered.len(),
        "no port serves two flows: {answered:?}"
    );
    assert_eq!(
        new,
        answered.len() as u64,
        "snat_new_flow counts the flows that got a port"
    );
    assert_eq!(
        exhausted,
        u64::from(FLOWS) - new,
        "every other flow's packet is dropped and counted"
    );
}

#[test]
fn pods_reach_the_gateway_address_and_get_replies_from_it_even_from_themselves() {
    // Clients inside the cluster: every pod asks the route, whose endpoints include
    // itself and the pods beside it on the same bridge (hairpin through node 1).
    const PER_POD: u16 = 50;
    let topo = cluster(2);
    // Node 2 sends the gateway address to node 1, as to any service address.
    topo.others[1].ip(&["route", "add", &GW.to_string(), "via", "10.251.2.1"]);
    let lab = ClusterLab::start(topo, &[(0, 1), (1, 1), (2, 1), (3, 1)], SNAT_PORTS);
    let (topo, pins) = (&lab.topo, &lab.pins);
    let mut failures = Vec::new();
    let mut reached: BTreeMap<(usize, String), u32> = BTreeMap::new();
    let mut peers: BTreeSet<(String, String)> = BTreeSet::new();
    for (c, pod) in topo.backends.iter().enumerate() {
        let addr = topo.backend_addrs[c];
        let results: Vec<Result<(SocketAddr, String), String>> = pod.enter(|| {
            (0..PER_POD)
                .map(|i| {
                    whoami_flow(
                        SocketAddrV4::new(addr, 23000 + i),
                        1,
                        Duration::from_millis(500),
                    )
                })
                .collect()
        });
        for r in results {
            match r {
                Ok((from, text)) if from == SocketAddr::V4(gw(K8S_UDP)) => {
                    let (who, peer) = text.split_once(' ').unwrap_or_default();
                    *reached.entry((c + 1, who.to_string())).or_default() += 1;
                    // All pods use the same source ports: the node ports keep them apart.
                    if !peers.insert((who.to_string(), peer.to_string())) {
                        failures.push(format!("pod {}: {who} saw node port {peer} twice", c + 1));
                    }
                }
                Ok((from, text)) => {
                    failures.push(format!("pod {}: reply {text:?} from {from}", c + 1))
                }
                Err(e) => failures.push(format!("pod {}: {e}", c + 1)),
            }
        }
    }
    let counters: BTreeMap<&str, u64> = Counter::ALL
        .iter()
        .map(|&c| (c.name(), pins.counter(c)))
        .filter(|(_, v)| *v > 0)
        .collect();
    eprintln!("pods as clients: reached {reached:?}\nfailures {failures:?}\ncounters {counters:?}");
    assert!(
        failures.is_empty(),
        "{} failures: {failures:?}",
        failures.len()
    );
}

/// The peer addresses of the established connections to nginx on `backend`.
fn nginx_peers(backend: &Netns) -> Vec<SocketAddrV4> {
    let ss = backend.exec(&[
        "ss",
        "-Htn",
        "state",
        "established",
        &format!("( sport = :{HTTP_PORT} )"),
    ]);
    String::from_utf8_lossy(&ss.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect()
}

#[test]
fn switching_a_route_between_router_and_snat_mode_keeps_the_flows_of_either_mode() {
    // Backends that route through the gateway, where both modes work.
    let topo = Topology::new(1);
    let _servers = topo.start_servers();
    let pins = Pins::new();
    let state = |snat: bool| {
        let (tcp, udp) = (svc(Protocol::Tcp, 80), svc(Protocol::Udp, 53));
        let (web, dns) = (
            backends(&topo, HTTP_PORT, &[]),
            backends(&topo, DNS_PORT, &[]),
        );
        let s = DesiredState::default().with_snat_ports(vec![SNAT_PORTS]);
        if snat {
            s.with_snat_service(tcp, web).with_snat_service(udp, dns)
        } else {
            s.with_service(tcp, web).with_service(udp, dns)
        }
    };
    let client = berth_tests::topo::CLIENT;
    // A kept-alive connection and a UDP flow opened in the mode `snat`; checks the
    // source the backend sees.
    let open = |snat: bool| {
        let (mut conn, flow) = topo.client.enter(|| {
            let c = TcpStream::connect_timeout(&gw(80).into(), TIMEOUT).expect("connect");
            c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
            (c, Flow::new(gw(53), TIMEOUT))
        });
        http_request(&mut conn).expect("first request");
        let local = match conn.local_addr() {
            Ok(SocketAddr::V4(a)) => a,
            other => panic!("local address {other:?}"),
        };
        let peers = nginx_peers(&topo.backends[0]);
        let want = if snat {
            Ipv4Addr::new(10, 251, 11, 1)
        } else {
            client
        };
        assert!(
            peers
                .iter()
                .any(|p| *p.ip() == want && (snat || *p == local)),
            "a connection opened in {} mode shows as from {want} on the backend: {peers:?}",
            if snat { "SNAT" } else { "router" }
        );
        (conn, flow)
    };
    let check = |what: &str, conns: &mut [(TcpStream, Flow)]| {
        for (i, (conn, flow)) in conns.iter_mut().enumerate() {
            http_request(conn).unwrap_or_else(|e| panic!("{what}: connection {i}: {e}"));
            assert!(flow.ask().is_some(), "{what}: UDP flow {i} got no answer");
        }
    };

    pins.write_state(&state(true));
    let (mut loader, _) = loader::start(LOADER, &topo, &pins);
    let mut flows = vec![open(true)];
    loader.kill();
    pins.write_state(&state(false));
    let (mut loader, report) = loader::start(LOADER, &topo, &pins);
    assert!(
        report.contains("\"changed\":2"),
        "both services switch: {report}"
    );
    check("SNAT flows after the switch to router mode", &mut flows);
    flows.push(open(false));
    loader.kill();
    pins.write_state(&state(true));
    let (_loader, report) = loader::start(LOADER, &topo, &pins);
    assert!(
        report.contains("\"changed\":2"),
        "both switch back: {report}"
    );
    check(
        "flows of both modes after the switch back to SNAT mode",
        &mut flows,
    );
    flows.push(open(true));
    check("all flows", &mut flows);
}

#[test]
fn fragmented_datagrams_through_snat_mode_reach_pods_on_both_nodes_and_come_back() {
    // 4000 bytes each way: three fragments on 1500-byte links, from the client and
    // from the pods.
    const LEN: usize = 4000;
    let lab = ClusterLab::start(cluster(1), &[(0, 1), (1, 1)], SNAT_PORTS);
    let pods: BTreeSet<String> = lab.topo.client.enter(|| {
        (0..20u16)
            .map(|i| {
                let sock = UdpSocket::bind((K8S_CLIENT, 24000 + i)).expect("bind");
                sock.set_read_timeout(Some(TIMEOUT)).expect("timeout");
                sock.send_to(&[b'x'; LEN], gw(K8S_UDP)).expect("send");
                let mut buf = vec![0u8; 65536];
                let (n, from) = sock
                    .recv_from(&mut buf)
                    .unwrap_or_else(|e| panic!("flow {i}: no answer to {LEN} bytes: {e}"));
                assert_eq!(from, SocketAddr::V4(gw(K8S_UDP)), "flow {i}");
                assert_eq!(n, LEN, "flow {i}: the whole answer");
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                text.split(' ').next().unwrap_or_default().to_string()
            })
            .collect()
    });
    let fragments = lab.pins.counter(Counter::FragmentTranslated);
    eprintln!("fragments: pods {pods:?}, fragment_translated {fragments}");
    assert_eq!(pods.len(), 2, "both pods answered: {pods:?}");
    assert!(
        fragments >= 40,
        "each flow's non-first fragments follow it: {fragments}"
    );
}
