//! A tier of Berth gateways behind a router's ECMP, as a bare-metal load-balancer tier
//! or a DaemonSet runs: every gateway runs `berth run` on the same manifests and
//! address and a BGP speaker with the config shipped in `deploy/` (FRR's on gateway 2,
//! BIRD's on the others); the router runs
//! BIRD with `merge paths`, so the gateway address has one next hop per announcing
//! gateway, hashed by the 5-tuple (`fib_multipath_hash_policy=1`).
//!
//! ```text
//!                       front 10.252.0.0/24 (a bridge)
//!  client ── router ──┬── gw1 .11 ──┐
//!  10.252.1.2  .1     ├── gw2 .12 ──┤   back 10.252.100.0/24 (a bridge)
//!                     ├── gw3 .13 ──┼── backends .21 .22 .23 (nginx, dnsmasq)
//!                     └── (gw4 .14) ┘   router .1 on it too
//! ```
//! Replies come back through one gateway (the backends' default route, `ReplyPath::Gateway`)
//! or through the router (`ReplyPath::Router`), which spreads them over the live
//! gateways (a static ECMP route with a BFD session per next hop) by policy routing of
//! the backends' subnet. In SNAT mode the backends answer each gateway's own address.
//! Everything is a namespace of the test's; all of it goes on drop.

use std::{
    collections::BTreeSet,
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    daemon::{berth_binary, Daemon, Dirs},
    netns::{unique, Netns},
    routing::{shipped_config, Bird, Frr, Speaker},
    topo::{
        enslave, host_on_bridge, start_servers, strs, veth, Flow, Servers, Veth, BIG_FILE, WHOAMI,
    },
};

/// The gateway address every gateway serves.
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 252, 200, 100);
/// The client.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 252, 1, 2);
/// Team A's web route (TCP) and team B's DNS route (UDP) ask for these ports.
pub const WEB_PORT: u16 = 30080;
/// See `WEB_PORT`.
pub const DNS_PORT: u16 = 30053;
/// Backends in the tier.
pub const BACKENDS: usize = 3;
/// The kernel table the gateways publish their addresses in (`--announce-table`).
pub const ANNOUNCE_TABLE: &str = "100";
/// How long a stopping gateway keeps serving before it exits (`--drain-timeout`).
pub const DRAIN_TIMEOUT: &str = "2s";
const ROUTER_AS: &str = "65000";
const GATEWAY_AS: &str = "65001";

/// Gateway `n`'s address on the front (router) segment.
pub fn front_addr(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 252, 0, 10 + n)
}

/// Gateway `n`'s address on the back (backend) segment.
pub fn back_addr(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 252, 100, 10 + n)
}

/// Backend `n`'s address (1-based).
pub fn backend_addr(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 252, 100, 20 + n as u8)
}

/// Where the backends send their replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyPath {
    /// Their default route is gateway `n`'s back address.
    Gateway(u8),
    /// Their default route is the router, which spreads them over the gateways.
    Router,
}

/// How the gateways translate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Backends see the client's address; replies must come back through a gateway.
    Router,
    /// `sourceNAT: true`: backends see the gateway node's address.
    Snat,
}

/// One gateway: its namespace, `berth run` and its BGP speaker. Fields drop in order:
/// the daemon (killed), the speaker, the directories (pins removed: programs detached), the namespace.
pub struct Gateway {
    /// 1-based; its addresses are `front_addr(n)` and `back_addr(n)`.
    pub n: u8,
    daemon: Option<Daemon>,
    /// Started once the daemon serves (see `add_gateway`).
    speaker: Option<Speaker>,
    dirs: Dirs,
    /// Where it runs.
    pub ns: Netns,
    /// The switch-side ports of its links.
    ports: [String; 2],
    /// Replies come back through the router, not the way the gateway reaches the
    /// backends: its daemon runs with `--reply-origin any`.
    asymmetric_replies: bool,
}

