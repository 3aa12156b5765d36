//! `cargo xtask bench e2e` (root): the same UDP load through the same namespace
//! topology (client → gateway → 2 backends, `topo::Topology`, built afresh for every
//! run) with the gateway doing its job in turn by plain routing (no NAT, the baseline:
//! the client sends straight to the backends' addresses), Berth's XDP datapath (the
//! real `berth run` on a generated manifest directory), iptables DNAT (legacy and nft
//! back ends), IPVS and nftables DNAT; and in source-NAT mode, Berth's SNAT (the
//! datapath applied with the service source-NATed by `berth-dp-loader`, the daemon's own
//! API) against its netfilter equivalent, iptables DNAT in PREROUTING + MASQUERADE in
//! POSTROUTING toward the backends. For the two SNAT modes the backends have no default
//! route (nothing in them routes via the gateway; as the sinks never answer, this shows
//! only that nothing the benchmark needs depends on it). Modes take turns, `REPS` rounds of `WARMUP` +
//! `MEASURE`; medians are reported as a table per load and topology, an SVG chart
//! (`target/bench/e2e.svg`, a section each) and, last, one JSON line (its rows carry
//! `backends`, the topology's name).
//!
//! Topologies (`--backends xdp|veth|bridge|all`, default all, each with rows of its own,
//! labelled `MODE@TOPOLOGY`, `MODE@TOPOLOGY/v6` in IPv6): the client's link to the gateway (`c0`) is the same in all
//! (GRO on, as a NIC takes frames); the backends' differ. `xdp`: a veth each, GRO on,
//! the XDP sink on the backend's end, so the gateway's end takes redirected XDP frames
//! (every mode runs). `veth`: a veth each as the kernel makes it (GRO off, no XDP on
//! either end), the backend's end in its namespace as a Kubernetes pod's. `bridge`: the
//! same veths as ports of bridge `cni0` in the gateway's namespace, which holds the
//! gateway's address toward the backends (one subnet), as a CNI bridge (flannel's,
//! kindnet's). On those two no backend interface takes XDP frames, as users have them:
//! Berth runs on `c0` only, the sink counts at TC ingress, and the modes are routing,
//! berth-xdp (`berth run`, `--redirect auto`), berth-kernel and iptables-nft; their
//! headlines are Berth against iptables-nft and Berth's gateway CPU against routing's.
//!
//! Address families (`--family 4|6|both`, default 4): the same loads over IPv4 or IPv6
//! or both, in the same run (every link of the topology carries both, `topo::mirror6`;
//! IPv6 sections follow their IPv4 twins and take turns with them). In IPv6 the client
//! sends to the gateway's fd00:251::100 (routing: to the backends' IPv6 addresses);
//! Berth serves the same route there (the Gateway made dual-stack, the route's
//! EndpointSlice of `addressType: IPv6`), iptables DNAT becomes ip6tables (legacy and
//! nft back ends), nftables' table the `ip6` family; the SNAT modes and IPVS run in
//! IPv4 only. Frames are 80 bytes (84 with the FCS): the IPv6 header is 20 bytes
//! longer, the UDP payload the same 18 bytes, and the UDP checksum (which IPv6 cannot
//! leave out) valid in every frame: the generator updates it incrementally for the
//! source port and address it varies. The new-flow load's sources are
//! fd00:250::1-fd00:250::800, routed by the gateway via the client's address (one
//! neighbour entry for all). After the tables, a table of every mode measured in both
//! families (IPv6's gateway ns per packet over IPv4's) and, in the IPv6 sections'
//! headlines and the JSON line (`family` per row, `family_ratios`), Berth's IPv6 cost
//! against its IPv4 cost. Default IPv4 only: `both` nearly doubles the run (6 IPv6
//! modes + 4 per plain topology: ~22 min instead of ~12 for all topologies and modes).
//! Seen on the development VM (2026-12-07, busy; xdp topology, `routing berth-xdp
//! iptables-nft`): Berth's IPv6 cost 1.21x its IPv4 cost under long flows (370 against
//! 306 ns) and 1.37x under new flows (812 against 590); routing 1.02x and 1.12x,
//! iptables-nft 1.45x and 1.13x.
//!
//! Loads (`--flows long|new|both`, default both, each run in every mode): 64-byte
//! frames (18-byte payload, no UDP checksum; IPv6: see above) sent on CPU 0 as fast as it goes, either
//! as 16 long UDP flows (source ports 40000-40015; with several destinations, flows
//! alternate between them), or as a new 5-tuple every packet, as DNS clients make
//! them: the generator's counter picks source port 1024 + n mod 64512, then the next
//! of 2048 source addresses (10.250.0.1-10.250.8.0, which the gateway routes to the
//! client), 132,120,576 tuples before one repeats, more than a run sends (up to ~27
//! million frames were seen, from a sender at 5 Mpps; a run warns if it sent more). Every packet is then a new flow for the gateway: a conntrack
//! miss, an insert, and once the table is full an eviction (Berth's LRU) or an early
//! drop of an unreplied entry (netfilter). That is the steady state this load
//! measures: at these rates the tables fill within the warm-up, as they would under
//! real DNS load (netfilter keeps an unreplied UDP entry 30 s). The tables are the
//! defaults users have: netfilter's `nf_conntrack_max` is the kernel's (262,144 on
//! the 24 GiB development VM, printed with the results and in the JSON line), Berth's
//! is what `berth run` makes (262,144 flows). No state carries over from one run to
//! the next: every run builds its namespaces afresh (netfilter's conntrack and rules
//! go with the gateway's namespace), and Berth's pinned maps are removed when its
//! daemon or loader stops. By default the kernel's own generator makes it
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
//! Counting, the same for every mode: `loadgen::Sink` on each backend's veth counts UDP
//! (over IPv4 or IPv6) and drops it (so nothing answers, not even ICMP): as XDP on the `xdp` topology, at TC
//! ingress (tcx) on the others, where the backends' interfaces take no XDP. Sent =
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
//! (routing, conntrack, NAT) and the transmit into the backend's receive ring. On the
//! `xdp` topology the backends' threads do theirs on CPU 0, next to the generator. On
//! `veth` and `bridge` the backends' veths have no NAPI (no GRO, no XDP): a backend
//! receives in softirq on the sending CPU, inside the gateway's thread (ksoftirqd was
//! seen to take none of it; a kernel with CONFIG_IRQ_TIME_ACCOUNTING, unset on the
//! development VM, would bill it apart), so the gateway's figure includes the backends'
//! receive and their TC sink (a few instructions), and no backend CPU is reported.
//! NAPI threads run
//! SCHED_FIFO, above ordinary tasks as softirq processing is, so other load on the
//! machine delays them less. Gateway CPU = that one thread's run time
//! (`/proc/PID/schedstat`, nanoseconds) over the measurement, divided by the packets
//! delivered meanwhile; its busy share says whether the gateway was the bottleneck.
//! A gateway that is not saturated pays for more sleeps and wake-ups per packet, so an
//! unsaturated mode's figure is if anything too high.
//!
//! Figures seen on the (shared, noisy) 2-CPU development VM: routing ~1.05 µs, netfilter
//! DNAT (any of the three) ~1.25-1.35 µs, Berth ~0.28 µs of gateway CPU per packet.
//! Under the new-flow load (2026-12-03, a busier VM: long flows routing 2.7 µs, DNATs
//! 2.6-2.8, Berth 0.45): routing 2.7 µs, DNATs 6.6-7.2, Berth 2.3, Berth's kernel path
//! 4.9; both SNAT rows collapse (Berth's port pool is exhausted: nothing delivered;
//! MASQUERADE ~7 kpps). A whole run (8 modes x 2 loads x 3 rounds) takes ~5.3 min.
//! Accounted the older way on the same setup (RPS of the gateway's receive to CPU 1,
//! softirq + system time of CPU 1 from /proc/stat) routing reads ~1.3 µs: that also bills
//! the RPS hand-off and whatever else runs on the CPU.

