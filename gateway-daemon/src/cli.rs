//! The `berth` command line: its subcommands, their options and how those parse.
//! What each subcommand does lives in `run` (`berth run`) and `commands` (the others).
//!
//! Part of the `berth` binary (declared in `main.rs`), not of the library.

use std::{net::IpAddr, path::PathBuf};

use berth::datapath;
use clap::{Args, Parser, Subcommand, ValueEnum};

const DEFAULT_ADMIN: &str = "127.0.0.1:9470";

#[derive(Parser)]
#[command(
    name = "berth",
    version,
    about = "Share one L4 gateway address: one port per route"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run the daemon: watch the manifests, allocate ports, program the datapath.
    Run(Box<RunArgs>),
    /// Inspect or repair a state directory: `check` lists records that cannot be read
    /// or that loading ignores (a port held twice) (exit 1 if any), `repair` moves them aside into FILE.bad-TIME and keeps every
    /// valid claim (refused while `berth run` uses the directory).
    State {
        /// What to do.
        #[arg(value_enum)]
        action: StateAction,
        /// The state directory.
        #[arg(long, default_value = "/var/lib/berth")]
        state_dir: PathBuf,
    },
    /// Remove Berth from this host: detach its programs from every interface, remove
    /// its pinned maps and links and its dummy interface (stop `berth run` first;
    /// established flows are lost). Claims in the state directory are kept.
    Uninstall {
        /// Where the datapath's maps and links are pinned.
        #[arg(long, default_value = datapath::DEFAULT_PIN_DIR)]
        pin_dir: PathBuf,
        /// The dummy interface that holds the gateway addresses.
        #[arg(long, default_value = DEFAULT_ADDRESS_INTERFACE)]
        address_interface: String,
    },
    /// Plan from manifests, with no kernel and no network: print claims and statuses.
    Check {
        /// Directory of YAML manifests.
        #[arg(long)]
        manifests: PathBuf,
        /// Also read the claims kept in this state directory.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Room in the datapath planned for, as `berth run` is given it.
        #[command(flatten)]
        room: Room,
    },
    /// Withdraw this node's gateway addresses (address interface, --announce-table)
    /// so that the routers send it no new traffic; the datapath keeps serving every
    /// flow that still arrives. Kept across restarts until `berth undrain`.
    Drain {
        /// The daemon's admin endpoint.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_addr: String,
    },
    /// Announce this node's gateway addresses again after `berth drain`.
    Undrain {
        /// The daemon's admin endpoint.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_addr: String,
    },
    /// Show the datapath's events live: packets dropped, handed to the kernel, or
    /// carried otherwise than a tracked flow's (mid-flow misses, ICMP errors, floods),
    /// with their headers as they entered and left; sampled and limited in the kernel.
    Monitor(Box<MonitorArgs>),
    /// Show what a running daemon holds.
    Get {
        /// What to show.
        #[arg(value_enum)]
        what: What,
        /// The daemon's admin endpoint.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_addr: String,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

/// The options of `berth monitor`.
#[derive(Args)]
pub(crate) struct MonitorArgs {
    /// Only events of this reason (a counter's name, as on /metrics); repeatable.
    #[arg(long = "reason", value_parser = berth::monitor::reason)]
    pub(crate) reasons: Vec<gateway_common::Counter>,
    /// Only packets of this route (NAMESPACE/NAME; its ports and endpoints, asked of
    /// the daemon); repeatable.
    #[arg(long = "route")]
    pub(crate) routes: Vec<String>,
    /// Only packets from or to this address; repeatable.
    #[arg(long = "address")]
    pub(crate) addresses: Vec<IpAddr>,
    /// Only packets from or to this port; repeatable.
    #[arg(long = "port")]
    pub(crate) ports: Vec<u16>,
    /// Send one event in N (per CPU).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) sample: u32,
    /// Send at most N events a second per CPU; the rest are counted as monitor_lost.
    #[arg(long, default_value_t = 1000)]
    pub(crate) rate: u32,
    /// Output format of the lines.
    #[arg(short, long, value_enum, default_value_t = MonitorOutput::Text)]
    pub(crate) output: MonitorOutput,
    /// Also write the packets (their first 128 bytes, as they entered and, if
    /// rewritten, as they left) to this pcap file; `-`: to standard output instead of
    /// the lines (`berth monitor --pcap - | tshark -r -`).
    #[arg(long)]
    pub(crate) pcap: Option<PathBuf>,
    /// End after N events.
    #[arg(long)]
    pub(crate) count: Option<u64>,
    /// End after this long (`30s`, `5m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) duration: Option<std::time::Duration>,
    /// Where the datapath's maps are pinned.
    #[arg(long, default_value = datapath::DEFAULT_PIN_DIR)]
    pub(crate) pin_dir: PathBuf,
    /// The daemon's admin endpoint (for --route).
    #[arg(long, default_value = DEFAULT_ADMIN)]
    pub(crate) admin_addr: String,
}

/// `berth monitor`'s line format.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum MonitorOutput {
    /// A line of text an event.
    Text,
    /// A JSON object a line.
    Json,
}

