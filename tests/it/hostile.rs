//! Hostile and careless use: absurd sizes, files cut or swapped under an open store, symlinks
//! out of a dataset root, special files where data is expected, loaders used from their own
//! transform. Each is a typed error (or correct data), never a crash, a hang or other bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use zrecord::loader::{IdSource, Loader, LoaderOptions, Mode, Sampler, SourceView, MAX_BATCH_SIZE, MAX_WORKERS};
use zrecord::prelude::*;
use zrecord::store::format::Manifest;
use zrecord::store::Dataset;

fn dense_store(path: &Path, n: usize, record: usize, opts: WriterOptions) -> Vec<u8> {
    let data = random_bytes(n * record, 11);
    let mut w = DenseWriter::create(path, DType::UInt8, &[record], opts).unwrap();
    w.append_slice(&data).unwrap();
    w.finish().unwrap();
    data
}

/// A loader over one dense stream `x` of `store`, drawing `sampler` with `workers` and `prefetch`.
fn loader_over<T: Send + 'static>(
    store: &zrecord::store::DenseStore,
    sampler: Sampler,
    workers: usize,
    prefetch: usize,
    transform: impl Fn(u64, Vec<zrecord::loader::PositionBatch>) -> T + Send + Sync + 'static,
) -> Loader<T> {
    let streams = vec![("x".to_string(), vec![SourceView::from(store.bind(&Allocator::cpu(1 << 20)))])];
    let opts = LoaderOptions { workers, prefetch, rank: 0, world_size: 1 };
    Loader::with_transform(streams, IdSource::Stateless(sampler), opts, transform).unwrap()
}

#[test]
fn absurd_sampler_and_loader_sizes_are_typed_errors() {
    for mode in [Mode::Iid, Mode::Sequential] {
        for b in [MAX_BATCH_SIZE + 1, 1 << 40, usize::MAX] {
            let e = Sampler::new(1 << 50, b, mode, 0).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { name: "batch_size", .. }), "{e}");
        }
    }
    assert_eq!(Sampler::new(10, MAX_BATCH_SIZE, Mode::Iid, 0).unwrap().batch(3).len(), MAX_BATCH_SIZE);

    let dir = tempfile::tempdir().unwrap();
    dense_store(&dir.path().join("s"), 16, 8, WriterOptions::default());
    let Store::Dense(store) = Store::open(dir.path().join("s")).unwrap() else { panic!() };
    let view = || vec![("x".to_string(), vec![SourceView::from(store.bind(&Allocator::cpu(0)))])];
    let s = Sampler::new(16, 4, Mode::Iid, 0).unwrap();
    for (workers, prefetch, world, what) in [
        (MAX_WORKERS + 1, 1, 1, "workers"),
        (usize::MAX, 1, 1, "workers"),
        (1, usize::MAX, 1, "prefetch"),
        (1, 1, usize::MAX, "batch_size"),
    ] {
        let o = LoaderOptions { workers, prefetch, rank: 0, world_size: world };
        match Loader::new(view(), s.clone(), o) {
            Err(Error::InvalidArgument { name, .. }) => assert_eq!(name, what),
            other => panic!("expected a typed error for {what}, got {:?}", other.map(|_| ())),
        }
    }
    let draw = Box::new(|| Ok(vec![0u64; 4]));
    let e = Loader::with_draw(view(), draw, MAX_BATCH_SIZE + 1, LoaderOptions::default(), |_, p| p).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "batch_size", .. }), "{e}");
}

#[test]
fn allocator_cap_fails_a_gather_typed() {
    let dir = tempfile::tempdir().unwrap();
    dense_store(&dir.path().join("s"), 64, 4096, WriterOptions::default());
    let Store::Dense(s) = Store::open(dir.path().join("s")).unwrap() else { panic!() };
    let alloc = Allocator::cpu_with_limit(0, Some(64 << 10));
    let v = s.bind(&alloc);
    let ok = v.gather(&[1, 2, 3]).unwrap();
    match v.gather(&(0..32).collect::<Vec<_>>()) {
        Err(Error::MemoryLimit { max_bytes, .. }) => assert_eq!(max_bytes, 64 << 10),
        other => panic!("expected MemoryLimit, got {:?}", other.map(|_| ())),
    }
    drop(ok);
    assert_eq!(alloc.stats().live_bytes, 0);
}

