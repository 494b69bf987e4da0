//! Prepared statements: parse, analyse, optimise and plan a query once, then execute it many
//! times with new parameter values and no SQL text per call.
//!
//! `_id = ANY($1)` and `_id = $1` filters over zrecord tables push into the scan with their
//! ids left open ([`ZrecordScanExec::bind`]); when every parameter of a statement is such a
//! filter the physical plan itself is reused: an execution binds the ids into a copy of the
//! scan and runs the same plan (no planning at all). Statements with other parameters
//! (`LIMIT $2`, `label = $1`, ...) are still parsed once, and their logical plan is bound and
//! re-optimised per execution.
//!
//! ```no_run
//! # async fn demo() -> datafusion::error::Result<()> {
//! use zrecord::query::{zrecord_context, PreparedQuery, SessionContextExt};
//! let ctx = zrecord_context();
//! ctx.register_zrecord("t", "/data/train")?;
//! let q = PreparedQuery::new(&ctx, "SELECT _id, x FROM t WHERE _id = ANY($1)").await?;
//! assert!(q.reuses_plan());
//! let batches = q.lookup(&[7, 3, 9]).await?; // rows 3, 7, 9 (id order, as IN)
//! # Ok(()) }
//! ```

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{ParamValues, Result as DfResult, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionState;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Expr, LogicalPlan, Statement};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{DataFrame, SessionContext};

use crate::error::Error;
use crate::query::ids::{ids_to_set, param_ids, param_order, BoundIds, IdParam};
use crate::query::table::{ZrecordScanExec, ZrecordTable};

/// A query planned once and executed many times with new parameter values.
pub struct PreparedQuery {
    state: SessionState,
    /// The analysed plan with its placeholders (the slow path binds it per execution).
    logical: LogicalPlan,
    /// The placeholders, sorted (`$1`, `$2`, ...).
    params: Vec<String>,
    /// The physical plan, when every placeholder is an `_id` filter inside a zrecord scan.
    physical: Option<Arc<dyn ExecutionPlan>>,
    task: Arc<TaskContext>,
    schema: SchemaRef,
}

impl std::fmt::Debug for PreparedQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedQuery").field("parameters", &self.params).field("reuses_plan", &self.physical.is_some()).finish()
    }
}

fn invalid(reason: impl Into<String>) -> DataFusionError {
    Error::invalid("prepared statement", reason).into()
}

/// `array_has($k, _id)` with an untyped `$k` (what `_id = ANY($1)` becomes): typed as a list
/// of UInt64, the `_id` type, so the statement plans without a `PREPARE ... (type)` clause.
fn type_id_lists(plan: LogicalPlan) -> DfResult<LogicalPlan> {
    let list = DataType::List(Arc::new(Field::new_list_field(DataType::UInt64, true)));
    plan.transform_up_with_subqueries(|node| {
        node.map_expressions(|e| {
            e.transform_up(|e| match e {
                Expr::ScalarFunction(mut f) if f.func.name() == "array_has" && f.args.len() == 2 => {
                    if let Expr::Placeholder(p) = &mut f.args[0] {
                        if p.field.is_none() {
                            p.field = Some(Arc::new(Field::new(p.id.clone(), list.clone(), true)));
                            return Ok(Transformed::yes(Expr::ScalarFunction(f)));
                        }
                    }
                    Ok(Transformed::no(Expr::ScalarFunction(f)))
                }
                other => Ok(Transformed::no(other)),
            })
        })
    })
    .map(|t| t.data)
}

/// Position of a positional placeholder (`$3` -> 2).
fn position(id: &str) -> Option<usize> {
    id.strip_prefix('$')?.parse::<usize>().ok()?.checked_sub(1)
}

