//! `berth run`: the daemon. Reads a drain kept from an earlier run, sets up the
//! datapath (loads or adopts the pinned maps and links, attaches to the interfaces,
//! turns ICMP redirects off, owns the address interface and the announce table), serves
//! the admin endpoint, watches for signals (with `--drain-on-stop`: withdraw, serve on
//! for the drain timeout, exit), and hands over to the standalone or the Kubernetes
//! loop.
//!
//! Part of the `berth` binary (declared in `main.rs`), not of the library.

use std::{
    net::TcpListener,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use berth::{
    admin,
    announce::{drain_file::DrainFile, Announcer, Control, Timing},
    datapath::{self, AttachMode, Attached, Config, Datapath, LinkChange},
    publish::{Published, Shared},
    standalone::{self, ManifestSource},
    store::Store,
};

use crate::{LogFormat, Redirect, ReplyOrigin, RunArgs, XdpMode, DEFAULT_ADDRESS_INTERFACE};

/// Runs the daemon as the options say (standalone unless `--kubernetes`).
pub(crate) fn run(args: RunArgs) -> anyhow::Result<()> {
    let RunArgs {
        manifests,
        manifest_settle,
        kubernetes,
        interfaces,
        state_dir,
        addresses,
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
        snat_ports,
        conntrack_size,
        room,
        new_flow_limit,
        reply_origin,
        announce_table,
        not_ready_grace,
        drain_on_stop,
        drain_timeout,
        metrics_per_route,
    } = args;
    let detail = if metrics_per_route {
        admin::metrics::Detail::PerRoute
    } else {
        admin::metrics::Detail::Aggregate
    };
    init_logging(log_format);
    berth::memory::starting();
    let default_addresses = berth::planner::DefaultAddresses::from_list(&addresses)?;
    // Both modes keep the operator's drain in the state directory (Kubernetes mode
    // keeps nothing else there).
    let control = Arc::new(Control::default());
    let announcer = Announcer::new(
        Timing {
            not_ready_grace,
            drain_timeout,
        },
        Arc::clone(&control),
        Some(DrainFile::new(&state_dir)),
    );
    let announcing = Announcing {
        stop: Stop {
            control,
            drain: drain_on_stop.then_some(drain_timeout),
        },
        announcer,
    };
    let limits = datapath::Limits {
        services: room.max_services,
        backends: room.max_backends,
        flows: conntrack_size,
        ..datapath::Limits::default()
    };
    let capacity = datapath::Capacity::of(&limits);
    let mut dp = DatapathOptions {
        interfaces,
        xdp_mode,
        redirect,
        pin_dir,
        limits,
        new_flow_limit,
        reply_origin,
        address_interface: if no_address_interface {
            None
        } else {
            address_interface.clone()
        },
        announce_table,
        announcing: !announcing.announcer.starts_withdrawn(),
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
            default_addresses,
            snat_ports,
            capacity,
        };
        let admin = AdminOptions {
            admin_addr: &admin_addr,
            metrics_addr: metrics_addr.as_deref(),
            detail,
        };
        return run_kubernetes(options, &dp, admin, announcing);
    }
    if !no_address_interface && address_interface.is_none() {
        dp.address_interface = Some(DEFAULT_ADDRESS_INTERFACE.to_string());
    }
    let dir = manifests.context("--manifests DIR (or --kubernetes) is required")?;
    let metrics_addr = metrics_addr.as_deref();
    let source = ManifestSource::new(&dir, manifest_settle);
    let admin = AdminOptions {
        admin_addr: &admin_addr,
        metrics_addr,
        detail,
    };
    let settings = berth::planner::Settings {
        default_addresses,
        snat_ports,
        capacity,
    };
    run_standalone(source, &dir, &state_dir, &settings, admin, &dp, announcing)
}

/// What the admin endpoint and the metrics endpoint serve, and where.
#[derive(Clone, Copy)]
struct AdminOptions<'a> {
    admin_addr: &'a str,
    metrics_addr: Option<&'a str>,
    /// `--metrics-per-route`.
    detail: admin::metrics::Detail,
}

/// The announce decision's edge, and how the daemon stops.
struct Announcing {
    announcer: Announcer,
    stop: Stop,
}

/// How the daemon stops: at once, or (`--drain-on-stop`) after withdrawing its
/// addresses through `control` and serving on for the drain timeout.
struct Stop {
    control: Arc<Control>,
    /// The drain timeout, with `--drain-on-stop`.
    drain: Option<Duration>,
}

