//! `cargo xtask bench control-plane [--routes N]...` (root): `berth run` with N routes
//! (default 1k, 10k and 100k in turn) and its datapath attached in a private namespace.
//!
//! The world of issue 29: four Gateways (10.252.0.1-4), each with one TCP listener whose
//! range holds 25,100 ports (25,000 for the routes, room for the changes); N TCPRoutes
//! spread over them, each with its own Service and EndpointSlice (one endpoint), in
//! 1,000 files (N/1000 routes with their Services and slices per file; below 1,000
//! routes one route a file). The daemon gets `--max-services` and `--max-backends` of
//! N and the changes, capped at `berth::datapath::Limits`' maxima: routes beyond them
//! wait (reason DatapathFull), which the bench reports, waiting for the admitted ones.
//!
//! Measured per N:
//! - cold start: from starting the daemon on a fresh state directory to ready with
//!   every admitted route's service in the BPF map; and the time the first plan spent
//!   reading the manifests (the daemon's `planned` log line, `snapshot=`);
//! - change latency (p50, p99 over `CHANGES` each): a new route file (route, Service,
//!   slice) to its port in the API and its service in the BPF map; a Service change
//!   (its port renamed, so the backend port becomes the slice's other port) to the
//!   new backend port in the BPF maps; an EndpointSlice change (the endpoint's
//!   address) to the new backend in the BPF maps;
//! - idle cost: the daemon's CPU seconds (utime + stime) over `IDLE` with nothing
//!   changing;
//! - memory: RSS at ready, peak RSS (VmHWM), RSS after `berth get routes`; and the
//!   kernel memory of the daemon's BPF maps (the sum of `memlock` in its fdinfo);
//! - `berth get routes` (the CLI, and a GET of `/api/v1/routes` it uses) and a scrape
//!   of `/metrics`: wall time and bytes.
//!
//! Prints one column per N and, last, one JSON line. Every wait has a timeout that
//! says what it waited for; the daemon, its namespace, pins and directories are
//! removed on every exit, a panic included. `BERTH_BENCH_LOG=1` copies the daemon's
//! log to stderr when the run ends; `BERTH_BENCH_BINARY=PATH` measures another build
//! of `berth` (the code before a change).

use std::{
    fmt::Write as _,
    io::{Read, Write},
    net::{Ipv4Addr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use aya::maps::{Array, HashMap, Map, MapData};
use berth::{
    admin::RouteRow,
    datapath::{Limits, Protocol, ServiceAddr},
};
use berth_tests::{daemon::berth_binary, netns::Netns};
use gateway_common::{map_names, Backend, Service, ServiceKey};

/// Ns measured when no `--routes` is given.
const DEFAULT_ROUTES: [usize; 3] = [1_000, 10_000, 100_000];
/// Changes of each kind.
const CHANGES: usize = 50;
/// Files the routes are spread over.
const FILES: usize = 1_000;
const GATEWAYS: u8 = 4;
const FIRST_PORT: u16 = 30_000;
/// The last port of each range: 25,000 ports for the routes and 100 for the changes.
const END_PORT: u16 = 55_099;
const ADMIN: &str = "127.0.0.1:9470";
/// How often the bench looks for a change's effect (the resolution of its timings).
const POLL: Duration = Duration::from_millis(1);
/// How long one change may take before its kind is given up.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a cold start may take.
const START_TIMEOUT: Duration = Duration::from_secs(900);
/// How long the idle cost is measured.
const IDLE: Duration = Duration::from_secs(10);
/// How long one GET may take (a big answer at 100k routes takes seconds).
const GET_TIMEOUT: Duration = Duration::from_secs(120);

/// Gateway `g`'s address.
fn gateway_addr(g: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 252, 0, 1 + g as u8)
}

fn gateways_yaml() -> String {
    let mut out = String::from(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: berth}\n\
         spec: {controllerName: berth.dev/gateway-controller}\n",
    );
    for g in 0..usize::from(GATEWAYS) {
        let addr = gateway_addr(g);
        let _ = write!(
            out,
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw{g}, namespace: infra}}\n\
             spec:\n  gatewayClassName: berth\n  addresses: [{{value: {addr}}}]\n  infrastructure:\n    \
             parametersRef: {{group: berth.dev, kind: GatewayConfig, name: cfg{g}}}\n  listeners:\n  \
             - {{name: pool, protocol: TCP, port: {FIRST_PORT}, allowedRoutes: {{namespaces: {{from: All}}}}}}\n---\n\
             apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: cfg{g}, namespace: infra}}\n\
             spec: {{listeners: [{{name: pool, endPort: {END_PORT}}}]}}\n"
        );
    }
    out
}

