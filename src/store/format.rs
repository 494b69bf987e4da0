//! The on-disk format, version 2 (readers also read version 1).
//!
//! A store is a folder:
//!
//! ```text
//! store/
//!   manifest.json      written last; {"checksum":"<xxh3 hex>","manifest":{...}}
//!   index.bin          64-byte header, then one 24-byte entry per record
//!   shapes.bin         ragged only: 64-byte header, then ndim little-endian u64 per record
//!   dictionary.zstd    zstd_dict only: the dictionary bytes
//!   data-000.bin ...   64-byte header, then encoded records back to back
//! ```
//!
//! All integers are little-endian. Index entry `i` (logical id `i`):
//!
//! | bytes  | field        | meaning                                               |
//! |--------|--------------|-------------------------------------------------------|
//! | 0..8   | `offset`     | byte offset of the stored record in its data shard   |
//! | 8..12  | `stored_len` | stored (encoded) size in bytes                        |
//! | 12..14 | `shard`      | data shard number                                     |
//! | 14..16 | reserved     | zero                                                  |
//! | 16..24 | `checksum`   | xxh3-64 of the stored bytes, seeded with [`record_seed`] |
//!
//! The seed binds a record's bytes to its id (and, for ragged, its shape), so a swapped or
//! misdirected index entry fails its checksum instead of returning another record.
//!
//! `manifest.json` names every file with its size and whole-file xxh3, so `open` detects
//! truncation and a damaged manifest (its checksum covers the exact bytes of the `manifest`
//! member) in O(1) time, and `verify` detects any flipped bit. Readers reject other versions.
//!
//! Version 2 adds two manifest fields (absent in version 1, where they read as their defaults):
//! `logical` (what the records mean: `tensor`, or for uint8 ndim-1 ragged stores `utf8` /
//! `binary`, so a store opened alone reads strings back as strings) and `allow_empty` (ragged
//! records may be empty: non-decreasing `cu_seqlens`, shapes with zero extents). Binary file
//! headers carry the version of the writer; the layout of index, shapes and data files is
//! unchanged.

use std::path::Path;

use serde::{Deserialize, Serialize};
use twox_hash::XxHash3_64;

use crate::error::{Error, Result};

/// The format version this build writes.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build reads.
pub const MIN_READ_VERSION: u32 = 1;
/// Manifest file name.
pub const MANIFEST: &str = "manifest.json";

/// Largest manifest read (a typed error beyond: manifests are small).
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;
/// Index file name.
pub const INDEX: &str = "index.bin";
/// Ragged shapes file name.
pub const SHAPES: &str = "shapes.bin";
/// Dictionary file name.
pub const DICTIONARY: &str = "dictionary.zstd";
/// Size of every binary file header.
pub const HEADER_BYTES: usize = 64;
/// Size of one index entry.
pub const ENTRY_BYTES: usize = 24;
/// Largest record, in decoded bytes (2 GiB).
pub const MAX_RECORD_BYTES: u64 = 2 << 30;

/// Magic of index files.
pub const INDEX_MAGIC: &[u8; 8] = b"ZRECIDX1";
/// Magic of shapes files.
pub const SHAPES_MAGIC: &[u8; 8] = b"ZRECSHP1";
/// Magic of data shard files.
pub const DATA_MAGIC: &[u8; 8] = b"ZRECDAT1";

/// Name of data shard `i`.
pub fn shard_name(i: usize) -> String {
    format!("data-{i:03}.bin")
}

/// A binary file header: magic, version, one u32 parameter and one u64 count.
pub fn header(magic: &[u8; 8], param: u32, count: u64) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(magic);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&param.to_le_bytes());
    h[16..24].copy_from_slice(&count.to_le_bytes());
    h
}

