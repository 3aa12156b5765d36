//! What the datapath changes on the host besides its maps: the programs' links on the
//! interfaces (`links.rs`), the published gateway addresses (`addresses.rs`: the dummy
//! interface, proxy neighbours, the announce table) and the services' ports reserved
//! from the host's ephemeral ports (`reserved.rs`).

pub(super) mod addresses;
pub(super) mod links;
mod reserved;

use std::{collections::BTreeMap, path::PathBuf};

use aya::programs::links::FdLink;

use super::AttachMode;

/// The host state the datapath keeps.
#[derive(Debug)]
pub(super) struct Host {
    /// Where and whether the gateway addresses are published (`addresses.rs`).
    pub(super) publication: addresses::Publication,
    /// Ports this process reserved from the host's ephemeral ports (at start: those of
    /// the services adopted, which the run before reserved).
    pub(super) reserved: crate::host::PortSet,
    /// Links this process holds, by pin path.
    pub(super) links: BTreeMap<PathBuf, FdLink>,
    /// The mode the `--interface`s were attached in, for interfaces attached for SNAT.
    pub(super) attach_mode: AttachMode,
}

impl Default for Host {
    fn default() -> Self {
        Host {
            publication: Default::default(),
            reserved: Default::default(),
            links: BTreeMap::new(),
            attach_mode: AttachMode::Auto,
        }
    }
}
