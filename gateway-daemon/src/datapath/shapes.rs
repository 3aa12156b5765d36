//! The shape of every map this build makes (key size, value size, entries), and what
//! becomes of an earlier run's pinned map of another shape before the object is loaded
//! over the pins: replaced when nothing it holds must outlive a restart (counters, an
//! earlier build's conntrack or Maglev tables), refused otherwise, naming what differs
//! (and the option, for a map sized by one).

use std::{fs, mem::size_of, path::Path};

use aya::maps::{MapError, MapInfo};
use gateway_common::{
    config, map_names, Affinity, AffinityKey, Backend, BackendStats, Counter, FdbKey, FloodWindow,
    Flow, FlowKey, FragKey, FragKey6, FragPorts, NextHop, ReplyIndex, Service, ServiceKey,
    ServiceStats, ADDR_FILTER_SLOTS, AFFINITY_ENTRIES, EVENTS_BYTES, FDB_ENTRIES, MAGLEV_MAX_SIZE,
    MAGLEV_POOL_ENTRIES_PER_BACKEND, SNAT_PORT_SLOTS, XMIT_SLOTS,
};

use super::{family::Addr6, DatapathError, Limit, Limits, MapProperty, Result};

impl Limits {
    /// Entries of each reply index (backend endpoint → services): twice the backends,
    /// as a change writes the roles of what is installed and what is wanted together
    /// first (`roles.rs`), which full maps whose endpoints all change make twice as
    /// many. (A disposable map: pinned with another size by an earlier build, it is
    /// replaced.)
    fn reply_index_entries(&self) -> u32 {
        self.backends.saturating_mul(2)
    }

    /// The shape of every map.
    pub(super) fn shapes(&self) -> [Shape; 31] {
        let shape = |name, key_size, value_size, max_entries| Shape {
            name,
            key_size,
            value_size,
            max_entries,
            sized_by: sized_by(name),
            disposable: DISPOSABLE.contains(&name),
        };
        let (services, backends) = (self.services, self.backends);
        let reply_index = self.reply_index_entries();
        [
            shape(
                map_names::SERVICES,
                size_of::<ServiceKey>(),
                size_of::<Service>(),
                services,
            ),
            shape(map_names::ADDRESSES, 4, 4, self.addresses),
            shape(map_names::MAGLEV, 4, 4, self.maglev_pool_entries()),
            shape(map_names::BACKENDS, 4, size_of::<Backend>(), backends),
            shape(
                map_names::CONNTRACK,
                size_of::<FlowKey>(),
                size_of::<Flow>(),
                self.flows,
            ),
            shape(
                map_names::FRAGMENTS,
                size_of::<FragKey>(),
                size_of::<FragPorts>(),
                self.fragments,
            ),
            shape(map_names::COUNTERS, 4, 8, Counter::COUNT),
            shape(
                map_names::SERVICE_STATS,
                4,
                size_of::<ServiceStats>(),
                services,
            ),
            shape(map_names::XMIT, 4, 4, XMIT_SLOTS),
            shape(map_names::PROGRAM_ID, 4, 4, 1),
            shape(map_names::SNAT_SOURCES, 4, 4, backends),
            shape(map_names::SNAT_PORTS, 4, 4, SNAT_PORT_SLOTS),
            shape(map_names::CONFIG, 4, 4, config::SLOTS),
            shape(map_names::FLOOD, 4, size_of::<FloodWindow>(), 1),
            shape(
                map_names::REPLY_INDEX,
                size_of::<ServiceKey>(),
                size_of::<ReplyIndex>(),
                reply_index,
            ),
            shape(map_names::ADDR_FILTER, 4, 4, ADDR_FILTER_SLOTS),
            shape(map_names::BACKEND_HOPS, 4, size_of::<NextHop>(), backends),
            shape(map_names::PROGRAMS, 4, 4, 3),
            shape(map_names::TC_PROGRAMS, 4, 4, 3),
            shape(
                map_names::SERVICES6,
                size_of::<ServiceKey<Addr6>>(),
                size_of::<Service>(),
                services,
            ),
            shape(map_names::ADDRESSES6, 16, 4, self.addresses),
            shape(
                map_names::CONNTRACK6,
                size_of::<FlowKey<Addr6>>(),
                size_of::<Flow<Addr6>>(),
                self.flows,
            ),
            shape(
                map_names::REPLY_INDEX6,
                size_of::<ServiceKey<Addr6>>(),
                size_of::<ReplyIndex<Addr6>>(),
                reply_index,
            ),
            shape(map_names::BACKENDS6, 4, 16, backends),
            shape(map_names::SNAT_SOURCES6, 4, 16, backends),
            shape(
                map_names::FRAGMENTS6,
                size_of::<FragKey6>(),
                size_of::<FragPorts>(),
                self.fragments,
            ),
            shape(
                map_names::BACKEND_STATS,
                4,
                size_of::<BackendStats>(),
                backends,
            ),
            shape(
                map_names::AFFINITY,
                size_of::<AffinityKey>(),
                size_of::<Affinity>(),
                AFFINITY_ENTRIES,
            ),
            shape(
                map_names::AFFINITY6,
                size_of::<AffinityKey<Addr6>>(),
                size_of::<Affinity>(),
                AFFINITY_ENTRIES,
            ),
            shape(map_names::EVENTS, 0, 0, EVENTS_BYTES),
            shape(map_names::FDB, size_of::<FdbKey>(), 4, FDB_ENTRIES),
        ]
    }
}