/// Check a header; returns `(param, count)`.
pub fn read_header(bytes: &[u8], magic: &[u8; 8], path: &Path) -> Result<(u32, u64)> {
    if bytes.len() < HEADER_BYTES {
        return Err(Error::corrupt(path, format!("file is {} bytes, shorter than its {HEADER_BYTES}-byte header", bytes.len())));
    }
    if &bytes[..8] != magic {
        return Err(Error::corrupt(path, format!("bad magic {:?}, expected {:?}", &bytes[..8], std::str::from_utf8(magic).unwrap_or("?"))));
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if !(MIN_READ_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(Error::UnsupportedVersion { path: path.to_path_buf(), found: version, supported: FORMAT_VERSION });
    }
    let param = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    let mut c = [0u8; 8];
    c.copy_from_slice(&bytes[16..24]);
    Ok((param, u64::from_le_bytes(c)))
}

/// One decoded index entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset in the shard file.
    pub offset: u64,
    /// Stored size.
    pub stored_len: u32,
    /// Shard number.
    pub shard: u16,
    /// Seeded xxh3 of the stored bytes.
    pub checksum: u64,
}

impl IndexEntry {
    /// Encode to the 24-byte on-disk form.
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.stored_len.to_le_bytes());
        b[12..14].copy_from_slice(&self.shard.to_le_bytes());
        b[16..24].copy_from_slice(&self.checksum.to_le_bytes());
        b
    }

    /// Decode from (at least) 24 bytes.
    #[inline]
    pub fn decode(b: &[u8]) -> IndexEntry {
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        IndexEntry {
            offset: u64_at(0),
            stored_len: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            shard: u16::from_le_bytes([b[12], b[13]]),
            checksum: u64_at(16),
        }
    }
}

/// The key a zstd_dict store mixes into every record's checksum seed: xxh3-64 of the
/// dictionary bytes (0 when there is no dictionary).
pub fn dictionary_key(dictionary: Option<&[u8]>) -> u64 {
    dictionary.map(|d| XxHash3_64::oneshot_with_seed(0x5A52_4443_5444_4943, d) | 1).unwrap_or(0)
}

/// The checksum seed of record `id` (ragged records also bind their shape row).
#[inline]
pub fn record_seed(id: u64, shape: Option<&[u64]>) -> u64 {
    let base = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5A52_4543_4F52_4431;
    match shape {
        None => base,
        Some(s) => {
            let mut h = base;
            for &d in s {
                h = (h ^ d).wrapping_mul(0x1000_0000_01B3).rotate_left(29);
            }
            h
        }
    }
}

/// Store layout kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// One fixed item shape.
    Dense,
    /// Variable shapes of one ndim.
    Ragged,
}

impl Kind {
    /// `"dense"` / `"ragged"`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Dense => "dense",
            Kind::Ragged => "ragged",
        }
    }
}

/// What the records of a store mean: tensors, or (uint8 ndim-1 ragged stores only) UTF-8
/// strings or opaque bytes. Recorded in the manifest from version 2; extensible.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Logical {
    /// Plain tensors (the default).
    #[default]
    Tensor,
    /// UTF-8 strings: read back as Arrow `Utf8View`.
    Utf8,
    /// Opaque bytes: read back as Arrow `Binary`.
    Binary,
}

impl Logical {
    /// `tensor`, `utf8` or `binary`.
    pub fn name(self) -> &'static str {
        match self {
            Logical::Tensor => "tensor",
            Logical::Utf8 => "utf8",
            Logical::Binary => "binary",
        }
    }

    /// True for the byte-string types (stored as uint8 ndim-1 ragged records).
    pub fn is_bytes(self) -> bool {
        matches!(self, Logical::Utf8 | Logical::Binary)
    }
}

impl std::str::FromStr for Logical {
    type Err = Error;

    fn from_str(s: &str) -> Result<Logical> {
        match s {
            "tensor" => Ok(Logical::Tensor),
            "utf8" | "string" | "str" => Ok(Logical::Utf8),
            "binary" | "bytes" => Ok(Logical::Binary),
            other => Err(Error::invalid("logical", format!("'{other}' is not a logical type (tensor, utf8, binary)"))),
        }
    }
}

