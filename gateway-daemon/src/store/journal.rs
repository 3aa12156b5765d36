//! A journal: a file of records, one per line, appended to and fsynced, rewritten whole
//! (temporary file fsynced, renamed over, directory fsynced) when it has grown.
//!
//! A `kill -9` (or a crash) at any instant leaves at worst a torn last line, which
//! readers ignore and the next append cuts off; a failed append is truncated back, so a
//! batch is either held whole or not at all. Temporary files are named after the
//! writer's pid, so those of dead writers can be told and removed.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    marker::PhantomData,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use super::{bounded, io_err, Result, StoreError};

/// The records of one journal: its file name, how a line reads and how it is written.
pub(super) trait Format {
    /// The file name in the state directory.
    const FILE: &'static str;
    /// One record, as read from a line (borrowing from it) or to be written.
    type Record<'l>;
    /// Parses one line (without its newline); what is wrong with it otherwise.
    fn parse(line: &str) -> std::result::Result<Self::Record<'_>, String>;
    /// Appends the line of `record`, with its newline, to `out`.
    fn write(record: &Self::Record<'_>, out: &mut String) -> std::result::Result<(), String>;
}

/// The journal of format `F` in a state directory.
pub(super) struct Journal<F> {
    dir: PathBuf,
    path: PathBuf,
    format: PhantomData<fn() -> F>,
}

impl<F: Format> Journal<F> {
    /// The journal of state directory `dir` (nothing is read or created yet).
    pub(super) fn new(dir: &Path) -> Self {
        Journal {
            dir: dir.to_path_buf(),
            path: dir.join(F::FILE),
            format: PhantomData,
        }
    }

    /// The journal's file.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the journal line by line (memory bounded by the longest line, not the
    /// file), passing each record and its line number (from 1) to `apply`; a line that
    /// does not parse makes the journal `Corrupt`. Returns the number of lines (none if
    /// there is no journal) and the size of a torn last record.
    pub(super) fn replay(
        &self,
        mut apply: impl FnMut(F::Record<'_>, usize),
    ) -> Result<bounded::Lines> {
        bounded::for_each_line(&self.path, |line, n| {
            let corrupt = |message: String| StoreError::Corrupt {
                path: self.path.clone(),
                message: format!("line {n}: {message}"),
            };
            let line = line.map_err(|bad| corrupt(bad.problem()))?;
            apply(F::parse(line).map_err(corrupt)?, n);
            Ok(())
        })
    }

    /// The lines of `records`.
    pub(super) fn text(&self, records: &[F::Record<'_>]) -> Result<String> {
        let mut text = String::new();
        for record in records {
            F::write(record, &mut text).map_err(|message| StoreError::Corrupt {
                path: self.path.clone(),
                message,
            })?;
        }
        Ok(text)
    }

    /// Appends the lines of `records`, durably, first cutting off a torn last line.
    /// The lines are made and written some thousands at a time: the 100,000 claims of
    /// a first plan were 26 MB of text at once (the journal's size after it).
    pub(super) fn append(&self, records: &[F::Record<'_>]) -> Result<()> {
        use std::io::{Seek, SeekFrom};
        let path = &self.path;
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io_err("opening", path))?;
        // Cut off a torn last line before appending after it (found reading backwards:
        // it may be of any size).
        let meta = f.metadata().map_err(io_err("reading", path))?;
        if !meta.is_file() {
            return Err(StoreError::NotRegular {
                path: path.clone(),
                kind: "not a regular file",
            });
        }
        let len = meta.len();
        if len > 0 {
            let keep = bounded::complete_len(&mut f, len).map_err(io_err("reading", path))?;
            if keep < len {
                f.set_len(keep).map_err(io_err("truncating", path))?;
                tracing::warn!(
                    file = %path.display(),
                    bytes = len - keep,
                    "cut off a torn last record (a write cut short by a crash or kill)"
                );
            }
        }
        let before = f
            .seek(SeekFrom::End(0))
            .map_err(io_err("appending to", path))?;
        let written = records.chunks(4096).try_for_each(|chunk| {
            let text = self.text(chunk)?;
            f.write_all(text.as_bytes())
                .map_err(io_err("appending to", path))
        });
        let written = written.and_then(|()| f.sync_data().map_err(io_err("appending to", path)));
        if let Err(e) = written {
            // Leave the journal as it was (a failed batch is not half held); if even
            // that fails, the reader ignores a torn last line and the next append cuts it.
            let _ = f.set_len(before).and_then(|()| f.sync_data());
            return Err(e);
        }
        if len == 0 {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Replaces the journal with `text`, atomically and durably.
    pub(super) fn rewrite(&self, text: &str) -> Result<()> {
        rewrite_file(&self.dir, F::FILE, text)
    }
}

/// Whether a journal of `lines` lines holding `records` records has grown enough to be
/// rewritten whole (to twice what it holds, and some).
pub(super) fn worth_rewriting(lines: usize, records: usize) -> bool {
    lines > 2 * records + 64
}

/// Replaces file `name` of `dir` with `text`, atomically and durably.
pub(super) fn rewrite_file(dir: &Path, name: &str, text: &str) -> Result<()> {
    let path = dir.join(name);
    let tmp = write_tmp(dir, text)?;
    if let Err(e) = fs::rename(&tmp, &path) {
        let _ = fs::remove_file(&tmp);
        return Err(io_err("replacing", &path)(e));
    }
    sync_dir(dir)
}

/// Removes the temporary files in `dirs` left by writers killed mid-write (their
/// process is gone).
pub(super) fn remove_stale_temporaries(dirs: &[PathBuf]) -> Result<()> {
    for d in dirs {
        for f in read_dir(d)? {
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

/// The entries of `dir`; none if it does not exist.
pub(super) fn read_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(entries.filter_map(|e| e.ok().map(|e| e.path())).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_err("listing", dir)(e)),
    }
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

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
pub(super) fn write_tmp_unsynced(dir: &Path, text: &str) -> Result<PathBuf> {
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

/// Makes the entries of `dir` (created, renamed, removed files) durable.
pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("syncing", dir))
}
