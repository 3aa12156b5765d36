//! The manifest directory as a source of objects: which files changed since the last
//! look, each file's last good objects, and which file defines what (a file that
//! defines an object another file defines waits until that definition goes).
//!
//! An object leaves only after the settle time: a file gone, or a new version of a file
//! that no longer defines some of its objects (an empty file included), keeps them in
//! force until the settle time passed without them coming back. (A file rewritten in
//! place, truncated then written as `>` does, once released its routes' claims in the
//! empty instant between, and with no cool-down another team's waiting route took the
//! port for good.)

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    ops::Bound,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use super::CycleError;
use crate::{
    manifests::{self, object_key, FileObjects, ObjectKey},
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
    /// The file of each object in force that its file's current version no longer
    /// defines.
    lingering: HashMap<ObjectKey, PathBuf>,
    /// Whether some file was gone at the last look (its objects still in force).
    some_gone: bool,
    /// What a look taken ahead (`read_ahead`) found, for the next `refresh` to report.
    ahead: Option<(bool, Vec<String>)>,
    /// The objects in force, in file order: patched where a file's objects change.
    snapshot: Snapshot,
}

/// A file's modification time and length.
type Stamp = (SystemTime, u64);

/// The stamp of the file at `path` (following links), if there is one.
fn stamp_of(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some((
        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        meta.len(),
    ))
}

/// Where a refresh looks.
#[derive(Debug, PartialEq, Eq)]
pub enum Look {
    /// At every file: the directory listed, each file's stamp read.
    All,
    /// At these files of the directory only (by name): the rest did not change.
    Names(BTreeSet<std::ffi::OsString>),
}

struct Tracked {
    /// Modification time and length of the version read.
    stamp: Stamp,
    /// The objects in force: the current version's, or the last good one's.
    objects: FileObjects,
    /// How many of each kind `objects` holds: its part of the snapshot.
    counts: manifests::Counts,
    /// The current version failed: its errors.
    broken: Vec<String>,
    /// The current version's unknown fields.
    warnings: Vec<String>,
    /// The current version, refused only for objects defined elsewhere.
    refused: Option<FileObjects>,
    /// When the file was first seen gone (its objects stay in force meanwhile).
    gone_since: Option<Instant>,
    /// Objects in force (after the current version's own) that the current version no
    /// longer defines, and since when.
    lingering: Vec<(ObjectKey, Instant)>,
}

