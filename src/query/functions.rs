//! Table functions: `gather('t', [ids])`, `zrecord_info('t')` and
//! `loader('t', batch_size, mode, seed [, steps])`.
//!
//! The first argument names a registered zrecord table, or else is a path to a store or
//! dataset root.

use std::fmt;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Float64Array, Int32Array, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result as DfResult, ScalarValue, Statistics, TableReference};
use datafusion::datasource::{MemTable, TableProvider, TableType};
use datafusion::execution::session_state::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, ReplaceChildrenOptions,
};

use crate::arrow::stream_field;
use crate::error::{Error, Result};
use crate::loader::{position_record_batch, IdSource, Loader, LoaderOptions, Mode, PositionBatch, Sampler, SourceView, STEP_COLUMN};
use crate::query::df_err;
use crate::query::table::ZrecordTable;
use crate::store::Layout;

pub(crate) fn arg_err(func: &str, msg: impl fmt::Display) -> datafusion::error::DataFusionError {
    df_err(Error::invalid("argument", format!("{func}: {msg}")))
}

pub(crate) fn literal<'a>(func: &str, args: &'a [Expr], i: usize, what: &str) -> DfResult<&'a ScalarValue> {
    match args.get(i) {
        Some(Expr::Literal(v, _)) => Ok(v),
        Some(e) => Err(arg_err(func, format!("argument {} ({what}) must be a constant, got {e}", i + 1))),
        None => Err(arg_err(func, format!("missing argument {} ({what})", i + 1))),
    }
}

pub(crate) fn string_arg(func: &str, args: &[Expr], i: usize, what: &str) -> DfResult<String> {
    match literal(func, args, i, what)? {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => Ok(s.clone()),
        v => Err(arg_err(func, format!("argument {} ({what}) must be a string, got {v}", i + 1))),
    }
}

pub(crate) fn int_arg(func: &str, args: &[Expr], i: usize, what: &str) -> DfResult<i64> {
    let v = literal(func, args, i, what)?;
    match v.cast_to(&DataType::Int64) {
        Ok(ScalarValue::Int64(Some(x))) if v.data_type().is_integer() => Ok(x),
        _ => Err(arg_err(func, format!("argument {} ({what}) must be an integer, got {v}", i + 1))),
    }
}

/// The zrecord table a name refers to: a registered table, else a path.
fn resolve_table(func: &str, session: &dyn Session, name: &str) -> DfResult<ZrecordTable> {
    if let Some(state) = session.as_any().downcast_ref::<SessionState>() {
        let reference = TableReference::from(name);
        if let Ok(schema) = state.schema_for_ref(reference.clone()) {
            let found = futures::executor::block_on(schema.table(reference.table()))?;
            if let Some(t) = found {
                return match t.downcast_ref::<ZrecordTable>() {
                    Some(z) => Ok(z.clone()),
                    None => Err(arg_err(func, format!("table '{name}' is not a zrecord table"))),
                };
            }
        }
    }
    let path = std::path::Path::new(name);
    if path.exists() {
        return Ok(ZrecordTable::open(path)?);
    }
    Err(arg_err(func, format!("'{name}' is neither a registered zrecord table nor a store / dataset path")))
}

/// `gather('t', [ids])`: the rows of those ids in the given order, duplicates kept.
#[derive(Debug, Default)]
pub struct GatherFunction;

impl TableFunctionImpl for GatherFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        const F: &str = "gather";
        let exprs = args.exprs();
        if exprs.len() != 2 {
            return Err(arg_err(F, "expects (table, [ids...])"));
        }
        let table = resolve_table(F, args.session(), &string_arg(F, exprs, 0, "table")?)?;
        // `gather('t', $1)` in a prepared statement: the ids are bound at each execution.
        if let Some(Expr::Placeholder(p)) = exprs.get(1) {
            return Ok(Arc::new(table.gather_param(&p.id)));
        }
        let ids = match literal(F, exprs, 1, "ids")? {
            ScalarValue::List(l) => ids_from_array(l.values())?,
            ScalarValue::LargeList(l) => ids_from_array(l.values())?,
            ScalarValue::FixedSizeList(l) => ids_from_array(l.values())?,
            v if v.data_type().is_integer() => ids_from_array(&v.to_array()?)?,
            v => return Err(arg_err(F, format!("ids must be a list of integers, got {v}"))),
        };
        Ok(Arc::new(table.gather(ids)?))
    }
}

