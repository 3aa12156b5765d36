//! Raw netlink: which interfaces accept redirected XDP frames, notifications when links
//! or their XDP features change, and a dummy link holding the gateway's /32 addresses.
//!
//! Every call opens its own socket, so it acts in the network namespace of the calling
//! thread at the time of the call. Replies are parsed, not trusted: every length is
//! checked before it is used. The system calls live in `crate::sys::netlink_socket`.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    net::Ipv4Addr,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    time::{Duration, Instant},
};

use crate::sys::netlink_socket as sys;

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
const RTNLGRP_LINK: u32 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFINFOMSG_LEN: usize = 16;
const IFADDRMSG_LEN: usize = 8;
const RT_SCOPE_UNIVERSE: u8 = 0;
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

/// Link and XDP-feature change notifications: rtnetlink RTNLGRP_LINK plus the netdev genl family's
/// "mgmt" multicast group (dev add/del/change notifications), on non-blocking sockets.
///
/// Create it before reading the state it guards, so no change between the read and the
/// first `wait` is missed. On kernels without the netdev family (before 6.3) only link
/// notifications are watched.
pub struct LinkEvents {
    route: OwnedFd,
    netdev: Option<OwnedFd>,
    buf: Vec<u8>,
}

impl LinkEvents {
    /// Subscribes to link and netdev notifications in the calling thread's namespace.
    pub fn new() -> Result<Self, NetlinkError> {
        let route = subscribe(libc::NETLINK_ROUTE, RTNLGRP_LINK)?;
        let mut control = Socket::open(libc::NETLINK_GENERIC)?;
        let netdev = match resolve_family(&mut control, NETDEV_FAMILY_NAME) {
            Ok(family) => {
                let group = family
                    .group(NETDEV_MCGRP_MGMT)
                    .ok_or(NetlinkError::Unsupported {
                        what: "the netdev family's mgmt multicast group",
                    })?;
                Some(subscribe(libc::NETLINK_GENERIC, group)?)
            }
            Err(NetlinkError::Unsupported { .. }) => None,
            Err(e) => return Err(e),
        };
        Ok(LinkEvents {
            route,
            netdev,
            buf: vec![0; RECV_BUF],
        })
    }

    /// Blocks up to `timeout` (poll(2) on both sockets); returns true if any notification arrived
    /// (drains everything that is queued; ENOBUFS overrun also counts as "something changed").
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, NetlinkError> {
        const WHAT: &str = "waiting for link notifications";
        let deadline = Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let fds = [
                Some(self.route.as_fd()),
                self.netdev.as_ref().map(|fd| fd.as_fd()),
            ];
            let ready = sys::poll(fds, remaining)
                .map_err(|source| NetlinkError::Io { what: WHAT, source })?;
            let mut changed = false;
            for (fd, ready) in fds.into_iter().zip(ready) {
                if let (Some(fd), true) = (fd, ready) {
                    changed |= drain(fd, &mut self.buf)?;
                }
            }
            if changed {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
        }
    }
}

/// Opens a non-blocking socket subscribed to one multicast group.
fn subscribe(protocol: libc::c_int, group: u32) -> Result<OwnedFd, NetlinkError> {
    const WHAT: &str = "subscribing to netlink notifications";
    let io = |source| NetlinkError::Io { what: WHAT, source };
    let fd = sys::socket(protocol, true).map_err(io)?;
    sys::bind(fd.as_fd()).map_err(io)?;
    sys::set_option(
        fd.as_fd(),
        libc::SOL_NETLINK,
        libc::NETLINK_ADD_MEMBERSHIP,
        group,
    )
    .map_err(io)?;
    Ok(fd)
}

