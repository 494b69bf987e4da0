//! Dataset roots: aligned named streams (one record source each) under one folder.
//!
//! A root written by `COPY ... STORED AS ZRECORD` (or `DatasetWriter`) holds one store per
//! column plus `dataset.json` (stream names, their folders, and what a uint8 ragged stream means:
//! tensor, utf8 or binary), and is published by one atomic rename once every stream is complete.
//! Streams are `Arc<dyn RecordSource>`: a dataset can also be assembled from any sources
//! ([`Dataset::from_streams`]) and is then scanned, loaded and queried like one read from disk.
//! A folder without `dataset.json` whose sub-folders are stores is accepted too (streams sorted
//! by folder name), so stores written separately can be queried together.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::io::Location;
use crate::store::concat::ConcatSource;
use crate::store::source::with_logical;
use crate::store::{format, Layout, Logical, RecordSource, Store};

/// The file naming a dataset root's streams.
pub const DATASET_FILE: &str = "dataset.json";
/// `format` of `dataset.json`.
pub const DATASET_FORMAT: &str = "zrecord-dataset";
/// `version` of `dataset.json` (a root of one part: its streams are stores directly below it).
pub const DATASET_VERSION: u32 = 1;
/// `version` of a multi-part root's `dataset.json`: its `parts` are roots of their own, read
/// one after another (ids global); readers of version 1 refuse it rather than misread it.
pub const DATASET_VERSION_PARTS: u32 = 2;

/// `dataset.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DatasetManifest {
    /// Always `zrecord-dataset`.
    pub format: String,
    /// Dataset manifest version.
    pub version: u32,
    /// Records per stream.
    pub record_count: u64,
    /// The streams, in column order.
    pub streams: Vec<StreamEntry>,
    /// Free-form description of where the data came from (conversion source, Hugging Face
    /// features and class-label names, ...). Absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    /// Multi-part roots (version 2): the parts in id order, each a dataset root (folder
    /// relative to this one) holding every stream at the `path` its entry here names. Empty for
    /// a root of one part.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartEntry>,
}

/// One part of a multi-part root.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PartEntry {
    /// Folder of the part (a dataset root), relative to the root.
    pub path: String,
    /// Records in the part.
    pub record_count: u64,
}

impl DatasetManifest {
    /// A manifest of the current version.
    pub fn new(record_count: u64, streams: Vec<StreamEntry>) -> DatasetManifest {
        DatasetManifest { format: DATASET_FORMAT.into(), version: DATASET_VERSION, record_count, streams, metadata: None, parts: Vec::new() }
    }

    /// The manifest of a multi-part root: `streams` as every part holds them, `parts` in id
    /// order.
    pub fn with_parts(streams: Vec<StreamEntry>, parts: Vec<PartEntry>) -> DatasetManifest {
        let record_count = parts.iter().map(|p| p.record_count).sum();
        DatasetManifest { format: DATASET_FORMAT.into(), version: DATASET_VERSION_PARTS, record_count, streams, metadata: None, parts }
    }

    /// The JSON bytes written to `dataset.json`.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(self).map_err(|e| Error::invalid("dataset", e.to_string()))
    }
}

/// One stream of `dataset.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamEntry {
    /// Column name.
    pub name: String,
    /// Folder of its store, relative to the root.
    pub path: String,
    /// What the records mean (also in the store's own manifest from format version 2).
    #[serde(default)]
    pub logical: Logical,
}

/// One named stream of a dataset.
#[derive(Clone, Debug)]
pub struct Stream {
    /// Column name.
    pub name: String,
    /// Where its records come from (its `logical()` says what they mean to Arrow).
    pub source: Arc<dyn RecordSource>,
}

impl Stream {
    /// A stream over `source`.
    pub fn new(name: impl Into<String>, source: Arc<dyn RecordSource>) -> Stream {
        Stream { name: name.into(), source }
    }

    /// What the records mean to Arrow.
    pub fn logical(&self) -> Logical {
        self.source.logical()
    }

    /// A stream over an opened store.
    pub fn of_store(name: impl Into<String>, store: &Store) -> Stream {
        Stream::new(name, store.source())
    }

