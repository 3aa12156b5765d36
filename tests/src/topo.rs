//! A small network of namespaces: a client, a gateway running the XDP program on its
//! interfaces, and backends running real servers (nginx for TCP, dnsmasq for UDP/DNS).
//!
//! ```text
//!  client (10.251.1.2) ──c0── gateway ──b1── backend 1 (10.251.11.2)
//!                                     ──b2── backend 2 (10.251.12.2)  ...
//! ```
//! The gateway address 10.251.0.100 is on no interface: only the XDP program answers it.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpStream, UdpSocket},
    path::PathBuf,
    time::Duration,
};

use crate::netns::{wait_until, Netns, Proc};

/// The shared gateway address.
pub const GW: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 100);
/// The client's address.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 2);
/// nginx's port on every backend.
pub const HTTP_PORT: u16 = 8080;
/// dnsmasq's port on every backend.
pub const DNS_PORT: u16 = 5353;
/// The name every dnsmasq answers with its own marker address.
pub const WHOAMI: &str = "whoami.berth.test";

/// Address of backend `n` (1-based).
pub fn backend_addr(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 251, 10 + n as u8, 2)
}

/// The A record backend `n`'s dnsmasq gives for `WHOAMI`.
pub fn marker(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, n as u8)
}

/// The namespaces and links; everything is removed on drop.
pub struct Topology {
    pub client: Netns,
    pub gateway: Netns,
    pub backends: Vec<Netns>,
    /// Interfaces of the gateway namespace that carry traffic (attach XDP to all).
    pub gateway_ifaces: Vec<String>,
}

fn veth(a: &Netns, a_name: &str, a_addr: &str, b: &Netns, b_name: &str, b_addr: &str) {
    // Create both ends in `a`, then move one into `b`.
    let tmp = crate::netns::unique("v");
    a.ip(&["link", "add", a_name, "type", "veth", "peer", "name", &tmp]);
    a.ip(&["link", "set", &tmp, "netns", &b.name]);
    b.ip(&["link", "set", &tmp, "name", b_name]);
    a.ip(&["addr", "add", a_addr, "dev", a_name]);
    b.ip(&["addr", "add", b_addr, "dev", b_name]);
    for (ns, dev) in [(a, a_name), (b, b_name)] {
        ns.ip(&["link", "set", dev, "up"]);
        // Checksum offload would leave partial checksums on forwarded packets; GRO lets
        // veth accept frames that XDP redirects into it.
        ns.exec(&["ethtool", "-K", dev, "tx", "off", "rx", "off", "gro", "on"]);
    }
}

impl Topology {
    /// Builds the network with `n` backends.
    pub fn new(n: usize) -> Self {
        let client = Netns::new("cl");
        let gateway = Netns::new("gw");
        veth(
            &gateway,
            "c0",
            "10.251.1.1/24",
            &client,
            "eth0",
            "10.251.1.2/24",
        );
        client.ip(&["route", "add", "default", "via", "10.251.1.1"]);
        let mut backends = Vec::new();
        let mut gateway_ifaces = vec!["c0".to_string()];
        for i in 1..=n {
            let b = Netns::new("be");
            let gw_if = format!("b{i}");
            veth(
                &gateway,
                &gw_if,
                &format!("10.251.{}.1/24", 10 + i),
                &b,
                "eth0",
                &format!("{}/24", backend_addr(i)),
            );
            b.ip(&[
                "route",
                "add",
                "default",
                "via",
                &format!("10.251.{}.1", 10 + i),
            ]);
            gateway_ifaces.push(gw_if);
            backends.push(b);
        }
        gateway.sysctl("net.ipv4.ip_forward", "1");
        Topology {
            client,
            gateway,
            backends,
            gateway_ifaces,
        }
    }

