//! What the `berth` CLI prints as tables (kubectl-style): `berth check` and
//! `berth get gateways|routes|claims`. Each printer returns the text, newline-ended.
//! And the line `berth drain` and `berth undrain` print.

use std::{fmt::Write as _, time::SystemTime};

use crate::{
    admin::RouteRow,
    announce::{control::Request, Status},
    state_document::{ClaimView, StateDocument},
};

/// The Gateways table of a document, then its routes table (none for a document without
/// routes).
pub fn state_tables(doc: &StateDocument) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<16} {:<24} {:<9} {:<10} {:<24} {}\n",
        "NAMESPACE", "GATEWAY", "ACCEPTED", "PROGRAMMED", "ADDRESSES", "LISTENERS"
    ));
    for g in &doc.gateways {
        let cond = |t: &str| {
            g.status
                .conditions
                .iter()
                .find(|c| c.kind == t)
                .map_or("Unknown", |c| &*c.status)
                .to_string()
        };
        let listeners: Vec<String> = g
            .status
            .listeners
            .iter()
            .map(|l| format!("{}({})", l.name, l.attached_routes))
            .collect();
        let addresses: Vec<&str> = g
            .status
            .addresses
            .iter()
            .map(|a| a.value.as_str())
            .collect();
        out.push_str(&format!(
            "{:<16} {:<24} {:<9} {:<10} {:<24} {}\n",
            g.namespace,
            g.name,
            cond("Accepted"),
            cond("Programmed"),
            if addresses.is_empty() {
                "-".to_string()
            } else {
                addresses.join(",")
            },
            listeners.join(",")
        ));
    }
    // `berth get gateways` passes a document without routes: no empty routes table.
    if doc.routes.is_empty() {
        return out;
    }
    out.push('\n');
    out.push_str(&format!(
        "{:<16} {:<24} {:<9} {:<22} {:<7} {:<9} {}\n",
        "NAMESPACE", "NAME", "KIND", "GATEWAY", "PORT", "ACCEPTED", "REASON"
    ));
    for r in &doc.routes {
        for p in &r.status.parents {
            let accepted = p.conditions.iter().find(|c| c.kind == "Accepted");
            let port = p
                .parent_ref
                .port
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into());
            out.push_str(&format!(
                "{:<16} {:<24} {:<9} {:<22} {:<7} {:<9} {}\n",
                r.namespace,
                r.name,
                r.kind.name(),
                p.parent_ref.name,
                port,
                accepted.map_or("Unknown", |c| &*c.status),
                accepted.map_or("", |c| &*c.reason)
            ));
        }
    }
    policy_table(&mut out, doc);
    out
}

/// The policies' table of `state_tables` (none without policies): one row per target,
/// with its conditions as `status/reason` and the first message that is not `True`.
fn policy_table(out: &mut String, doc: &StateDocument) {
    if doc.policies.is_empty() {
        return;
    }
    out.push('\n');
    out.push_str(&format!(
        "{:<16} {:<24} {:<20} {:<24} {:<26} {:<26} {}\n",
        "NAMESPACE", "POLICY", "KIND", "TARGET", "ACCEPTED", "HEALTHY", "MESSAGE"
    ));
    for p in &doc.policies {
        for a in &p.status.ancestors {
            let cond = |t: &str| {
                a.conditions
                    .iter()
                    .find(|c| c.kind == t)
                    .map_or("-".to_string(), |c| format!("{}/{}", c.status, c.reason))
            };
            let message = a
                .conditions
                .iter()
                .find(|c| c.status != "True")
                .or(a.conditions.first())
                .map_or("", |c| &*c.message);
            out.push_str(&format!(
                "{:<16} {:<24} {:<20} {:<24} {:<26} {:<26} {}\n",
                p.namespace,
                p.name,
                p.kind,
                format!("{}/{}", a.ancestor_ref.kind, a.ancestor_ref.name),
                cond("Accepted"),
                cond(crate::health::status::HEALTHY),
                message
            ));
        }
    }
}