/// Truncating a data file under an open, mapped store: the next gather is a typed error
/// naming the file (the SIGBUS is contained), verify reports it, other stores keep working.
#[test]
fn data_file_truncated_under_an_open_store_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dense_store(&dir.path().join("s"), 64, 8192, WriterOptions::default().data_shards(1));
    dense_store(&dir.path().join("other"), 8, 8192, WriterOptions::default());
    for verify in [true, false] {
        let d = dir.path().join(format!("cut-{verify}"));
        copy_dir(&dir.path().join("s"), &d);
        let Store::Dense(s) = Store::open(&d).unwrap() else { panic!() };
        let mut v = s.bind(&Allocator::cpu(0));
        v.set_verify_checksums(verify);
        assert_eq!(v.gather(&[63]).unwrap().as_bytes(), &data[63 * 8192..]);
        let shard = d.join("data-000.bin");
        let f = std::fs::OpenOptions::new().write(true).open(&shard).unwrap();
        f.set_len(8192).unwrap();
        let e = v.gather(&[40, 50]).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("data-000"), "{e}");
        // Sticky: the store stays refused, even for records whose pages are still there.
        assert!(v.gather(&[0]).is_err());
        let e = s.verify().unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    }
    let Store::Dense(o) = Store::open(dir.path().join("other")).unwrap() else { panic!() };
    assert_eq!(o.bind(&Allocator::cpu(0)).gather(&[7]).unwrap().as_bytes().len(), 8192);
}

/// A store replaced by a new one (new files, new inodes) while open keeps serving the bytes
/// it opened; reopening sees the new store.
#[test]
fn replaced_store_keeps_serving_the_opened_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s");
    let old = dense_store(&p, 32, 64, WriterOptions::default());
    let Store::Dense(s) = Store::open(&p).unwrap() else { panic!() };
    let v = s.bind(&Allocator::cpu(0));
    std::fs::rename(&p, dir.path().join("old")).unwrap();
    let data = random_bytes(32 * 64, 99);
    let mut w = DenseWriter::create(&p, DType::UInt8, &[64], WriterOptions::default()).unwrap();
    w.append_slice(&data).unwrap();
    w.finish().unwrap();
    std::fs::remove_dir_all(dir.path().join("old")).unwrap();
    assert_eq!(v.gather(&[5]).unwrap().as_bytes(), &old[5 * 64..6 * 64]);
    s.verify().unwrap();
    let Store::Dense(n) = Store::open(&p).unwrap() else { panic!() };
    assert_eq!(n.bind(&Allocator::cpu(0)).gather(&[5]).unwrap().as_bytes(), &data[5 * 64..6 * 64]);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn xxh3_hex(b: &[u8]) -> String {
    format!("{:016x}", twox_hash::XxHash3_64::oneshot_with_seed(0, b))
}

