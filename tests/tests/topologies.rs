//! The same checks on the networks a gateway meets outside the lab: veths as the
//! kernel makes them, backends behind a bridge as on a Kubernetes node, one arm on a
//! switch, backends routed hops away, a gateway address inside the client's own
//! subnet, a small MTU on the way, and a restart on other interfaces. Each network is
//! built from namespaces with real nginx and dnsmasq backends and `berth run` in the
//! gateway namespace, on the example manifests (rewritten where a network needs other
//! addresses). Needs root.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    path::PathBuf,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Duration,
};

use aya::programs::{tc::TcAttachType, SchedClassifier};
use berth_tests::{
    daemon::{berth_binary, metrics, sample, uninstall, Daemon, Dirs},
    netns::{poll, unique, wait_until, Netns},
    topo::{
        self, backend_addr, backend_addr6, bridge, default_routes, dual_cidrs, dual_veth, enslave,
        forward_both, host_on_bridge, http_get, http_request, marker, marker6, mirror6, routes_via,
        strs, tcp_peers, veth, Flow, Servers, Topology, Veth, BIG_FILE, CLIENT, GW, GW6, HTTP_PORT,
        WHOAMI,
    },
};

const TIMEOUT: Duration = Duration::from_secs(2);
/// Team A's TCPRoute gets the first port of the range; team B's UDPRoute asks for 30053.
const WEB_PORT: u16 = 30000;
const DNS_PORT: u16 = 30053;
/// Team B's only endpoint is backend 3.
const DNS_BACKEND: usize = 3;

/// A network with servers and `berth run`. Fields drop in order: the daemon (killed),
/// its directories (pins removed: programs detached), the servers, the namespaces.
struct Lab {
    daemon: Daemon,
    dirs: Dirs,
    servers: Servers,
    topo: Topology,
    /// What `berth run` is given as `--interface`.
    interfaces: Vec<String>,
    /// The gateway address of the manifests the checks use (either family).
    gw: IpAddr,
}

impl Lab {
    /// Starts the servers of `topo` and `berth run` on `interfaces` with `dirs`.
    fn start(topo: Topology, interfaces: &[&str], dirs: Dirs, gw: impl Into<IpAddr>) -> Lab {
        let gw = gw.into();
        let servers = topo.start_servers();
        let interfaces: Vec<String> = interfaces.iter().map(|s| s.to_string()).collect();
        let daemon = Daemon::start_on(&topo.gateway, &interfaces, &dirs);
        Lab {
            daemon,
            dirs,
            servers,
            topo,
            interfaces,
            gw,
        }
    }

    fn web(&self) -> SocketAddr {
        SocketAddr::new(self.gw, WEB_PORT)
    }

    fn dns(&self) -> SocketAddr {
        SocketAddr::new(self.gw, DNS_PORT)
    }

    /// Team `ns`'s route row as `berth get routes -o json` shows it.
    fn counters_row(&self, ns: &str) -> serde_json::Value {
        let rows = self.daemon.route_values(&self.topo.gateway);
        rows.into_iter()
            .find(|r| r["namespace"] == ns)
            .unwrap_or_else(|| panic!("no route of {ns} in berth get routes"))
    }

    /// Team `ns`'s route counters as `berth get routes -o json` shows them.
    fn counters(&self, ns: &str) -> Counters {
        let row = self.counters_row(ns);
        Counters {
            packets: row["packets"].as_u64().unwrap_or(0),
            reply_packets: row["reply_packets"].as_u64(),
            kernel_packets: row["kernel_packets"].as_u64(),
            path: row["path"].as_str().map(str::to_string),
        }
    }

