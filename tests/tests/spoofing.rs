//! Real traffic (issue 27): team B's client talks to team B's backend through the
//! gateway address (DNS over UDP, a kept-open TCP connection); a backend of team C, in
//! another namespace, forges UDP answers with B's backend's address as their source to
//! B's client's port, and an ICMP port-unreachable quoting B's TCP flow. Nothing forged
//! reaches the client, B's flows go on, and the gateway counts `reply_spoofed`:
//!
//! - through the XDP reply path: C's backend on another gateway interface running
//!   Berth, and C on the same L2 segment (a bridge) as B's backend (XDP tells them
//!   apart by source MAC);
//! - through the TC reply path: C's backend on a gateway interface without Berth's
//!   program (its packets reach the kernel, which forwards them out of the client's
//!   interface, where the TC program sees them come from the wrong interface).
//!
//! All traffic stays inside the namespaces the test creates (removed on drop). Needs
//! root.

use std::{
    io::{ErrorKind, Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpStream},
    time::Duration,
};

use berth::datapath::{AttachMode, DesiredState, Protocol, ServiceAddr, WeightedBackend};
use berth_tests::{
    netns::Netns,
    packet::Packet,
    topo::{
        bridged, start_servers, Flow, Servers, Topology, Veth, CLIENT, DNS_PORT, GW, HTTP_PORT,
    },
    xdp::TestDatapath,
};

const TIMEOUT: Duration = Duration::from_secs(2);
/// Forged datagrams C sends per case.
const FORGED: u64 = 20;

struct Lab {
    // Field order is drop order: the datapath (pins, links), then servers, then namespaces.
    dp: TestDatapath,
    _servers: Servers,
    topo: Topology,
}

fn gw(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(GW, port)
}

/// Team B's services: DNS and HTTP on backend B only.
fn state(b: Ipv4Addr) -> DesiredState {
    let one = |port| {
        vec![WeightedBackend {
            endpoint: SocketAddrV4::new(b, port).into(),
            weight: 1,
        }]
    };
    let svc = |protocol, port| ServiceAddr {
        addr: GW.into(),
        protocol,
        port,
    };
    DesiredState::default()
        .with_service(svc(Protocol::Udp, 53), one(DNS_PORT))
        .with_service(svc(Protocol::Tcp, 80), one(HTTP_PORT))
}

/// Servers on every backend, the program attached to `attach` (gateway interfaces);
/// `redirect`: those interfaces take XDP frames (veths with GRO), so XDP sends
/// replies itself.
fn lab(topo: Topology, b: Ipv4Addr, attach: &[&str], redirect: bool) -> Lab {
    let servers = start_servers(
        &topo
            .backends
            .iter()
            .zip(&topo.backend_addrs)
            .map(|(ns, &a)| (ns, vec![a.into()]))
            .collect::<Vec<_>>(),
    );
    let mut dp = TestDatapath::load();
    let ifindexes: Vec<u32> = topo.gateway.enter(|| {
        attach
            .iter()
            .map(|iface| {
                dp.dp
                    .attach(iface, AttachMode::Auto)
                    .unwrap_or_else(|e| panic!("attach {iface}: {e}"));
                topo.gateway.ifindex(iface)
            })
            .collect()
    });
    if redirect {
        dp.allow_redirect(&ifindexes);
    }
    dp.dp.apply(&state(b)).expect("apply");
    Lab {
        dp,
        _servers: servers,
        topo,
    }
}

/// Sends IPv4 packet `ip` (header included) from namespace `ns` through a raw socket:
/// any source address, routed by its destination.
fn send_raw(ns: &Netns, ip: &[u8]) {
    let dst = u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]);
    ns.enter(|| {
        // SAFETY: plain socket calls on a descriptor this function owns and closes.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
            assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
            let to = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: dst.to_be(),
                },
                sin_zero: [0; 8],
            };
            let sent = libc::sendto(
                fd,
                ip.as_ptr().cast(),
                ip.len(),
                0,
                (&raw const to).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            );
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            assert_eq!(sent, ip.len() as isize, "raw send: {err}");
        }
    });
}

/// ICMP messages the client's stack received (`/proc/net/snmp`, Icmp InMsgs): read
/// inside its namespace.
fn icmp_in(client: &Netns) -> u64 {
    let snmp = client.enter(|| std::fs::read_to_string("/proc/net/snmp").expect("snmp"));
    let mut lines = snmp.lines().filter(|l| l.starts_with("Icmp:"));
    let (names, values) = (lines.next().expect("names"), lines.next().expect("values"));
    let at = names
        .split_whitespace()
        .position(|n| n == "InMsgs")
        .expect("InMsgs");
    values
        .split_whitespace()
        .nth(at)
        .expect("value")
        .parse()
        .expect("number")
}

