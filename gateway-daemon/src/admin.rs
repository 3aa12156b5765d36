//! The admin endpoint: `/healthz`, `/readyz`, `/metrics` (Prometheus text) and
//! `/api/v1/state` (the `berth check -o json` document), plus `/api/v1/routes[/NS]` for
//! `berth get routes` and `/api/v1/announce` (whether the node announces its addresses),
//! answered from the published snapshot; and the operator's requests `POST
//! /api/v1/drain` and `POST /api/v1/undrain`, handed to the loop. [`server`] serves them
//! over HTTP, [`metrics`] encodes `/metrics`, [`get`] and [`post`] are the clients of
//! `berth get`, `berth drain` and `berth undrain`.

pub mod addresses;
pub mod backends;
pub mod host;
pub mod metrics;
pub mod server;

use std::{
    io::{Read, Write},
    net::TcpStream,
    sync::Arc,
    time::{Duration, Instant},
};

use hyper::StatusCode;
use serde::{Deserialize, Serialize};

use crate::{
    announce::control::Request,
    model::ServiceAddr,
    model::{claim_name, RouteKey},
    planner::{status::RouteParentStatus, Family, RouteEntry, ServedOn},
    publish::Published,
    state_document::StateDocument,
};

/// Which endpoints a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoints {
    /// All of them, the state API included (`--admin-addr`).
    All,
    /// `/healthz`, `/readyz` and `/metrics` only (`--metrics-addr`): what probes and
    /// Prometheus need, safe to serve off the host.
    Monitoring,
}

/// What a request's path asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    /// `/healthz`: the daemon runs.
    Health,
    /// `/readyz`: the last cycle succeeded.
    Ready,
    /// `/metrics`.
    Metrics,
    /// `/api/v1/state`: the state document.
    State,
    /// `/api/v1/routes[/NS]`: the rows of `berth get routes`, of one namespace or all.
    Routes(Option<String>),
    /// `/api/v1/tables/routes[/NS]`: the same rows as `berth get routes` prints them
    /// (as Kubernetes' API server prints tables for kubectl: at 100,000 routes the
    /// JSON of the rows is 30 MiB, and reading it took the command longer than the
    /// daemon took to write it).
    RouteTable(Option<String>),
    /// `/api/v1/announce`: whether the node announces its addresses (`announce::Status`).
    Announce,
    /// `/api/v1/node`: this node in a tier (`berth get node`): `NodeView`.
    Node,
    /// `/api/v1/backends`: every backend's traffic and the checks (`berth get backends`).
    Backends,
    /// `/api/v1/listeners`: how full each range listener is (`berth get listeners`).
    Listeners,
    /// `/api/v1/addresses`: the routes' traffic per gateway address and protocol
    /// (`berth get addresses`).
    Addresses,
    /// `POST /api/v1/drain` or `/api/v1/undrain`: the operator's request.
    Request(crate::announce::control::Request),
}

impl Resource {
    /// The resource at `path`, if `endpoints` serve it.
    pub fn at(path: &str, endpoints: Endpoints) -> Option<Resource> {
        let resource = match path {
            "/healthz" => Resource::Health,
            "/readyz" => Resource::Ready,
            "/metrics" => Resource::Metrics,
            "/api/v1/state" => Resource::State,
            "/api/v1/routes" => Resource::Routes(None),
            "/api/v1/tables/routes" => Resource::RouteTable(None),
            "/api/v1/announce" => Resource::Announce,
            "/api/v1/node" => Resource::Node,
            "/api/v1/backends" => Resource::Backends,
            "/api/v1/listeners" => Resource::Listeners,
            "/api/v1/addresses" => Resource::Addresses,
            "/api/v1/drain" => Resource::Request(Request::Drain),
            "/api/v1/undrain" => Resource::Request(Request::Undrain),
            other => match other.strip_prefix("/api/v1/tables/routes/") {
                Some(ns) => Resource::RouteTable(Some(ns.to_string())),
                None => Resource::Routes(Some(other.strip_prefix("/api/v1/routes/")?.to_string())),
            },
        };
        let monitoring = matches!(
            resource,
            Resource::Health | Resource::Ready | Resource::Metrics
        );
        (monitoring || endpoints == Endpoints::All).then_some(resource)
    }

    /// The methods it answers, as an `Allow` header lists them.
    pub fn methods(&self) -> &'static str {
        match self {
            Resource::Request(_) => "POST",
            _ => "GET, HEAD",
        }
    }

    /// Its status, content type and body in snapshot `p`, `/metrics` in `detail` (a
    /// request is answered by the server, which hands it to the loop).
    pub fn answer(
        &self,
        p: &Published,
        detail: metrics::Detail,
    ) -> (StatusCode, &'static str, String) {
        const TEXT: &str = "text/plain";
        const JSON: &str = "application/json";
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        match self {
            Resource::Health => (StatusCode::OK, TEXT, "ok\n".into()),
            Resource::Ready => match readiness(p, std::time::SystemTime::now()) {
                None => (StatusCode::OK, TEXT, "ready\n".into()),
                Some(why) => (unavailable, TEXT, why),
            },
            Resource::Metrics => (
                StatusCode::OK,
                metrics::CONTENT_TYPE,
                metrics::encode(p, detail),
            ),
            Resource::State => document(p.state.as_deref(), "no plan yet\n"),
            Resource::Routes(namespace) => (
                StatusCode::OK,
                JSON,
                route_rows_json(p, namespace.as_deref()),
            ),
            Resource::RouteTable(namespace) => (
                StatusCode::OK,
                "text/plain; charset=utf-8",
                route_table_text(p, namespace.as_deref()),
            ),
            Resource::Announce => document(p.announce.as_deref(), "not decided yet\n"),
            Resource::Node => (
                StatusCode::OK,
                JSON,
                serde_json::to_string_pretty(&NodeView::of(p)).unwrap_or_default(),
            ),
            Resource::Backends => (
                StatusCode::OK,
                JSON,
                serde_json::to_string_pretty(&backends::view(p)).unwrap_or_default(),
            ),
            Resource::Listeners => (
                StatusCode::OK,
                JSON,
                serde_json::to_string_pretty(&p.usage).unwrap_or_default(),
            ),
            Resource::Addresses => (
                StatusCode::OK,
                JSON,
                serde_json::to_string_pretty(&addresses::rows(p)).unwrap_or_default(),
            ),
            Resource::Request(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                TEXT,
                "method not allowed: POST\n".into(),
            ),
        }
    }
}

