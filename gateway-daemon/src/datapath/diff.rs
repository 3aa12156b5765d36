//! The services' diff, pure: from the installed services and the desired state to the
//! ordered list of what to write (`MapOp`), with no kernel behind it. `apply.rs`
//! applies the list to the maps.

use std::collections::BTreeMap;

use super::{desired::BackendSet, Installed};
use crate::model::{DesiredState, ServiceAddr};

/// A service that may differ from what is installed, with the backends wanted (`None`:
/// not wanted any more).
pub(super) type Change = (ServiceAddr, Option<BackendSet>);

/// One service's change to the maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum MapOp {
    /// Installed and no longer wanted: its entries go.
    Remove(ServiceAddr),
    /// Installed with other backends or weights (or a table that was lost): its table is
    /// written anew.
    Update {
        /// The service.
        service: ServiceAddr,
        /// Its backends.
        backends: BackendSet,
        /// SNAT mode.
        snat: bool,
    },
    /// Installed with these backends already: nothing to write (its mode may still
    /// switch, see `Datapath::sync_snat_flags`).
    Keep {
        /// The service.
        service: ServiceAddr,
        /// Its backends.
        backends: BackendSet,
    },
    /// Not installed: written with the other additions, last.
    Add {
        /// The service.
        service: ServiceAddr,
        /// Its backends.
        backends: BackendSet,
        /// SNAT mode.
        snat: bool,
    },
}

impl MapOp {
    /// The service it is about.
    pub(super) fn service(&self) -> ServiceAddr {
        match self {
            MapOp::Remove(service)
            | MapOp::Update { service, .. }
            | MapOp::Keep { service, .. }
            | MapOp::Add { service, .. } => *service,
        }
    }

    /// The backends wanted, if the service is.
    pub(super) fn wanted(&self) -> Option<&BackendSet> {
        match self {
            MapOp::Remove(_) => None,
            MapOp::Update { backends, .. }
            | MapOp::Keep { backends, .. }
            | MapOp::Add { backends, .. } => Some(backends),
        }
    }
}

/// The services of `desired` that may differ from what is installed, and how many are
/// the same: those that changed since `last`, the state last applied in full; without
/// one (at first, and after a failure) every service wanted and every one installed
/// (`installed`) that is not.
pub(super) fn candidates<'a>(
    desired: &DesiredState,
    last: Option<&DesiredState>,
    installed: impl Iterator<Item = &'a ServiceAddr>,
) -> (Vec<Change>, usize) {
    if let Some(last) = last {
        return desired.changes_since(last);
    }
    let want = desired.normalized();
    let wanted = |k: &ServiceAddr| want.binary_search_by(|(s, _)| s.cmp(k)).is_ok();
    let gone: Vec<Change> = installed
        .filter(|k| !wanted(k))
        .map(|&k| (k, None))
        .collect();
    let changes = gone
        .into_iter()
        .chain(want.into_iter().map(|(k, set)| (k, Some(set))))
        .collect();
    (changes, 0)
}

