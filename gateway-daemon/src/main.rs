//! `berth`: one L4 gateway address shared by many owners, one port each.

#![deny(unsafe_code)]

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    time::SystemTime,
};

use anyhow::{bail, Context as _};
use berth::{
    admin::{self, RouteRow},
    announce::{control::Request, Status},
    datapath, manifests,
    netlink::DummyDeleted,
    planner,
    state_document::{self, StateDocument},
    store::Store,
};
use clap::{Args, Parser, Subcommand, ValueEnum};

mod run;

const DEFAULT_ADMIN: &str = "127.0.0.1:9470";

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
struct MonitorArgs {
    /// Only events of this reason (a counter's name, as on /metrics); repeatable.
    #[arg(long = "reason", value_parser = berth::monitor::reason)]
    reasons: Vec<gateway_common::Counter>,
    /// Only packets of this route (NAMESPACE/NAME; its ports and endpoints, asked of
    /// the daemon); repeatable.
    #[arg(long = "route")]
    routes: Vec<String>,
    /// Only packets from or to this address; repeatable.
    #[arg(long = "address")]
    addresses: Vec<IpAddr>,
    /// Only packets from or to this port; repeatable.
    #[arg(long = "port")]
    ports: Vec<u16>,
    /// Send one event in N (per CPU).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    sample: u32,
    /// Send at most N events a second per CPU; the rest are counted as monitor_lost.
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// Output format of the lines.
    #[arg(short, long, value_enum, default_value_t = MonitorOutput::Text)]
    output: MonitorOutput,
    /// Also write the packets (their first 128 bytes, as they entered and, if
    /// rewritten, as they left) to this pcap file; `-`: to standard output instead of
    /// the lines (`berth monitor --pcap - | tshark -r -`).
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// End after N events.
    #[arg(long)]
    count: Option<u64>,
    /// End after this long (`30s`, `5m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<std::time::Duration>,
    /// Where the datapath's maps are pinned.
    #[arg(long, default_value = datapath::DEFAULT_PIN_DIR)]
    pin_dir: PathBuf,
    /// The daemon's admin endpoint (for --route).
    #[arg(long, default_value = DEFAULT_ADMIN)]
    admin_addr: String,
}

/// `berth monitor`'s line format.
#[derive(Clone, Copy, ValueEnum)]
enum MonitorOutput {
    /// A line of text an event.
    Text,
    /// A JSON object a line.
    Json,
}

