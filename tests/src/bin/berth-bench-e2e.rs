//! `cargo xtask bench e2e` (root): the same UDP load through the same namespace
//! topology (client → gateway → 2 backends, `topo::Topology`, built afresh for every
//! run) with the gateway doing its job in turn by plain routing (no NAT, the baseline:
//! the client sends straight to the backends' addresses), Berth's XDP datapath (the
//! real `berth run` on a generated manifest directory), iptables DNAT (legacy and nft
//! back ends), IPVS and nftables DNAT. Modes take turns, `REPS` rounds of `WARMUP` +
//! `MEASURE`; medians are reported as a table, an SVG chart (`target/bench/e2e.svg`)
//! and, last, one JSON line.
//!
//! Load: 16 UDP flows (source ports 40000-40015; with several destinations, flows
//! alternate between them) of 64-byte frames (18-byte payload, no UDP checksum), sent
//! on CPU 0 as fast as it goes. By default the kernel's own generator makes it
//! (`loadgen::FrameGenerator`, `BPF_PROG_TEST_RUN` with live frames): the frames reach
//! the gateway's veth as XDP frames in page-pool pages, which is how a NIC driver hands
//! packets over: XDP works on them in place, and for the stack the gateway builds an
//! skb around each one, as a driver does. `--load sendmmsg` uses connected UDP sockets
//! instead (this binary re-executed in the client namespace, `sendmmsg` of UDP GSO
//! datagrams, cut into ordinary packets by the client's veth). That load is unlike a
//! NIC in two ways that both favour the stack: the sender's skb travels on through the
//! gateway (which then allocates none), and native XDP on veth must first copy each such
//! skb into a page with headroom. On the 2-CPU development VM, Berth's XDP cost about
//! what plain routing did under that load (~0.6 µs/packet), and a quarter of it under
//! frames (0.28 against 1.06 µs).
//!
//! Counting, the same for every mode: `loadgen::Sink`, an XDP program on each
//! backend's veth, counts UDP and drops it (so nothing answers, not even ICMP). Sent =
//! frames the generator made (`--load sendmmsg`: packets the client's veth took,
//! transmitted or dropped). Delivered pps = counted / time; loss = 1 − delivered/sent,
//! nearly all of it at the gateway's receive ring (veth drops there when the gateway
//! falls behind; shown per run on stderr with the drops at the backends' rings).
//!
//! Gateway CPU per packet: veth hands a packet to the receiving device's NAPI, which
//! by default runs on the sending CPU: one core would do everything and pps would hide
//! the gateway's cost (RPS cannot help: XDP runs before it). Here the gateway's ingress
//! veth (`c0`) and every backend's veth run *threaded NAPI*: each device's receive
//! processing is a kernel thread of its own. The gateway's thread, pinned to CPU 1, does
//! for every mode exactly the gateway's work: receive from the client, XDP or the stack
//! (routing, conntrack, NAT) and the transmit into the backend's receive ring. The
//! backends' threads do theirs on CPU 0, next to the generator. NAPI threads run
//! SCHED_FIFO, above ordinary tasks as softirq processing is, so other load on the
//! machine delays them less. Gateway CPU = that one thread's run time
//! (`/proc/PID/schedstat`, nanoseconds) over the measurement, divided by the packets
//! delivered meanwhile; its busy share says whether the gateway was the bottleneck.
//! A gateway that is not saturated pays for more sleeps and wake-ups per packet, so an
//! unsaturated mode's figure is if anything too high.
//!
//! Figures seen on the (shared, noisy) 2-CPU development VM: routing ~1.05 µs, netfilter
//! DNAT (any of the three) ~1.25-1.35 µs, Berth ~0.28 µs of gateway CPU per packet.
//! Accounted the older way on the same setup (RPS of the gateway's receive to CPU 1,
//! softirq + system time of CPU 1 from /proc/stat) routing reads ~1.3 µs: that also bills
//! the RPS hand-off and whatever else runs on the CPU.

