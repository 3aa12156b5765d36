//! The cases: the packets of each path the bench measures (see the top of `main.rs`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use berth::datapath::{WeightedBackend, FLOOR_PROGRAM, PROGRAM};
use berth_tests::{
    packet::{Packet, Packet6, ACK, SYN},
    xdp::{maglev_pick, net::*, XDP_PASS, XDP_REDIRECT},
};
use gateway_common::proto;

use crate::{
    state::{nine_backends, SnatIdentity},
    MIDFLOW_CLIENTS, MIDFLOW_CLIENTS6, REPLY_CLIENTS, REPLY_CLIENTS6, RING_BASE, SNAT_RING_BASE,
};

/// A frame for sample (or hot run) `n`.
type FrameFn = Box<dyn Fn(usize) -> Vec<u8> + Send + Sync>;

pub struct Case {
    pub name: &'static str,
    pub key: &'static str,
    pub program: &'static str,
    pub ingress: u32,
    pub verdict: u32,
    /// Frame for sample `n` (distinct per sample only for new flows).
    pub frame: FrameFn,
    /// Frame for hot run `n`, when it differs from the cold one.
    pub hot_frame: Option<FrameFn>,
}

/// The gateway's MAC as the backends' side sees it (a reply's destination's source).
const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x64];

fn gw(port: u16) -> SocketAddrV4 {
    sa(GW, port)
}

fn gw6(port: u16) -> SocketAddrV6 {
    sa6(GW6, port)
}

fn udp(src: SocketAddrV4, dst: SocketAddrV4) -> Packet {
    Packet::udp(src, dst).payload(&[0u8; 18]).ttl(255)
}

fn udp6(src: SocketAddrV6, dst: SocketAddrV6) -> Packet6 {
    Packet6::udp(src, dst).payload(&[0u8; 18]).hop_limit(255)
}

fn to_gw(p: Packet) -> Vec<u8> {
    p.macs(CLIENT_MAC, FX0_MAC).frame()
}

fn to_gw6(p: Packet6) -> Vec<u8> {
    p.macs(CLIENT_MAC, FX0_MAC).frame()
}

/// A reply from the gateway's address (a ring service's, or the identity service's).
fn from_gw(p: Packet) -> Vec<u8> {
    p.macs(GW_MAC, FX1_MAC).frame()
}

fn from_gw6(p: Packet6) -> Vec<u8> {
    p.macs(GW_MAC, FX1_MAC).frame()
}

/// The frames the same every sample (one flow's, or a miss's); the established ones
/// are sent once before measuring, to open their flows.
pub struct Frames {
    pub established: Vec<u8>,
    reply: Vec<u8>,
    miss: Vec<u8>,
    pub snat_established: Vec<u8>,
    snat_reply: Vec<u8>,
    pub established6: Vec<u8>,
    reply6: Vec<u8>,
    miss6: Vec<u8>,
}

impl Frames {
    pub fn new(snat: SnatIdentity) -> Self {
        let snat_client = sa(CLIENT, snat.client_port);
        let miss6_dst = sa6(Ipv6Addr::new(0xfd00, 0x250, 9, 0, 0, 0, 0, 0x909), 53);
        Frames {
            established: to_gw(udp(sa(CLIENT, 40000), gw(53))),
            reply: from_gw(udp(gw(53), sa(CLIENT, 40000))),
            miss: to_gw(udp(sa(CLIENT, 40000), sa(Ipv4Addr::new(10, 250, 9, 9), 53))),
            snat_established: to_gw(udp(snat_client, gw(snat.service))),
            snat_reply: from_gw(udp(gw(snat.service), snat_client)),
            established6: to_gw6(udp6(sa6(CLIENT6, 40000), gw6(53))),
            reply6: from_gw6(udp6(gw6(53), sa6(CLIENT6, 40000))),
            miss6: to_gw6(udp6(sa6(CLIENT6, 40000), miss6_dst)),
        }
    }
}

/// A packet the same every sample: one flow's, or a miss's.
fn one(name: &'static str, key: &'static str, ingress: u32, verdict: u32, frame: &[u8]) -> Case {
    let frame = frame.to_vec();
    Case {
        name,
        key,
        program: PROGRAM,
        ingress,
        verdict,
        frame: Box::new(move |_| frame.clone()),
        hot_frame: None,
    }
}