pub(crate) fn ids_from_array(a: &ArrayRef) -> DfResult<Vec<u64>> {
    if a.data_type() == &DataType::Null && a.is_empty() {
        return Ok(Vec::new());
    }
    if a.null_count() > 0 {
        return Err(arg_err("gather", "ids contain NULL"));
    }
    // Literals past i64 (ids >= 2^63) arrive as decimals of scale 0.
    if let DataType::Decimal128(_, 0) | DataType::Decimal256(_, 0) = a.data_type() {
        let c = datafusion::arrow::compute::cast(a, &DataType::Decimal128(38, 0))?;
        let c = c.as_any().downcast_ref::<arrow_array::Decimal128Array>().ok_or_else(|| arg_err("gather", "ids"))?;
        return c
            .values()
            .iter()
            .map(|&v| match u64::try_from(v) {
                Ok(id) => Ok(id),
                Err(_) if v < 0 => Err(Error::invalid("argument", format!("gather: id {v} is negative")).into()),
                Err(_) => Err(Error::invalid("argument", format!("gather: id {v} out of range (ids are below 2^64)")).into()),
            })
            .collect();
    }
    if !a.data_type().is_integer() {
        return Err(arg_err("gather", format!("ids must be integers, got {}", a.data_type())));
    }
    // Widen without loss (unsigned to UInt64, signed to Int64): a narrowing cast would turn
    // ids >= 2^63 into NULL slots whose value reads as 0, i.e. silently record 0.
    if a.data_type().is_unsigned_integer() {
        let c = datafusion::arrow::compute::cast(a, &DataType::UInt64)?;
        let c = c.as_any().downcast_ref::<UInt64Array>().ok_or_else(|| arg_err("gather", "ids"))?;
        if c.null_count() > 0 {
            return Err(arg_err("gather", "ids do not fit in 64 bits"));
        }
        return Ok(c.values().to_vec());
    }
    let c = datafusion::arrow::compute::cast(a, &DataType::Int64)?;
    let c = c.as_any().downcast_ref::<arrow_array::Int64Array>().ok_or_else(|| arg_err("gather", "ids"))?;
    if c.null_count() > 0 {
        return Err(arg_err("gather", "ids do not fit in 64 bits"));
    }
    c.values()
        .iter()
        .map(|&v| u64::try_from(v).map_err(|_| Error::invalid("argument", format!("gather: id {v} is negative")).into()))
        .collect()
}

/// `zrecord_info('t')`: one row per stream describing its store.
#[derive(Debug, Default)]
pub struct InfoFunction;

impl TableFunctionImpl for InfoFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        const F: &str = "zrecord_info";
        if args.exprs().len() != 1 {
            return Err(arg_err(F, "expects (table or path)"));
        }
        let table = resolve_table(F, args.session(), &string_arg(F, args.exprs(), 0, "table")?)?;
        let batch = info_batch(&table)?;
        Ok(Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]])?))
    }
}

