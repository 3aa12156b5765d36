//! Standalone mode: a directory of manifests and a state directory in, claims, the
//! state document and the datapath out. One cycle = read changed files, plan under the
//! store's lock, write claim changes, program the datapath, publish the state.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use crate::{
    datapath::Datapath,
    manifests::{self, FileObjects},
    model::{PortClaim, Snapshot},
    planner::{
        self,
        changes::{claim_changes, ClaimChange},
        Plan,
    },
    publish::{effects, refresh_traffic, Published, Shared},
    store::{Store, StoreError},
    sys,
};

/// How often the directory is looked at when inotify is unavailable (a change takes
/// effect within a second either way).
pub const POLL: Duration = Duration::from_millis(200);

/// Wakes the loop as soon as the manifest directory changes (inotify), or after a
/// timeout; without inotify it simply waits `POLL`. A directory deleted (or moved away)
/// and created again is watched again once it is back.
pub struct DirWatch {
    fd: Option<std::os::fd::OwnedFd>,
    path: std::ffi::CString,
    /// The directory is no longer watched (it was deleted or moved).
    lost: std::cell::Cell<bool>,
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

    /// Waits until the directory changes or `timeout` passes. A change counts once the
    /// file is complete: closed after writing, moved in, or deleted. While some file is
    /// still being written, waits for it (at most 100 ms of a continuing burst).
    pub fn wait(&self, timeout: Duration) {
        if self.lost.get() && self.add() {
            self.lost.set(false);
        }
        let Some(fd) = self.fd.as_ref().filter(|_| !self.lost.get()) else {
            std::thread::sleep(POLL.min(timeout));
            return;
        };
        let Some(mut writing) = self.poll(fd, timeout) else {
            return;
        };
        let deadline = std::time::Instant::now() + Duration::from_millis(100);
        while writing && std::time::Instant::now() < deadline {
            match self.poll(fd, Duration::from_millis(10)) {
                Some(w) => writing = w,
                None => break,
            }
        }
    }

    /// Polls for events and drains them: `None` if there were none, else whether the
    /// last event leaves a file being written (modified or created, not yet closed).
    fn poll(&self, fd: &std::os::fd::OwnedFd, timeout: Duration) -> Option<bool> {
        use std::os::fd::AsFd;
        let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
        if !matches!(sys::inotify::poll_in(fd.as_fd(), millis), Ok(ready) if ready > 0) {
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
                if mask & (libc::IN_IGNORED | libc::IN_MOVE_SELF) != 0 {
                    self.lost.set(true);
                }
                at += 16 + len;
            }
        }
    }
}

/// The files of a manifest directory, each with its last good objects.
///
/// Bookkeeping per look at the directory is one listing and one `stat` per file, with
/// map lookups: O(n log n) for n files; a changed file costs its own parse.
pub struct ManifestSource {
    dir: PathBuf,
    settle: Duration,
    files: BTreeMap<PathBuf, Tracked>,
    /// Where each object in force is defined.
    definitions: manifests::Definitions,
    /// Files whose current version defines an object another file defines: admitted
    /// when that definition goes.
    waiting: BTreeSet<PathBuf>,
}

struct Tracked {
    /// Modification time and length of the version read.
    stamp: (SystemTime, u64),
    /// The objects in force: the current version's, or the last good one's.
    objects: FileObjects,
    /// The current version failed: its errors.
    broken: Vec<String>,
    /// The current version's unknown fields.
    warnings: Vec<String>,
    /// The current version, refused only for objects defined elsewhere.
    refused: Option<FileObjects>,
    /// When the file was first seen gone (its objects stay in force meanwhile).
    gone_since: Option<Instant>,
}

impl ManifestSource {
    /// Watches `dir`; a file's removal takes effect after it stays gone for `settle`
    /// (`--manifest-settle`), so that a file replaced by `rm` then write, or by an
    /// editor or a config tool, causes no outage.
    pub fn new(dir: &Path, settle: Duration) -> Self {
        ManifestSource {
            dir: dir.to_path_buf(),
            settle,
            files: BTreeMap::new(),
            definitions: manifests::Definitions::default(),
            waiting: BTreeSet::new(),
        }
    }

