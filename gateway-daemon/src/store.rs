//! The standalone claim store: one YAML file per PortClaim under `STATE/claims/NS/`,
//! and the first-seen times of routes in the journal `STATE/first-seen.log`.
//!
//! Every write is atomic and durable: the content goes to a temporary file that is
//! fsynced, then moved into place with `renameat2(RENAME_NOREPLACE)` (creation: fails
//! if the claim exists, so two allocators can never both create one) or `rename`
//! (update), and the directory is fsynced. A `kill -9` at any instant leaves either the
//! old or the new file, never a partial one. The first-seen journal is appended to and
//! fsynced (a torn last line, which only a crash mid-append leaves, is ignored and cut
//! off), and rewritten whole, atomically, when it has grown to twice what it holds.
//! Writers also hold an exclusive `flock` on `STATE/lock` for a whole read-plan-write
//! cycle, released by the kernel if the process dies.

use std::{
    collections::BTreeMap,
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use crate::model::PortClaim;

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
    #[error("{path}: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
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
}

#[derive(Debug, Default)]
struct Cache {
    generation: Option<u64>,
    claims: Option<BTreeMap<(String, String), PortClaim>>,
    first_seen: Option<FirstSeen>,
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
/// Written by earlier versions; read once and turned into the journal.
const FIRST_SEEN_YAML: &str = "first-seen.yaml";

/// The exclusive lock of a state directory; released on drop (or process death).
pub struct StoreLock {
    _file: File,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl Store {
    /// Opens (creating if needed) a state directory.
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir.join("claims")).map_err(io_err("creating", dir))?;
        let store = Store {
            dir: dir.to_path_buf(),
            cache: Default::default(),
        };
        store.remove_stale_temporaries()?;
        Ok(store)
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
        Ok(StoreLock { _file: file })
    }

