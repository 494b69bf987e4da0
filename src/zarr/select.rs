//! Queries: a crop (`Sample`: per-axis half-open ranges, out-of-bounds parts filled) or an index
//! query (per-axis index lists and slices, NumPy semantics, order and duplicates kept).

use crate::error::{Error, Result};

/// What one axis selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AxisSelection {
    /// Crop range `[start, stop)` in array coordinates; may extend past either edge (those
    /// positions read as the fill value).
    Range(i64, i64),
    /// A NumPy slice (`None` ends, negative values counted from the end, clipped; step != 0).
    Slice {
        /// Start.
        start: Option<i64>,
        /// Stop.
        stop: Option<i64>,
        /// Step.
        step: i64,
    },
    /// Explicit indices (negative counted from the end); each must be inside the array.
    Indices(Vec<i64>),
}

/// One sample of a batch: an array and what to take from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// The array (or NGFF image group) URI.
    pub uri: String,
    /// NGFF level when `uri` names a multiscale group.
    pub level: Option<usize>,
    /// One selection per axis.
    pub selection: Vec<AxisSelection>,
}

impl Query {
    /// A crop: `aabb[d] = (start, stop)`.
    pub fn crop(uri: impl Into<String>, aabb: &[(i64, i64)]) -> Query {
        Query { uri: uri.into(), level: None, selection: aabb.iter().map(|&(a, b)| AxisSelection::Range(a, b)).collect() }
    }

    /// An index query.
    pub fn index(uri: impl Into<String>, selection: Vec<AxisSelection>) -> Query {
        Query { uri: uri.into(), level: None, selection }
    }

    /// The same query at an NGFF level.
    pub fn at_level(mut self, level: usize) -> Query {
        self.level = Some(level);
        self
    }

    /// Per-axis positions in the array (`None`: outside, reads the fill value).
    pub(crate) fn resolve(&self, shape: &[u64]) -> Result<Vec<Vec<Option<u64>>>> {
        if self.selection.len() != shape.len() {
            return Err(Error::ShapeMismatch {
                expected: format!("{} axes (array shape {shape:?})", shape.len()),
                found: format!("a selection of {} axes", self.selection.len()),
            });
        }
        self.selection
            .iter()
            .zip(shape)
            .enumerate()
            .map(|(axis, (sel, &dim))| resolve_axis(axis, sel, dim, &self.uri))
            .collect()
    }
}

/// The longest selection along one axis: bounds planning memory for absurd inputs.
pub const MAX_AXIS_LEN: u64 = 1 << 24;

fn resolve_axis(axis: usize, sel: &AxisSelection, dim: u64, uri: &str) -> Result<Vec<Option<u64>>> {
    let idim = i64::try_from(dim).map_err(|_| Error::invalid("selection", "array dimension too large"))?;
    match sel {
        AxisSelection::Range(a, b) => {
            if b < a {
                return Err(Error::invalid("aabb", format!("axis {axis}: range ({a}, {b}) has stop < start")));
            }
            let n = b.checked_sub(*a).ok_or_else(|| Error::invalid("aabb", format!("axis {axis}: range ({a}, {b}) overflows")))? as u64;
            if n > MAX_AXIS_LEN {
                return Err(Error::invalid("aabb", format!("axis {axis}: range of {n} positions is larger than {MAX_AXIS_LEN}")));
            }
            Ok((*a..*b).map(|p| if p >= 0 && p < idim { Some(p as u64) } else { None }).collect())
        }
        AxisSelection::Slice { start, stop, step } => {
            if *step == 0 {
                return Err(Error::invalid("selection", format!("axis {axis}: slice step cannot be zero")));
            }
            // Python's slice.indices.
            let (lo, hi) = if *step > 0 { (0, idim) } else { (-1, idim - 1) };
            let norm = |v: Option<i64>, default: i64| -> i64 {
                match v {
                    None => default,
                    Some(x) if x < 0 => (x + idim).max(lo),
                    Some(x) => x.min(hi),
                }
            };
            let s = norm(*start, if *step > 0 { lo } else { hi });
            let e = norm(*stop, if *step > 0 { hi } else { lo });
            let mut out = Vec::new();
            let mut p = s;
            while (*step > 0 && p < e) || (*step < 0 && p > e) {
                if out.len() as u64 >= MAX_AXIS_LEN {
                    return Err(Error::invalid("selection", format!("axis {axis}: a slice of more than {MAX_AXIS_LEN} positions")));
                }
                out.push(Some(p as u64));
                p += step;
            }
            Ok(out)
        }
        AxisSelection::Indices(v) => {
            if v.len() as u64 > MAX_AXIS_LEN {
                return Err(Error::invalid("selection", format!("axis {axis}: {} indices is more than {MAX_AXIS_LEN}", v.len())));
            }
            v.iter()
                .map(|&i| {
                    let j = if i < 0 { i + idim } else { i };
                    if j < 0 || j >= idim {
                        Err(Error::IndexOutOfRange { index: i as i128, len: dim, store: format!("{uri} (axis {axis})").into() })
                    } else {
                        Ok(Some(j as u64))
                    }
                })
                .collect()
        }
    }
}

