//! Returning freed memory to the system. The `berth` binary allocates with mimalloc,
//! which keeps freed pages for reuse: after a plan of 10k routes they are megabytes
//! the daemon no longer uses.

// Links mimalloc's C library, whose `mi_collect` is declared below (the binary makes
// mimalloc the global allocator; other users of the library only call the function).
use mimalloc as _;

extern "C" {
    /// mimalloc's `void mi_collect(bool force)`.
    fn mi_collect(force: bool);
}

/// Returns the pages freed on this thread (and abandoned by finished threads) to the
/// operating system.
pub fn release_freed() {
    // SAFETY: no arguments beyond a flag; safe to call at any time from any thread.
    unsafe { mi_collect(true) }
}