/// The metadata of every stream of a table as one batch.
pub fn info_batch(table: &ZrecordTable) -> Result<RecordBatch> {
    let ds = table.dataset();
    let mut cols: [Vec<String>; 7] = Default::default();
    let (mut records, mut shards, mut raw, mut stored, mut files, mut ratio, mut level) = (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut paths: Vec<String> = vec![];
    for (info, s) in ds.stream_infos()?.into_iter().zip(ds.streams()) {
        let layout = &info.source.record_type.layout;
        let shape = match layout {
            Layout::Dense { item_shape } => format!("{item_shape:?}"),
            Layout::Ragged { ndim } => format!("ndim {ndim}"),
        };
        let arrow_type = stream_field(&s.name, s.source.as_ref())?.data_type().to_string();
        for (c, v) in cols.iter_mut().zip([
            info.name.clone(),
            layout.kind_name().to_string(),
            info.source.record_type.dtype.to_string(),
            shape,
            info.source.record_type.logical.name().to_string(),
            info.codec.map(|c| c.name().to_string()).unwrap_or_else(|| "-".into()),
            arrow_type,
        ]) {
            c.push(v);
        }
        let st = info.stats;
        records.push(info.source.len);
        shards.push(st.data_shards);
        raw.push(st.raw_bytes);
        stored.push(st.stored_bytes);
        files.push(st.file_bytes);
        ratio.push(st.compression_ratio());
        level.push(st.level);
        paths.push(info.path);
    }
    let str_col = |v: &Vec<String>| Arc::new(StringArray::from(v.clone())) as ArrayRef;
    let names = ["stream", "kind", "dtype", "shape", "logical", "codec", "arrow_type"];
    let mut fields: Vec<Field> = names.iter().map(|n| Field::new(*n, DataType::Utf8, false)).collect();
    let mut arrays: Vec<ArrayRef> = cols.iter().map(str_col).collect();
    for (name, dt, arr) in [
        ("level", DataType::Int32, Arc::new(Int32Array::from(level)) as ArrayRef),
        ("records", DataType::UInt64, Arc::new(UInt64Array::from(records))),
        ("data_shards", DataType::UInt32, Arc::new(UInt32Array::from(shards))),
        ("raw_bytes", DataType::UInt64, Arc::new(UInt64Array::from(raw))),
        ("stored_bytes", DataType::UInt64, Arc::new(UInt64Array::from(stored))),
        ("file_bytes", DataType::UInt64, Arc::new(UInt64Array::from(files))),
        ("compression_ratio", DataType::Float64, Arc::new(Float64Array::from(ratio))),
        ("path", DataType::Utf8, str_col(&paths)),
    ] {
        fields.push(Field::new(name, dt, false));
        arrays.push(arr);
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
}

/// `loader('t', batch_size, mode, seed [, steps])`: one batch per sampler step.
#[derive(Debug, Default)]
pub struct LoaderFunction;

impl TableFunctionImpl for LoaderFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        const F: &str = "loader";
        let e = args.exprs();
        if !(4..=5).contains(&e.len()) {
            return Err(arg_err(F, "expects (table, batch_size, mode, seed [, steps])"));
        }
        let table = resolve_table(F, args.session(), &string_arg(F, e, 0, "table")?)?;
        let batch_size = usize::try_from(int_arg(F, e, 1, "batch_size")?).map_err(|_| arg_err(F, "batch_size must be positive"))?;
        let mode: Mode = string_arg(F, e, 2, "mode")?.parse()?;
        let seed = u64::try_from(int_arg(F, e, 3, "seed")?).map_err(|_| arg_err(F, "seed must be >= 0"))?;
        let steps = match e.get(4) {
            Some(_) => Some(u64::try_from(int_arg(F, e, 4, "steps")?).map_err(|_| arg_err(F, "steps must be >= 0"))?),
            None => None,
        };
        // Validates batch_size against the record count and mode now (plan time).
        Sampler::new(table.dataset().len(), batch_size, mode, seed)?;
        Ok(Arc::new(LoaderTable::new(table, batch_size, mode, seed, steps)?))
    }
}

/// The loader as a table: `_step`, `_id`, then one column per stream.
#[derive(Debug, Clone)]
pub struct LoaderTable {
    table: ZrecordTable,
    schema: SchemaRef,
    batch_size: usize,
    mode: Mode,
    seed: u64,
    steps: Option<u64>,
}

impl LoaderTable {
    fn new(table: ZrecordTable, batch_size: usize, mode: Mode, seed: u64, steps: Option<u64>) -> DfResult<Self> {
        let base = table.schema();
        let mut fields = vec![Arc::new(Field::new(STEP_COLUMN, DataType::UInt64, false))];
        fields.extend(base.fields().iter().cloned()); // `_id` first, then streams
        Ok(LoaderTable { table, schema: Arc::new(Schema::new(fields)), batch_size, mode, seed, steps })
    }
}

#[async_trait]
impl TableProvider for LoaderTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(&self, _state: &dyn Session, projection: Option<&Vec<usize>>, _filters: &[Expr], limit: Option<usize>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let projection: Vec<usize> = projection.cloned().unwrap_or_else(|| (0..self.schema.fields().len()).collect());
        // A LIMIT bounds the steps too: no step past the last row needed is gathered.
        let by_limit = limit.map(|l| (l as u64).div_ceil(self.batch_size as u64));
        let steps = match (self.steps, by_limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(Arc::new(LoaderExec::new(self.clone(), projection, steps)?))
    }
}

