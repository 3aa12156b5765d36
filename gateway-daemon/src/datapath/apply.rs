//! Applying a desired state as a minimal diff of the maps: services added, changed
//! (a new Maglev table, switched to atomically) or removed, and the gateway addresses
//! and reserved ports that follow from them.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use aya::maps::{HashMap, IterableMap as _, MapData, MapError};
use gateway_common::{
    maglev_size, map_names, Backend, NextHop, Service, ServiceId, ServiceKey, BACKEND_LIVE,
};

use super::{
    desired::BackendSet,
    diff::{self, MapOp},
    family::{Addr6, ByFamily, MapAddr},
    held_back, maglev, map_err,
    new_services::batch_err,
    pool::Region,
    ApplyReport, Capacity, Datapath, DatapathError, DesiredState, FlowSettings, Installed,
    InstalledBackends, Limit, Result, ServiceAddr, Usage, WeightedBackend,
};

/// The service map of one family.
pub(super) type ServiceMap<A> = HashMap<MapData, ServiceKey<A>, Service>;

/// The service maps of both families, keyed by `ServiceAddr`.
impl ByFamily<ServiceMap<u32>, ServiceMap<Addr6>> {
    fn insert(&mut self, s: &ServiceAddr, value: Service) -> Result<()> {
        match (s.key::<u32>(), s.key::<Addr6>()) {
            (Some(k), _) => self.v4.insert(k, value, 0),
            (_, Some(k)) => self.v6.insert(k, value, 0),
            (None, None) => Ok(()),
        }
        .map_err(map_err(services_map(s)))
    }

    fn remove(&mut self, s: &ServiceAddr) -> Result<()> {
        let removed = match (s.key::<u32>(), s.key::<Addr6>()) {
            (Some(k), _) => self.v4.remove(&k),
            (_, Some(k)) => self.v6.remove(&k),
            (None, None) => Ok(()),
        };
        match removed {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(services_map(s))(e)),
        }
    }

    fn get(&self, s: &ServiceAddr) -> Result<Service> {
        match (s.key::<u32>(), s.key::<Addr6>()) {
            (Some(k), _) => self.v4.get(&k, 0),
            (_, Some(k)) => self.v6.get(&k, 0),
            (None, None) => Err(MapError::KeyNotFound),
        }
        .map_err(map_err(services_map(s)))
    }
}

/// Services installed per part when a start fills empty maps (`apply_in_parts`): as
/// many as `add_services` writes in one batch.
const START_PART: usize = 8192;

/// What an apply writes.
enum Scope {
    /// What differs from the state last applied (or, when that is unknown, from what
    /// is installed); the state is then the one last applied.
    Whole,
    /// One part of a start (`apply_in_parts`): these changes only.
    Part(Vec<(ServiceAddr, Option<BackendSet>)>),
}

/// The name of the service map `s` is in.
fn services_map(s: &ServiceAddr) -> &'static str {
    match s.addr {
        IpAddr::V4(_) => map_names::SERVICES,
        IpAddr::V6(_) => map_names::SERVICES6,
    }
}

impl Datapath {
    /// Ports of the installed services.
    pub(super) fn installed_ports(&self) -> crate::host::PortSet {
        self.keys.ports()
    }

    /// Reserves the installed services' ports from the host's ephemeral ports (and
    /// releases those no longer installed), leaving the operator's entries alone.
    fn sync_reserved_ports(&mut self) {
        let want = self.installed_ports();
        let release = self.reserved.minus(&want);
        match crate::host::update_reserved_ports(&release, &want) {
            Ok(()) => self.reserved = want,
            Err(e) => tracing::warn!(error = %e, "updating net.ipv4.ip_local_reserved_ports"),
        }
    }

    /// The services of the state last applied that the kernel program does not serve.
    pub fn held_back(&self) -> &[held_back::HeldBack] {
        &self.held_back
    }

