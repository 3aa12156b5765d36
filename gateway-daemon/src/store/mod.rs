//! The standalone claim store: the PortClaims in the journal `STATE/claims.log`, and
//! the first-seen times of routes in the journal `STATE/first-seen.log`.
//!
//! A journal is a file of records, one per line, appended to and fsynced: a claim
//! created or changed is a line `+` and its JSON, a claim deleted a line `-`, its
//! namespace and name. A `kill -9` (or a crash) at any instant leaves at worst a torn
//! last line, which readers ignore and the next append cuts off. A journal is rewritten
//! whole, atomically (temporary file fsynced, renamed over, directory fsynced), when it
//! has grown to twice what it holds. One append makes any number of claims durable:
//! 10k claims cost one write and one fsync, where a file per claim cost 10k file
//! creations (measured ~0.4 ms each on this project's VMs, 4 s in all).
//!
//! Writers hold an exclusive `flock` on `STATE/lock` for a whole read-plan-write cycle
//! (a write made without it takes it for itself), released by the kernel if the process
//! dies: so a claim is created only if no one holds it, also between processes. Claims
//! written by earlier versions, one YAML file each under `STATE/claims/NS/`, are moved
//! into the journal when the store is opened.

use std::{
    collections::BTreeMap,
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use crate::model::PortClaim;
use std::sync::Arc;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file operation failed.
    #[error("{action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A stored file could not be parsed.
    #[error(
        "{}: {message} (nothing is planned on a state that cannot be read: `berth state \
         check --state-dir DIR` lists the bad records, `berth state repair --state-dir DIR` \
         moves them aside and keeps every valid claim)",
        .path.display()
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Another daemon runs on this state directory.
    #[error(
        "state directory {} is in use by another berth run (pid {pid}); two daemons on one \
         directory would release each other's claims",
        .dir.display()
    )]
    InUse {
        /// The directory.
        dir: PathBuf,
        /// The holder's pid, as it wrote it ("?" if unreadable).
        pid: String,
    },
    /// Creating a claim that exists already: someone else holds the port.
    #[error("claim {namespace}/{name} exists already")]
    AlreadyExists {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

type Result<T, E = StoreError> = std::result::Result<T, E>;

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// A state directory.
///
/// Reads are served from memory while the directory's generation (`STATE/generation`,
/// bumped by `begin_write` before any writer changes anything) is the one they were
/// read at; a writer keeps that memory in step with what it writes.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
    cache: std::sync::Arc<std::sync::Mutex<Cache>>,
    /// Whether this store holds the directory's lock, and has bumped the generation
    /// under it.
    locked: std::sync::Arc<std::sync::Mutex<Locked>>,
    /// Ignored records already logged.
    reported: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

#[derive(Debug, Default)]
struct Locked {
    held: bool,
    bumped: bool,
}

#[derive(Debug, Default)]
struct Cache {
    generation: Option<u64>,
    claims: Option<Claims>,
    first_seen: Option<FirstSeen>,
}

/// Claims as read from the journal (by namespace, then name; shared with readers
/// until the next write), and the journal's length in lines.
#[derive(Debug, Default)]
struct Claims {
    list: Arc<Vec<Arc<PortClaim>>>,
    lines: usize,
}

fn claim_key(c: &PortClaim) -> (&str, &str) {
    (c.metadata.ns(), c.metadata.name.as_str())
}

impl Claims {
    fn find(&self, namespace: &str, name: &str) -> std::result::Result<usize, usize> {
        self.list
            .binary_search_by(|c| claim_key(c).cmp(&(namespace, name)))
    }

    /// Applies `changes` in order: one at a time where it belongs, or, for many, by
    /// rebuilding the list once.
    fn apply(&mut self, changes: &[Change]) {
        let list = Arc::make_mut(&mut self.list);
        if changes.len() > 64 {
            let mut by_name: BTreeMap<(String, String), Arc<PortClaim>> = std::mem::take(list)
                .into_iter()
                .map(|c| ((c.metadata.ns().to_string(), c.metadata.name.clone()), c))
                .collect();
            for change in changes {
                match change {
                    Change::Put(c) => {
                        let key = (c.metadata.ns().to_string(), c.metadata.name.clone());
                        by_name.insert(key, Arc::clone(c));
                    }
                    Change::Delete(ns, name) => {
                        by_name.remove(&(ns.to_string(), name.to_string()));
                    }
                }
            }
            *list = by_name.into_values().collect();
            return;
        }
        for change in changes {
            let (ns, name) = match change {
                Change::Put(c) => claim_key(c),
                Change::Delete(ns, name) => (*ns, *name),
            };
            match (
                change,
                list.binary_search_by(|c| claim_key(c).cmp(&(ns, name))),
            ) {
                (Change::Put(c), Ok(i)) => list[i] = Arc::clone(c),
                (Change::Put(c), Err(i)) => list.insert(i, Arc::clone(c)),
                (Change::Delete(..), Ok(i)) => {
                    list.remove(i);
                }
                (Change::Delete(..), Err(_)) => {}
            }
        }
    }
}

/// First-seen times as read from the journal, and the journal's length in lines.
#[derive(Debug)]
struct FirstSeen {
    times: FirstSeenTimes,
    lines: usize,
}

/// First-seen times of routes (`Kind/namespace/name` → RFC 3339), and which of them a
/// pass over the routes present has seen: a pass costs one lookup per route and tells
/// the routes that are gone without building a set of the present ones.
#[derive(Debug, Default)]
pub struct FirstSeenTimes {
    times: crate::planner::FastMap<String, Seen>,
    /// The current pass.
    pass: u64,
    /// Distinct keys seen in the current pass.
    seen: usize,
}

#[derive(Debug)]
struct Seen {
    time: String,
    /// The last pass that saw this key.
    pass: u64,
}

impl FirstSeenTimes {
    /// Starts a pass over the routes present.
    pub fn begin_pass(&mut self) {
        self.pass += 1;
        self.seen = 0;
    }

    /// The first-seen time of `key`, marking it present in this pass.
    pub fn see(&mut self, key: &str) -> Option<&str> {
        let pass = self.pass;
        let e = self.times.get_mut(key)?;
        if e.pass != pass {
            e.pass = pass;
            self.seen += 1;
        }
        Some(&e.time)
    }

    /// Keys not seen in this pass.
    pub fn unseen(&self) -> Vec<String> {
        if self.seen == self.times.len() {
            return Vec::new();
        }
        self.times
            .iter()
            .filter(|(_, e)| e.pass != self.pass)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The first-seen time of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.times.get(key).map(|e| e.time.as_str())
    }

    /// All times, by key.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.times
            .iter()
            .map(|(k, e)| (k.clone(), e.time.clone()))
            .collect()
    }

    fn insert(&mut self, key: String, time: String) {
        // Recorded during a pass: the route is present.
        let pass = self.pass;
        if self.times.insert(key, Seen { time, pass }).is_none() {
            self.seen += 1;
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some(e) = self.times.remove(key) {
            if e.pass == self.pass {
                self.seen -= 1;
            }
        }
    }

    fn len(&self) -> usize {
        self.times.len()
    }
}

const FIRST_SEEN_LOG: &str = "first-seen.log";
const CLAIMS_LOG: &str = "claims.log";
/// Written by earlier versions; read once and turned into the journal.
const FIRST_SEEN_YAML: &str = "first-seen.yaml";

/// A daemon's hold on a state directory for as long as it runs (`Store::own`);
/// released on drop or process death.
pub struct Owner {
    _file: File,
}

/// The exclusive lock of a state directory; released on drop (or process death).
pub struct StoreLock {
    _file: File,
    locked: std::sync::Arc<std::sync::Mutex<Locked>>,
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        *self.locked.lock().unwrap_or_else(|e| e.into_inner()) = Locked::default();
    }
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl Store {
    /// Opens (creating if needed) a state directory.
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        let store = Store {
            dir: dir.to_path_buf(),
            cache: Default::default(),
            locked: Default::default(),
            reported: Default::default(),
        };
        store.remove_stale_temporaries()?;
        store.import_claim_files()?;
        Ok(store)
    }

    /// Moves claims of earlier versions (a YAML file each) into the journal, once.
    fn import_claim_files(&self) -> Result<()> {
        let root = self.dir.join("claims");
        if !root.exists() {
            return Ok(());
        }
        let _lock = self.lock()?;
        let log = self.dir.join(CLAIMS_LOG);
        if !log.exists() {
            let mut text = String::new();
            for c in self.read_claim_files()? {
                claim_record(&mut text, &c, &log)?;
            }
            self.rewrite_journal(CLAIMS_LOG, &text)?;
        }
        // In the journal now (also if an earlier import stopped before this).
        fs::remove_dir_all(&root).map_err(io_err("removing", &root))?;
        sync_dir(&self.dir)
    }

    /// Removes temporary files left by writers killed mid-write (their process is gone).
    fn remove_stale_temporaries(&self) -> Result<()> {
        let mut dirs = vec![self.dir.clone()];
        dirs.extend(
            read_dir(&self.dir.join("claims"))?
                .into_iter()
                .filter(|p| p.is_dir()),
        );
        for d in dirs {
            for f in read_dir(&d)? {
                let name = f
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let Some(pid) = name.strip_prefix(".tmp-").and_then(|r| r.split('-').next()) else {
                    continue;
                };
                if !Path::new("/proc").join(pid).exists() {
                    let _ = fs::remove_file(&f);
                }
            }
        }
        Ok(())
    }

    /// Takes the directory for this process alone, for as long as the returned `Owner`
    /// lives: a second `berth run` on the same directory is refused at start (it would
    /// plan without the first one's routes and release their claims). Other readers and
    /// one-off writers (`berth check`, tests) do not need it.
    pub fn own(&self) -> Result<Owner> {
        let path = self.dir.join("owner");
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err("opening", &path))?;
        // SAFETY: flock on a descriptor we own; non-blocking.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let pid = fs::read_to_string(&path)
                    .map(|p| p.trim().to_string())
                    .unwrap_or_else(|_| "?".into());
                return Err(StoreError::InUse {
                    dir: self.dir.clone(),
                    pid,
                });
            }
            return Err(io_err("locking", &path)(err));
        }
        // For the message a second daemon prints; not needed for correctness.
        let _ = file
            .set_len(0)
            .and_then(|()| writeln!(file, "{}", std::process::id()));
        Ok(Owner { _file: file })
    }

    /// Takes the directory's writer lock, waiting for another holder to finish.
    pub fn lock(&self) -> Result<StoreLock> {
        let path = self.dir.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err("opening", &path))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io_err("locking", &path)(io::Error::last_os_error()));
        }
        self.locked.lock().unwrap_or_else(|e| e.into_inner()).held = true;
        Ok(StoreLock {
            _file: file,
            locked: std::sync::Arc::clone(&self.locked),
        })
    }

    /// The lock for one write: none if this store holds it already.
    fn lock_for_write(&self) -> Result<Option<StoreLock>> {
        let held = self.locked.lock().unwrap_or_else(|e| e.into_inner()).held;
        if held {
            Ok(None)
        } else {
            self.lock().map(Some)
        }
    }

    fn generation(&self) -> Result<u64> {
        let path = self.dir.join("generation");
        match fs::read_to_string(&path) {
            Ok(t) => t.trim().parse().map_err(|e| StoreError::Corrupt {
                path,
                message: format!("{e}"),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(io_err("reading", &path)(e)),
        }
    }

    /// The cache, emptied if the directory changed since it was filled.
    fn fresh_cache(&self) -> Result<std::sync::MutexGuard<'_, Cache>> {
        let generation = self.generation()?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.generation != Some(generation) {
            *cache = Cache {
                generation: Some(generation),
                ..Cache::default()
            };
        }
        Ok(cache)
    }

    /// Announces a batch of writes (call under the lock, before the first write): other
    /// readers of the directory will read it again.
    pub fn begin_write(&self) -> Result<()> {
        let held = {
            let locked = self.locked.lock().unwrap_or_else(|e| e.into_inner());
            if locked.held && locked.bumped {
                return Ok(());
            }
            locked.held
        };
        let mut cache = self.fresh_cache()?;
        let next = cache.generation.unwrap_or(0) + 1;
        let path = self.dir.join("generation");
        // Only other processes' caches depend on the generation, and a restarted process
        // starts with an empty cache: replaced atomically, it need not be durable.
        let tmp = write_tmp_unsynced(&self.dir, &format!("{next}\n"))?;
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err("replacing", &path)(e));
        }
        cache.generation = Some(next);
        // Bumped once per hold of the lock, and only once it is done.
        self.locked.lock().unwrap_or_else(|e| e.into_inner()).bumped = held;
        Ok(())
    }

    /// Every stored claim, by namespace then name.
    pub fn claims(&self) -> Result<Vec<PortClaim>> {
        Ok(self
            .claims_shared()?
            .iter()
            .map(|c| (**c).clone())
            .collect())
    }

    /// Every stored claim, by namespace then name, shared with the store (no copy; the
    /// store's next write copies them if this is still held).
    pub fn claims_shared(&self) -> Result<Arc<Vec<Arc<PortClaim>>>> {
        let mut cache = self.fresh_cache()?;
        Ok(Arc::clone(&self.loaded_claims(&mut cache)?.list))
    }

    fn loaded_claims<'c>(&self, cache: &'c mut Cache) -> Result<&'c mut Claims> {
        if cache.claims.is_none() {
            cache.claims = Some(self.read_claims()?);
        }
        Ok(cache.claims.as_mut().expect("just filled"))
    }

    fn read_claims(&self) -> Result<Claims> {
        let path = self.dir.join(CLAIMS_LOG);
        let mut replay = Replay::default();
        let journal = read_journal(&path)?;
        for (n, line) in journal.iter().enumerate() {
            let record = claim_line(line).map_err(|message| StoreError::Corrupt {
                path: path.clone(),
                message: format!("line {}: {message}", n + 1),
            })?;
            if let Err(problem) = replay.apply(record, n + 1) {
                self.report_once(format!("{} line {}: {problem}", path.display(), n + 1));
            }
        }
        Ok(Claims {
            list: Arc::new(replay.into_claims()),
            lines: journal.len(),
        })
    }

    /// Logs `message` unless this store logged it already (the journal is read again
    /// after every failed write and whenever another process wrote).
    fn report_once(&self, message: String) {
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        if !reported.contains(&message) {
            tracing::warn!("{message}");
            reported.insert(message);
        }
    }

    /// Claims of earlier versions: a YAML file each under `claims/NS/`.
    fn read_claim_files(&self) -> Result<Vec<PortClaim>> {
        let root = self.dir.join("claims");
        let mut out = Vec::new();
        let mut namespaces: Vec<PathBuf> = read_dir(&root)?
            .into_iter()
            .filter(|p| p.is_dir())
            .collect();
        namespaces.sort();
        for ns in namespaces {
            let mut files: Vec<PathBuf> = read_dir(&ns)?
                .into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
                .collect();
            files.sort();
            for f in files {
                let text = fs::read_to_string(&f).map_err(io_err("reading", &f))?;
                let claim: PortClaim =
                    serde_yaml::from_str(&text).map_err(|e| StoreError::Corrupt {
                        path: f.clone(),
                        message: e.to_string(),
                    })?;
                out.push(claim);
            }
        }
        Ok(out)
    }

    /// Creates a claim; fails with `AlreadyExists` if a claim of that name exists.
    pub fn create(&self, claim: &PortClaim) -> Result<()> {
        self.create_all(&[claim])
    }

    /// Creates claims with one append and one fsync. Stops with `AlreadyExists` at the
    /// first claim someone holds already; those before it are created (and durable).
    pub fn create_all(&self, claims: &[&PortClaim]) -> Result<()> {
        let claims: Vec<Arc<PortClaim>> = claims.iter().map(|&c| Arc::new(c.clone())).collect();
        self.commit(&[], &[], &claims)
    }

    /// Deletes, replaces and creates claims with one append and one fsync, in that order
    /// (a port handed over is free before its new claim). Creation stops with
    /// `AlreadyExists` at the first claim someone holds already; everything before it is
    /// written (and durable).
    pub fn commit(
        &self,
        deletes: &[(&str, &str)],
        updates: &[Arc<PortClaim>],
        claims: &[Arc<PortClaim>],
    ) -> Result<()> {
        if deletes.is_empty() && updates.is_empty() && claims.is_empty() {
            return Ok(());
        }
        let _lock = self.lock_for_write()?;
        let held = {
            let mut cache = self.fresh_cache()?;
            let stored = self.loaded_claims(&mut cache)?;
            claims
                .iter()
                .position(|c| stored.find(c.metadata.ns(), &c.metadata.name).is_ok())
        };
        let (new, conflict) = claims.split_at(held.unwrap_or(claims.len()));
        let changes = deletes
            .iter()
            .map(|&(ns, name)| Change::Delete(ns, name))
            .chain(
                updates
                    .iter()
                    .chain(new)
                    .map(|c| Change::Put(Arc::clone(c))),
            );
        self.write_claims(changes)?;
        match conflict.first() {
            None => Ok(()),
            Some(c) => Err(StoreError::AlreadyExists {
                namespace: c.metadata.ns().to_string(),
                name: c.metadata.name.clone(),
            }),
        }
    }

    /// Replaces a claim's content.
    pub fn update(&self, claim: &PortClaim) -> Result<()> {
        let _lock = self.lock_for_write()?;
        self.write_claims([Change::Put(Arc::new(claim.clone()))])
    }

    /// Deletes a claim (no error if it is already gone).
    pub fn delete(&self, namespace: &str, name: &str) -> Result<()> {
        let _lock = self.lock_for_write()?;
        self.write_claims([Change::Delete(namespace, name)])
    }

    /// Appends `changes` to the claims journal (under the lock), durably, and keeps
    /// the cache in step; rewrites the journal when it has grown to twice its claims.
    fn write_claims<'c>(&self, changes: impl IntoIterator<Item = Change<'c>>) -> Result<()> {
        let path = self.dir.join(CLAIMS_LOG);
        let mut text = String::new();
        let mut records = 0;
        let changes: Vec<Change> = changes.into_iter().collect();
        if changes.is_empty() {
            return Ok(());
        }
        for change in &changes {
            records += 1;
            match change {
                Change::Put(c) => claim_record(&mut text, c, &path)?,
                Change::Delete(ns, name) => {
                    text.push_str("-\t");
                    text.push_str(ns);
                    text.push('\t');
                    text.push_str(name);
                    text.push('\n');
                }
            }
        }
        self.begin_write()?;
        let mut cache = self.fresh_cache()?;
        let claims = self.loaded_claims(&mut cache)?;
        // The cache follows the disk: the changes are applied to a copy, which replaces
        // the cache only once the journal holds them durably. (It used to be applied
        // first: with the disk full mid-append, the next cycle saw nothing left to write,
        // the records were never written, and a restart lost the claims.)
        let mut next = Claims {
            list: Arc::clone(&claims.list),
            lines: claims.lines,
        };
        next.apply(&changes);
        let lines = next.lines.saturating_add(records);
        let written = if lines > 2 * next.list.len() + 64 {
            let mut whole = String::new();
            for c in next.list.iter() {
                claim_record(&mut whole, c, &path)?;
            }
            next.lines = next.list.len();
            self.rewrite_journal(CLAIMS_LOG, &whole)
        } else {
            next.lines = lines;
            self.append_journal(CLAIMS_LOG, &text)
        };
        match written {
            Ok(()) => *claims = next,
            // What is on disk now is read again before anything else is planned on it.
            Err(e) => {
                cache.claims = None;
                return Err(e);
            }
        }
        Ok(())
    }

    /// First-seen times of routes (`Kind/namespace/name` → RFC 3339).
    pub fn first_seen(&self) -> Result<BTreeMap<String, String>> {
        self.with_first_seen(|t| t.to_map())
    }

    /// Runs `f` on the first-seen times (read from the directory if it changed).
    pub fn with_first_seen<T>(&self, f: impl FnOnce(&mut FirstSeenTimes) -> T) -> Result<T> {
        let mut cache = self.fresh_cache()?;
        Ok(f(&mut self.loaded_first_seen(&mut cache)?.times))
    }

    fn loaded_first_seen<'c>(&self, cache: &'c mut Cache) -> Result<&'c mut FirstSeen> {
        if cache.first_seen.is_none() {
            cache.first_seen = Some(self.read_first_seen()?);
        }
        Ok(cache.first_seen.as_mut().expect("just filled"))
    }

    fn read_first_seen(&self) -> Result<FirstSeen> {
        let path = self.dir.join(FIRST_SEEN_LOG);
        if !path.exists() {
            return self.import_first_seen_yaml();
        }
        let mut times = FirstSeenTimes::default();
        let mut lines = 0;
        for line in read_journal(&path)? {
            lines += 1;
            match seen_line(&line) {
                Ok(SeenRecord::Seen(key, time)) => {
                    times.insert(key.to_string(), time.to_string());
                }
                Ok(SeenRecord::Gone(key)) => times.remove(key),
                Err(problem) => {
                    return Err(StoreError::Corrupt {
                        path,
                        message: format!("line {lines}: {problem}"),
                    })
                }
            }
        }
        Ok(FirstSeen { times, lines })
    }

    fn import_first_seen_yaml(&self) -> Result<FirstSeen> {
        let path = self.dir.join(FIRST_SEEN_YAML);
        let times: BTreeMap<String, String> = match fs::read_to_string(&path) {
            Ok(text) => serde_yaml::from_str(&text).map_err(|e| StoreError::Corrupt {
                path: path.clone(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(io_err("reading", &path)(e)),
        };
        let mut imported = FirstSeenTimes::default();
        for (key, time) in times {
            imported.insert(key, time);
        }
        Ok(FirstSeen {
            times: imported,
            // Not in the journal yet: the next record rewrites it whole.
            lines: usize::MAX,
        })
    }

    /// Records routes seen for the first time and forgets routes that are gone. Call
    /// under the lock, after `begin_write`.
    pub fn record_first_seen(&self, added: &[(String, String)], removed: &[String]) -> Result<()> {
        if added.is_empty() && removed.is_empty() {
            return Ok(());
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let seen = self.loaded_first_seen(&mut cache)?;
        // As for claims, memory follows the disk: if the journal does not take the
        // records, the times in memory are dropped and read again from the journal.
        let times = &mut seen.times;
        let mut journal = String::new();
        for (key, time) in added {
            times.insert(key.clone(), time.clone());
            journal.push_str(&format!("+\t{time}\t{key}\n"));
        }
        for key in removed {
            times.remove(key);
            journal.push_str(&format!("-\t{key}\n"));
        }
        let lines = seen.lines.saturating_add(added.len() + removed.len());
        let (written, lines) = if lines > 2 * times.len() + 64 {
            (self.rewrite_first_seen(times), times.len())
        } else {
            (self.append_journal(FIRST_SEEN_LOG, &journal), lines)
        };
        match written {
            Ok(()) => {
                seen.lines = lines;
                Ok(())
            }
            Err(e) => {
                cache.first_seen = None;
                Err(e)
            }
        }
    }

    /// Appends records to journal `name`, durably, first cutting off a torn last line.
    fn append_journal(&self, name: &str, journal: &str) -> Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.dir.join(name);
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err("opening", &path))?;
        // Cut off a torn last line before appending after it.
        let mut text = Vec::new();
        let len = f.metadata().map_err(io_err("reading", &path))?.len();
        if len > 0 {
            let mut last = [0u8];
            f.seek(SeekFrom::Start(len - 1))
                .and_then(|_| f.read_exact(&mut last))
                .map_err(io_err("reading", &path))?;
            if last[0] != b'\n' {
                f.seek(SeekFrom::Start(0))
                    .and_then(|_| f.read_to_end(&mut text))
                    .map_err(io_err("reading", &path))?;
                let keep = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                f.set_len(keep as u64)
                    .map_err(io_err("truncating", &path))?;
            }
        }
        let before = f
            .seek(SeekFrom::End(0))
            .map_err(io_err("appending to", &path))?;
        if let Err(e) = f.write_all(journal.as_bytes()).and_then(|()| f.sync_data()) {
            // Leave the journal as it was (a failed batch is not half held); if even
            // that fails, the reader ignores a torn last line and the next append cuts it.
            let _ = f.set_len(before).and_then(|()| f.sync_data());
            return Err(io_err("appending to", &path)(e));
        }
        if len == 0 {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Replaces journal `name` with `text`, atomically and durably.
    fn rewrite_journal(&self, name: &str, text: &str) -> Result<()> {
        let path = self.dir.join(name);
        let tmp = write_tmp(&self.dir, text)?;
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err("replacing", &path)(e));
        }
        sync_dir(&self.dir)
    }

    fn rewrite_first_seen(&self, times: &FirstSeenTimes) -> Result<()> {
        let mut text = String::new();
        for (key, time) in times.to_map() {
            text.push_str(&format!("+\t{time}\t{key}\n"));
        }
        self.rewrite_journal(FIRST_SEEN_LOG, &text)?;
        let old = self.dir.join(FIRST_SEEN_YAML);
        match fs::remove_file(&old) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("removing", &old)(e)),
        }
    }
}

