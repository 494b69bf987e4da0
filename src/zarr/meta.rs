//! Zarr array metadata: v3 (sharded or not) and v2 arrays, NGFF multiscale groups, resolved
//! once per URI into what the planner needs (shape, read-chunk grid, codec chains, fill value).
//!
//! `zarrs` parses the metadata and builds the codec chains; the layout (which files, which byte
//! ranges, which shard index) is ours.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Deserialize;
use zarrs::array::{Array, ArrayMetadata, ArrayToBytesCodecTraits, BytesRepresentation, CodecChain, FillValue};
use zarrs::metadata::v3::MetadataV3;

use crate::dtype::DType;
use crate::error::{Error, Result};

use crate::io::Uri;

/// Largest metadata document read (`zarr.json`, `.zarray`, `.zattrs`).
pub const MAX_METADATA_BYTES: u64 = 64 << 20;

/// How an array's chunks are stored.
#[derive(Clone, Debug)]
pub enum ChunkLayout {
    /// One object per chunk, decoded by `codecs`.
    Chunked {
        /// The chunk codec chain.
        codecs: Arc<CodecChain>,
    },
    /// `sharding_indexed`: one object per shard holding inner chunks and an index.
    Sharded {
        /// Shard shape in elements.
        shard_shape: Vec<u64>,
        /// Inner chunks per shard along each axis.
        per_shard: Vec<u64>,
        /// The inner chunks' codec chain.
        inner: Arc<CodecChain>,
        /// The index's codec chain (bytes + crc32c, usually).
        index: Arc<CodecChain>,
        /// The index is at the start of the shard (else at the end).
        index_at_start: bool,
        /// Encoded index size in bytes.
        index_size: u64,
    },
}

/// A decode path that skips the generic codec chain for the commonest layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastDecode {
    /// Use the codec chain.
    None,
    /// `bytes` in native order only: the stored bytes are the chunk.
    Raw,
    /// `bytes` in native order + `zstd` (with or without checksum): one zstd frame, decoded
    /// with a reused context into at most the chunk's size.
    Zstd,
}

/// The fast path for a chain, from its metadata.
fn fast_decode(chain: &CodecChain, dtype: DType) -> FastDecode {
    let metas = chain.create_metadatas(&zarrs::array::CodecMetadataOptions::default());
    let native = if cfg!(target_endian = "little") { "little" } else { "big" };
    let bytes_ok = |m: &MetadataV3| {
        m.name() == "bytes"
            && match m.configuration().and_then(|c| c.get("endian")).and_then(|e| e.as_str()) {
                Some(e) => e == native || dtype.size() == 1,
                None => dtype.size() == 1,
            }
    };
    match metas.as_slice() {
        [b] if bytes_ok(b) => FastDecode::Raw,
        // With `checksum: true` the frame carries zstd's own content checksum, which the
        // decoder verifies; the fast path also bounds the output at the chunk's size (the
        // generic chain would decode whatever the frame expands to).
        [b, z] if bytes_ok(b) && z.name() == "zstd" => FastDecode::Zstd,
        _ => FastDecode::None,
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One opened Zarr array.
pub struct ArrayMeta {
    /// Unique per opened array (cache keys).
    pub id: u64,
    /// The URI as given (messages).
    pub uri: String,
    /// The array folder.
    pub location: Uri,
    /// Zarr format (2 or 3).
    pub zarr_format: u8,
    /// Array shape.
    pub shape: Vec<u64>,
    /// Element type after decoding (native byte order).
    pub dtype: DType,
    /// Fill value in native bytes (`dtype.size()` bytes).
    pub fill: Vec<u8>,
    /// The unit read and decoded: the chunk, or the inner chunk of a sharded array.
    pub read_chunk: Vec<u64>,
    /// Storage layout.
    pub layout: ChunkLayout,
    /// The read chunk's fast decode path.
    pub fast: FastDecode,
    /// For chunk keys (the metadata's chunk grid: chunks, or shards when sharded).
    keys: Array<()>,
}

impl std::fmt::Debug for ArrayMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZarrArray('{}', v{}, {} {:?}, chunks {:?}, {})", self.uri, self.zarr_format, self.dtype, self.shape, self.read_chunk, if self.is_sharded() { "sharded" } else { "chunked" })
    }
}

/// An unsupported or invalid layout: names the metadata field.
fn field_error(uri: &str, field: &str, reason: impl std::fmt::Display) -> Error {
    Error::invalid("zarr metadata", format!("'{uri}': field '{field}': {reason}"))
}