/// The tier. Fields drop in order: gateways, the router's BIRD, the servers, the
/// namespaces.
pub struct Tier {
    /// The live gateways, by number.
    pub gateways: Vec<Gateway>,
    router_bird: Bird,
    _servers: Servers,
    /// Where the load comes from.
    pub client: Netns,
    /// The ECMP router.
    pub router: Netns,
    /// Backend `n` is `backends[n - 1]`.
    pub backends: Vec<Netns>,
    switch: Netns,
    /// Configs and logs, removed on drop.
    dir: PathBuf,
    mode: Mode,
    /// The backends' replies go through the router (`route_replies`).
    replies_through_router: AtomicBool,
    /// The `berth` binary new daemons start from (changed by `upgrade_binary`).
    binary: PathBuf,
}

impl Tier {
    /// Builds the network, starts the servers, gateways 1 to `gateways` and the
    /// router's BIRD, and waits until the router has a next hop through every gateway.
    pub fn new(gateways: u8, mode: Mode, replies: ReplyPath) -> Tier {
        let dir = std::env::temp_dir().join(format!("berth-tier-{}", unique("t")));
        std::fs::create_dir_all(&dir).expect("tier dir");
        let switch = Netns::new("sw");
        for bridge in ["front", "back"] {
            switch.ip(&["link", "add", bridge, "type", "bridge"]);
            switch.ip(&["link", "set", bridge, "up"]);
        }
        let client = Netns::new("cl");
        let router = Netns::new("rt");
        veth(
            &router,
            "c0",
            &["10.252.1.1/24"],
            &client,
            "eth0",
            &[&format!("{CLIENT}/24")],
            Veth::HOST_B,
        );
        client.ip(&["route", "add", "default", "via", "10.252.1.1"]);
        for (bridge, addr, port) in [
            ("front", "10.252.0.1/24", "rf"),
            ("back", "10.252.100.1/24", "rb"),
        ] {
            let iface = &bridge[..1];
            veth(
                &router,
                &format!("{iface}0"),
                &[addr],
                &switch,
                port,
                &[],
                Veth::default(),
            );
            enslave(&switch, port, bridge);
        }
        router.sysctl("net.ipv4.ip_forward", "1");
        router.sysctl("net.ipv4.fib_multipath_hash_policy", "1");
        // Replies from the backends' segment go back through the gateways (used when
        // the backends' default route is the router).
        router.ip(&[
            "rule",
            "add",
            "from",
            "10.252.100.0/24",
            "iif",
            "b0",
            "lookup",
            "200",
        ]);
        let mut backends = Vec::new();
        for n in 1..=BACKENDS {
            let cidr = format!("{}/24", backend_addr(n));
            backends.push(host_on_bridge(&switch, "back", &format!("bb{n}"), &[cidr]));
        }
        let servers = start_servers(
            &backends
                .iter()
                .enumerate()
                .map(|(i, b)| (b, vec![IpAddr::V4(backend_addr(i + 1))]))
                .collect::<Vec<_>>(),
        );
        let router_bird = Bird::start(&router, &dir, "router", &router_config());
        let mut tier = Tier {
            gateways: Vec::new(),
            router_bird,
            _servers: servers,
            client,
            router,
            backends,
            switch,
            dir,
            mode,
            replies_through_router: AtomicBool::new(false),
            binary: berth_binary(),
        };
        tier.route_replies(replies);
        for n in 1..=gateways {
            tier.add_gateway(n);
        }
        tier
    }

    /// Sets the backends' default route.
    pub fn route_replies(&self, replies: ReplyPath) {
        self.replies_through_router
            .store(replies == ReplyPath::Router, Ordering::Relaxed);
        let hop = match replies {
            ReplyPath::Gateway(n) => back_addr(n),
            ReplyPath::Router => Ipv4Addr::new(10, 252, 100, 1),
        };
        for b in &self.backends {
            b.ip(&["route", "replace", "default", "via", &hop.to_string()]);
        }
    }

