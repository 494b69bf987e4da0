//! Write throughput on the three workloads for raw / zstd / zstd_dict, with limits measured
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! in the same run: writing the same bytes to one file with fsync (page-cache / disk speed)
//! and single-thread zstd compression of the same records. Ends with a ratio table.

mod common;

use std::hint::black_box;
use std::io::Write;

use common::*;
use criterion::Throughput;
use zrecord::prelude::*;

fn main() {
    let mut c = common::criterion(4).sample_size(10);
    let shards = WriterOptions::default().data_shards;
    let workers = shards.min(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let dir = bench_dir("write");
    let mut names = Vec::new();
    for w in Workload::all(false) {
        let dict = w.dictionary();
        let total = w.total_bytes();
        let group = format!("write_{}", w.name);
        let mut g = c.benchmark_group(&group);
        g.throughput(Throughput::Bytes(total as u64));
        let mut k = 0u64;
        for codec in Codec::ALL {
            g.bench_function(format!("zrecord_{codec}"), |b| b.iter(|| {
                k += 1;
                let p = dir.join(format!("{}_{codec}_{k}", w.name));
                let opts = WriterOptions { codec, dictionary: (codec == Codec::ZstdDict).then(|| dict.clone()), ..Default::default() };
                w.write(&p, opts).expect("write");
                let _ = std::fs::remove_dir_all(&p);
            }));
        }
        g.bench_function("file_write_fsync", |b| b.iter(|| {
            k += 1;
            let p = dir.join(format!("plain_{k}"));
            let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&p).expect("create"));
            for i in 0..w.n {
                f.write_all(w.record(i)).expect("write");
            }
            f.into_inner().expect("flush").sync_all().expect("sync");
            let _ = std::fs::remove_file(&p);
        }));
        for (codec, d) in [(Codec::Zstd, None), (Codec::ZstdDict, Some(&dict))] {
            let mut cctx = match d {
                Some(d) => zstd::bulk::Compressor::with_dictionary(3, d).expect("cctx"),
                None => zstd::bulk::Compressor::new(3).expect("cctx"),
            };
            let max = (0..w.n).map(|i| w.record(i).len()).max().unwrap_or(0);
            let mut out = vec![0u8; zstd::zstd_safe::compress_bound(max)];
            g.bench_function(format!("zstd_1thread_{codec}"), |b| b.iter(|| {
                for i in 0..w.n {
                    black_box(cctx.compress_to_buffer(w.record(i), &mut out).expect("compress"));
                }
            }));
        }
        g.finish();
        names.push((w.name, total));
    }
    c.final_summary();
    let _ = std::fs::remove_dir_all(&dir);
    println!("\n## Write ({shards} data shards, {workers} cores)\n");
    println!("| workload | codec | zrecord GiB/s | limit | limit GiB/s | ratio |");
    println!("|---|---|---:|---|---:|---:|");
    for (name, total) in names {
        let g = format!("write_{name}");
        for codec in Codec::ALL {
            let ours = mean_ns(&g, &format!("zrecord_{codec}")).map(|ns| gib(total as f64, ns)).unwrap_or(f64::NAN);
            let (label, lim) = match codec {
                Codec::Raw => ("file write+fsync".to_string(), mean_ns(&g, "file_write_fsync").map(|ns| gib(total as f64, ns)).unwrap_or(f64::NAN)),
                _ => (format!("zstd 1-thread x {workers}"), mean_ns(&g, &format!("zstd_1thread_{codec}")).map(|ns| gib(total as f64, ns) * workers as f64).unwrap_or(f64::NAN)),
            };
            println!("| {name} | {codec} | {ours:.2} | {label} | {lim:.2} | {:.2}x |", ours / lim);
        }
    }
}