/// This node as one of a tier (`/api/v1/node`, `berth get node`): whether it announces
/// its addresses, and the packets of flows it picked up from other nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// Whether the node announces its addresses (none before the first decision).
    pub announce: Option<crate::announce::Status>,
    /// TCP segments without SYN that found no entry and were balanced by Maglev
    /// (`ct_miss_midflow`): flows that began on another node (or were evicted).
    pub midflow_misses: u64,
    /// Replies without an entry that Maglev matched, translated and recorded
    /// (`ct_miss_reply`).
    pub reply_misses: u64,
    /// Packets from a backend endpoint of no flow that Maglev maps elsewhere, passed
    /// untranslated (`reply_untracked`).
    pub replies_unmatched: u64,
    /// Replies and ICMP errors with a backend's address that arrived from elsewhere
    /// than that backend, dropped (`reply_spoofed`).
    #[serde(default)]
    pub replies_spoofed: u64,
}

impl NodeView {
    /// The view of snapshot `p` (counters zero without a datapath).
    pub fn of(p: &Published) -> NodeView {
        let counter = |c: gateway_common::Counter| p.counters.get(c.name()).copied().unwrap_or(0);
        NodeView {
            announce: p.announce.as_deref().cloned(),
            midflow_misses: counter(gateway_common::Counter::CtMissMidflow),
            reply_misses: counter(gateway_common::Counter::CtMissReply),
            replies_unmatched: counter(gateway_common::Counter::ReplyUntracked),
            replies_spoofed: counter(gateway_common::Counter::ReplySpoofed),
        }
    }
}

/// A published document as pretty JSON, or 503 saying `missing` when there is none
/// yet.
fn document<T: Serialize>(doc: Option<&T>, missing: &str) -> (StatusCode, &'static str, String) {
    match doc {
        Some(d) => (
            StatusCode::OK,
            "application/json",
            serde_json::to_string_pretty(d).unwrap_or_default(),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            missing.to_string(),
        ),
    }
}

/// Why `/readyz` answers 503, one reason a line, if it does: while the node does not
/// announce its addresses (drained, stopping, not ready for too long), so that an
/// external health check takes it out too; and while the last cycle failed (its claims
/// or first-seen times may not be durable, and what is served is the last state that
/// was) or no plan was made yet.
pub fn readiness(p: &Published, now: std::time::SystemTime) -> Option<String> {
    let mut lines = Vec::new();
    let withdrawn = p.announce.as_ref().filter(|a| !a.state.announcing());
    if let Some(a) = withdrawn {
        lines.push(a.summary(now));
    }
    // A node withdrawn for not being ready says why in its summary already.
    let said = withdrawn.is_some_and(|a| a.state == crate::announce::State::NotReady);
    if let Some(why) = p.not_ready().filter(|_| !said) {
        lines.push(format!("not ready: {why}"));
    }
    (!lines.is_empty()).then(|| lines.join("\n") + "\n")
}

/// One row of `berth get routes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: String,
    /// Gateway.
    pub gateway: String,
    /// Listener (of the claim), if any.
    pub listener: String,
    /// Assigned port, if any.
    pub port: Option<u16>,
    /// The gateway addresses the port is served on (none while it is not in the
    /// datapath).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<std::net::IpAddr>,
    /// Accepted condition status and reason.
    pub accepted: String,
    /// Backend endpoints in the datapath for this port that take new flows (those
    /// not ready or terminating keep their established flows only).
    pub backends: usize,
    /// First seen (RFC 3339), if known.
    pub created: Option<String>,
    /// Packets to and from the route's port, counted by the XDP program.
    #[serde(default)]
    pub packets: u64,
    /// Bytes to and from the route's port.
    #[serde(default)]
    pub bytes: u64,
    /// Tracked flows of the route's port that forwarded a packet in the last minute.
    #[serde(default)]
    pub active_flows: u64,
    /// Of those, the flows in SNAT mode.
    #[serde(default)]
    pub snat_flows: u64,
    /// TCP connections still on backends that left the route's Services (kept until
    /// they end).
    #[serde(default)]
    pub removed_backend_flows: u64,
    /// How the route's services forward: "snat" (GatewayConfig sourceNAT: true) or
    /// "router" (the backends see the client's address).
    #[serde(default)]
    pub mode: String,
    /// The path of the traffic of every route on the route's addresses together, where
    /// it is the route's own (`berth get routes` then leaves the reason to `berth get
    /// addresses`, said once per address); empty otherwise.
    #[serde(default)]
    pub address_path: String,
    /// Packets from the backends back to clients (reverse NAT).
    #[serde(default)]
    pub reply_packets: u64,
    /// Packets the kernel forwarded instead of XDP (either direction).
    #[serde(default)]
    pub kernel_packets: u64,
    /// How the route's packets leave: "xdp", "kernel: <why>", or "-" before any.
    #[serde(default)]
    pub path: String,
    /// Something the operator should look at (e.g. packets forwarded, no replies).
    #[serde(default)]
    pub warning: Option<String>,
}

/// Packets forwarded without any reply for this long make a route flagged.
pub const UNANSWERED_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// The warning of a route whose packets go unanswered, if they do.
/// How long a route's packets have been forwarded without a reply, once that is
/// [`UNANSWERED_AFTER`] or more.
pub fn unanswered_for(t: &crate::datapath::Traffic) -> Option<Duration> {
    let since = t.unanswered_since?.elapsed();
    (since >= UNANSWERED_AFTER).then_some(since)
}

/// What [`unanswered_for`] means for a route in SNAT mode or router mode.
pub fn unanswered(t: &crate::datapath::Traffic, snat: bool) -> Option<String> {
    let since = unanswered_for(t)?;
    let why = if snat {
        "in SNAT mode the backends answer the node's address toward them: are they up, \
         and does their traffic leave and come back through the interfaces Berth is attached to?"
    } else {
        "in router mode the backends must route replies back through the gateway"
    };
    Some(format!(
        "packets forwarded for {}s without a reply through the gateway: {why}",
        since.as_secs()
    ))
}

