//! Round trips of every dtype and codec, dense and ragged, against naive references.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use zrecord::prelude::*;
use zrecord::store::Ids;

fn options(codec: Codec, shards: usize, dict_samples: &[Vec<u8>]) -> WriterOptions {
    let dictionary = (codec == Codec::ZstdDict).then(|| dict_for(dict_samples));
    WriterOptions { codec, data_shards: shards, dictionary, ..Default::default() }
}

/// One `#[test]` per case: `cases!(f { name: (args), ... })` makes `f::name` call `f(args)`.
/// (A macro of our own instead of rstest, whose proc macro turned on host features of `regex`
/// that rebuilt prost-build and Ballista in every test build: see Cargo.toml.)
macro_rules! cases {
    ($f:ident { $($name:ident: ($($arg:expr),*)),* $(,)? }) => {
        mod $f {
            #[allow(unused_imports)]
            use super::*;
            $(#[test] fn $name() { super::$f($($arg),*) })*
        }
    };
}

cases!(dense_every_dtype { raw: (Codec::Raw), zstd: (Codec::Zstd), zstd_dict: (Codec::ZstdDict) });
fn dense_every_dtype(codec: Codec) {
    let dir = tempfile::tempdir().unwrap();
    let alloc = Allocator::cpu(1 << 20);
    for (k, dtype) in DType::ALL.into_iter().enumerate() {
        let item = [3usize, 5];
        let rb = 15 * dtype.size();
        let n = 41;
        let data = random_bytes(n * rb, k as u64);
        let samples: Vec<Vec<u8>> = data.chunks(rb).map(|c| c.to_vec()).collect();
        let path = dir.path().join(format!("{dtype}"));
        let mut w = DenseWriter::create(&path, dtype, &item, options(codec, 3, &samples)).unwrap();
        // Three appends of uneven sizes (one empty) extend the sequence in order.
        for (lo, hi) in [(0, 7), (7, 7), (7, 41)] {
            w.append(&TensorView::new(&data[lo * rb..hi * rb], dtype, vec![hi - lo, 3, 5])).unwrap();
        }
        assert_eq!(w.len(), 41);
        w.finish().unwrap();

        let store = DenseStore::open(&path).unwrap();
        assert_eq!((store.len(), store.dtype(), store.item_shape(), store.codec()), (41, dtype, &item[..], codec));
        let view = store.bind(&alloc);
        let ids = [40u64, 0, 5, 5, 17, 3, 40];
        let t = view.gather(&ids).unwrap();
        assert_eq!(t.shape(), &[7, 3, 5]);
        assert_eq!(t.dtype(), dtype);
        assert_eq!(t.as_bytes(), &dense_reference(&data, rb, &ids)[..], "{dtype} {codec}");
        let one = view.get(17).unwrap();
        assert_eq!(one.shape(), &[3, 5]);
        assert_eq!(one.as_bytes(), &data[17 * rb..18 * rb]);
        assert_eq!(view.read_all().unwrap().as_bytes(), &data[..]);
        assert_eq!(view.range(10..13).unwrap().as_bytes(), &data[10 * rb..13 * rb]);
        let rev = view.gather_ids(Ids::Range { start: 40, step: -3, len: 5 }).unwrap();
        assert_eq!(rev.as_bytes(), &dense_reference(&data, rb, &[40, 37, 34, 31, 28])[..]);
        let recs: Vec<Tensor> = view.iter().map(|r| r.unwrap()).collect();
        assert_eq!(recs.len(), 41);
        assert_eq!(recs[9].as_bytes(), &data[9 * rb..10 * rb]);
        assert_eq!(store.verify().unwrap(), 41);
        let empty = view.gather(&[]).unwrap();
        assert_eq!(empty.shape(), &[0, 3, 5]);
    }
}

cases!(ragged_every_dtype { raw_1d: (Codec::Raw, 1), zstd_1d: (Codec::Zstd, 1), zstd_dict_1d: (Codec::ZstdDict, 1), raw_3d: (Codec::Raw, 3), zstd_2d: (Codec::Zstd, 2), zstd_dict_2d: (Codec::ZstdDict, 2) });
fn ragged_every_dtype(codec: Codec, ndim: usize) {
    let dir = tempfile::tempdir().unwrap();
    let alloc = Allocator::cpu(1 << 20);
    for (k, dtype) in DType::ALL.into_iter().enumerate() {
        let fx = RaggedFixture::new(dtype, ndim, 33, 9, k as u64 + 100);
        let samples: Vec<Vec<u8>> = fx.records.iter().map(|r| r.0.clone()).collect();
        let path = dir.path().join(format!("{dtype}"));
        let mut w = RaggedWriter::create(&path, dtype, ndim, options(codec, 2, &samples)).unwrap();
        fx.append_to(&mut w, 0, 10).unwrap();
        fx.append_to(&mut w, 10, 10).unwrap();
        fx.append_to(&mut w, 10, 33).unwrap();
        w.finish().unwrap();
        let store = RaggedStore::open(&path).unwrap();
        assert_eq!((store.len(), store.dtype(), store.ndim()), (33, dtype, ndim));
        let view = store.bind(&alloc);
        let ids = [32u64, 0, 0, 12, 7, 31];
        fx.check(&view.gather(&ids).unwrap(), &ids);
        let one = view.get(12).unwrap();
        fx.check(&one, &[12]);
        let rec = one.record(0).unwrap();
        assert_eq!(rec.shape().iter().map(|&d| d as u64).collect::<Vec<_>>(), fx.records[12].1);
        let all: Vec<u64> = (0..33).collect();
        fx.check(&view.read_all().unwrap(), &all);
        fx.check(&view.range(5..9).unwrap(), &[5, 6, 7, 8]);
        let empty = view.gather(&[]).unwrap();
        assert_eq!(empty.cu_seqlens_slice(), &[0]);
        assert_eq!(empty.len(), 0);
        assert_eq!(empty.shapes().shape(), &[0, ndim]);
        assert_eq!(store.verify().unwrap(), 33);
    }
}

#[test]
fn to_tensors_restores_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let fx = RaggedFixture::new(DType::Float32, 2, 10, 6, 9);
    let path = dir.path().join("r");
    let mut w = RaggedWriter::create(&path, DType::Float32, 2, WriterOptions::default()).unwrap();
    fx.append_to(&mut w, 0, 10).unwrap();
    w.finish().unwrap();
    let view = RaggedStore::open(&path).unwrap().bind(&Allocator::default());
    let b = view.gather(&[3, 1, 4]).unwrap();
    let ts = b.to_tensors().unwrap();
    for (t, id) in ts.iter().zip([3usize, 1, 4]) {
        let (bytes, shape) = &fx.records[id];
        assert_eq!(t.shape().iter().map(|&d| d as u64).collect::<Vec<_>>(), *shape);
        assert_eq!(t.as_bytes(), &bytes[..]);
    }
}

