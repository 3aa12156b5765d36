//! The maps that tell the kernel program a packet's role without a conntrack lookup:
//! the address filter (`addr_slot(address)` → is some gateway / backend address there;
//! one array for both families) and the reply index of each family (backend endpoint →
//! the router-mode services it serves, so a reply finds its flow's forward entry and no
//! flow needs a second entry). Both follow from the installed services alone, kept in a
//! `Book` service by service.
//!
//! Written twice per change, for the keys the change touched alone: before the services
//! change, for the union of what is installed and what is wanted (a reply of a service
//! being added or removed is found throughout), and after, for exactly what is
//! installed. At start, and after a failed write, every key is written.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
};

use aya::maps::{Array, HashMap, MapData};
use gateway_common::{map_names, ReplyIndex, ServiceKey, ADDR_FILTER_SLOTS};

use super::{
    family::{endpoint_of, key, Addr6, ByFamily, MapAddr},
    map_err,
    role_book::{Book, Endpoint, Touched},
    Result, ServiceAddr,
};

/// A reply index of one family.
type Index<A> = BTreeMap<ServiceKey<A>, ReplyIndex<A>>;

/// What the maps hold, and which services' router-mode flows record reply entries (an
/// endpoint of theirs serves more services than `REPLY_CANDIDATES`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Roles {
    pub index: ByFamily<Index<u32>, Index<Addr6>>,
    pub filter: BTreeMap<u32, u32>,
    pub reply_entry: BTreeSet<ServiceAddr>,
}

/// A reply index map of one family.
type IndexMap<A> = HashMap<MapData, ServiceKey<A>, ReplyIndex<A>>;

/// The maps, the book of the roles they should hold, and what this process wrote.
pub(super) struct RoleMaps {
    index: ByFamily<IndexMap<u32>, IndexMap<Addr6>>,
    filter: Array<MapData, u32>,
    /// The roles of the installed services (and, between the two writes of a change,
    /// of the wanted ones).
    pub book: Book,
    /// What the maps hold, once read or written by this process.
    written: Option<Roles>,
    /// The next write covers every key: the maps were not yet written exactly from
    /// the book (at start, after a failure).
    full_due: bool,
}

impl RoleMaps {
    pub fn new(
        index: ByFamily<IndexMap<u32>, IndexMap<Addr6>>,
        filter: Array<MapData, u32>,
    ) -> Self {
        RoleMaps {
            index,
            filter,
            book: Book::default(),
            written: None,
            full_due: true,
        }
    }

    /// Whether the maps hold exactly what the book said at the last write.
    pub fn is_exact(&self) -> bool {
        self.written.is_some() && !self.full_due
    }

    /// Starts the book afresh from `services` (service, SNAT mode, endpoints); the
    /// next write covers every key.
    pub fn reset(
        &mut self,
        services: impl IntoIterator<Item = (ServiceAddr, bool, Vec<SocketAddr>)>,
    ) {
        self.book = Book::of(services);
        self.full_due = true;
    }

    /// The router-mode services whose flows record a reply entry, as last written.
    pub fn reply_entry(&self, service: &ServiceAddr) -> bool {
        self.written
            .as_ref()
            .is_some_and(|w| w.reply_entry.contains(service))
    }

    /// Makes the maps hold what the book says for the keys it touched (every key
    /// when due); with `keep`, entries the book no longer has stay (the union written
    /// before services change) and the touched keys stay touched for the exact write
    /// after. Returns the services whose reply-entry role changed (their
    /// `Service::flags` are the caller's to rewrite).
    pub fn write(&mut self, keep: bool) -> Result<BTreeSet<ServiceAddr>> {
        let mut have = match self.written.take() {
            Some(have) => have,
            None => {
                self.full_due = true;
                self.read()?
            }
        };
        let mut scope = if keep {
            self.book.touched().clone()
        } else {
            self.book.take_touched()
        };
        if self.full_due {
            scope.extend(self.book.keys());
            scope.extend(keys_of(&have));
        }
        // Additions before removals: a role is never missing in between.
        let v4 = diff::<u32>(&self.book, &scope.endpoints, &have.index.v4);
        let v6 = diff::<Addr6>(&self.book, &scope.endpoints, &have.index.v6);
        let filter: Vec<(u32, u32)> = scope
            .slots
            .iter()
            .map(|&slot| {
                let kept = if keep {
                    have.filter.get(&slot).copied().unwrap_or(0)
                } else {
                    0
                };
                (slot, self.book.bits(slot) | kept)
            })
            .filter(|(slot, bits)| have.filter.get(slot).copied().unwrap_or(0) != *bits)
            .collect();
        put(
            &mut self.index.v4,
            &mut have.index.v4,
            &v4,
            map_names::REPLY_INDEX,
        )?;
        put(
            &mut self.index.v6,
            &mut have.index.v6,
            &v6,
            map_names::REPLY_INDEX6,
        )?;
        for &(slot, bits) in filter.iter().filter(|(_, bits)| *bits != 0) {
            self.filter
                .set(slot, bits, 0)
                .map_err(map_err(map_names::ADDR_FILTER))?;
            have.filter.insert(slot, bits);
        }
        if !keep {
            take(
                &mut self.index.v4,
                &mut have.index.v4,
                &v4,
                map_names::REPLY_INDEX,
            )?;
            take(
                &mut self.index.v6,
                &mut have.index.v6,
                &v6,
                map_names::REPLY_INDEX6,
            )?;
            for &(slot, _) in filter.iter().filter(|(_, bits)| *bits == 0) {
                self.filter
                    .set(slot, 0, 0)
                    .map_err(map_err(map_names::ADDR_FILTER))?;
                have.filter.remove(&slot);
            }
        }
        let mut changed = BTreeSet::new();
        for service in &scope.services {
            let want = self.book.reply_entry(service);
            if want && have.reply_entry.insert(*service) {
                changed.insert(*service);
            }
            if !want && !keep && have.reply_entry.remove(service) {
                changed.insert(*service);
            }
        }
        self.written = Some(have);
        if !keep {
            self.full_due = false;
        }
        Ok(changed)
    }