/// The rows of `berth get routes`, of one namespace or all.
pub fn route_rows(p: &Published, namespace: Option<&str>) -> Vec<RouteRow> {
    let mut rows = Vec::new();
    each_route_row(p, namespace, |r| rows.push(r));
    rows
}

/// [`route_rows`] as the JSON array `/api/v1/routes` answers, whole.
pub fn route_rows_json(p: &Published, namespace: Option<&str>) -> String {
    RouteRowParts::new(Arc::new(p.clone()), namespace, RowFormat::Json).whole()
}

/// The table `berth get routes` prints, of one namespace or all, whole.
pub fn route_table_text(p: &Published, namespace: Option<&str>) -> String {
    RouteRowParts::new(Arc::new(p.clone()), namespace, RowFormat::Table).whole()
}

/// How [`RouteRowParts`] writes the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFormat {
    /// The JSON array `/api/v1/routes` answers.
    Json,
    /// The table `berth get routes` prints (`/api/v1/tables/routes`).
    Table,
}

/// The rows of `berth get routes`, written a part of about [`PART_BYTES`] at a time as
/// the server sends them. At 100k routes they are ~30 MiB of JSON (16 MiB of table):
/// built whole, the answer (and a string doubling its way there) raised the daemon's
/// peak memory by 35 MiB; each row at once in memory once took ~10 times that.
pub struct RouteRowParts {
    p: Arc<Published>,
    format: RowFormat,
    /// The indices in the state's routes still to write, by kind.
    ranges: std::vec::IntoIter<std::ops::Range<usize>>,
    current: std::ops::Range<usize>,
    /// Whether the start (`[`, the table's head) is written, whether a row is, and
    /// whether the end is.
    opened: bool,
    rows: bool,
    closed: bool,
    /// A part ends once it holds this many bytes (the row that passes it included).
    part_bytes: usize,
}

/// About how many bytes one part of a streamed answer holds.
pub const PART_BYTES: usize = 64 * 1024;

impl RouteRowParts {
    /// The rows of snapshot `p`, of one namespace or all.
    pub fn new(p: Arc<Published>, namespace: Option<&str>, format: RowFormat) -> Self {
        let ranges = p
            .state
            .as_ref()
            .map(|state| route_ranges(&state.routes, namespace))
            .unwrap_or_default();
        RouteRowParts {
            p,
            format,
            ranges: ranges.into_iter(),
            current: 0..0,
            opened: false,
            rows: false,
            closed: false,
            part_bytes: PART_BYTES,
        }
    }

    /// The next part of the text, none once it is all written.
    pub fn next_part(&mut self) -> Option<Vec<u8>> {
        if self.closed {
            return None;
        }
        let mut out = Vec::with_capacity(self.part_bytes + 1024);
        if !self.opened {
            match self.format {
                RowFormat::Json => out.push(b'['),
                RowFormat::Table => out.extend(crate::output::route_table_head().bytes()),
            }
            self.opened = true;
        }
        let p = &*self.p;
        let mut line = String::new();
        while out.len() < self.part_bytes {
            // The next index, past ranges left empty (a kind without routes in the
            // namespace asked for).
            let next = loop {
                match self.current.next() {
                    Some(i) => break Some(i),
                    None => match self.ranges.next() {
                        Some(range) => self.current = range,
                        None => break None,
                    },
                }
            };
            let (Some(i), Some(state)) = (next, &p.state) else {
                match self.format {
                    RowFormat::Json => out.push(b']'),
                    RowFormat::Table => {
                        out.extend(crate::output::route_table_foot(&p.address_paths).bytes())
                    }
                }
                self.closed = true;
                break;
            };
            rows_of(p, state, &state.routes[i], |r| match self.format {
                RowFormat::Json => {
                    if self.rows {
                        out.push(b',');
                    }
                    self.rows = true;
                    // A row is strings and numbers, written to memory: this cannot fail.
                    let _ = serde_json::to_writer(&mut out, &r);
                }
                RowFormat::Table => {
                    line.clear();
                    crate::output::route_table_row(&mut line, &r);
                    out.extend(line.bytes());
                }
            });
        }
        Some(out)
    }

    /// All the parts, as one text.
    fn whole(mut self) -> String {
        let bytes: Vec<u8> = std::iter::from_fn(|| self.next_part()).flatten().collect();
        // Both formats are written as UTF-8 text.
        String::from_utf8(bytes).unwrap_or_default()
    }
}

/// Hands each row of `berth get routes` (of one namespace or all) to `emit`, in order.
fn each_route_row(p: &Published, namespace: Option<&str>, mut emit: impl FnMut(RouteRow)) {
    let Some(state) = &p.state else {
        return;
    };
    for range in route_ranges(&state.routes, namespace) {
        for i in range {
            rows_of(p, state, &state.routes[i], &mut emit);
        }
    }
}

/// The indices of `list`'s routes of one namespace or all, one range per kind.
/// Routes are sorted by kind, namespace and name: a namespace's routes are found by
/// binary search within each kind, so asking for one namespace of many costs its own
/// rows only.
fn route_ranges(
    list: &crate::planner::RouteList,
    namespace: Option<&str>,
) -> Vec<std::ops::Range<usize>> {
    // The first index whose route is not `before` (the list is partitioned by it).
    let first_not = |before: &dyn Fn(&RouteEntry) -> bool| {
        list.binary_search_by(|r| match before(r) {
            true => std::cmp::Ordering::Less,
            false => std::cmp::Ordering::Greater,
        })
        .unwrap_or_else(|i| i)
    };
    let mut ranges = Vec::new();
    let mut at = 0;
    while at < list.len() {
        let kind = list[at].kind;
        let end = first_not(&|r| r.kind <= kind);
        ranges.push(match namespace {
            None => at..end,
            Some(ns) => {
                first_not(&|r| (r.kind, r.namespace.as_str()) < (kind, ns))..first_not(&|r| {
                    (r.kind, r.namespace.as_str()) <= (kind, ns)
                })
            }
        });
        at = end;
    }
    ranges
}

/// Hands the rows of route `r` to `emit`: one per listener each parent is served on (a
/// range port, a fixed listener), one saying why for a parent served on none.
fn rows_of(p: &Published, state: &StateDocument, r: &RouteEntry, mut emit: impl FnMut(RouteRow)) {
    for (i, parent) in r.status.parents.iter().enumerate() {
        match r.served_on.get(i).map(Vec::as_slice).unwrap_or_default() {
            [] => emit(row(p, state, r, parent, None)),
            on => on
                .iter()
                .for_each(|s| emit(row(p, state, r, parent, Some(s)))),
        }
    }
}

