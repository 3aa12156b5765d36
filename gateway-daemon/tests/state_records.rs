//! Records of a state directory are checked when loaded (`berth state check` and
//! `berth check --state-dir`, the real binary on crafted journals): a port held twice is
//! listed and ignored; a claim outside its listener's range or a second claim of one
//! route on one listener is not served.

use std::{path::PathBuf, process::Command};

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
