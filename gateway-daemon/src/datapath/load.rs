//! Loading the object and adopting what an earlier run pinned: map shapes checked
//! against this build's, the userspace view rebuilt from the maps, bpffs and tracefs
//! mounted when the host has none.

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, HashMap, MapData, MapError, MapInfo},
    programs::ProgramError,
    Ebpf, EbpfLoader,
};
use gateway_common::{
    map_names, Backend, Counter, Flow, FlowKey, FragKey, FragPorts, ReplyIndex, Service,
    ServiceKey, ServiceStats, BACKEND_LIVE, MAGLEV_MAX_SIZE, MAGLEV_POOL_ENTRIES_PER_BACKEND,
};

use super::{
    family::{endpoint_of, service_of, Addr6, ByFamily, MapAddr},
    links, map_err,
    pool::{Region, TablePool},
    xdp, AttachMode, Config, Datapath, DatapathError, IdPool, Installed, InstalledBackends, Limit,
    Limits, MapProperty, Result, ServiceAddr, ServiceIds, FLOOR_PROGRAM, MONITOR_PROGRAM, PROGRAM,
    PROGRAM_ICMP6, PROGRAM_V6, REDIRECT_ERR_PROGRAM, TC_MONITOR_PROGRAM, TC_PROGRAM,
    TC_PROGRAM_ICMP6, TC_PROGRAM_V6,
};
use crate::sys;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gateway"));

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
    fn shapes(&self) -> [Shape; 30] {
        use std::mem::size_of;
        let services = [map_names::SERVICES, map_names::SERVICES6];
        let backends = [
            map_names::BACKENDS,
            map_names::BACKENDS6,
            map_names::SNAT_SOURCES,
            map_names::SNAT_SOURCES6,
            map_names::BACKEND_STATS,
        ];
        let shape = |name, key_size, value_size, max_entries| Shape {
            name,
            key_size,
            value_size,
            max_entries,
            sized_by: if services.contains(&name) {
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
            },
            disposable: [
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
            ]
            .contains(&name),
        };
        [
            shape(
                map_names::SERVICES,
                size_of::<ServiceKey>(),
                size_of::<Service>(),
                self.services,
            ),
            shape(map_names::ADDRESSES, 4, 4, self.addresses),
            shape(map_names::MAGLEV, 4, 4, self.maglev_pool_entries()),
            shape(map_names::BACKENDS, 4, size_of::<Backend>(), self.backends),
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
                self.services,
            ),
            shape(map_names::XMIT, 4, 4, gateway_common::XMIT_SLOTS),
            shape(map_names::PROGRAM_ID, 4, 4, 1),
            shape(map_names::SNAT_SOURCES, 4, 4, self.backends),
            shape(map_names::SNAT_PORTS, 4, 4, gateway_common::SNAT_PORT_SLOTS),
            shape(map_names::CONFIG, 4, 4, gateway_common::config::SLOTS),
            shape(
                map_names::FLOOD,
                4,
                size_of::<gateway_common::FloodWindow>(),
                1,
            ),
            shape(
                map_names::REPLY_INDEX,
                size_of::<ServiceKey>(),
                size_of::<gateway_common::ReplyIndex>(),
                self.reply_index_entries(),
            ),
            shape(
                map_names::ADDR_FILTER,
                4,
                4,
                gateway_common::ADDR_FILTER_SLOTS,
            ),
            shape(
                map_names::BACKEND_HOPS,
                4,
                size_of::<gateway_common::NextHop>(),
                self.backends,
            ),
            shape(map_names::PROGRAMS, 4, 4, 3),
            shape(map_names::TC_PROGRAMS, 4, 4, 3),
            shape(
                map_names::SERVICES6,
                size_of::<ServiceKey<Addr6>>(),
                size_of::<Service>(),
                self.services,
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
                self.reply_index_entries(),
            ),
            shape(map_names::BACKENDS6, 4, 16, self.backends),
            shape(map_names::SNAT_SOURCES6, 4, 16, self.backends),
            shape(
                map_names::FRAGMENTS6,
                size_of::<gateway_common::FragKey6>(),
                size_of::<FragPorts>(),
                self.fragments,
            ),
            shape(
                map_names::BACKEND_STATS,
                4,
                size_of::<gateway_common::BackendStats>(),
                self.backends,
            ),
            shape(
                map_names::AFFINITY,
                size_of::<gateway_common::AffinityKey>(),
                size_of::<gateway_common::Affinity>(),
                gateway_common::AFFINITY_ENTRIES,
            ),
            shape(
                map_names::AFFINITY6,
                size_of::<gateway_common::AffinityKey<Addr6>>(),
                size_of::<gateway_common::Affinity>(),
                gateway_common::AFFINITY_ENTRIES,
            ),
            shape(map_names::EVENTS, 0, 0, gateway_common::EVENTS_BYTES),
        ]
    }
}

