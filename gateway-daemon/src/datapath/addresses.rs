//! Gateway addresses on a dummy interface the daemon owns (as kube-proxy's IPVS mode
//! does with `kube-ipvs0`): the host then answers ARP for them, so clients on the same
//! segment reach them without static routes, and a packet to a port no route holds gets
//! the local stack's answer (TCP RST, ICMP port unreachable) instead of vanishing. Only
//! the dummy interface is touched: addresses no longer programmed are removed from it.

use std::{collections::BTreeSet, net::IpAddr};

use super::{Datapath, DatapathError, Result};

impl Datapath {
    /// Puts the programmed gateway addresses on dummy interface `name` from now on
    /// (created if absent; a link of that name that is not a dummy is refused).
    pub fn own_addresses_on(&mut self, name: &str) -> Result<()> {
        crate::netlink::ensure_dummy(name).map_err(|source| DatapathError::Addresses {
            iface: name.to_string(),
            source,
        })?;
        self.address_interface = Some(name.to_string());
        self.sync_address_interface()
    }

    /// Makes the dummy interface hold exactly the addresses of installed services.
    pub(super) fn sync_address_interface(&mut self) -> Result<()> {
        let Some(name) = self.address_interface.clone() else {
            return Ok(());
        };
        let err = |source| DatapathError::Addresses {
            iface: name.clone(),
            source,
        };
        // Created again if someone deleted it.
        let index = crate::netlink::ensure_dummy(&name).map_err(err)?;
        let want: BTreeSet<IpAddr> = self.installed.keys().map(|s| s.addr).collect();
        let have = crate::netlink::addresses(index).map_err(err)?;
        for a in have.difference(&want) {
            crate::netlink::remove_address(index, *a).map_err(err)?;
            tracing::info!(iface = name, address = %a, "gateway address removed");
        }
        for a in want.difference(&have) {
            crate::netlink::add_address(index, *a).map_err(err)?;
            tracing::info!(iface = name, address = %a, "gateway address added");
        }
        Ok(())
    }
}
