//! `berth run --manifests DIR` while files are rewritten in place: truncated then
//! written (as `>` redirection does), written in parts, or written with fewer objects.
//! No route loses its port before the settle time, and no other team gets it.

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

mod run;
use run::{plans_total, port_of, state, wait_for, Daemon, TempDir};

/// A manifest and a state directory, removed on drop.
struct Dirs {
    manifests: PathBuf,
    state: PathBuf,
    _base: TempDir,
}

impl Dirs {
    fn new(tag: &str) -> Dirs {
        let base = TempDir::new(&format!("rw-{tag}"));
        let d = Dirs {
            manifests: base.join("manifests"),
            state: base.join("state"),
            _base: base,
        };
        std::fs::create_dir_all(&d.manifests).expect("manifest dir");
        std::fs::create_dir_all(&d.state).expect("state dir");
        d
    }
}

/// A Gateway whose TCP range is `first..=last`, with no cool-down.
fn gateway(last: u16) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: berth}}\n\
         spec: {{controllerName: berth.dev/gateway-controller}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: shared, namespace: infra}}\n\
         spec:\n  gatewayClassName: berth\n  addresses: [{{value: 10.251.0.100}}]\n  infrastructure:\n    \
         parametersRef: {{group: berth.dev, kind: GatewayConfig, name: cfg}}\n  listeners:\n  \
         - {{name: tcp-pool, protocol: TCP, port: 30000, allowedRoutes: {{namespaces: {{from: All}}}}}}\n---\n\
         apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: cfg, namespace: infra}}\n\
         spec:\n  releaseCooldown: 0s\n  listeners: [{{name: tcp-pool, endPort: {last}}}]\n"
    )
}

/// A TCPRoute `namespace/name` created at `minute` past midnight.
fn route(namespace: &str, name: &str, minute: u32) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
         metadata: {{name: {name}, namespace: {namespace}, creationTimestamp: \"2026-01-01T00:{minute:02}:00Z\"}}\n\
         spec:\n  parentRefs: [{{name: shared, namespace: infra}}]\n  \
         rules: [{{backendRefs: [{{name: {name}, port: 80}}]}}]\n"
    )
}

/// Truncates `path` as `>` does, and keeps it open for the rest of the write.
fn truncate(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .expect("truncate")
}

#[test]
fn a_file_rewritten_in_place_keeps_its_routes_port_from_a_waiting_team() {
    let dirs = Dirs::new("inplace");
    let m = &dirs.manifests;
    // One port, no cool-down: team-b's route waits for team-a's port.
    std::fs::write(m.join("gateway.yaml"), gateway(30000)).expect("write");
    let team_a = route("team-a", "web", 0);
    std::fs::write(m.join("team-a.yaml"), &team_a).expect("write");
    std::fs::write(m.join("team-b.yaml"), route("team-b", "waiting", 1)).expect("write");
    let d = Daemon::start_with(m, &dirs.state, &["--manifest-settle", "60s"]);
    let held = |d: &Daemon, when: &str| {
        let s = state(d);
        assert_eq!(
            (port_of(&s, "web"), port_of(&s, "waiting")),
            (Some(30000), None),
            "{when}: {s:#}"
        );
    };
    held(&d, "at start");

    for round in 1..=5 {
        // Truncated: the daemon reads the empty file before it is written again.
        let plans = plans_total(&d);
        let mut file = truncate(&m.join("team-a.yaml"));
        wait_for("the empty file to be planned", || plans_total(&d) > plans);
        held(&d, &format!("round {round}, file empty"));
        // Written in two parts: the first cut inside a document (unparseable).
        let (head, tail) = team_a.split_at(team_a.len() - 20);
        let plans = plans_total(&d);
        file.write_all(head.as_bytes()).expect("write");
        file.flush().expect("flush");
        wait_for("the partial file to be planned", || plans_total(&d) > plans);
        held(&d, &format!("round {round}, file partly written"));
        let plans = plans_total(&d);
        file.write_all(tail.as_bytes()).expect("write");
        drop(file);
        wait_for("the whole file to be planned", || plans_total(&d) > plans);
        held(&d, &format!("round {round}, file written"));
    }
}

