//! The maps that tell the kernel program a packet's role without a conntrack lookup:
//! the address filter (`addr_slot(address)` → is some gateway / backend address there;
//! one array for both families) and the reply index of each family (backend endpoint →
//! the router-mode services it serves, so a reply finds its flow's forward entry and no
//! flow needs a second entry). Both follow from the installed services alone.
//!
//! Written twice per change: before the services change, for the union of what is
//! installed and what is wanted (a reply of a service being added or removed is found
//! throughout), and after, for exactly what is installed.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

use aya::maps::{Array, HashMap, MapData};
use gateway_common::{
    addr_slot, map_names, ReplyIndex, ServiceKey, ADDR_BACKEND, ADDR_FILTER_SLOTS, ADDR_GATEWAY,
    REPLY_INDEX_SNAT,
};

use super::{
    family::{key, Addr6, ByFamily, MapAddr},
    map_err, Result, ServiceAddr,
};

/// One service as the roles see it: the service, whether it is in SNAT mode, its
/// endpoints (of its family).
pub(super) struct ServiceView<'a> {
    pub service: ServiceAddr,
    pub snat: bool,
    pub endpoints: Box<dyn Iterator<Item = SocketAddr> + 'a>,
}

/// A reply index of one family.
type Index<A> = BTreeMap<ServiceKey<A>, ReplyIndex<A>>;

/// What the maps should hold, and which services' router-mode flows must record reply
/// entries (an endpoint of theirs serves more services than `REPLY_CANDIDATES`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Roles {
    pub index: ByFamily<Index<u32>, Index<Addr6>>,
    pub filter: BTreeMap<u32, u32>,
    pub reply_entry: BTreeSet<ServiceAddr>,
}

/// The address-filter slot of `ip`, as the kernel program computes it.
fn slot(ip: IpAddr) -> u32 {
    match ip {
        IpAddr::V4(_) => u32::of(ip).map_or(0, addr_slot),
        IpAddr::V6(_) => Addr6::of(ip).map_or(0, addr_slot),
    }
}

impl Roles {
    /// The roles of `services` (each service once).
    pub fn of<'a>(services: impl Iterator<Item = ServiceView<'a>>) -> Roles {
        let mut roles = Roles::default();
        // (Endpoint, protocol) → (its services, whether one is in SNAT mode).
        type Serving = BTreeMap<(SocketAddr, u8), (BTreeSet<ServiceAddr>, bool)>;
        let mut serving = Serving::new();
        for svc in services {
            *roles.filter.entry(slot(svc.service.addr)).or_default() |= ADDR_GATEWAY;
            for endpoint in svc.endpoints {
                *roles.filter.entry(slot(endpoint.ip())).or_default() |= ADDR_BACKEND;
                // SNAT services are candidates too: flows a service started in router
                // mode keep their one entry after it switched.
                let proto = svc.service.protocol.number();
                let (services, snat) = serving.entry((endpoint, proto)).or_default();
                services.insert(svc.service);
                *snat |= svc.snat;
            }
        }
        for ((endpoint, proto), (services, snat)) in serving {
            let overflow = &mut roles.reply_entry;
            let (ip, port) = (endpoint.ip(), endpoint.port());
            if let Some(at) = key::<u32>(ip, port, proto) {
                roles.index.v4.insert(at, entry(services, snat, overflow));
            } else if let Some(at) = key::<Addr6>(ip, port, proto) {
                roles.index.v6.insert(at, entry(services, snat, overflow));
            }
        }
        roles
    }
}

/// The reply index entry of an endpoint serving `services`; those beyond the entry's
/// candidates go to `overflow` (their flows record reply entries).
fn entry<A: MapAddr>(
    services: BTreeSet<ServiceAddr>,
    snat: bool,
    overflow: &mut BTreeSet<ServiceAddr>,
) -> ReplyIndex<A> {
    let mut entry = ReplyIndex::default();
    if snat {
        entry.flags |= REPLY_INDEX_SNAT;
    }
    let keyed = services.into_iter().filter_map(|s| {
        let k = key::<A>(s.addr, s.port, s.protocol.number())?;
        Some((s, k))
    });
    for (i, (service, k)) in keyed.enumerate() {
        match entry.services.get_mut(i) {
            Some(slot) => {
                *slot = k;
                entry.count += 1;
            }
            None => {
                overflow.insert(service);
            }
        }
    }
    entry
}

/// A reply index map of one family.
type IndexMap<A> = HashMap<MapData, ServiceKey<A>, ReplyIndex<A>>;

/// The maps and what this process wrote into them.
pub(super) struct RoleMaps {
    index: ByFamily<IndexMap<u32>, IndexMap<Addr6>>,
    filter: Array<MapData, u32>,
    /// What the maps hold, once read or written by this process.
    written: Option<Roles>,
    /// The last write was exact (not a union kept with what was there).
    exact: bool,
}

impl RoleMaps {
    pub fn new(
        index: ByFamily<IndexMap<u32>, IndexMap<Addr6>>,
        filter: Array<MapData, u32>,
    ) -> Self {
        RoleMaps {
            index,
            filter,
            written: None,
            exact: false,
        }
    }

    /// Whether the maps hold exactly what this process last wanted (its last write was
    /// not a union).
    pub fn is_exact(&self) -> bool {
        self.written.is_some() && self.exact
    }

