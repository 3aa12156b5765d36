//! The pin directory as a whole: the lock every process using it holds, and what
//! `berth uninstall` recognises as Berth's in it (its maps by name and kind, its links
//! under `links/`) and removes, entry by entry.
//!
//! An incident made this module: `berth uninstall --pin-dir DIR` used to remove DIR
//! recursively, whatever it was (a copy of a state directory was gone, exit 0), and
//! said "programs are detached" while a running daemon held them attached.

use std::{
    fmt, fs, io,
    path::{Path, PathBuf},
};

use gateway_common::map_names;

use super::{
    links::{LinkKind, LinkRole},
    DatapathError,
};
use crate::sys;

/// `f_type` of bpffs (statfs(2)).
pub(super) const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The sub-directory of the pin directory that holds the links.
const LINKS: &str = "links";

/// A shared lock on a pin directory, held while a process uses it (released on drop
/// or process death); `berth uninstall` takes it exclusively, so it refuses while a
/// daemon runs on the directory.
#[derive(Debug)]
pub(super) struct PinDirLock(#[expect(dead_code, reason = "held for its lock")] fs::File);

impl PinDirLock {
    /// Takes the shared lock on `dir` (which exists).
    pub(super) fn take(dir: &Path) -> Result<Self, DatapathError> {
        let err = |source| DatapathError::PinDir {
            path: dir.to_path_buf(),
            source,
        };
        let file = fs::File::open(dir).map_err(err)?;
        match sys::flock::lock_shared(&file, true) {
            Ok(()) => Ok(PinDirLock(file)),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Err(err(io::Error::other(
                "`berth uninstall` is removing this pin directory",
            ))),
            Err(e) => Err(err(e)),
        }
    }
}

/// Errors of surveying and removing a pin directory. Nothing is removed when surveying
/// fails.
#[derive(Debug, thiserror::Error)]
pub enum PinDirError {
    /// The directory is not on a bpffs, so it holds no pins.
    #[error(
        "{} is not on a bpffs, so it is no pin directory of Berth's (pins live on bpffs, \
         e.g. /sys/fs/bpf/berth): nothing removed",
        .dir.display()
    )]
    NotBpffs {
        /// The directory.
        dir: PathBuf,
    },
    /// An entry that Berth did not make.
    #[error(
        "{} is not Berth's ({why}): nothing removed (Berth removes only what it made; \
         remove this yourself if it should go, then run uninstall again)",
        .path.display()
    )]
    Unknown {
        /// The entry.
        path: PathBuf,
        /// Why it is not recognised.
        why: String,
    },
    /// A process (a running `berth run`) uses the directory.
    #[error(
        "{} is in use by a running berth (it holds the pin directory's lock): stop it \
         first (uninstalling under it would leave its programs attached); nothing removed",
        .dir.display()
    )]
    InUse {
        /// The directory.
        dir: PathBuf,
    },
    /// A file operation failed.
    #[error("{action} {}", .path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PinDirError + 'a {
    move |source| PinDirError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// A link pinned under `links/`, as its name says: `xdp@IFINDEX`, `tc@IFINDEX` (an
/// `--interface`), `xdp-snat@IFINDEX`, `tc-snat@IFINDEX` (where SNAT traffic leaves),
/// or `NAME@IFINDEX` (XDP on an `--interface`, earlier versions).
pub(super) fn link_name(name: &str) -> Option<(LinkKind, LinkRole, u32)> {
    let (prefix, index) = name.rsplit_once('@')?;
    let ifindex = index.parse().ok()?;
    let (kind, role) = match prefix.strip_suffix(LinkRole::SnatEgress.suffix()) {
        Some(kind) => (kind, LinkRole::SnatEgress),
        None => (prefix, LinkRole::Listed),
    };
    let kind = [LinkKind::Tc, LinkKind::TcIngress]
        .into_iter()
        .find(|k| k.prefix() == kind)
        .unwrap_or(LinkKind::Xdp);
    Some((kind, role, ifindex))
}

/// What an entry of the pin directory is by its name and type alone.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    Map,
    LinksDir,
}

/// Classifies a top-level entry of the pin directory; why it is not Berth's otherwise.
fn entry(name: &str, is_dir: bool) -> Result<Entry, String> {
    match (name, is_dir) {
        (LINKS, true) => Ok(Entry::LinksDir),
        (n, false) if map_names::ALL.contains(&n) => Ok(Entry::Map),
        (n, true) if map_names::ALL.contains(&n) => Err("a directory named like a map".into()),
        (_, true) => Err("a directory Berth does not make".into()),
        _ => Err("no map of Berth's has this name".into()),
    }
}

