//! The bpf(2) calls aya does not make for us: batch lookups and updates, and reading
//! map values out of the byte buffers they fill.

use std::{io, os::fd::AsRawFd as _};

/// A `T` read from the start of `bytes` (a key or value of a BPF map, which need not be
/// aligned for `T`). Panics if `bytes` is shorter than a `T`.
pub(crate) fn read_pod<T: aya::Pod>(bytes: &[u8]) -> T {
    assert!(
        bytes.len() >= std::mem::size_of::<T>(),
        "a map entry shorter than its type"
    );
    // SAFETY: `bytes` holds at least size_of::<T>() bytes (checked above) and `T` is
    // Pod: any bytes are a valid value; read_unaligned needs no alignment.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) }
}

/// The `batch` member of `union bpf_attr` (uapi/linux/bpf.h).
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Makes the batch command `cmd` of bpf(2) with `attr` (which the kernel updates).
///
/// # Safety
/// Every buffer `attr` points to must hold what `cmd` reads or writes there, and live
/// through the call.
unsafe fn batch(cmd: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: `attr` is a valid `bpf_attr` batch member; the caller vouches for what
    // it points to.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads every entry of a BPF hash or array map with `BPF_MAP_LOOKUP_BATCH` (a few
/// syscalls for the whole map, not two per entry), calling `f` on each key's and value's
/// bytes (`value_size` as the kernel copies it: per-CPU maps give one 8-byte-aligned
/// slot per possible CPU). `key_size` and `value_size` must be the map's: the kernel
/// writes that many bytes per entry.
pub(crate) fn lookup_batch(
    fd: std::os::fd::BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    f: impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    lookup_batch_until(fd, key_size, value_size, &|| false, f)
}

/// `lookup_batch` that stops before a batch once `stop` says so, with an error of kind
/// `Interrupted` (a read of a large map gives way to something more urgent).
pub(crate) fn lookup_batch_until(
    fd: std::os::fd::BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    stop: &dyn Fn() -> bool,
    mut f: impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
    const CHUNK: usize = 1024;
    let mut keys = vec![0u8; CHUNK * key_size];
    let mut values = vec![0u8; CHUNK * value_size];
    // Hash maps and arrays both use a u32 (bucket, index) as the batch cursor.
    let (mut cursor_in, mut cursor_out) = (0u64, 0u64);
    let mut first = true;
    loop {
        if stop() {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                std::ptr::addr_of!(cursor_in) as u64
            },
            out_batch: std::ptr::addr_of_mut!(cursor_out) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd.as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: the buffers hold CHUNK keys and values of the sizes the kernel copies
        // (the caller passes the map's sizes); the cursors are 8 bytes, more than the 4
        // the kernel writes; `attr` and all it points to live through the call.
        let done = match unsafe { batch(BPF_MAP_LOOKUP_BATCH, &mut attr) } {
            Ok(()) => false,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(e) => return Err(e),
        };
        let n = (attr.count as usize).min(CHUNK);
        for (k, v) in keys
            .chunks_exact(key_size)
            .zip(values.chunks_exact(value_size))
            .take(n)
        {
            f(k, v);
        }
        if done {
            return Ok(());
        }
        cursor_in = cursor_out;
        first = false;
    }
}

/// Writes `values` into consecutive entries of a BPF array of `u32`, from index
/// `first`, with one `BPF_MAP_UPDATE_BATCH` (a Maglev table is up to 65,521 entries:
/// one syscall, not one per entry). The kernel writes the entries in order, each
/// atomically; nothing reads them before the caller points a service at them.
pub(crate) fn update_array_u32(
    fd: std::os::fd::BorrowedFd<'_>,
    first: u32,
    values: &[u32],
) -> io::Result<()> {
    let count = u32::try_from(values.len()).map_err(io::Error::other)?;
    let keys: Vec<u32> = (0..count).map(|i| first.wrapping_add(i)).collect();
    update_batch(fd, &keys, values)
}

/// Writes `keys[i]` → `values[i]` into a BPF map (hash or array; not per-CPU) with one
/// `BPF_MAP_UPDATE_BATCH`: in order, each entry atomically, one syscall for all.
/// `K` and `V` must be the map's key and value types.
pub(crate) fn update_batch<K: aya::Pod, V: aya::Pod>(
    fd: std::os::fd::BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> io::Result<()> {
    assert_eq!(keys.len(), values.len(), "a value per key");
    update_batch_bytes(fd, pod_bytes(keys), pod_bytes(values), keys.len())
}

/// Writes zeroed values for `keys` into a BPF map (of any type, per-CPU ones
/// included: every CPU's value) with one `BPF_MAP_UPDATE_BATCH`.
pub(crate) fn zero_batch<K: aya::Pod>(
    fd: std::os::fd::BorrowedFd<'_>,
    keys: &[K],
) -> io::Result<()> {
    // In chunks: the values of 100,000 per-CPU counters at once were 11 MB at the
    // daemon's peak.
    const CHUNK: usize = 4096;
    let (_, value_bytes) = entry_sizes(fd)?;
    let zeroes = vec![0u8; value_bytes * keys.len().min(CHUNK)];
    for chunk in keys.chunks(CHUNK) {
        let values = &zeroes[..value_bytes * chunk.len()];
        update_batch_bytes(fd, pod_bytes(chunk), values, chunk.len())?;
    }
    Ok(())
}

/// The sizes of a map's key and of a value as the kernel copies it from or to a
/// buffer (for a per-CPU map, one 8-byte-aligned slot per possible CPU), from the
/// descriptor's fdinfo.
fn entry_sizes(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<(usize, usize)> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    let field = |name: &str| -> Option<usize> {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    let (Some(map_type), Some(key), Some(value)) =
        (field("map_type:"), field("key_size:"), field("value_size:"))
    else {
        return Err(io::Error::other(
            "no map_type, key_size or value_size in the map's fdinfo",
        ));
    };
    // BPF_MAP_TYPE_PERCPU_HASH, _PERCPU_ARRAY, _LRU_PERCPU_HASH.
    if matches!(map_type, 5 | 6 | 10) {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        return Ok((key, value.next_multiple_of(8) * cpus));
    }
    Ok((key, value))
}

/// `BPF_MAP_UPDATE_BATCH` of `count` entries given as bytes, checked against the map's
/// entry sizes (the kernel reads that many bytes per entry: a caller's smaller types
/// would have it read past the buffers).
fn update_batch_bytes(
    fd: std::os::fd::BorrowedFd<'_>,
    keys: &[u8],
    values: &[u8],
    count: usize,
) -> io::Result<()> {
    const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
    if count == 0 {
        return Ok(());
    }
    let (key_size, value_size) = entry_sizes(fd)?;
    if keys.len() != key_size * count || values.len() != value_size * count {
        return Err(io::Error::other(format!(
            "a batch of {count} entries in {} key and {} value bytes for a map of \
             {key_size}-byte keys and {value_size}-byte values",
            keys.len(),
            values.len()
        )));
    }
    let count = u32::try_from(count).map_err(io::Error::other)?;
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count,
        map_fd: fd.as_raw_fd() as u32,
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: `keys` and `values` hold `count` keys and values of the sizes the kernel
    // reads (checked against the map above); it only reads them; `attr` and what it
    // points to outlive the call.
    unsafe { batch(BPF_MAP_UPDATE_BATCH, &mut attr) }?;
    if attr.count != count {
        return Err(io::Error::other(format!(
            "batch update wrote {} of {count} entries",
            attr.count
        )));
    }
    Ok(())
}

/// The bytes of a slice of plain data.
fn pod_bytes<T: aya::Pod>(items: &[T]) -> &[u8] {
    // SAFETY: `T` is Pod (no padding with undefined contents, any bytes valid), so its
    // memory may be read as bytes; the length covers exactly the slice.
    unsafe { std::slice::from_raw_parts(items.as_ptr().cast(), std::mem::size_of_val(items)) }
}

/// The kernel memory a BPF map takes, as the kernel accounts it (the `memlock:` line
/// of the descriptor's fdinfo), in bytes.
pub(crate) fn map_memlock(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::other("no memlock line in the map's fdinfo"))
}

/// What kind of BPF object is pinned at `path` (`BPF_OBJ_GET`, then the `map_type:`,
/// `prog_type:` or `link_type:` line of the descriptor's fdinfo): "map", "prog",
/// "link", or another word for a kind this does not know.
pub(crate) fn pinned_kind(path: &std::path::Path) -> io::Result<&'static str> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    use std::os::unix::ffi::OsStrExt as _;
    /// The `obj` member of `union bpf_attr` (uapi/linux/bpf.h).
    #[repr(C)]
    #[derive(Default)]
    struct ObjAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
        path_fd: i32,
        _pad: u32,
    }
    const BPF_OBJ_GET: libc::c_long = 7;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // No access flags: links accept none (BPF_F_RDONLY makes BPF_OBJ_GET fail with
    // EINVAL on a link); the descriptor is only used to read its fdinfo.
    let attr = ObjAttr {
        pathname: c_path.as_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid bpf_attr prefix of the size passed, its path pointer a
    // NUL-terminated string that outlives the call; the kernel only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET,
            &attr as *const ObjAttr,
            std::mem::size_of::<ObjAttr>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: BPF_OBJ_GET returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    let has = |key: &str| info.lines().any(|l| l.starts_with(key));
    Ok(if has("link_type:") {
        "link"
    } else if has("map_type:") {
        "map"
    } else if has("prog_type:") {
        "prog"
    } else {
        "unknown"
    })
}
