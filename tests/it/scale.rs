//! Opening a store of 100 million records reads nothing O(N): memory does not grow with the
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! record count. (The time it takes is measured by `benches/gather.rs`, not here.)

use std::fs::OpenOptions;
use std::io::Write;

use zrecord::prelude::*;
use zrecord::store::format::{self, FileEntry, Kind, Manifest};

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A 100M-record dense store whose index and data are sparse files (no disk, no memory).
pub fn sparse_store(path: &std::path::Path, n: u64) {
    std::fs::create_dir(path).unwrap();
    let mk = |name: &str, header: [u8; 64], len: u64| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(path.join(name)).unwrap();
        f.write_all(&header).unwrap();
        f.set_len(len).unwrap();
        FileEntry { name: name.into(), bytes: len, xxh3: "0000000000000000".into() }
    };
    let files = vec![
        mk(format::INDEX, format::header(format::INDEX_MAGIC, format::ENTRY_BYTES as u32, 0), 64 + n * 24),
        mk(&format::shard_name(0), format::header(format::DATA_MAGIC, 0, 0), 64 + n),
    ];
    let m = Manifest {
        format: "zrecord".into(),
        version: format::FORMAT_VERSION,
        kind: Kind::Dense,
        dtype: "uint8".into(),
        item_shape: Some(vec![1]),
        ndim: None,
        logical: Default::default(),
        allow_empty: false,
        checksums_bind_dictionary: false,
        codec: "raw".into(),
        level: 0,
        record_count: n,
        data_shards: 1,
        raw_bytes: n,
        stored_bytes: n,
        files,
        created_by: "test".into(),
        data_dir: None,
    };
    std::fs::write(path.join(format::MANIFEST), m.to_bytes().unwrap()).unwrap();
}

#[test]
fn open_100m_records_in_constant_memory() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("huge");
    let n = 100_000_000u64;
    sparse_store(&p, n);
    let before = rss_bytes();
    let stores: Vec<DenseStore> = (0..3).map(|_| DenseStore::open(&p).unwrap()).collect();
    let grown = rss_bytes().saturating_sub(before);
    assert!(grown < 8 << 20, "opening grew RSS by {grown} bytes");
    assert_eq!(stores[0].len(), n);
    // The fabricated index has zero checksums: reading a record is a corruption error, and
    // it touches only that record's pages.
    let v = stores[0].bind(&Allocator::default());
    let e = v.gather(&[n - 1, 12_345_678]).unwrap_err();
    assert!(e.is_corruption(), "{e}");
    assert!(rss_bytes().saturating_sub(before) < 16 << 20);
}