/// Whether the kernel's name of a map (truncated to 15 bytes) is that of the map
/// pinned as `pinned`.
fn kernel_name_matches(pinned: &str, kernel: &str) -> bool {
    const BPF_OBJ_NAME_LEN: usize = 16;
    let want = &pinned.as_bytes()[..pinned.len().min(BPF_OBJ_NAME_LEN - 1)];
    kernel.as_bytes() == want
}

/// A pin directory in which everything is Berth's, held exclusively (no daemon runs
/// on it) until removed or dropped.
#[derive(Debug)]
pub struct PinnedDatapath {
    dir: PathBuf,
    maps: Vec<PathBuf>,
    /// Links with their kind and interface index.
    links: Vec<(PathBuf, LinkKind, u32)>,
    links_dir: bool,
    _lock: fs::File,
}

/// One thing `PinnedDatapath::remove` removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    /// A pinned link: its program is detached from the interface (no process holds it:
    /// the lock says no daemon runs).
    Link {
        /// The pin.
        path: PathBuf,
        /// Which program it ran.
        kind: LinkKind,
        /// The interface's index.
        ifindex: u32,
        /// The interface's name, if it still exists.
        iface: Option<String>,
    },
    /// A pinned map.
    Map {
        /// The pin.
        path: PathBuf,
    },
    /// An empty directory Berth made (`links/`, the pin directory).
    Dir {
        /// The directory.
        path: PathBuf,
    },
}

impl fmt::Display for Removed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Removed::Link {
                path,
                kind,
                ifindex,
                iface,
            } => {
                let program = match kind {
                    LinkKind::Xdp => "XDP",
                    LinkKind::Tc => "TC",
                    LinkKind::TcIngress => "TC ingress",
                };
                let iface = iface.as_deref().unwrap_or("(gone)");
                write!(
                    f,
                    "link {} ({program} program detached from {iface}, index {ifindex})",
                    path.display()
                )
            }
            Removed::Map { path } => write!(f, "map {}", path.display()),
            Removed::Dir { path } => write!(f, "directory {}", path.display()),
        }
    }
}

impl PinnedDatapath {
    /// Reads `dir` and recognises every entry as Berth's (a map of its by name and
    /// kernel name, `links/` with links named as Berth names them), holding the
    /// directory's lock exclusively. `None` if `dir` does not exist or holds nothing
    /// of Berth's (an empty directory is left alone). Refuses, naming the entry, if
    /// anything is not Berth's; refuses while a daemon holds the directory.
    pub fn survey(dir: &Path) -> Result<Option<Self>, PinDirError> {
        let file = match fs::File::open(dir) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("opening", dir)(e)),
        };
        if !file.metadata().map_err(io_err("reading", dir))?.is_dir() {
            return Err(PinDirError::Unknown {
                path: dir.to_path_buf(),
                why: "not a directory".into(),
            });
        }
        let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|e| io_err("reading", dir)(io::Error::other(e)))?;
        if sys::fs::fs_type(&c_dir).map_err(io_err("reading", dir))? != BPF_FS_MAGIC {
            return Err(PinDirError::NotBpffs {
                dir: dir.to_path_buf(),
            });
        }
        match sys::flock::lock_exclusive(&file, true) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                return Err(PinDirError::InUse {
                    dir: dir.to_path_buf(),
                })
            }
            Err(e) => return Err(io_err("locking", dir)(e)),
        }
        let mut found = PinnedDatapath {
            dir: dir.to_path_buf(),
            maps: Vec::new(),
            links: Vec::new(),
            links_dir: false,
            _lock: file,
        };
        for (path, is_dir) in entries(dir)? {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let unknown = |why: String| PinDirError::Unknown {
                path: path.clone(),
                why,
            };
            match entry(&name, is_dir).map_err(unknown)? {
                Entry::LinksDir => found.links_dir = true,
                Entry::Map => {
                    require_kind(&path, "map")?;
                    let info = aya::maps::MapInfo::from_pin(&path)
                        .map_err(|e| unknown(format!("not readable as a map: {e}")))?;
                    let kernel = info.name_as_str().unwrap_or_default();
                    if !kernel_name_matches(&name, kernel) {
                        return Err(unknown(format!("a map named {kernel:?} in the kernel")));
                    }
                    found.maps.push(path);
                }
            }
        }
        if found.links_dir {
            for (path, is_dir) in entries(&dir.join(LINKS))? {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                let Some((kind, _, ifindex)) = link_name(&name).filter(|_| !is_dir) else {
                    return Err(PinDirError::Unknown {
                        path,
                        why: "not a link as Berth names them (xdp@IFINDEX, tc-snat@IFINDEX, ...)"
                            .into(),
                    });
                };
                require_kind(&path, "link")?;
                found.links.push((path, kind, ifindex));
            }
        }
        if found.maps.is_empty() && !found.links_dir {
            return Ok(None);
        }
        Ok(Some(found))
    }

    /// The pin directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes the links (detaching their programs), the maps, `links/` and the
    /// directory, in that order; what was removed, in that order. Stops at the first
    /// failure (what was removed before it stays removed).
    pub fn remove(self) -> Result<Vec<Removed>, PinDirError> {
        let mut out = Vec::new();
        for (path, kind, ifindex) in &self.links {
            let iface = sys::iface::index_to_name(*ifindex);
            fs::remove_file(path).map_err(io_err("removing", path))?;
            out.push(Removed::Link {
                path: path.clone(),
                kind: *kind,
                ifindex: *ifindex,
                iface,
            });
        }
        for path in &self.maps {
            fs::remove_file(path).map_err(io_err("removing", path))?;
            out.push(Removed::Map { path: path.clone() });
        }
        let mut dirs = Vec::new();
        if self.links_dir {
            dirs.push(self.dir.join(LINKS));
        }
        dirs.push(self.dir.clone());
        for path in dirs {
            // remove_dir: only if empty (something pinned since the survey stays).
            fs::remove_dir(&path).map_err(io_err("removing", &path))?;
            out.push(Removed::Dir { path });
        }
        Ok(out)
    }
}

