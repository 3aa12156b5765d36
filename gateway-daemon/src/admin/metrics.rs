//! `/metrics`: the Prometheus text exposition (version 0.0.4) of a published snapshot,
//! encoded by `prometheus-client` at scrape time (label values escaped, one HELP and
//! TYPE per family, its samples together, counters named `_total`).
//!
//! Its size is bounded by the number of gateway addresses, not of routes: traffic is
//! summed per address and protocol (`berth_address_*`). The per-route families
//! (`berth_route_*`, one series per route and address) are opt-in, `berth run
//! --metrics-per-route`: at 100k routes they are ~100 MiB a scrape.

use std::fmt;

use prometheus_client::{
    collector::Collector,
    encoding::{prometheus_text, DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Registry,
};

use super::unanswered_for;
use crate::publish::Published;

/// The `Content-Type` of what [`encode`] returns.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Whether `/metrics` has a series per route besides the per-address sums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Detail {
    /// Per-address sums only (bounded by the gateway addresses).
    #[default]
    Aggregate,
    /// The `berth_route_*` families too (`berth run --metrics-per-route`).
    PerRoute,
}

/// The metrics of `p` in the Prometheus text format.
pub fn encode(p: &Published, detail: Detail) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(families(p, detail)));
    let mut out = String::new();
    // Encoding into a String fails only if a collector does, and ours only writes.
    let _ = prometheus_text::encode(&mut out, &registry);
    out
}

/// Every family of a snapshot, ready to encode.
#[derive(Debug)]
struct Families(Vec<Family>);

/// One metric family: its name (counters without `_total`, which the encoder adds),
/// help, type and samples.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, u64)>,
}