    /// Builds gateway `n`, starts `berth run` and BIRD in it, and waits until the
    /// router routes the gateway address through it.
    pub fn add_gateway(&mut self, n: u8) {
        let ns = Netns::new(&format!("g{n}"));
        let ports = [format!("fg{n}"), format!("bg{n}")];
        for (bridge, iface, addr, port) in [
            ("front", "f0", front_addr(n), &ports[0]),
            ("back", "b0", back_addr(n), &ports[1]),
        ] {
            let cidr = format!("{addr}/24");
            veth(
                &ns,
                iface,
                &strs(&[cidr]),
                &self.switch,
                port,
                &[],
                Veth::default(),
            );
            enslave(&self.switch, port, bridge);
        }
        ns.ip(&["route", "add", "default", "via", "10.252.0.1"]);
        ns.sysctl("net.ipv4.ip_forward", "1");
        let dirs = Dirs::with_example_files(&[]);
        std::fs::write(dirs.manifests.join("tier.yaml"), manifests(self.mode))
            .expect("tier manifests");
        let mut gw = Gateway {
            n,
            daemon: None,
            speaker: None,
            dirs,
            ns,
            ports,
            asymmetric_replies: self.replies_through_router.load(Ordering::Relaxed),
        };
        gw.start_daemon(&self.binary);
        // The routing daemon starts after berth, as an operator orders them (systemd
        // `After=`): its BFD sessions make the router send replies through this node
        // at once, before berth would have attached its datapath otherwise.
        gw.speaker = Some(self.speaker(&gw.ns, n));
        self.gateways.push(gw);
        self.gateways.sort_by_key(|g| g.n);
        self.wait_for_hops(&format!("gateway {n} to be announced"), |hops| {
            hops.contains(&front_addr(n))
        });
    }

    /// Gateway `n`'s BGP speaker, started with the config shipped in `deploy/`: FRR on
    /// gateway 2, BIRD on the others.
    fn speaker(&self, ns: &Netns, n: u8) -> Speaker {
        let router_id = front_addr(n).to_string();
        let name = format!("gw{n}");
        let frr = n == 2;
        let (file, local_as, peer_as) = if frr {
            ("frr/frr.conf", "router bgp 65001", "remote-as 65000")
        } else {
            ("bird/bird.conf", "local as 65001", "as 65000")
        };
        let table = format!("table {ANNOUNCE_TABLE}");
        let mut edits = vec![
            ("192.0.2.11", router_id.as_str()),
            ("192.0.2.1", "10.252.0.1"),
        ];
        let (local, peer) = (
            local_as.replace("65001", GATEWAY_AS),
            peer_as.replace("65000", ROUTER_AS),
        );
        edits.extend([(local_as, local.as_str()), (peer_as, peer.as_str())]);
        if !frr {
            // FRR announces the addresses on berth0; BIRD the routes in the table.
            edits.push(("table 100", &table));
        }
        let config = shipped_config(file, &edits);
        if frr {
            Speaker::Frr(Frr::start(ns, &self.dir, &name, &config))
        } else {
            Speaker::Bird(Bird::start(ns, &self.dir, &name, &config))
        }
    }

    /// Removes gateway `n` whole, as a failed machine: its daemon and BIRD killed,
    /// its namespace (with its links) deleted.
    pub fn remove_gateway(&mut self, n: u8) {
        let i = self.index(n);
        let mut gw = self.gateways.remove(i);
        if let Some(s) = gw.speaker.as_mut() {
            s.kill();
        }
        if let Some(mut d) = gw.daemon.take() {
            d.kill9();
        }
        for port in &gw.ports {
            let _ = self.switch.try_exec(&["ip", "link", "del", port]);
        }
        drop(gw);
        self.wait_for_hops(
            &format!("gateway {n} to leave the router's routes"),
            |hops| !hops.contains(&front_addr(n)),
        );
    }

    fn index(&self, n: u8) -> usize {
        self.gateways
            .iter()
            .position(|g| g.n == n)
            .unwrap_or_else(|| panic!("no gateway {n} in the tier"))
    }

