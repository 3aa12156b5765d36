//! Backends that left a TCP service and still carry its connections (issue 30).
//!
//! A TCP connection keeps its backend until it ends, as kube-proxy keeps established
//! connections (Berth reset every connection of a backend that left its slice: its
//! segments were balanced to another backend, which answered RST). A backend removed
//! from a TCP service leaves the service's Maglev table, so it gets no new flow, but
//! keeps its id, its backend entry (weight 0) and its place in the reply index: its
//! connections' packets and replies are translated as before. It is released (id freed,
//! replies no longer expected from it) when a scan of the conntrack that began after it
//! retired finds none of its flows live (`Flow::is_over`: ended by RST, or FIN both
//! ways, more than `FLOW_LINGER` ago, or idle `SNAT_IDLE_TCP`); when its service goes;
//! when backend ids run short (oldest first); or it is a backend again, with its id,
//! when its endpoint comes back. A UDP flow moves to a live backend: a UDP service's
//! removed backends are released at once, as before.
//!
//! A backend that is listed but not ready never gets here: the planner keeps it in its
//! TCP service with weight 0.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
};

use gateway_common::{Flow, ServiceId};

use super::{Datapath, Protocol, Result, ServiceAddr};

/// A removed backend of a TCP service that keeps serving its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Retired {
    /// Its endpoint.
    pub endpoint: SocketAddr,
    /// Its backend id.
    pub bid: u32,
    /// Conntrack scans begun before it retired: only a later scan may release it.
    pub scans: u64,
}

/// The retired backends of every service, and the scans begun.
#[derive(Debug, Default)]
pub(super) struct Retirees {
    by_service: BTreeMap<ServiceAddr, Vec<Retired>>,
    scans: u64,
}

impl Retirees {
    /// The retired backends of `service`.
    pub fn of(&self, service: &ServiceAddr) -> &[Retired] {
        self.by_service.get(service).map_or(&[], Vec::as_slice)
    }

    /// Every retired backend, with its service.
    pub fn all(&self) -> impl Iterator<Item = (&ServiceAddr, &Retired)> {
        self.by_service
            .iter()
            .flat_map(|(s, list)| list.iter().map(move |r| (s, r)))
    }

    /// Retired backends in all.
    pub fn len(&self) -> usize {
        self.by_service.values().map(Vec::len).sum()
    }

    fn retire(&mut self, service: ServiceAddr, endpoint: SocketAddr, bid: u32) {
        let scans = self.scans;
        self.by_service.entry(service).or_default().push(Retired {
            endpoint,
            bid,
            scans,
        });
    }

    /// Takes `endpoint` back out of `service`'s retired backends: its id.
    fn take(&mut self, service: &ServiceAddr, endpoint: &SocketAddr) -> Option<u32> {
        let list = self.by_service.get_mut(service)?;
        let at = list.iter().position(|r| r.endpoint == *endpoint)?;
        let bid = list.remove(at).bid;
        if list.is_empty() {
            self.by_service.remove(service);
        }
        Some(bid)
    }

    /// Takes every retired backend of `service` out.
    fn take_all(&mut self, service: &ServiceAddr) -> Vec<Retired> {
        self.by_service.remove(service).unwrap_or_default()
    }

    /// Notes that a scan begins: what it counts for each retired backend (of service
    /// id, backend id) and the scan's number.
    pub fn scan_begins(&mut self, ids: impl Fn(&ServiceAddr) -> Option<ServiceId>) -> ScanOf {
        self.scans += 1;
        let mut count = HashMap::new();
        for (service, list) in &self.by_service {
            let Some(id) = ids(service) else { continue };
            for r in list {
                count.insert((id, r.bid), 0);
            }
        }
        ScanOf {
            scan: self.scans,
            count,
        }
    }
}

/// What one scan of the conntrack counts for the retired backends.
#[derive(Debug, Default)]
pub(super) struct ScanOf {
    scan: u64,
    /// Live flows per (service id, backend id).
    count: HashMap<(ServiceId, u32), u64>,
}

impl ScanOf {
    /// Counts forward entry `f` if its flow is live on a retired backend at coarse time
    /// `now` (`idle`: a TCP flow's idle timeout, in the same units).
    pub fn see<A: gateway_common::Addr>(&mut self, f: &Flow<A>, now: u32, idle: u32) {
        if self.count.is_empty() || f.kind != gateway_common::NAT_DST {
            return;
        }
        if let Some(n) = self.count.get_mut(&(f.service, f.backend)) {
            *n += u64::from(!f.is_over(now, idle));
        }
    }
}

impl Datapath {
    /// A backend `bid` at `endpoint` left `service` (id `id`, in SNAT mode or not): a
    /// TCP service's keeps its connections (weight 0, see the module doc), a UDP
    /// service's is cleared.
    pub(super) fn retire_backend(
        &mut self,
        service: &ServiceAddr,
        (id, snat): (ServiceId, bool),
        endpoint: SocketAddr,
        (bid, weight): (u32, u16),
    ) -> Result<()> {
        if service.protocol != Protocol::Tcp {
            return self.clear_backend(bid);
        }
        if weight != 0 {
            self.write_backend(bid, id, endpoint, 0, snat)?;
        }
        self.retirees.retire(*service, endpoint, bid);
        Ok(())
    }

