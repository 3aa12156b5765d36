//! One measurement: counters read before and after, delivered packets/s, loss, the
//! gateway thread's CPU time per packet.

use super::*;

/// A veth's transmit counters: (packets, dropped because the peer's ring was full).
pub(super) fn tx_stats(ns: &Netns, dev: &str) -> (u64, u64) {
    let out = ns.ip(&["-s", "-j", "link", "show", "dev", dev]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    let tx = &v[0]["stats64"]["tx"];
    (
        tx["packets"].as_u64().unwrap_or_default(),
        tx["dropped"].as_u64().unwrap_or_default(),
    )
}

/// Run time of a thread so far, nanoseconds.
pub(super) fn run_ns(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/schedstat: {e}"));
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("schedstat")
}

/// A counter read with the moment it was read (the middle of the read).
#[derive(Clone, Copy)]
pub(super) struct Reading {
    pub(super) value: u64,
    pub(super) at: Instant,
}

pub(super) fn read(f: impl FnOnce() -> u64) -> Reading {
    let t0 = Instant::now();
    let value = f();
    let t1 = Instant::now();
    Reading {
        value,
        at: t0 + (t1 - t0) / 2,
    }
}

pub(super) fn rate(a: Reading, b: Reading) -> f64 {
    (b.value - a.value) as f64 / (b.at - a.at).as_secs_f64()
}

pub(super) struct Snapshot {
    pub(super) sent: Reading,
    pub(super) delivered: Reading,
    pub(super) gateway_ns: Reading,
    /// Run time of the backends' NAPI threads.
    pub(super) backends_ns: u64,
    /// Dropped at the gateway's receive ring (the gateway fell behind).
    pub(super) ingress_drops: u64,
    /// Dropped at the backends' receive rings (a backend fell behind).
    pub(super) backend_drops: u64,
}

/// One measured run.
#[derive(Clone, Copy, Default)]
pub(super) struct Run {
    pub(super) sent_pps: f64,
    pub(super) delivered_pps: f64,
    pub(super) loss: f64,
    pub(super) gateway_ns_per_packet: f64,
    pub(super) gateway_busy: f64,
    /// The backends' CPU per delivered packet (not the gateway's; for reference; NaN
    /// where they have no NAPI thread of their own).
    pub(super) backend_ns_per_packet: f64,
    /// Share of the sent packets dropped at the gateway's receive ring.
    pub(super) ingress_drop: f64,
    /// Share of the sent packets dropped at the backends' receive rings.
    pub(super) backend_drop: f64,
    /// Entries in the gateway's netfilter conntrack at the end of the run
    /// (`nf_conntrack_count`; `None` where the module is not loaded).
    pub(super) conntrack_entries: Option<u64>,
    /// Its limit, `nf_conntrack_max`, as the gateway's namespace has it.
    pub(super) conntrack_max: Option<u64>,
}

/// A number under `/proc/sys/net/netfilter/` of `ns` (absent while the kernel's
/// conntrack is not loaded).
fn netfilter_sysctl(ns: &Netns, name: &str) -> Option<u64> {
    let path = format!("/proc/sys/net/netfilter/{name}");
    ns.enter(|| std::fs::read_to_string(&path).ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Conntrack entries the kernel holds over all namespaces (the `nf_conntrack` slab's
/// active objects; 0 while the module is not loaded).
fn conntrack_objects() -> u64 {
    std::fs::read_to_string("/proc/slabinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("nf_conntrack "))
                .and_then(|l| l.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Waits (up to 10 s) until the kernel has freed the conntrack entries of the
/// namespaces removed before, which it does in the background: a new-flow run leaves
/// a full table, and freeing it must not overlap the next measurement.
fn wait_for_conntrack_teardown() {
    const LEFT: u64 = 16384;
    let deadline = Instant::now() + Duration::from_secs(10);
    while conntrack_objects() > LEFT {
        if Instant::now() > deadline {
            eprintln!(
                "warning: {} conntrack entries still held after 10 s (another user of netfilter?)",
                conntrack_objects()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn measure(
    mode: Mode,
    backends: Backends,
    load: Load,
    flows: FlowLoad,
    family: Family,
    profile: Option<&std::path::Path>,
) -> Run {
    wait_for_conntrack_teardown();
    let topo = backends.build();
    if flows == FlowLoad::New {
        family.route_new_sources(&topo);
    }
    let _gateway = configure(mode, &topo, family);
    let sinks: Vec<Sink> = topo.backends.iter().map(|b| backends.sink(b)).collect();
    // After every attach and feature change, so the NAPI instances stay as they are.
    let gateway_thread = threaded_napi(&topo.gateway, "c0", GATEWAY_CPU);
    // Backends' veths without NAPI have no thread: they receive in the gateway's.
    let backend_threads: Vec<u32> = topo
        .backends
        .iter()
        .filter(|_| backends.napi())
        .map(|b| threaded_napi(b, "eth0", BACKEND_CPU))
        .collect();
    let dsts: Vec<SocketAddr> = if mode == Mode::Routing {
        family
            .backends(&topo)
            .into_iter()
            .map(|a| SocketAddr::new(a, BACKEND_PORT))
            .collect()
    } else {
        vec![SocketAddr::new(family.gateway(), GW_PORT)]
    };
    let mut generator = Generator::start(load, flows, family, &topo, &dsts);
    let delivered = || sinks.iter().map(Sink::count).sum::<u64>();
    wait_until(
        &format!("{} to deliver packets", mode.name()),
        Duration::from_secs(10),
        || {
            generator.assert_running();
            delivered() > 0
        },
    );
    std::thread::sleep(WARMUP);
    let snapshot = || Snapshot {
        sent: read(|| generator.sent(&topo.client)),
        delivered: read(delivered),
        gateway_ns: read(|| run_ns(gateway_thread)),
        backends_ns: backend_threads.iter().map(|p| run_ns(*p)).sum(),
        ingress_drops: tx_stats(&topo.client, "eth0").1,
        backend_drops: (1..=BACKENDS)
            .map(|i| tx_stats(&topo.gateway, &format!("b{i}")).1)
            .sum(),
    };
    let a = snapshot();
    std::thread::sleep(MEASURE);
    let b = snapshot();
    generator.assert_running();
    if let Some(base) = profile {
        super::profile::record(base);
    }
    let tuples = flows.flows().tuples();
    if flows == FlowLoad::New && b.sent.value > tuples {
        eprintln!(
            "warning: {} frames sent, more than the {tuples} distinct 5-tuples: some repeated",
            b.sent.value
        );
    }
    drop(generator);
    let conntrack_entries = netfilter_sysctl(&topo.gateway, "nf_conntrack_count");
    let conntrack_max = netfilter_sysctl(&topo.gateway, "nf_conntrack_max");
    let sent = (b.sent.value - a.sent.value) as f64;
    let delivered = (b.delivered.value - a.delivered.value) as f64;
    let sent_pps = rate(a.sent, b.sent);
    let delivered_pps = rate(a.delivered, b.delivered);
    let gateway_busy = rate(a.gateway_ns, b.gateway_ns) / 1e9;
    Run {
        sent_pps,
        delivered_pps,
        loss: (1.0 - delivered_pps / sent_pps).max(0.0),
        // None delivered: no figure (NaN, left out of the statistics).
        gateway_ns_per_packet: if delivered > 0.0 {
            gateway_busy * 1e9 / delivered_pps
        } else {
            f64::NAN
        },
        gateway_busy,
        backend_ns_per_packet: if delivered > 0.0 && !backend_threads.is_empty() {
            (b.backends_ns - a.backends_ns) as f64 / delivered
        } else {
            f64::NAN
        },
        ingress_drop: (b.ingress_drops - a.ingress_drops) as f64 / sent,
        backend_drop: (b.backend_drops - a.backend_drops) as f64 / sent,
        conntrack_entries,
        conntrack_max,
    }
}
