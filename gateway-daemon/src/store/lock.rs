//! Locking of a state directory: the writers' lock (`STATE/lock`, an exclusive `flock`
//! held for a whole read-plan-write cycle, so a claim is created only if no one holds
//! it, also between processes) and a daemon's ownership (`STATE/owner`, so two daemons
//! never run on one directory). The kernel releases both if the process dies.

use std::{
    fs::{File, OpenOptions},
    io::Write,
};

use super::{io_err, Result, Store, StoreError};
use crate::sys;

/// Whether a store holds its directory's lock, and has bumped the generation under it.
#[derive(Debug, Default)]
pub(super) struct Locked {
    pub(super) held: bool,
    pub(super) bumped: bool,
}

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

impl Store {
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
        if let Err(err) = sys::flock::lock_exclusive(&file, true) {
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let pid = super::read_small(&path, super::MAX_SMALL)
                    .ok()
                    .flatten()
                    .map(|p| p.trim().to_string())
                    .unwrap_or_else(|| "?".into());
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
        sys::flock::lock_exclusive(&file, false).map_err(io_err("locking", &path))?;
        self.locked.lock().unwrap_or_else(|e| e.into_inner()).held = true;
        Ok(StoreLock {
            _file: file,
            locked: std::sync::Arc::clone(&self.locked),
        })
    }

    /// The lock for one write: none if this store holds it already.
    pub(super) fn lock_for_write(&self) -> Result<Option<StoreLock>> {
        let held = self.locked.lock().unwrap_or_else(|e| e.into_inner()).held;
        if held {
            Ok(None)
        } else {
            self.lock().map(Some)
        }
    }
}
