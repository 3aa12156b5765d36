//! The allocator: returning freed pages to the operating system.

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
