//! Atomic publish of a local folder, shared by every writer: the manifest is written last
//! (create-only, fsynced), the folder fsynced, renamed into place without ever replacing an
//! existing path (`renameat2(RENAME_NOREPLACE)`), and the parent fsynced. Staging folders are
//! hidden siblings of their destination (`.<name>.zrecord-tmp-<pid>-<n>`, [`staging_name`]);
//! [`leftovers`] finds the ones killed writers left (`zrec gc`).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// A fresh hidden staging folder name for destination file name `name`:
/// `.<name>.zrecord-tmp-<pid>-<n>` (what [`leftovers`] recognises).
pub fn staging_name(name: &str) -> String {
    static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(".{name}.zrecord-tmp-{}-{}", std::process::id(), TMP_COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Publish the local folder `tmp` (every file in it already fsynced) as `dest`: write
/// `manifest` as `manifest_name` (create-only, fsynced), fsync the folder, rename it into place
/// without replacing anything, fsync the parent. Also what a multi-part COPY commits with.
pub fn publish_folder(tmp: &Path, dest: &Path, manifest_name: &str, manifest: &[u8]) -> Result<()> {
    let mpath = tmp.join(manifest_name);
    {
        let mut f = File::create_new(&mpath).map_err(|e| Error::io(&mpath, e))?;
        f.write_all(manifest).map_err(|e| Error::io(&mpath, e))?;
        f.sync_all().map_err(|e| Error::io(&mpath, e))?;
    }
    sync_dir(tmp)?;
    if let Err(e) = rename_noreplace(tmp, dest) {
        // Not published: the manifest must not stay behind in a folder that could be renamed
        // into place by hand.
        let _ = fs::remove_file(&mpath);
        return Err(e);
    }
    sync_dir(&parent_of(dest))?;
    Ok(())
}

/// An unpublished staging folder left by a writer that did not finish (killed, crashed, or
/// out of disk before its cleanup ran). It never opens as a store: it has no manifest, or is
/// hidden under a name no reader looks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftover {
    /// The staging folder.
    pub path: PathBuf,
    /// The destination it was being written for.
    pub dest: PathBuf,
    /// The writer's process id, from the folder name.
    pub pid: u32,
    /// Whether that process still runs on this machine (then the write may be in progress).
    pub writer_alive: bool,
    /// Bytes of the files inside.
    pub bytes: u64,
}

/// Staging folders directly inside `dir` (the parent folder of stores being written).
pub fn leftovers(dir: impl AsRef<Path>) -> Result<Vec<Leftover>> {
    let dir = dir.as_ref();
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((dest, pid)) = parse_staging_name(&name) else { continue };
        if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            continue;
        }
        let path = e.path();
        out.push(Leftover { dest: dir.join(dest), pid, writer_alive: process_alive(pid), bytes: folder_bytes(&path), path });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Remove leftovers in `dir` whose writer is gone (all of them with `include_live`, for
/// folders written from other machines of a shared filesystem). Returns what was removed.
pub fn remove_leftovers(dir: impl AsRef<Path>, include_live: bool) -> Result<Vec<Leftover>> {
    let mut removed = Vec::new();
    for l in leftovers(dir)? {
        if l.writer_alive && !include_live {
            continue;
        }
        fs::remove_dir_all(&l.path).map_err(|e| Error::io(&l.path, e))?;
        removed.push(l);
    }
    Ok(removed)
}

/// `.<name>.zrecord-tmp-<pid>-<n>` -> (name, pid).
fn parse_staging_name(name: &str) -> Option<(String, u32)> {
    let rest = name.strip_prefix('.')?;
    let at = rest.rfind(".zrecord-tmp-")?;
    let (dest, tail) = (&rest[..at], &rest[at + ".zrecord-tmp-".len()..]);
    let (pid, n) = tail.split_once('-')?;
    n.parse::<u64>().ok()?;
    if dest.is_empty() {
        return None;
    }
    Some((dest.to_string(), pid.parse().ok()?))
}

fn process_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    // SAFETY: kill with signal 0 only checks whether the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn folder_bytes(p: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(p) else { return 0 };
    rd.filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => folder_bytes(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

pub(crate) fn parent_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// fsync a folder (makes renames and new entries in it durable).
pub(crate) fn sync_dir(p: &Path) -> Result<()> {
    let f = File::open(p).map_err(|e| Error::io(p, e))?;
    f.sync_all().map_err(|e| Error::io(p, e))
}

/// Rename `from` to `to`, failing if `to` exists (never replaces a published store).
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let a = CString::new(from.as_os_str().as_bytes()).map_err(|_| Error::invalid("path", "contains NUL"))?;
        let b = CString::new(to.as_os_str().as_bytes()).map_err(|_| Error::invalid("path", "contains NUL"))?;
        // SAFETY: both arguments are valid NUL-terminated paths that outlive the call.
        let rc = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_NOREPLACE) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EEXIST) | Some(libc::ENOTEMPTY) => Err(Error::AlreadyExists { path: to.to_path_buf() }),
            // Filesystems without RENAME_NOREPLACE: fall back to check-then-rename.
            Some(libc::EINVAL) | Some(libc::ENOSYS) => fallback_rename(from, to),
            _ => Err(Error::io(to, err)),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        fallback_rename(from, to)
    }
}

fn fallback_rename(from: &Path, to: &Path) -> Result<()> {
    if fs::symlink_metadata(to).is_ok() {
        return Err(Error::AlreadyExists { path: to.to_path_buf() });
    }
    fs::rename(from, to).map_err(|e| Error::io(to, e))
}

#[cfg(test)]
mod tests {

    #[test]
    fn leftovers_are_found_and_only_dead_writers_removed() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let dead = dir.path().join(".old.zrecord-tmp-999999999-3");
        let live = dir.path().join(format!(".cur.zrecord-tmp-{me}-0"));
        for p in [&dead, &live] {
            fs::create_dir_all(p.join("inner")).unwrap();
            fs::write(p.join("inner/data-000.bin"), [0u8; 100]).unwrap();
        }
        fs::create_dir(dir.path().join("store")).unwrap();
        fs::write(dir.path().join(".not.zrecord-tmp-x"), b"").unwrap();
        let found = leftovers(dir.path()).unwrap();
        assert_eq!(found.len(), 2);
        let d = found.iter().find(|l| l.path == dead).unwrap();
        assert_eq!((d.pid, d.writer_alive, d.bytes, d.dest.clone()), (999999999, false, 100, dir.path().join("old")));
        assert!(found.iter().find(|l| l.path == live).unwrap().writer_alive);
        let removed = remove_leftovers(dir.path(), false).unwrap();
        assert_eq!(removed.len(), 1);
        assert!(!dead.exists() && live.exists() && dir.path().join("store").exists());
        assert_eq!(remove_leftovers(dir.path(), true).unwrap().len(), 1);
        assert!(!live.exists());
        assert_eq!(parse_staging_name(".a.b.zrecord-tmp-12-7"), Some(("a.b".into(), 12)));
        assert_eq!(parse_staging_name(".zrecord-tmp-12-7"), None);
    }

    use super::*;
}
