//! What a test or benchmark set up on the host is removed when a signal stops it, too.
//!
//! Every guard that removes something on drop (a namespace, a process, pins, a
//! directory) registers the same removal here. Drops do not run when SIGINT, SIGTERM or
//! SIGHUP ends a process, so the first registration installs a handler for them: it
//! runs every removal still registered, newest first, then lets the signal end the
//! process as it would have. Dropping a guard unregisters its removal, so the handler
//! never acts on something already gone.

use std::{
    collections::BTreeMap,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        atomic::{AtomicI32, AtomicU64, Ordering},
        Mutex, Once, PoisonError,
    },
};

type Removal = Box<dyn FnOnce() + Send>;

static REMOVALS: Mutex<BTreeMap<u64, Removal>> = Mutex::new(BTreeMap::new());
static NEXT: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();
/// The pipe's write end, which the signal handler writes the signal's number to.
static PIPE: AtomicI32 = AtomicI32::new(-1);

/// A removal registered with `on_signal`; dropping this unregisters it.
pub struct OnSignal(u64);

impl Drop for OnSignal {
    fn drop(&mut self) {
        let mut removals = REMOVALS.lock().unwrap_or_else(PoisonError::into_inner);
        removals.remove(&self.0);
    }
}

/// Registers `removal` to run if a signal stops this process while the returned guard
/// lives.
pub fn on_signal(removal: impl FnOnce() + Send + 'static) -> OnSignal {
    INSTALL.call_once(install);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut removals = REMOVALS.lock().unwrap_or_else(PoisonError::into_inner);
    removals.insert(id, Box::new(removal));
    OnSignal(id)
}

/// Registers the killing of `pid` (a child this process started) on a signal. The
/// process is held by a pidfd, so a PID reused after the child is reaped is never hit.
pub fn kill_on_signal(pid: u32) -> Option<OnSignal> {
    // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: `fd` was just opened and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Some(on_signal(move || {
        // SAFETY: a signal sent through a pidfd this closure owns.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }))
}

extern "C" fn handler(sig: libc::c_int) {
    let byte = sig as u8;
    // SAFETY: write(2) is async-signal-safe; the pipe outlives the process.
    unsafe {
        libc::write(
            PIPE.load(Ordering::Relaxed),
            (&raw const byte).cast::<libc::c_void>(),
            1,
        )
    };
}

/// Starts the thread that runs the removals, and routes the signals to it.
fn install() {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors it returns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        let e = std::io::Error::last_os_error();
        eprintln!("cleanup: no pipe ({e}): a signal will leave what this process set up");
        return;
    }
    PIPE.store(fds[1], Ordering::Relaxed);
    let read = fds[0];
    let spawned = std::thread::Builder::new()
        .name("on-signal".into())
        .spawn(move || remove_on_signal(read));
    if let Err(e) = spawned {
        eprintln!("cleanup: no thread ({e}): a signal will leave what this process set up");
        return;
    }
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with a handler that only writes to a pipe.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

/// Waits for a signal's number on `read`, runs every removal, newest first, then ends
/// the process by that signal.
fn remove_on_signal(read: libc::c_int) {
    let mut sig = 0u8;
    loop {
        // SAFETY: one byte into `sig`.
        let n = unsafe { libc::read(read, (&raw mut sig).cast::<libc::c_void>(), 1) };
        if n == 1 {
            break;
        }
        if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
    let removals = std::mem::take(&mut *REMOVALS.lock().unwrap_or_else(PoisonError::into_inner));
    let count = removals.len();
    for (_, removal) in removals.into_iter().rev() {
        removal();
    }
    eprintln!("stopped by signal {sig}: removed the {count} things this process set up");
    // SAFETY: the default action back, then the same signal, which ends the process.
    unsafe {
        libc::signal(libc::c_int::from(sig), libc::SIG_DFL);
        libc::raise(libc::c_int::from(sig));
    }
    std::process::exit(128 + i32::from(sig));
}