/// The entries of `dir` with whether each is a directory (not following symlinks).
fn entries(dir: &Path) -> Result<Vec<(PathBuf, bool)>, PinDirError> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(io_err("listing", dir))? {
        let e = e.map_err(io_err("listing", dir))?;
        let is_dir = e
            .file_type()
            .map_err(io_err("reading", &e.path()))?
            .is_dir();
        out.push((e.path(), is_dir));
    }
    out.sort();
    Ok(out)
}

/// Refuses `path` unless the object pinned there is a BPF `kind` ("map", "link").
fn require_kind(path: &Path, kind: &str) -> Result<(), PinDirError> {
    let found = sys::bpf::pinned_kind(path).map_err(|e| PinDirError::Unknown {
        path: path.to_path_buf(),
        why: format!("not a BPF object: {e}"),
    })?;
    if found != kind {
        return Err(PinDirError::Unknown {
            path: path.to_path_buf(),
            why: format!("a BPF {found}, where Berth pins a {kind}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_berths_map_names_and_its_links_directory_are_recognised() {
        assert_eq!(entry("berth_ct", false), Ok(Entry::Map));
        assert_eq!(entry("berth_reply_index6", false), Ok(Entry::Map));
        assert_eq!(entry("links", true), Ok(Entry::LinksDir));
        for (name, is_dir) in [
            ("claims.log", false),
            ("links", false),
            ("berth_ct", true),
            ("state", true),
            ("berth_ct.bak", false),
        ] {
            assert!(entry(name, is_dir).is_err(), "{name} (dir: {is_dir})");
        }
    }

    #[test]
    fn links_are_named_kind_at_ifindex() {
        use LinkRole::{Listed, SnatEgress};
        assert_eq!(link_name("xdp@3"), Some((LinkKind::Xdp, Listed, 3)));
        assert_eq!(link_name("tc@12"), Some((LinkKind::Tc, Listed, 12)));
        assert_eq!(
            link_name("xdp-snat@4"),
            Some((LinkKind::Xdp, SnatEgress, 4))
        );
        assert_eq!(link_name("tc-snat@4"), Some((LinkKind::Tc, SnatEgress, 4)));
        assert_eq!(link_name("tc-in@5"), Some((LinkKind::TcIngress, Listed, 5)));
        assert_eq!(
            link_name("tc-in-snat@5"),
            Some((LinkKind::TcIngress, SnatEgress, 5))
        );
        assert_eq!(
            link_name("eth0@7"),
            Some((LinkKind::Xdp, Listed, 7)),
            "earlier versions"
        );
        assert_eq!(link_name("xdp@"), None);
        assert_eq!(link_name("xdp"), None);
        assert_eq!(link_name("notes.txt"), None);
    }

    #[test]
    fn a_kernel_map_name_is_the_pin_name_cut_to_15_bytes() {
        assert!(kernel_name_matches("berth_ct", "berth_ct"));
        assert!(kernel_name_matches("berth_reply_index6", "berth_reply_ind"));
        assert!(!kernel_name_matches("berth_ct", "berth_ct6"));
        assert!(!kernel_name_matches("berth_ct", "other"));
    }
}