/// What writing `changes` over `installed` takes, in the order it is written:
/// removals first, then changed services (those giving backends back before those
/// taking more), then new ones, so that a state that fits the limits fits them at every
/// step (an id is taken before the one it replaces is given back). A service neither
/// installed nor wanted takes nothing. `snat` says which services are in SNAT mode.
pub(super) fn ops(
    changes: Vec<Change>,
    installed: &BTreeMap<ServiceAddr, Installed>,
    snat: impl Fn(&ServiceAddr) -> bool,
) -> Vec<MapOp> {
    let mut changes = changes;
    changes.sort_by_cached_key(|(key, want)| match (want, installed.get(key)) {
        (None, _) => (0, 0),
        (Some(want), Some(svc)) => (1, want.len() as i64 - svc.backends.len() as i64),
        (Some(_), None) => (2, 0),
    });
    changes
        .into_iter()
        .filter_map(|(service, want)| {
            let snat = snat(&service);
            Some(match (want, installed.get(&service)) {
                (None, None) => return None,
                (None, Some(_)) => MapOp::Remove(service),
                (Some(backends), None) => MapOp::Add {
                    service,
                    backends,
                    snat,
                },
                (Some(backends), Some(svc)) if svc.same_backends(&backends) => {
                    MapOp::Keep { service, backends }
                }
                (Some(backends), Some(_)) => MapOp::Update {
                    service,
                    backends,
                    snat,
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::model::{Protocol, WeightedBackend};

    fn service(port: u16) -> ServiceAddr {
        ServiceAddr::of("10.0.0.1", Protocol::Tcp, port)
    }

    fn endpoint(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 1, 0, last], 8080))
    }

    fn set(backends: &[(u8, u16)]) -> BackendSet {
        backends.iter().map(|&(e, w)| (endpoint(e), w)).collect()
    }

    /// A service installed with `backends` (ids and table as the maps would hold them).
    fn installed(backends: &[(u8, u16)]) -> Installed {
        Installed {
            id: Default::default(),
            table: super::super::pool::Region::EMPTY,
            table_lost: false,
            snat: false,
            backends: backends
                .iter()
                .enumerate()
                .map(|(i, &(e, w))| (endpoint(e), (i as u32, w)))
                .collect(),
        }
    }

    fn state(services: &[(u16, &[(u8, u16)])]) -> DesiredState {
        services
            .iter()
            .fold(DesiredState::default(), |state, (port, backends)| {
                let backends = backends
                    .iter()
                    .map(|&(e, weight)| WeightedBackend {
                        endpoint: endpoint(e),
                        weight,
                    })
                    .collect();
                state.with_service(service(*port), backends)
            })
    }

    #[test]
    fn removals_come_first_then_shrinking_then_growing_services_then_additions() {
        let have = BTreeMap::from([
            (service(1), installed(&[(1, 1), (2, 1)])),
            (service(2), installed(&[(1, 1)])),
            (service(3), installed(&[(1, 1), (2, 1), (3, 1)])),
            (service(4), installed(&[(1, 1)])),
        ]);
        let changes = vec![
            (service(5), Some(set(&[(1, 1)]))),
            (service(2), Some(set(&[(1, 1), (2, 1), (3, 1)]))),
            (service(3), Some(set(&[(1, 1)]))),
            (service(1), Some(set(&[(1, 1), (2, 1)]))),
            (service(4), None),
            (service(6), None),
        ];
        let ops = ops(changes, &have, |s| *s == service(5));
        let order: Vec<(u16, &str)> = ops
            .iter()
            .map(|op| {
                let kind = match op {
                    MapOp::Remove(_) => "remove",
                    MapOp::Update { .. } => "update",
                    MapOp::Keep { .. } => "keep",
                    MapOp::Add { .. } => "add",
                };
                (op.service().port, kind)
            })
            .collect();
        assert_eq!(
            order,
            [
                (4, "remove"),
                (3, "update"),
                (1, "keep"),
                (2, "update"),
                (5, "add")
            ],
            "service 6 was neither installed nor wanted"
        );
        assert_eq!(
            ops[4],
            MapOp::Add {
                service: service(5),
                backends: set(&[(1, 1)]),
                snat: true
            }
        );
    }

    #[test]
    fn another_weight_or_a_lost_table_is_an_update_and_the_same_backends_are_kept() {
        let mut lost = installed(&[(1, 1)]);
        lost.table_lost = true;
        let have = BTreeMap::from([
            (service(1), installed(&[(1, 1)])),
            (service(2), installed(&[(1, 1)])),
            (service(3), lost),
        ]);
        let changes = vec![
            (service(1), Some(set(&[(1, 1)]))),
            (service(2), Some(set(&[(1, 2)]))),
            (service(3), Some(set(&[(1, 1)]))),
        ];
        let kinds: Vec<bool> = ops(changes, &have, |_| false)
            .iter()
            .map(|op| matches!(op, MapOp::Keep { .. }))
            .collect();
        assert_eq!(kinds, [true, false, false]);
    }

    #[test]
    fn without_a_state_last_applied_everything_is_compared_and_the_rest_removed() {
        let desired = state(&[(1, &[(1, 1)]), (2, &[(2, 1)])]);
        let installed = [service(2), service(3)];
        let (changes, same) = candidates(&desired, None, installed.iter());
        assert_eq!(same, 0);
        assert_eq!(
            changes,
            [
                (service(3), None),
                (service(1), Some(set(&[(1, 1)]))),
                (service(2), Some(set(&[(2, 1)]))),
            ]
        );
    }

    #[test]
    fn after_a_state_applied_only_its_changes_are_candidates() {
        let last = state(&[(1, &[(1, 1)]), (2, &[(2, 1)]), (3, &[(3, 1)])]);
        let desired = state(&[(1, &[(1, 1)]), (2, &[(2, 1), (4, 1)]), (5, &[(5, 1)])]);
        let (changes, same) = candidates(&desired, Some(&last), [service(9)].iter());
        assert_eq!(same, 1, "service 1");
        let mut changes = changes;
        changes.sort_by_key(|(s, _)| *s);
        assert_eq!(
            changes,
            [
                (service(2), Some(set(&[(2, 1), (4, 1)]))),
                (service(3), None),
                (service(5), Some(set(&[(5, 1)]))),
            ],
            "what is installed is not asked (service 9)"
        );
    }

    #[test]
    fn duplicate_backends_are_one_with_their_weights_added() {
        let desired = state(&[(1, &[(1, 1), (1, 2), (2, 1)])]);
        let (changes, _) = candidates(&desired, None, std::iter::empty());
        assert_eq!(changes, [(service(1), Some(set(&[(1, 3), (2, 1)])))]);
    }
}
