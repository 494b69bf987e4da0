//! Shared pieces of the fuzz targets: building a small store from fuzzer input, structure-level
//! mutations that keep the checksum gates consistent (so the parsers behind them are reached),
//! and the oracle (a typed error, or exactly the bytes that were written).

use std::path::Path;

use arbitrary::Arbitrary;
use twox_hash::XxHash3_64;
use zrecord::prelude::*;
use zrecord::store::format::Manifest;

/// Where fuzz stores are written: a RAM filesystem when there is one.
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().expect("temp dir")
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum CodecChoice {
    Raw,
    Zstd,
    ZstdDict,
}

/// A structure-level change to a written store.
#[derive(Arbitrary, Debug)]
pub enum Mutation {
    RecordCount(u64),
    ItemShape(Vec<u64>),
    Ndim(u32),
    Dtype(u8),
    Codec(u8),
    Level(i32),
    DataShards(u32),
    RawBytes(u64),
    StoredBytes(u64),
    AllowEmpty(bool),
    Version(u32),
    Kind(bool),
    /// Change a file entry's size (the file itself is untouched).
    FileBytes { file: u8, bytes: u64 },
    /// Drop a file entry from the manifest.
    DropEntry(u8),
    /// Rename a file entry (to another file's name, or a path escaping the store).
    RenameEntry { file: u8, to: u8 },
    /// Overwrite a field of one 24-byte index entry (offset, length, shard, checksum).
    IndexField { record: u16, field: u8, value: u64, fix: bool },
    /// Overwrite one dimension of one shapes row.
    ShapeDim { record: u16, dim: u8, value: u64, fix: bool },
    /// XOR one byte of a file.
    Flip { file: u8, at: u32, xor: u8, fix: bool },
    /// Cut or extend a file.
    Resize { file: u8, len: u32, fix: bool },
    /// Replace the dictionary.
    Dictionary { bytes: Vec<u8>, fix: bool },
}

/// The fuzzer's description of a store and what to do to it.
#[derive(Arbitrary, Debug)]
pub struct StoreCase {
    pub ragged: bool,
    pub codec: CodecChoice,
    pub shards: u8,
    pub records: Vec<Vec<u8>>,
    pub mutations: Vec<Mutation>,
    pub ids: Vec<u16>,
}

pub fn hash_hex(b: &[u8]) -> String {
    format!("{:016x}", XxHash3_64::oneshot_with_seed(0, b))
}

/// The records as written: dense stores cut every record to the first one's length.
pub struct Written {
    pub records: Vec<Vec<u8>>,
}

/// Write the case's store at `path`; `None` when the input describes no valid store.
pub fn write_store(case: &StoreCase, path: &Path) -> Option<Written> {
    let mut records: Vec<Vec<u8>> = case.records.iter().take(48).map(|r| r.iter().take(96).copied().collect()).collect();
    let shards = (case.shards % 3 + 1) as usize;
    let opts = match case.codec {
        CodecChoice::Raw => WriterOptions::default(),
        CodecChoice::Zstd => WriterOptions::with_codec(Codec::Zstd).level(1),
        CodecChoice::ZstdDict => {
            let mut dict: Vec<u8> = records.iter().flatten().copied().collect();
            dict.extend_from_slice(b"zrecord fuzz dictionary content");
            WriterOptions::zstd_dict(dict)
        }
    }
    .data_shards(shards);
    if case.ragged {
        records.retain(|r| !r.is_empty());
        if records.is_empty() {
            return None;
        }
        let mut w = RaggedWriter::create(path, DType::UInt8, 1, opts).ok()?;
        let cu: Vec<i32> = std::iter::once(0).chain(records.iter().scan(0i32, |a, r| { *a += r.len() as i32; Some(*a) })).collect();
        let shapes: Vec<u64> = records.iter().map(|r| r.len() as u64).collect();
        let values: Vec<u8> = records.iter().flatten().copied().collect();
        w.append(&RaggedInput::from_slices(&values, &cu, &shapes, 1)).ok()?;
        w.finish().ok()?;
    } else {
        let len = records.first().map(|r| r.len()).unwrap_or(0).max(1);
        for r in records.iter_mut() {
            r.resize(len, 0xA5);
        }
        if records.is_empty() {
            return None;
        }
        let mut w = DenseWriter::create(path, DType::UInt8, &[len], opts).ok()?;
        let flat: Vec<u8> = records.iter().flatten().copied().collect();
        w.append_slice(&flat).ok()?;
        w.finish().ok()?;
    }
    Some(Written { records })
}

