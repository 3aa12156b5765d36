//! `berth`: one L4 gateway address shared by many owners, one port each.

#![deny(unsafe_code)]

use std::{
    net::{Ipv4Addr, TcpListener},
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use anyhow::{bail, Context as _};
use berth::{
    admin::{self, RouteRow},
    datapath::{self, AttachMode, Attached, Config, Datapath, LinkChange},
    manifests, planner,
    publish::{Published, Shared},
    standalone::{self, ManifestSource},
    state_document::{self, StateDocument},
    store::Store,
};
use clap::{Parser, Subcommand, ValueEnum};

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
    Run {
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
        /// Gateway address for Gateways whose spec.addresses has no IPv4 address.
        #[arg(long)]
        address: Option<Ipv4Addr>,
        /// Admin endpoint: /healthz, /readyz, /metrics and the state API
        /// (/api/v1/state, /api/v1/routes); keep it on localhost.
        #[arg(long, default_value = DEFAULT_ADMIN)]
        admin_addr: String,
        /// Also serve /healthz, /readyz and /metrics alone on this address (for probes
        /// and Prometheus from off the host, e.g. 0.0.0.0:9471).
        #[arg(long)]
        metrics_addr: Option<String>,
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
    },
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
    },
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
    match cli.command {
        Command::Check {
            manifests: dir,
            state_dir,
            output,
        } => check_cmd(&dir, state_dir, output),
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
        Command::Run {
            manifests,
            manifest_settle,
            kubernetes,
            interfaces,
            state_dir,
            address,
            admin_addr,
            metrics_addr,
            xdp_mode,
            node_name,
            lease_namespace,
            log_format,
            pin_dir,
            address_interface,
            no_address_interface,
            redirect,
        } => {
            init_logging(log_format);
            let mut dp = DatapathOptions {
                interfaces,
                xdp_mode,
                redirect,
                pin_dir,
                address_interface: if no_address_interface {
                    None
                } else {
                    address_interface.clone()
                },
            };
            if kubernetes {
                let identity = match node_name {
                    Some(n) => n,
                    None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                        .map(|h| h.trim().to_string())
                        .context("--node-name is not set and the host name is unreadable")?,
                };
                let options = berth::kubernetes::Options {
                    identity,
                    lease_namespace,
                    default_address: address,
                };
                return run_kubernetes(options, &dp, &admin_addr, metrics_addr.as_deref());
            }
            if !no_address_interface && address_interface.is_none() {
                dp.address_interface = Some(DEFAULT_ADDRESS_INTERFACE.to_string());
            }
            let dir = manifests.context("--manifests DIR (or --kubernetes) is required")?;
            let metrics_addr = metrics_addr.as_deref();
            let source = ManifestSource::new(&dir, manifest_settle);
            let admin = (admin_addr.as_str(), metrics_addr);
            run_standalone(source, &dir, &state_dir, address, admin, &dp)
        }
    }
}

