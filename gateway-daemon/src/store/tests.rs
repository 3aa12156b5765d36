//! Tests of the store: journals, claims, first-seen times, migrations, bad records.

use super::*;
use super::{bounded, claims::claim_record};
use crate::model::{ClaimRoute, PortClaim, PortClaimSpec, RouteKey, Time};
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
    let route = ClaimRoute::new(crate::model::RouteKind::Tcp, "a", "r", None);
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
        shared,
        imbl::vector![Arc::new(claim(30001)), Arc::new(claim(30002))],
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
    store
        .record_first_seen(&[(key("TCPRoute/a/r"), time("2026-01-01T00:00:00Z"))], &[])
        .expect("record");
    store
        .record_first_seen(&[(key("UDPRoute/b/s"), time("2026-01-02T00:00:00Z"))], &[])
        .expect("record");
    // A writer killed mid-append leaves a torn line: it is ignored, then cut off.
    let log = dir.join(FIRST_SEEN_LOG);
    tear(&log, b"+\t2026-01-03T00:0");
    let reopened = Store::open(&dir).expect("reopen");
    let want: BTreeMap<RouteKey, Time> = [
        (key("TCPRoute/a/r"), time("2026-01-01T00:00:00Z")),
        (key("UDPRoute/b/s"), time("2026-01-02T00:00:00Z")),
    ]
    .into();
    assert_eq!(reopened.first_seen().expect("read"), want);
    reopened
        .record_first_seen(&[], &[key("TCPRoute/a/r")])
        .expect("forget");
    let text = fs::read_to_string(&log).expect("log");
    assert!(text.ends_with("-\tTCPRoute/a/r\n"), "{text:?}");
    assert!(!text.contains("2026-01-03"), "torn line cut off: {text:?}");
    // Many records of few routes: the journal is rewritten to what it holds.
    for i in 0..100 {
        let route = key("TCPRoute/c/x");
        let at = time(&format!("2026-02-{:02}T00:00:00Z", i % 28 + 1));
        reopened
            .record_first_seen(&[(route.clone(), at)], &[])
            .expect("add");
        reopened.record_first_seen(&[], &[route]).expect("remove");
    }
    let lines = fs::read_to_string(&log).expect("log").lines().count();
    assert!(
        lines <= 2 + 64 + 2,
        "compacted (one route held): {lines} lines"
    );
    let fresh = Store::open(&dir).expect("reopen");
    let want: BTreeMap<RouteKey, Time> =
        [(key("UDPRoute/b/s"), time("2026-01-02T00:00:00Z"))].into();
    assert_eq!(fresh.first_seen().expect("read"), want);
}

/// A route key written `Kind/namespace/name`.
fn key(text: &str) -> RouteKey {
    RouteKey::parse(text).expect("a route key")
}

