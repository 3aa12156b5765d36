//! The snapshot as health checks make it: an unhealthy endpoint of a checked Service is
//! not ready in its EndpointSlices (a copy of the slice; every other object is the
//! snapshot's own allocation, so the planner's memo sees only those slices change).
//! A Service none of whose endpoints would be left ready is served as it is (fail
//! open). Pure.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use crate::model::{EndpointSlice, Snapshot};

use super::checks::Owner;

/// A Service's unhealthy addresses, and the policy's owner entry that said so.
type Unhealthy<'a> = (BTreeSet<IpAddr>, &'a Arc<Owner>);

/// The Service (namespace, name) of a slice.
fn service_of(s: &EndpointSlice) -> Option<(&str, &str)> {
    let name = s.metadata.labels.get("kubernetes.io/service-name")?;
    Some((s.metadata.ns(), name.as_str()))
}

/// `snapshot` with the `unhealthy` endpoints (by their checks' owner: namespace and
/// Service) not ready, if that changes it; and the owners served in full (fail open).
pub fn apply(
    snapshot: &Snapshot,
    unhealthy: &[(&Arc<Owner>, SocketAddr)],
) -> (Option<Snapshot>, Vec<Arc<Owner>>) {
    // Per Service (namespace, name): its unhealthy addresses, and the owner that said so.
    let mut by_service: BTreeMap<(&str, &str), Unhealthy> = BTreeMap::new();
    for (owner, endpoint) in unhealthy {
        by_service
            .entry((owner.namespace.as_str(), owner.service.as_str()))
            .or_insert_with(|| (BTreeSet::new(), owner))
            .0
            .insert(endpoint.ip());
    }
    // Fail open: a Service whose every ready endpoint is unhealthy keeps them all.
    let mut open = Vec::new();
    by_service.retain(|service, (bad, owner)| {
        let left = snapshot
            .endpoint_slices
            .iter()
            .filter(|s| service_of(s) == Some(*service))
            .flat_map(|s| s.endpoints.iter())
            .filter(|e| e.conditions.ready != Some(false))
            .flat_map(|e| e.addresses.iter())
            .any(|a| a.parse().is_ok_and(|ip| !bad.contains(&ip)));
        if !left {
            open.push(Arc::clone(owner));
        }
        left
    });
    let mut changed = false;
    let slices: Vec<Arc<EndpointSlice>> = snapshot
        .endpoint_slices
        .iter()
        .map(|s| {
            let Some((bad, _)) = service_of(s).and_then(|k| by_service.get(&k)) else {
                return Arc::clone(s);
            };
            let hit = |e: &crate::model::Endpoint| {
                e.conditions.ready != Some(false)
                    && e.addresses
                        .iter()
                        .any(|a| a.parse().is_ok_and(|ip| bad.contains(&ip)))
            };
            if !s.endpoints.iter().any(hit) {
                return Arc::clone(s);
            }
            changed = true;
            let mut copy = EndpointSlice::clone(s);
            for e in copy.endpoints.iter_mut().filter(|e| hit(e)) {
                e.conditions.ready = Some(false);
            }
            Arc::new(copy)
        })
        .collect();
    if !changed {
        return (None, open);
    }
    let out = Snapshot {
        endpoint_slices: slices,
        ..snapshot.clone()
    };
    (Some(out), open)
}
