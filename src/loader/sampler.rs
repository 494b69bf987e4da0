//! The stateless sampler: batch `step` is a pure function of `(n, batch_size, mode, seed,
//! step)`, identical on every platform (integer arithmetic only).
//!
//! - `Sequential`: ids `step * B + k (mod n)`.
//! - `Iid`: uniform with replacement, from a counter-based hash of `(seed, step, k)` reduced
//!   with Lemire's multiply-shift and deterministic rejection (exactly uniform).
//! - `Cyclic`: cycle `c` walks a keyed bijection of `[0, n)` (a balanced Feistel network over
//!   the next even power of two, with cycle walking), fresh for every cycle; each cycle yields
//!   `n / B` full batches, so the omitted remainder differs from cycle to cycle. No permutation
//!   array exists; `seek` is O(1).
//! - `Block`: cyclic over a locality-aware order: the full blocks of `block` contiguous records
//!   are permuted (fresh per cycle), taken `window` blocks at a time, and the records of each
//!   window are permuted among themselves (the last partial block comes last, shuffled within
//!   itself). A batch then touches a few blocks (a few coalesced range reads on remote or cold
//!   storage) instead of one place per record, at the cost of less randomness than `Cyclic`.

use crate::error::{Error, Result};

/// Sampling mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// In order, wrapping at the end.
    Sequential,
    /// Uniform with replacement.
    Iid,
    /// A fresh pseudo-random permutation per cycle, full batches only.
    Cyclic,
    /// Like `Cyclic`, over a block-shuffled order (see the module documentation).
    Block,
}

impl std::str::FromStr for Mode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Mode> {
        match s.to_ascii_lowercase().as_str() {
            "sequential" => Ok(Mode::Sequential),
            "iid" => Ok(Mode::Iid),
            "cyclic" => Ok(Mode::Cyclic),
            "block" => Ok(Mode::Block),
            other => Err(Error::invalid("mode", format!("'{other}' is not one of sequential, iid, cyclic, block"))),
        }
    }
}

use crate::rng::mix64 as mix;

#[inline(always)]
fn hash3(seed: u64, a: u64, b: u64) -> u64 {
    mix(mix(seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15)) ^ b.wrapping_mul(0xD1B5_4A32_D192_ED03))
}

const FEISTEL_ROUNDS: usize = 4;

/// A keyed bijection on `[0, n)`: a 4-round balanced Feistel network (Luby-Rackoff) with
/// per-round keys and a strong mixing round function, over `2^(2h) >= n` ids.
#[derive(Clone, Copy, Debug)]
struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; FEISTEL_ROUNDS],
}

impl Permutation {
    fn new(n: u64, key: u64) -> Self {
        let bits = 64 - (n.max(2) - 1).leading_zeros(); // ceil(log2 n), at least 1
        let mut keys = [0u64; FEISTEL_ROUNDS];
        for (i, k) in keys.iter_mut().enumerate() {
            *k = hash3(key, 0x0FE1_57E1, i as u64);
        }
        Permutation { n, half_bits: bits.div_ceil(2), keys }
    }

    #[inline(always)]
    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for k in self.keys {
            let f = mix(r ^ k) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half_bits) | r
    }

    /// Image of `x < n` (cycle walking keeps it inside `[0, n)`).
    #[inline]
    fn apply(&self, x: u64) -> u64 {
        let mut y = self.feistel(x);
        while y >= self.n {
            y = self.feistel(y);
        }
        y
    }
}

/// A stateless batch sampler over `[0, n)`.
///
/// ```
/// use zrecord::loader::{Mode, Sampler};
/// let mut s = Sampler::new(10, 4, Mode::Cyclic, 7).unwrap();
/// let first = s.next_batch().to_vec();
/// s.seek(0);
/// assert_eq!(s.next_batch(), &first[..]);
/// assert_eq!(Sampler::new(10, 4, Mode::Cyclic, 7).unwrap().batch(0), first);
/// ```
#[derive(Clone, Debug)]
pub struct Sampler {
    n: u64,
    batch_size: usize,
    mode: Mode,
    seed: u64,
    step: u64,
    buf: Vec<u64>,
    /// Block mode: records per block, blocks per shuffle window.
    block: u64,
    window: u64,
}