    /// The services currently installed, with their backends.
    pub fn installed(&self) -> DesiredState {
        let services = self
            .installed
            .iter()
            .map(|(service, svc)| {
                let backends = svc
                    .backends
                    .iter()
                    .map(|(&endpoint, &(_, weight))| WeightedBackend { endpoint, weight })
                    .collect::<Vec<_>>();
                (*service, super::Backends::from(backends))
            })
            .collect();
        let source_nat = self
            .installed
            .iter()
            .filter(|(_, svc)| svc.snat)
            .map(|(service, _)| *service)
            .collect();
        DesiredState {
            services,
            source_nat,
            snat_ports: self.snat.ports_written(),
            traffic: self.traffic.clone(),
        }
    }

    /// Makes the maps hold `desired`, touching only what differs. Flows of unchanged
    /// backends are never disturbed; a changed service switches tables atomically.
    /// Services the kernel program does not serve are held back (`held_back`).
    pub fn apply(&mut self, desired: &DesiredState) -> Result<ApplyReport> {
        self.apply_shared(&Arc::new(desired.clone()))
    }

    /// `apply` of a state the caller shares: kept as the state last applied without a
    /// copy (a copy of 100,000 services cost several milliseconds per change).
    pub fn apply_shared(&mut self, desired: &Arc<DesiredState>) -> Result<ApplyReport> {
        let (served, held) = held_back::kernel_state(desired, self.applied.as_deref());
        let desired = match served {
            Cow::Borrowed(_) => Arc::clone(desired),
            Cow::Owned(served) => Arc::new(served),
        };
        if held != self.held_back {
            log_held_back(&held);
            self.held_back = held;
        }
        let result = if self.applied.is_none() && self.installed.is_empty() {
            self.apply_in_parts(&desired)
        } else {
            self.apply_diff(&desired, Scope::Whole)
        };
        if result.is_err() {
            // Ids handed out to what was not installed in the end are free again.
            self.rebuild_pools();
        }
        result
    }

    /// Installs `desired` on empty maps (a start on fresh pins) in parts: its first
    /// [`START_PART`] services, then the next, and so on, each part applied as the
    /// services it adds. What an apply stages (its list of changes and their order, the
    /// roles' keys and changes) is then held for one part at a time: for 100,000
    /// services at once it was ~27 MB at the daemon's peak. (Parts made as growing
    /// copies of the state, each a change from the one before, held two copies of
    /// ~90,000 services at the end: the last 15 MB of the peak.) A state beyond the
    /// maps' limits is refused before any part is written (each part alone may fit);
    /// the state counts as applied once every part is: after a failure the parts
    /// written stay installed, and the next apply compares everything with them.
    fn apply_in_parts(&mut self, desired: &Arc<DesiredState>) -> Result<ApplyReport> {
        if desired.services.len() <= START_PART {
            return self.apply_diff(desired, Scope::Whole);
        }
        let backends = self.check_capacity(desired)?;
        let mut report = ApplyReport::default();
        for part in desired.parts(START_PART) {
            let done = self.apply_diff(desired, Scope::Part(part))?;
            report.added += done.added;
            report.changed += done.changed;
            report.removed += done.removed;
            report.unchanged += done.unchanged;
        }
        self.applied = Some(Arc::clone(desired));
        self.applied_backends = backends;
        Ok(report)
    }

