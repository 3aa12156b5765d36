//! The admin endpoint: `/healthz`, `/readyz`, `/metrics` (Prometheus text) and
//! `/api/v1/state` (the `berth check -o json` document), plus `/api/v1/routes[/NS]` for
//! `berth get routes`. A small HTTP/1.0 responder: GET only, one request per connection.

use std::{
    fmt::Write as _,
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
};

use serde::{Deserialize, Serialize};

use crate::{
    check::StateDocument,
    datapath::{Protocol, ServiceAddr},
    model::claim_name,
    planner::{status::RouteParentStatus, RouteEntry},
    standalone::{Published, Shared},
};

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
    /// Accepted condition status and reason.
    pub accepted: String,
    /// Backend endpoints in the datapath for this port.
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
pub fn unanswered(t: &crate::datapath::Traffic) -> Option<String> {
    let since = t.unanswered_since?.elapsed();
    (since >= UNANSWERED_AFTER).then(|| {
        format!(
            "packets forwarded for {}s without a reply through the gateway: in router mode \
             the backends must route replies back through the gateway",
            since.as_secs()
        )
    })
}

/// Serves until the listener fails, one connection at a time on this thread: answers
/// are built from the published snapshot without waiting for the planner (the whole
/// state of 10k routes in tens of milliseconds, anything else in far less), a thread
/// per connection would cost more in thread starts and per-thread allocator memory,
/// and a client that stalls is cut off after a second.
pub fn serve(listener: TcpListener, shared: Shared) {
    for stream in listener.incoming().flatten() {
        let timeout = Some(std::time::Duration::from_secs(1));
        if stream.set_read_timeout(timeout).is_ok() && stream.set_write_timeout(timeout).is_ok() {
            let _ = handle(stream, &shared);
        }
    }
}