/// One record of the claims journal.
enum ClaimRecord<'l> {
    /// A created or changed claim.
    Put(Box<PortClaim>),
    /// A deleted claim: namespace and name.
    Delete(&'l str, &'l str),
}

/// Parses one line of the claims journal.
fn claim_line(line: &str) -> std::result::Result<ClaimRecord<'_>, String> {
    match line.split_once('\t') {
        Some(("+", json)) => serde_json::from_str(json)
            .map(|c| ClaimRecord::Put(Box::new(c)))
            .map_err(|e| e.to_string()),
        Some(("-", key)) => key
            .split_once('\t')
            .map(|(ns, name)| ClaimRecord::Delete(ns, name))
            .ok_or_else(|| format!("not a deletion: {line:?}")),
        _ => Err(format!("not a claim record: {line:?}")),
    }
}

/// The claims of a journal, replayed record by record. A record that would make a
/// port held twice (a second claim, under another name, for a port of a Gateway a
/// claim holds already) is ignored: the earlier holder keeps the port. (A claim is
/// named after its Gateway, protocol and port, so only a damaged or hand-edited
/// journal has one.)
#[derive(Default)]
struct Replay {
    /// (namespace, name) → claim and the line that wrote it.
    by_name: BTreeMap<(String, String), (Arc<PortClaim>, usize)>,
    /// (namespace, Gateway, protocol, port) → the name of the claim holding it.
    by_port: BTreeMap<(String, String, String, u16), String>,
}