    fn apply_diff(&mut self, desired: &Arc<DesiredState>, scope: Scope) -> Result<ApplyReport> {
        let whole = matches!(scope, Scope::Whole);
        let backends = if whole {
            self.check_capacity(desired)?
        } else {
            0
        };
        let mut report = ApplyReport::default();
        let snat = &desired.source_nat;
        // The parts of a start add each service in its mode: only the first may find
        // the SNAT setting new.
        let snat_changed = match &scope {
            Scope::Whole => self
                .applied
                .as_ref()
                .is_none_or(|last| last.source_nat != desired.source_nat),
            Scope::Part(_) => self.installed.is_empty(),
        };
        // Ports first: a service switched to SNAT mode below takes them at once.
        let ports_changed = self.sync_snat_ports(&desired.snat_ports)?;
        if (ports_changed || snat_changed)
            && desired.snat_ports.is_empty()
            && !desired.source_nat.is_empty()
        {
            tracing::warn!(
                services = desired.source_nat.len(),
                "no SNAT source port is left (--snat-ports lies inside the listeners' \
                 ports): every new SNAT flow is dropped (counted drop_snat_ports_exhausted)"
            );
        }
        // Before the services: those added below take their affinity with them.
        self.sync_traffic(&desired.traffic)?;
        // The services that may differ from what is installed, and what each takes.
        let changes = match scope {
            Scope::Part(changes) => changes,
            Scope::Whole => {
                let last = self.applied.take();
                let (changes, same) =
                    diff::candidates(desired, last.as_deref(), self.installed.keys());
                report.unchanged = same;
                changes
            }
        };
        let had_changes = !changes.is_empty();
        let ops = diff::ops(changes, &self.installed, |s| snat.contains(s));
        // The roles follow the services: written for the endpoints and slots of the
        // services that may change, or whose mode did (or in full when they were never
        // written exactly: a start writes the adopted services' kept with what was there).
        let roles_due = had_changes || snat_changed || !self.roles.is_exact();
        // Backends that left their services give their ids back if the changes need
        // them (before the views below are taken).
        self.free_backend_ids(self.backends_added(&ops))?;
        // What each changing service is installed with, to take out of the roles after.
        let before: Vec<Option<Vec<SocketAddr>>> = ops
            .iter()
            .map(|op| {
                let key = op.service();
                self.installed
                    .contains_key(&key)
                    .then(|| self.indexed_endpoints(&key))
            })
            .collect();
        // The roles of what is installed and what is wanted, before either changes.
        if roles_due {
            for op in &ops {
                if let Some(want) = op.wanted() {
                    let key = op.service();
                    self.roles
                        .book
                        .add(key, snat.contains(&key), want.keys().copied());
                }
            }
            self.roles.write(true)?;
        }
        let mut adds = Vec::new();
        for op in &ops {
            match op {
                MapOp::Remove(service) => {
                    self.remove_service(service)?;
                    report.removed += 1;
                }
                // New services come last (`diff::ops`): written together below.
                MapOp::Add {
                    service,
                    backends,
                    snat,
                } => adds.push((*service, backends, *snat)),
                MapOp::Keep { .. } => report.unchanged += 1,
                MapOp::Update {
                    service,
                    backends,
                    snat,
                } => {
                    self.update_service(service, backends, *snat)?;
                    report.changed += 1;
                }
            }
        }
        self.add_services(&adds)?;
        report.added += adds.len();
        let switched = if snat_changed {
            // Only services whose backends are the same switch here (the others were
            // written with their mode above): counted as unchanged so far.
            let switched = self.sync_snat_flags(snat)?;
            report.changed += switched.len();
            report.unchanged = report.unchanged.saturating_sub(switched.len());
            switched
        } else {
            Vec::new()
        };
        if roles_due {
            // The book again holds exactly what is installed.
            for (op, old) in ops.iter().zip(before) {
                let key = op.service();
                let wanted = op.wanted().map(|w| w.keys().copied().collect::<Vec<_>>());
                let now = self
                    .installed
                    .get(&key)
                    .map(|svc| (svc.snat, self.indexed_endpoints(&key)));
                self.roles.book.settle(key, old, wanted, now);
            }
            for key in &switched {
                if let Some(svc) = self.installed.get(key) {
                    let (snat, endpoints) = (svc.snat, self.indexed_endpoints(key));
                    self.roles.book.remove(*key, endpoints.iter().copied());
                    self.roles.book.add(*key, snat, endpoints);
                }
            }
            for key in self.roles.write(false)? {
                self.write_flags(&key)?;
            }
        }
        if report.added + report.removed > 0 {
            self.sync_addresses()?;
            let (addresses, ports) = self.keys.take_changed();
            // Also after a publication that failed (it is done again).
            if addresses || self.publication_unsure() {
                self.sync_publication()?;
            }
            // Also after an update of the setting that failed (tried again).
            if ports || self.reserved != self.installed_ports() {
                self.sync_reserved_ports();
            }
        }
        if whole {
            self.applied = Some(Arc::clone(desired));
            self.applied_backends = backends;
        }
        Ok(report)
    }

