//! Publishing the gateway addresses, where the operator's routing daemon picks them
//! up: on a dummy interface the daemon owns (as kube-proxy's IPVS mode does with
//! `kube-ipvs0`), and with `--announce-table N` as host routes of protocol `berth`
//! (251) in kernel routing table N.
//!
//! On the interface the host answers ARP for them, so clients on the same segment reach
//! them without static routes, and a packet to a port no route holds gets the local
//! stack's answer (TCP RST, ICMP port unreachable) instead of vanishing. Only the dummy
//! interface is touched: addresses no longer published are removed from it. In the
//! table only routes of protocol 251 are ever added or removed; a route to a published
//! address of another protocol is left alone, and routes of protocol 251 to addresses
//! not published (an earlier run's) are removed.
//!
//! IPv6 neighbour discovery is answered only for addresses on the interface a
//! solicitation arrives on, so each IPv6 gateway address also gets a proxy neighbour
//! entry on every interface the gateway program is attached to (`proxy_ndp` on there):
//! clients on the same segment find it as IPv4 clients find theirs by ARP.
//!
//! What is published is one set (`announce::published`): the addresses of the installed
//! services while the node announces, none while it is withdrawn. The interface, the
//! proxy neighbours and the table all follow it; the services stay installed.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv6Addr},
};

use crate::datapath::{Datapath, DatapathError, Result};
use crate::netlink::{self, HostRoute, RouteAdded, RTPROT_BERTH};

/// The alias that marks an address interface as the one of the datapath pinned in
/// `pin_dir`, so that `berth uninstall` of another pin directory leaves it alone (it
/// once deleted a running daemon's `berth0`, given a wrong `--pin-dir`). At most 255
/// bytes, as the kernel takes.
pub fn address_interface_mark(pin_dir: &std::path::Path) -> String {
    let mut mark = format!("berth pin-dir {}", pin_dir.display());
    let mut end = mark.len().min(255);
    while !mark.is_char_boundary(end) {
        end -= 1;
    }
    mark.truncate(end);
    mark
}

/// Where and whether the gateway addresses are published.
#[derive(Clone, Debug, Default)]
pub(in crate::datapath) struct Publication {
    /// The dummy interface that holds them, if the daemon owns one.
    interface: Option<String>,
    /// The routing table that holds them as routes (`--announce-table`).
    table: Option<u32>,
    /// The announce decision withdrew them.
    withdrawn: bool,
    /// What the last sync that succeeded published (none before one did).
    published: Option<BTreeSet<IpAddr>>,
}

impl Datapath {
    /// Puts the published gateway addresses on dummy interface `name` from now on
    /// (created if absent; a link of that name that is not a dummy is refused).
    pub fn own_addresses_on(&mut self, name: &str) -> Result<()> {
        let mark = address_interface_mark(&self.pin_dir);
        netlink::ensure_dummy(name, &mark).map_err(|source| DatapathError::Addresses {
            iface: name.to_string(),
            source,
        })?;
        self.host.publication.interface = Some(name.to_string());
        self.sync_publication()
    }

    /// Also publishes the addresses as host routes of protocol `berth` in routing
    /// table `table`, through the address interface (`lo` without one); routes of that
    /// protocol an earlier run left there for addresses not published are removed.
    pub fn announce_in_table(&mut self, table: u32) -> Result<()> {
        self.host.publication.table = Some(table);
        self.host.publication.published = None;
        self.sync_publication()
    }

    /// Publishes the served addresses (`announcing`) or none; touches the kernel only
    /// when that changes what is published (or the last sync failed).
    pub fn set_announcing(&mut self, announcing: bool) -> Result<()> {
        self.host.publication.withdrawn = !announcing;
        if self.host.publication.published.as_ref() == Some(&self.wanted_addresses()) {
            return Ok(());
        }
        self.sync_publication()
    }

    /// The addresses of the installed services.
    pub fn served_addresses(&self) -> BTreeSet<IpAddr> {
        self.keys.addresses().keys().copied().collect()
    }

    /// Whether the last sync of the publication failed (or was never made).
    pub(in crate::datapath) fn publication_unsure(&self) -> bool {
        self.host.publication.published.is_none()
    }

    /// The addresses published by the last sync that succeeded.
    pub fn published_addresses(&self) -> BTreeSet<IpAddr> {
        self.host.publication.published.clone().unwrap_or_default()
    }

    /// The address interface, if the daemon owns one.
    pub fn address_interface(&self) -> Option<&str> {
        self.host.publication.interface.as_deref()
    }