fn init_logging(format: LogFormat) {
    // RUST_LOG (e.g. `berth=debug`) refines the default level, info.
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing::level_filters::LevelFilter::INFO.into())
        .from_env_lossy();
    // Colour only on a terminal: escape codes in a log file or journal are noise.
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn check_cmd(
    dir: &std::path::Path,
    state_dir: Option<PathBuf>,
    output: Output,
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
    let claims = match &state_dir {
        Some(s) => Store::open(s)
            .and_then(|s| s.claims_shared())
            .with_context(|| format!("reading claims from {}", s.display()))?,
        None => Default::default(),
    };
    let snapshot = manifests::snapshot(files.iter().map(|(_, f)| f));
    let plan = planner::plan(&planner::Input {
        snapshot: &snapshot,
        claims: &claims,
        now: SystemTime::now(),
        default_address: None,
        ephemeral_ports: None,
        allocate: true,
    });
    for why in &plan.released {
        eprintln!("warning: {why}");
    }
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
    // A daemon that just started has no plan yet: wait a little for its first one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let state = loop {
        match admin::get(addr, "/api/v1/state") {
            Err(e) if e.to_string().contains("no plan yet") => {
                if std::time::Instant::now() >= deadline {
                    bail!("the daemon at {addr} has made no plan yet after 10 s (see its log, or /readyz)");
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            other => break other.with_context(|| format!("asking the daemon at {addr}"))?,
        }
    };
    let state: StateDocument = serde_json::from_str(&state)?;
    match (what, output) {
        (What::Routes, _) => {
            let rows: Vec<RouteRow> = serde_json::from_str(&admin::get(addr, "/api/v1/routes")?)?;
            match output {
                Output::Table => print!("{}", berth::output::route_table(&rows)),
                _ => print_value(&rows, output)?,
            }
        }
        (What::Claims, Output::Table) => print!("{}", berth::output::claim_table(&state.claims)),
        (What::Claims, _) => print_value(&state.claims, output)?,
        (What::Gateways, Output::Table) => print!(
            "{}",
            berth::output::state_tables(&StateDocument {
                routes: vec![],
                claims: vec![],
                ..state
            })
        ),
        (What::Gateways, _) => print_value(&state.gateways, output)?,
    }
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

/// How `berth run` sets up the datapath.
struct DatapathOptions {
    interfaces: Vec<String>,
    xdp_mode: XdpMode,
    redirect: Redirect,
    pin_dir: PathBuf,
    address_interface: Option<String>,
}

fn run_standalone(
    mut source: ManifestSource,
    dir: &std::path::Path,
    state_dir: &std::path::Path,
    address: Option<Ipv4Addr>,
    (admin_addr, metrics_addr): (&str, Option<&str>),
    options: &DatapathOptions,
) -> anyhow::Result<()> {
    let store = Store::open(state_dir)
        .with_context(|| format!("opening state directory {}", state_dir.display()))?;
    // Before anything else is touched: a second daemon on this directory stops here.
    let _owner = store.own()?;
    let mut datapath = load_datapath(options)?;
    let shared = serve_admin(admin_addr, metrics_addr)?;
    tracing::info!(admin = admin_addr, metrics = metrics_addr, manifests = %dir.display(), state = %state_dir.display(), "berth running");
    exit_on_signal()?;
    standalone::run_loop(&mut source, &store, datapath.as_mut(), address, &shared);
    Ok(())
}

/// Standalone mode: on SIGTERM or Ctrl-C, says so and exits as a kill would (the
/// state is kill-safe at any instant, and the pinned datapath keeps serving).
fn exit_on_signal() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal watcher")?;
    std::thread::Builder::new()
        .name("berth-signals".into())
        .spawn(move || {
            runtime.block_on(terminated());
            tracing::info!("stopping on a signal; the datapath keeps serving");
            std::process::exit(0);
        })
        .context("starting the signal watcher")?;
    Ok(())
}

/// Loads the datapath, attaches it to the interfaces (none: no datapath), follows
/// which interfaces take XDP frames, and owns the address interface if asked to.
fn load_datapath(options: &DatapathOptions) -> anyhow::Result<Option<Datapath>> {
    // A first start that fails (an interface that does not exist, a hook held by
    // another program) leaves nothing pinned behind.
    let fresh = !options.interfaces.is_empty() && !options.pin_dir.exists();
    let loaded = set_up_datapath(options);
    if loaded.is_err() && fresh {
        let _ = datapath::remove_pins(&options.pin_dir);
    }
    loaded
}

fn set_up_datapath(options: &DatapathOptions) -> anyhow::Result<Option<Datapath>> {
    let DatapathOptions {
        interfaces,
        xdp_mode,
        redirect,
        pin_dir,
        address_interface,
    } = options;
    if interfaces.is_empty() {
        tracing::warn!("no --interface: planning and serving state only, no datapath");
        return Ok(None);
    }
    let mut dp = Datapath::load(&Config {
        pin_dir: pin_dir.clone(),
        ..Config::default()
    })
    .context("loading the datapath")?;
    if *redirect == Redirect::Auto {
        datapath::follow_xmit(pin_dir).context("following which interfaces take XDP frames")?;
    } else {
        datapath::XmitMap::open(pin_dir)
            .and_then(|mut m| m.set(&Default::default()))
            .context("clearing the xmit map")?;
        tracing::warn!("--redirect never: the kernel forwards every packet");
    }
    let mode = match xdp_mode {
        XdpMode::Auto => AttachMode::Auto,
        XdpMode::Native => AttachMode::Native,
        XdpMode::Skb => AttachMode::Skb,
    };
    let changes = dp
        .converge(interfaces, mode)
        .context("attaching to the interfaces (nothing new was left attached)")?;
    for change in changes {
        match change {
            LinkChange::Attached {
                iface,
                how: Attached::Replaced,
            } => tracing::info!(iface, "replaced the program an earlier run attached"),
            LinkChange::Attached {
                iface,
                how: Attached::New(m),
            } => tracing::info!(iface, mode = ?m, "attached the XDP and TC programs"),
            LinkChange::Detached { ifindex, iface } => tracing::warn!(
                ifindex,
                iface = iface.as_deref().unwrap_or("(gone)"),
                "detached the programs an earlier run attached: interface not in --interface"
            ),
        }
    }
    match berth::host::disable_icmp_redirects(interfaces) {
        Ok(changed) if !changed.is_empty() => tracing::info!(
            settings = changed.join(" "),
            "ICMP redirects off: they would send backends around the gateway's NAT"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "turning ICMP redirects off"),
    }
    if let Some(name) = address_interface {
        dp.own_addresses_on(name)
            .context("putting the gateway addresses on their interface")?;
        tracing::info!(
            iface = name,
            "gateway addresses go on this dummy interface (the host answers ARP for them)"
        );
    }
    if !datapath::ipv4_forwarding_enabled().unwrap_or(false) {
        tracing::error!("IPv4 forwarding is off (net.ipv4.ip_forward=0): every packet the XDP program hands to the kernel (interfaces that take no XDP frames, unresolved neighbours) will be dropped; set net.ipv4.ip_forward=1");
    }
    Ok(Some(dp))
}

/// `berth state check|repair`.
fn state_cmd(action: StateAction, dir: &std::path::Path) -> anyhow::Result<()> {
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

/// `berth uninstall`: removes the pins (detaching every program no process holds) and
/// the dummy interface.
fn uninstall(pin_dir: &std::path::Path, address_interface: &str) -> anyhow::Result<()> {
    let links = std::fs::read_dir(pin_dir.join("links"))
        .map(|d| d.count())
        .unwrap_or(0);
    let ports = datapath::pinned_service_ports(pin_dir)
        .with_context(|| format!("reading the services pinned in {}", pin_dir.display()))?;
    berth::host::update_reserved_ports(&ports, &Default::default())
        .context("releasing the reserved ports (net.ipv4.ip_local_reserved_ports)")?;
    if !ports.is_empty() {
        println!("released {} reserved ports", ports.len());
    }
    datapath::remove_pins(pin_dir).with_context(|| format!("removing {}", pin_dir.display()))?;
    println!(
        "removed {} ({links} program links: their programs are detached, and the maps)",
        pin_dir.display()
    );
    match berth::netlink::delete_dummy(address_interface) {
        Ok(true) => println!("removed interface {address_interface}"),
        Ok(false) => println!("no interface {address_interface}"),
        Err(e) => return Err(e).with_context(|| format!("removing interface {address_interface}")),
    }
    Ok(())
}

/// Binds the admin endpoint (and the metrics endpoint, if asked for) and serves them
/// from a thread; returns what they serve.
fn serve_admin(admin_addr: &str, metrics_addr: Option<&str>) -> anyhow::Result<Shared> {
    let shared = Arc::new(Mutex::new(Arc::new(Published::default())));
    let bind = |what: &str, addr: &str| {
        TcpListener::bind(addr).with_context(|| format!("binding the {what} endpoint {addr}"))
    };
    let mut listeners = vec![(bind("admin", admin_addr)?, admin::Endpoints::All)];
    if let Some(addr) = metrics_addr {
        listeners.push((bind("metrics", addr)?, admin::Endpoints::Monitoring));
    }
    admin::server::spawn(listeners, shared.clone()).context("starting the admin endpoint")?;
    Ok(shared)
}

fn run_kubernetes(
    options: berth::kubernetes::Options,
    dp: &DatapathOptions,
    admin_addr: &str,
    metrics_addr: Option<&str>,
) -> anyhow::Result<()> {
    let datapath = load_datapath(dp)?;
    let shared = serve_admin(admin_addr, metrics_addr)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
        tracing::info!(
            admin = admin_addr,
            metrics = metrics_addr,
            node = options.identity,
            lease_namespace = options.lease_namespace,
            "berth running in Kubernetes mode"
        );
        berth::kubernetes::run(client, options, datapath, shared, terminated()).await;
        Ok::<_, anyhow::Error>(())
    })?;
    // Leave as a kill would: the pinned datapath keeps serving for the next daemon.
    std::process::exit(0)
}

/// Resolves on SIGTERM (how Kubernetes stops a pod) or Ctrl-C.
async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