impl Replay {
    fn port_key(c: &PortClaim) -> (String, String, String, u16) {
        (
            c.metadata.ns().to_string(),
            c.spec.gateway.clone(),
            c.spec.protocol.to_ascii_uppercase(),
            c.spec.port,
        )
    }

    /// Applies the record of line `line`; the problem if it is ignored.
    fn apply(&mut self, record: ClaimRecord, line: usize) -> std::result::Result<(), String> {
        match record {
            ClaimRecord::Put(c) => {
                let name = (c.metadata.ns().to_string(), c.metadata.name.clone());
                let port = Self::port_key(&c);
                if let Some(holder) = self.by_port.get(&port).filter(|h| **h != name.1) {
                    let (held, at) = &self.by_name[&(name.0.clone(), holder.clone())];
                    let r = &c.spec.route;
                    return Err(format!(
                        "claim {}/{} ({} {}/{}) ignored: port {} {} of Gateway {}/{} is held \
                         by claim {}/{} ({} {}/{}, line {at})",
                        name.0,
                        name.1,
                        r.kind,
                        r.namespace,
                        r.name,
                        port.2,
                        port.3,
                        port.0,
                        port.1,
                        held.metadata.ns(),
                        held.metadata.name,
                        held.spec.route.kind,
                        held.spec.route.namespace,
                        held.spec.route.name,
                    ));
                }
                if let Some((old, _)) = self.by_name.insert(name.clone(), (Arc::from(c), line)) {
                    self.by_port.remove(&Self::port_key(&old));
                }
                self.by_port.insert(port, name.1);
            }
            ClaimRecord::Delete(ns, name) => {
                if let Some((old, _)) = self.by_name.remove(&(ns.to_string(), name.to_string())) {
                    self.by_port.remove(&Self::port_key(&old));
                }
            }
        }
        Ok(())
    }