/// An RFC 3339 time.
fn time(text: &str) -> Time {
    Time::parse(text).expect("an RFC 3339 time")
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
    other.spec.route = ClaimRoute::new(crate::model::RouteKind::Tcp, "b", "s", None);
    // A claim named after another port than it holds is ignored too (below).
    let mut later = claim(30002);
    later.spec.route = ClaimRoute::new(crate::model::RouteKind::Tcp, "b", "s", None);
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
        .record_first_seen(&[(key("UDPRoute/b/s"), time("2026-01-02T00:00:00Z"))], &[])
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

#[test]
fn a_claim_whose_name_says_another_port_is_ignored_reported_and_moved_aside() {
    let dir = TempDir::new("berth-store-renamed");
    fs::create_dir_all(&*dir).expect("dir");
    // Line 2 is line 1's record with its port changed by hand: it would move the route.
    let mut moved = claim(30001);
    moved.spec.port = 30007;
    fs::write(
        dir.join(CLAIMS_LOG),
        [put(&claim(30001)), put(&moved), put(&claim(30002))].concat(),
    )
    .expect("write");
    let store = Store::open(&dir).expect("open");
    assert_eq!(
        store.claims().expect("claims"),
        vec![claim(30001), claim(30002)],
        "the route keeps port 30001"
    );
    let bad = store.check().expect("check");
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!((bad[0].file, bad[0].line), (CLAIMS_LOG, 2));
    for part in ["infra/gw-tcp-30001", "TCP port 30007", "gw-tcp-30007"] {
        assert!(
            bad[0].problem.contains(part),
            "{part} in {}",
            bad[0].problem
        );
    }
    assert_eq!(store.reported.lock().expect("reported").len(), 1, "logged");
    assert_eq!(store.ignored_records(), 1, "counted");
    assert_eq!(store.repair().expect("repair"), bad);
    assert!(store.check().expect("check").is_empty());
    store.claims().expect("claims");
    assert_eq!(store.ignored_records(), 0, "none left after repair");
    let aside: Vec<_> = fs::read_dir(&*dir)
        .expect("dir")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("claims.log.bad-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "moved aside into one file");
}

#[test]
fn a_journal_that_is_a_device_or_a_fifo_is_refused_at_once_naming_it() {
    let dir = TempDir::new("berth-store-device");
    fs::create_dir_all(&*dir).expect("dir");
    std::os::unix::fs::symlink("/dev/full", dir.join(CLAIMS_LOG)).expect("symlink");
    let started = std::time::Instant::now();
    let store = Store::open(&dir).expect("open");
    let err = store.claims().expect_err("/dev/full is not a journal");
    assert!(matches!(err, StoreError::NotRegular { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("claims.log is a character device"), "{text}");
    let err = store.check().expect_err("state check refuses it too");
    assert!(err.to_string().contains("character device"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(1));

    fs::remove_file(dir.join(CLAIMS_LOG)).expect("rm");
    let made = std::process::Command::new("mkfifo")
        .arg(dir.join(FIRST_SEEN_LOG))
        .status()
        .expect("mkfifo");
    assert!(made.success(), "mkfifo");
    let err = store.first_seen().expect_err("a FIFO is not a journal");
    assert!(
        err.to_string().contains("first-seen.log is a FIFO"),
        "{err}"
    );
    fs::remove_file(dir.join(FIRST_SEEN_LOG)).expect("rm");
    fs::write(dir.join("generation"), "1".repeat(10_000)).expect("write");
    let err = Store::open(&dir)
        .expect("open")
        .claims()
        .expect_err("too large");
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
    assert!(
        err.to_string().contains("generation is 10000 bytes"),
        "{err}"
    );
}

#[test]
fn a_torn_tail_longer_than_a_line_is_ignored_then_cut_and_an_overlong_line_is_a_bad_record() {
    let dir = TempDir::new("berth-store-long");
    let store = Store::open(&dir).expect("open");
    store.create(&claim(30001)).expect("create");
    let log = dir.join(CLAIMS_LOG);
    let whole = fs::metadata(&log).expect("log").len();
    tear(&log, &vec![b'x'; 3 * bounded::MAX_LINE]);
    let reopened = Store::open(&dir).expect("reopen");
    assert_eq!(reopened.claims().expect("claims"), vec![claim(30001)]);
    let reported = reopened.reported.lock().expect("reported").clone();
    assert!(
        reported.iter().any(|r| r.contains(&format!(
            "torn last record of {} bytes",
            3 * bounded::MAX_LINE
        ))),
        "logged: {reported:?}"
    );
    reopened.create(&claim(30002)).expect("create");
    let text = fs::read_to_string(&log).expect("log");
    assert!(!text.contains("xxx"), "torn tail cut");
    assert!(fs::metadata(&log).expect("log").len() > whole);
    // A complete line beyond the limit is a bad record, not a reason to read it whole.
    tear(
        &log,
        &[vec![b'y'; 2 * bounded::MAX_LINE], b"\n".to_vec()].concat(),
    );
    let fresh = Store::open(&dir).expect("reopen");
    let err = fresh.claims().expect_err("corrupt");
    assert!(
        err.to_string().contains("line 3: longer than 64 KiB"),
        "{err}"
    );
    let bad = fresh.check().expect("check");
    assert_eq!((bad.len(), bad[0].line), (1, 3), "{bad:?}");
    fresh.repair().expect("repair");
    assert_eq!(
        Store::open(&dir).expect("reopen").claims().expect("claims"),
        vec![claim(30001), claim(30002)]
    );
}

#[test]
fn compaction_keeps_every_served_record_and_leaves_a_journal_with_ignored_ones() {
    let dir = TempDir::new("berth-store-compact");
    fs::create_dir_all(&*dir).expect("dir");
    let mut journal = String::new();
    for i in 0..1000u16 {
        journal.push_str(&put(&claim(30000 + i % 10)));
        if i % 10 != 3 {
            journal.push_str(&format!("-\tinfra\tgw-tcp-{}\n", 30000 + i % 10));
        }
    }
    fs::write(dir.join(CLAIMS_LOG), &journal).expect("write");
    let mut seen = String::new();
    for i in 0..500 {
        seen.push_str(&format!("+\t2026-01-01T00:00:00Z\tTCPRoute/a/r{}\n", i % 3));
    }
    fs::write(dir.join(FIRST_SEEN_LOG), &seen).expect("write");
    let store = Store::open(&dir).expect("open");
    let before = (
        store.claims().expect("claims"),
        store.first_seen().expect("seen"),
    );
    let done = store.compact().expect("compact");
    assert_eq!(
        done,
        vec![
            Compaction::Rewritten {
                file: CLAIMS_LOG,
                lines: 1900,
                records: 1
            },
            Compaction::Rewritten {
                file: FIRST_SEEN_LOG,
                lines: 500,
                records: 3
            }
        ]
    );
    let reopened = Store::open(&dir).expect("reopen");
    assert_eq!(
        (
            reopened.claims().expect("claims"),
            reopened.first_seen().expect("seen")
        ),
        before
    );
    assert_eq!(
        fs::read_to_string(dir.join(CLAIMS_LOG))
            .expect("log")
            .lines()
            .count(),
        1
    );
    assert!(
        reopened.compact().expect("again").is_empty(),
        "nothing left to do"
    );

    // A journal with an ignored record is left whole for `state repair` to move it aside.
    let mut moved = claim(30003);
    moved.spec.port = 30009;
    fs::write(dir.join(CLAIMS_LOG), [journal, put(&moved)].concat()).expect("write");
    let store = Store::open(&dir).expect("open");
    assert_eq!(
        store.compact().expect("compact"),
        vec![Compaction::KeptForRepair {
            file: CLAIMS_LOG,
            ignored: 1
        }]
    );
    assert_eq!(store.check().expect("check").len(), 1);
}
