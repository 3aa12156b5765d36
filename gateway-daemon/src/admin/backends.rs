//! `berth get backends` (`/api/v1/backends`): every backend of every served route with
//! its weight, state, health and what its flows carried (`ipvsadm --stats` per real
//! server), and every endpoint a BackendHealthPolicy checks.

use std::{collections::BTreeSet, net::SocketAddr};

use serde::{Deserialize, Serialize};

use crate::{health::BackendRow, publish::Published};

/// The document `/api/v1/backends` serves.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendsView {
    /// Every backend of every served route (and those that left a route's Services
    /// and still carry its connections), by route, service and endpoint.
    pub backends: Vec<BackendTrafficRow>,
    /// Every endpoint a BackendHealthPolicy checks.
    pub checks: Vec<BackendRow>,
}

/// One backend of one route's service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendTrafficRow {
    /// The route's namespace.
    pub namespace: String,
    /// The route's kind and name (`TCPRoute/web`).
    pub route: String,
    /// The gateway address, port and protocol (`TCP/10.0.0.1:30000`).
    pub service: String,
    /// The backend's address and port.
    pub endpoint: String,
    /// Its Maglev weight (0: it takes no new flows).
    pub weight: u16,
    /// `serving`, `no new flows` (not ready, draining or unhealthy), or `left` (no
    /// longer an endpoint of the route's Services, carrying its connections).
    pub state: String,
    /// Its health where a BackendHealthPolicy checks its address (`-` otherwise).
    pub health: String,
    /// Tracked flows that forwarded a packet recently.
    pub active_flows: u64,
    /// Flows it was given.
    pub new_flows: u64,
    /// Packets and bytes client → backend.
    pub packets: u64,
    /// Bytes client → backend.
    pub bytes: u64,
    /// Packets backend → client.
    pub reply_packets: u64,
    /// Bytes backend → client.
    pub reply_bytes: u64,
}

/// The view of what `p` publishes.
pub fn view(p: &Published) -> BackendsView {
    let checks = p.health.as_ref().map(|h| h.rows()).unwrap_or_default();
    // A backend's health: the worst its address is checked with.
    let health_of = |endpoint: &SocketAddr| {
        let ip = endpoint.ip();
        let mut found = checks
            .iter()
            .filter(|c| c.endpoint.parse::<SocketAddr>().is_ok_and(|e| e.ip() == ip))
            .map(|c| c.health.as_str());
        match found.next() {
            None => "-".to_string(),
            Some(first) => found
                .fold(first, |worst, h| if h == "healthy" { worst } else { h })
                .to_string(),
        }
    };
    let mut listed = BTreeSet::new();
    let mut rows = Vec::new();
    let mut row = |service: &crate::datapath::ServiceAddr, endpoint: SocketAddr, weight, state| {
        let (namespace, route) = p.owners.get(service).map_or_else(
            || ("-".to_string(), "-".to_string()),
            |k| {
                (
                    k.namespace.to_string(),
                    format!("{}/{}", k.kind.name(), k.name),
                )
            },
        );
        let t = p
            .backends
            .get(&(*service, endpoint))
            .copied()
            .unwrap_or_default();
        rows.push(BackendTrafficRow {
            namespace,
            route,
            service: service.to_string(),
            endpoint: endpoint.to_string(),
            weight,
            state: String::from(state),
            health: health_of(&endpoint),
            active_flows: t.active_flows,
            new_flows: t.stats.new_flows,
            packets: t.stats.packets,
            bytes: t.stats.bytes,
            reply_packets: t.stats.reply_packets,
            reply_bytes: t.stats.reply_bytes,
        });
    };
    for (service, backends) in &p.datapath.services {
        for b in backends.iter() {
            if !listed.insert((*service, b.endpoint)) {
                continue;
            }
            let state = if b.weight > 0 {
                "serving"
            } else {
                "no new flows"
            };
            row(service, b.endpoint, b.weight, state);
        }
    }
    // Backends that left their services and still carry connections (they counted).
    for (service, endpoint) in p.backends.keys() {
        if !listed.contains(&(*service, *endpoint)) && p.datapath.services.contains_key(service) {
            row(service, *endpoint, 0, "left");
        }
    }
    rows.sort_by(|a, b| {
        (&a.namespace, &a.route, &a.service, &a.endpoint).cmp(&(
            &b.namespace,
            &b.route,
            &b.service,
            &b.endpoint,
        ))
    });
    BackendsView {
        backends: rows,
        checks,
    }
}