    /// The router-mode services whose flows record a reply entry, as last written.
    pub fn reply_entry(&self, service: &ServiceAddr) -> bool {
        self.written
            .as_ref()
            .is_some_and(|w| w.reply_entry.contains(service))
    }

    /// Makes the maps hold `want`; with `keep`, entries not in `want` stay (the union
    /// written before services change). Returns the services whose reply-entry role
    /// changed (their `Service::flags` are the caller's to rewrite).
    pub fn write(&mut self, mut want: Roles, keep: bool) -> Result<BTreeSet<ServiceAddr>> {
        let have = match self.written.take() {
            Some(have) => have,
            None => self.read()?,
        };
        if keep {
            keep_all(&mut want.index.v4, &have.index.v4);
            keep_all(&mut want.index.v6, &have.index.v6);
            for (slot, bits) in &have.filter {
                *want.filter.entry(*slot).or_default() |= bits;
            }
            want.reply_entry.extend(have.reply_entry.iter().copied());
        }
        // Additions before removals: a role is never missing in between.
        add_changed(
            &mut self.index.v4,
            &have.index.v4,
            &want.index.v4,
            map_names::REPLY_INDEX,
        )?;
        add_changed(
            &mut self.index.v6,
            &have.index.v6,
            &want.index.v6,
            map_names::REPLY_INDEX6,
        )?;
        for (slot, bits) in &want.filter {
            if have.filter.get(slot) != Some(bits) {
                self.filter
                    .set(*slot, bits, 0)
                    .map_err(map_err(map_names::ADDR_FILTER))?;
            }
        }
        remove_gone(
            &mut self.index.v4,
            &have.index.v4,
            &want.index.v4,
            map_names::REPLY_INDEX,
        )?;
        remove_gone(
            &mut self.index.v6,
            &have.index.v6,
            &want.index.v6,
            map_names::REPLY_INDEX6,
        )?;
        for slot in have.filter.keys().filter(|s| !want.filter.contains_key(s)) {
            self.filter
                .set(*slot, 0, 0)
                .map_err(map_err(map_names::ADDR_FILTER))?;
        }
        let changed = have
            .reply_entry
            .symmetric_difference(&want.reply_entry)
            .copied()
            .collect();
        self.written = Some(want);
        self.exact = !keep;
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

/// Adds to `want` the entries of `have` it lacks.
fn keep_all<K: Ord + Copy, V: Copy>(want: &mut BTreeMap<K, V>, have: &BTreeMap<K, V>) {
    for (k, v) in have {
        want.entry(*k).or_insert(*v);
    }
}

/// Writes the entries of `want` that `have` lacks or holds otherwise.
fn add_changed<K: aya::Pod + Ord, V: aya::Pod + PartialEq>(
    map: &mut HashMap<MapData, K, V>,
    have: &BTreeMap<K, V>,
    want: &BTreeMap<K, V>,
    name: &'static str,
) -> Result<()> {
    for (k, v) in want {
        if have.get(k) != Some(v) {
            map.insert(k, v, 0).map_err(map_err(name))?;
        }
    }
    Ok(())
}

/// Removes the entries of `have` that `want` lacks.
fn remove_gone<K: aya::Pod + Ord, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    have: &BTreeMap<K, V>,
    want: &BTreeMap<K, V>,
    name: &'static str,
) -> Result<()> {
    for k in have.keys().filter(|k| !want.contains_key(k)) {
        map.remove(k).map_err(map_err(name))?;
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
    use crate::datapath::Protocol;
    use gateway_common::REPLY_CANDIDATES;

    fn service(addr: &str, port: u16) -> ServiceAddr {
        ServiceAddr {
            addr: addr.parse().unwrap(),
            protocol: Protocol::Udp,
            port,
        }
    }

    fn view(service: ServiceAddr, snat: bool, endpoints: &[SocketAddr]) -> ServiceView<'_> {
        ServiceView {
            service,
            snat,
            endpoints: Box::new(endpoints.iter().copied()),
        }
    }

    #[test]
    fn endpoints_shared_beyond_the_index_record_reply_entries() {
        let shared = ["10.0.0.1:53".parse().unwrap()];
        let own = ["10.0.0.2:53".parse().unwrap()];
        let mut services: Vec<ServiceView> = (0..REPLY_CANDIDATES as u16 + 1)
            .map(|i| view(service("192.0.2.1", 1000 + i), false, &shared))
            .collect();
        services.push(view(service("192.0.2.1", 2000), true, &own));
        let roles = Roles::of(services.into_iter());
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
        let roles = Roles::of([view(v6, false, &[backend])].into_iter());
        assert!(roles.index.v4.is_empty());
        let entry = roles.index.v6[&key::<Addr6>(backend.ip(), 53, 17).unwrap()];
        assert_eq!(entry.count, 1);
        assert_eq!(entry.services[0], key::<Addr6>(v6.addr, 53, 17).unwrap());
        // One filter for both families (an IPv6 address's slot is a hash of it).
        assert_eq!(roles.filter[&slot(v6.addr)], ADDR_GATEWAY);
        assert_eq!(roles.filter[&slot(backend.ip())], ADDR_BACKEND);
    }
}