    /// The id of `endpoint` if it is a retired backend of `service`, taken back.
    pub(super) fn unretire(&mut self, service: &ServiceAddr, endpoint: &SocketAddr) -> Option<u32> {
        self.retirees.take(service, endpoint)
    }

    /// Clears the retired backends of `service` (which goes).
    pub(super) fn clear_retired(&mut self, service: &ServiceAddr) -> Result<()> {
        for r in self.retirees.take_all(service) {
            self.clear_backend(r.bid)?;
        }
        Ok(())
    }

    /// The endpoints `service` is in the reply index for: its backends and its retired
    /// ones.
    pub(super) fn indexed_endpoints(&self, service: &ServiceAddr) -> Vec<SocketAddr> {
        let installed = self.installed.get(service).into_iter();
        installed
            .flat_map(|svc| svc.backends.keys().copied())
            .chain(self.retirees.of(service).iter().map(|r| r.endpoint))
            .collect()
    }

    /// Releases the retired backends `release` picks: ids freed, the reply index
    /// without them. Returns how many.
    pub(super) fn release_retired(
        &mut self,
        mut release: impl FnMut(&ServiceAddr, &Retired) -> bool,
    ) -> Result<usize> {
        let picked: Vec<(ServiceAddr, Retired)> = self
            .retirees
            .by_service
            .iter()
            .flat_map(|(s, list)| list.iter().map(move |r| (*s, *r)))
            .filter(|(s, r)| release(s, r))
            .collect();
        for (service, r) in &picked {
            let before = self.indexed_endpoints(service);
            self.retirees.take(service, &r.endpoint);
            self.clear_backend(r.bid)?;
            let after = self.indexed_endpoints(service);
            let snat = self.installed.get(service).is_some_and(|svc| svc.snat);
            self.roles
                .book
                .settle(*service, Some(before), None, Some((snat, after)));
            tracing::info!(
                service = %service,
                backend = %r.endpoint,
                "a backend that left its service carries no connection any more: released"
            );
        }
        if !picked.is_empty() {
            for key in self.roles.write(false)? {
                self.write_flags(&key)?;
            }
        }
        Ok(picked.len())
    }

    /// Releases the oldest retired backends until `needed` backend ids are free (or
    /// none is retired).
    pub(super) fn free_backend_ids(&mut self, needed: usize) -> Result<()> {
        let short = needed.saturating_sub(self.backend_ids.free_count());
        if short == 0 || self.retirees.len() == 0 {
            return Ok(());
        }
        let mut oldest: Vec<(u64, u32)> = self
            .retirees
            .by_service
            .values()
            .flatten()
            .map(|r| (r.scans, r.bid))
            .collect();
        oldest.sort_unstable();
        let picked: std::collections::BTreeSet<u32> =
            oldest.into_iter().take(short).map(|(_, bid)| bid).collect();
        let n = self.release_retired(|_, r| picked.contains(&r.bid))?;
        tracing::warn!(
            released = n,
            "backend ids short: backends that left their services released with their \
             connections"
        );
        Ok(())
    }

    /// Backend ids `changes` may take: the endpoints they want that their services do
    /// not have. 0 while nothing is retired (then there is nothing to free for them).
    pub(super) fn backends_added(&self, ops: &[super::diff::MapOp]) -> usize {
        if self.retirees.len() == 0 {
            return 0;
        }
        ops.iter()
            .filter_map(|op| Some((op.service(), op.wanted()?)))
            .map(|(key, want)| {
                let have = self.installed.get(&key);
                want.keys()
                    .filter(|e| have.is_none_or(|svc| !svc.backends.contains_key(e)))
                    .count()
            })
            .sum()
    }

    /// After scan `of` (not given up): releases the retired backends it found no live
    /// flow of, if they retired before it began.
    pub(super) fn release_idle_retired(&mut self, of: &ScanOf) -> Result<usize> {
        let idle: std::collections::BTreeSet<(ServiceAddr, u32)> = self
            .retirees
            .by_service
            .iter()
            .flat_map(|(s, list)| {
                let id = self.installed.get(s).map(|svc| svc.id);
                list.iter()
                    .filter(move |r| {
                        r.scans < of.scan
                            && id
                                .and_then(|id| of.count.get(&(id, r.bid)))
                                .is_some_and(|&n| n == 0)
                    })
                    .map(move |r| (*s, r.bid))
            })
            .collect();
        if idle.is_empty() {
            return Ok(0);
        }
        self.release_retired(|s, r| idle.contains(&(*s, r.bid)))
    }

    /// Per service, its flows live on retired backends, as scan `of` counted them.
    pub(super) fn flows_on_retired(&self, of: &ScanOf) -> BTreeMap<ServiceAddr, u64> {
        let mut out = BTreeMap::new();
        for (service, list) in &self.retirees.by_service {
            let Some(svc) = self.installed.get(service) else {
                continue;
            };
            let n: u64 = list
                .iter()
                .filter_map(|r| of.count.get(&(svc.id, r.bid)))
                .sum();
            out.insert(*service, n);
        }
        out
    }
}