use std::{
    collections::HashSet,
    fmt::Write as _,
    net::{SocketAddrV4, UdpSocket},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use berth_tests::{
    daemon::{Daemon, Dirs},
    loadgen::{pin, FrameGenerator, Sink},
    netns::{wait_until, Netns, Proc},
    packet::Packet,
    topo::{backend_addr, Topology, CLIENT, DNS_PORT, GW},
};
use serde_json::{json, Value};

const BACKENDS: usize = 2;
const FLOWS: u16 = 16;
const FIRST_SOURCE_PORT: u16 = 40000;
/// 14 (Ethernet) + 20 (IPv4) + 8 (UDP) + 18 = 60 bytes: a 64-byte frame with its FCS.
const PAYLOAD: usize = 18;
/// The port the UDPRoute asks for (and the NAT rules match).
const GW_PORT: u16 = 30053;
/// Where the backends receive.
const BACKEND_PORT: u16 = DNS_PORT;
const WARMUP: Duration = Duration::from_secs(1);
const MEASURE: Duration = Duration::from_secs(5);
const REPS: usize = 3;
const GEN_CPU: usize = 0;
const GATEWAY_CPU: usize = 1;
const BACKEND_CPU: usize = 0;
const ACCOUNTING: &str = "threaded NAPI: the gateway's receive, forwarding/NAT and transmit run in one kernel thread (napi/c0-*, SCHED_FIFO) pinned to CPU 1; gateway ns/packet = its run time (/proc/PID/schedstat) / delivered packets";

/// How the load is made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    /// The kernel's XDP live-frames generator.
    Frames,
    /// UDP sockets, `sendmmsg`.
    Sendmmsg,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Frames => "xdp-live-frames",
            Load::Sendmmsg => "sendmmsg",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Routing,
    Berth,
    /// Berth with every packet handed to the kernel (`--redirect never`): the path
    /// taken where the egress takes no XDP frames.
    BerthKernel,
    IptablesLegacy,
    IptablesNft,
    Ipvs,
    Nftables,
}

const MODES: [Mode; 7] = [
    Mode::Routing,
    Mode::Berth,
    Mode::BerthKernel,
    Mode::IptablesLegacy,
    Mode::IptablesNft,
    Mode::Ipvs,
    Mode::Nftables,
];

/// The references every mode is compared with.
const REFERENCES: [Mode; 4] = [
    Mode::IptablesLegacy,
    Mode::IptablesNft,
    Mode::Ipvs,
    Mode::Nftables,
];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Routing => "routing",
            Mode::Berth => "berth-xdp",
            Mode::BerthKernel => "berth-kernel",
            Mode::IptablesLegacy => "iptables-legacy",
            Mode::IptablesNft => "iptables-nft",
            Mode::Ipvs => "ipvs",
            Mode::Nftables => "nftables",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Mode::Routing => "no NAT: straight to a backend address (baseline)",
            Mode::Berth => "berth run, XDP DNAT + redirect",
            Mode::BerthKernel => "berth run --redirect never, XDP DNAT + the kernel forwards",
            Mode::IptablesLegacy => "iptables-legacy nat PREROUTING DNAT",
            Mode::IptablesNft => "iptables-nft nat PREROUTING DNAT",
            Mode::Ipvs => "IPVS masquerading (NAT)",
            Mode::Nftables => "nftables nat prerouting dnat (numgen)",
        }
    }

    /// Why the mode cannot run here, if it cannot.
    fn unavailable(self) -> Option<String> {
        if self == Mode::Ipvs && !Path::new("/proc/net/ip_vs").exists() {
            return Some("unavailable: kernel built without IPVS (CONFIG_IP_VS unset)".into());
        }
        let tool = match self {
            Mode::IptablesLegacy => "iptables-legacy",
            Mode::IptablesNft => "iptables-nft",
            Mode::Ipvs => "ipvsadm",
            Mode::Nftables => "nft",
            _ => return None,
        };
        (!have(tool)).then(|| format!("unavailable: {tool} is not installed"))
    }
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------------
// `--load sendmmsg`: this binary as `sendmmsg SECS CPU DST...` in the client namespace

/// Payloads per UDP GSO datagram (the client's veth, without segmentation offload, cuts
/// it into that many ordinary packets) and datagrams per `sendmmsg`.
const SEGMENTS: usize = 16;
const BATCH: usize = 4;
const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;

/// Sends on `FLOWS` connected sockets (flows spread over the destinations) as fast as
/// it can for SECS seconds.
fn sendmmsg_generator(args: &[String]) {
    let secs: f64 = args[0].parse().expect("seconds");
    let cpu: usize = args[1].parse().expect("cpu");
    let dsts: Vec<SocketAddrV4> = args[2..]
        .iter()
        .map(|a| a.parse().expect("destination ip:port"))
        .collect();
    pin(0, cpu);
    let socks: Vec<UdpSocket> = (0..FLOWS)
        .map(|i| {
            let s = UdpSocket::bind((CLIENT, FIRST_SOURCE_PORT + i)).expect("bind");
            s.connect(dsts[usize::from(i) % dsts.len()])
                .expect("connect");
            let size = PAYLOAD as libc::c_int;
            // SAFETY: setsockopt reads an int that outlives the call.
            let rc = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    SOL_UDP,
                    UDP_SEGMENT,
                    (&size as *const libc::c_int).cast(),
                    std::mem::size_of_val(&size) as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
            s
        })
        .collect();
    let payload = [0x42u8; PAYLOAD * SEGMENTS];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    let mut msgs: Vec<libc::mmsghdr> = (0..BATCH)
        .map(|_| {
            // SAFETY: mmsghdr is plain data; all-zero is a valid empty message.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = &mut iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        for s in &socks {
            // SAFETY: msgs point at iov and payload, which outlive the call. Errors
            // (an ICMP error before the path is ready) are ignored: keep sending.
            unsafe { libc::sendmmsg(s.as_raw_fd(), msgs.as_mut_ptr(), BATCH as u32, 0) };
        }
    }
}

