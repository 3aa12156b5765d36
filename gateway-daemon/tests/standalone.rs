//! `berth run --manifests DIR` and `berth check` as a user runs them (no datapath, so
//! no root needed): live changes, broken files, restarts, and the check document.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

mod run;
use run::{plans_total, port_of, state, wait_for, Daemon, TempDir};

fn temp_dir(tag: &str) -> TempDir {
    TempDir::new(tag)
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

#[test]
fn run_follows_file_changes_keeps_broken_files_last_good_and_survives_kill_9() {
    let manifests = temp_dir("man");
    let state_dir = temp_dir("state");
    for f in ["gateway.yaml", "team-a.yaml", "team-b.yaml"] {
        std::fs::copy(examples().join(f), manifests.join(f)).expect("copy example");
    }
    let d = Daemon::start(&manifests, &state_dir);
    let s = state(&d);
    assert_eq!(port_of(&s, "web"), Some(30000), "{s:#}");
    assert_eq!(port_of(&s, "dns"), Some(30053), "{s:#}");

    // `berth get routes`: a namespace's rows are those of the full listing in it, with
    // the claim's listener, the datapath's backends and the route's age.
    let rows = |path: &str| -> Vec<berth::admin::RouteRow> {
        serde_json::from_str(&berth::admin::get(&d.admin, path).expect("routes")).expect("json")
    };
    let all = rows("/api/v1/routes");
    assert_eq!(all.len(), 2, "{all:?}");
    for ns in ["team-a", "team-b"] {
        let want: Vec<_> = all.iter().filter(|r| r.namespace == ns).cloned().collect();
        assert_eq!(rows(&format!("/api/v1/routes/{ns}")), want);
    }
    assert!(rows("/api/v1/routes/nobody").is_empty());
    let web = all.iter().find(|r| r.name == "web").expect("web row");
    assert_eq!(
        (
            web.listener.as_str(),
            web.port,
            web.backends > 0,
            web.created.is_some()
        ),
        ("tcp-pool", Some(30000), true, true),
        "{web:?}"
    );
    let dns = all.iter().find(|r| r.name == "dns").expect("dns row");
    assert_eq!(
        (dns.listener.as_str(), dns.port),
        ("udp-pool", Some(30053)),
        "{dns:?}"
    );

    // Conditions keep the time they last changed, not the time of the last plan: let
    // the clock leave the second the first plan stamped, then make a new plan.
    let accepted_at = |s: &Value, ns: &str| {
        s["routes"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["namespace"] == ns))
            .and_then(|r| r["status"]["parents"][0]["conditions"].as_array())
            .and_then(|c| c.iter().find(|c| c["type"] == "Accepted"))
            .map(|c| {
                c["lastTransitionTime"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
    };
    let team_a_accepted = accepted_at(&s, "team-a").expect("team-a accepted");
    let deadline = Instant::now() + Duration::from_secs(3);
    while humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
        <= team_a_accepted
    {
        assert!(Instant::now() < deadline, "the clock stands still");
        std::thread::sleep(Duration::from_millis(20));
    }

    // A new route file is picked up.
    let team_a = std::fs::read_to_string(manifests.join("team-a.yaml")).expect("read");
    std::fs::write(
        manifests.join("team-c.yaml"),
        team_a.replace("team-a", "team-c"),
    )
    .expect("write");
    wait_for("team-c's route", || {
        let d = &d;
        port_of(&state(d), "web").is_some()
            && state(d)["claims"].as_array().is_some_and(|c| c.len() == 3)
    });
    let s = state(&d);
    assert_eq!(
        accepted_at(&s, "team-a").as_deref(),
        Some(team_a_accepted.as_str()),
        "an unchanged condition keeps its transition time"
    );
    assert!(
        accepted_at(&s, "team-c").is_some_and(|t| t > team_a_accepted),
        "a new route's condition has the time of its plan: {s:#}"
    );

    // A broken file is reported; its last good objects stay in force.
    std::fs::write(manifests.join("team-b.yaml"), "garbage: [\n").expect("break");
    wait_for("the broken file to be reported", || {
        let d = &d;
        berth::admin::get(&d.admin, "/metrics").is_ok_and(|m| m.contains("berth_manifest_errors 1"))
    });
    assert_eq!(
        port_of(&state(&d), "dns"),
        Some(30053),
        "the broken file's route keeps its port"
    );

    // kill -9 and start again on the same state: same ports.
    let before = state(&d)["claims"].clone();
    drop(d);
    std::fs::copy(
        examples().join("team-b.yaml"),
        manifests.join("team-b.yaml"),
    )
    .expect("repair");
    let d = Daemon::start(&manifests, &state_dir);
    assert_eq!(
        state(&d)["claims"],
        before,
        "claims after a kill -9 and restart"
    );

    // Removing a file releases its route's claim (kept, cooling down).
    std::fs::remove_file(manifests.join("team-c.yaml")).expect("remove");
    wait_for("team-c's route to go", || {
        let d = &d;
        state(d)["routes"].as_array().is_some_and(|r| r.len() == 2)
    });
    let claims = berth::store::Store::open(&state_dir)
        .expect("store")
        .claims()
        .expect("claims");
    let released: Vec<_> = claims
        .iter()
        .filter(|c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.phase == berth::model::ClaimPhase::Released)
        })
        .collect();
    assert_eq!(released.len(), 1, "{claims:#?}");
    assert_eq!(released[0].spec.route.namespace, "team-c");
    drop(d);
}

#[test]
fn check_serves_a_tcp_route_beside_an_http_route_and_reads_lists_and_json() {
    let dirs = Dirs::new("kinds", &["gateway.yaml"]);
    let team_a = std::fs::read_to_string(examples().join("team-a.yaml")).expect("read");
    // An HTTPRoute (served by another controller) beside team-a's TCPRoute.
    std::fs::write(
        dirs.manifests.join("team-a.yaml"),
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
             metadata: {{name: site, namespace: team-a}}\n\
             spec: {{parentRefs: [{{name: other}}], hostnames: [a.example]}}\n---\n{team_a}"
        ),
    )
    .expect("write");
    // Team-b's route as a kubectl List in JSON.
    let route_c: serde_json::Value = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
        "metadata": {"name": "api", "namespace": "team-c"},
        "spec": {"parentRefs": [{"name": "shared", "namespace": "infra", "sectionName": "tcp-pool"}],
                 "rules": [{"backendRefs": [{"name": "api", "port": 80}]}]}
    });
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [route_c]});
    std::fs::write(dirs.manifests.join("team-c.json"), list.to_string()).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["check", "-o", "json", "--manifests"])
        .arg(&dirs.manifests)
        .output()
        .expect("check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("HTTPRoute team-a/site (gateway.networking.k8s.io/v1) ignored"),
        "{err}"
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(port_of(&doc, "web"), Some(30000), "{doc:#}");
    assert_eq!(port_of(&doc, "api"), Some(30001), "{doc:#}");
}

