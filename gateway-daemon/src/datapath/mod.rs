//! The kernel datapath: load the XDP program, pin and adopt its maps, attach it to
//! interfaces, and apply a desired state of services as a minimal diff.
//!
//! Everything the kernel needs to keep forwarding lives in maps pinned under the pin
//! directory, and the XDP attachments are pinned bpf links: a daemon that exits (or is
//! killed) leaves the datapath serving, and a new one adopts it without a gap.
//!
//! Files: `load.rs` loads the object and adopts pinned maps, `shapes.rs` says what each
//! map must look like (and what becomes of an earlier run's pin of another shape);
//! `diff.rs` is the services' diff (pure: installed and desired in, ordered `MapOp`s out)
//! and `apply.rs` applies it (`ids.rs` hands out service and backend ids, `pool.rs`
//! the Maglev tables' regions of their pool); `error.rs` is what can go wrong;
//! `maps.rs` holds the typed maps of services, backends, flows and counters;
//! `traffic.rs` reads counters, service statistics and flows; `host/` is what the
//! datapath changes on the host besides its maps (`links.rs` attaches the programs,
//! `addresses.rs` publishes the gateway addresses: the dummy interface, proxy
//! neighbours, the announce table; `reserved.rs` reserves the services' ports);
//! `xmit.rs` follows which interfaces take XDP frames; `desired.rs` is the datapath's
//! view of `model::DesiredState`; `capacity.rs` is what the maps hold at most and what a state takes of it
//! (the planner admits routes by it); `held_back.rs` holds back what the kernel program cannot serve (a service
//! with backends of the other family); `family.rs` is how each family's addresses are
//! held in the maps (IPv4 and IPv6 have maps of their own where keys hold addresses);
//! `maglev.rs` builds the tables; `inspect.rs` reads a pinned datapath's tables.

pub mod maglev;

mod apply;
pub mod capacity;
mod desired;
mod diff;
mod error;
mod family;
mod fdb;
pub mod held_back;
mod host;
mod ids;
mod inspect;
mod keys;
mod load;
mod maps;
mod new_services;
mod pins;
mod pool;
mod retired;
mod role_book;
mod roles;
mod shapes;
mod snat;
mod traffic;
mod writes;
mod xmit;

use std::{
    collections::BTreeMap,
    fs, io,
    net::SocketAddr,
    path::{Path, PathBuf},
};

pub use crate::model::{
    reserved_ports, Backends, DesiredState, FlowSettings, Protocol, ServiceAddr, WeightedBackend,
};
use crate::sys::bpf::lookup_batch;
pub use addresses::address_interface_mark;
use aya::{
    maps::{Array, HashMap, MapData, MapError},
    programs::{ProgramError, SchedClassifier, Xdp},
    Ebpf,
};
pub use capacity::{Capacity, Limit, Resource, Usage};
use desired::BackendSet;
pub use error::{DatapathError, MapProperty};
use family::ByFamily;
pub use family::MapAddr;
use gateway_common::{config, map_names, Flow, FlowKey, ServiceId};
use host::{addresses, links};
use ids::{IdPool, ServiceIds};
pub use inspect::{pinned_memory, pinned_tables};
pub use links::{LinkChange, LinkKind, LinkRole};
pub use load::{pinned_service_ports, remove_pins};
pub use pins::{PinDirError, PinnedDatapath, Removed};
pub use traffic::{kernel_reason, ActiveFlows, FlowScan, Traffic};
pub use xmit::{egress, follow as follow_xmit, Egress, FollowError, XmitChange, XmitMap};