/// The running generator.
enum Generator {
    Frames(FrameGenerator),
    Sendmmsg(Proc),
}

impl Generator {
    fn start(load: Load, topo: &Topology, dsts: &[SocketAddrV4]) -> Self {
        match load {
            Load::Frames => {
                let template = Packet::udp(SocketAddrV4::new(CLIENT, FIRST_SOURCE_PORT), dsts[0])
                    .macs(mac(&topo.client, "eth0"), mac(&topo.gateway, "c0"))
                    .payload(&[0x42; PAYLOAD])
                    .no_udp_checksum();
                Generator::Frames(FrameGenerator::start(
                    &topo.client,
                    "eth0",
                    &template,
                    FLOWS,
                    dsts,
                    GEN_CPU,
                ))
            }
            Load::Sendmmsg => {
                let secs = (WARMUP + MEASURE + Duration::from_secs(20)).as_secs_f64();
                let child = topo
                    .client
                    .command(&std::env::current_exe().expect("own path"))
                    .arg("sendmmsg")
                    .arg(secs.to_string())
                    .arg(GEN_CPU.to_string())
                    .args(dsts.iter().map(ToString::to_string))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("starting the sendmmsg generator");
                Generator::Sendmmsg(Proc::from_child(child, "the sendmmsg generator"))
            }
        }
    }

    /// Packets sent so far.
    fn sent(&self, client: &Netns) -> u64 {
        match self {
            Generator::Frames(g) => g.sent(),
            Generator::Sendmmsg(_) => {
                let (packets, dropped) = tx_stats(client, "eth0");
                packets + dropped
            }
        }
    }

    fn assert_running(&mut self) {
        match self {
            Generator::Frames(g) => g.assert_running(),
            Generator::Sendmmsg(p) => p.assert_running(),
        }
    }
}

// ---------------------------------------------------------------------------------
// One run

fn route_yaml() -> String {
    let endpoints: String = (1..=BACKENDS)
        .map(|i| format!("- addresses: [{}]\n", backend_addr(i)))
        .collect();
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: UDPRoute\nmetadata: {{name: bench, namespace: bench}}\n\
         spec:\n  parentRefs: [{{name: shared, namespace: infra, port: {GW_PORT}}}]\n  \
         rules: [{{backendRefs: [{{name: sink, port: 53}}]}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: sink, namespace: bench}}\n\
         spec: {{ports: [{{name: udp, port: 53, protocol: UDP}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: sink-1, namespace: bench, labels: {{kubernetes.io/service-name: sink}}}}\n\
         addressType: IPv4\nendpoints:\n{endpoints}ports: [{{name: udp, port: {BACKEND_PORT}, protocol: UDP}}]\n"
    )
}

/// Sets the gateway up for `mode`. For Berth, returns the daemon and its directories,
/// to drop (kill, unpin) before the topology.
fn configure(mode: Mode, topo: &Topology) -> Option<(Daemon, Dirs)> {
    let gw = &topo.gateway;
    let backend = |i: usize| format!("{}:{BACKEND_PORT}", backend_addr(i));
    match mode {
        Mode::Routing => {}
        Mode::Berth | Mode::BerthKernel => {
            let dirs = Dirs::with_example_files(&["gateway.yaml"]);
            std::fs::write(dirs.manifests.join("bench.yaml"), route_yaml()).expect("write");
            let extra: &[&str] = if mode == Mode::BerthKernel {
                &["--redirect", "never"]
            } else {
                &[]
            };
            let daemon = Daemon::start_with(gw, &topo.gateway_ifaces, &dirs, extra);
            wait_until(
                "the bench route's port and backends in berth",
                Duration::from_secs(20),
                || {
                    daemon.routes(gw).iter().any(|r| {
                        r.name == "bench" && r.port == Some(GW_PORT) && r.backends == BACKENDS
                    })
                },
            );
            return Some((daemon, dirs));
        }
        Mode::IptablesLegacy | Mode::IptablesNft => {
            let cmd = if mode == Mode::IptablesLegacy {
                "iptables-legacy"
            } else {
                "iptables-nft"
            };
            // Rule i takes 1/(remaining) of the new flows: an even split.
            for i in 1..=BACKENDS {
                let (gw_addr, port, to) = (GW.to_string(), GW_PORT.to_string(), backend(i));
                let p = format!("{:.6}", 1.0 / (BACKENDS - i + 1) as f64);
                let mut rule = vec![
                    cmd,
                    "-t",
                    "nat",
                    "-A",
                    "PREROUTING",
                    "-d",
                    &gw_addr,
                    "-p",
                    "udp",
                    "--dport",
                    &port,
                ];
                if i < BACKENDS {
                    rule.extend(["-m", "statistic", "--mode", "random", "--probability", &p]);
                }
                rule.extend(["-j", "DNAT", "--to-destination", &to]);
                gw.exec(&rule);
            }
        }
        Mode::Ipvs => {
            // IPVS answers addresses of this host: put the gateway address on lo.
            gw.ip(&["addr", "add", &format!("{GW}/32"), "dev", "lo"]);
            let vip = format!("{GW}:{GW_PORT}");
            gw.exec(&["ipvsadm", "-A", "-u", &vip, "-s", "rr"]);
            for i in 1..=BACKENDS {
                gw.exec(&["ipvsadm", "-a", "-u", &vip, "-r", &backend(i), "-m"]);
            }
        }
        Mode::Nftables => {
            let map: Vec<String> = (1..=BACKENDS)
                .map(|i| format!("{} : {}", i - 1, backend_addr(i)))
                .collect();
            gw.exec(&[
                "nft",
                &format!(
                    "add table ip berth_bench; \
                     add chain ip berth_bench pre {{ type nat hook prerouting priority dstnat; }}; \
                     add rule ip berth_bench pre ip daddr {GW} udp dport {GW_PORT} \
                     dnat to numgen random mod {BACKENDS} map {{ {} }} : {BACKEND_PORT}",
                    map.join(", ")
                ),
            ]);
        }
    }
    None
}

/// An interface's MAC address.
fn mac(ns: &Netns, dev: &str) -> [u8; 6] {
    let out = ns.ip(&["-j", "link", "show", "dev", dev]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    let text = v[0]["address"].as_str().unwrap_or_default();
    let mut mac = [0u8; 6];
    for (b, part) in mac.iter_mut().zip(text.split(':')) {
        *b = u8::from_str_radix(part, 16).unwrap_or_else(|_| panic!("MAC {text}"));
    }
    mac
}

/// A veth's transmit counters: (packets, dropped because the peer's ring was full).
fn tx_stats(ns: &Netns, dev: &str) -> (u64, u64) {
    let out = ns.ip(&["-s", "-j", "link", "show", "dev", dev]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    let tx = &v[0]["stats64"]["tx"];
    (
        tx["packets"].as_u64().unwrap_or_default(),
        tx["dropped"].as_u64().unwrap_or_default(),
    )
}

fn napi_threads() -> HashSet<(u32, String)> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            let comm = comm.trim();
            comm.starts_with("napi/").then(|| (pid, comm.to_string()))
        })
        .collect()
}

