//! The conntrack's occupancy: evictions estimated, changes logged once.

use super::*;

fn counters(created: u64, untracked: u64) -> BTreeMap<&'static str, u64> {
    [("ct_created", created), ("flood_untracked", untracked)]
        .into_iter()
        .collect()
}

#[test]
fn evictions_are_entries_created_less_those_in_the_table_never_decreasing() {
    assert_eq!(evictions_estimate(5000, 1024), 3976);
    assert_eq!(evictions_estimate(100, 100), 0);
    // Counters replaced (an upgrade) while the table kept its entries.
    assert_eq!(evictions_estimate(10, 1024), 0);
    let first = Conntrack::counted(None, &counters(5000, 0), (1024, 1024, 0), 1024);
    assert_eq!(first.evictions, 3976);
    let later = Conntrack::counted(Some(&first), &counters(10, 0), (1024, 1024, 0), 1024);
    assert_eq!(later.evictions, 3976, "a counter never goes back");
    let more = Conntrack::counted(Some(&later), &counters(9000, 0), (1000, 1000, 0), 1024);
    assert_eq!(more.evictions, 8000);
    // Entries the daemon deleted (idle SNAT flows) were not evicted.
    let deleted = Conntrack::counted(Some(&more), &counters(9500, 0), (1000, 1000, 500), 1024);
    assert_eq!((deleted.evictions, deleted.entries), (8000, 1000));
}

#[test]
fn nearly_full_and_flooding_are_reported_once_per_change() {
    use ConntrackChange::{Flooding, NearlyFull};
    let count = |before: Option<&Conntrack>, untracked, entries| {
        Conntrack::counted(before, &counters(0, untracked), (entries, entries, 0), 1000)
    };
    let quiet = count(None, 0, 100);
    assert_eq!(conntrack_changes(None, &quiet), vec![]);
    let full = count(Some(&quiet), 0, 900);
    assert!(full.nearly_full() && !count(None, 0, 899).nearly_full());
    assert_eq!(
        conntrack_changes(Some(&quiet), &full),
        vec![NearlyFull(true)]
    );
    let flood = count(Some(&full), 7, 1000);
    assert!(flood.flooding);
    assert_eq!(conntrack_changes(Some(&full), &flood), vec![Flooding(true)]);
    let still = count(Some(&flood), 9, 1000);
    assert_eq!(conntrack_changes(Some(&flood), &still), vec![]);
    let calm = count(Some(&still), 9, 10);
    assert!(!calm.flooding, "flood_untracked did not grow");
    assert_eq!(
        conntrack_changes(Some(&still), &calm),
        vec![NearlyFull(false), Flooding(false)]
    );
    // A daemon that starts on a full table says so; a first count is never a flood.
    let restarted = count(None, 50, 950);
    assert!(!restarted.flooding);
    assert_eq!(conntrack_changes(None, &restarted), vec![NearlyFull(true)]);
}