/// Block mode's default records per block (the Python `Sampler` default too).
pub const DEFAULT_BLOCK: u64 = 64;
/// Block mode's default blocks per shuffle window (the Python `Sampler` default too).
pub const DEFAULT_WINDOW: u64 = 16;

/// The largest batch a sampler draws: 2^24 ids (128 MiB of ids). Larger requests are typed
/// errors rather than allocations that abort the process.
pub const MAX_BATCH_SIZE: usize = 1 << 24;

impl Sampler {
    /// A sampler of `batch_size` ids from `[0, n)`. `n` may be up to 2^63; `batch_size` up to
    /// [`MAX_BATCH_SIZE`].
    pub fn new(n: u64, batch_size: usize, mode: Mode, seed: u64) -> Result<Sampler> {
        if n == 0 {
            return Err(Error::invalid("n", "the sampler needs at least one record"));
        }
        if n > 1 << 63 {
            return Err(Error::invalid("n", format!("{n} exceeds 2^63")));
        }
        if batch_size == 0 {
            return Err(Error::invalid("batch_size", "must be at least 1"));
        }
        if batch_size > MAX_BATCH_SIZE {
            return Err(Error::invalid("batch_size", format!("{batch_size} exceeds the largest batch a sampler draws ({MAX_BATCH_SIZE} ids)")));
        }
        if matches!(mode, Mode::Cyclic | Mode::Block) && batch_size as u64 > n {
            return Err(Error::invalid("batch_size", format!("{batch_size} exceeds the {n} records of one cycle (cyclic mode draws without replacement)")));
        }
        Ok(Sampler { n, batch_size, mode, seed, step: 0, buf: vec![0; batch_size], block: DEFAULT_BLOCK, window: DEFAULT_WINDOW })
    }

    /// Block mode's geometry: `block` records per block, `window` blocks per shuffle window
    /// (both at least 1; `block * window` at most 2^40).
    pub fn with_blocks(mut self, block: u64, window: u64) -> Result<Sampler> {
        if block == 0 || window == 0 || block.checked_mul(window).is_none_or(|r| r > 1 << 40) {
            return Err(Error::invalid("block", format!("block {block} x window {window}: each at least 1, their product at most 2^40")));
        }
        self.block = block;
        self.window = window;
        Ok(self)
    }

    /// Block mode's `(records per block, blocks per window)`.
    pub fn blocks(&self) -> (u64, u64) {
        (self.block, self.window)
    }

    /// Position `pos` of cycle `epoch`'s block-shuffled order.
    fn block_order(&self, epoch: u64, pos: u64) -> u64 {
        let b = self.block;
        let full = self.n / b;
        let key = hash3(self.seed, 0xB10C_B10C, epoch);
        let body = full * b;
        if pos >= body {
            let tail = self.n - body;
            return body + Permutation::new(tail, hash3(key, 0x7A11, 0)).apply(pos - body);
        }
        let span = self.window * b;
        let (w, q) = (pos / span, pos % span);
        let first = w * self.window;
        let m = self.window.min(full - first) * b;
        let q = Permutation::new(m, hash3(key, 0x3A11, w)).apply(q);
        let blk = Permutation::new(full, key).apply(first + q / b);
        blk * b + q % b
    }

    /// Records sampled from.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True never (a sampler has at least one record); for clippy's `len` convention.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Ids per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Sampling mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The step the next draw returns.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Position the sampler at `step` (O(1)).
    pub fn seek(&mut self, step: u64) {
        self.step = step;
    }

    /// Batches per cycle in cyclic mode (`n / batch_size`).
    pub fn batches_per_cycle(&self) -> u64 {
        self.n / self.batch_size as u64
    }

