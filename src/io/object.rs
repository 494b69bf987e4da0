//! Stores and dataset roots on object storage: `s3://`, `gs://`, `az://` (and `abfs(s)://`,
//! `adl://`, `azure://`), `http(s)://` through the `object_store` crate. (`file://` URLs are local
//! folders: they open memory-mapped.)
//!
//! - **Configuration**: credentials and endpoints come from the environment (`AWS_*`,
//!   `GOOGLE_*`, `AZURE_*`, as object_store reads them) and from storage options registered for a
//!   URL prefix ([`register_storage_options`]; Python `zrecord.open(url, storage_options=...)`),
//!   with the keys object_store, delta-rs and Lance use (`aws_endpoint`, `aws_region`,
//!   `allow_http`, `google_service_account`, `azure_storage_account_name`, ...), plus zrecord's
//!   own `zrecord_*` keys for the read plan (see [`RemoteOptions`]).
//! - **Reads** ([`ObjectLocation`], [`ObjectFile`]): opening a store reads its manifest and the
//!   64-byte header of each file (one ranged GET each, sent together), nothing else. A gather
//!   first stages what it needs ([`preload`]): the index pages (and shape rows) of its ids, then
//!   its records' byte ranges, coalesced per file across gaps below `zrecord_coalesce_gap`, split
//!   at `zrecord_max_request_bytes`, and fetched concurrently (at most `zrecord_max_inflight`
//!   requests and `zrecord_max_inflight_bytes` bytes in flight); records are then checked and
//!   decoded from those buffers straight into the gather's pooled output, as from a local file.
//!   Fetched ranges stay in a per-store cache bounded by `zrecord_cache_bytes` (least recently
//!   used out first; ranges a running gather staged are pinned until it ends), so index pages
//!   of a store that fits are fetched once. Transient failures (5xx, 429, timeouts, dropped
//!   connections) are retried with exponential backoff by object_store's client
//!   (`zrecord_max_retries`, `zrecord_retry_timeout_s`); permanent ones are
//!   [`Error::Remote`] naming the URL, the byte range and the status.
//! - **Writes** ([`upload_published`], used by [`crate::store::Staging`]): a writer builds its
//!   output in a local staging folder as always; publishing uploads every data file under a fresh
//!   `data_dir` below the destination (multipart uploads for large files), then writes the
//!   manifest last with a create-only put. A crashed writer leaves only objects no manifest names;
//!   a second writer to the same URL gets [`Error::AlreadyExists`] and deletes what it uploaded;
//!   an existing store is never overwritten. [`leftovers`] lists unreferenced data folders
//!   (`zrec gc URL`).

use std::collections::{BTreeMap, HashMap};
use std::mem::MaybeUninit;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::{Error, RemoteKind, Result};
use crate::io::{ByteSource, Location};

use crate::io::runtime::block;

mod cache;
mod options;
mod plan;
mod read;
mod remote;

#[allow(unused_imports)]
use self::{cache::*, options::*, plan::*, read::*, remote::*};

pub use options::{is_secret_option, options_to_pickle, register_storage_options, register_storage_options_with, storage_options_registered, RemoteOptions};
pub(crate) use plan::{preload, Plan, Staged};
pub use read::{ObjectFile, ObjectLocation};
pub use remote::{connect, connect_with, object_store_for, Remote};

#[cfg(test)]
mod tests {
    use super::*;

    fn memory_remote(opts: RemoteOptions) -> Remote {
        Remote { store: Arc::new(object_store::memory::InMemory::new()), prefix: "root/store".into(), root: "memory://test".into(), credentials: true, opts }
    }

    fn put(r: &Remote, name: &str, data: Vec<u8>) {
        let (store, key) = (r.store.clone(), r.key(name));
        block(async move { store.put(&key, PutPayload::from(data)).await }).unwrap_or_else(|e| panic!("{e}"));
    }

    fn read(f: &dyn ByteSource, at: u64, n: usize) -> Result<Vec<u8>> {
        f.read_vec(at, n)
    }