/// How one route's objects are written: as generated, or changed for a measurement.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Original,
    /// The Service's port renamed `p` → `q`: the backend port becomes 9090.
    ServicePort,
    /// The endpoint's address moved to `moved_endpoint`.
    Endpoint,
}

/// Route `i`'s endpoint address (unique up to 2^24 routes).
fn endpoint(i: usize) -> Ipv4Addr {
    let [_, a, b, c] = (i as u32).to_be_bytes();
    Ipv4Addr::new(10, 100 + a, b, c)
}

/// Where the EndpointSlice change moves route `i`'s endpoint.
fn moved_endpoint(i: usize) -> Ipv4Addr {
    let [_, a, b, c] = (i as u32).to_be_bytes();
    Ipv4Addr::new(10, 200 + a, b, c)
}

/// Route `name` (index `i`) on gateway `g` with its own Service and EndpointSlice.
fn route_objects(out: &mut String, ns: &str, i: usize, g: usize, variant: Variant) {
    let service_port = if variant == Variant::ServicePort {
        "q"
    } else {
        "p"
    };
    let addr = if variant == Variant::Endpoint {
        moved_endpoint(i)
    } else {
        endpoint(i)
    };
    let _ = write!(
        out,
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {{name: r{i}, namespace: {ns}}}\n\
         spec:\n  parentRefs: [{{name: gw{g}, namespace: infra}}]\n  rules: [{{backendRefs: [{{name: s{i}, port: 80}}]}}]\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: {ns}}}\n\
         spec: {{ports: [{{name: {service_port}, port: 80}}]}}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: s{i}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: s{i}}}}}\n\
         addressType: IPv4\nendpoints: [{{addresses: [{addr}]}}]\n\
         ports: [{{name: p, port: 8080}}, {{name: q, port: 9090}}]\n"
    );
}

/// The generated world of `n` routes: which file holds which routes.
struct World {
    n: usize,
    files: usize,
    per_file: usize,
    dir: PathBuf,
}

impl World {
    fn new(n: usize, dir: PathBuf) -> World {
        let files = n.clamp(1, FILES);
        World {
            n,
            files,
            per_file: n.div_ceil(files),
            dir,
        }
    }

    fn namespace(f: usize) -> String {
        format!("t{f:04}")
    }

    /// The routes of file `f`.
    fn routes_of(&self, f: usize) -> std::ops::Range<usize> {
        (f * self.per_file).min(self.n)..((f + 1) * self.per_file).min(self.n)
    }

    /// File `f` with route `changed` written as `variant`.
    fn file_text(&self, f: usize, changed: Option<(usize, Variant)>) -> String {
        let mut out = String::new();
        for i in self.routes_of(f) {
            let variant = match changed {
                Some((c, v)) if c == i => v,
                _ => Variant::Original,
            };
            route_objects(&mut out, &World::namespace(f), i, i % 4, variant);
        }
        out
    }

    fn path(&self, f: usize) -> PathBuf {
        self.dir.join(format!("{}.yaml", World::namespace(f)))
    }

    fn write(&self) {
        std::fs::create_dir_all(&self.dir).expect("manifest directory");
        std::fs::write(self.dir.join("00-gateways.yaml"), gateways_yaml()).expect("write");
        for f in 0..self.files {
            std::fs::write(self.path(f), self.file_text(f, None)).expect("write");
        }
    }
}

