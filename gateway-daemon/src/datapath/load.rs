//! Loading the object and adopting what an earlier run pinned: map shapes checked
//! against this build's (`shapes.rs`), the userspace view rebuilt from the maps, bpffs
//! and tracefs mounted when the host has none.

use std::{
    collections::{BTreeMap, HashMap as StdHashMap, HashSet},
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, HashMap, MapData, MapError, MapInfo},
    programs::ProgramError,
    Ebpf, EbpfLoader,
};
use gateway_common::{map_names, Service, ServiceId, ServiceKey, BACKEND_LIVE};

use super::{
    family::{endpoint_of, service_of, Addr6, ByFamily, MapAddr},
    links, map_err,
    pins::PinDirLock,
    pool::{Region, TablePool},
    shapes::{self, Shape},
    xdp, Config, Datapath, DatapathError, IdPool, Installed, InstalledBackends, Limit, Limits,
    Resource, Result, ServiceAddr, ServiceIds, FLOOR_PROGRAM, MONITOR_PROGRAM, PROGRAM,
    PROGRAM_ICMP6, PROGRAM_V6, REDIRECT_ERR_PROGRAM, TC_INGRESS_PROGRAM, TC_MONITOR_PROGRAM,
    TC_PROGRAM, TC_PROGRAM_ICMP6, TC_PROGRAM_V6,
};
use crate::sys;

pub(super) static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gateway"));

impl Datapath {
    /// Loads the program, creating the maps or adopting those an earlier run pinned.
    pub fn load(config: &Config) -> Result<Self> {
        Self::load_from(config, OBJECT)
    }

    /// Loads `object` (an ELF object of the gateway program, such as another commit's
    /// build, for A/B benchmarks) instead of the one this build embeds, as `load` does.
    /// Its maps must have this build's key and value sizes (the same `gateway-common`):
    /// refused otherwise, naming the first map that differs.
    pub fn load_object(config: &Config, object: &[u8]) -> Result<Self> {
        shapes::check_object(object, &config.limits.shapes())?;
        Self::load_from(config, object)
    }