    /// Refuses a state that does not fit the maps before anything is touched. The
    /// planner plans only what fits (`planner::capacity`), so this is a defence.
    /// Returns the backends of `desired` counted with duplicates.
    fn check_capacity(&self, desired: &DesiredState) -> Result<u64> {
        use imbl::ordmap::DiffItem;
        let capacity = Capacity::of(&self.limits);
        let services = desired.services.len() as u64;
        // Counting distinct endpoints costs a sort per service: only when the plain
        // number of backends, which is never lower, passes the limit. That number
        // follows the state last applied by what changed since (the diff skips what
        // the two share).
        let at_most = match &self.applied {
            Some(last) => {
                last.services
                    .diff(&desired.services)
                    .fold(self.applied_backends, |n, item| match item {
                        DiffItem::Add(_, b) => n + b.len() as u64,
                        DiffItem::Remove(_, b) => n.saturating_sub(b.len() as u64),
                        DiffItem::Update { old, new } => {
                            n.saturating_sub(old.1.len() as u64) + new.1.len() as u64
                        }
                    })
            }
            None => desired.services.values().map(|b| b.len() as u64).sum(),
        };
        let quick = Usage {
            services,
            backends: at_most,
        };
        let over = match quick.exceeds(&capacity) {
            Some(Limit::Backends) => Usage::of_state(desired).exceeds(&capacity),
            over => over,
        };
        match over {
            Some(limit) => Err(DatapathError::Capacity {
                what: limit.name(),
                limit: capacity.of_limit(limit),
            }),
            None => Ok(at_most),
        }
    }

    fn update_service(&mut self, key: &ServiceAddr, want: &BackendSet, snat: bool) -> Result<()> {
        let Some(old) = self.installed.get(key).cloned() else {
            return self.add_services(&[(*key, want, snat)]);
        };
        // New backends take ids before the removed ones give theirs back (a table must
        // only name live backends). With too few ids free (the maps nearly full), the
        // service first switches to the backends it keeps, which frees the others'.
        let added = want
            .keys()
            .filter(|e| !old.backends.contains_key(e))
            .count();
        let removed = old.backends.keys().any(|e| !want.contains_key(e));
        if added > self.backend_ids.free_count() && removed {
            let kept: BackendSet = want
                .iter()
                .filter(|(e, _)| old.backends.contains_key(e))
                .map(|(&e, &w)| (e, w))
                .collect();
            tracing::debug!(
                service = %key,
                kept = kept.len(),
                "backend ids short: switching to the kept backends first"
            );
            self.update_service(key, &kept, snat)?;
        }
        let Some(old) = self.installed.get(key).cloned() else {
            return self.add_services(&[(*key, want, snat)]);
        };
        let mut svc = Installed {
            id: old.id,
            table: Region::EMPTY,
            table_lost: false,
            snat,
            backends: InstalledBackends::default(),
        };
        // New and reweighted backends first, so the new table only names live ones.
        for (&endpoint, &weight) in want {
            let bid = match old.backends.get(&endpoint) {
                Some(&(bid, w)) if w == weight && (old.snat || !snat) => bid,
                Some(&(bid, _)) => {
                    self.write_backend(bid, svc.id, endpoint, weight, snat)?;
                    bid
                }
                None => match self.unretire(key, &endpoint) {
                    // Back before its connections ended: a backend again, same id.
                    Some(bid) => {
                        self.write_backend(bid, svc.id, endpoint, weight, snat)?;
                        bid
                    }
                    None => self.new_backend(svc.id, endpoint, weight, snat)?,
                },
            };
            svc.backends.insert(endpoint, (bid, weight));
        }
        svc.backends.shrink();
        self.write_table(&mut svc)?;
        self.services.insert(key, self.service_value(key, &svc))?;
        // Only now that no table names them: removed backends go, a TCP service's once
        // their connections ended (`retired`); a UDP flow is balanced again by the
        // kernel program on its next packet.
        for (&endpoint, &backend) in &old.backends {
            if !svc.backends.contains_key(&endpoint) {
                self.retire_backend(key, (svc.id, snat), endpoint, backend)?;
            }
        }
        if !old.table_lost {
            self.tables.free(old.table);
        }
        self.installed.insert(*key, svc);
        Ok(())
    }

