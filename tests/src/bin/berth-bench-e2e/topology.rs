//! The topology a measurement runs on: how the backends are attached (`--backends`),
//! and the parts it pins down: MACs, the gateway's threaded-NAPI kernel thread on its
//! own CPU.

use super::*;

/// An interface's MAC address.
pub(super) fn mac(ns: &Netns, dev: &str) -> [u8; 6] {
    let out = ns.ip(&["-j", "link", "show", "dev", dev]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    let text = v[0]["address"].as_str().unwrap_or_default();
    let mut mac = [0u8; 6];
    for (b, part) in mac.iter_mut().zip(text.split(':')) {
        *b = u8::from_str_radix(part, 16).unwrap_or_else(|_| panic!("MAC {text}"));
    }
    mac
}

pub(super) fn napi_threads() -> HashSet<(u32, String)> {
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
pub(super) const NAPI_PRIORITY: i32 = 50;

/// Turns on threaded NAPI for `iface` in `ns`, pins its thread to `cpu` and gives it
/// `NAPI_PRIORITY` (SCHED_FIFO); returns its PID.
pub(super) fn threaded_napi(ns: &Netns, iface: &str, cpu: usize) -> u32 {
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

/// How the backends are attached to the gateway (`--backends`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Backends {
    /// A veth each, GRO on, the XDP `Sink` on the backend's end: the gateway's end
    /// takes redirected XDP frames.
    Xdp,
    /// A veth each as the kernel makes it (GRO off, no XDP on either end), the backend's
    /// end in its namespace as a pod's; the TC sink counts.
    Veth,
    /// A veth each, the gateway's ends ports of bridge `cni0`, which holds the gateway's
    /// address toward the backends (one subnet), as a CNI bridge; the TC sink counts.
    Bridge,
}

pub(super) const TOPOLOGIES: [Backends; 3] = [Backends::Xdp, Backends::Veth, Backends::Bridge];

/// The modes measured where the backends' interfaces take no XDP frames.
const PLAIN_MODES: [Mode; 4] = [
    Mode::Routing,
    Mode::Berth,
    Mode::BerthKernel,
    Mode::IptablesNft,
];

/// The CNI-like bridge of `Backends::Bridge`.
const BRIDGE: &str = "cni0";

impl Backends {
    pub(super) fn name(self) -> &'static str {
        match self {
            Backends::Xdp => "xdp",
            Backends::Veth => "veth",
            Backends::Bridge => "bridge",
        }
    }

    pub(super) fn what(self) -> &'static str {
        match self {
            Backends::Xdp => "a veth each, GRO on, an XDP sink on the backend's end (the gateway's redirects land as XDP frames)",
            Backends::Veth => "a veth each as the kernel makes it (GRO off, no XDP), like a pod's; a TC (tcx ingress) sink on the backend's end",
            Backends::Bridge => "veths on bridge cni0 (one subnet, GRO off, no XDP), like a CNI bridge; a TC (tcx ingress) sink on the backends' ends",
        }
    }

    /// Whether the backends' veths run NAPI (then threaded, on `BACKEND_CPU`). Without
    /// it, a backend receives in softirq on the sending CPU: the gateway's thread.
    pub(super) fn napi(self) -> bool {
        self == Backends::Xdp
    }

    /// How the gateway's CPU is accounted for here.
    pub(super) fn accounting(self) -> String {
        if self.napi() {
            ACCOUNTING.into()
        } else {
            format!("{ACCOUNTING}; the backends' veths have no NAPI, so their receive (and the TC sink, a few instructions) runs in softirq on the sending CPU, inside that thread: the figure includes it")
        }
    }

    /// Whether `mode` is measured on this topology.
    pub(super) fn runs(self, mode: Mode) -> bool {
        self == Backends::Xdp || PLAIN_MODES.contains(&mode)
    }

    /// Builds the network; the client's link is the same in every topology (GRO on, so
    /// the gateway's `c0` takes the generator's XDP frames and runs NAPI).
    pub(super) fn build(self) -> Topology {
        let mut topo = match self {
            Backends::Xdp => return Topology::with_gro(BACKENDS),
            Backends::Veth => Topology::with_links(BACKENDS, Veth::GRO, Veth::default()),
            Backends::Bridge => {
                // In cni0's subnet, 10.251.10.0/24, after its own .1.
                let addrs: Vec<Ipv4Addr> = (1..=BACKENDS)
                    .map(|i| Ipv4Addr::new(10, 251, 10, 1 + i as u8))
                    .collect();
                bridged_with(BRIDGE, &addrs, Veth::GRO, Veth::default())
            }
        };
        // Berth only on the client's link: the backends' take no XDP.
        topo.gateway_ifaces = vec!["c0".into()];
        topo
    }

    /// The sink counting what reaches backend `ns`.
    pub(super) fn sink(self, ns: &Netns) -> Sink {
        match self {
            Backends::Xdp => Sink::attach(ns, "eth0"),
            Backends::Veth | Backends::Bridge => Sink::attach_tc(ns, "eth0"),
        }
    }
}