/// The options of `berth run`.
#[derive(Args)]
struct RunArgs {
    /// Directory of YAML manifests (standalone mode).
    #[arg(long, conflicts_with = "kubernetes")]
    manifests: Option<PathBuf>,
    /// How long a manifest file must stay gone before its objects are removed (so
    /// that replacing a file, by `rm` then write or by an editor, causes no outage).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    manifest_settle: std::time::Duration,
    /// Read objects from the Kubernetes API.
    #[arg(long)]
    kubernetes: bool,
    /// Interfaces to attach the XDP program to (none: plan and serve state only).
    #[arg(long = "interface")]
    interfaces: Vec<String>,
    /// Where claims and first-seen times are kept.
    #[arg(long, default_value = "/var/lib/berth")]
    state_dir: PathBuf,
    /// Gateway address (IPv4 or IPv6) for Gateways whose spec.addresses has no
    /// address Berth serves; give it once per family for dual-stack defaults.
    #[arg(long = "address")]
    addresses: Vec<IpAddr>,
    /// Admin endpoint: /healthz, /readyz, /metrics and the state API
    /// (/api/v1/state, /api/v1/routes); keep it on localhost.
    #[arg(long, default_value = DEFAULT_ADMIN)]
    admin_addr: String,
    /// Also serve /healthz, /readyz and /metrics alone on this address (for probes
    /// and Prometheus from off the host, e.g. 0.0.0.0:9471).
    #[arg(long)]
    metrics_addr: Option<String>,
    /// Also give /metrics a series per route (berth_route_*) besides the sums per
    /// gateway address (berth_address_*): ~1 KiB per route a scrape, ~100 MiB at 100k
    /// routes.
    #[arg(long)]
    metrics_per_route: bool,
    /// XDP attach mode.
    #[arg(long, value_enum, default_value_t = XdpMode::Auto)]
    xdp_mode: XdpMode,
    /// This node's name (Kubernetes mode: identity in the allocator election and events).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Namespace of the allocator election's Lease (Kubernetes mode).
    #[arg(long, env = "POD_NAMESPACE", default_value = "berth-system")]
    lease_namespace: String,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Where the datapath's maps and links are pinned.
    #[arg(long, default_value = datapath::DEFAULT_PIN_DIR)]
    pin_dir: PathBuf,
    /// Dummy interface the daemon owns that holds the programmed gateway addresses,
    /// so the host answers ARP for them (default in standalone mode: berth0; in
    /// Kubernetes mode none unless given: announce addresses with MetalLB or BGP).
    #[arg(long, conflicts_with = "no_address_interface")]
    address_interface: Option<String>,
    /// Put the gateway addresses on no interface (clients then need a route to
    /// them via this host).
    #[arg(long)]
    no_address_interface: bool,
    /// Whether XDP sends packets itself (auto: into interfaces that take XDP
    /// frames) or hands every one to the kernel (never: for troubleshooting, and
    /// to measure the kernel path).
    #[arg(long, value_enum, default_value_t = Redirect::Auto)]
    redirect: Redirect,
    /// Source ports for SNAT mode (GatewayConfig sourceNAT: true), as LO-HI; every
    /// Gateway listener's ports are taken out. Keep it clear of the host's own
    /// ephemeral ports when the host opens many connections itself.
    #[arg(long, default_value = "32768-60999", value_parser = parse_port_range)]
    snat_ports: std::ops::RangeInclusive<u16>,
    /// Entries of the conntrack (a flow takes one, two in SNAT mode; 152 bytes of
    /// kernel memory each). A full table evicts its least recently used flows. A
    /// restart must give the size the pinned table has (refused otherwise: remove the
    /// pinned berth_ct to resize it, and its flows are balanced again).
    #[arg(long, default_value_t = datapath::Limits::default().flows, value_parser = parse_conntrack_size)]
    conntrack_size: u32,
    /// Room in the datapath for services and backends.
    #[command(flatten)]
    room: Room,
    /// New flows per second per CPU above which new flows (and replies matched by
    /// Maglev) are balanced by Maglev alone and not recorded in the conntrack
    /// (flood_untracked), so a flood of new flows cannot evict the established ones; 0:
    /// no limit.
    #[arg(long, default_value_t = DEFAULT_NEW_FLOW_LIMIT)]
    new_flow_limit: u32,
    /// Where replies of a flow (and ICMP errors about packets sent to a backend) may
    /// come from: `backend`, only from the interface (and neighbour) the gateway sends
    /// that backend's packets to, else dropped as reply_spoofed (a tenant forging
    /// another's backend); `any`, from anywhere, for backends whose replies come back
    /// another way (a router spreading them over a tier of gateways).
    #[arg(long, value_enum, default_value = "backend")]
    reply_origin: ReplyOrigin,
    /// Also publish each served gateway address as a route ADDR/32 (/128) of protocol
    /// berth (251) in this kernel routing table, through the address interface (lo
    /// without one), for the routing daemon to import (BIRD: protocol kernel { kernel
    /// table N; learn; }, as deploy/bird/bird.conf). Not 0, 253, 254 or 255.
    #[arg(long, value_name = "N", value_parser = parse_announce_table)]
    announce_table: Option<u32>,
    /// How long the node may be not ready (as /readyz says: the last cycle failed, no
    /// plan yet) before its addresses are withdrawn.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = humantime::parse_duration)]
    not_ready_grace: std::time::Duration,
    /// On SIGTERM, withdraw the addresses at once and keep running (serving and
    /// reconciling) for --drain-timeout, then exit; a second SIGTERM or Ctrl-C exits
    /// at once. Without it SIGTERM exits at once and leaves the addresses published
    /// (the pinned datapath serves through a restart).
    #[arg(long)]
    drain_on_stop: bool,
    /// How long a drain lasts: `berth drain` is draining for this long, then drained;
    /// with --drain-on-stop, the daemon exits this long after SIGTERM.
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = humantime::parse_duration)]
    drain_timeout: std::time::Duration,
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
struct Room {
    /// Services (gateway address, protocol, port) the datapath holds: a route takes
    /// one per port and address it is served on. Routes are served oldest first; those
    /// beyond the limit keep their ports and wait (Programmed=False, DatapathFull). At
    /// most 1048576 (2^20). A restart must give the size the pinned maps have.
    #[arg(long, value_name = "N", default_value_t = datapath::Limits::default().services, value_parser = parse_max_services)]
    max_services: u32,
    /// Backends the datapath holds over all services (an endpoint serving two
    /// services counts twice). Routes beyond the limit wait as with --max-services. It
    /// also sizes the Maglev tables' pool: 128 entries (1 KiB of kernel memory) per
    /// backend, plus one largest table. A restart must give the size the pinned maps have.
    #[arg(long, value_name = "N", default_value_t = datapath::Limits::default().backends, value_parser = parse_max_backends)]
    max_backends: u32,
}

