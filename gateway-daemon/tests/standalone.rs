//! `berth run --manifests DIR` and `berth check` as a user runs them (no datapath, so
//! no root needed): live changes, broken files, restarts, and the check document.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

mod run;
use run::{wait_for, Daemon};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("berth-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn state(d: &Daemon) -> Value {
    serde_json::from_str(&berth::admin::get(&d.admin, "/api/v1/state").expect("state"))
        .expect("json")
}

/// The port in the route's status for its first parent, if accepted.
fn port_of(state: &Value, name: &str) -> Option<u64> {
    let r = state["routes"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name)?;
    let p = &r["status"]["parents"][0];
    let accepted = p["conditions"]
        .as_array()?
        .iter()
        .any(|c| c["type"] == "Accepted" && c["status"] == "True");
    accepted.then(|| p["parentRef"]["port"].as_u64()).flatten()
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
    let _ = std::fs::remove_dir_all(&manifests);
    let _ = std::fs::remove_dir_all(&state_dir);
}

#[test]
fn check_prints_the_documented_json_and_fails_clearly_on_a_broken_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["check", "-o", "json", "--manifests"])
        .arg(examples())
        .output()
        .expect("check");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
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
    let _ = std::fs::remove_dir_all(&broken);
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
    for d in [&manifests, &state_dir, &other] {
        let _ = std::fs::remove_dir_all(d);
    }
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
    for dir in [&manifests, &state_dir] {
        let _ = std::fs::remove_dir_all(dir);
    }
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
    for dir in [&manifests, &state_dir] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn a_manifest_file_that_is_not_text_is_an_error_naming_it() {
    let manifests = temp_dir("man6");
    for f in ["gateway.yaml", "team-a.yaml"] {
        std::fs::copy(examples().join(f), manifests.join(f)).expect("copy example");
    }
    std::fs::write(manifests.join("blob.yaml"), [0xff, 0xfe, 0x00, 0x81]).expect("write");
    let out = berth(&[
        std::ffi::OsStr::new("check"),
        std::ffi::OsStr::new("--manifests"),
        manifests.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("blob.yaml") && err.contains("not UTF-8"),
        "the error names the file and why: {err}"
    );
    let _ = std::fs::remove_dir_all(&manifests);
}
