//! Zarr assembly in Rust: arrays encoded here with zarrs' own codec chains (sharded with zstd,
//! and chunked), read back by crops, index queries, the pipeline and the crop source, against
//! a reference computed in the test. The full codec / layout matrix against zarr-python's own
//! reads is in tests/python/test_zarr.py.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;
use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use zarrs::array::{ArrayBytes, ArrayToBytesCodecTraits, CodecChain, CodecOptions, FillValue};
use zarrs::metadata::v3::MetadataV3;
use zrecord::memory::Allocator;
use zrecord::store::SourceView;
use zrecord::zarr::{AxisSelection, Assembler, BatchSpec, CacheLimits, CropSource, Crops, Limits, Pipeline, Query, QueueLimits};
use zrecord::Error;

const SHAPE: [u64; 3] = [10, 20, 12];

fn reference() -> Vec<u16> {
    (0..SHAPE.iter().product::<u64>()).map(|i| (i * 7 % 65521) as u16).collect()
}

fn at(r: &[u16], z: i64, y: i64, x: i64) -> Option<u16> {
    let s = SHAPE.map(|v| v as i64);
    if z < 0 || y < 0 || x < 0 || z >= s[0] || y >= s[1] || x >= s[2] {
        return None;
    }
    Some(r[((z * s[1] + y) * s[2] + x) as usize])
}

/// Write a v3 array whose outer grid is `grid` with `codecs` (sharded or not), skipping the
/// grid cells in `skip`.
fn write_array(dir: &Path, grid: [u64; 3], codecs: serde_json::Value, skip: &[[u64; 3]]) {
    std::fs::create_dir_all(dir).unwrap();
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": SHAPE, "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 9, "codecs": codecs,
    });
    std::fs::write(dir.join("zarr.json"), serde_json::to_vec_pretty(&meta).unwrap()).unwrap();
    let codec_meta: Vec<MetadataV3> = serde_json::from_value(meta["codecs"].clone()).unwrap();
    let chain = CodecChain::from_metadata(&codec_meta).unwrap();
    let r = reference();
    let n: Vec<u64> = (0..3).map(|d| SHAPE[d].div_ceil(grid[d])).collect();
    for i in 0..n[0] {
        for j in 0..n[1] {
            for k in 0..n[2] {
                if skip.contains(&[i, j, k]) {
                    continue;
                }
                let mut cell = Vec::with_capacity((grid[0] * grid[1] * grid[2]) as usize * 2);
                for z in 0..grid[0] {
                    for y in 0..grid[1] {
                        for x in 0..grid[2] {
                            let v = at(&r, (i * grid[0] + z) as i64, (j * grid[1] + y) as i64, (k * grid[2] + x) as i64).unwrap_or(9);
                            cell.extend_from_slice(&v.to_ne_bytes());
                        }
                    }
                }
                let shape: Vec<NonZeroU64> = grid.iter().map(|&g| NonZeroU64::new(g).unwrap()).collect();
                let enc = chain
                    .encode(ArrayBytes::new_flen(Cow::Owned(cell)), &shape, &zarrs::array::data_type::uint16(), &FillValue::from(9u16), &CodecOptions::default())
                    .unwrap();
                let p = dir.join(format!("c/{i}/{j}"));
                std::fs::create_dir_all(&p).unwrap();
                std::fs::write(p.join(k.to_string()), &*enc).unwrap();
            }
        }
    }
}

fn sharded(dir: &Path, skip: &[[u64; 3]]) {
    let codecs = serde_json::json!([{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [2, 5, 3],
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 3, "checksum": false}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "index_location": "end"}}]);
    write_array(dir, [4, 10, 6], codecs, skip);
}

fn expected_crop(aabb: &[(i64, i64)]) -> Vec<u16> {
    let r = reference();
    let mut out = Vec::new();
    for z in aabb[0].0..aabb[0].1 {
        for y in aabb[1].0..aabb[1].1 {
            for x in aabb[2].0..aabb[2].1 {
                out.push(at(&r, z, y, x).unwrap_or(9));
            }
        }
    }
    out
}