    /// What an earlier run left in the maps (reply-entry services are not in a map:
    /// the services' flags hold them, and they are written again).
    fn read(&self) -> Result<Roles> {
        let mut roles = Roles {
            index: ByFamily {
                v4: read_all(&self.index.v4, map_names::REPLY_INDEX)?,
                v6: read_all(&self.index.v6, map_names::REPLY_INDEX6)?,
            },
            ..Roles::default()
        };
        for slot in 0..ADDR_FILTER_SLOTS {
            let bits = self
                .filter
                .get(&slot, 0)
                .map_err(map_err(map_names::ADDR_FILTER))?;
            if bits != 0 {
                roles.filter.insert(slot, bits);
            }
        }
        Ok(roles)
    }
}

impl Touched {
    fn extend(&mut self, other: Touched) {
        self.endpoints.extend(other.endpoints);
        self.slots.extend(other.slots);
        self.services.extend(other.services);
    }
}

/// Every key `roles` holds.
fn keys_of(roles: &Roles) -> Touched {
    let endpoints = |index_v4: &Index<u32>, index_v6: &Index<Addr6>| -> BTreeSet<Endpoint> {
        let v4 = index_v4
            .keys()
            .map(|k| (endpoint_of(k.addr, k.port), k.proto));
        let v6 = index_v6
            .keys()
            .map(|k| (endpoint_of(k.addr, k.port), k.proto));
        v4.chain(v6).collect()
    };
    Touched {
        endpoints: endpoints(&roles.index.v4, &roles.index.v6),
        slots: roles.filter.keys().copied().collect(),
        services: roles.reply_entry.clone(),
    }
}

/// The index entries of family `A` among `endpoints` that differ from `have`: the
/// entry wanted, or `None` where the endpoint serves nothing any more.
fn diff<A: MapAddr>(
    book: &Book,
    endpoints: &BTreeSet<Endpoint>,
    have: &Index<A>,
) -> Vec<(ServiceKey<A>, Option<ReplyIndex<A>>)> {
    endpoints
        .iter()
        .filter_map(|e| {
            let at = key::<A>(e.0.ip(), e.0.port(), e.1)?;
            let want = book.entry::<A>(e);
            (have.get(&at) != want.as_ref()).then_some((at, want))
        })
        .collect()
}

/// Writes the wanted entries of `changes`.
fn put<A: MapAddr>(
    map: &mut IndexMap<A>,
    have: &mut Index<A>,
    changes: &[(ServiceKey<A>, Option<ReplyIndex<A>>)],
    name: &'static str,
) -> Result<()> {
    for (k, want) in changes {
        if let Some(v) = want {
            map.insert(k, v, 0).map_err(map_err(name))?;
            have.insert(*k, *v);
        }
    }
    Ok(())
}

/// Removes the entries `changes` no longer want.
fn take<A: MapAddr>(
    map: &mut IndexMap<A>,
    have: &mut Index<A>,
    changes: &[(ServiceKey<A>, Option<ReplyIndex<A>>)],
    name: &'static str,
) -> Result<()> {
    for (k, want) in changes {
        if want.is_none() && have.remove(k).is_some() {
            match map.remove(k) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(name)(e)),
            }
        }
    }
    Ok(())
}

