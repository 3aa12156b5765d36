//! The raw system calls of the daemon: the only `unsafe` code in the crate.
//!
//! Every wrapper here is safe to call; each `unsafe` block carries a `SAFETY:` comment
//! saying why it is sound. The wrappers keep the calls' flags and errors as they were
//! where they were made (`io::Error::last_os_error()` for failures); the logic built
//! on them stays with its callers.

pub(crate) mod alloc;
pub(crate) mod bpf;
pub(crate) mod clock;
pub(crate) mod flock;
pub(crate) mod fs;
pub(crate) mod iface;
pub(crate) mod inotify;
pub(crate) mod netlink_socket;
pub(crate) mod poll;
pub(crate) mod rlimit;
pub(crate) mod sched;
pub(crate) mod signal;