/// What a map must look like: an earlier run's pinned map is adopted only if it matches.
struct Shape {
    name: &'static str,
    key_size: usize,
    value_size: usize,
    max_entries: u32,
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

impl Datapath {
    /// Loads the program, creating the maps or adopting those an earlier run pinned.
    pub fn load(config: &Config) -> Result<Self> {
        ensure_bpffs(&config.pin_dir)?;
        // A start that fails leaves no pins of its own behind (an earlier run's stay).
        let existed: Vec<bool> = map_names::ALL
            .iter()
            .map(|n| config.pin_dir.join(n).exists())
            .collect();
        let dir_existed = config.pin_dir.exists();
        let loaded = Self::load_pinned(config);
        if loaded.is_err() {
            for (name, existed) in map_names::ALL.iter().zip(existed) {
                if !existed {
                    let _ = fs::remove_file(config.pin_dir.join(name));
                }
            }
            if !dir_existed {
                let _ = fs::remove_dir_all(&config.pin_dir);
            }
        }
        loaded
    }

    fn load_pinned(config: &Config) -> Result<Self> {
        let Config { pin_dir, limits } = config;
        for (what, wanted, max) in [
            ("services", limits.services, Limits::MAX_SERVICES),
            ("backends", limits.backends, Limits::MAX_BACKENDS),
            ("conntrack entries", limits.flows, Limits::MAX_FLOWS),
        ] {
            if wanted > max {
                return Err(DatapathError::Limit { what, wanted, max });
            }
        }
        fs::create_dir_all(pin_dir.join("links")).map_err(|source| DatapathError::PinDir {
            path: pin_dir.clone(),
            source,
        })?;
        let pin_lock = super::pins::PinDirLock::take(pin_dir)?;

        let shapes = limits.shapes();
        let paths: Vec<PathBuf> = shapes.iter().map(|s| pin_dir.join(s.name)).collect();
        replace_pre_pool_maps(pin_dir, &shapes);
        for (shape, path) in shapes.iter().zip(&paths) {
            // Counters hold nothing a restart must keep: a build that counts more (or
            // differently) replaces them instead of refusing to start.
            if shape.disposable && check_pinned(path, pin_dir, shape).is_err() {
                tracing::info!(
                    map = shape.name,
                    "pinned counters have another shape; replacing them"
                );
                let _ = fs::remove_file(path);
            }
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
                            path: path.clone(),
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
                    path: path.clone(),
                    what: sized_by.limit.name(),
                    // Only maps sized by an option are `sized_by`.
                    option: sized_by.limit.option().unwrap_or("--max-services"),
                    found: sized_by.limit_of(found),
                    wanted: sized_by.limit_of(shape.max_entries),
                    dir: pin_dir.clone(),
                });
            }
            check_pinned(path, pin_dir, shape).map_err(|e| {
                e.unwrap_or_else(|source| DatapathError::Map {
                    name: shape.name,
                    source,
                })
            })?;
        }
        let mut loader = EbpfLoader::new();
        for (shape, path) in shapes.iter().zip(&paths) {
            loader.map_max_entries(shape.name, shape.max_entries);
            loader.map_pin_path(shape.name, path.as_path());
        }
        let mut ebpf = loader.load(OBJECT).map_err(DatapathError::Load)?;
        for name in [
            PROGRAM,
            PROGRAM_V6,
            PROGRAM_ICMP6,
            MONITOR_PROGRAM,
            FLOOR_PROGRAM,
        ] {
            xdp(&mut ebpf, name)?
                .load()
                .map_err(|source| DatapathError::Program { name, source })?;
        }
        for name in [TC_PROGRAM_V6, TC_PROGRAM_ICMP6, TC_MONITOR_PROGRAM] {
            links::classifier(&mut ebpf, name)?
                .load()
                .map_err(|source| DatapathError::Program { name, source })?;
        }
        enter_v6(&mut ebpf)?;
        let tc = links::tc_program(&mut ebpf)?;
        tc.load().map_err(|source| DatapathError::Program {
            name: TC_PROGRAM,
            source,
        })?;

        fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T>
        where
            T: TryFrom<aya::maps::Map, Error = MapError>,
        {
            let map = ebpf.take_map(name).ok_or(DatapathError::Map {
                name,
                source: MapError::InvalidName {
                    name: name.to_string(),
                },
            })?;
            T::try_from(map).map_err(map_err(name))
        }
        let mut dp = Datapath {
            services: ByFamily {
                v4: take(&mut ebpf, map_names::SERVICES)?,
                v6: take(&mut ebpf, map_names::SERVICES6)?,
            },
            addresses: ByFamily {
                v4: take(&mut ebpf, map_names::ADDRESSES)?,
                v6: take(&mut ebpf, map_names::ADDRESSES6)?,
            },
            maglev: take(&mut ebpf, map_names::MAGLEV)?,
            backends: take(&mut ebpf, map_names::BACKENDS)?,
            backends6: take(&mut ebpf, map_names::BACKENDS6)?,
            backend_hops: take(&mut ebpf, map_names::BACKEND_HOPS)?,
            conntrack: ByFamily {
                v4: take(&mut ebpf, map_names::CONNTRACK)?,
                v6: take(&mut ebpf, map_names::CONNTRACK6)?,
            },
            counters: take(&mut ebpf, map_names::COUNTERS)?,
            service_stats: take(&mut ebpf, map_names::SERVICE_STATS)?,
            backend_stats: take(&mut ebpf, map_names::BACKEND_STATS)?,
            snat: super::snat::Snat::new(
                ByFamily {
                    v4: take(&mut ebpf, map_names::SNAT_SOURCES)?,
                    v6: take(&mut ebpf, map_names::SNAT_SOURCES6)?,
                },
                take(&mut ebpf, map_names::SNAT_PORTS)?,
            ),
            roles: super::roles::RoleMaps::new(
                ByFamily {
                    v4: take(&mut ebpf, map_names::REPLY_INDEX)?,
                    v6: take(&mut ebpf, map_names::REPLY_INDEX6)?,
                },
                take(&mut ebpf, map_names::ADDR_FILTER)?,
            ),
            ebpf,
            pin_dir: pin_dir.clone(),
            limits: *limits,
            installed: BTreeMap::new(),
            keys: Default::default(),
            applied: None,
            applied_backends: 0,
            held_back: Vec::new(),
            publication: Default::default(),
            reserved: Default::default(),
            links: BTreeMap::new(),
            attach_mode: AttachMode::Auto,
            _pin_lock: pin_lock,
            service_ids: ServiceIds::new(limits.services),
            tables: TablePool::new(limits.maglev_pool_entries()),
            backend_ids: IdPool::new("backends", limits.backends),
            retirees: Default::default(),
            traffic: Default::default(),
        };
        dp.adopt()?;
        dp.keys = super::keys::Keys::of(dp.installed.keys());
        dp.reserved = dp.installed_ports();
        dp.count_redirect_errors();
        Ok(dp)
    }

    /// Rebuilds the userspace view of installed services from the (possibly adopted) maps.
    fn adopt(&mut self) -> Result<()> {
        let mut by_id = StdHashMap::new();
        let services = adopt_services(&self.services.v4, map_names::SERVICES)?
            .into_iter()
            .chain(adopt_services(&self.services.v6, map_names::SERVICES6)?);
        for (key, svc) in services {
            by_id.insert(svc.id, key);
            // The table stays where it is (its flows keep their backends, nothing is
            // rewritten); one that cannot be kept is written afresh by the next apply.
            let table = Region {
                start: Service::table_start(svc.table),
                len: Service::table_size(svc.table),
            };
            let table_lost = table.len != 0 && !self.tables.mark(table);
            if table_lost {
                tracing::warn!(
                    service = %key,
                    start = table.start,
                    size = table.len,
                    "an adopted service's Maglev table overlaps another or lies outside \
                     the pool; it is written afresh"
                );
            }
            self.installed.insert(
                key,
                Installed {
                    id: svc.id,
                    table,
                    table_lost,
                    snat: svc.flags & gateway_common::SERVICE_SNAT != 0,
                    backends: InstalledBackends::default(),
                },
            );
            // Its session affinity stays in force until the first apply says otherwise.
            let affinity = Service::affinity_secs(svc.flags);
            if affinity != 0 {
                let adopted = super::FlowSettings {
                    idle_secs: None,
                    affinity_secs: Some(affinity),
                };
                self.traffic.insert(key, adopted);
            }
            self.service_ids.mark(svc.id);
        }
        let mut orphans = Vec::new();
        let mut adopted6 = std::collections::HashSet::new();
        for (id, item) in self.backends.iter().enumerate() {
            let b = item.map_err(map_err(map_names::BACKENDS))?;
            if b.flags & BACKEND_LIVE == 0 {
                continue;
            }
            let id = id as u32;
            match by_id
                .get(&b.service)
                .and_then(|key| Some((*key, self.installed.get_mut(key)?)))
            {
                Some((key, svc)) => {
                    let endpoint = match key.addr {
                        std::net::IpAddr::V4(_) => endpoint_of(b.addr, b.port),
                        std::net::IpAddr::V6(_) => endpoint_of(
                            self.backends6
                                .get(&id, 0)
                                .map_err(map_err(map_names::BACKENDS6))?,
                            b.port,
                        ),
                    };
                    if key.addr.is_ipv6() {
                        adopted6.insert(id);
                    }
                    svc.backends.push_unordered(endpoint, (id, b.weight));
                    self.backend_ids.mark(id);
                }
                // A backend left behind by a run that died mid-update.
                None => orphans.push(id),
            }
        }
        for svc in self.installed.values_mut() {
            svc.backends.settle();
        }
        for id in orphans {
            self.clear_backend(id)?;
        }
        // Earlier builds left the address of an IPv6 backend that went in `BACKENDS6`,
        // where it named the id's next backend (see `write_backend`).
        let mut stale6 = Vec::new();
        for (id, item) in self.backends6.iter().enumerate() {
            let addr = item.map_err(map_err(map_names::BACKENDS6))?;
            if addr != Addr6::default() && !adopted6.contains(&(id as u32)) {
                stale6.push(id as u32);
            }
        }
        for id in stale6 {
            self.backends6
                .set(id, Addr6::default(), 0)
                .map_err(map_err(map_names::BACKENDS6))?;
        }
        // Conntrack entries may still name services removed before this start: the
        // ids handed out from now on must differ from theirs.
        let mut seen = std::collections::HashSet::new();
        self.each_flow(|_, f| {
            seen.insert(f.service);
        })?;
        super::traffic::each_flow_in(&self.conntrack.v6, |_, f| {
            seen.insert(f.service);
        })?;
        for id in seen {
            self.service_ids.saw(id);
        }
        self.write_adopted_roles()
    }

    /// Attaches the tracepoint that counts redirects the kernel refused (`redirect_error`)
    /// to this daemon's lifetime. Best effort: without tracefs or perf events the
    /// counter stays at zero, which is logged.
    fn count_redirect_errors(&mut self) {
        let result = (|| -> std::result::Result<(), String> {
            let id = xdp(&mut self.ebpf, PROGRAM)
                .map_err(|e| e.to_string())?
                .info()
                .map_err(|e| e.to_string())?
                .id();
            let mut ids: Array<&mut MapData, u32> = Array::try_from(
                self.ebpf
                    .map_mut(map_names::PROGRAM_ID)
                    .ok_or("no program id map")?,
            )
            .map_err(|e| e.to_string())?;
            ids.set(0, id, 0).map_err(|e| e.to_string())?;
            let tp: &mut aya::programs::TracePoint = self
                .ebpf
                .program_mut(REDIRECT_ERR_PROGRAM)
                .ok_or("no tracepoint program")?
                .try_into()
                .map_err(|e: ProgramError| e.to_string())?;
            tp.load().map_err(|e| e.to_string())?;
            ensure_tracefs().map_err(|e| format!("mounting tracefs: {e}"))?;
            tp.attach("xdp", "xdp_redirect_err")
                .map_err(|e| e.to_string())?;
            Ok(())
        })();
        if let Err(e) = result {
            tracing::warn!(
                error = e,
                "redirect errors the kernel reports will not be counted (redirect_error)"
            );
        }
    }
}