    /// Draw the batch at the current step into the reusable buffer and advance.
    pub fn next_batch(&mut self) -> &[u64] {
        let step = self.step;
        self.step += 1;
        let mut buf = std::mem::take(&mut self.buf);
        self.fill(step, &mut buf);
        self.buf = buf;
        &self.buf
    }

    /// The batch at `step`, freshly allocated (does not move the sampler).
    pub fn batch(&self, step: u64) -> Vec<u64> {
        let mut v = vec![0; self.batch_size];
        self.fill(step, &mut v);
        v
    }

    /// Write the batch at `step` into `out` (`out.len()` ids; normally `batch_size`).
    pub fn fill(&self, step: u64, out: &mut [u64]) {
        let b = self.batch_size as u64;
        match self.mode {
            Mode::Sequential => {
                let start = ((step as u128 * b as u128) % self.n as u128) as u64;
                let mut id = start;
                for o in out.iter_mut() {
                    *o = id;
                    id += 1;
                    if id == self.n {
                        id = 0;
                    }
                }
            }
            Mode::Iid => {
                let key = mix(self.seed ^ 0x1D_1D_1D_1D);
                // Lemire: reject the (rare) low products below 2^64 mod n.
                let threshold = self.n.wrapping_neg() % self.n;
                for (k, o) in out.iter_mut().enumerate() {
                    let mut ctr = k as u64;
                    loop {
                        let x = hash3(key, step, ctr);
                        let m = x as u128 * self.n as u128;
                        if (m as u64) >= threshold {
                            *o = (m >> 64) as u64;
                            break;
                        }
                        ctr = ctr.wrapping_add(1 << 40); // deterministic retry stream
                    }
                }
            }
            Mode::Cyclic => {
                let per_cycle = self.batches_per_cycle();
                let cycle = step / per_cycle;
                let j = step % per_cycle;
                let perm = Permutation::new(self.n, hash3(self.seed, 0xC1C1E, cycle));
                for (k, o) in out.iter_mut().enumerate() {
                    *o = perm.apply(j * b + k as u64);
                }
            }
            Mode::Block => {
                let per_cycle = self.batches_per_cycle();
                let (cycle, j) = (step / per_cycle, step % per_cycle);
                for (k, o) in out.iter_mut().enumerate() {
                    *o = self.block_order(cycle, j * b + k as u64);
                }
            }
        }
    }
}

impl Sampler {
    /// The ids at positions `start..start + out.len()` of epoch `epoch`'s order: the identity in
    /// sequential mode, cycle `epoch`'s permutation in cyclic mode (the same permutation the
    /// cyclic batches of that cycle walk, whatever the batch size). Lets a consumer split one
    /// epoch exactly (every id once) across workers and ranks, remainder included, without a
    /// dataset-sized array. Iid sampling has no epoch order.
    pub fn order(&self, epoch: u64, start: u64, out: &mut [u64]) -> Result<()> {
        let end = start.checked_add(out.len() as u64).filter(|&e| e <= self.n).ok_or_else(|| {
            Error::invalid("positions", format!("{start}..{start}+{} is outside the {} positions of an epoch", out.len(), self.n))
        })?;
        debug_assert!(end <= self.n);
        match self.mode {
            Mode::Sequential => {
                for (k, o) in out.iter_mut().enumerate() {
                    *o = start + k as u64;
                }
            }
            Mode::Cyclic => {
                let perm = Permutation::new(self.n, hash3(self.seed, 0xC1C1E, epoch));
                for (k, o) in out.iter_mut().enumerate() {
                    *o = perm.apply(start + k as u64);
                }
            }
            Mode::Block => {
                for (k, o) in out.iter_mut().enumerate() {
                    *o = self.block_order(epoch, start + k as u64);
                }
            }
            Mode::Iid => return Err(Error::invalid("mode", "iid sampling draws with replacement and has no epoch order")),
        }
        Ok(())
    }
}