/// Replaces `path` whole (written aside, then renamed), so that the daemon never
/// reads half a file.
fn replace(path: &Path, text: &str) {
    let aside = path.with_extension("tmp");
    std::fs::write(&aside, text).expect("write");
    std::fs::rename(&aside, path).expect("rename");
}

/// What is removed when a run ends, however it ends: the daemon (by PID), its
/// directories and its pins.
struct Run {
    child: Child,
    dirs: Vec<PathBuf>,
    log: PathBuf,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::env::var_os("BERTH_BENCH_LOG").is_some() {
            eprint!("{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A memory figure of `/proc/PID/status` (`VmRSS:`, `VmHWM:`) in MiB.
fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// The CPU seconds (user and system) process `pid` used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) : state is field 3, utime 14.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    fields.iter().sum::<u64>() as f64 / ticks
}

/// The CPU seconds (user and system) of this process's children that ended.
fn children_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given, which lives across the call.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The kernel memory of the BPF maps process `pid` holds open (each map once), MiB.
fn maps_memlock_mib(pid: u32) -> f64 {
    let mut seen = std::collections::BTreeMap::new();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0.0;
    };
    for fd in fds.flatten() {
        let info = std::fs::read_to_string(fd.path()).unwrap_or_default();
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        if let (Some(_), Some(id), Some(memlock)) =
            (field("map_type:"), field("map_id:"), field("memlock:"))
        {
            seen.insert(id, memlock.parse::<u64>().unwrap_or(0));
        }
    }
    seen.values().sum::<u64>() as f64 / (1024.0 * 1024.0)
}

/// The seconds of the day of a log line's timestamp (`2026-12-05T13:20:33.123456Z`).
fn logged_at(line: &str) -> Option<f64> {
    let time = line.split_whitespace().next()?.split_once('T')?.1;
    let mut parts = time.trim_end_matches('Z').split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// What the daemon's log says of its first plan: the time from `berth running` to
/// the plan's start (reading the manifests, mostly), and the plan's own time (its
/// `planned` line's `total`).
fn first_plan(log: &str) -> String {
    let running = log.lines().find(|l| l.contains("berth running"));
    let planned = log.lines().find(|l| l.contains("planned"));
    let (Some(running), Some(planned)) = (running, planned) else {
        return "-".into();
    };
    let total = planned
        .split_once("total=")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("-");
    let seconds = |d: &str| {
        let (n, unit) = d.split_at(d.find(|c: char| c.is_alphabetic() || c == 'µ')?);
        let n: f64 = n.parse().ok()?;
        Some(match unit {
            "s" => n,
            "ms" => n / 1e3,
            "µs" => n / 1e6,
            "ns" => n / 1e9,
            _ => return None,
        })
    };
    match (logged_at(running), logged_at(planned), seconds(total)) {
        (Some(r), Some(p), Some(t)) => format!("{:.0} + {:.0}", (p - t - r) * 1e3, t * 1e3),
        _ => "-".into(),
    }
}

fn percentile(v: &[f64], p: f64) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[((v.len() as f64 - 1.0) * p).round() as usize])
}

/// A GET of the admin endpoint (from inside the daemon's namespace) without
/// `berth::admin::get`'s 5 s limit: the status line and the body.
fn get_long(ns: &Netns, path: &str) -> std::io::Result<(String, Vec<u8>)> {
    ns.enter(|| {
        let mut s = TcpStream::connect(ADMIN)?;
        s.set_read_timeout(Some(GET_TIMEOUT))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {ADMIN}\r\n\r\n")?;
        let mut text = Vec::new();
        s.read_to_end(&mut text)?;
        let end = text
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(text.len(), |e| e + 4);
        let head = String::from_utf8_lossy(&text[..end]).into_owned();
        let status = head.lines().next().unwrap_or_default().to_string();
        Ok((status, text.split_off(end)))
    })
}