/// Name of the gateway program in the object.
pub const PROGRAM: &str = "berth";
/// Name of the IPv6 gateway program, entered by tail call from `PROGRAM`.
pub const PROGRAM_V6: &str = "berth_v6";
/// Name of the ICMPv6 program, entered by tail call from `PROGRAM_V6`.
pub const PROGRAM_ICMP6: &str = "berth_icmp6";
/// Name of the program sending `berth monitor`'s events, entered by tail call from the
/// gateway programs' verdicts.
pub const MONITOR_PROGRAM: &str = "berth_monitor";
/// Name of the program counting the kernel's refused redirects (tracepoint).
pub const REDIRECT_ERR_PROGRAM: &str = "berth_redirect_err";
/// Name of the reverse-NAT program attached to the interfaces' egress (tcx).
pub const TC_PROGRAM: &str = "berth_tc";
/// Name of the hand-off program attached to the interfaces' ingress (tcx): sends out
/// the packets XDP translated for an egress that takes no XDP frames.
pub const TC_INGRESS_PROGRAM: &str = "berth_tc_in";
/// Name of the IPv6 half of `TC_PROGRAM`, entered by tail call from it.
pub const TC_PROGRAM_V6: &str = "berth_tc_v6";
/// Name of the ICMPv6 part of `TC_PROGRAM_V6`, entered by tail call from it.
pub const TC_PROGRAM_ICMP6: &str = "berth_tc_icmp6";
/// Name of the program sending the TC programs' events, entered by tail call from
/// their verdicts.
pub const TC_MONITOR_PROGRAM: &str = "berth_tc_monitor";
/// Name of a program that returns `XDP_PASS` at once (the benchmark's floor).
pub const FLOOR_PROGRAM: &str = "berth_pass";
/// Default pin directory.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/berth";
/// The instructions the kernel's verifier processes at most for one program
/// (`BPF_COMPLEXITY_LIMIT_INSNS`): past it, the program is refused ("BPF program is too
/// large"). See `Datapath::verified_instructions`.
pub const VERIFIER_INSN_LIMIT: u32 = 1_000_000;

type Result<T, E = DatapathError> = std::result::Result<T, E>;

/// The conntrack of one family.
type Conntrack<A> = HashMap<MapData, FlowKey<A>, Flow<A>>;

/// A random u32 other than 0, from the kernel's generator.
fn random_nonzero_u32() -> std::io::Result<u32> {
    use std::io::Read as _;
    let mut urandom = std::fs::File::open("/dev/urandom")?;
    loop {
        let mut bytes = [0; 4];
        urandom.read_exact(&mut bytes)?;
        let n = u32::from_ne_bytes(bytes);
        if n != 0 {
            return Ok(n);
        }
    }
}

fn map_err(name: &'static str) -> impl FnOnce(MapError) -> DatapathError {
    move |source| DatapathError::Map { name, source }
}

/// A failed bpf(2) call `call` (one aya does not make: `sys::bpf`) on the map `name`.
fn syscall_err(
    name: &'static str,
    call: &'static str,
) -> impl FnOnce(std::io::Error) -> DatapathError {
    move |io_error| {
        map_err(name)(MapError::SyscallError(aya::sys::SyscallError {
            call,
            io_error,
        }))
    }
}

/// Sizes of the maps. A restarted daemon must use the same limits to adopt the maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Services (gateway address, protocol, port) (`berth run --max-services`): at
    /// most `MAX_SERVICES`.
    pub services: u32,
    /// Backends over all services (`berth run --max-backends`): at most
    /// `MAX_BACKENDS`.
    pub backends: u32,
    /// Conntrack entries (`berth run --conntrack-size`): at most `MAX_FLOWS`.
    pub flows: u32,
    /// Fragmented datagrams tracked at once.
    pub fragments: u32,
    /// Distinct gateway addresses.
    pub addresses: u32,
}

impl Limits {
    /// Gateway addresses of each IP family the maps hold (a fixed size: a tier has a
    /// few addresses, and the planner leaves the routes of any beyond it waiting).
    pub const ADDRESSES: u32 = 256;

    /// The largest conntrack (`flows`) the daemon accepts: 2^26 entries, about 10 GB of
    /// kernel memory (an entry is a `FlowKey`, a `Flow` and the hash table's own
    /// overhead: about 150 bytes).
    pub const MAX_FLOWS: u32 = 1 << 26;

    /// The most services (`services`): as many as a service id has slots (2^20; about
    /// 300 bytes of kernel memory each over the maps sized by it, their Maglev tables
    /// being counted with the backends).
    pub const MAX_SERVICES: u32 = ServiceId::SLOTS;

