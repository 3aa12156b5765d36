//! Standalone mode: a directory of manifests and a state directory in, claims, the
//! state document and the datapath out. One cycle = read changed files, plan under the
//! store's lock, write claim changes, program the datapath, publish the state; then the
//! announce decision is applied (`announce::Announcer`).
//!
//! `source` reads the manifest directory, `cycle` plans and writes the claims; this
//! file holds the directory watch and the loop.

mod cycle;
mod source;
#[cfg(test)]
mod source_tests;

pub use cycle::cycle;
pub use source::{Look, ManifestSource};

use std::{
    os::fd::BorrowedFd,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::{
    announce::Announcer,
    datapath::Datapath,
    planner,
    publish::{effects, refresh_traffic, Published, Shared},
    store::{Store, StoreError},
    sys,
};

/// How often the directory is looked at when inotify is unavailable (a change takes
/// effect within a second either way).
pub const POLL: Duration = Duration::from_millis(200);

/// Wakes the loop as soon as the manifest directory changes (inotify), or after a
/// timeout; without inotify it simply waits `POLL`. A directory deleted (or moved away)
/// and created again is watched again once it is back. The events say which files to
/// look at (`take_look`).
pub struct DirWatch {
    fd: Option<std::os::fd::OwnedFd>,
    path: std::ffi::CString,
    /// The directory is no longer watched (it was deleted or moved).
    lost: std::cell::Cell<bool>,
    /// What the events drained since the last `take_look` name.
    look: std::cell::RefCell<Option<Look>>,
}

impl DirWatch {
    /// Watches `dir` for files written, moved, created or deleted.
    pub fn new(dir: &Path) -> Self {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap_or_default();
        let none = |path| DirWatch {
            fd: None,
            path,
            lost: false.into(),
            look: None.into(),
        };
        if path.is_empty() {
            return none(path);
        }
        let Ok(fd) = sys::inotify::init() else {
            return none(path);
        };
        let watch = DirWatch {
            fd: Some(fd),
            path,
            lost: false.into(),
            look: None.into(),
        };
        // A directory missing at the start is watched once it appears.
        watch.lost.set(!watch.add());
        watch
    }

    /// Adds the watch on the directory's path; whether that worked.
    fn add(&self) -> bool {
        use std::os::fd::AsFd;
        let Some(fd) = &self.fd else { return false };
        let mask = libc::IN_CLOSE_WRITE
            | libc::IN_MOVED_TO
            | libc::IN_MOVED_FROM
            | libc::IN_CREATE
            | libc::IN_DELETE
            | libc::IN_MODIFY
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF;
        sys::inotify::add_watch(fd.as_fd(), &self.path, mask).is_ok()
    }

    /// Waits until the directory changes, `wake` (a socket other threads write to) has
    /// something, or `timeout` passes. A change counts once the file is complete:
    /// closed after writing, moved in, or deleted. While some file is still being
    /// written, waits for it (at most 100 ms of a continuing burst).
    pub fn wait(&self, timeout: Duration, wake: Option<BorrowedFd<'_>>) {
        if self.lost.get() && self.add() {
            self.lost.set(false);
        }
        let Some(fd) = self.fd.as_ref().filter(|_| !self.lost.get()) else {
            let _ = sys::poll::poll([None, wake], POLL.min(timeout));
            return;
        };
        let Some(mut writing) = self.poll(fd, timeout, wake) else {
            return;
        };
        let deadline = std::time::Instant::now() + Duration::from_millis(100);
        while writing && std::time::Instant::now() < deadline {
            match self.poll(fd, Duration::from_millis(10), None) {
                Some(w) => writing = w,
                None => break,
            }
        }
    }

    /// What the next look at the directory needs to read: the files the events since
    /// the last call named, or every file when no event came (a wake by the timer:
    /// the look every second also finds what inotify cannot see, such as a manifest
    /// that links to a file elsewhere), when the queue overflowed, the directory was
    /// lost, or a directory or link in it changed (a ConfigMap volume swaps its
    /// `..data` link).
    pub fn take_look(&self) -> Look {
        self.look.take().unwrap_or(Look::All)
    }

    /// Notes what one event says to look at.
    fn note(&self, mask: u32, name: &[u8]) {
        use std::os::unix::ffi::OsStrExt;
        let mut look = self.look.borrow_mut();
        let name = std::ffi::OsStr::from_bytes(name.split(|b| *b == 0).next().unwrap_or_default());
        let whole = libc::IN_Q_OVERFLOW
            | libc::IN_ISDIR
            | libc::IN_IGNORED
            | libc::IN_MOVE_SELF
            | libc::IN_DELETE_SELF;
        let current = look.get_or_insert_with(|| Look::Names(Default::default()));
        let Look::Names(names) = current else {
            return;
        };
        if mask & whole != 0 || name.is_empty() {
            *current = Look::All;
            return;
        }
        if crate::manifests::is_manifest_name(std::path::Path::new(name)) {
            names.insert(name.to_os_string());
            return;
        }
        // Other files (written aside, then renamed to a manifest's name) are not read;
        // a link or directory may be where manifests point.
        let dir = std::path::Path::new(std::ffi::OsStr::from_bytes(self.path.as_bytes()));
        if std::fs::symlink_metadata(dir.join(name)).is_ok_and(|m| !m.is_file()) {
            *current = Look::All;
        }
    }

    /// Whether a change of the directory or something on `wake` waits (without taking
    /// it: the next `wait` does).
    pub fn pending(&self, wake: Option<BorrowedFd<'_>>) -> bool {
        use std::os::fd::AsFd;
        let dir = self.fd.as_ref().map(|fd| fd.as_fd());
        matches!(
            sys::poll::poll([dir, wake], Duration::ZERO),
            Ok([true, _] | [_, true])
        )
    }

    /// Polls for events (returning early when `wake` has something) and drains them:
    /// `None` if there were none, else whether the last event leaves a file being
    /// written (modified or created, not yet closed).
    fn poll(
        &self,
        fd: &std::os::fd::OwnedFd,
        timeout: Duration,
        wake: Option<BorrowedFd<'_>>,
    ) -> Option<bool> {
        use std::os::fd::AsFd;
        if !matches!(
            sys::poll::poll([Some(fd.as_fd()), wake], timeout),
            Ok([true, _])
        ) {
            return None;
        }
        let mut writing = None;
        let mut buf = [0u8; 4096];
        loop {
            let n = match sys::inotify::read(fd.as_fd(), &mut buf) {
                Ok(n) if n > 0 => n,
                _ => return writing,
            };
            // struct inotify_event: wd (i32), mask (u32), cookie (u32), len (u32), name.
            let mut at = 0;
            while at + 16 <= n {
                let field = |i: usize| {
                    u32::from_ne_bytes(buf[at + i..at + i + 4].try_into().unwrap_or_default())
                };
                let (mask, len) = (field(4), field(12) as usize);
                writing = Some(mask & (libc::IN_MODIFY | libc::IN_CREATE) != 0);
                self.note(mask, buf.get(at + 16..at + 16 + len).unwrap_or_default());
                if mask & (libc::IN_IGNORED | libc::IN_MOVE_SELF) != 0 {
                    self.lost.set(true);
                }
                at += 16 + len;
            }
        }
    }
}

/// Errors of one cycle.
#[derive(Debug, thiserror::Error)]
pub enum CycleError {
    /// The claim store failed.
    #[error("claim store")]
    Store(#[from] StoreError),
    /// The manifest directory could not be read (what was in force stays).
    #[error("reading manifests from {}", dir.display())]
    Manifests {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The datapath could not be programmed.
    #[error("programming the datapath")]
    Datapath(#[from] crate::datapath::DatapathError),
    /// Claims kept changing under us (another writer of the state directory).
    #[error(transparent)]
    Unsettled(#[from] crate::reconcile::Unsettled),
}

/// Runs the loop forever: poll the directory, plan, commit, program, publish; and
/// apply the announce decision (at least every second, and at once when `announcer`'s
/// control is asked something). A failed cycle is logged and retried; what was last
/// committed and programmed stays in force.
pub fn run_loop(
    source: &mut ManifestSource,
    store: &Store,
    mut datapath: Option<&mut Datapath>,
    settings: &planner::Settings,
    shared: &Shared,
    announcer: &mut Announcer,
) {
    let control = Arc::clone(announcer.control());
    let mut plans = Plans {
        last: std::time::Instant::now() - Duration::from_secs(3600),
        memo: planner::Memo::default(),
        health: crate::health::Checker::new({
            let control = Arc::clone(&control);
            move || control.wake_loop()
        }),
    };
    let mut failing = false;
    let watch = DirWatch::new(&source.dir);
    // A drain kept from an earlier run, or a stop, holds before the first plan.
    announcer.step(datapath.as_deref_mut(), shared);
    // A read of the counters gives way to a change of the manifests or a request.
    let pending = || watch.pending(control.wake_fd());
    loop {
        let woken = Woken {
            look: watch.take_look(),
            pending: &pending,
        };
        match step(
            source,
            woken,
            store,
            datapath.as_deref_mut(),
            settings,
            shared,
            &mut plans,
        ) {
            Ok(()) if failing => {
                tracing::info!("recovered");
                failing = false;
            }
            Ok(()) => {}
            Err(e) => {
                if !failing {
                    tracing::error!(error = %crate::error_chain(&e), "cycle failed; retrying");
                }
                failing = true;
                let mut guard = shared.lock().unwrap_or_else(|e| e.into_inner());
                let mut p = Published::clone(&guard);
                p.last_error = Some(crate::error_chain(&e));
                *guard = Arc::new(p);
            }
        }
        announcer.step(datapath.as_deref_mut(), shared);
        // Wake on a change or a request, and about every second for cool-downs that
        // end and the announce decision (never more often than POLL without a change,
        // also while cycles fail).
        watch.wait(
            Duration::from_secs(1)
                .saturating_sub(plans.last.elapsed())
                .max(POLL),
            control.wake_fd(),
        );
    }
}

/// What one plan leaves for the loop: when it was made, the planner's memo, and the
/// health checks.
struct Plans {
    last: std::time::Instant,
    memo: planner::Memo,
    health: crate::health::Checker,
}

/// What a wake of the loop brings: where to look for changed files, and whether
/// something else waits already (a read of the counters gives way to it).
struct Woken<'a> {
    look: Look,
    pending: &'a dyn Fn() -> bool,
}

fn step(
    source: &mut ManifestSource,
    woken: Woken,
    store: &Store,
    datapath: Option<&mut Datapath>,
    settings: &planner::Settings,
    shared: &Shared,
    plans: &mut Plans,
) -> Result<(), CycleError> {
    let Woken { look, pending } = woken;
    let refreshing = std::time::Instant::now();
    let (changed, errors) = source.refresh_looking(look)?;
    let t_refresh = refreshing.elapsed();
    for e in &errors {
        tracing::error!("{e} (the last good version of this file stays in force)");
    }
    let prev = Arc::clone(&shared.lock().unwrap_or_else(|e| e.into_inner()));
    if changed || prev.cycles == 0 {
        plans.health.follow(source.snapshot());
    }
    // Plan on a change (of the objects, or of an endpoint's health), after a failure,
    // and (about every second) while a released port cools down; otherwise nothing the
    // plan depends on has moved.
    let due = changed
        || plans.health.moved()
        || prev.cycles == 0
        || prev.last_error.is_some()
        || (prev.cooling && plans.last.elapsed() >= Duration::from_secs(1));
    if !due {
        if let Some(dp) = datapath {
            refresh_traffic(shared, dp, pending);
        }
        return Ok(());
    }
    let started = std::time::Instant::now();
    let checked = plans.health.overlay(source.snapshot());
    let now = SystemTime::now();
    let health = plans.health.policy_entries(source.snapshot(), now);
    let plan = cycle(
        store,
        checked.as_ref().unwrap_or_else(|| source.snapshot()),
        now,
        settings,
        &mut plans.memo,
        health,
    )?;
    let t_cycle = started.elapsed();
    let mut datapath = datapath;
    // The plan is indexed for the next one on a second thread while its effects run
    // (a third of a second at start with 100,000 routes).
    let memo = &mut plans.memo;
    let mut next = std::thread::scope(|s| {
        let settling = s.spawn(|| memo.settle());
        let next = effects(plan, datapath.as_deref_mut(), &prev);
        if let Err(panic) = settling.join() {
            std::panic::resume_unwind(panic);
        }
        next
    })?;
    let t_effects = started.elapsed();
    next.broken = source.broken();
    next.warnings = source.warnings();
    next.ignored_records = store.ignored_records();
    next.health = plans.health.handle();
    next.cycle_millis += started.elapsed().as_millis() as u64;
    crate::memory::published();
    *shared.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
    plans.last = std::time::Instant::now();
    tracing::debug!(
        total = ?started.elapsed(),
        refresh = ?t_refresh,
        plan_and_store = ?t_cycle,
        datapath_and_document = ?(t_effects - t_cycle),
        "planned"
    );
    if let Some(dp) = datapath {
        crate::publish::refresh_stale_traffic(shared, dp, pending);
    }
    Ok(())
}
