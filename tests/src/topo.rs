//! A small network of namespaces: a client, a gateway running the XDP program on its
//! interfaces, and backends running real servers (nginx for TCP, dnsmasq for UDP/DNS).
//!
//! ```text
//!  client (10.251.1.2) ──c0── gateway ──b1── backend 1 (10.251.11.2)
//!                                     ──b2── backend 2 (10.251.12.2)  ...
//! ```
//! Every link also carries IPv6, in the subnet that mirrors its IPv4 one (10.251.11.0/24
//! beside fd00:251:11::/64, see `mirror6`), with routes as for IPv4. The gateway
//! addresses 10.251.0.100 and fd00:251::100 are on no interface of this network: the
//! XDP program answers them (`berth run` also puts them on a dummy interface of its
//! own, `berth0`); the client's routes send them to the gateway.
//! `Topology::new` leaves the veths as the kernel makes them (GRO off);
//! `Topology::with_gro` turns GRO on, which lets the program redirect into them;
//! `Topology::with_links` sets the client's and the backends' links apart. The
//! backends' servers and the clients' requests are in `servers`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::netns::Netns;

mod servers;
pub use servers::*;

/// The shared gateway address.
pub const GW: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 100);
/// The shared gateway's IPv6 address (`mirror6(GW)`).
pub const GW6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x251, 0, 0, 0, 0, 0, 0x100);
/// The client's address.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 2);
/// The client's IPv6 address (`mirror6(CLIENT)`).
pub const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x251, 1, 0, 0, 0, 0, 2);
/// nginx's port on every backend.
pub const HTTP_PORT: u16 = 8080;
/// dnsmasq's port on every backend.
pub const DNS_PORT: u16 = 5353;
/// Size of the static file `/big` on every backend's nginx.
pub const BIG_FILE: u64 = 10 << 20;
/// The name every dnsmasq answers with its own marker address.
pub const WHOAMI: &str = "whoami.berth.test";

/// Address of backend `n` (1-based).
pub fn backend_addr(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 251, 10 + n as u8, 2)
}

/// IPv6 address of backend `n` (1-based): `mirror6(backend_addr(n))`.
pub fn backend_addr6(n: usize) -> Ipv6Addr {
    mirror6(backend_addr(n))
}

/// The IPv6 address that mirrors a 10.251.x.y address of this network: fd00:251:x::y,
/// written with the same digits (10.251.11.2 is fd00:251:11::2).
pub fn mirror6(v4: Ipv4Addr) -> Ipv6Addr {
    let [_, _, x, y] = v4.octets();
    format!("fd00:251:{x}::{y}")
        .parse()
        .unwrap_or_else(|e| panic!("no IPv6 mirror of {v4}: {e}"))
}

/// The A record backend `n`'s dnsmasq gives for `WHOAMI`.
pub fn marker(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, n as u8)
}

/// The AAAA record backend `n`'s dnsmasq gives for `WHOAMI`.
pub fn marker6(n: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, n as u16)
}

/// The namespaces and links; everything is removed on drop.
pub struct Topology {
    /// Where the client sends from.
    pub client: Netns,
    /// Where the gateway (XDP program or daemon) runs.
    pub gateway: Netns,
    /// The backends: `backends[n - 1]` is backend `n`.
    pub backends: Vec<Netns>,
    /// Interfaces of the gateway namespace that carry traffic (attach XDP to all).
    pub gateway_ifaces: Vec<String>,
    /// The address backend `n` serves on is `backend_addrs[n - 1]`.
    pub backend_addrs: Vec<Ipv4Addr>,
    /// Its IPv6 address, `backend_addrs6[n - 1]` (empty for a network without IPv6).
    pub backend_addrs6: Vec<Ipv6Addr>,
    /// Namespaces in between (routers, switches).
    pub others: Vec<Netns>,
}

/// How a veth pair is set up; `Default` is the kernel's own defaults.
#[derive(Clone, Copy, Debug, Default)]
pub struct Veth {
    /// GRO on both ends. Off by default in the kernel; while it is off, a veth whose
    /// peer runs no XDP program drops every frame XDP redirects into it.
    pub gro: bool,
    /// Checksum offload off (`tx off rx off`) on the first end.
    pub a_no_offload: bool,
    /// Checksum offload off on the second end.
    pub b_no_offload: bool,
    /// MTU of both ends (1500 if none).
    pub mtu: Option<u32>,
}

impl Veth {
    /// Kernel defaults, but checksum offload off on the second end: the end of a
    /// client or backend, which then sends complete checksums as a real NIC delivers
    /// them (XDP cannot complete a partial checksum).
    pub const HOST_B: Veth = Veth {
        gro: false,
        a_no_offload: false,
        b_no_offload: true,
        mtu: None,
    };

    /// The datapath tests' veths: GRO on and checksum offload off on both ends, so
    /// veth accepts frames the XDP program redirects into it.
    pub const GRO: Veth = Veth {
        gro: true,
        a_no_offload: true,
        b_no_offload: true,
        mtu: None,
    };

