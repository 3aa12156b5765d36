//! `berth run`: the daemon. Reads a drain kept from an earlier run, sets up the
//! datapath (loads or adopts the pinned maps and links, attaches to the interfaces,
//! turns ICMP redirects off, owns the address interface and the announce table), serves
//! the admin endpoint, watches for signals (with `--drain-on-stop`: withdraw, serve on
//! for the drain timeout, exit), and hands over to the standalone or the Kubernetes
//! loop. The datapath's setup is `datapath_setup`.
//!
//! Part of the `berth` binary (declared in `main.rs`), not of the library.

use std::{
    net::TcpListener,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use berth::{
    admin,
    announce::{drain_file::DrainFile, Announcer, Control, Timing},
    datapath,
    publish::{Published, Shared},
    standalone::{self, ManifestSource},
    store::Store,
};

use crate::cli::{LogFormat, RunArgs, DEFAULT_ADDRESS_INTERFACE};

mod datapath_setup;

use datapath_setup::{load_datapath, DatapathOptions};

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
    let announcing = Announcing::new(&state_dir, not_ready_grace, drain_timeout, drain_on_stop);
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
    let admin = AdminOptions {
        admin_addr: &admin_addr,
        metrics_addr: metrics_addr.as_deref(),
        detail,
    };
    if kubernetes {
        let options = berth::kubernetes::Options {
            identity: node_identity(node_name)?,
            lease_namespace,
            default_addresses,
            snat_ports,
            capacity,
        };
        return run_kubernetes(options, &dp, admin, announcing);
    }
    if !no_address_interface && address_interface.is_none() {
        dp.address_interface = Some(DEFAULT_ADDRESS_INTERFACE.to_string());
    }
    let dir = manifests.context("--manifests DIR (or --kubernetes) is required")?;
    let source = ManifestSource::new(&dir, manifest_settle);
    let settings = berth::planner::Settings {
        default_addresses,
        snat_ports,
        capacity,
    };
    run_standalone(source, &dir, &state_dir, &settings, admin, &dp, announcing)
}

/// This node's name in Kubernetes mode: `--node-name`, else the host's name.
fn node_identity(node_name: Option<String>) -> anyhow::Result<String> {
    match node_name {
        Some(n) => Ok(n),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .context("--node-name is not set and the host name is unreadable"),
    }
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

impl Announcing {
    /// The announcer, with the operator's drain kept in `state_dir`, and how the daemon
    /// stops (`--drain-on-stop`: after `drain_timeout`).
    fn new(
        state_dir: &Path,
        not_ready_grace: Duration,
        drain_timeout: Duration,
        drain_on_stop: bool,
    ) -> Self {
        // Both modes keep the operator's drain in the state directory (Kubernetes mode
        // keeps nothing else there).
        let control = Arc::new(Control::default());
        let announcer = Announcer::new(
            Timing {
                not_ready_grace,
                drain_timeout,
            },
            Arc::clone(&control),
            Some(DrainFile::new(state_dir)),
        );
        Announcing {
            stop: Stop {
                control,
                drain: drain_on_stop.then_some(drain_timeout),
            },
            announcer,
        }
    }
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