    fn remove_service(&mut self, key: &ServiceAddr) -> Result<()> {
        let Some(svc) = self.installed.remove(key) else {
            return Ok(());
        };
        self.keys.count(key, false);
        self.services.remove(key)?;
        for &(bid, _) in svc.backends.values() {
            self.clear_backend(bid)?;
        }
        self.clear_retired(key)?;
        self.service_ids.free(svc.id);
        if !svc.table_lost {
            self.tables.free(svc.table);
        }
        Ok(())
    }

    /// The map value of an installed service.
    pub(super) fn service_value(&self, key: &ServiceAddr, svc: &Installed) -> Service {
        Service {
            id: svc.id,
            table: Service::table(svc.table.start, svc.table.len),
            flags: service_flags(svc.snat, self.roles.reply_entry(key), self.affinity(key)),
        }
    }

    /// Writes the service's Maglev table into a free region of the pool (`new_table`)
    /// and sets `svc.table` to it. The service does not point at it yet.
    fn write_table(&mut self, svc: &mut Installed) -> Result<()> {
        let Some((region, entries)) = self.new_table(svc)? else {
            svc.table = Region::EMPTY;
            return Ok(());
        };
        let fd = std::os::fd::AsFd::as_fd(self.maglev.map().fd());
        if let Err(e) = crate::sys::bpf::update_array_u32(fd, region.start, &entries) {
            self.tables.free(region);
            return Err(batch_err(map_names::MAGLEV)(e));
        }
        svc.table = region;
        Ok(())
    }

    /// The service's Maglev table (backend ids), sized by its backends taking new
    /// flows, and the free region of the pool taken for it; none without any.
    pub(super) fn new_table(&mut self, svc: &Installed) -> Result<Option<(Region, Vec<u32>)>> {
        let candidates: Vec<maglev::Candidate> = svc
            .backends
            .iter()
            .map(|(&endpoint, &(_, weight))| maglev::Candidate { endpoint, weight })
            .collect();
        let active = candidates.iter().filter(|c| c.weight > 0).count() as u32;
        let size = maglev_size(active);
        let Some(table) = maglev::table(&candidates, size) else {
            return Ok(None);
        };
        let ids: Vec<u32> = svc.backends.values().map(|&(bid, _)| bid).collect();
        let entries: Vec<u32> = table.iter().map(|&e| ids[e as usize]).collect();
        Ok(Some((self.tables.alloc(size)?, entries)))
    }

    /// Gives a new backend an id: one that starts with no next hop (the kernel program
    /// caches one per id, and a packet of an earlier holder's flow may have refilled it
    /// since the id was freed).
    fn new_backend(
        &mut self,
        service: ServiceId,
        e: SocketAddr,
        weight: u16,
        snat: bool,
    ) -> Result<u32> {
        let bid = self.backend_ids.alloc()?;
        self.backend_hops
            .set(bid, NextHop::default(), 0)
            .map_err(map_err(map_names::BACKEND_HOPS))?;
        // Its counters start from zero (an earlier holder's stay otherwise).
        let fd = std::os::fd::AsFd::as_fd(self.backend_stats.map().fd());
        crate::sys::bpf::zero_batch(fd, &[bid]).map_err(batch_err(map_names::BACKEND_STATS))?;
        self.write_backend(bid, service, e, weight, snat)?;
        Ok(bid)
    }

    /// Writes a backend; in SNAT mode its source first (its flows need it from the
    /// first packet); an IPv6 backend's address before the entry that makes it live.
    ///
    /// An id holds one family: an IPv4 backend's id has no IPv6 address. The kernel
    /// program reads `BACKENDS6` for any IPv6 packet; an address an IPv6 backend left
    /// there named the id's next (IPv4) backend, so a reply of the old backend's flow
    /// cached its next hop for the new one, whose own replies were then dropped as
    /// forged (`reply_spoofed`; the fuzzer found it).
    pub(super) fn write_backend(
        &mut self,
        bid: u32,
        service: ServiceId,
        e: SocketAddr,
        weight: u16,
        snat: bool,
    ) -> Result<()> {
        if snat {
            self.write_snat_source(bid, e)?;
        }
        let (value, addr6) = backend_entry(service, e, weight);
        self.backends6
            .set(bid, addr6, 0)
            .map_err(map_err(map_names::BACKENDS6))?;
        self.backends
            .set(bid, value, 0)
            .map_err(map_err(map_names::BACKENDS))
    }

