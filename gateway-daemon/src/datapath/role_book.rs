//! The roles of the installed services, kept service by service: which services each
//! backend endpoint serves, how many addresses fall into each address-filter slot, and
//! which services an endpoint serves beyond its reply index's candidates. A change of a
//! few services touches only the entries of their endpoints and slots; the book says
//! which (`Touched`), so that the maps are written for those alone (100,000 services
//! recomputed twice per change cost 60 ms, measured).

use std::{
    collections::{BTreeSet, HashMap},
    net::{IpAddr, SocketAddr},
};

use gateway_common::{addr_slot, ReplyIndex, ADDR_BACKEND, ADDR_GATEWAY, REPLY_INDEX_SNAT};

use super::{
    family::{key, Addr6, MapAddr},
    ServiceAddr,
};

/// A backend endpoint as the reply index keys it: address and port, protocol number.
pub(super) type Endpoint = (SocketAddr, u8);

/// Services one endpoint's reply index entry names.
const CANDIDATES: usize = gateway_common::REPLY_CANDIDATES as usize;

/// The address-filter slot of `ip`, as the kernel program computes it.
pub(super) fn slot(ip: IpAddr) -> u32 {
    match ip {
        IpAddr::V4(_) => u32::of(ip).map_or(0, addr_slot),
        IpAddr::V6(_) => Addr6::of(ip).map_or(0, addr_slot),
    }
}

/// The roles of a set of services, kept as services are added and removed.
#[derive(Debug, Default)]
pub(super) struct Book {
    /// Each endpoint's services in service order, with whether each is in SNAT mode.
    serving: HashMap<Endpoint, Serving>,
    /// Per filter slot: services whose gateway address falls there, and endpoints of
    /// services whose address does (`[gateways, backends]`).
    slots: HashMap<u32, [u32; 2]>,
    /// Services an endpoint serves beyond its `REPLY_CANDIDATES`, with how many such
    /// endpoints: their router-mode flows record reply entries.
    overflow: HashMap<ServiceAddr, u32>,
    /// What changed since it was last taken.
    touched: Touched,
}

/// The keys whose entries may differ from what was written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Touched {
    /// Endpoints whose services changed.
    pub endpoints: BTreeSet<Endpoint>,
    /// Filter slots an address entered or left.
    pub slots: BTreeSet<u32>,
    /// Services that started or stopped serving beyond some endpoint's candidates.
    pub services: BTreeSet<ServiceAddr>,
}

impl Book {
    /// A book of `services` (service, SNAT mode, endpoints), everything touched.
    pub fn of(services: impl IntoIterator<Item = (ServiceAddr, bool, Vec<SocketAddr>)>) -> Self {
        let mut book = Book::default();
        for (service, snat, endpoints) in services {
            book.add(service, snat, endpoints);
        }
        book
    }

    /// Adds `service` with `endpoints`. Adding a service again (its wanted endpoints
    /// beside its installed ones, for the union written before it changes) keeps it
    /// once per endpoint; each `add` is undone by one `remove`.
    pub fn add(
        &mut self,
        service: ServiceAddr,
        snat: bool,
        endpoints: impl IntoIterator<Item = SocketAddr>,
    ) {
        self.count(slot(service.addr), 0, true);
        let proto = service.protocol.number();
        for endpoint in endpoints {
            self.count(slot(endpoint.ip()), 1, true);
            let at = (endpoint, proto);
            self.touched.endpoints.insert(at);
            let set = self.serving.entry(at).or_default();
            if let Some(s) = set.get_mut(&service) {
                // SNAT services are candidates too: flows a service started in router
                // mode keep their one entry after it switched.
                *s |= snat;
                continue;
            }
            set.insert(service, snat);
            // Past the candidates, one service more serves beyond them: the new one,
            // or the one it pushed out.
            let pushed = (set.len() > CANDIDATES).then(|| {
                if rank(set, &service) < CANDIDATES {
                    set.keys().nth(CANDIDATES).copied()
                } else {
                    Some(service)
                }
            });
            if let Some(Some(s)) = pushed {
                self.overflow_by(s, true);
            }
        }
    }

    /// After `service` changed: takes out its installed view before (`was`) and the
    /// view added for the union written before the change (`wanted`), and puts in what
    /// it is installed with now (`now`: SNAT mode, endpoints). Each view comes out as
    /// often as it went in: a service added counts its address once, a service removed
    /// none (taking out a view never added took a shared address's count with it:
    /// removing one route of a Gateway made the others' address pass untouched).
    pub fn settle(
        &mut self,
        service: ServiceAddr,
        was: Option<Vec<SocketAddr>>,
        wanted: Option<Vec<SocketAddr>>,
        now: Option<(bool, Vec<SocketAddr>)>,
    ) {
        for view in [was, wanted].into_iter().flatten() {
            self.remove(service, view);
        }
        if let Some((snat, endpoints)) = now {
            self.add(service, snat, endpoints);
        }
    }

