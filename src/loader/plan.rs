//! Epoch plans: which records each shard (rank x worker) of a data-parallel job reads in an
//! epoch, and where the job resumes when its world size or worker count changes (elastic
//! resumption).
//!
//! An epoch of `n` records is a sequence of *base batches* `0..T` of `batch_size` ids each,
//! defined without reference to any layout: base batch `t` is positions `[t*B, (t+1)*B)` of the
//! epoch's order (the identity in sequential mode, the epoch's keyed permutation in cyclic mode;
//! [`Sampler::order`]), or in iid mode the sampler's draw at step `epoch * T + t`. The last base
//! batch is partial when `B` does not divide `n` (dropped with `drop_last`).
//!
//! A [`Deal`] hands the base batches an epoch still has (all of them, or those after a
//! [`Position`]) to `S = ranks * workers` shards round robin: shard `s = rank * workers + worker`
//! reads the remaining batches `s, s + S, s + 2S, ...`. With one shard this is the
//! uninterrupted single-process stream; with `S` shards one step of every shard is `S`
//! consecutive base batches of it. A [`Position`] (epoch, a consumed prefix, the few consumed
//! batches beyond it) is all a job needs to continue on any other layout: the remaining base
//! batches are dealt again, so no record is read twice and none is skipped.
//!
//! ```
//! use zrecord::loader::{EpochPlan, Mode, Position};
//! let plan = EpochPlan::new(100, 8, Mode::Cyclic, 7, false).unwrap();
//! let two_by_two = plan.deal(&Position::default(), 2, 2).unwrap();
//! // Each rank's DataLoader yielded 3 batches (its 2 workers round robin) before a checkpoint.
//! let at = two_by_two.position_after(&[3, 3]).unwrap();
//! let three_by_one = plan.deal(&at, 3, 1).unwrap();
//! let total: u64 = (0..3).map(|r| three_by_one.rank_len(r)).sum();
//! assert_eq!(total + 6, plan.batches()); // 13 base batches: 6 read, 7 left
//! ```

use crate::error::{Error, Result};
use crate::loader::sampler::{Mode, Sampler};

/// Where an epoch stands: base batches `[0, done)` and the batches in `extra` were consumed.
/// `extra` is sorted, each entry above `done` (a prefix is always folded into `done`); it holds
/// the few batches that some shards read beyond the others (at most one per shard of the layout
/// that stopped), so a position is small whatever the dataset size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Position {
    /// The epoch.
    pub epoch: u64,
    /// Base batches `[0, done)` were consumed.
    pub done: u64,
    /// Further consumed base batches, sorted, each `> done`.
    pub extra: Vec<u64>,
}

/// The most extra batches a position may list (a position is a small checkpoint value).
pub const MAX_EXTRA: usize = 1 << 16;
/// The most shards (ranks x workers) a deal spreads an epoch over.
pub const MAX_SHARDS: u64 = 1 << 20;

/// An epoch of `n` records as base batches (see the module documentation).
#[derive(Clone, Debug)]
pub struct EpochPlan {
    n: u64,
    batch_size: u64,
    mode: Mode,
    drop_last: bool,
    /// The epoch order (sequential / cyclic) or the iid draw of one base batch.
    sampler: Sampler,
    batches: u64,
}

impl EpochPlan {
    /// A plan over `n` records in base batches of `batch_size`. `drop_last` drops the partial
    /// last base batch and, in a deal, the batches that do not fill a whole round of shards
    /// (so every shard reads as many batches as every other).
    pub fn new(n: u64, batch_size: usize, mode: Mode, seed: u64, drop_last: bool) -> Result<EpochPlan> {
        // The same limits as the sampler (n >= 1, n <= 2^63, batch size bounds); iid draws whole
        // base batches, the other modes walk the epoch order one position at a time.
        let sampler = match mode {
            Mode::Iid => Sampler::new(n, batch_size, Mode::Iid, seed)?,
            _ => {
                Sampler::new(n, batch_size, Mode::Sequential, seed)?; // checks batch_size
                Sampler::new(n, 1, mode, seed)?
            }
        };
        let b = batch_size as u64;
        let batches = if drop_last { n / b } else { n.div_ceil(b) };
        Ok(EpochPlan { n, batch_size: b, mode, drop_last, sampler, batches })
    }