    /// The claims held, by namespace then name.
    fn into_claims(self) -> Vec<Arc<PortClaim>> {
        self.by_name.into_values().map(|(c, _)| c).collect()
    }
}

/// One record of the first-seen journal.
enum SeenRecord<'l> {
    /// Route key first seen at a time.
    Seen(&'l str, &'l str),
    /// Route key gone.
    Gone(&'l str),
}

/// Parses one line of the first-seen journal.
fn seen_line(line: &str) -> std::result::Result<SeenRecord<'_>, String> {
    let mut fields = line.splitn(3, '\t');
    match (fields.next(), fields.next(), fields.next()) {
        (Some("+"), Some(time), Some(key)) if humantime::parse_rfc3339_weak(time).is_ok() => {
            Ok(SeenRecord::Seen(key, time))
        }
        (Some("-"), Some(key), None) => Ok(SeenRecord::Gone(key)),
        _ => Err(format!("not a first-seen record: {line:?}")),
    }
}

/// A record of a state directory that cannot be read, or that loading ignores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRecord {
    /// The file (`claims.log`, `first-seen.log`, `generation`).
    pub file: &'static str,
    /// Line number, from 1.
    pub line: usize,
    /// The line as it is.
    pub text: String,
    /// What is wrong with it.
    pub problem: String,
}