#[test]
fn objects_a_new_version_leaves_out_stay_until_the_settle_time_unless_back() {
    let dirs = Dirs::new("fewer");
    let m = &dirs.manifests;
    std::fs::write(m.join("gateway.yaml"), gateway(30001)).expect("write");
    let both = format!(
        "{}{}",
        route("team-a", "web", 0),
        route("team-a", "extra", 1)
    );
    let one = route("team-a", "web", 0);
    std::fs::write(m.join("team-a.yaml"), &both).expect("write");
    std::fs::write(m.join("team-b.yaml"), route("team-b", "waiting", 2)).expect("write");
    let settle = Duration::from_secs(3);
    let d = Daemon::start_with(m, &dirs.state, &["--manifest-settle", "3s"]);
    let ports = |d: &Daemon| {
        let s = state(d);
        (
            port_of(&s, "web"),
            port_of(&s, "extra"),
            port_of(&s, "waiting"),
        )
    };
    assert_eq!(ports(&d), (Some(30000), Some(30001), None));

    // Left out, then back within the settle time: nothing moves, then or later.
    let plans = plans_total(&d);
    std::fs::write(m.join("team-a.yaml"), &one).expect("write");
    let left_out = Instant::now();
    wait_for("the shorter file to be planned", || plans_total(&d) > plans);
    assert_eq!(ports(&d), (Some(30000), Some(30001), None), "left out");
    let plans = plans_total(&d);
    std::fs::write(m.join("team-a.yaml"), &both).expect("write");
    wait_for("the whole file to be planned", || plans_total(&d) > plans);
    assert!(left_out.elapsed() < settle, "the test was too slow");
    // Past the settle time of the first leaving-out, it still holds its port.
    while left_out.elapsed() < settle + Duration::from_secs(1) {
        assert_eq!(ports(&d), (Some(30000), Some(30001), None), "came back");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Left out for good: gone after the settle time, and team-b gets its port.
    std::fs::write(m.join("team-a.yaml"), &one).expect("write");
    let left_out = Instant::now();
    wait_for("the left-out route to go", || ports(&d).1.is_none());
    assert!(
        left_out.elapsed() >= settle - Duration::from_millis(100),
        "gone after {:?}, before the settle time",
        left_out.elapsed()
    );
    wait_for("team-b to get the port", || {
        ports(&d) == (Some(30000), None, Some(30001))
    });
}

#[test]
fn a_file_past_the_size_limit_is_broken_and_its_last_good_version_stays() {
    let dirs = Dirs::new("large");
    let m = &dirs.manifests;
    std::fs::write(m.join("gateway.yaml"), gateway(30000)).expect("write");
    let team_a = route("team-a", "web", 0);
    std::fs::write(m.join("team-a.yaml"), &team_a).expect("write");
    let d = Daemon::start(m, &dirs.state);
    assert_eq!(port_of(&state(&d), "web"), Some(30000));

    // The route, then comments past 16 MiB.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(m.join("team-a.yaml"))
        .expect("open");
    let line = format!("# {}\n", "x".repeat(1021));
    for _ in 0..(17 * 1024) {
        file.write_all(line.as_bytes()).expect("append");
    }
    drop(file);
    wait_for("the large file to be counted broken", || {
        berth::admin::get(&d.admin, "/metrics").is_ok_and(|m| m.contains("berth_manifest_errors 1"))
    });
    assert_eq!(
        port_of(&state(&d), "web"),
        Some(30000),
        "the last good version"
    );

    let check = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["check", "--manifests"])
        .arg(m)
        .output()
        .expect("berth check");
    let err = String::from_utf8_lossy(&check.stderr);
    assert!(!check.status.success(), "{err}");
    assert!(
        err.contains("team-a.yaml") && err.contains("larger than the 16 MiB"),
        "{err}"
    );
}
