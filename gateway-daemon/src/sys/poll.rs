//! poll(2): waiting for input on a few descriptors (netlink sockets, inotify, a
//! wake-up socket).

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
    time::Duration,
};

/// poll(2) for input on a few descriptors; which ones are ready (or in error, which a
/// read then reports). An interrupted poll reports none.
pub(crate) fn poll<const N: usize>(
    fds: [Option<BorrowedFd<'_>>; N],
    timeout: Duration,
) -> io::Result<[bool; N]> {
    let mut pollfds = fds.map(|fd| libc::pollfd {
        // poll ignores negative descriptors.
        fd: fd.map_or(-1, |fd| fd.as_raw_fd()),
        events: libc::POLLIN,
        revents: 0,
    });
    // Rounded up, so a wait of less than a millisecond does not spin.
    let millis = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
    // SAFETY: `pollfds` is a live array of pollfd and its length is given.
    let rc = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, millis) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok([false; N]);
        }
        return Err(e);
    }
    Ok(pollfds.map(|p| p.revents != 0))
}

/// An epoll of mio's (the health checker's TCP checks), registered with the current
/// tokio runtime: readable there when one of its descriptors is ready. Within a
/// runtime with IO.
pub(crate) fn register_epoll(epoll: mio::Poll) -> io::Result<tokio::io::unix::AsyncFd<mio::Poll>> {
    // SAFETY: a `mio::Poll` owns its epoll descriptor, open for as long as it lives
    // (the `AsyncFd` owns it, so it outlives the registration), and `as_raw_fd` always
    // returns that one descriptor.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(epoll, tokio::io::Interest::READABLE)
    }
    .map_err(io::Error::from)
}
