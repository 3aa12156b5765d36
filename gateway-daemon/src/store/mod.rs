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

//!
//! The parts: `journal` (the file format all journals share: append, torn lines,
//! rewrite), `claims` and `first_seen` (the two journals and their caches), `lock`
//! (the writers' lock and a daemon's ownership), `migrate` (layouts of earlier
//! versions) and `records` (`berth state check` and `repair`).

use std::{
    fs, io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

mod bounded;
mod claims;
mod first_seen;
mod journal;
mod lock;
mod migrate;
mod records;

pub use bounded::{read_small, MAX_SMALL};
pub use claims::Compaction;
pub use first_seen::{FirstSeenTimes, Found};
pub use lock::{Owner, StoreLock};
pub use records::BadRecord;

use claims::Claims;
use first_seen::FirstSeen;
use lock::Locked;

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
    /// A file of the state directory is not a regular file (a device, a FIFO, ...).
    #[error(
        "{} is {kind}, not a regular file: refusing to read it (a state file is only ever \
         a regular file; remove it, or move it aside)",
        .path.display()
    )]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// A file of the state directory is larger than such a file may be.
    #[error(
        "{} is {size} bytes, more than the {limit} bytes such a state file may hold: \
         refusing to read it",
        .path.display()
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit for its kind.
        limit: u64,
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
    cache: Arc<Mutex<Cache>>,
    /// Whether this store holds the directory's lock, and has bumped the generation
    /// under it.
    locked: Arc<Mutex<Locked>>,
    /// Ignored records already logged.
    reported: Arc<Mutex<std::collections::BTreeSet<String>>>,
}

#[derive(Debug, Default)]
struct Cache {
    generation: Option<u64>,
    claims: Option<Claims>,
    first_seen: Option<FirstSeen>,
}

const FIRST_SEEN_LOG: &str = "first-seen.log";
const CLAIMS_LOG: &str = "claims.log";
/// Written by earlier versions; read once and turned into the journal.
const FIRST_SEEN_YAML: &str = "first-seen.yaml";

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

    /// Removes temporary files left by writers killed mid-write (their process is gone),
    /// also in the claim directories of earlier versions.
    fn remove_stale_temporaries(&self) -> Result<()> {
        let mut dirs = vec![self.dir.clone()];
        dirs.extend(
            journal::read_dir(&self.dir.join("claims"))?
                .into_iter()
                .filter(|p| p.is_dir()),
        );
        journal::remove_stale_temporaries(&dirs)
    }

    fn generation(&self) -> Result<u64> {
        let path = self.dir.join("generation");
        match read_small(&path, MAX_SMALL)? {
            Some(t) => t.trim().parse().map_err(|e| StoreError::Corrupt {
                path,
                message: format!("{e}"),
            }),
            None => Ok(0),
        }
    }

    /// The cache, emptied if the directory changed since it was filled.
    fn fresh_cache(&self) -> Result<MutexGuard<'_, Cache>> {
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
        let tmp = journal::write_tmp_unsynced(&self.dir, &format!("{next}\n"))?;
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err("replacing", &path)(e));
        }
        cache.generation = Some(next);
        // Bumped once per hold of the lock, and only once it is done.
        self.locked.lock().unwrap_or_else(|e| e.into_inner()).bumped = held;
        Ok(())
    }

    /// Logs a torn last record of `bytes` bytes at the end of journal `path` (ignored
    /// when read, cut off by the next write), once.
    fn report_torn(&self, path: &Path, bytes: u64) {
        if bytes > 0 {
            self.report_once(format!(
                "{}: a torn last record of {bytes} bytes is ignored (a write cut short by a \
                 crash or kill; the next write cuts it off)",
                path.display()
            ));
        }
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
}

/// Replaces file `name` of directory `dir` (created if absent) with `text`,
/// atomically and durably: a temporary file fsynced, renamed over, the directory
/// fsynced. For small files beside the journals (the operator's drain).
pub fn replace_file(dir: &Path, name: &str, text: &str) -> Result<()> {
    fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    journal::rewrite_file(dir, name, text)
}

/// Removes file `name` of `dir` durably (the directory fsynced); whether it was there.
pub fn remove_file(dir: &Path, name: &str) -> Result<bool> {
    let path = dir.join(name);
    match fs::remove_file(&path) {
        Ok(()) => journal::sync_dir(dir).map(|()| true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err("removing", &path)(e)),
    }
}

#[cfg(test)]
mod tests;
