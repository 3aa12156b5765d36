//! Records of a state directory are checked when loaded (`berth state check` and
//! `berth check --state-dir`, the real binary on crafted journals): a port held twice is
//! listed and ignored; a claim outside its listener's range or a second claim of one
//! route on one listener is not served; a journal that is a device is refused at once,
//! a long one compacted when `berth run` starts.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

mod run;

/// A directory of one test, removed when the test ends (also when it fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("berth-records-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("manifests")).expect("manifests");
        std::fs::create_dir_all(dir.join("state")).expect("state");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The example Gateway (TCP and UDP ranges 30000-30999) and TCPRoutes `team-0/NAME`.
fn manifests(dir: &TempDir, routes: &[&str]) {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let m = dir.0.join("manifests");
    std::fs::copy(examples.join("gateway.yaml"), m.join("gateway.yaml")).expect("gateway");
    for name in routes {
        let route = format!(
            "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata:\n  \
             name: {name}\n  namespace: team-0\nspec:\n  parentRefs:\n  - name: shared\n    \
             namespace: infra\n    sectionName: tcp-pool\n  rules:\n  - backendRefs:\n    \
             - name: svc\n      port: 80\n"
        );
        std::fs::write(m.join(format!("{name}.yaml")), route).expect("route");
    }
}

/// A bound claim record of `claims.log`: `name` for port `port` of the example Gateway,
/// held by TCPRoute `team-0/route`.
fn record(name: &str, port: u16, route: &str) -> String {
    format!(
        "+\t{{\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"infra\"}},\"spec\":{{\
         \"gateway\":\"shared\",\"listener\":\"tcp-pool\",\"protocol\":\"TCP\",\"port\":{port},\
         \"route\":{{\"group\":\"gateway.networking.k8s.io\",\"kind\":\"TCPRoute\",\
         \"namespace\":\"team-0\",\"name\":\"{route}\"}}}},\"status\":{{\"phase\":\"Bound\"}}}}\n"
    )
}

fn run(args: &[&str], dir: &TempDir) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .args(["--state-dir".as_ref(), dir.0.join("state").as_os_str()])
        .output()
        .expect("berth")
}

