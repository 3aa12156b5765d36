//! `cargo xtask bench planner`: planning time as the daemon plans (with the memo of
//! the last plan) in worlds of 1k, 10k and 100k TCPRoutes, each with its own Service
//! and EndpointSlice (as in a cluster), over 4 Gateways of one 26,000-port range each.
//! Measured: the first plan at start (no claims yet) and the change after it, a route
//! added with its Service and EndpointSlice, a Service changed (a port added or
//! removed), an EndpointSlice changed (an endpoint's address, or its readiness), an
//! idle re-plan (nothing changed: the daemon plans on wake-ups), and a full plan (no
//! memo). Each change builds on the last and its claims are fed back, as the store
//! does. Prints a table (median and p99 over the runs) and, last, one JSON line.
//!
//! `BERTH_BENCH_MAX_SERVICES=N` plans for a datapath of N services (`berth run
//! --max-services`): the routes beyond it wait, and every plan is a full one.
//! `BERTH_BENCH_SIZES=1000,10000` picks the world sizes.
//!
//! With `--files`: the manifest source's bookkeeping with 10k files of one route each
//! (one file per team): the first load, a look at the unchanged directory (made at
//! every wake-up), and one file changed.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use berth::{
    model::*,
    planner::{plan, plan_with, Input, Memo, Plan},
};

/// The allocator `berth` uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const GATEWAYS: usize = 4;
const RANGE_FIRST: u16 = 20000;
/// A little over 25,000 ports: 100k routes fill four ranges of 25,000, and the routes
/// added must get a port.
const RANGE_PORTS: u16 = 26000;
const NAMESPACES: usize = 100;

fn meta(name: &str, ns: &str) -> Meta {
    Meta {
        name: name.into(),
        namespace: Some(ns.into()),
        ..Meta::default()
    }
}

/// The world of `routes` routes.
fn snapshot(routes: usize) -> Snapshot {
    let mut s = Snapshot::default();
    s.gateway_classes.push(Arc::new(GatewayClass {
        metadata: meta("berth", ""),
        spec: GatewayClassSpec {
            controller_name: CONTROLLER_NAME.to_string(),
        },
    }));
    for g in 0..GATEWAYS {
        let all = Some(AllowedRoutes {
            namespaces: Some(RouteNamespaces {
                from: Some("All".to_string()),
                selector: None,
            }),
            kinds: vec![],
        });
        s.gateways.push(Arc::new(Gateway {
            metadata: meta(&format!("shared-{g}"), "infra"),
            spec: GatewaySpec {
                gateway_class_name: "berth".to_string(),
                listeners: vec![Listener {
                    name: "pool".to_string(),
                    port: RANGE_FIRST,
                    protocol: "TCP".to_string(),
                    allowed_routes: all,
                }],
                addresses: vec![GatewayAddress {
                    kind: None,
                    value: format!("10.0.0.{}", g + 1),
                }],
                infrastructure: Some(Infrastructure {
                    parameters_ref: Some(LocalParametersRef {
                        group: BERTH_GROUP.to_string(),
                        kind: "GatewayConfig".to_string(),
                        name: "cfg".to_string(),
                    }),
                }),
            },
        }));
    }
    s.gateway_configs.push(Arc::new(GatewayConfig {
        metadata: meta("cfg", "infra"),
        spec: GatewayConfigSpec {
            listeners: vec![ListenerRange {
                name: "pool".to_string(),
                end_port: RANGE_FIRST + (RANGE_PORTS - 1),
                max_ports_per_namespace: None,
            }],
            release_cooldown: None,
            source_nat: None,
        },
    }));
    for i in 0..routes {
        s.routes.push(route(i).into());
        s.services.push(service(i, false).into());
        s.endpoint_slices.push(slice(i, 1, true).into());
    }
    s
}

fn namespace(i: usize) -> String {
    format!("team-{}", i % NAMESPACES)
}

/// Route `i`: on Gateway `i % 4`, to its own Service `svc-i`.
fn route(i: usize) -> Route {
    Route {
        kind: RouteKind::Tcp,
        metadata: meta(&format!("r{i}"), &namespace(i)),
        spec: RouteSpec {
            parent_refs: vec![ParentRef {
                name: format!("shared-{}", i % GATEWAYS).into(),
                namespace: Some("infra".into()),
                ..ParentRef::default()
            }],
            rules: vec![RouteRule {
                backend_refs: vec![BackendRef {
                    name: format!("svc-{i}").into(),
                    port: Some(80),
                    ..BackendRef::default()
                }],
            }],
        },
        first_seen: Default::default(),
    }
}

/// Service `svc-i`: port 80, and 443 when `second_port`.
fn service(i: usize, second_port: bool) -> Service {
    let port = |name: &str, port| ServicePort {
        name: Some(name.into()),
        port,
        protocol: None,
        target_port: None,
    };
    let mut ports = vec![port("http", 80)];
    if second_port {
        ports.push(port("https", 443));
    }
    Service {
        metadata: meta(&format!("svc-{i}"), &namespace(i)),
        spec: ServiceSpec { ports },
    }
}