fn assembler() -> Assembler {
    Assembler::new(Limits { decode_workers: 2, ..Limits::default() }, CacheLimits::default()).unwrap()
}

#[test]
fn sharded_crops_and_whole_reads_match_the_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("a.zarr");
    sharded(&p, &[]);
    let uri = p.to_str().unwrap();
    let asm = assembler();
    let whole = asm.read(uri, None, None, &Allocator::default()).unwrap();
    assert_eq!(whole.shape(), &[10, 20, 12]);
    assert_eq!(whole.as_slice::<u16>().unwrap(), &reference()[..]);
    let crops: Vec<Vec<(i64, i64)>> = vec![
        vec![(0, 4), (0, 5), (0, 3)],
        vec![(3, 9), (8, 14), (4, 10)],
        vec![(-2, 4), (17, 23), (-1, 5)],
        vec![(12, 18), (0, 6), (0, 6)],
    ];
    for c in &crops {
        let shape: Vec<usize> = c.iter().map(|(a, b)| (b - a) as usize).collect();
        let _ = shape;
    }
    let same: Vec<Vec<(i64, i64)>> = vec![vec![(3, 9), (8, 14), (4, 10)], vec![(-2, 4), (17, 23), (-1, 5)], vec![(12, 18), (0, 6), (0, 6)], vec![(3, 9), (8, 14), (4, 10)]];
    let qs: Vec<Query> = same.iter().map(|c| Query::crop(uri, c)).collect();
    let t = asm.gather(&qs, None, None, &Allocator::default()).unwrap();
    assert_eq!(t.shape(), &[4, 6, 6, 6]);
    let v = t.as_slice::<u16>().unwrap();
    for (i, c) in same.iter().enumerate() {
        assert_eq!(&v[i * 216..(i + 1) * 216], &expected_crop(c)[..], "crop {c:?}");
    }
    let f = asm.gather(&[Query::crop(uri, &crops[0])], Some(zrecord::DType::Float32), None, &Allocator::default()).unwrap();
    let want: Vec<f32> = expected_crop(&crops[0]).iter().map(|&x| x as f32).collect();
    assert_eq!(f.as_slice::<f32>().unwrap(), &want[..]);
    let st = asm.stats();
    assert!(st.index_cache_hits > 0 && st.chunks_decoded > 0);
}

#[test]
fn index_queries_keep_order_and_duplicates() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("a.zarr");
    write_array(&p, [3, 7, 5], serde_json::json!([{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "zstd", "configuration": {"level": 1, "checksum": true}}]), &[]);
    let uri = p.to_str().unwrap();
    let q = Query::index(uri, vec![AxisSelection::Indices(vec![9, 0, 9]), AxisSelection::Slice { start: Some(-3), stop: None, step: 1 }, AxisSelection::Indices(vec![11, 2, 2, 0])]);
    let t = assembler().gather(&[q], None, None, &Allocator::default()).unwrap();
    assert_eq!(t.shape(), &[1, 3, 3, 4]);
    let r = reference();
    let mut want = Vec::new();
    for z in [9, 0, 9] {
        for y in [17, 18, 19] {
            for x in [11, 2, 2, 0] {
                want.push(at(&r, z, y, x).unwrap());
            }
        }
    }
    assert_eq!(t.as_slice::<u16>().unwrap(), &want[..]);
    let bad = Query::index(uri, vec![AxisSelection::Indices(vec![10]), AxisSelection::Range(0, 1), AxisSelection::Range(0, 1)]);
    assert!(matches!(assembler().gather(&[bad], None, None, &Allocator::default()).unwrap_err().root(), Error::IndexOutOfRange { index: 10, .. }));
}