fn file_at(m: &Manifest, i: u8) -> Option<String> {
    if m.files.is_empty() {
        return None;
    }
    Some(m.files[i as usize % m.files.len()].name.clone())
}

/// Apply the mutations, keeping file checksums (when `fix`) and the manifest checksum right.
pub fn mutate(path: &Path, muts: &[Mutation]) {
    let mpath = path.join("manifest.json");
    let Ok(bytes) = std::fs::read(&mpath) else { return };
    let Ok(mut m) = Manifest::from_bytes(&bytes, &mpath) else { return };
    let mut rehash: Vec<String> = Vec::new();
    let edit = |name: &str, f: &mut dyn FnMut(&mut Vec<u8>)| {
        let p = path.join(name);
        if let Ok(mut b) = std::fs::read(&p) {
            f(&mut b);
            let _ = std::fs::write(&p, &b);
        }
    };
    for mu in muts.iter().take(6) {
        match mu {
            Mutation::RecordCount(n) => m.record_count = *n,
            Mutation::ItemShape(s) => m.item_shape = Some(s.iter().take(6).copied().collect()),
            Mutation::Ndim(n) => m.ndim = Some(*n),
            Mutation::Dtype(d) => {
                let names = ["uint8", "int16", "int32", "float64", "bfloat16", "bool", "complex128", "nope"];
                m.dtype = names[*d as usize % names.len()].into();
            }
            Mutation::Codec(c) => m.codec = ["raw", "zstd", "zstd_dict", "lz4"][*c as usize % 4].into(),
            Mutation::Level(l) => m.level = *l,
            Mutation::DataShards(n) => m.data_shards = *n,
            Mutation::RawBytes(n) => m.raw_bytes = *n,
            Mutation::StoredBytes(n) => m.stored_bytes = *n,
            Mutation::AllowEmpty(b) => m.allow_empty = *b,
            Mutation::Version(v) => m.version = *v % 4,
            Mutation::Kind(r) => m.kind = if *r { zrecord::store::Kind::Ragged } else { zrecord::store::Kind::Dense },
            Mutation::FileBytes { file, bytes } => {
                if let Some(n) = file_at(&m, *file) {
                    for f in m.files.iter_mut().filter(|f| f.name == n) {
                        f.bytes = *bytes;
                    }
                }
            }
            Mutation::DropEntry(i) => {
                if !m.files.is_empty() {
                    let k = *i as usize % m.files.len();
                    m.files.remove(k);
                }
            }
            Mutation::RenameEntry { file, to } => {
                let names = ["../escape", "/etc/passwd", "index.bin", "shapes.bin", "data-000.bin", "data-001.bin", "dictionary.zstd", "manifest.json"];
                if !m.files.is_empty() {
                    let k = *file as usize % m.files.len();
                    m.files[k].name = names[*to as usize % names.len()].into();
                }
            }
            Mutation::IndexField { record, field, value, fix } => {
                edit("index.bin", &mut |b| {
                    let at = 64 + (*record as usize % 64) * 24;
                    let (off, w) = match field % 4 {
                        0 => (0, 8),
                        1 => (8, 4),
                        2 => (12, 2),
                        _ => (16, 8),
                    };
                    if at + off + w <= b.len() {
                        b[at + off..at + off + w].copy_from_slice(&value.to_le_bytes()[..w]);
                    }
                });
                if *fix {
                    rehash.push("index.bin".into());
                }
            }
            Mutation::ShapeDim { record, dim, value, fix } => {
                let nd = m.ndim.unwrap_or(1).max(1) as usize;
                edit("shapes.bin", &mut |b| {
                    let at = 64 + ((*record as usize % 64) * nd + *dim as usize % nd) * 8;
                    if at + 8 <= b.len() {
                        b[at..at + 8].copy_from_slice(&value.to_le_bytes());
                    }
                });
                if *fix {
                    rehash.push("shapes.bin".into());
                }
            }
            Mutation::Flip { file, at, xor, fix } => {
                if let Some(n) = file_at(&m, *file) {
                    edit(&n, &mut |b| {
                        if !b.is_empty() {
                            let k = *at as usize % b.len();
                            b[k] ^= xor | 1;
                        }
                    });
                    if *fix {
                        rehash.push(n);
                    }
                }
            }
            Mutation::Resize { file, len, fix } => {
                if let Some(n) = file_at(&m, *file) {
                    edit(&n, &mut |b| b.resize(*len as usize % (b.len() * 2 + 2), 0));
                    if *fix {
                        rehash.push(n);
                    }
                }
            }
            Mutation::Dictionary { bytes, fix } => {
                let _ = std::fs::write(path.join("dictionary.zstd"), bytes);
                if *fix {
                    rehash.push("dictionary.zstd".into());
                }
            }
        }
    }
    for name in rehash {
        if let Ok(b) = std::fs::read(path.join(&name)) {
            for f in m.files.iter_mut().filter(|f| f.name == name) {
                f.bytes = b.len() as u64;
                f.xxh3 = hash_hex(&b);
            }
        }
    }
    if let Ok(b) = m.to_bytes() {
        let _ = std::fs::write(&mpath, b);
    }
}

