//! Raw netlink: which interfaces accept redirected XDP frames, notifications when links
//! or their XDP features change, a dummy link holding the gateway's /32 addresses, and
//! host routes of one protocol in one routing table (`--announce-table`), where the
//! operator's routing daemon imports them.
//!
//! Every call opens its own socket, so it acts in the network namespace of the calling
//! thread at the time of the call. Replies are parsed, not trusted: every length is
//! checked before it is used. The system calls live in `crate::sys::netlink_socket`.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    net::IpAddr,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    time::{Duration, Instant},
};

use crate::sys::netlink_socket as sys;

mod bridge;
mod events;
mod objects;
mod routes;
mod socket;
mod wire;

pub use bridge::{fdb, FdbEntry};
pub use events::LinkEvents;
use objects::*;
use routes::*;
pub use routes::{
    add_host_route, host_routes, remove_host_route, route_oif, HostRoute, RouteAdded, RTPROT_BERTH,
};
use socket::*;
use wire::*;

// Netlink framing (include/uapi/linux/netlink.h).
const NLMSG_HDRLEN: usize = 16;
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_REPLACE: u16 = 0x100;
/// In an NLMSG_ERROR: the request is not echoed back, only its header.
const NLM_F_CAPPED: u16 = 0x100;
/// In an NLMSG_ERROR or NLMSG_DONE: extended-ack attributes follow.
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLA_HDRLEN: usize = 4;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | (1 << 14));

// rtnetlink (include/uapi/linux/rtnetlink.h, if_link.h, if_addr.h).
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;
const RTM_GETNEIGH: u16 = 30;
/// `ndmsg.ndm_flags`: a proxy entry (the host answers neighbour solicitations for it).
const NTF_PROXY: u8 = 0x08;
const NUD_PERMANENT: u16 = 0x80;
const NDA_DST: u16 = 1;
const NDMSG_LEN: usize = 12;
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NEIGH: u32 = 3;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_IFALIAS: u16 = 20;
/// `IFLA_LINK_NETNSID`: the namespace of the link's other end, when it is another.
const IFLA_LINK_NETNSID: u16 = 37;
/// `ARPHRD_ETHER`: a link that carries Ethernet frames.
const ARPHRD_ETHER: u16 = 1;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const IFLA_INFO_SLAVE_KIND: u16 = 4;
const IFLA_INFO_SLAVE_DATA: u16 = 5;
const IFLA_MASTER: u16 = 10;
const IFLA_BR_VLAN_FILTERING: u16 = 7;
const IFLA_BRPORT_STATE: u16 = 1;
const BR_STATE_FORWARDING: u8 = 3;
/// `IFLA_XDP`: nested, the XDP programs attached to the link.
const IFLA_XDP: u16 = 43;
/// `IFLA_XDP_ATTACHED` inside `IFLA_XDP`: a `u8`, `XDP_ATTACHED_*`.
const IFLA_XDP_ATTACHED: u16 = 2;
/// `XDP_ATTACHED_DRV`: a native (driver) program.
pub const XDP_ATTACHED_DRV: u8 = 1;
/// `XDP_ATTACHED_SKB`: a generic (skb) program.
pub const XDP_ATTACHED_SKB: u8 = 2;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFINFOMSG_LEN: usize = 16;
const IFADDRMSG_LEN: usize = 8;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;
/// In a delete request: any scope.
const RT_SCOPE_NOWHERE: u8 = 255;
const RTN_UNICAST: u8 = 1;
/// `rtm_table` of a table above 255, whose number then travels in RTA_TABLE.
const RT_TABLE_COMPAT: u8 = 252;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_TABLE: u16 = 15;
const RTMSG_LEN: usize = 12;
/// A socket option: the kernel filters dumps by the request's header and attributes
/// (Linux 4.20+), so a dump of one table does not walk a full BGP table to userspace.
const NETLINK_GET_STRICT_CHK: libc::c_int = 12;
/// IFNAMSIZ, including the terminating NUL.
const IFNAMSIZ: usize = 16;

// Generic netlink controller (include/uapi/linux/genetlink.h).
const GENL_ID_CTRL: u16 = 0x10;
const GENL_HDRLEN: usize = 4;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_VERSION: u8 = 2;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const CTRL_ATTR_MCAST_GROUPS: u16 = 7;
const CTRL_ATTR_MCAST_GRP_NAME: u16 = 1;
const CTRL_ATTR_MCAST_GRP_ID: u16 = 2;

