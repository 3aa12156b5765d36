//! Filesystems: mounting one, asking which one holds a path.

use std::{
    ffi::{CStr, CString},
    io,
    os::unix::ffi::OsStrExt as _,
    path::Path,
};

/// Mounts a filesystem of type `fstype` (no device, no options) on `at`.
pub(crate) fn mount(fstype: &str, at: &Path) -> io::Result<()> {
    let c_at = CString::new(at.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let c_type = CString::new(fstype).map_err(io::Error::other)?;
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call; no
    // data argument.
    let rc = unsafe {
        libc::mount(
            c_type.as_ptr(),
            c_at.as_ptr(),
            c_type.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The type (`f_type`, a magic number) of the filesystem holding `path` (statfs(2)).
pub(crate) fn fs_type(path: &CStr) -> io::Result<i64> {
    // SAFETY: statfs is plain integers; all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs writes into `st`, which we own and which outlives the call; the
    // path is NUL-terminated.
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}
