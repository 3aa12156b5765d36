//! Tests of the store: journals, claims, first-seen times, migrations, bad records.

use super::claims::claim_record;
use super::*;
use crate::model::{ClaimRoute, PortClaim, PortClaimSpec};
use std::{
    collections::BTreeMap,
    fs,
    io::Write,
    path::{Path, PathBuf},
};

/// A directory of one test, removed when the test ends (also when it fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Appends `partial` without its newline, as a writer killed mid-append leaves it.
fn tear(log: &Path, partial: &[u8]) {
    fs::OpenOptions::new()
        .append(true)
        .open(log)
        .and_then(|mut f| f.write_all(partial))
        .expect("tear");
}

fn claim(port: u16) -> PortClaim {
    let route = ClaimRoute::new("TCPRoute", "a", "r", None);
    PortClaim::bound(
        "infra",
        PortClaimSpec::new("gw", "pool", "TCP", port, route),
    )
}

#[test]
fn a_reader_sees_what_another_writer_wrote_after_its_generation_bump() {
    let dir = TempDir::new("berth-store-gen");
    let (a, b) = (Store::open(&dir).expect("a"), Store::open(&dir).expect("b"));
    assert!(
        a.claims().expect("claims").is_empty(),
        "a caches an empty store"
    );
    // A write bumps the generation itself (no `begin_write` by the caller).
    b.create(&claim(30001)).expect("create");
    assert_eq!(
        a.claims().expect("claims"),
        vec![claim(30001)],
        "a reads again"
    );
    assert_eq!(
        b.claims().expect("claims"),
        vec![claim(30001)],
        "b kept its memory in step"
    );
}

#[test]
fn create_all_publishes_every_claim_and_stops_at_one_held_by_someone_else() {
    let dir = TempDir::new("berth-store-all");
    let store = Store::open(&dir).expect("open");
    let (a, b, c) = (claim(30001), claim(30002), claim(30003));
    store.create_all(&[&a, &b]).expect("create all");
    assert_eq!(store.claims().expect("claims"), vec![a.clone(), b.clone()]);
    // 30000 is new, 30002 exists: 30000 is published, then it stops.
    let z = claim(30000);
    assert!(matches!(
        store.create_all(&[&z, &b, &c]),
        Err(StoreError::AlreadyExists { .. })
    ));
    let on_disk = Store::open(&dir).expect("reopen").claims().expect("claims");
    assert_eq!(
        on_disk,
        vec![z, a, b],
        "the claim before the conflict is durable, the one after is not written"
    );
    let stray: Vec<_> = fs::read_dir(&*dir)
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "no temporary files left");
}

#[test]
fn temporaries_of_dead_writers_are_removed_on_open() {
    let dir = TempDir::new("berth-store-tmp");
    fs::create_dir_all(&*dir).expect("dir");
    // PID 0 is never a process; our own PID is alive.
    let dead = dir.join(".tmp-0-1");
    let alive = dir.join(format!(".tmp-{}-1", std::process::id()));
    fs::write(&dead, "x").expect("write");
    fs::write(&alive, "x").expect("write");
    Store::open(&dir).expect("open");
    assert!(!dead.exists(), "dead writer's file removed");
    assert!(alive.exists(), "live writer's file kept");
}

#[test]
fn a_claim_is_created_once_read_back_updated_and_deleted() {
    let dir = TempDir::new("berth-store");
    let store = Store::open(&dir).expect("open");
    let c = claim(30000);
    store.create(&c).expect("create");
    assert!(matches!(
        store.create(&c),
        Err(StoreError::AlreadyExists { .. })
    ));
    assert_eq!(store.claims().expect("claims"), vec![c.clone()]);
    let mut released = c.clone();
    released.spec.listener = "other".into();
    store.update(&released).expect("update");
    assert_eq!(store.claims().expect("claims"), vec![released]);
    store.delete("infra", "gw-tcp-30000").expect("delete");
    assert!(store.claims().expect("claims").is_empty());
    let leftovers: Vec<_> = fs::read_dir(&*dir)
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "no temporary files left: {leftovers:?}"
    );
}