    /// Switches installed services in or out of SNAT mode as `snat` says (sources
    /// written before the flag that makes new flows use them); returns those switched.
    /// Established flows keep the translation they started with.
    fn sync_snat_flags(&mut self, snat: &imbl::OrdSet<ServiceAddr>) -> Result<Vec<ServiceAddr>> {
        let switch: Vec<ServiceAddr> = self
            .installed
            .iter()
            .filter(|(key, svc)| svc.snat != snat.contains(*key))
            .map(|(key, _)| *key)
            .collect();
        for key in &switch {
            let Some(mut svc) = self.installed.get(key).cloned() else {
                continue;
            };
            svc.snat = !svc.snat;
            if svc.snat {
                for (&endpoint, &(bid, _)) in &svc.backends {
                    self.write_snat_source(bid, endpoint)?;
                }
            }
            self.installed.insert(*key, svc);
            self.write_flags(key)?;
        }
        Ok(switch)
    }

    /// The session-affinity timeout of a service, in seconds (0: none).
    fn affinity(&self, key: &ServiceAddr) -> u32 {
        self.traffic
            .get(key)
            .and_then(|t| t.affinity_secs)
            .unwrap_or(0)
    }

    /// Takes `want` as the flow settings in force; rewrites the flags of the installed
    /// services whose affinity it changes.
    fn sync_traffic(&mut self, want: &imbl::OrdMap<ServiceAddr, FlowSettings>) -> Result<()> {
        use imbl::ordmap::DiffItem;
        if self.traffic.ptr_eq(want) {
            return Ok(());
        }
        let old = std::mem::replace(&mut self.traffic, want.clone());
        let switched: Vec<ServiceAddr> = old
            .diff(want)
            .filter_map(|item| match item {
                DiffItem::Add(k, new) => new.affinity_secs.is_some().then_some(*k),
                DiffItem::Remove(k, old) => old.affinity_secs.is_some().then_some(*k),
                DiffItem::Update { old, new } => {
                    (old.1.affinity_secs != new.1.affinity_secs).then_some(*new.0)
                }
            })
            .collect();
        for key in &switched {
            self.write_flags(key)?;
        }
        Ok(())
    }

    /// Rewrites an installed service's `Service::flags` from its mode and role.
    pub(super) fn write_flags(&mut self, key: &ServiceAddr) -> Result<()> {
        let Some(svc) = self.installed.get(key) else {
            return Ok(());
        };
        let flags = service_flags(svc.snat, self.roles.reply_entry(key), self.affinity(key));
        let mut value = self.services.get(key)?;
        if value.flags != flags {
            value.flags = flags;
            self.services.insert(key, value)?;
        }
        Ok(())
    }

    /// At load, before the programs are attached: adds the roles of the adopted services
    /// to the pinned maps (kept with what is there: the program still attached may read
    /// them), so that this build's program finds every role in its own slots from its
    /// first packet, even if an earlier build put them elsewhere. The first apply then
    /// writes exactly what is installed.
    pub(super) fn write_adopted_roles(&mut self) -> Result<()> {
        self.roles.reset(self.role_views());
        for key in self.roles.write(true)? {
            self.write_flags(&key)?;
        }
        Ok(())
    }

    /// The installed services as the roles see them: service, SNAT mode, endpoints.
    fn role_views(&self) -> Vec<(ServiceAddr, bool, Vec<SocketAddr>)> {
        self.installed
            .iter()
            .map(|(key, svc)| (*key, svc.snat, svc.backends.keys().copied().collect()))
            .collect()
    }

    pub(super) fn clear_backend(&mut self, bid: u32) -> Result<()> {
        self.backends
            .set(bid, Backend::default(), 0)
            .map_err(map_err(map_names::BACKENDS))?;
        self.backends6
            .set(bid, Addr6::default(), 0)
            .map_err(map_err(map_names::BACKENDS6))?;
        // The id's next backend starts without the old one's next hop.
        self.backend_hops
            .set(bid, NextHop::default(), 0)
            .map_err(map_err(map_names::BACKEND_HOPS))?;
        self.backend_ids.free(bid);
        Ok(())
    }

