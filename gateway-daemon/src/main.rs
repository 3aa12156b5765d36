//! `berth`: one L4 gateway address shared by many owners, one port each.

use std::{path::PathBuf, process::ExitCode, time::SystemTime};

use anyhow::{bail, Context as _};
use berth::{check, manifests, planner};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "berth",
    version,
    about = "Share one L4 gateway address: one port per route"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Plan from manifests, with no kernel and no network: print claims and statuses.
    Check {
        /// Directory of YAML manifests.
        #[arg(long)]
        manifests: PathBuf,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
    Yaml,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("berth: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check {
            manifests: dir,
            output,
        } => {
            let files = manifests::load_dir(&dir)
                .with_context(|| format!("reading manifests from {}", dir.display()))?;
            let mut failed = false;
            for (_, f) in &files {
                for note in &f.ignored {
                    eprintln!("note: {note}");
                }
                for e in &f.errors {
                    eprintln!("error: {e}");
                    failed = true;
                }
            }
            if failed {
                bail!("some manifests could not be read (see above)");
            }
            let snapshot = manifests::snapshot(files.iter().map(|(_, f)| f));
            let plan = planner::plan(&planner::Input {
                snapshot: &snapshot,
                claims: &[],
                now: SystemTime::now(),
            });
            let doc = check::document(&plan);
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&doc)?),
                Output::Yaml => print!("{}", serde_yaml::to_string(&doc)?),
                Output::Table => print!("{}", check::tables(&doc)),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
