//! The kernel datapath: load the XDP program, pin and adopt its maps, attach it to
//! interfaces, and apply a desired state of services as a minimal diff.
//!
//! Everything the kernel needs to keep forwarding lives in maps pinned under the pin
//! directory, and the XDP attachments are pinned bpf links: a daemon that exits (or is
//! killed) leaves the datapath serving, and a new one adopts it without a gap.

pub mod maglev;

mod addresses;
mod desired;
mod links;
mod xmit;

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    fs, io,
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, HashMap, MapData, MapError, MapInfo, PerCpuArray, PerCpuValues},
    programs::{links::FdLink, ProgramError, SchedClassifier, Xdp},
    Ebpf, EbpfLoader,
};
use desired::BackendSet;
pub use desired::{reserved_ports, Backends, DesiredState, Protocol, ServiceAddr, WeightedBackend};
use gateway_common::{
    map_names, Backend, Counter, Flow, FlowKey, FragKey, FragPorts, MaglevTable, Service,
    ServiceId, ServiceKey, ServiceStats, BACKEND_LIVE, MAGLEV_SIZE,
};
pub use links::{LinkChange, LinkKind};
pub use xmit::{follow as follow_xmit, FollowError, XmitChange, XmitMap};

/// What the datapath counted for one service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Packets, bytes and new flows, summed over CPUs.
    pub stats: ServiceStats,
    /// Tracked flows that forwarded a packet recently.
    pub active_flows: u64,
    /// Since when packets were forwarded to the backends without a reply coming back
    /// (None: replies keep up, or nothing was forwarded).
    pub unanswered_since: Option<std::time::Instant>,
}

impl Traffic {
    /// The traffic of two services together (a route served on several addresses).
    pub fn plus(self, other: &Traffic) -> Traffic {
        Traffic {
            stats: add_stats(self.stats, &other.stats),
            active_flows: self.active_flows + other.active_flows,
            unanswered_since: match (self.unanswered_since, other.unanswered_since) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            },
        }
    }

    /// How this service's packets leave: `None` before any packet, "xdp" while XDP
    /// sends nearly all (the first packet to a backend whose neighbour entry is not
    /// resolved yet goes through the kernel anyway), else "kernel: <why>".
    pub fn path(&self) -> Option<String> {
        let all = self.stats.packets + self.stats.reply_packets;
        if all == 0 {
            return None;
        }
        if self.stats.kernel_packets * 20 <= all {
            return Some("xdp".into());
        }
        let why = self
            .stats
            .kernel_reason
            .checked_sub(1)
            .and_then(Counter::from_index)
            .map_or("unknown", kernel_reason);
        Some(format!("kernel: {why}"))
    }
}

/// Two services' (or CPUs') counters together.
fn add_stats(a: ServiceStats, b: &ServiceStats) -> ServiceStats {
    ServiceStats {
        packets: a.packets + b.packets,
        bytes: a.bytes + b.bytes,
        reply_packets: a.reply_packets + b.reply_packets,
        reply_bytes: a.reply_bytes + b.reply_bytes,
        new_flows: a.new_flows + b.new_flows,
        kernel_packets: a.kernel_packets + b.kernel_packets,
        kernel_reason: min_reason(a.kernel_reason, b.kernel_reason),
        pad: 0,
    }
}

/// Of two `ServiceStats::kernel_reason`s the one to show: the forward path's reasons
/// (lower indices) over TC's, any over none (0).
fn min_reason(a: u32, b: u32) -> u32 {
    match (a, b) {
        (0, r) | (r, 0) => r,
        (x, y) => x.min(y),
    }
}

/// Why a packet took the kernel's path, in words.
pub fn kernel_reason(c: Counter) -> &'static str {
    match c {
        Counter::KernelNoXdpEgress => "egress takes no XDP frames",
        Counter::KernelNoNeighbour => "no neighbour entry yet",
        Counter::KernelFragNeeded => "longer than the egress MTU",
        Counter::KernelTtl => "TTL expired",
        Counter::KernelNoRoute => "no usable route",
        Counter::KernelForwardingOff => "forwarding disabled (dropped)",
        Counter::KernelEgressUnknown => "egress interface index beyond the map",
        Counter::TcReply => "replies arrive where XDP does not run (translated by TC)",
        other => other.name(),
    }
}

/// Name of the gateway program in the object.
pub const PROGRAM: &str = "berth";
/// Name of the program counting the kernel's refused redirects (tracepoint).
pub const REDIRECT_ERR_PROGRAM: &str = "berth_redirect_err";
/// Name of the reverse-NAT program attached to the interfaces' egress (tcx).
pub const TC_PROGRAM: &str = "berth_tc";
/// Name of a program that returns `XDP_PASS` at once (the benchmark's floor).
pub const FLOOR_PROGRAM: &str = "berth_pass";
/// Default pin directory.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/berth";

/// Maglev tables beyond one per service: a changed service's new table is written to a
/// spare one before the service switches to it.
const SPARE_TABLES: u32 = 64;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gateway"));