/// Puts the IPv6 programs in their tail-call slots: `berth_v6` (slot 0) and
/// `berth_icmp6` (slot 1) of `map_names::PROGRAMS` (and `berth_monitor` in slot 2), the TC program's IPv6 half and its
/// ICMPv6 part in slots 0 and 1 of `map_names::TC_PROGRAMS` (and `berth_tc_monitor` in
/// slot 2); the IPv4 programs enter them for IPv6 frames (an empty
/// slot passes them, counted `ipv6_no_program`). A pinned array's slots are
/// overwritten: from now on this build's programs run.
fn enter_v6(ebpf: &mut Ebpf) -> Result<()> {
    let clone = |name, fd: std::result::Result<&aya::programs::ProgramFd, ProgramError>| {
        fd.and_then(|fd| fd.try_clone().map_err(ProgramError::IOError))
            .map_err(program_err(name))
    };
    let v6 = clone(PROGRAM_V6, xdp(ebpf, PROGRAM_V6)?.fd())?;
    let icmp6 = clone(PROGRAM_ICMP6, xdp(ebpf, PROGRAM_ICMP6)?.fd())?;
    let monitor = clone(MONITOR_PROGRAM, xdp(ebpf, MONITOR_PROGRAM)?.fd())?;
    let tc_v6 = clone(TC_PROGRAM_V6, links::classifier(ebpf, TC_PROGRAM_V6)?.fd())?;
    let tc_icmp6 = clone(
        TC_PROGRAM_ICMP6,
        links::classifier(ebpf, TC_PROGRAM_ICMP6)?.fd(),
    )?;
    let tc_monitor = clone(
        TC_MONITOR_PROGRAM,
        links::classifier(ebpf, TC_MONITOR_PROGRAM)?.fd(),
    )?;
    for (name, slot, fd) in [
        (map_names::PROGRAMS, 0, &v6),
        (map_names::PROGRAMS, 1, &icmp6),
        (map_names::PROGRAMS, 2, &monitor),
        (map_names::TC_PROGRAMS, 0, &tc_v6),
        (map_names::TC_PROGRAMS, 1, &tc_icmp6),
        (map_names::TC_PROGRAMS, 2, &tc_monitor),
    ] {
        let map = ebpf.map_mut(name).ok_or(DatapathError::Map {
            name,
            source: MapError::InvalidName {
                name: name.to_string(),
            },
        })?;
        let mut programs: aya::maps::ProgramArray<&mut MapData> =
            aya::maps::ProgramArray::try_from(map).map_err(map_err(name))?;
        programs.set(slot, fd, 0).map_err(map_err(name))?;
    }
    Ok(())
}