/// A new flow every sample, redirected; hot runs go to the next of a ring's services.
fn new_flow(
    name: &'static str,
    key: &'static str,
    ingress: u32,
    cold: impl Fn(usize) -> Vec<u8> + Send + Sync + 'static,
    hot: impl Fn(usize) -> Vec<u8> + Send + Sync + 'static,
) -> Case {
    Case {
        name,
        key,
        program: PROGRAM,
        ingress,
        verdict: XDP_REDIRECT,
        frame: Box::new(cold),
        hot_frame: Some(Box::new(hot)),
    }
}

/// A distinct client address and port per sample: every one is a new flow.
fn new_client(n: usize) -> SocketAddrV4 {
    sa(
        Ipv4Addr::new(10, 250, 1, 100 + (n / 60000) as u8),
        1024 + (n % 60000) as u16,
    )
}

fn new_client6(n: usize) -> SocketAddrV6 {
    let host = 0x100 + (n / 60000) as u16;
    sa6(
        Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, host),
        1024 + (n % 60000) as u16,
    )
}

/// The client of hot run `n` of a ring (its own address `host` per case).
fn ring4(host: u8, n: usize) -> SocketAddrV4 {
    sa(Ipv4Addr::new(10, 250, 1, host), 1024 + n as u16)
}

fn ring6(host: u16, n: usize) -> SocketAddrV6 {
    sa6(
        Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, host),
        1024 + n as u16,
    )
}

/// Clients of no other case: 60000 ports on each of two addresses.
fn client_of(ips: &[IpAddr], n: usize) -> SocketAddr {
    SocketAddr::new(ips[(n / 60000) % 2], 1024 + (n % 60000) as u16)
}

/// A reply to `client` from the backend Maglev maps its flow to `service` to.
fn answer(backends: &[WeightedBackend], client: SocketAddr, service: SocketAddr) -> SocketAddr {
    maglev_pick(backends, client, service, proto::UDP).expect("a backend with weight")
}

/// Every case, the floor first.
pub fn cases(fx0: u32, fx1: u32, f: &Frames) -> Vec<Case> {
    let floor = Case {
        program: FLOOR_PROGRAM,
        ..one(
            "floor (empty XDP program)",
            "floor_ns",
            fx0,
            XDP_PASS,
            &f.established,
        )
    };
    let mut cases = vec![floor];
    cases.extend(cases4(fx0, fx1, f));
    cases.extend(snat_cases(fx0, fx1, f));
    cases.extend(cases6(fx0, fx1, f));
    cases
}

/// The IPv4 router-mode cases.
fn cases4(fx0: u32, fx1: u32, f: &Frames) -> Vec<Case> {
    let syn = |src, dst| Packet::tcp(src, dst).flags(SYN).ttl(255);
    let ack = |src, dst| Packet::tcp(src, dst).flags(ACK).ttl(255);
    let udp54 = nine_backends([B1.into(), B2.into(), B3.into()]);
    vec![
        one(
            "established flow (conntrack hit, DNAT, redirect)",
            "established_ns",
            fx0,
            XDP_REDIRECT,
            &f.established,
        ),
        one(
            "reply (reverse NAT, redirect)",
            "reply_ns",
            fx1,
            XDP_REDIRECT,
            &f.reply,
        ),
        one(
            "miss (not a service, passes untouched)",
            "miss_ns",
            fx0,
            XDP_PASS,
            &f.miss,
        ),
        new_flow(
            "new flow (Maglev, 1 conntrack insert, FIB, DNAT)",
            "new_flow_ns",
            fx0,
            move |n| to_gw(udp(new_client(n), gw(54))),
            move |n| to_gw(udp(ring4(200, n), gw(RING_BASE))),
        ),
        new_flow(
            "new TCP flow (SYN: no conntrack lookup, 1 insert)",
            "syn_new_flow_ns",
            fx0,
            move |n| to_gw(syn(new_client(n), gw(56))),
            move |n| to_gw(syn(ring4(203, n), gw(RING_BASE))),
        ),
        new_flow(
            "new flow over the flood guard (not recorded)",
            "flood_new_flow_ns",
            fx0,
            move |n| to_gw(udp(new_client(n), gw(54))),
            move |n| to_gw(udp(ring4(202, n), gw(RING_BASE))),
        ),
        new_flow(
            "midflow miss (TCP ACK, no entry: Maglev, 1 insert)",
            "midflow_miss_ns",
            fx0,
            move |n| to_gw(ack(v4(client_of(&MIDFLOW_CLIENTS, n)), gw(56))),
            move |n| to_gw(ack(ring4(204, n), gw(RING_BASE))),
        ),
        new_flow(
            "reply miss (no entry: Maglev match, 1 insert)",
            "reply_miss_ns",
            fx1,
            move |n| {
                let client = v4(client_of(&REPLY_CLIENTS, n));
                let backend = v4(answer(&udp54, client.into(), gw(54).into()));
                udp(backend, client)
                    .macs(mac_of(*backend.ip()), FX1_MAC)
                    .frame()
            },
            // A reply from service i+1's address: service i's backend's.
            move |n| from_gw(udp(gw(RING_BASE + 1), ring4(204, n))),
        ),
    ]
}

