#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
//! Bench workloads (generated deterministically at bench time), store building, and the
//! ratio summary read back from criterion's estimates.

use std::path::{Path, PathBuf};

use zrecord::prelude::*;
use zrecord::demo;

/// Scale factor from `ZREC_BENCH_SCALE` (default 1.0 = the sizes the issue names).
pub fn scale() -> f64 {
    std::env::var("ZREC_BENCH_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0)
}

pub enum Data {
    Dense { dtype: DType, item: Vec<usize>, bytes: Vec<u8> },
    Ragged(PackedRagged<i32>),
}

pub struct Workload {
    pub name: &'static str,
    pub n: usize,
    pub data: Data,
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Workload {
    pub fn dense_vision(n: usize) -> Workload {
        Workload { name: "dense_vision", n, data: Data::Dense { dtype: DType::UInt8, item: vec![3, 224, 224], bytes: demo::vision(n, 3, 224, 224, 7) } }
    }
    pub fn dense_tokens(n: usize) -> Workload {
        Workload { name: "dense_tokens", n, data: Data::Dense { dtype: DType::Int32, item: vec![512], bytes: i32_bytes(&demo::tokens_dense(n, 512, 8)) } }
    }
    pub fn ragged_tokens(n: usize) -> Workload {
        Workload { name: "ragged_tokens", n, data: Data::Ragged(demo::tokens_ragged(n, 9)) }
    }

    /// The three workloads at `scale()`; `ZREC_BENCH_ONLY=name[,name]` picks some.
    pub fn all(gather: bool) -> Vec<Workload> {
        let s = scale();
        let k = |n: f64| ((n * s) as usize).max(64);
        let only = std::env::var("ZREC_BENCH_ONLY").unwrap_or_default();
        let want = |name: &str| only.is_empty() || only.split(',').any(|o| o == name);
        let sizes = if gather { [2500.0, 200_000.0, 200_000.0] } else { [500.0, 50_000.0, 50_000.0] };
        let mut v = Vec::new();
        if want("dense_vision") {
            v.push(Self::dense_vision(k(sizes[0])));
        }
        if want("dense_tokens") {
            v.push(Self::dense_tokens(k(sizes[1])));
        }
        if want("ragged_tokens") {
            v.push(Self::ragged_tokens(k(sizes[2])));
        }
        v
    }

    /// Decoded bytes of record `i`.
    pub fn record(&self, i: usize) -> &[u8] {
        match &self.data {
            Data::Dense { bytes, .. } => {
                let rb = bytes.len() / self.n;
                &bytes[i * rb..(i + 1) * rb]
            }
            Data::Ragged(p) => {
                // SAFETY: i32 slice viewed as bytes (POD, exact length).
                let v = &p.values[p.cu_seqlens[i] as usize..p.cu_seqlens[i + 1] as usize];
                unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len() * 4) }
            }
        }
    }

    pub fn total_bytes(&self) -> usize {
        match &self.data {
            Data::Dense { bytes, .. } => bytes.len(),
            Data::Ragged(p) => p.values.len() * 4,
        }
    }

    pub fn dictionary(&self) -> Vec<u8> {
        let step = (self.n / 4000).max(1);
        let samples: Vec<Vec<u8>> = (0..self.n).step_by(step).map(|i| self.record(i).to_vec()).collect();
        train_dict(&samples[..], zrecord::store::DEFAULT_DICT_SIZE).expect("dictionary")
    }

    /// Write this workload as a store.
    pub fn write(&self, path: &Path, opts: WriterOptions) -> Result<()> {
        match &self.data {
            Data::Dense { dtype, item, bytes } => {
                let mut w = DenseWriter::create(path, *dtype, item, opts)?;
                let mut shape = vec![self.n];
                shape.extend_from_slice(item);
                w.append(&TensorView::new(bytes, *dtype, shape))?;
                w.finish()?;
            }
            Data::Ragged(p) => {
                let mut w = RaggedWriter::create(path, DType::Int32, 1, opts)?;
                w.append(&p.as_input())?;
                w.finish()?;
            }
        }
        Ok(())
    }
}

pub fn bench_dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("zrecord-bench-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("bench dir");
    d
}

/// Where criterion writes its estimates in this process.
pub fn criterion_dir() -> PathBuf {
    std::env::temp_dir().join(format!("zrecord-criterion-{}", std::process::id()))
}

/// Criterion writing its estimates where [`mean_ns`] reads them: 1 s warm-up, `secs` of
/// measurement, command-line options applied.
pub fn criterion(secs: u64) -> criterion::Criterion {
    criterion::Criterion::default()
        .output_directory(&criterion_dir())
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(secs))
        .configure_from_args()
}

/// Mean time per iteration (ns) of `group/id` from criterion's estimates.
pub fn mean_ns(group: &str, id: &str) -> Option<f64> {
    let p = criterion_dir().join(group).join(id).join("new").join("estimates.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).ok()?).ok()?;
    v["mean"]["point_estimate"].as_f64()
}

pub fn gib(bytes: f64, ns: f64) -> f64 {
    bytes / (ns * 1e-9) / (1u64 << 30) as f64
}