/// Real-time priority of the NAPI threads: above every ordinary task, as softirq
/// processing (where NAPI runs when not threaded) is.
const NAPI_PRIORITY: i32 = 50;

/// Turns on threaded NAPI for `iface` in `ns`, pins its thread to `cpu` and gives it
/// `NAPI_PRIORITY` (SCHED_FIFO); returns its PID.
fn threaded_napi(ns: &Netns, iface: &str, cpu: usize) -> u32 {
    let before = napi_threads();
    ns.exec(&[
        "sh",
        "-c",
        &format!("echo 1 > /sys/class/net/{iface}/threaded"),
    ]);
    let prefix = format!("napi/{iface}-");
    let new: Vec<u32> = napi_threads()
        .difference(&before)
        .filter(|(_, comm)| comm.starts_with(&prefix))
        .map(|(pid, _)| *pid)
        .collect();
    assert!(
        new.len() == 1,
        "expected one new NAPI thread for {iface} in {}, found {new:?} (threaded NAPI needs a veth with GRO or XDP)",
        ns.name
    );
    pin(new[0], cpu);
    let param = libc::sched_param {
        sched_priority: NAPI_PRIORITY,
    };
    // SAFETY: plain syscall on a thread we just found; param outlives it.
    let rc = unsafe { libc::sched_setscheduler(new[0] as i32, libc::SCHED_FIFO, &param) };
    assert_eq!(
        rc,
        0,
        "SCHED_FIFO for {iface}'s NAPI thread: {}",
        std::io::Error::last_os_error()
    );
    new[0]
}

/// Run time of a thread so far, nanoseconds.
fn run_ns(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/schedstat: {e}"));
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("schedstat")
}

/// A counter read with the moment it was read (the middle of the read).
#[derive(Clone, Copy)]
struct Reading {
    value: u64,
    at: Instant,
}

fn read(f: impl FnOnce() -> u64) -> Reading {
    let t0 = Instant::now();
    let value = f();
    let t1 = Instant::now();
    Reading {
        value,
        at: t0 + (t1 - t0) / 2,
    }
}

fn rate(a: Reading, b: Reading) -> f64 {
    (b.value - a.value) as f64 / (b.at - a.at).as_secs_f64()
}