/// The EndpointSlice of `svc-i`: one endpoint whose address ends in `host`.
fn slice(i: usize, host: u8, ready: bool) -> EndpointSlice {
    let mut m = meta(&format!("svc-{i}-x1"), &namespace(i));
    m.labels.insert(
        "kubernetes.io/service-name".into(),
        format!("svc-{i}").into(),
    );
    EndpointSlice {
        metadata: m,
        address_type: "IPv4".into(),
        endpoints: vec![Endpoint {
            addresses: vec![format!("10.{}.{}.{host}", 1 + i / 65536 % 200, i / 256 % 256).into()],
            conditions: EndpointConditions {
                ready: Some(ready),
                ..EndpointConditions::default()
            },
        }],
        ports: vec![
            EndpointPort {
                name: Some("http".into()),
                port: Some(8080),
                protocol: None,
            },
            EndpointPort {
                name: Some("https".into()),
                port: Some(8443),
                protocol: None,
            },
        ],
    }
}

/// Median and 99th percentile.
fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    let p99 = (v.len() * 99).div_ceil(100).max(1) - 1;
    (v[v.len() / 2], v[p99])
}

const FILE_RUNS: usize = 7;

/// The `--files` case: times of the standalone manifest source with `n` route files.
fn bench_files(n: usize) {
    use berth::standalone::ManifestSource;
    let dir = std::env::temp_dir().join(format!("berth-bench-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let route = |i: usize, port: u16| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
             metadata: {{name: web, namespace: team-{i}}}\n\
             spec:\n  parentRefs: [{{name: shared, namespace: infra, port: {port}}}]\n  \
             rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n"
        )
    };
    for i in 0..n {
        std::fs::write(dir.join(format!("team-{i:05}.yaml")), route(i, 30000)).expect("write");
    }
    let mut source = ManifestSource::new(&dir, Duration::from_secs(5));
    let t = Instant::now();
    let (changed, errors) = source.refresh().expect("refresh");
    let first = t.elapsed();
    assert!(changed && errors.is_empty(), "{errors:?}");
    let mut idle = Vec::new();
    let mut change = Vec::new();
    let mut named = Vec::new();
    for run in 0..FILE_RUNS {
        let t = Instant::now();
        let (changed, _) = source.refresh().expect("refresh");
        idle.push(t.elapsed());
        assert!(!changed);
        // A longer file: its stamp changes even within the file system's time grain.
        let port = 30001 + run as u16 * 1000;
        std::fs::write(dir.join("team-00042.yaml"), route(42, port)).expect("write");
        let t = Instant::now();
        let (changed, _) = source.refresh().expect("refresh");
        change.push(t.elapsed());
        assert!(changed);
        // The same, with the file named as the directory watch names it.
        let port = 30501 + run as u16 * 1000;
        std::fs::write(dir.join("team-00042.yaml"), route(42, port)).expect("write");
        let look = berth::standalone::Look::Names(["team-00042.yaml".into()].into());
        let t = Instant::now();
        let (changed, _) = source.refresh_looking(look).expect("refresh");
        named.push(t.elapsed());
        assert!(changed);
        assert_eq!(source.snapshot().routes.len(), n);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let median = |v| percentiles(v).0;
    let (idle, change, named) = (median(idle), median(change), median(named));
    println!("manifest source with {n} files of one route each, median of {FILE_RUNS} runs");
    println!(
        "{:<44} {:>10.1}",
        "first load (read and parse all) ms",
        ms(first)
    );
    println!(
        "{:<44} {:>10.2}",
        "look at the unchanged directory ms",
        ms(idle)
    );
    println!(
        "{:<44} {:>10.2}",
        "one file changed, all looked at ms",
        ms(change)
    );
    println!(
        "{:<44} {:>10.2}",
        "one file changed, named by the watch ms",
        ms(named)
    );
    println!(
        "{{\"files\":{n},\"first_load_ms\":{:.1},\"idle_look_ms\":{:.2},\"one_change_ms\":{:.2},\"named_change_ms\":{:.2}}}",
        ms(first),
        ms(idle),
        ms(change),
        ms(named)
    );
}

/// What is measured in each world, in table order.
const KINDS: [&str; 7] = [
    "first plan at start",
    "first change after start",
    "route added (+Service, +slice)",
    "Service changed",
    "EndpointSlice changed",
    "idle re-plan",
    "full plan (no memo)",
];

/// The planner's input as the daemon makes it.
fn input<'a>(
    snapshot: &'a Snapshot,
    claims: &'a berth::model::ClaimList,
    now: SystemTime,
    capacity: berth::datapath::Capacity,
) -> Input<'a> {
    Input {
        snapshot,
        claims,
        now,
        default_addresses: berth::planner::DefaultAddresses::default(),
        ephemeral_ports: None,
        snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
        capacity,
        allocate: true,
    }
}

/// The daemon's view of one world: its objects, the claims stored, the memo.
struct Daemon {
    snap: Snapshot,
    claims: berth::model::ClaimList,
    memo: Memo,
    now: SystemTime,
    capacity: berth::datapath::Capacity,
}