    /// Records per epoch.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// False (a plan has at least one record); for clippy's `len` convention.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Ids per base batch (the last one of an epoch may be partial without `drop_last`).
    pub fn batch_size(&self) -> usize {
        self.batch_size as usize
    }

    /// The sampling mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether partial batches and incomplete rounds are dropped.
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// Base batches per epoch (`T`).
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Ids in base batch `t` (`batch_size`, or fewer for a partial last batch).
    pub fn batch_len(&self, t: u64) -> u64 {
        match self.mode {
            Mode::Iid => self.batch_size,
            _ => (self.n - t.saturating_mul(self.batch_size).min(self.n)).min(self.batch_size),
        }
    }

    /// The ids of base batch `t` of `epoch`, written over `out` (resized).
    pub fn fill(&self, epoch: u64, t: u64, out: &mut Vec<u64>) -> Result<()> {
        if t >= self.batches {
            return Err(Error::invalid("batch", format!("base batch {t} is outside the {} of an epoch", self.batches)));
        }
        out.resize(self.batch_len(t) as usize, 0);
        match self.mode {
            Mode::Iid => {
                self.sampler.fill(epoch.wrapping_mul(self.batches).wrapping_add(t), out);
                Ok(())
            }
            _ => self.sampler.order(epoch, t * self.batch_size, out),
        }
    }

    /// Check a position (from a checkpoint) against this plan: typed errors, never a panic.
    pub fn check(&self, p: &Position) -> Result<()> {
        if p.done > self.batches {
            return Err(Error::invalid("position", format!("done = {} exceeds the {} base batches of an epoch", p.done, self.batches)));
        }
        if p.extra.len() > MAX_EXTRA {
            return Err(Error::invalid("position", format!("{} extra batches exceed the {MAX_EXTRA} a position may list", p.extra.len())));
        }
        let mut prev = p.done;
        for &e in &p.extra {
            if e >= self.batches {
                return Err(Error::invalid("position", format!("extra batch {e} is outside the {} of an epoch", self.batches)));
            }
            // Sorted, unique, above `done` (a consumed batch `done` would be part of the prefix).
            if e <= prev {
                return Err(Error::invalid("position", format!("extra batches must be sorted, unique and above done (done = {}, extra = {:?})", p.done, &p.extra[..p.extra.len().min(8)])));
            }
            prev = e;
        }
        Ok(())
    }

    /// Deal the base batches `from` has not consumed to `ranks * workers` shards.
    pub fn deal(&self, from: &Position, ranks: u64, workers: u64) -> Result<Deal> {
        self.check(from)?;
        if ranks == 0 || workers == 0 {
            return Err(Error::invalid("layout", format!("{ranks} ranks x {workers} workers: both must be at least 1")));
        }
        let shards = ranks.checked_mul(workers).filter(|&s| s <= MAX_SHARDS).ok_or_else(|| {
            Error::invalid("layout", format!("{ranks} ranks x {workers} workers exceed the {MAX_SHARDS} shards a deal spreads an epoch over"))
        })?;
        let remaining = self.batches - from.done - from.extra.len() as u64;
        let dealt = if self.drop_last { remaining / shards * shards } else { remaining };
        Ok(Deal { plan: self.clone(), from: from.clone(), ranks, workers, shards, dealt })
    }
}

/// An epoch's remaining base batches dealt to `ranks x workers` shards ([`EpochPlan::deal`]).
#[derive(Clone, Debug)]
pub struct Deal {
    plan: EpochPlan,
    from: Position,
    ranks: u64,
    workers: u64,
    shards: u64,
    /// Remaining base batches handed out (all, or whole rounds with `drop_last`).
    dealt: u64,
}

impl Deal {
    /// The plan dealt.
    pub fn plan(&self) -> &EpochPlan {
        &self.plan
    }

    /// The position the deal starts from.
    pub fn start(&self) -> &Position {
        &self.from
    }

    /// Ranks of the layout.
    pub fn ranks(&self) -> u64 {
        self.ranks
    }

    /// Workers per rank.
    pub fn workers(&self) -> u64 {
        self.workers
    }

