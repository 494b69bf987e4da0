//! Gather throughput: IID batches of 256 on the three workloads for raw / zstd / zstd_dict,
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! each group with its limits measured in the same run (a plain memcpy of the same bytes from
//! one contiguous buffer, and single-thread zstd decompression of the same records). Ends with
//! a ratio table. `ZREC_BENCH_SCALE=0.1` runs a quick, smaller version.

mod common;

use std::hint::black_box;

use common::*;
use criterion::Throughput;
use zrecord::prelude::*;
use zrecord::demo::SplitMix64;

const BATCH: usize = 256;
/// Distinct pre-drawn batches cycled through: 1M ids, so the working set is the whole dataset.
const BATCHES: usize = 4096;

/// A workload measured cold: (name, batch bytes, fio's (IOPS, block size)).
type ColdRow = (&'static str, f64, Option<(f64, usize)>);

struct Row {
    workload: &'static str,
    codec: Codec,
    batch_bytes: f64,
    ours_ns: f64,
    memcpy_ns: f64,
    zstd1_ns: Option<f64>,
}

fn main() {
    let mut c = common::criterion(3);
    let threads = rayon::current_num_threads();
    let dir = bench_dir("gather");
    let alloc = Allocator::default();
    let mut rows = Vec::new();
    let mut cold_rows: Vec<ColdRow> = Vec::new();
    for w in Workload::all(true) {
        let dict = w.dictionary();
        let mut rng = SplitMix64::new(1);
        let batches: Vec<Vec<u64>> = (0..BATCHES).map(|_| (0..BATCH).map(|_| rng.below(w.n as u64)).collect()).collect();
        let batch_bytes: f64 = batches.iter().map(|b| b.iter().map(|&i| w.record(i as usize).len()).sum::<usize>() as f64).sum::<f64>() / BATCHES as f64;
        let group_name = format!("gather_{}", w.name);
        for codec in Codec::ALL {
            if !codec_enabled(codec) {
                continue;
            }
            let path = dir.join(format!("{}_{codec}", w.name));
            let opts = WriterOptions { codec, dictionary: (codec == Codec::ZstdDict).then(|| dict.clone()), ..Default::default() };
            w.write(&path, opts).expect("write");
            let store = Store::open(&path).expect("open");
            let mut g = c.benchmark_group(&group_name);
            g.throughput(Throughput::Bytes(batch_bytes as u64));
            let mut k = 0usize;
            match &store {
                Store::Dense(s) => {
                    let mut v = s.bind(&alloc);
                    g.bench_function(format!("zrecord_{codec}"), |b| b.iter(|| { k = (k + 1) % BATCHES; black_box(v.gather(&batches[k]).expect("gather")); }));
                    v.set_verify_checksums(false);
                    g.bench_function(format!("zrecord_{codec}_nocheck"), |b| b.iter(|| { k = (k + 1) % BATCHES; black_box(v.gather(&batches[k]).expect("gather")); }));
                }
                Store::Ragged(s) => {
                    let mut v = s.bind(&alloc);
                    g.bench_function(format!("zrecord_{codec}"), |b| b.iter(|| { k = (k + 1) % BATCHES; black_box(v.gather(&batches[k]).expect("gather")); }));
                    v.set_verify_checksums(false);
                    g.bench_function(format!("zrecord_{codec}_nocheck"), |b| b.iter(|| { k = (k + 1) % BATCHES; black_box(v.gather(&batches[k]).expect("gather")); }));
                }
            }
            // The same gather through the record-source seam (`Arc<dyn RecordSource>`, what the
            // loader and SQL use), and through positional reads instead of the mapping.
            let sv = SourceView::new(store.source(), &alloc);
            g.bench_function(format!("zrecord_{codec}_source"), |b| b.iter(|| { k = (k + 1) % BATCHES; black_box(sv.gather(&batches[k]).expect("gather")); }));
            let pread = Store::open_at(&zrecord::store::LocalFolder::new(&path, zrecord::store::ReadMode::Pread)).expect("open");
            let pv = SourceView::new(pread.source(), &alloc);
            g.bench_function(format!("zrecord_{codec}_pread"), |b| b.iter(|| { k = (k + 1) % BATCHES; black_box(pv.gather(&batches[k]).expect("gather")); }));
            // Single-thread zstd decode of the same records, from in-memory frames.
            if codec != Codec::Raw {
                let level = zrecord::store::DEFAULT_LEVEL;
                let mut cctx = zstd::bulk::Compressor::new(level).expect("cctx");
                if codec == Codec::ZstdDict {
                    cctx = zstd::bulk::Compressor::with_dictionary(level, &dict).expect("cctx");
                }
                let frames: Vec<Vec<u8>> = (0..w.n).map(|i| cctx.compress(w.record(i)).expect("compress")).collect();
                let mut dctx = if codec == Codec::ZstdDict { zstd::bulk::Decompressor::with_dictionary(&dict).expect("d") } else { zstd::bulk::Decompressor::new().expect("d") };
                let mut out = vec![0u8; (0..w.n).map(|i| w.record(i).len()).max().unwrap_or(0) * BATCH];
                let mut k = 0usize;
                g.bench_function(format!("zstd_1thread_{codec}"), |b| b.iter(|| {
                    k = (k + 1) % BATCHES;
                    let mut at = 0;
                    for &i in &batches[k] {
                        let n = dctx.decompress_to_buffer(&frames[i as usize], &mut out[at..]).expect("decode");
                        at += n;
                    }
                    black_box(&out);
                }));
            }
            g.finish();
            // Cold: every batch starts with the store's pages evicted from memory (its mapped
            // pages released, the files dropped from the page cache).
            if cold_enabled() && codec != Codec::ZstdDict {
                // Dirty pages (the store was just written) cannot be evicted: write them back.
                // SAFETY: sync takes no arguments and cannot fail.
                unsafe { libc::sync() };
                let mut g = c.benchmark_group(format!("gather_cold_{}", w.name));
                g.throughput(Throughput::Bytes(batch_bytes as u64));
                g.sample_size(10).warm_up_time(std::time::Duration::from_millis(500));
                // `faults`: cold mode forced off before each batch (page faults only); `data_only`:
                // the data files evicted, the index and shape rows left in the page cache (a
                // dataset larger than RAM keeps its small, often-read metadata cached).
                let cold = |g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, id: String, st: &Store, v: &SourceView, faults: bool, data_only: bool| {
                    let mut k = 0usize;
                    g.bench_function(id, |b| {
                        b.iter_custom(|iters| {
                            let mut t = std::time::Duration::ZERO;
                            for _ in 0..iters {
                                k = (k + 1) % BATCHES;
                                if data_only {
                                    st.release_pages(false);
                                    evict_data_files(&path);
                                } else {
                                    st.release_pages(true);
                                }
                                if faults {
                                    st.set_cold(false);
                                }
                                let s = std::time::Instant::now();
                                black_box(v.gather(&batches[k]).expect("gather"));
                                t += s.elapsed();
                            }
                            t
                        })
                    });
                };
                cold(&mut g, format!("zrecord_{codec}"), &store, &sv, false, false);
                cold(&mut g, format!("zrecord_{codec}_faults"), &store, &sv, true, false);
                cold(&mut g, format!("zrecord_{codec}_pread"), &pread, &pv, false, false);
                cold(&mut g, format!("zrecord_{codec}_data_only"), &store, &sv, false, true);
                g.finish();
                store.set_cold(false);
                if codec == Codec::Raw {
                    cold_rows.push((w.name, batch_bytes, fio_randread(&path, batch_bytes / BATCH as f64)));
                }
            }
            rows.push(Row { workload: w.name, codec, batch_bytes, ours_ns: 0.0, memcpy_ns: 0.0, zstd1_ns: None });
        }
        // memcpy of the same number of bytes from one contiguous buffer as large as the
        // dataset (so, like the store's pages, the source is not cache-resident).
        let n = batch_bytes as usize;
        let src = vec![3u8; w.total_bytes().max(64 << 20) + n];
        let mut dst = vec![0u8; n];
        let windows = (src.len() - n) / 4096;
        let mut rng = SplitMix64::new(2);
        let mut g = c.benchmark_group(&group_name);
        g.throughput(Throughput::Bytes(n as u64));
        g.bench_function("memcpy", |b| b.iter(|| {
            let at = rng.below(windows as u64) as usize * 4096;
            dst.copy_from_slice(black_box(&src[at..at + n]));
            black_box(&dst);
        }));
        g.finish();
        let _ = std::fs::remove_dir_all(dir.join(format!("{}_raw", w.name)));
    }
    // Opening a store of 100M records (sparse files): O(1) in the record count.
    {
        let p = dir.join("huge");
        sparse_store(&p, 100_000_000);
        let mut g = c.benchmark_group("open");
        g.bench_function("open_100m_records", |b| b.iter(|| black_box(DenseStore::open(&p).expect("open"))));
        g.finish();
    }
    c.final_summary();
    let _ = std::fs::remove_dir_all(&dir);

    println!("\n## Gather, IID batches of {BATCH} ({threads} threads)\n");
    println!("| workload | codec | zrecord GiB/s | records/s | memcpy GiB/s | x memcpy | zstd 1-thread GiB/s | x (1-thread x {threads}) | unchecked GiB/s |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &mut rows {
        let g = format!("gather_{}", r.workload);
        r.ours_ns = mean_ns(&g, &format!("zrecord_{}", r.codec)).unwrap_or(f64::NAN);
        r.memcpy_ns = mean_ns(&g, "memcpy").unwrap_or(f64::NAN);
        r.zstd1_ns = mean_ns(&g, &format!("zstd_1thread_{}", r.codec));
        let ours = gib(r.batch_bytes, r.ours_ns);
        let mc = gib(r.batch_bytes, r.memcpy_ns);
        let (z, zr) = match r.zstd1_ns {
            Some(z) => {
                let zg = gib(r.batch_bytes, z);
                (format!("{zg:.2}"), format!("{:.2}x", ours / (zg * threads as f64)))
            }
            None => ("-".into(), "-".into()),
        };
        let unchecked = mean_ns(&g, &format!("zrecord_{}_nocheck", r.codec)).map(|ns| gib(r.batch_bytes, ns)).unwrap_or(f64::NAN);
        println!("| {} | {} | {ours:.2} | {:.0} | {mc:.2} | {:.2}x | {z} | {zr} | {unchecked:.2} |", r.workload, r.codec, BATCH as f64 / (r.ours_ns * 1e-9), ours / mc);
    }
    if let Some(ns) = mean_ns("open", "open_100m_records") {
        println!("\nopen a 100M-record store: {:.1} us", ns / 1e3);
    }
    if !cold_rows.is_empty() {
        println!("\n## Cold gather (pages evicted before every batch of {BATCH}, IID)\n");
        println!("| workload | codec | zrecord records/s | page faults only (no prefetch) | pread store + prefetch | x faults | index cached, data cold | fio randread QD32 IOPS (bs) | zrecord / fio | index cached / fio |");
        println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (name, _bb, fio) in &cold_rows {
            for codec in [Codec::Raw, Codec::Zstd] {
                let g = format!("gather_cold_{name}");
                let rate = |id: String| mean_ns(&g, &id).map(|ns| BATCH as f64 / (ns * 1e-9));
                let (Some(ours), Some(faults), Some(pread), Some(data_only)) =
                    (rate(format!("zrecord_{codec}")), rate(format!("zrecord_{codec}_faults")), rate(format!("zrecord_{codec}_pread")), rate(format!("zrecord_{codec}_data_only")))
                else {
                    continue;
                };
                let (fio_txt, ratio, ratio_data) = match fio {
                    Some((iops, bs)) => (format!("{iops:.0} ({bs} B)"), format!("{:.2}x", ours / iops), format!("{:.2}x", data_only / iops)),
                    None => ("- (fio not installed)".into(), "-".into(), "-".into()),
                };
                println!("| {name} | {codec} | {ours:.0} | {faults:.0} | {pread:.0} | {:.2}x | {data_only:.0} | {fio_txt} | {ratio} | {ratio_data} |", ours / faults);
            }
        }
    }
}

/// Drop a store's data files (not its index or shapes) from the page cache.
fn evict_data_files(store: &std::path::Path) {
    use std::os::fd::AsRawFd;
    for e in std::fs::read_dir(store).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with("data-") {
            if let Ok(f) = std::fs::File::open(e.path()) {
                // SAFETY: posix_fadvise only reads its integer arguments; `f` is open.
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
        }
    }
}

/// `ZREC_BENCH_CODECS=raw,zstd` measures only those codecs (all by default).
fn codec_enabled(codec: Codec) -> bool {
    std::env::var("ZREC_BENCH_CODECS").map(|v| v.split(',').any(|c| c.trim() == codec.to_string())).unwrap_or(true)
}

/// Cold measurements run unless `ZREC_BENCH_COLD=0`.
fn cold_enabled() -> bool {
    std::env::var("ZREC_BENCH_COLD").map(|v| v != "0").unwrap_or(true)
}

/// The device's random-read rate at queue depth 32 over the store's data files, as `fio`
/// measures it (direct I/O, so the page cache plays no part): (IOPS, block size), the block
/// being one record rounded up to whole pages (what a cold record read costs). `None` when
/// fio is not installed.
fn fio_randread(store: &std::path::Path, record_bytes: f64) -> Option<(f64, usize)> {
    let bs = ((record_bytes as usize).max(1)).div_ceil(4096) * 4096;
    let files: Vec<String> = std::fs::read_dir(store).ok()?.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("data-"))).map(|p| p.display().to_string()).collect();
    let out = std::process::Command::new("fio")
        .args(["--name=randread", "--rw=randread", "--readonly", "--direct=1", "--ioengine=libaio", "--iodepth=32", "--time_based", "--runtime=4", "--output-format=json"])
        .arg(format!("--bs={bs}"))
        .arg(format!("--filename={}", files.join(":")))
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((v["jobs"][0]["read"]["iops"].as_f64()?, bs))
}