    /// Runs `curl ARGS URL` on the client; returns what `-w FORMAT` printed.
    fn curl(&self, args: &[&str]) -> String {
        self.try_curl(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `curl`, or what it said when it failed.
    fn try_curl(&self, args: &[&str]) -> Result<String, String> {
        self.try_client(&[&["curl", "-sS"], args].concat())
    }

    /// Runs `cmd` on the client; its output, trimmed, or what it said when it failed.
    fn try_client(&self, cmd: &[&str]) -> Result<String, String> {
        let out = self.topo.client.try_exec(cmd);
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "{cmd:?} failed ({}): {stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

/// A route's counters; the fields a datapath without the kernel path lacks are `None`.
#[derive(Debug, Clone)]
struct Counters {
    packets: u64,
    reply_packets: Option<u64>,
    kernel_packets: Option<u64>,
    path: Option<String>,
}

/// Fresh directories with the example manifests, every `from` replaced by `to`.
fn manifests(rewrites: &[(impl AsRef<str>, impl AsRef<str>)]) -> Dirs {
    let dirs = Dirs::with_examples();
    for f in ["gateway.yaml", "team-a.yaml", "team-b.yaml"] {
        let path = dirs.manifests.join(f);
        let text = std::fs::read_to_string(&path).expect("read manifest");
        std::fs::write(&path, rewrite(text, rewrites)).expect("write manifest");
    }
    dirs
}

/// `text` with every `from` replaced by `to`.
fn rewrite(mut text: String, rewrites: &[(impl AsRef<str>, impl AsRef<str>)]) -> String {
    for (from, to) in rewrites {
        text = text.replace(from.as_ref(), to.as_ref());
    }
    text
}

/// Sets an `AtomicBool` when dropped: stops a helper thread also when the test panics
/// (a scoped thread that never stops would hang the test instead of failing it).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The checks every network must pass: (a) HTTP through the gateway address, (b) DNS
/// over UDP answered from the gateway address and port, (c) a kept-alive TCP
/// connection and a UDP stream survive `kill -9` of the daemon and a restart, (d) the
/// routes' packet counters grow in both directions.
fn serves_tcp_and_udp_across_a_restart_and_counts_both_directions(lab: &mut Lab) {
    let before = (lab.counters("team-a"), lab.counters("team-b"));
    http_answers(lab);
    dns_answers(lab);
    connections_survive_kill_9_and_restart(lab);
    counters_grow(lab, &before.0, &before.1);
}

/// (a): a GET through the gateway's web port gets a backend's page.
fn http_answers(lab: &Lab) {
    let web = lab.web();
    let body = poll("HTTP through the gateway", Duration::from_secs(10), || {
        lab.topo
            .client
            .enter(|| http_get(web))
            .map_err(|e| format!("GET http://{web}/: {e}"))
    });
    assert!(
        body == "backend-1\n" || body == "backend-2\n",
        "team A's port answered {body:?}"
    );
}

/// (b): a DNS query to the gateway's DNS port is answered by backend 3, from the
/// gateway address and port (`Flow` ignores answers from anywhere else).
fn dns_answers(lab: &Lab) {
    let dns = lab.dns();
    let answer = poll("DNS through the gateway", Duration::from_secs(10), || {
        lab.topo
            .client
            .enter(|| Flow::new(dns, TIMEOUT).ask())
            .ok_or_else(|| format!("no answer to {WHOAMI} from {dns}"))
    });
    assert_eq!(
        answer,
        marker(DNS_BACKEND),
        "team B's port reaches backend 3"
    );
}

/// (c): as `e2e.rs`'s kill -9 test, on this network.
fn connections_survive_kill_9_and_restart(lab: &mut Lab) {
    let (web, dns) = (lab.web(), lab.dns());
    let Lab {
        daemon,
        dirs,
        topo,
        interfaces,
        ..
    } = lab;
    let (sent, answered, stop) = (AtomicU64::new(0), AtomicU64::new(0), AtomicBool::new(false));
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        // A steady UDP stream on one flow, counted query by query.
        s.spawn(|| {
            topo.client.enter(|| {
                let mut flow = Flow::new(dns, TIMEOUT);
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
        let mut conn = topo.client.enter(|| {
            let c = TcpStream::connect_timeout(&web, TIMEOUT).expect("tcp connect");
            c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
            c
        });
        let body = http_request(&mut conn).expect("first request on the kept-alive connection");
        let progress = |what: &str| {
            let target = answered.load(Ordering::Relaxed) + 20;
            wait_until(
                &format!("the UDP stream to progress {what}"),
                Duration::from_secs(10),
                || answered.load(Ordering::Relaxed) >= target,
            );
        };
        progress("before the kill");
        daemon.kill9();
        progress("with no daemon");
        assert_eq!(
            http_request(&mut conn).expect("request with the daemon dead"),
            body
        );
        *daemon = Daemon::start_on(&topo.gateway, interfaces, dirs);
        progress("after the restart");
        assert_eq!(
            http_request(&mut conn).expect("request after the restart"),
            body,
            "same connection, same backend"
        );
    });
    let (sent, answered) = (sent.into_inner(), answered.into_inner());
    assert_eq!(
        answered,
        sent,
        "UDP queries lost across kill -9 and restart: {} of {sent}",
        sent - answered
    );
}

/// (d): both routes' `packets` and `reply_packets` grew since `a` and `b`.
fn counters_grow(lab: &Lab, a: &Counters, b: &Counters) {
    for (ns, before) in [("team-a", a), ("team-b", b)] {
        poll(
            &format!("{ns}'s counters to grow"),
            Duration::from_secs(20),
            || {
                let now = lab.counters(ns);
                let Some(replies) = now.reply_packets else {
                    panic!("{ns}'s route row has no reply_packets (berth older than the contract): {now:?}");
                };
                if now.packets > before.packets && replies > before.reply_packets.unwrap_or(0) {
                    Ok(())
                } else {
                    Err(format!("before {before:?}, now {now:?}"))
                }
            },
        );
    }
}

/// Polls until both routes' rows name the path of their packets on default veths: the
/// replies arrive where XDP does not run and the kernel forwards them (translated by
/// TC), the forward packets are sent by the TC hand-off.
fn rows_name_the_handoff(lab: &Lab) {
    const WHY: &str = "kernel: replies arrive where XDP does not run";
    for ns in ["team-a", "team-b"] {
        let c = poll(
            &format!("{ns}'s row to show the replies' kernel path"),
            Duration::from_secs(20),
            || {
                let c = lab.counters(ns);
                if c.kernel_packets.is_some_and(|k| k > 0)
                    && c.path.as_deref().is_some_and(|p| p.starts_with(WHY))
                {
                    return Ok(c);
                }
                Err(format!("{c:?}"))
            },
        );
        eprintln!("default veths through {}: {c:?}", lab.gw);
    }
}

#[test]
fn veths_with_the_kernels_defaults_are_served_by_the_tc_handoff_past_netfilter() {
    served_by_the_tc_handoff(Dirs::with_examples(), GW);
}

#[test]
fn ipv6_on_veths_with_the_kernels_defaults_is_served_by_the_tc_handoff() {
    served_by_the_tc_handoff(ipv6_manifests(), GW6);
}

/// On veths as the kernel makes them (they take no XDP frames; their peers are in the
/// backends' namespaces), the checks pass through `gw` of the manifests `dirs`; the
/// forward packets are sent by the TC hand-off (`tc_redirect` grows by at least team
/// B's stream) and never reach the kernel's forwarding path: a netfilter FORWARD rule
/// matching them counts (nearly) none, while its twin matching the replies, which the
/// kernel forwards, counts them all.
fn served_by_the_tc_handoff(dirs: Dirs, gw: impl Into<IpAddr>) {
    let gw = gw.into();
    let mut lab = lab_on(Topology::new(3), dirs, gw);
    let iptables = if gw.is_ipv4() {
        "iptables"
    } else {
        "ip6tables"
    };
    let backend: IpAddr = if gw.is_ipv4() {
        backend_addr(DNS_BACKEND).into()
    } else {
        backend_addr6(DNS_BACKEND).into()
    };
    let port = topo::DNS_PORT.to_string();
    let to_backend = ["-d", &backend.to_string(), "-p", "udp", "--dport", &port];
    let replies = ["-s", &backend.to_string(), "-p", "udp", "--sport", &port];
    for rule in [&to_backend, &replies] {
        let mut args = vec![iptables, "-w", "-I", "FORWARD"];
        args.extend(rule.iter());
        args.extend(["-j", "ACCEPT"]);
        let out = lab.topo.gateway.exec(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let before = datapath_counter(&lab, "tc_redirect");
    // A row's `packets` counts both directions.
    let forward = |c: &Counters| c.packets - c.reply_packets.unwrap_or(0);
    let b_before = forward(&lab.counters("team-b"));
    serves_tcp_and_udp_across_a_restart_and_counts_both_directions(&mut lab);
    let b = lab.counters("team-b");
    let handed = datapath_counter(&lab, "tc_redirect") - before;
    assert!(
        handed + 10 >= forward(&b) - b_before,
        "team B's {} forward packets were sent by TC, tc_redirect grew by {handed}",
        forward(&b) - b_before
    );
    let counts = forward_counts(&lab, iptables);
    let (forwarded, replied) = (counts[&to_backend.join(" ")], counts[&replies.join(" ")]);
    assert!(
        replied >= b.reply_packets.unwrap_or(0) / 2 && replied > 100,
        "the replies rule counts the replies the kernel forwards: {replied} of {b:?}"
    );
    assert!(
        forwarded <= 10,
        "the forward packets skip the kernel's forwarding path (netfilter saw {forwarded}, \
         a flow's first packets before its neighbour is resolved at most): {b:?}"
    );
    rows_name_the_handoff(&lab);
    nothing_lost(&lab);
}

/// The packet counts of the gateway's FORWARD rules (`iptables-save -c`), by the rule's
/// match as given to `-I` (its `-d`/`-s`, `-p`, `--dport`/`--sport` in that order).
fn forward_counts(lab: &Lab, iptables: &str) -> std::collections::BTreeMap<String, u64> {
    let out = lab.topo.gateway.exec(&[&format!("{iptables}-save"), "-c"]);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| {
            let (counts, rule) = l.strip_prefix('[')?.split_once("] -A FORWARD ")?;
            let packets = counts.split(':').next()?.parse().ok()?;
            let rule = rule
                .replace("/32", "")
                .replace("/128", "")
                .replace(" -m udp", "")
                .replace(" -j ACCEPT", "");
            Some((rule, packets))
        })
        .collect()
}

#[test]
fn veths_with_gro_are_served_by_xdp_redirects() {
    served_by_xdp_redirects(Dirs::with_examples(), GW);
}

#[test]
fn ipv6_on_veths_with_gro_is_served_by_xdp_redirects() {
    served_by_xdp_redirects(ipv6_manifests(), GW6);
}

/// On veths with GRO (they take frames XDP redirects into them), the checks pass
/// through `gw` of the manifests `dirs`, the redirect counter grows, and team B's
/// stream rides XDP.
fn served_by_xdp_redirects(dirs: Dirs, gw: impl Into<IpAddr>) {
    let mut lab = lab_on(Topology::with_gro(3), dirs, gw);
    let before = datapath_counter(&lab, "redirect");
    serves_tcp_and_udp_across_a_restart_and_counts_both_directions(&mut lab);
    counter_grows(&lab, "redirect", before);
    // Team B's stream is hundreds of packets on one flow: only a flow's first packets
    // (before the neighbour is known) may take the kernel's path.
    let b = lab.counters("team-b");
    assert!(
        b.kernel_packets.unwrap_or(u64::MAX) * 10 < b.packets,
        "an established flow rides XDP: {b:?}"
    );
    assert_eq!(b.path.as_deref(), Some("xdp"), "and the row says so: {b:?}");
    eprintln!(
        "with GRO through {}: team A {:?}, team B {b:?}",
        lab.gw,
        lab.counters("team-a")
    );
    nothing_lost(&lab);
}

/// The example endpoints moved to one subnet, 10.251.10.0/24 (backend n at .1n).
const BRIDGED: [(&str, &str); 3] = [
    ("10.251.11.2", "10.251.10.11"),
    ("10.251.12.2", "10.251.10.12"),
    ("10.251.13.2", "10.251.10.13"),
];

/// The bridged backends (`topo::bridged`) of `BRIDGED`, sending partial checksums.
fn bridged() -> Topology {
    let addrs: Vec<Ipv4Addr> = BRIDGED
        .iter()
        .map(|(_, a)| a.parse().expect("address"))
        .collect();
    topo::bridged(&addrs, Veth::default())
}

#[test]
fn backends_behind_a_bridge_sending_partial_checksums_are_served_with_the_program_on_the_client_side(
) {
    let mut lab = Lab::start(bridged(), &["c0"], manifests(&BRIDGED), GW);
    let before = datapath_counter(&lab, "tc_bridge_port");
    let br0_before = tx_packets(&lab, "br0");
    // A row's `packets` counts both directions.
    let forward = |c: &Counters| c.packets - c.reply_packets.unwrap_or(0);
    let b_before = forward(&lab.counters("team-b"));
    serves_tcp_and_udp_across_a_restart_and_counts_both_directions(&mut lab);
    // The bridge takes no XDP frames: the forward packets are sent by the hand-off
    // program on c0's ingress, into the bridge port that holds the backend's MAC.
    let sent = forward(&lab.counters("team-b")) - b_before;
    let into_ports = datapath_counter(&lab, "tc_bridge_port") - before;
    assert!(
        into_ports + 10 >= sent,
        "team B's {sent} forward packets were sent into bridge ports, tc_bridge_port grew \
         by {into_ports}"
    );
    let through_br0 = tx_packets(&lab, "br0") - br0_before;
    assert!(
        through_br0 * 10 < sent,
        "the forward packets skip the bridge: br0 sent {through_br0} packets of {sent}"
    );
    nothing_lost(&lab);
}

/// The packets `iface` of the gateway's namespace has sent (its statistics).
fn tx_packets(lab: &Lab, iface: &str) -> u64 {
    let path = format!("/sys/class/net/{iface}/statistics/tx_packets");
    let out = lab.topo.gateway.exec(&["cat", &path]);
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {e}: {out:?}"))
}

#[test]
fn backends_behind_a_bridge_sending_partial_checksums_are_served_with_the_program_on_the_bridge_too(
) {
    let mut lab = Lab::start(bridged(), &["c0", "br0"], manifests(&BRIDGED), GW);
    serves_tcp_and_udp_across_a_restart_and_counts_both_directions(&mut lab);
}

#[test]
fn over_ipv6_backends_behind_a_bridge_sending_partial_checksums_are_served() {
    for interfaces in [&["c0"][..], &["c0", "br0"]] {
        let dirs = manifests(&ipv6_rewrites_moving(&BRIDGED));
        let mut lab = Lab::start(bridged(), interfaces, dirs, GW6);
        serves_tcp_and_udp_across_a_restart_and_counts_both_directions(&mut lab);
        nothing_lost(&lab);
    }
}

/// One arm: client, gateway and backends each with one veth into bridge `sw0` of a
/// switch namespace. The gateway's one interface holds the client's subnet and each
/// backend's; the backends route via the gateway, the client routes the gateway
/// address via it.
fn one_arm() -> Topology {
    let switch = Netns::new("sw");
    bridge(&switch, "sw0", &[]);
    let client = Netns::new("cl");
    let gateway = Netns::new("gw");
    veth(
        &switch,
        "p0",
        &[],
        &client,
        "eth0",
        &strs(&dual_cidrs(&[CLIENT])),
        Veth::HOST_B,
    );
    let hop = |subnet: u8| Ipv4Addr::new(10, 251, subnet, 1);
    veth(
        &switch,
        "pg",
        &[],
        &gateway,
        "eth0",
        &strs(&dual_cidrs(&[hop(1), hop(11), hop(12), hop(13)])),
        Veth::default(),
    );
    enslave(&switch, "p0", "sw0");
    enslave(&switch, "pg", "sw0");
    client.ip(&["route", "add", &GW.to_string(), "via", &hop(1).to_string()]);
    client.ip(&[
        "-6",
        "route",
        "add",
        &GW6.to_string(),
        "via",
        &mirror6(hop(1)).to_string(),
    ]);
    let mut backends = Vec::new();
    for i in 1..=3 {
        let b = host_on_bridge(
            &switch,
            "sw0",
            &format!("p{i}"),
            &dual_cidrs(&[backend_addr(i)]),
        );
        default_routes(&b, hop(10 + i as u8));
        backends.push(b);
    }
    forward_both(&gateway);
    // ICMP redirects stay on (the kernel's default): `berth run` turns them off on its
    // interfaces, or the backends would be told to reach the client around the NAT.
    Topology {
        client,
        gateway,
        backends,
        gateway_ifaces: vec!["eth0".into()],
        backend_addrs: (1..=3).map(backend_addr).collect(),
        backend_addrs6: (1..=3).map(backend_addr6).collect(),
        others: vec![switch],
    }
}

#[test]
fn a_one_armed_gateway_on_the_clients_and_backends_segment_serves_them() {
    one_armed_serves(Dirs::with_examples(), GW.into());
}

#[test]
fn over_ipv6_a_one_armed_gateway_on_the_clients_and_backends_segment_serves_them() {
    one_armed_serves(ipv6_manifests(), GW6.into());
}

/// The one-armed network through `gw` of `dirs`: after a first request and query, no
/// backend has taken an ICMP redirect from the gateway (which would send its replies
/// to the client around the NAT), and the checks pass. IPv4's redirects are turned
/// off (`send_redirects`); IPv6 has no such switch, so the TC program drops the ones
/// the host sends, and counts them.
fn one_armed_serves(dirs: Dirs, gw: IpAddr) {
    let mut lab = Lab::start(one_arm(), &["eth0"], dirs, gw);
    http_answers(&lab);
    dns_answers(&lab);
    if gw.is_ipv6() {
        wait_until(
            "the host's ICMPv6 redirects counted as dropped",
            Duration::from_secs(5),
            || datapath_counter(&lab, "tc_icmp6_redirect_dropped") > 0,
        );
    }
    for ns in &lab.topo.backends {
        let out = ns.exec(&["nstat", "-asz", "IcmpInRedirects", "Icmp6InRedirects"]);
        let taken: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.split_whitespace().nth(1).is_some_and(|n| n != "0"))
            .map(str::to_string)
            .collect();
        assert!(
            taken.is_empty(),
            "{} took ICMP redirects from the gateway, which send replies around the NAT: {taken:?}",
            ns.name
        );
    }
    serves_tcp_and_udp_across_a_restart_and_counts_both_directions(&mut lab);
    nothing_lost(&lab);
}

/// Backends two routed hops away: gateway ─r0─ router ─b1..b3─ backends. The link
/// between gateway and router has MTU `mtu`; every other link 1500.
fn routed(mtu: u32) -> Topology {
    let client = Netns::new("cl");
    let gateway = Netns::new("gw");
    let router = Netns::new("rt");
    let addr = |c: u8, d: u8| Ipv4Addr::new(10, 251, c, d);
    dual_veth(
        (&gateway, "c0", addr(1, 1)),
        (&client, "eth0", CLIENT),
        Veth::HOST_B,
    );
    default_routes(&client, addr(1, 1));
    dual_veth(
        (&gateway, "r0", addr(2, 1)),
        (&router, "eth0", addr(2, 2)),
        Veth::default().mtu(mtu),
    );
    default_routes(&router, addr(2, 1));
    let mut backends = Vec::new();
    for i in 1..=3 {
        let b = Netns::new("be");
        let subnet = 10 + i as u8;
        dual_veth(
            (&router, &format!("b{i}"), addr(subnet, 1)),
            (&b, "eth0", backend_addr(i)),
            Veth::HOST_B,
        );
        default_routes(&b, addr(subnet, 1));
        routes_via(&gateway, addr(subnet, 0), addr(2, 2));
        backends.push(b);
    }
    forward_both(&gateway);
    forward_both(&router);
    Topology {
        client,
        gateway,
        backends,
        gateway_ifaces: vec!["c0".into(), "r0".into()],
        backend_addrs: (1..=3).map(backend_addr).collect(),
        backend_addrs6: (1..=3).map(backend_addr6).collect(),
        others: vec![router],
    }
}

#[test]
fn backends_two_routed_hops_away_are_served() {
    let mut lab = lab_on(routed(1500), Dirs::with_examples(), GW);
    serves_tcp_and_udp_across_a_restart_and_counts_both_directions(&mut lab);
}

#[test]
fn a_gateway_address_in_the_clients_subnet_is_found_by_arp_and_closed_ports_refuse() {
    // The gateway's veth is 10.251.1.1/24, the client 10.251.1.2/24 with only its
    // connected route: it must ask ARP for the gateway address, which only the
    // gateway host's own copy of it (on berth0) can answer.
    let gw = Ipv4Addr::new(10, 251, 1, 100);
    let dirs = manifests(&[("10.251.0.100", "10.251.1.100")]);
    found_on_the_clients_link_and_closed_ports_refuse(gw.into(), dirs);
}

#[test]
fn an_ipv6_gateway_address_in_the_clients_subnet_is_found_by_neighbour_discovery() {
    // The same over IPv6: the client has only its connected route to fd00:251:1::/64
    // and must ask neighbour discovery for fd00:251:1::100.
    let gw = mirror6(Ipv4Addr::new(10, 251, 1, 100));
    let rewrites: Vec<(String, String)> = std::iter::once((GW.to_string(), gw.to_string()))
        .chain(ipv6_rewrites())
        .collect();
    found_on_the_clients_link_and_closed_ports_refuse(gw.into(), manifests(&rewrites));
}

/// The gateway address `gw` of `dirs` is in the client's subnet and the client has no
/// default route of its family: the client finds it as a neighbour (the gateway host
/// answers for its copy on berth0), a port no route holds refuses, and the checks pass.
fn found_on_the_clients_link_and_closed_ports_refuse(gw: IpAddr, dirs: Dirs) {
    let topo = Topology::new(3);
    let family = if gw.is_ipv4() { "-4" } else { "-6" };
    topo.client.ip(&[family, "route", "del", "default"]);
    let mut lab = lab_on(topo, dirs, gw);
    http_answers(&lab);
    let neigh = lab
        .topo
        .client
        .ip(&["neigh", "show", &gw.to_string(), "dev", "eth0"]);
    assert!(
        String::from_utf8_lossy(&neigh.stdout).contains("lladdr"),
        "the client learned the gateway address {gw} as a neighbour: {}",
        String::from_utf8_lossy(&neigh.stdout)
    );
    let closed = SocketAddr::new(gw, 31999);
    let err = lab
        .topo
        .client
        .enter(|| TcpStream::connect_timeout(&closed, TIMEOUT))
        .expect_err("no route holds port 31999: the connect must fail");
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "a port no route holds answers with a RST, not silence: {err}"
    );
    serves_tcp_and_udp_across_a_restart_and_counts_both_directions(&mut lab);
}

/// A file removed on drop.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A DNS query for `WHOAMI` padded to `len` bytes with an EDNS(0) padding option
/// (RFC 7830), so that the server answers it.
fn padded_query(id: u16, len: usize) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend(id.to_be_bytes());
    q.extend([0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1]);
    for label in WHOAMI.split('.') {
        q.push(label.len() as u8);
        q.extend(label.as_bytes());
    }
    q.extend([0, 0, 1, 0, 1]);
    // OPT: root name, type 41, UDP size 4096, TTL 0, then rdata = one padding option.
    let pad = len - q.len() - 11 - 4;
    q.extend([0, 0, 41, 0x10, 0, 0, 0, 0, 0]);
    q.extend(((pad + 4) as u16).to_be_bytes());
    q.extend(12u16.to_be_bytes());
    q.extend((pad as u16).to_be_bytes());
    q.extend(std::iter::repeat_n(0u8, pad));
    assert_eq!(q.len(), len);
    q
}

/// What became of a datagram too big for the path, sent with DF.
#[derive(Debug)]
enum BigDatagram {
    /// It got through (fragmented or not) and was answered.
    Answered,
    /// The sender learned the path MTU: a send failed with EMSGSIZE, or IP_MTU says so.
    PathMtu(u32),
}

/// Sends 1400-byte DNS queries with DF (IPv4) or without local fragmentation (IPv6)
/// from a socket connected to `server` until one is answered or the socket knows a
/// path MTU of at most 1280.
fn big_datagram_with_df(server: SocketAddr) -> BigDatagram {
    let (bind, level, discover, discover_do, mtu_opt) = match server {
        SocketAddr::V4(_) => (
            "0.0.0.0:0",
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
            libc::IP_MTU,
        ),
        SocketAddr::V6(_) => (
            "[::]:0",
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
            libc::IPV6_MTU,
        ),
    };
    let sock = UdpSocket::bind(bind).expect("bind");
    sock.connect(server).expect("connect");
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let fd = sock.as_raw_fd();
    // SAFETY: a valid socket, an int option and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            discover,
            std::ptr::from_ref(&discover_do).cast(),
            std::mem::size_of_val(&discover_do) as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "path MTU discovery on: {}",
        std::io::Error::last_os_error()
    );
    let path_mtu = || {
        let mut mtu: libc::c_int = 0;
        let mut len = std::mem::size_of_val(&mtu) as libc::socklen_t;
        // SAFETY: a valid socket, an int option, its buffer and size.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                level,
                mtu_opt,
                std::ptr::from_mut(&mut mtu).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "path MTU: {}", std::io::Error::last_os_error());
        mtu as u32
    };
    let too_big = |e: &std::io::Error| e.raw_os_error() == Some(libc::EMSGSIZE);
    let mut id = 0u16;
    poll(
        "a 1400-byte datagram with DF to get through or its sender to learn the path MTU",
        Duration::from_secs(15),
        || {
            id = id.wrapping_add(1);
            match sock.send(&padded_query(id, 1400)) {
                Err(e) if too_big(&e) => return Ok(BigDatagram::PathMtu(path_mtu())),
                Err(e) => return Err(format!("send: {e}")),
                Ok(_) => {}
            }
            let mut buf = [0u8; 2048];
            match sock.recv(&mut buf) {
                Ok(n) if n >= 2 && buf[..2] == id.to_be_bytes() => {
                    return Ok(BigDatagram::Answered)
                }
                Err(e) if too_big(&e) => return Ok(BigDatagram::PathMtu(path_mtu())),
                _ => {}
            }
            match path_mtu() {
                m if m <= 1280 => Ok(BigDatagram::PathMtu(m)),
                m => Err(format!("no answer, IP_MTU still {m}")),
            }
        },
    )
}

#[test]
fn a_1280_byte_mtu_link_before_the_backends_carries_big_transfers_and_path_mtu_discovery() {
    small_mtu_carries_big_transfers_and_path_mtu_discovery(Dirs::with_examples(), GW.into());
}

#[test]
fn over_ipv6_a_1280_byte_mtu_link_carries_big_transfers_and_packet_too_big() {
    small_mtu_carries_big_transfers_and_path_mtu_discovery(ipv6_manifests(), GW6.into());
}

/// Through `gw` of `dirs`, with a 1280-byte MTU link between the gateway and the
/// backends' router: a 10 MB upload and download, and a 1400-byte datagram that cannot
/// be fragmented on the way, all learn the path MTU from the gateway's or the router's
/// ICMP (Packet Too Big over IPv6); then the usual checks.
fn small_mtu_carries_big_transfers_and_path_mtu_discovery(dirs: Dirs, gw: IpAddr) {
    let mut lab = lab_on(routed(1280), dirs, gw);
    let url = |path: &str| format!("http://{}{path}", lab.web());

    // Upload: the client's full-sized segments need the gateway's ICMP "fragmentation
    // needed", translated back to the gateway address, to learn the path MTU. (Seen
    // passing without that ICMP when a download had taught the backend the path MTU
    // first: its SYN-ACK then advertised the smaller MSS. Hence the flushes.)
    forget_path_mtus(&lab.topo);
    let upload = TempFile(std::env::temp_dir().join(format!("berth-upload-{}", unique("u"))));
    std::fs::File::create(&upload.0)
        .and_then(|f| f.set_len(BIG_FILE))
        .expect("upload file");
    let name = unique("up");
    let got = lab.curl(&[
        "--max-time",
        "120",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{size_upload}",
        "-T",
        upload.0.to_str().expect("path"),
        &url(&format!("/upload/{name}")),
    ]);
    assert_eq!(got, format!("201 {BIG_FILE}"), "10 MB upload");
    let stored: Vec<u64> = (1..=2)
        .filter_map(|n| std::fs::metadata(lab.servers.file(n, &format!("upload/{name}"))).ok())
        .map(|m| m.len())
        .collect();
    assert_eq!(stored, [BIG_FILE], "one backend stored the whole body");
    let route = lab.topo.client.ip(&["route", "get", &lab.gw.to_string()]);
    let route = String::from_utf8_lossy(&route.stdout);
    assert!(
        route.contains("mtu 1280"),
        "the client holds the path MTU for the gateway address (the gateway's ICMP came back translated): {route}"
    );

    // UDP with DF: only the gateway's translated ICMP can tell the socket.
    forget_path_mtus(&lab.topo);
    let dns = lab.dns();
    let outcome = lab.topo.client.enter(|| big_datagram_with_df(dns));
    if let BigDatagram::PathMtu(m) = outcome {
        assert!(m <= 1280, "path MTU {m}");
    }
    eprintln!("1400-byte datagram with DF: {outcome:?}");

    // Download: every segment from a backend is cut to the small link by the backend
    // itself, told by the router's ICMP.
    forget_path_mtus(&lab.topo);
    let got = lab.curl(&[
        "--max-time",
        "120",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{size_download}",
        &url("/big"),
    ]);
    assert_eq!(got, format!("200 {BIG_FILE}"), "10 MB download");

    serves_tcp_and_udp_across_a_restart_and_counts_both_directions(&mut lab);
}

/// Flushes the route caches of the client and the backends, with the path MTUs
/// they learned.
fn forget_path_mtus(topo: &Topology) {
    for ns in std::iter::once(&topo.client).chain(&topo.backends) {
        ns.ip(&["-4", "route", "flush", "cache"]);
        ns.ip(&["-6", "route", "flush", "cache"]);
    }
}

/// The interfaces of `ns` running an XDP program.
fn xdp_interfaces(ns: &Netns) -> BTreeSet<String> {
    let out = ns.ip(&["-d", "-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("prog/xdp"))
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .collect()
}

/// Every interface of `ns`.
fn interfaces(ns: &Netns) -> Vec<String> {
    let out = ns.ip(&["-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .collect()
}

/// TC programs on `iface` of `ns`, tcx links and classic filters both, as text.
fn tc_programs(ns: &Netns, iface: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (dir, attach) in [
        ("ingress", TcAttachType::Ingress),
        ("egress", TcAttachType::Egress),
    ] {
        let tcx = ns
            .enter(|| SchedClassifier::query_tcx(iface, attach))
            .unwrap_or_else(|e| panic!("querying tcx {dir} of {iface}: {e}"));
        found.extend(
            tcx.1
                .iter()
                .map(|p| format!("tcx {dir}: program {}", p.id())),
        );
        let classic = ns.try_exec(&["tc", "filter", "show", "dev", iface, dir]);
        let text = String::from_utf8_lossy(&classic.stdout).trim().to_string();
        if !text.is_empty() {
            found.push(format!("tc {dir}: {text}"));
        }
    }
    found
}

#[test]
fn a_restart_on_other_interfaces_moves_the_program_and_uninstall_leaves_no_trace() {
    let topo = Topology::new(3);
    let servers = topo.start_servers();
    let dirs = Dirs::with_examples();
    let gw = &topo.gateway;
    let mut daemon = Daemon::start_on(gw, &["c0", "b1"], &dirs);
    let set = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    wait_until("XDP on c0 and b1", Duration::from_secs(10), || {
        xdp_interfaces(gw) == set(&["c0", "b1"])
    });

    daemon.kill9();
    let daemon = Daemon::start_on(gw, &["c0", "b2", "b3"], &dirs);
    poll(
        "XDP on exactly the new interfaces",
        Duration::from_secs(10),
        || match xdp_interfaces(gw) {
            x if x == set(&["c0", "b2", "b3"]) => Ok(()),
            x => Err(format!("XDP on {x:?}")),
        },
    );
    for iface in ["c0", "b2", "b3"] {
        assert!(
            !tc_programs(gw, iface).is_empty(),
            "{iface} has the reply program (so the checks for none below can see one)"
        );
    }
    assert_eq!(
        tc_programs(gw, "b1"),
        Vec::<String>::new(),
        "b1 left the set"
    );
    let mut lab = Lab {
        daemon,
        dirs,
        servers,
        topo,
        interfaces: vec!["c0".into(), "b2".into(), "b3".into()],
        gw: GW.into(),
    };
    http_answers(&lab);
    dns_answers(&lab);

    lab.daemon.kill9();
    let gw = &lab.topo.gateway;
    uninstall(gw, &lab.dirs);
    // The kernel releases a link whose last pin is gone on a work queue of its own:
    // poll for it.
    poll(
        "no XDP left",
        Duration::from_secs(5),
        || match xdp_interfaces(gw) {
            xdp if xdp.is_empty() => Ok(()),
            xdp => Err(format!("XDP left on {xdp:?}")),
        },
    );
    poll("no TC program left", Duration::from_secs(5), || {
        let tc: Vec<String> = interfaces(gw)
            .iter()
            .flat_map(|i| {
                tc_programs(gw, i)
                    .into_iter()
                    .map(move |p| format!("{i}: {p}"))
            })
            .collect();
        if tc.is_empty() {
            Ok(())
        } else {
            Err(format!("TC programs left: {tc:?}"))
        }
    });
    assert!(
        !lab.dirs.pins.exists(),
        "pin directory {} left",
        lab.dirs.pins.display()
    );
    let links = interfaces(gw);
    assert!(
        !links.iter().any(|l| l == "berth0"),
        "berth0 left: {links:?}"
    );
}

/// IPv6 beside IPv4 on default veths: the gateway program enters its IPv6 half
/// (`berth_v6`) by tail call for every IPv6 frame. IPv6 that is not Berth's —
/// neighbour discovery, and a TCP connection routed through the gateway to a backend's
/// own address — must pass untouched, with none of it counted as lost to an empty
/// tail-call slot.
#[test]
fn ipv6_through_the_gateway_and_neighbour_discovery_pass_untouched() {
    use std::io::{Read, Write};
    let topo = Topology::new(1);
    let lab = lab_on(topo, Dirs::with_examples(), GW);
    // A TCP echo on the backend's IPv6 address, reached from the client through the
    // gateway (neighbour discovery on both links first).
    let backend = SocketAddr::new(backend_addr6(1).into(), 7000);
    let listener = lab.topo.backends[0]
        .enter(|| std::net::TcpListener::bind(backend))
        .expect("listen on the backend's IPv6 address");
    let echo = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).expect("read");
        s.write_all(&buf[..n]).expect("write");
    });
    let answer = lab.topo.client.enter(|| {
        let mut s = TcpStream::connect_timeout(&backend, TIMEOUT).expect("connect over IPv6");
        s.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        s.write_all(b"over ipv6").expect("send");
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).expect("echo");
        buf[..n].to_vec()
    });
    echo.join().expect("echo thread");
    assert_eq!(answer, b"over ipv6", "the echo came back unchanged");
    // The counters are published within a second of the daemon's start: under load
    // the first scrape could come before (the series then is absent).
    let series = "berth_datapath_packets_total{reason=\"ipv6_no_program\"}";
    let lost = poll("the datapath counters on /metrics", TIMEOUT * 5, || {
        sample(&metrics(&lab.topo.gateway), series).ok_or_else(|| "not published yet".to_string())
    });
    assert_eq!(
        lost, 0,
        "every IPv6 frame entered the IPv6 program (as of the last counter refresh)"
    );
}

/// The example manifests' addresses of this network (the gateway's and the
/// endpoints') replaced by their IPv6 mirrors, and the EndpointSlices made IPv6.
fn ipv6_rewrites() -> Vec<(String, String)> {
    ipv6_rewrites_moving(&[])
}

/// `ipv6_rewrites` for endpoints moved to other IPv4 addresses (`moved` as for
/// `manifests`): an endpoint becomes the IPv6 mirror of its new address.
fn ipv6_rewrites_moving(moved: &[(&str, &str)]) -> Vec<(String, String)> {
    std::iter::once(GW)
        .chain((1..=3).map(backend_addr))
        .map(|a| {
            let a = a.to_string();
            let to = moved
                .iter()
                .find(|(from, _)| *from == a)
                .map_or(&*a, |m| m.1);
            let to: Ipv4Addr = to.parse().expect("IPv4 address");
            (a, mirror6(to).to_string())
        })
        .chain([("addressType: IPv4".into(), "addressType: IPv6".into())])
        .collect()
}

/// The example manifests with an IPv6 Gateway address and IPv6 endpoints only.
fn ipv6_manifests() -> Dirs {
    manifests(&ipv6_rewrites())
}

/// The example manifests made dual-stack: the Gateway has the IPv4 address and its
/// IPv6 mirror, and each team's EndpointSlice has an IPv6 twin (`v6-<name>`).
fn dual_stack_manifests() -> Dirs {
    let dirs = Dirs::with_examples();
    let v4 = format!("    value: {GW}\n");
    dirs.edit_manifest(
        "gateway.yaml",
        &v4,
        &format!("{v4}  - type: IPAddress\n    value: {GW6}\n"),
    );
    for f in ["team-a.yaml", "team-b.yaml"] {
        let path = dirs.manifests.join(f);
        let text = std::fs::read_to_string(&path).expect("read manifest");
        let slice = text
            .split("\n---\n")
            .find(|doc| doc.contains("kind: EndpointSlice"))
            .unwrap_or_else(|| panic!("{f} has no EndpointSlice"));
        let twin =
            rewrite(slice.to_string(), &ipv6_rewrites()).replacen("  name: ", "  name: v6-", 1);
        let text = format!("{}\n---\n{}\n", text.trim_end(), twin.trim_end());
        std::fs::write(&path, text).expect("write manifest");
    }
    dirs
}

/// `topo` with `berth run` on every gateway interface, the manifests `dirs`, checked
/// through `gw`.
fn lab_on(topo: Topology, dirs: Dirs, gw: impl Into<IpAddr>) -> Lab {
    let ifaces = topo.gateway_ifaces.clone();
    let ifaces: Vec<&str> = ifaces.iter().map(String::as_str).collect();
    Lab::start(topo, &ifaces, dirs, gw)
}

/// The value of the datapath counter `reason` on the gateway's /metrics (0 if absent).
fn datapath_counter(lab: &Lab, reason: &str) -> u64 {
    let series = format!("berth_datapath_packets_total{{reason=\"{reason}\"}}");
    sample(&metrics(&lab.topo.gateway), &series).unwrap_or(0)
}

/// Polls until the datapath counter `reason` is above `before`.
fn counter_grows(lab: &Lab, reason: &str, before: u64) {
    poll(
        &format!("{reason} to grow from {before}"),
        Duration::from_secs(20),
        || match datapath_counter(lab, reason) {
            n if n > before => Ok(()),
            n => Err(format!("{reason} is {n}")),
        },
    );
}

/// Every datapath counter of a packet lost (dropped, left untranslated, refused by the
/// kernel after a redirect, or passed for want of the IPv6 program) is 0.
fn nothing_lost(lab: &Lab) {
    let m = metrics(&lab.topo.gateway);
    let prefix = "berth_datapath_packets_total{reason=\"";
    let lost = |reason: &str| {
        reason.starts_with("drop_")
            || ["tc_untranslated", "redirect_error", "ipv6_no_program"].contains(&reason)
    };
    let samples: Vec<(&str, &str)> = m
        .lines()
        .filter_map(|l| l.strip_prefix(prefix)?.split_once("\"} "))
        .filter(|(reason, _)| lost(reason))
        .collect();
    assert!(
        samples.iter().any(|(r, _)| *r == "drop_malformed"),
        "no drop counters in /metrics to check: {m}"
    );
    let nonzero: Vec<_> = samples.iter().filter(|(_, v)| v.trim() != "0").collect();
    assert!(nonzero.is_empty(), "packets counted as lost: {nonzero:?}");
}

/// `dig` on the client (`family` is `-4` or `-6`) for `WHOAMI` of type `qtype` at
/// `server`'s DNS port: the short answer.
fn dig(lab: &Lab, family: &str, server: IpAddr, qtype: &str) -> Result<String, String> {
    lab.try_client(&[
        "dig",
        family,
        "+short",
        "+time=1",
        "+tries=1",
        "-p",
        &DNS_PORT.to_string(),
        &format!("@{server}"),
        WHOAMI,
        qtype,
    ])
    .and_then(|a| {
        if a.is_empty() || a.starts_with(';') {
            Err(format!("no answer: {a:?}"))
        } else {
            Ok(a)
        }
    })
}

/// `curl` on the client (`family` is `-4` or `-6`) of the web port at `gw`: the body.
fn curl_web(lab: &Lab, family: &str, gw: IpAddr) -> String {
    let url = format!("http://{}/", SocketAddr::new(gw, WEB_PORT));
    poll(
        &format!("curl {family} {url}"),
        Duration::from_secs(10),
        || lab.try_curl(&[family, "--max-time", "2", &url]),
    )
}

/// `curl` (`family` is `-4` or `-6`) of the web port at `gw` gets team A's page, and
/// `dig` of the DNS port gets backend 3's A and AAAA records.
fn curl_and_dig_answer(lab: &Lab, family: &str, gw: IpAddr) {
    let body = curl_web(lab, family, gw);
    assert!(
        body == "backend-1" || body == "backend-2",
        "curl {family} through {gw} got {body:?}"
    );
    for (qtype, marker) in [
        ("A", IpAddr::from(marker(DNS_BACKEND))),
        ("AAAA", marker6(DNS_BACKEND).into()),
    ] {
        assert_eq!(
            dig_answers(lab, family, gw, qtype),
            marker.to_string(),
            "dig {family} {qtype} through {gw} reaches backend 3"
        );
    }
}

/// Polls `dig` until it answers; the answer.
fn dig_answers(lab: &Lab, family: &str, server: IpAddr, qtype: &str) -> String {
    poll(
        &format!("dig {family} @{server} {WHOAMI} {qtype}"),
        Duration::from_secs(10),
        || dig(lab, family, server, qtype),
    )
}

#[test]
fn ipv6_in_router_mode_on_default_veths_is_served_and_tc_translates_the_replies() {
    let lab = lab_on(Topology::new(3), ipv6_manifests(), GW6);
    let before = (lab.counters("team-a"), lab.counters("team-b"));
    let tc_before = datapath_counter(&lab, "tc_reply_translated");
    curl_and_dig_answer(&lab, "-6", GW6.into());
    http_answers(&lab);
    dns_answers(&lab);
    counters_grow(&lab, &before.0, &before.1);
    // Default veths take no XDP frames: the kernel forwards every reply, and the TC
    // program gives it the gateway's address and port.
    counter_grows(&lab, "tc_reply_translated", tc_before);
    rows_name_the_handoff(&lab);
    nothing_lost(&lab);
}

#[test]
fn an_ipv6_tcp_connection_and_udp_stream_survive_kill_9_and_restart() {
    let mut lab = lab_on(Topology::new(3), ipv6_manifests(), GW6);
    connections_survive_kill_9_and_restart(&mut lab);
    nothing_lost(&lab);
}

#[test]
fn ipv6_in_snat_mode_reaches_backends_without_a_route_back_from_the_gateways_address() {
    let topo = Topology::new(3);
    // The backends reach only their own IPv6 subnet: replies to the client's address
    // have nowhere to go, replies to the gateway's address on their link do.
    for b in &topo.backends {
        b.ip(&["-6", "route", "del", "default"]);
    }
    let dirs = ipv6_manifests();
    dirs.edit_manifest(
        "gateway.yaml",
        "  releaseCooldown: 300s\n",
        "  releaseCooldown: 300s\n  sourceNAT: true\n",
    );
    let lab = lab_on(topo, dirs, GW6);
    poll(
        "team A's route in SNAT mode",
        Duration::from_secs(10),
        || match lab.counters_row("team-a") {
            row if row["mode"] == "snat" => Ok(()),
            row => Err(format!("{row}")),
        },
    );
    let masq_before = datapath_counter(&lab, "tc_masq_translated");
    curl_and_dig_answer(&lab, "-6", GW6.into());
    // A kept-open connection: its backend sees the gateway's IPv6 address on its link.
    let web = lab.web();
    let conn = lab.topo.client.enter(|| {
        let mut s = TcpStream::connect_timeout(&web, TIMEOUT).expect("connect to the web port");
        s.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        let body = http_request(&mut s).expect("GET on a kept-alive connection");
        (s, body)
    });
    let n: usize = conn
        .1
        .trim()
        .trim_start_matches("backend-")
        .parse()
        .unwrap_or_else(|_| panic!("answered {:?}", conn.1));
    let node = mirror6(Ipv4Addr::new(10, 251, 10 + n as u8, 1));
    let peers = tcp_peers(&lab.topo.backends[n - 1], HTTP_PORT);
    assert!(
        !peers.is_empty(),
        "no connection established at backend {n}"
    );
    for p in &peers {
        assert!(
            p.starts_with(&format!("[{node}]:")),
            "backend {n} sees {p}, not the gateway's address on its link ({node})"
        );
    }
    drop(conn);
    counter_grows(&lab, "snat_new_flow", 0);
    // These veths take no XDP frames: the kernel forwards, TC gives the source.
    counter_grows(&lab, "tc_masq_translated", masq_before);
    nothing_lost(&lab);
}

#[test]
fn a_dual_stack_gateway_serves_both_families_on_the_same_ports_at_once() {
    let mut lab = lab_on(Topology::new(3), dual_stack_manifests(), GW);
    // Both families, one kept-alive connection each, open at the same time on the
    // same port, asked in turn.
    let (web4, web6) = (
        SocketAddr::new(GW.into(), WEB_PORT),
        SocketAddr::new(GW6.into(), WEB_PORT),
    );
    let connect = |web: SocketAddr| {
        poll(
            &format!("a connection to {web}"),
            Duration::from_secs(10),
            || {
                lab.topo.client.enter(|| {
                    let mut s =
                        TcpStream::connect_timeout(&web, TIMEOUT).map_err(|e| e.to_string())?;
                    s.set_read_timeout(Some(TIMEOUT))
                        .map_err(|e| e.to_string())?;
                    let body = http_request(&mut s).map_err(|e| e.to_string())?;
                    Ok((s, body))
                })
            },
        )
    };
    let (mut c4, body4) = connect(web4);
    let (mut c6, body6) = connect(web6);
    for _ in 0..3 {
        assert_eq!(http_request(&mut c4).expect("IPv4 request"), body4);
        assert_eq!(http_request(&mut c6).expect("IPv6 request"), body6);
    }
    drop((c4, c6));
    for (family, gw) in [("-4", IpAddr::from(GW)), ("-6", IpAddr::from(GW6))] {
        curl_and_dig_answer(&lab, family, gw);
    }
    for gw in [IpAddr::from(GW), IpAddr::from(GW6)] {
        lab.gw = gw;
        http_answers(&lab);
        dns_answers(&lab);
    }
    // The Gateway is served on both addresses, and each route on the endpoints of both
    // families: 2 + 2 for team A, 1 + 1 for team B.
    let out = lab
        .topo
        .gateway
        .command(&berth_binary())
        .args(["get", "gateways"])
        .output()
        .expect("berth get gateways");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("{GW},{GW6}")),
        "berth get gateways shows both addresses: {text}"
    );
    // Each address counted its own replies on the same port.
    for gw in [IpAddr::from(GW), IpAddr::from(GW6)] {
        let series = format!(
            "berth_address_packets_total{{address=\"{gw}\",protocol=\"TCP\",direction=\"reply\"}}"
        );
        poll(
            &format!("replies counted on {gw}"),
            Duration::from_secs(20),
            || match sample(&metrics(&lab.topo.gateway), &series) {
                Some(n) if n > 0 => Ok(()),
                other => Err(format!("{series} is {other:?}")),
            },
        );
    }
    for (ns, backends) in [("team-a", 4), ("team-b", 2)] {
        let row = lab.counters_row(ns);
        assert_eq!(
            row["port"],
            if ns == "team-a" { WEB_PORT } else { DNS_PORT },
            "{row}"
        );
        assert_eq!(
            row["backends"], backends,
            "{ns}'s endpoints of both families: {row}"
        );
    }
    nothing_lost(&lab);
}
