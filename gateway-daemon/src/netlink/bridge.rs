//! Bridges' forwarding databases (`bridge fdb show`): which port of a bridge holds
//! which MAC, so that the hand-off program can send a packet into the port itself.

use super::*;

const AF_BRIDGE: u8 = libc::AF_BRIDGE as u8;
const NDA_LLADDR: u16 = 2;
const NDA_VLAN: u16 = 5;
const NDA_MASTER: u16 = 9;
/// The entry is the device's own (its address list), not its bridge's database: the
/// bridge's entries carry no flag of the two (NTF_MASTER is for requests).
const NTF_SELF: u8 = 0x02;

/// One entry of a forwarding database, as RTM_NEWNEIGH (family `AF_BRIDGE`) says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdbEntry {
    /// The device the MAC is reached through (a bridge port, or the bridge itself).
    pub port: u32,
    /// The bridge whose database holds it (`NDA_MASTER`; 0: the device's own list).
    pub master: u32,
    /// The MAC.
    pub mac: [u8; 6],
    /// Its VLAN (`NDA_VLAN`), if it has one.
    pub vlan: Option<u16>,
    /// An address of the bridge's own (`NUD_PERMANENT`): frames to it are the host's.
    pub local: bool,
    /// Whether the bridge holds it (`NDA_MASTER` and no `NTF_SELF`), rather than the
    /// device's own list.
    pub of_master: bool,
}

impl FdbEntry {
    /// Parses an ndmsg of family `AF_BRIDGE` and its attributes (others: `None`).
    fn parse(body: &[u8]) -> Result<Option<Self>, &'static str> {
        let (header, attrs) = split_fixed(body, NDMSG_LEN).ok_or("short ndmsg")?;
        if header[0] != AF_BRIDGE {
            return Ok(None);
        }
        let port = ne_u32(&header[4..8]).ok_or("short ndmsg")?;
        let state = ne_u16(&header[8..10]).ok_or("short ndmsg")?;
        let flags = header[10];
        let (mut master, mut mac, mut vlan) = (0, None, None);
        for attr in Attrs::new(attrs) {
            let attr = attr?;
            match attr.ty {
                NDA_MASTER => master = ne_u32(attr.value).ok_or("short NDA_MASTER")?,
                NDA_LLADDR => mac = <[u8; 6]>::try_from(attr.value).ok(),
                NDA_VLAN => vlan = Some(ne_u16(attr.value).ok_or("short NDA_VLAN")?),
                _ => {}
            }
        }
        // An entry without a 6-byte MAC is none a frame is sent to.
        let Some(mac) = mac else { return Ok(None) };
        Ok(Some(FdbEntry {
            port,
            master,
            mac,
            vlan,
            local: state & NUD_PERMANENT != 0,
            of_master: master != 0 && flags & NTF_SELF == 0,
        }))
    }
}

/// Every entry of every forwarding database (RTM_GETNEIGH dump, family `AF_BRIDGE`).
pub fn fdb() -> Result<Vec<FdbEntry>, NetlinkError> {
    const WHAT: &str = "dumping the bridges' forwarding databases";
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let mut header = [0; NDMSG_LEN];
    header[0] = AF_BRIDGE;
    let request = Request::new(RTM_GETNEIGH, NLM_F_DUMP).fixed(&header);
    let mut out = Vec::new();
    for reply in sock.dump(WHAT, &request)? {
        if reply.ty != RTM_NEWNEIGH {
            continue;
        }
        let entry = FdbEntry::parse(&reply.body)
            .map_err(|detail| NetlinkError::Malformed { what: WHAT, detail })?;
        out.extend(entry);
    }
    Ok(out)
}

/// Whether a neighbour notification datagram holds an entry of a forwarding database
/// (IP neighbours, which change all the time, do not wake the xmit thread).
pub(super) fn is_fdb_notification(datagram: &[u8]) -> bool {
    Messages::new(datagram).any(|m| {
        m.is_ok_and(|m| {
            matches!(m.ty, RTM_NEWNEIGH | RTM_DELNEIGH) && m.body.first() == Some(&AF_BRIDGE)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ndmsg(family: u8, port: u32, state: u16, flags: u8) -> [u8; NDMSG_LEN] {
        let mut m = [0; NDMSG_LEN];
        m[0] = family;
        m[4..8].copy_from_slice(&port.to_ne_bytes());
        m[8..10].copy_from_slice(&state.to_ne_bytes());
        m[10] = flags;
        m
    }

    #[test]
    fn a_learnt_entry_names_its_port_bridge_and_mac() {
        const NUD_REACHABLE: u16 = 0x02;
        let mac = [2, 0, 0, 0, 0, 0x11];
        let message = Request::new(RTM_NEWNEIGH, 0)
            .fixed(&ndmsg(AF_BRIDGE, 7, NUD_REACHABLE, 0))
            .attr(NDA_LLADDR, &mac)
            .attr(NDA_MASTER, &3u32.to_ne_bytes())
            .finish(1);
        let m = Messages::new(&message).next().unwrap().unwrap();
        let entry = FdbEntry::parse(m.body).unwrap().unwrap();
        assert_eq!(
            entry,
            FdbEntry {
                port: 7,
                master: 3,
                mac,
                vlan: None,
                local: false,
                of_master: true
            }
        );
        assert!(is_fdb_notification(&message));
    }

    #[test]
    fn ip_neighbours_are_not_forwarding_database_entries() {
        let message = Request::new(RTM_NEWNEIGH, 0)
            .fixed(&ndmsg(libc::AF_INET as u8, 7, 0x02, 0))
            .attr(NDA_LLADDR, &[2, 0, 0, 0, 0, 1])
            .finish(1);
        let m = Messages::new(&message).next().unwrap().unwrap();
        assert_eq!(FdbEntry::parse(m.body).unwrap(), None);
        assert!(!is_fdb_notification(&message));
    }

    #[test]
    fn a_local_entry_with_a_vlan_says_both() {
        let message = Request::new(RTM_NEWNEIGH, 0)
            .fixed(&ndmsg(AF_BRIDGE, 3, NUD_PERMANENT, NTF_SELF))
            .attr(NDA_LLADDR, &[2, 0, 0, 0, 0, 1])
            .attr(NDA_VLAN, &10u16.to_ne_bytes())
            .finish(1);
        let m = Messages::new(&message).next().unwrap().unwrap();
        let entry = FdbEntry::parse(m.body).unwrap().unwrap();
        assert!(entry.local);
        assert_eq!(entry.vlan, Some(10));
    }
}
