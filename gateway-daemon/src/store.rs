//! The standalone claim store: one YAML file per PortClaim under `STATE/claims/NS/`,
//! and the first-seen times of routes in `STATE/first-seen.yaml`.
//!
//! Every write is atomic and durable: the content goes to a temporary file that is
//! fsynced, then published with `link` (creation: fails if the claim exists, so two
//! allocators can never both create one) or `rename` (update), and the directory is
//! fsynced. A `kill -9` at any instant leaves either the old or the new file, never a
//! partial one. Writers also hold an exclusive `flock` on `STATE/lock` for a whole
//! read-plan-write cycle, released by the kernel if the process dies.

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
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

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

    /// Every stored claim, by namespace then name.
    pub fn claims(&self) -> Result<Vec<PortClaim>> {
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
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => sync_dir(&dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(StoreError::AlreadyExists {
                namespace: ns.to_string(),
                name: claim.metadata.name.clone(),
            }),
            Err(e) => Err(io_err("publishing", &path)(e)),
        }
    }

    /// Replaces a claim's content.
    pub fn update(&self, claim: &PortClaim) -> Result<()> {
        let path = self.claim_path(claim.metadata.ns(), &claim.metadata.name);
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let tmp = write_tmp(&dir, &yaml(claim, &path)?)?;
        fs::rename(&tmp, &path).map_err(io_err("replacing", &path))?;
        sync_dir(&dir)
    }

    /// Deletes a claim (absent is fine).
    pub fn delete(&self, namespace: &str, name: &str) -> Result<()> {
        let path = self.claim_path(namespace, name);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(path.parent().unwrap_or(&self.dir)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("deleting", &path)(e)),
        }
    }

    /// First-seen times of routes (`Kind/namespace/name` → RFC 3339).
    pub fn first_seen(&self) -> Result<BTreeMap<String, String>> {
        let path = self.dir.join("first-seen.yaml");
        match fs::read_to_string(&path) {
            Ok(text) => serde_yaml::from_str(&text).map_err(|e| StoreError::Corrupt {
                path,
                message: e.to_string(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(e) => Err(io_err("reading", &path)(e)),
        }
    }

    /// Replaces the first-seen times.
    pub fn set_first_seen(&self, times: &BTreeMap<String, String>) -> Result<()> {
        let path = self.dir.join("first-seen.yaml");
        let text = serde_yaml::to_string(times).map_err(|e| StoreError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let tmp = write_tmp(&self.dir, &text)?;
        fs::rename(&tmp, &path).map_err(io_err("replacing", &path))?;
        sync_dir(&self.dir)
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
    let n = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".tmp-{}-{n}", std::process::id()));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io_err("creating", &tmp))?;
    f.write_all(text.as_bytes())
        .map_err(io_err("writing", &tmp))?;
    f.sync_all().map_err(io_err("syncing", &tmp))?;
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

    fn claim(port: u16) -> PortClaim {
        PortClaim::bound(
            "infra",
            PortClaimSpec {
                gateway: "gw".into(),
                listener: "pool".into(),
                protocol: "TCP".into(),
                port,
                route: ClaimRoute {
                    group: "gateway.networking.k8s.io".into(),
                    kind: "TCPRoute".into(),
                    namespace: "a".into(),
                    name: "r".into(),
                    uid: None,
                },
            },
        )
    }

    #[test]
    fn temporaries_of_dead_writers_are_removed_on_open() {
        let dir = std::env::temp_dir().join(format!("berth-store-tmp-{}", std::process::id()));
        fs::create_dir_all(dir.join("claims/infra")).expect("dir");
        // PID 0 is never a process; our own PID is alive.
        let dead = dir.join("claims/infra/.tmp-0-1");
        let alive = dir.join(format!("claims/infra/.tmp-{}-1", std::process::id()));
        fs::write(&dead, "x").expect("write");
        fs::write(&alive, "x").expect("write");
        Store::open(&dir).expect("open");
        assert!(!dead.exists(), "dead writer's file removed");
        assert!(alive.exists(), "live writer's file kept");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_claim_is_created_once_read_back_updated_and_deleted() {
        let dir = std::env::temp_dir().join(format!("berth-store-{}", std::process::id()));
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
        let _ = fs::remove_dir_all(&dir);
    }
}