/// Swap a zstd_dict store's raw-content dictionary for another store's and make the manifest
/// agree (size, checksum, manifest checksum): the records' checksums are bound to their
/// dictionary, so every read fails instead of decoding to other bytes.
#[test]
fn swapped_zstd_dictionary_is_detected_even_with_a_consistent_manifest() {
    let dir = tempfile::tempdir().unwrap();
    // Raw-content dictionaries (no zstd magic, no dictionary id in the frames) and records
    // made of dictionary content, so that frames refer into the dictionary.
    let (dict_a, dict_b) = (random_bytes(4096, 1), random_bytes(4096, 2));
    let records = |d: &[u8]| -> Vec<u8> { (0..40).flat_map(|i| d[i * 64..i * 64 + 256].to_vec()).collect() };
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let data = records(&dict_a);
    for (p, dict, d) in [(&a, &dict_a, &data), (&b, &dict_b, &records(&dict_b))] {
        let mut w = DenseWriter::create(p, DType::UInt8, &[256], WriterOptions::zstd_dict(dict.clone())).unwrap();
        w.append_slice(d).unwrap();
        w.finish().unwrap();
    }
    let mpath = a.join("manifest.json");
    let mut m = Manifest::from_bytes(&std::fs::read(&mpath).unwrap(), &mpath).unwrap();
    assert!(m.checksums_bind_dictionary);
    let other = std::fs::read(b.join("dictionary.zstd")).unwrap();
    std::fs::write(a.join("dictionary.zstd"), &other).unwrap();
    for f in m.files.iter_mut().filter(|f| f.name == "dictionary.zstd") {
        f.bytes = other.len() as u64;
        f.xxh3 = xxh3_hex(&other);
    }
    std::fs::write(&mpath, m.to_bytes().unwrap()).unwrap();
    let Store::Dense(s) = Store::open(&a).unwrap() else { panic!("the manifest is consistent: it opens") };
    for verify in [true, false] {
        let mut v = s.bind(&Allocator::cpu(0));
        v.set_verify_checksums(verify);
        match v.gather(&[3]) {
            Ok(t) => {
                assert!(!verify, "a checked read returned data");
                assert_ne!(t.as_bytes(), &data[3 * 256..4 * 256], "sanity: the other dictionary decodes differently");
            }
            Err(e) => assert!(matches!(e, Error::Corrupt { .. } | Error::Codec { .. }), "{e}"),
        }
    }
    assert!(s.verify().is_err());
}

/// A dense store whose manifest claims more decoded bytes than its data files could produce
/// (raw: stored as is; zstd: at most 32768-fold) is refused at open, before any gather asks for
/// that memory; the most compressible real store (all zeros) still opens and reads back.
#[test]
fn dense_stores_claiming_more_than_their_files_hold_are_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    for codec in [Codec::Raw, Codec::Zstd] {
        let p = dir.path().join(format!("{codec}"));
        dense_store(&p, 10, 64, WriterOptions::with_codec(codec));
        let mpath = p.join("manifest.json");
        let mut m = Manifest::from_bytes(&std::fs::read(&mpath).unwrap(), &mpath).unwrap();
        m.item_shape = Some(vec![if codec == Codec::Raw { 128 } else { 1 << 30 }]);
        std::fs::write(&mpath, m.to_bytes().unwrap()).unwrap();
        let e = Store::open(&p).unwrap_err();
        assert!(matches!(&e, Error::Corrupt { path, .. } if path.ends_with("manifest.json")), "{codec}: {e}");
        assert!(e.to_string().contains("cannot come from data files"), "{e}");
    }
    let zeros = dir.path().join("zeros");
    let mut w = DenseWriter::create(&zeros, DType::UInt8, &[4 << 20], WriterOptions::with_codec(Codec::Zstd).level(19)).unwrap();
    w.append_slice(&vec![0u8; 3 * (4 << 20)]).unwrap();
    w.finish().unwrap();
    let Store::Dense(s) = Store::open(&zeros).unwrap() else { panic!("dense") };
    let t = s.bind(&Allocator::cpu(0)).gather(&[2, 0]).unwrap();
    assert!(t.as_bytes().len() == 2 * (4 << 20) && t.as_bytes().iter().all(|&b| b == 0));
}

