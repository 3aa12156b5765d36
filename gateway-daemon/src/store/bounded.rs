//! Reading the files of a state directory with bounded memory: only regular files are
//! read (a symlink to `/dev/full` or a FIFO is refused at once), each kind of file has
//! a size limit, and journals are read line by line with a limit on a line's length.
//!
//! An incident made this module: `claims.log` symlinked to `/dev/full` took `berth
//! state check` to 10 GB of memory in 8 s, and `berth run` the same on every retry; a
//! journal of a million lines, read whole and then split, peaked at 637 MB.

use std::{
    fs::{File, OpenOptions},
    io::{self, BufRead, BufReader, Read},
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::Path,
};

use super::{io_err, Result, StoreError};

/// The longest line a journal may hold (a claim's record is well under 2 KiB).
pub(super) const MAX_LINE: usize = 64 * 1024;
/// The largest journal read (compaction keeps a journal near twice its records).
pub(super) const MAX_JOURNAL: u64 = 1 << 30;
/// The largest small file (`generation`, `owner`, the drain file): a line or two.
pub const MAX_SMALL: u64 = 4096;
/// The largest YAML file of earlier versions (`first-seen.yaml`, a claim file).
pub(super) const MAX_YAML: u64 = 64 << 20;

/// Opens `path` for reading if it is a regular file of at most `limit` bytes; `None`
/// if it does not exist. Never blocks (a FIFO is opened non-blocking, then refused).
pub(super) fn open(path: &Path, limit: u64) -> Result<Option<(File, u64)>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("opening", path)(e)),
    };
    let meta = file.metadata().map_err(io_err("reading", path))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let kind = if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(StoreError::NotRegular {
            path: path.to_path_buf(),
            kind,
        });
    }
    if meta.len() > limit {
        return Err(StoreError::TooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
            limit,
        });
    }
    Ok(Some((file, meta.len())))
}

/// The text of a small file of the state directory (at most `limit` bytes, regular);
/// `None` if it does not exist.
pub fn read_small(path: &Path, limit: u64) -> Result<Option<String>> {
    let Some((file, _)) = open(path, limit)? else {
        return Ok(None);
    };
    let mut text = String::new();
    // `take`: a file that grows after the size check is still read only up to `limit`.
    file.take(limit)
        .read_to_string(&mut text)
        .map_err(io_err("reading", path))?;
    Ok(Some(text))
}

/// What reading a journal found besides its lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lines {
    /// Complete lines.
    pub(super) count: usize,
    /// Bytes after the last newline: a torn last record (a writer cut short).
    pub(super) torn: u64,
}

/// A line of a journal that cannot be passed on as text.
#[derive(Debug)]
pub(super) enum BadLine {
    /// Longer than `MAX_LINE`; its first bytes.
    TooLong(Vec<u8>),
    /// Not UTF-8; its bytes.
    NotUtf8(Vec<u8>),
}

impl BadLine {
    /// What is wrong with the line.
    pub(super) fn problem(&self) -> String {
        match self {
            BadLine::TooLong(_) => format!("longer than {} KiB", MAX_LINE / 1024),
            BadLine::NotUtf8(_) => "not UTF-8".to_string(),
        }
    }

    /// The line as text, as far as it was kept.
    pub(super) fn text(&self) -> String {
        match self {
            BadLine::TooLong(b) | BadLine::NotUtf8(b) => String::from_utf8_lossy(b).into_owned(),
        }
    }
}

/// Reads the journal `path` line by line, passing each complete line (without its
/// newline) and its number (from 1) to `each`; a line that is too long or not UTF-8 is
/// passed as `Err`. Memory is bounded by `MAX_LINE` whatever the file holds. Nothing
/// if there is no journal.
pub(super) fn for_each_line(
    path: &Path,
    mut each: impl FnMut(std::result::Result<&str, BadLine>, usize) -> Result<()>,
) -> Result<Lines> {
    let Some((file, _)) = open(path, MAX_JOURNAL)? else {
        return Ok(Lines::default());
    };
    let mut reader = BufReader::with_capacity(256 * 1024, file.take(MAX_JOURNAL));
    let mut out = Lines::default();
    // The start of a line that spans reads (at most `MAX_LINE + 1` bytes of it kept),
    // and the length of that line so far.
    let mut pending = Vec::new();
    let mut pending_len = 0u64;
    let mut pass = |bytes: &[u8], len: u64, out: &mut Lines| {
        out.count += 1;
        let line = if len > MAX_LINE as u64 {
            Err(BadLine::TooLong(bytes[..bytes.len().min(256)].to_vec()))
        } else {
            std::str::from_utf8(bytes).map_err(|_| BadLine::NotUtf8(bytes.to_vec()))
        };
        each(line, out.count)
    };
    loop {
        let chunk = reader.fill_buf().map_err(io_err("reading", path))?;
        if chunk.is_empty() {
            // The end of the file: bytes after the last newline are a torn record.
            out.torn = pending_len;
            return Ok(out);
        }
        let room = (MAX_LINE + 1).saturating_sub(pending.len());
        let Some(end) = chunk.iter().position(|&b| b == b'\n') else {
            let n = chunk.len();
            pending.extend_from_slice(&chunk[..n.min(room)]);
            pending_len += n as u64;
            reader.consume(n);
            continue;
        };
        if pending_len == 0 {
            // The whole line is in this read: passed without a copy.
            pass(&chunk[..end], end as u64, &mut out)?;
        } else {
            pending.extend_from_slice(&chunk[..end.min(room)]);
            pass(&pending, pending_len + end as u64, &mut out)?;
            pending.clear();
            pending_len = 0;
        }
        reader.consume(end + 1);
    }
}

/// The length of `file` up to and including its last newline, reading backwards in
/// chunks (a torn last record of any size is found without reading it whole).
pub(super) fn complete_len(file: &mut File, len: u64) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    const CHUNK: u64 = 64 * 1024;
    let mut end = len;
    let mut buf = vec![0u8; CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let part = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(part)?;
        if let Some(i) = part.iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}
