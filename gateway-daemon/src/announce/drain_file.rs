//! The operator's drain, kept across restarts so that "drain, upgrade, undrain" works:
//! the file `drain` in the state directory (`--state-dir`, in both modes), holding the
//! time the drain began (RFC 3339). Written and removed by the loop only, atomically
//! and durably (`store::replace_file`), so a `kill -9` leaves either the old state or
//! the new one. A stopping drain (SIGTERM) is never written here: the next start
//! announces.

use std::{
    path::{Path, PathBuf},
    time::SystemTime,
};

use crate::store::{self, StoreError};

/// The file's name in the state directory.
pub const FILE: &str = "drain";

/// The drain file of one state directory.
#[derive(Clone, Debug)]
pub struct DrainFile {
    dir: PathBuf,
}

impl DrainFile {
    /// The drain file of state directory `dir`.
    pub fn new(dir: &Path) -> Self {
        DrainFile {
            dir: dir.to_path_buf(),
        }
    }

    /// Its path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// When the drain it holds began; none without the file. A file whose text is not
    /// a time (edited by hand, say) still drains: since its modification time.
    pub fn read(&self) -> Result<Option<SystemTime>, StoreError> {
        let path = self.path();
        // Bounded, and only a regular file: the drain file sits in the state directory.
        let Some(text) = crate::store::read_small(&path, crate::store::MAX_SMALL)? else {
            return Ok(None);
        };
        let since = humantime::parse_rfc3339_weak(text.trim()).ok().or_else(|| {
            tracing::warn!(
                file = %path.display(),
                "the drain file holds no time; draining since its modification time"
            );
            std::fs::metadata(&path).and_then(|m| m.modified()).ok()
        });
        Ok(Some(since.unwrap_or_else(SystemTime::now)))
    }

    /// Records a drain that began at `since`.
    pub fn write(&self, since: SystemTime) -> Result<(), StoreError> {
        let text = format!("{}\n", humantime::format_rfc3339_nanos(since));
        store::replace_file(&self.dir, FILE, &text)
    }

    /// Forgets the drain (no file: nothing to do).
    pub fn remove(&self) -> Result<(), StoreError> {
        store::remove_file(&self.dir, FILE).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("berth-drain-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_drain_written_is_read_back_with_its_time_until_it_is_removed() {
        let d = dir("roundtrip");
        let file = DrainFile::new(&d.join("state"));
        assert_eq!(file.read().unwrap(), None, "no directory, no drain");
        let since = SystemTime::UNIX_EPOCH + std::time::Duration::new(1_800_000_000, 5);
        file.write(since).unwrap();
        assert_eq!(file.read().unwrap(), Some(since));
        let leftovers: Vec<_> = std::fs::read_dir(d.join("state"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            leftovers,
            vec![std::ffi::OsString::from(FILE)],
            "no temporary file left"
        );
        file.remove().unwrap();
        assert_eq!(file.read().unwrap(), None);
        file.remove().unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_drain_file_without_a_time_still_drains() {
        let d = dir("garbled");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(FILE), "yes please\n").unwrap();
        let since = DrainFile::new(&d).read().unwrap().expect("a drain");
        assert!(since.elapsed().unwrap_or_default() < std::time::Duration::from_secs(60));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
