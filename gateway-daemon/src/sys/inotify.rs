//! inotify(7): a descriptor reporting changes to watched paths.

use std::{
    ffi::CStr,
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

/// A new inotify instance, non-blocking and close-on-exec.
pub(crate) fn init() -> io::Result<OwnedFd> {
    // SAFETY: no pointers; the result is checked before use.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Watches `path` for the events in `mask` (IN_* flags).
pub(crate) fn add_watch(fd: BorrowedFd<'_>, path: &CStr, mask: u32) -> io::Result<()> {
    // SAFETY: a valid descriptor and a NUL-terminated path, both live through the call.
    if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), mask) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads queued events into `buf`: the number of bytes read (0 at end of file).
pub(crate) fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is live and writable for `buf.len()` bytes; read writes at most that.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}
