//! Zarr crop assembly in Rust, each figure against a peer measured in the same run:
//! - a batch of 16 random (16, 64, 64) uint16 crops from a sharded zstd array (inner chunks
//!   16x64x64), assembled by `Assembler::gather`, vs decoding the same number of chunks with
//!   one thread's zstd (`zstd::bulk`, no scatter): the ratio says how close assembly runs to
//!   the decode limit (>= 1 means the pool beats one decoding thread);
//! - the same batch with every chunk in the decoded-chunk cache vs a plain `memcpy` of the
//!   output bytes (the floor of a scatter).
//!
//! `ZREC_BENCH_SCALE=0.1` runs a quick, smaller version. The Python comparison with
//! tensorstore / zarrs-python / zarr-python is `benches/python/zarr_crops.py`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::borrow::Cow;
use std::hint::black_box;
use std::num::NonZeroU64;
use std::path::Path;

use common::{bench_dir, mean_ns, scale};
use criterion::Throughput;
use zarrs::array::{ArrayBytes, ArrayToBytesCodecTraits, CodecChain, CodecOptions, FillValue};
use zarrs::metadata::v3::MetadataV3;
use zrecord::memory::Allocator;
use zrecord::demo::SplitMix64;
use zrecord::zarr::{Assembler, CacheLimits, Limits, Query};

const CROP: [u64; 3] = [16, 64, 64];
const INNER: [u64; 3] = [16, 64, 64];
const SAMPLES: usize = 16;