fn berth(args: &[&str], dir: &TempDir) -> (bool, String) {
    let out = run(args, dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The ports each route is served on, per `berth check --state-dir`, and its warnings.
fn served(dir: &TempDir) -> (Vec<(String, u64)>, String) {
    let m = dir.0.join("manifests");
    let out = run(
        &[
            "check",
            "-o",
            "json",
            "--manifests",
            m.to_str().expect("utf-8"),
        ],
        dir,
    );
    let warnings = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{warnings}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let mut out = Vec::new();
    for r in doc["routes"].as_array().expect("routes") {
        for p in r["status"]["parents"].as_array().expect("parents") {
            if let Some(port) = p["parentRef"]["port"].as_u64() {
                out.push((r["name"].as_str().expect("name").to_string(), port));
            }
        }
    }
    (out, warnings)
}

#[test]
fn a_port_held_twice_is_listed_by_state_check_and_the_later_record_is_not_served() {
    let dir = TempDir::new("twice");
    manifests(&dir, &["a", "b"]);
    let journal = [
        record("shared-tcp-30000", 30000, "a"),
        record("hand-made", 30000, "b"),
    ]
    .concat();
    std::fs::write(dir.0.join("state/claims.log"), journal).expect("journal");
    let (ok, text) = berth(&["state", "check"], &dir);
    assert!(!ok, "exit 1 with a record to move aside: {text}");
    for part in [
        "claims.log line 2",
        "infra/hand-made",
        "infra/shared-tcp-30000",
        "line 1",
    ] {
        assert!(text.contains(part), "{part} in: {text}");
    }
    let (mut ports, _) = served(&dir);
    ports.sort();
    assert_eq!(ports, vec![("a".into(), 30000), ("b".into(), 30001)]);
    let (ok, text) = berth(&["state", "repair"], &dir);
    assert!(ok, "{text}");
    let (ok, text) = berth(&["state", "check"], &dir);
    assert!(ok, "{text}");
}

#[test]
fn a_claim_outside_its_listeners_range_is_not_served() {
    let dir = TempDir::new("range");
    manifests(&dir, &["a"]);
    std::fs::write(
        dir.0.join("state/claims.log"),
        record("shared-tcp-31500", 31500, "a"),
    )
    .expect("journal");
    let (ports, warnings) = served(&dir);
    assert_eq!(
        ports,
        vec![("a".into(), 30000)],
        "a port of the range, not the stored 31500"
    );
    assert!(
        warnings.contains(
            "warning: claim infra/shared-tcp-31500 (TCP 31500) released: port 31500 is \
             outside listener tcp-pool's range"
        ),
        "{warnings}"
    );
}

#[test]
fn of_two_claims_of_one_route_on_one_listener_one_is_served() {
    let dir = TempDir::new("route");
    manifests(&dir, &["a"]);
    let journal = [
        record("shared-tcp-30005", 30005, "a"),
        record("shared-tcp-30002", 30002, "a"),
    ]
    .concat();
    std::fs::write(dir.0.join("state/claims.log"), journal).expect("journal");
    let (ports, warnings) = served(&dir);
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert!(
        warnings.contains("released: its route already holds another port of listener tcp-pool"),
        "{warnings}"
    );
}

/// Peak resident memory (VmHWM) of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    run::status_kib(pid, "VmHWM")
}

#[test]
fn a_journal_symlinked_to_dev_full_is_refused_at_once_by_state_check_check_and_run() {
    let dir = TempDir::new("devfull");
    manifests(&dir, &["a"]);
    std::os::unix::fs::symlink("/dev/full", dir.0.join("state/claims.log")).expect("symlink");
    let m = dir.0.join("manifests");
    for args in [
        vec!["state", "check"],
        vec!["check", "--manifests", m.to_str().expect("utf-8")],
    ] {
        let started = Instant::now();
        let (ok, text) = berth(&args, &dir);
        assert!(!ok, "{args:?} fails: {text}");
        assert!(
            text.contains("claims.log is a character device, not a regular file"),
            "{args:?}: {text}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{args:?} at once"
        );
    }
    // `berth run` stays up, not ready, saying why, on every cycle; memory stays small.
    let d = run::Daemon::spawn(&m, &dir.0.join("state"), false);
    run::wait_for("not ready naming the file", || {
        d.readyz()
            .is_some_and(|(ok, why)| !ok && why.contains("claims.log is a character device"))
    });
    std::thread::sleep(Duration::from_secs(2));
    let peak = peak_rss_kib(d.child.id());
    assert!(peak < 100 * 1024, "peak RSS {peak} KiB");
}

#[test]
fn a_bad_first_seen_record_fails_check_as_it_stops_run() {
    let dir = TempDir::new("seen");
    manifests(&dir, &["a"]);
    std::fs::write(dir.0.join("state/first-seen.log"), "?\tgarbage\n").expect("journal");
    let m = dir.0.join("manifests");
    let (ok, text) = berth(&["check", "--manifests", m.to_str().expect("utf-8")], &dir);
    assert!(!ok, "check fails as run does: {text}");
    assert!(
        text.contains("first-seen.log: line 1") && text.contains("berth state repair"),
        "{text}"
    );
}

#[test]
fn a_long_journal_is_compacted_when_run_starts_keeping_every_claim() {
    let dir = TempDir::new("compact");
    manifests(&dir, &["a", "b"]);
    // 200k lines of churn, then the two claims that hold.
    let mut journal = String::new();
    for i in 0..100_000u32 {
        let port = 30000 + (i % 500) as u16;
        journal.push_str(&record(&format!("shared-tcp-{port}"), port, "a"));
        journal.push_str(&format!("-\tinfra\tshared-tcp-{port}\n"));
    }
    journal.push_str(&record("shared-tcp-30007", 30007, "a"));
    journal.push_str(&record("shared-tcp-30003", 30003, "b"));
    let log = dir.0.join("state/claims.log");
    std::fs::write(&log, journal).expect("journal");
    let d = run::Daemon::start(&dir.0.join("manifests"), &dir.0.join("state"));
    let peak = peak_rss_kib(d.child.id());
    let text = std::fs::read_to_string(&log).expect("journal");
    assert_eq!(text.lines().count(), 2, "compacted to its claims: {text}");
    for name in ["shared-tcp-30007", "shared-tcp-30003"] {
        assert!(text.contains(name), "{name} kept: {text}");
    }
    let (mut ports, _) = served(&dir);
    ports.sort();
    assert_eq!(ports, vec![("a".into(), 30007), ("b".into(), 30003)]);
    assert!(peak < 100 * 1024, "peak RSS {peak} KiB");
}

#[test]
fn a_port_edited_inside_a_record_does_not_move_the_route_and_is_listed() {
    let dir = TempDir::new("edited");
    manifests(&dir, &["a"]);
    // Line 2 is line 1 with its port edited: the name still says 30004.
    let journal = [
        record("shared-tcp-30004", 30004, "a"),
        record("shared-tcp-30004", 30009, "a"),
    ]
    .concat();
    std::fs::write(dir.0.join("state/claims.log"), journal).expect("journal");
    let (ports, _) = served(&dir);
    assert_eq!(ports, vec![("a".into(), 30004)], "the route keeps its port");
    let (ok, text) = berth(&["state", "check"], &dir);
    assert!(!ok, "listed: {text}");
    assert!(
        text.contains("claims.log line 2") && text.contains("would be named shared-tcp-30009"),
        "{text}"
    );
    // Counted by a running daemon.
    let d = run::Daemon::start(&dir.0.join("manifests"), &dir.0.join("state"));
    let metrics = berth::admin::get(&d.admin, "/metrics").expect("metrics");
    assert!(
        metrics.contains("\nberth_state_ignored_records 1\n"),
        "{metrics}"
    );
    drop(d);
    let (ok, text) = berth(&["state", "repair"], &dir);
    assert!(ok, "{text}");
    assert_eq!(served(&dir).0, vec![("a".into(), 30004)]);
}