struct Snapshot {
    sent: Reading,
    delivered: Reading,
    gateway_ns: Reading,
    /// Run time of the backends' NAPI threads.
    backends_ns: u64,
    /// Dropped at the gateway's receive ring (the gateway fell behind).
    ingress_drops: u64,
    /// Dropped at the backends' receive rings (a backend fell behind).
    backend_drops: u64,
}

/// One measured run.
#[derive(Clone, Copy, Default)]
struct Run {
    sent_pps: f64,
    delivered_pps: f64,
    loss: f64,
    gateway_ns_per_packet: f64,
    gateway_busy: f64,
    /// The backends' CPU per delivered packet (not the gateway's; for reference).
    backend_ns_per_packet: f64,
    /// Share of the sent packets dropped at the gateway's receive ring.
    ingress_drop: f64,
    /// Share of the sent packets dropped at the backends' receive rings.
    backend_drop: f64,
}

fn measure(mode: Mode, load: Load) -> Run {
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

// ---------------------------------------------------------------------------------
// Report

struct Row {
    mode: Mode,
    /// Why it did not run.
    unavailable: Option<String>,
    runs: Vec<Run>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl Row {
    fn stat(&self, f: impl Fn(&Run) -> f64) -> Option<Stat> {
        if self.runs.is_empty() {
            return None;
        }
        let v: Vec<f64> = self.runs.iter().map(f).collect();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((median(v), lo, hi))
    }
    fn pps(&self) -> Option<f64> {
        self.stat(|r| r.delivered_pps).map(|s| s.0)
    }
    fn ns(&self) -> Option<f64> {
        self.stat(|r| r.gateway_ns_per_packet).map(|s| s.0)
    }
    /// (delivered pps ratio, gateway CPU ratio) against `reference`: both > 1 when this
    /// mode is better (more packets, fewer ns per packet).
    fn ratio(&self, reference: &Row) -> Option<(f64, f64)> {
        Some((self.pps()? / reference.pps()?, reference.ns()? / self.ns()?))
    }
}

fn table(rows: &[Row]) -> String {
    let mut t = String::new();
    let _ = write!(
        t,
        "{:<16} {:>9} {:>9} {:>7} {:>9} {:>6}",
        "mode", "dlv kpps", "sent kpps", "loss %", "gw ns/pkt", "gw %"
    );
    for r in REFERENCES {
        let _ = write!(t, "  {:>19}", format!("vs {}", r.name()));
    }
    t.push('\n');
    for row in rows {
        let _ = write!(t, "{:<16} ", row.mode.name());
        if let Some(why) = row.unavailable.as_ref().filter(|_| row.runs.is_empty()) {
            let _ = writeln!(t, "{why}");
            continue;
        }
        let m = |f: fn(&Run) -> f64| row.stat(f).map(|s| s.0).unwrap_or(f64::NAN);
        let _ = write!(
            t,
            "{:>9.1} {:>9.1} {:>7.1} {:>9.0} {:>6.0}",
            m(|r| r.delivered_pps) / 1e3,
            m(|r| r.sent_pps) / 1e3,
            m(|r| r.loss) * 100.0,
            m(|r| r.gateway_ns_per_packet),
            m(|r| r.gateway_busy) * 100.0,
        );
        for reference in REFERENCES {
            let cell = rows
                .iter()
                .find(|r| r.mode == reference)
                .and_then(|r| row.ratio(r))
                .map(|(p, c)| format!("pps {p:.2}x cpu {c:.2}x"))
                .unwrap_or_else(|| "-".into());
            let _ = write!(t, "  {cell:>19}");
        }
        t.push('\n');
    }
    t
}

fn json_line(rows: &[Row], load: Load, chart: &Path) -> Value {
    let modes: Vec<Value> = rows
        .iter()
        .map(|row| {
            let Some((pps, pps_lo, pps_hi)) = row.stat(|r| r.delivered_pps) else {
                return json!({
                    "mode": row.mode.name(),
                    "available": false,
                    "reason": row.unavailable,
                });
            };
            let med = |f: fn(&Run) -> f64| row.stat(f).map(|s| s.0).unwrap_or(f64::NAN);
            let mut ratios = serde_json::Map::new();
            for reference in REFERENCES {
                if let Some((p, c)) = rows
                    .iter()
                    .find(|r| r.mode == reference)
                    .and_then(|r| row.ratio(r))
                {
                    ratios.insert(format!("pps_vs_{}", reference.name()), json!(round(p, 3)));
                    ratios.insert(format!("cpu_vs_{}", reference.name()), json!(round(c, 3)));
                }
            }
            json!({
                "mode": row.mode.name(),
                "available": true,
                "delivered_pps": pps.round(),
                "delivered_pps_min": pps_lo.round(),
                "delivered_pps_max": pps_hi.round(),
                "sent_pps": med(|r| r.sent_pps).round(),
                "loss": round(med(|r| r.loss), 4),
                "gateway_ns_per_packet": round(med(|r| r.gateway_ns_per_packet), 1),
                "gateway_busy": round(med(|r| r.gateway_busy), 3),
                "gateway_pps_per_core": (1e9 / med(|r| r.gateway_ns_per_packet)).round(),
                "backend_ns_per_packet": round(med(|r| r.backend_ns_per_packet), 1),
                "dropped_at_gateway_ring": round(med(|r| r.ingress_drop), 4),
                "dropped_at_backend_rings": round(med(|r| r.backend_drop), 4),
                "runs": row.runs.len(),
                "ratios": ratios,
            })
        })
        .collect();
    json!({
        "bench": "e2e",
        "load": load.name(),
        "flows": FLOWS,
        "frame_bytes": 64,
        "backends": BACKENDS,
        "warmup_s": WARMUP.as_secs_f64(),
        "measure_s": MEASURE.as_secs_f64(),
        "repetitions": REPS,
        "statistic": "median",
        "gateway_cpu_accounting": ACCOUNTING,
        "ratios_mean": "pps_vs_X = delivered pps / X's; cpu_vs_X = X's gateway ns per packet / this mode's",
        "modes": modes,
        "chart": chart.display().to_string(),
    })
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

// ---------------------------------------------------------------------------------
// Chart (hand-written SVG)

fn color(mode: Mode) -> &'static str {
    match mode {
        Mode::Routing => "#9ca3af",
        Mode::Berth => "#2563eb",
        Mode::BerthKernel => "#60a5fa",
        Mode::IptablesLegacy => "#f59e0b",
        Mode::IptablesNft => "#ef4444",
        Mode::Ipvs => "#a855f7",
        Mode::Nftables => "#10b981",
    }
}

/// A round axis step giving about five ticks up to `max`.
fn nice_step(max: f64) -> f64 {
    let raw = (max / 5.0).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Median, minimum and maximum.
type Stat = (f64, f64, f64);

struct Panel<'a> {
    x: f64,
    title: &'a str,
    unit: &'a str,
    /// (median, min, max) per row, in the panel's unit.
    value: &'a dyn Fn(&Row) -> Option<Stat>,
    decimals: usize,
    /// Two short lines written at the foot of a bar.
    label: &'a dyn Fn(&Row) -> Option<[String; 2]>,
}

/// A gateway busier than this share is taken as saturated (SCHED_FIFO threads get at
/// most 95% of a CPU).
const UNSATURATED: f64 = 0.85;

const PLOT_TOP: f64 = 120.0;
const PLOT_H: f64 = 300.0;
const PLOT_W: f64 = 420.0;

fn panel(svg: &mut String, rows: &[Row], p: &Panel) {
    let values: Vec<Option<Stat>> = rows.iter().map(|r| (p.value)(r)).collect();
    let max = values
        .iter()
        .flatten()
        .map(|v| v.2)
        .fold(0.0, f64::max)
        .max(1e-9);
    let step = nice_step(max * 1.1);
    let top = (max * 1.1 / step).ceil() * step;
    let y = |v: f64| PLOT_TOP + PLOT_H - v / top * PLOT_H;
    let bottom = PLOT_TOP + PLOT_H;
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        p.x + PLOT_W / 2.0,
        PLOT_TOP - 22.0,
        escape(p.title)
    );
    let mut tick = 0.0;
    while tick <= top + step / 2.0 {
        let ty = y(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{:.1}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#e5e7eb"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11" fill="#374151">{}</text>"##,
            p.x,
            p.x + PLOT_W,
            p.x - 6.0,
            ty + 4.0,
            fmt_tick(tick, step)
        );
        tick += step;
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{x:.1}" y1="{PLOT_TOP}" x2="{x:.1}" y2="{bottom}" stroke="#111827"/><line x1="{x:.1}" y1="{bottom}" x2="{:.1}" y2="{bottom}" stroke="#111827"/>"##,
        p.x + PLOT_W,
        x = p.x
    );
    let (cx, cy) = (p.x - 48.0, PLOT_TOP + PLOT_H / 2.0);
    let _ = writeln!(
        svg,
        r##"<text x="{cx:.1}" y="{cy:.1}" transform="rotate(-90 {cx:.1} {cy:.1})" text-anchor="middle" font-size="12" fill="#374151">{}</text>"##,
        escape(p.unit)
    );
    let slot = PLOT_W / rows.len() as f64;
    let bar = slot * 0.62;
    for (i, (row, v)) in rows.iter().zip(&values).enumerate() {
        let mid = p.x + slot * (i as f64 + 0.5);
        let name = row.mode.name();
        let (first, second) = name.split_once('-').unwrap_or((name, ""));
        let _ = writeln!(
            svg,
            r##"<text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="12" fill="#111827">{first}</text><text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="12" fill="#111827">{second}</text>"##,
            bottom + 16.0,
            bottom + 30.0
        );
        let Some((med, lo, hi)) = *v else {
            let _ = writeln!(
                svg,
                r##"<rect x="{:.1}" y="{:.1}" width="{bar:.1}" height="60" fill="none" stroke="#9ca3af" stroke-dasharray="4 3"/><text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="11" fill="#6b7280">n/a</text>"##,
                mid - bar / 2.0,
                bottom - 60.0,
                bottom - 34.0
            );
            continue;
        };
        let _ = writeln!(
            svg,
            r#"<rect x="{:.1}" y="{:.1}" width="{bar:.1}" height="{:.1}" fill="{}"><title>{name}: {med:.*} {}</title></rect>"#,
            mid - bar / 2.0,
            y(med),
            bottom - y(med),
            color(row.mode),
            p.decimals,
            escape(p.unit)
        );
        if hi > lo {
            let _ = writeln!(
                svg,
                r##"<path d="M{mid:.1} {:.1}V{:.1}M{:.1} {:.1}h8M{:.1} {:.1}h8" stroke="#111827" stroke-width="1.2"/>"##,
                y(hi),
                y(lo),
                mid - 4.0,
                y(hi),
                mid - 4.0,
                y(lo)
            );
        }
        let _ = writeln!(
            svg,
            r##"<text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="12" font-weight="bold" fill="#111827">{med:.*}</text>"##,
            y(hi.max(med)) - 6.0,
            p.decimals
        );
        if let Some([a, b]) = (p.label)(row).filter(|_| bottom - y(med) > 34.0) {
            let _ = writeln!(
                svg,
                r##"<text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="10" fill="white">{}</text><text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="10" fill="white">{}</text>"##,
                bottom - 18.0,
                escape(&a),
                bottom - 6.0,
                escape(&b)
            );
        }
    }
}

fn fmt_tick(v: f64, step: f64) -> String {
    if step.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn chart(rows: &[Row], load: Load, headline: &str) -> String {
    let (w, h) = (1040.0, 530.0);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="{:.1}" y="30" text-anchor="middle" font-size="20" font-weight="bold" fill="#111827">One gateway, the same UDP load: Berth's XDP datapath vs kernel NAT</text>
<text x="{:.1}" y="54" text-anchor="middle" font-size="13" fill="#374151">{FLOWS} flows of 64-byte UDP frames ({} load), client → gateway → {BACKENDS} backends over veth; median of {REPS} runs of {}s (whiskers: min–max)</text>
<text x="{:.1}" y="74" text-anchor="middle" font-size="13" font-weight="bold" fill="#1d4ed8">{}</text>"##,
        w / 2.0,
        w / 2.0,
        load.name(),
        MEASURE.as_secs(),
        w / 2.0,
        escape(headline)
    );
    panel(
        &mut svg,
        rows,
        &Panel {
            x: 80.0,
            title: "Delivered packets per second (higher is better)",
            unit: "kpps at the backends",
            value: &|r: &Row| {
                r.stat(|x| x.delivered_pps)
                    .map(|(m, lo, hi)| (m / 1e3, lo / 1e3, hi / 1e3))
            },
            decimals: 0,
            label: &|r: &Row| {
                r.stat(|x| x.gateway_busy)
                    .map(|(b, _, _)| ["busy".into(), format!("{:.0}%", b * 100.0)])
            },
        },
    );
    panel(
        &mut svg,
        rows,
        &Panel {
            x: 590.0,
            title: "Gateway CPU per packet (lower is better)",
            unit: "ns of gateway CPU per delivered packet",
            value: &|r: &Row| r.stat(|x| x.gateway_ns_per_packet),
            decimals: 0,
            label: &|_| None,
        },
    );
    let mut notes: Vec<String> = rows
        .iter()
        .filter(|r| r.runs.is_empty())
        .filter_map(|r| {
            r.unavailable
                .as_ref()
                .map(|why| format!("{}: {why}", r.mode.name()))
        })
        .collect();
    let unsaturated: Vec<&str> = rows
        .iter()
        .filter(|r| {
            r.stat(|x| x.gateway_busy)
                .is_some_and(|b| b.0 < UNSATURATED)
        })
        .map(|r| r.mode.name())
        .collect();
    if !unsaturated.is_empty() {
        notes.push(format!(
            "{}: gateway not saturated (CPU 0, shared by the generator and the backends, was the limit)",
            unsaturated.join(", ")
        ));
    }
    let notes = notes.join("; ");
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11" fill="#4b5563">Gateway CPU = run time of its threaded-NAPI kernel thread (receive, forwarding/NAT, transmit; own CPU) ÷ delivered packets; busy = its share of that CPU.</text>
<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11" fill="#4b5563">{}</text>
</svg>"##,
        w / 2.0,
        h - 44.0,
        w / 2.0,
        h - 26.0,
        escape(&notes)
    );
    svg
}

