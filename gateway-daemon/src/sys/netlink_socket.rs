//! Netlink sockets: open, bind, set options, send, receive, poll. The protocol (message
//! building and parsing) lives in [`crate::netlink`].

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

/// A netlink socket of the calling thread's network namespace.
pub(crate) fn socket(protocol: libc::c_int, nonblocking: bool) -> io::Result<OwnedFd> {
    let mut ty = libc::SOCK_RAW | libc::SOCK_CLOEXEC;
    if nonblocking {
        ty |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: no pointers; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, ty, protocol) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An address for the kernel (port 0, no groups), or for binding with a port the
/// kernel chooses.
fn kernel_address() -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain integers; all zeros is a valid value.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr
}

const ADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;

/// Binds to a port the kernel chooses.
pub(crate) fn bind(fd: BorrowedFd<'_>) -> io::Result<()> {
    let addr = kernel_address();
    // SAFETY: `addr` is a live sockaddr_nl and ADDR_LEN its size.
    let rc = unsafe { libc::bind(fd.as_raw_fd(), std::ptr::from_ref(&addr).cast(), ADDR_LEN) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// setsockopt(2) with a plain value (an int, a group number, a timeval).
pub(crate) fn set_option<T: Copy>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: T,
) -> io::Result<()> {
    // SAFETY: the pointer and size describe `value`, which outlives the call; the
    // kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends one message to the kernel.
pub(crate) fn send(fd: BorrowedFd<'_>, message: &[u8]) -> io::Result<()> {
    let addr = kernel_address();
    loop {
        // SAFETY: `message` and `addr` are live for the call and their sizes given.
        let n = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                message.as_ptr().cast(),
                message.len(),
                0,
                std::ptr::from_ref(&addr).cast(),
                ADDR_LEN,
            )
        };
        if n >= 0 {
            // Netlink sends a datagram whole or not at all.
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one datagram: its full length (which exceeds `buf.len()` if it was
/// truncated) and the sender's port id.
pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], dontwait: bool) -> io::Result<(usize, u32)> {
    let mut flags = libc::MSG_TRUNC;
    if dontwait {
        flags |= libc::MSG_DONTWAIT;
    }
    loop {
        let mut addr = kernel_address();
        let mut addr_len = ADDR_LEN;
        // SAFETY: `buf` and `addr` are live, writable and their sizes given; the
        // kernel writes at most `buf.len()` bytes even with MSG_TRUNC.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
                std::ptr::from_mut(&mut addr).cast(),
                &mut addr_len,
            )
        };
        if let Ok(n) = usize::try_from(n) {
            return Ok((n, addr.nl_pid));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

pub(crate) use super::poll::poll;