    fn shard(&self, rank: u64, worker: u64) -> Result<u64> {
        if rank >= self.ranks || worker >= self.workers {
            return Err(Error::invalid("shard", format!("rank {rank}, worker {worker} is outside the {} ranks x {} workers of the deal", self.ranks, self.workers)));
        }
        Ok(rank * self.workers + worker)
    }

    fn len_of(&self, shard: u64) -> u64 {
        self.dealt / self.shards + u64::from(shard < self.dealt % self.shards)
    }

    /// Batches shard (`rank`, `worker`) reads in this epoch.
    pub fn shard_len(&self, rank: u64, worker: u64) -> Result<u64> {
        Ok(self.len_of(self.shard(rank, worker)?))
    }

    /// Batches rank `rank` reads in this epoch (all its workers).
    pub fn rank_len(&self, rank: u64) -> u64 {
        (0..self.workers).filter_map(|w| self.shard_len(rank, w).ok()).sum()
    }

    /// The `j`-th remaining base batch (`j < dealt`): `done + j`, stepped over the extras.
    fn remaining(&self, j: u64) -> u64 {
        let mut t = self.from.done + j;
        for &e in &self.from.extra {
            if e <= t {
                t += 1;
            } else {
                break;
            }
        }
        t
    }

    /// The base batch shard (`rank`, `worker`) reads at its step `i`.
    pub fn shard_batch(&self, rank: u64, worker: u64, i: u64) -> Result<u64> {
        let s = self.shard(rank, worker)?;
        if i >= self.len_of(s) {
            return Err(Error::invalid("step", format!("step {i} is past the {} batches of rank {rank}, worker {worker} in epoch {}", self.len_of(s), self.from.epoch)));
        }
        Ok(self.remaining(i * self.shards + s))
    }

    /// The ids shard (`rank`, `worker`) reads at its step `i`, written over `out`.
    pub fn fill(&self, rank: u64, worker: u64, i: u64, out: &mut Vec<u64>) -> Result<()> {
        let t = self.shard_batch(rank, worker, i)?;
        self.plan.fill(self.from.epoch, t, out)
    }

    /// The position once rank `r` consumed `consumed[r]` batches, each rank through a loader
    /// that takes its workers' batches round robin in worker order, skipping a worker that
    /// has no more (PyTorch's `DataLoader`). A finished epoch is the next epoch's start.
    pub fn position_after(&self, consumed: &[u64]) -> Result<Position> {
        if consumed.len() as u64 != self.ranks {
            return Err(Error::invalid("consumed", format!("{} counts for {} ranks", consumed.len(), self.ranks)));
        }
        let mut counts = Vec::with_capacity(self.shards as usize);
        for (r, &m) in consumed.iter().enumerate() {
            let totals: Vec<u64> = (0..self.workers).map(|w| self.len_of(r as u64 * self.workers + w)).collect();
            counts.extend(round_robin(&totals, m).map_err(|reason| Error::invalid("consumed", format!("rank {r}: {reason}")))?);
        }
        if counts.iter().enumerate().all(|(s, &c)| c == self.len_of(s as u64)) {
            return Ok(Position { epoch: self.from.epoch + 1, done: 0, extra: Vec::new() });
        }
        let low = counts.iter().copied().min().unwrap_or(0);
        let prefix = low * self.shards; // remaining[0..prefix] all consumed
        let mut done = if prefix > 0 { self.remaining(prefix - 1) + 1 } else { self.from.done };
        let mut extra: Vec<u64> = self.from.extra.iter().copied().filter(|&e| e >= done).collect();
        for (s, &c) in counts.iter().enumerate() {
            for i in low..c {
                extra.push(self.remaining(i * self.shards + s as u64));
            }
        }
        extra.sort_unstable();
        extra.dedup();
        let mut k = 0;
        while k < extra.len() && extra[k] == done {
            done += 1;
            k += 1;
        }
        extra.drain(..k);
        if extra.len() > MAX_EXTRA {
            return Err(Error::invalid("consumed", format!("the position would list {} extra batches (at most {MAX_EXTRA})", extra.len())));
        }
        Ok(Position { epoch: self.from.epoch, done, extra })
    }
}

