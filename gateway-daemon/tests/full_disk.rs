//! A full disk under the state directory, for real: a small tmpfs, filled up while
//! claims are written. Memory follows the disk: a write that did not land is not held,
//! is retried, and lands once there is room; the daemon says it is not ready meanwhile.
//! Needs root (mounts a tmpfs; unmounted when the test ends, also on failure).

use std::{path::Path, sync::Arc};

use berth::{
    model::{ClaimRoute, PortClaim, PortClaimSpec},
    store::Store,
};

mod run;
use run::{fill, wait_for, Daemon, Tmpfs};

fn claim(port: u16) -> Arc<PortClaim> {
    let route = ClaimRoute::new(
        berth::model::RouteKind::Tcp,
        "team",
        &format!("route-{port}"),
        None,
    );
    let mut c = PortClaim::bound(
        "infra",
        PortClaimSpec::new("gw", "pool", "TCP", port, route),
    );
    c.metadata.name = format!("gw-tcp-{port}").into();
    Arc::new(c)
}

fn ports(store: &Store) -> Vec<u16> {
    let mut p: Vec<u16> = store
        .claims()
        .expect("claims")
        .iter()
        .map(|c| c.spec.port)
        .collect();
    p.sort();
    p
}

fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("state dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect()
}

#[test]
fn a_batch_the_full_disk_cut_short_is_not_held_and_lands_once_there_is_room() {
    let fs = Tmpfs::new("store", 256);
    let dir = fs.0.join("state");
    let store = Store::open(&dir).expect("open");
    let first: Vec<Arc<PortClaim>> = (30000..30010).map(claim).collect();
    store.commit(&[], &[], &first).expect("ten claims fit");

    // Room for part of the next batch only: its append stops midway.
    let filler = fill(&fs.0, 4096);
    let batch: Vec<Arc<PortClaim>> = (30010..30050).map(claim).collect();
    let err = store
        .commit(&[], &[], &batch)
        .expect_err("forty claims do not fit in 4 KiB");
    eprintln!("as expected: {}", berth::error_chain(&err));
    let held: Vec<u16> = (30000..30010).collect();
    assert_eq!(
        ports(&store),
        held,
        "the store holds what the disk holds, no more"
    );
    assert_eq!(
        ports(&Store::open(&dir).expect("reopen")),
        held,
        "and so does a restarted daemon: nothing half written"
    );
    assert!(temporaries(&dir).is_empty(), "{:?}", temporaries(&dir));

    // The same batch again once there is room: all of it, durably.
    std::fs::remove_file(&filler).expect("free the disk");
    store.commit(&[], &[], &batch).expect("the retried batch");
    let all: Vec<u16> = (30000..30050).collect();
    assert_eq!(ports(&store), all);
    assert_eq!(ports(&Store::open(&dir).expect("reopen")), all);
}

/// TCPRoute `a/name` first seen at RFC 3339 `time`.
fn seen(name: &str, time: &str) -> (berth::model::RouteKey, berth::model::Time) {
    let key = berth::model::RouteKey {
        kind: berth::model::RouteKind::Tcp,
        namespace: "a".into(),
        name: name.into(),
    };
    (key, berth::model::Time::parse(time).expect("a time"))
}

#[test]
fn first_seen_times_the_full_disk_refused_are_not_held() {
    let fs = Tmpfs::new("seen", 256);
    let dir = fs.0.join("state");
    let store = Store::open(&dir).expect("open");
    let first = vec![seen("one", "2026-12-03T10:00:00Z")];
    store.record_first_seen(&first, &[]).expect("fits");
    let filler = fill(&fs.0, 0);
    let many: Vec<_> = (0..200)
        .map(|i| seen(&format!("r{i}"), "2026-12-03T11:00:00Z"))
        .collect();
    store
        .record_first_seen(&many, &[])
        .expect_err("a full disk refuses the records");
    let seen = store.first_seen().expect("first seen");
    assert_eq!(seen.len(), 1, "only what the journal holds: {seen:?}");
    std::fs::remove_file(&filler).expect("free the disk");
    store.record_first_seen(&many, &[]).expect("room again");
    assert_eq!(
        Store::open(&dir)
            .expect("reopen")
            .first_seen()
            .expect("seen")
            .len(),
        201
    );
}