/// Streams one RecordBatch per sampler step (endless unless `steps` bounds it).
#[derive(Debug)]
pub struct LoaderExec {
    table: LoaderTable,
    projection: Vec<usize>,
    schema: SchemaRef,
    steps: Option<u64>,
    properties: Arc<PlanProperties>,
}

impl LoaderExec {
    fn new(table: LoaderTable, projection: Vec<usize>, steps: Option<u64>) -> DfResult<Self> {
        let schema = Arc::new(table.schema.project(&projection)?);
        let bounded = if steps.is_some() { Boundedness::Bounded } else { Boundedness::Unbounded { requires_infinite_memory: false } };
        let properties = PlanProperties::new(EquivalenceProperties::new(schema.clone()), Partitioning::UnknownPartitioning(1), EmissionType::Incremental, bounded);
        Ok(LoaderExec { table, projection, schema, steps, properties: Arc::new(properties) })
    }
}

impl DisplayAs for LoaderExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<&str> = self.projection.iter().map(|&i| self.table.schema.field(i).name().as_str()).collect();
        write!(
            f,
            "LoaderExec: path={}, batch_size={}, mode={:?}, seed={}, steps={}, columns=[{}]",
            self.table.table.dataset().path().display(),
            self.table.batch_size,
            self.table.mode,
            self.table.seed,
            self.steps.map(|s| s.to_string()).unwrap_or_else(|| "endless".into()),
            names.join(", ")
        )
    }
}

impl ExecutionPlan for LoaderExec {
    fn name(&self) -> &'static str {
        "LoaderExec"
    }

    leaf_exec_methods!();

    fn statistics_from_inputs(&self, _input: &[Arc<Statistics>], _args: &datafusion::physical_plan::statistics::StatisticsArgs) -> DfResult<Arc<Statistics>> {
        let rows = match self.steps {
            Some(s) => Precision::Exact((s as usize).saturating_mul(self.table.batch_size)),
            None => Precision::Absent,
        };
        Ok(Arc::new(Statistics::new_unknown(&self.schema).with_num_rows(rows)))
    }

    fn execute(&self, partition: usize, _context: Arc<TaskContext>) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(Error::invalid("partition", format!("LoaderExec has one partition, asked for {partition}")).into());
        }
        let t = &self.table;
        let sampler = Sampler::new(t.table.dataset().len(), t.batch_size, t.mode, t.seed)?;
        let names: Vec<String> = self.projection.iter().map(|&i| t.schema.field(i).name().clone()).collect();
        let ds = t.table.dataset();
        let mut streams = Vec::new();
        for s in ds.streams() {
            if !names.contains(&s.name) {
                continue; // unselected streams are never read
            }
            streams.push((s.name.clone(), vec![SourceView::new(s.source.clone(), t.table.allocator())]));
        }
        let schema = self.schema.clone();
        let steps = self.steps;
        let iter: Box<dyn Iterator<Item = DfResult<RecordBatch>> + Send> = if streams.is_empty() {
            // Only `_step` / `_id`: the sampler alone, nothing is read.
            let mut step = 0u64;
            Box::new(std::iter::from_fn(move || {
                if steps.is_some_and(|s| step >= s) {
                    return None;
                }
                let ids = sampler.batch(step);
                let part = PositionBatch { step, position: 0, ids, values: vec![] };
                step += 1;
                Some(position_record_batch(&schema, &[], &part).map_err(Into::into))
            }))
        } else {
            let options = LoaderOptions { workers: 0, prefetch: 1, rank: 0, world_size: 1 };
            let (schema2, streams2) = (schema.clone(), streams.clone());
            let mut loader = Loader::with_transform(streams, IdSource::Stateless(sampler), options, move |_, mut parts: Vec<PositionBatch>| {
                let part = parts.pop().ok_or_else(|| Error::invalid("loader", "no position batch"))?;
                position_record_batch(&schema2, &streams2, &part)
            })?;
            let mut done = 0u64;
            Box::new(std::iter::from_fn(move || {
                if steps.is_some_and(|s| done >= s) {
                    return None;
                }
                done += 1;
                match loader.next_step()? {
                    Ok(r) => Some(r.map_err(Into::into)),
                    Err(e) => Some(Err(e.into())),
                }
            }))
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), futures::stream::iter(iter))))
    }
}