/// A GET of `path` that must answer 200: its wall time (ms), the CPU time daemon
/// `pid` spent meanwhile (ms) and the size of its body.
fn timed_get(ns: &Netns, pid: u32, path: &str) -> (f64, f64, usize) {
    let (t, cpu) = (Instant::now(), cpu_seconds(pid));
    let (status, body) = get_long(ns, path).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(status.contains("200"), "GET {path}: {status}");
    (ms, (cpu_seconds(pid) - cpu) * 1e3, body.len())
}

/// The pinned maps a change's effect is looked for in.
struct Maps {
    services: HashMap<MapData, ServiceKey, Service>,
    maglev: Array<MapData, u32>,
    backends: Array<MapData, Backend>,
    addresses: HashMap<MapData, u32, u32>,
}

impl Maps {
    fn open(pins: &Path) -> Maps {
        let open = |name: &str| {
            MapData::from_pin(pins.join(name)).unwrap_or_else(|e| panic!("pinned map {name}: {e}"))
        };
        Maps {
            services: HashMap::try_from(Map::HashMap(open(map_names::SERVICES)))
                .expect("services map"),
            maglev: Array::try_from(Map::Array(open(map_names::MAGLEV))).expect("maglev map"),
            backends: Array::try_from(Map::Array(open(map_names::BACKENDS))).expect("backends map"),
            addresses: HashMap::try_from(Map::HashMap(open(map_names::ADDRESSES)))
                .expect("addresses map"),
        }
    }

    /// Services programmed on every address (a handful of lookups, not a walk).
    fn services_count(&self) -> u64 {
        self.addresses
            .iter()
            .filter_map(Result::ok)
            .map(|(_, n)| u64::from(n))
            .sum()
    }

    /// The backend a new flow to `key` goes to (the table's first slot), if any.
    fn backend(&self, key: &ServiceKey) -> Option<(Ipv4Addr, u16)> {
        let svc = self.services.get(key, 0).ok()?;
        // No table: no backend takes new flows.
        if Service::table_size(svc.table) == 0 {
            return None;
        }
        let first = self.maglev.get(&Service::table_start(svc.table), 0).ok()?;
        let b = self.backends.get(&first, 0).ok()?;
        Some((Ipv4Addr::from(u32::from_be(b.addr)), u16::from_be(b.port)))
    }
}

fn key(g: usize, port: u16) -> ServiceKey {
    ServiceAddr {
        addr: gateway_addr(g).into(),
        protocol: Protocol::Tcp,
        port,
    }
    .key()
    .expect("the benchmark's gateway addresses are IPv4")
}

/// The change latencies of one kind (ms), and why it stopped early, if it did.
#[derive(Default)]
struct Latencies {
    to_api: Vec<f64>,
    to_map: Vec<f64>,
    stopped: Option<String>,
}