    /// The routing table the addresses are published in, if any.
    pub fn announce_table(&self) -> Option<u32> {
        self.host.publication.table
    }

    /// What should be published now.
    fn wanted_addresses(&self) -> BTreeSet<IpAddr> {
        crate::announce::published(!self.host.publication.withdrawn, self.served_addresses())
    }

    /// Makes the interface, the proxy neighbours and the table hold exactly what
    /// should be published.
    pub(in crate::datapath) fn sync_publication(&mut self) -> Result<()> {
        let want = self.wanted_addresses();
        self.host.publication.published = None;
        // Routes leave the table before their addresses leave the interface: BIRD
        // missed the deletion of a route whose device had just lost the address, and
        // withdrew it only at its next scan of the table, up to 10 s later (seen in
        // the tier test: drained gateways kept getting new flows for seconds).
        let in_table = self.withdraw_from_table(&want)?;
        let device = self.sync_address_interface(&want)?;
        self.add_to_table(&want, &in_table, device)?;
        self.host.publication.published = Some(want);
        Ok(())
    }

    /// Makes the dummy interface hold exactly `want`; returns its ifindex (none
    /// without one).
    fn sync_address_interface(&mut self, want: &BTreeSet<IpAddr>) -> Result<Option<u32>> {
        let Some(name) = self.host.publication.interface.clone() else {
            return Ok(None);
        };
        let err = |source| DatapathError::Addresses {
            iface: name.clone(),
            source,
        };
        // Created again if someone deleted it.
        let mark = address_interface_mark(&self.pin_dir);
        let index = netlink::ensure_dummy(&name, &mark).map_err(err)?;
        let have = netlink::addresses(index).map_err(err)?;
        for a in have.difference(want) {
            netlink::remove_address(index, *a).map_err(err)?;
            tracing::info!(iface = name, address = %a, "gateway address removed");
        }
        for a in want.difference(&have) {
            netlink::add_address(index, *a).map_err(err)?;
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
        let (want6, have6) = (v6(want), v6(&have));
        self.sync_proxy_neighbours(&want6, &have6.difference(&want6).copied().collect())?;
        Ok(Some(index))
    }

    /// Removes the announce table's routes of protocol `berth` to addresses not in
    /// `want`; returns the addresses that have one.
    fn withdraw_from_table(&self, want: &BTreeSet<IpAddr>) -> Result<BTreeSet<IpAddr>> {
        let Some(table) = self.host.publication.table else {
            return Ok(BTreeSet::new());
        };
        let err = |source| DatapathError::AnnounceTable { table, source };
        let mut have = netlink::host_routes(table, RTPROT_BERTH).map_err(err)?;
        for a in have.clone().difference(want) {
            netlink::remove_host_route(HostRoute {
                table,
                protocol: RTPROT_BERTH,
                addr: *a,
            })
            .map_err(err)?;
            have.remove(a);
            tracing::info!(table, address = %a, "route withdrawn from the announce table");
        }
        Ok(have)
    }

    /// Adds to the announce table a route of protocol `berth` to each address of `want`
    /// that has none in `have` (what `withdraw_from_table` left), through `device` (`lo`
    /// if none).
    fn add_to_table(
        &self,
        want: &BTreeSet<IpAddr>,
        have: &BTreeSet<IpAddr>,
        device: Option<u32>,
    ) -> Result<()> {
        let Some(table) = self.host.publication.table else {
            return Ok(());
        };
        let err = |source| DatapathError::AnnounceTable { table, source };
        let route = |addr| HostRoute {
            table,
            protocol: RTPROT_BERTH,
            addr,
        };
        let missing: Vec<&IpAddr> = want.difference(have).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let device = match device {
            Some(index) => index,
            None => crate::sys::iface::name_to_index("lo").ok_or(DatapathError::NoInterface {
                iface: "lo".to_string(),
            })?,
        };
        for a in missing {
            match netlink::add_host_route(route(*a), device).map_err(err)? {
                RouteAdded::Added => {
                    tracing::info!(table, address = %a, "route added to the announce table")
                }
                RouteAdded::Exists => tracing::warn!(
                    table,
                    address = %a,
                    "the announce table holds a route to this gateway address of another \
                     protocol: left alone (it is announced as that route says)"
                ),
            }
        }
        Ok(())
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
                netlink::remove_proxy_neighbour(*ifindex, *a).map_err(err)?;
            }
            for a in want {
                netlink::add_proxy_neighbour(*ifindex, *a).map_err(err)?;
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