/// Reads every queued datagram; true if any came from the kernel or some were lost.
fn drain(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<bool, NetlinkError> {
    let mut changed = false;
    for _ in 0..DRAIN_LIMIT {
        match sys::recv(fd, buf, true) {
            // A truncated notification still says that something changed.
            Ok((_, sender)) => changed |= sender == KERNEL,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(changed),
            // The queue overflowed and notifications were lost: something changed.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => changed = true,
            Err(source) => {
                return Err(NetlinkError::Io {
                    what: "receiving link notifications",
                    source,
                })
            }
        }
    }
    Ok(changed)
}

/// Kinds of link that carry no traffic of their own and may hold the gateway
/// addresses, in order of preference: `dummy`, else `ifb` (kernels built without
/// CONFIG_DUMMY, as this project's machines are, have it).
const HOLDER_KINDS: [&[u8]; 2] = [b"dummy\0", b"ifb\0"];

/// Creates (if absent) a dummy interface `name` (IFLA_INFO_KIND "dummy", or "ifb" where
/// the kernel has no dummy driver), sets it up; returns its ifindex.
/// If a link with that name exists but is not of those kinds, return an error naming it
/// (never touch it).
pub fn ensure_dummy(name: &str) -> Result<u32, NetlinkError> {
    check_name(name)?;
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    if let Some(link) = link_by_name(&mut sock, name)? {
        return adopt_dummy(&mut sock, name, link);
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
    adopt_dummy(&mut sock, name, link)
}

/// Checks that `link` is the dummy called `name` and sets it up.
fn adopt_dummy(sock: &mut Socket, name: &str, link: Link) -> Result<u32, NetlinkError> {
    link.require_dummy(name)?;
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

/// Deletes link `name` if it exists and is a dummy (Ok(false) when absent).
pub fn delete_dummy(name: &str) -> Result<bool, NetlinkError> {
    check_name(name)?;
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let Some(link) = link_by_name(&mut sock, name)? else {
        return Ok(false);
    };
    link.require_dummy(name)?;
    let delete = Request::new(RTM_DELLINK, NLM_F_ACK).fixed(&ifinfomsg(link.index, 0, 0));
    match sock.request("deleting a dummy link", &delete) {
        Ok(_) => Ok(true),
        // Deleted by someone else since the look-up.
        Err(e) if e.errno() == Some(libc::ENODEV) => Ok(false),
        Err(e) => Err(e),
    }
}

/// IPv4 addresses on interface `ifindex` (RTM_GETADDR dump, filtered).
pub fn ipv4_addresses(ifindex: u32) -> Result<BTreeSet<Ipv4Addr>, NetlinkError> {
    const WHAT: &str = "dumping IPv4 addresses";
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let request = Request::new(RTM_GETADDR, NLM_F_DUMP).fixed(&ifaddrmsg(0, 0));
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
            if index == ifindex {
                out.insert(local);
            }
        }
    }
    Ok(out)
}

/// Adds `addr`/32 to `ifindex` (EEXIST is success).
pub fn add_ipv4_address(ifindex: u32, addr: Ipv4Addr) -> Result<(), NetlinkError> {
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let request = Request::new(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
        .fixed(&ifaddrmsg(ifindex, 32))
        .attr(IFA_LOCAL, &addr.octets())
        .attr(IFA_ADDRESS, &addr.octets());
    match sock.request("adding an IPv4 address", &request) {
        Err(e) if e.errno() != Some(libc::EEXIST) => Err(e),
        _ => Ok(()),
    }
}

/// Removes `addr`/32 from `ifindex` (EADDRNOTAVAIL/ENOENT: success).
pub fn remove_ipv4_address(ifindex: u32, addr: Ipv4Addr) -> Result<(), NetlinkError> {
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    // IFA_ADDRESS with prefix length 32 makes the kernel match only the /32, never the
    // same address with another prefix.
    let request = Request::new(RTM_DELADDR, NLM_F_ACK)
        .fixed(&ifaddrmsg(ifindex, 32))
        .attr(IFA_LOCAL, &addr.octets())
        .attr(IFA_ADDRESS, &addr.octets());
    match sock.request("removing an IPv4 address", &request) {
        Err(e) if !matches!(e.errno(), Some(libc::EADDRNOTAVAIL | libc::ENOENT)) => Err(e),
        _ => Ok(()),
    }
}

/// Index → name of every link (RTM_GETLINK dump).
pub fn links() -> Result<BTreeMap<u32, String>, NetlinkError> {
    const WHAT: &str = "dumping links";
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let request = Request::new(RTM_GETLINK, NLM_F_DUMP).fixed(&ifinfomsg(0, 0, 0));
    let mut out = BTreeMap::new();
    for reply in sock.dump(WHAT, &request)? {
        if reply.ty != RTM_NEWLINK {
            continue;
        }
        let link = Link::parse(&reply.body)
            .map_err(|detail| NetlinkError::Malformed { what: WHAT, detail })?;
        out.insert(link.index, String::from_utf8_lossy(&link.name).into_owned());
    }
    Ok(out)
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
    let reply = replies
        .iter()
        .find(|r| r.ty == RTM_NEWLINK)
        .ok_or(NetlinkError::Malformed {
            what: WHAT,
            detail: "no link in the answer",
        })?;
    Link::parse(&reply.body)
        .map(Some)
        .map_err(|detail| NetlinkError::Malformed { what: WHAT, detail })
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

/// A link as RTM_NEWLINK describes it.
struct Link {
    index: u32,
    flags: u32,
    name: Vec<u8>,
    kind: Option<Vec<u8>>,
}

impl Link {
    /// Parses an ifinfomsg and its attributes.
    fn parse(body: &[u8]) -> Result<Self, &'static str> {
        let (header, attrs) = split_fixed(body, IFINFOMSG_LEN).ok_or("short ifinfomsg")?;
        let index = ne_i32(&header[4..8]).ok_or("short ifinfomsg")?;
        let index = u32::try_from(index)
            .ok()
            .filter(|&i| i > 0)
            .ok_or("link without a valid index")?;
        let flags = ne_u32(&header[8..12]).ok_or("short ifinfomsg")?;
        let (mut name, mut kind) = (None, None);
        for attr in Attrs::new(attrs) {
            let attr = attr?;
            match attr.ty {
                IFLA_IFNAME => name = Some(until_nul(attr.value).to_vec()),
                IFLA_LINKINFO => {
                    for info in Attrs::new(attr.value) {
                        let info = info?;
                        if info.ty == IFLA_INFO_KIND {
                            kind = Some(until_nul(info.value).to_vec());
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Link {
            index,
            flags,
            name: name.ok_or("link without a name")?,
            kind,
        })
    }

    /// Ok if this is the dummy called `name`: never touch another link.
    fn require_dummy(&self, name: &str) -> Result<(), NetlinkError> {
        if self.name != name.as_bytes() {
            return Err(NetlinkError::AltName {
                name: name.to_owned(),
                holder: String::from_utf8_lossy(&self.name).into_owned(),
            });
        }
        let kind = self.kind.as_deref().unwrap_or_default();
        if !HOLDER_KINDS.iter().any(|k| &k[..k.len() - 1] == kind) {
            return Err(NetlinkError::NotDummy {
                name: name.to_owned(),
                kind: self
                    .kind
                    .as_deref()
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
            });
        }
        Ok(())
    }
}

/// An address as RTM_NEWADDR describes it (IPv4 only).
struct Address {
    index: u32,
    local: Option<Ipv4Addr>,
}

impl Address {
    /// Parses an ifaddrmsg and its attributes; `None` for other families.
    fn parse(body: &[u8]) -> Result<Option<Self>, &'static str> {
        let (header, attrs) = split_fixed(body, IFADDRMSG_LEN).ok_or("short ifaddrmsg")?;
        if i32::from(header[0]) != libc::AF_INET {
            return Ok(None);
        }
        let index = ne_u32(&header[4..8]).ok_or("short ifaddrmsg")?;
        let (mut local, mut address) = (None, None);
        for attr in Attrs::new(attrs) {
            let attr = attr?;
            let ip = || {
                <[u8; 4]>::try_from(attr.value)
                    .map(Ipv4Addr::from)
                    .map_err(|_| "IPv4 address attribute not 4 bytes long")
            };
            match attr.ty {
                IFA_LOCAL => local = Some(ip()?),
                IFA_ADDRESS => address = Some(ip()?),
                _ => {}
            }
        }
        // IFA_LOCAL is the interface's own address; IFA_ADDRESS differs from it only on
        // point-to-point links, where it is the peer's.
        Ok(Some(Address {
            index,
            local: local.or(address),
        }))
    }
}

/// A device as the netdev family's dev-get describes it.
struct Device {
    ifindex: u32,
    xdp_features: u64,
}

impl Device {
    /// Parses a genlmsghdr and the dev attributes.
    fn parse(body: &[u8]) -> Result<Self, &'static str> {
        let (_, attrs) = split_fixed(body, GENL_HDRLEN).ok_or("short genlmsghdr")?;
        let (mut ifindex, mut xdp_features) = (None, 0);
        for attr in Attrs::new(attrs) {
            let attr = attr?;
            match attr.ty {
                NETDEV_A_DEV_IFINDEX => {
                    ifindex = Some(ne_u32(attr.value).ok_or("ifindex not 4 bytes long")?)
                }
                NETDEV_A_DEV_XDP_FEATURES => {
                    xdp_features = ne_u64(attr.value).ok_or("xdp-features not 8 bytes long")?
                }
                _ => {}
            }
        }
        Ok(Device {
            ifindex: ifindex.ok_or("device without an ifindex")?,
            xdp_features,
        })
    }
}

/// A generic netlink family: its message type and multicast groups.
struct Family {
    id: u16,
    groups: Vec<(Vec<u8>, u32)>,
}

impl Family {
    fn group(&self, name: &str) -> Option<u32> {
        self.groups
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|&(_, id)| id)
    }

    /// Parses the controller's answer to CTRL_CMD_GETFAMILY.
    fn parse(body: &[u8]) -> Result<Self, &'static str> {
        let (_, attrs) = split_fixed(body, GENL_HDRLEN).ok_or("short genlmsghdr")?;
        let (mut id, mut groups) = (None, Vec::new());
        for attr in Attrs::new(attrs) {
            let attr = attr?;
            match attr.ty {
                CTRL_ATTR_FAMILY_ID => {
                    id = Some(ne_u16(attr.value).ok_or("family id not 2 bytes long")?)
                }
                CTRL_ATTR_MCAST_GROUPS => {
                    for group in Attrs::new(attr.value) {
                        let (mut name, mut gid) = (None, None);
                        for field in Attrs::new(group?.value) {
                            let field = field?;
                            match field.ty {
                                CTRL_ATTR_MCAST_GRP_NAME => {
                                    name = Some(until_nul(field.value).to_vec())
                                }
                                CTRL_ATTR_MCAST_GRP_ID => {
                                    gid = Some(ne_u32(field.value).ok_or("group id not 4 bytes")?)
                                }
                                _ => {}
                            }
                        }
                        if let (Some(name), Some(gid)) = (name, gid) {
                            groups.push((name, gid));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Family {
            id: id.ok_or("family without an id")?,
            groups,
        })
    }
}

/// Asks the generic netlink controller for family `name`.
fn resolve_family(sock: &mut Socket, name: &'static str) -> Result<Family, NetlinkError> {
    const WHAT: &str = "resolving a generic netlink family";
    let request = Request::new(GENL_ID_CTRL, NLM_F_ACK)
        .fixed(&genl_header(CTRL_CMD_GETFAMILY, CTRL_VERSION))
        .attr(CTRL_ATTR_FAMILY_NAME, &c_string(name));
    let replies = match sock.request(WHAT, &request) {
        Ok(replies) => replies,
        Err(e) if e.errno() == Some(libc::ENOENT) => {
            return Err(NetlinkError::Unsupported {
                what: "the netdev generic netlink family (Linux 6.3+)",
            })
        }
        Err(e) => return Err(e),
    };
    let reply = replies
        .iter()
        .find(|r| r.ty == GENL_ID_CTRL)
        .ok_or(NetlinkError::Malformed {
            what: WHAT,
            detail: "no family in the answer",
        })?;
    Family::parse(&reply.body).map_err(|detail| NetlinkError::Malformed { what: WHAT, detail })
}

/// The port id of the kernel, the only sender whose datagrams are read.
const KERNEL: u32 = 0;

/// A blocking netlink socket for requests, with a receive timeout so a silent kernel
/// cannot hang the caller.
struct Socket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

/// One message of an answer: its type and what follows the netlink header.
struct Reply {
    ty: u16,
    body: Vec<u8>,
}

impl Socket {
    fn open(protocol: libc::c_int) -> Result<Self, NetlinkError> {
        const WHAT: &str = "opening a netlink socket";
        let io = |source| NetlinkError::Io { what: WHAT, source };
        let fd = sys::socket(protocol, false).map_err(io)?;
        sys::bind(fd.as_fd()).map_err(io)?;
        let timeout = libc::timeval {
            tv_sec: REQUEST_TIMEOUT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        sys::set_option(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, timeout).map_err(io)?;
        // Errors then carry the kernel's explanation and not a copy of the request. Both
        // are conveniences: kernels without them still answer.
        let _ = sys::set_option(fd.as_fd(), libc::SOL_NETLINK, libc::NETLINK_EXT_ACK, 1i32);
        let _ = sys::set_option(fd.as_fd(), libc::SOL_NETLINK, libc::NETLINK_CAP_ACK, 1i32);
        Ok(Socket {
            fd,
            seq: 0,
            buf: vec![0; RECV_BUF],
        })
    }

    /// Sends a request and returns the messages answering it, up to the kernel's ack.
    fn request(
        &mut self,
        what: &'static str,
        request: &Request,
    ) -> Result<Vec<Reply>, NetlinkError> {
        self.exchange(what, request).map(|(replies, _)| replies)
    }

    /// Sends a dump request and returns every message up to NLMSG_DONE, starting over
    /// when the kernel says that changes interrupted the dump.
    fn dump(&mut self, what: &'static str, request: &Request) -> Result<Vec<Reply>, NetlinkError> {
        for _ in 0..DUMP_ATTEMPTS {
            let (replies, interrupted) = self.exchange(what, request)?;
            if !interrupted {
                return Ok(replies);
            }
        }
        Err(NetlinkError::Interrupted { what })
    }

    /// Sends `request` and collects the answer; true if a dump was interrupted.
    fn exchange(
        &mut self,
        what: &'static str,
        request: &Request,
    ) -> Result<(Vec<Reply>, bool), NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        sys::send(self.fd.as_fd(), &request.finish(seq))
            .map_err(|source| NetlinkError::Io { what, source })?;
        let malformed = |detail| NetlinkError::Malformed { what, detail };
        let (mut replies, mut interrupted) = (Vec::new(), false);
        loop {
            let len = self.receive(what)?;
            for message in Messages::new(&self.buf[..len]) {
                let message = message.map_err(malformed)?;
                // A late answer to an earlier request on this socket.
                if message.seq != seq {
                    continue;
                }
                interrupted |= message.flags & NLM_F_DUMP_INTR != 0;
                match message.ty {
                    NLMSG_NOOP => {}
                    NLMSG_ERROR | NLMSG_DONE => {
                        let status = Status::parse(&message).map_err(malformed)?;
                        if status.errno < 0 {
                            return Err(NetlinkError::Kernel {
                                what,
                                errno: status.errno.saturating_neg(),
                                message: status.message,
                            });
                        }
                        return Ok((replies, interrupted));
                    }
                    NLMSG_OVERRUN => return Err(malformed("overrun")),
                    ty => replies.push(Reply {
                        ty,
                        body: message.body.to_vec(),
                    }),
                }
            }
        }
    }

    /// Receives one datagram from the kernel into `self.buf`; returns its length.
    fn receive(&mut self, what: &'static str) -> Result<usize, NetlinkError> {
        loop {
            let (len, sender) = sys::recv(self.fd.as_fd(), &mut self.buf, false).map_err(|e| {
                let source = if e.kind() == io::ErrorKind::WouldBlock {
                    io::Error::new(io::ErrorKind::TimedOut, "the kernel did not answer")
                } else {
                    e
                };
                NetlinkError::Io { what, source }
            })?;
            // Another process may send to this port; only the kernel answers requests.
            if sender != KERNEL {
                continue;
            }
            if len > self.buf.len() {
                return Err(NetlinkError::Malformed {
                    what,
                    detail: "datagram larger than the receive buffer",
                });
            }
            return Ok(len);
        }
    }
}

/// The outcome carried by NLMSG_ERROR (0 is an ack) or NLMSG_DONE.
struct Status {
    errno: i32,
    message: Option<String>,
}

impl Status {
    fn parse(message: &Message<'_>) -> Result<Self, &'static str> {
        let body = message.body;
        // Kernels before 4.x could end a dump with an empty NLMSG_DONE.
        if message.ty == NLMSG_DONE && body.is_empty() {
            return Ok(Status {
                errno: 0,
                message: None,
            });
        }
        let errno = ne_i32(body.get(..4).ok_or("short status")?).ok_or("short status")?;
        let mut tlvs = &body[4..];
        if message.ty == NLMSG_ERROR {
            // The request follows: its header only when capped, else all of it.
            let echoed = tlvs.get(..NLMSG_HDRLEN).ok_or("short error")?;
            let echoed_len = ne_u32(&echoed[..4]).ok_or("short error")? as usize;
            let skip = if message.flags & NLM_F_CAPPED != 0 {
                NLMSG_HDRLEN
            } else {
                align(echoed_len)
            };
            tlvs = tlvs.get(skip..).unwrap_or_default();
        }
        let message = if message.flags & NLM_F_ACK_TLVS != 0 {
            ext_ack_message(tlvs)
        } else {
            None
        };
        Ok(Status { errno, message })
    }
}

/// The kernel's error text among extended-ack attributes; a garbled one is dropped, as
/// it only decorates the error.
fn ext_ack_message(tlvs: &[u8]) -> Option<String> {
    Attrs::new(tlvs)
        .map_while(Result::ok)
        .find(|a| a.ty == NLMSGERR_ATTR_MSG)
        .map(|a| String::from_utf8_lossy(until_nul(a.value)).into_owned())
}

/// A request being built: the netlink header, a fixed header, attributes.
struct Request {
    buf: Vec<u8>,
}

impl Request {
    fn new(ty: u16, flags: u16) -> Self {
        let mut buf = vec![0; NLMSG_HDRLEN];
        buf[4..6].copy_from_slice(&ty.to_ne_bytes());
        buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        Request { buf }
    }

    /// Appends the family's fixed header (ifinfomsg, ifaddrmsg, genlmsghdr).
    fn fixed(mut self, header: &[u8]) -> Self {
        self.buf.extend_from_slice(header);
        self.pad();
        self
    }

    fn attr(mut self, ty: u16, value: &[u8]) -> Self {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; NLA_HDRLEN]);
        self.buf.extend_from_slice(value);
        self.close_attr(start, ty);
        self
    }

    fn nested(mut self, ty: u16, inner: impl FnOnce(Self) -> Self) -> Self {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; NLA_HDRLEN]);
        self = inner(self);
        self.close_attr(start, ty | NLA_F_NESTED);
        self
    }

    fn close_attr(&mut self, start: usize, ty: u16) {
        // Every attribute this module builds is a name or an address: far below 64 KiB.
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self.buf[start + 2..start + 4].copy_from_slice(&ty.to_ne_bytes());
        self.pad();
    }

    fn pad(&mut self) {
        self.buf.resize(align(self.buf.len()), 0);
    }

    /// The finished message with its length and sequence number.
    fn finish(&self, seq: u32) -> Vec<u8> {
        let mut buf = self.buf.clone();
        // Requests hold a few attributes: far below 4 GiB.
        let len = buf.len() as u32;
        buf[0..4].copy_from_slice(&len.to_ne_bytes());
        buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        buf
    }
}

fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; IFINFOMSG_LEN] {
    let mut m = [0; IFINFOMSG_LEN];
    // ifi_family AF_UNSPEC, ifi_type 0; ifi_index is a C int, and kernel indexes fit it.
    m[4..8].copy_from_slice(&index.to_ne_bytes());
    m[8..12].copy_from_slice(&flags.to_ne_bytes());
    m[12..16].copy_from_slice(&change.to_ne_bytes());
    m
}

fn ifaddrmsg(index: u32, prefix_len: u8) -> [u8; IFADDRMSG_LEN] {
    let mut m = [0; IFADDRMSG_LEN];
    m[0] = libc::AF_INET as u8;
    m[1] = prefix_len;
    m[3] = RT_SCOPE_UNIVERSE;
    m[4..8].copy_from_slice(&index.to_ne_bytes());
    m
}

fn genl_header(cmd: u8, version: u8) -> [u8; GENL_HDRLEN] {
    [cmd, version, 0, 0]
}

/// A string attribute's value: the bytes and a NUL.
fn c_string(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A netlink message inside a datagram.
struct Message<'a> {
    ty: u16,
    flags: u16,
    seq: u32,
    body: &'a [u8],
}

/// The messages of a datagram; stops at the first malformed one.
struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Messages<'a> {
    fn new(datagram: &'a [u8]) -> Self {
        Messages { rest: datagram }
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Message<'a>, &'static str>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let parsed = (|| {
            let header = self
                .rest
                .get(..NLMSG_HDRLEN)
                .ok_or("short netlink header")?;
            let len = ne_u32(&header[0..4]).ok_or("short netlink header")? as usize;
            if len < NLMSG_HDRLEN || len > self.rest.len() {
                return Err("netlink message length out of bounds");
            }
            let message = Message {
                ty: ne_u16(&header[4..6]).ok_or("short netlink header")?,
                flags: ne_u16(&header[6..8]).ok_or("short netlink header")?,
                seq: ne_u32(&header[8..12]).ok_or("short netlink header")?,
                body: &self.rest[NLMSG_HDRLEN..len],
            };
            Ok((message, align(len).min(self.rest.len())))
        })();
        match parsed {
            Ok((message, next)) => {
                self.rest = &self.rest[next..];
                Some(Ok(message))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// An attribute: its type without the nested/byte-order flags, and its value.
struct Attr<'a> {
    ty: u16,
    value: &'a [u8],
}

/// The attributes in a buffer; stops at the first malformed one.
struct Attrs<'a> {
    rest: &'a [u8],
}

impl<'a> Attrs<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Attrs { rest: buf }
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, &'static str>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let parsed = (|| {
            let header = self
                .rest
                .get(..NLA_HDRLEN)
                .ok_or("short attribute header")?;
            let len = ne_u16(&header[0..2]).ok_or("short attribute header")? as usize;
            let ty = ne_u16(&header[2..4]).ok_or("short attribute header")?;
            if len < NLA_HDRLEN || len > self.rest.len() {
                return Err("attribute length out of bounds");
            }
            let attr = Attr {
                ty: ty & NLA_TYPE_MASK,
                value: &self.rest[NLA_HDRLEN..len],
            };
            // The last attribute may go without its padding.
            Ok((attr, align(len).min(self.rest.len())))
        })();
        match parsed {
            Ok((attr, next)) => {
                self.rest = &self.rest[next..];
                Some(Ok(attr))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// Rounds up to NLA_ALIGNTO (and NLMSG_ALIGNTO): 4 bytes.
fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// `(fixed header, rest)` if `body` holds at least the fixed header.
fn split_fixed(body: &[u8], len: usize) -> Option<(&[u8], &[u8])> {
    let header = body.get(..len)?;
    Some((header, body.get(align(len)..).unwrap_or_default()))
}

fn until_nul(value: &[u8]) -> &[u8] {
    value.split(|&b| b == 0).next().unwrap_or_default()
}

fn ne_u16(b: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(b.try_into().ok()?))
}

fn ne_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(b.try_into().ok()?))
}