/// zarrs data-type name -> ours.
fn dtype_of(name: &str) -> Option<DType> {
    Some(match name {
        "bool" => DType::Bool,
        "int8" => DType::Int8,
        "int16" => DType::Int16,
        "int32" => DType::Int32,
        "int64" => DType::Int64,
        "uint8" => DType::UInt8,
        "uint16" => DType::UInt16,
        "uint32" => DType::UInt32,
        "uint64" => DType::UInt64,
        "float16" => DType::Float16,
        "bfloat16" => DType::BFloat16,
        "float32" => DType::Float32,
        "float64" => DType::Float64,
        "complex64" => DType::Complex64,
        "complex128" => DType::Complex128,
        _ => return None,
    })
}

#[derive(Deserialize)]
struct ShardingConfig {
    chunk_shape: Vec<u64>,
    codecs: Vec<MetadataV3>,
    index_codecs: Vec<MetadataV3>,
    #[serde(default = "default_index_location")]
    index_location: String,
}

fn default_index_location() -> String {
    "end".into()
}

/// The element size of a shard index row: (offset, nbytes) as two uint64.
const INDEX_FIELDS: u64 = 2;

impl ArrayMeta {
    /// Open the array at `uri`; a group with NGFF `multiscales` picks `datasets[level]` (level
    /// 0 when `None`).
    pub fn open(uri: &str, level: Option<usize>) -> Result<ArrayMeta> {
        let root = Uri::parse(uri)?;
        let (location, metadata) = resolve(uri, &root, level)?;
        Self::from_metadata(uri, location, metadata)
    }