    /// Gateway `n`.
    pub fn gateway(&mut self, n: u8) -> &mut Gateway {
        let i = self.index(n);
        &mut self.gateways[i]
    }

    /// The next hops the router has for the gateway address.
    pub fn hops(&self) -> BTreeSet<Ipv4Addr> {
        let out = self.router.ip(&["route", "show", &VIP.to_string()]);
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "via")
            .filter_map(|w| w[1].parse().ok())
            .collect()
    }

    /// Polls the router's next hops for the gateway address until `ok` holds (60 s: a
    /// BGP session that BFD took down on a loaded machine waits out BIRD's error wait
    /// before it connects again); on timeout, panics with the router's protocols.
    pub fn wait_for_hops(&mut self, what: &str, ok: impl Fn(&BTreeSet<Ipv4Addr>) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            self.router_bird.assert_running();
            let hops = self.hops();
            if ok(&hops) {
                return;
            }
            // (birdc runs only when the assertion fails.)
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}: the router's hops {hops:?}; its protocols:\n{}",
                self.router_bird
                    .try_birdc(&["show", "protocols"])
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `berth drain` (or `undrain`) on gateway `n`; panics if it fails.
    pub fn berth_cli(&self, n: u8, verb: &str) -> String {
        self.berth_cli_args(n, &[verb])
    }

    /// `berth ARGS...` on gateway `n`; its output; panics if it fails.
    pub fn berth_cli_args(&self, n: u8, args: &[&str]) -> String {
        let gw = &self.gateways[self.index(n)];
        let out = gw
            .ns
            .command(&self.binary)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("berth {args:?}: {e}"));
        assert!(
            out.status.success(),
            "berth {args:?} on gateway {n} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `berth get node -o json` on gateway `n`.
    pub fn node(&self, n: u8) -> serde_json::Value {
        let text = self.berth_cli_args(n, &["get", "node", "-o", "json"]);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("berth get node: {e}: {text}"))
    }

    /// From now on new daemons start from a copy of the `berth` binary: a new build
    /// as far as the running daemons and the pins are concerned.
    pub fn upgrade_binary(&mut self) {
        let next = self.dir.join("berth-next");
        std::fs::copy(berth_binary(), &next).expect("copy berth");
        self.binary = next;
    }

    /// The `berth` binary new daemons start from.
    pub fn binary(&self) -> &Path {
        &self.binary
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        self.gateways.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Gateway {
    /// Starts `berth run` (from `binary`) on the gateway's links and waits until it
    /// serves.
    pub fn start_daemon(&mut self, binary: &Path) {
        assert!(self.daemon.is_none(), "gateway {} runs a daemon", self.n);
        let mut extra = vec![
            "--announce-table",
            ANNOUNCE_TABLE,
            "--drain-on-stop",
            "--drain-timeout",
            DRAIN_TIMEOUT,
        ];
        extra.extend(["--log-format", "text"]);
        if self.asymmetric_replies {
            // They arrive from the router on the front link, not from the backends'
            // link: by default dropped as reply_spoofed.
            extra.extend(["--reply-origin", "any"]);
        }
        self.daemon = Some(Daemon::start_binary(
            binary,
            &self.ns,
            &["f0", "b0"],
            &self.dirs,
            &extra,
        ));
    }

    /// The running daemon.
    pub fn daemon(&mut self) -> &mut Daemon {
        let n = self.n;
        self.daemon
            .as_mut()
            .unwrap_or_else(|| panic!("gateway {n} runs no daemon"))
    }

    /// Takes the running daemon out (to kill or stop it).
    pub fn take_daemon(&mut self) -> Daemon {
        let n = self.n;
        self.daemon
            .take()
            .unwrap_or_else(|| panic!("gateway {n} runs no daemon"))
    }
}

/// The router's BIRD: BGP (with BFD) to every gateway slot, their routes merged into
/// one ECMP route; the reply path (table 200) a static ECMP default route through the
/// gateways whose BFD session is up.
fn router_config() -> String {
    let slots: Vec<u8> = (1..=4).collect();
    let mut c = format!(
        "router id 10.252.0.1;\n\
         protocol device {{}}\n\
         protocol bfd {{ interface \"*\" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }}; }}\n\
         protocol kernel {{ merge paths on; ipv4 {{ export all; import none; }}; }}\n\
         template bgp gateways {{ local as {ROUTER_AS}; bfd on; connect retry time 1; error wait time 1, 5; ipv4 {{ import all; export none; }}; }}\n"
    );
    for n in &slots {
        c.push_str(&format!(
            "protocol bgp gw{n} from gateways {{ neighbor {} as {GATEWAY_AS}; }}\n",
            front_addr(*n)
        ));
    }
    let hops: Vec<String> = slots
        .iter()
        .map(|n| format!("via {} bfd", front_addr(*n)))
        .collect();
    c.push_str(&format!(
        "ipv4 table replies;\n\
         protocol static reply_path {{ ipv4 {{ table replies; }}; route 0.0.0.0/0 {}; }}\n\
         protocol kernel reply_kernel {{ kernel table 200; merge paths on; ipv4 {{ table replies; export all; import none; }}; }}\n",
        hops.join(" ")
    ));
    c
}

/// The manifests every gateway serves: the shared Gateway on `VIP` with port-range
/// listeners, team A's web route (TCP, port `WEB_PORT`) and team B's DNS route (UDP,
/// `DNS_PORT`), each with all backends.
fn manifests(mode: Mode) -> String {
    let endpoints: Vec<String> = (1..=BACKENDS)
        .map(|n| format!("- addresses: [{}]", backend_addr(n)))
        .collect();
    let endpoints = endpoints.join("\n");
    let snat = match mode {
        Mode::Router => "",
        Mode::Snat => "\n  sourceNAT: true",
    };
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: berth}}
spec: {{controllerName: berth.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: shared, namespace: infra}}
spec:
  gatewayClassName: berth
  addresses: [{{type: IPAddress, value: {VIP}}}]
  infrastructure:
    parametersRef: {{group: berth.dev, kind: GatewayConfig, name: shared-l4}}
  listeners:
  - {{name: tcp-pool, protocol: TCP, port: 30000, allowedRoutes: {{namespaces: {{from: All}}}}}}
  - {{name: udp-pool, protocol: UDP, port: 30000, allowedRoutes: {{namespaces: {{from: All}}}}}}
