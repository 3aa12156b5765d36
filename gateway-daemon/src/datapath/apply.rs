//! Applying a desired state as a minimal diff of the maps: services added, changed
//! (a new Maglev table, switched to atomically) or removed, and the gateway addresses
//! and reserved ports that follow from them.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use aya::maps::{HashMap, MapData, MapError};
use gateway_common::{map_names, Service, ServiceKey};

use super::{
    desired::BackendSet,
    diff::{self, MapOp},
    family::{Addr6, ByFamily, MapAddr},
    held_back, map_err, ApplyReport, Capacity, Datapath, DatapathError, DesiredState, Limit,
    Resource, Result, ServiceAddr, Usage, WeightedBackend,
};

/// The service map of one family.
pub(super) type ServiceMap<A> = HashMap<MapData, ServiceKey<A>, Service>;

/// The service maps of both families, keyed by `ServiceAddr`.
impl ByFamily<ServiceMap<u32>, ServiceMap<Addr6>> {
    pub(super) fn insert(&mut self, s: &ServiceAddr, value: Service) -> Result<()> {
        match (s.key::<u32>(), s.key::<Addr6>()) {
            (Some(k), _) => self.v4.insert(k, value, 0),
            (_, Some(k)) => self.v6.insert(k, value, 0),
            (None, None) => Ok(()),
        }
        .map_err(map_err(services_map(s)))
    }

    pub(super) fn remove(&mut self, s: &ServiceAddr) -> Result<()> {
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

    pub(super) fn get(&self, s: &ServiceAddr) -> Result<Service> {
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
        let snat_changed = self.sync_settings(desired, &scope)?;
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
        // The roles follow the services: written for the endpoints and slots of the
        // services that may change, or whose mode did (or in full when they were never
        // written exactly: a start writes the adopted services' kept with what was there).
        let roles_due = !changes.is_empty() || snat_changed || !self.roles.is_exact();
        let ops = diff::ops(changes, &self.installed, |s| snat.contains(s));
        // Backends that left their services give their ids back if the changes need
        // them (before the views below are taken).
        self.free_backend_ids(self.backends_added(&ops))?;
        let before = self.roles_before(&ops, snat, roles_due)?;
        self.write_ops(&ops, &mut report)?;
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
            self.roles_after(&ops, before, &switched)?;
        }
        if report.added + report.removed > 0 {
            self.sync_host()?;
        }
        if whole {
            self.applied = Some(Arc::clone(desired));
            self.applied_backends = backends;
        }
        Ok(report)
    }

    /// The settings every service shares, before the services: the SNAT source ports (a
    /// service switched to SNAT mode takes them at once) and the flow settings (a
    /// service added takes its affinity with it). Returns whether the SNAT setting may
    /// be new: the parts of a start add each service in its mode, only the first may
    /// find it new.
    fn sync_settings(&mut self, desired: &DesiredState, scope: &Scope) -> Result<bool> {
        let snat_changed = match scope {
            Scope::Whole => self
                .applied
                .as_ref()
                .is_none_or(|last| last.source_nat != desired.source_nat),
            Scope::Part(_) => self.installed.is_empty(),
        };
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
        self.sync_traffic(&desired.traffic)?;
        Ok(snat_changed)
    }

    /// What each service of `ops` is installed with (to take out of the roles after);
    /// if the roles are due, the roles of what is installed and what is wanted are
    /// written before either changes.
    fn roles_before(
        &mut self,
        ops: &[MapOp],
        snat: &imbl::OrdSet<ServiceAddr>,
        roles_due: bool,
    ) -> Result<Vec<Option<Vec<SocketAddr>>>> {
        let before = ops
            .iter()
            .map(|op| {
                let key = op.service();
                self.installed
                    .contains_key(&key)
                    .then(|| self.indexed_endpoints(&key))
            })
            .collect();
        if roles_due {
            for op in ops {
                if let Some(want) = op.wanted() {
                    let key = op.service();
                    self.roles
                        .book
                        .add(key, snat.contains(&key), want.keys().copied());
                }
            }
            self.roles.write(true)?;
        }
        Ok(before)
    }

    /// Writes the services' ops in their order, new services together last.
    fn write_ops(&mut self, ops: &[MapOp], report: &mut ApplyReport) -> Result<()> {
        let mut adds = Vec::new();
        for op in ops {
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
        Ok(())
    }

    /// After the ops: the book holds exactly what is installed again (services that
    /// switched mode re-entered with it), and the roles are written for it.
    fn roles_after(
        &mut self,
        ops: &[MapOp],
        before: Vec<Option<Vec<SocketAddr>>>,
        switched: &[ServiceAddr],
    ) -> Result<()> {
        for (op, old) in ops.iter().zip(before) {
            let key = op.service();
            let wanted = op.wanted().map(|w| w.keys().copied().collect::<Vec<_>>());
            let now = self
                .installed
                .get(&key)
                .map(|svc| (svc.snat, self.indexed_endpoints(&key)));
            self.roles.book.settle(key, old, wanted, now);
        }
        for key in switched {
            if let Some(svc) = self.installed.get(key) {
                let (snat, endpoints) = (svc.snat, self.indexed_endpoints(key));
                self.roles.book.remove(*key, endpoints.iter().copied());
                self.roles.book.add(*key, snat, endpoints);
            }
        }
        for key in self.roles.write(false)? {
            self.write_flags(&key)?;
        }
        Ok(())
    }

    /// The host's side of a change of services: the address maps, the published
    /// addresses (also after a publication that failed: done again) and the reserved
    /// ports (also after an update of the setting that failed: tried again).
    fn sync_host(&mut self) -> Result<()> {
        self.sync_addresses()?;
        let (addresses, ports) = self.keys.take_changed();
        if addresses || self.publication_unsure() {
            self.sync_publication()?;
        }
        if ports || self.reserved_ports_stale() {
            self.sync_reserved_ports();
        }
        Ok(())
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
                what: Resource::Of(limit),
                limit: capacity.of_limit(limit),
            }),
            None => Ok(at_most),
        }
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
        sync_counts(
            &mut self.maps.addresses.v4,
            want.v4,
            limit,
            map_names::ADDRESSES,
        )?;
        sync_counts(
            &mut self.maps.addresses.v6,
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
            what: Resource::Of(Limit::Addresses),
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