/// `berth get routes`: one row per route with its traffic, and below a row the reason
/// its packets take the kernel's way and any warning.
pub fn route_table(rows: &[RouteRow]) -> String {
    let mut out = route_table_head();
    for r in rows {
        route_table_row(&mut out, r);
    }
    out
}

/// The head line of `route_table` (its columns have fixed widths: rows follow one by
/// one, as the daemon writes them for `/api/v1/tables/routes`).
pub fn route_table_head() -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "{:<16} {:<20} {:<9} {:<16} {:<12} {:<6} {:<24} {:<8} {:<5} {:<6} {:<6} TRAFFIC",
        "NAMESPACE",
        "NAME",
        "KIND",
        "GATEWAY",
        "LISTENER",
        "PORT",
        "ACCEPTED",
        "BACKENDS",
        "AGE",
        "MODE",
        "PATH"
    );
    out
}

/// Appends the line of row `r` of `route_table` (and the lines below it) to `out`.
pub fn route_table_row(out: &mut String, r: &RouteRow) {
    {
        let port = r.port.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
        let path = path_column(&r.path);
        let _ = writeln!(
            out,
            "{:<16} {:<20} {:<9} {:<16} {:<12} {:<6} {:<24} {:<8} {:<5} {:<6} {:<6} {} pkts, {} B, {} active flows{}",
            r.namespace,
            r.name,
            r.kind,
            r.gateway,
            r.listener,
            port,
            r.accepted,
            r.backends,
            age(r.created.as_deref()),
            if r.mode.is_empty() { "-" } else { &r.mode },
            path,
            r.packets,
            r.bytes,
            r.active_flows,
            if r.mode == "snat" {
                format!(" ({} snat)", r.snat_flows)
            } else {
                String::new()
            }
        );
        // The slow way and its reason, and anything to look at, below the row; a
        // reason every route of its addresses shares is said once per address (`berth
        // get addresses`), not on each of their rows.
        if let Some(why) = r.path.strip_prefix("kernel: ") {
            if r.address_path != r.path {
                let _ = writeln!(out, "  ↳ forwarded by the kernel: {why}");
            }
        }
        if r.removed_backend_flows > 0 {
            let _ = writeln!(
                out,
                "  ↳ {} connection(s) still on backends that left its Services",
                r.removed_backend_flows
            );
        }
        if let Some(w) = &r.warning {
            let _ = writeln!(out, "  ↳ warning: {w}");
        }
    }
}

/// `berth get backends`: every backend of every served route with what its flows
/// carried, then (when a BackendHealthPolicy checks some) each endpoint checked.
pub fn backend_table(view: &crate::admin::backends::BackendsView) -> String {
    let mut out = format!(
        "{:<16} {:<24} {:<26} {:<24} {:<6} {:<13} {:<10} {:>6} {:>8} {:>10} {:>12} {:>10} {:>12}\n",
        "NAMESPACE",
        "ROUTE",
        "SERVICE",
        "ENDPOINT",
        "WEIGHT",
        "STATE",
        "HEALTH",
        "ACTIVE",
        "FLOWS",
        "INPKTS",
        "INBYTES",
        "OUTPKTS",
        "OUTBYTES"
    );
    for r in &view.backends {
        let _ = writeln!(
            out,
            "{:<16} {:<24} {:<26} {:<24} {:<6} {:<13} {:<10} {:>6} {:>8} {:>10} {:>12} {:>10} {:>12}",
            r.namespace,
            r.route,
            r.service,
            r.endpoint,
            r.weight,
            r.state,
            r.health,
            r.active_flows,
            r.new_flows,
            r.packets,
            r.bytes,
            r.reply_packets,
            r.reply_bytes
        );
    }
    if !view.checks.is_empty() {
        out.push('\n');
        out.push_str(&check_table(&view.checks));
    }
    out
}

