//! Gateway addresses on a dummy interface the daemon owns (as kube-proxy's IPVS mode
//! does with `kube-ipvs0`): the host then answers ARP for them, so clients on the same
//! segment reach them without static routes, and a packet to a port no route holds gets
//! the local stack's answer (TCP RST, ICMP port unreachable) instead of vanishing. Only
//! the dummy interface is touched: addresses no longer programmed are removed from it.
//!
//! IPv6 neighbour discovery is answered only for addresses on the interface a
//! solicitation arrives on, so each IPv6 gateway address also gets a proxy neighbour
//! entry on every interface the gateway program is attached to (`proxy_ndp` on there):
//! clients on the same segment find it as IPv4 clients find theirs by ARP.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv6Addr},
};

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
        let v6 = |set: &BTreeSet<IpAddr>| -> BTreeSet<Ipv6Addr> {
            set.iter()
                .filter_map(|a| match a {
                    IpAddr::V6(a) => Some(*a),
                    IpAddr::V4(_) => None,
                })
                .collect()
        };
        let (want6, have6) = (v6(&want), v6(&have));
        self.sync_proxy_neighbours(&want6, &have6.difference(&want6).copied().collect())
    }

    /// Puts a proxy neighbour entry for each IPv6 gateway address in `want` on every
    /// attached interface (`proxy_ndp` on), and removes those of `gone`.
    fn sync_proxy_neighbours(
        &mut self,
        want: &BTreeSet<Ipv6Addr>,
        gone: &BTreeSet<Ipv6Addr>,
    ) -> Result<()> {
        let interfaces = self.attached_interfaces();
        for (ifindex, iface) in &interfaces {
            let err = |source| DatapathError::Addresses {
                iface: iface.clone(),
                source,
            };
            for a in gone {
                crate::netlink::remove_proxy_neighbour(*ifindex, *a).map_err(err)?;
            }
            for a in want {
                crate::netlink::add_proxy_neighbour(*ifindex, *a).map_err(err)?;
            }
        }
        if want.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = interfaces.into_iter().map(|(_, name)| name).collect();
        match crate::host::enable_proxy_ndp(&names) {
            Ok(changed) if !changed.is_empty() => tracing::info!(
                settings = changed.join(" "),
                "proxy_ndp on: the host answers neighbour solicitations for the IPv6 \
                 gateway addresses"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "turning proxy_ndp on"),
        }
        for name in names {
            if !crate::host::ipv6_forwarding(&name).unwrap_or(true) {
                tracing::warn!(
                    iface = name,
                    "IPv6 forwarding is off on this interface: the host answers no \
                     neighbour solicitation for the IPv6 gateway addresses there, and \
                     drops the IPv6 packets the program hands to it; set \
                     net.ipv6.conf.all.forwarding=1"
                );
            }
        }
        Ok(())
    }
}
