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
//! `Topology::with_gro` turns GRO on, which lets the program redirect into them.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    path::PathBuf,
    time::Duration,
};

use crate::netns::{wait_until, Netns, Proc};

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
    let client = Netns::new("cl");
    let gateway = Netns::new("gw");
    let hop = Ipv4Addr::new(10, 251, 1, 1);
    dual_veth(
        (&gateway, "c0", hop),
        (&client, "eth0", CLIENT),
        Veth::HOST_B,
    );
    default_routes(&client, hop);
    let br0 = Ipv4Addr::new(10, 251, 10, 1);
    bridge(&gateway, "br0", &strs(&dual_cidrs(&[br0])));
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
        enslave(&gateway, &port, "br0");
        default_routes(&b, br0);
        backends.push(b);
    }
    forward_both(&gateway);
    Topology {
        client,
        gateway,
        backends,
        gateway_ifaces: vec!["c0".into(), "br0".into()],
        backend_addrs6: addrs.iter().copied().map(mirror6).collect(),
        backend_addrs: addrs.to_vec(),
        others: Vec::new(),
    }
}

impl Topology {
    /// Builds the network with `n` backends on veths as the kernel sets them up (GRO
    /// off), checksum offload off on the client's and backends' ends.
    pub fn new(n: usize) -> Self {
        Self::build(n, Veth::HOST_B)
    }

    /// Builds the network with `n` backends on veths with GRO on: frames the XDP
    /// program redirects are accepted. For tests of the redirect path itself.
    pub fn with_gro(n: usize) -> Self {
        Self::build(n, Veth::GRO)
    }