/// Errors of the datapath.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// The object could not be loaded.
    #[error("loading the XDP object")]
    Load(#[source] aya::EbpfError),
    /// A program could not be loaded or found.
    #[error("program {name}")]
    Program {
        /// Program name.
        name: &'static str,
        /// Cause.
        #[source]
        source: ProgramError,
    },
    /// A map operation failed.
    #[error("map {name}")]
    Map {
        /// Map name.
        name: &'static str,
        /// Cause.
        #[source]
        source: MapError,
    },
    /// A pinned map from an earlier run does not match this build or these limits.
    #[error(
        "pinned map {path} has {what} {found}, this daemon needs {wanted}; restart with the \
         same limits, or remove {dir} to start afresh (established flows are then lost)"
    )]
    Incompatible {
        /// Path of the pinned map.
        path: PathBuf,
        /// The property that differs.
        what: &'static str,
        /// Its value in the pinned map.
        found: u32,
        /// Its value in this build.
        wanted: u32,
        /// The pin directory.
        dir: PathBuf,
    },
    /// Attaching to an interface failed.
    #[error("attaching the {what} program to interface {iface}")]
    Attach {
        /// Interface name.
        iface: String,
        /// Which program.
        what: &'static str,
        /// Cause.
        #[source]
        source: ProgramError,
    },
    /// An interface to attach to does not exist.
    #[error("interface {iface} does not exist (in this network namespace)")]
    NoInterface {
        /// Interface name.
        iface: String,
    },
    /// Another program, not attached by Berth, holds the hook.
    #[error(
        "interface {iface} already runs a {what} program that Berth did not attach \
         (see `ip link show dev {iface}` / `bpftool net show dev {iface}`): detach it, or \
         leave {iface} out of --interface"
    )]
    Occupied {
        /// Interface name.
        iface: String,
        /// Which hook.
        what: &'static str,
    },
    /// The gateway addresses could not be put on their interface.
    #[error("gateway addresses on interface {iface}")]
    Addresses {
        /// The dummy interface.
        iface: String,
        /// Cause.
        #[source]
        source: crate::netlink::NetlinkError,
    },
    /// The pins would land on a bpffs private to this process.
    #[error(
        "/sys/fs/bpf is not the host's bpffs: this process runs in a mount namespace of its \
         own (as `ip netns exec` makes), so pinned maps and links would vanish with it and \
         a kill would detach everything; enter only the network namespace \
         (`nsenter --net=/var/run/netns/NAME berth run ...`), or pass --pin-dir on the host's bpffs"
    )]
    PrivateBpffs,
    /// A pinned link could not be used or created.
    #[error("pinned link {path}: {message}")]
    Link {
        /// Link pin path.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The pin directory could not be prepared.
    #[error("pin directory {path}")]
    PinDir {
        /// The directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A map limit is beyond what the maps' layout can address.
    #[error("a limit of {wanted} {what} is beyond the {max} the datapath can address")]
    Limit {
        /// The limited resource.
        what: &'static str,
        /// The limit asked for.
        wanted: u32,
        /// The largest limit supported.
        max: u32,
    },
    /// The desired state does not fit the configured limits.
    #[error("desired state needs more {what} than the limit of {limit}")]
    Capacity {
        /// The exhausted resource.
        what: &'static str,
        /// Its limit.
        limit: u32,
    },
}

type Result<T, E = DatapathError> = std::result::Result<T, E>;

fn map_err(name: &'static str) -> impl FnOnce(MapError) -> DatapathError {
    move |source| DatapathError::Map { name, source }
}

/// Sizes of the maps. A restarted daemon must use the same limits to adopt the maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Services (gateway address, protocol, port).
    pub services: u32,
    /// Backends over all services.
    pub backends: u32,
    /// Conntrack entries (two per flow).
    pub flows: u32,
    /// Fragmented datagrams tracked at once.
    pub fragments: u32,
    /// Distinct gateway addresses.
    pub addresses: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            services: 16384,
            backends: 65536,
            flows: 262_144,
            fragments: 8192,
            addresses: 256,
        }
    }
}

impl Limits {
    fn tables(&self) -> u32 {
        self.services + SPARE_TABLES
    }

    /// The shape of every map.
    fn shapes(&self) -> [Shape; 10] {
        use std::mem::size_of;
        let shape = |name, key_size, value_size, max_entries| Shape {
            name,
            key_size,
            value_size,
            max_entries,
            disposable: [
                map_names::COUNTERS,
                map_names::SERVICE_STATS,
                map_names::PROGRAM_ID,
            ]
            .contains(&name),
        };
        [
            shape(
                map_names::SERVICES,
                size_of::<ServiceKey>(),
                size_of::<Service>(),
                self.services,
            ),
            shape(map_names::ADDRESSES, 4, 4, self.addresses),
            shape(
                map_names::MAGLEV,
                4,
                size_of::<MaglevTable>(),
                self.tables(),
            ),
            shape(map_names::BACKENDS, 4, size_of::<Backend>(), self.backends),
            shape(
                map_names::CONNTRACK,
                size_of::<FlowKey>(),
                size_of::<Flow>(),
                self.flows,
            ),
            shape(
                map_names::FRAGMENTS,
                size_of::<FragKey>(),
                size_of::<FragPorts>(),
                self.fragments,
            ),
            shape(map_names::COUNTERS, 4, 8, Counter::COUNT),
            shape(
                map_names::SERVICE_STATS,
                4,
                size_of::<ServiceStats>(),
                self.services,
            ),
            shape(map_names::XMIT, 4, 4, gateway_common::XMIT_SLOTS),
            shape(map_names::PROGRAM_ID, 4, 4, 1),
        ]
    }
}

/// What a map must look like: an earlier run's pinned map is adopted only if it matches.
struct Shape {
    name: &'static str,
    key_size: usize,
    value_size: usize,
    max_entries: u32,
    /// Replaced rather than refused when an earlier run's pin has another shape.
    disposable: bool,
}

/// How to attach to an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttachMode {
    /// Native (driver) mode, falling back to generic (SKB) mode.
    #[default]
    Auto,
    /// Native (driver) mode only.
    Native,
    /// Generic (SKB) mode.
    Skb,
}

/// What `attach` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attached {
    /// A link pinned by an earlier run now runs this program (atomic replacement).
    Replaced,
    /// Attached afresh in this mode.
    New(AttachMode),
}

/// One service as installed in the maps.
#[derive(Clone, Debug)]
struct Installed {
    id: ServiceId,
    table: u32,
    /// Endpoint → (backend id, weight).
    backends: BTreeMap<SocketAddrV4, (u32, u16)>,
}