#[test]
fn store_open_reports_kind() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    let mut w = DenseWriter::create(&d, DType::Int64, &[2], WriterOptions::default()).unwrap();
    w.append_slice(&[1i64, 2, 3, 4]).unwrap();
    w.finish().unwrap();
    let r = dir.path().join("r");
    let mut w = RaggedWriter::create(&r, DType::Int64, 1, WriterOptions::default()).unwrap();
    let p = PackedRagged::from_records(1, [(&[1i64][..], &[1usize][..])]).unwrap();
    w.append(&p.as_input()).unwrap();
    w.finish().unwrap();
    assert!(matches!(Store::open(&d).unwrap(), Store::Dense(_)));
    assert!(matches!(Store::open(&r).unwrap(), Store::Ragged(_)));
    assert!(matches!(DenseStore::open(&r), Err(Error::WrongKind { .. })));
    assert!(matches!(RaggedStore::open(&d), Err(Error::WrongKind { .. })));
    let s = Store::open(&d).unwrap();
    assert_eq!((s.len(), s.dtype(), s.item_shape()), (2, DType::Int64, &[2usize][..]));
    let st = s.stats();
    assert_eq!(st.raw_bytes, 32);
    assert_eq!(st.record_count, 2);
}

#[test]
fn empty_store_and_scalar_records() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("empty");
    DenseWriter::create(&p, DType::Float64, &[4], WriterOptions::with_codec(Codec::Zstd)).unwrap().finish().unwrap();
    let s = DenseStore::open(&p).unwrap();
    assert_eq!(s.len(), 0);
    assert_eq!(s.verify().unwrap(), 0);
    assert_eq!(s.bind(&Allocator::default()).read_all().unwrap().shape(), &[0, 4]);
    // Scalar records: item shape ().
    let q = dir.path().join("labels");
    let mut w = DenseWriter::create(&q, DType::Int64, &[], WriterOptions::default()).unwrap();
    w.append_slice(&[5i64, 6, 7]).unwrap();
    w.finish().unwrap();
    let v = DenseStore::open(&q).unwrap().bind(&Allocator::default());
    let one = v.get(1).unwrap();
    assert_eq!(one.shape(), &[] as &[usize]);
    assert_eq!(one.as_slice::<i64>().unwrap(), &[6]);
    assert_eq!(v.gather(&[2, 0]).unwrap().as_slice::<i64>().unwrap(), &[7, 5]);
}