    /// Re-reads files that changed; returns whether any file did (or was removed), and
    /// the errors of files newly found broken (their last good objects stay in force).
    /// If the directory cannot be listed (it is gone), nothing changes.
    pub fn refresh(&mut self) -> Result<(bool, Vec<String>), CycleError> {
        let listed = manifests::list_dir(&self.dir).map_err(|e| CycleError::Manifests {
            dir: self.dir.clone(),
            source: e,
        })?;
        let mut changed = false;
        let mut errors = Vec::new();
        let stamp_of = |path: &Path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                meta.len(),
            ))
        };
        // One merge of the listing with the files known, both in path order (one
        // directory: comparing the paths' bytes orders them as `Path` does): files new
        // or changed are read below; files gone stay in force until they have stayed
        // gone for the settle time.
        let now = Instant::now();
        let mut to_read = Vec::new();
        let (mut newly_gone, mut removed) = (Vec::new(), Vec::new());
        let mut listed = listed.into_iter().peekable();
        for (path, t) in &mut self.files {
            while let Some(new) = listed.next_if(|p| p.as_os_str() < path.as_os_str()) {
                to_read.extend(stamp_of(&new).map(|s| (new, s)));
            }
            if listed
                .next_if(|p| p.as_os_str() == path.as_os_str())
                .is_some()
            {
                if t.gone_since.take().is_some() {
                    tracing::debug!(file = %path.display(), "manifest file is back");
                }
                match stamp_of(path) {
                    Some(s) if s != t.stamp => to_read.push((path.clone(), s)),
                    _ => {}
                }
                continue;
            }
            let since = *t.gone_since.get_or_insert_with(|| {
                newly_gone.push(path.clone());
                now
            });
            if now.duration_since(since) >= self.settle {
                removed.push(path.clone());
            }
        }
        for new in listed {
            to_read.extend(stamp_of(&new).map(|s| (new, s)));
        }
        for (path, stamp) in to_read {
            self.read(&path, stamp, &mut errors);
            changed = true;
        }
        if !newly_gone.is_empty() {
            tracing::info!(
                files = %some_of(&newly_gone),
                settle = %humantime::format_duration(self.settle),
                "manifest files gone: their objects stay in force unless they are back within the settle time"
            );
        }
        if !removed.is_empty() {
            tracing::info!(files = %some_of(&removed), "manifest files removed: their objects are gone");
            changed = true;
        }
        for path in removed {
            if let Some(t) = self.files.remove(&path) {
                self.waiting.remove(&path);
                // Releasing definitions cannot fail.
                let _ = self
                    .definitions
                    .replace(&path, &t.objects, &FileObjects::default());
            }
        }
        // A file changed or removed may have let go of definitions others wait for.
        if changed && !self.waiting.is_empty() {
            self.admit_waiting();
        }
        Ok((changed, errors))
    }

    /// Reads a new version of `path`: in force if it is good, else its errors are
    /// added to `errors` and the last good version stays.
    fn read(&mut self, path: &Path, stamp: (SystemTime, u64), errors: &mut Vec<String>) {
        let parsed = manifests::read_file(path);
        for w in &parsed.warnings {
            tracing::warn!("{w}");
        }
        let t = self
            .files
            .entry(path.to_path_buf())
            .or_insert_with(|| Tracked {
                stamp,
                objects: FileObjects::default(),
                broken: Vec::new(),
                warnings: Vec::new(),
                refused: None,
                gone_since: None,
            });
        t.stamp = stamp;
        t.warnings = parsed.warnings.clone();
        t.refused = None;
        self.waiting.remove(path);
        let failed = if parsed.errors.is_empty() {
            match self.definitions.replace(path, &t.objects, &parsed) {
                Ok(()) => {
                    t.objects = parsed;
                    t.broken.clear();
                    return;
                }
                Err(e) => {
                    t.refused = Some(parsed);
                    self.waiting.insert(path.to_path_buf());
                    e
                }
            }
        } else {
            parsed.errors
        };
        t.broken = failed.iter().map(ToString::to_string).collect();
        errors.extend(t.broken.iter().cloned());
    }

    /// Admits the files refused for objects defined elsewhere whose other definitions
    /// are gone.
    fn admit_waiting(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        for path in waiting {
            let Some(t) = self.files.get_mut(&path) else {
                continue;
            };
            let Some(new) = t.refused.take() else {
                continue;
            };
            match self.definitions.replace(&path, &t.objects, &new) {
                Ok(()) => {
                    tracing::info!(file = %path.display(), "manifest file admitted: the other definitions are gone");
                    t.objects = new;
                    t.broken.clear();
                }
                Err(e) => {
                    t.broken = e.iter().map(ToString::to_string).collect();
                    t.refused = Some(new);
                    self.waiting.insert(path);
                }
            }
        }
    }

    /// The objects in force, moved out (none copied) until `give_back`.
    pub fn take_snapshot(&mut self) -> (Snapshot, manifests::Layout) {
        manifests::take_snapshot(self.files.values_mut().map(|t| &mut t.objects))
    }

    /// Returns the objects of `take_snapshot` (routes keep the creation times a cycle
    /// gave them: a route's first-seen time does not change while it stays).
    pub fn give_back(&mut self, snapshot: Snapshot, layout: manifests::Layout) {
        manifests::give_back(
            self.files.values_mut().map(|t| &mut t.objects),
            snapshot,
            layout,
        );
    }

    /// Errors of files whose current version is broken.
    pub fn broken(&self) -> Vec<String> {
        self.files
            .values()
            .flat_map(|t| t.broken.iter().cloned())
            .collect()
    }

    /// Unknown fields of the files' current versions.
    pub fn warnings(&self) -> Vec<String> {
        self.files
            .values()
            .flat_map(|t| t.warnings.iter().cloned())
            .collect()
    }
}