impl Installed {
    fn same_backends(&self, want: &BackendSet) -> bool {
        self.backends.len() == want.len()
            && self
                .backends
                .iter()
                .zip(want)
                .all(|((e1, (_, w1)), (e2, w2))| e1 == e2 && w1 == w2)
    }
}

/// What `apply` changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Services added.
    pub added: usize,
    /// Services whose backends or weights changed.
    pub changed: usize,
    /// Services removed.
    pub removed: usize,
    /// Services left as they were.
    pub unchanged: usize,
}

/// Where the datapath is pinned and how big its maps are.
#[derive(Clone, Debug)]
pub struct Config {
    /// Pin directory on a bpffs (`/sys/fs/bpf/berth` by default).
    pub pin_dir: PathBuf,
    /// Map sizes.
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            limits: Limits::default(),
        }
    }
}

/// A loaded datapath whose maps are pinned (and adopted when already pinned).
pub struct Datapath {
    ebpf: Ebpf,
    pin_dir: PathBuf,
    limits: Limits,
    services: HashMap<MapData, ServiceKey, Service>,
    addresses: HashMap<MapData, u32, u32>,
    maglev: Array<MapData, MaglevTable>,
    backends: Array<MapData, Backend>,
    conntrack: HashMap<MapData, FlowKey, Flow>,
    counters: PerCpuArray<MapData, u64>,
    service_stats: PerCpuArray<MapData, ServiceStats>,
    installed: BTreeMap<ServiceKey, Installed>,
    /// The state last applied in full: what is installed, unless the maps were changed
    /// behind the daemon's back (only by the daemon itself, which forgets this first).
    applied: Option<DesiredState>,
    /// The dummy interface that holds the gateway addresses, if the daemon owns one.
    address_interface: Option<String>,
    /// Ports this process reserved from the host's ephemeral ports (at start: those of
    /// the services adopted, which the run before reserved).
    reserved: std::collections::BTreeSet<u16>,
    /// Links this process holds, by pin path.
    links: BTreeMap<PathBuf, FdLink>,
    service_ids: ServiceIds,
    tables: IdPool,
    backend_ids: IdPool,
}

impl Datapath {
    /// Loads the program, creating the maps or adopting those an earlier run pinned.
    pub fn load(config: &Config) -> Result<Self> {
        ensure_bpffs(&config.pin_dir)?;
        // A start that fails leaves no pins of its own behind (an earlier run's stay).
        let existed: Vec<bool> = map_names::ALL
            .iter()
            .map(|n| config.pin_dir.join(n).exists())
            .collect();
        let dir_existed = config.pin_dir.exists();
        let loaded = Self::load_pinned(config);
        if loaded.is_err() {
            for (name, existed) in map_names::ALL.iter().zip(existed) {
                if !existed {
                    let _ = fs::remove_file(config.pin_dir.join(name));
                }
            }
            if !dir_existed {
                let _ = fs::remove_dir_all(&config.pin_dir);
            }
        }
        loaded
    }

    fn load_pinned(config: &Config) -> Result<Self> {
        let Config { pin_dir, limits } = config;
        if limits.services > ServiceId::SLOTS {
            return Err(DatapathError::Limit {
                what: "services",
                wanted: limits.services,
                max: ServiceId::SLOTS,
            });
        }
        fs::create_dir_all(pin_dir.join("links")).map_err(|source| DatapathError::PinDir {
            path: pin_dir.clone(),
            source,
        })?;

        let shapes = limits.shapes();
        let paths: Vec<PathBuf> = shapes.iter().map(|s| pin_dir.join(s.name)).collect();
        for (shape, path) in shapes.iter().zip(&paths) {
            // Counters hold nothing a restart must keep: a build that counts more (or
            // differently) replaces them instead of refusing to start.
            if shape.disposable && check_pinned(path, pin_dir, shape).is_err() {
                tracing::info!(
                    map = shape.name,
                    "pinned counters have another shape; replacing them"
                );
                let _ = fs::remove_file(path);
            }
            check_pinned(path, pin_dir, shape).map_err(|e| {
                e.unwrap_or_else(|source| DatapathError::Map {
                    name: shape.name,
                    source,
                })
            })?;
        }
        let mut loader = EbpfLoader::new();
        for (shape, path) in shapes.iter().zip(&paths) {
            loader.map_max_entries(shape.name, shape.max_entries);
            loader.map_pin_path(shape.name, path.as_path());
        }
        let mut ebpf = loader.load(OBJECT).map_err(DatapathError::Load)?;
        for name in [PROGRAM, FLOOR_PROGRAM] {
            xdp(&mut ebpf, name)?
                .load()
                .map_err(|source| DatapathError::Program { name, source })?;
        }
        let tc = links::tc_program(&mut ebpf)?;
        tc.load().map_err(|source| DatapathError::Program {
            name: TC_PROGRAM,
            source,
        })?;

        fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T>
        where
            T: TryFrom<aya::maps::Map, Error = MapError>,
        {
            let map = ebpf.take_map(name).ok_or(DatapathError::Map {
                name,
                source: MapError::InvalidName {
                    name: name.to_string(),
                },
            })?;
            T::try_from(map).map_err(map_err(name))
        }
        let mut dp = Datapath {
            services: take(&mut ebpf, map_names::SERVICES)?,
            addresses: take(&mut ebpf, map_names::ADDRESSES)?,
            maglev: take(&mut ebpf, map_names::MAGLEV)?,
            backends: take(&mut ebpf, map_names::BACKENDS)?,
            conntrack: take(&mut ebpf, map_names::CONNTRACK)?,
            counters: take(&mut ebpf, map_names::COUNTERS)?,
            service_stats: take(&mut ebpf, map_names::SERVICE_STATS)?,
            ebpf,
            pin_dir: pin_dir.clone(),
            limits: *limits,
            installed: BTreeMap::new(),
            applied: None,
            address_interface: None,
            reserved: Default::default(),
            links: BTreeMap::new(),
            service_ids: ServiceIds::new(limits.services),
            tables: IdPool::new("Maglev tables", limits.tables()),
            backend_ids: IdPool::new("backends", limits.backends),
        };
        dp.adopt()?;
        dp.reserved = dp.installed_ports();
        dp.count_redirect_errors();
        Ok(dp)
    }

