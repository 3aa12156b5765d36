//! Advisory whole-file locks (flock(2)).

use std::{io, os::fd::AsRawFd as _};

/// Takes an exclusive lock on `file`, held as long as its descriptor is open; waits for
/// other holders unless `nonblocking` (then fails with `EWOULDBLOCK`).
pub(crate) fn lock_exclusive(file: &std::fs::File, nonblocking: bool) -> io::Result<()> {
    lock(file, libc::LOCK_EX, nonblocking)
}

/// Takes a shared lock on `file` (any number of holders, none while an exclusive lock
/// is held), held as long as its descriptor is open; waits unless `nonblocking`.
pub(crate) fn lock_shared(file: &std::fs::File, nonblocking: bool) -> io::Result<()> {
    lock(file, libc::LOCK_SH, nonblocking)
}

fn lock(file: &std::fs::File, mut operation: libc::c_int, nonblocking: bool) -> io::Result<()> {
    if nonblocking {
        operation |= libc::LOCK_NB;
    }
    // SAFETY: flock on a descriptor `file` owns and keeps open through the call; no
    // pointers.
    if unsafe { libc::flock(file.as_raw_fd(), operation) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