cases!(transcode_by_read_then_append { dense_raw_to_zstd_dict: (false), ragged_raw_to_zstd_dict: (true) });
fn transcode_by_read_then_append(ragged: bool) {
    let dir = tempfile::tempdir().unwrap();
    let alloc = Allocator::default();
    let src = dir.path().join("src");
    let dst = dir.path().join("dst");
    if !ragged {
        let data = zrecord::demo::tokens_dense(300, 64, 4);
        let mut w = DenseWriter::create(&src, DType::Int32, &[64], WriterOptions::default()).unwrap();
        w.append_slice(&data).unwrap();
        w.finish().unwrap();
        let source = DenseStore::open(&src).unwrap().bind(&alloc);
        let dict = train_dict(&source, 8192).unwrap();
        let mut w = DenseWriter::create(&dst, source.dtype(), source.item_shape(), WriterOptions::zstd_dict(dict)).unwrap();
        w.append(&source.read_all().unwrap().view()).unwrap();
        w.finish().unwrap();
        let out = DenseStore::open(&dst).unwrap();
        assert_eq!(out.codec(), Codec::ZstdDict);
        assert!(out.stats().stored_bytes < out.stats().raw_bytes);
        assert_eq!(out.bind(&alloc).read_all().unwrap().as_slice::<i32>().unwrap(), &data[..]);
    } else {
        let p = zrecord::demo::tokens_ragged(500, 8);
        let mut w = RaggedWriter::create(&src, DType::Int32, 1, WriterOptions::default()).unwrap();
        w.append(&p.as_input()).unwrap();
        w.finish().unwrap();
        let source = RaggedStore::open(&src).unwrap().bind(&alloc);
        let dict = train_dict(&source, 8192).unwrap();
        let mut w = RaggedWriter::create(&dst, source.dtype(), source.ndim(), WriterOptions::zstd_dict(dict)).unwrap();
        w.append(&source.read_all().unwrap().as_input()).unwrap();
        w.finish().unwrap();
        let all = RaggedStore::open(&dst).unwrap().bind(&alloc).read_all().unwrap();
        assert_eq!(all.values().as_slice::<i32>().unwrap(), &p.values[..]);
        assert_eq!(all.cu_seqlens_slice(), &p.cu_seqlens[..]);
    }
}

cases!(appends_crossing_writer_windows { raw_one_shard: (Codec::Raw, 1), zstd_one_shard: (Codec::Zstd, 1), zstd_three_shards: (Codec::Zstd, 3) });
fn appends_crossing_writer_windows(codec: Codec, shards: usize) {
    // Windows hold 16 MiB of input per shard, so 40 MiB spans three windows with one shard;
    // compressed windows are encoded in 1 MiB chunks spread over the shards.
    let dir = tempfile::tempdir().unwrap();
    let rb = 1 << 20;
    let data = random_bytes(40 * rb, 77);
    let p = dir.path().join("big");
    let mut w = DenseWriter::create(&p, DType::UInt8, &[rb], WriterOptions::with_codec(codec).data_shards(shards)).unwrap();
    w.append_slice(&data).unwrap();
    w.finish().unwrap();
    let store = DenseStore::open(&p).unwrap();
    let v = store.bind(&Allocator::default());
    let ids = [39u64, 0, 16, 15, 32, 31];
    assert!(v.gather(&ids).unwrap().as_bytes() == &dense_reference(&data, rb, &ids)[..]);
    assert!(v.read_all().unwrap().as_bytes() == &data[..]);
    assert_eq!(store.verify().unwrap(), 40);
}