/// The limit the entries of map `name` follow, if any.
fn sized_by(name: &str) -> Option<SizedBy> {
    let services = [map_names::SERVICES, map_names::SERVICES6];
    let backends = [
        map_names::BACKENDS,
        map_names::BACKENDS6,
        map_names::SNAT_SOURCES,
        map_names::SNAT_SOURCES6,
        map_names::BACKEND_STATS,
    ];
    if services.contains(&name) {
        Some(SizedBy::of(Limit::Services))
    } else if backends.contains(&name) {
        Some(SizedBy::of(Limit::Backends))
    } else if name == map_names::MAGLEV {
        Some(SizedBy {
            limit: Limit::Backends,
            per: MAGLEV_POOL_ENTRIES_PER_BACKEND,
            extra: MAGLEV_MAX_SIZE,
        })
    } else {
        None
    }
}

/// The maps that hold nothing a restart must keep (`Shape::disposable`).
const DISPOSABLE: [&str; 16] = [
    map_names::COUNTERS,
    map_names::SERVICE_STATS,
    map_names::PROGRAM_ID,
    map_names::CONFIG,
    map_names::FLOOD,
    map_names::REPLY_INDEX,
    map_names::ADDR_FILTER,
    map_names::BACKEND_HOPS,
    map_names::PROGRAMS,
    map_names::TC_PROGRAMS,
    map_names::REPLY_INDEX6,
    // Clients' backends: lost, a client's next flow goes where Maglev
    // says by its address.
    map_names::AFFINITY,
    map_names::AFFINITY6,
    map_names::BACKEND_STATS,
    map_names::EVENTS,
    // The daemon reads the bridges' forwarding databases again.
    map_names::FDB,
];

/// What a map must look like: an earlier run's pinned map is adopted only if it matches.
pub(super) struct Shape {
    pub(super) name: &'static str,
    key_size: usize,
    value_size: usize,
    pub(super) max_entries: u32,
    /// The limit its entries follow (`--max-services`, `--max-backends`).
    sized_by: Option<SizedBy>,
    /// Replaced rather than refused when an earlier run's pin has another shape.
    disposable: bool,
}

/// How a map's entries follow a limit: `per` entries per unit of it, and `extra`.
#[derive(Clone, Copy)]
struct SizedBy {
    limit: Limit,
    per: u32,
    extra: u32,
}

impl SizedBy {
    fn of(limit: Limit) -> Self {
        SizedBy {
            limit,
            per: 1,
            extra: 0,
        }
    }

    /// The limit a map of `entries` entries was made for.
    fn limit_of(self, entries: u32) -> u32 {
        entries.saturating_sub(self.extra) / self.per
    }
}

