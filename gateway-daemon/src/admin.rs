//! The admin endpoint: `/healthz`, `/readyz`, `/metrics` (Prometheus text) and
//! `/api/v1/state` (the `berth check -o json` document), plus `/api/v1/routes[/NS]` for
//! `berth get routes` and `/api/v1/announce` (whether the node announces its addresses),
//! answered from the published snapshot; and the operator's requests `POST
//! /api/v1/drain` and `POST /api/v1/undrain`, handed to the loop. [`server`] serves them
//! over HTTP, [`metrics`] encodes `/metrics`, [`get`] and [`post`] are the clients of
//! `berth get`, `berth drain` and `berth undrain`.

pub mod addresses;
pub mod backends;
mod client;
pub mod host;
pub mod metrics;
mod route_row;
mod routes;
pub mod server;

pub use client::{get, post, ClientError, GET_TIMEOUT};
pub use route_row::{unanswered, unanswered_for, RouteRow, UNANSWERED_AFTER};
pub use routes::{
    route_rows, route_rows_json, route_table_text, RouteRowParts, RowFormat, PART_BYTES,
};

use hyper::StatusCode;
use serde::{Deserialize, Serialize};

use crate::{announce::control::Request, publish::Published};

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

#[cfg(test)]
mod tests;