impl Stop {
    /// Resolves when the daemon should exit: on SIGTERM or Ctrl-C at once, or with
    /// `--drain-on-stop` once the addresses are withdrawn and the drain timeout has
    /// passed since the signal (a second signal: at once). The loop goes on meanwhile.
    async fn stopped(self) {
        terminated().await;
        let Some(timeout) = self.drain else {
            tracing::info!(
                "stopping on a signal; the datapath keeps serving and the gateway \
                 addresses stay published"
            );
            return;
        };
        self.control.stop(SystemTime::now());
        tracing::info!(
            drain_timeout = %humantime::format_duration(timeout),
            "stopping (--drain-on-stop): the gateway addresses are withdrawn at once; \
             serving and reconciling on for the drain timeout (a second SIGTERM or \
             Ctrl-C exits at once)"
        );
        tokio::select! {
            _ = tokio::time::sleep(timeout) => tracing::info!(
                "drain timeout over; exiting (the datapath keeps serving what still arrives)"
            ),
            _ = terminated() => tracing::info!("a second signal: exiting now"),
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

/// How `berth run` sets up the datapath.
struct DatapathOptions {
    interfaces: Vec<String>,
    xdp_mode: XdpMode,
    redirect: Redirect,
    pin_dir: PathBuf,
    /// Map sizes: `--max-services`, `--max-backends`, `--conntrack-size`.
    limits: datapath::Limits,
    /// New flows per second per CPU the kernel records (0: no limit).
    new_flow_limit: u32,
    /// `--reply-origin`.
    reply_origin: ReplyOrigin,
    address_interface: Option<String>,
    /// `--announce-table`.
    announce_table: Option<u32>,
    /// Whether the addresses are published from the start (not while a drain kept
    /// from an earlier run holds).
    announcing: bool,
}

fn run_standalone(
    mut source: ManifestSource,
    dir: &std::path::Path,
    state_dir: &std::path::Path,
    settings: &berth::planner::Settings,
    admin: AdminOptions,
    options: &DatapathOptions,
    Announcing {
        mut announcer,
        stop,
    }: Announcing,
) -> anyhow::Result<()> {
    let store = Store::open(state_dir)
        .with_context(|| format!("opening state directory {}", state_dir.display()))?;
    // Before anything else is touched: a second daemon on this directory stops here.
    let _owner = store.own()?;
    // A journal grown long (by churn, or across many restarts) is rewritten to what it
    // holds before it is read on every cycle.
    // A state that cannot be read is not a reason to exit: the cycle reports it (not
    // ready, with the way out) until it is repaired.
    match store.compact() {
        Ok(done) => done.iter().for_each(|d| tracing::info!("{d}")),
        Err(e) => tracing::warn!(
            error = %berth::error_chain(&e),
            "the journals were not compacted"
        ),
    }
    // The manifests are read while the kernel verifies the datapath program (at
    // 100,000 routes, 3 s and 0.8 s of a cold start).
    let mut datapath = std::thread::scope(|s| {
        let reading = s.spawn(|| source.read_ahead());
        let loaded = load_datapath(options);
        if let Err(panic) = reading.join() {
            std::panic::resume_unwind(panic);
        }
        loaded
    })?;
    let shared = serve_admin(admin, announcer.control())?;
    tracing::info!(admin = admin.admin_addr, metrics = admin.metrics_addr, manifests = %dir.display(), state = %state_dir.display(), "berth running");
    exit_on_signal(stop)?;
    standalone::run_loop(
        &mut source,
        &store,
        datapath.as_mut(),
        settings,
        &shared,
        &mut announcer,
    );
    Ok(())
}

/// Standalone mode: on SIGTERM or Ctrl-C (after the drain, with `--drain-on-stop`),
/// exits as a kill would (the state is kill-safe at any instant, and the pinned
/// datapath keeps serving).
fn exit_on_signal(stop: Stop) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal watcher")?;
    std::thread::Builder::new()
        .name("berth-signals".into())
        .spawn(move || {
            runtime.block_on(stop.stopped());
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
        limits,
        new_flow_limit,
        reply_origin,
        address_interface,
        announce_table,
        announcing,
    } = options;
    let conntrack_size = limits.flows;
    if interfaces.is_empty() {
        tracing::warn!("no --interface: planning and serving state only, no datapath");
        if announce_table.is_some() {
            tracing::warn!(
                "--announce-table without --interface: no address is served, so none is announced"
            );
        }
        return Ok(None);
    }
    let mut dp = Datapath::load(&Config {
        pin_dir: pin_dir.clone(),
        limits: *limits,
    })
    .context("loading the datapath")?;
    // The kernel's own accounting of the maps (best effort: only reported).
    let kernel_memory_mib = berth::datapath::pinned_memory(pin_dir)
        .map(|maps| maps.values().sum::<u64>() / (1 << 20))
        .unwrap_or_default();
    tracing::info!(
        max_services = limits.services,
        max_backends = limits.backends,
        conntrack_size,
        kernel_memory_mib,
        "datapath sized: routes beyond it wait for room, oldest served first"
    );
    dp.set_new_flow_limit(*new_flow_limit)
        .context("writing --new-flow-limit into the datapath's config map")?;
    match new_flow_limit {
        0 => tracing::info!(
            conntrack_size,
            "no new-flow limit: every new flow is recorded in the conntrack"
        ),
        limit => tracing::info!(
            conntrack_size,
            new_flow_limit = limit,
            "new flows beyond the limit (per second per CPU) are balanced by Maglev alone"
        ),
    }
    let any_origin = *reply_origin == ReplyOrigin::Any;
    dp.set_reply_origin_any(any_origin)
        .context("writing --reply-origin into the datapath's config map")?;
    if any_origin {
        tracing::warn!(
            "--reply-origin any: replies are translated from whatever interface and \
             neighbour they come from; a host that forges a backend's address can answer \
             for it"
        );
    }
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
            // The mode stays the earlier run's: native and generic XDP cannot be
            // attached at once, and a switch would leave the interface without the
            // program for a moment (its packets to the host, connections reset).
            LinkChange::Attached {
                iface,
                how: Attached::Replaced(Some(AttachMode::Skb)),
            } if mode == AttachMode::Native => tracing::warn!(
                iface,
                pin = %dp.pin_dir().join("links").display(),
                "--xdp-mode native asked, but an earlier run attached this interface in \
                 generic (skb) mode, which its program keeps (replaced in place, flows kept): \
                 to change the mode, stop berth, remove the interface's link pin xdp@INDEX \
                 there (that detaches it) and start again"
            ),
            LinkChange::Attached {
                iface,
                how: Attached::Replaced(m),
            } => tracing::info!(iface, mode = ?m, "replaced the program an earlier run attached"),
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
    // Before anything is published: a drain kept from an earlier run holds.
    dp.set_announcing(*announcing)
        .context("deciding what to publish")?;
    if let Some(name) = address_interface {
        dp.own_addresses_on(name)
            .context("putting the gateway addresses on their interface")?;
        tracing::info!(
            iface = name,
            "gateway addresses go on this dummy interface (the host answers ARP for them)"
        );
    }
    if let Some(table) = announce_table {
        dp.announce_in_table(*table).with_context(|| {
            format!("publishing the gateway addresses in routing table {table}")
        })?;
        tracing::info!(
            table,
            via = address_interface.as_deref().unwrap_or("lo"),
            "gateway addresses are also routes of protocol berth (251) in this table, for \
             the routing daemon to import"
        );
    }
    if !datapath::ipv4_forwarding_enabled().unwrap_or(false) {
        tracing::error!("IPv4 forwarding is off (net.ipv4.ip_forward=0): every packet the XDP program hands to the kernel (interfaces that take no XDP frames, unresolved neighbours) will be dropped; set net.ipv4.ip_forward=1");
    }
    Ok(Some(dp))
}

/// Binds the admin endpoint (and the metrics endpoint, if asked for) and serves them
/// from a thread; returns what they serve.
fn serve_admin(
    AdminOptions {
        admin_addr,
        metrics_addr,
        detail,
    }: AdminOptions,
    control: &Arc<Control>,
) -> anyhow::Result<Shared> {
    let shared = Arc::new(Mutex::new(Arc::new(Published::default())));
    let bind = |what: &str, addr: &str| {
        TcpListener::bind(addr).with_context(|| format!("binding the {what} endpoint {addr}"))
    };
    let mut listeners = vec![(bind("admin", admin_addr)?, admin::Endpoints::All)];
    if let Some(addr) = metrics_addr {
        listeners.push((bind("metrics", addr)?, admin::Endpoints::Monitoring));
    }
    admin::server::spawn(
        listeners,
        admin_addr,
        detail,
        shared.clone(),
        Arc::clone(control),
    )
    .context("starting the admin endpoint")?;
    Ok(shared)
}

fn run_kubernetes(
    options: berth::kubernetes::Options,
    dp: &DatapathOptions,
    admin: AdminOptions,
    Announcing { announcer, stop }: Announcing,
) -> anyhow::Result<()> {
    let datapath = load_datapath(dp)?;
    let shared = serve_admin(admin, announcer.control())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
        tracing::info!(
            admin = admin.admin_addr,
            metrics = admin.metrics_addr,
            node = options.identity,
            lease_namespace = options.lease_namespace,
            "berth running in Kubernetes mode"
        );
        berth::kubernetes::run(client, options, datapath, shared, announcer, stop.stopped()).await;
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