/// The maps whose values changed meaning with the Maglev pool: the Maglev map went from
/// one 1021-entry table per entry to one backend id per entry (its value size tells an
/// earlier build's), and a service's third word from its number of backends to its
/// table's size (the same size: replaced with the tables).
const POOL_LAYOUT: [&str; 3] = [map_names::SERVICES, map_names::SERVICES6, map_names::MAGLEV];

/// Leaves in `pin_dir` only maps of these `shapes` (or none): an earlier run's pin of
/// another shape is replaced or refused, map by map in the order of `shapes`.
pub(super) fn check_pins(pin_dir: &Path, shapes: &[Shape]) -> Result<()> {
    replace_pre_pool_maps(pin_dir, shapes);
    for shape in shapes {
        let path = pin_dir.join(shape.name);
        replace_disposable(&path, pin_dir, shape);
        replace_older_conntrack(&path, pin_dir, shape)?;
        refuse_other_limit(&path, pin_dir, shape)?;
        check_pinned(&path, pin_dir, shape).map_err(|e| {
            e.unwrap_or_else(|source| DatapathError::Map {
                name: shape.name,
                source,
            })
        })?;
    }
    Ok(())
}

/// Removes the pin of a disposable map of another shape.
fn replace_disposable(path: &Path, pin_dir: &Path, shape: &Shape) {
    // Counters hold nothing a restart must keep: a build that counts more (or
    // differently) replaces them instead of refusing to start.
    if shape.disposable && check_pinned(path, pin_dir, shape).is_err() {
        tracing::info!(
            map = shape.name,
            "pinned counters have another shape; replacing them"
        );
        let _ = fs::remove_file(path);
    }
}

/// Removes the pin of a conntrack of another entry layout; refuses one of another size.
fn replace_older_conntrack(path: &Path, pin_dir: &Path, shape: &Shape) -> Result<()> {
    // The conntrack of a build whose flow entries had another layout (an
    // upgrade): its entries cannot be read by this program. Replaced rather than
    // refused, so an upgrade starts; established flows are balanced again by
    // Maglev (to the same backend while the backends are unchanged) on their
    // next forward packet. Another size is refused: a restart with the same
    // size keeps the flows, resizing (losing them) is the operator's decision.
    if [map_names::CONNTRACK, map_names::CONNTRACK6].contains(&shape.name) {
        if let Err(Ok(DatapathError::Incompatible {
            what,
            found,
            wanted,
            ..
        })) = check_pinned(path, pin_dir, shape)
        {
            if what == MapProperty::MaxEntries {
                return Err(DatapathError::ConntrackSize {
                    path: path.to_path_buf(),
                    found,
                    wanted,
                });
            }
            tracing::warn!(
                map = shape.name,
                what = %what,
                found,
                wanted,
                "the pinned conntrack has another entry layout (an earlier \
                 build); replacing it: established flows are balanced again"
            );
            let _ = fs::remove_file(path);
        }
    }
    Ok(())
}

/// Refuses the pin of a map sized by a limit that was pinned with another.
fn refuse_other_limit(path: &Path, pin_dir: &Path, shape: &Shape) -> Result<()> {
    // A map sized by --max-services or --max-backends: refused naming the
    // option and the size it was pinned with.
    if let (
        Some(sized_by),
        Err(Ok(DatapathError::Incompatible {
            what: MapProperty::MaxEntries,
            found,
            ..
        })),
    ) = (shape.sized_by, check_pinned(path, pin_dir, shape))
    {
        return Err(DatapathError::LimitSize {
            path: path.to_path_buf(),
            what: sized_by.limit,
            // Only maps sized by an option are `sized_by`.
            option: sized_by.limit.option().unwrap_or("--max-services"),
            found: sized_by.limit_of(found),
            wanted: sized_by.limit_of(shape.max_entries),
            dir: pin_dir.to_path_buf(),
        });
    }
    Ok(())
}