mod baselines;
mod chart;
mod cli;
mod family;
mod measure;
mod profile;
mod report;
mod sendmmsg;
mod topology;

use std::{
    collections::HashSet,
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, UdpSocket},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use berth::datapath::{DesiredState, Protocol, ServiceAddr, WeightedBackend};
use berth_tests::{
    daemon::{Daemon, Dirs, Loader},
    loadgen::{pin, Flows, FrameGenerator, Sink, Template},
    netns::{wait_until, Netns, Proc},
    topo::{bridged_with, Topology, Veth, CLIENT, CLIENT6, DNS_PORT, GW, GW6},
};
use serde_json::{json, Value};

use baselines::*;
use chart::*;
use cli::*;
use family::*;
use measure::*;
use report::*;
use sendmmsg::*;
use topology::*;

const BACKENDS: usize = 2;
const FLOWS: u16 = 16;
const FIRST_SOURCE_PORT: u16 = 40000;
/// The new-flow load's source ports: 1024-65535.
const NEW_FIRST_PORT: u16 = 1024;
/// The new-flow load's source addresses: `NEW_SOURCES` (routed to the client by the
/// gateway), from its first address up.
const NEW_ADDRESSES: u32 = 2048;
/// Where the new-flow load's clients are (10.250.0.1-10.250.8.0 of it).
const NEW_SOURCES: &str = "10.250.0.0/16";
/// The first of them.
const NEW_FIRST_SOURCE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// 14 (Ethernet) + 20 (IPv4) + 8 (UDP) + 18 = 60 bytes: a 64-byte frame with its FCS.
const PAYLOAD: usize = 18;
/// The port the UDPRoute asks for (and the NAT rules match).
const GW_PORT: u16 = 30053;
/// Where the backends receive.
const BACKEND_PORT: u16 = DNS_PORT;
const WARMUP: Duration = Duration::from_secs(1);
const MEASURE: Duration = Duration::from_secs(4);
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
    /// The frame generator's frames from an `AF_PACKET` socket.
    PacketSocket,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Frames => "xdp-live-frames",
            Load::Sendmmsg => "sendmmsg",
            Load::PacketSocket => "af-packet",
        }
    }
}

