//! The bench's fixture network and desired state: the services every case runs on.

use std::net::{IpAddr, Ipv4Addr};

use berth::datapath::{DesiredState, Protocol, ServiceAddr, WeightedBackend};
use berth_tests::xdp::{net::*, FixtureNet};
use gateway_common::{flow_hash, proto, snat_port_slot};

use crate::{REPLY_CLIENTS, REPLY_CLIENTS6, RING, RING_BASE, SNAT_RING_BASE};

/// The SNAT port pool.
const SNAT_PORTS: std::ops::RangeInclusive<u16> = 1024..=65535;
/// Backend endpoints of the SNAT new-flow service (each has its own port pool).
const SNAT_BACKENDS: u16 = 64;

/// The SNAT identity flow: its service port and client port (see `snat_identity`).
#[derive(Clone, Copy)]
pub struct SnatIdentity {
    pub service: u16,
    pub client_port: u16,
}

/// A UDP service port in `ports` and a client port for which a SNAT flow from
/// `client` to the gateway gets the client port as its node port on the first try
/// (node address = client): the forward and reply rewrites are then identities.
pub fn snat_identity(client: Ipv4Addr, ports: std::ops::Range<u16>) -> SnatIdentity {
    let pool: Vec<u16> = SNAT_PORTS.collect();
    let (service, client_port) = ports
        .flat_map(|svc| pool.iter().map(move |&c| (svc, c)))
        .find(|&(svc, c)| {
            let h = flow_hash(
                u32::from(client).to_be(),
                u32::from(GW).to_be(),
                c.to_be(),
                svc.to_be(),
                proto::UDP,
            );
            pool[snat_port_slot(h, 0, pool.len() as u32) as usize - 1] == c
        })
        .expect("a service and client port whose node port is the client port");
    SnatIdentity {
        service,
        client_port,
    }
}

/// The fixture namespace with the routes and neighbours the cases need.
pub fn fixture() -> FixtureNet {
    let fx = FixtureNet::new();
    // The gateway address routes out of fx1, like a backend.
    fx.ns.ip(&["route", "add", "10.250.0.100/32", "dev", "fx1"]);
    // And the IPv6 gateway address.
    fx.ns
        .ip(&["-6", "route", "add", &format!("{GW6}/128"), "dev", "fx1"]);
    let gw_mac = [2, 0, 0, 0, 0, 0x64];
    fx.neighbour(GW.into(), gw_mac, "fx1");
    fx.neighbour(GW6.into(), gw_mac, "fx1");
    // The clients the reply misses go to: on fx0, resolved.
    for ip in REPLY_CLIENTS.into_iter().chain(REPLY_CLIENTS6) {
        fx.neighbour(ip, CLIENT_MAC, "fx0");
    }
    fx
}

/// The 9 backends (3 addresses, 3 ports, weights 1 to 3) of the services on port 54
/// (UDP) and 56 (TCP), of `ips`' family.
pub fn nine_backends(ips: [IpAddr; 3]) -> Vec<WeightedBackend> {
    ips.iter()
        .flat_map(|&b| {
            (0..3).map(move |i| WeightedBackend {
                endpoint: std::net::SocketAddr::new(b, 8080 + i),
                weight: 1 + i,
            })
        })
        .collect()
}

/// One backend of weight 1.
fn one(e: std::net::SocketAddr) -> Vec<WeightedBackend> {
    vec![WeightedBackend {
        endpoint: e,
        weight: 1,
    }]
}

fn gw4(protocol: Protocol, port: u16) -> ServiceAddr {
    ServiceAddr {
        addr: GW.into(),
        protocol,
        port,
    }
}

/// `state` with a ring of `RING` services of `protocol` from port `base`: service
/// `base + i` balances to the address of `base + (i + 1) % RING` (`at`), by `with`.
fn ring(
    state: DesiredState,
    protocol: Protocol,
    base: u16,
    svc: impl Fn(Protocol, u16) -> ServiceAddr,
    at: impl Fn(u16) -> std::net::SocketAddr,
    with: fn(DesiredState, ServiceAddr, Vec<WeightedBackend>) -> DesiredState,
) -> DesiredState {
    (0..RING as u16).fold(state, |state, i| {
        let next = base + (i + 1) % RING as u16;
        with(state, svc(protocol, base + i), one(at(next)))
    })
}

/// Every service of the bench: IPv4 router-mode (identity UDP 53, 9-backend UDP 54 and
/// TCP 56, the UDP and TCP rings), SNAT (the identity flow's, UDP 55 of many backends,
/// the SNAT ring) and their IPv6 twins (`ipv6_services`).
pub fn desired_state(snat: SnatIdentity) -> DesiredState {
    let gw = |port| std::net::SocketAddr::from(sa(GW, port));
    let backends = nine_backends([B1.into(), B2.into(), B3.into()]);
    let state = DesiredState::default()
        .with_service(gw4(Protocol::Udp, 53), one(gw(53)))
        .with_service(gw4(Protocol::Udp, 54), backends.clone())
        .with_service(gw4(Protocol::Tcp, 56), backends);
    let with = DesiredState::with_service;
    // The new-flow ring: service RING_BASE + i balances to RING_BASE + (i + 1) % RING.
    let state = ring(state, Protocol::Udp, RING_BASE, gw4, gw, with);
    // The same ring for TCP SYNs.
    let state = ring(state, Protocol::Tcp, RING_BASE, gw4, gw, with);
    // SNAT services beside them. The node address is the client's (see the top).
    let snat_backends = [B1, B2, B3]
        .iter()
        .flat_map(|&b| {
            (0..SNAT_BACKENDS / 3).map(move |i| WeightedBackend {
                endpoint: sa(b, 9000 + i).into(),
                weight: 1,
            })
        })
        .collect();
    let state = state
        .with_snat_service(gw4(Protocol::Udp, snat.service), one(gw(snat.service)))
        .with_snat_service(gw4(Protocol::Udp, 55), snat_backends)
        .with_snat_ports(vec![SNAT_PORTS]);
    let with_snat = DesiredState::with_snat_service;
    let state = ring(state, Protocol::Udp, SNAT_RING_BASE, gw4, gw, with_snat);
    ipv6_services(state)
}

/// `state` with the IPv6 twins of the router-mode services on `GW6`: the identity
/// service (UDP 53), the 9-backend services (UDP 54, TCP 56) and the UDP and TCP rings.
fn ipv6_services(state: DesiredState) -> DesiredState {
    let gw6 = |port| std::net::SocketAddr::from(sa6(GW6, port));
    let svc6 = |protocol, port| ServiceAddr {
        addr: IpAddr::V6(GW6),
        protocol,
        port,
    };
    let backends = nine_backends([B1_6.into(), B2_6.into(), B3_6.into()]);
    let state = state
        .with_service(svc6(Protocol::Udp, 53), one(gw6(53)))
        .with_service(svc6(Protocol::Udp, 54), backends.clone())
        .with_service(svc6(Protocol::Tcp, 56), backends);
    let with = DesiredState::with_service;
    let state = ring(state, Protocol::Udp, RING_BASE, svc6, gw6, with);
    ring(state, Protocol::Tcp, RING_BASE, svc6, gw6, with)
}
