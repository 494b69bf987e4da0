#![allow(dead_code, clippy::unwrap_used)]
//! Shared fixtures: deterministic random data and naive reference gathers.

use zrecord::prelude::*;
use zrecord::demo::SplitMix64;

pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut r = SplitMix64::new(seed);
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let x = r.next_u64();
        // Mix compressible runs with noise so codecs do real work.
        if x.is_multiple_of(3) {
            v.extend(std::iter::repeat_n((x >> 8) as u8, ((x >> 16) % 9) as usize));
        } else {
            v.extend_from_slice(&x.to_le_bytes()[..((x >> 20) % 8 + 1) as usize]);
        }
    }
    v.truncate(n);
    v
}

/// Records of variable shape as (bytes, shape) for a ragged store.
pub struct RaggedFixture {
    pub dtype: DType,
    pub ndim: usize,
    pub records: Vec<(Vec<u8>, Vec<u64>)>,
}

impl RaggedFixture {
    pub fn new(dtype: DType, ndim: usize, n: usize, max_dim: u64, seed: u64) -> Self {
        let mut r = SplitMix64::new(seed);
        let records = (0..n)
            .map(|i| {
                let shape: Vec<u64> = (0..ndim).map(|_| 1 + r.below(max_dim)).collect();
                let numel: u64 = shape.iter().product();
                (random_bytes(numel as usize * dtype.size(), seed * 1000 + i as u64), shape)
            })
            .collect();
        RaggedFixture { dtype, ndim, records }
    }

    /// Packed (values bytes, cu_seqlens, shapes) of records `lo..hi`.
    pub fn packed(&self, lo: usize, hi: usize) -> (Vec<u8>, Vec<i32>, Vec<u64>) {
        let mut values = Vec::new();
        let mut cu = vec![0i32];
        let mut shapes = Vec::new();
        for (b, s) in &self.records[lo..hi] {
            values.extend_from_slice(b);
            cu.push((values.len() / self.dtype.size()) as i32);
            shapes.extend_from_slice(s);
        }
        (values, cu, shapes)
    }

    pub fn append_to(&self, w: &mut RaggedWriter, lo: usize, hi: usize) -> Result<()> {
        let (values, cu, shapes) = self.packed(lo, hi);
        let input = RaggedInput::new(
            TensorView::new(&values, self.dtype, vec![values.len() / self.dtype.size()]),
            TensorView::from_slice(&cu, &[cu.len()]),
            TensorView::from_slice(&shapes, &[hi - lo, self.ndim]),
        );
        w.append(&input)
    }

    /// Check a gathered batch against the reference records `ids`.
    pub fn check(&self, b: &RaggedBatch, ids: &[u64]) {
        assert_eq!(b.len(), ids.len());
        assert_eq!(b.dtype(), self.dtype);
        assert_eq!(b.ndim(), self.ndim);
        let (values, cu, shapes) = {
            let mut values = Vec::new();
            let mut cu = vec![0i32];
            let mut shapes = Vec::new();
            for &i in ids {
                let (bytes, s) = &self.records[i as usize];
                values.extend_from_slice(bytes);
                cu.push((values.len() / self.dtype.size()) as i32);
                shapes.extend_from_slice(s);
            }
            (values, cu, shapes)
        };
        assert_eq!(b.cu_seqlens_slice(), &cu[..]);
        assert_eq!(b.shapes_slice(), &shapes[..]);
        assert!(b.values().as_bytes() == &values[..], "values differ");
    }
}

/// Reference dense gather: slice the input bytes.
pub fn dense_reference(data: &[u8], record_bytes: usize, ids: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() * record_bytes);
    for &i in ids {
        out.extend_from_slice(&data[i as usize * record_bytes..(i as usize + 1) * record_bytes]);
    }
    out
}

pub fn random_ids(n: u64, k: usize, seed: u64) -> Vec<u64> {
    let mut r = SplitMix64::new(seed);
    (0..k).map(|_| r.below(n)).collect()
}

/// A dictionary trained on the given sample bytes (enough samples guaranteed).
pub fn dict_for(samples: &[Vec<u8>]) -> Vec<u8> {
    let mut s: Vec<Vec<u8>> = samples.to_vec();
    while s.len() < 64 {
        let k = s.len();
        let mut x = s[k % samples.len()].clone();
        x.reverse();
        s.push(x);
    }
    train_dict(&s[..], 4096).unwrap()
}

/// Run the `#[ignore]`d test `helper` of the current test binary as a child process with
/// `env` set, stdout piped (for "started" lines), stderr discarded.
pub fn spawn_helper(helper: &str, env: (&str, String)) -> (std::process::Child, std::io::BufReader<std::process::ChildStdout>) {
    spawn_helper_with(helper, &[env])
}

/// [`spawn_helper`] with several environment variables.
#[allow(dead_code)]
pub fn spawn_helper_with(helper: &str, envs: &[(&str, String)]) -> (std::process::Child, std::io::BufReader<std::process::ChildStdout>) {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([helper, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    (child, out)
}