    /// The most backends (`backends`): 2^22, about 1.2 KiB of kernel memory each over
    /// the maps sized by it (1 KiB of it the Maglev pool's), about 5 GB at the most.
    pub const MAX_BACKENDS: u32 = 1 << 22;

    /// Entries of the Maglev pool (`berth_maglev`): `MAGLEV_POOL_ENTRIES_PER_BACKEND`
    /// (128) per backend, which holds the tables of any state within `backends` (no
    /// table takes more per backend taking new flows), plus one largest table
    /// (`MAGLEV_MAX_SIZE`) for the new table of the service being switched (written
    /// before its old one is given back). An entry is 4 bytes, but the kernel gives
    /// each array value an 8-byte slot: 1 KiB of kernel memory per backend.
    pub fn maglev_pool_entries(&self) -> u32 {
        self.backends
            .saturating_mul(gateway_common::MAGLEV_POOL_ENTRIES_PER_BACKEND)
            .saturating_add(gateway_common::MAGLEV_MAX_SIZE)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            services: 16384,
            backends: 65536,
            flows: 262_144,
            fragments: 8192,
            addresses: Limits::ADDRESSES,
        }
    }
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
    /// A link pinned by an earlier run now runs this program (atomic replacement), in
    /// the mode that run attached it in (if the kernel says).
    Replaced(Option<AttachMode>),
    /// Attached afresh in this mode.
    New(AttachMode),
}

/// One service as installed in the maps.
#[derive(Clone, Debug)]
struct Installed {
    id: ServiceId,
    /// The table's region of the Maglev pool (empty: no backend takes new flows).
    table: pool::Region,
    /// The adopted region could not be kept (overlapping another, or outside the
    /// pool): the table is written afresh by the next apply.
    table_lost: bool,
    /// SNAT mode (`Service::flags`).
    snat: bool,
    /// Endpoint → (backend id, weight).
    backends: InstalledBackends,
}

/// A service's installed backends, endpoint → (backend id, weight), ordered by
/// endpoint: one exact allocation, where a `BTreeMap` took a node of about 450 bytes for
/// the single backend most services have (45 MB at 100,000 routes).
type InstalledBackends = crate::vec_map::VecMap<SocketAddr, (u32, u16)>;

impl Installed {
    fn same_backends(&self, want: &BackendSet) -> bool {
        !self.table_lost
            && self.backends.len() == want.len()
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
    /// The maps of services, backends, flows and counters.
    maps: maps::Maps,
    installed: BTreeMap<ServiceAddr, Installed>,
    /// Installed services per address and port.
    keys: keys::Keys,
    /// The state last applied in full: what is installed, unless the maps were changed
    /// behind the daemon's back (only by the daemon itself, which forgets this first).
    applied: Option<std::sync::Arc<DesiredState>>,
    /// The backends of `applied`'s services, counted with duplicates (a bound of the
    /// distinct backends it takes, followed change by change).
    applied_backends: u64,
    /// The services of the state last applied that the kernel program does not serve.
    held_back: Vec<held_back::HeldBack>,
    /// Links, published addresses and reserved ports (`host/`).
    host: host::Host,
    /// The shared lock on the pin directory, held while this process uses it
    /// (`berth uninstall` refuses while anyone holds it).
    _pin_lock: pins::PinDirLock,
    service_ids: ServiceIds,
    tables: pool::TablePool,
    backend_ids: IdPool,
    /// Backends that left their TCP services and still carry connections.
    retirees: retired::Retirees,
    /// SNAT mode's maps and what this process wrote into them.
    snat: snat::Snat,
    /// The address filter and the reply index.
    roles: roles::RoleMaps,
    /// The flow settings in force (`DesiredState::traffic` as last applied): the
    /// services' affinity in their flags, their idle timeouts in the conntrack scan.
    traffic: imbl::OrdMap<ServiceAddr, FlowSettings>,
}

impl Datapath {
    /// A loaded program of the object (`PROGRAM` or `FLOOR_PROGRAM`), e.g. for
    /// `BPF_PROG_TEST_RUN`.
    pub fn program_mut(&mut self, name: &'static str) -> Result<&mut Xdp> {
        xdp(&mut self.ebpf, name)
    }

