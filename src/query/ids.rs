//! The `_id` filters that push down into a scan exactly.
//!
//! A filter that only involves `_id` and integer literals (`=`, `!=`, `<`, `<=`, `>`, `>=`,
//! `BETWEEN`, `IN`, `IS [NOT] NULL`, combined with `AND` / `OR` / `NOT`) becomes an [`IdSet`]: sorted,
//! disjoint id ranges within `[0, n)`. The scan reads exactly those records.

use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator};

pub use crate::store::selection::IdSet;

fn is_id_column(e: &Expr) -> bool {
    match e {
        Expr::Column(c) => c.name == "_id",
        // Casts that keep every id value (ids < 2^63): wider or equal integer / scale-0 decimal.
        Expr::Cast(c) => {
            use datafusion::arrow::datatypes::DataType::*;
            matches!(c.field.data_type(), Int64 | UInt64 | Decimal128(_, 0) | Decimal256(_, 0)) && is_id_column(&c.expr)
        }
        // TRY_CAST to Int64 (see `UnsignedLiterals`): ids past i64::MAX become NULL and match
        // nothing; no table has that many records.
        Expr::TryCast(c) => c.field.data_type() == &datafusion::arrow::datatypes::DataType::Int64 && is_id_column(&c.expr),
        _ => false,
    }
}

/// An integer literal as i128 (`None` for anything else, NULL included).
fn int_literal(e: &Expr) -> Option<i128> {
    let Expr::Literal(v, _) = e else { return None };
    Some(match v {
        ScalarValue::Int8(Some(x)) => *x as i128,
        ScalarValue::Int16(Some(x)) => *x as i128,
        ScalarValue::Int32(Some(x)) => *x as i128,
        ScalarValue::Int64(Some(x)) => *x as i128,
        ScalarValue::UInt8(Some(x)) => *x as i128,
        ScalarValue::UInt16(Some(x)) => *x as i128,
        ScalarValue::UInt32(Some(x)) => *x as i128,
        ScalarValue::UInt64(Some(x)) => *x as i128,
        ScalarValue::Decimal128(Some(x), _, 0) => *x,
        _ => return None,
    })
}

fn clamp(v: i128, n: u64) -> u64 {
    v.clamp(0, n as i128) as u64
}

/// `_id op v` over `[0, n)`.
fn compare(op: Operator, v: i128, n: u64) -> Option<IdSet> {
    let r = |lo: i128, hi: i128| IdSet::range(clamp(lo, n), clamp(hi, n));
    Some(match op {
        Operator::Eq => r(v, v + 1),
        Operator::NotEq => r(v, v + 1).complement(n),
        Operator::Lt => r(0, v),
        Operator::LtEq => r(0, v + 1),
        Operator::Gt => r(v + 1, n as i128),
        Operator::GtEq => r(v, n as i128),
        _ => return None,
    })
}

fn flip(op: Operator) -> Option<Operator> {
    Some(match op {
        Operator::Eq => Operator::Eq,
        Operator::NotEq => Operator::NotEq,
        Operator::Lt => Operator::Gt,
        Operator::LtEq => Operator::GtEq,
        Operator::Gt => Operator::Lt,
        Operator::GtEq => Operator::LtEq,
        _ => return None,
    })
}

/// The exact id set a filter selects over `[0, n)`, or `None` when it is not an `_id`-only
/// filter this scan can answer exactly.
pub fn id_filter(e: &Expr, n: u64) -> Option<IdSet> {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::And => Some(id_filter(left, n)?.intersect(&id_filter(right, n)?)),
            Operator::Or => Some(id_filter(left, n)?.union(&id_filter(right, n)?)),
            _ => {
                if is_id_column(left) {
                    compare(*op, int_literal(right)?, n)
                } else if is_id_column(right) {
                    compare(flip(*op)?, int_literal(left)?, n)
                } else {
                    None
                }
            }
        },
        Expr::Not(inner) => Some(id_filter(inner, n)?.complement(n)),
        Expr::Between(Between { expr, negated, low, high }) if is_id_column(expr) => {
            let (lo, hi) = (int_literal(low)?, int_literal(high)?);
            let s = IdSet::range(clamp(lo, n), clamp(hi.saturating_add(1), n));
            Some(if *negated { s.complement(n) } else { s })
        }
        Expr::InList(l) if is_id_column(&l.expr) => {
            let mut ranges = Vec::with_capacity(l.list.len());
            for v in &l.list {
                let v = int_literal(v)?;
                if (0..n as i128).contains(&v) {
                    ranges.push(v as u64..v as u64 + 1);
                }
            }
            let s = IdSet::from_ranges(ranges);
            Some(if l.negated { s.complement(n) } else { s })
        }
        // What the simplifier leaves of an always-true / always-false filter (`_id IN ()`).
        Expr::Literal(ScalarValue::Boolean(b), _) => Some(if *b == Some(true) { IdSet::all(n) } else { IdSet::empty() }),
        Expr::IsNotNull(inner) if is_id_column(inner) => Some(IdSet::all(n)),
        Expr::IsNull(inner) if is_id_column(inner) => Some(IdSet::empty()),
        _ => None,
    }
}

