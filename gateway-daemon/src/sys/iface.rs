//! Interface names and indexes (if_nametoindex(3), if_indextoname(3)).

use std::ffi::{CStr, CString};

/// The index of interface `name`, if it exists (and the name holds no NUL).
pub(crate) fn name_to_index(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

/// The name of interface `ifindex`, if it exists.
pub(crate) fn index_to_name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success the buffer holds a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// The MTU of interface `name` in this network namespace (`SIOCGIFMTU`), if it exists.
pub(crate) fn mtu(name: &str) -> Option<u32> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    if name.len() >= libc::IF_NAMESIZE {
        return None;
    }
    // SAFETY: a plain datagram socket; the descriptor is owned (closed on drop).
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `ifreq` is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: SIOCGIFMTU reads the NUL-terminated name and writes `ifru_mtu` of `req`,
    // which lives for the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut req) };
    if rc != 0 {
        return None;
    }
    // SAFETY: on success the kernel wrote the MTU into this union member.
    u32::try_from(unsafe { req.ifr_ifru.ifru_mtu }).ok()
}