    /// Rebuilds the userspace view of installed services from the (possibly adopted) maps.
    fn adopt(&mut self) -> Result<()> {
        let mut by_id = StdHashMap::new();
        for item in self.services.iter() {
            let (key, svc) = item.map_err(map_err(map_names::SERVICES))?;
            by_id.insert(svc.id, key);
            self.installed.insert(
                key,
                Installed {
                    id: svc.id,
                    table: svc.table,
                    backends: BTreeMap::new(),
                },
            );
            self.service_ids.mark(svc.id);
            self.tables.mark(svc.table);
        }
        let mut orphans = Vec::new();
        for (id, item) in self.backends.iter().enumerate() {
            let b = item.map_err(map_err(map_names::BACKENDS))?;
            if b.flags & BACKEND_LIVE == 0 {
                continue;
            }
            let id = id as u32;
            match by_id
                .get(&b.service)
                .and_then(|key| self.installed.get_mut(key))
            {
                Some(svc) => {
                    svc.backends
                        .insert(endpoint(b.addr, b.port), (id, b.weight));
                    self.backend_ids.mark(id);
                }
                // A backend left behind by a run that died mid-update.
                None => orphans.push(id),
            }
        }
        for id in orphans {
            self.backends
                .set(id, Backend::default(), 0)
                .map_err(map_err(map_names::BACKENDS))?;
        }
        // Conntrack entries may still name services removed before this start: the
        // ids handed out from now on must differ from theirs.
        let mut seen = std::collections::HashSet::new();
        self.each_flow(|_, f| {
            seen.insert(f.service);
        })?;
        for id in seen {
            self.service_ids.saw(id);
        }
        Ok(())
    }

    /// Attaches the tracepoint that counts redirects the kernel refused (`redirect_error`)
    /// to this daemon's lifetime. Best effort: without tracefs or perf events the
    /// counter stays at zero, which is logged.
    fn count_redirect_errors(&mut self) {
        let result = (|| -> std::result::Result<(), String> {
            let id = xdp(&mut self.ebpf, PROGRAM)
                .map_err(|e| e.to_string())?
                .info()
                .map_err(|e| e.to_string())?
                .id();
            let mut ids: Array<&mut MapData, u32> = Array::try_from(
                self.ebpf
                    .map_mut(map_names::PROGRAM_ID)
                    .ok_or("no program id map")?,
            )
            .map_err(|e| e.to_string())?;
            ids.set(0, id, 0).map_err(|e| e.to_string())?;
            let tp: &mut aya::programs::TracePoint = self
                .ebpf
                .program_mut(REDIRECT_ERR_PROGRAM)
                .ok_or("no tracepoint program")?
                .try_into()
                .map_err(|e: ProgramError| e.to_string())?;
            tp.load().map_err(|e| e.to_string())?;
            ensure_tracefs().map_err(|e| format!("mounting tracefs: {e}"))?;
            tp.attach("xdp", "xdp_redirect_err")
                .map_err(|e| e.to_string())?;
            Ok(())
        })();
        if let Err(e) = result {
            tracing::warn!(
                error = e,
                "redirect errors the kernel reports will not be counted (redirect_error)"
            );
        }
    }

    /// Ports of the installed services.
    fn installed_ports(&self) -> std::collections::BTreeSet<u16> {
        self.installed
            .keys()
            .map(|k| u16::from_be(k.port))
            .collect()
    }

    /// Reserves the installed services' ports from the host's ephemeral ports (and
    /// releases those no longer installed), leaving the operator's entries alone.
    fn sync_reserved_ports(&mut self) {
        let want = self.installed_ports();
        let release: std::collections::BTreeSet<u16> =
            self.reserved.difference(&want).copied().collect();
        match crate::host::update_reserved_ports(&release, &want) {
            Ok(()) => self.reserved = want,
            Err(e) => tracing::warn!(error = %e, "updating net.ipv4.ip_local_reserved_ports"),
        }
    }

    /// The services currently installed, with their backends.
    pub fn installed(&self) -> DesiredState {
        let services = self
            .installed
            .iter()
            .filter_map(|(key, svc)| {
                let backends = svc
                    .backends
                    .iter()
                    .map(|(&endpoint, &(_, weight))| WeightedBackend { endpoint, weight })
                    .collect::<Vec<_>>();
                Some((ServiceAddr::from_key(key)?, backends.into()))
            })
            .collect();
        DesiredState { services }
    }

    /// Makes the maps hold `desired`, touching only what differs. Flows of unchanged
    /// backends are never disturbed; a changed service switches tables atomically.
    pub fn apply(&mut self, desired: &DesiredState) -> Result<ApplyReport> {
        let result = self.apply_diff(desired);
        if result.is_err() {
            // Ids handed out to what was not installed in the end are free again.
            self.rebuild_pools();
        }
        result
    }