#[test]
fn dataset_streams_may_not_leave_the_root_through_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    dense_store(&outside, 4, 8, WriterOptions::default());
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    dense_store(&root.join("a"), 4, 8, WriterOptions::default());
    std::os::unix::fs::symlink(&outside, root.join("b")).unwrap();
    // Folder scan (no dataset.json).
    let e = Dataset::open(&root).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }) && e.to_string().contains("outside the dataset root"), "{e}");
    // dataset.json naming the symlink.
    std::fs::write(
        root.join("dataset.json"),
        r#"{"format":"zrecord-dataset","version":1,"record_count":4,"streams":[{"name":"a","path":"a"},{"name":"b","path":"b"}]}"#,
    )
    .unwrap();
    let e = Dataset::open(&root).unwrap_err();
    assert!(e.to_string().contains("outside the dataset root"), "{e}");
    // A symlink that stays inside the root is fine.
    std::fs::remove_file(root.join("b")).unwrap();
    std::os::unix::fs::symlink(root.join("a"), root.join("b")).unwrap();
    assert_eq!(Dataset::open(&root).unwrap().len(), 4);
}

#[test]
fn special_files_in_place_of_store_files_never_hang() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    // dataset.json a FIFO: opening it for reading would block forever.
    let c = std::ffi::CString::new(root.join("dataset.json").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert!(Dataset::open(&root).is_err());
    // A store's dictionary a symlink to an endless device.
    let a = dir.path().join("a");
    dense_store(&a, 40, 256, WriterOptions::zstd_dict(random_bytes(2048, 3)));
    std::fs::remove_file(a.join("dictionary.zstd")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", a.join("dictionary.zstd")).unwrap();
    let e = Store::open(&a).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

/// The transform may read the loader's position and close it (a signal); repositioning from
/// inside is refused. Nothing deadlocks with or without workers.
#[test]
fn transform_reentering_its_loader_neither_deadlocks_nor_corrupts() {
    let dir = tempfile::tempdir().unwrap();
    dense_store(&dir.path().join("s"), 64, 8, WriterOptions::default());
    let Store::Dense(store) = Store::open(dir.path().join("s")).unwrap() else { panic!() };
    for workers in [0, 2] {
        let slot: Arc<std::sync::OnceLock<zrecord::loader::LoaderHandle>> = Arc::default();
        let seen = slot.clone();
        let s = Sampler::new(64, 4, Mode::Sequential, 0).unwrap();
        let mut l = loader_over(&store, s, workers, 2, move |step, _parts| {
            // Workers start producing as soon as the loader exists, before the test has stored
            // its handle: wait for it.
            let t0 = std::time::Instant::now();
            let h = loop {
                match seen.get() {
                    Some(h) => break h,
                    None if t0.elapsed().as_secs() < 30 => std::thread::yield_now(),
                    None => panic!("handle never set"),
                }
            };
            let pos = h.state().expect("alive while its transform runs");
            assert!(h.in_transform());
            if step == 3 {
                h.close();
            }
            (step, pos)
        });
        slot.set(l.handle()).ok().unwrap();
        assert!(!l.handle().in_transform());
        let mut got = Vec::new();
        while let Some(r) = l.next_step() {
            got.push(r.unwrap().0);
        }
        // In order, nothing after the closing step; with workers, steps made before the close
        // but not yet delivered are dropped with it.
        assert_eq!(got, (0..got.len() as u64).collect::<Vec<_>>(), "workers={workers}");
        assert!(got.len() <= 4 && l.is_closed());
        if workers == 0 {
            assert_eq!(got, [0, 1, 2, 3]);
        }
        // The handle inside the transform does not keep the loader (and its transform, which
        // holds the handle) alive: dropping the loader frees it.
        let h = l.handle();
        drop(l);
        assert!(h.is_closed() && h.state().is_none(), "workers={workers}: the loader outlived its owner");
        assert!(slot.get().unwrap().state().is_none());
    }
}

/// 16 threads gather (zstd, checksums verified) through views sharing one pooled
/// allocator while another thread closes that allocator: every gather returns the exact rows or
/// `Error::Closed`, nothing else; batches made before the close stay valid after it and return
/// their memory to the closed pool when dropped. (Also run under ThreadSanitizer, scripts/sanitize.sh.)
#[test]
fn sixteen_threads_gathering_while_the_allocator_closes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dense_store(&dir.path().join("d"), 300, 40, WriterOptions::with_codec(Codec::Zstd));
    let Store::Dense(store) = Store::open(dir.path().join("d")).unwrap() else { panic!() };
    for round in 0..4u64 {
        let alloc = Allocator::cpu(1 << 20);
        let closed_seen = std::sync::atomic::AtomicUsize::new(0);
        let kept: std::sync::Mutex<Vec<(Vec<u64>, Tensor)>> = Default::default();
        std::thread::scope(|s| {
            for t in 0..16u64 {
                let view = store.bind(&alloc);
                let (data, closed_seen, kept) = (&data, &closed_seen, &kept);
                s.spawn(move || {
                    // Until this thread sees the close (bounded, should the close be lost).
                    for k in 0..1_000_000u64 {
                        let ids = random_ids(300, 1 + (k % 17) as usize, round * 10_000 + t * 100 + k);
                        match view.gather(&ids) {
                            Ok(b) => {
                                assert_eq!(b.as_bytes(), &dense_reference(data, 40, &ids)[..]);
                                if k % 64 == 0 {
                                    kept.lock().unwrap().push((ids, b));
                                }
                            }
                            Err(Error::Closed { .. }) => {
                                closed_seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                break;
                            }
                            Err(e) => panic!("thread {t}: {e}"),
                        }
                    }
                });
            }
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(1 + round * 3));
                alloc.close();
            });
        });
        assert!(alloc.is_closed());
        assert_eq!(closed_seen.into_inner(), 16, "every thread sees the close");
        // Batches made before the close still hold the right bytes.
        for (ids, b) in kept.into_inner().unwrap() {
            assert_eq!(b.as_bytes(), &dense_reference(&data, 40, &ids)[..]);
        }
        assert!(store.bind(&alloc).gather(&[0]).is_err(), "a closed allocator allocates nothing");
    }
}