impl std::fmt::Display for BadRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} line {}: {}", self.file, self.line, self.problem)
    }
}

impl Store {
    /// The records of the state directory that cannot be read, or that loading ignores
    /// (a port held twice), with line numbers (`berth state check`); changes nothing.
    pub fn check(&self) -> Result<Vec<BadRecord>> {
        Ok(self
            .scan()?
            .into_iter()
            .flat_map(|(_, _, bad)| bad)
            .collect())
    }

    /// Moves every record that cannot be read into `FILE.bad-TIME` beside its journal
    /// and rewrites the journal with the rest, in order (`berth state repair`); a
    /// `generation` that cannot be read is reset. Every valid claim is kept. Refused
    /// while a daemon runs on the directory. Returns what was moved.
    pub fn repair(&self) -> Result<Vec<BadRecord>> {
        let _owner = self.own()?;
        let _lock = self.lock()?;
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace(':', "");
        let mut moved = Vec::new();
        for (file, good, bad) in self.scan()? {
            if bad.is_empty() {
                continue;
            }
            let aside: String = bad.iter().map(|b| format!("{}\n", b.text)).collect();
            let aside_path = self.dir.join(format!("{file}.bad-{stamp}"));
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&aside_path)
                .and_then(|mut f| f.write_all(aside.as_bytes()).and_then(|()| f.sync_all()))
                .map_err(io_err("writing", &aside_path))?;
            let text: String = good.iter().map(|l| format!("{l}\n")).collect();
            self.rewrite_journal(file, &text)?;
            moved.extend(bad);
        }
        self.begin_write()?;
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = Cache::default();
        Ok(moved)
    }

    /// Each file's good lines and bad records.
    fn scan(&self) -> Result<Vec<Scanned>> {
        let mut out = Vec::new();
        // A claim record is bad if it does not parse or is ignored when replayed.
        let mut replay = Replay::default();
        let mut claims = |l: &str, n: usize| claim_line(l).and_then(|r| replay.apply(r, n));
        let mut seen = |l: &str, _: usize| seen_line(l).map(|_| ());
        type Check<'f> = &'f mut dyn FnMut(&str, usize) -> std::result::Result<(), String>;
        for (file, check) in [
            (CLAIMS_LOG, &mut claims as Check),
            (FIRST_SEEN_LOG, &mut seen as Check),
        ] {
            let (mut good, mut bad) = (Vec::new(), Vec::new());
            for (n, line) in read_journal(&self.dir.join(file))?.into_iter().enumerate() {
                match check(&line, n + 1) {
                    Ok(()) => good.push(line),
                    Err(problem) => bad.push(BadRecord {
                        file,
                        line: n + 1,
                        text: line,
                        problem,
                    }),
                }
            }
            out.push((file, good, bad));
        }
        let generation = self.dir.join("generation");
        if let Ok(text) = fs::read_to_string(&generation) {
            if text.trim().parse::<u64>().is_err() {
                out.push((
                    "generation",
                    vec!["0".to_string()],
                    vec![BadRecord {
                        file: "generation",
                        line: 1,
                        text: text.trim_end().to_string(),
                        problem: "not a number".to_string(),
                    }],
                ));
            }
        }
        Ok(out)
    }
}

