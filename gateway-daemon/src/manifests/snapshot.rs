//! Snapshots of parsed files: copied, or taken from the files and given back.

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

/// Where each object of a taken snapshot came from: per file, the kinds in order.
#[derive(Debug, Default)]
pub struct Layout(Vec<Vec<u8>>);

fn kind_of(o: &Object) -> u8 {
    match o {
        Object::GatewayClass(_) => 0,
        Object::Gateway(_) => 1,
        Object::Route(_) => 2,
        Object::ReferenceGrant(_) => 3,
        Object::Service(_) => 4,
        Object::EndpointSlice(_) => 5,
        Object::Namespace(_) => 6,
        Object::GatewayConfig(_) => 7,
    }
}

/// Moves the objects of `files` into one snapshot, copying none of them; `give_back`
/// returns them to the same files (in the same order), changed or not.
pub fn take_snapshot<'a>(
    files: impl IntoIterator<Item = &'a mut FileObjects>,
) -> (Snapshot, Layout) {
    let mut s = Snapshot::default();
    let mut layout = Layout::default();
    for f in files {
        layout.0.push(f.objects.iter().map(kind_of).collect());
        for o in f.objects.drain(..) {
            s.push(o);
        }
    }
    (s, layout)
}

/// Gives the objects of a snapshot made by `take_snapshot` back to their files.
pub fn give_back<'a>(
    files: impl IntoIterator<Item = &'a mut FileObjects>,
    snapshot: Snapshot,
    layout: Layout,
) {
    let Snapshot {
        gateway_classes,
        gateways,
        routes,
        reference_grants,
        services,
        endpoint_slices,
        namespaces,
        gateway_configs,
    } = snapshot;
    let mut gateway_classes = gateway_classes.into_iter();
    let mut gateways = gateways.into_iter();
    let mut routes = routes.into_iter();
    let mut reference_grants = reference_grants.into_iter();
    let mut services = services.into_iter();
    let mut endpoint_slices = endpoint_slices.into_iter();
    let mut namespaces = namespaces.into_iter();
    let mut gateway_configs = gateway_configs.into_iter();
    for (f, kinds) in files.into_iter().zip(layout.0) {
        f.objects = kinds
            .into_iter()
            .filter_map(|k| match k {
                0 => gateway_classes.next().map(Object::GatewayClass),
                1 => gateways.next().map(Object::Gateway),
                2 => routes.next().map(Object::Route),
                3 => reference_grants.next().map(Object::ReferenceGrant),
                4 => services.next().map(Object::Service),
                5 => endpoint_slices.next().map(Object::EndpointSlice),
                6 => namespaces.next().map(Object::Namespace),
                _ => gateway_configs.next().map(Object::GatewayConfig),
            })
            .collect();
    }
}
