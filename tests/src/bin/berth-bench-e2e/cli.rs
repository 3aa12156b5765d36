//! The command line: loads, topologies, modes; the rows it asks for.

use super::*;

const USAGE: &str =
    "usage: berth-bench-e2e [--load xdp-live-frames|af-packet|sendmmsg] [--flows long|new|both]
                       [--backends xdp|veth|bridge|all] [--family 4|6|both]
                       [--profile DIR] [MODE...]
  --load: the kernel's XDP live-frame generator (default), the same frames from an
           AF_PACKET socket (where the kernel refuses live frames), or UDP sockets
  --flows: 16 long flows, a new 5-tuple every packet, or both (default; long only
           with --load sendmmsg, whose sockets have fixed ports)
  --family: the load over IPv4 (default), IPv6 (to fd00:251::100, rows labelled
           MODE@TOPOLOGY/v6) or both, each its own rows, with IPv6 against IPv4 per
           mode; IPv6 needs the frame generator and runs no SNAT mode (berth-snat,
           iptables-masq) and no ipvs
  --backends: how the backends are attached (default all, each its own rows):
           xdp    veths with an XDP sink on the backends' ends (they take XDP frames)
           veth   veths as the kernel makes them (no GRO, no XDP), as pods' (TC sink)
           bridge the same as ports of bridge cni0, as behind a CNI bridge (TC sink)
           (veth and bridge run routing, berth-xdp, berth-kernel, iptables-nft only)
  --profile: after each row's first measurement, sample the gateway's CPU with perf
           (cpu-clock, call graphs) into DIR/ROW.data and DIR/ROW.txt, and print the
           top symbols
  MODE: routing berth-xdp berth-kernel iptables-legacy iptables-nft ipvs nftables
        berth-snat iptables-masq (default: all)";

/// The value after `flag` in `args`, both taken out; `None` if `flag` is absent.
fn take_option(args: &mut Vec<String>, flag: &str) -> Option<String> {
    let i = args.iter().position(|a| a == flag)?;
    let Some(value) = args.get(i + 1).cloned() else {
        usage_error(&format!("{flag} needs a value"));
    };
    args.drain(i..i + 2);
    Some(value)
}

fn usage_error(what: &str) -> ! {
    eprintln!("{what}\n{USAGE}");
    std::process::exit(2);
}

/// What the command line asks for.
pub(super) struct Args {
    pub(super) load: Load,
    pub(super) flows: &'static [FlowLoad],
    pub(super) topologies: Vec<Backends>,
    pub(super) families: &'static [Family],
    /// The modes named (none: all).
    pub(super) modes: Vec<String>,
    /// Where to keep the rows' profiles (`--profile`), if anywhere.
    pub(super) profile: Option<std::path::PathBuf>,
}

pub(super) fn parse_args(mut args: Vec<String>) -> Args {
    let load = match take_option(&mut args, "--load").as_deref() {
        None | Some("xdp-live-frames") => Load::Frames,
        Some("sendmmsg") => Load::Sendmmsg,
        Some("af-packet") => Load::PacketSocket,
        Some(other) => usage_error(&format!("--load: unknown load {other}")),
    };
    let flows: &[FlowLoad] = match take_option(&mut args, "--flows").as_deref() {
        None if load == Load::Sendmmsg => &[FlowLoad::Long],
        None | Some("both") => &[FlowLoad::Long, FlowLoad::New],
        Some("long") => &[FlowLoad::Long],
        Some("new") => &[FlowLoad::New],
        Some(other) => usage_error(&format!("--flows: unknown value {other}")),
    };
    if load == Load::Sendmmsg && flows.contains(&FlowLoad::New) {
        usage_error(
            "--flows new needs the frame generator's frames (--load xdp-live-frames or af-packet)",
        );
    }
    let topologies = match take_option(&mut args, "--backends").as_deref() {
        None | Some("all") => TOPOLOGIES.to_vec(),
        Some(name) => match TOPOLOGIES.iter().find(|b| b.name() == name) {
            Some(&b) => vec![b],
            None => usage_error(&format!("--backends: unknown topology {name}")),
        },
    };
    let families: &[Family] = match take_option(&mut args, "--family").as_deref() {
        None | Some("4") => &[Family::V4],
        Some("6") => &[Family::V6],
        Some("both") => &[Family::V4, Family::V6],
        Some(other) => usage_error(&format!("--family: unknown value {other}")),
    };
    if load == Load::Sendmmsg && families.contains(&Family::V6) {
        usage_error(
            "--family 6 needs the frame generator's frames (--load xdp-live-frames or af-packet)",
        );
    }
    let profile = take_option(&mut args, "--profile").map(std::path::PathBuf::from);
    if let Some(dir) = &profile {
        if let Err(e) = std::fs::create_dir_all(dir) {
            usage_error(&format!("--profile: creating {}: {e}", dir.display()));
        }
    }
    if let Some(bad) = args.iter().find(|a| MODES.iter().all(|m| m.name() != *a)) {
        usage_error(&format!("unknown mode {bad}"));
    }
    Args {
        load,
        flows,
        topologies,
        families,
        modes: args,
        profile,
    }
}

/// The rows to measure: per topology, per load, per family (IPv4's and IPv6's rows
/// of a load side by side), the modes asked for that run there.
pub(super) fn sections(args: &Args) -> Vec<Section> {
    let mut sections = Vec::new();
    for &backends in &args.topologies {
        for &flows in args.flows {
            for &family in args.families {
                let rows: Vec<Row> = MODES
                    .iter()
                    .filter(|m| args.modes.is_empty() || args.modes.iter().any(|a| a == m.name()))
                    .filter(|&&m| backends.runs(m) && family.runs(m))
                    .map(|&mode| Row {
                        mode,
                        backends,
                        family,
                        unavailable: mode.unavailable(family),
                        runs: Vec::new(),
                    })
                    .collect();
                if !rows.is_empty() {
                    sections.push(Section {
                        backends,
                        flows,
                        family,
                        rows,
                    });
                }
            }
        }
    }
    if sections.is_empty() {
        usage_error("none of these modes runs on these topologies");
    }
    sections
}