/// A program error of program `name`.
fn program_err(name: &'static str) -> impl Fn(ProgramError) -> DatapathError {
    move |source| DatapathError::Program { name, source }
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

/// Ports of the services in the maps pinned in `pin_dir` (none if nothing is pinned).
pub fn pinned_service_ports(pin_dir: &Path) -> Result<std::collections::BTreeSet<u16>> {
    let mut ports = pinned_ports::<u32>(pin_dir, map_names::SERVICES)?;
    ports.extend(pinned_ports::<Addr6>(pin_dir, map_names::SERVICES6)?);
    Ok(ports)
}

/// Ports of the services in one family's pinned service map.
fn pinned_ports<A: MapAddr>(
    pin_dir: &Path,
    name: &'static str,
) -> Result<std::collections::BTreeSet<u16>> {
    let path = pin_dir.join(name);
    if !path.exists() {
        return Ok(Default::default());
    }
    // Read by keys alone: the values may have an earlier build's layout (`berth
    // uninstall` after an upgrade of the binary).
    let data = MapData::from_pin(&path).map_err(map_err(name))?;
    let info = MapInfo::from_pin(&path).map_err(map_err(name))?;
    use std::os::fd::AsFd as _;
    let mut ports = std::collections::BTreeSet::new();
    let key_size = std::mem::size_of::<ServiceKey<A>>();
    if info.key_size() as usize != key_size {
        return Err(map_err(name)(MapError::InvalidKeySize {
            size: info.key_size() as usize,
            expected: key_size,
        }));
    }
    sys::bpf::lookup_batch(
        data.fd().as_fd(),
        key_size,
        info.value_size() as usize,
        |k, _| {
            let key: ServiceKey<A> = sys::bpf::read_pod(k);
            ports.insert(u16::from_be(key.port));
        },
    )
    .map_err(|io_error| {
        map_err(name)(MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_lookup_batch",
            io_error,
        }))
    })?;
    Ok(ports)
}