---
apiVersion: berth.dev/v1alpha1
kind: GatewayConfig
metadata: {{name: shared-l4, namespace: infra}}
spec:
  listeners:
  - {{name: tcp-pool, endPort: 30999}}
  - {{name: udp-pool, endPort: 30999}}{snat}
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {{name: web, namespace: team-a}}
spec:
  parentRefs: [{{name: shared, namespace: infra, port: {WEB_PORT}}}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: team-a}}
spec: {{ports: [{{name: http, port: 80, protocol: TCP}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: team-a
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
{endpoints}
ports: [{{name: http, port: 8080, protocol: TCP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: UDPRoute
metadata: {{name: dns, namespace: team-b}}
spec:
  parentRefs: [{{name: shared, namespace: infra, port: {DNS_PORT}}}]
  rules: [{{backendRefs: [{{name: dns, port: 53}}]}}]
---
apiVersion: v1
kind: Service
metadata: {{name: dns, namespace: team-b}}
spec: {{ports: [{{name: dns, port: 53, protocol: UDP}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-1
  namespace: team-b
  labels: {{kubernetes.io/service-name: dns}}
addressType: IPv4
endpoints:
{endpoints}
ports: [{{name: dns, port: 5353, protocol: UDP}}]
"
    )
}

/// What kind of load a sample is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `curl` of a page, a new connection each time.
    Http,
    /// `dig`, a new 5-tuple each time.
    Dns,
    /// One UDP 5-tuple asking every 20 ms.
    Stream,
    /// A 10 MB download read at about 2 MB/s.
    Download,
}

impl Kind {
    /// All kinds, in report order.
    pub const ALL: [Kind; 4] = [Kind::Http, Kind::Dns, Kind::Stream, Kind::Download];

    /// The report's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Http => "curl",
            Kind::Dns => "dig",
            Kind::Stream => "udp stream",
            Kind::Download => "download",
        }
    }
}

/// One request (or one download) of the steady load.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Its kind.
    pub kind: Kind,
    /// When it started.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
    /// Whether it was answered correctly (a download: all of it).
    pub ok: bool,
    /// A download's longest wait between two reads.
    pub stall: Duration,
    /// What went wrong.
    pub error: Option<String>,
    /// The backend that answered, where the answer says.
    pub backend: Option<usize>,
}

/// The steady load: curl, dig, a UDP stream and downloads, each in a loop on a thread
/// in the client's namespace, until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    /// Starts every loop in `client`.
    pub fn start(client: &Netns) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for kind in Kind::ALL {
            let (stop, samples) = (stop.clone(), samples.clone());
            threads.push(client.spawn_thread(move || {
                // The stream keeps one socket, and so one 5-tuple, for the whole run.
                let mut stream = (kind == Kind::Stream).then(|| {
                    Flow::new(
                        SocketAddr::from((VIP, DNS_PORT)),
                        Duration::from_millis(500),
                    )
                });
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let (ok, stall, error, backend) = match kind {
                        Kind::Http => curl(),
                        Kind::Dns => dig(),
                        Kind::Stream => ask(stream.as_mut()),
                        Kind::Download => download(&stop),
                    };
                    let end = Instant::now();
                    samples
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Sample {
                            kind,
                            start,
                            end,
                            ok,
                            stall,
                            error,
                            backend,
                        });
                    // Pacing, not synchronisation: about 20 requests a second.
                    let pause = match kind {
                        Kind::Http | Kind::Dns => 40,
                        Kind::Stream => 20,
                        Kind::Download => 0,
                    };
                    std::thread::sleep(Duration::from_millis(pause).saturating_sub(end - start));
                }
            }));
        }
        Load {
            stop,
            samples,
            threads,
        }
    }

    /// The samples so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops the loops (a download in progress is cut short, not counted).
    pub fn stop(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.samples()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

type Outcome = (bool, Duration, Option<String>, Option<usize>);

fn failed(error: String) -> Outcome {
    (false, Duration::ZERO, Some(error), None)
}

/// One `curl` of team A's page through the gateway address.
fn curl() -> Outcome {
    let url = format!("http://{VIP}:{WEB_PORT}/");
    let out = std::process::Command::new("curl")
        .args(["-s", "--connect-timeout", "3", "--max-time", "5", &url])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let body = String::from_utf8_lossy(&o.stdout);
            match body
                .trim()
                .strip_prefix("backend-")
                .and_then(|n| n.parse().ok())
            {
                Some(n) => (true, Duration::ZERO, None, Some(n)),
                None => failed(format!("curl: unexpected body {body:?}")),
            }
        }
        Ok(o) => failed(format!(
            "curl: {} {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => failed(format!("curl: {e}")),
    }
}

/// One `dig` of team B's DNS server through the gateway address.
fn dig() -> Outcome {
    let out = std::process::Command::new("dig")
        .args([
            &format!("@{VIP}"),
            "-p",
            &DNS_PORT.to_string(),
            WHOAMI,
            "+short",
            "+tries=1",
            "+time=2",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            match text.trim().parse::<Ipv4Addr>() {
                Ok(m) => (
                    true,
                    Duration::ZERO,
                    None,
                    Some(crate::topo::backend_of_marker(m)),
                ),
                Err(_) => failed(format!("dig: no answer ({})", text.trim())),
            }
        }
        Ok(o) => failed(format!(
            "dig: {} {}",
            o.status,
            String::from_utf8_lossy(&o.stdout)
        )),
        Err(e) => failed(format!("dig: {e}")),
    }
}

/// One question of the UDP stream.
fn ask(stream: Option<&mut Flow>) -> Outcome {
    match stream.and_then(Flow::ask) {
        Some(m) => (
            true,
            Duration::ZERO,
            None,
            Some(crate::topo::backend_of_marker(m)),
        ),
        None => failed("udp stream: no answer in 500 ms".into()),
    }
}

/// One download of `/big` (`BIG_FILE` bytes) through the gateway address, read at
/// about 2 MB/s; its longest wait between two reads.
fn download(stop: &AtomicBool) -> Outcome {
    const RATE: u64 = 2 << 20;
    let run = || -> Result<Duration, String> {
        let addr = SocketAddr::from((VIP, WEB_PORT));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            .map_err(|e| format!("download: connect: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        s.write_all(b"GET /big HTTP/1.1\r\nHost: berth\r\nConnection: close\r\n\r\n")
            .map_err(|e| format!("download: send: {e}"))?;
        let start = Instant::now();
        let (mut got, mut last, mut stall) = (0u64, Instant::now(), Duration::ZERO);
        let mut buf = vec![0u8; 64 << 10];
        let mut header = Vec::new();
        let mut body = 0u64;
        loop {
            let n = s
                .read(&mut buf)
                .map_err(|e| format!("download: read after {body} of {BIG_FILE} bytes: {e}"))?;
            let now = Instant::now();
            stall = stall.max(now - last);
            last = now;
            if n == 0 {
                break;
            }
            got += n as u64;
            if body == 0 && header.len() < 4096 {
                header.extend_from_slice(&buf[..n]);
                if let Some(end) = header.windows(4).position(|w| w == b"\r\n\r\n") {
                    body = header.len() as u64 - end as u64 - 4;
                    header.truncate(end);
                }
            } else {
                body += n as u64;
            }
            if stop.load(Ordering::Relaxed) {
                return Err("stopped".into());
            }
            // Pacing: about RATE bytes a second.
            let due = Duration::from_secs_f64(got as f64 / RATE as f64);
            std::thread::sleep(due.saturating_sub(start.elapsed()));
        }
        if body != BIG_FILE {
            return Err(format!(
                "download: {body} of {BIG_FILE} bytes, then the connection closed"
            ));
        }
        Ok(stall)
    };
    match run() {
        Ok(stall) => (true, stall, None, None),
        Err(e) if e == "stopped" => (true, Duration::ZERO, None, None),
        Err(e) => failed(e),
    }
}

/// What one kind of load saw during an event.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Requests (downloads) that ended in the window.
    pub total: usize,
    /// Of which failed.
    pub failed: usize,
    /// The longest time without a successful answer (a download: without data).
    pub stall: Duration,
    /// The first few errors.
    pub errors: Vec<String>,
    /// The backends that answered.
    pub backends: BTreeSet<usize>,
}

/// What each kind of load saw in the window `[from, to]`: requests that ended in it,
/// downloads that overlap it.
pub fn window(samples: &[Sample], from: Instant, to: Instant) -> Vec<(Kind, Seen)> {
    Kind::ALL
        .iter()
        .map(|&kind| {
            let mut seen = Seen::default();
            let mut last_ok = from;
            for s in samples.iter().filter(|s| s.kind == kind) {
                let inside = match kind {
                    Kind::Download => s.start < to && s.end > from,
                    _ => s.end >= from && s.end <= to,
                };
                if !inside {
                    continue;
                }
                seen.total += 1;
                if s.ok {
                    seen.stall = seen.stall.max(s.stall);
                    if kind != Kind::Download {
                        seen.stall = seen.stall.max(s.end.saturating_duration_since(last_ok));
                        last_ok = s.end;
                    }
                    seen.backends.extend(s.backend);
                } else {
                    seen.failed += 1;
                    if seen.errors.len() < 3 {
                        seen.errors.extend(s.error.clone());
                    }
                }
            }
            if kind != Kind::Download {
                seen.stall = seen.stall.max(to.saturating_duration_since(last_ok));
            }
            (kind, seen)
        })
        .collect()
}
