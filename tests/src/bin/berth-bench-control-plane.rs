//! `cargo xtask bench control-plane` (root): `berth run` with 10k routes present and
//! its datapath attached in a private namespace:
//! - cold start: from starting the daemon on a fresh state directory to ready,
//! - 100 changes: from a new route file appearing to its port in the API and its
//!   service in the BPF map (p50, p99),
//! - the daemon's resident memory.
//!
//! Prints a table and, last, one JSON line.

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use aya::maps::{HashMap, Map, MapData};
use berth::{
    admin::RouteRow,
    datapath::{Protocol, ServiceAddr},
};
use berth_tests::{daemon::berth_binary, netns::Netns};
use gateway_common::{map_names, Service, ServiceKey};

const ROUTES: usize = 10_000;
const CHANGES: usize = 100;
const ADMIN: &str = "127.0.0.1:9470";
/// How often the bench looks for a change's effect (the resolution of its timings).
const POLL: Duration = Duration::from_millis(1);
const GW: Ipv4Addr = Ipv4Addr::new(10, 252, 0, 1);

fn gateway_yaml() -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: berth}}\n\
         spec: {{controllerName: berth.dev/gateway-controller}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: infra}}\n\
         spec:\n  gatewayClassName: berth\n  addresses: [{{value: {GW}}}]\n  infrastructure:\n    \
         parametersRef: {{group: berth.dev, kind: GatewayConfig, name: cfg}}\n  listeners:\n  \
         - {{name: pool, protocol: TCP, port: 30000, allowedRoutes: {{namespaces: {{from: All}}}}}}\n---\n\
         apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: cfg, namespace: infra}}\n\
         spec: {{listeners: [{{name: pool, endPort: 49999}}]}}\n"
    )
}

fn route(ns: &str, name: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  parentRefs: [{{name: gw, namespace: infra}}]\n  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n"
    )
}

fn service(ns: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: {ns}}}\nspec: {{ports: [{{name: p, port: 80}}]}}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: web-1, namespace: {ns}, labels: {{kubernetes.io/service-name: web}}}}\n\
         addressType: IPv4\nendpoints: [{{addresses: [10.252.1.2]}}]\nports: [{{name: p, port: 8080}}]\n"
    )
}

struct Run {
    child: Child,
    dirs: Vec<PathBuf>,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// A memory figure of `/proc/PID/status` (`VmRSS:`, `RssAnon:`, `RssFile:`) in MiB.
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

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let ns = Netns::new("cp");
    ns.ip(&["link", "add", "c0", "type", "veth", "peer", "name", "c1"]);
    ns.ip(&["link", "set", "c0", "up"]);
    ns.ip(&["link", "set", "c1", "up"]);
    let id = std::process::id();
    let manifests = std::env::temp_dir().join(format!("berth-cpbench-manifests-{id}"));
    let state = std::env::temp_dir().join(format!("berth-cpbench-state-{id}"));
    let pins = PathBuf::from(format!("/sys/fs/bpf/berth-test-cpbench-{id}"));
    std::fs::create_dir_all(&manifests).expect("manifests");
    std::fs::write(manifests.join("00-gateway.yaml"), gateway_yaml()).expect("write");
    let mut bulk = service("bulk");
    for i in 0..ROUTES {
        bulk.push_str(&route("bulk", &format!("r{i}")));
    }
    std::fs::write(manifests.join("01-bulk.yaml"), bulk).expect("write");
    std::fs::write(manifests.join("02-change.yaml"), service("change")).expect("write");