    fn apply_diff(&mut self, desired: &DesiredState) -> Result<ApplyReport> {
        if desired.services.len() as u32 > self.limits.services {
            return Err(DatapathError::Capacity {
                what: "services",
                limit: self.limits.services,
            });
        }
        let mut report = ApplyReport::default();
        // The services that may differ from what is installed: those that changed since
        // the state last applied in full, or (after a failure, and at first) all.
        let changes: Vec<(ServiceKey, Option<BackendSet>)> = match self.applied.take() {
            Some(last) => {
                let (changes, same) = desired.changes_since(&last);
                report.unchanged = same;
                changes
            }
            None => {
                let want = desired.normalized();
                let gone: Vec<(ServiceKey, Option<BackendSet>)> = self
                    .installed
                    .keys()
                    .filter(|k| !want.contains_key(k))
                    .map(|&k| (k, None))
                    .collect();
                gone.into_iter()
                    .chain(want.into_iter().map(|(k, set)| (k, Some(set))))
                    .collect()
            }
        };
        for (key, want) in &changes {
            match (want, self.installed.get(key)) {
                (None, None) => {}
                (None, Some(_)) => {
                    self.remove_service(key)?;
                    report.removed += 1;
                }
                (Some(backends), None) => {
                    self.add_service(key, backends)?;
                    report.added += 1;
                }
                (Some(backends), Some(svc)) if svc.same_backends(backends) => report.unchanged += 1,
                (Some(backends), Some(_)) => {
                    self.update_service(key, backends)?;
                    report.changed += 1;
                }
            }
        }
        if report.added + report.removed > 0 {
            self.sync_addresses()?;
            self.sync_address_interface()?;
            self.sync_reserved_ports();
        }
        self.applied = Some(desired.clone());
        Ok(report)
    }

    fn add_service(&mut self, key: &ServiceKey, want: &BackendSet) -> Result<()> {
        let id = self.service_ids.alloc()?;
        let table = self.tables.alloc()?;
        let mut svc = Installed {
            id,
            table,
            backends: BTreeMap::new(),
        };
        for (&endpoint, &weight) in want {
            let bid = self.backend_ids.alloc()?;
            self.write_backend(bid, id, endpoint, weight)?;
            svc.backends.insert(endpoint, (bid, weight));
        }
        let active = self.write_table(&svc)?;
        let zero =
            PerCpuValues::try_from(vec![ServiceStats::default(); nr_cpus()?]).map_err(|e| {
                map_err(map_names::SERVICE_STATS)(MapError::SyscallError(aya::sys::SyscallError {
                    call: "per-cpu values",
                    io_error: e,
                }))
            })?;
        self.service_stats
            .set(id.slot(), zero, 0)
            .map_err(map_err(map_names::SERVICE_STATS))?;
        self.services
            .insert(
                key,
                Service {
                    id,
                    table,
                    active,
                    pad: 0,
                },
                0,
            )
            .map_err(map_err(map_names::SERVICES))?;
        self.installed.insert(*key, svc);
        Ok(())
    }

    fn update_service(&mut self, key: &ServiceKey, want: &BackendSet) -> Result<()> {
        let Some(old) = self.installed.get(key).cloned() else {
            return self.add_service(key, want);
        };
        let mut svc = Installed {
            id: old.id,
            table: self.tables.alloc()?,
            backends: BTreeMap::new(),
        };
        // New and reweighted backends first, so the new table only names live ones.
        for (&endpoint, &weight) in want {
            let bid = match old.backends.get(&endpoint) {
                Some(&(bid, w)) if w == weight => bid,
                Some(&(bid, _)) => {
                    self.write_backend(bid, svc.id, endpoint, weight)?;
                    bid
                }
                None => {
                    let bid = self.backend_ids.alloc()?;
                    self.write_backend(bid, svc.id, endpoint, weight)?;
                    bid
                }
            };
            svc.backends.insert(endpoint, (bid, weight));
        }
        let active = self.write_table(&svc)?;
        self.services
            .insert(
                key,
                Service {
                    id: svc.id,
                    table: svc.table,
                    active,
                    pad: 0,
                },
                0,
            )
            .map_err(map_err(map_names::SERVICES))?;
        // Only now that no table names them: retire removed backends. Their flows are
        // balanced again by the kernel program on their next packet.
        for (endpoint, &(bid, _)) in &old.backends {
            if !svc.backends.contains_key(endpoint) {
                self.clear_backend(bid)?;
            }
        }
        self.tables.free(old.table);
        self.installed.insert(*key, svc);
        Ok(())
    }