/// Read the (possibly damaged) store every way a user can; panics only when a checked read
/// returns bytes other than the ones written (or a read of a record that was never written
/// succeeds).
pub fn exercise(path: &Path, written: &Written, ids: &[u16]) {
    let Ok(store) = Store::open(path) else { return };
    let n = store.len();
    let want = |id: u64| -> &[u8] {
        assert!(id < written.records.len() as u64, "read of record {id} succeeded; only {} were written", written.records.len());
        &written.records[id as usize]
    };
    let alloc = Allocator::cpu_with_limit(0, Some(64 << 20));
    let ids: Vec<u64> = if n == 0 { vec![] } else { ids.iter().take(64).map(|&i| i as u64 % n.min(1 << 20)).collect() };
    match &store {
        Store::Dense(s) => {
            for verify in [true, false] {
                let mut v = s.bind(&alloc);
                v.set_verify_checksums(verify);
                if let Ok(t) = v.gather(&ids) {
                    if verify && !ids.is_empty() {
                        let rb = t.as_bytes().len() / ids.len();
                        for (k, &id) in ids.iter().enumerate() {
                            assert_eq!(&t.as_bytes()[k * rb..(k + 1) * rb], want(id), "record {id}");
                        }
                    }
                }
            }
        }
        Store::Ragged(s) => {
            for verify in [true, false] {
                let mut v = s.bind(&alloc);
                v.set_verify_checksums(verify);
                if let Ok(b) = v.gather(&ids) {
                    if verify {
                        let vals = b.values();
                        let bytes = vals.as_bytes();
                        let es = s.dtype().size();
                        let cu = b.cu_seqlens_slice();
                        for (k, &id) in ids.iter().enumerate() {
                            assert_eq!(&bytes[cu[k] as usize * es..cu[k + 1] as usize * es], want(id), "record {id}");
                        }
                    }
                }
            }
        }
    }
    if store.verify().is_ok() {
        for id in 0..n.min(64) {
            let _ = want(id);
        }
    }
    // The loader (one step) and a SQL scan over the same store.
    if n > 0 {
        if let Ok(s) = zrecord::loader::Sampler::new(n, 2.min(n as usize), zrecord::loader::Mode::Sequential, 0) {
            let streams = vec![("x".to_string(), vec![zrecord::loader::SourceView::new(store.source(), &alloc)])];
            if let Ok(mut l) = zrecord::loader::Loader::new(streams, s, zrecord::loader::LoaderOptions { workers: 0, prefetch: 1, rank: 0, world_size: 1 }) {
                let _ = l.next_step();
            }
        }
    }
    // SQL planning costs milliseconds: scan one case in eight.
    if !ids.first().is_some_and(|&i| i % 8 == 0) {
        return;
    }
    if let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() {
        rt.block_on(async {
            let ctx = zrecord::query::zrecord_context();
            let q = format!("SELECT * FROM '{}' LIMIT 64", path.display());
            if let Ok(df) = ctx.sql(&q).await {
                let _ = df.collect().await;
            }
        });
    }
}