#[test]
fn check_plans_with_the_room_run_would_have_and_shows_the_routes_that_wait() {
    let dirs = Dirs::new("room", &["gateway.yaml", "team-a.yaml", "team-b.yaml"]);
    let check = |room: &[&str]| -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["check", "-o", "json", "--manifests"])
            .arg(&dirs.manifests)
            .args(room)
            .output()
            .expect("check");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        serde_json::from_slice(&out.stdout).expect("json")
    };
    // The routes waiting for room, by name (a `Programmed=False` condition).
    let waiting = |doc: &Value| -> Vec<String> {
        let mut names: Vec<String> = doc["routes"]
            .as_array()
            .expect("routes")
            .iter()
            .filter(|r| {
                r["status"]["parents"][0]["conditions"]
                    .as_array()
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c["type"] == "Programmed"
                                && c["status"] == "False"
                                && c["reason"] == "DatapathFull"
                        })
                    })
            })
            .map(|r| r["name"].as_str().unwrap_or_default().to_string())
            .collect();
        names.sort();
        names
    };
    let roomy = check(&[]);
    assert_eq!(waiting(&roomy), Vec::<String>::new(), "{roomy:#}");
    // One service of room: the oldest route (team-a's, by file name) is served, the
    // other (team-b's) waits and keeps its port.
    let tight = check(&["--max-services", "1"]);
    assert_eq!(waiting(&tight), ["dns"], "{tight:#}");
    assert_eq!(port_of(&tight, "web"), port_of(&roomy, "web"), "{tight:#}");
    assert_eq!(port_of(&tight, "dns"), port_of(&roomy, "dns"), "{tight:#}");
    // A limit check refuses is refused as run refuses it.
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["check", "--max-backends", "0", "--manifests"])
        .arg(&dirs.manifests)
        .output()
        .expect("check");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--max-backends"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn long_route_names_get_ports_and_a_bad_listener_name_breaks_only_its_file() {
    let dirs = Dirs::new("names", &["gateway.yaml", "team-b.yaml"]);
    let long = format!("{}.web", "w".repeat(200));
    let team_a = std::fs::read_to_string(examples().join("team-a.yaml")).expect("read");
    std::fs::write(
        dirs.manifests.join("team-a.yaml"),
        team_a.replacen("name: web\n", &format!("name: {long}\n"), 1),
    )
    .expect("write");
    let check = || {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["check", "-o", "json", "--manifests"])
            .arg(&dirs.manifests)
            .output()
            .expect("check")
    };
    let out = check();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(port_of(&doc, &long), Some(30000), "{doc:#}");

    let d = Daemon::start(&dirs.manifests, &dirs.state);
    // Another Gateway, its listener named with a quote and a newline.
    let gateway = std::fs::read_to_string(examples().join("gateway.yaml")).expect("read");
    let other = gateway
        .split("---")
        .find(|doc| doc.contains("kind: Gateway\n"))
        .expect("the Gateway")
        .replace("name: shared", "name: other")
        .replace("name: udp-pool", "name: \"udp\\\"pool\\nx\"");
    std::fs::write(dirs.manifests.join("other.yaml"), &other).expect("write");
    let out = check();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("other.yaml document 1: Gateway infra/other: field spec.listeners[1].name: \"udp\\\"pool\\nx\" is not a valid listener name"),
        "{err}"
    );
    wait_for("the bad file to be counted broken", || {
        manifest_errors(&d).as_deref() == Some("1")
    });
    let s = state(&d);
    assert_eq!(port_of(&s, &long), Some(30000), "{s:#}");
    assert_eq!(port_of(&s, "dns"), Some(30053), "{s:#}");
}