    fn from_metadata(uri: &str, location: Uri, metadata: ArrayMetadata) -> Result<ArrayMeta> {
        let zarr_format = match &metadata {
            ArrayMetadata::V3(_) => 3,
            ArrayMetadata::V2(_) => 2,
        };
        // Checked by us first, so the error names the field.
        let (grid_shape, v3_codecs) = match &metadata {
            ArrayMetadata::V3(m) => {
                if m.chunk_grid.name() != "regular" {
                    return Err(field_error(uri, "chunk_grid", format!("'{}' is not supported (regular grids only)", m.chunk_grid.name())));
                }
                let cfg = m.chunk_grid.configuration().and_then(|c| c.get("chunk_shape")).cloned();
                let cs: Vec<u64> = cfg.and_then(|v| serde_json::from_value(v).ok()).ok_or_else(|| field_error(uri, "chunk_grid.configuration.chunk_shape", "missing or not a list of integers"))?;
                if !m.storage_transformers.is_empty() {
                    return Err(field_error(uri, "storage_transformers", "storage transformers are not supported"));
                }
                (cs, Some(m.codecs.clone()))
            }
            ArrayMetadata::V2(m) => {
                if m.filters.as_ref().is_some_and(|f| !f.is_empty()) {
                    // zarrs maps many v2 filters; we let it decide below.
                }
                (m.chunks.iter().map(|c| c.get()).collect(), None)
            }
        };
        let keys = Array::new_with_metadata(Arc::new(()), "/", metadata).map_err(|e| {
            let msg = e.to_string();
            let field = if msg.contains("codec") {
                if zarr_format == 2 { "compressor/filters" } else { "codecs" }
            } else if msg.contains("data type") {
                if zarr_format == 2 { "dtype" } else { "data_type" }
            } else if msg.contains("fill") {
                "fill_value"
            } else if msg.contains("chunk key") {
                "chunk_key_encoding"
            } else {
                "metadata"
            };
            field_error(uri, field, msg)
        })?;
        let shape = keys.shape().to_vec();
        if grid_shape.len() != shape.len() || grid_shape.contains(&0) {
            return Err(field_error(uri, "chunk_grid", format!("chunk shape {grid_shape:?} does not fit array shape {shape:?}")));
        }
        let dt_name = keys.data_type().name_v3().map(|c| c.into_owned()).unwrap_or_default();
        let dtype = dtype_of(&dt_name).ok_or_else(|| {
            field_error(uri, if zarr_format == 2 { "dtype" } else { "data_type" }, format!("'{dt_name}' is not supported (bool, int8-64, uint8-64, float16, bfloat16, float32, float64, complex64, complex128)"))
        })?;
        let fill = keys.fill_value().as_ne_bytes().to_vec();
        if fill.len() != dtype.size() {
            return Err(field_error(uri, "fill_value", format!("{} bytes for a {dtype} array", fill.len())));
        }

        // Sharding: the only codec at the outer level (checked here so planning owns the I/O).
        let sharding = v3_codecs.as_ref().and_then(|c| c.iter().position(|m| m.name() == "sharding_indexed"));
        let layout = match (sharding, &v3_codecs) {
            (Some(pos), Some(codecs)) => {
                if codecs.len() != 1 {
                    let names: Vec<&str> = codecs.iter().map(|m| m.name()).collect();
                    return Err(field_error(uri, "codecs", format!("{names:?}: sharding_indexed together with other outer codecs is not supported")));
                }
                let cfg_map = codecs[pos].configuration().ok_or_else(|| field_error(uri, "codecs[sharding_indexed].configuration", "missing"))?;
                let cfg: ShardingConfig = serde_json::from_value(serde_json::Value::Object(cfg_map.clone().into()))
                    .map_err(|e| field_error(uri, "codecs[sharding_indexed].configuration", e))?;
                if cfg.chunk_shape.len() != shape.len() || cfg.chunk_shape.contains(&0) {
                    return Err(field_error(uri, "codecs[sharding_indexed].configuration.chunk_shape", format!("{:?} for a {}-d array", cfg.chunk_shape, shape.len())));
                }
                let mut per_shard = Vec::with_capacity(shape.len());
                for (s, c) in grid_shape.iter().zip(&cfg.chunk_shape) {
                    if s % c != 0 {
                        return Err(field_error(uri, "codecs[sharding_indexed].configuration.chunk_shape", format!("inner chunk {:?} does not divide shard {grid_shape:?}", cfg.chunk_shape)));
                    }
                    per_shard.push(s / c);
                }
                let inner = CodecChain::from_metadata(&cfg.codecs).map_err(|e| field_error(uri, "codecs[sharding_indexed].configuration.codecs", e))?;
                let index = CodecChain::from_metadata(&cfg.index_codecs).map_err(|e| field_error(uri, "codecs[sharding_indexed].configuration.index_codecs", e))?;
                let index_shape = index_shape(&per_shard)?;
                let index_size = match index.encoded_representation(&index_shape, &zarrs::array::data_type::uint64(), &FillValue::from(u64::MAX)) {
                    Ok(BytesRepresentation::FixedSize(n)) => n,
                    Ok(_) => return Err(field_error(uri, "codecs[sharding_indexed].configuration.index_codecs", "the index codecs must have a fixed encoded size")),
                    Err(e) => return Err(field_error(uri, "codecs[sharding_indexed].configuration.index_codecs", e)),
                };
                let index_at_start = match cfg.index_location.as_str() {
                    "start" => true,
                    "end" => false,
                    other => return Err(field_error(uri, "codecs[sharding_indexed].configuration.index_location", format!("'{other}' (start or end)"))),
                };
                (ChunkLayout::Sharded { shard_shape: grid_shape.clone(), per_shard, inner: Arc::new(inner), index: Arc::new(index), index_at_start, index_size }, cfg.chunk_shape)
            }
            _ => (ChunkLayout::Chunked { codecs: keys.codecs() }, grid_shape),
        };
        let (layout, read_chunk) = layout;
        let chunk_bytes = read_chunk.iter().try_fold(dtype.size() as u64, |a, &c| a.checked_mul(c));
        if chunk_bytes.is_none_or(|b| b > 1 << 40) {
            return Err(field_error(uri, "chunk_grid", format!("chunk shape {read_chunk:?} is absurdly large")));
        }
        let fast = match &layout {
            ChunkLayout::Chunked { codecs } => fast_decode(codecs, dtype),
            ChunkLayout::Sharded { inner, .. } => fast_decode(inner, dtype),
        };
        Ok(ArrayMeta { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), uri: uri.to_string(), location, zarr_format, shape, dtype, fill, read_chunk, layout, fast, keys })
    }

    /// True when the array is sharded.
    pub fn is_sharded(&self) -> bool {
        matches!(self.layout, ChunkLayout::Sharded { .. })
    }

    /// The object holding chunk (unsharded) or shard (sharded) `grid` indices.
    pub fn object(&self, grid: &[u64]) -> Uri {
        let key = self.keys.chunk_key(grid);
        // Keys built here from grid indices (digits, the encoding's separator): no lookup
        // per component is needed to keep them inside the array.
        self.location.join_built(key.as_str())
    }

    /// Elements per read chunk (checked to fit when the array was opened).
    pub fn chunk_numel(&self) -> u64 {
        self.read_chunk.iter().fold(1u64, |a, &c| a.saturating_mul(c))
    }

    /// Decoded bytes per read chunk.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_numel().saturating_mul(self.dtype.size() as u64)
    }

    /// The read chunk's shape as zarrs wants it.
    pub fn chunk_shape_nz(&self) -> Vec<NonZeroU64> {
        self.read_chunk.iter().map(|&c| NonZeroU64::new(c).unwrap_or(NonZeroU64::MIN)).collect()
    }

    /// zarrs' view of the data type and fill value (for decoding).
    pub fn zarrs_array(&self) -> &Array<()> {
        &self.keys
    }
}