impl PreparedQuery {
    /// Prepare `sql`: a query with positional parameters `$1`, `$2`, ... (or a
    /// `PREPARE name(type, ...) AS query` statement, whose declared types are used). Untyped
    /// `_id = ANY($k)` parameters are lists of UInt64.
    pub async fn new(ctx: &SessionContext, sql: &str) -> DfResult<PreparedQuery> {
        let state = ctx.state();
        let plan = state.create_logical_plan(sql).await?;
        let plan = match plan {
            LogicalPlan::Statement(Statement::Prepare(p)) => Arc::unwrap_or_clone(p.input),
            p @ (LogicalPlan::Dml(_) | LogicalPlan::Ddl(_) | LogicalPlan::Copy(_) | LogicalPlan::Statement(_)) => {
                return Err(invalid(format!("only queries can be prepared, not {}", p.display())));
            }
            p => p,
        };
        let logical = type_id_lists(plan)?;
        let mut params: Vec<String> = logical.get_parameter_types()?.into_keys().collect();
        // `gather('t', $k)`: the table function took its placeholder at planning time, so the
        // plan holds it in the scanned table, not in an expression.
        for p in gather_params(&logical)? {
            if !params.contains(&p.id) {
                params.push(p.id);
            }
        }
        params.sort_by_key(|p| (position(p), p.clone()));
        if let Some(named) = params.iter().find(|p| position(p).is_none()) {
            return Err(invalid(format!("parameter {named} is not positional: use $1, $2, ...")));
        }
        for (i, p) in params.iter().enumerate() {
            if position(p) != Some(i) {
                return Err(invalid(format!("parameters must be numbered $1..${} without gaps, found {p}", params.len())));
            }
        }
        let schema: SchemaRef = Arc::new(logical.schema().as_arrow().clone());
        // Plan the whole statement now. It succeeds exactly when no placeholder is left outside
        // the zrecord scans (the physical planner refuses a placeholder expression).
        let physical = match state.create_physical_plan(&logical).await {
            Ok(p) if all_params_in_scans(&p, &params) => Some(p),
            Ok(_) => None,
            Err(e) if e.to_string().contains("Placeholder") => None,
            Err(e) => return Err(e),
        };
        let task = Arc::new(TaskContext::from(&state));
        Ok(PreparedQuery { state, logical, params, physical, task, schema })
    }

    /// The statement's parameters, in order (`$1`, `$2`, ...).
    pub fn parameters(&self) -> &[String] {
        &self.params
    }

    /// The schema of the result.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// True when executions reuse the physical plan (every parameter is an `_id` filter of a
    /// zrecord table); false when each execution binds and re-plans the parsed statement.
    pub fn reuses_plan(&self) -> bool {
        self.physical.is_some()
    }

    /// The physical plan executions reuse (with its scans' ids still open), if any.
    pub fn physical_plan(&self) -> Option<&Arc<dyn ExecutionPlan>> {
        self.physical.as_ref()
    }

    /// Execute with `values[k]` bound to `$k+1`. Id parameters take an integer (`_id = $1`)
    /// or a list of integers (`_id = ANY($1)`): ids outside the table match nothing, as in an
    /// `IN` list. A reused plan reads its ids in one partition, in id order; like any SQL,
    /// other statements promise an order only with `ORDER BY`. A `gather('t', $k)` takes a
    /// list of ids, read in that order with duplicates kept (an id past the table is an
    /// error).
    pub async fn execute(&self, values: Vec<ScalarValue>) -> DfResult<Vec<RecordBatch>> {
        if values.len() != self.params.len() {
            return Err(invalid(format!("the statement has {} parameters, {} values given", self.params.len(), values.len())));
        }
        let mut value = |p: &IdParam, n: u64| {
            let v = position(&p.id).and_then(|k| values.get(k)).ok_or_else(|| Error::invalid("parameter", format!("no value for {}", p.id)))?;
            if p.gather {
                Ok(BoundIds::Order(Arc::new(param_order(p, v)?)))
            } else {
                param_ids(p, v, n).map(BoundIds::Set)
            }
        };
        match &self.physical {
            Some(plan) => {
                let plan = bind(plan, &mut value)?;
                datafusion::physical_plan::collect(plan, self.task.clone()).await
            }
            None => {
                let plan = self.logical.clone().with_param_values(ParamValues::from(values.clone()))?;
                let physical = DataFrame::new(self.state.clone(), plan).create_physical_plan().await?;
                // A `gather('t', $k)` scan still takes its ids (no expression held them).
                let physical = bind(&physical, &mut value)?;
                datafusion::physical_plan::collect(physical, self.task.clone()).await
            }
        }
    }