/// `LoaderHandle::close` from another thread while the owner iterates with workers: the
/// iteration ends promptly with the results in step order.
#[test]
fn loader_closed_from_another_thread_while_iterating() {
    let dir = tempfile::tempdir().unwrap();
    dense_store(&dir.path().join("s"), 256, 16, WriterOptions::default());
    let Store::Dense(store) = Store::open(dir.path().join("s")).unwrap() else { panic!() };
    for workers in [0, 1, 3] {
        let mut l = loader_over(&store, Sampler::new(256, 8, Mode::Iid, 7).unwrap(), workers, 4, |step, _parts| step);
        let h = l.handle();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            h.close();
        });
        let mut got = Vec::new();
        while let Some(r) = l.next_step() {
            got.push(r.unwrap());
            assert!(got.len() < 10_000_000, "workers={workers}: close from another thread did not stop the loader");
        }
        closer.join().unwrap();
        assert_eq!(got, (0..got.len() as u64).collect::<Vec<_>>(), "workers={workers}");
        assert!(l.is_closed());
    }
}

/// A transform that panics on a worker thread: that step's result is `Error::Panicked` with the
/// message, the steps around it are delivered in order, and nothing hangs. (Without workers the
/// panic unwinds into the caller, as any panic of its own code.)
#[test]
fn a_panicking_transform_on_a_worker_is_an_error_for_its_step() {
    let dir = tempfile::tempdir().unwrap();
    dense_store(&dir.path().join("s"), 64, 8, WriterOptions::default());
    let Store::Dense(store) = Store::open(dir.path().join("s")).unwrap() else { panic!() };
    for workers in [1, 3] {
        let s = Sampler::new(64, 4, Mode::Sequential, 0).unwrap();
        let mut l = loader_over(&store, s, workers, 2, |step, _parts| {
            if step == 2 {
                panic!("bad record in step {step}");
            }
            step
        });
        for want in 0..6u64 {
            match l.next_step().expect("open") {
                Ok(step) => assert_eq!(step, want),
                Err(Error::Panicked { step, message, .. }) => {
                    assert_eq!((want, step), (2, 2));
                    assert_eq!(message, "bad record in step 2");
                }
                Err(e) => panic!("{e}"),
            }
        }
        l.close();
    }
}