/// A file of a state directory as `Store::scan` read it: its name, the lines that read
/// and the records that do not.
type Scanned = (&'static str, Vec<String>, Vec<BadRecord>);

/// A change to the claims.
enum Change<'c> {
    /// Created or changed (shared with the writer and the readers of the list).
    Put(Arc<PortClaim>),
    /// Deleted: namespace and name.
    Delete(&'c str, &'c str),
}

/// Appends the journal record of a created or changed claim to `out`.
fn claim_record(out: &mut String, claim: &PortClaim, path: &Path) -> Result<()> {
    let json = serde_json::to_string(claim).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    out.push_str("+\t");
    out.push_str(&json);
    out.push('\n');
    Ok(())
}

/// The complete lines of a journal (a last line without its newline is a torn append,
/// not part of it); none if there is no journal.
fn read_journal(path: &Path) -> Result<Vec<String>> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("reading", path)(e)),
    };
    Ok(text
        .split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
        .map(str::to_string)
        .collect())
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(entries.filter_map(|e| e.ok().map(|e| e.path())).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_err("listing", dir)(e)),
    }
}

/// Writes `text` to a new temporary file in `dir` and fsyncs it.
fn write_tmp(dir: &Path, text: &str) -> Result<PathBuf> {
    let tmp = write_tmp_unsynced(dir, text)?;
    if let Err(e) = File::open(&tmp).and_then(|f| f.sync_all()) {
        let _ = fs::remove_file(&tmp);
        return Err(io_err("syncing", &tmp)(e));
    }
    Ok(tmp)
}

