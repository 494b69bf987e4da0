//! Truncated or bit-flipped files give typed errors naming the file: never a panic, never
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! different bytes than were written.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use zrecord::prelude::*;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

enum Fixture {
    Dense(Vec<u8>),
    Ragged(RaggedFixture),
}

fn build(dir: &Path) -> Vec<(PathBuf, Fixture)> {
    let mut out = Vec::new();
    // Dense zstd_dict over two shards: manifest, index, dictionary, data files.
    let data = random_bytes(24 * 40, 5);
    let samples: Vec<Vec<u8>> = data.chunks(40).map(|c| c.to_vec()).collect();
    let p = dir.join("dense");
    let mut w = DenseWriter::create(&p, DType::UInt8, &[40], WriterOptions { data_shards: 2, ..WriterOptions::zstd_dict(dict_for(&samples)) }).unwrap();
    w.append_slice(&data).unwrap();
    w.finish().unwrap();
    out.push((p, Fixture::Dense(data)));
    // Ragged raw: shapes file too.
    let fx = RaggedFixture::new(DType::Int16, 2, 12, 5, 6);
    let p = dir.join("ragged");
    let mut w = RaggedWriter::create(&p, DType::Int16, 2, WriterOptions::default().data_shards(2)).unwrap();
    fx.append_to(&mut w, 0, 12).unwrap();
    w.finish().unwrap();
    out.push((p, Fixture::Ragged(fx)));
    out
}

/// Open, read everything, verify. Returns the first error; panics if any read returns bytes
/// other than the originals.
fn probe(path: &Path, fx: &Fixture) -> Result<()> {
    let store = Store::open(path)?;
    let alloc = Allocator::cpu(0);
    match (&store, fx) {
        (Store::Dense(s), Fixture::Dense(data)) => {
            let t = s.bind(&alloc).read_all()?;
            assert!(t.as_bytes() == &data[..], "silently wrong data from {}", path.display());
        }
        (Store::Ragged(s), Fixture::Ragged(f)) => {
            let b = s.bind(&alloc).read_all()?;
            let ids: Vec<u64> = (0..f.records.len() as u64).collect();
            f.check(&b, &ids);
        }
        _ => panic!("kind changed"),
    }
    store.verify()?;
    Ok(())
}

fn positions(len: usize) -> Vec<usize> {
    if len <= 400 {
        (0..len).collect()
    } else {
        let mut v: Vec<usize> = (0..128).collect();
        v.extend((128..len).step_by(len / 250 + 1));
        v.push(len - 1);
        v
    }
}

#[test]
fn flipped_bits_in_every_file_kind_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    for (store, fx) in build(dir.path()) {
        probe(&store, &fx).unwrap();
        let files: Vec<String> = std::fs::read_dir(&store).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(files.len() >= 4, "{files:?}");
        for name in &files {
            let orig = std::fs::read(store.join(name)).unwrap();
            for pos in positions(orig.len()) {
                let bad = dir.path().join("bad");
                let _ = std::fs::remove_dir_all(&bad);
                copy_dir(&store, &bad);
                let mut bytes = orig.clone();
                bytes[pos] ^= 0x10;
                std::fs::write(bad.join(name), &bytes).unwrap();
                let e = probe(&bad, &fx).expect_err(&format!("flip in {name} at {pos} went unnoticed"));
                assert!(e.is_corruption(), "{name}@{pos}: not a corruption error: {e}");
            }
            // verify() names the damaged file.
            if name != "manifest.json" {
                let bad = dir.path().join("bad");
                let _ = std::fs::remove_dir_all(&bad);
                copy_dir(&store, &bad);
                let mut bytes = orig.clone();
                let last = bytes.len() - 1;
                bytes[last] ^= 1;
                std::fs::write(bad.join(name), &bytes).unwrap();
                let e = Store::open(&bad).and_then(|s| s.verify()).unwrap_err();
                match &e {
                    Error::Corrupt { path, .. } => assert!(path.ends_with(name) || name == "dictionary.zstd" && path.ends_with(name), "{name}: {e}"),
                    other => panic!("{name}: {other}"),
                }
            }
        }
    }
}

#[test]
fn truncated_files_fail_to_open_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for (store, fx) in build(dir.path()) {
        let files: Vec<String> = std::fs::read_dir(&store).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        for name in &files {
            let orig = std::fs::read(store.join(name)).unwrap();
            for cut in [1usize, orig.len() / 2, orig.len()] {
                let bad = dir.path().join("bad");
                let _ = std::fs::remove_dir_all(&bad);
                copy_dir(&store, &bad);
                std::fs::write(bad.join(name), &orig[..orig.len() - cut]).unwrap();
                let e = probe(&bad, &fx).expect_err(&format!("truncation of {name} by {cut} went unnoticed"));
                assert!(e.is_corruption(), "{name}: {e}");
                if let Error::Corrupt { path, .. } = &e {
                    assert!(path.ends_with(name), "{name}: error names {}", path.display());
                }
            }
            // A missing file.
            let bad = dir.path().join("bad");
            let _ = std::fs::remove_dir_all(&bad);
            copy_dir(&store, &bad);
            std::fs::remove_file(bad.join(name)).unwrap();
            let e = probe(&bad, &fx).unwrap_err();
            if name == "manifest.json" {
                assert!(matches!(e, Error::NotFound { .. }), "{e}");
            } else {
                assert!(e.is_corruption() && e.to_string().contains(name.as_str()), "{name}: {e}");
            }
        }
    }
}

#[test]
fn verify_checks_records_already_read() {
    // Reads check each record once per opened store; `verify` always checks everything.
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(50 * 64, 11);
    let p = dir.path().join("s");
    let mut w = DenseWriter::create(&p, DType::UInt8, &[64], WriterOptions::default().data_shards(1)).unwrap();
    w.append_slice(&data).unwrap();
    w.finish().unwrap();
    let store = DenseStore::open(&p).unwrap();
    let view = store.bind(&Allocator::default());
    assert!(view.read_all().unwrap().as_bytes() == &data[..]);
    // Damage record 0 on disk after it was verified (the shared mapping sees the change).
    let shard = p.join("data-000.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[64] ^= 0x40;
    std::fs::write(&shard, &bytes).unwrap();
    assert!(matches!(store.verify(), Err(Error::Corrupt { .. })));
    // A freshly opened store checks on first read again.
    let fresh = DenseStore::open(&p).unwrap().bind(&Allocator::default());
    assert!(fresh.get(0).unwrap_err().is_corruption());
}
