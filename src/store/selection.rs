//! Id selections: which records a scan reads ([`IdSet`]: sorted disjoint ranges, read in id
//! order; or an explicit list in a given order), and how a selection is cut into batches.

use std::fmt;
use std::ops::Range;

use std::sync::Arc;

/// Sorted, disjoint, non-adjacent id ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdSet {
    ranges: Vec<Range<u64>>,
}

impl IdSet {
    /// `[0, n)`.
    pub fn all(n: u64) -> IdSet {
        IdSet::range(0, n)
    }

    /// `[lo, hi)` (empty when `hi <= lo`).
    pub fn range(lo: u64, hi: u64) -> IdSet {
        let mut ranges = Vec::with_capacity(1);
        if lo < hi {
            ranges.push(lo..hi);
        }
        IdSet { ranges }
    }

    /// No ids.
    pub fn empty() -> IdSet {
        IdSet { ranges: Vec::new() }
    }

    /// Normalise any ranges (sorted, merged, empty ones dropped).
    pub fn from_ranges(mut ranges: Vec<Range<u64>>) -> IdSet {
        ranges.retain(|r| r.start < r.end);
        ranges.sort_by_key(|r| r.start);
        let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match out.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => out.push(r),
            }
        }
        IdSet { ranges: out }
    }

    /// The set of `ids`, which must be sorted ascending (duplicates allowed): one pass, no sort.
    pub fn from_sorted_ids(ids: &[u64]) -> IdSet {
        debug_assert!(ids.windows(2).all(|w| w[0] <= w[1]));
        let mut ranges: Vec<Range<u64>> = Vec::with_capacity(ids.len());
        for &i in ids {
            match ranges.last_mut() {
                Some(r) if i < r.end => {}
                Some(r) if i == r.end => r.end += 1,
                _ => ranges.push(i..i + 1),
            }
        }
        IdSet { ranges }
    }

    /// The ranges.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// Number of ids.
    pub fn count(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    /// True when `id` is in the set.
    pub fn contains(&self, id: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.end <= id);
        self.ranges.get(i).is_some_and(|r| r.start <= id)
    }

    /// Ids in both.
    pub fn intersect(&self, other: &IdSet) -> IdSet {
        let (mut i, mut j, mut out) = (0, 0, Vec::new());
        while i < self.ranges.len() && j < other.ranges.len() {
            let (a, b) = (&self.ranges[i], &other.ranges[j]);
            let lo = a.start.max(b.start);
            let hi = a.end.min(b.end);
            if lo < hi {
                out.push(lo..hi);
            }
            if a.end < b.end {
                i += 1;
            } else {
                j += 1;
            }
        }
        IdSet { ranges: out }
    }

    /// Ids in either.
    pub fn union(&self, other: &IdSet) -> IdSet {
        IdSet::from_ranges(self.ranges.iter().chain(other.ranges.iter()).cloned().collect())
    }

    /// Ids of `[0, n)` not in the set.
    pub fn complement(&self, n: u64) -> IdSet {
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        let mut at = 0;
        for r in &self.ranges {
            if r.start > at {
                out.push(at..r.start.min(n));
            }
            at = r.end;
        }
        if at < n {
            out.push(at..n);
        }
        IdSet::from_ranges(out)
    }

    /// The first `k` ids.
    pub fn truncate(&self, k: u64) -> IdSet {
        let mut left = k;
        let mut out = Vec::new();
        for r in &self.ranges {
            if left == 0 {
                break;
            }
            let take = (r.end - r.start).min(left);
            out.push(r.start..r.start + take);
            left -= take;
        }
        IdSet { ranges: out }
    }

    /// Split into at most `parts` pieces of nearly equal counts (in id order).
    pub fn split(&self, parts: usize) -> Vec<IdSet> {
        let total = self.count();
        let parts = (parts.max(1) as u64).min(total.max(1));
        let mut out = Vec::with_capacity(parts as usize);
        let mut iter = self.ranges.iter().cloned();
        let mut cur: Option<Range<u64>> = iter.next();
        for p in 0..parts {
            let want = total / parts + u64::from(p < total % parts);
            let mut got = 0;
            let mut piece = Vec::new();
            while got < want {
                let Some(r) = cur.take() else { break };
                let take = (r.end - r.start).min(want - got);
                piece.push(r.start..r.start + take);
                got += take;
                cur = if r.start + take < r.end { Some(r.start + take..r.end) } else { iter.next() };
            }
            out.push(IdSet { ranges: piece });
        }
        out
    }
}