/// Ids that come from a statement parameter, bound at execution: an `_id` filter
/// (`_id = ANY($1)`, an id list, or `_id = $1`, one id) or the ids of `gather('t', $1)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdParam {
    /// The placeholder, with its `$` (`"$1"`, `"$ids"`).
    pub id: String,
    /// True for a list of ids (`= ANY($1)`, `gather('t', $1)`), false for one id (`= $1`).
    pub list: bool,
    /// True for `gather('t', $1)`: the ids in their order, duplicates kept, each one an id of
    /// the table (an error otherwise); false for a filter (`IN` semantics).
    pub gather: bool,
}

impl IdParam {
    /// `_id = ANY($k)` (`list`) or `_id = $k`.
    pub fn filter(id: impl Into<String>, list: bool) -> IdParam {
        IdParam { id: id.into(), list, gather: false }
    }

    /// The ids of `gather('t', $k)`.
    pub fn gather(id: impl Into<String>) -> IdParam {
        IdParam { id: id.into(), list: true, gather: true }
    }

    /// How the parameter reads in a plan: `ANY($1)`, `$1` or `gather($1)`.
    pub fn display(&self) -> String {
        match (self.gather, self.list) {
            (true, _) => format!("gather({})", self.id),
            (false, true) => format!("ANY({})", self.id),
            (false, false) => self.id.clone(),
        }
    }
}

/// What a bound parameter selects: a set of ids (a filter) or ids in order (a gather).
#[derive(Clone, Debug)]
pub enum BoundIds {
    /// Ids within the table, in id order (`_id = ANY($1)`, `_id = $1`).
    Set(IdSet),
    /// Ids in the given order, duplicates kept, each below the table's record count.
    Order(std::sync::Arc<Vec<u64>>),
}

/// The ids of a `gather('t', $k)` parameter value (a list of integers) in their order: a NULL
/// or a negative id is an error naming the parameter (the scan checks them against its table).
pub fn param_order(param: &IdParam, value: &ScalarValue) -> crate::error::Result<Vec<u64>> {
    use datafusion::arrow::array::Array;
    let values = match value {
        ScalarValue::List(a) if !a.is_null(0) => a.value(0),
        ScalarValue::LargeList(a) if !a.is_null(0) => a.value(0),
        ScalarValue::FixedSizeList(a) if !a.is_null(0) => a.value(0),
        v => {
            return Err(crate::error::Error::invalid("parameter", format!("{} binds the ids of gather(): expected a list of integers, got {v:?}", param.id)));
        }
    };
    crate::query::functions::ids_from_array(&values).map_err(|e| crate::error::Error::invalid("parameter", format!("{}: {e}", param.id)))
}

fn placeholder_id(e: &Expr) -> Option<&str> {
    match e {
        Expr::Placeholder(p) => Some(&p.id),
        Expr::Cast(c) => placeholder_id(&c.expr),
        Expr::TryCast(c) => placeholder_id(&c.expr),
        _ => None,
    }
}

/// The parameter a filter takes its ids from, when it is `_id = ANY($k)` (planned by
/// DataFusion as `array_has($k, _id)`) or `_id = $k`.
pub fn param_filter(e: &Expr) -> Option<IdParam> {
    match e {
        Expr::ScalarFunction(f) if f.func.name() == "array_has" && f.args.len() == 2 && is_id_column(&f.args[1]) => {
            Some(IdParam::filter(placeholder_id(&f.args[0])?, true))
        }
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::Eq, right }) => {
            let p = if is_id_column(left) { placeholder_id(right)? } else if is_id_column(right) { placeholder_id(left)? } else { return None };
            Some(IdParam::filter(p, false))
        }
        _ => None,
    }
}

