//! What a plan changes in the claim store: the pure diff between the claims held and
//! the claims a plan wants, as the writes that turn one into the other. Both modes'
//! claim writers (the standalone store and the Kubernetes API) apply it.

use std::sync::Arc;

use crate::model::PortClaim;

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

/// The writes that turn `have` into `want`: one merge of the two lists by namespace,
/// then name (the store lists claims and the planner returns them in that order). A
/// claim the plan kept is the stored allocation: compared by pointer first.
pub fn claim_changes<'h, 'w>(
    have: &'h [Arc<PortClaim>],
    want: &'w [Arc<PortClaim>],
) -> Vec<ClaimChange<'h, 'w>> {
    fn key(c: &PortClaim) -> (&str, &str) {
        (c.metadata.ns(), c.metadata.name.as_str())
    }
    fn sorted(list: &[Arc<PortClaim>]) -> Vec<&Arc<PortClaim>> {
        let mut refs: Vec<&Arc<PortClaim>> = list.iter().collect();
        if !refs.is_sorted_by_key(|c| key(c)) {
            refs.sort_by(|a, b| key(a).cmp(&key(b)));
        }
        refs
    }
    let (have, want) = (sorted(have), sorted(want));
    let (mut h, mut w) = (have.into_iter().peekable(), want.into_iter().peekable());
    let mut changes = Vec::new();
    loop {
        match (h.peek(), w.peek()) {
            (None, None) => return changes,
            (Some(&a), None) => {
                changes.push(ClaimChange::Delete(a));
                h.next();
            }
            (None, Some(&b)) => {
                changes.push(ClaimChange::Create(b));
                w.next();
            }
            (Some(&a), Some(&b)) => match key(a).cmp(&key(b)) {
                std::cmp::Ordering::Less => {
                    changes.push(ClaimChange::Delete(a));
                    h.next();
                }
                std::cmp::Ordering::Greater => {
                    changes.push(ClaimChange::Create(b));
                    w.next();
                }
                std::cmp::Ordering::Equal => {
                    if !Arc::ptr_eq(a, b) && a != b {
                        changes.push(ClaimChange::Update(b));
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
        let route = ClaimRoute::new("TCPRoute", "a", route, None);
        let mut c = PortClaim::bound(ns, PortClaimSpec::new("gw", "pool", "TCP", port, route));
        c.metadata.name = format!("gw-tcp-{port}");
        Arc::new(c)
    }

    #[test]
    fn claim_changes_merge_both_lists_in_any_order() {
        let have = vec![claim("a", 1, "x"), claim("a", 2, "y"), claim("b", 3, "z")];
        let want = vec![
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