    /// Execute a statement whose parameters are all id lists (`_id = ANY($1)`,
    /// `gather('t', $1)`) with every one of them bound to `ids`: the fast path for point
    /// lookups (no `ScalarValue` per id).
    pub async fn lookup(&self, ids: &[u64]) -> DfResult<Vec<RecordBatch>> {
        match &self.physical {
            Some(plan) => {
                let plan = bind(plan, &mut |p, n| {
                    if !p.list {
                        return Err(Error::invalid("parameter", format!("{} is one id (_id = {}), not an id list: use execute", p.id, p.id)));
                    }
                    if p.gather {
                        return Ok(BoundIds::Order(Arc::new(ids.to_vec())));
                    }
                    if ids.iter().all(|&i| i < n) {
                        return Ok(BoundIds::Set(ids_to_set(ids)));
                    }
                    Ok(BoundIds::Set(ids_to_set(&ids.iter().copied().filter(|&i| i < n).collect::<Vec<_>>())))
                })?;
                datafusion::physical_plan::collect(plan, self.task.clone()).await
            }
            None => self.execute(vec![id_list(ids.to_vec()); self.params.len()]).await,
        }
    }
}

/// `ids` as one list value (`List<UInt64>`), to bind to an `_id = ANY($k)` parameter.
pub fn id_list(ids: Vec<u64>) -> ScalarValue {
    use datafusion::arrow::array::{ListArray, UInt64Array};
    use datafusion::arrow::buffer::OffsetBuffer;
    let n = ids.len();
    let field = Arc::new(Field::new_list_field(DataType::UInt64, true));
    ScalarValue::List(Arc::new(ListArray::new(field, OffsetBuffer::from_lengths([n]), Arc::new(UInt64Array::from(ids)), None)))
}

/// True when every parameter is consumed by some zrecord scan of `plan`.
fn all_params_in_scans(plan: &Arc<dyn ExecutionPlan>, params: &[String]) -> bool {
    let mut found: Vec<String> = Vec::new();
    let _ = plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<ZrecordScanExec>() {
            found.extend(scan.parameters().into_iter().map(|p| p.id));
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    params.iter().all(|p| found.contains(p))
}

/// The `gather('t', $k)` parameters of the zrecord tables `plan` scans (subqueries included).
fn gather_params(plan: &LogicalPlan) -> DfResult<Vec<IdParam>> {
    let mut found = Vec::new();
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            if let Ok(provider) = datafusion::datasource::source_as_provider(&scan.source) {
                if let Some(p) = provider.downcast_ref::<ZrecordTable>().and_then(ZrecordTable::order_parameter) {
                    found.push(p.clone());
                }
            }
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })?;
    Ok(found)
}

/// `plan` with each parameterised zrecord scan replaced by its bound copy.
fn bind(plan: &Arc<dyn ExecutionPlan>, value: &mut dyn FnMut(&IdParam, u64) -> crate::error::Result<BoundIds>) -> DfResult<Arc<dyn ExecutionPlan>> {
    plan.clone()
        .transform_up(|node| match node.downcast_ref::<ZrecordScanExec>() {
            Some(scan) if !scan.parameters().is_empty() => {
                let n = scan.table_len();
                let bound = scan.bind(&mut |p| value(p, n))?;
                Ok(Transformed::yes(Arc::new(bound) as Arc<dyn ExecutionPlan>))
            }
            _ => Ok(Transformed::no(node)),
        })
        .map(|t| t.data)
}