/// Team B's assigned port in the daemon's state, if it has one.
fn team_b_port(d: &Daemon) -> Option<u64> {
    let state: serde_json::Value =
        serde_json::from_str(&berth::admin::get(&d.admin, "/api/v1/state").ok()?).ok()?;
    state["claims"]
        .as_array()?
        .iter()
        .find(|c| c["route"]["namespace"] == "team-b")?["port"]
        .as_u64()
}

#[test]
fn a_daemon_whose_disk_is_full_is_not_ready_says_why_and_catches_up_when_there_is_room() {
    let fs = Tmpfs::new("run", 512);
    let manifests = fs.0.join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifests");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for f in ["gateway.yaml", "team-a.yaml"] {
        std::fs::copy(examples.join(f), manifests.join(f)).expect("copy");
    }
    let state = fs.0.join("state");
    let team_b = std::fs::read_to_string(examples.join("team-b.yaml")).expect("team-b");
    let mut d = Daemon::spawn(&manifests, &state, false);
    wait_for("readiness", || d.readyz().is_some_and(|(ok, _)| ok));

    // The disk fills; team B's route arrives (the file itself still fits: written
    // before the filler takes the rest).
    std::fs::write(manifests.join("team-b.yaml"), &team_b).expect("team-b");
    let filler = fill(&fs.0, 0);
    // A write cut short may have happened before the filler: only a refusal counts.
    wait_for("not ready, saying why", || {
        d.readyz()
            .is_some_and(|(ok, body)| !ok && body.contains("No space left on device"))
            || team_b_port(&d).is_some()
    });
    if team_b_port(&d).is_none() {
        let (_, body) = d.readyz().expect("readyz");
        eprintln!("while full: {body}");
        assert_eq!(
            team_b_port(&d),
            None,
            "a claim that is not durable is not served"
        );
    }

    std::fs::remove_file(&filler).expect("free the disk");
    wait_for("ready again with team B's port", || {
        d.readyz().is_some_and(|(ok, _)| ok) && team_b_port(&d) == Some(30053)
    });

    // Durable: a restart after kill -9 holds the same port.
    drop(d);
    d = Daemon::spawn(&manifests, &state, false);
    wait_for("the restarted daemon's plan", || team_b_port(&d).is_some());
    assert_eq!(team_b_port(&d), Some(30053));
}

#[test]
fn temporary_files_of_writes_the_full_disk_refused_are_removed() {
    let fs = Tmpfs::new("tmp", 256);
    let dir = fs.0.join("state");
    let store = Store::open(&dir).expect("open");
    let claims: Vec<Arc<PortClaim>> = (30000..30040).map(claim).collect();
    store.commit(&[], &[], &claims).expect("forty claims");
    // Updates up to where the next write rewrites the journal whole (a temporary
    // file of ~9 KiB renamed over it): 40 claims, 2 * 40 + 64 lines.
    let mut updated = (*claims[0]).clone();
    for i in 0..104 {
        updated.spec.listener = format!("pool-{i}").into();
        store.update(&updated).expect("update");
    }

    // No room at all: even the generation's temporary file is refused.
    let filler = fill(&fs.0, 0);
    updated.spec.listener = "full".into();
    store.update(&updated).expect_err("a full disk");
    assert!(temporaries(&dir).is_empty(), "{:?}", temporaries(&dir));

    // A page: the generation is bumped, the journal's rewrite is refused.
    std::fs::remove_file(&filler).expect("free");
    let filler = fill(&fs.0, 4096);
    let err = store
        .update(&updated)
        .expect_err("the rewrite does not fit");
    eprintln!("as expected: {}", berth::error_chain(&err));
    assert!(
        berth::error_chain(&err).contains(".tmp-"),
        "refused while writing the temporary file: {}",
        berth::error_chain(&err)
    );
    assert!(temporaries(&dir).is_empty(), "{:?}", temporaries(&dir));
    assert_eq!(ports(&store), (30000..30040).collect::<Vec<_>>());

    // And the same for the first-seen journal.
    let many: Vec<_> = (0..200)
        .map(|i| seen(&format!("r{i}"), "2026-12-03T11:00:00Z"))
        .collect();
    store
        .record_first_seen(&many, &[])
        .expect_err("a full disk");
    assert!(temporaries(&dir).is_empty(), "{:?}", temporaries(&dir));

    std::fs::remove_file(&filler).expect("free");
    store.update(&updated).expect("room again");
    assert_eq!(
        Store::open(&dir).expect("reopen").claims().expect("claims")[0],
        updated
    );
}