#[test]
fn allocations_return_to_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x");
    let mut w = DenseWriter::create(&p, DType::Float32, &[1000], WriterOptions::default()).unwrap();
    w.append_slice(&vec![1.0f32; 100_000]).unwrap();
    w.finish().unwrap();
    let alloc = Allocator::cpu(64 << 20);
    let v = DenseStore::open(&p).unwrap().bind(&alloc);
    for _ in 0..20 {
        let t = v.gather(&random_ids(100, 64, 1)).unwrap();
        assert_eq!(t.numel(), 64_000);
    }
    let st = alloc.stats();
    assert_eq!(st.live_bytes, 0);
    assert_eq!(st.fresh, 1, "one region served every batch: {st:?}");
    assert_eq!(st.reused, 19);
    // A batch outlives its store, view and allocator.
    let t = v.gather(&[3, 4]).unwrap();
    drop(v);
    alloc.close();
    drop(alloc);
    assert_eq!(t.as_slice::<f32>().unwrap().len(), 2000);
    assert!(t.as_slice::<f32>().unwrap().iter().all(|&x| x == 1.0));
}

#[test]
fn concurrent_readers_share_one_store() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c");
    let data = random_bytes(500 * 96, 3);
    let mut w = DenseWriter::create(&p, DType::UInt8, &[96], WriterOptions::with_codec(Codec::Zstd)).unwrap();
    w.append_slice(&data).unwrap();
    w.finish().unwrap();
    let store = DenseStore::open(&p).unwrap();
    let alloc = Allocator::default();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let view = store.bind(&alloc);
            let data = &data;
            s.spawn(move || {
                for k in 0..50 {
                    let ids = random_ids(500, 200, t * 1000 + k);
                    assert!(view.gather(&ids).unwrap().as_bytes() == &dense_reference(data, 96, &ids)[..]);
                }
            });
        }
    });
}

cases!(cold_mode_and_released_pages_read_the_same_bytes { raw: (Codec::Raw), zstd: (Codec::Zstd), zstd_dict: (Codec::ZstdDict) });
/// Cold mode (every page of a batch requested up front), released and evicted pages, and the
/// mapped-residency bound change how pages arrive, never the bytes: every codec, dense and
/// ragged, against the references; a gather at memory speed leaves cold mode.
fn cold_mode_and_released_pages_read_the_same_bytes(codec: Codec) {
    let dir = tempfile::tempdir().unwrap();
    let alloc = Allocator::cpu(1 << 24);
    let n = 3000usize;
    let rb = 2048usize;
    let data = random_bytes(n * rb, 5);
    let samples: Vec<Vec<u8>> = data.chunks(rb).take(200).map(|c| c.to_vec()).collect();
    let dpath = dir.path().join("d");
    let mut w = DenseWriter::create(&dpath, DType::UInt8, &[rb], options(codec, 3, &samples)).unwrap();
    w.append_slice(&data).unwrap();
    w.finish().unwrap();
    let fx = RaggedFixture::new(DType::Int32, 2, n, 40, 9);
    let rsamples: Vec<Vec<u8>> = fx.records.iter().take(200).map(|r| r.0.clone()).collect();
    let rpath = dir.path().join("r");
    let mut w = RaggedWriter::create(&rpath, DType::Int32, 2, options(codec, 2, &rsamples)).unwrap();
    fx.append_to(&mut w, 0, n).unwrap();
    w.finish().unwrap();

    let dense = DenseStore::open(&dpath).unwrap();
    let ragged = RaggedStore::open(&rpath).unwrap();
    let (ds, rs): (Store, Store) = (dense.clone().into(), ragged.clone().into());
    let (dv, rv) = (dense.bind(&alloc), ragged.bind(&alloc));
    for (round, seed) in (0..6).zip(40u64..) {
        // Sorted, random with repeats, and adjacent ids (merged into one range per page run).
        let ids = match round % 3 {
            0 => random_ids(n as u64, 300, seed),
            1 => (1000..1400).collect(),
            _ => {
                let mut v = random_ids(n as u64, 257, seed);
                v.sort_unstable();
                v
            }
        };
        ds.set_cold(true);
        rs.set_cold(true);
        if round % 2 == 1 {
            ds.release_pages(round == 3);
            rs.release_pages(round == 3);
        }
        assert_eq!(dv.gather(&ids).unwrap().as_bytes(), &dense_reference(&data, rb, &ids)[..], "round {round}");
        fx.check(&rv.gather(&ids).unwrap(), &ids);
        // A gather at memory speed leaves cold mode (released pages refault from the page cache
        // at memory speed too); retried, as a loaded machine can slow any one gather.
        let left = (0..50).any(|_| {
            let _ = dv.gather(&ids).unwrap();
            !ds.is_cold()
        });
        assert!(left || cfg!(zrecord_sanitize), "round {round}: gathers at memory speed leave cold mode");
    }
    // The residency bound releases the mapped pages every `bound` gathered bytes.
    let before = ds.page_releases();
    ds.set_max_mapped_bytes(Some(1 << 20));
    for seed in 0..8 {
        let ids = random_ids(n as u64, 256, seed);
        assert_eq!(dv.gather(&ids).unwrap().as_bytes(), &dense_reference(&data, rb, &ids)[..]);
    }
    // Released when a gather takes the count past 1 MiB: the 3rd and the 6th.
    assert_eq!(ds.page_releases() - before, 2, "8 x 512 KiB gathered under a 1 MiB bound");
    ds.set_max_mapped_bytes(None);
    let before = ds.page_releases();
    let _ = dv.gather(&random_ids(n as u64, 2048, 1)).unwrap();
    assert_eq!(ds.page_releases(), before);
    assert_eq!(dense.verify().unwrap(), n as u64);
    assert_eq!(ragged.verify().unwrap(), n as u64);
}