/// Berth against the kernel NAT references, e.g. "Berth vs iptables-legacy,
/// iptables-nft, nftables: 3.4x the packets per second, 4.4-4.5x less gateway CPU per
/// packet".
fn headline(rows: &[Row]) -> String {
    let find = |m: Mode| rows.iter().find(|r| r.mode == m);
    let Some(berth) = find(Mode::Berth) else {
        return String::new();
    };
    let (mut names, mut pps, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    for m in REFERENCES {
        if let Some((p, c)) = find(m).and_then(|r| berth.ratio(r)) {
            names.push(m.name());
            pps.push(p);
            cpu.push(c);
        }
    }
    if names.is_empty() {
        return String::new();
    }
    let range = |v: &[f64]| {
        let lo = format!("{:.1}", v.iter().copied().fold(f64::INFINITY, f64::min));
        let hi = format!("{:.1}", v.iter().copied().fold(f64::NEG_INFINITY, f64::max));
        if lo == hi {
            format!("{lo}x")
        } else {
            format!("{lo}-{hi}x")
        }
    };
    format!(
        "Berth vs {}: {} the packets per second, {} less gateway CPU per packet",
        names.join(", "),
        range(&pps),
        range(&cpu)
    )
}

fn chart_path() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    // target/<profile>/berth-bench-e2e → target/bench/e2e.svg
    let target = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("bench").join("e2e.svg")
}