/// The health checks' table of `backend_table`: each endpoint a BackendHealthPolicy
/// checks.
fn check_table(rows: &[crate::health::BackendRow]) -> String {
    let mut out = format!(
        "{:<16} {:<20} {:<20} {:<24} {:<30} {:<10} {}\n",
        "NAMESPACE", "SERVICE", "POLICY", "ENDPOINT", "HEALTH", "LATENCY", "LAST CHECK"
    );
    for r in rows {
        let latency = r
            .latency_ms
            .map(|ms| format!("{ms:.1}ms"))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{:<16} {:<20} {:<20} {:<24} {:<30} {:<10} {}{}",
            r.namespace,
            r.service,
            r.policy,
            r.endpoint,
            r.health,
            latency,
            r.last_check.as_deref().unwrap_or("-"),
            if r.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", r.detail)
            }
        );
    }
    out
}

/// `berth get listeners`: each range listener's ports, bound, cooling down and free.
pub fn listener_table(usage: &[crate::planner::ListenerUsage]) -> String {
    let mut out = format!(
        "{:<16} {:<24} {:<16} {:<13} {:>6} {:>6} {:>8} {:>6} {:>5}\n",
        "NAMESPACE", "GATEWAY", "LISTENER", "RANGE", "SIZE", "USED", "COOLING", "FREE", "USE%"
    );
    for u in usage {
        let last = u32::from(u.first) + u.size.saturating_sub(1);
        let _ = writeln!(
            out,
            "{:<16} {:<24} {:<16} {:<13} {:>6} {:>6} {:>8} {:>6} {:>5}",
            u.namespace,
            u.gateway,
            u.listener,
            format!("{}-{last}", u.first),
            u.size,
            u.bound,
            u.cooling,
            u.size.saturating_sub(u.bound + u.cooling),
            u.percent()
        );
    }
    out
}

/// The end of `berth get routes`' table: the kernel's path of each gateway address whose
/// routes the kernel forwards, once (rows whose reason is their address's say no more).
pub fn route_table_foot(
    paths: &std::collections::BTreeMap<(std::net::IpAddr, crate::datapath::Protocol), String>,
) -> String {
    let mut out = String::new();
    for ((addr, protocol), path) in paths {
        if let Some(why) = path.strip_prefix("kernel: ") {
            let _ = writeln!(
                out,
                "{addr} {protocol}: forwarded by the kernel: {why} (its routes' rows say PATH kernel; berth get addresses)"
            );
        }
    }
    out
}

/// A path (`xdp`, `kernel: WHY`, `-`) as its column shows it: the reason goes below.
fn path_column(path: &str) -> &str {
    if path.starts_with("kernel") {
        "kernel"
    } else {
        path
    }
}

/// `berth get addresses`: the routes' traffic per gateway address and protocol, with
/// the kernel's path and unanswered routes said once per address.
pub fn address_table(rows: &[crate::admin::addresses::AddressRow]) -> String {
    let mut out = format!(
        "{:<40} {:<8} {:>6} {:>12} {:>14} {:>8} {:>12} PATH\n",
        "ADDRESS", "PROTOCOL", "ROUTES", "PACKETS", "BYTES", "ACTIVE", "KERNEL PKTS"
    );
    for r in rows {
        let path = path_column(&r.path);
        let _ = writeln!(
            out,
            "{:<40} {:<8} {:>6} {:>12} {:>14} {:>8} {:>12} {path}",
            r.address, r.protocol, r.routes, r.packets, r.bytes, r.active_flows, r.kernel_packets
        );
        if let Some(why) = r.path.strip_prefix("kernel: ") {
            let _ = writeln!(out, "  ↳ forwarded by the kernel: {why}");
        }
        if r.unanswered_routes > 0 {
            let _ = writeln!(
                out,
                "  ↳ warning: {} route(s) forwarding without replies (berth get routes names them)",
                r.unanswered_routes
            );
        }
    }
    out
}

/// For the commands that print (not `berth run`): a reader that closes the pipe early
/// (`berth check -o json | head`) ends the command quietly, as it ends `cat`, instead
/// of a panic on the failed write.
pub fn end_quietly_on_a_closed_pipe() {
    crate::sys::signal::default_sigpipe();
}