// The netdev family (include/uapi/linux/netdev.h, Linux 6.3+).
const NETDEV_FAMILY_NAME: &str = "netdev";
const NETDEV_FAMILY_VERSION: u8 = 1;
const NETDEV_MCGRP_MGMT: &str = "mgmt";
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
const NETDEV_XDP_ACT_NDO_XMIT: u64 = 1 << 2;

/// Large enough for any datagram the kernel sends: dumps fill at most 32 KiB.
const RECV_BUF: usize = 64 * 1024;
/// How long a request waits for the kernel's answer before giving up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a dump is restarted when the kernel reports it was interrupted by changes.
const DUMP_ATTEMPTS: usize = 5;
/// At most this many notifications are drained per socket in one `wait`, so a storm of
/// changes cannot keep the caller from acting on them.
const DRAIN_LIMIT: usize = 1024;

/// Errors of netlink requests.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// A socket call failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The system call's error.
        #[source]
        source: io::Error,
    },
    /// The kernel answered a request with an error.
    #[error("{what}: {}{}", io::Error::from_raw_os_error(*.errno), detail(.message))]
    Kernel {
        /// The request.
        what: &'static str,
        /// The error number (positive, as in `errno`).
        errno: i32,
        /// The kernel's extended-ack text, when it gave one.
        message: Option<String>,
    },
    /// The kernel lacks a feature the request needs.
    #[error("{what} is not supported by this kernel")]
    Unsupported {
        /// The missing feature.
        what: &'static str,
    },
    /// A reply from the kernel did not parse.
    #[error("{what}: malformed reply: {detail}")]
    Malformed {
        /// The request.
        what: &'static str,
        /// What was wrong with the reply.
        detail: &'static str,
    },
    /// A dump was interrupted by concurrent changes every time it was tried.
    #[error("{what}: interrupted by concurrent changes {DUMP_ATTEMPTS} times")]
    Interrupted {
        /// The dump.
        what: &'static str,
    },
    /// The name cannot be an interface name.
    #[error("invalid interface name {name:?}")]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// The name belongs to a link that is not a dummy; it is left alone.
    #[error("link {name} exists and is not a dummy (kind: {})", .kind.as_deref().unwrap_or("none"))]
    NotDummy {
        /// The link's name.
        name: String,
        /// The link's kind (`IFLA_INFO_KIND`), if it has one.
        kind: Option<String>,
    },
    /// The name is an alternative name of another link; that link is left alone.
    #[error("{name} is an alternative name of link {holder}")]
    AltName {
        /// The name given.
        name: String,
        /// The link holding it.
        holder: String,
    },
}

fn detail(message: &Option<String>) -> String {
    message
        .as_deref()
        .map(|m| format!(" ({m})"))
        .unwrap_or_default()
}