    /// The same with this MTU on both ends.
    pub fn mtu(self, mtu: u32) -> Veth {
        Veth {
            mtu: Some(mtu),
            ..self
        }
    }
}

/// A veth pair `a_name` in `a` ↔ `b_name` in `b`, both up, with the given addresses
/// (CIDR; none for a bridge port). IPv6 addresses are added `nodad`: usable at once,
/// with no duplicate address detection to wait for.
pub fn veth(
    a: &Netns,
    a_name: &str,
    a_addrs: &[&str],
    b: &Netns,
    b_name: &str,
    b_addrs: &[&str],
    how: Veth,
) {
    // Create both ends in `a`, then move one into `b`.
    let tmp = crate::netns::unique("v");
    a.ip(&["link", "add", a_name, "type", "veth", "peer", "name", &tmp]);
    a.ip(&["link", "set", &tmp, "netns", &b.name]);
    b.ip(&["link", "set", &tmp, "name", b_name]);
    for (ns, dev, addrs, no_offload) in [
        (a, a_name, a_addrs, how.a_no_offload),
        (b, b_name, b_addrs, how.b_no_offload),
    ] {
        for addr in addrs {
            add_addr(ns, dev, addr);
        }
        if let Some(mtu) = how.mtu {
            ns.ip(&["link", "set", dev, "mtu", &mtu.to_string()]);
        }
        ns.ip(&["link", "set", dev, "up"]);
        if no_offload {
            ns.exec(&["ethtool", "-K", dev, "tx", "off", "rx", "off"]);
        }
        if how.gro {
            ns.exec(&["ethtool", "-K", dev, "gro", "on"]);
        }
    }
}

/// A Linux bridge `name` in `ns`, up, with the given addresses.
pub fn bridge(ns: &Netns, name: &str, addrs: &[&str]) {
    ns.ip(&["link", "add", name, "type", "bridge"]);
    for addr in addrs {
        add_addr(ns, name, addr);
    }
    ns.ip(&["link", "set", name, "up"]);
}

/// Adds `addr` (CIDR) to `dev` in `ns`; an IPv6 address `nodad`.
fn add_addr(ns: &Netns, dev: &str, addr: &str) {
    if addr.contains(':') {
        ns.ip(&["addr", "add", addr, "dev", dev, "nodad"]);
    } else {
        ns.ip(&["addr", "add", addr, "dev", dev]);
    }
}

/// A veth pair between two (namespace, interface, IPv4 address) ends, as `veth`, each
/// end with its address in a /24 and its IPv6 mirror in the /64 beside it.
pub fn dual_veth(a: (&Netns, &str, Ipv4Addr), b: (&Netns, &str, Ipv4Addr), how: Veth) {
    let (a_cidrs, b_cidrs) = (dual_cidrs(&[a.2]), dual_cidrs(&[b.2]));
    veth(a.0, a.1, &strs(&a_cidrs), b.0, b.1, &strs(&b_cidrs), how);
}

/// Each of `v4s` in a /24 and its IPv6 mirror in a /64, as CIDR strings.
pub fn dual_cidrs(v4s: &[Ipv4Addr]) -> Vec<String> {
    v4s.iter()
        .flat_map(|a| [format!("{a}/24"), format!("{}/64", mirror6(*a))])
        .collect()
}

/// The `&str`s of `strings` (for `veth` and `bridge`).
pub fn strs(strings: &[String]) -> Vec<&str> {
    strings.iter().map(String::as_str).collect()
}

/// Routes of both families in `ns` to the /24 of `subnet` and its IPv6 mirror's /64,
/// via `hop` and its mirror.
pub fn routes_via(ns: &Netns, subnet: Ipv4Addr, hop: Ipv4Addr) {
    ns.ip(&[
        "route",
        "add",
        &format!("{subnet}/24"),
        "via",
        &hop.to_string(),
    ]);
    ns.ip(&[
        "-6",
        "route",
        "add",
        &format!("{}/64", mirror6(subnet)),
        "via",
        &mirror6(hop).to_string(),
    ]);
}

/// Default routes of both families in `ns`: via `hop` and via its IPv6 mirror.
pub fn default_routes(ns: &Netns, hop: Ipv4Addr) {
    ns.ip(&["route", "add", "default", "via", &hop.to_string()]);
    ns.ip(&[
        "-6",
        "route",
        "add",
        "default",
        "via",
        &mirror6(hop).to_string(),
    ]);
}

/// Turns on forwarding of both families in `ns`.
pub fn forward_both(ns: &Netns) {
    ns.sysctl("net.ipv4.ip_forward", "1");
    ns.sysctl("net.ipv6.conf.all.forwarding", "1");
}