cases!(gathers_longer_than_a_locate_block { raw: (Codec::Raw), zstd: (Codec::Zstd) });
/// Gathers locate a block of records (index entries, bounds) before reading them: batches
/// longer than a block, ids repeated and in any order, on one thread and on the crew, mapped
/// and cold, dense and ragged, equal the references.
fn gathers_longer_than_a_locate_block(codec: Codec) {
    let dir = tempfile::tempdir().unwrap();
    let alloc = Allocator::cpu(1 << 24);
    // 96-byte records: 1,800 of them are a parallel gather (>= 128 KiB) in chunks of 341
    // records, so block boundaries fall inside chunks too.
    let (n, rb) = (2000usize, 96usize);
    let data = random_bytes(n * rb, 11);
    let path = dir.path().join("d");
    let mut w = DenseWriter::create(&path, DType::UInt8, &[rb], options(codec, 3, &[])).unwrap();
    w.append_slice(&data).unwrap();
    w.finish().unwrap();
    let store = DenseStore::open(&path).unwrap();
    let as_store: Store = store.clone().into();
    let mut ids = random_ids(n as u64, 1500, 3);
    ids.extend((0..300).rev()); // a descending run and repeats of earlier ids
    for cold in [false, true] {
        as_store.set_cold(cold);
        for parallel in [true, false] {
            let mut v = store.bind(&alloc);
            v.set_parallel(parallel);
            for len in [1usize, 255, 256, 257, 513, ids.len()] {
                let got = v.gather(&ids[..len]).unwrap();
                assert_eq!(got.as_bytes(), &dense_reference(&data, rb, &ids[..len])[..], "cold {cold} parallel {parallel} len {len}");
            }
        }
    }
    // Ragged gathers read their records the same way.
    let fx = RaggedFixture::new(DType::Int32, 2, n, 40, 12);
    let rpath = dir.path().join("r");
    let mut w = RaggedWriter::create(&rpath, DType::Int32, 2, options(codec, 2, &[])).unwrap();
    fx.append_to(&mut w, 0, n).unwrap();
    w.finish().unwrap();
    let ragged = RaggedStore::open(&rpath).unwrap();
    let as_store: Store = ragged.clone().into();
    for cold in [false, true] {
        as_store.set_cold(cold);
        for parallel in [true, false] {
            let mut v = ragged.bind(&alloc);
            v.set_parallel(parallel);
            for len in [1usize, 256, 257, ids.len()] {
                fx.check(&v.gather(&ids[..len]).unwrap(), &ids[..len]);
            }
        }
    }
}