    fn remove_service(&mut self, key: &ServiceKey) -> Result<()> {
        let Some(svc) = self.installed.remove(key) else {
            return Ok(());
        };
        match self.services.remove(key) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(map_err(map_names::SERVICES)(e)),
        }
        for &(bid, _) in svc.backends.values() {
            self.clear_backend(bid)?;
        }
        self.service_ids.free(svc.id);
        self.tables.free(svc.table);
        Ok(())
    }

    /// Writes the service's Maglev table; returns the number of backends taking new flows.
    fn write_table(&mut self, svc: &Installed) -> Result<u32> {
        let candidates: Vec<maglev::Candidate> = svc
            .backends
            .iter()
            .map(|(&endpoint, &(_, weight))| maglev::Candidate { endpoint, weight })
            .collect();
        let ids: Vec<u32> = svc.backends.values().map(|&(bid, _)| bid).collect();
        let Some(table) = maglev::table(&candidates, MAGLEV_SIZE) else {
            return Ok(0);
        };
        let mut entries: MaglevTable = [0; MAGLEV_SIZE as usize];
        for (slot, &e) in entries.iter_mut().zip(&table) {
            *slot = ids[e as usize];
        }
        self.maglev
            .set(svc.table, entries, 0)
            .map_err(map_err(map_names::MAGLEV))?;
        Ok(candidates.iter().filter(|c| c.weight > 0).count() as u32)
    }

    fn write_backend(
        &mut self,
        bid: u32,
        service: ServiceId,
        e: SocketAddrV4,
        weight: u16,
    ) -> Result<()> {
        let value = Backend {
            addr: u32::from(*e.ip()).to_be(),
            port: e.port().to_be(),
            weight,
            service,
            flags: BACKEND_LIVE,
        };
        self.backends
            .set(bid, value, 0)
            .map_err(map_err(map_names::BACKENDS))
    }

    fn clear_backend(&mut self, bid: u32) -> Result<()> {
        self.backends
            .set(bid, Backend::default(), 0)
            .map_err(map_err(map_names::BACKENDS))?;
        self.backend_ids.free(bid);
        Ok(())
    }

    /// Keeps the gateway-address map equal to the addresses of installed services.
    fn sync_addresses(&mut self) -> Result<()> {
        let mut want: BTreeMap<u32, u32> = BTreeMap::new();
        for key in self.installed.keys() {
            *want.entry(key.addr).or_default() += 1;
        }
        if want.len() as u32 > self.limits.addresses {
            return Err(DatapathError::Capacity {
                what: "addresses",
                limit: self.limits.addresses,
            });
        }
        let have: Vec<(u32, u32)> = self
            .addresses
            .iter()
            .collect::<Result<_, _>>()
            .map_err(map_err(map_names::ADDRESSES))?;
        for (addr, _) in have.iter().filter(|(a, _)| !want.contains_key(a)) {
            self.addresses
                .remove(addr)
                .map_err(map_err(map_names::ADDRESSES))?;
        }
        for (addr, count) in want {
            if !have.contains(&(addr, count)) {
                self.addresses
                    .insert(addr, count, 0)
                    .map_err(map_err(map_names::ADDRESSES))?;
            }
        }
        Ok(())
    }

    /// Marks exactly the ids of installed services as used.
    fn rebuild_pools(&mut self) {
        self.service_ids.clear();
        self.tables.clear();
        self.backend_ids.clear();
        for svc in self.installed.values() {
            self.service_ids.mark(svc.id);
            self.tables.mark(svc.table);
            for &(bid, _) in svc.backends.values() {
                self.backend_ids.mark(bid);
            }
        }
    }

    /// Named counters summed over CPUs.
    pub fn counters(&self) -> Result<BTreeMap<&'static str, u64>> {
        Counter::ALL
            .iter()
            .map(|c| {
                let values = self
                    .counters
                    .get(&(*c as u32), 0)
                    .map_err(map_err(map_names::COUNTERS))?;
                Ok((c.name(), values.iter().sum()))
            })
            .collect()
    }

    /// Statistics of every installed service, summed over CPUs.
    pub fn service_stats(&self) -> Result<BTreeMap<ServiceAddr, ServiceStats>> {
        use aya::maps::IterableMap as _;
        // Per-CPU values come as one 8-byte-aligned slot per possible CPU.
        let slot = std::mem::size_of::<ServiceStats>().next_multiple_of(8);
        let cpus = nr_cpus()?;
        let mut by_slot: StdHashMap<u32, ServiceStats> = StdHashMap::new();
        let fd = std::os::fd::AsFd::as_fd(self.service_stats.map().fd());
        lookup_batch(fd, 4, slot * cpus, |key, value| {
            let index = u32::from_ne_bytes(key.try_into().unwrap_or_default());
            let sum = value
                .chunks_exact(slot)
                .fold(ServiceStats::default(), |a, v| {
                    // SAFETY: each slot starts with a ServiceStats (Pod, any bytes valid);
                    // read unaligned from the byte buffer.
                    let s: ServiceStats = unsafe { std::ptr::read_unaligned(v.as_ptr().cast()) };
                    add_stats(a, &s)
                });
            by_slot.insert(index, sum);
        })
        .map_err(batch_err(map_names::SERVICE_STATS))?;
        Ok(self
            .installed
            .iter()
            .filter_map(|(key, svc)| {
                Some((
                    ServiceAddr::from_key(key)?,
                    by_slot.get(&svc.id.slot()).copied()?,
                ))
            })
            .collect())
    }

    /// Tracked flows, client → gateway direction only: (flow tuple, backend endpoint, service).
    pub fn flows(&self) -> Result<Vec<(FlowKey, Flow)>> {
        let mut out = Vec::new();
        self.each_flow(|k, f| {
            if f.kind == gateway_common::NAT_DST {
                out.push((*k, *f));
            }
        })?;
        Ok(out)
    }

    /// Per service, the tracked flows (client → gateway) that forwarded a packet within
    /// about `window` (a flow's next hop is asked for at least every second while its
    /// packets flow, and that time is what is compared).
    pub fn active_flows(&self, window: std::time::Duration) -> Result<BTreeMap<ServiceAddr, u64>> {
        let now = coarse_clock_units();
        let window = u32::try_from(window.as_nanos() >> 20).unwrap_or(u32::MAX);
        let mut per_id: StdHashMap<ServiceId, u64> = StdHashMap::new();
        self.each_flow(|_, f| {
            if f.kind == gateway_common::NAT_DST
                && now.wrapping_sub(f.next_hop.checked_at) <= window
            {
                *per_id.entry(f.service).or_default() += 1;
            }
        })?;
        Ok(self
            .installed
            .iter()
            .filter_map(|(key, svc)| Some((ServiceAddr::from_key(key)?, *per_id.get(&svc.id)?)))
            .collect())
    }

    /// Calls `f` on every conntrack entry, reading them in batches (a few syscalls for
    /// the whole table, not two per entry).
    fn each_flow(&self, mut f: impl FnMut(&FlowKey, &Flow)) -> Result<()> {
        use aya::maps::IterableMap as _;
        let fd = std::os::fd::AsFd::as_fd(self.conntrack.map().fd());
        let (key_size, value_size) = (std::mem::size_of::<FlowKey>(), std::mem::size_of::<Flow>());
        lookup_batch(fd, key_size, value_size, |k, v| {
            // SAFETY: the map's key and value are a FlowKey and a Flow (sizes checked at
            // load; Pod, any bytes valid); read unaligned from the byte buffers.
            let (k, v): (FlowKey, Flow) = unsafe {
                (
                    std::ptr::read_unaligned(k.as_ptr().cast()),
                    std::ptr::read_unaligned(v.as_ptr().cast()),
                )
            };
            f(&k, &v)
        })
        .map_err(batch_err(map_names::CONNTRACK))
    }

    /// A loaded program of the object (`PROGRAM` or `FLOOR_PROGRAM`), e.g. for
    /// `BPF_PROG_TEST_RUN`.
    pub fn program_mut(&mut self, name: &'static str) -> Result<&mut Xdp> {
        xdp(&mut self.ebpf, name)
    }

    /// The loaded TC program, e.g. for `BPF_PROG_TEST_RUN`.
    pub fn tc_program_mut(&mut self) -> Result<&mut SchedClassifier> {
        links::tc_program(&mut self.ebpf)
    }

    /// The pin directory.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }
}

