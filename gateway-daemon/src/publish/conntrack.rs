//! The conntrack's occupancy as the traffic reading counts it (with the active flows,
//! every `ACTIVE_FLOW_REFRESH`): entries, evictions estimated, whether the flood guard
//! is active, and one log line per change of those.

use std::collections::BTreeMap;

/// The conntrack's occupancy, read with the active flows (`ACTIVE_FLOW_REFRESH`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conntrack {
    /// Entries in the tables (IPv4 and IPv6 together).
    pub entries: u64,
    /// Entries in the fuller of the two.
    pub fullest: u64,
    /// Entries each family's table can hold (`berth run --conntrack-size`).
    pub capacity: u64,
    /// The `ct_created` counter (entries the kernel created) read with `entries`.
    pub created: u64,
    /// The `flood_untracked` counter read with `entries`.
    pub untracked: u64,
    /// Estimated entries the LRU evicted (`evictions_estimate`), never lower than
    /// what this daemon published before.
    pub evictions: u64,
    /// New flows went untracked since the count before (the flood guard is active).
    pub flooding: bool,
}

impl Conntrack {
    /// A table is nearly full (90 % or more): new flows evict established ones.
    pub fn nearly_full(&self) -> bool {
        self.capacity > 0 && self.fullest * 10 >= self.capacity * 9
    }

    /// The occupancy counted now, following `before` (the count before, if any).
    pub(super) fn counted(
        before: Option<&Conntrack>,
        counters: &BTreeMap<&'static str, u64>,
        (entries, fullest, deleted): (u64, u64, u64),
        capacity: u64,
    ) -> Conntrack {
        use gateway_common::Counter;
        let count = |c: Counter| counters.get(c.name()).copied().unwrap_or(0);
        let (created, untracked) = (count(Counter::CtCreated), count(Counter::FloodUntracked));
        Conntrack {
            entries,
            fullest,
            capacity,
            created,
            untracked,
            // Entries the daemon deleted itself (idle SNAT flows) were not evicted.
            evictions: evictions_estimate(created, entries + deleted)
                .max(before.map_or(0, |b| b.evictions)),
            flooding: before.is_some_and(|b| untracked > b.untracked),
        }
    }
}

/// Entries the conntrack's LRU evicted, estimated: the kernel counts no evictions, so
/// this is the entries created (`ct_created`) less those still in the table or deleted
/// by the daemon (idle SNAT flows), 0 when fewer were counted as created (counters
/// replaced by an upgrade).
pub fn evictions_estimate(created: u64, entries: u64) -> u64 {
    created.saturating_sub(entries)
}

/// A change of the conntrack's state worth one log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConntrackChange {
    /// The table became nearly full (true) or no longer is (false).
    NearlyFull(bool),
    /// The flood guard started (true) or stopped (false) leaving new flows untracked.
    Flooding(bool),
}

/// What changed from the count `before` (none: a fresh daemon, which says what is
/// the case) to `after`.
fn conntrack_changes(before: Option<&Conntrack>, after: &Conntrack) -> Vec<ConntrackChange> {
    let full_before = before.is_some_and(Conntrack::nearly_full);
    let flooding_before = before.is_some_and(|b| b.flooding);
    let mut changes = Vec::new();
    if after.nearly_full() != full_before {
        changes.push(ConntrackChange::NearlyFull(after.nearly_full()));
    }
    if after.flooding != flooding_before {
        changes.push(ConntrackChange::Flooding(after.flooding));
    }
    changes
}

/// Logs, once per change, that the conntrack became nearly full or the flood guard
/// started (and that they ended), naming the option that changes each.
pub(super) fn log_conntrack(before: Option<&Conntrack>, after: &Conntrack) {
    for change in conntrack_changes(before, after) {
        let Conntrack {
            entries,
            capacity,
            evictions,
            ..
        } = *after;
        match change {
            ConntrackChange::NearlyFull(true) => tracing::warn!(
                entries,
                capacity,
                evictions,
                "the conntrack is 90 % full or more: new flows evict the least recently \
                 used ones, whose next packets are balanced again by Maglev (to another \
                 backend if the backends changed); raise berth run --conntrack-size"
            ),
            ConntrackChange::NearlyFull(false) => {
                tracing::info!(entries, capacity, "the conntrack is below 90 % full again")
            }
            ConntrackChange::Flooding(true) => tracing::warn!(
                untracked = after.untracked - before.map_or(0, |b| b.untracked),
                "flood guard active: a CPU saw more new flows per second than \
                 --new-flow-limit, so new flows are balanced by Maglev alone and not \
                 recorded (flood_untracked); raise berth run --new-flow-limit if this \
                 is legitimate load"
            ),
            ConntrackChange::Flooding(false) => tracing::info!(
                "flood guard inactive: new flows are recorded in the conntrack again"
            ),
        }
    }
}

#[cfg(test)]
mod tests;