const USAGE: &str = "usage: berth-bench-e2e [--load xdp-live-frames|sendmmsg] [MODE...]
  MODE: routing berth-xdp iptables-legacy iptables-nft ipvs nftables (default: all)";

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("sendmmsg") {
        sendmmsg_generator(&args[1..]);
        return;
    }
    let mut load = Load::Frames;
    if let Some(i) = args.iter().position(|a| a == "--load") {
        load = match args.get(i + 1).map(String::as_str) {
            Some("xdp-live-frames") => Load::Frames,
            Some("sendmmsg") => Load::Sendmmsg,
            _ => {
                eprintln!("{USAGE}");
                std::process::exit(2);
            }
        };
        args.drain(i..i + 2);
    }
    if let Some(bad) = args.iter().find(|a| MODES.iter().all(|m| m.name() != *a)) {
        eprintln!("unknown mode {bad}\n{USAGE}");
        std::process::exit(2);
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cpus >= 2,
        "the benchmark needs 2 CPUs (generator and backends, gateway); this machine has {cpus}"
    );
    let mut rows: Vec<Row> = MODES
        .iter()
        .filter(|m| args.is_empty() || args.iter().any(|a| a == m.name()))
        .map(|&mode| Row {
            mode,
            unavailable: mode.unavailable(),
            runs: Vec::new(),
        })
        .collect();
    println!(
        "e2e: {FLOWS} UDP flows of 64-byte frames ({} load), client -> gateway -> {BACKENDS} backends over veth; \
         {}s warm-up + {}s per run, {REPS} rounds, medians",
        load.name(),
        WARMUP.as_secs(),
        MEASURE.as_secs()
    );
    println!("gateway CPU accounting: {ACCOUNTING}");
    for row in &rows {
        println!("  {:<16} {}", row.mode.name(), row.mode.what());
    }
    for round in 1..=REPS {
        for row in rows.iter_mut().filter(|r| r.unavailable.is_none()) {
            let mode = row.mode;
            let started = Instant::now();
            match std::panic::catch_unwind(|| measure(mode, load)) {
                Ok(run) => {
                    eprintln!(
                        "round {round} {:<16} {:>7.1} kpps delivered, {:>7.1} kpps sent, gateway {:>5.0} ns/pkt busy {:>3.0}%, \
                         backends {:>4.0} ns/pkt; dropped at the gateway's ring {:.1}%, at the backends' {:.1}% ({:.1}s)",
                        mode.name(),
                        run.delivered_pps / 1e3,
                        run.sent_pps / 1e3,
                        run.gateway_ns_per_packet,
                        run.gateway_busy * 100.0,
                        run.backend_ns_per_packet,
                        run.ingress_drop * 100.0,
                        run.backend_drop * 100.0,
                        started.elapsed().as_secs_f64()
                    );
                    row.runs.push(run);
                }
                Err(_) => {
                    eprintln!("round {round} {}: failed (see above)", mode.name());
                    if row.runs.is_empty() {
                        row.unavailable = Some("failed: see the benchmark's error output".into());
                    }
                }
            }
        }
    }
    let headline = headline(&rows);
    let path = chart_path();
    std::fs::create_dir_all(path.parent().expect("chart dir")).expect("creating target/bench");
    std::fs::write(&path, chart(&rows, load, &headline)).expect("writing the chart");
    println!();
    print!("{}", table(&rows));
    println!(
        "ratios: pps = delivered pps / the reference's; cpu = the reference's gateway ns per packet / this mode's (> 1: better)"
    );
    if !headline.is_empty() {
        println!("{headline}");
    }
    println!("chart: {}", path.display());
    println!("{}", json_line(&rows, load, &path));
}
