//! How a packet leaves by each interface (`berth_xmit`): the daemon keeps the map equal
//! to what the kernel says of the interfaces. Those that accept XDP frames are
//! redirected into by XDP; other Ethernet interfaces (bridges, veths whose peer runs
//! no XDP) by the hand-off program on TC ingress (`bpf_redirect`, or
//! `bpf_redirect_peer` into a veth peer's namespace, or into the port of a bridge that
//! holds the next hop's MAC, `fdb.rs`); the program sends every other packet through
//! the kernel.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use aya::maps::{Array, MapData, MapError};
use gateway_common::{
    map_names, XMIT_EGRESS, XMIT_HANDOFF_IN, XMIT_OK, XMIT_SLOTS, XMIT_TC, XMIT_TC_BRIDGE,
    XMIT_TC_PEER,
};

use super::{
    fdb::{self, FdbMap},
    lookup_batch, map_err, Result,
};
use crate::netlink::{EtherKind, EtherLink};

/// How a packet the XDP program translated leaves by an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Egress {
    /// XDP redirects it (the interface takes XDP frames).
    Xdp,
    /// The hand-off program on TC ingress redirects it (`bpf_redirect`).
    Tc,
    /// The hand-off program sends it into the namespace of the veth's peer
    /// (`bpf_redirect_peer`).
    TcPeer,
    /// A bridge: the hand-off program sends it into the port that holds the next hop's
    /// MAC (`berth_fdb`), else into the bridge.
    TcBridge,
}

impl Egress {
    fn value(self) -> u32 {
        match self {
            Egress::Xdp => XMIT_OK,
            Egress::Tc => XMIT_TC,
            Egress::TcPeer => XMIT_TC_PEER,
            Egress::TcBridge => XMIT_TC_BRIDGE,
        }
    }

    fn of(value: u32) -> Option<Self> {
        [Egress::Xdp, Egress::Tc, Egress::TcPeer, Egress::TcBridge]
            .into_iter()
            .find(|e| e.value() == value)
    }

    /// What it means for the packets, for the log.
    pub fn describe(self) -> &'static str {
        match self {
            Egress::Xdp => "takes XDP frames: packets to it are redirected by XDP",
            Egress::Tc => "takes no XDP frames: packets to it are redirected by TC (bpf_redirect)",
            Egress::TcPeer => {
                "a veth into another namespace without XDP: packets to it are sent into its \
                 peer by TC (bpf_redirect_peer)"
            }
            Egress::TcBridge => {
                "a bridge: packets to it are sent by TC into the port that holds their \
                 destination MAC (or into the bridge, for a MAC not learnt yet)"
            }
        }
    }
}

/// A handle of its own on the pinned map, so that a thread following the kernel's
/// link notifications can keep it current while the planner owns the `Datapath`.
pub struct XmitMap {
    map: Array<MapData, u32>,
    /// The map's non-zero values.
    have: BTreeMap<u32, u32>,
}

/// What `XmitMap::set` changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XmitChange {
    /// Interfaces whose way out is new or changed.
    pub added: Vec<(u32, Egress)>,
    /// Interfaces whose packets now go through the kernel.
    pub removed: Vec<u32>,
    /// Interfaces whose index is beyond the map (their packets take the kernel's
    /// path).
    pub beyond: Vec<u32>,
}