    /// Record shape.
    pub fn layout(&self) -> Layout {
        self.source.layout()
    }

    /// The local store behind the stream, if any.
    pub fn store(&self) -> Option<Store> {
        self.source.store()
    }
}

/// `stream` (a folder named by a dataset root) after resolving symlinks, refused unless it
/// still lies inside `root`: a symlinked stream must not make a root serve files from
/// elsewhere (a root is often unpacked from an archive someone else made).
fn inside_root(root: &Path, stream: &Path, name: &str) -> Result<PathBuf> {
    let real_root = fs::canonicalize(root).map_err(|e| Error::io(root, e))?;
    let real = match fs::canonicalize(stream) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::NotFound { path: stream.to_path_buf(), reason: format!("stream '{name}' listed in dataset.json is missing") })
        }
        Err(e) => return Err(Error::io(stream, e)),
    };
    if real == real_root || !real.starts_with(&real_root) {
        return Err(Error::corrupt(
            root.join(DATASET_FILE),
            format!("stream '{name}' resolves to {} (through a symlink), outside the dataset root {}", real.display(), real_root.display()),
        ));
    }
    Ok(real)
}

/// Aligned streams with one record count.
#[derive(Clone, Debug)]
pub struct Dataset {
    path: PathBuf,
    streams: Vec<Stream>,
    len: u64,
    metadata: Option<serde_json::Value>,
    parts: Vec<PartEntry>,
    /// Opened from `path` (which opens it again elsewhere), not assembled from sources.
    opened: bool,
}

/// The column name of a single store: its folder name without extension.
fn store_column_name(path: &Path) -> String {
    path.file_stem().or_else(|| path.file_name()).map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "data".into())
}

/// The name of a lone store opened on its own: the stream's name when the store is a stream
/// folder of a dataset root (`root/000-t` is `t`, as in the root's `dataset.json`), so a stream
/// has one name whether its root or the stream alone is opened; else its folder name. Python
/// views name their `to_arrow` column this way too.
pub fn stream_name_of(path: &Path) -> String {
    let named = || -> Option<String> {
        let folder = path.file_name()?.to_str()?;
        let root = path.parent()?;
        let text = crate::io::LocalFolder::new(root, Default::default()).read_small(DATASET_FILE, 16 << 20).ok()??;
        let m: DatasetManifest = serde_json::from_slice(&text).ok()?;
        m.streams.into_iter().find(|e| e.path.trim_end_matches('/') == folder).map(|e| e.name)
    };
    named().unwrap_or_else(|| store_column_name(path))
}

/// A stream described ([`Dataset::stream_infos`]).
#[derive(Clone, Debug)]
pub struct StreamInfo {
    /// The stream's name.
    pub name: String,
    /// Its source: name, length, record type.
    pub source: crate::store::SourceInfo,
    /// The store's codec (`None` for sources that are not stores).
    pub codec: Option<crate::store::Codec>,
    /// Sizes (zeros for sources that are not stores).
    pub stats: crate::store::StoreStats,
    /// Where it is (a multi-part root says how many parts).
    pub path: String,
}

impl Dataset {
    /// Open a store (one stream named after its folder, extension dropped) or a dataset root.
    pub fn open(path: impl AsRef<Path>) -> Result<Dataset> {
        let mut d = Dataset::open_at(path.as_ref())?;
        d.opened = true;
        Ok(d)
    }

    /// Whether `path` (a folder or an object-store URL) is a single store rather than a dataset
    /// root: the same test [`Dataset::open`] makes first, through the same access paths.
    pub fn is_store(path: impl AsRef<Path>) -> Result<bool> {
        crate::store::is_store(path.as_ref())
    }