/// An upgrade from a build of one 1021-entry Maglev table per service: its service maps
/// and tables cannot be read by this program. They are replaced together rather than
/// refused, so the upgrade starts; the services are written afresh by the first apply
/// (new ids, tables sized by their backends). Until then packets to them pass untouched,
/// and established flows, whose entries name the old ids, are balanced again by the new
/// tables on their next forward packet (`ct_stale_service`): a flow to a service of
/// several backends may move to another (its TCP connection breaks).
fn replace_pre_pool_maps(pin_dir: &Path, shapes: &[Shape]) {
    let older = shapes
        .iter()
        .filter(|s| POOL_LAYOUT.contains(&s.name))
        .find_map(|s| match check_pinned(&pin_dir.join(s.name), pin_dir, s) {
            Err(Ok(DatapathError::Incompatible {
                what: MapProperty::ValueSize,
                found,
                wanted,
                ..
            })) => Some((s.name, found, wanted)),
            _ => None,
        });
    let Some((map, found, wanted)) = older else {
        return;
    };
    tracing::warn!(
        map,
        found,
        wanted,
        "the pinned service maps and Maglev tables have another layout (a build before \
         tables sized by backends); replacing them: services are written afresh, and \
         established flows are balanced again by the new tables (a flow to a service of \
         several backends may move to another backend)"
    );
    for name in POOL_LAYOUT {
        let _ = fs::remove_file(pin_dir.join(name));
    }
}

/// Compares a pinned map's shape with this build's. `Ok(())` when absent or equal.
fn check_pinned(
    path: &Path,
    dir: &Path,
    shape: &Shape,
) -> std::result::Result<(), std::result::Result<DatapathError, MapError>> {
    if !path.exists() {
        return Ok(());
    }
    let info = MapInfo::from_pin(path).map_err(Err)?;
    let checks = [
        (MapProperty::KeySize, info.key_size(), shape.key_size as u32),
        (
            MapProperty::ValueSize,
            info.value_size(),
            shape.value_size as u32,
        ),
        (
            MapProperty::MaxEntries,
            info.max_entries(),
            shape.max_entries,
        ),
    ];
    for (what, found, wanted) in checks {
        if found != wanted {
            return Err(Ok(DatapathError::Incompatible {
                path: path.to_path_buf(),
                what,
                found,
                wanted,
                dir: dir.to_path_buf(),
            }));
        }
    }
    Ok(())
}

/// Maps an older build's object may lack (`check_object`): only the xmit thread of a
/// running daemon opens them, never the loader, so an A/B benchmark of an object from
/// before they existed loads.
const MAY_LACK: [&str; 1] = [map_names::FDB];

/// Checks that the maps of `object` (an ELF object of the gateway program) have these
/// `shapes`' key and value sizes, map by map in their order: the first that differs or
/// is missing (but for `MAY_LACK`) is named.
pub(super) fn check_object(object: &[u8], shapes: &[Shape]) -> Result<()> {
    let parsed = aya_obj::Object::parse(object)
        .map_err(|e| DatapathError::Load(aya::EbpfError::ParseError(e)))?;
    for shape in shapes {
        let Some(map) = parsed.maps.get(shape.name) else {
            if MAY_LACK.contains(&shape.name) {
                continue;
            }
            return Err(DatapathError::ObjectMapMissing { name: shape.name });
        };
        let checks = [
            (MapProperty::KeySize, map.key_size(), shape.key_size as u32),
            (
                MapProperty::ValueSize,
                map.value_size(),
                shape.value_size as u32,
            ),
        ];
        for (what, found, wanted) in checks {
            if found != wanted {
                return Err(DatapathError::ObjectMap {
                    name: shape.name,
                    what,
                    found,
                    wanted,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod object_tests {
    use super::*;

    #[test]
    fn the_embedded_object_passes_and_a_map_of_another_layout_is_named() {
        let object = super::super::load::OBJECT;
        let mut shapes = Limits::default().shapes();
        assert!(check_object(object, &shapes).is_ok());
        let conntrack = shapes
            .iter_mut()
            .find(|s| s.name == map_names::CONNTRACK)
            .expect("a conntrack shape");
        conntrack.value_size += 8;
        match check_object(object, &shapes) {
            Err(DatapathError::ObjectMap {
                name,
                what: MapProperty::ValueSize,
                ..
            }) => assert_eq!(name, map_names::CONNTRACK),
            other => panic!("expected the conntrack's value size, got {other:?}"),
        }
    }
}