    /// Keeps the gateway-address maps equal to the addresses of installed services.
    fn sync_addresses(&mut self) -> Result<()> {
        let mut want = ByFamily::<BTreeMap<u32, u32>, BTreeMap<Addr6, u32>>::default();
        for (&addr, &services) in self.keys.addresses() {
            if let Some(a) = u32::of(addr) {
                want.v4.insert(a, services);
            } else if let Some(a) = Addr6::of(addr) {
                want.v6.insert(a, services);
            }
        }
        let limit = self.limits.addresses;
        sync_counts(&mut self.addresses.v4, want.v4, limit, map_names::ADDRESSES)?;
        sync_counts(
            &mut self.addresses.v6,
            want.v6,
            limit,
            map_names::ADDRESSES6,
        )
    }

    /// Marks exactly the ids of installed services as used, and starts the roles'
    /// book afresh from them (a failed apply may have left wanted services in it).
    fn rebuild_pools(&mut self) {
        let views = self.role_views();
        self.roles.reset(views);
        self.keys = super::keys::Keys::of(self.installed.keys());
        self.service_ids.clear();
        self.tables.clear();
        self.backend_ids.clear();
        for svc in self.installed.values() {
            self.service_ids.mark(svc.id);
            if !svc.table_lost {
                self.tables.mark(svc.table);
            }
            for &(bid, _) in svc.backends.values() {
                self.backend_ids.mark(bid);
            }
        }
    }
}

/// Makes an address map (address → services on it) hold `want`.
fn sync_counts<A: MapAddr>(
    map: &mut HashMap<MapData, A, u32>,
    want: BTreeMap<A, u32>,
    limit: u32,
    name: &'static str,
) -> Result<()> {
    if want.len() as u32 > limit {
        return Err(DatapathError::Capacity {
            what: "addresses",
            limit,
        });
    }
    let have: Vec<(A, u32)> = map
        .iter()
        .collect::<Result<_, _>>()
        .map_err(map_err(name))?;
    for (addr, _) in have.iter().filter(|(a, _)| !want.contains_key(a)) {
        map.remove(addr).map_err(map_err(name))?;
    }
    for (addr, count) in want {
        if !have.contains(&(addr, count)) {
            map.insert(addr, count, 0).map_err(map_err(name))?;
        }
    }
    Ok(())
}

/// Says which services are held back and why (or that none is any more): once per
/// change, as `apply` calls it.
fn log_held_back(held: &[held_back::HeldBack]) {
    if held.is_empty() {
        tracing::info!("every service is programmed: none is held back any more");
        return;
    }
    // The first ones by name: a line, not a page, with thousands of services.
    const NAMED: usize = 20;
    let mut list: Vec<String> = held.iter().take(NAMED).map(ToString::to_string).collect();
    if held.len() > NAMED {
        list.push(format!("and {} more", held.len() - NAMED));
    }
    tracing::warn!(
        services = held.len(),
        held_back = %list.join(", "),
        "services held back from the datapath (berth_services_held_back)"
    );
}

/// A live backend's entry in `BACKENDS`, and its address in `BACKENDS6` (none for
/// an IPv4 backend).
pub(super) fn backend_entry(service: ServiceId, e: SocketAddr, weight: u16) -> (Backend, Addr6) {
    let entry = Backend {
        addr: u32::of(e.ip()).unwrap_or(0),
        port: e.port().to_be(),
        weight,
        service,
        flags: BACKEND_LIVE,
    };
    (entry, Addr6::of(e.ip()).unwrap_or_default())
}

/// `Service::flags` for a service in SNAT mode or not, recording reply entries or not,
/// with a session-affinity timeout of `affinity_secs` (0: none).
fn service_flags(snat: bool, reply_entry: bool, affinity_secs: u32) -> u32 {
    let mode = if snat {
        gateway_common::SERVICE_SNAT
    } else if reply_entry {
        gateway_common::SERVICE_REPLY_ENTRY
    } else {
        0
    };
    let affinity = affinity_secs.min(gateway_common::SERVICE_AFFINITY_MAX_SECS);
    mode | affinity << gateway_common::SERVICE_AFFINITY_SHIFT
}
