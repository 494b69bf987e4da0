//! The range planner: which reads fetch a set of byte ranges of one file. Store preloads from
//! object storage and Zarr shard reads (local and remote) both plan through [`coalesce`].

use std::ops::Range;

/// One planned read: the bytes to fetch and which of the wanted ranges they hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    /// Bytes to fetch.
    pub range: Range<u64>,
    /// Indexes (into the planner's input) of the wanted ranges inside `range`, in offset order.
    pub members: Vec<usize>,
}

impl Read {
    /// Bytes the read fetches.
    pub fn len(&self) -> u64 {
        self.range.end - self.range.start
    }

    /// True for a read of no bytes (only empty ranges wanted there).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Plan reads of `wanted` (ranges of one file, any order, overlaps allowed): ranges closer than
/// `gap` bytes are fetched by one read as long as that read stays within `max_len` bytes. A
/// single range longer than `max_len` is its own read (split it with [`split`] where requests
/// have a size limit). Every wanted range is a member of exactly one read; an empty range (or
/// one with `end < start`, taken as empty at `start`) joins the read that covers its offset,
/// or is a read of no bytes. Reads come in offset order; two reads overlap
/// only where wanted ranges overlap and one read holding both would pass `max_len`.
pub fn coalesce(wanted: &[Range<u64>], gap: u64, max_len: u64) -> Vec<Read> {
    let span = |i: usize| wanted[i].start..wanted[i].end.max(wanted[i].start);
    let mut order: Vec<usize> = (0..wanted.len()).collect();
    order.sort_unstable_by_key(|&i| (wanted[i].start, wanted[i].end.max(wanted[i].start)));
    let mut reads: Vec<Read> = Vec::new();
    for i in order {
        let r = span(i);
        match reads.last_mut() {
            Some(m) if r.start <= m.range.end.saturating_add(gap) && r.end.max(m.range.end) - m.range.start <= max_len => {
                m.range.end = m.range.end.max(r.end);
                m.members.push(i);
            }
            // Contained in the previous read already (overlapping ranges): no growth.
            Some(m) if r.end <= m.range.end => m.members.push(i),
            _ => reads.push(Read { range: r, members: vec![i] }),
        }
    }
    reads
}

/// `range` cut into pieces of at most `max_len` bytes (`max_len` of 0 is taken as 1).
pub fn split(range: Range<u64>, max_len: u64) -> impl Iterator<Item = Range<u64>> {
    let step = max_len.max(1);
    let mut at = range.start;
    std::iter::from_fn(move || {
        (at < range.end).then(|| {
            let end = at.saturating_add(step).min(range.end);
            let piece = at..end;
            at = end;
            piece
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn neighbours_merge_within_the_gap_and_the_size_limit() {
        let wanted = [100..110, 0..10, 10..20, 25..30, 200..210];
        // Gap 0: only touching ranges merge.
        let r = coalesce(&wanted, 0, 1 << 20);
        assert_eq!(r.iter().map(|r| r.range.clone()).collect::<Vec<_>>(), vec![0..20, 25..30, 100..110, 200..210]);
        assert_eq!(r[0].members, vec![1, 2]);
        // Gap 5 bridges 20..25; gap 100 everything but the size limit of 120 stops at 110.
        let r = coalesce(&wanted, 5, 1 << 20);
        assert_eq!(r.iter().map(|r| r.range.clone()).collect::<Vec<_>>(), vec![0..30, 100..110, 200..210]);
        let r = coalesce(&wanted, 100, 120);
        assert_eq!(r.iter().map(|r| r.range.clone()).collect::<Vec<_>>(), vec![0..110, 200..210]);
        assert_eq!(r[0].members, vec![1, 2, 3, 0]);
        // Empty ranges join the read covering them or are reads of no bytes; a range over the
        // limit stands alone.
        assert_eq!(coalesce(&[0..8, 5..5, 30..2], 0, 10), vec![Read { range: 0..8, members: vec![0, 1] }, Read { range: 30..30, members: vec![2] }]);
        let r = coalesce(&[0..50, 50..51], 0, 10);
        assert_eq!(r.iter().map(|r| r.range.clone()).collect::<Vec<_>>(), vec![0..50, 50..51]);
        // A range inside a read already planned joins it even when the read is at the limit.
        let r = coalesce(&[0..10, 2..4], 0, 10);
        assert_eq!(r, vec![Read { range: 0..10, members: vec![0, 1] }]);
        assert_eq!(split(0..10, 4).collect::<Vec<_>>(), vec![0..4, 4..8, 8..10]);
        assert_eq!(split(u64::MAX - 3..u64::MAX, 2).collect::<Vec<_>>(), vec![u64::MAX - 3..u64::MAX - 1, u64::MAX - 1..u64::MAX]);
        assert_eq!(split(7..7, 0).count(), 0);
    }

    proptest! {
        #[test]
        fn every_range_is_read_once_inside_one_disjoint_read(
            wanted in proptest::collection::vec((0u64..5000, 0u64..300, any::<bool>()), 0..60),
            gap in 0u64..400,
            max_len in 1u64..2000,
        ) {
            // Some ranges inverted (end < start): taken as empty.
            let wanted: Vec<Range<u64>> = wanted.into_iter().map(|(a, n, flip)| if flip { a..a.saturating_sub(n) } else { a..a + n }).collect();
            let reads = coalesce(&wanted, gap, max_len);
            let mut seen = vec![0usize; wanted.len()];
            for (k, r) in reads.iter().enumerate() {
                for &i in &r.members {
                    seen[i] += 1;
                    prop_assert!(r.range.start <= wanted[i].start && wanted[i].end.max(wanted[i].start) <= r.range.end);
                }
                // Reads over the limit hold one range exactly (or ranges inside it).
                if r.len() > max_len {
                    prop_assert!(r.members.iter().any(|&i| wanted[i] == r.range));
                }
                if let Some(next) = reads.get(k + 1) {
                    prop_assert!(r.range.start <= next.range.start);
                    prop_assert!(r.range.end <= next.range.start || next.range.end.max(r.range.end) - r.range.start > max_len);
                    // Not merged: too far apart or too long together.
                    prop_assert!(next.range.start > r.range.end.saturating_add(gap) || next.range.end.max(r.range.end) - r.range.start > max_len);
                }
                // A read starts at a range and ends at one.
                prop_assert!(r.members.iter().any(|&i| wanted[i].start == r.range.start));
                prop_assert!(r.members.iter().any(|&i| wanted[i].end.max(wanted[i].start) == r.range.end));
            }
            prop_assert!(seen.iter().all(|&n| n == 1), "{:?}", seen);
        }
    }
}
