//! The allocator: returning freed pages to the operating system, and the pages the
//! heap is made of (small or huge).

// Links mimalloc's C library, whose `mi_collect` is declared below (the binary makes
// mimalloc the global allocator; other users of the library only call the function).
use mimalloc as _;

extern "C" {
    /// mimalloc's `void mi_collect(bool force)`.
    fn mi_collect(force: bool);
    /// mimalloc's `void mi_option_set(mi_option_t option, long value)`.
    fn mi_option_set(option: libc::c_int, value: libc::c_long);
    /// mimalloc's `long mi_option_get(mi_option_t option)`.
    fn mi_option_get(option: libc::c_int) -> libc::c_long;
}

/// `mi_option_purge_delay` in the mimalloc (v3) the `mimalloc` crate builds (checked
/// against its default in a test): milliseconds before freed memory is given back.
const MI_OPTION_PURGE_DELAY: libc::c_int = 15;

/// mimalloc's `mi_collect(true)`: returns the pages freed on this thread (and abandoned
/// by finished threads) to the operating system.
pub(crate) fn collect() {
    // SAFETY: no arguments beyond a flag; safe to call at any time from any thread.
    unsafe { mi_collect(true) }
}

/// How long (in milliseconds; times mimalloc's arena multiplier, 1 by default) freed
/// memory stays for reuse before it is given back to the operating system.
pub(crate) fn set_purge_delay(ms: i64) {
    // SAFETY: sets a process-wide option (an atomic store); any thread, any time.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, ms as libc::c_long) }
}

/// The purge delay in force (`set_purge_delay`).
pub(crate) fn purge_delay() -> i64 {
    // SAFETY: reads a process-wide option; any thread, any time.
    unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) as i64 }
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_purge_delay_option_is_mimallocs_with_its_default_of_a_second() {
        // Read before any test sets it (none does); the environment may set it.
        let want = std::env::var("MIMALLOC_PURGE_DELAY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        assert_eq!(super::purge_delay(), want);
    }
}
