//! `berth check`: plans from manifests, with no kernel and no network, and prints the
//! claims and statuses.
//!
//! Part of the `berth` binary (declared in `main.rs`), not of the library.

use std::{
    path::{Path, PathBuf},
    time::SystemTime,
};

use anyhow::{bail, Context as _};
use berth::{
    manifests, planner,
    state_document::{self, StateDocument},
    store::Store,
};

use crate::cli::{Output, Room};

pub(crate) fn check_cmd(
    dir: &Path,
    state_dir: Option<PathBuf>,
    output: Output,
    room: Room,
) -> anyhow::Result<()> {
    let files = manifests::load_dir(dir)
        .with_context(|| format!("reading manifests from {}", dir.display()))?;
    let mut failed = false;
    for (_, f) in &files {
        for note in &f.ignored {
            eprintln!("note: {note}");
        }
        for w in &f.warnings {
            eprintln!("warning: {w}");
        }
        for e in &f.errors {
            eprintln!("error: {e}");
            failed = true;
        }
    }
    if failed {
        bail!("some manifests could not be read (see above)");
    }
    // The first-seen times are read too, though the plan does not use them here: a
    // state `berth run` would refuse to plan on is refused here as well (a bad
    // first-seen record used to stop `run` while `check` planned over it).
    let claims = match &state_dir {
        Some(s) => Store::open(s)
            .and_then(|store| store.first_seen().and_then(|_| store.claims_shared()))
            .with_context(|| format!("reading the state in {}", s.display()))?,
        None => Default::default(),
    };
    let snapshot = manifests::snapshot(files.iter().map(|(_, f)| f));
    let plan = planner::plan(&planner::Input {
        snapshot: &snapshot,
        claims: &claims,
        now: SystemTime::now(),
        default_addresses: planner::DefaultAddresses::default(),
        ephemeral_ports: None,
        snat_ports: planner::DEFAULT_SNAT_PORTS,
        capacity: room.capacity(),
        allocate: true,
    });
    for why in &plan.released {
        eprintln!("warning: {why}");
    }
    let mut plan = plan;
    // No checks run here: BackendHealthPolicies say whether they are accepted only.
    let now = berth::model::Time::at(SystemTime::now());
    let health = berth::health::status::entries(&snapshot, None, &now);
    planner::traffic::add_policies(&mut plan, health);
    print_document(&state_document::document(&plan), output)
}

fn print_document(doc: &StateDocument, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(doc)?),
        Output::Yaml => print!("{}", serde_yaml::to_string(doc)?),
        Output::Table => print!("{}", berth::output::state_tables(doc)),
    }
    Ok(())
}
