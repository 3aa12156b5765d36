//! Snapshots of parsed files: copied whole, or kept and patched file by file.

use std::sync::Arc;

use super::FileObjects;
use crate::model::{Object, Snapshot};

/// The snapshot of parsed files, in order.
pub fn snapshot<'a>(files: impl IntoIterator<Item = &'a FileObjects>) -> Snapshot {
    let mut s = Snapshot::default();
    for f in files {
        for o in &f.objects {
            s.push(o.clone());
        }
    }
    s
}

/// How many objects of each kind (in the order of `Snapshot`'s fields) a run of files
/// holds: where a file's objects lie in a snapshot of files in order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts([usize; 10]);

impl std::ops::Add for Counts {
    type Output = Counts;

    fn add(mut self, other: Counts) -> Counts {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
        self
    }
}

impl std::ops::Sub for Counts {
    type Output = Counts;

    fn sub(mut self, other: Counts) -> Counts {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a -= b;
        }
        self
    }
}

impl Counts {
    /// How many objects of each kind `s` holds.
    pub fn of(s: &Snapshot) -> Counts {
        // Destructured: a new kind of object is a compile error here.
        let Snapshot {
            gateway_classes,
            gateways,
            routes,
            reference_grants,
            services,
            endpoint_slices,
            namespaces,
            gateway_configs,
            backend_health_policies,
            route_traffic_policies,
        } = s;
        Counts([
            gateway_classes.len(),
            gateways.len(),
            routes.len(),
            reference_grants.len(),
            services.len(),
            endpoint_slices.len(),
            namespaces.len(),
            gateway_configs.len(),
            backend_health_policies.len(),
            route_traffic_policies.len(),
        ])
    }
}

/// Replaces, in `s`, the objects of one file (`old` of each kind, from `at`) by `new`;
/// returns the counts of `new`. A change of one file moves pointers in the snapshot's
/// lists, and touches no other file's objects (taking 100,000 routes out of their
/// files and putting them back was a quarter of a change's cost).
pub fn splice(s: &mut Snapshot, at: Counts, old: Counts, new: &[Object]) -> Counts {
    let mut part = Snapshot::default();
    for o in new {
        part.push(o.clone());
    }
    fn put<T>(
        list: &mut Vec<Arc<T>>,
        kind: usize,
        at: Counts,
        old: Counts,
        new: Vec<Arc<T>>,
    ) -> usize {
        let (start, len) = (at.0[kind], new.len());
        list.splice(start..start + old.0[kind], new);
        len
    }
    // Destructured: a new kind of object is a compile error here.
    let Snapshot {
        gateway_classes,
        gateways,
        routes,
        reference_grants,
        services,
        endpoint_slices,
        namespaces,
        gateway_configs,
        backend_health_policies,
        route_traffic_policies,
    } = part;
    Counts([
        put(&mut s.gateway_classes, 0, at, old, gateway_classes),
        put(&mut s.gateways, 1, at, old, gateways),
        put(&mut s.routes, 2, at, old, routes),
        put(&mut s.reference_grants, 3, at, old, reference_grants),
        put(&mut s.services, 4, at, old, services),
        put(&mut s.endpoint_slices, 5, at, old, endpoint_slices),
        put(&mut s.namespaces, 6, at, old, namespaces),
        put(&mut s.gateway_configs, 7, at, old, gateway_configs),
        put(
            &mut s.backend_health_policies,
            8,
            at,
            old,
            backend_health_policies,
        ),
        put(
            &mut s.route_traffic_policies,
            9,
            at,
            old,
            route_traffic_policies,
        ),
    ])
}
