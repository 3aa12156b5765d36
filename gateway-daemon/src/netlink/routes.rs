//! Host routes of one protocol in one routing table (`--announce-table`), where the
//! operator's routing daemon imports them, and the route the kernel takes to an
//! address.

use super::*;

/// The routing protocol number of the routes Berth announces in `--announce-table`
/// (`proto berth` with `deploy/rt_protos.d/berth.conf`): only routes of this protocol
/// are ever changed there.
pub const RTPROT_BERTH: u8 = 251;

/// A route to a single address (/32, /128) in routing table `table`, of routing
/// protocol `protocol`: how a gateway address is announced to the routing daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostRoute {
    /// The routing table (any but 0; above 255 it travels in RTA_TABLE).
    pub table: u32,
    /// The routing protocol number (`rtm_protocol`).
    pub protocol: u8,
    /// The address the route leads to.
    pub addr: IpAddr,
}

/// What `add_host_route` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteAdded {
    /// The route was added.
    Added,
    /// A route to that address exists in the table already, of this or another
    /// protocol: it is left as it is.
    Exists,
}

/// The addresses of the host routes (/32, /128) of `protocol` in `table`, both
/// families (RTM_GETROUTE dumps; filtered by the kernel where it can, and here).
pub fn host_routes(table: u32, protocol: u8) -> Result<BTreeSet<IpAddr>, NetlinkError> {
    const WHAT: &str = "dumping the routes of a table";
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    // Best effort: without it the kernel sends every route, and they are filtered here.
    let _ = sys::set_option(
        sock.fd.as_fd(),
        libc::SOL_NETLINK,
        NETLINK_GET_STRICT_CHK,
        1i32,
    );
    let mut out = BTreeSet::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        let replies = match sock.dump(WHAT, &route_dump_request(family, table, protocol)) {
            Ok(replies) => replies,
            // A table that holds no route of the family does not exist.
            Err(e) if e.errno() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        for reply in replies {
            if reply.ty != RTM_NEWROUTE {
                continue;
            }
            let route = Route::parse(&reply.body)
                .map_err(|detail| NetlinkError::Malformed { what: WHAT, detail })?;
            if let Some(addr) = route.host(table, protocol) {
                out.insert(addr);
            }
        }
    }
    Ok(out)
}

/// Adds `route` through interface `ifindex`, scope link (`ip route add ADDR/32 dev
/// IFACE table T proto P scope link`). A route to that address already in the table,
/// of any protocol, is never replaced: `RouteAdded::Exists`.
pub fn add_host_route(route: HostRoute, ifindex: u32) -> Result<RouteAdded, NetlinkError> {
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    match sock.request("adding a route", &add_route_request(route, ifindex)) {
        Ok(_) => Ok(RouteAdded::Added),
        Err(e) if e.errno() == Some(libc::EEXIST) => Ok(RouteAdded::Exists),
        Err(e) => Err(e),
    }
}

/// Removes `route`: only a route of its protocol matches (absent: success).
pub fn remove_host_route(route: HostRoute) -> Result<(), NetlinkError> {
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    match sock.request("removing a route", &remove_route_request(route)) {
        Err(e) if !matches!(e.errno(), Some(libc::ESRCH | libc::ENOENT)) => Err(e),
        _ => Ok(()),
    }
}

/// The RTM_GETROUTE dump of `host_routes` for one family: a strict dump request (zero
/// prefix lengths, tos and scope, else EINVAL) that the kernel filters by table and
/// protocol.
pub(super) fn route_dump_request(family: i32, table: u32, protocol: u8) -> Request {
    Request::new(RTM_GETROUTE, NLM_F_DUMP)
        .fixed(&rtmsg(family, 0, table, protocol, 0, 0))
        .attr(RTA_TABLE, &table.to_ne_bytes())
}

/// The RTM_NEWROUTE request of `add_host_route`: exclusive, so that no route is
/// replaced.
pub(super) fn add_route_request(route: HostRoute, ifindex: u32) -> Request {
    let (family, len) = host_prefix_len(route.addr);
    Request::new(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
        .fixed(&rtmsg(
            family,
            len,
            route.table,
            route.protocol,
            RT_SCOPE_LINK,
            RTN_UNICAST,
        ))
        .attr(RTA_TABLE, &route.table.to_ne_bytes())
        .attr(RTA_DST, &octets(&route.addr))
        .attr(RTA_OIF, &ifindex.to_ne_bytes())
}

/// The RTM_DELROUTE request of `remove_host_route`: any scope, type and device, only
/// its protocol (the kernel compares `rtm_protocol` when it is not 0).
pub(super) fn remove_route_request(route: HostRoute) -> Request {
    let (family, len) = host_prefix_len(route.addr);
    Request::new(RTM_DELROUTE, NLM_F_ACK)
        .fixed(&rtmsg(
            family,
            len,
            route.table,
            route.protocol,
            RT_SCOPE_NOWHERE,
            0,
        ))
        .attr(RTA_TABLE, &route.table.to_ne_bytes())
        .attr(RTA_DST, &octets(&route.addr))
}

/// The family and the prefix length of a single address.
pub(super) fn host_prefix_len(addr: IpAddr) -> (i32, u8) {
    match addr {
        IpAddr::V4(_) => (libc::AF_INET, 32),
        IpAddr::V6(_) => (libc::AF_INET6, 128),
    }
}

/// The interface the kernel's routes send a packet to `addr` out of (RTM_GETROUTE, as
/// `ip route get` asks), if any route reaches it.
pub fn route_oif(addr: IpAddr) -> Result<Option<u32>, NetlinkError> {
    const WHAT: &str = "asking the route to an address";
    let (family, len) = host_prefix_len(addr);
    let mut sock = Socket::open(libc::NETLINK_ROUTE)?;
    let request = Request::new(RTM_GETROUTE, NLM_F_ACK)
        .fixed(&rtmsg(family, len, 0, 0, 0, 0))
        .attr(RTA_DST, &octets(&addr));
    let replies = match sock.request(WHAT, &request) {
        Ok(replies) => replies,
        Err(e) if matches!(e.errno(), Some(libc::ENETUNREACH | libc::EHOSTUNREACH)) => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let Some(reply) = replies.iter().find(|r| r.ty == RTM_NEWROUTE) else {
        return Ok(None);
    };
    Route::parse(&reply.body)
        .map(|r| r.oif)
        .map_err(|detail| NetlinkError::Malformed { what: WHAT, detail })
}
