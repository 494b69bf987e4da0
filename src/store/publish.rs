//! Staging and atomic publish, shared by every writer (stores, dataset roots, and the remote and
//! distributed writers to come).
//!
//! A writer builds its output in a hidden sibling folder of the destination
//! (`.<name>.zrecord-tmp-<pid>-<n>`), fsyncs every file it writes, and calls
//! [`Staging::publish`], which writes the manifest last (create-only, fsynced), fsyncs the folder,
//! renames it into place without ever replacing an existing path (`renameat2(RENAME_NOREPLACE)`),
//! and fsyncs the parent. A dropped [`Staging`] removes its folder; a killed process leaves only a
//! hidden staging folder, which opens only if the kill came after its manifest (then it is
//! complete) and is never the destination; [`leftovers`] finds such folders (`zrec gc`).

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
    /// A destination on an object store: the staging folder is local (under the temp
    /// folder, or `ZRECORD_STAGING_DIR`) and publishing uploads it (see `store::object`).
    remote: Option<Box<crate::store::object::Remote>>,
}

impl Staging {
    /// Create the staging folder for `dest`, which must not exist (its parent is created).
    pub fn create(dest: impl AsRef<Path>) -> Result<Staging> {
        let dest = dest.as_ref();
        if crate::store::object::is_url(dest) {
            return Staging::create_remote(dest);
        }
        let dest = crate::store::object::local_path(dest);
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
        Ok(Staging { dest, tmp, published: false, remote: None })
    }

    /// Staging for a URL destination: a local folder, uploaded on publish. Fails early when a
    /// store or dataset is already published there (publishing checks again, create-only).
    fn create_remote(dest: &Path) -> Result<Staging> {
        let url = dest.to_str().unwrap_or_default().trim_end_matches('/').to_string();
        let remote = crate::store::object::connect(&url)?;
        for name in [crate::store::format::MANIFEST, crate::store::dataset::DATASET_FILE] {
            if remote.exists(name)? {
                return Err(Error::AlreadyExists { path: PathBuf::from(&url) });
            }
        }
        let base = std::env::var_os("ZRECORD_STAGING_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        fs::create_dir_all(&base).map_err(|e| Error::io(&base, e))?;
        let tmp = base.join(format!(".upload.zrecord-tmp-{}-{}", std::process::id(), TMP_COUNTER.fetch_add(1, Ordering::Relaxed)));
        fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        Ok(Staging { dest: PathBuf::from(url), tmp, published: false, remote: Some(Box::new(remote)) })
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
        if let Some(remote) = self.remote.take() {
            // Uploaded, manifest last and create-only; the local folder goes when `self` drops.
            crate::store::object::upload_published(&self.tmp, &remote, manifest_name, manifest)?;
            return Ok(self.dest.clone());
        }
        publish_folder(&self.tmp, &self.dest, manifest_name, manifest)?;
        self.published = true;
        Ok(self.dest.clone())
    }
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