/// How many of its batches each worker yielded once `m` were taken round robin (worker order,
/// a worker that has none left skipped) from workers holding `totals`.
fn round_robin(totals: &[u64], mut m: u64) -> std::result::Result<Vec<u64>, String> {
    let sum: u64 = totals.iter().sum();
    if m > sum {
        return Err(format!("{m} batches consumed, but its workers hold {sum} in this epoch"));
    }
    let mut counts = vec![0u64; totals.len()];
    let mut level = 0u64;
    while m > 0 {
        let active: Vec<usize> = (0..totals.len()).filter(|&w| totals[w] > level).collect();
        let next = active.iter().map(|&w| totals[w]).min().unwrap_or(level);
        let a = active.len() as u64;
        let rounds = next - level;
        if m >= rounds * a {
            for &w in &active {
                counts[w] += rounds;
            }
            m -= rounds * a;
            level = next;
        } else {
            let (full, rest) = (m / a, m % a);
            for (k, &w) in active.iter().enumerate() {
                counts[w] += full + u64::from((k as u64) < rest);
            }
            m = 0;
        }
    }
    Ok(counts)
}

/// One shard's batches as an endless stream over epochs: the deal it resumes (from a
/// position), then every following epoch dealt afresh on the same layout. Step `k` maps to
/// (epoch, base batch) in O(|extra|); the loader reads it like the stateless sampler.
#[derive(Clone, Debug)]
pub struct ShardStream {
    first: Deal,
    fresh: Deal,
    rank: u64,
    worker: u64,
    first_len: u64,
    fresh_len: u64,
}

impl ShardStream {
    /// Shard (`rank`, `worker`) of `deal`, continuing into the epochs after it.
    pub fn new(deal: &Deal, rank: u64, worker: u64) -> Result<ShardStream> {
        let first_len = deal.shard_len(rank, worker)?;
        let next = Position { epoch: deal.from.epoch.saturating_add(1), done: 0, extra: Vec::new() };
        let fresh = deal.plan.deal(&next, deal.ranks, deal.workers)?;
        let fresh_len = fresh.shard_len(rank, worker)?;
        Ok(ShardStream { first: deal.clone(), fresh, rank, worker, first_len, fresh_len })
    }

    /// Batches of the first (possibly resumed) epoch.
    pub fn first_len(&self) -> u64 {
        self.first_len
    }

    /// Batches of every later epoch.
    pub fn epoch_len(&self) -> u64 {
        self.fresh_len
    }

    /// The largest batch the stream yields.
    pub fn batch_size(&self) -> usize {
        self.first.plan.batch_size()
    }

    /// Records of the plan's epochs (ids are below this).
    pub fn records(&self) -> u64 {
        self.first.plan.len()
    }

    /// `(epoch, base batch)` of step `k`.
    pub fn locate(&self, k: u64) -> Result<(u64, u64)> {
        if k < self.first_len {
            return Ok((self.first.from.epoch, self.first.shard_batch(self.rank, self.worker, k)?));
        }
        if self.fresh_len == 0 {
            return Err(Error::invalid("step", format!("rank {}, worker {} has no batches in a fresh epoch ({} base batches for {} shards)", self.rank, self.worker, self.fresh.dealt, self.fresh.shards)));
        }
        let k = k - self.first_len;
        let epoch = self.fresh.from.epoch.saturating_add(k / self.fresh_len);
        Ok((epoch, self.fresh.shard_batch(self.rank, self.worker, k % self.fresh_len)?))
    }