/// The ids a bound parameter value selects over `[0, n)` (IN semantics: ids outside the
/// table and NULLs match nothing; order and duplicates do not matter). A value that is not
/// an integer (or a list of integers) is an error naming the parameter.
pub fn param_ids(param: &IdParam, value: &ScalarValue, n: u64) -> crate::error::Result<IdSet> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{DataType, Int64Type, UInt64Type};
    let bad = || crate::error::Error::invalid("parameter", format!("{} binds _id values: expected {}, got {value:?}", param.id, if param.list { "a list of integers" } else { "an integer" }));
    let one = |v: &ScalarValue| -> crate::error::Result<Option<u64>> {
        if v.is_null() {
            return Ok(None);
        }
        let x = int_literal(&Expr::Literal(v.clone(), None)).ok_or_else(bad)?;
        Ok((0..n as i128).contains(&x).then_some(x as u64))
    };
    let mut ids: Vec<u64> = Vec::new();
    let elements = match value {
        ScalarValue::List(a) if param.list => (!a.is_null(0)).then(|| a.value(0)),
        ScalarValue::LargeList(a) if param.list => (!a.is_null(0)).then(|| a.value(0)),
        ScalarValue::FixedSizeList(a) if param.list => (!a.is_null(0)).then(|| a.value(0)),
        v if !param.list => {
            ids.extend(one(v)?);
            None
        }
        v if v.is_null() => None,
        _ => return Err(bad()),
    };
    if let Some(values) = elements {
        match values.data_type() {
            DataType::UInt64 => ids.extend(values.as_primitive::<UInt64Type>().iter().flatten().filter(|&i| i < n)),
            t if t.is_integer() => {
                // Values too large for int64 are ids past any table: cast to null, no match.
                let v = arrow_cast::cast(&values, &DataType::Int64).map_err(|_| bad())?;
                ids.extend(v.as_primitive::<Int64Type>().iter().flatten().filter(|&i| i >= 0 && (i as u64) < n).map(|i| i as u64));
            }
            DataType::Null => {}
            _ => return Err(bad()),
        }
    }
    Ok(ids_to_set(&ids))
}

/// Sorted, merged ranges of any ids.
pub fn ids_to_set(ids: &[u64]) -> IdSet {
    if ids.windows(2).all(|w| w[0] <= w[1]) {
        return IdSet::from_sorted_ids(ids);
    }
    let mut v = ids.to_vec();
    v.sort_unstable();
    IdSet::from_sorted_ids(&v)
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init, clippy::expect_used)]
mod tests {
    use super::*;
    use datafusion::logical_expr::{col, lit};

    #[test]
    fn set_algebra() {
        let a = IdSet::from_ranges(vec![5..10, 0..3, 2..4, 10..12]);
        assert_eq!(a.ranges(), &[0..4, 5..12]);
        assert_eq!(a.count(), 11);
        assert!(a.contains(3) && !a.contains(4) && a.contains(11) && !a.contains(12));
        assert_eq!(a.complement(20).ranges(), &[4..5, 12..20]);
        let b = IdSet::from_ranges(vec![3..6, 11..30]);
        assert_eq!(a.intersect(&b).ranges(), &[3..4, 5..6, 11..12]);
        assert_eq!(a.truncate(6).ranges(), &[0..4, 5..7]);
        let parts = a.split(3);
        assert_eq!(parts.iter().map(|p| p.count()).collect::<Vec<_>>(), vec![4, 4, 3]);
        assert_eq!(parts[1].ranges(), &[5..9]);
        assert_eq!(IdSet::all(2).split(8).len(), 2);
        assert_eq!(IdSet::empty().split(4).len(), 1);
    }