    fn open_at(path: &Path) -> Result<Dataset> {
        let local = match crate::io::Uri::parse_path(path)? {
            crate::io::Uri::File(p) => p,
            #[cfg(feature = "remote")]
            crate::io::Uri::Remote(r) => return Dataset::open_remote(path, crate::io::resolve(r.url(), crate::io::ReadMode::Mmap)?),
        };
        let path = local.as_path();
        if path.join(format::MANIFEST).exists() {
            return Dataset::single(path);
        }
        let meta = path.join(DATASET_FILE);
        if meta.exists() {
            // Bounded, regular files only (a FIFO named dataset.json must not hang open).
            let text = crate::io::LocalFolder::new(path, Default::default())
                .read_small(DATASET_FILE, 16 << 20)?
                .ok_or_else(|| Error::NotFound { path: path.to_path_buf(), reason: "dataset.json vanished while opening".into() })?;
            return Dataset::described(path, &text, |name, rel| Store::open(inside_root(path, &path.join(rel), name)?));
        }
        let streams = if path.is_dir() {
            let dirs: Vec<PathBuf> = crate::io::list_dir(path)?.into_iter().map(|e| e.path).filter(|p| p.join(format::MANIFEST).exists()).collect();
            let mut streams = Vec::with_capacity(dirs.len());
            for d in dirs {
                let store = Store::open(inside_root(path, &d, &store_column_name(&d))?)?;
                streams.push(Stream::of_store(store_column_name(&d), &store));
            }
            streams
        } else {
            return Err(Error::NotFound { path: path.to_path_buf(), reason: "no manifest.json or dataset.json (and not a folder)".into() });
        };
        Dataset::found(path, streams)
    }

    /// One store as a one-stream dataset.
    fn single(path: &Path) -> Result<Dataset> {
        let store = Store::open(path)?;
        let len = store.len();
        let stream = Stream::of_store(stream_name_of(path), &store);
        Ok(Dataset { path: path.to_path_buf(), streams: vec![stream], len, metadata: None, parts: Vec::new(), opened: false })
    }

    fn found(path: &Path, streams: Vec<Stream>) -> Result<Dataset> {
        if streams.is_empty() {
            return Err(Error::NotFound { path: path.to_path_buf(), reason: "neither a store nor a dataset root (no streams found)".into() });
        }
        Dataset::from_streams(path.to_path_buf(), streams)
    }

    /// A store or dataset root on an object store: `manifest.json` (a store),
    /// `dataset.json` (a root), else the sub-folders that hold a store.
    #[cfg(feature = "remote")]
    fn open_remote(path: &Path, remote: Arc<dyn crate::io::Location>) -> Result<Dataset> {
        let url = remote.path().to_str().unwrap_or_default().to_string();
        let url = url.as_str();
        if remote.exists(format::MANIFEST)? {
            return Dataset::single(Path::new(url));
        }
        if let Some(text) = remote.read_small(DATASET_FILE, 16 << 20)? {
            return Dataset::described(Path::new(url), &text, |_, rel| Store::open(format!("{url}/{}", rel.trim_matches('/'))));
        }
        let mut streams = Vec::new();
        for d in remote.list_dirs()? {
            if remote.child(&d)?.exists(format::MANIFEST)? {
                let store = Store::open(format!("{url}/{d}"))?;
                streams.push(Stream::of_store(d, &store));
            }
        }
        if streams.is_empty() {
            return Err(Error::NotFound { path: path.to_path_buf(), reason: "no manifest.json, no dataset.json and no stores below this URL".into() });
        }
        Dataset::found(path, streams)
    }