/// The shard index's array shape: `[*per_shard, 2]`.
pub(crate) fn index_shape(per_shard: &[u64]) -> Result<Vec<NonZeroU64>> {
    per_shard
        .iter()
        .copied()
        .chain([INDEX_FIELDS])
        .map(|n| NonZeroU64::new(n).ok_or_else(|| Error::invalid("zarr metadata", "zero-sized shard")))
        .collect()
}

/// Find the array node at `root` (following NGFF multiscales in a group) and parse it.
fn resolve(uri: &str, root: &Uri, level: Option<usize>) -> Result<(Uri, ArrayMetadata)> {
    let mut loc = root.clone();
    for _ in 0..4 {
        if let Some(bytes) = loc.join("zarr.json")?.read_all(MAX_METADATA_BYTES)? {
            let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| field_error(uri, "zarr.json", e))?;
            match v.get("node_type").and_then(|t| t.as_str()) {
                Some("array") => {
                    if let Some(l) = level {
                        if loc == *root && l != 0 {
                            return Err(Error::invalid("level", format!("'{uri}' is an array, not a multiscale group; level {l} has no meaning")));
                        }
                    }
                    let m: zarrs::array::ArrayMetadataV3 = serde_json::from_value(v).map_err(|e| field_error(uri, "zarr.json", e))?;
                    return Ok((loc, ArrayMetadata::V3(m)));
                }
                Some("group") => {
                    let attrs = v.get("attributes").cloned().unwrap_or_default();
                    let path = multiscale_path(uri, &attrs, level)?;
                    loc = loc.join(&path)?;
                    continue;
                }
                other => return Err(field_error(uri, "node_type", format!("{other:?} (array or group)"))),
            }
        }
        if let Some(bytes) = loc.join(".zarray")?.read_all(MAX_METADATA_BYTES)? {
            let m: zarrs::array::ArrayMetadataV2 = serde_json::from_slice(&bytes).map_err(|e| field_error(uri, ".zarray", e))?;
            return Ok((loc, ArrayMetadata::V2(m)));
        }
        if let Some(bytes) = loc.join(".zattrs")?.read_all(MAX_METADATA_BYTES)? {
            let attrs: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| field_error(uri, ".zattrs", e))?;
            let path = multiscale_path(uri, &attrs, level)?;
            loc = loc.join(&path)?;
            continue;
        }
        return Err(Error::NotFound { path: loc.path(), reason: format!("'{uri}': no zarr.json (v3) or .zarray (v2) here") });
    }
    Err(Error::invalid("uri", format!("'{uri}': multiscale groups nested too deeply")))
}

/// `multiscales[0].datasets[level].path` from group attributes (NGFF 0.4 at the top level,
/// 0.5 under `ome`).
fn multiscale_path(uri: &str, attrs: &serde_json::Value, level: Option<usize>) -> Result<String> {
    let ms = attrs
        .get("ome")
        .and_then(|o| o.get("multiscales"))
        .or_else(|| attrs.get("multiscales"))
        .ok_or_else(|| Error::invalid("uri", format!("'{uri}' is a group without NGFF multiscales; name an array")))?;
    let datasets = ms.get(0).and_then(|m| m.get("datasets")).and_then(|d| d.as_array()).ok_or_else(|| field_error(uri, "multiscales[0].datasets", "missing"))?;
    let l = level.unwrap_or(0);
    let d = datasets.get(l).ok_or_else(|| Error::invalid("level", format!("'{uri}' has {} multiscale levels; level {l} is out of range", datasets.len())))?;
    let path = d.get("path").and_then(|p| p.as_str()).ok_or_else(|| field_error(uri, &format!("multiscales[0].datasets[{l}].path"), "missing"))?;
    if path.is_empty() || path.split('/').any(|c| c == ".." || c.is_empty()) || path.starts_with('/') {
        return Err(field_error(uri, &format!("multiscales[0].datasets[{l}].path"), format!("'{path}' is not a relative path inside the group")));
    }
    Ok(path.to_string())
}