/// The options of `berth run`.
#[derive(Args)]
pub(crate) struct RunArgs {
    /// Directory of YAML manifests (standalone mode).
    #[arg(long, conflicts_with = "kubernetes")]
    pub(crate) manifests: Option<PathBuf>,
    /// How long a manifest file must stay gone before its objects are removed (so
    /// that replacing a file, by `rm` then write or by an editor, causes no outage).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub(crate) manifest_settle: std::time::Duration,
    /// Read objects from the Kubernetes API.
    #[arg(long)]
    pub(crate) kubernetes: bool,
    /// Interfaces to attach the XDP program to (none: plan and serve state only).
    #[arg(long = "interface")]
    pub(crate) interfaces: Vec<String>,
    /// Where claims and first-seen times are kept.
    #[arg(long, default_value = "/var/lib/berth")]
    pub(crate) state_dir: PathBuf,
    /// Gateway address (IPv4 or IPv6) for Gateways whose spec.addresses has no
    /// address Berth serves; give it once per family for dual-stack defaults.
    #[arg(long = "address")]
    pub(crate) addresses: Vec<IpAddr>,
    /// Admin endpoint: /healthz, /readyz, /metrics and the state API
    /// (/api/v1/state, /api/v1/routes); keep it on localhost.
    #[arg(long, default_value = DEFAULT_ADMIN)]
    pub(crate) admin_addr: String,
    /// Also serve /healthz, /readyz and /metrics alone on this address (for probes
    /// and Prometheus from off the host, e.g. 0.0.0.0:9471).
    #[arg(long)]
    pub(crate) metrics_addr: Option<String>,
    /// Also give /metrics a series per route (berth_route_*) besides the sums per
    /// gateway address (berth_address_*): ~1 KiB per route a scrape, ~100 MiB at 100k
    /// routes.
    #[arg(long)]
    pub(crate) metrics_per_route: bool,
    /// XDP attach mode.
    #[arg(long, value_enum, default_value_t = XdpMode::Auto)]
    pub(crate) xdp_mode: XdpMode,
    /// This node's name (Kubernetes mode: identity in the allocator election and events).
    #[arg(long, env = "NODE_NAME")]
    pub(crate) node_name: Option<String>,
    /// Namespace of the allocator election's Lease (Kubernetes mode).
    #[arg(long, env = "POD_NAMESPACE", default_value = "berth-system")]
    pub(crate) lease_namespace: String,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Where the datapath's maps and links are pinned.
    #[arg(long, default_value = datapath::DEFAULT_PIN_DIR)]
    pub(crate) pin_dir: PathBuf,
    /// Dummy interface the daemon owns that holds the programmed gateway addresses,
    /// so the host answers ARP for them (default in standalone mode: berth0; in
    /// Kubernetes mode none unless given: announce addresses with MetalLB or BGP).
    #[arg(long, conflicts_with = "no_address_interface")]
    pub(crate) address_interface: Option<String>,
    /// Put the gateway addresses on no interface (clients then need a route to
    /// them via this host).
    #[arg(long)]
    pub(crate) no_address_interface: bool,
    /// Whether XDP sends packets itself (auto: into interfaces that take XDP
    /// frames, and through the hand-off program on TC ingress into other Ethernet
    /// interfaces) or hands every one to the kernel (never: for troubleshooting, and
    /// to measure the kernel path).
    #[arg(long, value_enum, default_value_t = Redirect::Auto)]
    pub(crate) redirect: Redirect,
    /// Source ports for SNAT mode (GatewayConfig sourceNAT: true), as LO-HI; every
    /// Gateway listener's ports are taken out. Keep it clear of the host's own
    /// ephemeral ports when the host opens many connections itself.
    #[arg(long, default_value = "32768-60999", value_parser = parse_port_range)]
    pub(crate) snat_ports: std::ops::RangeInclusive<u16>,
    /// Entries of the conntrack (a flow takes one, two in SNAT mode; 152 bytes of
    /// kernel memory each). A full table evicts its least recently used flows. A
    /// restart must give the size the pinned table has (refused otherwise: remove the
    /// pinned berth_ct to resize it, and its flows are balanced again).
    #[arg(long, default_value_t = datapath::Limits::default().flows, value_parser = parse_conntrack_size)]
    pub(crate) conntrack_size: u32,
    /// Room in the datapath for services and backends.
    #[command(flatten)]
    pub(crate) room: Room,
    /// New flows per second per CPU above which new flows (and replies matched by
    /// Maglev) are balanced by Maglev alone and not recorded in the conntrack
    /// (flood_untracked), so a flood of new flows cannot evict the established ones; 0:
    /// no limit.
    #[arg(long, default_value_t = DEFAULT_NEW_FLOW_LIMIT)]
    pub(crate) new_flow_limit: u32,
    /// Where replies of a flow (and ICMP errors about packets sent to a backend) may
    /// come from: `backend`, only from the interface (and neighbour) the gateway sends
    /// that backend's packets to, else dropped as reply_spoofed (a tenant forging
    /// another's backend); `any`, from anywhere, for backends whose replies come back
    /// another way (a router spreading them over a tier of gateways).
    #[arg(long, value_enum, default_value = "backend")]
    pub(crate) reply_origin: ReplyOrigin,
    /// Also publish each served gateway address as a route ADDR/32 (/128) of protocol
    /// berth (251) in this kernel routing table, through the address interface (lo
    /// without one), for the routing daemon to import (BIRD: protocol kernel { kernel
    /// table N; learn; }, as deploy/bird/bird.conf). Not 0, 253, 254 or 255.
    #[arg(long, value_name = "N", value_parser = parse_announce_table)]
    pub(crate) announce_table: Option<u32>,
    /// How long the node may be not ready (as /readyz says: the last cycle failed, no
    /// plan yet) before its addresses are withdrawn.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) not_ready_grace: std::time::Duration,
    /// On SIGTERM, withdraw the addresses at once and keep running (serving and
    /// reconciling) for --drain-timeout, then exit; a second SIGTERM or Ctrl-C exits
    /// at once. Without it SIGTERM exits at once and leaves the addresses published
    /// (the pinned datapath serves through a restart).
    #[arg(long)]
    pub(crate) drain_on_stop: bool,
    /// How long a drain lasts: `berth drain` is draining for this long, then drained;
    /// with --drain-on-stop, the daemon exits this long after SIGTERM.
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) drain_timeout: std::time::Duration,
}