    fn build(n: usize, how: Veth) -> Self {
        let client = Netns::new("cl");
        let gateway = Netns::new("gw");
        let hop = Ipv4Addr::new(10, 251, 1, 1);
        dual_veth((&gateway, "c0", hop), (&client, "eth0", CLIENT), how);
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

/// Starts nginx and dnsmasq on every backend (`backends[n - 1]` is backend `n`, in its
/// namespace, with the addresses it serves on: IPv4 first, then IPv6 if any) and waits
/// until they answer.
pub fn start_servers(backends: &[(&Netns, Vec<IpAddr>)]) -> Servers {
    let dir = std::env::temp_dir().join(format!("berth-servers-{}", crate::netns::unique("s")));
    std::fs::create_dir_all(&dir).expect("server dir");
    let mut procs = Vec::new();
    for (i, (ns, addrs)) in backends.iter().enumerate() {
        let n = i + 1;
        let prefix = dir.join(format!("b{n}"));
        std::fs::create_dir_all(&prefix).expect("nginx prefix");
        let conf = prefix.join("nginx.conf");
        let v4 = addrs
            .iter()
            .find_map(|a| match a {
                IpAddr::V4(a) => Some(*a),
                IpAddr::V6(_) => None,
            })
            .expect("a backend serves on an IPv4 address");
        let v6 = addrs.iter().any(IpAddr::is_ipv6);
        std::fs::write(&conf, nginx_conf(&prefix, n, v4, v6)).expect("nginx.conf");
        let www = prefix.join("www");
        std::fs::create_dir_all(&www).expect("nginx root");
        // Sparse: ten megabytes of zeros that take no disk.
        std::fs::File::create(www.join("big"))
            .and_then(|f| f.set_len(BIG_FILE))
            .expect("big file");
        procs.push(ns.spawn(&[
            "nginx",
            "-p",
            prefix.to_str().unwrap_or_default(),
            "-c",
            conf.to_str().unwrap_or_default(),
        ]));
        // On its IPv4 address and, if it has one, its IPv6 address; an A and an
        // AAAA record name the backend.
        let mut dnsmasq: Vec<String> = [
            "dnsmasq",
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--pid-file",
            "--user=root",
            "--log-facility=-",
        ]
        .map(String::from)
        .to_vec();
        dnsmasq.push(format!("--port={DNS_PORT}"));
        dnsmasq.push(format!("--address=/{WHOAMI}/{}", marker(n)));
        dnsmasq.push(format!("--address=/{WHOAMI}/{}", marker6(n)));
        for addr in addrs {
            dnsmasq.push(format!("--listen-address={addr}"));
        }
        let dnsmasq: Vec<&str> = dnsmasq.iter().map(String::as_str).collect();
        procs.push(ns.spawn(&dnsmasq));
    }
    for (i, (ns, addrs)) in backends.iter().enumerate() {
        let n = i + 1;
        for &addr in addrs {
            let dns = SocketAddr::new(addr, DNS_PORT);
            let http = SocketAddr::new(addr, HTTP_PORT);
            ns.enter(|| {
                wait_until(
                    &format!("dnsmasq on backend {n} at {dns}"),
                    Duration::from_secs(10),
                    || dns_whoami_from(dns, Duration::from_millis(200)).is_some(),
                );
                wait_until(
                    &format!("nginx on backend {n} at {http}"),
                    Duration::from_secs(10),
                    || http_get(http).is_ok(),
                );
            });
        }
    }
    for p in &mut procs {
        p.assert_running();
    }
    Servers { _procs: procs, dir }
}

/// Running servers, killed by PID on drop; their files removed.
pub struct Servers {
    _procs: Vec<Proc>,
    dir: PathBuf,
}

impl Servers {
    /// A file under backend `n`'s nginx root (`/upload/x` is `file(n, "upload/x")`).
    pub fn file(&self, n: usize, path: &str) -> PathBuf {
        self.dir.join(format!("b{n}")).join("www").join(path)
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self._procs.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// nginx serving on `addr` and, with `v6`, on `[::]` (IPv6 only) too.
fn nginx_conf(prefix: &std::path::Path, n: usize, addr: Ipv4Addr, v6: bool) -> String {
    let p = prefix.display();
    let listen6 = if v6 {
        format!("listen [::]:{HTTP_PORT};\n    ")
    } else {
        String::new()
    };
    // `/big` is a static file of `BIG_FILE` bytes; `PUT /upload/NAME` stores a body of
    // up to 20 MB and answers only once it has all of it.
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n  \
         fastcgi_temp_path {p}/fastcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  scgi_temp_path {p}/scgi;\n  \
         keepalive_timeout 300s;\n  keepalive_requests 100000;\n  \
         server {{\n    listen {addr}:{HTTP_PORT};\n    {listen6}root {p}/www;\n    \
         location / {{ return 200 \"backend-{n}\\n\"; }}\n    \
         location = /big {{ }}\n    \
         location /upload/ {{ dav_methods PUT; create_full_put_path on; client_max_body_size 20m; }}\n  }}\n}}\n"
    )
}

/// A DNS query for `WHOAMI` (type A).
fn dns_query(id: u16) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend(id.to_be_bytes());
    q.extend([0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in WHOAMI.split('.') {
        q.push(label.len() as u8);
        q.extend(label.as_bytes());
    }
    q.extend([0, 0, 1, 0, 1]);
    q
}

/// The A record of a DNS answer to `dns_query(id)`: its last four bytes.
fn dns_answer(id: u16, buf: &[u8]) -> Option<Ipv4Addr> {
    if buf.len() < 16 || buf[0..2] != id.to_be_bytes() || u16::from_be_bytes([buf[6], buf[7]]) == 0
    {
        return None;
    }
    let a = &buf[buf.len() - 4..];
    Some(Ipv4Addr::new(a[0], a[1], a[2], a[3]))
}

/// Asks `server` (either family) for `WHOAMI` from a fresh socket (a new flow).
/// Returns the marker address, if an answer came back from `server` itself.
pub fn dns_whoami_from(server: impl Into<SocketAddr>, timeout: Duration) -> Option<Ipv4Addr> {
    let server = server.into();
    let sock = UdpSocket::bind(any_port(&server)).ok()?;
    Flow::from_socket(sock, server, timeout).ask()
}

/// The unspecified address of `server`'s family, port 0.
fn any_port(server: &SocketAddr) -> SocketAddr {
    let any = match server {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(any, 0)
}

/// One UDP flow (a bound socket) asking `server` again and again.
pub struct Flow {
    sock: UdpSocket,
    server: SocketAddr,
    next_id: u16,
}

impl Flow {
    /// A new flow to `server` (either family); must be created on a thread inside the
    /// client's namespace.
    pub fn new(server: impl Into<SocketAddr>, timeout: Duration) -> Self {
        let server = server.into();
        let sock = UdpSocket::bind(any_port(&server)).expect("bind udp");
        Self::from_socket(sock, server, timeout)
    }

    /// A new flow from the local address `local` (e.g. one source port per flow, for
    /// as many distinct flows as ports); must be created inside the client's namespace.
    pub fn bound(
        local: impl Into<SocketAddr>,
        server: impl Into<SocketAddr>,
        timeout: Duration,
    ) -> Self {
        let local = local.into();
        let sock = UdpSocket::bind(local).unwrap_or_else(|e| panic!("bind udp {local}: {e}"));
        Self::from_socket(sock, server.into(), timeout)
    }

    fn from_socket(sock: UdpSocket, server: SocketAddr, timeout: Duration) -> Self {
        sock.set_read_timeout(Some(timeout)).expect("timeout");
        Flow {
            sock,
            server,
            next_id: 1,
        }
    }

    /// Sends one query; returns the marker of the answering backend. Answers must come
    /// from `server`'s address and port (reverse NAT); others are ignored.
    pub fn ask(&mut self) -> Option<Ipv4Addr> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.sock.send_to(&dns_query(id), self.server).ok()?;
        let mut buf = [0u8; 512];
        loop {
            let (n, from) = self.sock.recv_from(&mut buf).ok()?;
            if from == self.server {
                if let Some(a) = dns_answer(id, &buf[..n]) {
                    return Some(a);
                }
            }
        }
    }

    /// The local port of this flow.
    pub fn port(&self) -> u16 {
        self.sock.local_addr().map(|a| a.port()).unwrap_or_default()
    }

    /// The flow's socket (to see what else reaches it).
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }
}

/// Which backend a marker address belongs to (1-based).
pub fn backend_of_marker(m: Ipv4Addr) -> usize {
    usize::from(m.octets()[3])
}

/// One HTTP/1.1 GET on a new connection to `addr` (either family); returns the body.
pub fn http_get(addr: impl Into<SocketAddr>) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    http_request(&mut s)
}

/// The bodies (trimmed; empty for a request that failed) of one GET on each of `n` new
/// connections from the client of `topo` to `at`, each within `timeout`.
pub fn fresh_answers(
    topo: &Topology,
    at: std::net::SocketAddrV4,
    n: usize,
    timeout: Duration,
) -> Vec<String> {
    (0..n)
        .map(|_| {
            topo.client.enter(|| {
                let mut c = TcpStream::connect_timeout(&at.into(), timeout).expect("connect");
                c.set_read_timeout(Some(timeout)).expect("timeout");
                http_request(&mut c)
                    .map(|b| b.trim().to_string())
                    .unwrap_or_default()
            })
        })
        .collect()
}

/// A connection from `ns` to `addr` kept open (2 s timeouts) after a first keep-alive
/// GET, with that GET's body.
pub fn kept_alive(ns: &Netns, addr: std::net::SocketAddrV4) -> (TcpStream, String) {
    ns.enter(|| {
        let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2))
            .expect("connect to the gateway port");
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("read timeout");
        let body = http_request(&mut s).expect("GET on a kept-alive connection");
        (s, body)
    })
}

/// Sends a keep-alive GET on `s` and reads one response; returns the body.
pub fn http_request(s: &mut TcpStream) -> std::io::Result<String> {
    s.write_all(b"GET / HTTP/1.1\r\nHost: berth\r\nConnection: keep-alive\r\n\r\n")?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        buf.extend(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>())
                })
                .and_then(Result::ok)
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return Ok(text[end + 4..end + 4 + len].to_string());
            }
        }
    }
}

/// The peer addresses (`ss` style: `10.251.11.1:40000`, `[fd00:251:11::1]:40000`) of
/// the TCP connections established to local port `port` in `ns`.
pub fn tcp_peers(ns: &Netns, port: u16) -> Vec<String> {
    let filter = format!("( sport = :{port} )");
    let out = ns.exec(&["ss", "-Htn", "state", "established", &filter]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect()
}