impl Daemon {
    fn input(&self) -> Input<'_> {
        input(&self.snap, &self.claims, self.now, self.capacity)
    }

    /// Plans with the memo, stores the plan's claims; returns the planning time.
    fn plan(&mut self) -> (Duration, Plan) {
        let input = input(&self.snap, &self.claims, self.now, self.capacity);
        let t = Instant::now();
        let p = plan_with(&input, &mut self.memo);
        let took = t.elapsed();
        self.claims = p.claims.clone();
        (took, p)
    }
}

/// Times of each kind in a world of `n` routes, `runs` runs of each change.
fn bench_world(n: usize, runs: usize, capacity: berth::datapath::Capacity) -> Vec<Vec<Duration>> {
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); KINDS.len()];
    let mut d = Daemon {
        snap: snapshot(n),
        claims: Default::default(),
        memo: Memo::default(),
        now: SystemTime::now(),
        capacity,
    };
    let (first, p) = d.plan();
    assert_eq!(p.claims.len(), n, "every route gets a port");
    times[0].push(first);
    // The first change after the start: one route added.
    let mut next = n;
    let mut add = |d: &mut Daemon| {
        let at = d.snap.routes.len() / 2;
        d.snap.routes.insert(at, route(next).into());
        d.snap.services.insert(at, service(next, false).into());
        d.snap
            .endpoint_slices
            .insert(at, slice(next, 1, true).into());
        let (t, p) = d.plan();
        next += 1;
        assert_eq!(
            p.claims.len(),
            d.snap.routes.len(),
            "the new route gets a port"
        );
        t
    };
    times[1].push(add(&mut d));
    for run in 0..runs {
        times[2].push(add(&mut d));
        // Services and slices of routes spread over the world.
        let i = (run * 7919) % n;
        let at = d
            .snap
            .services
            .iter()
            .position(|s| s.metadata.name == format!("svc-{i}"))
            .expect("the Service is there");
        d.snap.services[at] = service(i, run % 2 == 0).into();
        times[3].push(d.plan().0);
        let (host, ready) = (2 + (run % 2) as u8, run % 4 != 3);
        d.snap.endpoint_slices[at] = slice(i, host, ready).into();
        let (t, p) = d.plan();
        times[4].push(t);
        let served = p.routes.iter().find(|r| r.name == format!("r{i}"));
        assert!(served.is_some(), "route r{i} has a status");
        times[5].push(d.plan().0);
    }
    for _ in 0..runs.min(5) {
        let t = Instant::now();
        let p = plan(&d.input());
        times[6].push(t.elapsed());
        assert_eq!(p.claims.len(), d.snap.routes.len());
    }
    times
}

fn main() {
    if std::env::args().any(|a| a == "--files") {
        return bench_files(10_000);
    }
    // Room for every route (`berth run --max-services 262144 --max-backends 262144`):
    // with the default room (16k services) routes wait, and every plan is a full one.
    let mut capacity = berth::datapath::Capacity {
        services: 262_144,
        backends: 262_144,
    };
    if let Ok(n) = std::env::var("BERTH_BENCH_MAX_SERVICES") {
        capacity.services = n.parse().expect("BERTH_BENCH_MAX_SERVICES: a number");
    }
    let sizes: Vec<usize> = match std::env::var("BERTH_BENCH_SIZES") {
        Ok(list) => list
            .split(',')
            .map(|n| n.trim().parse().expect("BERTH_BENCH_SIZES: numbers"))
            .collect(),
        Err(_) => vec![1_000, 10_000, 100_000],
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut json = Vec::new();
    println!(
        "planner time with the memo (as the daemon plans), ms, median / p99 over the runs;\n\
         {GATEWAYS} Gateways of one {RANGE_PORTS}-port TCP range, a Service and an \
         EndpointSlice per route"
    );
    print!("{:<34}", "");
    for n in &sizes {
        print!(" {:>20}", format!("{n} routes"));
    }
    println!();
    let results: Vec<(usize, usize, Vec<Vec<Duration>>)> = sizes
        .iter()
        .map(|&n| {
            let runs = match n {
                0..=2_000 => 101,
                2_001..=20_000 => 51,
                _ => 21,
            };
            (n, runs, bench_world(n, runs, capacity))
        })
        .collect();
    for (k, kind) in KINDS.iter().enumerate() {
        print!("{kind:<34}");
        for (n, _, times) in &results {
            let (p50, p99) = percentiles(times[k].clone());
            print!(" {:>20}", format!("{:.3} / {:.3}", ms(p50), ms(p99)));
            let key = kind
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
                .join("_")
                .to_lowercase();
            json.push(format!(
                "\"{key}_{n}\":{{\"p50_ms\":{:.3},\"p99_ms\":{:.3}}}",
                ms(p50),
                ms(p99)
            ));
        }
        println!();
    }
    let runs: Vec<String> = results
        .iter()
        .map(|(n, r, _)| format!("{r} at {n}"))
        .collect();
    println!("runs of each change: {}", runs.join(", "));
    println!("{{{}}}", json.join(","));
}