impl Iterator for Sampler {
    type Item = Vec<u64>;
    fn next(&mut self) -> Option<Vec<u64>> {
        Some(self.next_batch().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_mode_is_a_permutation_of_few_blocks_per_window() {
        for (n, block, window) in [(1000u64, 10u64, 4u64), (1003, 16, 3), (50, 64, 2), (7, 1, 1)] {
            let s = Sampler::new(n, 1, Mode::Block, 3).unwrap().with_blocks(block, window).unwrap();
            for epoch in 0..3 {
                let mut order = vec![0u64; n as usize];
                s.order(epoch, 0, &mut order).unwrap();
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n {n} block {block} window {window}");
                // Every window of positions holds whole blocks, at most `window` of them.
                let full = (n / block) * block;
                for w in order[..full as usize].chunks((block * window) as usize) {
                    let mut blocks: Vec<u64> = w.iter().map(|id| id / block).collect();
                    blocks.sort_unstable();
                    blocks.dedup();
                    assert_eq!(blocks.len() as u64 * block, w.len() as u64);
                }
                assert!(order[full as usize..].iter().all(|&id| id >= full), "the partial block comes last");
            }
            let mut a = vec![0u64; n as usize];
            let mut b = vec![0u64; n as usize];
            s.order(0, 0, &mut a).unwrap();
            s.order(1, 0, &mut b).unwrap();
            assert!(n < 20 || a != b, "a fresh order per epoch");
        }
        let s = Sampler::new(1000, 10, Mode::Block, 1).unwrap().with_blocks(10, 4).unwrap();
        let mut order = vec![0u64; 1000];
        s.order(2, 0, &mut order).unwrap();
        assert_eq!(s.batch(2 * 100 + 7), order[70..80].to_vec());
        assert!(Sampler::new(10, 1, Mode::Block, 0).unwrap().with_blocks(0, 1).is_err());
        assert!(Sampler::new(10, 1, Mode::Block, 0).unwrap().with_blocks(1 << 30, 1 << 30).is_err());
    }

    #[test]
    fn epoch_order_matches_cyclic_batches_and_covers_every_id() {
        let (n, b) = (103u64, 10usize);
        let s = Sampler::new(n, b, Mode::Cyclic, 5).unwrap();
        for epoch in 0..3u64 {
            let mut order = vec![0u64; n as usize];
            s.order(epoch, 0, &mut order).unwrap();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>());
            for j in 0..s.batches_per_cycle() {
                let batch = s.batch(epoch * s.batches_per_cycle() + j);
                assert_eq!(&batch[..], &order[(j as usize) * b..(j as usize + 1) * b]);
            }
            // A different batch size walks the same permutation of the cycle.
            let one = Sampler::new(n, 1, Mode::Cyclic, 5).unwrap();
            assert_eq!(one.batch(epoch * n + 100), vec![order[100]]);
            let mut tail = vec![0u64; 3];
            s.order(epoch, 100, &mut tail).unwrap();
            assert_eq!(&tail[..], &order[100..]);
        }
        let seq = Sampler::new(n, b, Mode::Sequential, 0).unwrap();
        let mut v = vec![0u64; 4];
        seq.order(9, 99, &mut v).unwrap();
        assert_eq!(v, vec![99, 100, 101, 102]);
        assert!(seq.order(0, 100, &mut v).is_err());
        assert!(seq.order(0, u64::MAX, &mut v).is_err());
        assert!(Sampler::new(n, b, Mode::Iid, 0).unwrap().order(0, 0, &mut v).is_err());
    }

    #[test]
    fn permutation_is_a_bijection() {
        for n in [1u64, 2, 3, 7, 64, 100, 1000, 4097] {
            let p = Permutation::new(n, 99);
            let mut seen = vec![false; n as usize];
            for x in 0..n {
                let y = p.apply(x);
                assert!(y < n);
                assert!(!seen[y as usize], "n={n} collision");
                seen[y as usize] = true;
            }
        }
    }

    #[test]
    fn cyclic_epochs_are_permutations_with_moving_remainder() {
        let n = 1003u64;
        let b = 10usize;
        let s = Sampler::new(n, b, Mode::Cyclic, 5).unwrap();
        let per = s.batches_per_cycle();
        assert_eq!(per, 100);
        let mut remainders = Vec::new();
        for cycle in 0..3 {
            let mut seen = vec![0u32; n as usize];
            for j in 0..per {
                for id in s.batch(cycle * per + j) {
                    seen[id as usize] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c <= 1), "no id twice in a cycle");
            assert_eq!(seen.iter().filter(|&&c| c == 1).count(), 1000);
            let rem: Vec<usize> = (0..n as usize).filter(|&i| seen[i] == 0).collect();
            remainders.push(rem);
        }
        assert_ne!(remainders[0], remainders[1]);
        assert_ne!(s.batch(0), s.batch(per), "each cycle has its own order");
    }

    #[test]
    fn iid_is_uniform_chi_square() {
        let n = 50u64;
        let s = Sampler::new(n, 1000, Mode::Iid, 3).unwrap();
        let mut counts = vec![0f64; n as usize];
        for step in 0..100 {
            for id in s.batch(step) {
                counts[id as usize] += 1.0;
            }
        }
        let expected = 100_000.0 / n as f64;
        let chi2: f64 = counts.iter().map(|c| (c - expected).powi(2) / expected).sum();
        // 49 degrees of freedom: the 99.9% quantile is about 85.4.
        assert!(chi2 < 85.4, "chi2 = {chi2}");
    }

    #[test]
    fn sequential_wraps_and_seek_is_exact() {
        let mut s = Sampler::new(5, 3, Mode::Sequential, 0).unwrap();
        assert_eq!(s.next_batch(), &[0, 1, 2]);
        assert_eq!(s.next_batch(), &[3, 4, 0]);
        s.seek(1000);
        assert_eq!(s.next_batch(), &[0, 1, 2]); // 3000 % 5 == 0
        let big = Sampler::new(1 << 63, 4, Mode::Cyclic, 1).unwrap();
        assert!(big.batch(123_456_789).iter().all(|&x| x < 1 << 63));
        let iid = Sampler::new(1 << 63, 4, Mode::Iid, 1).unwrap();
        assert!(iid.batch(u64::MAX).iter().all(|&x| x < 1 << 63));
    }

    #[test]
    fn seeds_and_platform_stable_values() {
        let a = Sampler::new(1000, 8, Mode::Iid, 1).unwrap();
        let b = Sampler::new(1000, 8, Mode::Iid, 2).unwrap();
        assert_ne!(a.batch(0), b.batch(0));
        assert_ne!(a.batch(0), a.batch(1));
        // Golden values: the same seed gives the same stream on every platform.
        assert_eq!(Sampler::new(1000, 4, Mode::Iid, 42).unwrap().batch(7), GOLDEN_IID);
        assert_eq!(Sampler::new(1000, 4, Mode::Cyclic, 42).unwrap().batch(7), GOLDEN_CYCLIC);
    }

    #[test]
    fn argument_errors() {
        assert!(Sampler::new(0, 1, Mode::Iid, 0).is_err());
        assert!(Sampler::new(10, 0, Mode::Iid, 0).is_err());
        assert!(Sampler::new(10, 11, Mode::Cyclic, 0).is_err());
        assert!(Sampler::new(10, 11, Mode::Iid, 0).is_ok());
        assert!("bogus".parse::<Mode>().is_err());
        assert_eq!("CYCLIC".parse::<Mode>().unwrap(), Mode::Cyclic);
    }

    const GOLDEN_IID: [u64; 4] = [177, 693, 953, 311];
    const GOLDEN_CYCLIC: [u64; 4] = [131, 46, 682, 598];
}
