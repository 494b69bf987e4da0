//! Dataset mixtures: every global batch drawn from several sources in set proportions,
//! deterministically and statelessly (step `s` is a pure function of the mixture and `s`).
//!
//! The record slots of the whole run (`batch_size` per step, back to back) are assigned to
//! sources by a fixed pattern of period `D`: with integer weights `a_i` summing to `D`, every
//! period of `D` slots holds exactly `a_i` slots of source `i`, spread by smooth weighted round
//! robin (each slot goes to the source furthest behind its share). So over any window the
//! records of source `i` are within a couple of records of `a_i / D` of the window, wherever
//! the window starts: no drift, unlike independent coin flips per record. Weights that are not
//! small integers are apportioned to `D = 2^16` (largest remainder, at least one slot each).
//!
//! Slot `j` of source `i` is that source's `C_i(j)`-th record (its slots before `j`); each
//! source walks its own stream of epochs: position `p` is epoch `p / n_i`, offset `p % n_i` of
//! its order (sequential, a fresh keyed permutation per epoch, or iid draws). Counting slots
//! per period makes `C_i` O(1), so any step is computed directly (O(1) seek) and a step number
//! is the whole state. Sources that wrap are counted, never re-weighted; with `max_epochs` a
//! source that would start epoch `max_epochs` is an error naming it.
//!
//! Ids are global over the sources concatenated in order (source `i`'s record `r` is
//! `starts[i] + r`), the id space of a [`crate::store::ConcatSource`] over the sources' views.

use crate::error::{Error, Result};
use crate::loader::sampler::{Mode, Sampler};

/// The most sources a mixture draws from.
pub const MAX_SOURCES: usize = 1024;
/// The pattern period used when weights are not small integers.
pub const SCALED_PERIOD: u64 = 1 << 16;
/// The largest period of integer weights taken as they are (larger sums are scaled).
pub const MAX_PERIOD: u64 = 1 << 20;
const BLOCK: usize = 64;

#[derive(Clone, Debug)]
struct Part {
    n: u64,
    start: u64,
    slots: u64,
    order: Sampler,
}

/// A deterministic weighted mixture of record sources (see the module documentation).
#[derive(Clone, Debug)]
pub struct Mixture {
    parts: Vec<Part>,
    period: u64,
    /// The source of each slot of one period.
    pattern: Vec<u16>,
    /// `blocks[k * parts + i]`: slots of source `i` among the first `k * BLOCK` of a period.
    blocks: Vec<u32>,
    batch_size: u64,
    mode: Mode,
    max_epochs: Option<u64>,
}

impl Mixture {
    /// A mixture of sources of `lens[i]` records with `weights[i]` (any positive scale), drawing
    /// `batch_size` ids per step in `mode` (each source its own order, keyed by `seed` and its
    /// index). `max_epochs`: the epochs a source may start (None: endless).
    pub fn new(lens: &[u64], weights: &[f64], batch_size: usize, mode: Mode, seed: u64, max_epochs: Option<u64>) -> Result<Mixture> {
        if lens.is_empty() || lens.len() > MAX_SOURCES {
            return Err(Error::invalid("sources", format!("a mixture needs 1 to {MAX_SOURCES} sources, got {}", lens.len())));
        }
        if weights.len() != lens.len() {
            return Err(Error::invalid("weights", format!("{} weights for {} sources", weights.len(), lens.len())));
        }
        if let Some(k) = weights.iter().position(|w| !w.is_finite() || *w <= 0.0) {
            return Err(Error::invalid("weights", format!("weight {} of source {k} must be a positive finite number", weights[k])));
        }
        if max_epochs == Some(0) {
            return Err(Error::invalid("max_epochs", "must be at least 1"));
        }
        // Check batch_size like the sampler does.
        Sampler::new(1, batch_size, Mode::Sequential, 0)?;
        let slots = apportion(weights);
        let period: u64 = slots.iter().sum();
        let mut parts = Vec::with_capacity(lens.len());
        let mut start = 0u64;
        for (i, (&n, &a)) in lens.iter().zip(&slots).enumerate() {
            let key = crate::rng::mix64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let order = Sampler::new(n, 1, mode, key).map_err(|e| Error::invalid("sources", format!("source {i}: {e}")))?;
            parts.push(Part { n, start, slots: a, order });
            start = start.checked_add(n).filter(|&s| s <= 1 << 63).ok_or_else(|| Error::invalid("sources", "the sources hold more than 2^63 records together"))?;
        }
        // Smooth weighted round robin over one period.
        let mut pattern = Vec::with_capacity(period as usize);
        let mut current = vec![0i64; parts.len()];
        for _ in 0..period {
            let mut best = 0;
            for (i, p) in parts.iter().enumerate() {
                current[i] += p.slots as i64;
                if current[i] > current[best] {
                    best = i;
                }
            }
            current[best] -= period as i64;
            pattern.push(best as u16);
        }
        let k = parts.len();
        let mut blocks = vec![0u32; (pattern.len() / BLOCK + 1) * k];
        let mut running = vec![0u32; k];
        for (j, &src) in pattern.iter().enumerate() {
            if j % BLOCK == 0 {
                blocks[(j / BLOCK) * k..(j / BLOCK + 1) * k].copy_from_slice(&running);
            }
            running[src as usize] += 1;
        }
        if pattern.len() % BLOCK == 0 {
            let b = pattern.len() / BLOCK;
            blocks[b * k..(b + 1) * k].copy_from_slice(&running);
        }
        Ok(Mixture { parts, period, pattern, blocks, batch_size: batch_size as u64, mode, max_epochs })
    }

