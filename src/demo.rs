//! Deterministic sample workloads (the built-in demo data, benchmark and test fixtures):
//! image-like dense records, Zipf-distributed token records, and ragged token sequences.

use crate::memory::PackedRagged;

pub use crate::rng::SplitMix64;

/// Image-like uint8 records `[channels, height, width]`: smooth gradients and blobs with a
/// little sensor noise, so codecs see realistic (moderate) redundancy.
pub fn vision(n: usize, channels: usize, height: usize, width: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; n * channels * height * width];
    let per = channels * height * width;
    for (i, rec) in out.chunks_mut(per.max(1)).enumerate().take(n) {
        let mut r = SplitMix64::new(seed.wrapping_add(i as u64 * 7919));
        let (gx, gy) = (r.next_f64() * 2.0 - 1.0, r.next_f64() * 2.0 - 1.0);
        let blobs: Vec<(f64, f64, f64, f64)> = (0..4)
            .map(|_| (r.next_f64() * width as f64, r.next_f64() * height as f64, 8.0 + r.next_f64() * 40.0, r.next_f64() * 120.0 - 60.0))
            .collect();
        for c in 0..channels {
            let base = 60.0 + r.next_f64() * 120.0;
            let plane = &mut rec[c * height * width..(c + 1) * height * width];
            for y in 0..height {
                for x in 0..width {
                    let mut v = base + gx * x as f64 * 0.4 + gy * y as f64 * 0.4;
                    for &(bx, by, rad, amp) in &blobs {
                        let d2 = (x as f64 - bx).powi(2) + (y as f64 - by).powi(2);
                        if d2 < rad * rad {
                            v += amp * (1.0 - d2 / (rad * rad));
                        }
                    }
                    let noise = (r.next_u64() % 7) as f64 - 3.0;
                    plane[y * width + x] = (v + noise).clamp(0.0, 255.0) as u8;
                }
            }
        }
    }
    out
}

/// A Zipf(s) sampler over `0..vocab` by inverse CDF.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// Build for `vocab` ids with exponent `s`.
    pub fn new(vocab: usize, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(vocab);
        let mut acc = 0.0;
        for k in 1..=vocab {
            acc += 1.0 / (k as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    /// Draw one id.
    #[inline]
    pub fn sample(&self, r: &mut SplitMix64) -> i32 {
        let u = r.next_f64();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as i32
    }
}

/// Dense token records: `n * len` Zipf(1.1) ids over a 50k vocabulary.
pub fn tokens_dense(n: usize, len: usize, seed: u64) -> Vec<i32> {
    let z = Zipf::new(50_000, 1.1);
    let mut r = SplitMix64::new(seed);
    (0..n * len).map(|_| z.sample(&mut r)).collect()
}

/// Ragged 1-D token records: lengths log-normal around 129, clipped to 16..=512.
pub fn tokens_ragged(n: usize, seed: u64) -> PackedRagged<i32> {
    let z = Zipf::new(50_000, 1.1);
    let mut r = SplitMix64::new(seed);
    let mut p = PackedRagged { values: Vec::new(), cu_seqlens: vec![0], shapes: Vec::with_capacity(n), ndim: 1 };
    for _ in 0..n {
        let len = ((129f64.ln() + 0.7 * r.normal()).exp().round() as usize).clamp(16, 512);
        for _ in 0..len {
            p.values.push(z.sample(&mut r));
        }
        p.cu_seqlens.push(p.values.len() as i32);
        p.shapes.push(len as u64);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_shaped() {
        assert_eq!(tokens_dense(3, 8, 1), tokens_dense(3, 8, 1));
        assert_ne!(tokens_dense(3, 8, 1), tokens_dense(3, 8, 2));
        let r = tokens_ragged(2001, 5);
        let mut lens: Vec<u64> = r.shapes.clone();
        lens.sort();
        let median = lens[1000];
        assert!((100..=160).contains(&median), "median {median}");
        assert!(lens[0] >= 16 && lens[2000] <= 512);
        let v = vision(2, 3, 16, 16, 0);
        assert_eq!(v.len(), 2 * 3 * 256);
        assert_eq!(v, vision(2, 3, 16, 16, 0));
    }
}
