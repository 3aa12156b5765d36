//! `berth_fdb`: which port of a bridge holds which MAC, for the hand-off program, which
//! sends a packet into the port itself rather than into the bridge (`handoff.rs`). The
//! xmit thread keeps it equal to the kernel's forwarding databases of the bridges it
//! redirects into.

use std::{collections::BTreeMap, path::Path};

use aya::maps::{HashMap, MapData};
use gateway_common::{map_names, FdbKey, FDB_ENTRIES};

use super::{map_err, Result};
use crate::netlink::{EtherKind, EtherLink, FdbEntry};

/// The (bridge, MAC) → port entries the program may use: a bridge without VLAN
/// filtering (`EtherKind::Bridge`), an entry of its own database (not a device's own
/// address list), not one of the bridge's own addresses (frames to those are the
/// host's), and a port that forwards (STP) and is still that bridge's.
pub fn ports(links: &BTreeMap<u32, EtherLink>, fdb: &[FdbEntry]) -> BTreeMap<FdbKey, u32> {
    let is_bridge = |i: u32| links.get(&i).is_some_and(|l| l.kind == EtherKind::Bridge);
    let forwards_for =
        |port: u32, bridge: u32| links.get(&port).is_some_and(|l| l.port_of == Some(bridge));
    fdb.iter()
        .filter(|e| {
            e.of_master
                && !e.local
                && e.vlan.is_none()
                && e.port != e.master
                && is_bridge(e.master)
                && forwards_for(e.port, e.master)
        })
        .map(|e| {
            let key = FdbKey {
                bridge: e.master,
                mac: e.mac,
                pad: [0; 2],
            };
            (key, e.port)
        })
        .collect()
}

/// A handle of its own on the pinned map (as `XmitMap`).
pub struct FdbMap {
    map: HashMap<MapData, FdbKey, u32>,
    have: BTreeMap<FdbKey, u32>,
    /// Entries left out at the last `set` for want of room.
    beyond: usize,
}

/// What `FdbMap::set` changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FdbChange {
    /// Entries written (new or moved to another port).
    pub written: usize,
    /// Entries removed.
    pub removed: usize,
    /// Entries left out for want of room (their packets go into the bridge), if that
    /// number changed.
    pub beyond: Option<usize>,
}

impl FdbMap {
    /// Opens the map pinned in `pin_dir` (by `Datapath::load`) and reads what it holds.
    pub fn open(pin_dir: &Path) -> Result<Self> {
        let name = map_names::FDB;
        let data = MapData::from_pin(pin_dir.join(name)).map_err(map_err(name))?;
        let map: HashMap<MapData, FdbKey, u32> =
            HashMap::try_from(aya::maps::Map::HashMap(data)).map_err(map_err(name))?;
        let have = map
            .iter()
            .collect::<std::result::Result<_, _>>()
            .map_err(map_err(name))?;
        Ok(FdbMap {
            map,
            have,
            beyond: 0,
        })
    }

    /// Makes the map hold exactly `want`, or as much of it as fits (the rest is
    /// reported). Entries are removed before any is added.
    pub fn set(&mut self, want: &BTreeMap<FdbKey, u32>) -> Result<FdbChange> {
        let name = map_names::FDB;
        let room = FDB_ENTRIES as usize;
        let fits: BTreeMap<FdbKey, u32> = want.iter().take(room).map(|(k, v)| (*k, *v)).collect();
        let mut change = FdbChange::default();
        let stale: Vec<FdbKey> = self
            .have
            .keys()
            .filter(|k| !fits.contains_key(k))
            .copied()
            .collect();
        for key in stale {
            match self.map.remove(&key) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(name)(e)),
            }
            self.have.remove(&key);
            change.removed += 1;
        }
        for (key, &port) in &fits {
            if self.have.get(key) != Some(&port) {
                self.map.insert(key, port, 0).map_err(map_err(name))?;
                self.have.insert(*key, port);
                change.written += 1;
            }
        }
        let beyond = want.len() - fits.len();
        if beyond != self.beyond {
            self.beyond = beyond;
            change.beyond = Some(beyond);
        }
        Ok(change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BRIDGE: u32 = 3;

    fn link(kind: EtherKind, port_of: Option<u32>) -> EtherLink {
        EtherLink { kind, port_of }
    }

    fn learnt(port: u32, last: u8) -> FdbEntry {
        FdbEntry {
            port,
            master: BRIDGE,
            mac: [2, 0, 0, 0, 0, last],
            vlan: None,
            local: false,
            of_master: true,
        }
    }

    #[test]
    fn only_learnt_macs_of_forwarding_ports_of_plain_bridges_are_used() {
        // 3: a bridge; 4, 5: its ports (5 blocked by STP); 6: a bridge with VLAN
        // filtering (Plain); 7: its port; 8: a pod veth, no port.
        let links: BTreeMap<u32, EtherLink> = [
            (BRIDGE, link(EtherKind::Bridge, None)),
            (4, link(EtherKind::PeerElsewhere, Some(BRIDGE))),
            (5, link(EtherKind::PeerElsewhere, None)),
            (6, link(EtherKind::Plain, None)),
            (7, link(EtherKind::PeerElsewhere, Some(6))),
            (8, link(EtherKind::PeerElsewhere, None)),
        ]
        .into();
        let fdb = [
            learnt(4, 0x11),
            // The bridge's own address on its port.
            FdbEntry {
                local: true,
                ..learnt(4, 0x12)
            },
            // The port device's own address list.
            FdbEntry {
                of_master: false,
                master: 0,
                ..learnt(4, 0x13)
            },
            FdbEntry {
                vlan: Some(10),
                ..learnt(4, 0x14)
            },
            learnt(5, 0x15),
            FdbEntry {
                master: 6,
                ..learnt(7, 0x16)
            },
            // An entry of the bridge device itself.
            learnt(BRIDGE, 0x17),
            // An entry naming a port the link dump saw on no bridge (raced a change).
            learnt(8, 0x18),
        ];
        let want: BTreeMap<FdbKey, u32> = [(
            FdbKey {
                bridge: BRIDGE,
                mac: [2, 0, 0, 0, 0, 0x11],
                pad: [0; 2],
            },
            4,
        )]
        .into();
        assert_eq!(ports(&links, &fdb), want);
    }
}