/// A contiguous run along one axis: `len` positions from `src` in a chunk to `dst` in the
/// output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub src: u64,
    pub dst: u64,
    pub len: u64,
}

/// Positions along one axis grouped by chunk: `(chunk index, runs)` in chunk order, plus
/// whether some positions are outside the array.
pub(crate) fn runs_by_chunk(positions: &[Option<u64>], chunk: u64) -> (Vec<(u64, Vec<Run>)>, bool) {
    let mut by: std::collections::BTreeMap<u64, Vec<Run>> = std::collections::BTreeMap::new();
    let mut outside = false;
    for (dst, p) in positions.iter().enumerate() {
        let Some(p) = *p else {
            outside = true;
            continue;
        };
        let (c, off) = (p / chunk, p % chunk);
        let runs = by.entry(c).or_default();
        match runs.last_mut() {
            Some(r) if r.src + r.len == off && r.dst + r.len == dst as u64 => r.len += 1,
            _ => runs.push(Run { src: off, dst: dst as u64, len: 1 }),
        }
    }
    (by.into_iter().collect(), outside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_follow_python() {
        let s = |a, b, st| AxisSelection::Slice { start: a, stop: b, step: st };
        let pos = |sel: AxisSelection| resolve_axis(0, &sel, 10, "x").unwrap().into_iter().map(|p| p.unwrap() as i64).collect::<Vec<_>>();
        assert_eq!(pos(s(None, None, 1)), (0..10).collect::<Vec<_>>());
        assert_eq!(pos(s(Some(-3), None, 1)), vec![7, 8, 9]);
        assert_eq!(pos(s(None, None, -3)), vec![9, 6, 3, 0]);
        assert_eq!(pos(s(Some(2), Some(100), 4)), vec![2, 6]);
        assert_eq!(pos(s(Some(8), Some(2), -2)), vec![8, 6, 4]);
        assert!(pos(s(Some(5), Some(2), 1)).is_empty());
        assert!(resolve_axis(0, &s(None, None, 0), 10, "x").is_err());
    }

    #[test]
    fn indices_wrap_and_check() {
        let r = resolve_axis(1, &AxisSelection::Indices(vec![-1, 0, 3, 3]), 4, "u").unwrap();
        assert_eq!(r, vec![Some(3), Some(0), Some(3), Some(3)]);
        let e = resolve_axis(1, &AxisSelection::Indices(vec![4]), 4, "u").unwrap_err();
        assert!(matches!(e, Error::IndexOutOfRange { index: 4, len: 4, .. }), "{e}");
    }

    #[test]
    fn runs_group_by_chunk_in_order() {
        let pos: Vec<Option<u64>> = vec![None, Some(3), Some(4), Some(5), Some(2), Some(2)];
        let (runs, outside) = runs_by_chunk(&pos, 4);
        assert!(outside);
        assert_eq!(runs, vec![
            (0, vec![Run { src: 3, dst: 1, len: 1 }, Run { src: 2, dst: 4, len: 1 }, Run { src: 2, dst: 5, len: 1 }]),
            (1, vec![Run { src: 0, dst: 2, len: 2 }]),
        ]);
    }
}