impl std::fmt::Display for Logical {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn is_tensor(l: &Logical) -> bool {
    *l == Logical::Tensor
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One file listed in the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name inside the store folder.
    pub name: String,
    /// Exact size in bytes.
    pub bytes: u64,
    /// xxh3-64 of the whole file, hex.
    pub xxh3: String,
}

/// The manifest: everything needed to open and check a store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `"zrecord"`.
    pub format: String,
    /// Format version.
    pub version: u32,
    /// Dense or ragged.
    pub kind: Kind,
    /// Catalog dtype name.
    pub dtype: String,
    /// Dense item shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_shape: Option<Vec<u64>>,
    /// Ragged ndim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ndim: Option<u32>,
    /// What the records mean (version 2; version 1 stores read as `tensor`).
    #[serde(default, skip_serializing_if = "is_tensor")]
    pub logical: Logical,
    /// Ragged records may be empty (version 2, writer opt-in).
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_empty: bool,
    /// zstd_dict: record checksums are seeded with the dictionary's xxh3 as well (see
    /// [`dictionary_key`]), so records checked against another dictionary fail instead of
    /// decoding to different bytes. Absent in stores written before this field existed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub checksums_bind_dictionary: bool,
    /// `"raw"`, `"zstd"` or `"zstd_dict"`.
    pub codec: String,
    /// zstd level (0 for raw).
    pub level: i32,
    /// Number of records.
    pub record_count: u64,
    /// Number of data shard files.
    pub data_shards: u32,
    /// Decoded bytes of all records.
    pub raw_bytes: u64,
    /// Stored bytes of all records (without headers).
    pub stored_bytes: u64,
    /// Every file of the store but the manifest.
    pub files: Vec<FileEntry>,
    /// The sub-folder holding the files, when they are not next to the manifest (stores
    /// published to object storage: each writer uploads below a fresh folder and the
    /// create-only manifest decides which one is the store; see `io::object`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<String>,
    /// Writer that made it.
    pub created_by: String,
}

const MANIFEST_PREFIX: &str = "{\"checksum\":\"";
const MANIFEST_MIDDLE: &str = "\",\"manifest\":";