/// A sharded zstd uint16 array of `shape` (smooth + noise, compresses ~3x), written with
/// zarrs' own codec chain. Returns the encoded inner chunks of the first shard (for the
/// decode baseline).
fn write(dir: &Path, shape: [u64; 3], shard: [u64; 3]) -> Vec<Vec<u8>> {
    std::fs::create_dir_all(dir).unwrap();
    let inner_codecs = serde_json::json!([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 3, "checksum": false}}]);
    let codecs = serde_json::json!([{"name": "sharding_indexed", "configuration": {
        "chunk_shape": INNER, "codecs": inner_codecs,
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}], "index_location": "end"}}]);
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shard}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": codecs,
    });
    std::fs::write(dir.join("zarr.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
    let chain = CodecChain::from_metadata(&serde_json::from_value::<Vec<MetadataV3>>(codecs).unwrap()).unwrap();
    let inner = CodecChain::from_metadata(&serde_json::from_value::<Vec<MetadataV3>>(inner_codecs).unwrap()).unwrap();
    let mut rng = SplitMix64::new(1);
    let value = |z: u64, y: u64, x: u64, noise: u64| (1000.0 + 400.0 * (z as f64 / 9.0).sin() + 300.0 * (y as f64 / 23.0).cos() + 200.0 * (x as f64 / 17.0).sin()) as u16 + (noise % 64) as u16;
    let nz = |s: [u64; 3]| s.map(|v| NonZeroU64::new(v).unwrap());
    let mut first = Vec::new();
    for i in 0..shape[0] / shard[0] {
        for j in 0..shape[1] / shard[1] {
            for k in 0..shape[2] / shard[2] {
                let mut cell = Vec::with_capacity((shard.iter().product::<u64>() * 2) as usize);
                for z in 0..shard[0] {
                    for y in 0..shard[1] {
                        for x in 0..shard[2] {
                            cell.extend_from_slice(&value(i * shard[0] + z, j * shard[1] + y, k * shard[2] + x, rng.next_u64()).to_le_bytes());
                        }
                    }
                }
                if first.is_empty() {
                    // The first shard's inner chunks, encoded alone (decode baseline).
                    for cz in 0..shard[0] / INNER[0] {
                        for cy in 0..shard[1] / INNER[1] {
                            for cx in 0..shard[2] / INNER[2] {
                                let mut c = Vec::new();
                                for z in 0..INNER[0] {
                                    for y in 0..INNER[1] {
                                        let at = (((cz * INNER[0] + z) * shard[1] + cy * INNER[1] + y) * shard[2] + cx * INNER[2]) as usize * 2;
                                        c.extend_from_slice(&cell[at..at + INNER[2] as usize * 2]);
                                    }
                                }
                                let e = inner.encode(ArrayBytes::new_flen(Cow::Owned(c)), &nz(INNER), &zarrs::array::data_type::uint16(), &FillValue::from(0u16), &CodecOptions::default()).unwrap();
                                first.push(e.into_owned());
                            }
                        }
                    }
                }
                let enc = chain.encode(ArrayBytes::new_flen(Cow::Owned(cell)), &nz(shard), &zarrs::array::data_type::uint16(), &FillValue::from(0u16), &CodecOptions::default()).unwrap();
                let p = dir.join(format!("c/{i}/{j}"));
                std::fs::create_dir_all(&p).unwrap();
                std::fs::write(p.join(k.to_string()), &*enc).unwrap();
            }
        }
    }
    first
}

fn main() {
    let mut c = common::criterion(3);
    let dir = bench_dir("zarr");
    let s = scale();
    let side = if s < 0.5 { 256 } else { 512 };
    let shape = [64, side, side];
    let uri_path = dir.join("a.zarr");
    let chunks = write(&uri_path, shape, [32, 128, 128]);
    let uri = uri_path.to_str().unwrap().to_string();
    let mut rng = SplitMix64::new(7);
    let batches: Vec<Vec<Query>> = (0..32)
        .map(|_| {
            (0..SAMPLES)
                .map(|_| {
                    let o: Vec<i64> = (0..3).map(|d| rng.below(shape[d] - CROP[d] + 1) as i64).collect();
                    Query::crop(uri.clone(), &[(o[0], o[0] + 16), (o[1], o[1] + 64), (o[2], o[2] + 64)])
                })
                .collect()
        })
        .collect();
    let alloc = Allocator::cpu(256 << 20);
    let out_bytes = SAMPLES * CROP.iter().product::<u64>() as usize * 2;
    let plain = Assembler::new(Limits::default(), CacheLimits::default()).unwrap();
    let cached = Assembler::new(Limits::default(), CacheLimits { chunk_bytes: 1 << 30, ..CacheLimits::default() }).unwrap();
    for b in &batches {
        plain.gather(b, None, None, &alloc).unwrap();
        cached.gather(b, None, None, &alloc).unwrap();
    }
    let st = plain.stats();
    let chunks_per_batch = st.chunks_decoded as f64 / st.batches as f64;
    let decode_n = chunks_per_batch.round() as usize;
    let chunk_bytes = (INNER.iter().product::<u64>() * 2) as usize;

    let group = "zarr_crops";
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Bytes(out_bytes as u64));
    let mut i = 0;
    g.bench_function("assemble", |b| b.iter(|| { i = (i + 1) % batches.len(); black_box(plain.gather(&batches[i], None, None, &alloc).unwrap()); }));
    g.bench_function("decode_1_thread", |b| {
        let mut d = zstd::bulk::Decompressor::new().unwrap();
        let mut buf = Vec::with_capacity(chunk_bytes);
        b.iter(|| {
            for k in 0..decode_n {
                buf.clear();
                d.decompress_to_buffer(&chunks[k % chunks.len()], &mut buf).unwrap();
                black_box(&buf);
            }
        })
    });
    g.bench_function("assemble_cached", |b| b.iter(|| { i = (i + 1) % batches.len(); black_box(cached.gather(&batches[i], None, None, &alloc).unwrap()); }));
    let src = vec![7u8; out_bytes];
    g.bench_function("memcpy_output", |b| {
        b.iter(|| {
            let mut a = alloc.allocate(out_bytes).unwrap();
            // SAFETY: `a` holds at least `out_bytes` bytes; `src` is a distinct buffer.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), a.as_mut_ptr(), out_bytes) };
            black_box(a);
        })
    });
    g.finish();
    c.final_summary();
    let _ = std::fs::remove_dir_all(&dir);
    let get = |id: &str| mean_ns(group, id).unwrap_or(f64::NAN);
    let (asm, dec, cac, cpy) = (get("assemble"), get("decode_1_thread"), get("assemble_cached"), get("memcpy_output"));
    println!("\n## Zarr crop assembly ({SAMPLES} crops {CROP:?} uint16 from {shape:?}, sharded zstd, {} threads)\n", rayon::current_num_threads());
    println!("| batch | assemble | one thread decoding the same {decode_n} chunks | decode-1-thread / assemble | assemble, chunk cache | memcpy of the output | memcpy / cached |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} KiB out, read amplification {:.2} | {:.2} ms | {:.2} ms | {:.2}x | {:.3} ms | {:.3} ms | {:.2}x |",
        out_bytes >> 10,
        st.read_amplification(),
        asm / 1e6,
        dec / 1e6,
        dec / asm,
        cac / 1e6,
        cpy / 1e6,
        cpy / cac
    );
}