    fn claim_path(&self, namespace: &str, name: &str) -> PathBuf {
        self.dir
            .join("claims")
            .join(namespace)
            .join(format!("{name}.yaml"))
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

    fn with_claims<T>(
        &self,
        cache: &mut Cache,
        f: impl FnOnce(&mut BTreeMap<(String, String), PortClaim>) -> T,
    ) -> Option<T> {
        cache.claims.as_mut().map(f)
    }

    /// Announces a batch of writes (call under the lock, before the first write): other
    /// readers of the directory will read it again.
    pub fn begin_write(&self) -> Result<()> {
        let mut cache = self.fresh_cache()?;
        let next = cache.generation.unwrap_or(0) + 1;
        let path = self.dir.join("generation");
        // Only other processes' caches depend on the generation, and a restarted process
        // starts with an empty cache: replaced atomically, it need not be durable.
        let tmp = write_tmp_unsynced(&self.dir, &format!("{next}\n"))?;
        fs::rename(&tmp, &path).map_err(io_err("replacing", &path))?;
        cache.generation = Some(next);
        Ok(())
    }

    /// Every stored claim, by namespace then name.
    pub fn claims(&self) -> Result<Vec<PortClaim>> {
        let mut cache = self.fresh_cache()?;
        if cache.claims.is_none() {
            let read = self.read_claims()?;
            cache.claims = Some(
                read.into_iter()
                    .map(|c| ((c.metadata.ns().to_string(), c.metadata.name.clone()), c))
                    .collect(),
            );
        }
        Ok(cache
            .claims
            .as_ref()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default())
    }

    fn read_claims(&self) -> Result<Vec<PortClaim>> {
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
        let ns = claim.metadata.ns();
        let path = self.claim_path(ns, &claim.metadata.name);
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
        let tmp = write_tmp(&dir, &yaml(claim, &path)?)?;
        let linked = publish_exclusive(&tmp, &path);
        if linked.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        match linked {
            Ok(()) => {
                sync_dir(&dir)?;
                let key = (ns.to_string(), claim.metadata.name.clone());
                self.with_claims(&mut cache, |m| m.insert(key, claim.clone()));
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Someone else wrote it: what we remember is out of date.
                *cache = Cache::default();
                Err(StoreError::AlreadyExists {
                    namespace: ns.to_string(),
                    name: claim.metadata.name.clone(),
                })
            }
            Err(e) => Err(io_err("publishing", &path)(e)),
        }
    }

    /// Creates several claims with one filesystem sync instead of one per claim: every
    /// file is written, the filesystem synced once, then each is moved into place
    /// (exclusively, as in `create`) and each directory synced once. Stops with
    /// `AlreadyExists` at the first claim someone else holds; those published before it
    /// stay (and are durable).
    pub fn create_all(&self, claims: &[&PortClaim]) -> Result<()> {
        if claims.len() <= 1 {
            return claims.iter().try_for_each(|c| self.create(c));
        }
        let mut staged: Vec<(PathBuf, PathBuf, &PortClaim)> = Vec::new();
        let result = self.publish_staged(claims, &mut staged);
        // Temporaries not published (a published one was moved into place).
        for (tmp, _, _) in staged
            .iter()
            .filter(|(tmp, _, _)| !tmp.as_os_str().is_empty())
        {
            let _ = fs::remove_file(tmp);
        }
        result
    }

    fn publish_staged<'c>(
        &self,
        claims: &[&'c PortClaim],
        staged: &mut Vec<(PathBuf, PathBuf, &'c PortClaim)>,
    ) -> Result<()> {
        for c in claims {
            let path = self.claim_path(c.metadata.ns(), &c.metadata.name);
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
            let tmp = write_tmp_unsynced(&dir, &yaml(c, &path)?)?;
            staged.push((tmp, path, c));
        }
        let root = File::open(&self.dir).map_err(io_err("opening", &self.dir))?;
        // SAFETY: syncfs on a descriptor we own.
        if unsafe { libc::syncfs(root.as_raw_fd()) } != 0 {
            return Err(io_err("syncing", &self.dir)(io::Error::last_os_error()));
        }
        let mut dirs = std::collections::BTreeSet::new();
        let mut outcome = Ok(());
        for (tmp, path, c) in staged.iter_mut() {
            match publish_exclusive(tmp, path) {
                Ok(()) => {
                    *tmp = PathBuf::new();
                    dirs.insert(path.parent().map(Path::to_path_buf).unwrap_or_default());
                    let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                    let key = (c.metadata.ns().to_string(), c.metadata.name.clone());
                    self.with_claims(&mut cache, |m| m.insert(key, (*c).clone()));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = Cache::default();
                    outcome = Err(StoreError::AlreadyExists {
                        namespace: c.metadata.ns().to_string(),
                        name: c.metadata.name.clone(),
                    });
                    break;
                }
                Err(e) => {
                    outcome = Err(io_err("publishing", path)(e));
                    break;
                }
            }
        }
        // What was published must be durable, also when stopping early.
        for d in dirs {
            sync_dir(&d)?;
        }
        outcome
    }

    /// Replaces a claim's content.
    pub fn update(&self, claim: &PortClaim) -> Result<()> {
        let path = self.claim_path(claim.metadata.ns(), &claim.metadata.name);
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let tmp = write_tmp(&dir, &yaml(claim, &path)?)?;
        fs::rename(&tmp, &path).map_err(io_err("replacing", &path))?;
        sync_dir(&dir)?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let key = (claim.metadata.ns().to_string(), claim.metadata.name.clone());
        self.with_claims(&mut cache, |m| m.insert(key, claim.clone()));
        Ok(())
    }

    /// Deletes a claim (absent is fine).
    pub fn delete(&self, namespace: &str, name: &str) -> Result<()> {
        let path = self.claim_path(namespace, name);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(path.parent().unwrap_or(&self.dir))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("deleting", &path)(e)),
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        self.with_claims(&mut cache, |m| {
            m.remove(&(namespace.to_string(), name.to_string()))
        });
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
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return self.import_first_seen_yaml();
            }
            Err(e) => return Err(io_err("reading", &path)(e)),
        };
        let mut times = FirstSeenTimes::default();
        let mut lines = 0;
        // A last line without its newline is a torn append: not part of the journal.
        for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
            lines += 1;
            let mut fields = line.trim_end_matches('\n').splitn(3, '\t');
            match (fields.next(), fields.next(), fields.next()) {
                (Some("+"), Some(time), Some(key)) => {
                    times.insert(key.to_string(), time.to_string());
                }
                (Some("-"), Some(key), None) => {
                    times.remove(key);
                }
                _ => {
                    return Err(StoreError::Corrupt {
                        path,
                        message: format!("line {lines}: not a first-seen record: {line:?}"),
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
        if lines > 2 * times.len() + 64 {
            self.rewrite_first_seen(times)?;
            seen.lines = times.len();
        } else {
            self.append_first_seen(&journal)?;
            seen.lines = lines;
        }
        Ok(())
    }

    fn append_first_seen(&self, journal: &str) -> Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.dir.join(FIRST_SEEN_LOG);
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
        f.seek(SeekFrom::End(0))
            .and_then(|_| f.write_all(journal.as_bytes()))
            .and_then(|()| f.sync_data())
            .map_err(io_err("appending to", &path))?;
        if len == 0 {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    fn rewrite_first_seen(&self, times: &FirstSeenTimes) -> Result<()> {
        let path = self.dir.join(FIRST_SEEN_LOG);
        let mut text = String::new();
        for (key, time) in times.to_map() {
            text.push_str(&format!("+\t{time}\t{key}\n"));
        }
        let tmp = write_tmp(&self.dir, &text)?;
        fs::rename(&tmp, &path).map_err(io_err("replacing", &path))?;
        sync_dir(&self.dir)?;
        let old = self.dir.join(FIRST_SEEN_YAML);
        match fs::remove_file(&old) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("removing", &old)(e)),
        }
    }
}

fn yaml(claim: &PortClaim, path: &Path) -> Result<String> {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Doc<'a> {
        api_version: &'static str,
        kind: &'static str,
        #[serde(flatten)]
        claim: &'a PortClaim,
    }
    serde_yaml::to_string(&Doc {
        api_version: "berth.dev/v1alpha1",
        kind: "PortClaim",
        claim,
    })
    .map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
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
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io_err("syncing", &tmp))?;
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
    f.write_all(text.as_bytes())
        .map_err(io_err("writing", &tmp))?;
    Ok(tmp)
}