impl fmt::Display for IdSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 4;
        write!(f, "[")?;
        for (i, r) in self.ranges.iter().take(SHOWN).enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            if r.end - r.start == 1 {
                write!(f, "{}", r.start)?;
            } else {
                write!(f, "{}..{}", r.start, r.end)?;
            }
        }
        if self.ranges.len() > SHOWN {
            write!(f, ", ... {} more ranges", self.ranges.len() - SHOWN)?;
        }
        write!(f, "]")
    }
}

/// Which records a scan covers.
#[derive(Clone, Debug)]
pub enum Selection {
    /// Id ranges, read in id order.
    Set(IdSet),
    /// Explicit ids in the given order, duplicates kept.
    List(Arc<Vec<u64>>),
}

impl Selection {
    /// Every id of `0..n`.
    pub fn all(n: u64) -> Selection {
        Selection::Set(IdSet::all(n))
    }

    /// Number of ids.
    pub fn count(&self) -> u64 {
        match self {
            Selection::Set(s) => s.count(),
            Selection::List(l) => l.len() as u64,
        }
    }
}

/// One batch worth of ids: a contiguous run or an explicit list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkIds {
    /// `start..start + len`.
    Run(u64, usize),
    /// Explicit ids.
    List(Vec<u64>),
}

impl ChunkIds {
    /// As gather ids.
    pub fn ids(&self) -> crate::store::Ids<'_> {
        match self {
            ChunkIds::Run(start, len) => crate::store::Ids::Range { start: *start, step: 1, len: *len },
            ChunkIds::List(l) => crate::store::Ids::List(l),
        }
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        match self {
            ChunkIds::Run(_, n) => *n,
            ChunkIds::List(l) => l.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids as a vector.
    pub fn to_vec(&self) -> Vec<u64> {
        match self {
            ChunkIds::Run(s, n) => (*s..*s + *n as u64).collect(),
            ChunkIds::List(l) => l.clone(),
        }
    }
}

/// Cuts a selection into batches of at most `batch_size` ids, in selection order.
#[derive(Clone, Debug)]
pub struct Chunks {
    sel: Selection,
    range: usize,
    at: u64,
    batch_size: usize,
}

impl Chunks {
    /// Batches of `sel`, at most `batch_size` (>= 1) ids each.
    pub fn new(sel: Selection, batch_size: usize) -> Chunks {
        let at = match &sel {
            Selection::Set(s) => s.ranges().first().map(|r| r.start).unwrap_or(0),
            Selection::List(_) => 0,
        };
        Chunks { sel, range: 0, at, batch_size: batch_size.max(1) }
    }
}

impl Iterator for Chunks {
    type Item = ChunkIds;

    fn next(&mut self) -> Option<ChunkIds> {
        match &self.sel {
            Selection::List(l) => {
                let lo = self.at as usize;
                if lo >= l.len() {
                    return None;
                }
                let hi = (lo + self.batch_size).min(l.len());
                self.at = hi as u64;
                Some(ChunkIds::List(l[lo..hi].to_vec()))
            }
            Selection::Set(s) => {
                // Take up to batch_size ids, range by range; one piece is a contiguous run.
                let ranges = s.ranges();
                let mut pieces: Vec<(u64, usize)> = Vec::new();
                let mut want = self.batch_size;
                while want > 0 && self.range < ranges.len() {
                    let r = &ranges[self.range];
                    let take = ((r.end - self.at) as usize).min(want);
                    pieces.push((self.at, take));
                    self.at += take as u64;
                    want -= take;
                    if self.at >= r.end {
                        self.range += 1;
                        self.at = ranges.get(self.range).map(|n| n.start).unwrap_or(self.at);
                    }
                }
                match pieces[..] {
                    [] => None,
                    [(start, len)] => Some(ChunkIds::Run(start, len)),
                    _ => Some(ChunkIds::List(pieces.iter().flat_map(|&(s, n)| s..s + n as u64).collect())),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(sel: Selection, bs: usize) -> Vec<Vec<u64>> {
        Chunks::new(sel, bs).map(|c| c.to_vec()).collect()
    }

    #[test]
    fn chunks_cover_selection_in_order() {
        let s = IdSet::from_ranges(vec![0..5, 7..8, 10..13]);
        assert_eq!(collect(Selection::Set(s.clone()), 4), vec![vec![0, 1, 2, 3], vec![4, 7, 10, 11], vec![12]]);
        assert_eq!(collect(Selection::Set(s), 100), vec![vec![0, 1, 2, 3, 4, 7, 10, 11, 12]]);
        assert!(collect(Selection::Set(IdSet::empty()), 4).is_empty());
        assert_eq!(collect(Selection::List(Arc::new(vec![5, 1, 5])), 2), vec![vec![5, 1], vec![5]]);
        // A chunk inside one range is a contiguous run.
        assert!(matches!(Chunks::new(Selection::Set(IdSet::all(10)), 4).next(), Some(ChunkIds::Run(0, 4))));
    }
}