impl Manifest {
    /// Serialise with its checksum wrapper.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let body = serde_json::to_string_pretty(self)
            .map_err(|e| Error::invalid("manifest", e.to_string()))?;
        let sum = XxHash3_64::oneshot(body.as_bytes());
        Ok(format!("{MANIFEST_PREFIX}{sum:016x}{MANIFEST_MIDDLE}{body}}}\n").into_bytes())
    }

    /// Parse and check the checksum and version.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Manifest> {
        let text = std::str::from_utf8(bytes).map_err(|_| Error::corrupt(path, "manifest is not UTF-8"))?;
        let text = text.strip_suffix('\n').ok_or_else(|| Error::corrupt(path, "manifest is cut short (no final newline)"))?;
        let rest = text.strip_prefix(MANIFEST_PREFIX).ok_or_else(|| Error::corrupt(path, "manifest does not start with its checksum"))?;
        if rest.len() < 16 || !rest.is_char_boundary(16) {
            return Err(Error::corrupt(path, "manifest checksum is cut short"));
        }
        let (hex, rest) = rest.split_at(16);
        if !hex.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
            return Err(Error::corrupt(path, "manifest checksum is not lowercase hex"));
        }
        let want = u64::from_str_radix(hex, 16).map_err(|_| Error::corrupt(path, "manifest checksum is not hex"))?;
        let body = rest
            .strip_prefix(MANIFEST_MIDDLE)
            .and_then(|b| b.strip_suffix('}'))
            .ok_or_else(|| Error::corrupt(path, "manifest wrapper is malformed"))?;
        if XxHash3_64::oneshot(body.as_bytes()) != want {
            return Err(Error::corrupt(path, "manifest checksum mismatch"));
        }
        let m: Manifest = serde_json::from_str(body).map_err(|e| Error::corrupt(path, format!("manifest JSON: {e}")))?;
        if m.format != "zrecord" {
            return Err(Error::corrupt(path, format!("format is '{}', not 'zrecord'", m.format)));
        }
        if !(MIN_READ_VERSION..=FORMAT_VERSION).contains(&m.version) {
            return Err(Error::UnsupportedVersion { path: path.to_path_buf(), found: m.version, supported: FORMAT_VERSION });
        }
        if m.version < 2 && (m.logical != Logical::Tensor || m.allow_empty) {
            return Err(Error::corrupt(path, format!("version {} manifest carries version-2 fields", m.version)));
        }
        if m.logical.is_bytes() && (m.kind != Kind::Ragged || m.dtype != "uint8" || m.ndim != Some(1)) {
            return Err(Error::corrupt(path, format!("logical type {} needs a uint8 ndim-1 ragged store", m.logical)));
        }
        if m.allow_empty && m.kind != Kind::Ragged {
            return Err(Error::corrupt(path, "allow_empty is only meaningful for ragged stores"));
        }
        if let Some(d) = &m.data_dir {
            let ok = !d.is_empty() && d != "." && d != ".." && d.len() <= 200 && d.bytes().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c));
            if !ok {
                return Err(Error::corrupt(path, format!("data_dir '{d}' is not a plain folder name")));
            }
        }
        Ok(m)
    }

    /// Where file `name` is stored, relative to the manifest's folder.
    pub fn stored_name(&self, name: &str) -> String {
        match &self.data_dir {
            Some(d) => format!("{d}/{name}"),
            None => name.to_string(),
        }
    }

    /// The listed entry for a file name.
    pub fn file(&self, name: &str) -> Option<&FileEntry> {
        self.files.iter().find(|f| f.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format: "zrecord".into(),
            version: FORMAT_VERSION,
            kind: Kind::Ragged,
            dtype: "int32".into(),
            item_shape: None,
            ndim: Some(1),
            logical: Logical::Tensor,
            allow_empty: false,
            checksums_bind_dictionary: false,
            codec: "zstd".into(),
            level: 3,
            record_count: 5,
            data_shards: 2,
            raw_bytes: 100,
            stored_bytes: 80,
            files: vec![FileEntry { name: INDEX.into(), bytes: 184, xxh3: "00ff".into() }],
            created_by: "test".into(),
            data_dir: None,
        }
    }

    #[test]
    fn manifest_round_trip_and_checksum() {
        let m = sample();
        let b = m.to_bytes().unwrap();
        let p = Path::new("m.json");
        assert_eq!(Manifest::from_bytes(&b, p).unwrap(), m);
        // Any single flipped bit in the file is detected.
        for i in 0..b.len() {
            for bit in [0x01u8, 0x20] {
                let mut c = b.clone();
                c[i] ^= bit;
                assert!(Manifest::from_bytes(&c, p).is_err(), "flip at byte {i}");
            }
        }
        assert!(Manifest::from_bytes(&b[..b.len() / 2], p).is_err());
        // The wrapper is valid JSON.
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["manifest"]["record_count"], 5);
    }

    #[test]
    fn entries_round_trip() {
        let e = IndexEntry { offset: 1 << 40, stored_len: u32::MAX, shard: 254, checksum: 0xDEAD_BEEF_0123_4567 };
        assert_eq!(IndexEntry::decode(&e.encode()), e);
        assert_ne!(record_seed(1, None), record_seed(2, None));
        assert_ne!(record_seed(1, Some(&[2, 3])), record_seed(1, Some(&[3, 2])));
    }

    #[test]
    fn headers() {
        let h = header(INDEX_MAGIC, 24, 7);
        let p = Path::new("i");
        assert_eq!(read_header(&h, INDEX_MAGIC, p).unwrap(), (24, 7));
        assert!(read_header(&h, DATA_MAGIC, p).is_err());
        assert!(read_header(&h[..10], INDEX_MAGIC, p).is_err());
        let mut v = h;
        v[8] = 1; // version-1 headers still read
        assert_eq!(read_header(&v, INDEX_MAGIC, p).unwrap(), (24, 7));
        v[8] = 9;
        assert!(matches!(read_header(&v, INDEX_MAGIC, p), Err(Error::UnsupportedVersion { .. })));
    }
}