/// Moves `tmp` to `path` unless `path` exists (then `AlreadyExists`, `tmp` stays):
/// `renameat2(RENAME_NOREPLACE)`, or `link` and `unlink` where the filesystem lacks it.
fn publish_exclusive(tmp: &Path, path: &Path) -> io::Result<()> {
    use std::{ffi::CString, os::unix::ffi::OsStrExt};
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
    let (from, to) = (c(tmp)?, c(path)?);
    // SAFETY: two valid NUL-terminated paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
        return Err(e);
    }
    fs::hard_link(tmp, path)?;
    let _ = fs::remove_file(tmp);
    Ok(())
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
        b.begin_write().expect("begin");
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
        let stray: Vec<_> = fs::read_dir(dir.join("claims/infra"))
            .expect("dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
            .collect();
        assert!(stray.is_empty(), "no temporary files left");
    }

    #[test]
    fn temporaries_of_dead_writers_are_removed_on_open() {
        let dir = TempDir::new("berth-store-tmp");
        fs::create_dir_all(dir.join("claims/infra")).expect("dir");
        // PID 0 is never a process; our own PID is alive.
        let dead = dir.join("claims/infra/.tmp-0-1");
        let alive = dir.join(format!("claims/infra/.tmp-{}-1", std::process::id()));
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
        let leftovers: Vec<_> = fs::read_dir(dir.join("claims/infra"))
            .expect("dir")
            .collect();
        assert!(
            leftovers.is_empty(),
            "no temporary files left: {leftovers:?}"
        );
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
        fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .and_then(|mut f| f.write_all(b"+\t2026-01-03T00:0"))
            .expect("tear");
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
