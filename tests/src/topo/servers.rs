//! The backends' servers (nginx for TCP, dnsmasq for UDP/DNS) and the clients that
//! talk to them: DNS queries, HTTP requests, flows.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    path::PathBuf,
    time::Duration,
};

use super::*;
use crate::netns::{wait_until, Proc};

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
