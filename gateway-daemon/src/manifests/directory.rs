//! The directory source: the manifest files of a directory, listed and parsed.

use std::path::{Path, PathBuf};

use super::{read_file, Definitions, FileObjects};

/// Every `*.yaml`/`*.yml`/`*.json` file of a directory, in file-name order, parsed. An object
/// defined again in a later file (or document) is an error of that file, naming both.
pub fn load_dir(dir: &Path) -> std::io::Result<Vec<(PathBuf, FileObjects)>> {
    let mut definitions = Definitions::default();
    Ok(list_dir(dir)?
        .into_iter()
        .map(|f| {
            let mut objects = read_file(&f);
            if let Err(e) = definitions.replace(&f, &FileObjects::default(), &objects) {
                objects.errors.extend(e);
            }
            (f, objects)
        })
        .collect())
}

/// The `*.yaml`/`*.yml`/`*.json` files of a directory, sorted by name.
pub fn list_dir(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| {
            let p = e.path();
            matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"))
                // The entry's type comes with the listing: a `stat` only for links.
                && e.file_type().is_ok_and(|t| t.is_file() || (t.is_symlink() && p.is_file()))
        })
        .map(|e| e.path())
        .collect();
    // One directory: the paths' bytes order them as `Path` does, at less cost.
    files.sort_unstable_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
    Ok(files)
}