impl XmitMap {
    /// Opens the map pinned in `pin_dir` (by `Datapath::load`) and reads what it holds.
    pub fn open(pin_dir: &Path) -> Result<Self> {
        let name = map_names::XMIT;
        let data = MapData::from_pin(pin_dir.join(name)).map_err(map_err(name))?;
        let map = Array::try_from(aya::maps::Map::Array(data)).map_err(map_err(name))?;
        let mut have = BTreeMap::new();
        {
            use aya::maps::IterableMap as _;
            let fd = std::os::fd::AsFd::as_fd(map.map().fd());
            lookup_batch(fd, 4, 4, |k, v| {
                let index = u32::from_ne_bytes(k.try_into().unwrap_or_default());
                let value = u32::from_ne_bytes(v.try_into().unwrap_or_default());
                if value != 0 {
                    have.insert(index, value);
                }
            })
            .map_err(|io_error| {
                map_err(name)(MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_lookup_batch",
                    io_error,
                }))
            })?;
        }
        Ok(XmitMap { map, have })
    }

    /// Makes the map hold exactly `want`, and `XMIT_HANDOFF_IN` for the interfaces in
    /// `handoff_in` (indices beyond the map are left out and reported). Entries are
    /// removed before any is added or changed.
    pub fn set(
        &mut self,
        want: &BTreeMap<u32, Egress>,
        handoff_in: &BTreeSet<u32>,
    ) -> Result<XmitChange> {
        let name = map_names::XMIT;
        let mut change = XmitChange::default();
        let mut fits = values(want, handoff_in);
        fits.retain(|&i, _| {
            let ok = i < XMIT_SLOTS;
            if !ok {
                change.beyond.push(i);
            }
            ok
        });
        for &i in self.have.keys().filter(|i| !fits.contains_key(i)) {
            self.map.set(i, 0, 0).map_err(map_err(name))?;
            change.removed.push(i);
        }
        for (&i, &v) in fits.iter().filter(|(i, v)| self.have.get(i) != Some(v)) {
            self.map.set(i, v, 0).map_err(map_err(name))?;
            if let Some(e) = Egress::of(v & XMIT_EGRESS) {
                if self.have.get(&i).map(|h| h & XMIT_EGRESS) != Some(v & XMIT_EGRESS) {
                    change.added.push((i, e));
                }
            }
        }
        self.have = fits;
        Ok(change)
    }
}

/// The map's values: each interface's way out, and `XMIT_HANDOFF_IN` for those in
/// `handoff_in`.
fn values(want: &BTreeMap<u32, Egress>, handoff_in: &BTreeSet<u32>) -> BTreeMap<u32, u32> {
    let mut out: BTreeMap<u32, u32> = want.iter().map(|(&i, e)| (i, e.value())).collect();
    for &i in handoff_in {
        *out.entry(i).or_default() |= XMIT_HANDOFF_IN;
    }
    out
}

/// How packets leave by each interface: XDP into those in `xdp` (they take XDP frames),
/// the hand-off program into the other Ethernet ones (`ethernet`), the kernel otherwise.
pub fn egress(xdp: &BTreeSet<u32>, ethernet: &BTreeMap<u32, EtherLink>) -> BTreeMap<u32, Egress> {
    let tc = ethernet.iter().map(|(&i, l)| {
        let e = match l.kind {
            EtherKind::Plain => Egress::Tc,
            EtherKind::PeerElsewhere => Egress::TcPeer,
            EtherKind::Bridge => Egress::TcBridge,
        };
        (i, e)
    });
    tc.chain(xdp.iter().map(|&i| (i, Egress::Xdp))).collect()
}

