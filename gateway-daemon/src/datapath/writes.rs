//! Writing one service into the maps: its Maglev table, backends and flags (SNAT
//! mode, affinity, reply entries), and removing it. `apply.rs` decides what to write
//! (`diff.rs`) and calls these in order.

use std::net::SocketAddr;

use aya::maps::IterableMap as _;
use gateway_common::{maglev_size, map_names, Backend, NextHop, Service, ServiceId, BACKEND_LIVE};

use super::{
    desired::BackendSet,
    family::{Addr6, MapAddr},
    maglev, map_err,
    new_services::batch_err,
    pool::Region,
    Datapath, FlowSettings, Installed, InstalledBackends, Result, ServiceAddr,
};

impl Datapath {
    pub(super) fn update_service(
        &mut self,
        key: &ServiceAddr,
        want: &BackendSet,
        snat: bool,
    ) -> Result<()> {
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
        self.maps
            .services
            .insert(key, self.service_value(key, &svc))?;
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

    pub(super) fn remove_service(&mut self, key: &ServiceAddr) -> Result<()> {
        let Some(svc) = self.installed.remove(key) else {
            return Ok(());
        };
        self.keys.count(key, false);
        self.maps.services.remove(key)?;
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
    pub(super) fn write_table(&mut self, svc: &mut Installed) -> Result<()> {
        let Some((region, entries)) = self.new_table(svc)? else {
            svc.table = Region::EMPTY;
            return Ok(());
        };
        let fd = std::os::fd::AsFd::as_fd(self.maps.maglev.map().fd());
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
    pub(super) fn new_backend(
        &mut self,
        service: ServiceId,
        e: SocketAddr,
        weight: u16,
        snat: bool,
    ) -> Result<u32> {
        let bid = self.backend_ids.alloc()?;
        self.maps
            .backend_hops
            .set(bid, NextHop::default(), 0)
            .map_err(map_err(map_names::BACKEND_HOPS))?;
        // Its counters start from zero (an earlier holder's stay otherwise).
        let fd = std::os::fd::AsFd::as_fd(self.maps.backend_stats.map().fd());
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
        self.maps
            .backends6
            .set(bid, addr6, 0)
            .map_err(map_err(map_names::BACKENDS6))?;
        self.maps
            .backends
            .set(bid, value, 0)
            .map_err(map_err(map_names::BACKENDS))
    }

    /// Switches installed services in or out of SNAT mode as `snat` says (sources
    /// written before the flag that makes new flows use them); returns those switched.
    /// Established flows keep the translation they started with.
    pub(super) fn sync_snat_flags(
        &mut self,
        snat: &imbl::OrdSet<ServiceAddr>,
    ) -> Result<Vec<ServiceAddr>> {
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
    pub(super) fn affinity(&self, key: &ServiceAddr) -> u32 {
        self.traffic
            .get(key)
            .and_then(|t| t.affinity_secs)
            .unwrap_or(0)
    }

    /// Takes `want` as the flow settings in force; rewrites the flags of the installed
    /// services whose affinity it changes.
    pub(super) fn sync_traffic(
        &mut self,
        want: &imbl::OrdMap<ServiceAddr, FlowSettings>,
    ) -> Result<()> {
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
        let mut value = self.maps.services.get(key)?;
        if value.flags != flags {
            value.flags = flags;
            self.maps.services.insert(key, value)?;
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
    pub(super) fn role_views(&self) -> Vec<(ServiceAddr, bool, Vec<SocketAddr>)> {
        self.installed
            .iter()
            .map(|(key, svc)| (*key, svc.snat, svc.backends.keys().copied().collect()))
            .collect()
    }

    pub(super) fn clear_backend(&mut self, bid: u32) -> Result<()> {
        self.maps
            .backends
            .set(bid, Backend::default(), 0)
            .map_err(map_err(map_names::BACKENDS))?;
        self.maps
            .backends6
            .set(bid, Addr6::default(), 0)
            .map_err(map_err(map_names::BACKENDS6))?;
        // The id's next backend starts without the old one's next hop.
        self.maps
            .backend_hops
            .set(bid, NextHop::default(), 0)
            .map_err(map_err(map_names::BACKEND_HOPS))?;
        self.backend_ids.free(bid);
        Ok(())
    }
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
pub(super) fn service_flags(snat: bool, reply_entry: bool, affinity_secs: u32) -> u32 {
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
