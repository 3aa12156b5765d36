//! The maps that tell the kernel program a packet's role without a conntrack lookup:
//! the address filter (`addr_slot(address)` → is some gateway / backend address there)
//! and the reply index (backend endpoint → the router-mode services it serves, so a
//! reply finds its flow's forward entry and no flow needs a second entry). Both follow
//! from the installed services alone.
//!
//! Written twice per change: before the services change, for the union of what is
//! installed and what is wanted (a reply of a service being added or removed is found
//! throughout), and after, for exactly what is installed.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddrV4,
};

use aya::maps::{Array, HashMap, MapData};
use gateway_common::{
    addr_slot, map_names, ReplyIndex, ServiceKey, ADDR_BACKEND, ADDR_FILTER_SLOTS, ADDR_GATEWAY,
    REPLY_INDEX_SNAT,
};

use super::{map_err, Result};

/// One service as the roles see it: its key, whether it is in SNAT mode, its endpoints.
pub(super) struct ServiceView<'a> {
    pub key: ServiceKey,
    pub snat: bool,
    pub endpoints: Box<dyn Iterator<Item = SocketAddrV4> + 'a>,
}

/// What the two maps should hold, and which services' router-mode flows must record
/// reply entries (an endpoint of theirs serves more services than `REPLY_CANDIDATES`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Roles {
    pub index: BTreeMap<ServiceKey, ReplyIndex>,
    pub filter: BTreeMap<u32, u32>,
    pub reply_entry: BTreeSet<ServiceKey>,
}

impl Roles {
    /// The roles of `services` (each service once).
    pub fn of<'a>(services: impl Iterator<Item = ServiceView<'a>>) -> Roles {
        let mut roles = Roles::default();
        // Endpoint → (its services, whether one is in SNAT mode).
        let mut serving: BTreeMap<ServiceKey, (BTreeSet<ServiceKey>, bool)> = BTreeMap::new();
        for svc in services {
            *roles.filter.entry(addr_slot(svc.key.addr)).or_default() |= ADDR_GATEWAY;
            for endpoint in svc.endpoints {
                let addr = u32::from(*endpoint.ip()).to_be();
                *roles.filter.entry(addr_slot(addr)).or_default() |= ADDR_BACKEND;
                // SNAT services are candidates too: flows a service started in router
                // mode keep their one entry after it switched.
                let at = ServiceKey {
                    addr,
                    port: endpoint.port().to_be(),
                    proto: svc.key.proto,
                    pad: 0,
                };
                let (services, snat) = serving.entry(at).or_default();
                services.insert(svc.key);
                *snat |= svc.snat;
            }
        }
        for (endpoint, (services, snat)) in serving {
            let mut entry = ReplyIndex::default();
            if snat {
                entry.flags |= REPLY_INDEX_SNAT;
            }
            for (i, key) in services.into_iter().enumerate() {
                match entry.services.get_mut(i) {
                    Some(slot) => {
                        *slot = key;
                        entry.count += 1;
                    }
                    None => {
                        roles.reply_entry.insert(key);
                    }
                }
            }
            roles.index.insert(endpoint, entry);
        }
        roles
    }
}

/// The maps and what this process wrote into them.
pub(super) struct RoleMaps {
    index: HashMap<MapData, ServiceKey, ReplyIndex>,
    filter: Array<MapData, u32>,
    /// What the maps hold, once read or written by this process.
    written: Option<Roles>,
    /// The last write was exact (not a union kept with what was there).
    exact: bool,
}

impl RoleMaps {
    pub fn new(
        index: HashMap<MapData, ServiceKey, ReplyIndex>,
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
    pub fn reply_entry(&self, key: &ServiceKey) -> bool {
        self.written
            .as_ref()
            .is_some_and(|w| w.reply_entry.contains(key))
    }

    /// Makes the maps hold `want`; with `keep`, entries not in `want` stay (the union
    /// written before services change). Returns the services whose reply-entry role
    /// changed (their `Service::flags` are the caller's to rewrite).
    pub fn write(&mut self, mut want: Roles, keep: bool) -> Result<BTreeSet<ServiceKey>> {
        let have = match self.written.take() {
            Some(have) => have,
            None => self.read()?,
        };
        if keep {
            for (endpoint, entry) in &have.index {
                want.index.entry(*endpoint).or_insert(*entry);
            }
            for (slot, bits) in &have.filter {
                *want.filter.entry(*slot).or_default() |= bits;
            }
            want.reply_entry.extend(have.reply_entry.iter().copied());
        }
        // Additions before removals: a role is never missing in between.
        for (endpoint, entry) in &want.index {
            if have.index.get(endpoint) != Some(entry) {
                self.index
                    .insert(endpoint, entry, 0)
                    .map_err(map_err(map_names::REPLY_INDEX))?;
            }
        }
        for (slot, bits) in &want.filter {
            if have.filter.get(slot) != Some(bits) {
                self.filter
                    .set(*slot, bits, 0)
                    .map_err(map_err(map_names::ADDR_FILTER))?;
            }
        }
        for endpoint in have.index.keys().filter(|e| !want.index.contains_key(e)) {
            self.index
                .remove(endpoint)
                .map_err(map_err(map_names::REPLY_INDEX))?;
        }
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
        let mut roles = Roles::default();
        for item in self.index.iter() {
            let (endpoint, entry) = item.map_err(map_err(map_names::REPLY_INDEX))?;
            roles.index.insert(endpoint, entry);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_common::REPLY_CANDIDATES;

    fn key(last: u8, port: u16) -> ServiceKey {
        ServiceKey {
            addr: u32::from(std::net::Ipv4Addr::new(192, 0, 2, last)).to_be(),
            port: port.to_be(),
            proto: 17,
            pad: 0,
        }
    }

    fn view(key: ServiceKey, snat: bool, endpoints: &[SocketAddrV4]) -> ServiceView<'_> {
        ServiceView {
            key,
            snat,
            endpoints: Box::new(endpoints.iter().copied()),
        }
    }

    #[test]
    fn endpoints_shared_beyond_the_index_record_reply_entries() {
        let shared = ["10.0.0.1:53".parse().unwrap()];
        let own = ["10.0.0.2:53".parse().unwrap()];
        let mut services: Vec<ServiceView> = (0..REPLY_CANDIDATES as u16 + 1)
            .map(|i| view(key(1, 1000 + i), false, &shared))
            .collect();
        services.push(view(key(1, 2000), true, &own));
        let roles = Roles::of(services.into_iter());
        let at = |e: SocketAddrV4| ServiceKey {
            addr: u32::from(*e.ip()).to_be(),
            port: e.port().to_be(),
            proto: 17,
            pad: 0,
        };
        let entry = roles.index[&at(shared[0])];
        assert_eq!(u32::from(entry.count), REPLY_CANDIDATES);
        assert_eq!(entry.flags, 0);
        assert_eq!(roles.index[&at(own[0])].flags, REPLY_INDEX_SNAT);
        assert_eq!(
            roles.reply_entry,
            BTreeSet::from([key(1, 1000 + REPLY_CANDIDATES as u16)])
        );
        let gw = addr_slot(key(1, 0).addr);
        assert_eq!(roles.filter[&gw] & ADDR_GATEWAY, ADDR_GATEWAY);
        for e in [shared[0], own[0]] {
            let slot = addr_slot(u32::from(*e.ip()).to_be());
            assert_eq!(roles.filter[&slot] & ADDR_BACKEND, ADDR_BACKEND);
        }
    }
}
