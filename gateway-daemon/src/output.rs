//! What the `berth` CLI prints as tables (kubectl-style): `berth check` and
//! `berth get gateways|routes|claims`. Each printer returns the text, newline-ended.

use std::{fmt::Write as _, sync::Arc, time::SystemTime};

use crate::{
    admin::RouteRow,
    state_document::{ClaimEntry, StateDocument},
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
                r.kind,
                p.parent_ref.name,
                port,
                accepted.map_or("Unknown", |c| &*c.status),
                accepted.map_or("", |c| &*c.reason)
            ));
        }
    }
    out
}

/// `berth get routes`: one row per route with its traffic, and below a row the reason
/// its packets take the kernel's way and any warning.
pub fn route_table(rows: &[RouteRow]) -> String {
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
    for r in rows {
        let port = r.port.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
        let path = if r.path.starts_with("kernel") {
            "kernel"
        } else {
            r.path.as_str()
        };
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
        // The slow way and its reason, and anything to look at, below the row.
        if let Some(why) = r.path.strip_prefix("kernel: ") {
            let _ = writeln!(out, "  ↳ forwarded by the kernel: {why}");
        }
        if let Some(w) = &r.warning {
            let _ = writeln!(out, "  ↳ warning: {w}");
        }
    }
    out
}

/// `berth get claims`: one row per claim held.
pub fn claim_table(claims: &[Arc<ClaimEntry>]) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "{:<16} {:<24} {:<16} {:<12} {:<5} {:<6} ROUTE",
        "NAMESPACE", "NAME", "GATEWAY", "LISTENER", "PROTO", "PORT"
    );
    for c in claims {
        let _ = writeln!(
            out,
            "{:<16} {:<24} {:<16} {:<12} {:<5} {:<6} {} {}/{}",
            c.namespace,
            c.name,
            c.gateway,
            c.listener,
            c.protocol,
            c.port,
            c.route.kind,
            c.route.namespace,
            c.route.name
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        planner::{status::*, GatewayEntry},
        state_document::StateDocument,
    };

    #[test]
    fn the_gateways_table_shows_ipv4_and_ipv6_addresses_as_written_in_the_status() {
        let address = |value: &str| GatewayStatusAddress {
            kind: "IPAddress".into(),
            value: value.into(),
        };
        let gateway = |name: &str, addresses| GatewayEntry {
            namespace: "infra".into(),
            name: name.into(),
            status: GatewayStatus {
                addresses,
                conditions: Vec::new(),
                listeners: Vec::new(),
            },
        };
        let doc = StateDocument {
            gateways: vec![
                gateway("dual", vec![address("10.0.0.1"), address("2001:db8::1")]),
                gateway("none", vec![]),
            ],
            routes: Vec::new(),
            claims: Vec::new(),
        };
        let table = state_tables(&doc);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains(" ADDRESSES "), "{table}");
        assert!(lines[1].contains(" 10.0.0.1,2001:db8::1 "), "{table}");
        assert!(lines[2].contains(" - "), "{table}");
    }
}