    /// `load` of `object`.
    fn load_from(config: &Config, object: &[u8]) -> Result<Self> {
        ensure_bpffs(&config.pin_dir)?;
        // A start that fails leaves no pins of its own behind (an earlier run's stay).
        let existed: Vec<bool> = map_names::ALL
            .iter()
            .map(|n| config.pin_dir.join(n).exists())
            .collect();
        let dir_existed = config.pin_dir.exists();
        let loaded = Self::load_pinned(config, object);
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

    /// Loads `object` over the maps pinned in `config.pin_dir` (this build's shapes,
    /// created or an earlier run's) and rebuilds the userspace view from them.
    fn load_pinned(config: &Config, object: &[u8]) -> Result<Self> {
        let Config { pin_dir, limits } = config;
        check_limits(limits)?;
        fs::create_dir_all(pin_dir.join("links")).map_err(|source| DatapathError::PinDir {
            path: pin_dir.clone(),
            source,
        })?;
        let pin_lock = PinDirLock::take(pin_dir)?;
        let shapes = limits.shapes();
        shapes::check_pins(pin_dir, &shapes)?;
        let ebpf = load_object(object, pin_dir, &shapes)?;
        let mut dp = Self::with_maps(ebpf, config, pin_lock)?;
        dp.ensure_handoff_nonce()?;
        dp.adopt()?;
        dp.keys = super::keys::Keys::of(dp.installed.keys());
        dp.host.reserved = dp.installed_ports();
        dp.count_redirect_errors();
        Ok(dp)
    }

    /// A datapath of the loaded object's maps, holding `pin_lock`, with nothing
    /// installed yet.
    fn with_maps(mut ebpf: Ebpf, config: &Config, pin_lock: PinDirLock) -> Result<Self> {
        let Config { pin_dir, limits } = config;
        Ok(Datapath {
            maps: super::maps::Maps::take(&mut ebpf)?,
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
            host: Default::default(),
            _pin_lock: pin_lock,
            service_ids: ServiceIds::new(limits.services),
            tables: TablePool::new(limits.maglev_pool_entries()),
            backend_ids: IdPool::new(Resource::Of(Limit::Backends), limits.backends),
            retirees: Default::default(),
            traffic: Default::default(),
        })
    }

    /// Rebuilds the userspace view of installed services from the (possibly adopted) maps.
    fn adopt(&mut self) -> Result<()> {
        let by_id = self.adopt_installed()?;
        let adopted6 = self.adopt_backends(&by_id)?;
        self.clear_stale_backends6(&adopted6)?;
        self.note_flow_service_ids()?;
        self.write_adopted_roles()
    }

    /// Adopts the services of the service maps, with their tables and session affinity
    /// (no backends yet): the services by id.
    fn adopt_installed(&mut self) -> Result<StdHashMap<ServiceId, ServiceAddr>> {
        let mut by_id = StdHashMap::new();
        let services = adopt_services(&self.maps.services.v4, map_names::SERVICES)?
            .into_iter()
            .chain(adopt_services(
                &self.maps.services.v6,
                map_names::SERVICES6,
            )?);
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
        Ok(by_id)
    }

    /// Adopts the live backends of the backend map into their services (`by_id`),
    /// clearing those of no service: the ids of the IPv6 backends adopted.
    fn adopt_backends(
        &mut self,
        by_id: &StdHashMap<ServiceId, ServiceAddr>,
    ) -> Result<HashSet<u32>> {
        let mut orphans = Vec::new();
        let mut adopted6 = HashSet::new();
        for (id, item) in self.maps.backends.iter().enumerate() {
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
                            self.maps
                                .backends6
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
        Ok(adopted6)
    }

    /// Clears the IPv6 addresses in `BACKENDS6` of ids that are no adopted IPv6 backend.
    fn clear_stale_backends6(&mut self, adopted6: &HashSet<u32>) -> Result<()> {
        // Earlier builds left the address of an IPv6 backend that went in `BACKENDS6`,
        // where it named the id's next backend (see `write_backend`).
        let mut stale6 = Vec::new();
        for (id, item) in self.maps.backends6.iter().enumerate() {
            let addr = item.map_err(map_err(map_names::BACKENDS6))?;
            if addr != Addr6::default() && !adopted6.contains(&(id as u32)) {
                stale6.push(id as u32);
            }
        }
        for id in stale6 {
            self.maps
                .backends6
                .set(id, Addr6::default(), 0)
                .map_err(map_err(map_names::BACKENDS6))?;
        }
        Ok(())
    }

    /// Keeps the service ids the conntrack entries name from being handed out.
    fn note_flow_service_ids(&mut self) -> Result<()> {
        // Conntrack entries may still name services removed before this start: the
        // ids handed out from now on must differ from theirs.
        let mut seen = HashSet::new();
        self.each_flow(|_, f| {
            seen.insert(f.service);
        })?;
        super::traffic::each_flow_in(&self.maps.conntrack.v6, |_, f| {
            seen.insert(f.service);
        })?;
        for id in seen {
            self.service_ids.saw(id);
        }
        Ok(())
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

/// Refuses limits beyond what the daemon accepts.
fn check_limits(limits: &Limits) -> Result<()> {
    for (what, wanted, max) in [
        (
            Resource::Of(Limit::Services),
            limits.services,
            Limits::MAX_SERVICES,
        ),
        (
            Resource::Of(Limit::Backends),
            limits.backends,
            Limits::MAX_BACKENDS,
        ),
        (Resource::ConntrackEntries, limits.flows, Limits::MAX_FLOWS),
    ] {
        if wanted > max {
            return Err(DatapathError::Limit { what, wanted, max });
        }
    }
    Ok(())
}

/// Loads `object` with its maps pinned in `pin_dir` (adopting those pinned there), and
/// its programs.
fn load_object(object: &[u8], pin_dir: &Path, shapes: &[Shape]) -> Result<Ebpf> {
    let paths: Vec<PathBuf> = shapes.iter().map(|s| pin_dir.join(s.name)).collect();
    let mut loader = EbpfLoader::new();
    for (shape, path) in shapes.iter().zip(&paths) {
        loader.map_max_entries(shape.name, shape.max_entries);
        loader.map_pin_path(shape.name, path.as_path());
    }
    let mut ebpf = loader.load(object).map_err(DatapathError::Load)?;
    load_programs(&mut ebpf)?;
    Ok(ebpf)
}

/// Loads the programs into the kernel, the IPv6 ones in their tail-call slots.
fn load_programs(ebpf: &mut Ebpf) -> Result<()> {
    for name in [
        PROGRAM,
        PROGRAM_V6,
        PROGRAM_ICMP6,
        MONITOR_PROGRAM,
        FLOOR_PROGRAM,
    ] {
        xdp(ebpf, name)?
            .load()
            .map_err(|source| DatapathError::Program { name, source })?;
    }
    // The hand-off program only where the object has it: an older build's object
    // loaded for an A/B benchmark has none (attaching it then fails, naming it).
    let handoff = ebpf.program(TC_INGRESS_PROGRAM).map(|_| TC_INGRESS_PROGRAM);
    for name in [TC_PROGRAM_V6, TC_PROGRAM_ICMP6, TC_MONITOR_PROGRAM]
        .into_iter()
        .chain(handoff)
    {
        links::classifier(ebpf, name)?
            .load()
            .map_err(|source| DatapathError::Program { name, source })?;
    }
    enter_v6(ebpf)?;
    let tc = links::tc_program(ebpf)?;
    tc.load().map_err(|source| DatapathError::Program {
        name: TC_PROGRAM,
        source,
    })?;
    Ok(())
}

/// Takes map `name` out of the loaded object, as a `T`.
pub(super) fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T>
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