impl Tracked {
    /// The file `path` is there (again).
    fn back(&mut self, path: &Path) {
        if self.gone_since.take().is_some() {
            tracing::debug!(file = %path.display(), "manifest file is back");
        }
    }
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
            lingering: HashMap::new(),
            some_gone: false,
            ahead: None,
            snapshot: Snapshot::default(),
        }
    }

    /// Reads the directory ahead of the first cycle (while the daemon does something
    /// else: the kernel verifying the datapath program); the next `refresh` reports
    /// what it found. A directory that cannot be listed is left to that `refresh`.
    pub fn read_ahead(&mut self) {
        if let Ok(found) = self.refresh() {
            self.ahead = Some(found);
        }
    }

    /// Re-reads files that changed; returns whether any file did (or was removed), and
    /// the errors of files newly found broken (their last good objects stay in force).
    /// If the directory cannot be listed (it is gone), nothing changes. What a read
    /// ahead found is reported too.
    pub fn refresh(&mut self) -> Result<(bool, Vec<String>), CycleError> {
        self.refresh_looking(Look::All)
    }

    /// `refresh`, looking only where `look` says: a change of one file costs a `stat`
    /// of that file, not of every file (at 1,000 files, a listing and 1,000 `stat`s were
    /// a fifth of a change's cost).
    pub fn refresh_looking(&mut self, look: Look) -> Result<(bool, Vec<String>), CycleError> {
        let now = Instant::now();
        let mut to_read = Vec::new();
        let mut newly_gone = Vec::new();
        match look {
            Look::All => self.look_at_all(now, &mut to_read, &mut newly_gone)?,
            Look::Names(names) => self.look_at(names, now, &mut to_read, &mut newly_gone),
        }
        let mut changed = false;
        let mut errors = Vec::new();
        // Files gone stay in force until they have stayed gone for the settle time.
        let mut removed = Vec::new();
        self.some_gone = false;
        for (path, t) in &self.files {
            if let Some(since) = t.gone_since {
                self.some_gone = true;
                if now.duration_since(since) >= self.settle {
                    removed.push(path.clone());
                }
            }
        }
        let paths: Vec<PathBuf> = to_read.iter().map(|(p, _)| p.clone()).collect();
        for ((path, stamp), parsed) in to_read.into_iter().zip(manifests::read_files(&paths)) {
            self.read(&path, stamp, parsed, now, &mut errors);
            changed = true;
        }
        if !self.lingering.is_empty() {
            changed |= self.expire_lingering(now);
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
            if let Some(t) = self.files.get(&path) {
                // Releasing definitions cannot fail.
                let _ = self
                    .definitions
                    .replace(&path, &t.objects, &FileObjects::default());
            }
            self.put(&path, FileObjects::default());
            if let Some(t) = self.files.remove(&path) {
                self.waiting.remove(&path);
                for (key, _) in &t.lingering {
                    self.lingering.remove(key);
                }
            }
        }
        // A file changed or removed may have let go of definitions others wait for.
        if changed && !self.waiting.is_empty() {
            self.admit_waiting(now);
        }
        if let Some((ahead_changed, ahead_errors)) = self.ahead.take() {
            changed |= ahead_changed;
            errors.splice(0..0, ahead_errors);
        }
        Ok((changed, errors))
    }

    /// Lists the directory: the files new or changed go to `to_read`, those no longer
    /// listed are gone from now (`newly_gone`), those listed again are back. One merge
    /// of the listing with the files known, both in path order (one directory:
    /// comparing the paths' bytes orders them as `Path` does).
    fn look_at_all(
        &mut self,
        now: Instant,
        to_read: &mut Vec<(PathBuf, Stamp)>,
        newly_gone: &mut Vec<PathBuf>,
    ) -> Result<(), CycleError> {
        let listed = manifests::list_dir(&self.dir).map_err(|e| CycleError::Manifests {
            dir: self.dir.clone(),
            source: e,
        })?;
        let mut listed = listed.into_iter().peekable();
        for (path, t) in &mut self.files {
            while let Some(new) = listed.next_if(|p| p.as_os_str() < path.as_os_str()) {
                to_read.extend(stamp_of(&new).map(|s| (new, s)));
            }
            if listed
                .next_if(|p| p.as_os_str() == path.as_os_str())
                .is_some()
            {
                t.back(path);
                match stamp_of(path) {
                    Some(s) if s != t.stamp => to_read.push((path.clone(), s)),
                    _ => {}
                }
            } else if t.gone_since.is_none() {
                t.gone_since = Some(now);
                newly_gone.push(path.clone());
            }
        }
        for new in listed {
            to_read.extend(stamp_of(&new).map(|s| (new, s)));
        }
        Ok(())
    }

    /// `look_at_all` for the files `names` only (in the directory; the rest are as
    /// they were).
    fn look_at(
        &mut self,
        names: BTreeSet<std::ffi::OsString>,
        now: Instant,
        to_read: &mut Vec<(PathBuf, Stamp)>,
        newly_gone: &mut Vec<PathBuf>,
    ) {
        for name in names {
            let path = self.dir.join(name);
            // A manifest is a file (or a link to one), as listed.
            let stamp = std::fs::metadata(&path)
                .ok()
                .filter(std::fs::Metadata::is_file)
                .and_then(|_| stamp_of(&path));
            match (self.files.get_mut(&path), stamp) {
                (Some(t), Some(s)) => {
                    t.back(&path);
                    if s != t.stamp {
                        to_read.push((path, s));
                    }
                }
                (None, Some(s)) => to_read.push((path, s)),
                (Some(t), None) if t.gone_since.is_none() => {
                    t.gone_since = Some(now);
                    newly_gone.push(path);
                }
                (_, None) => {}
            }
        }
    }

    /// Takes a new version of `path` (`parsed`, as read): in force if it is good, else
    /// its errors are added to `errors` and the last good version stays.
    fn read(
        &mut self,
        path: &Path,
        stamp: Stamp,
        parsed: FileObjects,
        now: Instant,
        errors: &mut Vec<String>,
    ) {
        for w in &parsed.warnings {
            tracing::warn!("{w}");
        }
        for note in &parsed.ignored {
            tracing::info!("{note}");
        }
        if parsed.errors.is_empty() {
            self.moved_here(path, &parsed);
        }
        let t = self
            .files
            .entry(path.to_path_buf())
            .or_insert_with(|| Tracked {
                stamp,
                objects: FileObjects::default(),
                counts: manifests::Counts::default(),
                broken: Vec::new(),
                warnings: Vec::new(),
                refused: None,
                gone_since: None,
                lingering: Vec::new(),
            });
        t.stamp = stamp;
        t.warnings = parsed.warnings.clone();
        t.refused = None;
        self.waiting.remove(path);
        let failed = if parsed.errors.is_empty() {
            let (parsed, lingering) = with_lingering(&t.objects, &t.lingering, parsed, now);
            let parsed = share_unchanged(&t.objects, parsed);
            match self.definitions.replace(path, &t.objects, &parsed) {
                Ok(()) => {
                    t.broken.clear();
                    set_lingering(&mut self.lingering, path, &mut t.lingering, lingering);
                    self.put(path, parsed);
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
    fn admit_waiting(&mut self, now: Instant) {
        let waiting = std::mem::take(&mut self.waiting);
        for path in waiting {
            let Some(t) = self.files.get_mut(&path) else {
                continue;
            };
            let Some(new) = t.refused.take() else {
                continue;
            };
            // Objects it defines that linger in another file are its now.
            self.moved_here(&path, &new);
            let Some(t) = self.files.get_mut(&path) else {
                continue;
            };
            let (in_force, lingering) = with_lingering(&t.objects, &t.lingering, new.clone(), now);
            match self.definitions.replace(&path, &t.objects, &in_force) {
                Ok(()) => {
                    tracing::info!(file = %path.display(), "manifest file admitted: the other definitions are gone");
                    t.broken.clear();
                    set_lingering(&mut self.lingering, &path, &mut t.lingering, lingering);
                    self.put(&path, in_force);
                }
                Err(e) => {
                    t.broken = e.iter().map(ToString::to_string).collect();
                    t.refused = Some(new);
                    self.waiting.insert(path);
                }
            }
        }
    }

    /// Lets go at once of the objects of other files that `new`, the new version of
    /// `path`, defines, where they stay only for the settle time (left out of their
    /// file's new version, or their file gone): an object moved from one file to
    /// another, or a file renamed, takes effect as soon as the other file has it.
    fn moved_here(&mut self, path: &Path, new: &FileObjects) {
        if self.lingering.is_empty() && !self.some_gone {
            return;
        }
        let mut by_file: BTreeMap<PathBuf, HashSet<ObjectKey>> = BTreeMap::new();
        for o in &new.objects {
            let key = object_key(o);
            let from = match self.lingering.get(&key) {
                Some(file) => Some(file.as_path()),
                None if self.some_gone => self
                    .definitions
                    .file_of(o)
                    .filter(|f| self.files.get(*f).is_some_and(|t| t.gone_since.is_some())),
                None => None,
            };
            if let Some(file) = from.filter(|f| *f != path) {
                by_file.entry(file.to_path_buf()).or_default().insert(key);
            }
        }
        for (file, keys) in by_file {
            self.take_out(&file, &keys, "objects defined anew by another file");
        }
    }

    /// Drops the lingering objects whose settle time passed; returns whether any did.
    fn expire_lingering(&mut self, now: Instant) -> bool {
        let settle = self.settle;
        let due: BTreeSet<PathBuf> = self
            .lingering
            .values()
            .filter(|file| {
                self.files.get(*file).is_some_and(|t| {
                    t.lingering
                        .iter()
                        .any(|(_, since)| now.duration_since(*since) >= settle)
                })
            })
            .cloned()
            .collect();
        for file in &due {
            self.drop_lingering(file, |_, since| now.duration_since(since) >= settle);
        }
        !due.is_empty()
    }

    /// Takes the lingering objects of `file` for which `drop` holds out of force.
    fn drop_lingering(&mut self, file: &Path, drop: impl Fn(&ObjectKey, Instant) -> bool) {
        let Some(t) = self.files.get(file) else {
            return;
        };
        let due: HashSet<ObjectKey> = t
            .lingering
            .iter()
            .filter(|(key, since)| drop(key, *since))
            .map(|(key, _)| key.clone())
            .collect();
        if !due.is_empty() {
            self.take_out(
                file,
                &due,
                "objects no longer defined by their file are gone",
            );
        }
    }

    /// Takes the objects `keys` of `file` out of force, saying `why`.
    fn take_out(&mut self, file: &Path, keys: &HashSet<ObjectKey>, why: &str) {
        let Some(t) = self.files.get_mut(file) else {
            return;
        };
        let mut kept = FileObjects::default();
        for (o, &d) in t.objects.objects.iter().zip(&t.objects.documents) {
            if !keys.contains(&object_key(o)) {
                kept.objects.push(o.clone());
                kept.documents.push(d);
            }
        }
        // Fewer definitions of the same file: releasing them cannot fail.
        let _ = self.definitions.replace(file, &t.objects, &kept);
        t.lingering.retain(|(key, _)| !keys.contains(key));
        let kept = FileObjects {
            objects: kept.objects,
            documents: kept.documents,
            ..std::mem::take(&mut t.objects)
        };
        for key in keys {
            if self.lingering.get(key).is_some_and(|f| f == file) {
                self.lingering.remove(key);
            }
        }
        self.put(file, kept);
        let names: Vec<String> = keys
            .iter()
            .map(|(kind, ns, name)| format!("{kind} {ns}/{name}"))
            .collect();
        tracing::info!(file = %file.display(), objects = %names.join(", "), "{why}");
    }

    /// Puts `objects` in force for `file` (tracked), in the snapshot too: after the
    /// objects of the files before it.
    fn put(&mut self, file: &Path, objects: FileObjects) {
        // What the snapshot holds less the objects of this file and the files after it:
        // files read in order (the first look at a directory) each cost their own.
        let from_here = self
            .files
            .range::<Path, _>((Bound::Included(file), Bound::Unbounded))
            .fold(manifests::Counts::default(), |n, (_, t)| n + t.counts);
        let at = manifests::Counts::of(&self.snapshot) - from_here;
        let Some(t) = self.files.get_mut(file) else {
            return;
        };
        t.counts = manifests::splice(&mut self.snapshot, at, t.counts, &objects.objects);
        t.objects = objects;
    }

    /// The objects in force, in file order (then as each file orders them).
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The snapshot made afresh from the files' objects in force.
    #[cfg(test)]
    pub(super) fn rebuilt(&self) -> Snapshot {
        manifests::snapshot(self.files.values().map(|t| &t.objects))
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

/// `new` in force for a file whose objects in force were `old` (lingering since the
/// times in `lingering`): the objects of `old` that `new` no longer defines stay after
/// `new`'s own, lingering since they first went missing (`now` if just now).
fn with_lingering(
    old: &FileObjects,
    lingering: &[(ObjectKey, Instant)],
    mut new: FileObjects,
    now: Instant,
) -> (FileObjects, Vec<(ObjectKey, Instant)>) {
    let defined: HashSet<ObjectKey> = new.objects.iter().map(object_key).collect();
    let mut still = Vec::new();
    for (o, &document) in old.objects.iter().zip(&old.documents) {
        let key = object_key(o);
        if defined.contains(&key) {
            continue;
        }
        let since = lingering
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(now, |(_, since)| *since);
        new.objects.push(o.clone());
        new.documents.push(document);
        still.push((key, since));
    }
    (new, still)
}

/// Makes `new` the lingering objects of `file` (`mine`), in the source's index too.
fn set_lingering(
    index: &mut HashMap<ObjectKey, PathBuf>,
    file: &Path,
    mine: &mut Vec<(ObjectKey, Instant)>,
    new: Vec<(ObjectKey, Instant)>,
) {
    for (key, _) in mine.iter() {
        index.remove(key);
    }
    let fresh: Vec<String> = new
        .iter()
        .filter(|(key, _)| !mine.iter().any(|(k, _)| k == key))
        .map(|((kind, ns, name), _)| format!("{kind} {ns}/{name}"))
        .collect();
    if !fresh.is_empty() {
        tracing::info!(
            file = %file.display(),
            objects = %fresh.join(", "),
            "manifest file no longer defines these objects: they stay in force unless they are back within the settle time"
        );
    }
    for (key, _) in &new {
        index.insert(key.clone(), file.to_path_buf());
    }
    *mine = new;
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

/// `new` with each object equal to the one at its place in `old` given as that very
/// allocation: a file read again after a change of one object keeps the others as
/// they were (the planner finds unchanged routes by address, and memory holds one of
/// each).
fn share_unchanged(old: &FileObjects, mut new: FileObjects) -> FileObjects {
    for (n, o) in new.objects.iter_mut().zip(&old.objects) {
        if n == o {
            *n = o.clone();
        }
    }
    new
}
