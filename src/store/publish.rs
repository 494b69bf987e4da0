//! Staging and publish for every writer (stores, dataset roots, partitioned COPY): a writer
//! builds its output in a hidden staging folder, fsyncs every file it writes, and calls
//! [`Staging::publish`], which publishes through [`crate::io::publish`] (local: manifest last,
//! no-replace rename) or, for a URL destination, uploads through [`crate::io::object`] (data
//! files under a fresh `data_dir`, the manifest naming it last with a create-only put). A
//! dropped [`Staging`] removes its folder; a crashed writer leaves only what [`crate::io::publish::leftovers`]
//! (local) or [`remote_leftovers`] (object stores) find (`zrec gc`).

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::io::publish::{parent_of, publish_folder, staging_name};
#[cfg(feature = "remote")]
use crate::io::object::Remote;
#[cfg(feature = "remote")]
use crate::store::format;

/// A hidden staging folder that becomes `dest` on [`Staging::publish`] and disappears when
/// dropped unpublished.
#[derive(Debug)]
pub struct Staging {
    dest: PathBuf,
    tmp: PathBuf,
    published: bool,
    /// A destination on an object store: the staging folder is local (under the temp
    /// folder, or `ZRECORD_STAGING_DIR`) and publishing uploads it.
    #[cfg(feature = "remote")]
    remote: Option<Box<Remote>>,
}

impl Staging {
    /// Create the staging folder for `dest`, which must not exist (its parent is created).
    pub fn create(dest: impl AsRef<Path>) -> Result<Staging> {
        let dest = dest.as_ref();
        let dest = match crate::io::Uri::parse_path(dest)? {
            crate::io::Uri::File(p) => p,
            #[cfg(feature = "remote")]
            crate::io::Uri::Remote(r) => return Staging::create_remote(r),
        };
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
        let tmp = parent.join(staging_name(&name));
        fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        Ok(Staging { dest, tmp, published: false, #[cfg(feature = "remote")] remote: None })
    }

    /// Staging for a URL destination: a local folder, uploaded on publish. Fails early when a
    /// store or dataset is already published there (publishing checks again, create-only).
    #[cfg(feature = "remote")]
    fn create_remote(remote: Remote) -> Result<Staging> {
        let url = remote.url();
        for name in [format::MANIFEST, crate::store::dataset::DATASET_FILE] {
            if remote.exists(name)? {
                return Err(Error::AlreadyExists { path: PathBuf::from(&url) });
            }
        }
        let base = std::env::var_os("ZRECORD_STAGING_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        fs::create_dir_all(&base).map_err(|e| Error::io(&base, e))?;
        let tmp = base.join(staging_name("upload"));
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
        #[cfg(feature = "remote")]
        if let Some(remote) = self.remote.take() {
            // Uploaded, manifest last and create-only; the local folder goes when `self` drops.
            upload_published(&self.tmp, &remote, manifest_name, manifest)?;
            return Ok(self.dest.clone());
        }
        publish_folder(&self.tmp, &self.dest, manifest_name, manifest)?;
        self.published = true;
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

/// Publish the local staging folder `src` (a store: files + `manifest`) at `dest`: upload
/// its files below a fresh data folder, then put the manifest, naming that folder, create-only.
/// On any failure what was uploaded is deleted; the destination is never overwritten.
#[cfg(feature = "remote")]
pub(crate) fn upload_store(src: &Path, dest: &Remote, manifest: &[u8]) -> Result<()> {
    let mut m = format::Manifest::from_bytes(manifest, &src.join(format::MANIFEST))?;
    if dest.exists(format::MANIFEST)? {
        return Err(Error::AlreadyExists { path: PathBuf::from(dest.url()) });
    }
    let data_dir = fresh_data_dir();
    let files: Vec<PathBuf> = {
        crate::io::list_dir(src)?.into_iter().filter(|e| e.is_file && e.name != format::MANIFEST).map(|e| e.path).collect::<Vec<PathBuf>>()
    };
    let result = (|| -> Result<()> {
        // Files in parallel (each upload is itself concurrent above 8 MiB).
        use rayon::prelude::*;
        files.par_iter().try_for_each(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            dest.upload(p, &format!("{data_dir}/{name}"))
        })?;
        m.data_dir = Some(data_dir.clone());
        let bytes = m.to_bytes()?;
        dest.put_create(format::MANIFEST, bytes)
    })();
    if let Err(e) = result {
        // Leave nothing behind (best effort: `zrec gc` finds what a crash left).
        let _ = dest.delete_tree(&data_dir);
        return Err(e);
    }
    Ok(())
}

/// A data folder name no other writer picks: time, process and a counter.
#[cfg(feature = "remote")]
fn fresh_data_dir() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let mut seed = [0u8; 8];
    let _ = getrandom::fill(&mut seed);
    format!("upload-{t:x}-{:x}-{}-{:016x}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed), u64::from_le_bytes(seed))
}

/// Publish a local staging folder (a store, or a dataset root of stores + `dataset.json`) at
/// `dest`. Stores go first, each with its create-only manifest; the dataset file last.
#[cfg(feature = "remote")]
pub(crate) fn upload_published(src: &Path, dest: &Remote, manifest_name: &str, manifest: &[u8]) -> Result<()> {
    if manifest_name == format::MANIFEST {
        return upload_store(src, dest, manifest);
    }
    if dest.exists(manifest_name)? {
        return Err(Error::AlreadyExists { path: PathBuf::from(dest.url()) });
    }
    // A dataset root: every sub-folder holding a store is published as a store, then the
    // dataset file. On failure the streams published here are removed again.
    let subs: Vec<PathBuf> = crate::io::list_dir(src)?.into_iter().map(|e| e.path).filter(|p| p.join(format::MANIFEST).is_file()).collect();
    let mut done: Vec<Remote> = Vec::new();
    let result = (|| -> Result<()> {
        for s in &subs {
            let name = s.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let m = crate::io::read_bounded(&s.join(format::MANIFEST), format::MAX_MANIFEST_BYTES)?;
            let sub = dest.join(&name);
            upload_store(s, &sub, &m)?;
            done.push(sub);
        }
        dest.put_create(manifest_name, manifest.to_vec())
    })();
    if let Err(e) = result {
        for sub in done {
            let _ = sub.delete(format::MANIFEST);
            let _ = sub.delete_tree("");
        }
        return Err(e);
    }
    Ok(())
}

/// Data folders below the store at `dest` that its manifest does not name (left by writers
/// that crashed or lost a race): `(folder url, objects)`. With `remove`, delete them.
#[cfg(feature = "remote")]
pub fn remote_leftovers(dest: &Remote, remove: bool) -> Result<Vec<(String, u64)>> {
    let live: Option<String> = match dest.get_small(format::MANIFEST, 1 << 20)? {
        Some(b) => format::Manifest::from_bytes(&b, Path::new(&dest.url_of(format::MANIFEST)))?.data_dir,
        None => None,
    };
    let mut out = Vec::new();
    for d in dest.list_dirs()? {
        if !d.starts_with("upload-") || live.as_deref() == Some(d.as_str()) {
            continue;
        }
        let n = if remove { dest.delete_tree(&d)? } else { 0 };
        out.push((dest.url_of(&d), n));
    }
    Ok(out)
}


#[cfg(test)]
mod tests {
    use std::fs;

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
