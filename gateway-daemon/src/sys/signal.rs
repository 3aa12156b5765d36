//! Signal dispositions of the process.

/// Restores SIGPIPE's default action (end the process), which the Rust runtime sets to
/// "ignore": a command whose reader closed the pipe (`berth check -o json | head`) then
/// ends as command-line tools do, instead of failing every write with EPIPE and
/// panicking in `println!`. Not for `berth run`, whose sockets must not end it.
pub(crate) fn default_sigpipe() {
    // SAFETY: signal(2) with a valid signal number and SIG_DFL installs no handler; it
    // is called before any thread that could be writing to a pipe exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Set by SIGINT and SIGTERM once `catch_interrupts` installed its handler.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn interrupted(_signal: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Catches SIGINT and SIGTERM: instead of ending the process they set the flag
/// returned, and interrupt a blocking call (a command that must undo something before
/// it ends, as `berth monitor` turns the datapath's events off).
pub(crate) fn catch_interrupts() -> &'static std::sync::atomic::AtomicBool {
    let handler = interrupted as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
    &INTERRUPTED
}