    /// The ids of step `k`, written over `out`.
    pub fn fill(&self, k: u64, out: &mut Vec<u64>) -> Result<()> {
        let (epoch, t) = self.locate(k)?;
        self.first.plan.fill(epoch, t, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every id read by every shard of `deal` for `consumed` batches per rank, shard by shard.
    fn read(deal: &Deal, consumed: &[u64]) -> Vec<u64> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        for (r, &m) in consumed.iter().enumerate() {
            let totals: Vec<u64> = (0..deal.workers()).map(|w| deal.shard_len(r as u64, w).unwrap()).collect();
            for (w, c) in round_robin(&totals, m).unwrap().into_iter().enumerate() {
                for i in 0..c {
                    deal.fill(r as u64, w as u64, i, &mut buf).unwrap();
                    out.extend_from_slice(&buf);
                }
            }
        }
        out
    }

    /// The uninterrupted single-process stream of epoch `e`.
    fn single(plan: &EpochPlan, e: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        for t in 0..plan.batches() {
            plan.fill(e, t, &mut buf).unwrap();
            out.extend_from_slice(&buf);
        }
        out
    }

    fn sorted(mut v: Vec<u64>) -> Vec<u64> {
        v.sort_unstable();
        v
    }

    #[test]
    fn two_by_two_then_three_by_one_then_one_by_four_reads_the_epoch_exactly_once() {
        for mode in [Mode::Sequential, Mode::Cyclic, Mode::Iid] {
            let plan = EpochPlan::new(1003, 16, mode, 42, false).unwrap();
            let mut seen = Vec::new();
            let d1 = plan.deal(&Position::default(), 2, 2).unwrap();
            seen.extend(read(&d1, &[5, 5]));
            let p1 = d1.position_after(&[5, 5]).unwrap();
            let d2 = plan.deal(&p1, 3, 1).unwrap();
            seen.extend(read(&d2, &[4, 4, 4]));
            let p2 = d2.position_after(&[4, 4, 4]).unwrap();
            let d3 = plan.deal(&p2, 1, 4).unwrap();
            let rest = d3.rank_len(0);
            seen.extend(read(&d3, &[rest]));
            assert_eq!(d3.position_after(&[rest]).unwrap(), Position { epoch: 1, done: 0, extra: vec![] });
            assert_eq!(sorted(seen), sorted(single(&plan, 0)), "{mode:?}");
        }
    }

    #[test]
    fn one_shard_is_the_single_process_stream_and_shards_split_each_step() {
        let plan = EpochPlan::new(100, 8, Mode::Cyclic, 3, false).unwrap();
        let one = plan.deal(&Position::default(), 1, 1).unwrap();
        assert_eq!(read(&one, &[13]), single(&plan, 0));
        // Shard s at step i reads base batch i*S + s: the old Sampler(n, B*S) step i, slice s.
        let four = plan.deal(&Position::default(), 2, 2).unwrap();
        let g = Sampler::new(100, 32, Mode::Cyclic, 3).unwrap();
        let mut buf = Vec::new();
        for i in 0..3 {
            let global = g.batch(i);
            for s in 0..4 {
                four.fill(s / 2, s % 2, i, &mut buf).unwrap();
                assert_eq!(buf, global[(s * 8) as usize..(s * 8 + 8) as usize]);
            }
        }
        // The remainder (100 = 3 * 32 + 4): one partial batch, for shard 0.
        assert_eq!((four.shard_len(0, 0).unwrap(), four.shard_len(0, 1).unwrap(), four.shard_len(1, 0).unwrap()), (4, 3, 3));
        four.fill(0, 0, 3, &mut buf).unwrap();
        assert_eq!(buf.len(), 4);
    }

    #[test]
    fn drop_last_deals_whole_rounds_only() {
        let plan = EpochPlan::new(100, 8, Mode::Sequential, 0, true).unwrap();
        assert_eq!(plan.batches(), 12);
        let d = plan.deal(&Position::default(), 5, 1).unwrap();
        assert_eq!((0..5).map(|r| d.rank_len(r)).collect::<Vec<_>>(), vec![2; 5]);
        assert_eq!(d.position_after(&[2; 5]).unwrap().epoch, 1);
    }

    #[test]
    fn uneven_worker_consumption_is_recorded_as_extra_batches() {
        let plan = EpochPlan::new(64, 4, Mode::Sequential, 0, false).unwrap();
        let at = |p: &Position| (p.epoch, p.done, p.extra.clone());
        let d = plan.deal(&Position::default(), 1, 3).unwrap();
        // Round robin over 3 workers reading base batches w, w+3, ...: 4 taken = 0, 1, 2, 3.
        assert_eq!(at(&d.position_after(&[4]).unwrap()), (0, 4, vec![]));
        assert_eq!(at(&d.position_after(&[5]).unwrap()), (0, 5, vec![]));
        assert_eq!(at(&d.position_after(&[2]).unwrap()), (0, 2, vec![]));
        // 2 ranks x 2 workers, rank 0 one batch behind rank 1: batches 0, 2, 3 read.
        let two = plan.deal(&Position::default(), 2, 2).unwrap();
        let p = two.position_after(&[1, 2]).unwrap();
        assert_eq!(at(&p), (0, 1, vec![2, 3]));
        assert_eq!(sorted(read(&two, &[1, 2])), (0..4).chain(8..16).collect::<Vec<_>>());
        // Resumed on one shard: 1, 4, 5, ... (2 and 3 are not read again).
        let one = plan.deal(&p, 1, 1).unwrap();
        assert_eq!((0..3).map(|i| one.shard_batch(0, 0, i).unwrap()).collect::<Vec<_>>(), vec![1, 4, 5]);
        assert_eq!(one.rank_len(0), 13);
    }

    #[test]
    fn bad_positions_and_layouts_are_typed_errors() {
        let plan = EpochPlan::new(10, 4, Mode::Cyclic, 0, false).unwrap();
        for p in [
            Position { epoch: 0, done: 4, extra: vec![] },
            Position { epoch: 0, done: 0, extra: vec![0] },
            Position { epoch: 0, done: 0, extra: vec![2, 1] },
            Position { epoch: 0, done: 0, extra: vec![1, 1] },
            Position { epoch: 0, done: 1, extra: vec![3] },
        ] {
            assert!(matches!(plan.deal(&p, 1, 1), Err(Error::InvalidArgument { .. })), "{p:?}");
        }
        assert!(plan.deal(&Position::default(), 0, 1).is_err());
        assert!(plan.deal(&Position::default(), 1 << 40, 1 << 40).is_err());
        let d = plan.deal(&Position::default(), 1, 2).unwrap();
        assert!(d.position_after(&[4]).is_err(), "3 batches exist");
        assert!(d.position_after(&[1, 1]).is_err(), "one rank");
        assert!(d.shard_batch(0, 2, 0).is_err());
        assert!(d.shard_batch(0, 0, 2).is_err());
        assert!(EpochPlan::new(0, 4, Mode::Cyclic, 0, false).is_err());
        assert!(EpochPlan::new(10, 0, Mode::Cyclic, 0, false).is_err());
    }

    #[test]
    fn a_shard_stream_runs_on_into_later_epochs() {
        let plan = EpochPlan::new(50, 5, Mode::Cyclic, 9, false).unwrap();
        let d = plan.deal(&Position { epoch: 2, done: 3, extra: vec![5] }, 2, 1).unwrap();
        let s = ShardStream::new(&d, 1, 0).unwrap();
        // 10 batches, 4 consumed: 6 left, 3 each; later epochs 5 each.
        assert_eq!((s.first_len(), s.epoch_len()), (3, 5));
        assert_eq!(s.locate(0).unwrap(), (2, 4));
        assert_eq!(s.locate(1).unwrap(), (2, 7));
        assert_eq!(s.locate(3).unwrap(), (3, 1));
        assert_eq!(s.locate(8).unwrap(), (4, 1));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]
        /// Any chain of layouts and checkpoints reads every record of the epoch exactly as often
        /// as the uninterrupted stream: no batch twice, none skipped.
        #[test]
        fn any_chain_of_layouts_reads_the_epoch_exactly(
            n in 1u64..400, b in 1usize..20, seed in any::<u64>(), cyclic in any::<bool>(),
            layouts in proptest::collection::vec((1u64..4, 1u64..4, 0u64..6), 1..5),
        ) {
            let mode = if cyclic { Mode::Cyclic } else { Mode::Sequential };
            let plan = EpochPlan::new(n, b, mode, seed, false).unwrap();
            let mut at = Position::default();
            let mut seen = Vec::new();
            for (ranks, workers, steps) in layouts {
                let d = plan.deal(&at, ranks, workers).unwrap();
                // Every rank consumes the same count (training steps), bounded by what it holds.
                let m = (0..ranks).map(|r| d.rank_len(r)).min().unwrap().min(steps * workers);
                let consumed = vec![m; ranks as usize];
                seen.extend(read(&d, &consumed));
                at = d.position_after(&consumed).unwrap();
                prop_assert!(plan.check(&at).is_ok());
                if at.epoch == 1 { break; }
            }
            if at.epoch == 0 {
                let d = plan.deal(&at, 1, 1).unwrap();
                let rest = d.rank_len(0);
                seen.extend(read(&d, &[rest]));
            }
            prop_assert_eq!(sorted(seen), sorted(single(&plan, 0)));
        }
    }
}