/// Which 5-tuples the load has.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FlowLoad {
    /// `FLOWS` long flows.
    Long,
    /// A new 5-tuple every packet.
    New,
}

impl FlowLoad {
    fn name(self) -> &'static str {
        match self {
            FlowLoad::Long => "long",
            FlowLoad::New => "new",
        }
    }

    fn what(self) -> String {
        let f = self.flows();
        match self {
            FlowLoad::Long => format!("{FLOWS} long UDP flows"),
            FlowLoad::New => format!(
                "a new UDP 5-tuple every packet ({} source ports x {} source addresses: {} tuples before one repeats)",
                f.ports,
                f.addresses,
                f.tuples()
            ),
        }
    }

    /// A short title (the chart's).
    fn title(self) -> String {
        match self {
            FlowLoad::Long => format!("{FLOWS} long flows"),
            FlowLoad::New => "a new 5-tuple every packet (DNS-style)".into(),
        }
    }

    fn source(self, family: Family) -> IpAddr {
        match self {
            FlowLoad::Long => family.client(),
            FlowLoad::New => family.new_first_source(),
        }
    }

    fn first_port(self) -> u16 {
        match self {
            FlowLoad::Long => FIRST_SOURCE_PORT,
            FlowLoad::New => NEW_FIRST_PORT,
        }
    }

    fn flows(self) -> Flows {
        match self {
            FlowLoad::Long => Flows {
                ports: u32::from(FLOWS),
                addresses: 1,
            },
            FlowLoad::New => Flows {
                ports: (1 << 16) - u32::from(NEW_FIRST_PORT),
                addresses: NEW_ADDRESSES,
            },
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
    /// Berth with the service source-NATed (`berth-dp-loader`).
    BerthSnat,
    /// iptables-nft DNAT + MASQUERADE toward the backends.
    IptablesMasq,
}

const MODES: [Mode; 9] = [
    Mode::Routing,
    Mode::Berth,
    Mode::BerthKernel,
    Mode::IptablesLegacy,
    Mode::IptablesNft,
    Mode::Ipvs,
    Mode::Nftables,
    Mode::BerthSnat,
    Mode::IptablesMasq,
];

/// The references every mode is compared with (ratio columns).
const REFERENCES: [Mode; 5] = [
    Mode::IptablesLegacy,
    Mode::IptablesNft,
    Mode::Ipvs,
    Mode::Nftables,
    Mode::IptablesMasq,
];

/// What the headline compares: Berth in router mode with the kernel's DNAT, Berth in
/// SNAT mode with the kernel's DNAT + MASQUERADE.
const HEADLINES: [(Mode, &str, &[Mode]); 2] = [
    (
        Mode::Berth,
        "Berth",
        &[
            Mode::IptablesLegacy,
            Mode::IptablesNft,
            Mode::Ipvs,
            Mode::Nftables,
        ],
    ),
    (Mode::BerthSnat, "Berth SNAT", &[Mode::IptablesMasq]),
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
            Mode::BerthSnat => "berth-snat",
            Mode::IptablesMasq => "iptables-masq",
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
            Mode::BerthSnat => "berth-dp-loader, XDP DNAT + SNAT to the node address + redirect",
            Mode::IptablesMasq => "iptables-nft PREROUTING DNAT + POSTROUTING MASQUERADE",
        }
    }

    /// Whether netfilter's conntrack keeps the mode's flows.
    fn netfilter(self) -> bool {
        matches!(
            self,
            Mode::IptablesLegacy | Mode::IptablesNft | Mode::Nftables | Mode::IptablesMasq
        )
    }

    /// Why the mode cannot run here in `family`, if it cannot.
    fn unavailable(self, family: Family) -> Option<String> {
        if self == Mode::Ipvs && !Path::new("/proc/net/ip_vs").exists() {
            return Some("unavailable: kernel built without IPVS (CONFIG_IP_VS unset)".into());
        }
        let tool = match self {
            Mode::IptablesLegacy => family.iptables("iptables-legacy"),
            Mode::IptablesNft | Mode::IptablesMasq => family.iptables("iptables-nft"),
            Mode::Ipvs => "ipvsadm".into(),
            Mode::Nftables => "nft".into(),
            _ => return None,
        };
        let tool = tool.as_str();
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

/// One load's rows on one topology, in one address family.
struct Section {
    backends: Backends,
    flows: FlowLoad,
    family: Family,
    rows: Vec<Row>,
}

impl Section {
    /// The load and the topology, e.g. `long@veth` (`long@veth/v6` in IPv6).
    fn name(&self) -> String {
        format!(
            "{}@{}{}",
            self.flows.name(),
            self.backends.name(),
            self.family.suffix()
        )
    }
}

fn print_header(sections: &[Section], load: Load) {
    println!(
        "e2e: {} UDP frames ({} load), client -> gateway -> {BACKENDS} backends over veth; \
         {}s warm-up + {}s per run, {REPS} rounds, medians",
        frame_sizes(sections),
        load.name(),
        WARMUP.as_secs(),
        MEASURE.as_secs()
    );
    let mut seen = Vec::new();
    for s in sections {
        if !seen.contains(&s.flows.name()) {
            seen.push(s.flows.name());
            println!("flows {:<4}: {}", s.flows.name(), s.flows.what());
        }
    }
    let mut families: Vec<Family> = Vec::new();
    for s in sections {
        if !families.contains(&s.family) {
            families.push(s.family);
            println!("family {}: {}", s.family.name(), s.family.what());
        }
    }
    let mut topologies: Vec<Backends> = sections.iter().map(|s| s.backends).collect();
    topologies.dedup();
    for b in &topologies {
        println!("backends {:<6}: {}", b.name(), b.what());
        println!("  gateway CPU accounting: {}", b.accounting());
    }
    let mut modes: Vec<Mode> = Vec::new();
    for row in sections.iter().flat_map(|s| &s.rows) {
        if !modes.contains(&row.mode) {
            modes.push(row.mode);
            println!("  {:<16} {}", row.mode.name(), row.mode.what());
        }
    }
}

/// Measures every row `REPS` times, the modes taking turns.
fn run_rounds(sections: &mut [Section], load: Load, profile: Option<&std::path::Path>) {
    for round in 1..=REPS {
        for section in sections.iter_mut() {
            let (backends, flows, family) = (section.backends, section.flows, section.family);
            for row in section.rows.iter_mut().filter(|r| r.unavailable.is_none()) {
                let mode = row.mode;
                let started = Instant::now();
                // Each row is profiled once, after its first measurement.
                let profile = profile.filter(|_| round == 1).map(|dir| {
                    let topology = backends.name();
                    let (flows, family, mode) = (flows.name(), family.name(), mode.name());
                    dir.join(format!("{mode}@{topology}-{flows}-{family}"))
                });
                let run = || measure(mode, backends, load, flows, family, profile.as_deref());
                match std::panic::catch_unwind(run) {
                    Ok(run) => {
                        eprintln!(
                            "round {round} {:<4} {}{} ({:.1}s)",
                            flows.name(),
                            run_line(row, &run),
                            conntrack_note(mode, &run),
                            started.elapsed().as_secs_f64()
                        );
                        row.runs.push(run);
                    }
                    Err(_) => {
                        eprintln!(
                            "round {round} {} {}: failed (see above)",
                            flows.name(),
                            row.label()
                        );
                        if row.runs.is_empty() {
                            row.unavailable =
                                Some("failed: see the benchmark's error output".into());
                        }
                    }
                }
            }
        }
    }
}

/// One run's figures, for the progress lines.
fn run_line(row: &Row, run: &Run) -> String {
    let backends = if run.backend_ns_per_packet.is_finite() {
        format!("{:>4.0} ns/pkt", run.backend_ns_per_packet)
    } else {
        "in the gateway's".into()
    };
    format!(
        "{:<26} {:>7.1} kpps delivered, {:>7.1} kpps sent, gateway {:>5.0} ns/pkt busy {:>3.0}%, \
         backends {backends}; dropped at the gateway's ring {:.1}%, at the backends' {:.1}%",
        row.label(),
        run.delivered_pps / 1e3,
        run.sent_pps / 1e3,
        run.gateway_ns_per_packet,
        run.gateway_busy * 100.0,
        run.ingress_drop * 100.0,
        run.backend_drop * 100.0,
    )
}

/// `, conntrack N/MAX` for a netfilter mode.
fn conntrack_note(mode: Mode, run: &Run) -> String {
    match (mode.netfilter(), run.conntrack_entries, run.conntrack_max) {
        (true, Some(n), Some(max)) => format!(", conntrack {n}/{max}"),
        _ => String::new(),
    }
}

fn print_report(sections: &[Section], load: Load) {
    let headlines: Vec<Vec<String>> = sections.iter().map(|s| headline(s, sections)).collect();
    let path = chart_path();
    std::fs::create_dir_all(path.parent().expect("chart dir")).expect("creating target/bench");
    std::fs::write(&path, chart(sections, load, &headlines)).expect("writing the chart");
    for (section, headline) in sections.iter().zip(&headlines) {
        println!();
        println!(
            "flows {}, backends {}, {}: {}",
            section.flows.name(),
            section.backends.name(),
            section.family.name(),
            section.flows.what()
        );
        print!("{}", table(&section.rows));
        for line in headline {
            println!("{line}");
        }
    }
    println!(
        "ratios: pps = delivered pps / the reference's; cpu = the reference's gateway ns per packet / this mode's (> 1: better)"
    );
    let summary = summary(sections);
    if !summary.is_empty() {
        println!();
        print!("{summary}");
    }
    let families = family_table(sections);
    if !families.is_empty() {
        println!();
        println!("IPv6 against IPv4 (gateway CPU per delivered packet, medians):");
        print!("{families}");
    }
    if let Some(max) = conntrack_max(sections) {
        println!("netfilter's conntrack table: nf_conntrack_max {max} (the kernel's default here)");
    }
    println!("chart: {}", path.display());
    println!("{}", json_line(sections, load, &path));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("sendmmsg") {
        sendmmsg_generator(&args[1..]);
        return;
    }
    let args = parse_args(args);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cpus >= 2,
        "the benchmark needs 2 CPUs (generator and backends, gateway); this machine has {cpus}"
    );
    let _alone = alone();
    if args.load == Load::Frames {
        if let Err(e) = berth_tests::loadgen::live_frames() {
            eprintln!(
                "the frame generator needs BPF_PROG_TEST_RUN with live frames, which this \
                 kernel refuses ({e}); use --load af-packet (the same frames from a packet \
                 socket) or --load sendmmsg"
            );
            std::process::exit(2);
        }
    }
    let mut sections = sections(&args);
    print_header(&sections, args.load);
    run_rounds(&mut sections, args.load, args.profile.as_deref());
    print_report(&sections, args.load);
}

/// Where a running benchmark holds its lock.
const LOCK: &str = "/run/berth-bench-e2e.lock";

/// Takes the lock only one run at a time holds (released when the returned file is
/// dropped, or the process ends): two runs would each pin a SCHED_FIFO gateway thread
/// to the same CPU and measure half a CPU each. Exits, saying so, if another run
/// holds it.
fn alone() -> std::fs::File {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK)
        .unwrap_or_else(|e| panic!("opening {LOCK}: {e}"));
    // SAFETY: flock on a file descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        eprintln!(
            "another berth-bench-e2e runs (it holds {LOCK}): two runs would share the gateway's CPU and both measure wrong; wait for it"
        );
        std::process::exit(1);
    }
    file
}