/// The services of one family's service map, by `ServiceAddr`.
pub(super) fn adopt_services<A: MapAddr>(
    map: &HashMap<MapData, ServiceKey<A>, Service>,
    name: &'static str,
) -> Result<Vec<(ServiceAddr, Service)>> {
    let mut out = Vec::new();
    for item in map.iter() {
        let (key, svc) = item.map_err(map_err(name))?;
        if let Some(service) = service_of(&key) {
            out.push((service, svc));
        }
    }
    Ok(out)
}

/// Removes every pin of a datapath (maps and links). Attached programs whose link is
/// held by no process are detached; established flows are forgotten.
pub fn remove_pins(pin_dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(pin_dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
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

/// Mounts tracefs on `/sys/kernel/tracing` if it is not there: attaching to a
/// tracepoint reads the event's id from it (a fresh host has it unmounted).
fn ensure_tracefs() -> io::Result<()> {
    let root = Path::new("/sys/kernel/tracing");
    if root.join("events").exists() {
        return Ok(());
    }
    sys::fs::mount("tracefs", root)
}

/// Whether this process shares its parent's mount namespace (true when it cannot
/// tell). `ip netns exec` unshares the mount namespace and remounts /sys just before it
/// executes its command, so a daemon it started is the first process of a new one.
fn in_parent_mount_namespace() -> bool {
    let parent = std::os::unix::process::parent_id();
    match (
        fs::read_link("/proc/self/ns/mnt"),
        fs::read_link(format!("/proc/{parent}/ns/mnt")),
    ) {
        (Ok(own), Ok(theirs)) => own == theirs,
        _ => true,
    }
}

/// Mounts bpffs on `/sys/fs/bpf` if the pin directory lies there and it is not mounted.
fn ensure_bpffs(pin_dir: &Path) -> Result<()> {
    use super::pins::BPF_FS_MAGIC;
    let root = Path::new("/sys/fs/bpf");
    if !pin_dir.starts_with(root) {
        return Ok(());
    }
    let err = |source| DatapathError::PinDir {
        path: pin_dir.to_path_buf(),
        source,
    };
    let c_root = std::ffi::CString::new("/sys/fs/bpf").map_err(|e| err(io::Error::other(e)))?;
    if sys::fs::fs_type(&c_root).is_ok_and(|t| t == BPF_FS_MAGIC) {
        return Ok(());
    }
    // Not mounted here. Usually a host that never mounted it: mount it. In a mount
    // namespace made just for this process (`ip netns exec` remounts /sys), a bpffs
    // mounted now would be private: the pins would die with this process.
    if !in_parent_mount_namespace() {
        return Err(DatapathError::PrivateBpffs);
    }
    sys::fs::mount("bpf", root).map_err(err)
}
