//! New services written together: their backends, Maglev tables and counters with one
//! batch update per map, then the services themselves with one per family.
//!
//! Nothing reads a new backend id, table region or counter slot before a service
//! points at it, so those batches may land in any order and be seen half-written; the
//! services go last. At a start of 100,000 routes this is 7 syscalls instead of
//! 600,000 (one per entry and map).

use std::os::fd::{AsFd as _, BorrowedFd};

use aya::maps::IterableMap as _;
use gateway_common::{map_names, Backend, NextHop, Service, ServiceKey};

use super::{
    desired::BackendSet, family::Addr6, pool::Region, syscall_err, writes::backend_entry, Datapath,
    DatapathError, Installed, InstalledBackends, Result, ServiceAddr,
};

/// The entries of new services, staged per map.
#[derive(Default)]
struct Staged {
    /// Backend ids: each gets an empty next hop, its IPv6 address and its entry.
    backend_ids: Vec<u32>,
    backends: Vec<Backend>,
    backends6: Vec<Addr6>,
    maglev_index: Vec<u32>,
    maglev_backend: Vec<u32>,
    /// Counter slots to zero.
    stats: Vec<u32>,
    services4: (Vec<ServiceKey<u32>>, Vec<Service>),
    services6: (Vec<ServiceKey<Addr6>>, Vec<Service>),
}

impl Datapath {
    /// Installs services not installed yet, each `(service, backends, SNAT mode)`,
    /// some thousands at a time (the staged entries of 100,000 services at once were
    /// 16 MB at the daemon's peak). On an error some of a batch may be written to the
    /// maps but none of it is recorded as installed (`apply` then frees the ids they
    /// took and writes them afresh).
    pub(super) fn add_services(&mut self, adds: &[(ServiceAddr, &BackendSet, bool)]) -> Result<()> {
        adds.chunks(8192)
            .try_for_each(|batch| self.add_batch(batch))
    }

    fn add_batch(&mut self, adds: &[(ServiceAddr, &BackendSet, bool)]) -> Result<()> {
        let mut staged = Staged::default();
        let mut added = Vec::with_capacity(adds.len());
        for &(key, want, snat) in adds {
            let id = self.service_ids.alloc()?;
            let mut svc = Installed {
                id,
                table: Region::EMPTY,
                table_lost: false,
                snat,
                backends: InstalledBackends::default(),
            };
            for (&endpoint, &weight) in want {
                let bid = self.backend_ids.alloc()?;
                // SNAT sources are few services' and written one by one.
                if snat {
                    self.write_snat_source(bid, endpoint)?;
                }
                let (entry, addr6) = backend_entry(id, endpoint, weight);
                staged.backend_ids.push(bid);
                staged.backends.push(entry);
                staged.backends6.push(addr6);
                svc.backends.insert(endpoint, (bid, weight));
            }
            svc.backends.shrink();
            if let Some((region, entries)) = self.new_table(&svc)? {
                staged
                    .maglev_index
                    .extend(region.start..region.start + region.len);
                staged.maglev_backend.extend(entries);
                svc.table = region;
            }
            staged.stats.push(id.slot());
            let service = self.service_value(&key, &svc);
            if let Some(k) = key.key::<u32>() {
                staged.services4.0.push(k);
                staged.services4.1.push(service);
            } else if let Some(k) = key.key::<Addr6>() {
                staged.services6.0.push(k);
                staged.services6.1.push(service);
            }
            added.push((key, svc));
        }
        self.write_staged(&staged)?;
        for (key, svc) in added {
            if self.installed.insert(key, svc).is_none() {
                self.keys.count(&key, true);
            }
        }
        Ok(())
    }

    /// Writes the staged entries, the services last.
    fn write_staged(&self, s: &Staged) -> Result<()> {
        let no_hops = vec![NextHop::default(); s.backend_ids.len()];
        write(
            self.maps.backend_hops.map().fd().as_fd(),
            map_names::BACKEND_HOPS,
            &s.backend_ids,
            &no_hops,
        )?;
        write(
            self.maps.backends6.map().fd().as_fd(),
            map_names::BACKENDS6,
            &s.backend_ids,
            &s.backends6,
        )?;
        write(
            self.maps.backends.map().fd().as_fd(),
            map_names::BACKENDS,
            &s.backend_ids,
            &s.backends,
        )?;
        write(
            self.maps.maglev.map().fd().as_fd(),
            map_names::MAGLEV,
            &s.maglev_index,
            &s.maglev_backend,
        )?;
        crate::sys::bpf::zero_batch(self.maps.service_stats.map().fd().as_fd(), &s.stats)
            .map_err(batch_err(map_names::SERVICE_STATS))?;
        crate::sys::bpf::zero_batch(self.maps.backend_stats.map().fd().as_fd(), &s.backend_ids)
            .map_err(batch_err(map_names::BACKEND_STATS))?;
        write(
            self.maps.services.v4.map().fd().as_fd(),
            map_names::SERVICES,
            &s.services4.0,
            &s.services4.1,
        )?;
        write(
            self.maps.services.v6.map().fd().as_fd(),
            map_names::SERVICES6,
            &s.services6.0,
            &s.services6.1,
        )
    }
}

/// One batch update of the map `name`.
fn write<K: aya::Pod, V: aya::Pod>(
    fd: BorrowedFd<'_>,
    name: &'static str,
    keys: &[K],
    values: &[V],
) -> Result<()> {
    crate::sys::bpf::update_batch(fd, keys, values).map_err(batch_err(name))
}

/// A failed batch update of the map `name`.
pub(super) fn batch_err(name: &'static str) -> impl FnOnce(std::io::Error) -> DatapathError {
    syscall_err(name, "bpf_map_update_batch")
}