/// Keeps `berth_xmit` equal to what the kernel says of the interfaces (`egress`), and
/// `berth_fdb` to the bridges' forwarding databases (`fdb::ports`): reads them at once
/// (before returning, so the program is right from the start), then on a thread of its
/// own again whenever the kernel announces a link, xdp-features or forwarding-database
/// change, and every `RECHECK` in case a notification was lost. Where the kernel cannot
/// say (older than 6.3), the map stays empty: every packet takes the kernel's path,
/// which is slower but never loses a packet.
pub fn follow(pin_dir: &Path) -> Result<std::thread::JoinHandle<()>, FollowError> {
    const RECHECK: std::time::Duration = std::time::Duration::from_secs(10);
    let mut map = XmitMap::open(pin_dir)?;
    let mut fdb = FdbMap::open(pin_dir)?;
    let mut events = crate::netlink::LinkEvents::new()?;
    let mut attached = Attached::new(pin_dir);
    sync(&mut map, &mut fdb, &mut attached);
    std::thread::Builder::new()
        .name("berth-xmit".into())
        .spawn(move || loop {
            if let Err(e) = events.wait(RECHECK) {
                tracing::warn!(error = %crate::error_chain(&e), "link notifications");
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
            sync(&mut map, &mut fdb, &mut attached);
        })
        .map_err(FollowError::Thread)
}

/// The attached interfaces (those with a link pinned) that existed at the last pass,
/// by index, with their names: an interface deleted under the datapath is logged once,
/// by name. (It used to go unlogged: its programs vanished with it, silently.)
struct Attached {
    pin_dir: std::path::PathBuf,
    present: std::collections::BTreeMap<u32, String>,
}

impl Attached {
    fn new(pin_dir: &Path) -> Self {
        Attached {
            pin_dir: pin_dir.to_path_buf(),
            present: Default::default(),
        }
    }

    /// Takes the interfaces that exist now (index → name); returns the attached ones
    /// that existed at the last pass and are gone.
    fn pass(&mut self, now: &std::collections::BTreeMap<u32, String>) -> Vec<(u32, String)> {
        let attached = super::links::attached(&self.pin_dir).into_keys().collect();
        gone_since(&mut self.present, &attached, now)
    }
}

/// Updates `present` (attached interfaces that existed, with their names) to the
/// `attached` ones that exist `now`; returns those that were present and are gone.
fn gone_since(
    present: &mut std::collections::BTreeMap<u32, String>,
    attached: &BTreeSet<u32>,
    now: &std::collections::BTreeMap<u32, String>,
) -> Vec<(u32, String)> {
    let gone = present
        .iter()
        .filter(|(i, _)| !now.contains_key(i))
        .map(|(i, n)| (*i, n.clone()))
        .collect();
    *present = attached
        .iter()
        .filter_map(|i| now.get(i).map(|n| (*i, n.clone())))
        .collect();
    gone
}

/// Errors of `follow`.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// The pinned map could not be opened.
    #[error("opening the xmit map")]
    Map(#[from] super::DatapathError),
    /// The notification sockets could not be opened.
    #[error("subscribing to link notifications")]
    Netlink(#[from] crate::netlink::NetlinkError),
    /// The thread could not be started.
    #[error("starting the xmit thread")]
    Thread(#[source] std::io::Error),
}

/// One pass: the kernel's lists into the maps, changes logged; attached interfaces that
/// are gone logged.
fn sync(map: &mut XmitMap, fdb: &mut FdbMap, attached: &mut Attached) {
    let names = crate::netlink::links();
    if let Ok(names) = &names {
        for (ifindex, iface) in attached.pass(names) {
            tracing::warn!(
                iface,
                ifindex,
                "an attached interface is gone (deleted): its XDP and TC programs went with \
                 it; an interface made again under that name is attached when berth restarts"
            );
        }
    }
    let xdp = match crate::netlink::xdp_xmit_interfaces() {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(
                error = %crate::error_chain(&e),
                "cannot learn which interfaces take XDP frames: none is redirected into by XDP"
            );
            BTreeSet::new()
        }
    };
    let ethernet = match crate::netlink::ethernet_links() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(
                error = %crate::error_chain(&e),
                "cannot list the Ethernet interfaces: none is redirected into by TC"
            );
            BTreeMap::new()
        }
    };
    let want = egress(&xdp, &ethernet);
    sync_fdb(fdb, &ethernet);
    let handoff_in = super::links::handoff_ingresses(&attached.pin_dir);
    match map.set(&want, &handoff_in) {
        Ok(change) => {
            let names = names.unwrap_or_default();
            let name = |i: &u32| names.get(i).cloned().unwrap_or_else(|| format!("#{i}"));
            for (i, e) in &change.added {
                tracing::info!(iface = name(i), "{}", e.describe());
            }
            for i in &change.removed {
                tracing::info!(iface = name(i), "packets to it go through the kernel");
            }
            for i in &change.beyond {
                tracing::warn!(
                    iface = name(i),
                    "interface index beyond the xmit map: packets to it go through the kernel"
                );
            }
        }
        Err(e) => tracing::warn!(error = %crate::error_chain(&e), "updating the xmit map"),
    }
}

