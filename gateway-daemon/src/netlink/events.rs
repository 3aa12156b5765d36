//! Notifications of link, XDP-feature and forwarding-database changes, on non-blocking
//! sockets.

use super::*;

/// Link, XDP-feature and forwarding-database change notifications: rtnetlink
/// RTNLGRP_LINK, the netdev genl family's "mgmt" multicast group (dev add/del/change
/// notifications) and RTNLGRP_NEIGH's bridge entries, on non-blocking sockets.
///
/// Create it before reading the state it guards, so no change between the read and the
/// first `wait` is missed. On kernels without the netdev family (before 6.3) only link
/// notifications are watched.
pub struct LinkEvents {
    route: OwnedFd,
    netdev: Option<OwnedFd>,
    neigh: OwnedFd,
    buf: Vec<u8>,
}

impl LinkEvents {
    /// Subscribes to link and netdev notifications in the calling thread's namespace.
    pub fn new() -> Result<Self, NetlinkError> {
        let route = subscribe(libc::NETLINK_ROUTE, RTNLGRP_LINK)?;
        let neigh = subscribe(libc::NETLINK_ROUTE, RTNLGRP_NEIGH)?;
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
            neigh,
            buf: vec![0; RECV_BUF],
        })
    }

    /// Blocks up to `timeout` (poll(2) on the sockets); returns true if any notification
    /// arrived (drains everything that is queued; ENOBUFS overrun also counts as
    /// "something changed"). Of the neighbour notifications only forwarding-database
    /// entries count.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, NetlinkError> {
        const WHAT: &str = "waiting for link notifications";
        let deadline = Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let fds = [
                Some(self.route.as_fd()),
                self.netdev.as_ref().map(|fd| fd.as_fd()),
                Some(self.neigh.as_fd()),
            ];
            let relevant: [fn(&[u8]) -> bool; 3] =
                [|_| true, |_| true, bridge::is_fdb_notification];
            let ready = sys::poll(fds, remaining)
                .map_err(|source| NetlinkError::Io { what: WHAT, source })?;
            let mut changed = false;
            for ((fd, ready), relevant) in fds.into_iter().zip(ready).zip(relevant) {
                if let (Some(fd), true) = (fd, ready) {
                    changed |= drain(fd, &mut self.buf, relevant)?;
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

/// Reads every queued datagram; true if any `relevant` one came from the kernel or some
/// were lost.
fn drain(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    relevant: fn(&[u8]) -> bool,
) -> Result<bool, NetlinkError> {
    let mut changed = false;
    for _ in 0..DRAIN_LIMIT {
        match sys::recv(fd, buf, true) {
            // A truncated notification still says that something changed.
            Ok((len, sender)) => {
                changed |= sender == KERNEL && relevant(&buf[..len.min(buf.len())]);
            }
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