    #[test]
    fn ranges_coalesce_cache_and_pin() {
        let opts = RemoteOptions { coalesce_gap: 100, max_request_bytes: 1000, page_bytes: 256, cache_bytes: 4096, ..Default::default() };
        let r = memory_remote(opts);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        put(&r, "f", data.clone());
        let loc = ObjectLocation::new(r);
        assert!(matches!(loc.open("f", 9_999), Err(Error::Corrupt { .. })), "size is checked at open");
        assert!(matches!(loc.open("missing", 10), Err(Error::Remote { kind: crate::error::RemoteKind::NotFound, status: Some(404), .. })));
        let src = loc.open("f", 10_000).unwrap_or_else(|e| panic!("{e}"));
        let f = src.as_object().unwrap_or_else(|| panic!("an object file"));
        // 3 ranges within the gap merge into one request; a far one is its own; a long one splits.
        let staged = preload(vec![(f, 1000, 1010), (f, 1050, 1060), (f, 1100, 1200), (f, 5000, 5010), (f, 6000, 8500)], Plan::Ranges)
            .unwrap_or_else(|e| panic!("{e}"));
        {
            let c = f.cache();
            let starts: Vec<u64> = c.map.keys().filter(|k| k.0 == f.id).map(|k| k.1).collect();
            assert_eq!(starts, vec![0, 1000, 5000, 6000, 7000, 8000]);
            assert!(c.map.values().filter(|e| e.pins > 0).count() == 5);
        }
        for (at, n) in [(1000u64, 200usize), (1055, 3), (5000, 10), (6000, 1000), (7990, 20)] {
            if at == 7990 {
                // spans two cached requests: served by a fresh read, still exact
            }
            assert_eq!(read(src.as_ref(), at, n).unwrap_or_else(|e| panic!("{e}")), data[at as usize..at as usize + n]);
        }
        assert!(matches!(read(src.as_ref(), 9_990, 20), Err(Error::Corrupt { .. })), "past the end");
        drop(staged);
        {
            let c = f.cache();
            assert!(c.bytes <= 4096, "unpinned ranges are evicted down to the budget");
            assert!(c.map.keys().all(|k| ![1000, 5000, 6000, 7000, 8000].contains(&k.1)), "staged record ranges go when their gather ends: {:?}", c.map.keys().collect::<Vec<_>>());
        }
        // Pages: index-like reads round to aligned pages.
        let _s = preload(vec![(f, 300, 316), (f, 2000, 2016)], Plan::Pages).unwrap_or_else(|e| panic!("{e}"));
        let c = f.cache();
        assert!(c.map.contains_key(&(f.id, 256)) && c.map.contains_key(&(f.id, 1792)), "{:?}", c.map.keys().collect::<Vec<_>>());
    }

    #[test]
    fn options_are_checked() {
        let mut o = RemoteOptions::default();
        assert!(o.set("zrecord_max_inflight", "8").unwrap_or(false));
        assert_eq!(o.max_inflight, 8);
        assert!(matches!(o.set("zrecord_max_inflight", "0"), Err(Error::InvalidArgument { .. })));
        assert!(matches!(o.set("zrecord_coalesce_gap", "lots"), Err(Error::InvalidArgument { .. })));
        assert!(!o.set("aws_region", "x").unwrap_or(true));
        let e = connect_with("s3://bucket/x", &[("no_such_option".into(), "1".into())]);
        assert!(matches!(e, Err(Error::InvalidArgument { .. })), "{e:?}");
        assert!(matches!(connect_with("s3:///x", &[]), Err(Error::InvalidArgument { .. })));
        assert!(matches!(connect_with("ftp://host/x", &[]), Err(Error::InvalidArgument { .. })));
        assert!(matches!(connect_with("s3://b/a/../c", &[]), Err(Error::InvalidArgument { .. })));
        assert_eq!(status_of("Server returned non-2xx status code: 503 Service Unavailable"), Some(503));
    }

    /// A store written locally, published to an (in-memory) object store, opened there and
    /// gathered: same records and order as the local store; index pages and record ranges are
    /// staged, not read one by one; a second publish to the same place fails and leaves
    /// nothing; a damaged object is caught by the checksums.
    #[test]
    fn store_round_trip_over_an_object_store() {
        use crate::prelude::*;
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
            crate::store::publish::upload_store(&local, &remote, &manifest).unwrap_or_else(|e| panic!("{e}"));
            let again = crate::store::publish::upload_store(&local, &remote, &manifest);
            assert!(matches!(again, Err(Error::AlreadyExists { .. })), "{again:?}");
            assert!(crate::store::publish::remote_leftovers(&remote, false).unwrap_or_else(|e| panic!("{e}")).is_empty(), "the losing writer cleaned up");

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
        use crate::prelude::*;
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
        crate::store::publish::upload_store(&local, &remote, &manifest).unwrap_or_else(|e| panic!("{e}"));
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
}