/// The bridges' forwarding databases into `berth_fdb`.
fn sync_fdb(map: &mut FdbMap, ethernet: &BTreeMap<u32, EtherLink>) {
    let entries = match crate::netlink::fdb() {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(
                error = %crate::error_chain(&e),
                "cannot read the bridges' forwarding databases: packets go into the bridges"
            );
            Vec::new()
        }
    };
    match map.set(&fdb::ports(ethernet, &entries)) {
        Ok(change) => {
            if change.written + change.removed > 0 {
                tracing::debug!(
                    written = change.written,
                    removed = change.removed,
                    "bridge ports' MACs updated"
                );
            }
            if let Some(beyond) = change.beyond.filter(|&n| n > 0) {
                tracing::warn!(
                    beyond,
                    room = gateway_common::FDB_ENTRIES,
                    "bridge ports' MACs beyond the map: packets to them go into their bridge"
                );
            }
        }
        Err(e) => tracing::warn!(error = %crate::error_chain(&e), "updating the fdb map"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdp_takes_what_accepts_its_frames_tc_the_other_ethernet_links() {
        // 1: lo (not Ethernet), 2: a NIC with XDP frames, 3: a bridge, 4: a pod's veth
        // (peer in another namespace), 5: a veth whose peer takes XDP frames, 6: a
        // tunnel (not Ethernet) that says it takes XDP frames, 7: a default veth.
        let xdp: BTreeSet<u32> = [2, 5, 6].into();
        let link = |kind| EtherLink {
            kind,
            port_of: None,
        };
        let ethernet: BTreeMap<u32, EtherLink> = [
            (2, link(EtherKind::Plain)),
            (3, link(EtherKind::Bridge)),
            (4, link(EtherKind::PeerElsewhere)),
            (5, link(EtherKind::PeerElsewhere)),
            (7, link(EtherKind::Plain)),
        ]
        .into();
        let want: BTreeMap<u32, Egress> = [
            (2, Egress::Xdp),
            (3, Egress::TcBridge),
            (4, Egress::TcPeer),
            (5, Egress::Xdp),
            (6, Egress::Xdp),
            (7, Egress::Tc),
        ]
        .into();
        assert_eq!(egress(&xdp, &ethernet), want);
        let handoff_in: BTreeSet<u32> = [2, 3, 9].into();
        let values = values(&want, &handoff_in);
        assert_eq!(values[&2], XMIT_OK | XMIT_HANDOFF_IN);
        assert_eq!(values[&3], XMIT_TC_BRIDGE | XMIT_HANDOFF_IN);
        assert_eq!(values[&7], XMIT_TC);
        assert_eq!(values[&9], XMIT_HANDOFF_IN, "an ingress that is no egress");
        for e in [Egress::Xdp, Egress::Tc, Egress::TcPeer, Egress::TcBridge] {
            assert_eq!(Egress::of(e.value()), Some(e));
        }
        assert_eq!(Egress::of(0), None, "0: the kernel");
    }

    #[test]
    fn an_attached_interface_that_is_deleted_is_reported_once_by_name() {
        let names = |l: &[(u32, &str)]| -> std::collections::BTreeMap<u32, String> {
            l.iter().map(|(i, n)| (*i, n.to_string())).collect()
        };
        let attached: BTreeSet<u32> = [3, 4].into();
        let mut present = Default::default();
        let all = names(&[(1, "lo"), (3, "c0"), (4, "b1")]);
        assert!(gone_since(&mut present, &attached, &all).is_empty());
        let without_b1 = names(&[(1, "lo"), (3, "c0")]);
        assert_eq!(
            gone_since(&mut present, &attached, &without_b1),
            vec![(4, "b1".to_string())]
        );
        assert!(
            gone_since(&mut present, &attached, &without_b1).is_empty(),
            "once per event"
        );
        // An interface that is not attached going away is not reported.
        let attached_c0: BTreeSet<u32> = [3].into();
        assert!(gone_since(&mut present, &attached_c0, &names(&[(3, "c0")])).is_empty());
    }
}
