//! Packet fixtures through `BPF_PROG_TEST_RUN`: a named table of input packet →
//! expected verdict and exact output bytes. Maps are set up through the daemon's own
//! `Datapath::apply`; expected packets are built independently, checksums from scratch.
//! The program runs inside a namespace whose routes and static neighbours make its
//! FIB lookups deterministic (fx0: client side, fx1: backend side). Needs root.

use std::net::{Ipv4Addr, SocketAddrV4};

use berth::datapath::{DesiredState, Limits, Protocol, ServiceAddr, WeightedBackend};
use berth_tests::{
    packet::{decode, Packet, SYN},
    xdp::{
        maglev_pick, net::*, run_gateway, run_tc, test_limits, verdict_name, FixtureNet,
        TestDatapath, TC_NEXT, XDP_DROP, XDP_PASS, XDP_REDIRECT,
    },
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Client,
    Backend,
}

enum Step {
    Apply(&'static str, DesiredState),
    /// The interfaces that accept XDP frames (the daemon keeps this from the kernel).
    Xmit(Vec<Side>),
    /// The daemon restarts: a new one loads the program and adopts the pinned maps.
    Restart,
    Packet {
        name: String,
        ingress: Side,
        input: Vec<u8>,
        verdict: u32,
        output: Option<Vec<u8>>,
    },
    /// A frame leaving an `--interface` through the TC egress program (verdict "next").
    Egress {
        name: String,
        input: Vec<u8>,
        output: Option<Vec<u8>>,
    },
}

fn case(
    name: impl Into<String>,
    ingress: Side,
    input: Vec<u8>,
    verdict: u32,
    output: Option<Vec<u8>>,
) -> Step {
    Step::Packet {
        name: name.into(),
        ingress,
        input,
        verdict,
        output,
    }
}

fn svc(protocol: Protocol, port: u16) -> ServiceAddr {
    ServiceAddr {
        addr: GW.into(),
        protocol,
        port,
    }
}

fn wb(ip: Ipv4Addr, port: u16, weight: u16) -> WeightedBackend {
    WeightedBackend {
        endpoint: sa(ip, port).into(),
        weight,
    }
}

fn base_state() -> DesiredState {
    use Protocol::*;
    DesiredState::default()
        .with_service(svc(Tcp, 80), vec![wb(B1, 8080, 1)])
        .with_service(svc(Udp, 53), vec![wb(B2, 5353, 1)])
        .with_service(svc(Tcp, 81), vec![wb(B1, 8081, 0), wb(B3, 8081, 1)])
        .with_service(svc(Tcp, 82), vec![wb(B1, 9000, 1), wb(B2, 9000, 1)])
        .with_service(svc(Udp, 54), vec![wb(B_NO_NEIGH, 53, 1)])
        .with_service(svc(Udp, 55), vec![wb(B1, 55, 0)])
        .with_service(svc(Tcp, 83), vec![wb(B_SAME_SIDE, 80, 1)])
}

fn client(port: u16) -> SocketAddrV4 {
    sa(CLIENT, port)
}

fn gw(port: u16) -> SocketAddrV4 {
    sa(GW, port)
}

/// A client packet as it arrives at fx0.
fn from_client(p: Packet) -> Packet {
    p.macs(CLIENT_MAC, FX0_MAC)
}

/// A backend packet as it arrives at fx1.
fn from_backend(p: Packet) -> Packet {
    let m = mac_of(p.src);
    p.macs(m, FX1_MAC)
}

/// What the gateway sends a backend for client packet `p`: DNATed, TTL-1, new MACs.
fn forwarded(p: &Packet, backend: SocketAddrV4) -> Packet {
    p.clone()
        .with_dst(backend)
        .ttl(p.ttl - 1)
        .macs(FX1_MAC, mac_of(*backend.ip()))
}

/// What the gateway sends the client for backend packet `p`: source restored.
fn replied(p: &Packet, service: SocketAddrV4) -> Packet {
    p.clone()
        .with_src(service)
        .ttl(p.ttl - 1)
        .macs(FX0_MAC, CLIENT_MAC)
}

/// The backend Maglev gives a new flow (`maglev_pick`).
fn predict(
    backends: &[WeightedBackend],
    src: SocketAddrV4,
    dst: SocketAddrV4,
    proto: u8,
) -> SocketAddrV4 {
    v4(maglev_pick(backends, src.into(), dst.into(), proto).expect("a backend with weight"))
}

fn with_ip_header(mut frame: Vec<u8>, edit: impl FnOnce(&mut [u8])) -> Vec<u8> {
    edit(&mut frame[14..34]);
    frame
}

fn fix_ip_checksum(ip: &mut [u8]) {
    ip[10] = 0;
    ip[11] = 0;
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let c = berth_tests::packet::checksum(&ip[..ihl.clamp(20, ip.len())]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// The table: every case with its verdict and exact output bytes. The steps share the
/// conntrack state and run in this order; later sections send again or quote packets
/// of the first flows.
fn steps() -> Vec<Step> {
    let mut s = vec![
        Step::Apply("base services", base_state()),
        // Both sides take XDP frames.
        Step::Xmit(vec![Side::Client, Side::Backend]),
    ];
    let flows = dnat_steps(&mut s);
    dnat_edge_case_steps(&mut s);
    let unknown_port = not_ours_steps(&mut s, &flows.syn);
    malformed_steps(&mut s, &flows.syn, &unknown_port);
    fragment_steps(&mut s);
    icmp_error_steps(&mut s, &flows.udp, &flows.udp_reply);
    weight_steps(&mut s);
    backend_change_steps(&mut s);
    no_xdp_egress_steps(&mut s);
    service_removal_steps(&mut s, &flows.data);
    s
}

/// The packets of the first flows (`dnat_steps`) that later sections send again or
/// quote.
struct Flows {
    /// The syn of tcp/80's flow from client port 40001 (backend B1:8080).
    syn: Packet,
    /// A later segment of that flow.
    data: Packet,
    /// A datagram of udp/53's flow from client port 50001 (backend B2:5353).
    udp: Packet,
    /// The backend's reply to it.
    udp_reply: Packet,
}

/// DNAT and reverse NAT, tcp and udp.
fn dnat_steps(s: &mut Vec<Step>) -> Flows {
    use Side::*;
    let syn = from_client(Packet::tcp(client(40001), gw(80)).flags(SYN).payload(b""));
    s.push(case(
        "tcp syn to a service is DNATed to its backend and redirected",
        Client,
        syn.frame(),
        XDP_REDIRECT,
        Some(forwarded(&syn, sa(B1, 8080)).frame()),
    ));
    let data = from_client(Packet::tcp(client(40001), gw(80)).payload(b"GET / HTTP/1.0\r\n\r\n"));
    s.push(case(
        "later tcp segment of the flow follows conntrack",
        Client,
        data.frame(),
        XDP_REDIRECT,
        Some(forwarded(&data, sa(B1, 8080)).frame()),
    ));
    let jumbo = from_client(Packet::tcp(client(40001), gw(80)).payload(&[b'x'; 1600]));
    s.push(case(
        "a packet beyond the egress mtu is left to the kernel though the hop is cached",
        Client,
        jumbo.frame(),
        XDP_PASS,
        Some(jumbo.clone().with_dst(sa(B1, 8080)).frame()),
    ));
    let reply =
        from_backend(Packet::tcp(sa(B1, 8080), client(40001)).payload(b"HTTP/1.0 200 OK\r\n"));
    s.push(case(
        "tcp reply from the backend is reverse-NATed to the gateway address",
        Backend,
        reply.frame(),
        XDP_REDIRECT,
        Some(replied(&reply, gw(80)).frame()),
    ));
    let udp = from_client(Packet::udp(client(50001), gw(53)).payload(b"query"));
    s.push(case(
        "udp datagram to a service is DNATed",
        Client,
        udp.frame(),
        XDP_REDIRECT,
        Some(forwarded(&udp, sa(B2, 5353)).frame()),
    ));
    let udp_reply = from_backend(Packet::udp(sa(B2, 5353), client(50001)).payload(b"answer"));
    s.push(case(
        "udp reply is reverse-NATed to the gateway address",
        Backend,
        udp_reply.frame(),
        XDP_REDIRECT,
        Some(replied(&udp_reply, gw(53)).frame()),
    ));
    let nocsum = from_client(Packet::udp(client(50002), gw(53)).no_udp_checksum());
    s.push(case(
        "udp without checksum keeps a zero checksum",
        Client,
        nocsum.frame(),
        XDP_REDIRECT,
        Some(forwarded(&nocsum, sa(B2, 5353)).frame()),
    ));
    let nocsum_reply = from_backend(Packet::udp(sa(B2, 5353), client(50002)).no_udp_checksum());
    s.push(case(
        "udp reply without checksum keeps a zero checksum",
        Backend,
        nocsum_reply.frame(),
        XDP_REDIRECT,
        Some(replied(&nocsum_reply, gw(53)).frame()),
    ));
    Flows {
        syn,
        data,
        udp,
        udp_reply,
    }
}

/// DNAT past ip options, to a backend on the receiving side, a backend with no
/// neighbour entry, and with ttl 1.
fn dnat_edge_case_steps(s: &mut Vec<Step>) {
    use Side::*;
    let opts = from_client(Packet::tcp(client(40002), gw(80)).options(&[1, 1, 1, 0]));
    s.push(case(
        "tcp with ip options is DNATed past the options",
        Client,
        opts.frame(),
        XDP_REDIRECT,
        Some(forwarded(&opts, sa(B1, 8080)).frame()),
    ));
    let same_side = from_client(Packet::tcp(client(40010), gw(83)));
    let mut tx = same_side
        .clone()
        .with_dst(sa(B_SAME_SIDE, 80))
        .ttl(63)
        .macs(FX0_MAC, B_SAME_SIDE_MAC);
    tx.id = same_side.id;
    s.push(case(
        "a backend on the receiving side is reached by a redirect out of the same interface",
        Client,
        same_side.frame(),
        XDP_REDIRECT,
        Some(tx.frame()),
    ));
    let no_neigh = from_client(Packet::udp(client(50010), gw(54)));
    s.push(case(
        "a backend with no neighbour entry is handed to the kernel, rewritten",
        Client,
        no_neigh.frame(),
        XDP_PASS,
        Some(no_neigh.clone().with_dst(sa(B_NO_NEIGH, 53)).frame()),
    ));
    let ttl1 = from_client(Packet::tcp(client(40011), gw(80)).ttl(1));
    s.push(case(
        "a packet with ttl 1 is NATed and left to the kernel to expire",
        Client,
        ttl1.frame(),
        XDP_PASS,
        Some(ttl1.clone().with_dst(sa(B1, 8080)).frame()),
    ));
}

/// Not ours: passed untouched. Returns the packet to a port of the gateway address
/// with no service.
fn not_ours_steps(s: &mut Vec<Step>, syn: &Packet) -> Packet {
    use Side::*;
    let unknown_port = from_client(Packet::tcp(client(40003), gw(9999)));
    s.push(case(
        "a packet to an unknown port of the gateway address passes untouched",
        Client,
        unknown_port.frame(),
        XDP_PASS,
        None,
    ));
    let other = from_client(Packet::tcp(
        client(40004),
        sa(Ipv4Addr::new(10, 250, 9, 9), 80),
    ));
    s.push(case(
        "a packet to another address passes untouched",
        Client,
        other.frame(),
        XDP_PASS,
        None,
    ));
    let mut arp = vec![0xff; 6];
    arp.extend(CLIENT_MAC);
    arp.extend([0x08, 0x06]);
    arp.extend([0u8; 28]);
    s.push(case(
        "an arp frame passes untouched",
        Client,
        arp,
        XDP_PASS,
        None,
    ));
    let mut ipv6 = FX0_MAC.to_vec();
    ipv6.extend(CLIENT_MAC);
    ipv6.extend([0x86, 0xdd, 0x60]);
    ipv6.extend([0u8; 39]);
    s.push(case(
        "an ipv6 packet passes untouched",
        Client,
        ipv6,
        XDP_PASS,
        None,
    ));
    // (BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet header.)
    s.push(case(
        "a frame cut inside the ip header passes untouched",
        Client,
        syn.frame()[..20].to_vec(),
        XDP_PASS,
        None,
    ));
    let echo = from_client(Packet::icmp_error(CLIENT, GW, 8, 0, 0x0001_0001, b"ping"));
    s.push(case(
        "an icmp echo request to the gateway address passes untouched",
        Client,
        echo.frame(),
        XDP_PASS,
        None,
    ));
    unknown_port
}

/// Malformed: dropped when sent to the gateway address, passed otherwise.
fn malformed_steps(s: &mut Vec<Step>, syn: &Packet, unknown_port: &Packet) {
    use Side::*;
    let truncated_tcp = with_ip_header(
        unknown_port.clone().with_dst(gw(80)).frame()[..44].to_vec(),
        |ip| {
            ip[2..4].copy_from_slice(&30u16.to_be_bytes());
            fix_ip_checksum(ip);
        },
    );
    s.push(case(
        "a truncated tcp header to the gateway address is dropped",
        Client,
        truncated_tcp,
        XDP_DROP,
        None,
    ));
    let truncated_udp_other = from_client(Packet::udp(
        client(50004),
        sa(Ipv4Addr::new(10, 250, 9, 9), 53),
    ))
    .frame()[..38]
        .to_vec();
    s.push(case(
        "a truncated udp header to another address passes untouched",
        Client,
        truncated_udp_other,
        XDP_PASS,
        None,
    ));
    let short_ihl = with_ip_header(syn.frame(), |ip| {
        ip[0] = 0x44;
        fix_ip_checksum(ip);
    });
    s.push(case(
        "an ip header length below 20 to the gateway address is dropped",
        Client,
        short_ihl,
        XDP_DROP,
        None,
    ));
    let long_total = with_ip_header(syn.frame(), |ip| {
        ip[2..4].copy_from_slice(&1500u16.to_be_bytes());
        fix_ip_checksum(ip);
    });
    s.push(case(
        "an ip total length beyond the frame to the gateway address is dropped",
        Client,
        long_total,
        XDP_DROP,
        None,
    ));
}

/// Fragments.
fn fragment_steps(s: &mut Vec<Step>) {
    use Side::*;
    let big = from_client(Packet::udp(client(50003), gw(53)).payload(&[7u8; 40]));
    let (first, later) = big.fragments(24);
    let (first_out, later_out) = forwarded(&big, sa(B2, 5353)).fragments(24);
    s.push(case(
        "a first fragment to a service is DNATed, udp checksum over the whole datagram",
        Client,
        first,
        XDP_REDIRECT,
        Some(first_out),
    ));
    s.push(case(
        "a later fragment follows its first fragment's backend",
        Client,
        later,
        XDP_REDIRECT,
        Some(later_out),
    ));
    let mut orphan = from_client(Packet::udp(client(50005), gw(53)).payload(&[7u8; 40]));
    orphan.id = 0x9999;
    s.push(case(
        "a later fragment whose first fragment was not seen is dropped",
        Client,
        orphan.fragments(24).1,
        XDP_DROP,
        None,
    ));
    let other_frag = from_client(
        Packet::udp(client(50005), sa(Ipv4Addr::new(10, 250, 9, 9), 53)).payload(&[7u8; 40]),
    );
    s.push(case(
        "a later fragment to another address passes untouched",
        Client,
        other_frag.fragments(24).1,
        XDP_PASS,
        None,
    ));
}

/// ICMP errors about `udp` (the datagram of "udp datagram to a service") and its reply
/// `udp_reply`.
fn icmp_error_steps(s: &mut Vec<Step>, udp: &Packet, udp_reply: &Packet) {
    use Side::*;
    // The backend answers the forwarded datagram of "udp datagram to a service" with
    // port unreachable (or a parameter problem, its pointer into the quote); the client
    // must see it come from the gateway, quoting what it sent.
    let sent = forwarded(udp, sa(B2, 5353));
    let mut quote = udp.clone().ttl(sent.ttl).quote();
    quote[26..28].copy_from_slice(&sent.quote()[26..28]); // quoted L4 checksums are left alone
    for (name, kind, code, rest) in [
        (
            "icmp port unreachable from a backend is translated for the client",
            3,
            3,
            0,
        ),
        (
            "icmp parameter problem from a backend is translated for the client",
            12,
            0,
            20 << 24,
        ),
    ] {
        let error = from_backend(Packet::icmp_error(
            B2,
            CLIENT,
            kind,
            code,
            rest,
            &sent.quote(),
        ));
        let out = Packet::icmp_error(GW, CLIENT, kind, code, rest, &quote)
            .ttl(63)
            .macs(FX0_MAC, CLIENT_MAC);
        s.push(case(
            name,
            Backend,
            error.frame(),
            XDP_REDIRECT,
            Some(out.frame()),
        ));
    }
    // A router on the client side cannot forward a reply without fragmenting it.
    let router = Ipv4Addr::new(10, 250, 1, 254);
    let reply_sent = replied(udp_reply, gw(53));
    let frag_needed = from_client(Packet::icmp_error(
        router,
        GW,
        3,
        4,
        1400,
        &reply_sent.quote(),
    ));
    let mut quote = udp_reply.clone().ttl(reply_sent.ttl).quote();
    quote[26..28].copy_from_slice(&reply_sent.quote()[26..28]);
    let frag_needed_out = Packet::icmp_error(router, B2, 3, 4, 1400, &quote)
        .ttl(63)
        .macs(FX1_MAC, mac_of(B2));
    s.push(case(
        "icmp fragmentation needed about a reply is translated for the backend",
        Client,
        frag_needed.frame(),
        XDP_REDIRECT,
        Some(frag_needed_out.frame()),
    ));
    let stranger = Packet::udp(sa(B2, 5353), client(59999));
    let untracked = from_backend(Packet::icmp_error(CLIENT, B2, 3, 3, 0, &stranger.quote()));
    s.push(case(
        "an icmp error about an untracked flow passes untouched",
        Backend,
        untracked.frame(),
        XDP_PASS,
        None,
    ));
}

/// Weights.
fn weight_steps(s: &mut Vec<Step>) {
    use Side::*;
    for port in 41000..41008 {
        let p = from_client(Packet::tcp(client(port), gw(81)).flags(SYN));
        s.push(case(
            format!("a weight 0 backend gets no new flow (client port {port})"),
            Client,
            p.frame(),
            XDP_REDIRECT,
            Some(forwarded(&p, sa(B3, 8081)).frame()),
        ));
    }
    let p = from_client(Packet::udp(client(50011), gw(55)));
    s.push(case(
        "a new flow to a service whose backends all have weight 0 is dropped",
        Client,
        p.frame(),
        XDP_DROP,
        None,
    ));
}

/// Conntrack across backend changes.
fn backend_change_steps(s: &mut Vec<Step>) {
    use Side::*;
    let before = [wb(B1, 9000, 1), wb(B2, 9000, 1)];
    let grown = [wb(B1, 9000, 1), wb(B2, 9000, 1), wb(B3, 9000, 4)];
    let proto = 6;
    // A flow whose backend would differ under the grown table, and one on the other backend.
    let port = (42000..43000)
        .find(|&p| {
            predict(&before, client(p), gw(82), proto) != predict(&grown, client(p), gw(82), proto)
        })
        .expect("a flow that the new table would move");
    let x = predict(&before, client(port), gw(82), proto);
    let other_port = (43000..44000)
        .find(|&p| predict(&before, client(p), gw(82), proto) != x)
        .expect("a flow on the other backend");
    let y = predict(&before, client(other_port), gw(82), proto);
    let p = from_client(Packet::tcp(client(port), gw(82)));
    let q = from_client(Packet::tcp(client(other_port), gw(82)));
    s.push(case(
        "a new flow goes to the backend Maglev predicts",
        Client,
        p.frame(),
        XDP_REDIRECT,
        Some(forwarded(&p, x).frame()),
    ));
    s.push(case(
        "another new flow goes to the other backend",
        Client,
        q.frame(),
        XDP_REDIRECT,
        Some(forwarded(&q, y).frame()),
    ));
    s.push(Step::Apply(
        "add a heavy backend to the service",
        base_state().with_service(svc(Protocol::Tcp, 82), grown.to_vec()),
    ));
    s.push(case(
        "a tracked flow keeps its backend after the backend set changed",
        Client,
        p.frame(),
        XDP_REDIRECT,
        Some(forwarded(&p, x).frame()),
    ));
    let remaining: Vec<WeightedBackend> = grown
        .iter()
        .filter(|b| v4(b.endpoint) != x)
        .copied()
        .collect();
    s.push(Step::Apply(
        "remove the flow's backend",
        base_state().with_service(svc(Protocol::Tcp, 82), remaining.clone()),
    ));
    // A TCP connection keeps a backend that left its service until it ends (issue 30;
    // `tcp_state.rs` has the UDP flow that moves, and the release).
    s.push(case(
        "a TCP flow whose backend was removed keeps it",
        Client,
        p.frame(),
        XDP_REDIRECT,
        Some(forwarded(&p, x).frame()),
    ));
    let late = from_backend(Packet::tcp(x, client(port)).payload(b"late"));
    s.push(case(
        "a reply from the removed backend of a live TCP flow is translated",
        Backend,
        late.frame(),
        XDP_REDIRECT,
        Some(replied(&late, gw(82)).frame()),
    ));
    s.push(case(
        "a flow of a remaining backend stays where it was",
        Client,
        q.frame(),
        XDP_REDIRECT,
        Some(forwarded(&q, y).frame()),
    ));
}

/// Egress that takes no XDP frames.
fn no_xdp_egress_steps(s: &mut Vec<Step>) {
    use Side::*;
    // The backend side takes no XDP frames.
    s.push(Step::Xmit(vec![Side::Client]));
    let slow = from_client(Packet::udp(client(50020), gw(53)).payload(b"slow"));
    s.push(case(
        "a forward packet whose egress takes no xdp frames is translated and left to the kernel",
        Client,
        slow.frame(),
        XDP_PASS,
        Some(slow.clone().with_dst(sa(B2, 5353)).frame()),
    ));
    // The client side takes no XDP frames.
    s.push(Step::Xmit(vec![Side::Backend]));
    let slow_reply = from_backend(Packet::udp(sa(B2, 5353), client(50020)).payload(b"back"));
    s.push(case(
        "a reply whose egress takes no xdp frames goes to the kernel untranslated (tc translates it)",
        Backend,
        slow_reply.frame(),
        XDP_PASS,
        None,
    ));
    // Both sides take XDP frames again.
    s.push(Step::Xmit(vec![Side::Client, Side::Backend]));
    s.push(case(
        "the same reply is translated and redirected once its egress takes xdp frames",
        Backend,
        slow_reply.frame(),
        XDP_REDIRECT,
        Some(replied(&slow_reply, gw(53)).frame()),
    ));
}

/// Service removal: a tracked flow (`data`, a segment of tcp/80's flow) of a removed
/// service.
fn service_removal_steps(s: &mut Vec<Step>, data: &Packet) {
    use Side::*;
    let mut without_80 = base_state();
    without_80.services.remove(&svc(Protocol::Tcp, 80));
    s.push(Step::Apply("remove the tcp/80 service", without_80));
    s.push(case(
        "a tracked flow of a removed service passes untouched",
        Client,
        data.frame(),
        XDP_PASS,
        None,
    ));
}

/// Runs `steps` on `t`; returns the number of packets and the failures, described.
impl Side {
    /// The fixture interface this side's packets arrive on.
    fn ifindex(self, fx: &FixtureNet) -> u32 {
        match self {
            Side::Client => fx.fx0,
            Side::Backend => fx.fx1,
        }
    }

    /// Runs the XDP program on `frame` as received on this side: verdict and output.
    fn run(self, t: &mut TestDatapath, fx: &FixtureNet, frame: &[u8]) -> (u32, Vec<u8>) {
        fx.ns
            .enter(|| run_gateway(&mut t.dp, self.ifindex(fx), frame))
    }
}

fn run_steps(t: &mut TestDatapath, fx: &FixtureNet, steps: Vec<Step>) -> (usize, Vec<String>) {
    let mut failures = Vec::new();
    let mut count = 0;
    for step in steps {
        match step {
            Step::Apply(what, state) => {
                t.dp.apply(&state)
                    .unwrap_or_else(|e| panic!("applying {what}: {e}"));
            }
            Step::Xmit(sides) => {
                let ifindexes: Vec<u32> = sides.iter().map(|s| s.ifindex(fx)).collect();
                t.allow_redirect(&ifindexes);
            }
            Step::Restart => t.restart(),
            Step::Packet {
                name,
                ingress,
                input,
                verdict,
                output,
            } => {
                count += 1;
                let (got_verdict, got) = ingress.run(t, fx, &input);
                let want = output.unwrap_or_else(|| input.clone());
                if got_verdict != verdict || got != want {
                    failures.push(failure(
                        &name,
                        &input,
                        (verdict_name(verdict), &want),
                        (verdict_name(got_verdict), &got),
                    ));
                }
            }
            Step::Egress {
                name,
                input,
                output,
            } => {
                count += 1;
                let (verdict, got) = fx.ns.enter(|| run_tc(&mut t.dp, &input));
                let want = output.unwrap_or_else(|| input.clone());
                if verdict != TC_NEXT || got != want {
                    failures.push(failure(
                        &name,
                        &input,
                        ("tc next", &want),
                        (&format!("tc verdict {verdict:#x}"), &got),
                    ));
                }
            }
        }
    }
    (count, failures)
}

/// A case that failed, with the packets decoded.
fn failure(name: &str, input: &[u8], want: (&str, &[u8]), got: (&str, &[u8])) -> String {
    format!(
        "✗ {name}\n  input:\n    {}\n  expected {}:\n    {}\n  got {}:\n    {}",
        decode(input).replace('\n', "\n    "),
        want.0,
        decode(want.1).replace('\n', "\n    "),
        got.0,
        decode(got.1).replace('\n', "\n    "),
    )
}

fn assert_no_failures(count: usize, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} of {count} fixtures failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn packet_fixtures_give_the_expected_verdict_and_bytes() {
    let mut t = TestDatapath::load();
    let fx = FixtureNet::new();
    let (count, failures) = run_steps(&mut t, &fx, steps());
    assert!(count >= 25, "the table has {count} cases");
    assert_no_failures(count, &failures);

    let c = t.dp.counters().expect("counters");
    let expect = [
        ("drop_malformed", 3),
        ("drop_fragment", 1),
        ("drop_no_backend", 1),
        ("icmp_translated", 3),
        ("fragment_translated", 1),
        ("tx", 1),
        // A TCP flow keeps a backend that left (`tcp_state.rs` counts the flows
        // balanced again).
        ("backend_gone", 0),
        // The flow of the removed service.
        ("ct_stale_service", 1),
        ("kernel_forward_frag_needed", 1),
        ("kernel_forward_no_neighbour", 1),
        ("kernel_forward_ttl", 1),
        ("kernel_forward_no_xdp_egress", 2),
    ];
    for (name, want) in expect {
        assert_eq!(c[name], want, "counter {name} (all: {c:?})");
    }
}

/// A flow of service S1 (tcp/84 → B1:7000), established; then S1 is removed and an
/// unrelated service S2 (tcp/85, another route to the same backend endpoint) is
/// installed, taking S1's service and backend slots. Old flows must not be forwarded,
/// and their replies not translated, as if they were still S1's: a packet to tcp/84 is
/// a packet to no service (passes untouched, the host answers it), and an ICMP error
/// about the old flow is not the gateway's to rewrite. A reply from B1 to the old
/// flow's client is never translated to S1's address: it cannot be told from a reply
/// of an S2 flow from the same client port begun on another gateway (S2's Maglev maps
/// that tuple to B1, its one backend), so it is taken for one (issue 26). A service
/// installed on tcp/84 again balances the old flow's next packet afresh. With
/// `restart`, the daemon restarts between S1's removal and S2's installation.
fn reuse_steps(restart: bool) -> Vec<Step> {
    use Side::*;
    let backend = || vec![wb(B1, 7000, 1)];
    let s1 = || DesiredState::default().with_service(svc(Protocol::Tcp, 84), backend());
    let s2 = DesiredState::default().with_service(svc(Protocol::Tcp, 85), backend());
    let p = from_client(Packet::tcp(client(45000), gw(84)).payload(b"old"));
    let r = from_backend(Packet::tcp(sa(B1, 7000), client(45000)).payload(b"old reply"));
    // The same reply as the kernel forwards it out of fx0.
    let r_kernel = r.clone().ttl(r.ttl - 1).macs(FX0_MAC, CLIENT_MAC);
    let sent = forwarded(&p, sa(B1, 7000));
    let unreach = from_backend(Packet::icmp_error(B1, CLIENT, 3, 3, 0, &sent.quote()));
    let q = from_client(Packet::tcp(client(45001), gw(85)).flags(SYN));
    let mut steps = vec![
        Step::Xmit(vec![Client, Backend]),
        Step::Apply("S1", s1()),
        case(
            "a flow to S1 is DNATed to its backend",
            Client,
            p.frame(),
            XDP_REDIRECT,
            Some(sent.frame()),
        ),
        case(
            "its reply is reverse-NATed to S1's address",
            Backend,
            r.frame(),
            XDP_REDIRECT,
            Some(replied(&r, gw(84)).frame()),
        ),
        Step::Apply("S1 removed", DesiredState::default()),
    ];
    if restart {
        steps.push(Step::Restart);
    }
    steps.extend([
        Step::Apply("S2 takes S1's service and backend slots", s2),
        case(
            "a packet of the removed service's flow passes untouched",
            Client,
            p.frame(),
            XDP_PASS,
            None,
        ),
        case(
            "an icmp error about the removed service's flow passes untranslated",
            Backend,
            unreach.frame(),
            XDP_PASS,
            None,
        ),
        Step::Egress {
            name: "tc takes a reply of the removed service's flow for S2's, by Maglev".into(),
            input: r_kernel.frame(),
            output: Some(r_kernel.clone().with_src(gw(85)).frame()),
        },
        case(
            "so does xdp, from the entry tc recorded, never as S1's",
            Backend,
            r.frame(),
            XDP_REDIRECT,
            Some(replied(&r, gw(85)).frame()),
        ),
        case(
            "a new flow to S2 is DNATed to the same backend",
            Client,
            q.frame(),
            XDP_REDIRECT,
            Some(forwarded(&q, sa(B1, 7000)).frame()),
        ),
        Step::Apply("S2 removed", DesiredState::default()),
        Step::Apply("S1 installed again", s1()),
        case(
            "the old flow's next packet is balanced afresh by the service now on its port",
            Client,
            p.frame(),
            XDP_REDIRECT,
            Some(sent.frame()),
        ),
    ]);
    steps
}

/// Runs `reuse_steps` and checks what was counted.
fn check_reuse(limits: Limits, restart: bool) {
    let mut t = TestDatapath::load_with(limits);
    let fx = FixtureNet::new();
    let (count, failures) = run_steps(&mut t, &fx, reuse_steps(restart));
    assert_no_failures(count, &failures);
    let c = t.dp.counters().expect("counters");
    // The forward packet, and again once S1 is back. (The reply and the icmp error find
    // no entry: replies are found through the reply index, which names S2 only.)
    assert_eq!(c["ct_stale_service"], 2, "all: {c:?}");
    // The reply is taken for S2's by Maglev (TC, which records it; XDP then finds it).
    assert_eq!(c["ct_miss_reply"], 1, "all: {c:?}");
    assert_eq!(c["reply_untracked"], 0, "all: {c:?}");
    assert_eq!(
        c["new_flow"], 3,
        "the old flow twice, S2's flow; the reply is none; all: {c:?}"
    );
    // The old flow's packets carry no SYN: both found no entry that applied.
    assert_eq!(c["ct_miss_midflow"], 2, "all: {c:?}");
    assert_eq!(c["backend_gone"], 0, "all: {c:?}");
}

#[test]
fn a_flow_of_a_removed_service_is_not_served_by_the_service_given_its_ids() {
    // One service slot and one backend slot: every service gets the same ids, as a
    // daemon's ids come round again once it has used them all.
    let limits = Limits {
        services: 1,
        backends: 1,
        ..test_limits()
    };
    check_reuse(limits, false);
}

#[test]
fn a_flow_of_a_removed_service_is_not_served_by_the_service_given_its_ids_after_a_restart() {
    // A restarted daemon hands out ids from the highest in use: with none in use, S1's.
    check_reuse(test_limits(), true);
}

#[test]
fn service_counters_count_packets_bytes_and_flows_per_direction() {
    let mut t = TestDatapath::load();
    let fx = FixtureNet::new();
    t.dp.apply(&base_state()).expect("apply");
    t.allow_redirect(&[fx.fx0, fx.fx1]);
    let fwd = from_client(Packet::udp(client(51000), gw(53)).payload(&[1; 100]));
    let rev = from_backend(Packet::udp(sa(B2, 5353), client(51000)).payload(&[1; 50]));
    fx.ns.enter(|| {
        for _ in 0..3 {
            assert_eq!(run_gateway(&mut t.dp, fx.fx0, &fwd.frame()).0, XDP_REDIRECT);
        }
        assert_eq!(run_gateway(&mut t.dp, fx.fx1, &rev.frame()).0, XDP_REDIRECT);
    });
    let stats = t.dp.service_stats().expect("stats");
    let s = stats[&svc(Protocol::Udp, 53)];
    assert_eq!((s.packets, s.bytes), (3, 3 * 128), "forward");
    assert_eq!((s.reply_packets, s.reply_bytes), (1, 78), "reply");
    assert_eq!(s.new_flows, 1);
    assert!(
        !stats.contains_key(&svc(Protocol::Tcp, 80)),
        "other services untouched (and so not listed): {stats:?}"
    );
}

/// What the TC egress program does with one frame leaving an `--interface`.
struct TcCase {
    name: &'static str,
    input: Vec<u8>,
    /// None: the frame leaves unchanged.
    output: Option<Vec<u8>>,
}

#[test]
fn tc_egress_translates_what_the_kernel_forwarded_and_nothing_else() {
    let mut t = TestDatapath::load();
    let fx = FixtureNet::new();
    t.dp.apply(&base_state()).expect("apply");
    // The backend side takes no XDP frames: XDP translates forward packets and hands
    // them to the kernel, and replies come back through the kernel untranslated.
    t.allow_redirect(&[fx.fx0]);
    let udp = from_client(Packet::udp(client(52000), gw(53)).payload(b"query"));
    let tcp = from_client(Packet::tcp(client(42000), gw(80)).flags(SYN));
    fx.ns.enter(|| {
        for p in [&udp, &tcp] {
            assert_eq!(run_gateway(&mut t.dp, fx.fx0, &p.frame()).0, XDP_PASS);
        }
    });
    let cases = tc_cases(&udp);
    let mut failures = Vec::new();
    for case in &cases {
        let (verdict, got) = fx.ns.enter(|| run_tc(&mut t.dp, &case.input));
        let want = case.output.clone().unwrap_or_else(|| case.input.clone());
        if verdict != TC_NEXT || got != want {
            failures.push(failure(
                case.name,
                &case.input,
                ("tc next", &want),
                (&format!("tc verdict {verdict:#x}"), &got),
            ));
        }
    }
    assert_no_failures(cases.len(), &failures);
    let c = t.dp.counters().expect("counters");
    assert_eq!(c["tc_reply_translated"], 4, "all: {c:?}");
    assert_eq!(c["ct_miss_reply"], 1, "all: {c:?}");
    assert_eq!(c["tc_icmp_translated"], 2, "all: {c:?}");
    assert_eq!(c["kernel_forward_no_xdp_egress"], 2, "all: {c:?}");
    let stats = t.dp.service_stats().expect("stats");
    let s = stats[&svc(Protocol::Udp, 53)];
    assert_eq!(
        s.reply_packets, 3,
        "replies the TC program translated are counted"
    );
    assert_eq!(
        s.kernel_packets, 4,
        "the forward packet and the three replies took the kernel's path"
    );
    let recorded = gateway_common::FlowKey {
        src: u32::from(CLIENT).to_be(),
        dst: u32::from(GW).to_be(),
        sport: 59999u16.to_be(),
        dport: 53u16.to_be(),
        proto: 17,
        pad: [0; 3],
    };
    assert!(
        t.conntrack().get(&recorded, 0).is_ok(),
        "the matched reply's flow is recorded"
    );
}

/// The cases of `tc_egress_translates_what_the_kernel_forwarded_and_nothing_else`, after
/// XDP handed the kernel the client's datagram `udp` (and a tcp syn from client port
/// 42000).
fn tc_cases(udp: &Packet) -> [TcCase; 9] {
    // As the kernel forwards them out of fx0 (TTL decremented, MACs of the client side).
    let out = |p: Packet| p.ttl(63).macs(FX0_MAC, CLIENT_MAC);
    let udp_reply = out(Packet::udp(sa(B2, 5353), client(52000)).payload(b"answer"));
    let tcp_reply = out(Packet::tcp(sa(B1, 8080), client(42000)).payload(b"HTTP/1.0 200"));
    let nocsum = out(Packet::udp(sa(B2, 5353), client(52000)).no_udp_checksum());
    // The gateway's own kernel cannot forward the translated datagram without
    // fragmenting it: its frag-needed quotes the backend's address.
    let sent = udp.clone().with_dst(sa(B2, 5353)).ttl(63);
    let mut quote = udp.clone().ttl(63).quote();
    quote[26..28].copy_from_slice(&sent.quote()[26..28]); // quoted L4 checksums are left alone
    let own = Ipv4Addr::new(10, 250, 1, 1);
    let frag_needed = out(Packet::icmp_error(own, CLIENT, 3, 4, 1280, &sent.quote()));
    let frag_needed_out = out(Packet::icmp_error(own, CLIENT, 3, 4, 1280, &quote));
    let unreach = out(Packet::icmp_error(B2, CLIENT, 3, 3, 0, &sent.quote()));
    let unreach_out = out(Packet::icmp_error(GW, CLIENT, 3, 3, 0, &quote));
    // A reply of a flow begun on another gateway (it arrived on an interface without
    // XDP): Maglev maps its tuple to the backend it came from.
    let other_gateways = out(Packet::udp(sa(B2, 5353), client(59999)).payload(b"answer"));
    // A packet from a backend of tcp/82 whose tuple Maglev maps to the other backend.
    let tcp82 = [wb(B1, 9000, 1), wb(B2, 9000, 1)];
    let port = (43000..44000)
        .find(|&p| predict(&tcp82, client(p), gw(82), 6) != sa(B1, 9000))
        .expect("a tuple Maglev maps to B2");
    let elsewhere = out(Packet::tcp(sa(B1, 9000), client(port)));
    [
        TcCase {
            name: "a udp reply the kernel forwarded leaves from the gateway address and port",
            output: Some(udp_reply.clone().with_src(gw(53)).frame()),
            input: udp_reply.frame(),
        },
        TcCase {
            name: "a tcp reply the kernel forwarded leaves from the gateway address and port",
            output: Some(tcp_reply.clone().with_src(gw(80)).frame()),
            input: tcp_reply.frame(),
        },
        TcCase {
            name: "a udp reply without checksum keeps a zero checksum",
            output: Some(nocsum.clone().with_src(gw(53)).frame()),
            input: nocsum.frame(),
        },
        TcCase {
            name: "fragmentation needed from the gateway itself quotes the gateway address",
            input: frag_needed.frame(),
            output: Some(frag_needed_out.frame()),
        },
        TcCase {
            name: "an icmp error the backend sent comes from the gateway address",
            input: unreach.frame(),
            output: Some(unreach_out.frame()),
        },
        TcCase {
            name: "a reply xdp already translated is not translated again",
            input: udp_reply.clone().with_src(gw(53)).frame(),
            output: None,
        },
        TcCase {
            name: "a forward packet leaves untouched",
            input: out(Packet::udp(client(52000), sa(B2, 5353))).frame(),
            output: None,
        },
        TcCase {
            name: "a reply with no entry whose tuple maglev maps to its backend is translated",
            output: Some(other_gateways.clone().with_src(gw(53)).frame()),
            input: other_gateways.frame(),
        },
        TcCase {
            name: "a packet of no flow whose tuple maglev maps to another backend leaves untouched",
            input: elsewhere.frame(),
            output: None,
        },
    ]
}

#[path = "fixtures/affinity.rs"]
mod affinity;
#[path = "fixtures/ecmp.rs"]
mod ecmp;
#[path = "fixtures/entries.rs"]
mod entries;
#[path = "fixtures/ipv6.rs"]
mod ipv6;
#[path = "fixtures/monitor.rs"]
mod monitor;
#[path = "fixtures/snat.rs"]
mod snat;
#[path = "fixtures/spoof.rs"]
mod spoof;
#[path = "fixtures/tcp_state.rs"]
mod tcp_state;