/// `berth get node`: whether this node announces its addresses, where, since when, and
/// the flows it carries that began on another node of its tier.
pub fn node_table(node: &crate::admin::NodeView) -> String {
    let mut out = String::new();
    let (state, since, published, places) = match &node.announce {
        Some(a) => {
            let list: Vec<String> = a.addresses.iter().map(ToString::to_string).collect();
            let published = if list.is_empty() {
                "-".to_string()
            } else {
                list.join(",")
            };
            (
                a.state.name().to_uppercase(),
                a.since.clone(),
                published,
                a.places(),
            )
        }
        None => ("UNDECIDED".into(), "-".into(), "-".into(), "-".into()),
    };
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "{:<20} {:<21} {:<32} {:<20} {:>14} {:>12} {:>17} {:>15}",
        "STATE",
        "SINCE",
        "PUBLISHED",
        "WHERE",
        "MIDFLOW-MISSES",
        "REPLY-MISSES",
        "REPLIES-UNMATCHED",
        "REPLIES-SPOOFED"
    );
    let _ = writeln!(
        out,
        "{:<20} {:<21} {:<32} {:<20} {:>14} {:>12} {:>17} {:>15}",
        state,
        since,
        published,
        places,
        node.midflow_misses,
        node.reply_misses,
        node.replies_unmatched,
        node.replies_spoofed
    );
    out
}

/// `berth get claims`: one row per claim, bound or cooling down after its release
/// (STATE `Released`, with the time it was released: the port is free after the
/// listener's cool-down).
pub fn claim_table(claims: &crate::model::ClaimList) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "{:<16} {:<24} {:<16} {:<12} {:<5} {:<6} {:<9} ROUTE",
        "NAMESPACE", "NAME", "GATEWAY", "LISTENER", "PROTO", "PORT", "STATE"
    );
    for c in claims {
        let c = ClaimView::of(c);
        let state = match c.phase {
            crate::model::ClaimPhase::Bound => "Bound",
            crate::model::ClaimPhase::Released => "Released",
        };
        let _ = write!(
            out,
            "{:<16} {:<24} {:<16} {:<12} {:<5} {:<6} {:<9} {} {}/{}",
            c.namespace,
            c.name,
            c.gateway,
            c.listener,
            c.protocol,
            c.port,
            state,
            c.route.kind,
            c.route.namespace,
            c.route.name
        );
        if let Some(at) = c.released_at {
            let _ = write!(out, " (released {at}, cooling down)");
        }
        let _ = writeln!(out);
    }
    out
}

/// How long ago an RFC 3339 time was, kubectl-style (`-` if unknown).
fn age(created: Option<&str>) -> String {
    let Some(t) = created.and_then(|c| humantime::parse_rfc3339_weak(c).ok()) else {
        return "-".into();
    };
    let secs = SystemTime::now()
        .duration_since(t)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// What `berth drain` or `berth undrain` did, from the announce status before the
/// request and once it was applied: the addresses withdrawn or announced, and where.
pub fn drain_result(request: Request, before: &Status, after: &Status, now: SystemTime) -> String {
    let changed = |from: &Status, to: &Status| -> Vec<String> {
        from.addresses
            .iter()
            .filter(|a| !to.addresses.contains(a))
            .map(ToString::to_string)
            .collect()
    };
    let places = after.places();
    match request {
        Request::Drain => {
            let withdrawn = changed(before, after);
            let what = if !withdrawn.is_empty() {
                format!("withdrew {} ({places})", withdrawn.join(", "))
            } else if !before.state.announcing() {
                format!("nothing more to withdraw ({})", before.summary(now))
            } else {
                "nothing was published yet".to_string()
            };
            format!(
                "drained: {what}; the datapath keeps serving flows that still arrive \
                 (drained after --drain-timeout {})",
                after.drain_timeout
            )
        }
        Request::Undrain if !after.state.announcing() => format!(
            "undrained, but the addresses stay withdrawn: {}",
            after.summary(now)
        ),
        Request::Undrain => {
            let announced = changed(after, before);
            if announced.is_empty() && after.addresses.is_empty() {
                "undrained: announcing (no gateway address is served yet)".to_string()
            } else if announced.is_empty() {
                "undrained: nothing to announce, the addresses were published already".to_string()
            } else {
                format!("undrained: announced {} ({places})", announced.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests;