#[test]
fn check_prints_the_documented_json_and_fails_clearly_on_a_broken_file() {
    let doc = check_json(&examples());
    let keys: Vec<&String> = doc.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["claims", "gateways", "routes"]);
    let claim = &doc["claims"][0];
    for k in [
        "namespace",
        "name",
        "gateway",
        "listener",
        "protocol",
        "port",
        "route",
    ] {
        assert!(!claim[k].is_null(), "claim field {k}: {claim}");
    }
    assert_eq!(
        claim["route"].as_object().map(|o| o.len()),
        Some(3),
        "route has kind, namespace, name"
    );

    let broken = temp_dir("broken");
    std::fs::write(broken.join("bad.yaml"), "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {name: x, namespace: y}\nspec:\n  parentRefs:\n  - name: gw\n    port: seventy\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["check", "--manifests"])
        .arg(&broken)
        .output()
        .expect("check");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml document 1: TCPRoute y/x: field spec.parentRefs[0].port"),
        "{err}"
    );
}

#[test]
fn a_second_daemon_on_the_same_state_directory_refuses_to_start_and_the_first_keeps_serving() {
    let manifests = temp_dir("man2");
    let state_dir = temp_dir("state2");
    for f in ["gateway.yaml", "team-a.yaml", "team-b.yaml"] {
        std::fs::copy(examples().join(f), manifests.join(f)).expect("copy example");
    }
    let first = Daemon::start(&manifests, &state_dir);
    let before = state(&first)["claims"].clone();

    // Another daemon, on the same state directory but with a route less: it would have
    // released team B's claim.
    let other = temp_dir("man3");
    for f in ["gateway.yaml", "team-a.yaml"] {
        std::fs::copy(examples().join(f), other.join(f)).expect("copy example");
    }
    let mut second = Daemon::spawn(&other, &state_dir, true);
    let (out, err) =
        second.exit("the second daemon is still running on the first one's state directory");
    let stderr = err;
    assert!(!out.success(), "the second daemon must not run: {stderr}");
    assert!(
        stderr.contains("in use by another berth run")
            && stderr.contains(&first.child.id().to_string()),
        "the refusal names the holder: {stderr}"
    );
    assert_eq!(
        state(&first)["claims"],
        before,
        "the first daemon's claims are untouched"
    );
}