fn handle(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    // Read the headers too: closing with unread input would reset the connection.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let p = std::sync::Arc::clone(&shared.lock().unwrap_or_else(|e| e.into_inner()));
    let (code, kind, body) = match path.as_str() {
        "/healthz" => (200, "text/plain", "ok\n".to_string()),
        // Not ready while the last cycle failed: its claims (or first-seen times) may not
        // be durable, and what is served is the last state that was.
        "/readyz" => match (&p.last_error, p.cycles) {
            (Some(e), _) => (503, "text/plain", format!("not ready: {e}\n")),
            (None, 0) => (503, "text/plain", "not ready: no plan yet\n".to_string()),
            (None, _) => (200, "text/plain", "ready\n".to_string()),
        },
        "/api/v1/state" => match &p.state {
            Some(s) => (
                200,
                "application/json",
                serde_json::to_string_pretty(&**s).unwrap_or_default(),
            ),
            None => (503, "text/plain", "no plan yet\n".to_string()),
        },
        "/api/v1/routes" => (
            200,
            "application/json",
            serde_json::to_string(&route_rows(&p, None)).unwrap_or_default(),
        ),
        other if other.starts_with("/api/v1/routes/") => {
            let ns = &other["/api/v1/routes/".len()..];
            (
                200,
                "application/json",
                serde_json::to_string(&route_rows(&p, Some(ns))).unwrap_or_default(),
            )
        }
        "/metrics" => (200, "text/plain; version=0.0.4", metrics(&p)),
        _ => (404, "text/plain", "not found\n".to_string()),
    };
    let status = match code {
        200 => "200 OK",
        404 => "404 Not Found",
        _ => "503 Service Unavailable",
    };
    write!(stream, "HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
}

/// The rows of `berth get routes`, of one namespace or all.
pub fn route_rows(p: &Published, namespace: Option<&str>) -> Vec<RouteRow> {
    let Some(state) = &p.state else {
        return Vec::new();
    };
    // Routes are sorted by kind, namespace and name: a namespace's routes are found by
    // binary search within each kind, so asking for one namespace of many costs its own
    // rows only.
    let mut routes: Vec<&RouteEntry> = Vec::new();
    let mut at = 0;
    while at < state.routes.len() {
        let kind = state.routes[at].kind.as_str();
        let end = at + state.routes[at..].partition_point(|r| r.kind == kind);
        let block = &state.routes[at..end];
        let (lo, hi) = match namespace {
            None => (0, block.len()),
            Some(ns) => (
                block.partition_point(|r| r.namespace.as_str() < ns),
                block.partition_point(|r| r.namespace.as_str() <= ns),
            ),
        };
        routes.extend(block[lo..hi].iter().map(|r| &**r));
        at = end;
    }
    routes
        .into_iter()
        .flat_map(|r| {
            r.status
                .parents
                .iter()
                .map(move |parent| row(p, state, r, parent))
        })
        .collect()
}

/// The row of one route's parent: its claim and datapath service are looked up by the
/// names they must have.
fn row(
    p: &Published,
    state: &StateDocument,
    r: &RouteEntry,
    parent: &RouteParentStatus,
) -> RouteRow {
    let pr = &parent.parent_ref;
    let gw_ns = pr.namespace.as_deref().unwrap_or(&r.namespace);
    let protocol = if r.kind == "UDPRoute" {
        Protocol::Udp
    } else {
        Protocol::Tcp
    };
    let is_route = |kind: &str, namespace: &str, name: &str| {
        kind == r.kind && namespace == r.namespace && name == r.name
    };
    let claim = pr.port.and_then(|port| {
        let name = claim_name(&pr.name, &protocol.to_string(), port);
        let i = state
            .claims
            .binary_search_by(|c| (c.namespace.as_str(), c.name.as_str()).cmp(&(gw_ns, &name)))
            .ok()?;
        let c = &state.claims[i];
        is_route(&c.route.kind, &c.route.namespace, &c.route.name).then_some(c)
    });
    // The route's services: one per address its Gateway is served on.
    let services: Vec<ServiceAddr> = pr
        .port
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
                .filter(|s| {
                    p.owners
                        .get(s)
                        .is_some_and(|o| is_route(&o.kind, &o.namespace, &o.name))
                })
                .collect();
            Some(services)
        })
        .unwrap_or_default();
    let accepted = parent.conditions.iter().find(|c| c.kind == "Accepted");
    let backends = services
        .first()
        .and_then(|s| p.datapath.services.get(s))
        .map_or(0, |b| b.len());
    let traffic = services
        .iter()
        .filter_map(|s| p.traffic.get(s))
        .fold(crate::datapath::Traffic::default(), |a, t| a.plus(t));
    RouteRow {
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        kind: r.kind.clone(),
        gateway: pr.name.clone(),
        listener: claim
            .map(|c| c.listener.clone())
            .or_else(|| pr.section_name.clone())
            .unwrap_or_default(),
        port: pr.port,
        accepted: accepted
            .map(|c| format!("{} ({})", c.status, c.reason))
            .unwrap_or_default(),
        backends,
        created: r.created.clone(),
        packets: traffic.stats.packets + traffic.stats.reply_packets,
        bytes: traffic.stats.bytes + traffic.stats.reply_bytes,
        active_flows: traffic.active_flows,
        reply_packets: traffic.stats.reply_packets,
        kernel_packets: traffic.stats.kernel_packets,
        path: traffic.path().unwrap_or_else(|| "-".into()),
        warning: unanswered(&traffic),
    }
}