/// One N's figures.
#[derive(Default)]
struct Figures {
    n: usize,
    programmed: u64,
    waiting: u64,
    max_services: u32,
    cold_ms: f64,
    manifests_read: String,
    new_route: Latencies,
    service: Latencies,
    slice: Latencies,
    idle_cpu_s: f64,
    rss_ready: f64,
    rss_peak: f64,
    /// The peak before the GETs: the start's and the changes', not the answers'.
    rss_peak_before_get: f64,
    rss_before_get: f64,
    rss_after_get: f64,
    memlock_mib: f64,
    routes_api_ms: f64,
    /// The daemon's CPU time answering it (less noisy than the wall time on a busy
    /// machine).
    routes_api_cpu_ms: f64,
    routes_api_bytes: usize,
    cli_ms: f64,
    /// The CLI's own CPU time (its process's user and system time).
    cli_cpu_ms: f64,
    cli_bytes: usize,
    cli_error: Option<String>,
    metrics_ms: f64,
    metrics_cpu_ms: f64,
    metrics_bytes: usize,
    load: String,
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Waits until `found` gives a value, polling every `POLL`, for `CHANGE_TIMEOUT`.
fn wait_for<T>(mut found: impl FnMut() -> Option<T>) -> Option<T> {
    let t = Instant::now();
    loop {
        if let Some(v) = found() {
            return Some(v);
        }
        if t.elapsed() > CHANGE_TIMEOUT {
            return None;
        }
        // Poll every millisecond, not flat out: on two CPUs a tight loop of requests
        // would take the daemon's CPU away from the very work being timed.
        std::thread::sleep(POLL);
    }
}

/// The port of route `name` in namespace `ns`, as the API says now.
fn port_of(ns: &Netns, namespace: &str, name: &str) -> Option<u16> {
    let body = ns
        .enter(|| berth::admin::get(ADMIN, &format!("/api/v1/routes/{namespace}")))
        .ok()?;
    let rows: Vec<RouteRow> = serde_json::from_str(&body).ok()?;
    rows.iter().find(|r| r.name == name).and_then(|r| r.port)
}

fn measure(n: usize, berth: &Path) -> Figures {
    let ns = Netns::new("cp");
    ns.ip(&["link", "add", "c0", "type", "veth", "peer", "name", "c1"]);
    ns.ip(&["link", "set", "c0", "up"]);
    ns.ip(&["link", "set", "c1", "up"]);
    let id = format!("{}-{n}", std::process::id());
    let tmp = std::env::temp_dir();
    let world = World::new(n, tmp.join(format!("berth-cpbench-manifests-{id}")));
    let state = tmp.join(format!("berth-cpbench-state-{id}"));
    let pins = PathBuf::from(format!("/sys/fs/bpf/berth-test-cpbench-{id}"));
    let log = tmp.join(format!("berth-cpbench-{id}.log"));
    let t = Instant::now();
    world.write();
    eprintln!(
        "{n} routes: {} files written in {:.1} s",
        world.files,
        t.elapsed().as_secs_f64()
    );
    let want = u32::try_from(n + CHANGES).unwrap_or(u32::MAX);
    let max_services = want.next_power_of_two().min(Limits::MAX_SERVICES);
    let max_backends = want.next_power_of_two().min(Limits::MAX_BACKENDS);

    let started = Instant::now();
    let child = ns
        .command(berth)
        .arg("run")
        .arg("--manifests")
        .arg(&world.dir)
        .arg("--state-dir")
        .arg(&state)
        .arg("--pin-dir")
        .arg(&pins)
        .args(["--interface", "c0", "--admin-addr", ADMIN])
        .args(["--max-services", &max_services.to_string()])
        .args(["--max-backends", &max_backends.to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("daemon log"))
        .env("RUST_LOG", "berth=debug")
        .spawn()
        .expect("start berth run");
    let pid = child.id();
    let mut run = Run {
        child,
        dirs: vec![world.dir.clone(), state.clone(), pins.clone()],
        log: log.clone(),
    };
    let mut fig = Figures {
        n,
        max_services,
        ..Figures::default()
    };

    // Ready, then every admitted route's service in the BPF map: all N, or as many as
    // the datapath took once that number stops growing (the rest wait, DatapathFull).
    let expected = (n as u64).min(u64::from(max_services));
    let mut maps = None;
    let (mut last, mut since) = (0, Instant::now());
    loop {
        if let Ok(Some(status)) = run.child.try_wait() {
            panic!(
                "berth run exited ({status}) before it was ready; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < START_TIMEOUT,
            "{n} routes: not ready with every route programmed within {START_TIMEOUT:?} \
             ({last} services in the BPF map)"
        );
        if ns.enter(|| berth::admin::get(ADMIN, "/readyz")).is_ok() {
            let m = maps.get_or_insert_with(|| Maps::open(&pins));
            let count = m.services_count();
            if count != last {
                (last, since) = (count, Instant::now());
            }
            if count >= expected || (count > 0 && since.elapsed() > Duration::from_secs(5)) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // A stall's 5 s are not part of the cold start.
    fig.cold_ms = if last >= expected {
        started.elapsed()
    } else {
        since.duration_since(started)
    }
    .as_secs_f64()
        * 1e3;
    fig.programmed = last;
    fig.waiting = n as u64 - last.min(n as u64);
    fig.rss_ready = status_mib(pid, "VmRSS:");
    fig.manifests_read = first_plan(&std::fs::read_to_string(&log).unwrap_or_default());
    eprintln!(
        "{n} routes: ready in {:.0} ms, {} programmed, {} waiting",
        fig.cold_ms, fig.programmed, fig.waiting
    );
    let maps = maps.expect("maps opened once ready");

    // Idle cost, before anything changes.
    let cpu = cpu_seconds(pid);
    std::thread::sleep(IDLE);
    fig.idle_cpu_s = cpu_seconds(pid) - cpu;
    fig.memlock_mib = maps_memlock_mib(pid);

    fig.new_route = new_routes(&ns, &world, &maps, fig.waiting > 0);
    fig.service = changes(&ns, &world, &maps, Variant::ServicePort);
    fig.slice = changes(&ns, &world, &maps, Variant::Endpoint);

    fig.rss_before_get = status_mib(pid, "VmRSS:");
    fig.rss_peak_before_get = status_mib(pid, "VmHWM:");
    (
        fig.routes_api_ms,
        fig.routes_api_cpu_ms,
        fig.routes_api_bytes,
    ) = timed_get(&ns, pid, "/api/v1/routes");
    let (t, cli_cpu) = (Instant::now(), children_cpu_seconds());
    let cli = ns
        .command(berth)
        .args(["get", "routes", "--admin-addr", ADMIN])
        .stderr(Stdio::piped())
        .output()
        .expect("berth get routes");
    fig.cli_ms = t.elapsed().as_secs_f64() * 1e3;
    fig.cli_cpu_ms = (children_cpu_seconds() - cli_cpu) * 1e3;
    fig.cli_bytes = cli.stdout.len();
    if !cli.status.success() {
        fig.cli_error = Some(String::from_utf8_lossy(&cli.stderr).trim().to_string());
    }
    fig.rss_after_get = status_mib(pid, "VmRSS:");
    (fig.metrics_ms, fig.metrics_cpu_ms, fig.metrics_bytes) = timed_get(&ns, pid, "/metrics");
    fig.rss_peak = status_mib(pid, "VmHWM:");
    fig.load = load_average();
    drop(maps);
    drop(run);
    fig
}

/// `CHANGES` new route files (route, Service, slice, namespace `new`, gateway 0): to
/// the port in the API and the service in the BPF map. With the datapath full the new
/// routes wait, so only the port is timed.
fn new_routes(ns: &Netns, world: &World, maps: &Maps, full: bool) -> Latencies {
    let mut out = Latencies::default();
    for j in 0..CHANGES {
        let i = world.n + j;
        let mut text = String::new();
        route_objects(&mut text, "new", i, 0, Variant::Original);
        let t = Instant::now();
        replace(&world.dir.join(format!("zz-new-{j:03}.yaml")), &text);
        let Some(port) = wait_for(|| port_of(ns, "new", &format!("r{i}"))) else {
            out.stopped = Some(format!("new route {j}: no port within {CHANGE_TIMEOUT:?}"));
            return out;
        };
        out.to_api.push(t.elapsed().as_secs_f64() * 1e3);
        if full {
            continue;
        }
        if wait_for(|| maps.backend(&key(0, port))).is_none() {
            out.stopped = Some(format!(
                "new route {j}: not in the BPF map within {CHANGE_TIMEOUT:?}"
            ));
            return out;
        }
        out.to_map.push(t.elapsed().as_secs_f64() * 1e3);
    }
    if full {
        out.stopped = Some("datapath full: new routes wait, port only".into());
    }
    out
}

/// `CHANGES` changes of kind `variant` to routes of different files (the first route
/// of files 0-49 for Services, 50-99 for slices, all admitted as the oldest by name),
/// each to its new backend in the BPF maps.
fn changes(ns: &Netns, world: &World, maps: &Maps, variant: Variant) -> Latencies {
    let mut out = Latencies::default();
    let first = if variant == Variant::ServicePort {
        0
    } else {
        CHANGES
    };
    for c in 0..CHANGES {
        let f = (first + c) % world.files;
        let i = world.routes_of(f).start;
        let g = i % 4;
        let Some(port) = port_of(ns, &World::namespace(f), &format!("r{i}")) else {
            out.stopped = Some(format!("route {i} has no port"));
            return out;
        };
        let want = match variant {
            Variant::ServicePort => (endpoint(i), 9090),
            _ => (moved_endpoint(i), 8080),
        };
        if maps.backend(&key(g, port)) == Some(want) {
            out.stopped = Some(format!(
                "route {i} was changed before (fewer than 100 files)"
            ));
            return out;
        }
        let t = Instant::now();
        replace(&world.path(f), &world.file_text(f, Some((i, variant))));
        if wait_for(|| (maps.backend(&key(g, port)) == Some(want)).then_some(())).is_none() {
            out.stopped = Some(format!(
                "route {i}: backend {}:{} not in the BPF maps within {CHANGE_TIMEOUT:?}",
                want.0, want.1
            ));
            return out;
        }
        out.to_map.push(t.elapsed().as_secs_f64() * 1e3);
    }
    out
}

fn mib(bytes: usize) -> String {
    format!("{:.2}", bytes as f64 / (1024.0 * 1024.0))
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

/// A row of the table: its name and how to read its cell from one N's figures.
type Row = (&'static str, Box<dyn Fn(&Figures) -> String>);

fn print(figs: &[Figures]) {
    let rows: Vec<Row> = vec![
        ("routes", Box::new(|f| f.n.to_string())),
        (
            "programmed / waiting (DatapathFull)",
            Box::new(|f| format!("{} / {}", f.programmed, f.waiting)),
        ),
        ("--max-services", Box::new(|f| f.max_services.to_string())),
        (
            "cold start to ready, all programmed, ms",
            Box::new(|f| format!("{:.0}", f.cold_ms)),
        ),
        (
            "  start to first plan + first plan, ms",
            Box::new(|f| f.manifests_read.clone()),
        ),
        (
            "new route file -> port in API p50/p99 ms",
            Box::new(|f| pair(&f.new_route.to_api)),
        ),
        (
            "new route file -> BPF service p50/p99 ms",
            Box::new(|f| pair(&f.new_route.to_map)),
        ),
        (
            "Service change -> BPF backend p50/p99 ms",
            Box::new(|f| pair(&f.service.to_map)),
        ),
        (
            "slice change -> BPF backend p50/p99 ms",
            Box::new(|f| pair(&f.slice.to_map)),
        ),
        (
            "idle CPU s over 10 s",
            Box::new(|f| format!("{:.2}", f.idle_cpu_s)),
        ),
        (
            "RSS at ready MiB",
            Box::new(|f| format!("{:.0}", f.rss_ready)),
        ),
        (
            "peak RSS before the GETs / at the end (VmHWM) MiB",
            Box::new(|f| format!("{:.0} / {:.0}", f.rss_peak_before_get, f.rss_peak)),
        ),
        (
            "RSS before / after berth get routes MiB",
            Box::new(|f| format!("{:.0} / {:.0}", f.rss_before_get, f.rss_after_get)),
        ),
        (
            "BPF maps memlock MiB",
            Box::new(|f| format!("{:.1}", f.memlock_mib)),
        ),
        (
            "GET /api/v1/routes ms (daemon CPU ms)",
            Box::new(|f| format!("{:.0} ({:.0})", f.routes_api_ms, f.routes_api_cpu_ms)),
        ),
        (
            "GET /api/v1/routes MiB",
            Box::new(|f| mib(f.routes_api_bytes)),
        ),
        (
            "berth get routes (CLI) ms (its CPU ms)",
            Box::new(|f| {
                format!(
                    "{:.0} ({:.0}){}",
                    f.cli_ms,
                    f.cli_cpu_ms,
                    if f.cli_error.is_some() {
                        " (failed)"
                    } else {
                        ""
                    }
                )
            }),
        ),
        (
            "berth get routes output MiB",
            Box::new(|f| mib(f.cli_bytes)),
        ),
        (
            "GET /metrics ms (daemon CPU ms)",
            Box::new(|f| format!("{:.0} ({:.0})", f.metrics_ms, f.metrics_cpu_ms)),
        ),
        ("GET /metrics MiB", Box::new(|f| mib(f.metrics_bytes))),
        ("load average at the end", Box::new(|f| f.load.clone())),
    ];
    println!("berth run, datapath attached; {CHANGES} changes of each kind");
    for (name, value) in &rows {
        print!("{name:<44}");
        for f in figs {
            print!(" {:>16}", value(f));
        }
        println!();
    }
    for f in figs {
        for (what, l) in [
            ("new routes", &f.new_route),
            ("Service changes", &f.service),
            ("slice changes", &f.slice),
        ] {
            if let Some(why) = &l.stopped {
                println!("{} routes, {what}: {why}", f.n);
            }
        }
        if let Some(e) = &f.cli_error {
            println!("{} routes, berth get routes: {e}", f.n);
        }
    }
    let json: Vec<String> = figs
        .iter()
        .map(|f| {
            let p = |v: &[f64], q| ms(percentile(v, q)).replace('-', "null");
            format!(
                "{{\"routes\":{},\"programmed\":{},\"waiting\":{},\"cold_start_ms\":{:.0},\
                 \"new_route_api_p50_ms\":{},\"new_route_api_p99_ms\":{},\
                 \"new_route_map_p50_ms\":{},\"new_route_map_p99_ms\":{},\
                 \"service_p50_ms\":{},\"service_p99_ms\":{},\"slice_p50_ms\":{},\"slice_p99_ms\":{},\
                 \"idle_cpu_s\":{:.2},\"rss_ready_mib\":{:.0},\"rss_peak_mib\":{:.0},\"rss_peak_before_get_mib\":{:.0},\
                 \"rss_before_get_mib\":{:.0},\"rss_after_get_mib\":{:.0},\"maps_memlock_mib\":{:.1},\"routes_api_ms\":{:.0},\"routes_api_cpu_ms\":{:.0},\
                 \"routes_api_bytes\":{},\"cli_ms\":{:.0},\"cli_cpu_ms\":{:.0},\"cli_bytes\":{},\"metrics_ms\":{:.0},\"metrics_cpu_ms\":{:.0},\
                 \"metrics_bytes\":{}}}",
                f.n,
                f.programmed,
                f.waiting,
                f.cold_ms,
                p(&f.new_route.to_api, 0.5),
                p(&f.new_route.to_api, 0.99),
                p(&f.new_route.to_map, 0.5),
                p(&f.new_route.to_map, 0.99),
                p(&f.service.to_map, 0.5),
                p(&f.service.to_map, 0.99),
                p(&f.slice.to_map, 0.5),
                p(&f.slice.to_map, 0.99),
                f.idle_cpu_s,
                f.rss_ready,
                f.rss_peak,
                f.rss_peak_before_get,
                f.rss_before_get,
                f.rss_after_get,
                f.memlock_mib,
                f.routes_api_ms,
                f.routes_api_cpu_ms,
                f.routes_api_bytes,
                f.cli_ms,
                f.cli_cpu_ms,
                f.cli_bytes,
                f.metrics_ms,
                f.metrics_cpu_ms,
                f.metrics_bytes
            )
        })
        .collect();
    println!("[{}]", json.join(","));
}

fn pair(v: &[f64]) -> String {
    format!("{} / {}", ms(percentile(v, 0.5)), ms(percentile(v, 0.99)))
}

fn main() {
    let mut routes = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().map(|v| v.replace('_', "").parse())) {
            ("--routes", Some(Ok(n))) if n > 0 => routes.push(n),
            _ => {
                eprintln!("usage: berth-bench-control-plane [--routes N]...");
                std::process::exit(2);
            }
        }
    }
    if routes.is_empty() {
        routes = DEFAULT_ROUTES.to_vec();
    }
    // Another build to measure (the code before a change, say), else the one beside.
    let berth = std::env::var_os("BERTH_BENCH_BINARY").map_or_else(berth_binary, PathBuf::from);
    let figs: Vec<Figures> = routes.iter().map(|&n| measure(n, &berth)).collect();
    print(&figs);
}
