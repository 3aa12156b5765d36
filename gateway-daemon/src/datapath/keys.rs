//! How many installed services each gateway address and each port has, kept as
//! services come and go: the address maps, the published addresses and the reserved
//! ports follow from them without a walk over every installed service (three walks of
//! 100,000 services took several milliseconds of every change that added a route).

use std::{collections::BTreeMap, net::IpAddr};

use super::ServiceAddr;

/// Installed services per gateway address and per port.
#[derive(Debug, Default)]
pub(super) struct Keys {
    addresses: BTreeMap<IpAddr, u32>,
    ports: BTreeMap<u16, u32>,
    /// The set of addresses changed since taken.
    addresses_changed: bool,
    /// The set of ports changed since taken.
    ports_changed: bool,
}

impl Keys {
    /// The counts of `services`.
    pub fn of<'a>(services: impl IntoIterator<Item = &'a ServiceAddr>) -> Self {
        let mut keys = Keys::default();
        for s in services {
            keys.count(s, true);
        }
        keys
    }

    /// Counts a service installed (`up`) or removed.
    pub fn count(&mut self, s: &ServiceAddr, up: bool) {
        self.addresses_changed |= bump(&mut self.addresses, s.addr, up);
        self.ports_changed |= bump(&mut self.ports, s.port, up);
    }

    /// Services on each address.
    pub fn addresses(&self) -> &BTreeMap<IpAddr, u32> {
        &self.addresses
    }

    /// The ports of installed services.
    pub fn ports(&self) -> crate::host::PortSet {
        self.ports.keys().copied().collect()
    }

    /// Whether the set of addresses and of ports changed since last asked.
    pub fn take_changed(&mut self) -> (bool, bool) {
        let changed = (self.addresses_changed, self.ports_changed);
        (self.addresses_changed, self.ports_changed) = (false, false);
        changed
    }
}

/// Counts `key` up or down in `map`; whether it came or went.
fn bump<K: Ord>(map: &mut BTreeMap<K, u32>, key: K, up: bool) -> bool {
    if up {
        let n = map.entry(key).or_default();
        *n += 1;
        return *n == 1;
    }
    let std::collections::btree_map::Entry::Occupied(mut e) = map.entry(key) else {
        return false;
    };
    *e.get_mut() -= 1;
    if *e.get() == 0 {
        e.remove();
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::Protocol;

    fn s(addr: &str, port: u16) -> ServiceAddr {
        ServiceAddr::of(addr, Protocol::Tcp, port)
    }

    #[test]
    fn addresses_and_ports_are_counted_and_say_when_their_sets_change() {
        let mut keys = Keys::of(&[s("10.0.0.1", 80), s("10.0.0.2", 80)]);
        assert_eq!(keys.take_changed(), (true, true));
        keys.count(&s("10.0.0.1", 81), true);
        assert_eq!(
            keys.take_changed(),
            (false, true),
            "a new port on a known address"
        );
        keys.count(&s("10.0.0.2", 80), false);
        assert_eq!(
            keys.take_changed(),
            (true, false),
            "port 80 is still served on .1"
        );
        assert_eq!(keys.addresses().len(), 1);
        assert_eq!(keys.ports(), crate::host::PortSet::from_iter([80, 81]));
        // A service never counted in changes nothing.
        keys.count(&s("10.0.0.9", 9), false);
        assert_eq!(keys.take_changed(), (false, false));
    }
}