fn metrics(p: &Published) -> String {
    let mut m = String::new();
    let _ = writeln!(m, "# HELP berth_plans_total Plans made since start.\n# TYPE berth_plans_total counter\nberth_plans_total {}", p.cycles);
    let _ = writeln!(m, "# HELP berth_manifest_errors Manifest files whose current version is broken.\n# TYPE berth_manifest_errors gauge\nberth_manifest_errors {}", p.broken.len());
    let _ = writeln!(
        m,
        "# HELP berth_cycle_failing 1 while the last plan/commit/program cycle failed.\n# TYPE berth_cycle_failing gauge\nberth_cycle_failing {}",
        u8::from(p.last_error.is_some())
    );
    if let Some(s) = &p.state {
        let _ = writeln!(m, "# HELP berth_claims Claims held (bound or cooling down).\n# TYPE berth_claims gauge\nberth_claims {}", s.claims.len());
        let _ = writeln!(m, "# HELP berth_listener_attached_routes Attached routes per listener.\n# TYPE berth_listener_attached_routes gauge");
        for g in &s.gateways {
            for l in &g.status.listeners {
                let _ = writeln!(
                    m,
                    "berth_listener_attached_routes{{namespace=\"{}\",gateway=\"{}\",listener=\"{}\"}} {}",
                    g.namespace, g.name, l.name, l.attached_routes
                );
            }
        }
    }
    let _ = writeln!(m, "# HELP berth_listener_ports Ports of a range listener by state.\n# TYPE berth_listener_ports gauge");
    for u in &p.usage {
        let labels = format!(
            "namespace=\"{}\",gateway=\"{}\",listener=\"{}\"",
            u.namespace, u.gateway, u.listener
        );
        let free = u.size.saturating_sub(u.bound + u.cooling);
        let _ = writeln!(
            m,
            "berth_listener_ports{{{labels},state=\"used\"}} {}",
            u.bound
        );
        let _ = writeln!(
            m,
            "berth_listener_ports{{{labels},state=\"cooling\"}} {}",
            u.cooling
        );
        let _ = writeln!(m, "berth_listener_ports{{{labels},state=\"free\"}} {free}");
    }
    if !p.traffic.is_empty() {
        let _ = writeln!(m, "# HELP berth_route_packets_total Packets through a route's port, by direction.\n# TYPE berth_route_packets_total counter");
        let _ = writeln!(m, "# HELP berth_route_bytes_total Bytes through a route's port, by direction.\n# TYPE berth_route_bytes_total counter");
        let _ = writeln!(m, "# HELP berth_route_flows_total Flows balanced to a route's backends.\n# TYPE berth_route_flows_total counter");
        let _ = writeln!(m, "# HELP berth_route_active_flows Tracked flows of a route that forwarded a packet in the last minute.\n# TYPE berth_route_active_flows gauge");
        let _ = writeln!(m, "# HELP berth_route_kernel_packets_total Packets of a route the kernel forwarded instead of XDP, by the last reason.\n# TYPE berth_route_kernel_packets_total counter");
        let _ = writeln!(m, "# HELP berth_route_unanswered 1 while a route forwards packets and no reply has come back for 10 s or more.\n# TYPE berth_route_unanswered gauge");
        for (service, traffic) in &p.traffic {
            let (active, t) = (traffic.active_flows, traffic.stats);
            let Some(o) = p.owners.get(service) else {
                continue;
            };
            let labels = format!(
                "kind=\"{}\",namespace=\"{}\",name=\"{}\",address=\"{}\",port=\"{}\"",
                o.kind, o.namespace, o.name, service.addr, service.port
            );
            let _ = writeln!(
                m,
                "berth_route_packets_total{{{labels},direction=\"forward\"}} {}",
                t.packets
            );
            let _ = writeln!(
                m,
                "berth_route_packets_total{{{labels},direction=\"reply\"}} {}",
                t.reply_packets
            );
            let _ = writeln!(
                m,
                "berth_route_bytes_total{{{labels},direction=\"forward\"}} {}",
                t.bytes
            );
            let _ = writeln!(
                m,
                "berth_route_bytes_total{{{labels},direction=\"reply\"}} {}",
                t.reply_bytes
            );
            let _ = writeln!(m, "berth_route_flows_total{{{labels}}} {}", t.new_flows);
            let _ = writeln!(m, "berth_route_active_flows{{{labels}}} {active}");
            let _ = writeln!(
                m,
                "berth_route_kernel_packets_total{{{labels},path=\"{}\"}} {}",
                traffic.path().unwrap_or_default(),
                t.kernel_packets
            );
            let _ = writeln!(
                m,
                "berth_route_unanswered{{{labels}}} {}",
                u8::from(unanswered(traffic).is_some())
            );
        }
    }
    if !p.counters.is_empty() {
        let _ = writeln!(m, "# HELP berth_datapath_packets_total XDP verdicts and events by reason.\n# TYPE berth_datapath_packets_total counter");
        for (name, v) in &p.counters {
            let _ = writeln!(m, "berth_datapath_packets_total{{reason=\"{name}\"}} {v}");
        }
    }
    m
}

/// A GET against a running daemon's admin endpoint; returns the body.
pub fn get(addr: &str, path: &str) -> std::io::Result<String> {
    use std::io::Read;
    // A daemon that hangs must not hang its caller (`berth get`, probes, tests).
    const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
    let target = std::net::ToSocketAddrs::to_socket_addrs(addr)?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{addr}: no address")))?;
    let mut s = TcpStream::connect_timeout(&target, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    if !head.starts_with("HTTP/1.0 200") {
        return Err(std::io::Error::other(format!(
            "{path}: {}: {}",
            head.lines().next().unwrap_or_default(),
            body.trim()
        )));
    }
    Ok(body.to_string())
}