impl Room {
    /// The capacity the planner admits routes into.
    fn capacity(&self) -> datapath::Capacity {
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
enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Clone, Copy, ValueEnum)]
enum What {
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
enum XdpMode {
    Auto,
    Native,
    Skb,
}

#[derive(Clone, Copy, ValueEnum)]
enum StateAction {
    Check,
    Repair,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Redirect {
    Auto,
    Never,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

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

fn check_cmd(
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
    let now = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .into();
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

fn get_cmd(what: What, addr: &str, output: Output) -> anyhow::Result<()> {
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
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
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
            Err(e) if e.to_string().contains("no plan yet") => {
                if std::time::Instant::now() >= deadline {
                    bail!("the daemon at {addr} has made no plan yet after 10 s (see its log, or /readyz)");
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            // 503 for another reason: the daemon answers. (Its status line follows the
            // URL: `GET http://ADDR/readyz: HTTP/1.1 503 Service Unavailable: why`.)
            Err(e)
                if e.to_string()
                    .split(": ")
                    .nth(1)
                    .and_then(|status| status.split(' ').nth(1))
                    == Some("503") =>
            {
                return Ok(())
            }
            other => {
                other.with_context(|| format!("asking the daemon at {addr}"))?;
                return Ok(());
            }
        }
    }
}

/// The daemon's `/api/v1/announce`.
fn announce_status(addr: &str) -> anyhow::Result<Status> {
    let text = admin::get(addr, "/api/v1/announce")?;
    serde_json::from_str(&text).context("reading /api/v1/announce")
}

/// How long `berth drain` and `berth undrain` wait for the daemon to apply them.
const APPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `berth drain` / `berth undrain`: hands the request to the daemon, waits until its
/// loop applied it, and says what was withdrawn or announced, and where.
fn drain_cmd(addr: &str, request: Request) -> anyhow::Result<()> {
    let asking = || format!("asking the daemon at {addr}");
    let before = announce_status(addr).with_context(asking)?;
    let path = match request {
        Request::Drain => "/api/v1/drain",
        Request::Undrain => "/api/v1/undrain",
    };
    let answer: serde_json::Value =
        serde_json::from_str(&admin::post(addr, path).with_context(asking)?)
            .context("reading the daemon's answer")?;
    let number = answer["request"]
        .as_u64()
        .context("the daemon's answer has no request number")?;
    let deadline = std::time::Instant::now() + APPLY_TIMEOUT;
    let after = loop {
        let now = announce_status(addr).with_context(asking)?;
        if now.applied >= number {
            break now;
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "the daemon at {addr} did not apply the request within {} s (see its log)",
                APPLY_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    if let Some(e) = &after.persist_error {
        eprintln!("warning: the daemon could not record this in its state directory, so a restart forgets it: {e}");
    }
    println!(
        "{}",
        berth::output::drain_result(request, &before, &after, SystemTime::now())
    );
    Ok(())
}

fn print_value<T: serde::Serialize>(v: &T, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Yaml => print!("{}", serde_yaml::to_string(v)?),
        _ => println!("{}", serde_json::to_string_pretty(v)?),
    }
    Ok(())
}

/// Default name of the dummy interface that holds the gateway addresses.
const DEFAULT_ADDRESS_INTERFACE: &str = "berth0";

/// `berth state check|repair`.
fn state_cmd(action: StateAction, dir: &Path) -> anyhow::Result<()> {
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

/// `berth uninstall`: removes what Berth pinned in the pin directory (its links first,
/// which detaches their programs, then its maps and directories) and the address
/// interface, printing each. Refuses, removing nothing, while a daemon uses the pin
/// directory or if anything in it is not Berth's.
fn uninstall(pin_dir: &Path, address_interface: &str) -> anyhow::Result<()> {
    let Some(pinned) = datapath::PinnedDatapath::survey(pin_dir)
        .with_context(|| format!("refusing to uninstall from {}", pin_dir.display()))?
    else {
        println!("nothing of Berth's is pinned in {}", pin_dir.display());
        // Only an interface marked for this pin directory is removed: an unmarked one
        // may be the address interface of a daemon with another --pin-dir.
        return remove_address_interface(pin_dir, address_interface, false);
    };
    let ports = datapath::pinned_service_ports(pinned.dir())
        .with_context(|| format!("reading the services pinned in {}", pin_dir.display()))?;
    berth::host::update_reserved_ports(&ports.iter().copied().collect(), &Default::default())
        .context("releasing the reserved ports (net.ipv4.ip_local_reserved_ports)")?;
    if !ports.is_empty() {
        let list: Vec<String> = ports.iter().map(u16::to_string).collect();
        println!("released reserved ports {}", list.join(","));
    }
    let removed = pinned
        .remove()
        .with_context(|| format!("removing what Berth pinned in {}", pin_dir.display()))?;
    for r in &removed {
        println!("removed {r}");
    }
    remove_address_interface(pin_dir, address_interface, true)
}

/// Removes the address interface if it is marked as `pin_dir`'s (or, if
/// `unmarked_too`, not marked at all: made by an earlier version), saying what it did.
fn remove_address_interface(
    pin_dir: &Path,
    address_interface: &str,
    unmarked_too: bool,
) -> anyhow::Result<()> {
    let mark = datapath::address_interface_mark(pin_dir);
    match berth::netlink::delete_dummy(address_interface, &mark, unmarked_too) {
        Ok(DummyDeleted::Deleted) => println!("removed interface {address_interface}"),
        Ok(DummyDeleted::Absent) => println!("no interface {address_interface}"),
        Ok(DummyDeleted::Kept { alias }) if alias.is_empty() => println!(
            "interface {address_interface} left alone: nothing marks it as the address \
             interface of {}",
            pin_dir.display()
        ),
        Ok(DummyDeleted::Kept { alias }) => println!(
            "interface {address_interface} left alone: it is marked {alias:?}, the address \
             interface of another pin directory"
        ),
        Err(e) => return Err(e).with_context(|| format!("removing interface {address_interface}")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{
        parse_announce_table, parse_conntrack_size, parse_max_services, parse_port_range, Cli,
        Command,
    };
    use clap::Parser as _;

    /// Each `(input, what the error says)` of `cases` is refused by `parse`, saying that.
    fn refuses<T: std::fmt::Debug>(parse: fn(&str) -> Result<T, String>, cases: &[(&str, &str)]) {
        for (bad, says) in cases {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn conntrack_size_is_a_positive_count_up_to_2_to_the_26() {
        assert_eq!(parse_conntrack_size("1024"), Ok(1024));
        assert_eq!(parse_conntrack_size("67108864"), Ok(1 << 26));
        refuses(
            parse_conntrack_size,
            &[
                ("0", "0 entries"),
                ("67108865", "beyond the 67108864"),
                ("99999999999", "beyond"),
                ("-1", "not a number"),
                ("1k", "not a number"),
            ],
        );
    }

    #[test]
    fn max_services_goes_up_to_2_to_the_20() {
        assert_eq!(parse_max_services("131072"), Ok(1 << 17));
        assert_eq!(parse_max_services("1048576"), Ok(1 << 20));
        refuses(
            parse_max_services,
            &[("0", "0 services"), ("1048577", "beyond the 1048576")],
        );
    }

    fn run_args(extra: &[&str]) -> Result<super::RunArgs, clap::Error> {
        let mut argv = vec!["berth", "run", "--manifests", "m"];
        argv.extend(extra);
        match Cli::try_parse_from(argv)?.command {
            Command::Run(args) => Ok(*args),
            _ => unreachable!("berth run parses as Run"),
        }
    }

    #[test]
    fn conntrack_size_and_new_flow_limit_default_and_parse() {
        let args = run_args(&[]).expect("defaults");
        assert_eq!(args.conntrack_size, 262_144);
        assert_eq!(args.new_flow_limit, 125_000);
        let args =
            run_args(&["--conntrack-size", "1024", "--new-flow-limit", "0"]).expect("both given");
        assert_eq!((args.conntrack_size, args.new_flow_limit), (1024, 0));
        let err = run_args(&["--conntrack-size", "0"])
            .err()
            .expect("0 is refused");
        assert!(err.to_string().contains("--conntrack-size"), "{err}");
        assert!(run_args(&["--new-flow-limit", "-5"]).is_err());
    }

    #[test]
    fn replies_must_come_from_their_backend_unless_told_otherwise() {
        use super::ReplyOrigin;
        let origin = |extra: &[&str]| run_args(extra).map(|a| a.reply_origin).ok();
        assert_eq!(origin(&[]), Some(ReplyOrigin::Backend));
        assert_eq!(origin(&["--reply-origin", "any"]), Some(ReplyOrigin::Any));
        assert_eq!(
            origin(&["--reply-origin", "backend"]),
            Some(ReplyOrigin::Backend)
        );
        assert_eq!(origin(&["--reply-origin", "router"]), None);
    }

    #[test]
    fn address_takes_either_family_once_per_family() {
        use berth::planner::DefaultAddresses;
        let defaults = |extra: &[&str]| {
            let args = run_args(extra).map_err(|e| e.to_string())?;
            DefaultAddresses::from_list(&args.addresses).map_err(|e| e.to_string())
        };
        assert_eq!(defaults(&[]), Ok(DefaultAddresses::default()));
        let both = defaults(&["--address", "2001:DB8::1", "--address", "192.0.2.1"])
            .expect("one address per family");
        assert_eq!(both.ipv4, Some("192.0.2.1".parse().expect("v4")));
        assert_eq!(both.ipv6, Some("2001:db8::1".parse().expect("v6")));
        let v6 = defaults(&["--address", "fd00::1"]).expect("IPv6 alone");
        assert_eq!(
            (v6.ipv4, v6.ipv6.map(|a| a.to_string())),
            (None, Some("fd00::1".into()))
        );
        let twice = defaults(&["--address", "192.0.2.1", "--address", "192.0.2.2"])
            .expect_err("two IPv4 addresses");
        assert!(
            twice.contains("--address is given twice for IPv4"),
            "{twice}"
        );
        let bad = defaults(&["--address", "gw.example.com"]).expect_err("not an IP");
        assert!(bad.contains("--address"), "{bad}");
    }

    #[test]
    fn announce_options_default_and_the_kernels_tables_are_refused() {
        let args = run_args(&[]).expect("defaults");
        assert_eq!(args.announce_table, None);
        assert_eq!(args.not_ready_grace, std::time::Duration::from_secs(10));
        assert_eq!(args.drain_timeout, std::time::Duration::from_secs(30));
        assert!(!args.drain_on_stop);
        let args = run_args(&[
            "--announce-table",
            "100",
            "--drain-on-stop",
            "--drain-timeout",
            "2s",
            "--not-ready-grace",
            "500ms",
        ])
        .expect("all given");
        assert_eq!(args.announce_table, Some(100));
        assert!(args.drain_on_stop);
        assert_eq!(args.drain_timeout, std::time::Duration::from_secs(2));
        assert_eq!(args.not_ready_grace, std::time::Duration::from_millis(500));
        assert_eq!(parse_announce_table("256"), Ok(256));
        refuses(
            parse_announce_table,
            &[
                ("0", "unspec"),
                ("253", "default table"),
                ("254", "main table"),
                ("255", "local table"),
                ("-1", "not a routing table number"),
            ],
        );
        let err = run_args(&["--announce-table", "254"])
            .err()
            .expect("refused");
        assert!(err.to_string().contains("--announce-table"), "{err}");
    }

    #[test]
    fn snat_ports_are_lo_hi_with_both_above_zero_and_in_order() {
        assert_eq!(parse_port_range("32768-60999"), Ok(32768..=60999));
        assert_eq!(parse_port_range("5000-5000"), Ok(5000..=5000));
        refuses(
            parse_port_range,
            &[
                ("60999-32768", "above the last"),
                ("0-100", "port 0"),
                ("100", "not LO-HI"),
                ("100-70000", "not a port"),
                ("a-b", "not a port"),
            ],
        );
    }
}