/// Every entry of `map`.
fn read_all<K: aya::Pod + Ord, V: aya::Pod>(
    map: &HashMap<MapData, K, V>,
    name: &'static str,
) -> Result<BTreeMap<K, V>> {
    map.iter().map(|item| item.map_err(map_err(name))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::{role_book::slot, Protocol};
    use gateway_common::{ADDR_BACKEND, ADDR_GATEWAY, REPLY_CANDIDATES, REPLY_INDEX_SNAT};

    fn service(addr: &str, port: u16) -> ServiceAddr {
        ServiceAddr::of(addr, Protocol::Udp, port)
    }

    fn view(
        service: ServiceAddr,
        snat: bool,
        endpoints: &[SocketAddr],
    ) -> (ServiceAddr, bool, Vec<SocketAddr>) {
        (service, snat, endpoints.to_vec())
    }

    /// The roles of `services` in full, as written at start.
    fn roles_of(services: impl IntoIterator<Item = (ServiceAddr, bool, Vec<SocketAddr>)>) -> Roles {
        let book = Book::of(services);
        let keys = book.keys();
        let mut roles = Roles::default();
        for e in &keys.endpoints {
            let (ip, port) = (e.0.ip(), e.0.port());
            if let (Some(at), Some(v)) = (key::<u32>(ip, port, e.1), book.entry::<u32>(e)) {
                roles.index.v4.insert(at, v);
            }
            if let (Some(at), Some(v)) = (key::<Addr6>(ip, port, e.1), book.entry::<Addr6>(e)) {
                roles.index.v6.insert(at, v);
            }
        }
        roles.filter = keys.slots.iter().map(|&s| (s, book.bits(s))).collect();
        roles.reply_entry = keys.services;
        roles
    }

    #[test]
    fn endpoints_shared_beyond_the_index_record_reply_entries() {
        let shared = ["10.0.0.1:53".parse().unwrap()];
        let own = ["10.0.0.2:53".parse().unwrap()];
        let mut services: Vec<_> = (0..REPLY_CANDIDATES as u16 + 1)
            .map(|i| view(service("192.0.2.1", 1000 + i), false, &shared))
            .collect();
        services.push(view(service("192.0.2.1", 2000), true, &own));
        let roles = roles_of(services);
        let at = |e: SocketAddr| key::<u32>(e.ip(), e.port(), 17).unwrap();
        let entry = roles.index.v4[&at(shared[0])];
        assert_eq!(u32::from(entry.count), REPLY_CANDIDATES);
        assert_eq!(entry.flags, 0);
        assert_eq!(roles.index.v4[&at(own[0])].flags, REPLY_INDEX_SNAT);
        assert_eq!(
            roles.reply_entry,
            BTreeSet::from([service("192.0.2.1", 1000 + REPLY_CANDIDATES as u16)])
        );
        let gw = slot("192.0.2.1".parse().unwrap());
        assert_eq!(roles.filter[&gw] & ADDR_GATEWAY, ADDR_GATEWAY);
        for e in [shared[0], own[0]] {
            assert_eq!(roles.filter[&slot(e.ip())] & ADDR_BACKEND, ADDR_BACKEND);
        }
    }

    #[test]
    fn ipv6_hosts_of_different_subnets_ending_alike_get_different_filter_slots() {
        // The last 16 bits gave a client fd00:250:1::a its backend fd00:250:2::a's
        // slot: every packet of it took the hash lookups (bench datapath's IPv6 miss).
        let at = |subnet: u16, host: u16| {
            slot(std::net::Ipv6Addr::new(0xfd00, 0x250, subnet, 0, 0, 0, 0, host).into())
        };
        assert_ne!(at(1, 10), at(2, 10));
        for host in [1, 2, 10] {
            let slots: BTreeSet<u32> = (0..256).map(|subnet| at(subnet, host)).collect();
            assert!(
                slots.len() >= 250,
                "::{host} in 256 subnets: {} slots",
                slots.len()
            );
        }
        // IPv4 keeps its last 16 bits: a subnet up to a /16 never shares a slot.
        assert_eq!(slot("10.250.2.10".parse().unwrap()), 0x020a);
    }

    #[test]
    fn ipv6_endpoints_go_to_the_ipv6_index_and_share_the_filter() {
        let v6 = service("2001:db8::100", 53);
        let backend: SocketAddr = "[2001:db8:1::5]:53".parse().unwrap();
        let roles = roles_of([view(v6, false, &[backend])]);
        assert!(roles.index.v4.is_empty());
        let entry = roles.index.v6[&key::<Addr6>(backend.ip(), 53, 17).unwrap()];
        assert_eq!(entry.count, 1);
        assert_eq!(entry.services[0], key::<Addr6>(v6.addr, 53, 17).unwrap());
        // One filter for both families (an IPv6 address's slot is a hash of it).
        assert_eq!(roles.filter[&slot(v6.addr)], ADDR_GATEWAY);
        assert_eq!(roles.filter[&slot(backend.ip())], ADDR_BACKEND);
    }
}