/// The IPv4 SNAT-mode cases.
fn snat_cases(fx0: u32, fx1: u32, f: &Frames) -> Vec<Case> {
    vec![
        one(
            "SNAT established flow (conntrack hit, DNAT+SNAT)",
            "snat_established_ns",
            fx0,
            XDP_REDIRECT,
            &f.snat_established,
        ),
        one(
            "SNAT reply (reverse NAT of both ends, redirect)",
            "snat_reply_ns",
            fx1,
            XDP_REDIRECT,
            &f.snat_reply,
        ),
        new_flow(
            "SNAT new flow (Maglev, port claim, 2 inserts, FIB)",
            "snat_new_flow_ns",
            fx0,
            move |n| to_gw(udp(new_client(n), gw(55))),
            move |n| to_gw(udp(ring4(201, n), gw(SNAT_RING_BASE))),
        ),
    ]
}

/// The IPv6 cases.
fn cases6(fx0: u32, fx1: u32, f: &Frames) -> Vec<Case> {
    let syn6 = |src, dst| Packet6::tcp(src, dst).flags(SYN).hop_limit(255);
    let ack6 = |src, dst| Packet6::tcp(src, dst).flags(ACK).hop_limit(255);
    let backends6 = nine_backends([B1_6.into(), B2_6.into(), B3_6.into()]);
    vec![
        one(
            "IPv6 established flow (conntrack hit, DNAT, redirect)",
            "v6_established_ns",
            fx0,
            XDP_REDIRECT,
            &f.established6,
        ),
        one(
            "IPv6 reply (reverse NAT, redirect)",
            "v6_reply_ns",
            fx1,
            XDP_REDIRECT,
            &f.reply6,
        ),
        one(
            "IPv6 miss (not a service, passes untouched)",
            "v6_miss_ns",
            fx0,
            XDP_PASS,
            &f.miss6,
        ),
        new_flow(
            "IPv6 new flow (Maglev, 1 conntrack insert, FIB, DNAT)",
            "v6_new_flow_ns",
            fx0,
            move |n| to_gw6(udp6(new_client6(n), gw6(54))),
            move |n| to_gw6(udp6(ring6(0x200, n), gw6(RING_BASE))),
        ),
        new_flow(
            "IPv6 new TCP flow (SYN: no conntrack lookup, 1 insert)",
            "v6_syn_new_flow_ns",
            fx0,
            move |n| to_gw6(syn6(new_client6(n), gw6(56))),
            move |n| to_gw6(syn6(ring6(0x203, n), gw6(RING_BASE))),
        ),
        new_flow(
            "IPv6 midflow miss (TCP ACK, no entry: Maglev, 1 insert)",
            "v6_midflow_miss_ns",
            fx0,
            move |n| to_gw6(ack6(v6(client_of(&MIDFLOW_CLIENTS6, n)), gw6(56))),
            move |n| to_gw6(ack6(ring6(0x204, n), gw6(RING_BASE))),
        ),
        new_flow(
            "IPv6 reply miss (no entry: Maglev match, 1 insert)",
            "v6_reply_miss_ns",
            fx1,
            move |n| {
                let client = v6(client_of(&REPLY_CLIENTS6, n));
                let backend = v6(answer(&backends6, client.into(), gw6(54).into()));
                udp6(backend, client)
                    .macs(mac_of6(*backend.ip()), FX1_MAC)
                    .frame()
            },
            move |n| from_gw6(udp6(gw6(RING_BASE + 1), ring6(0x204, n))),
        ),
    ]
}
