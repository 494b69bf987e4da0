//! Staging and atomic publish, shared by every writer (stores, dataset roots, and the remote and
//! distributed writers to come).
//!
//! A writer builds its output in a hidden sibling folder of the destination
//! (`.<name>.zrecord-tmp-<pid>-<n>`), fsyncs every file it writes, and calls
//! [`Staging::publish`], which writes the manifest last (create-only, fsynced), fsyncs the folder,
//! renames it into place without ever replacing an existing path (`renameat2(RENAME_NOREPLACE)`),
//! and fsyncs the parent. A dropped [`Staging`] removes its folder; a killed process leaves only a
//! hidden folder without a manifest, which never opens.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A hidden staging folder that becomes `dest` on [`Staging::publish`] and disappears when
/// dropped unpublished.
#[derive(Debug)]
pub struct Staging {
    dest: PathBuf,
    tmp: PathBuf,
    published: bool,
}

impl Staging {
    /// Create the staging folder for `dest`, which must not exist (its parent is created).
    pub fn create(dest: impl AsRef<Path>) -> Result<Staging> {
        let dest = dest.as_ref().to_path_buf();
        if fs::symlink_metadata(&dest).is_ok() {
            return Err(Error::AlreadyExists { path: dest });
        }
        let name = dest
            .file_name()
            .ok_or_else(|| Error::invalid("path", format!("'{}' has no final component", dest.display())))?
            .to_string_lossy()
            .into_owned();
        let parent = parent_of(&dest);
        fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
        let tmp = parent.join(format!(".{name}.zrecord-tmp-{}-{}", std::process::id(), TMP_COUNTER.fetch_add(1, Ordering::Relaxed)));
        fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        Ok(Staging { dest, tmp, published: false })
    }

    /// The staging folder: write the output's files here.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Where the output is published.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Write `manifest` as `manifest_name` (last, create-only, fsynced), fsync the folder, rename
    /// it to the destination without replacing anything, fsync the parent. Every other file
    /// must already be fsynced by its writer.
    pub fn publish(mut self, manifest_name: &str, manifest: &[u8]) -> Result<PathBuf> {
        let mpath = self.tmp.join(manifest_name);
        {
            let mut f = File::create_new(&mpath).map_err(|e| Error::io(&mpath, e))?;
            f.write_all(manifest).map_err(|e| Error::io(&mpath, e))?;
            f.sync_all().map_err(|e| Error::io(&mpath, e))?;
        }
        sync_dir(&self.tmp)?;
        rename_noreplace(&self.tmp, &self.dest)?;
        self.published = true;
        sync_dir(&parent_of(&self.dest))?;
        Ok(self.dest.clone())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

fn parent_of(p: &Path) -> PathBuf {
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
    use super::*;

    #[test]
    fn publish_is_atomic_and_never_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("sub").join("out");
        let s = Staging::create(&dest).unwrap();
        fs::write(s.path().join("data"), b"x").unwrap();
        assert!(!dest.exists());
        let tmp = s.path().to_path_buf();
        assert_eq!(s.publish("manifest.json", b"{}").unwrap(), dest);
        assert!(!tmp.exists());
        assert_eq!(fs::read(dest.join("manifest.json")).unwrap(), b"{}");
        assert!(matches!(Staging::create(&dest), Err(Error::AlreadyExists { .. })));
        // A dropped staging folder leaves nothing behind.
        let other = dir.path().join("other");
        let s = Staging::create(&other).unwrap();
        let tmp = s.path().to_path_buf();
        drop(s);
        assert!(!tmp.exists() && !other.exists());
        // Someone else publishing first wins; the late writer gets AlreadyExists, not a merge.
        let race = dir.path().join("race");
        let a = Staging::create(&race).unwrap();
        let b = Staging::create(&race).unwrap();
        a.publish("m", b"a").unwrap();
        assert!(matches!(b.publish("m", b"b"), Err(Error::AlreadyExists { .. })));
        assert_eq!(fs::read(race.join("m")).unwrap(), b"a");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2, "sub and race only: no hidden folder left");
    }
}