/// Ports of the services in the maps pinned in `pin_dir` (none if nothing is pinned).
pub fn pinned_service_ports(pin_dir: &Path) -> Result<std::collections::BTreeSet<u16>> {
    let name = map_names::SERVICES;
    let path = pin_dir.join(name);
    if !path.exists() {
        return Ok(Default::default());
    }
    let data = MapData::from_pin(&path).map_err(map_err(name))?;
    let map: HashMap<MapData, ServiceKey, Service> =
        HashMap::try_from(aya::maps::Map::HashMap(data)).map_err(map_err(name))?;
    map.keys()
        .map(|k| k.map(|k| u16::from_be(k.port)).map_err(map_err(name)))
        .collect()
}

/// Removes every pin of a datapath (maps and links). Attached programs whose link is
/// held by no process are detached; established flows are forgotten.
pub fn remove_pins(pin_dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(pin_dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Whether the kernel forwards IPv4 in this network namespace. Packets the program
/// hands to the kernel (no neighbour entry yet, TTL expiry) need it.
pub fn ipv4_forwarding_enabled() -> io::Result<bool> {
    Ok(fs::read_to_string("/proc/sys/net/ipv4/ip_forward")?.trim() == "1")
}

fn xdp<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut Xdp> {
    let missing = || DatapathError::Program {
        name,
        source: ProgramError::UnexpectedProgramType,
    };
    let program = ebpf.program_mut(name).ok_or_else(missing)?;
    program
        .try_into()
        .map_err(|source| DatapathError::Program { name, source })
}

/// Compares a pinned map's shape with this build's. `Ok(())` when absent or equal.
fn check_pinned(
    path: &Path,
    dir: &Path,
    shape: &Shape,
) -> std::result::Result<(), std::result::Result<DatapathError, MapError>> {
    if !path.exists() {
        return Ok(());
    }
    let info = MapInfo::from_pin(path).map_err(Err)?;
    let checks = [
        ("key size", info.key_size(), shape.key_size as u32),
        ("value size", info.value_size(), shape.value_size as u32),
        ("max entries", info.max_entries(), shape.max_entries),
    ];
    for (what, found, wanted) in checks {
        if found != wanted {
            return Err(Ok(DatapathError::Incompatible {
                path: path.to_path_buf(),
                what,
                found,
                wanted,
                dir: dir.to_path_buf(),
            }));
        }
    }
    Ok(())
}

/// `bpf_ktime_get_coarse_ns() >> 20` as the program computes it (CLOCK_MONOTONIC_COARSE).
fn coarse_clock_units() -> u32 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    let ns = (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64;
    (ns >> 20) as u32
}

fn batch_err(name: &'static str) -> impl FnOnce(io::Error) -> DatapathError {
    move |io_error| {
        map_err(name)(MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_lookup_batch",
            io_error,
        }))
    }
}

/// Reads every entry of a BPF hash or array map with `BPF_MAP_LOOKUP_BATCH` (a few
/// syscalls for the whole map, not two per entry), calling `f` on each key's and value's
/// bytes (`value_size` as the kernel copies it: per-CPU maps give one 8-byte-aligned
/// slot per possible CPU).
fn lookup_batch(
    fd: std::os::fd::BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    mut f: impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    /// The `batch` member of `union bpf_attr` (uapi/linux/bpf.h).
    #[repr(C)]
    struct BatchAttr {
        in_batch: u64,
        out_batch: u64,
        keys: u64,
        values: u64,
        count: u32,
        map_fd: u32,
        elem_flags: u64,
        flags: u64,
    }
    const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
    const CHUNK: usize = 1024;
    let mut keys = vec![0u8; CHUNK * key_size];
    let mut values = vec![0u8; CHUNK * value_size];
    // Hash maps and arrays both use a u32 (bucket, index) as the batch cursor.
    let (mut cursor_in, mut cursor_out) = (0u64, 0u64);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                std::ptr::addr_of!(cursor_in) as u64
            },
            out_batch: std::ptr::addr_of_mut!(cursor_out) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd.as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: the buffers hold CHUNK keys and values of the sizes the kernel copies;
        // the cursors are 8 bytes, more than the 4 the kernel writes.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let done = if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
            true
        } else {
            false
        };
        let n = (attr.count as usize).min(CHUNK);
        for (k, v) in keys
            .chunks_exact(key_size)
            .zip(values.chunks_exact(value_size))
            .take(n)
        {
            f(k, v);
        }
        if done {
            return Ok(());
        }
        cursor_in = cursor_out;
        first = false;
    }
}

fn endpoint(addr: u32, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(u32::from_be(addr)), u16::from_be(port))
}

/// Service ids: a slot from a pool, with the next generation of that slot, so that no
/// two services (over the datapath's life, restarts included) get the same id.
struct ServiceIds {
    slots: IdPool,
    /// Per slot, the highest generation handed out or found in the maps.
    generations: Vec<u16>,
}

impl ServiceIds {
    fn new(capacity: u32) -> Self {
        ServiceIds {
            slots: IdPool::new("services", capacity),
            generations: vec![0; capacity as usize],
        }
    }

