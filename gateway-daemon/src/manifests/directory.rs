//! The directory source: the manifest files of a directory, listed and parsed.

use std::path::{Path, PathBuf};

use super::{read_file, Definitions, FileObjects};

/// Every `*.yaml`/`*.yml`/`*.json` file of a directory, in file-name order, parsed. An object
/// defined again in a later file (or document) is an error of that file, naming both.
pub fn load_dir(dir: &Path) -> std::io::Result<Vec<(PathBuf, FileObjects)>> {
    let mut definitions = Definitions::default();
    let files = list_dir(dir)?;
    let parsed = read_files(&files);
    Ok(files
        .into_iter()
        .zip(parsed)
        .map(|(f, mut objects)| {
            if let Err(e) = definitions.replace(&f, &FileObjects::default(), &objects) {
                objects.errors.extend(e);
            }
            (f, objects)
        })
        .collect())
}

/// Reads and parses `paths` (in the order given), on every CPU when there are many:
/// parsing YAML is most of a cold start (5.2 of 6.3 s for 100,000 routes in 1,000
/// files on one core), and files parse independently. Each thread takes the next file
/// not yet taken, so that all finish together (with halves fixed in advance, one
/// finished 0.5 s before the other while the kernel verified the datapath program on
/// one CPU).
pub fn read_files(paths: &[PathBuf]) -> Vec<FileObjects> {
    const PER_THREAD: usize = 8;
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(paths.len() / PER_THREAD)
        .max(1);
    if threads == 1 {
        return paths.iter().map(|p| read_file(p)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let take = || {
        let mut read = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(path) = paths.get(i) else {
                return read;
            };
            read.push((i, read_file(path)));
        }
    };
    let mut read: Vec<(usize, FileObjects)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads).map(|_| scope.spawn(take)).collect();
        workers
            .into_iter()
            .flat_map(|w| match w.join() {
                Ok(read) => read,
                // A panic while parsing is a bug: raised again here as it would have
                // been had the file been parsed on this thread.
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    read.sort_unstable_by_key(|(i, _)| *i);
    read.into_iter().map(|(_, objects)| objects).collect()
}

/// Whether `path` is named as a manifest file is: `*.yaml`, `*.yml` or `*.json`.
pub fn is_manifest_name(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// The `*.yaml`/`*.yml`/`*.json` files of a directory, sorted by name.
pub fn list_dir(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| {
            let p = e.path();
            is_manifest_name(&p)
                // The entry's type comes with the listing: a `stat` only for links.
                && e.file_type().is_ok_and(|t| t.is_file() || (t.is_symlink() && p.is_file()))
        })
        .map(|e| e.path())
        .collect();
    // One directory: the paths' bytes order them as `Path` does, at less cost.
    files.sort_unstable_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
    Ok(files)
}
