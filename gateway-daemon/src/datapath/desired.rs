//! The datapath's view of the desired state (`model::DesiredState`): services with
//! their backends merged by endpoint, in parts, and what changed since the last one.

use std::net::SocketAddr;

use crate::model::{DesiredState, ServiceAddr, WeightedBackend};

/// Backends of one service keyed by endpoint (duplicates merged by adding weights).
/// A sorted vector: the first apply at 100,000 routes made one of each service, and
/// the `BTreeMap` it was took 39 MB at the daemon's peak (heaptrack).
pub(crate) type BackendSet = crate::vec_map::VecMap<SocketAddr, u16>;

impl DesiredState {
    /// Services with their backends merged by endpoint, in service order (a vector: a
    /// `BTreeMap` of 100,000 services was an estimated 10 MB more at the first apply,
    /// not measured alone).
    pub(crate) fn normalized(&self) -> Vec<(ServiceAddr, BackendSet)> {
        self.services
            .iter()
            .map(|(service, backends)| (*service, backend_set(backends)))
            .collect()
    }

    /// The services in parts of `size`, in service order, each with its backends
    /// merged by endpoint: the changes that install them on empty maps.
    pub(crate) fn parts(
        &self,
        size: usize,
    ) -> impl Iterator<Item = Vec<(ServiceAddr, Option<BackendSet>)>> + '_ {
        let mut services = self.services.iter();
        std::iter::from_fn(move || {
            let part: Vec<_> = services
                .by_ref()
                .take(size)
                .map(|(service, backends)| (*service, Some(backend_set(backends))))
                .collect();
            (!part.is_empty()).then_some(part)
        })
    }

    /// What differs from `last`: each service added or changed with its backends,
    /// each removed with `None`; and how many are the same. The maps' diff skips what
    /// they share (a state planned from `last` shares all but what changed), and
    /// backends shared with `last` are the same without comparing them.
    pub(crate) fn changes_since(
        &self,
        last: &DesiredState,
    ) -> (Vec<(ServiceAddr, Option<BackendSet>)>, usize) {
        use imbl::ordmap::DiffItem;
        let mut changes = Vec::new();
        let mut kept = self.services.len();
        for item in last.services.diff(&self.services) {
            match item {
                DiffItem::Remove(service, _) => changes.push((*service, None)),
                DiffItem::Add(service, backends)
                | DiffItem::Update {
                    new: (service, backends),
                    ..
                } => {
                    kept -= 1;
                    changes.push((*service, Some(backend_set(backends))));
                }
            }
        }
        (changes, kept)
    }
}

/// Backends by endpoint, duplicates merged by adding their weights.
fn backend_set(backends: &[WeightedBackend]) -> BackendSet {
    let mut set = BackendSet::default();
    for b in backends {
        set.push_unordered(b.endpoint, b.weight);
    }
    set.settle_with(|w, more| *w = w.saturating_add(more));
    set
}
