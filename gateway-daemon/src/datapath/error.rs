//! What can go wrong in the datapath, each variant with its context: callers match
//! variants (and `MapProperty`), never message text.

use std::{io, path::PathBuf};

use aya::{maps::MapError, programs::ProgramError};

/// A property of a map's shape that a pinned map and this build may disagree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapProperty {
    /// The key's size in bytes.
    KeySize,
    /// The value's size in bytes.
    ValueSize,
    /// The number of entries.
    MaxEntries,
}

impl std::fmt::Display for MapProperty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MapProperty::KeySize => "key size",
            MapProperty::ValueSize => "value size",
            MapProperty::MaxEntries => "max entries",
        })
    }
}

/// Errors of the datapath.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// Random bytes could not be read.
    #[error("drawing {what}")]
    Random {
        /// What they were for.
        what: &'static str,
        /// The error reading `/dev/urandom`.
        #[source]
        source: std::io::Error,
    },
    /// The object could not be loaded.
    #[error("loading the XDP object")]
    Load(#[source] aya::EbpfError),
    /// A map of an object given to `Datapath::load_object` has another shape than this
    /// build's (an object built with another `gateway-common`).
    #[error(
        "map {name} of the given object has {what} {found}, this build's has {wanted}: \
         the object was built with another map layout (gateway-common)"
    )]
    ObjectMap {
        /// The map's name.
        name: &'static str,
        /// The property that differs.
        what: MapProperty,
        /// Its value in the given object.
        found: u32,
        /// Its value in this build.
        wanted: u32,
    },
    /// A map of this build that an object given to `Datapath::load_object` lacks.
    #[error("the given object has no map {name} (built with another gateway-common?)")]
    ObjectMapMissing {
        /// The map's name.
        name: &'static str,
    },
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
        what: MapProperty,
        /// Its value in the pinned map.
        found: u32,
        /// Its value in this build.
        wanted: u32,
        /// The pin directory.
        dir: PathBuf,
    },
    /// The pinned conntrack holds another number of entries than asked for. Refused
    /// rather than replaced: a restart must keep the established flows, and throwing
    /// them away to resize the table is the operator's decision.
    #[error(
        "pinned conntrack {path} holds {found} entries, this daemon was asked for {wanted} \
         (--conntrack-size): restart with --conntrack-size {found} to keep the established \
         flows, or remove {path} and start again to resize it (established flows are then \
         balanced again by Maglev: to the same backend while the backends do not change)"
    )]
    ConntrackSize {
        /// Path of the pinned conntrack.
        path: PathBuf,
        /// Its entries.
        found: u32,
        /// The entries asked for.
        wanted: u32,
    },
    /// A pinned map sized by `--max-services` or `--max-backends` was pinned with
    /// another size. Refused like the conntrack: the maps hold the services served and
    /// their backends, and resizing them is the operator's decision.
    #[error(
        "pinned map {path} holds {found} {what}, this daemon was asked for {wanted} \
         ({option}): restart with {option} {found} to keep serving as before, or stop \
         berth, run `berth uninstall` (or remove {dir}) and start again with the new \
         size (established flows are then lost)"
    )]
    LimitSize {
        /// Path of the pinned map.
        path: PathBuf,
        /// What the limit counts.
        what: super::Limit,
        /// The option that sets it.
        option: &'static str,
        /// The limit the map was pinned with.
        found: u32,
        /// The limit asked for.
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
    /// Native XDP refused the interface's MTU (a program without multi-buffer support
    /// takes frames of one page at most).
    #[error(
        "attaching the XDP program to interface {iface} in native mode: its MTU ({mtu}; \
         on a veth, its peer's counts) is larger than its driver's native XDP takes for a \
         program without multi-buffer support (about 3,500 bytes on veth); lower the MTU \
         or use --xdp-mode skb (auto falls back to it)"
    )]
    XdpMtu {
        /// Interface name.
        iface: String,
        /// Its MTU (`?` if it could not be read).
        mtu: String,
        /// Cause.
        #[source]
        source: Box<ProgramError>,
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
    /// The gateway addresses could not be published in the announce table.
    #[error("gateway address routes in routing table {table} (--announce-table)")]
    AnnounceTable {
        /// The table.
        table: u32,
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
        what: super::Resource,
        /// The limit asked for.
        wanted: u32,
        /// The largest limit supported.
        max: u32,
    },
    /// The desired state does not fit the configured limits (the planner plans only
    /// what fits `Limits::services` and `Limits::backends`: a defence).
    #[error("desired state needs more {what} than the limit of {limit}")]
    Capacity {
        /// The exhausted resource.
        what: super::Resource,
        /// Its limit.
        limit: u32,
    },
}
