//! Two processes racing on one state directory never both hold a port.

use std::{collections::BTreeSet, process::Command};

#[test]
fn two_processes_racing_for_the_same_ports_never_both_get_one() {
    let dir = std::env::temp_dir().join(format!("berth-race-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let count = 2000u16;
    let spawn = |who: &str| {
        Command::new(env!("CARGO_BIN_EXE_berth-claim-race"))
            .args([dir.to_str().expect("utf-8"), who, &count.to_string()])
            .output()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| spawn("a"));
        let b = s.spawn(|| spawn("b"));
        (
            a.join().expect("a").expect("run a"),
            b.join().expect("b").expect("run b"),
        )
    });
    assert!(a.status.success() && b.status.success(), "{a:?} {b:?}");
    let won = |o: &std::process::Output| -> BTreeSet<u16> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| l.parse().expect("port"))
            .collect()
    };
    let (wa, wb) = (won(&a), won(&b));
    assert!(
        wa.is_disjoint(&wb),
        "ports won by both: {:?}",
        wa.intersection(&wb).collect::<Vec<_>>()
    );
    assert_eq!(
        wa.len() + wb.len(),
        usize::from(count),
        "every port won by exactly one"
    );
    // The store agrees: each claim names its winner.
    let store = berth::store::Store::open(&dir).expect("open");
    for c in store.claims().expect("claims") {
        let winner = if wa.contains(&c.spec.port) { "a" } else { "b" };
        assert_eq!(
            c.spec.route.namespace, winner,
            "claim for port {}",
            c.spec.port
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