    /// Ids per step.
    pub fn batch_size(&self) -> usize {
        self.batch_size as usize
    }

    /// Sources.
    pub fn sources(&self) -> usize {
        self.parts.len()
    }

    /// All records of all sources (ids are below this).
    pub fn len(&self) -> u64 {
        self.parts.last().map(|p| p.start + p.n).unwrap_or(0)
    }

    /// False (a mixture has a source with records); for clippy's `len` convention.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sampling mode of every source.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Slots of source `i` per period, and the period: its share is `slots / period`.
    pub fn share(&self, i: usize) -> (u64, u64) {
        (self.parts.get(i).map(|p| p.slots).unwrap_or(0), self.period)
    }

    /// The id where source `i`'s records start.
    pub fn start(&self, i: usize) -> u64 {
        self.parts.get(i).map(|p| p.start).unwrap_or(0)
    }

    /// Slots of source `i` among the first `j` slots of the run.
    fn slots_before(&self, i: usize, j: u128) -> u128 {
        let d = self.period as u128;
        let (q, r) = ((j / d), (j % d) as usize);
        let k = self.parts.len();
        let b = r / BLOCK;
        let mut c = self.blocks[b * k + i] as u128;
        c += self.pattern[b * BLOCK..r].iter().filter(|&&s| s as usize == i).count() as u128;
        q * self.parts[i].slots as u128 + c
    }

    /// Records each source gave before step `step` (its position in its own stream).
    pub fn consumed(&self, step: u64) -> Vec<u64> {
        let j = step as u128 * self.batch_size as u128;
        (0..self.parts.len()).map(|i| u64::try_from(self.slots_before(i, j)).unwrap_or(u64::MAX)).collect()
    }

    /// The epoch each source is in at step `step` (before drawing it).
    pub fn epochs(&self, step: u64) -> Vec<u64> {
        self.consumed(step).iter().zip(&self.parts).map(|(&c, p)| c / p.n).collect()
    }

    /// The source holding global id `id`.
    pub fn source_of(&self, id: u64) -> Option<usize> {
        if id >= self.len() {
            return None;
        }
        Some(self.parts.partition_point(|p| p.start + p.n <= id))
    }

    /// Write step `step`'s ids over `out` (`batch_size` ids, in slot order).
    pub fn fill(&self, step: u64, out: &mut Vec<u64>) -> Result<()> {
        let first = step as u128 * self.batch_size as u128;
        let mut next: Vec<u128> = (0..self.parts.len()).map(|i| self.slots_before(i, first)).collect();
        out.clear();
        out.reserve(self.batch_size as usize);
        let d = self.period as u128;
        for j in first..first + self.batch_size as u128 {
            let i = self.pattern[(j % d) as usize] as usize;
            let pos = next[i];
            next[i] += 1;
            out.push(self.id_of(i, pos, || format!("step {step}"))?);
        }
        Ok(())
    }

    /// The global id of record slot `j` of the run (slot `j` of step `j / batch_size`): what a
    /// consumer reading the mixture one record at a time (sequence packing) takes.
    pub fn slot_id(&self, j: u128) -> Result<u64> {
        let i = self.pattern[(j % self.period as u128) as usize] as usize;
        self.id_of(i, self.slots_before(i, j), || format!("record slot {j}"))
    }

