//! `UnsignedLiterals`: an analyzer rule run before type coercion that types non-negative integer
//! literals compared with a UInt64 column (such as `_id`) as UInt64.
//!
//! Without it, `_id IN (3, 17, ...)` (Int64 literals against a UInt64 column) is coerced through
//! Decimal128 casts of every literal that the simplifier then evaluates and unwraps one by one:
//! about a third of the planning time of a 256-id lookup. The rewrite keeps the semantics
//! exactly (a non-negative Int64 equals the same UInt64); negative literals are left for the
//! usual coercion. It also lets `_id = ANY(<signed integer list>)` plan (see below).

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::logical_expr::{Between, BinaryExpr, Expr, LogicalPlan, Operator};
use datafusion::optimizer::AnalyzerRule;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct UnsignedLiterals;

fn is_u64_column(e: &Expr, schema: &DFSchema) -> bool {
    match e {
        Expr::Column(c) => schema.qualified_field_from_column(c).map(|(_, f)| f.data_type() == &datafusion::arrow::datatypes::DataType::UInt64).unwrap_or(false),
        _ => false,
    }
}

/// The literal as UInt64 when it is a non-negative signed integer.
fn as_u64(e: &Expr) -> Option<Expr> {
    let Expr::Literal(v, meta) = e else { return None };
    let x: i64 = match v {
        ScalarValue::Int64(Some(x)) => *x,
        ScalarValue::Int32(Some(x)) => *x as i64,
        ScalarValue::Int16(Some(x)) => *x as i64,
        ScalarValue::Int8(Some(x)) => *x as i64,
        _ => return None,
    };
    u64::try_from(x).ok().map(|u| Expr::Literal(ScalarValue::UInt64(Some(u)), meta.clone()))
}

fn rewrite(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    e.transform_up(|e| {
        Ok(match e {
            Expr::InList(mut l) if is_u64_column(&l.expr, schema) => {
                let typed: Option<Vec<Expr>> = l.list.iter().map(as_u64).collect();
                match typed {
                    Some(list) => {
                        l.list = list;
                        Transformed::yes(Expr::InList(l))
                    }
                    None => Transformed::no(Expr::InList(l)),
                }
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right })
                if matches!(op, Operator::Eq | Operator::NotEq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq) =>
            {
                if is_u64_column(&left, schema) {
                    if let Some(r) = as_u64(&right) {
                        return Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr { left, op, right: Box::new(r) })));
                    }
                } else if is_u64_column(&right, schema) {
                    if let Some(l) = as_u64(&left) {
                        return Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr { left: Box::new(l), op, right })));
                    }
                }
                Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right }))
            }
            Expr::Between(b) if is_u64_column(&b.expr, schema) => match (as_u64(&b.low), as_u64(&b.high)) {
                (Some(lo), Some(hi)) => Transformed::yes(Expr::Between(Between { expr: b.expr, negated: b.negated, low: Box::new(lo), high: Box::new(hi) })),
                _ => Transformed::no(Expr::Between(b)),
            },
            // `u = ANY(<signed integer list>)` (`array_has(list, u)`): DataFusion cannot coerce a
            // UInt64 element against an Int64 list; compare as Int64 (TRY_CAST: a value past
            // i64::MAX is NULL, which matches nothing, as it equals no element).
            Expr::ScalarFunction(mut f)
                if f.func.name() == "array_has" && f.args.len() == 2 && is_u64_column(&f.args[1], schema) && signed_list(&f.args[0], schema) =>
            {
                let col = std::mem::replace(&mut f.args[1], Expr::Literal(ScalarValue::Null, None));
                f.args[1] = Expr::TryCast(datafusion::logical_expr::TryCast::new(Box::new(col), datafusion::arrow::datatypes::DataType::Int64));
                Transformed::yes(Expr::ScalarFunction(f))
            }
            other => Transformed::no(other),
        })
    })
}

/// An expression (list literal, `make_array`, typed placeholder) of a list of signed integers.
fn signed_list(e: &Expr, schema: &DFSchema) -> bool {
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::ExprSchemable;
    match e.get_type(schema) {
        Ok(DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)) => f.data_type().is_signed_integer(),
        _ => false,
    }
}

impl AnalyzerRule for UnsignedLiterals {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|p| match p {
            LogicalPlan::Filter(mut f) => {
                let schema = f.input.schema().clone();
                let t = rewrite(f.predicate, &schema)?;
                f.predicate = t.data;
                Ok(if t.transformed { Transformed::yes(LogicalPlan::Filter(f)) } else { Transformed::no(LogicalPlan::Filter(f)) })
            }
            // Filters DataFusion placed in the scan itself (all columns of the source).
            LogicalPlan::TableScan(mut ts) if !ts.filters.is_empty() => {
                let schema = DFSchema::try_from_qualified_schema(ts.table_name.clone(), &ts.source.schema())?;
                let mut any = false;
                let filters = std::mem::take(&mut ts.filters);
                for f in filters {
                    let t = rewrite(f, &schema)?;
                    any |= t.transformed;
                    ts.filters.push(t.data);
                }
                Ok(if any { Transformed::yes(LogicalPlan::TableScan(ts)) } else { Transformed::no(LogicalPlan::TableScan(ts)) })
            }
            other => Ok(Transformed::no(other)),
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "zrecord_unsigned_literals"
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{RecordBatch, UInt64Array};

    async fn plan_and_rows(sql: &str) -> (String, usize) {
        let ctx = crate::query::zrecord_context();
        let b = RecordBatch::try_from_iter(vec![("u", Arc::new(UInt64Array::from((0..10u64).collect::<Vec<_>>())) as _)]).unwrap();
        ctx.register_batch("m", b).unwrap();
        let df = ctx.sql(sql).await.unwrap();
        let plan = format!("{}", df.clone().into_optimized_plan().unwrap().display_indent());
        let rows = df.collect().await.unwrap().iter().map(|b| b.num_rows()).sum();
        (plan, rows)
    }

    #[test]
    fn literals_against_uint64_columns_are_typed_uint64() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let (plan, rows) = plan_and_rows("SELECT u FROM m WHERE u IN (1, 3, 30) OR u BETWEEN 7 AND 8 OR 9 <= u").await;
            assert!(plan.contains("UInt64(3)") && !plan.contains("Decimal128"), "{plan}");
            assert_eq!(rows, 5); // 1, 3, 7, 8, 9
            // A negative literal keeps the usual coercion (and the same answer).
            let (plan, rows) = plan_and_rows("SELECT u FROM m WHERE u IN (-1, 2) OR u > -5 AND u < 1").await;
            assert!(plan.contains("Int64(-1)") || plan.contains("Decimal128"), "{plan}");
            assert_eq!(rows, 2); // 2 and 0
            // `= ANY(<Int64 list>)` against UInt64 plans (DataFusion alone cannot coerce it).
            let (plan, rows) = plan_and_rows("SELECT u FROM m WHERE u = ANY([3, -1, 5, 3])").await;
            assert!(plan.contains("TRY_CAST"), "{plan}");
            assert_eq!(rows, 2);
        });
    }
}