/// Parses `--announce-table`: a routing table of its own, not one the kernel reserves.
fn parse_announce_table(text: &str) -> Result<u32, String> {
    let table: u32 = text
        .trim()
        .parse()
        .map_err(|e| format!("{text:?} is not a routing table number: {e}"))?;
    let reserved = match table {
        0 => "unspec (0)",
        253 => "the default table (253)",
        254 => "the main table (254)",
        255 => "the local table (255)",
        _ => return Ok(table),
    };
    Err(format!(
        "{reserved} is the kernel's: give the routes a table of their own (e.g. 100), \
         which the routing daemon imports"
    ))
}

/// `--reply-origin`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ReplyOrigin {
    /// Only from where the gateway sends the backend's packets.
    Backend,
    /// From any interface and neighbour.
    Any,
}

/// Default of `--new-flow-limit`: Katran's default `MAX_CONN_RATE`.
const DEFAULT_NEW_FLOW_LIMIT: u32 = 125_000;

/// Parses `--conntrack-size`: 1 to `Limits::MAX_FLOWS` entries.
fn parse_conntrack_size(text: &str) -> Result<u32, String> {
    let max = datapath::Limits::MAX_FLOWS;
    match text.trim().parse::<u64>() {
        Ok(0) => Err("0 entries: the conntrack needs at least one (default 262144)".into()),
        Ok(n) if n > u64::from(max) => Err(format!(
            "{n} entries is beyond the {max} (2^26) the daemon accepts \
             (152 bytes of kernel memory each, about 10 GB at the most)"
        )),
        Ok(n) => Ok(n as u32),
        Err(e) => Err(format!("{text:?} is not a number of entries: {e}")),
    }
}

