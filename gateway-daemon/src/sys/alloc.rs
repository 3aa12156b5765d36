//! The allocator: returning freed pages to the operating system, and the pages the
//! heap is made of (small or huge).

// Links mimalloc's C library, whose `mi_collect` is declared below (the binary makes
// mimalloc the global allocator; other users of the library only call the function).
use mimalloc as _;

extern "C" {
    /// mimalloc's `void mi_collect(bool force)`.
    fn mi_collect(force: bool);
}

/// mimalloc's `mi_collect(true)`: returns the pages freed on this thread (and abandoned
/// by finished threads) to the operating system.
pub(crate) fn collect() {
    // SAFETY: no arguments beyond a flag; safe to call at any time from any thread.
    unsafe { mi_collect(true) }
}

/// Allows or forbids transparent huge pages for this process's future page faults
/// (`PR_SET_THP_DISABLE`; kept across fork and exec).
pub(crate) fn huge_pages(allowed: bool) -> std::io::Result<()> {
    const PR_SET_THP_DISABLE: libc::c_int = 41;
    // SAFETY: prctl with an integer option and integer arguments; no memory is passed.
    let rc = unsafe { libc::prctl(PR_SET_THP_DISABLE, u64::from(!allowed), 0u64, 0u64, 0u64) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Asks the kernel to back `len` bytes from `start` (2 MiB aligned) with huge pages now
/// (`MADV_COLLAPSE`, Linux 6.1), copying the small pages there.
pub(crate) fn collapse(start: usize, len: usize) -> std::io::Result<()> {
    const MADV_COLLAPSE: libc::c_int = 25;
    // SAFETY: MADV_COLLAPSE changes how a range is backed, never its contents; a range
    // that is not mapped, or not eligible, is an error and nothing else.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, MADV_COLLAPSE) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
