//! Scheduling of the calling thread.

/// Gives the calling thread the lowest priority (nice 19): work that may wait for
/// everything else. On Linux the priority is a thread's own.
pub(crate) fn lowest_priority() {
    // SAFETY: gettid and setpriority take and return integers; a failure leaves the
    // priority as it was.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}
