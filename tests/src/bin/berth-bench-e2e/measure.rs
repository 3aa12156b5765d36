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
    /// The backends' CPU per delivered packet (not the gateway's; for reference).
    pub(super) backend_ns_per_packet: f64,
    /// Share of the sent packets dropped at the gateway's receive ring.
    pub(super) ingress_drop: f64,
    /// Share of the sent packets dropped at the backends' receive rings.
    pub(super) backend_drop: f64,
}

pub(super) fn measure(mode: Mode, load: Load) -> Run {
    let topo = Topology::with_gro(BACKENDS);
    let _gateway = configure(mode, &topo);
    let sinks: Vec<Sink> = topo
        .backends
        .iter()
        .map(|b| Sink::attach(b, "eth0"))
        .collect();
    // After every attach and feature change, so the NAPI instances stay as they are.
    let gateway_thread = threaded_napi(&topo.gateway, "c0", GATEWAY_CPU);
    let backend_threads: Vec<u32> = topo
        .backends
        .iter()
        .map(|b| threaded_napi(b, "eth0", BACKEND_CPU))
        .collect();
    let dsts: Vec<SocketAddrV4> = if mode == Mode::Routing {
        (1..=BACKENDS)
            .map(|i| SocketAddrV4::new(backend_addr(i), BACKEND_PORT))
            .collect()
    } else {
        vec![SocketAddrV4::new(GW, GW_PORT)]
    };
    let mut generator = Generator::start(load, &topo, &dsts);
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
    drop(generator);
    let sent = (b.sent.value - a.sent.value) as f64;
    let delivered = (b.delivered.value - a.delivered.value) as f64;
    let sent_pps = rate(a.sent, b.sent);
    let delivered_pps = rate(a.delivered, b.delivered);
    let gateway_busy = rate(a.gateway_ns, b.gateway_ns) / 1e9;
    Run {
        sent_pps,
        delivered_pps,
        loss: (1.0 - delivered_pps / sent_pps).max(0.0),
        gateway_ns_per_packet: gateway_busy * 1e9 / delivered_pps,
        gateway_busy,
        backend_ns_per_packet: (b.backends_ns - a.backends_ns) as f64 / delivered,
        ingress_drop: (b.ingress_drops - a.ingress_drops) as f64 / sent,
        backend_drop: (b.backend_drops - a.backend_drops) as f64 / sent,
    }
}