    /// A root described by `dataset.json` (`text`); `open(name, relative path)` opens a stream's store.
    fn described(path: &Path, text: &[u8], open: impl Fn(&str, &str) -> Result<Store> + Sync) -> Result<Dataset> {
        let meta = path.join(DATASET_FILE);
        let m: DatasetManifest = serde_json::from_slice(text).map_err(|e| Error::corrupt(&meta, format!("dataset JSON: {e}")))?;
        if m.format != DATASET_FORMAT {
            return Err(Error::corrupt(&meta, format!("format is '{}', not '{DATASET_FORMAT}'", m.format)));
        }
        match (m.version, m.parts.is_empty()) {
            (DATASET_VERSION, true) | (DATASET_VERSION_PARTS, false) => {}
            (DATASET_VERSION, false) => return Err(Error::corrupt(&meta, "a version-1 dataset lists parts")),
            (DATASET_VERSION_PARTS, true) => return Err(Error::corrupt(&meta, "a version-2 (multi-part) dataset lists no parts")),
            (v, _) => return Err(Error::UnsupportedVersion { path: meta, found: v, supported: DATASET_VERSION_PARTS }),
        }
        let leaves = |p: &str| p.is_empty() || p.contains("..") || p.starts_with('/') || p.contains("://");
        // A path no file system or object store can name: NUL and other control characters.
        let unnameable = |p: &str| p.chars().find(|c| c.is_control()).map(|c| if c == '\0' { "a NUL byte".to_string() } else { format!("the control character {:?}", c) });
        for e in &m.streams {
            if let Some(what) = unnameable(&e.path) {
                return Err(Error::corrupt(&meta, format!("stream '{}': field 'path' ({:?}) contains {what}", e.name.escape_debug(), e.path)));
            }
            if leaves(&e.path) {
                return Err(Error::corrupt(&meta, format!("stream '{}' path '{}' leaves the root", e.name, e.path)));
            }
        }
        for p in &m.parts {
            if let Some(what) = unnameable(&p.path) {
                return Err(Error::corrupt(&meta, format!("part: field 'path' ({:?}) contains {what}", p.path)));
            }
            if leaves(&p.path) {
                return Err(Error::corrupt(&meta, format!("part path '{}' leaves the root", p.path)));
            }
        }
        let total: Option<u64> = m.parts.iter().try_fold(0u64, |a, p| a.checked_add(p.record_count));
        if !m.parts.is_empty() && total != Some(m.record_count) {
            return Err(Error::corrupt(&meta, format!("parts hold {total:?} records, record_count says {}", m.record_count)));
        }
        // One store per (part, stream); a root of one part is its own single part.
        let prefixes: Vec<String> = if m.parts.is_empty() { vec![String::new()] } else { m.parts.iter().map(|p| format!("{}/", p.path.trim_end_matches('/'))).collect() };
        let jobs: Vec<(&StreamEntry, String)> = prefixes.iter().flat_map(|pre| m.streams.iter().map(move |e| (e, format!("{pre}{}", e.path)))).collect();
        // On an object store the stream stores open in parallel (each open waits for a few
        // round trips), on threads of their own: a rayon pool would hang in a forked child,
        // where its threads do not exist. The first error in stream order wins.
        let stores: Vec<Result<Store>> = if crate::io::is_url(path) && jobs.len() > 1 {
            std::thread::scope(|scope| {
                let open = &open;
                let handles: Vec<_> = jobs.iter().map(|(e, rel)| scope.spawn(move || open(&e.name, rel))).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err(Error::invalid("dataset", "opening a stream panicked"))))
                    .collect()
            })
        } else {
            jobs.iter().map(|(e, rel)| open(&e.name, rel)).collect()
        };
        let mut sources: Vec<Vec<Arc<dyn RecordSource>>> = (0..m.streams.len()).map(|_| Vec::new()).collect();
        for (k, ((e, _), store)) in jobs.iter().zip(stores).enumerate() {
            let store = store?;
            // Version-1 stores know no logical type: dataset.json says it. A version-2
            // store records its own, which must agree.
            let logical = match (e.logical, store.logical()) {
                (l, Logical::Tensor) | (Logical::Tensor, l) => l,
                (a, b) if a == b => a,
                (a, b) => return Err(Error::corrupt(&meta, format!("stream '{}' is marked {a} but its store says {b}", e.name))),
            };
            if let Some(part) = m.parts.get(k / m.streams.len().max(1)) {
                if store.len() != part.record_count {
                    return Err(Error::corrupt(&meta, format!("stream '{}' of part '{}' has {} records, the part {}", e.name, part.path, store.len(), part.record_count)));
                }
            }
            let source = with_logical(store.source(), logical).map_err(|_| {
                Error::corrupt(&meta, format!("stream '{}' is marked {} but is not a uint8 ndim-1 ragged store", e.name, logical.name()))
            })?;
            sources[k % m.streams.len().max(1)].push(source);
        }
        let mut streams = Vec::with_capacity(m.streams.len());
        for (e, mut parts) in m.streams.into_iter().zip(sources) {
            let source: Arc<dyn RecordSource> = if parts.len() == 1 {
                parts.remove(0)
            } else {
                Arc::new(ConcatSource::new(format!("{}/{}", path.display(), e.name), parts).map_err(|err| Error::corrupt(&meta, err.to_string()))?)
            };
            streams.push(Stream::new(e.name, source));
        }
        let mut d = Dataset::found(path, streams)?;
        d.metadata = m.metadata;
        d.parts = m.parts;
        Ok(d)
    }

    /// Streams given directly (names must be unique; record counts must agree).
    pub fn from_streams(path: PathBuf, streams: Vec<Stream>) -> Result<Dataset> {
        let len = streams.first().map(|s| s.source.len()).unwrap_or(0);
        for (i, s) in streams.iter().enumerate() {
            if s.name == "_id" || s.name == "_step" {
                return Err(Error::invalid("stream", format!("stream name '{}' is reserved", s.name)));
            }
            if streams[..i].iter().any(|o| o.name == s.name) {
                return Err(Error::invalid("stream", format!("stream name '{}' appears twice", s.name)));
            }
            if s.source.len() != len {
                return Err(Error::invalid(
                    "dataset",
                    format!("streams are not aligned: '{}' has {} records but '{}' has {len}", s.name, s.source.len(), streams[0].name),
                ));
            }
            if s.logical().is_bytes() && !(s.source.dtype() == crate::DType::UInt8 && s.source.layout() == (Layout::Ragged { ndim: 1 })) {
                return Err(Error::invalid("stream", format!("stream '{}' is {} but its records are not uint8 ndim-1 ragged", s.name, s.logical())));
            }
        }
        Ok(Dataset { path, streams, len, metadata: None, parts: Vec::new(), opened: false })
    }

    /// Where it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The streams, in column order.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }

    /// Records per stream.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// `dataset.json`'s `metadata` (conversion source, Hugging Face features, class names).
    pub fn metadata(&self) -> Option<&serde_json::Value> {
        self.metadata.as_ref()
    }

    /// True when there are no records.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the dataset was opened from [`Dataset::path`] (so another process can open the
    /// same records there), false when assembled from sources.
    pub fn is_opened(&self) -> bool {
        self.opened
    }

    /// The parts of a multi-part root, in id order (empty for a root of one part).
    pub fn parts(&self) -> &[PartEntry] {
        &self.parts
    }

    /// Every stream described: its record type, codec and sizes (a multi-part root's streams
    /// summed over their parts). What `zrec info` prints and SQL's `zrecord_info()` returns.
    pub fn stream_infos(&self) -> Result<Vec<StreamInfo>> {
        let mut parts: Vec<Dataset> = Vec::new();
        for p in &self.parts {
            parts.push(Dataset::open(self.path.join(&p.path))?);
        }
        let mut out = Vec::with_capacity(self.streams.len());
        for (k, s) in self.streams.iter().enumerate() {
            let part_stores: Vec<Store> = parts.iter().filter_map(|d| d.streams().get(k).and_then(|p| p.store())).collect();
            let store = s.store().or_else(|| part_stores.first().cloned());
            let summed = (!part_stores.is_empty()).then(|| {
                let mut st = part_stores[0].stats();
                for x in &part_stores[1..] {
                    let o = x.stats();
                    st.record_count += o.record_count;
                    st.raw_bytes += o.raw_bytes;
                    st.stored_bytes += o.stored_bytes;
                    st.file_bytes += o.file_bytes;
                    st.data_shards += o.data_shards;
                }
                st
            });
            // Sources that are not local stores have no file statistics: zeros, no codec.
            let stats = summed.or_else(|| store.as_ref().map(|x| x.stats())).unwrap_or(crate::store::StoreStats {
                record_count: s.source.len(),
                raw_bytes: 0,
                stored_bytes: 0,
                file_bytes: 0,
                data_shards: 0,
                level: 0,
            });
            let path = if parts.is_empty() {
                store.as_ref().map(|x| x.path().display().to_string()).unwrap_or_else(|| s.source.name())
            } else {
                format!("{} ({} parts)", s.source.name(), parts.len())
            };
            out.push(StreamInfo { name: s.name.clone(), source: s.source.info(), codec: store.map(|x| x.codec()), stats, path });
        }
        Ok(out)
    }
}