    /// The global id of source `i`'s record at position `pos` of its stream of epochs.
    fn id_of(&self, i: usize, pos: u128, at: impl Fn() -> String) -> Result<u64> {
        let p = &self.parts[i];
        let epoch = u64::try_from(pos / p.n as u128).map_err(|_| Error::invalid("step", format!("{} is past the last epoch a source can count", at())))?;
        if let Some(m) = self.max_epochs.filter(|&m| epoch >= m) {
            return Err(Error::invalid("step", format!("source {i} is exhausted: {} would start its epoch {epoch}, max_epochs is {m}", at())));
        }
        let offset = (pos % p.n as u128) as u64;
        let mut buf = [0u64; 1];
        match self.mode {
            Mode::Iid => p.order.fill(pos as u64, &mut buf),
            _ => p.order.order(epoch, offset, &mut buf)?,
        }
        Ok(p.start + buf[0])
    }
}

/// Integer slots per period for `weights`: the weights themselves when they are integers
/// summing to at most [`MAX_PERIOD`], else a largest-remainder apportionment of
/// [`SCALED_PERIOD`] slots (at least one each).
fn apportion(weights: &[f64]) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    // Integer weights as they are, while the pattern stays cheap to build (period x sources).
    if weights.iter().all(|w| w.fract() == 0.0 && *w <= MAX_PERIOD as f64) && sum <= MAX_PERIOD as f64 && sum * weights.len() as f64 <= (1u64 << 24) as f64 {
        return weights.iter().map(|&w| w as u64).collect();
    }
    let d = SCALED_PERIOD.max(weights.len() as u64 * 2);
    let exact: Vec<f64> = weights.iter().map(|w| w / sum * d as f64).collect();
    let mut slots: Vec<u64> = exact.iter().map(|e| (e.floor() as u64).max(1)).collect();
    let mut total: u64 = slots.iter().sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    // Largest remainders first (ties: lower index); remove from the smallest when over.
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
    let mut k = 0;
    while total < d {
        slots[order[k % order.len()]] += 1;
        total += 1;
        k += 1;
    }
    let mut k = order.len();
    while total > d {
        k = if k == 0 { order.len() - 1 } else { k - 1 };
        let i = order[k];
        if slots[i] > 1 {
            slots[i] -= 1;
            total -= 1;
        }
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn per_source(m: &Mixture, ids: &[u64]) -> Vec<u64> {
        let mut c = vec![0u64; m.sources()];
        for &id in ids {
            c[m.source_of(id).unwrap()] += 1;
        }
        c
    }

    #[test]
    fn every_window_holds_each_source_at_its_weight_within_two_records() {
        let m = Mixture::new(&[1000, 50, 7], &[7.0, 2.0, 1.0], 32, Mode::Cyclic, 1, None).unwrap();
        let steps: Vec<Vec<u64>> = (0..200).map(|s| {
            let mut v = Vec::new();
            m.fill(s, &mut v).unwrap();
            v
        }).collect();
        for w in [1usize, 3, 10, 37] {
            for start in 0..(200 - w) {
                let ids: Vec<u64> = steps[start..start + w].concat();
                let got = per_source(&m, &ids);
                for (i, &want) in [0.7, 0.2, 0.1].iter().enumerate() {
                    let exp = want * ids.len() as f64;
                    assert!((got[i] as f64 - exp).abs() <= 2.0, "window {w} at {start}: source {i} has {} of {}, expected {exp}", got[i], ids.len());
                }
            }
        }
    }

    #[test]
    fn each_source_walks_its_own_epochs_exactly_once_per_epoch() {
        let m = Mixture::new(&[100, 30], &[1.0, 1.0], 20, Mode::Cyclic, 9, None).unwrap();
        let mut all = Vec::new();
        for s in 0..30 {
            let mut v = Vec::new();
            m.fill(s, &mut v).unwrap();
            all.extend(v);
        }
        // 600 slots: 300 each; source 0 = 3 epochs of 100, source 1 = 10 epochs of 30.
        let mut a: Vec<u64> = all.iter().copied().filter(|&id| id < 100).collect();
        let mut b: Vec<u64> = all.iter().copied().filter(|&id| id >= 100).map(|id| id - 100).collect();
        assert_eq!((a.len(), b.len()), (300, 300));
        for (chunk, n) in [(&mut a, 100usize), (&mut b, 30)] {
            for e in chunk.chunks(n) {
                let mut e = e.to_vec();
                e.sort_unstable();
                assert_eq!(e, (0..n as u64).collect::<Vec<_>>());
            }
        }
        assert_eq!(m.epochs(30), vec![3, 10]);
        assert_eq!(m.consumed(30), vec![300, 300]);
        assert_ne!(a[..100], a[100..200], "a fresh permutation per epoch");
    }

    #[test]
    fn seek_is_direct_and_max_epochs_is_an_error_naming_the_source() {
        let m = Mixture::new(&[10, 1000], &[1.0, 3.0], 8, Mode::Sequential, 0, Some(2)).unwrap();
        let mut v = Vec::new();
        m.fill(4, &mut v).unwrap();
        let mut w = Vec::new();
        for s in 0..5 {
            m.fill(s, &mut w).unwrap();
        }
        assert_eq!(v, w);
        // Source 0 gives 2 of every 8 slots: its 21st record (epoch 2) comes at step 10.
        assert!(m.fill(9, &mut v).is_ok());
        let e = m.fill(10, &mut v).unwrap_err().to_string();
        assert!(e.contains("source 0 is exhausted"), "{e}");
    }

    #[test]
    fn slots_one_at_a_time_are_the_batches_laid_end_to_end() {
        let m = Mixture::new(&[30, 11, 5], &[0.5, 0.3, 0.2], 7, Mode::Cyclic, 4, None).unwrap();
        let mut v = Vec::new();
        for s in 0..20u64 {
            m.fill(s, &mut v).unwrap();
            for (k, &id) in v.iter().enumerate() {
                assert_eq!(m.slot_id(s as u128 * 7 + k as u128).unwrap(), id);
            }
        }
    }

    #[test]
    fn bad_arguments_are_typed_errors() {
        for (lens, weights) in [(vec![], vec![]), (vec![5], vec![0.0]), (vec![5], vec![f64::NAN]), (vec![5, 5], vec![1.0]), (vec![0], vec![1.0])] {
            assert!(matches!(Mixture::new(&lens, &weights, 4, Mode::Cyclic, 0, None), Err(Error::InvalidArgument { .. })), "{lens:?} {weights:?}");
        }
        assert!(Mixture::new(&[5], &[1.0], 0, Mode::Cyclic, 0, None).is_err());
        assert!(Mixture::new(&[5], &[1.0], 4, Mode::Cyclic, 0, Some(0)).is_err());
    }

    #[test]
    fn float_weights_are_apportioned_to_the_scaled_period() {
        let s = apportion(&[1.0 / 3.0, 2.0 / 3.0]);
        assert_eq!(s.iter().sum::<u64>(), SCALED_PERIOD);
        assert!((s[0] as f64 / SCALED_PERIOD as f64 - 1.0 / 3.0).abs() < 1e-4);
        assert_eq!(apportion(&[7.0, 3.0]), vec![7, 3]);
        let tiny = apportion(&[1e-9, 1.0]);
        assert!(tiny[0] >= 1 && tiny.iter().sum::<u64>() == SCALED_PERIOD);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
        #[test]
        fn the_share_of_any_prefix_is_within_two_records(
            weights in proptest::collection::vec(1u32..20, 1..6), b in 1usize..64, steps in 1u64..40, seed in any::<u64>(),
        ) {
            let lens: Vec<u64> = weights.iter().map(|&w| (w as u64) * 3 + 1).collect();
            let wf: Vec<f64> = weights.iter().map(|&w| w as f64).collect();
            let m = Mixture::new(&lens, &wf, b, Mode::Iid, seed, None).unwrap();
            let total: f64 = wf.iter().sum();
            let mut ids = Vec::new();
            let mut v = Vec::new();
            for s in 0..steps {
                m.fill(s, &mut v).unwrap();
                ids.extend_from_slice(&v);
            }
            let got = per_source(&m, &ids);
            for (i, w) in wf.iter().enumerate() {
                let exp = w / total * ids.len() as f64;
                prop_assert!((got[i] as f64 - exp).abs() <= 2.0);
                prop_assert_eq!(m.consumed(steps)[i], got[i]);
            }
        }
    }
}
