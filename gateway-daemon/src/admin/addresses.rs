//! `berth get addresses` (`/api/v1/addresses`): the routes' traffic summed per gateway
//! address and protocol, with the way the kernel's path takes once per address (50
//! routes over 5 addresses once repeated the same kernel-path line 50 times). The same
//! sums are `/metrics`' `berth_address_*` families.

use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

use super::unanswered_for;
use crate::{
    datapath::{Protocol, Traffic},
    publish::Published,
};

/// One gateway address and protocol's routes, summed.
#[derive(Clone, Debug, Default)]
pub struct Sum {
    /// Routes whose service on it is programmed.
    pub routes: u64,
    /// Of those, the routes forwarding without replies.
    pub unanswered: u64,
    /// Their traffic.
    pub traffic: Traffic,
}

/// Every gateway address and protocol's routes, summed.
pub fn sums(p: &Published) -> BTreeMap<(IpAddr, Protocol), Sum> {
    let mut sums: BTreeMap<_, Sum> = BTreeMap::new();
    for service in p.owners.keys() {
        sums.entry((service.addr, service.protocol))
            .or_default()
            .routes += 1;
    }
    for (service, traffic) in p.traffic.iter() {
        if !p.owners.contains_key(service) {
            continue;
        }
        let sum = sums.entry((service.addr, service.protocol)).or_default();
        sum.traffic = sum.traffic.plus(traffic);
        sum.unanswered += u64::from(unanswered_for(traffic).is_some());
    }
    sums
}

/// A row of `berth get addresses`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressRow {
    /// The gateway address.
    pub address: String,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// Routes whose service on it is programmed.
    pub routes: u64,
    /// Packets to and from its routes' ports.
    pub packets: u64,
    /// Bytes to and from them.
    pub bytes: u64,
    /// Of the packets, those from the backends back to clients.
    pub reply_packets: u64,
    /// Tracked flows that forwarded a packet in the last minute.
    pub active_flows: u64,
    /// Packets the kernel forwarded instead of XDP.
    pub kernel_packets: u64,
    /// `xdp`, `kernel: WHY` (the last reason, when the kernel carried more than 5 %),
    /// or `-` before any packet.
    pub path: String,
    /// Routes forwarding without a reply for 10 s or more.
    pub unanswered_routes: u64,
}

/// The rows of `berth get addresses`, by address and protocol.
pub fn rows(p: &Published) -> Vec<AddressRow> {
    sums(p)
        .into_iter()
        .map(|((address, protocol), s)| {
            let t = &s.traffic;
            AddressRow {
                address: address.to_string(),
                protocol: protocol.to_string(),
                routes: s.routes,
                packets: t.stats.packets + t.stats.reply_packets,
                bytes: t.stats.bytes + t.stats.reply_bytes,
                reply_packets: t.stats.reply_packets,
                active_flows: t.active_flows,
                kernel_packets: t.stats.kernel_packets,
                path: t.path().unwrap_or_else(|| "-".into()),
                unanswered_routes: s.unanswered,
            }
        })
        .collect()
}