/// Up to five of `paths`, and how many more.
fn some_of(paths: &[PathBuf]) -> String {
    let mut s: Vec<String> = paths
        .iter()
        .take(5)
        .map(|p| p.display().to_string())
        .collect();
    if paths.len() > 5 {
        s.push(format!("and {} more", paths.len() - 5));
    }
    s.join(", ")
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
}

/// Plans once from `snapshot`, commits the claim changes and returns the plan.
pub fn cycle(
    store: &Store,
    snapshot: &mut Snapshot,
    now: SystemTime,
    default_address: Option<std::net::Ipv4Addr>,
    memo: &mut planner::Memo,
) -> Result<Plan, CycleError> {
    let started = std::time::Instant::now();
    let _lock = store.lock()?;
    // Routes without a creation time are ordered by when Berth first saw them.
    let now_text = humantime::format_rfc3339_seconds(now).to_string();
    let (added, removed) = store.with_first_seen(|seen| {
        seen.begin_pass();
        let mut added: Vec<(String, String)> = Vec::new();
        let mut key = String::new();
        for r in &mut snapshot.routes {
            key.clear();
            crate::model::route_key(&mut key, r.kind.name(), r.metadata.ns(), &r.metadata.name);
            let t = match seen.see(&key) {
                Some(t) => t,
                None => {
                    added.push((key.clone(), now_text.clone()));
                    &now_text
                }
            };
            if r.metadata.creation_timestamp.is_none() {
                // The route is moved back into its file with this time: only a route
                // seen for the first time is copied here.
                Arc::make_mut(r).metadata.creation_timestamp = Some(t.to_string());
            }
        }
        // A route that is gone and comes back later is a new object with a new time.
        (added, seen.unseen())
    })?;
    let mut seen_changed = !added.is_empty() || !removed.is_empty();
    let t_seen = started.elapsed();
    loop {
        let stored = store.claims_shared()?;
        let t_claims = started.elapsed();
        let plan = planner::plan_with(
            &planner::Input {
                snapshot,
                claims: &stored,
                now,
                default_address,
                ephemeral_ports: crate::host::ephemeral_ports(),
                allocate: true,
            },
            memo,
        );
        let t_plan = started.elapsed();
        let changes = claim_changes(&stored, &plan.claims);
        let t_changes = started.elapsed();
        if seen_changed || !changes.is_empty() {
            // Other readers of the directory must read it again.
            store.begin_write()?;
            if seen_changed {
                store.record_first_seen(&added, &removed)?;
                seen_changed = false;
            }
        }
        // Deletions keep only names: the stored claims are let go before writing, so
        // that the store's write need not copy the claims it shares with `stored`.
        let writes = Writes::of(changes);
        drop(stored);
        let r = writes.commit(store);
        tracing::debug!(
            lock_and_first_seen = ?t_seen,
            read_claims = ?(t_claims - t_seen),
            plan = ?(t_plan - t_claims),
            claim_changes = ?(t_changes - t_plan),
            commit = ?(started.elapsed() - t_changes),
            "cycle"
        );
        match r {
            Ok(()) => {
                // Said once: the claim is released for good by this commit.
                for why in &plan.released {
                    tracing::warn!("{why}");
                }
                return Ok(plan);
            }
            // Someone else created that claim meanwhile: read again and plan again.
            Err(StoreError::AlreadyExists { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Claim changes as the store takes them: deleted by name, updated, created.
struct Writes {
    deleted: Vec<(String, String)>,
    updates: Vec<Arc<PortClaim>>,
    creates: Vec<Arc<PortClaim>>,
}

impl Writes {
    fn of(changes: Vec<ClaimChange>) -> Self {
        let mut w = Writes {
            deleted: Vec::new(),
            updates: Vec::new(),
            creates: Vec::new(),
        };
        for change in changes {
            match change {
                ClaimChange::Delete(c) => w
                    .deleted
                    .push((c.metadata.ns().to_string(), c.metadata.name.clone())),
                ClaimChange::Update(c) => w.updates.push(Arc::clone(c)),
                ClaimChange::Create(c) => w.creates.push(Arc::clone(c)),
            }
        }
        w
    }

    /// Writes them in one commit of the store (deletions first: a port handed over
    /// within one plan is free before its new claim is created).
    fn commit(&self, store: &Store) -> Result<(), StoreError> {
        let deletes: Vec<(&str, &str)> = self
            .deleted
            .iter()
            .map(|(ns, name)| (ns.as_str(), name.as_str()))
            .collect();
        store.commit(&deletes, &self.updates, &self.creates)
    }
}

/// Runs the loop forever: poll the directory, plan, commit, program, publish. A failed
/// cycle is logged and retried; what was last committed and programmed stays in force.
pub fn run_loop(
    source: &mut ManifestSource,
    store: &Store,
    mut datapath: Option<&mut Datapath>,
    default_address: Option<std::net::Ipv4Addr>,
    shared: &Shared,
) {
    let mut last_plan = std::time::Instant::now() - Duration::from_secs(3600);
    let mut failing = false;
    let mut memo = planner::Memo::default();
    let watch = DirWatch::new(&source.dir);
    loop {
        match step(
            source,
            store,
            datapath.as_deref_mut(),
            default_address,
            shared,
            &mut last_plan,
            &mut memo,
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
        // Wake on a change, and about every second for cool-downs that end (never
        // more often than POLL without a change, also while cycles fail).
        watch.wait(
            Duration::from_secs(1)
                .saturating_sub(last_plan.elapsed())
                .max(POLL),
        );
    }
}

fn step(
    source: &mut ManifestSource,
    store: &Store,
    datapath: Option<&mut Datapath>,
    default_address: Option<std::net::Ipv4Addr>,
    shared: &Shared,
    last_plan: &mut std::time::Instant,
    memo: &mut planner::Memo,
) -> Result<(), CycleError> {
    let (changed, errors) = source.refresh()?;
    for e in &errors {
        tracing::error!("{e} (the last good version of this file stays in force)");
    }
    let prev = Arc::clone(&shared.lock().unwrap_or_else(|e| e.into_inner()));
    // Plan on a change, after a failure, and (about every second) while a released
    // port cools down; otherwise nothing the plan depends on has moved.
    let due = changed
        || prev.cycles == 0
        || prev.last_error.is_some()
        || (prev.cooling && last_plan.elapsed() >= Duration::from_secs(1));
    if !due {
        if let Some(dp) = datapath {
            refresh_traffic(shared, dp);
        }
        return Ok(());
    }
    let started = std::time::Instant::now();
    let (mut snapshot, layout) = source.take_snapshot();
    let t_snapshot = started.elapsed();
    let planned = cycle(
        store,
        &mut snapshot,
        SystemTime::now(),
        default_address,
        memo,
    );
    source.give_back(snapshot, layout);
    let plan = planned?;
    let t_cycle = started.elapsed();
    let mut next = effects(plan, datapath, &prev)?;
    let t_effects = started.elapsed();
    next.broken = source.broken();
    next.warnings = source.warnings();
    // A plan of many routes frees megabytes: give them back (about a millisecond).
    crate::memory::release_freed();
    *shared.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
    *last_plan = std::time::Instant::now();
    tracing::debug!(
        total = ?started.elapsed(),
        snapshot = ?t_snapshot,
        plan_and_store = ?(t_cycle - t_snapshot),
        datapath_and_document = ?(t_effects - t_cycle),
        "planned"
    );
    Ok(())
}