/// B's client with a UDP flow and a TCP connection to B's backend; C (namespace `c`)
/// forges answers to the UDP flow and a port unreachable quoting the TCP connection,
/// with B's backend address `b` as source. Nothing forged reaches the client; both
/// flows go on; `reply_spoofed` counts every forgery.
fn forgeries_are_dropped(lab: &Lab, b: Ipv4Addr, c: &Netns) {
    let client = &lab.topo.client;
    let (mut dns, mut http, cport) = client.enter(|| {
        let mut dns = Flow::new(gw(53), TIMEOUT);
        assert!(dns.ask().is_some(), "b's dns answers through the gateway");
        let mut http =
            TcpStream::connect_timeout(&gw(80).into(), TIMEOUT).expect("tcp connect to b");
        http.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        assert!(get(&mut http).starts_with("backend-"), "b's http answers");
        let cport = http.local_addr().expect("local").port();
        (dns, http, cport)
    });
    let spoofed_before = lab.dp.dp.counters().expect("counters")["reply_spoofed"];
    let icmp_before = icmp_in(client);

    // Forged answers to the DNS flow's port, and port unreachables quoting the TCP
    // connection as B's backend got it.
    let answer = Packet::udp(
        SocketAddrV4::new(b, DNS_PORT),
        SocketAddrV4::new(CLIENT, dns.port()),
    )
    .payload(b"forged answer forged answer");
    let sent = Packet::tcp(
        SocketAddrV4::new(CLIENT, cport),
        SocketAddrV4::new(b, HTTP_PORT),
    )
    .ttl(63);
    let unreach = Packet::icmp_error(b, CLIENT, 3, 3, 0, &sent.quote());
    for _ in 0..FORGED {
        send_raw(c, &answer.ip_bytes());
        send_raw(c, &unreach.ip_bytes());
    }
    std::thread::sleep(Duration::from_millis(300));

    client.enter(|| {
        dns.socket().set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 512];
        match dns.socket().recv(&mut buf) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("a forged answer reached b's client: {other:?}"),
        }
        dns.socket().set_nonblocking(false).expect("blocking");
        assert!(dns.ask().is_some(), "b's dns flow goes on");
        assert!(
            get(&mut http).starts_with("backend-"),
            "b's tcp connection goes on"
        );
    });
    assert_eq!(
        icmp_in(client),
        icmp_before,
        "a forged port unreachable reached b's client"
    );
    let spoofed = lab.dp.dp.counters().expect("counters")["reply_spoofed"] - spoofed_before;
    assert!(
        spoofed >= 2 * FORGED,
        "reply_spoofed counted {spoofed} of {} forgeries",
        2 * FORGED
    );
}

/// One HTTP/1.1 request on a kept-open connection: the response body.
fn get(s: &mut TcpStream) -> String {
    s.write_all(b"GET / HTTP/1.1\r\nHost: b\r\n\r\n")
        .expect("request");
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !got.ends_with(b"\n") || !String::from_utf8_lossy(&got).contains("backend-") {
        let n = s.read(&mut buf).expect("response");
        assert!(n > 0, "connection closed");
        got.extend(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    text.split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_backend_on_another_interface_forging_a_backends_replies_is_dropped_by_xdp() {
    let topo = Topology::with_gro(2);
    let (b, c) = (topo.backend_addrs[0], 1);
    let lab = lab(topo, b, &["c0", "b1", "b2"], true);
    forgeries_are_dropped(&lab, b, &lab.topo.backends[c]);
}

#[test]
fn a_backend_on_an_interface_without_berth_forging_a_backends_replies_is_dropped_by_tc() {
    // b2 runs no Berth program: C's packets reach the kernel, which forwards them out
    // of c0, where the TC program sees where they came from.
    let topo = Topology::new(2);
    // Whatever the host's default: the kernel forwards C's packets (strict reverse-path
    // filtering would drop them before TC, as it cannot where XDP runs).
    for conf in ["all", "default", "b2"] {
        topo.gateway
            .sysctl(&format!("net.ipv4.conf.{conf}.rp_filter"), "0");
    }
    let (b, c) = (topo.backend_addrs[0], 1);
    let lab = lab(topo, b, &["c0", "b1"], false);
    forgeries_are_dropped(&lab, b, &lab.topo.backends[c]);
}

#[test]
fn a_host_on_the_backends_l2_segment_forging_a_backends_replies_is_dropped_by_xdp() {
    // B's backend and C's on one bridge behind the gateway's br0.
    let addrs = [Ipv4Addr::new(10, 251, 10, 2), Ipv4Addr::new(10, 251, 10, 3)];
    let topo = bridged(&addrs, Veth::HOST_B);
    let lab = lab(topo, addrs[0], &["c0", "br0"], false);
    forgeries_are_dropped(&lab, addrs[0], &lab.topo.backends[1]);
}
