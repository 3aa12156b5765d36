//! `berth state check|repair`: lists, or moves aside, the records of a state
//! directory that cannot be read or that loading ignores.
//!
//! Part of the `berth` binary (declared in `main.rs`), not of the library.

use std::path::Path;

use anyhow::{bail, Context as _};
use berth::store::Store;

use crate::cli::StateAction;

/// `berth state check|repair`.
pub(crate) fn state_cmd(action: StateAction, dir: &Path) -> anyhow::Result<()> {
    let store =
        Store::open(dir).with_context(|| format!("opening state directory {}", dir.display()))?;
    match action {
        StateAction::Check => {
            let bad = store.check()?;
            for b in &bad {
                println!("{b}: {:?}", b.text);
            }
            if !bad.is_empty() {
                bail!(
                    "{} records of {} cannot be read or are ignored: `berth state repair --state-dir {}` moves them aside",
                    bad.len(),
                    dir.display(),
                    dir.display()
                );
            }
            println!("{}: every record reads", dir.display());
        }
        StateAction::Repair => {
            let moved = store.repair()?;
            for b in &moved {
                println!("moved aside: {b}: {:?}", b.text);
            }
            println!(
                "{}: {} records moved aside (into FILE.bad-TIME beside each file); every valid claim kept",
                dir.display(),
                moved.len()
            );
        }
    }
    Ok(())
}