/// A new host namespace (`berth-be...`) on `bridge` of `switch`: a veth from switch
/// port `port` to the host's `eth0`, which holds `cidrs` (checksum offload off there,
/// as on a real NIC).
pub fn host_on_bridge(switch: &Netns, bridge: &str, port: &str, cidrs: &[String]) -> Netns {
    let host = Netns::new("be");
    veth(switch, port, &[], &host, "eth0", &strs(cidrs), Veth::HOST_B);
    enslave(switch, port, bridge);
    host
}

/// Makes `port` (in `ns`) a port of `bridge`.
pub fn enslave(ns: &Netns, port: &str, bridge: &str) {
    ns.ip(&["link", "set", port, "master", bridge]);
}

/// Backends in namespaces behind bridge `br0` in the gateway namespace, as pods behind
/// a node's cni0: br0 holds the subnet's first address (10.251.10.1), the backends'
/// veth peers are its ports, and the backends' own ends are set up as `how` says (the
/// kernel's defaults keep tx checksum offload on, as pods' do: their replies reach the
/// gateway with partial checksums). `addrs` are the backends' addresses, in
/// 10.251.10.0/24.
pub fn bridged(addrs: &[Ipv4Addr], how: Veth) -> Topology {
    bridged_with("br0", addrs, Veth::HOST_B, how)
}

/// `bridged` with the bridge named `name` and the client's link set up as `client`.
pub fn bridged_with(name: &str, addrs: &[Ipv4Addr], client_link: Veth, how: Veth) -> Topology {
    let client = Netns::new("cl");
    let gateway = Netns::new("gw");
    let hop = Ipv4Addr::new(10, 251, 1, 1);
    dual_veth(
        (&gateway, "c0", hop),
        (&client, "eth0", CLIENT),
        client_link,
    );
    default_routes(&client, hop);
    let br0 = Ipv4Addr::new(10, 251, 10, 1);
    bridge(&gateway, name, &strs(&dual_cidrs(&[br0])));
    let mut backends = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let b = Netns::new("be");
        let port = format!("b{}", i + 1);
        veth(
            &gateway,
            &port,
            &[],
            &b,
            "eth0",
            &strs(&dual_cidrs(&[*addr])),
            how,
        );
        enslave(&gateway, &port, name);
        default_routes(&b, br0);
        backends.push(b);
    }
    forward_both(&gateway);
    Topology {
        client,
        gateway,
        backends,
        gateway_ifaces: vec!["c0".into(), name.into()],
        backend_addrs6: addrs.iter().copied().map(mirror6).collect(),
        backend_addrs: addrs.to_vec(),
        others: Vec::new(),
    }
}

impl Topology {
    /// Builds the network with `n` backends on veths as the kernel sets them up (GRO
    /// off), checksum offload off on the client's and backends' ends.
    pub fn new(n: usize) -> Self {
        Self::with_links(n, Veth::HOST_B, Veth::HOST_B)
    }

    /// Builds the network with `n` backends on veths with GRO on: frames the XDP
    /// program redirects are accepted. For tests of the redirect path itself.
    pub fn with_gro(n: usize) -> Self {
        Self::with_links(n, Veth::GRO, Veth::GRO)
    }

    /// Builds the network with `n` backends, the client's link set up as `client_link`,
    /// the backends' as `how`.
    pub fn with_links(n: usize, client_link: Veth, how: Veth) -> Self {
        let client = Netns::new("cl");
        let gateway = Netns::new("gw");
        let hop = Ipv4Addr::new(10, 251, 1, 1);
        dual_veth(
            (&gateway, "c0", hop),
            (&client, "eth0", CLIENT),
            client_link,
        );
        default_routes(&client, hop);
        let mut backends = Vec::new();
        let mut gateway_ifaces = vec!["c0".to_string()];
        for i in 1..=n {
            let b = Netns::new("be");
            let gw_if = format!("b{i}");
            let hop = Ipv4Addr::new(10, 251, 10 + i as u8, 1);
            dual_veth((&gateway, &gw_if, hop), (&b, "eth0", backend_addr(i)), how);
            default_routes(&b, hop);
            gateway_ifaces.push(gw_if);
            backends.push(b);
        }
        forward_both(&gateway);
        Topology {
            client,
            gateway,
            backends,
            gateway_ifaces,
            backend_addrs: (1..=n).map(backend_addr).collect(),
            backend_addrs6: (1..=n).map(backend_addr6).collect(),
            others: Vec::new(),
        }
    }

    /// Starts nginx and dnsmasq on every backend and waits until they answer.
    pub fn start_servers(&self) -> Servers {
        let backends: Vec<(&Netns, Vec<IpAddr>)> = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, ns)| (ns, self.backend_serving_addrs(i)))
            .collect();
        start_servers(&backends)
    }

    /// The addresses backend `i + 1` serves on: IPv4, and IPv6 if it has it.
    fn backend_serving_addrs(&self, i: usize) -> Vec<IpAddr> {
        std::iter::once(IpAddr::V4(self.backend_addrs[i]))
            .chain(self.backend_addrs6.get(i).copied().map(IpAddr::V6))
            .collect()
    }
}