#[test]
fn missing_shards_fill_and_corrupt_indexes_fail() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("a.zarr");
    sharded(&p, &[[1, 1, 1]]);
    let uri = p.to_str().unwrap();
    let t = assembler().read(uri, None, None, &Allocator::default()).unwrap();
    let v = t.as_slice::<u16>().unwrap();
    let r = reference();
    for (i, (&got, &want)) in v.iter().zip(&r).enumerate() {
        let (z, y, x) = (i / 240, i / 12 % 20, i % 12);
        let missing = (4..8).contains(&z) && (10..20).contains(&y) && (6..12).contains(&x);
        assert_eq!(got, if missing { 9 } else { want }, "at {z},{y},{x}");
    }
    // Flip a byte of shard (0,0,0)'s index: its crc32c no longer matches.
    let shard = p.join("c/0/0/0");
    let mut b = std::fs::read(&shard).unwrap();
    let n = b.len();
    b[n - 6] ^= 0xFF;
    std::fs::write(&shard, b).unwrap();
    let e = assembler().read(uri, None, None, &Allocator::default()).unwrap_err();
    assert!(e.is_corruption(), "{e}");
    assert!(e.to_string().contains("shard index"), "{e}");
}

#[test]
fn pipeline_streams_in_order_and_closes_promptly() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("a.zarr");
    sharded(&p, &[]);
    let uri = p.to_str().unwrap().to_string();
    let limits = Limits { decode_workers: 2, max_read_bytes: 1 << 20, max_chunk_bytes: 1 << 20, max_memory_bytes: 32 << 20 };
    let spec = BatchSpec { samples: 3, shape: vec![4, 5, 6], dtype: zrecord::DType::UInt16 };
    let pl = Pipeline::new(spec.clone(), limits, QueueLimits { lookahead_samples: 3, prepared_batches: 2 }, CacheLimits::default()).unwrap();
    let crop = |i: i64| vec![(i % 7, i % 7 + 4), (i % 16, i % 16 + 5), (i % 7 - 1, i % 7 + 5)];
    let u = uri.clone();
    pl.push(Box::new((0..).map(move |i| Ok(Query::crop(u.clone(), &crop(i)))))).unwrap();
    for b in 0..4u64 {
        let batch = pl.pop(Some(Duration::from_secs(30))).unwrap();
        assert_eq!(batch.index, b);
        let v = batch.tensor.as_slice::<u16>().unwrap();
        for k in 0..3 {
            let i = (b * 3 + k) as i64;
            assert_eq!(&v[k as usize * 120..(k as usize + 1) * 120], &expected_crop(&crop(i))[..], "batch {b} sample {k}");
        }
    }
    let t0 = std::time::Instant::now();
    pl.close();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(matches!(pl.pop(Some(Duration::from_millis(10))).unwrap_err(), Error::Closed { .. }));

    // A budget smaller than one batch plus scratch is refused up front.
    let tight = Limits { max_memory_bytes: 1 << 10, ..limits };
    assert!(matches!(Pipeline::new(spec, tight, QueueLimits::default(), CacheLimits::default()).unwrap_err().root(), Error::MemoryLimit { .. }));
}

#[test]
fn crop_source_is_a_record_source() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("a.zarr");
    sharded(&p, &[]);
    let uri = p.to_str().unwrap();
    let asm = Arc::new(assembler());
    let list = vec![vec![(0, 2), (0, 4), (0, 4)], vec![(8, 10), (16, 20), (8, 12)]];
    let src = CropSource::new(asm.clone(), uri, None, Crops::List(list.clone()), None).unwrap();
    let view = SourceView::new(Arc::new(src), &Allocator::default());
    let b = view.gather(&[1, 0, 1]).unwrap();
    let t = b.as_dense().unwrap();
    assert_eq!(t.shape(), &[3, 2, 4, 4]);
    let v = t.as_slice::<u16>().unwrap();
    assert_eq!(&v[..32], &expected_crop(&list[1])[..]);
    assert_eq!(&v[32..64], &expected_crop(&list[0])[..]);
    assert!(matches!(view.gather(&[2]).unwrap_err(), Error::IndexOutOfRange { index: 2, .. }));
    let rnd = CropSource::new(asm, uri, None, Crops::Random { shape: vec![4, 5, 6], count: 50, seed: 1 }, None).unwrap();
    for i in 0..50 {
        let c = rnd.crop(i);
        assert!(c.iter().zip(SHAPE).all(|(&(a, b), s)| a >= 0 && b as u64 <= s));
        assert_eq!(c, rnd.crop(i));
    }
}