/// The row of one route's parent on listener `on` (none: the parent is not served):
/// its claim and datapath service are looked up by the names they must have.
fn row(
    p: &Published,
    state: &StateDocument,
    r: &RouteEntry,
    parent: &RouteParentStatus,
    on: Option<&ServedOn>,
) -> RouteRow {
    let pr = &parent.parent_ref;
    // Rows of fixed listeners once showed no listener, port or traffic: their
    // parentRef has no port, so the port is the listener's.
    let port = on.map(|s| s.port).or(pr.port);
    let gw_ns = pr.namespace.as_deref().unwrap_or(&r.namespace);
    let protocol = r.kind.protocol();
    let key = RouteKey {
        kind: r.kind,
        namespace: r.namespace.clone(),
        name: r.name.clone(),
    };
    let claim = port.and_then(|port| {
        let name = claim_name(&pr.name, &protocol.to_string(), port);
        let i = state
            .claims
            .binary_search_by(|c| (c.metadata.ns(), c.metadata.name.as_str()).cmp(&(gw_ns, &name)))
            .ok()?;
        let c = &state.claims[i];
        (c.spec.route.key().as_ref() == Some(&key)).then_some(c)
    });
    // The route's services: one per address its Gateway is served on.
    let mut shadowed_by = None;
    let services: Vec<ServiceAddr> = port
        .and_then(|port| {
            let g = state
                .gateways
                .binary_search_by(|g| {
                    (g.namespace.as_str(), g.name.as_str()).cmp(&(gw_ns, &pr.name))
                })
                .ok()?;
            let services = state.gateways[g]
                .status
                .addresses
                .iter()
                .filter_map(|a| a.value.parse().ok())
                .map(|addr| ServiceAddr {
                    addr,
                    protocol,
                    port,
                })
                .filter(|s| match p.owners.get(s) {
                    Some(o) if **o == key => true,
                    Some(o) => {
                        shadowed_by.get_or_insert_with(|| format!("{}/{}", o.namespace, o.name));
                        false
                    }
                    None => false,
                })
                .collect();
            Some(services)
        })
        .unwrap_or_default();
    let accepted = parent.conditions.iter().find(|c| c.kind == "Accepted");
    // The endpoints of each family (those of its first address: every address of a
    // family has the same).
    let of_family = |family: Family| {
        services
            .iter()
            .find(|s| Family::of(&s.addr) == family)
            .map(|s| {
                (
                    s,
                    p.datapath
                        .services
                        .get(s)
                        .map_or(0, |b| b.iter().filter(|w| w.weight > 0).count()),
                )
            })
    };
    let by_family: Vec<(&ServiceAddr, usize)> =
        Family::ALL.into_iter().filter_map(of_family).collect();
    let backends = by_family.iter().map(|(_, n)| n).sum();
    let snat = services.iter().any(|s| p.datapath.source_nat.contains(s));
    let traffic = services
        .iter()
        .filter_map(|s| p.traffic.get(s))
        .fold(crate::datapath::Traffic::default(), |a, t| a.plus(t));
    let path = traffic.path().unwrap_or_else(|| "-".into());
    RouteRow {
        namespace: r.namespace.to_string(),
        name: r.name.to_string(),
        kind: r.kind.name().to_string(),
        gateway: pr.name.to_string(),
        listener: on
            .map(|s| s.listener.to_string())
            .or_else(|| claim.map(|c| c.spec.listener.to_string()))
            .or_else(|| pr.section_name.as_ref().map(ToString::to_string))
            .unwrap_or_default(),
        port,
        addresses: services.iter().map(|s| s.addr).collect(),
        accepted: accepted
            .map(|c| format!("{} ({})", c.status, c.reason))
            .unwrap_or_default(),
        backends,
        created: r.created.as_deref().map(str::to_string),
        packets: traffic.stats.packets + traffic.stats.reply_packets,
        bytes: traffic.stats.bytes + traffic.stats.reply_bytes,
        active_flows: traffic.active_flows,
        snat_flows: traffic.snat_flows,
        removed_backend_flows: traffic.removed_backend_flows,
        mode: if snat { "snat" } else { "router" }.to_string(),
        reply_packets: traffic.stats.reply_packets,
        kernel_packets: traffic.stats.kernel_packets,
        path: path.clone(),
        address_path: services
            .iter()
            .all(|s| p.address_paths.get(&(s.addr, s.protocol)) == Some(&path))
            .then(|| path.clone())
            .filter(|_| !services.is_empty())
            .unwrap_or_default(),
        warning: warnings(Warned {
            p,
            services: &services,
            by_family: &by_family,
            traffic: &traffic,
            shadowed_by: shadowed_by.filter(|_| services.is_empty()),
            resolved: parent.conditions.iter().find(|c| c.kind == "ResolvedRefs"),
            programmed: parent
                .conditions
                .iter()
                .find(|c| c.kind == crate::planner::capacity::PROGRAMMED),
        }),
    }
}

/// What [`warnings`] looks at for one row.
struct Warned<'a> {
    p: &'a Published,
    services: &'a [ServiceAddr],
    by_family: &'a [(&'a ServiceAddr, usize)],
    traffic: &'a crate::datapath::Traffic,
    /// The older route served on the row's port instead (GEP-2644), if one is.
    shadowed_by: Option<String>,
    /// The parent's ResolvedRefs condition.
    resolved: Option<&'a crate::planner::status::Condition>,
    /// The parent's Programmed condition (present while the datapath has no room).
    programmed: Option<&'a crate::planner::status::Condition>,
}