    /// Removes `service` from `endpoints` (those it is not at are left alone). Undoes
    /// one `add` of the service: its address is counted out once per call.
    pub fn remove(
        &mut self,
        service: ServiceAddr,
        endpoints: impl IntoIterator<Item = SocketAddr>,
    ) {
        self.count(slot(service.addr), 0, false);
        let proto = service.protocol.number();
        for endpoint in endpoints {
            self.count(slot(endpoint.ip()), 1, false);
            let at = (endpoint, proto);
            let Some(set) = self.serving.get_mut(&at) else {
                continue;
            };
            if !set.contains_key(&service) {
                continue;
            }
            self.touched.endpoints.insert(at);
            // One service fewer serves beyond the candidates: this one, or the first
            // beyond them, which moves up.
            let lifted = (set.len() > CANDIDATES).then(|| {
                if rank(set, &service) < CANDIDATES {
                    set.keys().nth(CANDIDATES).copied()
                } else {
                    Some(service)
                }
            });
            set.remove(&service);
            if set.is_empty() {
                self.serving.remove(&at);
            }
            if let Some(Some(s)) = lifted {
                self.overflow_by(s, false);
            }
        }
    }

    /// What changed since last taken.
    pub fn touched(&self) -> &Touched {
        &self.touched
    }

    /// Takes what changed.
    pub fn take_touched(&mut self) -> Touched {
        std::mem::take(&mut self.touched)
    }

    /// Whether `service`'s router-mode flows record reply entries (an endpoint of its
    /// serves it beyond the candidates).
    pub fn reply_entry(&self, service: &ServiceAddr) -> bool {
        self.overflow.contains_key(service)
    }

    /// The filter bits of `slot`.
    pub fn bits(&self, slot: u32) -> u32 {
        let [gateways, backends] = self.slots.get(&slot).copied().unwrap_or_default();
        let mut bits = 0;
        if gateways > 0 {
            bits |= ADDR_GATEWAY;
        }
        if backends > 0 {
            bits |= ADDR_BACKEND;
        }
        bits
    }

    /// The reply index entry of `endpoint` in family `A`, if it serves any service.
    /// Only services of the endpoint's family are named (the datapath holds back any
    /// other: `held_back.rs`).
    pub fn entry<A: MapAddr>(&self, endpoint: &Endpoint) -> Option<ReplyIndex<A>> {
        let set = self.serving.get(endpoint)?;
        let mut entry = ReplyIndex::default();
        if set.values().any(|&snat| snat) {
            entry.flags |= REPLY_INDEX_SNAT;
        }
        let keyed = set
            .keys()
            .filter_map(|s| key::<A>(s.addr, s.port, s.protocol.number()));
        for (slot, k) in entry.services.iter_mut().zip(keyed) {
            *slot = k;
            entry.count += 1;
        }
        Some(entry)
    }

    /// Every endpoint, filter slot and reply-entry service of the book.
    pub fn keys(&self) -> Touched {
        Touched {
            endpoints: self.serving.keys().copied().collect(),
            slots: self.slots.keys().copied().collect(),
            services: self.overflow.keys().copied().collect(),
        }
    }

    fn count(&mut self, slot: u32, which: usize, up: bool) {
        let counts = self.slots.entry(slot).or_default();
        let before = counts[which];
        counts[which] = if up {
            before + 1
        } else {
            before.saturating_sub(1)
        };
        let now = *counts;
        if (before == 0) != (now[which] == 0) {
            self.touched.slots.insert(slot);
        }
        if now == [0, 0] {
            self.slots.remove(&slot);
        }
    }

    fn overflow_by(&mut self, service: ServiceAddr, up: bool) {
        let n = self.overflow.entry(service).or_default();
        let before = *n;
        *n = if up {
            before + 1
        } else {
            before.saturating_sub(1)
        };
        if *n == 0 {
            self.overflow.remove(&service);
        }
        if before == 0 || !self.overflow.contains_key(&service) {
            self.touched.services.insert(service);
        }
    }
}

/// How many services of `set` come before `service`, counted up to `CANDIDATES`.
fn rank(set: &Serving, service: &ServiceAddr) -> usize {
    set.rank(service).min(CANDIDATES)
}