    /// Starts nginx and dnsmasq on every backend and waits until they answer.
    pub fn start_servers(&self) -> Servers {
        let dir = std::env::temp_dir().join(format!("berth-servers-{}", crate::netns::unique("s")));
        std::fs::create_dir_all(&dir).expect("server dir");
        let mut procs = Vec::new();
        for (i, ns) in self.backends.iter().enumerate() {
            let n = i + 1;
            let prefix = dir.join(format!("b{n}"));
            std::fs::create_dir_all(&prefix).expect("nginx prefix");
            let conf = prefix.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(&prefix, n)).expect("nginx.conf");
            procs.push(ns.spawn(&[
                "nginx",
                "-p",
                prefix.to_str().unwrap_or_default(),
                "-c",
                conf.to_str().unwrap_or_default(),
            ]));
            let listen = backend_addr(n).to_string();
            procs.push(ns.spawn(&[
                "dnsmasq",
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                &format!("--listen-address={listen}"),
                &format!("--port={DNS_PORT}"),
                &format!("--address=/{WHOAMI}/{}", marker(n)),
                "--pid-file",
                "--user=root",
                "--log-facility=-",
            ]));
        }
        for (i, ns) in self.backends.iter().enumerate() {
            let n = i + 1;
            let target = SocketAddrV4::new(backend_addr(n), DNS_PORT);
            let http = SocketAddrV4::new(backend_addr(n), HTTP_PORT);
            ns.enter(|| {
                wait_until(
                    &format!("dnsmasq on backend {n}"),
                    Duration::from_secs(10),
                    || dns_whoami_from(target, Duration::from_millis(200)).is_some(),
                );
                wait_until(
                    &format!("nginx on backend {n}"),
                    Duration::from_secs(10),
                    || http_get(http).is_ok(),
                );
            });
        }
        for p in &mut procs {
            p.assert_running();
        }
        Servers { _procs: procs, dir }
    }
}

/// Running servers, killed by PID on drop; their files removed.
pub struct Servers {
    _procs: Vec<Proc>,
    dir: PathBuf,
}

impl Drop for Servers {
    fn drop(&mut self) {
        self._procs.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nginx_conf(prefix: &std::path::Path, n: usize) -> String {
    let p = prefix.display();
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n  \
         fastcgi_temp_path {p}/fastcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  scgi_temp_path {p}/scgi;\n  \
         keepalive_timeout 300s;\n  keepalive_requests 100000;\n  \
         server {{\n    listen {addr}:{HTTP_PORT};\n    location / {{ return 200 \"backend-{n}\\n\"; }}\n  }}\n}}\n",
        addr = backend_addr(n)
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

/// Asks `server` for `WHOAMI` from a fresh socket (a new flow). Returns the marker
/// address, if an answer came back from `server` itself.
pub fn dns_whoami_from(server: SocketAddrV4, timeout: Duration) -> Option<Ipv4Addr> {
    let sock = UdpSocket::bind("0.0.0.0:0").ok()?;
    Flow::from_socket(sock, server, timeout).ask()
}

/// One UDP flow (a bound socket) asking `server` again and again.
pub struct Flow {
    sock: UdpSocket,
    server: SocketAddrV4,
    next_id: u16,
}

impl Flow {
    /// A new flow; must be created on a thread inside the client's namespace.
    pub fn new(server: SocketAddrV4, timeout: Duration) -> Self {
        let sock = UdpSocket::bind("0.0.0.0:0").expect("bind udp");
        Self::from_socket(sock, server, timeout)
    }

    fn from_socket(sock: UdpSocket, server: SocketAddrV4, timeout: Duration) -> Self {
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
            if from == std::net::SocketAddr::V4(self.server) {
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
}

/// Which backend a marker address belongs to (1-based).
pub fn backend_of_marker(m: Ipv4Addr) -> usize {
    usize::from(m.octets()[3])
}

/// One HTTP/1.1 GET on a new connection; returns the body.
pub fn http_get(addr: SocketAddrV4) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    http_request(&mut s)
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