impl NetlinkError {
    fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// Interfaces (ifindex) that accept XDP frames redirected into them: the netdev generic-netlink
/// family's dev-get dump, NETDEV_A_DEV_XDP_FEATURES containing NETDEV_XDP_ACT_NDO_XMIT.
pub fn xdp_xmit_interfaces() -> Result<BTreeSet<u32>, NetlinkError> {
    const WHAT: &str = "dumping the XDP features of interfaces (netdev dev-get)";
    let mut sock = Socket::open(libc::NETLINK_GENERIC)?;
    let family = resolve_family(&mut sock, NETDEV_FAMILY_NAME)?;
    let request = Request::new(family.id, NLM_F_DUMP)
        .fixed(&genl_header(NETDEV_CMD_DEV_GET, NETDEV_FAMILY_VERSION));
    let mut out = BTreeSet::new();
    for reply in sock.dump(WHAT, &request)? {
        if reply.ty != family.id {
            continue;
        }
        let dev = Device::parse(&reply.body)
            .map_err(|detail| NetlinkError::Malformed { what: WHAT, detail })?;
        if dev.xdp_features & NETDEV_XDP_ACT_NDO_XMIT != 0 {
            out.insert(dev.ifindex);
        }
    }
    Ok(out)
}

/// Kinds of link that carry no traffic of their own and may hold the gateway
/// addresses, in order of preference: `dummy`, else `ifb` (kernels built without
/// CONFIG_DUMMY, as this project's machines are, have it).
const HOLDER_KINDS: [&[u8]; 2] = [b"dummy\0", b"ifb\0"];

/// Creates (if absent) a dummy interface `name` (IFLA_INFO_KIND "dummy", or "ifb" where
/// the kernel has no dummy driver), sets it up and marks it with alias `mark` (which
/// says whose it is: see `delete_dummy`); returns its ifindex.
/// If a link with that name exists but is not of those kinds, return an error naming it
/// (never touch it).
pub fn ensure_dummy(name: &str, mark: &str) -> Result<u32, NetlinkError> {
    check_name(name)?;
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    if let Some(link) = link_by_name(&mut sock, name)? {
        return adopt_dummy(&mut sock, name, link, mark);
    }
    let mut created = false;
    for kind in HOLDER_KINDS {
        let create = Request::new(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
            .fixed(&ifinfomsg(0, libc::IFF_UP as u32, libc::IFF_UP as u32))
            .attr(IFLA_IFNAME, &c_string(name))
            .nested(IFLA_LINKINFO, |r| r.attr(IFLA_INFO_KIND, kind));
        match sock.request("creating a dummy link", &create) {
            // EEXIST: created by someone else since the look-up; it is checked below.
            Ok(_) => {}
            Err(e) if e.errno() == Some(libc::EEXIST) => {}
            Err(e) if e.errno() == Some(libc::EOPNOTSUPP) => continue,
            Err(e) => return Err(e),
        }
        created = true;
        break;
    }
    if !created {
        return Err(NetlinkError::Unsupported {
            what: "dummy and ifb links (CONFIG_DUMMY, CONFIG_IFB)",
        });
    }
    let link = link_by_name(&mut sock, name)?.ok_or(NetlinkError::Kernel {
        what: "finding the dummy link just created",
        errno: libc::ENODEV,
        message: None,
    })?;
    adopt_dummy(&mut sock, name, link, mark)
}

/// Checks that `link` is the dummy called `name`, sets it up and marks it.
fn adopt_dummy(sock: &mut Socket, name: &str, link: Link, mark: &str) -> Result<u32, NetlinkError> {
    link.require_dummy(name)?;
    if link.alias.as_deref() != Some(mark.as_bytes()) {
        let alias = Request::new(RTM_NEWLINK, NLM_F_ACK)
            .fixed(&ifinfomsg(link.index, 0, 0))
            .attr(IFLA_IFALIAS, mark.as_bytes());
        sock.request("marking the dummy link (its alias)", &alias)?;
    }
    if link.flags & libc::IFF_UP as u32 == 0 {
        let up = Request::new(RTM_NEWLINK, NLM_F_ACK).fixed(&ifinfomsg(
            link.index,
            libc::IFF_UP as u32,
            libc::IFF_UP as u32,
        ));
        sock.request("setting the dummy link up", &up)?;
    }
    Ok(link.index)
}

/// What `delete_dummy` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DummyDeleted {
    /// Deleted.
    Deleted,
    /// There is no link of that name.
    Absent,
    /// Left alone: its alias marks it as another owner's (another pin directory's).
    Kept {
        /// Its alias.
        alias: String,
    },
}

/// Deletes link `name` if it exists, is a dummy, and is marked `mark`, or not at all
/// (made by a version that did not mark it) if `unmarked_too`.
pub fn delete_dummy(
    name: &str,
    mark: &str,
    unmarked_too: bool,
) -> Result<DummyDeleted, NetlinkError> {
    check_name(name)?;
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let Some(link) = link_by_name(&mut sock, name)? else {
        return Ok(DummyDeleted::Absent);
    };
    link.require_dummy(name)?;
    let alias = link.alias.as_deref().unwrap_or_default();
    let ours = alias == mark.as_bytes() || (alias.is_empty() && unmarked_too);
    if !ours {
        return Ok(DummyDeleted::Kept {
            alias: String::from_utf8_lossy(alias).into_owned(),
        });
    }
    let delete = Request::new(RTM_DELLINK, NLM_F_ACK).fixed(&ifinfomsg(link.index, 0, 0));
    match sock.request("deleting a dummy link", &delete) {
        Ok(_) => Ok(DummyDeleted::Deleted),
        // Deleted by someone else since the look-up.
        Err(e) if e.errno() == Some(libc::ENODEV) => Ok(DummyDeleted::Absent),
        Err(e) => Err(e),
    }
}

/// The addresses on interface `ifindex`, of both families (RTM_GETADDR dump, filtered),
/// except IPv6 link-local ones (the kernel's own, fe80::/10).
pub fn addresses(ifindex: u32) -> Result<BTreeSet<IpAddr>, NetlinkError> {
    const WHAT: &str = "dumping addresses";
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let request = Request::new(RTM_GETADDR, NLM_F_DUMP).fixed(&ifaddrmsg(0, 0, 0, 0));
    let mut out = BTreeSet::new();
    for reply in sock.dump(WHAT, &request)? {
        if reply.ty != RTM_NEWADDR {
            continue;
        }
        let addr = Address::parse(&reply.body)
            .map_err(|detail| NetlinkError::Malformed { what: WHAT, detail })?;
        if let Some(Address {
            index,
            local: Some(local),
        }) = addr
        {
            if index == ifindex && !is_link_local(local) {
                out.insert(local);
            }
        }
    }
    Ok(out)
}

fn is_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80)
}