    let started = Instant::now();
    let child = ns
        .command(&berth_binary())
        .arg("run")
        .arg("--manifests")
        .arg(&manifests)
        .arg("--state-dir")
        .arg(&state)
        .arg("--pin-dir")
        .arg(&pins)
        .args(["--interface", "c0", "--admin-addr", ADMIN])
        .stdout(Stdio::null())
        // BERTH_BENCH_LOG=1: the daemon's log (with per-cycle timings) on stderr.
        .stderr(if std::env::var_os("BERTH_BENCH_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .env("RUST_LOG", "berth=debug")
        .spawn()
        .expect("start berth run");
    let run = Run {
        child,
        dirs: vec![manifests.clone(), state.clone(), pins.clone()],
    };
    let get = |path: &str| ns.enter(|| berth::admin::get(ADMIN, path));
    while get("/readyz").is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "berth run did not become ready"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let cold = started.elapsed().as_secs_f64() * 1e3;
    let rss_start = rss_mib(run.child.id());

    let services = Map::HashMap(
        MapData::from_pin(pins.join(map_names::SERVICES)).expect("pinned services map"),
    );
    let services: HashMap<_, ServiceKey, Service> =
        HashMap::try_from(services).expect("services map");
    let (mut to_api, mut to_map) = (Vec::new(), Vec::new());
    for i in 0..CHANGES {
        let t = Instant::now();
        std::fs::write(
            manifests.join(format!("10-change-{i}.yaml")),
            route("change", &format!("c{i}")),
        )
        .expect("write");
        let port = loop {
            if let Ok(body) = get("/api/v1/routes/change") {
                let rows: Vec<RouteRow> = serde_json::from_str(&body).unwrap_or_default();
                if let Some(p) = rows
                    .iter()
                    .find(|r| r.name == format!("c{i}"))
                    .and_then(|r| r.port)
                {
                    break p;
                }
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "change {i} never appeared"
            );
            // Poll every millisecond, not flat out: on two CPUs a tight loop of requests
            // would take the daemon's CPU away from the very work being timed.
            std::thread::sleep(POLL);
        };
        to_api.push(t.elapsed().as_secs_f64() * 1e3);
        let key = ServiceAddr {
            addr: GW.into(),
            protocol: Protocol::Tcp,
            port,
        }
        .key()
        .expect("the benchmark's gateway address is IPv4");
        while services.get(&key, 0).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "change {i} never reached the BPF map"
            );
            std::thread::sleep(POLL);
        }
        to_map.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let rss_end = rss_mib(run.child.id());
    let (anon_end, file_end, peak) = (
        status_mib(run.child.id(), "RssAnon:"),
        status_mib(run.child.id(), "RssFile:"),
        status_mib(run.child.id(), "VmHWM:"),
    );
    drop(run);

    println!(
        "berth run with {ROUTES} routes, datapath attached; {CHANGES} route files added one by one"
    );
    println!(
        "{:<44} {:>10}",
        "cold start to ready (fresh state) ms",
        format!("{cold:.0}")
    );
    println!(
        "{:<44} {:>10}",
        "route file -> port in API, p50 ms",
        format!("{:.1}", percentile(to_api.clone(), 0.5))
    );
    println!(
        "{:<44} {:>10}",
        "route file -> port in API, p99 ms",
        format!("{:.1}", percentile(to_api.clone(), 0.99))
    );
    println!(
        "{:<44} {:>10}",
        "route file -> service in BPF map, p50 ms",
        format!("{:.1}", percentile(to_map.clone(), 0.5))
    );
    println!(
        "{:<44} {:>10}",
        "route file -> service in BPF map, p99 ms",
        format!("{:.1}", percentile(to_map.clone(), 0.99))
    );
    // Where the tail comes from: the slowest changes, in the order they were made.
    let mut slowest: Vec<(usize, f64)> = to_map.iter().copied().enumerate().collect();
    slowest.sort_by(|a, b| b.1.total_cmp(&a.1));
    slowest.truncate(5);
    slowest.sort_by_key(|&(i, _)| i);
    println!(
        "{:<44} {:>10}",
        "slowest changes (number: ms)",
        slowest
            .iter()
            .map(|(i, ms)| format!("{i}: {ms:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "{:<44} {:>10}",
        "daemon RSS after start / after changes MiB",
        format!("{rss_start:.0} / {rss_end:.0}")
    );
    println!(
        "{:<44} {:>10}",
        "  of which heap / mapped files MiB",
        format!("{anon_end:.0} / {file_end:.0}")
    );
    println!(
        "{:<44} {:>10}",
        "daemon peak RSS (cold start included) MiB",
        format!("{peak:.0}")
    );
    println!(
        "{{\"cold_start_ms\":{cold:.0},\"api_p50_ms\":{:.1},\"api_p99_ms\":{:.1},\"map_p50_ms\":{:.1},\"map_p99_ms\":{:.1},\"rss_mib\":{:.0}}}",
        percentile(to_api.clone(), 0.5),
        percentile(to_api, 0.99),
        percentile(to_map.clone(), 0.5),
        percentile(to_map, 0.99),
        rss_end.max(rss_start)
    );
}
