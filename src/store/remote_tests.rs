//! Stores published to an (in-memory) object store and read back through `io::object`: the
//! store layer's upload (`store::publish`) over the io layer's remote reads.

use std::path::Path;

use crate::io::object::{memory_remote, put, ObjectLocation, Remote, RemoteOptions};
use crate::prelude::*;
use crate::store::publish::{remote_leftovers, upload_store};

/// A store written locally, published to an (in-memory) object store, opened there and
/// gathered: same records and order as the local store; index pages and record ranges are
/// staged, not read one by one; a second publish to the same place fails and leaves
/// nothing; a damaged object is caught by the checksums.
#[test]
fn store_round_trip_over_an_object_store() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for codec in [Codec::Raw, Codec::Zstd] {
        let local = dir.path().join(format!("ragged-{}", codec.name()));
        let mut w = RaggedWriter::create(&local, DType::Int32, 1, WriterOptions { codec, data_shards: 3, ..Default::default() })
            .unwrap_or_else(|e| panic!("{e}"));
        let recs: Vec<Vec<i32>> = (0..500).map(|i| (0..(i % 37 + 1)).map(|j| i * 100 + j).collect()).collect();
        let shapes: Vec<[usize; 1]> = recs.iter().map(|r| [r.len()]).collect();
        let packed = PackedRagged::from_records(1, recs.iter().zip(&shapes).map(|(r, s)| (&r[..], &s[..]))).unwrap_or_else(|e| panic!("{e}"));
        w.append(&packed.as_input()).unwrap_or_else(|e| panic!("{e}"));
        w.finish().unwrap_or_else(|e| panic!("{e}"));

        let opts = RemoteOptions { page_bytes: 1024, coalesce_gap: 64, ..Default::default() };
        let remote = memory_remote(opts);
        let manifest = std::fs::read(local.join(crate::store::format::MANIFEST)).unwrap_or_else(|e| panic!("{e}"));
        upload_store(&local, &remote, &manifest).unwrap_or_else(|e| panic!("{e}"));
        let again = upload_store(&local, &remote, &manifest);
        assert!(matches!(again, Err(Error::AlreadyExists { .. })), "{again:?}");
        assert!(remote_leftovers(&remote, false).unwrap_or_else(|e| panic!("{e}")).is_empty(), "the losing writer cleaned up");

        let loc = ObjectLocation::new(remote.clone());
        let store = Store::open_at(&loc).unwrap_or_else(|e| panic!("{e}"));
        let Store::Ragged(rs) = store else { panic!("a ragged store") };
        let view = rs.bind(&Allocator::default());
        let ids: Vec<u64> = vec![499, 0, 17, 17, 250, 3, 498, 100];
        let b = view.gather(&ids).unwrap_or_else(|e| panic!("{e}"));
        let want: Vec<i32> = ids.iter().flat_map(|&i| recs[i as usize].clone()).collect();
        assert_eq!(b.values().as_slice::<i32>().unwrap_or_else(|e| panic!("{e}")), &want[..]);
        let all: Vec<u64> = (0..500).collect();
        let b = view.gather(&all).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.values().as_slice::<i32>().unwrap_or_else(|e| panic!("{e}")).len(), recs.iter().map(|r| r.len()).sum::<usize>());
        assert!(matches!(view.gather(&[500]), Err(Error::IndexOutOfRange { .. })));

        // A flipped byte in a data object: the record's checksum catches it on a fresh open.
        let (shard, mut bytes) = first_shard(&remote);
        let last = bytes.len() - 1;
        bytes[last] ^= 0x55;
        put(&remote, &shard, bytes);
        let store = Store::open_at(&ObjectLocation::new(remote.clone())).unwrap_or_else(|e| panic!("{e}"));
        let Store::Ragged(rs) = store else { panic!("a ragged store") };
        let r = rs.bind(&Allocator::default()).gather(&all);
        assert!(matches!(r, Err(Error::Corrupt { .. }) | Err(Error::Codec { .. })), "{r:?}");
    }
}

/// Ranges fetched once are kept in the local disk folder and served from there by a later
/// opening (another process, another run): with the object's bytes replaced on the server
/// by garbage of the same size, records gathered before still read back exactly; others
/// fail their checksums. The folder stays within its bound.
#[test]
fn disk_cache_serves_ranges_across_openings() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let local = dir.path().join("dense");
    let mut w = DenseWriter::create(&local, DType::UInt8, &[1000], WriterOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    w.append_slice(&data).unwrap_or_else(|e| panic!("{e}"));
    w.finish().unwrap_or_else(|e| panic!("{e}"));
    let cache_dir = dir.path().join("cache");
    let opts = RemoteOptions { cache_dir: Some(cache_dir.clone()), cache_dir_bytes: 64 << 10, coalesce_gap: 0, ..Default::default() };
    let remote = memory_remote(opts);
    let manifest = std::fs::read(local.join(crate::store::format::MANIFEST)).unwrap_or_else(|e| panic!("{e}"));
    upload_store(&local, &remote, &manifest).unwrap_or_else(|e| panic!("{e}"));
    let ids = [7u64, 150, 3];
    let want: Vec<u8> = ids.iter().flat_map(|&i| data[i as usize * 1000..(i as usize + 1) * 1000].to_vec()).collect();
    let gather = |ids: &[u64]| -> Result<Vec<u8>> {
        let Store::Dense(s) = Store::open_at(&ObjectLocation::new(remote.clone()))? else { panic!("dense") };
        Ok(s.bind(&Allocator::default()).gather(ids)?.as_bytes().to_vec())
    };
    assert_eq!(gather(&ids).unwrap_or_else(|e| panic!("{e}")), want);
    // garbage on the server, same size, header kept
    let (shard, mut bytes) = first_shard(&remote);
    for b in &mut bytes[crate::store::format::HEADER_BYTES..] {
        *b = !*b;
    }
    put(&remote, &shard, bytes);
    let again = gather(&[150, 3, 7, 7]).unwrap_or_else(|e| panic!("{e}"));
    assert!(again == [&want[1000..], &want[..1000], &want[..1000]].concat(), "served from disk");
    assert!(matches!(gather(&[42]), Err(Error::Corrupt { .. })), "not cached: fetched, and the checksum catches the garbage");
    // the bound holds
    for k in 0..150u64 {
        let _ = gather(&[k + 40]);
    }
    let total: u64 = walk(&cache_dir);
    assert!(total <= 64 << 10, "{total}");
}

/// The object name and bytes of the first data shard of the store published at `remote`.
fn first_shard(remote: &Remote) -> (String, Vec<u8>) {
    let m = crate::store::format::Manifest::from_bytes(
        &remote.get_small(crate::store::format::MANIFEST, 1 << 20).unwrap_or_else(|e| panic!("{e}")).unwrap_or_default(),
        Path::new("m"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let shard = m.stored_name(&crate::store::format::shard_name(0));
    let bytes = remote.get_small(&shard, 1 << 30).unwrap_or_else(|e| panic!("{e}")).unwrap_or_default();
    (shard, bytes)
}

fn walk(p: &Path) -> u64 {
    std::fs::read_dir(p).map(|rd| rd.flatten().map(|e| if e.path().is_dir() { walk(&e.path()) } else { e.metadata().map(|m| m.len()).unwrap_or(0) }).sum()).unwrap_or(0)
}
