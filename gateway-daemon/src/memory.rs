//! Returning freed memory to the system. The `berth` binary allocates with mimalloc,
//! which keeps freed pages for reuse: after a plan of 10k routes they are megabytes
//! the daemon no longer uses.

/// Returns the pages freed on this thread (and abandoned by finished threads) to the
/// operating system.
pub fn release_freed() {
    crate::sys::alloc::collect();
}