/// What the operator should look at about a route's services, if anything: not
/// programmed for want of room in the datapath, an older route served on its port
/// instead, no backend at all, those the datapath holds back, a family served without
/// endpoints beside one with, packets unanswered.
fn warnings(w: Warned) -> Option<String> {
    let Warned {
        p,
        services,
        by_family,
        traffic,
        shadowed_by,
        resolved,
        programmed,
    } = w;
    let mut out: Vec<String> = Vec::new();
    // Its message says which limit, and the option that raises it.
    out.extend(
        programmed
            .filter(|c| c.status == "False")
            .map(|c| c.message.to_string()),
    );
    if let Some(older) = shadowed_by {
        out.push(format!(
            "an older route, {older}, gets the traffic of this port (only the oldest route \
             of a listener is served)"
        ));
    }
    // A served route without a single backend was once silent (an unnamed Service port
    // unmatched): its packets are dropped, so it is always said.
    if !services.is_empty() && by_family.iter().all(|&(_, n)| n == 0) {
        let why = resolved.map_or("", |c| &*c.message);
        out.push(format!("no backends: packets to it are dropped ({why})"));
    }
    out.extend(services.iter().filter_map(|s| {
        let i = p.held_back.binary_search_by(|h| h.service.cmp(s)).ok()?;
        Some(format!("{s} is held back: {}", p.held_back[i].why))
    }));
    if by_family.iter().any(|&(_, n)| n > 0) {
        out.extend(by_family.iter().filter(|&&(_, n)| n == 0).map(|(s, _)| {
            let family = Family::of(&s.addr);
            format!("no {family} endpoints: {family} clients of {s} get no backend")
        }));
    }
    out.extend(services.iter().flat_map(|s| {
        let backends = p
            .datapath
            .services
            .get(s)
            .map(|b| b.as_slice())
            .unwrap_or_default();
        backends.iter().filter_map(|b| {
            let iface = p.snat_egress.get(&b.endpoint)?;
            Some(format!(
                "SNAT traffic to {} leaves out of {iface}, which refused Berth's programs (the \
                 daemon's log says why): packets the kernel forwards there keep the client's \
                 source",
                b.endpoint
            ))
        })
    }));
    let snat = services.iter().any(|s| p.datapath.source_nat.contains(s));
    out.extend(unanswered(traffic, snat));
    out.extend(services.iter().filter_map(|s| {
        crate::host_listeners::conflict(&p.host_listeners, s.protocol, s.addr, s.port)
    }));
    (!out.is_empty()).then(|| out.join("; "))
}

/// How long [`get`] waits for a whole answer: connecting, asking, reading to the end.
pub const GET_TIMEOUT: Duration = Duration::from_secs(5);

/// A GET against a running daemon's admin endpoint; returns the body of a 200 answer.
/// A daemon that hangs, or answers a byte at a time, must not hang its caller (`berth
/// get`, probes, tests): the whole request has [`GET_TIMEOUT`]. Errors name the URL.
pub fn get(addr: &str, path: &str) -> std::io::Result<String> {
    call("GET", addr, path)
}

/// A POST without a body (`berth drain`, `berth undrain`); returns the body of a 2xx
/// answer, within [`GET_TIMEOUT`] as [`get`].
pub fn post(addr: &str, path: &str) -> std::io::Result<String> {
    call("POST", addr, path)
}

/// `method path` against the admin endpoint at `addr`: the body of a 2xx answer (200
/// for GET); a 404 is an error of kind `NotFound`.
fn call(method: &str, addr: &str, path: &str) -> std::io::Result<String> {
    let url = format!("http://{addr}{path}");
    let named = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{method} {url}: no complete answer within {GET_TIMEOUT:?}"),
        ),
        kind => std::io::Error::new(kind, format!("{method} {url}: {e}")),
    };
    let (head, body) = fetch(addr, method, path, Instant::now() + GET_TIMEOUT).map_err(named)?;
    let status = head.lines().next().unwrap_or_default();
    let code = status.split_whitespace().nth(1).unwrap_or_default();
    let ok = match method {
        "GET" => code == "200",
        _ => code.len() == 3 && code.starts_with('2'),
    };
    if !ok {
        // A path the daemon does not serve is told apart by its kind (an older daemon
        // without a newer endpoint).
        let kind = match code {
            "404" => std::io::ErrorKind::NotFound,
            _ => std::io::ErrorKind::Other,
        };
        return Err(std::io::Error::new(
            kind,
            format!("{method} {url}: {status}: {}", body.trim()),
        ));
    }
    Ok(body)
}