/// The document `berth check -o json --manifests DIR` prints; it must succeed.
fn check_json(dir: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["check", "-o", "json", "--manifests"])
        .arg(dir)
        .output()
        .expect("check");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// `berth check --manifests DIR`: whether it succeeded, and its stderr.
fn check(dir: &Path) -> (bool, String) {
    let out = berth(&[
        std::ffi::OsStr::new("check"),
        std::ffi::OsStr::new("--manifests"),
        dir.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), err)
}

fn berth(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .output()
        .expect("run berth")
}

#[test]
fn a_bad_state_record_stops_planning_with_a_way_out_and_repair_keeps_every_valid_claim() {
    let manifests = temp_dir("man4");
    let state_dir = temp_dir("state4");
    for f in ["gateway.yaml", "team-a.yaml", "team-b.yaml"] {
        std::fs::copy(examples().join(f), manifests.join(f)).expect("copy example");
    }
    let d = Daemon::start(&manifests, &state_dir);
    let before = state(&d)["claims"].clone();
    assert_eq!(before.as_array().map(Vec::len), Some(2), "{before}");
    drop(d);

    // One bad line in the middle of each journal.
    for (file, garbage) in [
        ("claims.log", "+\t{not json\n"),
        ("first-seen.log", "?\tgarbage\n"),
    ] {
        let path = state_dir.join(file);
        let text = std::fs::read_to_string(&path).expect("journal");
        let (head, tail) = text.split_at(text.find('\n').expect("a record") + 1);
        std::fs::write(&path, format!("{head}{garbage}{tail}")).expect("write");
    }
    let os = |s: &str| std::ffi::OsStr::new(s).to_owned();
    let state_arg = state_dir.as_os_str();

    // berth check fails as run does, and says what to do.
    let out = berth(&[
        &os("check"),
        &os("--manifests"),
        manifests.as_os_str(),
        &os("--state-dir"),
        state_arg,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("berth state repair"),
        "{err}"
    );

    // berth run is not ready, and says why.
    let stuck = Daemon::spawn(&manifests, &state_dir, false);
    wait_for("not ready naming the way out", || {
        let d = &stuck;
        berth::admin::get(&d.admin, "/healthz").is_ok()
            && berth::admin::get(&d.admin, "/readyz")
                .err()
                .is_some_and(|e| e.to_string().contains("503"))
    });
    drop(stuck);

    let check = berth(&[&os("state"), &os("check"), &os("--state-dir"), state_arg]);
    let listed = String::from_utf8_lossy(&check.stdout);
    assert!(
        !check.status.success(),
        "check reports the bad records: {listed}"
    );
    assert!(
        listed.contains("claims.log line 2") && listed.contains("first-seen.log line 2"),
        "{listed}"
    );

    let repair = berth(&[&os("state"), &os("repair"), &os("--state-dir"), state_arg]);
    assert!(
        repair.status.success(),
        "{}",
        String::from_utf8_lossy(&repair.stderr)
    );
    let aside: Vec<String> = std::fs::read_dir(&state_dir)
        .expect("state dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".bad-"))
        .collect();
    assert_eq!(aside.len(), 2, "one file aside per journal: {aside:?}");
    let check = berth(&[&os("state"), &os("check"), &os("--state-dir"), state_arg]);
    assert!(check.status.success(), "clean after repair");

    let d = Daemon::start(&manifests, &state_dir);
    assert_eq!(
        state(&d)["claims"],
        before,
        "every valid claim kept, ports unchanged"
    );
    drop(d);
}

#[test]
fn sigterm_is_logged_without_colour_codes_and_exits_cleanly() {
    let manifests = temp_dir("man5");
    let state_dir = temp_dir("state5");
    std::fs::copy(
        examples().join("gateway.yaml"),
        manifests.join("gateway.yaml"),
    )
    .expect("copy");
    let mut d = Daemon::spawn(&manifests, &state_dir, true);
    wait_for("readiness", || {
        let d = &d;
        berth::admin::get(&d.admin, "/readyz").is_ok()
    });
    // SAFETY: signals a child this test started and has not reaped.
    let rc = unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let (status, log) = d.exit("berth run ignored SIGTERM");
    assert!(status.success(), "{status}: {log}");
    assert!(log.contains("stopping on a signal"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log that is not a terminal: {log:?}"
    );
}

#[test]
fn a_manifest_file_that_is_not_text_is_an_error_naming_it() {
    let manifests = temp_dir("man6");
    for f in ["gateway.yaml", "team-a.yaml"] {
        std::fs::copy(examples().join(f), manifests.join(f)).expect("copy example");
    }
    std::fs::write(manifests.join("blob.yaml"), [0xff, 0xfe, 0x00, 0x81]).expect("write");
    let (ok, err) = check(&manifests);
    assert!(!ok, "{err}");
    assert!(
        err.contains("blob.yaml") && err.contains("not UTF-8"),
        "the error names the file and why: {err}"
    );
}

/// A manifest directory holding some examples and a state directory, for one test;
/// removed when the test ends, also when it fails (declare it before the daemon).
struct Dirs {
    manifests: TempDir,
    state: TempDir,
}

impl Dirs {
    fn new(tag: &str, files: &[&str]) -> Dirs {
        let d = Dirs {
            manifests: temp_dir(&format!("{tag}-man")),
            state: temp_dir(&format!("{tag}-state")),
        };
        copy_examples(&d.manifests, files);
        d
    }
}

fn copy_examples(dir: &Path, files: &[&str]) {
    for f in files {
        std::fs::copy(examples().join(f), dir.join(f)).expect("copy example");
    }
}

fn manifest_errors(d: &Daemon) -> Option<String> {
    let m = berth::admin::get(&d.admin, "/metrics").ok()?;
    m.lines()
        .find_map(|l| l.strip_prefix("berth_manifest_errors "))
        .map(str::to_string)
}

#[test]
fn the_same_route_in_two_files_is_an_error_naming_both_and_the_first_stays_in_force() {
    let dirs = Dirs::new("t7", &["gateway.yaml", "team-a.yaml"]);
    let (manifests, state_dir) = (&dirs.manifests, &dirs.state);
    let team_a = std::fs::read_to_string(manifests.join("team-a.yaml")).expect("read");
    let (route, rest) = team_a.split_once("---\n").expect("documents");
    let d = Daemon::start(manifests, state_dir);
    let before = state(&d)["claims"].clone();
    assert_eq!(port_of(&state(&d), "web"), Some(30000));

    // The same route, with another port asked for, in a second file.
    let copy = manifests.join("team-a-copy.yaml");
    std::fs::write(&copy, route.replace("sectionName: tcp-pool", "port: 30500")).expect("write");
    wait_for("the duplicate to be counted", || {
        manifest_errors(&d).as_deref() == Some("1")
    });
    let s = state(&d);
    assert_eq!(
        s["claims"], before,
        "the definition in force keeps its claim"
    );
    assert_eq!(port_of(&s, "web"), Some(30000), "{s:#}");
    assert_eq!(s["routes"].as_array().map(Vec::len), Some(1), "{s:#}");

    let (ok, err) = check(manifests);
    assert!(!ok, "{err}");
    assert!(
        err.contains("team-a.yaml document 1: TCPRoute team-a/web: also defined in")
            && err.contains("team-a-copy.yaml document 1"),
        "the error names the object and both files: {err}"
    );

    // Moving the route: once the first file lets go of it, the copy is in force.
    std::fs::write(manifests.join("team-a.yaml"), rest).expect("write");
    wait_for("the copy to be admitted", || {
        manifest_errors(&d).as_deref() == Some("0")
            && state(&d)["routes"][0]["status"]["parents"][0]["parentRef"]["port"] == 30500
    });
    drop(d);

    // A first start with both files present: the first file by name wins.
    std::fs::write(manifests.join("team-a.yaml"), &team_a).expect("write");
    let d = Daemon::start(manifests, state_dir);
    wait_for("the later file to be counted broken", || {
        manifest_errors(&d).as_deref() == Some("1")
    });
    let s = state(&d);
    assert_eq!(
        s["routes"][0]["status"]["parents"][0]["parentRef"]["port"], 30500,
        "team-a-copy.yaml comes first: {s:#}"
    );
}

#[test]
fn a_replaced_file_causes_no_outage_and_a_removed_one_goes_after_the_settle_time() {
    let dirs = Dirs::new("t8", &["gateway.yaml", "team-a.yaml", "team-b.yaml"]);
    let (manifests, state_dir) = (&dirs.manifests, &dirs.state);
    let d = Daemon::start_with(manifests, state_dir, &["--manifest-settle", "3s"]);
    let before = state(&d);
    let ports = |s: &Value| (port_of(s, "web"), port_of(s, "dns"));
    assert_eq!(ports(&before), (Some(30000), Some(30053)), "{before:#}");

    // The Gateway's file replaced by rm, then a write a second later: every route keeps
    // its port and every claim stays, all along.
    let gateway = std::fs::read_to_string(manifests.join("gateway.yaml")).expect("read");
    std::fs::remove_file(manifests.join("gateway.yaml")).expect("rm");
    let gap = Instant::now();
    while gap.elapsed() < Duration::from_secs(1) {
        let s = state(&d);
        assert_eq!(ports(&s), ports(&before), "while the file is gone: {s:#}");
        assert_eq!(s["claims"], before["claims"]);
        std::thread::sleep(Duration::from_millis(50));
    }
    let plans = plans_total(&d);
    std::fs::write(manifests.join("gateway.yaml"), gateway).expect("write");
    wait_for("the rewritten file to be read", || plans_total(&d) > plans);
    let s = state(&d);
    assert_eq!(ports(&s), ports(&before), "{s:#}");
    assert_eq!(s["claims"], before["claims"]);

    // Removed for good: gone after the settle time.
    std::fs::remove_file(manifests.join("team-b.yaml")).expect("rm");
    wait_for("team-b's route to go", || {
        port_of(&state(&d), "dns").is_none()
    });
    assert_eq!(port_of(&state(&d), "web"), Some(30000));
}

#[test]
fn a_missing_manifest_directory_keeps_the_last_state_and_makes_the_daemon_not_ready() {
    let files = ["gateway.yaml", "team-a.yaml"];
    let dirs = Dirs::new("t9", &files);
    let (manifests, state_dir) = (&dirs.manifests, &dirs.state);
    let d = Daemon::start_with(manifests, state_dir, &["--manifest-settle", "3s"]);
    let before = state(&d)["claims"].clone();

    std::fs::remove_dir_all(manifests).expect("rm -r");
    wait_for("not ready, naming the directory", || {
        d.readyz()
            .is_some_and(|(ok, body)| !ok && body.contains(&manifests.display().to_string()))
    });
    let s = state(&d);
    assert_eq!(
        s["claims"], before,
        "claims kept while the directory is gone"
    );
    assert_eq!(port_of(&s, "web"), Some(30000), "{s:#}");

    // Created again, empty at first, then filled: nothing is lost on the way.
    std::fs::create_dir(manifests).expect("mkdir");
    wait_for("ready again", || d.readyz().is_some_and(|(ok, _)| ok));
    assert_eq!(port_of(&state(&d), "web"), Some(30000), "right after mkdir");
    let plans = plans_total(&d);
    copy_examples(manifests, &files);
    wait_for("the files to be read again", || plans_total(&d) > plans);
    let s = state(&d);
    assert_eq!(s["claims"], before);
    assert_eq!(port_of(&s, "web"), Some(30000), "{s:#}");
}

#[test]
fn unknown_fields_are_warnings_in_check_and_logged_once_per_file_version_in_run() {
    let dirs = Dirs::new("t10", &["gateway.yaml"]);
    let (manifests, state_dir) = (&dirs.manifests, &dirs.state);
    let team_a = std::fs::read_to_string(examples().join("team-a.yaml")).expect("read");
    std::fs::write(
        manifests.join("team-a.yaml"),
        team_a.replace("sectionName: tcp-pool", "sectionname: tcp-pool"),
    )
    .expect("write");
    let warning =
        "team-a.yaml document 1: TCPRoute team-a/web: unknown field \"spec.parentRefs[0].sectionname\"";

    let (ok, err) = check(manifests);
    assert!(ok, "warnings do not fail the check: {err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("warning: ") && l.ends_with(warning)),
        "{err}"
    );

    let mut d = Daemon::spawn(manifests, state_dir, true);
    wait_for("readiness", || d.readyz().is_some_and(|(ok, _)| ok));
    // More plans: the warning is not repeated for the same version of the file.
    copy_examples(manifests, &["team-b.yaml"]);
    wait_for("team-b's route", || port_of(&state(&d), "dns").is_some());
    // SAFETY: signals a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) }, 0);
    let (_, log) = d.exit("berth run ignored SIGTERM");
    assert_eq!(log.matches(warning).count(), 1, "{log}");
}

/// `berth drain|undrain --admin-addr ADMIN`: whether it succeeded, and what it printed.
fn drain_cli(d: &Daemon, what: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([what, "--admin-addr", &d.admin])
        .output()
        .expect("berth drain");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_drain_without_a_datapath_makes_the_daemon_not_ready_and_is_kept_until_undrained() {
    let dirs = Dirs::new("t10", &["gateway.yaml", "team-a.yaml"]);
    let args = ["--drain-timeout", "1s"];
    let mut d = Daemon::start_with(&dirs.manifests, &dirs.state, &args);
    let (ok, said) = drain_cli(&d, "drain");
    assert!(ok, "{said}");
    assert!(
        said.starts_with("drained: nothing was published yet; the datapath keeps serving"),
        "{said}"
    );
    let (ready, body) = d.readyz().expect("readyz");
    assert!(
        !ready && body.starts_with("draining: addresses withdrawn by berth drain"),
        "{body}"
    );
    assert!(dirs.state.join("drain").exists());
    let tables = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["get", "claims", "--admin-addr", &d.admin])
        .output()
        .expect("berth get");
    let tables = String::from_utf8_lossy(&tables.stdout).into_owned();
    assert!(
        tables.starts_with("NODE DRAINING (berth drain, ")
            && tables
                .lines()
                .next()
                .is_some_and(|l| l.contains("no address to withdraw")),
        "{tables}"
    );

    // Kept across a restart: drained at once (the drain timeout passed).
    let _ = d.child.kill();
    let _ = d.child.wait();
    d = Daemon::spawn_with(&dirs.manifests, &dirs.state, false, &args);
    wait_for("drained after a restart", || {
        d.readyz()
            .is_some_and(|(ok, body)| !ok && body.starts_with("drained: addresses withdrawn"))
    });
    let (ok, said) = drain_cli(&d, "undrain");
    assert!(ok, "{said}");
    assert_eq!(
        said.trim(),
        "undrained: announcing (no gateway address is served yet)"
    );
    wait_for("ready again", || d.readyz().is_some_and(|(ok, _)| ok));
    assert!(!dirs.state.join("drain").exists());
}

#[test]
fn announce_tables_the_kernel_reserves_are_refused_naming_the_option() {
    for table in ["0", "253", "254", "255", "main"] {
        let out = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args([
                "run",
                "--manifests",
                "/nonexistent",
                "--announce-table",
                table,
            ])
            .output()
            .expect("berth run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "table {table} accepted");
        assert!(err.contains("--announce-table"), "table {table}: {err}");
    }
}

/// `berth check -o json | head -1`: the reader goes away early, as `head` does. The
/// command ends as command-line tools do on a closed pipe (SIGPIPE), without a panic
/// message (issue 27: it panicked).
#[test]
fn check_whose_reader_closes_the_pipe_ends_quietly() {
    use std::io::Read as _;
    // A document far larger than a pipe holds (64 KiB): 400 routes.
    let dir = temp_dir("pipe");
    std::fs::copy(examples().join("gateway.yaml"), dir.join("gateway.yaml")).expect("copy");
    let routes: String = (0..400)
        .map(|i| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
                 metadata: {{name: r{i}, namespace: team}}\n\
                 spec: {{parentRefs: [{{name: shared, namespace: infra}}], \
                 rules: [{{backendRefs: [{{name: web, port: 80}}]}}]}}\n---\n"
            )
        })
        .collect();
    std::fs::write(dir.join("routes.yaml"), routes).expect("write routes");
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["check", "--manifests"])
        .arg(&dir)
        .args(["-o", "json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start berth check");
    // Read one byte, then close the pipe before the document is written.
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("a first byte");
    drop(stdout);
    let out = child.wait_with_output().expect("berth check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "berth check panicked on a closed pipe: {stderr}"
    );
}

/// A GatewayClass, a Gateway with a fixed TCP listener beside an HTTP one, an
/// HTTP-only Gateway (as the conformance suite's base Gateways), and a route to a
/// Service with one unnamed port whose EndpointSlice names its port `slice_port_name`.
fn fixed_listener_manifests(slice_port_name: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: berth}}
spec: {{controllerName: berth.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: db, namespace: infra}}
spec:
  gatewayClassName: berth
  addresses: [{{type: IPAddress, value: 10.251.0.7}}]
  listeners:
  - {{name: http, protocol: HTTP, port: 80}}
  - {{name: postgres, protocol: TCP, port: 5432, allowedRoutes: {{namespaces: {{from: All}}}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: web-only, namespace: infra}}
spec:
  gatewayClassName: berth
  addresses: [{{type: IPAddress, value: 10.251.0.8}}]
  listeners:
  - {{name: http, protocol: HTTP, port: 80}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {{name: pg, namespace: team-a}}
spec:
  parentRefs: [{{name: db, namespace: infra}}]
  rules: [{{backendRefs: [{{name: pg, port: 5432}}]}}]
---
apiVersion: v1
kind: Service
metadata: {{name: pg, namespace: team-a}}
spec:
  ports: [{{port: 5432, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: pg-x7k2p
  namespace: team-a
  labels: {{kubernetes.io/service-name: pg}}
addressType: IPv4
endpoints:
- addresses: [10.251.1.5]
  conditions: {{ready: true}}
ports: [{{name: {slice_port_name:?}, port: 5432, protocol: TCP}}]
"
    )
}

#[test]
fn an_unnamed_service_port_on_a_fixed_listener_is_served_shown_and_warned_when_it_goes() {
    let dirs = Dirs::new("fixed", &[]);
    let file = dirs.manifests.join("db.yaml");
    std::fs::write(&file, fixed_listener_manifests("")).expect("write");

    // `berth check`: both Gateways accepted and programmed, the route resolved.
    let doc = check_json(&dirs.manifests);
    for g in doc["gateways"].as_array().expect("gateways") {
        let cond = |t: &str| {
            g["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == t))
                .map(|c| (c["status"].clone(), c["reason"].clone()))
        };
        assert_eq!(
            cond("Accepted"),
            Some(("True".into(), "ListenersNotValid".into())),
            "{g:#}"
        );
        assert_eq!(
            cond("Programmed").map(|c| c.0),
            Some("True".into()),
            "{g:#}"
        );
        let http = &g["status"]["listeners"][0];
        assert_eq!(
            http["conditions"][0]["reason"], "UnsupportedProtocol",
            "{g:#}"
        );
    }

    // `berth run`: the route's row names the fixed listener, its port and backend.
    let mut d = Daemon::spawn(&dirs.manifests, &dirs.state, true);
    wait_for("readiness", || d.readyz().is_some_and(|(ok, _)| ok));
    let pg = |d: &Daemon| -> berth::admin::RouteRow {
        let rows: Vec<berth::admin::RouteRow> =
            serde_json::from_str(&berth::admin::get(&d.admin, "/api/v1/routes").expect("rows"))
                .expect("json");
        rows.into_iter().find(|r| r.name == "pg").expect("pg's row")
    };
    let row = pg(&d);
    assert_eq!(
        (
            row.listener.as_str(),
            row.port,
            row.backends,
            row.warning.as_deref()
        ),
        ("postgres", Some(5432), 1, None),
        "{row:?}"
    );
    let table = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["get", "routes", "--admin-addr", &d.admin])
        .output()
        .expect("berth get routes");
    let table = String::from_utf8_lossy(&table.stdout);
    let line = table
        .lines()
        .find(|l| l.contains(" pg "))
        .expect("pg's line");
    assert!(
        line.contains(" postgres ") && line.contains(" 5432 "),
        "{table}"
    );

    // The slice's port renamed: not the Service's unnamed port any more. The route
    // stays accepted, and the row and the log say it has no backend.
    let plans = plans_total(&d);
    std::fs::write(&file, fixed_listener_manifests("metrics")).expect("write");
    wait_for("the renamed port to be read", || plans_total(&d) > plans);
    let row = pg(&d);
    assert_eq!(row.backends, 0, "{row:?}");
    assert!(
        row.warning
            .as_deref()
            .is_some_and(|w| w.starts_with("no backends:")),
        "{row:?}"
    );
    // SAFETY: signals a child this test started and has not reaped.
    let rc = unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let (_, log) = d.exit("berth run ignored SIGTERM");
    assert!(
        log.contains("route has no backends") && log.contains("TCPRoute/team-a/pg"),
        "{log}"
    );
}
