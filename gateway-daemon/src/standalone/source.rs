//! The manifest directory as a source of objects: which files changed since the last
//! look, each file's last good objects, and which file defines what (a file that
//! defines an object another file defines waits until that definition goes).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use super::CycleError;
use crate::{
    manifests::{self, FileObjects},
    model::Snapshot,
};

/// The files of a manifest directory, each with its last good objects.
///
/// Bookkeeping per look at the directory is one listing and one `stat` per file, with
/// map lookups: O(n log n) for n files; a changed file costs its own parse.
pub struct ManifestSource {
    /// The manifest directory.
    pub(super) dir: PathBuf,
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