/// A 100M-record store whose index and data are sparse files.
fn sparse_store(path: &std::path::Path, n: u64) {
    use std::io::Write;
    use zrecord::store::format::{self, FileEntry, Kind, Manifest};
    std::fs::create_dir(path).expect("dir");
    let mk = |name: &str, header: [u8; 64], len: u64| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(path.join(name)).expect("file");
        f.write_all(&header).expect("header");
        f.set_len(len).expect("len");
        FileEntry { name: name.into(), bytes: len, xxh3: "0000000000000000".into() }
    };
    let files = vec![
        mk(format::INDEX, format::header(format::INDEX_MAGIC, format::ENTRY_BYTES as u32, 0), 64 + n * 24),
        mk(&format::shard_name(0), format::header(format::DATA_MAGIC, 0, 0), 64 + n),
    ];
    let m = Manifest {
        format: "zrecord".into(), version: format::FORMAT_VERSION, kind: Kind::Dense, dtype: "uint8".into(),
        item_shape: Some(vec![1]), ndim: None, logical: Default::default(), allow_empty: false, checksums_bind_dictionary: false, codec: "raw".into(), level: 0, record_count: n, data_shards: 1,
        raw_bytes: n, stored_bytes: n, files, created_by: "bench".into(), data_dir: None,
    };
    std::fs::write(path.join(format::MANIFEST), m.to_bytes().expect("manifest")).expect("write");
}