#[test]
fn a_commit_deletes_updates_and_creates_in_one_append() {
    let dir = TempDir::new("berth-store-commit");
    let store = Store::open(&dir).expect("open");
    store
        .create_all(&[&claim(30001), &claim(30002)])
        .expect("create");
    let shared = store.claims_shared().expect("claims");
    let mut moved = claim(30002);
    moved.spec.listener = "other".into();
    store
        .commit(
            &[("infra", "gw-tcp-30001")],
            &[Arc::new(moved.clone())],
            &[Arc::new(claim(30003))],
        )
        .expect("commit");
    assert_eq!(
        *shared,
        vec![Arc::new(claim(30001)), Arc::new(claim(30002))],
        "a reader's list stays"
    );
    assert_eq!(
        store.claims().expect("claims"),
        vec![moved.clone(), claim(30003)]
    );
    let log = fs::read_to_string(dir.join(CLAIMS_LOG)).expect("log");
    assert_eq!(log.lines().count(), 2 + 3, "{log}");
    assert_eq!(
        Store::open(&dir).expect("reopen").claims().expect("claims"),
        vec![moved, claim(30003)]
    );
}

#[test]
fn the_claims_journal_survives_a_torn_append_and_compacts() {
    let dir = TempDir::new("berth-store-claims-log");
    let store = Store::open(&dir).expect("open");
    store
        .create_all(&[&claim(30001), &claim(30002)])
        .expect("create");
    let log = dir.join(CLAIMS_LOG);
    tear(&log, b"+\t{\"metadata\":{\"na");
    let reopened = Store::open(&dir).expect("reopen");
    assert_eq!(
        reopened.claims().expect("read"),
        vec![claim(30001), claim(30002)]
    );
    reopened.delete("infra", "gw-tcp-30001").expect("delete");
    let text = fs::read_to_string(&log).expect("log");
    assert!(text.ends_with("-\tinfra\tgw-tcp-30001\n"), "{text:?}");
    assert!(
        !text.contains("{\"metadata\":{\"na\n"),
        "torn line cut off: {text:?}"
    );
    for _ in 0..100 {
        reopened.create(&claim(30003)).expect("create");
        reopened.delete("infra", "gw-tcp-30003").expect("delete");
    }
    let lines = fs::read_to_string(&log).expect("log").lines().count();
    assert!(
        lines <= 2 + 64 + 2,
        "compacted (one claim held): {lines} lines"
    );
    let fresh = Store::open(&dir).expect("reopen");
    assert_eq!(fresh.claims().expect("read"), vec![claim(30002)]);
}

#[test]
fn claim_files_of_earlier_versions_are_moved_into_the_journal() {
    let dir = TempDir::new("berth-store-files");
    fs::create_dir_all(dir.join("claims/infra")).expect("dir");
    let c = claim(30005);
    let yaml = serde_yaml::to_string(&c).expect("yaml");
    fs::write(dir.join("claims/infra/gw-tcp-30005.yaml"), &yaml).expect("write");
    let store = Store::open(&dir).expect("open");
    assert_eq!(store.claims().expect("read"), vec![c.clone()]);
    assert!(!dir.join("claims").exists(), "claim files removed");
    // An import that stopped before removing the files does not import them again
    // (the journal holds them, and what came after).
    fs::create_dir_all(dir.join("claims/infra")).expect("dir");
    fs::write(dir.join("claims/infra/gw-tcp-30005.yaml"), &yaml).expect("write");
    store.delete("infra", "gw-tcp-30005").expect("delete");
    let again = Store::open(&dir).expect("reopen");
    assert!(again.claims().expect("read").is_empty());
    assert!(!dir.join("claims").exists(), "leftover files removed");
}