/// The ifaddrmsg of a single-address prefix of `addr` (/32, /128) on `ifindex`; an IPv6
/// one without duplicate address detection (a dummy interface has no neighbours).
fn host_prefix(ifindex: u32, addr: IpAddr) -> [u8; IFADDRMSG_LEN] {
    const IFA_F_NODAD: u8 = 0x02;
    match addr {
        IpAddr::V4(_) => ifaddrmsg(libc::AF_INET, ifindex, 32, 0),
        IpAddr::V6(_) => ifaddrmsg(libc::AF_INET6, ifindex, 128, IFA_F_NODAD),
    }
}

fn octets(addr: &IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Adds `addr` as a single-address prefix (/32, /128) to `ifindex` (EEXIST is success).
pub fn add_address(ifindex: u32, addr: IpAddr) -> Result<(), NetlinkError> {
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let request = Request::new(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
        .fixed(&host_prefix(ifindex, addr))
        .attr(IFA_LOCAL, &octets(&addr))
        .attr(IFA_ADDRESS, &octets(&addr));
    match sock.request("adding an address", &request) {
        Err(e) if e.errno() != Some(libc::EEXIST) => Err(e),
        _ => Ok(()),
    }
}

/// Removes `addr`'s single-address prefix from `ifindex` (EADDRNOTAVAIL/ENOENT: success).
pub fn remove_address(ifindex: u32, addr: IpAddr) -> Result<(), NetlinkError> {
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    // IFA_ADDRESS with the single-address prefix length makes the kernel match only
    // that prefix, never the same address with another prefix.
    let request = Request::new(RTM_DELADDR, NLM_F_ACK)
        .fixed(&host_prefix(ifindex, addr))
        .attr(IFA_LOCAL, &octets(&addr))
        .attr(IFA_ADDRESS, &octets(&addr));
    match sock.request("removing an address", &request) {
        Err(e) if !matches!(e.errno(), Some(libc::EADDRNOTAVAIL | libc::ENOENT)) => Err(e),
        _ => Ok(()),
    }
}

/// An ndmsg for a proxy entry of an IPv6 address on `ifindex`.
fn proxy_ndmsg(ifindex: u32) -> [u8; NDMSG_LEN] {
    let mut m = [0; NDMSG_LEN];
    m[0] = libc::AF_INET6 as u8;
    m[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    m[8..10].copy_from_slice(&NUD_PERMANENT.to_ne_bytes());
    m[10] = NTF_PROXY;
    m
}

/// Adds a proxy neighbour entry: the host answers neighbour solicitations for `addr`
/// arriving on `ifindex` (`ip -6 neigh add proxy ADDR dev IFACE`; present: success).
/// The kernel answers them only while the interface forwards IPv6 and has `proxy_ndp`
/// on (see `host::enable_proxy_ndp`).
pub fn add_proxy_neighbour(ifindex: u32, addr: std::net::Ipv6Addr) -> Result<(), NetlinkError> {
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let request = Request::new(RTM_NEWNEIGH, NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE)
        .fixed(&proxy_ndmsg(ifindex))
        .attr(NDA_DST, &addr.octets());
    sock.request("adding a proxy neighbour entry", &request)
        .map(|_| ())
}

/// Removes the proxy neighbour entry of `addr` on `ifindex` (absent: success).
pub fn remove_proxy_neighbour(ifindex: u32, addr: std::net::Ipv6Addr) -> Result<(), NetlinkError> {
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let request = Request::new(RTM_DELNEIGH, NLM_F_ACK)
        .fixed(&proxy_ndmsg(ifindex))
        .attr(NDA_DST, &addr.octets());
    match sock.request("removing a proxy neighbour entry", &request) {
        Err(e) if !matches!(e.errno(), Some(libc::ENOENT | libc::ENODEV)) => Err(e),
        _ => Ok(()),
    }
}

/// Index → name of every link (RTM_GETLINK dump).
pub fn links() -> Result<BTreeMap<u32, String>, NetlinkError> {
    Ok(dump_links()?
        .into_iter()
        .map(|l| (l.index, String::from_utf8_lossy(&l.name).into_owned()))
        .collect())
}

/// Every link (RTM_GETLINK dump).
fn dump_links() -> Result<Vec<Link>, NetlinkError> {
    const WHAT: &str = "dumping links";
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let request = Request::new(RTM_GETLINK, NLM_F_DUMP).fixed(&ifinfomsg(0, 0, 0));
    let mut out = Vec::new();
    for reply in sock.dump(WHAT, &request)? {
        if reply.ty != RTM_NEWLINK {
            continue;
        }
        out.push(
            Link::parse(&reply.body)
                .map_err(|detail| NetlinkError::Malformed { what: WHAT, detail })?,
        );
    }
    Ok(out)
}

/// What a packet redirected into an Ethernet link needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EtherLink {
    /// What kind of link it is.
    pub kind: EtherKind,
    /// The bridge it is a forwarding port of, if any.
    pub port_of: Option<u32>,
}

/// Ethernet links by what a redirect into them does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EtherKind {
    /// A redirect sends the packet out of it.
    Plain,
    /// A veth whose peer is in another namespace: a packet may go straight into it.
    PeerElsewhere,
    /// A bridge without VLAN filtering: a packet may go straight into the port that
    /// holds its destination MAC.
    Bridge,
}

/// The links that carry Ethernet (a packet with MACs may be redirected into them), by
/// index.
pub fn ethernet_links() -> Result<BTreeMap<u32, EtherLink>, NetlinkError> {
    Ok(dump_links()?
        .into_iter()
        .filter_map(|l| Some((l.index, l.ether()?)))
        .collect())
}

/// How an XDP program is attached to link `ifindex` (`XDP_ATTACHED_*`; 0: none).
pub fn xdp_attached(ifindex: u32) -> Result<u8, NetlinkError> {
    const WHAT: &str = "asking how XDP is attached to a link";
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let request = Request::new(RTM_GETLINK, NLM_F_ACK).fixed(&ifinfomsg(ifindex, 0, 0));
    let replies = sock.request(WHAT, &request)?;
    the_link(WHAT, &replies).map(|l| l.xdp_attached)
}

/// The link called `name` (or holding it as an alternative name), if any.
fn link_by_name(sock: &mut Socket, name: &str) -> Result<Option<Link>, NetlinkError> {
    const WHAT: &str = "looking up a link by name";
    let request = Request::new(RTM_GETLINK, NLM_F_ACK)
        .fixed(&ifinfomsg(0, 0, 0))
        .attr(IFLA_IFNAME, &c_string(name));
    let replies = match sock.request(WHAT, &request) {
        Ok(replies) => replies,
        Err(e) if e.errno() == Some(libc::ENODEV) => return Ok(None),
        Err(e) => return Err(e),
    };
    the_link(WHAT, &replies).map(Some)
}

/// The link an answer to RTM_GETLINK for one link describes.
fn the_link(what: &'static str, replies: &[Reply]) -> Result<Link, NetlinkError> {
    let reply = replies
        .iter()
        .find(|r| r.ty == RTM_NEWLINK)
        .ok_or(NetlinkError::Malformed {
            what,
            detail: "no link in the answer",
        })?;
    Link::parse(&reply.body).map_err(|detail| NetlinkError::Malformed { what, detail })
}

/// Mirrors the kernel's `dev_valid_name`, so a bad name fails before any request.
fn check_name(name: &str) -> Result<(), NetlinkError> {
    let bad = name.is_empty()
        || name.len() >= IFNAMSIZ
        || name == "."
        || name == ".."
        || name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace());
    if bad {
        return Err(NetlinkError::InvalidName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