/// The datapath's room for services and backends (`berth run`; `berth check` plans
/// with the same room, so it shows the routes that would wait).
#[derive(Args, Clone, Copy, Debug)]
pub(crate) struct Room {
    /// Services (gateway address, protocol, port) the datapath holds: a route takes
    /// one per port and address it is served on. Routes are served oldest first; those
    /// beyond the limit keep their ports and wait (Programmed=False, DatapathFull). At
    /// most 1048576 (2^20). A restart must give the size the pinned maps have.
    #[arg(long, value_name = "N", default_value_t = datapath::Limits::default().services, value_parser = parse_max_services)]
    pub(crate) max_services: u32,
    /// Backends the datapath holds over all services (an endpoint serving two
    /// services counts twice). Routes beyond the limit wait as with --max-services. It
    /// also sizes the Maglev tables' pool: 128 entries (1 KiB of kernel memory) per
    /// backend, plus one largest table. A restart must give the size the pinned maps have.
    #[arg(long, value_name = "N", default_value_t = datapath::Limits::default().backends, value_parser = parse_max_backends)]
    pub(crate) max_backends: u32,
}

impl Room {
    /// The capacity the planner admits routes into.
    pub(crate) fn capacity(&self) -> datapath::Capacity {
        datapath::Capacity {
            services: self.max_services,
            backends: self.max_backends,
        }
    }
}

/// Parses `--max-services`: 1 to `Limits::MAX_SERVICES`.
fn parse_max_services(text: &str) -> Result<u32, String> {
    parse_limit(
        text,
        "services",
        datapath::Limits::default().services,
        datapath::Limits::MAX_SERVICES,
    )
}

/// Parses `--max-backends`: 1 to `Limits::MAX_BACKENDS`.
fn parse_max_backends(text: &str) -> Result<u32, String> {
    parse_limit(
        text,
        "backends",
        datapath::Limits::default().backends,
        datapath::Limits::MAX_BACKENDS,
    )
}

/// Parses a size of the datapath's maps: 1 to `max` of `what`.
fn parse_limit(text: &str, what: &str, default: u32, max: u32) -> Result<u32, String> {
    match text.trim().parse::<u64>() {
        Ok(0) => Err(format!(
            "0 {what}: the datapath needs room for at least one (default {default})"
        )),
        Ok(n) if n > u64::from(max) => Err(format!(
            "{n} {what} is beyond the {max} the datapath can address"
        )),
        Ok(n) => Ok(n as u32),
        Err(e) => Err(format!("{text:?} is not a number of {what}: {e}")),
    }
}

/// Parses `LO-HI` (1 <= LO <= HI <= 65535) for `--snat-ports`.
fn parse_port_range(text: &str) -> Result<std::ops::RangeInclusive<u16>, String> {
    let (lo, hi) = text
        .split_once('-')
        .ok_or_else(|| format!("{text:?} is not LO-HI (e.g. 32768-60999)"))?;
    let port = |p: &str| match p.trim().parse::<u16>() {
        Ok(0) => Err(format!("port 0 in {text:?}: ports start at 1")),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{p:?} in {text:?} is not a port (1-65535): {e}")),
    };
    let (lo, hi) = (port(lo)?, port(hi)?);
    if lo > hi {
        return Err(format!(
            "{text:?}: the first port {lo} is above the last {hi}"
        ));
    }
    Ok(lo..=hi)
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum What {
    Gateways,
    Routes,
    Claims,
    /// This node in a tier: announced or drained, and flows picked up from others.
    Node,
    /// Every backend: weight, state, health, flows, packets, bytes; then the checks.
    Backends,
    /// Every range listener: ports used, cooling down, free.
    Listeners,
    /// Every gateway address and protocol: its routes' traffic and path, summed.
    Addresses,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum XdpMode {
    Auto,
    Native,
    Skb,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum StateAction {
    Check,
    Repair,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Redirect {
    Auto,
    Never,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Default name of the dummy interface that holds the gateway addresses.
pub(crate) const DEFAULT_ADDRESS_INTERFACE: &str = "berth0";

#[cfg(test)]
mod tests;