#[test]
fn first_seen_journal_survives_a_torn_append_and_compacts() {
    let dir = TempDir::new("berth-store-seen");
    let store = Store::open(&dir).expect("open");
    let t = |s: &str| s.to_string();
    store
        .record_first_seen(&[(t("TCPRoute/a/r"), t("2026-01-01T00:00:00Z"))], &[])
        .expect("record");
    store
        .record_first_seen(&[(t("UDPRoute/b/s"), t("2026-01-02T00:00:00Z"))], &[])
        .expect("record");
    // A writer killed mid-append leaves a torn line: it is ignored, then cut off.
    let log = dir.join(FIRST_SEEN_LOG);
    tear(&log, b"+\t2026-01-03T00:0");
    let reopened = Store::open(&dir).expect("reopen");
    let want: BTreeMap<String, String> = [
        (t("TCPRoute/a/r"), t("2026-01-01T00:00:00Z")),
        (t("UDPRoute/b/s"), t("2026-01-02T00:00:00Z")),
    ]
    .into();
    assert_eq!(reopened.first_seen().expect("read"), want);
    reopened
        .record_first_seen(&[], &[t("TCPRoute/a/r")])
        .expect("forget");
    let text = fs::read_to_string(&log).expect("log");
    assert!(text.ends_with("-\tTCPRoute/a/r\n"), "{text:?}");
    assert!(!text.contains("2026-01-03"), "torn line cut off: {text:?}");
    // Many records of few routes: the journal is rewritten to what it holds.
    for i in 0..100 {
        let key = t("TCPRoute/c/x");
        reopened
            .record_first_seen(
                &[(key.clone(), format!("2026-02-{:02}T00:00:00Z", i % 28 + 1))],
                &[],
            )
            .expect("add");
        reopened.record_first_seen(&[], &[key]).expect("remove");
    }
    let lines = fs::read_to_string(&log).expect("log").lines().count();
    assert!(
        lines <= 2 + 64 + 2,
        "compacted (one route held): {lines} lines"
    );
    let fresh = Store::open(&dir).expect("reopen");
    let want: BTreeMap<String, String> = [(t("UDPRoute/b/s"), t("2026-01-02T00:00:00Z"))].into();
    assert_eq!(fresh.first_seen().expect("read"), want);
}

/// A claim record as the journal holds it.
fn put(c: &PortClaim) -> String {
    let mut line = String::new();
    claim_record(&mut line, c, Path::new(CLAIMS_LOG)).expect("record");
    line
}

#[test]
fn a_port_held_twice_is_reported_with_its_line_and_the_later_record_ignored() {
    let dir = TempDir::new("berth-store-twice");
    fs::create_dir_all(&*dir).expect("dir");
    // Line 3 names port 30001 under another name, for another route; line 5 takes
    // 30002 after line 4 let it go.
    let mut other = claim(30001);
    other.metadata.name = "hand-made".into();
    other.spec.route = ClaimRoute::new("TCPRoute", "b", "s", None);
    let mut later = other.clone();
    later.metadata.name = "hand-made-2".into();
    later.spec.port = 30002;
    let journal = [
        put(&claim(30001)),
        put(&claim(30002)),
        put(&other),
        "-\tinfra\tgw-tcp-30002\n".to_string(),
        put(&later),
    ]
    .concat();
    fs::write(dir.join(CLAIMS_LOG), journal).expect("write");
    let store = Store::open(&dir).expect("open");
    assert_eq!(
        store.claims().expect("claims"),
        vec![claim(30001), later.clone()],
        "the earlier holder keeps 30001; the record of line 3 is ignored"
    );
    let bad = store.check().expect("check");
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!((bad[0].file, bad[0].line), (CLAIMS_LOG, 3));
    for part in [
        "infra/hand-made",
        "TCPRoute b/s",
        "TCP 30001",
        "infra/gw-tcp-30001",
        "line 1",
    ] {
        assert!(
            bad[0].problem.contains(part),
            "{part} in {}",
            bad[0].problem
        );
    }
    assert_eq!(store.reported.lock().expect("reported").len(), 1, "logged");
    // Read again (another writer bumped the generation): not logged twice.
    Store::open(&dir).expect("b").begin_write().expect("bump");
    store.claims().expect("claims");
    assert_eq!(store.reported.lock().expect("reported").len(), 1);

    // Repair moves it aside and keeps the rest.
    assert_eq!(store.repair().expect("repair"), bad);
    assert!(store.check().expect("check").is_empty());
    assert_eq!(
        Store::open(&dir).expect("reopen").claims().expect("claims"),
        vec![claim(30001), later]
    );
}

#[test]
fn first_seen_of_earlier_versions_is_imported() {
    let dir = TempDir::new("berth-store-yaml");
    fs::create_dir_all(&dir).expect("dir");
    fs::write(
        dir.join(FIRST_SEEN_YAML),
        "TCPRoute/a/r: 2026-01-01T00:00:00Z\n",
    )
    .expect("write");
    let store = Store::open(&dir).expect("open");
    assert_eq!(store.first_seen().expect("read").len(), 1);
    store
        .record_first_seen(
            &[("UDPRoute/b/s".into(), "2026-01-02T00:00:00Z".into())],
            &[],
        )
        .expect("record");
    assert!(
        !dir.join(FIRST_SEEN_YAML).exists(),
        "turned into the journal"
    );
    assert_eq!(
        Store::open(&dir)
            .expect("reopen")
            .first_seen()
            .expect("read")
            .len(),
        2
    );
}