fn ne_i32(b: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(b.try_into().ok()?))
}

fn ne_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_ne_bytes(b.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_read_with_padding_and_nesting() {
        let request = Request::new(RTM_NEWLINK, 0)
            .fixed(&ifinfomsg(7, 0, 0))
            .attr(IFLA_IFNAME, b"abc\0")
            .nested(IFLA_LINKINFO, |r| r.attr(IFLA_INFO_KIND, b"dummy\0"));
        let datagram = request.finish(1);
        let message = Messages::new(&datagram).next().unwrap().unwrap();
        let link = Link::parse(message.body).unwrap();
        assert_eq!(link.index, 7);
        assert_eq!(link.name, b"abc");
        assert_eq!(link.kind.as_deref(), Some(&b"dummy"[..]));
    }

    #[test]
    fn an_attribute_longer_than_its_buffer_is_rejected() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&9u16.to_ne_bytes());
        buf.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
        buf.extend_from_slice(b"ab");
        assert!(Attrs::new(&buf).next().unwrap().is_err());
    }

    #[test]
    fn a_message_shorter_than_its_header_is_rejected() {
        let mut buf = 8u32.to_ne_bytes().to_vec();
        buf.resize(NLMSG_HDRLEN, 0);
        assert!(Messages::new(&buf).next().unwrap().is_err());
    }

    #[test]
    fn a_capped_error_yields_errno_and_kernel_message() {
        let mut body = (-libc::EEXIST).to_ne_bytes().to_vec();
        body.extend_from_slice(&Request::new(RTM_NEWADDR, 0).finish(3)[..NLMSG_HDRLEN]);
        let tlv = Request::new(0, 0).attr(NLMSGERR_ATTR_MSG, b"exists\0");
        body.extend_from_slice(&tlv.buf[NLMSG_HDRLEN..]);
        let message = Message {
            ty: NLMSG_ERROR,
            flags: NLM_F_CAPPED | NLM_F_ACK_TLVS,
            seq: 3,
            body: &body,
        };
        let status = Status::parse(&message).unwrap();
        assert_eq!(status.errno, -libc::EEXIST);
        assert_eq!(status.message.as_deref(), Some("exists"));
    }

    #[test]
    fn interface_names_follow_the_kernel_rules() {
        for good in ["berth0", "a", "x-y_z.1", "fifteen_chars_x"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a:b", "a b", "sixteen_chars_xx"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