    /// The loaded TC program, e.g. for `BPF_PROG_TEST_RUN`.
    pub fn tc_program_mut(&mut self) -> Result<&mut SchedClassifier> {
        links::tc_program(&mut self.ebpf)
    }

    /// The loaded TC program `name` (`TC_INGRESS_PROGRAM`, ...), e.g. for
    /// `BPF_PROG_TEST_RUN`.
    pub fn classifier_mut(&mut self, name: &'static str) -> Result<&mut SchedClassifier> {
        links::classifier(&mut self.ebpf, name)
    }

    /// The instructions the kernel's verifier processed to accept each loaded program
    /// (`bpf_prog_info.verified_insns`), largest first: how near each program is to
    /// `VERIFIER_INSN_LIMIT`, which a kernel whose verifier explores more paths (or a
    /// change to the program) can cross. 0 where the kernel does not say.
    pub fn verified_instructions(&self) -> Vec<(String, u32)> {
        let mut counts: Vec<(String, u32)> = self
            .ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some((
                    name.to_string(),
                    info.verified_instruction_count().unwrap_or(0),
                ))
            })
            .collect();
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        counts
    }

    /// The pin directory.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Sets the new flows per second per CPU above which the program stops recording
    /// new flows (`gateway_common::config::NEW_FLOW_LIMIT`; 0: no limit).
    pub fn set_new_flow_limit(&mut self, per_cpu_per_second: u32) -> Result<()> {
        self.set_config(config::NEW_FLOW_LIMIT, per_cpu_per_second)
    }

    /// Sets where replies may come from (`gateway_common::config::REPLY_ORIGIN`): with
    /// `any`, from any interface and neighbour; otherwise only from where the gateway
    /// sends their backend's packets (else dropped as `reply_spoofed`).
    pub fn set_reply_origin_any(&mut self, any: bool) -> Result<()> {
        let value = if any {
            config::REPLY_ORIGIN_ANY
        } else {
            config::REPLY_ORIGIN_BACKEND
        };
        self.set_config(config::REPLY_ORIGIN, value)
    }

    /// Turns the monitor's events off if the `berth monitor` that turned them on is
    /// gone (killed before it could; silent for `config::MONITOR_STALE_SECS`): its
    /// process id, then.
    pub fn forget_gone_monitor(&mut self) -> Result<Option<u32>> {
        let config = self.config()?;
        let read = |slot| config.get(&slot, 0).map_err(map_err(map_names::CONFIG));
        let (pid, alive) = (read(config::MONITOR)?, read(config::MONITOR_ALIVE)?);
        if pid == 0 || !crate::monitor::stale(alive) {
            return Ok(None);
        }
        self.set_config(config::MONITOR, 0)?;
        Ok(Some(pid))
    }

    /// Gives the datapath its hand-off secret (`config::HANDOFF_NONCE`) unless the pins
    /// already hold one (a restart keeps it: a packet between XDP and TC at that moment
    /// is not lost to a new secret).
    fn ensure_handoff_nonce(&mut self) -> Result<()> {
        let name = map_names::CONFIG;
        let have = self
            .config()?
            .get(&config::HANDOFF_NONCE, 0)
            .map_err(map_err(name))?;
        if have != 0 {
            return Ok(());
        }
        let nonce = random_nonzero_u32().map_err(|source| DatapathError::Random {
            what: "the hand-off secret",
            source,
        })?;
        self.set_config(config::HANDOFF_NONCE, nonce)
    }

    /// Writes `value` into slot `slot` of the program's config map.
    fn set_config(&mut self, slot: u32, value: u32) -> Result<()> {
        self.config()?
            .set(slot, value, 0)
            .map_err(map_err(map_names::CONFIG))
    }

    /// The program's config map.
    fn config(&mut self) -> Result<Array<&mut MapData, u32>> {
        let name = map_names::CONFIG;
        let map = self.ebpf.map_mut(name).ok_or(DatapathError::Map {
            name,
            source: MapError::InvalidName {
                name: name.to_string(),
            },
        })?;
        Array::try_from(map).map_err(map_err(name))
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

fn ifindex(iface: &str) -> Option<u32> {
    crate::sys::iface::name_to_index(iface)
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
