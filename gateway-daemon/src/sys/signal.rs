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