    fn alloc(&mut self) -> Result<ServiceId> {
        let slot = self.slots.alloc()?;
        let generation = match self.generations.get_mut(slot as usize) {
            Some(g) => {
                // Wraps after 65535 services in one slot; an entry that old is long gone.
                *g = g.wrapping_add(1);
                *g
            }
            None => 0,
        };
        Ok(ServiceId::new(slot, generation))
    }

    /// Marks the id of an installed service (adopted maps).
    fn mark(&mut self, id: ServiceId) {
        self.slots.mark(id.slot());
        self.saw(id);
    }

    /// Notes an id found in the maps (in use or not), so that it is not handed out again.
    fn saw(&mut self, id: ServiceId) {
        if let Some(g) = self.generations.get_mut(id.slot() as usize) {
            *g = (*g).max(id.generation());
        }
    }

    fn free(&mut self, id: ServiceId) {
        self.slots.free(id.slot());
    }

    /// Frees every slot; generations are kept.
    fn clear(&mut self) {
        self.slots.clear();
    }
}

/// The ids of one kind of map slot (services, Maglev tables, backends) in use. Handed
/// out next-fit, so that a freed id is not reused at once: a CPU may still be reading
/// the slot through a lookup made just before it was freed.
struct IdPool {
    what: &'static str,
    used: Vec<bool>,
    cursor: u32,
}

impl IdPool {
    fn new(what: &'static str, capacity: u32) -> Self {
        IdPool {
            what,
            used: vec![false; capacity as usize],
            cursor: 0,
        }
    }

    fn alloc(&mut self) -> Result<u32> {
        let cap = self.used.len() as u32;
        let id = (0..cap)
            .map(|i| (self.cursor + i) % cap)
            .find(|&id| !self.used[id as usize])
            .ok_or(DatapathError::Capacity {
                what: self.what,
                limit: cap,
            })?;
        self.used[id as usize] = true;
        self.cursor = (id + 1) % cap;
        Ok(id)
    }

    /// Marks an id found in use (adopted maps); new ids come after the highest.
    fn mark(&mut self, id: u32) {
        if let Some(u) = self.used.get_mut(id as usize) {
            *u = true;
            self.cursor = self.cursor.max(id + 1);
        }
    }

    fn free(&mut self, id: u32) {
        if let Some(u) = self.used.get_mut(id as usize) {
            *u = false;
        }
    }

    fn clear(&mut self) {
        self.used.fill(false);
    }
}

fn ifindex(iface: &str) -> Option<u32> {
    let name = std::ffi::CString::new(iface).ok()?;
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

fn nr_cpus() -> Result<usize> {
    aya::util::nr_cpus().map_err(|(_, source)| DatapathError::Map {
        name: map_names::SERVICE_STATS,
        source: MapError::SyscallError(aya::sys::SyscallError {
            call: "nr_cpus",
            io_error: source,
        }),
    })
}

/// Mounts tracefs on `/sys/kernel/tracing` if it is not there: attaching to a
/// tracepoint reads the event's id from it (a fresh host has it unmounted).
fn ensure_tracefs() -> io::Result<()> {
    let root = Path::new("/sys/kernel/tracing");
    if root.join("events").exists() {
        return Ok(());
    }
    mount("tracefs", root)
}

/// Mounts a filesystem of type `fstype` (no device, no options) on `at`.
fn mount(fstype: &str, at: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c_at = std::ffi::CString::new(at.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let c_type = std::ffi::CString::new(fstype).map_err(io::Error::other)?;
    // SAFETY: all pointers are valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            c_type.as_ptr(),
            c_at.as_ptr(),
            c_type.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process shares its parent's mount namespace (true when it cannot
/// tell). `ip netns exec` unshares the mount namespace and remounts /sys just before it
/// executes its command, so a daemon it started is the first process of a new one.
fn in_parent_mount_namespace() -> bool {
    let parent = std::os::unix::process::parent_id();
    match (
        fs::read_link("/proc/self/ns/mnt"),
        fs::read_link(format!("/proc/{parent}/ns/mnt")),
    ) {
        (Ok(own), Ok(theirs)) => own == theirs,
        _ => true,
    }
}

/// Mounts bpffs on `/sys/fs/bpf` if the pin directory lies there and it is not mounted.
fn ensure_bpffs(pin_dir: &Path) -> Result<()> {
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    let root = Path::new("/sys/fs/bpf");
    if !pin_dir.starts_with(root) {
        return Ok(());
    }
    let err = |source| DatapathError::PinDir {
        path: pin_dir.to_path_buf(),
        source,
    };
    let c_root = std::ffi::CString::new("/sys/fs/bpf").map_err(|e| err(io::Error::other(e)))?;
    // SAFETY: statfs writes into the zeroed struct we own; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_root.as_ptr(), &mut st) } == 0 && st.f_type as i64 == BPF_FS_MAGIC {
        return Ok(());
    }
    // Not mounted here. Usually a host that never mounted it: mount it. In a mount
    // namespace made just for this process (`ip netns exec` remounts /sys), a bpffs
    // mounted now would be private: the pins would die with this process.
    if !in_parent_mount_namespace() {
        return Err(DatapathError::PrivateBpffs);
    }
    mount("bpf", root).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_slot_given_again_comes_with_a_new_generation() {
        let mut ids = ServiceIds::new(1);
        let first = ids.alloc().expect("a free slot");
        ids.free(first);
        let second = ids.alloc().expect("a free slot");
        assert_eq!(first.slot(), second.slot());
        assert_ne!(first, second);
    }

    #[test]
    fn a_service_id_seen_in_the_maps_is_never_handed_out() {
        // As after a restart: conntrack entries name generation 7 of slot 0, whose
        // service is gone.
        let mut ids = ServiceIds::new(1);
        ids.saw(ServiceId::new(0, 7));
        assert_eq!(ids.alloc().expect("a free slot"), ServiceId::new(0, 8));
    }
}
