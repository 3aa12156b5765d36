//! `berth`: one L4 gateway address shared by many owners, one port each.

#![deny(unsafe_code)]

use std::process::ExitCode;

use berth::announce::control::Request;
use clap::Parser as _;

mod cli;
mod commands;
mod run;

use cli::{Cli, Command, MonitorOutput};
use commands::{check_cmd, drain_cmd, get_cmd, state_cmd, uninstall};

/// The planner allocates many small strings per route; mimalloc makes a plan of 10k
/// routes markedly faster than glibc's allocator does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("berth: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Does what the command line asks.
fn run(cli: Cli) -> anyhow::Result<()> {
    if !matches!(cli.command, Command::Run(_)) {
        berth::output::end_quietly_on_a_closed_pipe();
    }
    match cli.command {
        Command::Check {
            manifests: dir,
            state_dir,
            output,
            room,
        } => check_cmd(&dir, state_dir, output, room),
        Command::Get {
            what,
            admin_addr,
            output,
        } => get_cmd(what, &admin_addr, output),
        Command::Uninstall {
            pin_dir,
            address_interface,
        } => uninstall(&pin_dir, &address_interface),
        Command::State { action, state_dir } => state_cmd(action, &state_dir),
        Command::Drain { admin_addr } => drain_cmd(&admin_addr, Request::Drain),
        Command::Undrain { admin_addr } => drain_cmd(&admin_addr, Request::Undrain),
        Command::Run(args) => run::run(*args),
        Command::Monitor(args) => berth::monitor::run(&berth::monitor::Options {
            pin_dir: args.pin_dir,
            admin_addr: args.admin_addr,
            reasons: args.reasons,
            routes: args.routes,
            addresses: args.addresses,
            ports: args.ports,
            sample: args.sample,
            rate: args.rate,
            json: matches!(args.output, MonitorOutput::Json),
            pcap: args.pcap,
            count: args.count,
            duration: args.duration,
        }),
    }
}