/// The services one endpoint serves, in service order, with whether each is in SNAT
/// mode. A sorted vector: an endpoint serves one service or a few, and a `BTreeMap`
/// took a node of about 250 bytes for one (25 MB at 100,000 services).
type Serving = crate::vec_map::VecMap<ServiceAddr, bool>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::Protocol;
    use std::collections::BTreeMap;

    fn service(port: u16) -> ServiceAddr {
        ServiceAddr {
            addr: "192.0.2.1".parse().unwrap(),
            protocol: Protocol::Udp,
            port,
        }
    }

    /// What a book says in full: entries, filter bits, reply-entry services.
    type Said = (
        Vec<(Endpoint, ReplyIndex<u32>)>,
        Vec<(u32, u32)>,
        Vec<ServiceAddr>,
    );

    fn said(book: &Book) -> Said {
        let keys = book.keys();
        let entries = keys
            .endpoints
            .iter()
            .map(|e| (*e, book.entry::<u32>(e).unwrap()))
            .collect();
        let slots = keys.slots.iter().map(|&s| (s, book.bits(s))).collect();
        (entries, slots, keys.services.into_iter().collect())
    }

    #[test]
    fn a_book_kept_through_adds_and_removes_says_what_a_fresh_one_says() {
        // Services 0..12 over 3 shared endpoints and one of their own each, added,
        // partly removed and added again with other endpoints and modes, in a mixed
        // order; at every step the kept book equals one built from scratch.
        let shared: Vec<SocketAddr> = (1..=3)
            .map(|i| format!("10.0.0.{i}:53").parse().unwrap())
            .collect();
        let view = |i: u16, round: u16| -> (ServiceAddr, bool, Vec<SocketAddr>) {
            let own: SocketAddr = format!("10.0.{}.{}:53", 1 + round, 10 + i).parse().unwrap();
            let mut eps = vec![own];
            eps.extend(shared.iter().skip(usize::from((i + round) % 3)).copied());
            (
                service(1000 + (i * 7) % 13),
                (i + round).is_multiple_of(4),
                eps,
            )
        };
        let mut kept = Book::default();
        let mut live: BTreeMap<ServiceAddr, (bool, Vec<SocketAddr>)> = BTreeMap::new();
        for round in 0..3u16 {
            for i in 0..12u16 {
                let (s, snat, eps) = view(i, round);
                if let Some((_, old)) = live.remove(&s) {
                    kept.remove(s, old);
                }
                if !(i + round).is_multiple_of(5) {
                    kept.add(s, snat, eps.clone());
                    live.insert(s, (snat, eps));
                }
                let fresh = Book::of(live.iter().map(|(s, (n, e))| (*s, *n, e.clone())));
                assert_eq!(said(&kept), said(&fresh), "round {round}, service {i}");
            }
        }
        assert!(
            !kept.overflow.is_empty(),
            "the shared endpoints serve beyond the candidates"
        );
    }

    #[test]
    fn changes_settled_as_apply_settles_them_keep_a_shared_gateway_address() {
        // Two services on one gateway address; one is removed, one added, one
        // changed, each as `apply` does it: the wanted view added for the union, then
        // settled. The book equals one built afresh, and the address stays a gateway.
        let a: SocketAddr = "10.0.0.1:53".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:53".parse().unwrap();
        let mut book = Book::of([(service(1), false, vec![a]), (service(2), false, vec![b])]);
        // Service 1 removed.
        book.settle(service(1), Some(vec![a]), None, None);
        // Service 3 added on a.
        book.add(service(3), false, [a]);
        book.settle(service(3), None, Some(vec![a]), Some((false, vec![a])));
        // Service 2 moved from b to a.
        book.add(service(2), false, [a]);
        book.settle(
            service(2),
            Some(vec![b]),
            Some(vec![a]),
            Some((false, vec![a])),
        );
        let fresh = Book::of([(service(2), false, vec![a]), (service(3), false, vec![a])]);
        assert_eq!(said(&book), said(&fresh));
        let gw = slot(service(2).addr);
        assert_eq!(book.bits(gw) & ADDR_GATEWAY, ADDR_GATEWAY);
        assert_eq!(book.bits(slot(b.ip())), 0, "b serves nothing any more");
    }

    #[test]
    fn a_union_added_on_top_and_taken_away_again_leaves_the_book_as_it_was() {
        let a: SocketAddr = "10.0.0.1:53".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:53".parse().unwrap();
        let mut book = Book::of([(service(1), false, vec![a])]);
        let before = said(&book);
        book.take_touched();
        // The union: service 1 wanted on b in SNAT mode, beside its installed a.
        book.add(service(1), true, [b]);
        assert_eq!(book.entry::<u32>(&(b, 17)).unwrap().flags, REPLY_INDEX_SNAT);
        assert_eq!(book.bits(slot(b.ip())), ADDR_BACKEND);
        // Not applied after all: both views taken away, the installed one put back.
        book.remove(service(1), [a]);
        book.remove(service(1), [b]);
        book.add(service(1), false, [a]);
        assert_eq!(said(&book), before);
        let touched = book.take_touched();
        assert_eq!(touched.endpoints, BTreeSet::from([(a, 17), (b, 17)]));
        assert!(touched.slots.contains(&slot(b.ip())));
    }
}