/// The head and body of the answer to `method path`, read to its end before
/// `deadline`.
fn fetch(
    addr: &str,
    method: &str,
    path: &str,
    deadline: Instant,
) -> std::io::Result<(String, String)> {
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(std::io::ErrorKind::TimedOut)
    };
    let target = std::net::ToSocketAddrs::to_socket_addrs(addr)?
        .next()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    let mut s = TcpStream::connect_timeout(&target, left()?)?;
    s.set_write_timeout(Some(left()?))?;
    // HTTP/1.0: the daemon closes the connection after its answer, which ends it.
    let length = if method == "GET" {
        ""
    } else {
        "Content-Length: 0\r\n"
    };
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{length}\r\n"
    )?;
    let mut text = Vec::new();
    let mut chunk = vec![0; 64 * 1024];
    loop {
        // Each read may take only what is left of the whole request's time.
        s.set_read_timeout(Some(left()?))?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let text = String::from_utf8(text).map_err(std::io::Error::other)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    Ok((head.to_string(), body.to_string()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{datapath::held_back, manifests, planner};

    /// What a daemon publishes for the golden case `name` (its plan, with the
    /// services a datapath holds back).
    fn published(name: &str) -> Published {
        published_with(name, Default::default())
    }

    /// `published` for a datapath of room `capacity` (the case's `PlannerClock`
    /// document left out).
    fn published_with(name: &str, capacity: crate::datapath::Capacity) -> Published {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
        let path = dir.join(format!("{name}.in.yaml"));
        let text = std::fs::read_to_string(&path).expect("golden input");
        let text: Vec<&str> = text
            .split("\n---\n")
            .filter(|doc| !doc.contains("kind: PlannerClock"))
            .collect();
        published_of(&path, &text.join("\n---\n"), capacity)
    }

    /// What a daemon publishes for the manifests `text` (read as file `path`).
    fn published_of(path: &Path, text: &str, capacity: crate::datapath::Capacity) -> Published {
        let parsed = manifests::parse_file(path, text);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let snapshot = manifests::snapshot([&parsed]);
        let plan = planner::plan(&planner::Input {
            snapshot: &snapshot,
            claims: &Default::default(),
            now: humantime::parse_rfc3339("2026-01-01T00:00:00Z").expect("time"),
            default_addresses: planner::DefaultAddresses::default(),
            ephemeral_ports: None,
            allocate: true,
            snat_ports: planner::DEFAULT_SNAT_PORTS,
            capacity,
        });
        let (_, held) = held_back::kernel_state(&plan.datapath, None);
        let mut p = crate::publish::effects(plan, None, &Published::default()).expect("effects");
        p.held_back = held;
        p
    }

    #[test]
    fn the_routes_answers_written_row_by_row_are_the_json_and_the_table_of_the_rows() {
        let p = published_with(
            "a-full-datapath-serves-the-oldest-routes-and-the-rest-keep-their-ports-and-say-why",
            crate::datapath::Capacity {
                services: 2,
                ..Default::default()
            },
        );
        for namespace in [None, Some("team-a"), Some("nobody")] {
            let rows = route_rows(&p, namespace);
            assert_eq!(
                route_rows_json(&p, namespace),
                serde_json::to_string(&rows).expect("json"),
                "{namespace:?}"
            );
            assert_eq!(
                route_table_text(&p, namespace),
                crate::output::route_table(&rows),
                "{namespace:?}"
            );
        }
        assert!(!route_rows(&p, None).is_empty());
        assert_eq!(route_rows_json(&Published::default(), None), "[]");
        // Written a row a part, the parts make the same text.
        let p = Arc::new(p);
        for format in [RowFormat::Json, RowFormat::Table] {
            let mut parts = RouteRowParts::new(Arc::clone(&p), None, format);
            parts.part_bytes = 1;
            let parts: Vec<Vec<u8>> = std::iter::from_fn(|| parts.next_part()).collect();
            assert!(parts.len() > 3, "{format:?}: {} parts", parts.len());
            let whole = RouteRowParts::new(Arc::clone(&p), None, format).whole();
            assert_eq!(String::from_utf8(parts.concat()).expect("text"), whole);
        }
        let all = Resource::at("/api/v1/tables/routes", Endpoints::All);
        assert_eq!(all, Some(Resource::RouteTable(None)));
        let (code, _, text) = Resource::RouteTable(None).answer(&p, metrics::Detail::Aggregate);
        assert_eq!(code, StatusCode::OK);
        assert!(
            text.starts_with("NAMESPACE") && text.contains("oldest"),
            "{text}"
        );
        assert_eq!(
            Resource::at("/api/v1/tables/routes/team-a", Endpoints::All),
            Some(Resource::RouteTable(Some("team-a".into())))
        );
    }

    /// The real admin server on a free loopback port, serving snapshot `p`; its address.
    fn serve(p: Published) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let shared: crate::publish::Shared = Arc::new(std::sync::Mutex::new(Arc::new(p)));
        server::spawn(
            vec![(listener, Endpoints::All)],
            &addr,
            metrics::Detail::Aggregate,
            shared,
            Default::default(),
        )
        .expect("serve");
        addr
    }

    #[test]
    fn a_namespace_with_routes_of_the_second_kind_only_gets_its_rows_in_parts() {
        // The examples: team-a has a TCPRoute, team-b a UDPRoute. Written in parts, the
        // rows of team-b once came out empty: the TCPRoutes' range of team-b is empty,
        // and an empty range ended the rows.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let text: Vec<String> = ["gateway.yaml", "team-a.yaml", "team-b.yaml"]
            .iter()
            .map(|f| std::fs::read_to_string(dir.join(f)).expect("example"))
            .collect();
        let p = Arc::new(published_of(
            &dir.join("all.yaml"),
            &text.join("\n---\n"),
            Default::default(),
        ));
        let all = route_rows(&p, None);
        assert!(all
            .iter()
            .any(|r| r.kind == "UDPRoute" && r.namespace == "team-b"));
        for namespace in ["team-a", "team-b"] {
            let want: Vec<RouteRow> = all
                .iter()
                .filter(|r| r.namespace == namespace)
                .cloned()
                .collect();
            assert!(!want.is_empty(), "{namespace}");
            for part_bytes in [1, PART_BYTES] {
                let mut parts =
                    RouteRowParts::new(Arc::clone(&p), Some(namespace), RowFormat::Json);
                parts.part_bytes = part_bytes;
                let json: Vec<u8> = std::iter::from_fn(|| parts.next_part()).flatten().collect();
                let rows: Vec<RouteRow> = serde_json::from_slice(&json).expect("json");
                assert_eq!(rows, want, "{namespace}, parts of {part_bytes} bytes");
            }
        }
    }

    #[test]
    fn the_routes_are_sent_as_written_to_http_1_0_and_chunked_to_http_1_1_clients() {
        let p = published("dynamic-routes-get-the-lowest-free-ports-in-source-order");
        let addr = serve(p.clone());
        let json = route_rows_json(&p, None);
        assert!(json.len() > 2, "{json}");
        // berth's own client asks in HTTP/1.0: the answer ends with the connection.
        assert_eq!(get(&addr, "/api/v1/routes").expect("routes"), json);
        assert_eq!(
            get(&addr, "/api/v1/tables/routes").expect("table"),
            route_table_text(&p, None)
        );
        // curl and Prometheus ask in HTTP/1.1: chunks.
        let mut s = TcpStream::connect(&addr).expect("connect");
        s.write_all(b"GET /api/v1/routes HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .expect("request");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("answer");
        let (head, mut rest) = text.split_once("\r\n\r\n").expect("head and body");
        assert!(
            head.to_ascii_lowercase()
                .contains("transfer-encoding: chunked"),
            "{head}"
        );
        let mut body = String::new();
        loop {
            let (size, after) = rest.split_once("\r\n").expect("chunk size");
            let size = usize::from_str_radix(size, 16).expect("hex size");
            if size == 0 {
                break;
            }
            body.push_str(&after[..size]);
            rest = after[size..].strip_prefix("\r\n").expect("chunk end");
        }
        assert_eq!(body, json);
    }

    #[test]
    fn the_client_tells_a_path_the_daemon_does_not_serve_by_its_kind() {
        let addr = serve(Published::default());
        let table = get(&addr, "/api/v1/tables/routes").expect("the table");
        assert!(table.starts_with("NAMESPACE"), "{table}");
        let missing = get(&addr, "/api/v1/tables/nothing").expect_err("404");
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound, "{missing}");
        let unavailable = get(&addr, "/api/v1/state").expect_err("503: no plan yet");
        assert_ne!(
            unavailable.kind(),
            std::io::ErrorKind::NotFound,
            "{unavailable}"
        );
    }

    #[test]
    fn routes_waiting_for_room_in_the_datapath_are_warned_about_and_counted_and_it_is_ready() {
        let room = crate::datapath::Capacity {
            services: 2,
            ..Default::default()
        };
        let p = published_with(
            "a-full-datapath-serves-the-oldest-routes-and-the-rest-keep-their-ports-and-say-why",
            room,
        );
        let rows = route_rows(&p, Some("team-a"));
        let by = |name: &str| {
            rows.iter()
                .find(|r| r.name == name)
                .unwrap_or_else(|| panic!("no {name}: {rows:?}"))
        };
        assert_eq!(by("oldest").warning, None);
        assert_eq!(by("oldest").backends, 1);
        for name in ["third", "newest"] {
            let r = by(name);
            assert!(r.port.is_some() && r.accepted.starts_with("True"), "{r:?}");
            assert_eq!(r.backends, 0, "{r:?}");
            let w = r.warning.as_deref().unwrap_or_default();
            assert!(
                w.starts_with(
                    "not programmed: the datapath holds at most 2 services (berth run \
                     --max-services)"
                ),
                "{r:?}"
            );
        }
        let table = crate::output::route_table(&rows);
        assert!(table.contains("  ↳ warning: not programmed"), "{table}");
        let text = metrics::encode(&p, metrics::Detail::Aggregate);
        for want in [
            "berth_routes_waiting_for_capacity{limit=\"services\"} 2",
            "berth_routes_waiting_for_capacity{limit=\"backends\"} 0",
        ] {
            assert!(text.contains(want), "no {want} in:\n{text}");
        }
        assert_eq!(readiness(&p, std::time::SystemTime::now()), None);
    }

    #[test]
    fn the_node_view_counts_flows_picked_up_from_other_gateways_and_prints_a_row() {
        use gateway_common::Counter;
        let mut p = Published::default();
        for (c, n) in [
            (Counter::CtMissMidflow, 3),
            (Counter::CtMissReply, 5),
            (Counter::ReplyUntracked, 1),
            (Counter::ReplySpoofed, 7),
            (Counter::NewFlow, 99),
        ] {
            p.counters.insert(c.name(), n);
        }
        p.announce = Some(std::sync::Arc::new(crate::announce::Status::example(
            crate::announce::State::Draining,
            Some("addresses withdrawn by berth drain"),
            &[],
        )));
        let node = NodeView::of(&p);
        assert_eq!(
            (
                node.midflow_misses,
                node.reply_misses,
                node.replies_unmatched,
                node.replies_spoofed
            ),
            (3, 5, 1, 7)
        );
        let (status, _, body) = Resource::Node.answer(&p, metrics::Detail::Aggregate);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(serde_json::from_str::<NodeView>(&body).expect("json"), node);
        let table = crate::output::node_table(&node);
        let row = table.lines().nth(1).expect("a row");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells.first(), Some(&"DRAINING"), "{table}");
        assert_eq!(cells[cells.len() - 4..], ["3", "5", "1", "7"], "{table}");
        assert_eq!(
            Resource::at("/api/v1/node", Endpoints::Monitoring),
            None,
            "the node view is on the admin address only"
        );
    }

    #[test]
    fn readiness_says_why_the_addresses_are_withdrawn_and_why_the_node_is_not_ready() {
        use crate::announce::{State, Status};
        let t0 = humantime::parse_rfc3339(crate::announce::EXAMPLE_SINCE).expect("time");
        let status = |state: State, reason: Option<&str>| Status::example(state, reason, &[]);
        let published = |announce: Option<Status>, last_error: Option<&str>| Published {
            cycles: 1,
            last_error: last_error.map(str::to_string),
            announce: announce.map(std::sync::Arc::new),
            ..Published::default()
        };
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(readiness(&published(None, None), at(0)), None);
        let announced = published(Some(status(State::Announced, None)), None);
        assert_eq!(readiness(&announced, at(0)), None);
        let drained = Some(status(
            State::Draining,
            Some("addresses withdrawn by berth drain"),
        ));
        assert_eq!(
            readiness(&published(drained.clone(), Some("disk full")), at(12)).as_deref(),
            Some("draining: addresses withdrawn by berth drain 12s ago\nnot ready: disk full\n")
        );
        let not_ready = Some(status(State::NotReady, Some("not ready (disk full)")));
        assert_eq!(
            readiness(&published(not_ready, Some("disk full")), at(3)).as_deref(),
            Some("withdrawn-not-ready: not ready (disk full) 3s ago\n"),
            "the reason is said once"
        );
        let no_plan = Published::default();
        assert_eq!(
            readiness(&no_plan, at(0)).as_deref(),
            Some("not ready: no plan yet\n")
        );
    }

    #[test]
    fn a_route_with_only_endpoints_of_a_family_its_gateway_does_not_serve_says_so() {
        // An IPv4 Gateway, a UDPRoute whose Service has only IPv6 endpoints: accepted,
        // no backend, and the row and the loss log say why (issue 31).
        let p = published(
            "an-ipv4-gateway-refuses-a-route-with-only-ipv6-endpoints-and-serves-the-others",
        );
        let rows = route_rows(&p, None);
        let dns = rows.iter().find(|r| r.name == "dns").expect("dns");
        assert_eq!(
            (dns.accepted.as_str(), dns.backends),
            ("True (Accepted)", 0)
        );
        assert_eq!(
            dns.warning.as_deref(),
            Some(
                "no backends: packets to it are dropped (Gateway infra/shared serves IPv4 \
                 only; Service team-a/dns has only IPv6 endpoints (there is no NAT64))"
            )
        );
        let web = rows.iter().find(|r| r.name == "web").expect("web");
        assert_eq!((web.backends, web.warning.as_deref()), (1, None));
        assert_eq!(
            crate::publish::loss_routes(&p, &p, gateway_common::Counter::DropNoBackend),
            "UDPRoute/team-a/dns"
        );
    }

    #[test]
    fn a_route_of_a_dual_stack_gateway_names_its_endpointless_family() {
        let p = published(
            "a-dual-stack-gateway-serves-a-route-with-only-ipv4-endpoints-on-ipv4-and-says-so",
        );
        assert!(p.held_back.is_empty(), "IPv6 is served: {:?}", p.held_back);
        let rows = route_rows(&p, None);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].backends, 1);
        assert_eq!(
            rows[0].warning.as_deref(),
            Some("no IPv6 endpoints: IPv6 clients of TCP/[2001:db8::1]:30000 get no backend")
        );
        let table = crate::output::route_table(&rows);
        assert!(table.contains("  ↳ warning: no IPv6 endpoints"), "{table}");
        let metrics = metrics::encode(&p, metrics::Detail::Aggregate);
        for want in [
            "berth_services_held_back{family=\"ipv4\"} 0",
            "berth_services_held_back{family=\"ipv6\"} 0",
        ] {
            assert!(
                metrics.lines().any(|l| l == want),
                "no {want:?} in:\n{metrics}"
            );
        }
    }

    #[test]
    fn a_route_of_a_dual_stack_gateway_with_both_families_counts_the_endpoints_of_each() {
        let mut p = published("a-dual-stack-gateway-serves-both-families-on-the-same-port");
        let rows = route_rows(&p, None);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].port, Some(30000));
        assert_eq!(rows[0].backends, 3, "two IPv4 endpoints and one IPv6");
        assert_eq!(rows[0].warning, None, "{rows:?}");
        // A service the datapath holds back is named with the reason.
        let v6 = *p
            .datapath
            .services
            .keys()
            .find(|s| s.addr.is_ipv6())
            .expect("an IPv6 service");
        p.held_back = vec![held_back::HeldBack {
            service: v6,
            why: held_back::Why::MixedFamilies,
        }];
        assert_eq!(
            route_rows(&p, None)[0].warning.as_deref(),
            Some(
                "TCP/[2001:db8::1]:30000 is held back: a backend of the other IP family \
                 (there is no NAT64)"
            )
        );
    }

    #[test]
    fn a_kernel_path_all_of_an_addresss_routes_share_is_said_once_per_address() {
        // Routes on one address, all forwarded by the kernel for one reason: the rows
        // say PATH kernel, the reason is said once, per address (issue 31).
        let mut p = published("the-namespace-quota-refuses-the-extra-route-only");
        let services: Vec<ServiceAddr> = p.datapath.services.keys().copied().collect();
        let n = services.len();
        assert!(n >= 2, "{services:?}");
        for s in &services {
            let mut traffic = crate::datapath::Traffic::default();
            traffic.stats.packets = 10;
            traffic.stats.kernel_packets = 10;
            traffic.stats.kernel_reason = gateway_common::Counter::KernelNoXdpEgress as u32 + 1;
            std::sync::Arc::make_mut(&mut p.traffic).insert(*s, traffic);
        }
        p.address_paths = Arc::new(
            addresses::sums(&p)
                .into_iter()
                .filter_map(|(k, s)| Some((k, s.traffic.path()?)))
                .collect(),
        );
        let rows = addresses::rows(&p);
        assert_eq!(rows.len(), 1, "{rows:?}");
        let all = 10 * n as u64;
        assert_eq!(
            (rows[0].routes, rows[0].packets, rows[0].kernel_packets),
            (n as u64, all, all)
        );
        assert_eq!(rows[0].path, "kernel: egress takes no XDP frames");
        let table = crate::output::address_table(&rows);
        assert_eq!(
            table.matches("forwarded by the kernel").count(),
            1,
            "{table}"
        );

        let routes = RouteRowParts::new(Arc::new(p), None, RowFormat::Table).whole();
        assert_eq!(
            routes.matches("egress takes no XDP frames").count(),
            1,
            "{routes}"
        );
        assert_eq!(
            routes.matches(" kernel ").count(),
            n,
            "every row's PATH: {routes}"
        );
    }

    #[test]
    fn routes_of_a_fixed_listener_show_its_name_port_backends_and_traffic() {
        let mut p = published(
            "two-routes-on-a-fixed-listener-are-both-accepted-and-only-the-oldest-serves",
        );
        let service = *p
            .datapath
            .services
            .keys()
            .next()
            .expect("the listener's service");
        let mut traffic = crate::datapath::Traffic::default();
        traffic.stats.packets = 7;
        traffic.stats.reply_packets = 3;
        traffic.active_flows = 2;
        std::sync::Arc::make_mut(&mut p.traffic).insert(service, traffic);
        let rows = route_rows(&p, None);
        let row = |name: &str| rows.iter().find(|r| r.name == name).expect("a row");
        let (old, new) = (row("old"), row("new"));
        assert_eq!(
            (old.listener.as_str(), old.port, old.backends),
            ("tcp-80", Some(80), 1),
            "{old:?}"
        );
        assert_eq!((old.packets, old.active_flows), (10, 2), "{old:?}");
        assert_eq!(old.warning, None, "{old:?}");
        // The newer route is accepted but not served: said, with no traffic of its own.
        assert_eq!(
            (new.listener.as_str(), new.port, new.backends, new.packets),
            ("tcp-80", Some(80), 0, 0),
            "{new:?}"
        );
        assert!(
            new.warning
                .as_deref()
                .is_some_and(|w| w.starts_with("an older route, team-a/old, gets the traffic")),
            "{new:?}"
        );
    }

    #[test]
    fn a_served_route_without_any_backend_is_warned_about() {
        let p = published(
            "service-ports-match-endpoint-slice-ports-by-name-an-unnamed-one-by-the-empty-name",
        );
        let rows = route_rows(&p, None);
        let row = |name: &str| rows.iter().find(|r| r.name == name).expect("a row");
        let unnamed = row("unnamed");
        assert_eq!(
            unnamed.backends, 2,
            "an IPv4 and an IPv6 endpoint: {unnamed:?}"
        );
        assert_eq!(unnamed.warning, None, "{unnamed:?}");
        assert_eq!(row("named").backends, 2, "{rows:?}");
        let mismatched = row("mismatched");
        assert_eq!(mismatched.backends, 0);
        let warning = mismatched.warning.as_deref().unwrap_or_default();
        assert!(
            warning.starts_with("no backends: packets to it are dropped")
                && warning.contains("has no TCP port named \"\""),
            "{warning}"
        );
        let table = crate::output::route_table(&rows);
        assert!(table.contains("  ↳ warning: no backends"), "{table}");
    }
}
