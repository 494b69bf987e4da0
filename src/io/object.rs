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
//! - **Writes** (`Remote::upload`, `Remote::put_create`; the store layer's
//!   `store::publish::upload_published`, used by `store::Staging`): a writer builds its
//!   output in a local staging folder as always; publishing uploads every data file under a fresh
//!   `data_dir` below the destination (multipart uploads for large files), then writes the
//!   manifest last with a create-only put. A crashed writer leaves only objects no manifest names;
//!   a second writer to the same URL gets [`Error::AlreadyExists`] and deletes what it uploaded;
//!   an existing store is never overwritten. `store::publish::remote_leftovers` lists
//!   unreferenced data folders (`zrec gc URL`).

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

/// A folder of a fresh in-memory object store (tests of what is built on object stores).
#[cfg(test)]
pub(crate) fn memory_remote(opts: RemoteOptions) -> Remote {
    Remote { store: Arc::new(object_store::memory::InMemory::new()), prefix: "root/store".into(), root: "memory://test".into(), credentials: true, opts }
}

/// Replace object `name` below `r` with `data` (tests: damage what a writer published).
#[cfg(test)]
pub(crate) fn put(r: &Remote, name: &str, data: Vec<u8>) {
    let (store, key) = (r.store.clone(), r.key(name));
    block(async move { store.put(&key, PutPayload::from(data)).await }).unwrap_or_else(|e| panic!("{e}"));
}

#[cfg(test)]
mod tests {
    use super::*;


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
}
