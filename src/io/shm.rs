//! Shared memory between processes of one host: rows a process owns live in a sealed `memfd`
//! that readers on the same host open through `/proc/<owner pid>/fd/<fd>` and map.
//!
//! A mapping of a file that shrinks under it raises SIGBUS on the next touch past the new end.
//! The owner therefore seals its file against shrinking and growing once sized
//! (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`), and a reader maps only a file that carries
//! those seals and is at least as long as announced: the length it checked cannot change.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::PathBuf;

use crate::error::{Error, Result};

/// The seals a shared file carries once sized.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A new zero-filled shared-memory file of `len` bytes (at least one: mmap refuses zero-length
/// mappings), sealed at that size. `name` shows in `/proc/<pid>/fd` (debugging only).
pub fn create_shared(name: &str, len: usize) -> Result<File> {
    let cname = std::ffi::CString::new(format!("zrecord-{}", name.replace('\0', "?"))).unwrap_or_default();
    // SAFETY: `cname` is a valid NUL-terminated string; memfd_create has no other inputs.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(Error::io("memfd", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len.max(1) as u64).map_err(|e| Error::io("memfd", e))?;
    // SAFETY: fcntl on the descriptor `file` owns, with integer arguments only.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } < 0 {
        return Err(Error::io("memfd", std::io::Error::last_os_error()));
    }
    Ok(file)
}

/// The seals on `file` (`None`: not a file that takes seals, such as a file on disk).
fn seals(file: &File) -> Option<libc::c_int> {
    // SAFETY: fcntl on a descriptor `file` owns; F_GET_SEALS takes no pointer.
    let s = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    (s >= 0).then_some(s)
}

/// Open process `pid`'s shared file `fd` read-only, checked: a regular file, sealed against
/// shrinking and growing, at least `min_len` bytes. Returns it and its length.
pub fn open_shared(pid: u32, fd: i32, min_len: u64) -> Result<(File, u64)> {
    let path = PathBuf::from(format!("/proc/{pid}/fd/{fd}"));
    let (file, len) = crate::io::open_regular(&path)?.ok_or_else(|| Error::io(&path, std::io::ErrorKind::NotFound.into()))?;
    match seals(&file) {
        Some(s) if s & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) == (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) => {}
        _ => return Err(Error::corrupt(&path, "shared rows are not sealed against resizing (mapping them could fault when the owner shrinks them)")),
    }
    if len < min_len.max(1) {
        return Err(Error::corrupt(&path, format!("shared file holds {len} bytes, {min_len} expected")));
    }
    Ok((file, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_files_are_sealed_and_readers_refuse_unsealed_or_short_ones() {
        let pid = std::process::id();
        let f = create_shared("t", 4096).unwrap_or_else(|e| panic!("{e}"));
        // The owner cannot shrink or grow it any more, nor lift the seals.
        assert!(f.set_len(10).is_err());
        assert!(f.set_len(1 << 20).is_err());
        // SAFETY: fcntl on a descriptor `f` owns, integer arguments.
        assert!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, 0) } < 0);
        let (r, len) = open_shared(pid, f.as_raw_fd(), 4096).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(len, 4096);
        assert_eq!(r.metadata().map(|m| m.len()).unwrap_or(0), 4096);
        // Announced longer than it is: refused.
        let e = open_shared(pid, f.as_raw_fd(), 4097).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }) && e.to_string().contains("4097"), "{e}");
        // An unsealed memfd and a file on disk: refused before any mapping.
        let cname = std::ffi::CString::new("unsealed").unwrap_or_default();
        // SAFETY: valid NUL-terminated name; the descriptor is owned by `u` below.
        let u = unsafe { File::from_raw_fd(libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC)) };
        u.set_len(4096).unwrap_or_else(|e| panic!("{e}"));
        let e = open_shared(pid, u.as_raw_fd(), 16).unwrap_err();
        assert!(e.to_string().contains("not sealed"), "{e}");
        let disk = tempfile::tempfile().unwrap_or_else(|e| panic!("{e}"));
        disk.set_len(4096).unwrap_or_else(|e| panic!("{e}"));
        let e = open_shared(pid, disk.as_raw_fd(), 16).unwrap_err();
        assert!(e.to_string().contains("not sealed"), "{e}");
        // A descriptor that is a FIFO or does not exist: typed errors, no hang.
        let mut fds = [0; 2];
        // SAFETY: `fds` is a writable array of two ints.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let e = open_shared(pid, fds[0], 16).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // SAFETY: closing the two descriptors pipe() returned, owned by this test.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert!(open_shared(pid, 1 << 20, 16).is_err());
    }
}