/// Writes `text` to a new temporary file in `dir` (not yet durable).
fn write_tmp_unsynced(dir: &Path, text: &str) -> Result<PathBuf> {
    let n = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".tmp-{}-{n}", std::process::id()));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io_err("creating", &tmp))?;
    // A temporary file left behind by a full disk would only fill it further.
    if let Err(e) = f.write_all(text.as_bytes()) {
        let _ = fs::remove_file(&tmp);
        return Err(io_err("writing", &tmp)(e));
    }
    Ok(tmp)
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("syncing", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClaimRoute, PortClaimSpec};

    /// A directory of one test, removed when the test ends (also when it fails).
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            TempDir(dir)
        }
    }

    impl AsRef<Path> for TempDir {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl std::ops::Deref for TempDir {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// Appends `partial` without its newline, as a writer killed mid-append leaves it.
    fn tear(log: &Path, partial: &[u8]) {
        fs::OpenOptions::new()
            .append(true)
            .open(log)
            .and_then(|mut f| f.write_all(partial))
            .expect("tear");
    }

    fn claim(port: u16) -> PortClaim {
        let route = ClaimRoute::new("TCPRoute", "a", "r", None);
        PortClaim::bound(
            "infra",
            PortClaimSpec::new("gw", "pool", "TCP", port, route),
        )
    }

    #[test]
    fn a_reader_sees_what_another_writer_wrote_after_its_generation_bump() {
        let dir = TempDir::new("berth-store-gen");
        let (a, b) = (Store::open(&dir).expect("a"), Store::open(&dir).expect("b"));
        assert!(
            a.claims().expect("claims").is_empty(),
            "a caches an empty store"
        );
        // A write bumps the generation itself (no `begin_write` by the caller).
        b.create(&claim(30001)).expect("create");
        assert_eq!(
            a.claims().expect("claims"),
            vec![claim(30001)],
            "a reads again"
        );
        assert_eq!(
            b.claims().expect("claims"),
            vec![claim(30001)],
            "b kept its memory in step"
        );
    }

    #[test]
    fn create_all_publishes_every_claim_and_stops_at_one_held_by_someone_else() {
        let dir = TempDir::new("berth-store-all");
        let store = Store::open(&dir).expect("open");
        let (a, b, c) = (claim(30001), claim(30002), claim(30003));
        store.create_all(&[&a, &b]).expect("create all");
        assert_eq!(store.claims().expect("claims"), vec![a.clone(), b.clone()]);
        // 30000 is new, 30002 exists: 30000 is published, then it stops.
        let z = claim(30000);
        assert!(matches!(
            store.create_all(&[&z, &b, &c]),
            Err(StoreError::AlreadyExists { .. })
        ));
        let on_disk = Store::open(&dir).expect("reopen").claims().expect("claims");
        assert_eq!(
            on_disk,
            vec![z, a, b],
            "the claim before the conflict is durable, the one after is not written"
        );
        let stray: Vec<_> = fs::read_dir(&*dir)
            .expect("dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
            .collect();
        assert!(stray.is_empty(), "no temporary files left");
    }

    #[test]
    fn temporaries_of_dead_writers_are_removed_on_open() {
        let dir = TempDir::new("berth-store-tmp");
        fs::create_dir_all(&*dir).expect("dir");
        // PID 0 is never a process; our own PID is alive.
        let dead = dir.join(".tmp-0-1");
        let alive = dir.join(format!(".tmp-{}-1", std::process::id()));
        fs::write(&dead, "x").expect("write");
        fs::write(&alive, "x").expect("write");
        Store::open(&dir).expect("open");
        assert!(!dead.exists(), "dead writer's file removed");
        assert!(alive.exists(), "live writer's file kept");
    }

    #[test]
    fn a_claim_is_created_once_read_back_updated_and_deleted() {
        let dir = TempDir::new("berth-store");
        let store = Store::open(&dir).expect("open");
        let c = claim(30000);
        store.create(&c).expect("create");
        assert!(matches!(
            store.create(&c),
            Err(StoreError::AlreadyExists { .. })
        ));
        assert_eq!(store.claims().expect("claims"), vec![c.clone()]);
        let mut released = c.clone();
        released.spec.listener = "other".into();
        store.update(&released).expect("update");
        assert_eq!(store.claims().expect("claims"), vec![released]);
        store.delete("infra", "gw-tcp-30000").expect("delete");
        assert!(store.claims().expect("claims").is_empty());
        let leftovers: Vec<_> = fs::read_dir(&*dir)
            .expect("dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
            .collect();
        assert!(
            leftovers.is_empty(),
            "no temporary files left: {leftovers:?}"
        );
    }

    #[test]
    fn a_commit_deletes_updates_and_creates_in_one_append() {
        let dir = TempDir::new("berth-store-commit");
        let store = Store::open(&dir).expect("open");
        store
            .create_all(&[&claim(30001), &claim(30002)])
            .expect("create");
        let shared = store.claims_shared().expect("claims");
        let mut moved = claim(30002);
        moved.spec.listener = "other".into();
        store
            .commit(
                &[("infra", "gw-tcp-30001")],
                &[Arc::new(moved.clone())],
                &[Arc::new(claim(30003))],
            )
            .expect("commit");
        assert_eq!(
            *shared,
            vec![Arc::new(claim(30001)), Arc::new(claim(30002))],
            "a reader's list stays"
        );
        assert_eq!(
            store.claims().expect("claims"),
            vec![moved.clone(), claim(30003)]
        );
        let log = fs::read_to_string(dir.join(CLAIMS_LOG)).expect("log");
        assert_eq!(log.lines().count(), 2 + 3, "{log}");
        assert_eq!(
            Store::open(&dir).expect("reopen").claims().expect("claims"),
            vec![moved, claim(30003)]
        );
    }

    #[test]
    fn the_claims_journal_survives_a_torn_append_and_compacts() {
        let dir = TempDir::new("berth-store-claims-log");
        let store = Store::open(&dir).expect("open");
        store
            .create_all(&[&claim(30001), &claim(30002)])
            .expect("create");
        let log = dir.join(CLAIMS_LOG);
        tear(&log, b"+\t{\"metadata\":{\"na");
        let reopened = Store::open(&dir).expect("reopen");
        assert_eq!(
            reopened.claims().expect("read"),
            vec![claim(30001), claim(30002)]
        );
        reopened.delete("infra", "gw-tcp-30001").expect("delete");
        let text = fs::read_to_string(&log).expect("log");
        assert!(text.ends_with("-\tinfra\tgw-tcp-30001\n"), "{text:?}");
        assert!(
            !text.contains("{\"metadata\":{\"na\n"),
            "torn line cut off: {text:?}"
        );
        for _ in 0..100 {
            reopened.create(&claim(30003)).expect("create");
            reopened.delete("infra", "gw-tcp-30003").expect("delete");
        }
        let lines = fs::read_to_string(&log).expect("log").lines().count();
        assert!(
            lines <= 2 + 64 + 2,
            "compacted (one claim held): {lines} lines"
        );
        let fresh = Store::open(&dir).expect("reopen");
        assert_eq!(fresh.claims().expect("read"), vec![claim(30002)]);
    }

    #[test]
    fn claim_files_of_earlier_versions_are_moved_into_the_journal() {
        let dir = TempDir::new("berth-store-files");
        fs::create_dir_all(dir.join("claims/infra")).expect("dir");
        let c = claim(30005);
        let yaml = serde_yaml::to_string(&c).expect("yaml");
        fs::write(dir.join("claims/infra/gw-tcp-30005.yaml"), &yaml).expect("write");
        let store = Store::open(&dir).expect("open");
        assert_eq!(store.claims().expect("read"), vec![c.clone()]);
        assert!(!dir.join("claims").exists(), "claim files removed");
        // An import that stopped before removing the files does not import them again
        // (the journal holds them, and what came after).
        fs::create_dir_all(dir.join("claims/infra")).expect("dir");
        fs::write(dir.join("claims/infra/gw-tcp-30005.yaml"), &yaml).expect("write");
        store.delete("infra", "gw-tcp-30005").expect("delete");
        let again = Store::open(&dir).expect("reopen");
        assert!(again.claims().expect("read").is_empty());
        assert!(!dir.join("claims").exists(), "leftover files removed");
    }

    #[test]
    fn first_seen_journal_survives_a_torn_append_and_compacts() {
        let dir = TempDir::new("berth-store-seen");
        let store = Store::open(&dir).expect("open");
        let t = |s: &str| s.to_string();
        store
            .record_first_seen(&[(t("TCPRoute/a/r"), t("2026-01-01T00:00:00Z"))], &[])
            .expect("record");
        store
            .record_first_seen(&[(t("UDPRoute/b/s"), t("2026-01-02T00:00:00Z"))], &[])
            .expect("record");
        // A writer killed mid-append leaves a torn line: it is ignored, then cut off.
        let log = dir.join(FIRST_SEEN_LOG);
        tear(&log, b"+\t2026-01-03T00:0");
        let reopened = Store::open(&dir).expect("reopen");
        let want: BTreeMap<String, String> = [
            (t("TCPRoute/a/r"), t("2026-01-01T00:00:00Z")),
            (t("UDPRoute/b/s"), t("2026-01-02T00:00:00Z")),
        ]
        .into();
        assert_eq!(reopened.first_seen().expect("read"), want);
        reopened
            .record_first_seen(&[], &[t("TCPRoute/a/r")])
            .expect("forget");
        let text = fs::read_to_string(&log).expect("log");
        assert!(text.ends_with("-\tTCPRoute/a/r\n"), "{text:?}");
        assert!(!text.contains("2026-01-03"), "torn line cut off: {text:?}");
        // Many records of few routes: the journal is rewritten to what it holds.
        for i in 0..100 {
            let key = t("TCPRoute/c/x");
            reopened
                .record_first_seen(
                    &[(key.clone(), format!("2026-02-{:02}T00:00:00Z", i % 28 + 1))],
                    &[],
                )
                .expect("add");
            reopened.record_first_seen(&[], &[key]).expect("remove");
        }
        let lines = fs::read_to_string(&log).expect("log").lines().count();
        assert!(
            lines <= 2 + 64 + 2,
            "compacted (one route held): {lines} lines"
        );
        let fresh = Store::open(&dir).expect("reopen");
        let want: BTreeMap<String, String> =
            [(t("UDPRoute/b/s"), t("2026-01-02T00:00:00Z"))].into();
        assert_eq!(fresh.first_seen().expect("read"), want);
    }

    /// A claim record as the journal holds it.
    fn put(c: &PortClaim) -> String {
        let mut line = String::new();
        claim_record(&mut line, c, Path::new(CLAIMS_LOG)).expect("record");
        line
    }

    #[test]
    fn a_port_held_twice_is_reported_with_its_line_and_the_later_record_ignored() {
        let dir = TempDir::new("berth-store-twice");
        fs::create_dir_all(&*dir).expect("dir");
        // Line 3 names port 30001 under another name, for another route; line 5 takes
        // 30002 after line 4 let it go.
        let mut other = claim(30001);
        other.metadata.name = "hand-made".into();
        other.spec.route = ClaimRoute::new("TCPRoute", "b", "s", None);
        let mut later = other.clone();
        later.metadata.name = "hand-made-2".into();
        later.spec.port = 30002;
        let journal = [
            put(&claim(30001)),
            put(&claim(30002)),
            put(&other),
            "-\tinfra\tgw-tcp-30002\n".to_string(),
            put(&later),
        ]
        .concat();
        fs::write(dir.join(CLAIMS_LOG), journal).expect("write");
        let store = Store::open(&dir).expect("open");
        assert_eq!(
            store.claims().expect("claims"),
            vec![claim(30001), later.clone()],
            "the earlier holder keeps 30001; the record of line 3 is ignored"
        );
        let bad = store.check().expect("check");
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!((bad[0].file, bad[0].line), (CLAIMS_LOG, 3));
        for part in [
            "infra/hand-made",
            "TCPRoute b/s",
            "TCP 30001",
            "infra/gw-tcp-30001",
            "line 1",
        ] {
            assert!(
                bad[0].problem.contains(part),
                "{part} in {}",
                bad[0].problem
            );
        }
        assert_eq!(store.reported.lock().expect("reported").len(), 1, "logged");
        // Read again (another writer bumped the generation): not logged twice.
        Store::open(&dir).expect("b").begin_write().expect("bump");
        store.claims().expect("claims");
        assert_eq!(store.reported.lock().expect("reported").len(), 1);

        // Repair moves it aside and keeps the rest.
        assert_eq!(store.repair().expect("repair"), bad);
        assert!(store.check().expect("check").is_empty());
        assert_eq!(
            Store::open(&dir).expect("reopen").claims().expect("claims"),
            vec![claim(30001), later]
        );
    }

    #[test]
    fn first_seen_of_earlier_versions_is_imported() {
        let dir = TempDir::new("berth-store-yaml");
        fs::create_dir_all(&dir).expect("dir");
        fs::write(
            dir.join(FIRST_SEEN_YAML),
            "TCPRoute/a/r: 2026-01-01T00:00:00Z\n",
        )
        .expect("write");
        let store = Store::open(&dir).expect("open");
        assert_eq!(store.first_seen().expect("read").len(), 1);
        store
            .record_first_seen(
                &[("UDPRoute/b/s".into(), "2026-01-02T00:00:00Z".into())],
                &[],
            )
            .expect("record");
        assert!(
            !dir.join(FIRST_SEEN_YAML).exists(),
            "turned into the journal"
        );
        assert_eq!(
            Store::open(&dir)
                .expect("reopen")
                .first_seen()
                .expect("read")
                .len(),
            2
        );
    }
}