    #[test]
    fn filters_to_sets() {
        let n = 100;
        let f = |e: Expr| id_filter(&e, n).map(|s| s.ranges().to_vec());
        assert_eq!(f(col("_id").eq(lit(5u64))), Some(vec![5..6]));
        assert_eq!(f(lit(5i64).lt(col("_id"))), Some(vec![6..100]));
        assert_eq!(f(col("_id").gt_eq(lit(90i64)).and(col("_id").lt(lit(95i32)))), Some(vec![90..95]));
        assert_eq!(f(col("_id").in_list(vec![lit(7i64), lit(3i64), lit(7i64), lit(500i64), lit(-1i64)], false)), Some(vec![3..4, 7..8]));
        assert_eq!(f(col("_id").between(lit(10i64), lit(12i64)).or(col("_id").eq(lit(0i64)))), Some(vec![0..1, 10..13]));
        assert_eq!(f(col("_id").not_eq(lit(0i64))), Some(vec![1..100]));
        assert_eq!(f(Expr::Not(Box::new(col("_id").lt(lit(98i64))))), Some(vec![98..100]));
        assert_eq!(f(col("_id").lt(lit(-3i64))), Some(vec![]));
        assert_eq!(f(lit(false)), Some(vec![]));
        assert_eq!(f(lit(ScalarValue::Boolean(None))), Some(vec![]));
        assert_eq!(f(lit(true).and(col("_id").lt(lit(2i64)))), Some(vec![0..2]));
        // Not exact: other columns, floats, non-literals.
        assert_eq!(f(col("label").eq(lit(1i64))), None);
        assert_eq!(f(col("_id").eq(lit(1.5f64))), None);
        assert_eq!(f(col("_id").eq(col("label"))), None);
        assert_eq!(f(col("_id").eq(lit(1i64)).or(col("label").eq(lit(2i64)))), None);
    }

    /// A small filter language evaluated by brute force over every id: the reference.
    #[derive(Clone, Debug)]
    enum F {
        Cmp(u8, i64),
        In(Vec<i64>, bool),
        Between(i64, i64, bool),
        And(Box<F>, Box<F>),
        Or(Box<F>, Box<F>),
        Not(Box<F>),
    }

    impl F {
        fn eval(&self, id: i64) -> bool {
            match self {
                F::Cmp(op, v) => [id == *v, id != *v, id < *v, id <= *v, id > *v, id >= *v][*op as usize],
                F::In(l, neg) => l.contains(&id) != *neg,
                F::Between(a, b, neg) => (*a <= id && id <= *b) != *neg,
                F::And(a, b) => a.eval(id) && b.eval(id),
                F::Or(a, b) => a.eval(id) || b.eval(id),
                F::Not(a) => !a.eval(id),
            }
        }

        fn expr(&self) -> Expr {
            let id = || col("_id");
            match self {
                F::Cmp(op, v) => match op {
                    0 => id().eq(lit(*v)),
                    1 => id().not_eq(lit(*v)),
                    2 => id().lt(lit(*v)),
                    3 => id().lt_eq(lit(*v)),
                    4 => lit(*v).lt(id()), // literal on the left
                    _ => id().gt_eq(lit(*v)),
                },
                F::In(l, neg) => id().in_list(l.iter().map(|v| lit(*v)).collect(), *neg),
                F::Between(a, b, neg) => {
                    if *neg {
                        id().not_between(lit(*a), lit(*b))
                    } else {
                        id().between(lit(*a), lit(*b))
                    }
                }
                F::And(a, b) => a.expr().and(b.expr()),
                F::Or(a, b) => a.expr().or(b.expr()),
                F::Not(a) => Expr::Not(Box::new(a.expr())),
            }
        }
    }

    fn arb_filter(n: i64) -> impl proptest::strategy::Strategy<Value = F> {
        use proptest::prelude::*;
        let v = -3..n + 3;
        let leaf = prop_oneof![
            (0u8..6, v.clone()).prop_map(|(o, x)| F::Cmp(o, x)),
            (proptest::collection::vec(v.clone(), 0..6), any::<bool>()).prop_map(|(l, neg)| F::In(l, neg)),
            (v.clone(), v, any::<bool>()).prop_map(|(a, b, neg)| F::Between(a, b, neg)),
        ];
        leaf.prop_recursive(3, 16, 2, |inner| {
            prop_oneof![
                (inner.clone(), inner.clone()).prop_map(|(a, b)| F::And(Box::new(a), Box::new(b))),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| F::Or(Box::new(a), Box::new(b))),
                inner.prop_map(|a| F::Not(Box::new(a))),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn id_filters_match_brute_force(f in arb_filter(40), n in 0u64..40) {
            let set = id_filter(&f.expr(), n).expect("every generated filter is an exact _id filter");
            let want: Vec<u64> = (0..n).filter(|&i| f.eval(i as i64)).collect();
            let got: Vec<u64> = set.ranges().iter().flat_map(|r| r.clone()).collect();
            proptest::prop_assert_eq!(got, want, "{}", f.expr());
            // Ranges are normalised: sorted, disjoint, non-adjacent, non-empty.
            for w in set.ranges().windows(2) {
                proptest::prop_assert!(w[0].end < w[1].start);
            }
        }
    }
}
