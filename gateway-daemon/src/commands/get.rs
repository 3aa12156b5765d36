//! `berth get`: shows what a running daemon holds, asked of its admin endpoint.
//!
//! Part of the `berth` binary (declared in `main.rs`), not of the library.

use std::time::SystemTime;

use anyhow::{bail, Context as _};
use berth::{
    admin::{self, RouteRow},
    state_document::StateDocument,
};

use super::drain::announce_status;
use crate::cli::{Output, What};

pub(crate) fn get_cmd(what: What, addr: &str, output: Output) -> anyhow::Result<()> {
    wait_for_first_plan(addr)?;
    if let Output::Table = output {
        // A daemon of an older version has no /api/v1/announce: no banner then.
        if let Some(banner) = announce_status(addr)
            .ok()
            .and_then(|s| s.banner(SystemTime::now()))
        {
            println!("{banner}");
        }
    }
    // Each asks for what it shows only: `berth get routes` once fetched the whole
    // state document first (every route, claim and gateway, pretty-printed: far
    // larger than the routes at 100k routes, and within the same 5 s).
    let state = || -> anyhow::Result<StateDocument> {
        let text = admin::get(addr, "/api/v1/state")
            .with_context(|| format!("asking the daemon at {addr}"))?;
        Ok(serde_json::from_str(&text)?)
    };
    match (what, output) {
        // The table as the daemon prints it (a daemon from before it did: the rows,
        // printed here).
        (What::Routes, Output::Table) => match admin::get(addr, "/api/v1/tables/routes") {
            Ok(table) => print!("{table}"),
            Err(e) if e.code() == Some(404) => {
                let rows: Vec<RouteRow> =
                    serde_json::from_str(&admin::get(addr, "/api/v1/routes")?)?;
                print!("{}", berth::output::route_table(&rows));
            }
            Err(e) => return Err(e.into()),
        },
        (What::Routes, _) => {
            let rows: Vec<RouteRow> = serde_json::from_str(&admin::get(addr, "/api/v1/routes")?)?;
            print_value(&rows, output)?;
        }
        (What::Claims, Output::Table) => print!("{}", berth::output::claim_table(&state()?.claims)),
        (What::Claims, _) => print_value(&state()?.claims, output)?,
        (What::Gateways, Output::Table) => print!(
            "{}",
            berth::output::state_tables(&StateDocument {
                routes: Default::default(),
                claims: Default::default(),
                ..state()?
            })
        ),
        (What::Gateways, _) => print_value(&state()?.gateways, output)?,
        (What::Backends, _) => {
            let view: admin::backends::BackendsView =
                serde_json::from_str(&admin::get(addr, "/api/v1/backends")?)?;
            match output {
                Output::Table => print!("{}", berth::output::backend_table(&view)),
                _ => print_value(&view, output)?,
            }
        }
        (What::Listeners, _) => {
            let usage: Vec<berth::planner::ListenerUsage> =
                serde_json::from_str(&admin::get(addr, "/api/v1/listeners")?)?;
            match output {
                Output::Table => print!("{}", berth::output::listener_table(&usage)),
                _ => print_value(&usage, output)?,
            }
        }
        (What::Addresses, _) => {
            let rows: Vec<admin::addresses::AddressRow> =
                serde_json::from_str(&admin::get(addr, "/api/v1/addresses")?)?;
            match output {
                Output::Table => print!("{}", berth::output::address_table(&rows)),
                _ => print_value(&rows, output)?,
            }
        }
        (What::Node, _) => {
            let node: admin::NodeView = serde_json::from_str(&admin::get(addr, "/api/v1/node")?)?;
            match output {
                Output::Table => print!("{}", berth::output::node_table(&node)),
                _ => print_value(&node, output)?,
            }
        }
    }
    Ok(())
}

/// Waits (up to 10 s) while a daemon that just started has made no plan yet; fails
/// if there is no daemon at `addr`. A daemon not ready for another reason (a failed
/// cycle, drained) is asked all the same: what it holds is what `berth get` shows.
fn wait_for_first_plan(addr: &str) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match admin::get(addr, "/readyz") {
            Err(e)
                if e.code() == Some(503) && e.body().is_some_and(|b| b.contains("no plan yet")) =>
            {
                if std::time::Instant::now() >= deadline {
                    bail!("the daemon at {addr} has made no plan yet after 10 s (see its log, or /readyz)");
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            // 503 for another reason: the daemon answers.
            Err(e) if e.code() == Some(503) => return Ok(()),
            other => {
                other.with_context(|| format!("asking the daemon at {addr}"))?;
                return Ok(());
            }
        }
    }
}

fn print_value<T: serde::Serialize>(v: &T, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Yaml => print!("{}", serde_yaml::to_string(v)?),
        _ => println!("{}", serde_json::to_string_pretty(v)?),
    }
    Ok(())
}