/// A sample's labels, in the order they are written.
type Labels = Vec<(&'static str, String)>;

impl Family {
    fn new(name: &'static str, help: &'static str, kind: MetricType) -> Family {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    fn with(mut self, labels: Labels, value: u64) -> Family {
        self.samples.push((labels, value));
        self
    }
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        for f in &self.0 {
            let mut metric = encoder.encode_descriptor(f.name, f.help, None, f.kind)?;
            for (labels, value) in &f.samples {
                encode_sample(&mut metric, labels, f.kind, *value)?;
            }
        }
        Ok(())
    }
}

fn encode_sample(
    metric: &mut MetricEncoder,
    labels: &impl EncodeLabelSet,
    kind: MetricType,
    value: u64,
) -> fmt::Result {
    let sample = metric.encode_family(labels)?;
    match kind {
        MetricType::Counter => ConstCounter::new(value).encode(sample),
        _ => ConstGauge::new(value).encode(sample),
    }
}

/// The families of `p`: those of the planner, of range listeners, of the traffic per
/// gateway address (and, with `Detail::PerRoute`, per route), and the datapath's
/// counters.
fn families(p: &Published, detail: Detail) -> Families {
    let mut out = planner_families(p);
    out.extend(announce_families(p));
    out.extend(listener_families(p));
    // Once the counters were read (a service without traffic has no entry).
    if p.traffic_at.is_some() {
        out.extend(address_families(p));
        if detail == Detail::PerRoute {
            out.extend(route_families(p));
        }
    }
    out.extend(health_families(p));
    out.extend(capacity_families(p));
    out.extend(datapath_families(p));
    Families(out)
}

/// The planner's: its cycles, whether it is ready, what it could not read.
fn planner_families(p: &Published) -> Vec<Family> {
    use MetricType::{Counter, Gauge};
    vec![
        Family::new("berth_plans", "Plans made since start.", Counter).with(vec![], p.cycles),
        Family::new(
            "berth_plan_cycle_milliseconds",
            "Time spent in the cycles that made the plans (read, plan, store, program): \
             divided by berth_plans_total, the mean cycle.",
            Counter,
        )
        .with(vec![], p.cycle_millis),
        Family::new(
            "berth_ready",
            "1 while /readyz says ready (a plan is programmed and the addresses are \
             announced), else 0.",
            Gauge,
        )
        .with(
            vec![],
            u64::from(crate::admin::readiness(p, std::time::SystemTime::now()).is_none()),
        ),
        Family::new(
            "berth_manifest_errors",
            "Manifest files whose current version is broken.",
            Gauge,
        )
        .with(vec![], p.broken.len() as u64),
        Family::new(
            "berth_manifest_warnings",
            "Unknown fields in the manifests' current versions (each is logged).",
            Gauge,
        )
        .with(vec![], p.warnings.len() as u64),
        Family::new(
            "berth_state_ignored_records",
            "Records of the claims journal ignored when last read: a port held twice, a \
             name that does not match its port (each logged; berth state check lists them).",
            Gauge,
        )
        .with(vec![], p.ignored_records),
        Family::new(
            "berth_cycle_failing",
            "1 while the last plan/commit/program cycle failed.",
            Gauge,
        )
        .with(vec![], u64::from(p.last_error.is_some())),
    ]
}

/// The claims and the listeners': the routes attached to each (with a plan), the ports
/// of each range listener by state.
fn listener_families(p: &Published) -> Vec<Family> {
    use MetricType::Gauge;
    let mut out = Vec::new();
    if let Some(s) = &p.state {
        out.push(
            Family::new(
                "berth_claims",
                "Claims held (bound or cooling down).",
                Gauge,
            )
            .with(vec![], s.claims.len() as u64),
        );
        let mut attached = Family::new(
            "berth_listener_attached_routes",
            "Attached routes per listener.",
            Gauge,
        );
        for g in &s.gateways {
            for l in &g.status.listeners {
                let labels = listener_labels(&g.namespace, &g.name, &l.name);
                attached = attached.with(labels, u64::try_from(l.attached_routes).unwrap_or(0));
            }
        }
        out.push(attached);
    }
    let mut ports = Family::new(
        "berth_listener_ports",
        "Ports of a range listener by state.",
        Gauge,
    );
    for u in &p.usage {
        let free = u.size.saturating_sub(u.bound + u.cooling);
        for (state, n) in [("used", u.bound), ("cooling", u.cooling), ("free", free)] {
            let mut labels = listener_labels(&u.namespace, &u.gateway, &u.listener);
            labels.push(("state", state.to_string()));
            ports = ports.with(labels, u64::from(n));
        }
    }
    out.push(ports);
    out
}

/// The health checks' (with BackendHealthPolicies): the endpoints by health, the checks
/// by result.
fn health_families(p: &Published) -> Vec<Family> {
    let Some(h) = &p.health else {
        return Vec::new();
    };
    let c = h.counts();
    let mut endpoints = Family::new(
        "berth_health_checked_endpoints",
        "Endpoints BackendHealthPolicies check, by health (berth get backends lists \
         them).",
        MetricType::Gauge,
    );
    for (health, n) in [
        ("healthy", c.endpoints - c.unhealthy),
        ("unhealthy", c.unhealthy),
    ] {
        endpoints = endpoints.with(vec![("health", health.to_string())], n);
    }
    let mut checks = Family::new(
        "berth_health_checks",
        "Health checks made, by result.",
        MetricType::Counter,
    );
    for (result, n) in [("passed", c.checks - c.failed), ("failed", c.failed)] {
        checks = checks.with(vec![("result", result.to_string())], n);
    }
    vec![endpoints, checks]
}

/// What the datapath does not program: services held back, routes waiting for room.
fn capacity_families(p: &Published) -> [Family; 2] {
    let mut held = Family::new(
        "berth_services_held_back",
        "Services (address, protocol, port) of the plan the datapath does not program, \
         by the gateway address's family: IPv6 ones until the kernel program serves IPv6 \
         (each change is logged; `berth get routes` names them).",
        MetricType::Gauge,
    );
    for (family, n) in crate::datapath::held_back::count_by_family(&p.held_back) {
        held = held.with(vec![("family", family.to_string())], n);
    }
    let mut waiting = Family::new(
        "berth_routes_waiting_for_capacity",
        "Routes whose services are not programmed because the datapath is full \
         (Programmed=False, reason DatapathFull), by the limit they meet: services \
         (berth run --max-services) or backends (--max-backends). Each change is logged.",
        MetricType::Gauge,
    );
    for (limit, n) in crate::publish::waiting_by_limit(&p.waiting) {
        waiting = waiting.with(vec![("limit", limit.name().to_string())], n);
    }
    [held, waiting]
}

/// The datapath's: its conntrack (once counted) and its counters (once read).
fn datapath_families(p: &Published) -> Vec<Family> {
    use MetricType::{Counter, Gauge};
    let mut out = Vec::new();
    if let Some(ct) = &p.conntrack {
        out.extend([
            Family::new(
                "berth_conntrack_entries",
                "Entries in the conntrack (every flow direction, IPv4 and IPv6), counted \
                 every 10 s.",
                Gauge,
            )
            .with(vec![], ct.entries),
            Family::new(
                "berth_conntrack_capacity",
                "Entries the conntrack of each family (IPv4, IPv6) can hold (berth run \
                 --conntrack-size).",
                Gauge,
            )
            .with(vec![], ct.capacity),
            Family::new(
                "berth_conntrack_evictions",
                "Estimated conntrack entries the LRU evicted to make room for new ones, \
                 as the kernel counts no evictions: entries created (ct_created, which \
                 also counts an entry replaced in place, e.g. by a retransmitted SYN) \
                 less those in the table.",
                Counter,
            )
            .with(vec![], ct.evictions),
        ]);
    }
    if !p.counters.is_empty() {
        let mut datapath = Family::new(
            "berth_datapath_packets",
            "XDP verdicts and events by reason.",
            Counter,
        );
        for (reason, v) in &p.counters {
            datapath = datapath.with(vec![("reason", reason.to_string())], *v);
        }
        out.push(datapath);
    }
    out
}

/// Whether the node announces its addresses: how many it publishes, its state (1 for
/// the current one, 0 for the others) and, while withdrawn, why.
fn announce_families(p: &Published) -> Vec<Family> {
    use crate::announce::State;
    let Some(a) = &p.announce else {
        return Vec::new();
    };
    let mut states = Family::new(
        "berth_drain_state",
        "1 for the node's announce state (announced, or why its addresses are withdrawn: \
         draining, drained, stopping, not_ready), 0 for the others.",
        MetricType::Gauge,
    );
    for s in State::ALL {
        states = states.with(
            vec![("state", s.metric_label().to_string())],
            u64::from(s == a.state),
        );
    }
    let mut out = vec![
        Family::new(
            "berth_announced_addresses",
            "Gateway addresses published (address interface, --announce-table) now.",
            MetricType::Gauge,
        )
        .with(vec![], a.addresses.len() as u64),
        states,
    ];
    if let Some(reason) = &a.reason {
        out.push(
            Family::new(
                "berth_drain_reason",
                "1 while the addresses are withdrawn, labelled with why.",
                MetricType::Gauge,
            )
            .with(
                vec![
                    ("state", a.state.metric_label().to_string()),
                    ("reason", reason.clone()),
                ],
                1,
            ),
        );
    }
    out
}

fn listener_labels(namespace: &str, gateway: &str, listener: &str) -> Labels {
    vec![
        ("namespace", namespace.to_string()),
        ("gateway", gateway.to_string()),
        ("listener", listener.to_string()),
    ]
}

/// The per-address families: each route's traffic summed per gateway address and
/// protocol, so that their size does not grow with the routes. A sum falls when a
/// route goes away, which Prometheus' `rate()` takes as a counter reset.
fn address_families(p: &Published) -> [Family; 9] {
    use MetricType::{Counter, Gauge};

    let sums = super::addresses::sums(p);
    let [mut routes, mut packets, mut bytes, mut flows, mut active, mut snat, mut removed, mut kernel, mut silent] =
        [
            (
                "berth_address_routes",
                "Routes whose service on the gateway address is programmed.",
                Gauge,
            ),
            (
                "berth_address_packets",
                "Packets through the routes' ports of a gateway address, by direction.",
                Counter,
            ),
            (
                "berth_address_bytes",
                "Bytes through the routes' ports of a gateway address, by direction.",
                Counter,
            ),
            (
                "berth_address_flows",
                "Flows balanced to the backends of the routes of a gateway address.",
                Counter,
            ),
            (
                "berth_address_active_flows",
                "Tracked flows of a gateway address that forwarded a packet in the last minute.",
                Gauge,
            ),
            (
                "berth_address_snat_flows",
                "Tracked SNAT flows of a gateway address that forwarded a packet in the last \
             minute.",
                Gauge,
            ),
            (
                "berth_address_removed_backend_flows",
                "TCP connections of a gateway address's routes still on backends that left \
             their Services (kept until they end; berth get routes names the routes).",
                Gauge,
            ),
            (
                "berth_address_kernel_packets",
                "Packets of a gateway address's routes the kernel forwarded instead of XDP.",
                Counter,
            ),
            (
                "berth_address_unanswered_routes",
                "Routes of a gateway address that forward packets and got no reply for 10 s or \
             more (berth get routes names them).",
                Gauge,
            ),
        ]
        .map(|(name, help, kind)| Family::new(name, help, kind));
    for ((addr, protocol), sum) in sums {
        let at = vec![
            ("address", addr.to_string()),
            ("protocol", protocol.to_string()),
        ];
        let with = |direction: &str| {
            let mut labels = at.clone();
            labels.push(("direction", direction.to_string()));
            labels
        };
        let t = sum.traffic.stats;
        routes = routes.with(at.clone(), sum.routes);
        packets = packets
            .with(with("forward"), t.packets)
            .with(with("reply"), t.reply_packets);
        bytes = bytes
            .with(with("forward"), t.bytes)
            .with(with("reply"), t.reply_bytes);
        flows = flows.with(at.clone(), t.new_flows);
        active = active.with(at.clone(), sum.traffic.active_flows);
        snat = snat.with(at.clone(), sum.traffic.snat_flows);
        removed = removed.with(at.clone(), sum.traffic.removed_backend_flows);
        kernel = kernel.with(at.clone(), t.kernel_packets);
        silent = silent.with(at, sum.unanswered);
    }
    [
        routes, packets, bytes, flows, active, snat, removed, kernel, silent,
    ]
}

/// The per-route families: one sample per datapath service (route and address).
fn route_families(p: &Published) -> [Family; 8] {
    use MetricType::{Counter, Gauge};
    let [mut packets, mut bytes, mut flows, mut active, mut snat, mut removed, mut kernel, mut silent] =
        [
            (
                "berth_route_packets",
                "Packets through a route's port, by direction.",
                Counter,
            ),
            (
                "berth_route_bytes",
                "Bytes through a route's port, by direction.",
                Counter,
            ),
            (
                "berth_route_flows",
                "Flows balanced to a route's backends.",
                Counter,
            ),
            (
                "berth_route_active_flows",
                "Tracked flows of a route that forwarded a packet in the last minute.",
                Gauge,
            ),
            (
                "berth_route_snat_flows",
                "Tracked SNAT flows of a route that forwarded a packet in the last minute.",
                Gauge,
            ),
            (
                "berth_route_removed_backend_flows",
                "TCP connections of a route still on backends that left its Services (kept \
             until they end).",
                Gauge,
            ),
            (
                "berth_route_kernel_packets",
                "Packets of a route the kernel forwarded instead of XDP, by the last reason.",
                Counter,
            ),
            (
                "berth_route_unanswered",
                "1 while a route forwards packets and no reply has come back for 10 s or more.",
                Gauge,
            ),
        ]
        .map(|(name, help, kind)| Family::new(name, help, kind));
    // Every route's series, also of one without traffic (then zero, as the datapath
    // counted it).
    let none = crate::datapath::Traffic::default();
    for (service, o) in p.owners.iter() {
        let traffic = p.traffic.get(service).unwrap_or(&none);
        let t = traffic.stats;
        let route = vec![
            ("kind", o.kind.name().to_string()),
            ("namespace", o.namespace.to_string()),
            ("name", o.name.to_string()),
            ("address", service.addr.to_string()),
            ("port", service.port.to_string()),
        ];
        let with = |extra: (&'static str, String)| {
            let mut labels = route.clone();
            labels.push(extra);
            labels
        };
        let forward = || ("direction", "forward".to_string());
        let reply = || ("direction", "reply".to_string());
        packets = packets
            .with(with(forward()), t.packets)
            .with(with(reply()), t.reply_packets);
        bytes = bytes
            .with(with(forward()), t.bytes)
            .with(with(reply()), t.reply_bytes);
        flows = flows.with(route.clone(), t.new_flows);
        active = active.with(route.clone(), traffic.active_flows);
        snat = snat.with(route.clone(), traffic.snat_flows);
        removed = removed.with(route.clone(), traffic.removed_backend_flows);
        let path = traffic.path().unwrap_or_default();
        kernel = kernel.with(with(("path", path)), t.kernel_packets);
        silent = silent.with(route, u64::from(unanswered_for(traffic).is_some()));
    }
    [packets, bytes, flows, active, snat, removed, kernel, silent]
}

#[cfg(test)]
mod tests;
