//! `cargo xtask bench planner`: planning time for 100, 1k and 10k routes over a
//! 20k-port range, a full plan from no claims and a one-route change with every other
//! claim in place. Prints a table and, last, one JSON line.
//!
//! `BERTH_BENCH_MAX_SERVICES=N` plans for a datapath of N services (`berth run
//! --max-services`): the routes beyond it wait, and every plan is a full one.
//!
//! With `--files`: the manifest source's bookkeeping with 10k files of one route each
//! (one file per team): the first load, a look at the unchanged directory (made at
//! every wake-up), and one file changed.

use std::time::{Duration, Instant, SystemTime};

use berth::{
    model::*,
    planner::{plan, plan_with, Input, Memo},
};

/// The allocator `berth` uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RANGE_FIRST: u16 = 30000;
const RANGE_LAST: u16 = 49999;
const RUNS: usize = 7;

fn meta(name: &str, ns: &str) -> Meta {
    Meta {
        name: name.to_string(),
        namespace: Some(ns.to_string()),
        ..Meta::default()
    }
}

fn snapshot(routes: usize) -> Snapshot {
    let mut s = Snapshot::default();
    s.gateway_classes.push(std::sync::Arc::new(GatewayClass {
        metadata: meta("berth", ""),
        spec: GatewayClassSpec {
            controller_name: CONTROLLER_NAME.to_string(),
        },
    }));
    let all = Some(AllowedRoutes {
        namespaces: Some(RouteNamespaces {
            from: Some("All".to_string()),
            selector: None,
        }),
        kinds: vec![],
    });
    s.gateways.push(std::sync::Arc::new(Gateway {
        metadata: meta("shared", "infra"),
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
                value: "10.0.0.1".to_string(),
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
    s.gateway_configs.push(std::sync::Arc::new(GatewayConfig {
        metadata: meta("cfg", "infra"),
        spec: GatewayConfigSpec {
            listeners: vec![ListenerRange {
                name: "pool".to_string(),
                end_port: RANGE_LAST,
                max_ports_per_namespace: None,
            }],
            release_cooldown: None,
            source_nat: None,
        },
    }));
    for i in 0..routes {
        s.routes.push(route(i).into());
    }
    // One Service with one endpoint per namespace.
    for ns in 0..100 {
        let ns = format!("team-{ns}");
        s.services.push(std::sync::Arc::new(Service {
            metadata: meta("web", &ns),
            spec: ServiceSpec {
                ports: vec![ServicePort {
                    name: Some("p".into()),
                    port: 80,
                    protocol: None,
                    target_port: None,
                }],
            },
        }));
        let mut m = meta("web-1", &ns);
        m.labels
            .insert("kubernetes.io/service-name".into(), "web".into());
        s.endpoint_slices.push(std::sync::Arc::new(EndpointSlice {
            metadata: m,
            address_type: "IPv4".into(),
            endpoints: vec![Endpoint {
                addresses: vec!["10.1.0.1".into()],
                conditions: EndpointConditions::default(),
            }],
            ports: vec![EndpointPort {
                name: Some("p".into()),
                port: Some(8080),
                protocol: None,
            }],
        }));
    }
    s
}

fn route(i: usize) -> Route {
    Route {
        kind: RouteKind::Tcp,
        metadata: meta(&format!("r{i}"), &format!("team-{}", i % 100)),
        spec: RouteSpec {
            parent_refs: vec![ParentRef {
                name: "shared".into(),
                namespace: Some("infra".into()),
                ..ParentRef::default()
            }],
            rules: vec![RouteRule {
                backend_refs: vec![BackendRef {
                    name: "web".into(),
                    port: Some(80),
                    ..BackendRef::default()
                }],
            }],
        },
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

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
    let snapshot_of = |source: &mut ManifestSource| {
        let t = Instant::now();
        let (snap, layout) = source.take_snapshot();
        assert_eq!(snap.routes.len(), n);
        source.give_back(snap, layout);
        t.elapsed()
    };
    let mut idle = Vec::new();
    let mut change = Vec::new();
    let mut snapshot = Vec::new();
    for run in 0..RUNS {
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
        snapshot.push(snapshot_of(&mut source));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (idle, change, snapshot) = (median(idle), median(change), median(snapshot));
    println!("manifest source with {n} files of one route each, median of {RUNS} runs");
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
    println!("{:<44} {:>10.2}", "one file changed ms", ms(change));
    println!(
        "{:<44} {:>10.2}",
        "snapshot taken and given back ms",
        ms(snapshot)
    );
    println!(
        "{{\"files\":{n},\"first_load_ms\":{:.1},\"idle_look_ms\":{:.2},\"one_change_ms\":{:.2},\"snapshot_ms\":{:.2}}}",
        ms(first),
        ms(idle),
        ms(change),
        ms(snapshot)
    );
}

fn main() {
    if std::env::args().any(|a| a == "--files") {
        return bench_files(10_000);
    }
    let now = SystemTime::now();
    let mut capacity = berth::datapath::Capacity::default();
    if let Ok(n) = std::env::var("BERTH_BENCH_MAX_SERVICES") {
        capacity.services = n.parse().expect("BERTH_BENCH_MAX_SERVICES: a number");
    }
    let mut rows = Vec::new();
    for n in [100usize, 1_000, 10_000] {
        let snap = snapshot(n);
        let mut full = Vec::new();
        let mut claims = Vec::new();
        for _ in 0..RUNS {
            let t = Instant::now();
            let p = plan(&Input {
                snapshot: &snap,
                claims: &[],
                now,
                default_addresses: berth::planner::DefaultAddresses::default(),
                ephemeral_ports: None,
                snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
                capacity,
                allocate: true,
            });
            full.push(t.elapsed());
            assert_eq!(p.claims.len(), n, "every route gets a port");
            claims = p.claims;
        }
        let mut changed = snap.clone();
        changed.routes.push(route(n).into());
        let mut one = Vec::new();
        for _ in 0..RUNS {
            let t = Instant::now();
            let p = plan(&Input {
                snapshot: &changed,
                claims: &claims,
                now,
                default_addresses: berth::planner::DefaultAddresses::default(),
                ephemeral_ports: None,
                snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
                capacity,
                allocate: true,
            });
            one.push(t.elapsed());
            assert_eq!(p.claims.len(), n + 1);
        }
        // As the daemon plans: with the memo of the plan before the change.
        let mut remembered = Vec::new();
        let runs = if n == 10_000 && std::env::var_os("ONLY_MEMO").is_some() {
            40
        } else {
            RUNS
        };
        for _ in 0..runs {
            let input = |snapshot| Input {
                snapshot,
                claims: &claims,
                now,
                default_addresses: berth::planner::DefaultAddresses::default(),
                ephemeral_ports: None,
                snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
                capacity,
                allocate: true,
            };
            let mut memo = Memo::default();
            plan_with(&input(&snap), &mut memo);
            let t = Instant::now();
            let p = plan_with(&input(&changed), &mut memo);
            remembered.push(t.elapsed());
            assert_eq!(p.claims.len(), n + 1);
        }
        rows.push((n, median(full), median(one), median(remembered)));
    }
    println!(
        "planner time, median of {RUNS} runs, one TCP range of {} ports",
        RANGE_LAST - RANGE_FIRST + 1
    );
    println!(
        "{:>8} {:>14} {:>20} {:>26}",
        "routes", "full plan ms", "one-route change ms", "change with memo ms (x)"
    );
    for (n, f, o, m) in &rows {
        println!(
            "{n:>8} {:>14.2} {:>20.2} {:>20.2} ({:.1}x)",
            f.as_secs_f64() * 1e3,
            o.as_secs_f64() * 1e3,
            m.as_secs_f64() * 1e3,
            o.as_secs_f64() / m.as_secs_f64()
        );
    }
    let json: Vec<String> = rows
        .iter()
        .map(|(n, f, o, m)| {
            format!(
                "\"full_{n}_ms\":{:.3},\"change_{n}_ms\":{:.3},\"change_memo_{n}_ms\":{:.3}",
                f.as_secs_f64() * 1e3,
                o.as_secs_f64() * 1e3,
                m.as_secs_f64() * 1e3
            )
        })
        .collect();
    println!("{{{}}}", json.join(","));
}
