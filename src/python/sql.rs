//! SQL from Python: `zrecord.SessionContext`, `zrecord.QueryResult` and `zrecord.Table`
//! (`__datafusion_table_provider__` for the `datafusion` PyPI package).

use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::{ArrowError, SchemaRef};
use datafusion::dataframe::DataFrame;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::table_provider::FFI_TableProvider;
use futures::StreamExt;
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

use crate::python::errors::{exception, IntoPy};
use crate::query::{id_list, zrecord_context_with_config, zrecord_error, PlanCache, PreparedQuery, ZrecordTable};
use datafusion::common::ScalarValue;

/// One multi-threaded runtime for every query started from Python.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        crate::io::runtime::build("zrecord-sql", None, None).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// A DataFusion error as the matching Python exception: zrecord errors keep their mapping
/// (IndexError, FileExistsError, ...), planning errors are ValueError.
pub(crate) fn df_to_py(e: DataFusionError) -> PyErr {
    if let Some(z) = zrecord_error(&e) {
        // The zrecord error's exception type, with DataFusion's full message.
        return exception(z, e.to_string());
    }
    match e.find_root() {
        DataFusionError::NotImplemented(_) => PyNotImplementedError::new_err(e.to_string()),
        DataFusionError::Plan(_) | DataFusionError::SQL(..) | DataFusionError::SchemaError(..) | DataFusionError::Configuration(_) => {
            PyValueError::new_err(e.to_string())
        }
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// A DataFusion session with zrecord's tables, COPY TO format and table functions.
#[pyclass(name = "SessionContext", module = "zrecord")]
pub struct PySessionContext {
    ctx: SessionContext,
    /// Plans of `_id IN (...)` query shapes, reused by `sql` (cleared on any catalog change).
    cache: Arc<PlanCache>,
}

#[pymethods]
impl PySessionContext {
    #[new]
    #[pyo3(signature = (target_partitions = None, batch_size = None, ballista = None))]
    fn new(py: Python<'_>, target_partitions: Option<usize>, batch_size: Option<usize>, ballista: Option<String>) -> PyResult<Self> {
        if let Some(url) = ballista {
            // Queries run on the Ballista cluster of this scheduler (`zrec ballista scheduler`).
            if target_partitions == Some(0) || batch_size == Some(0) {
                return Err(PyValueError::new_err("target_partitions and batch_size must be at least 1"));
            }
            let tp = target_partitions.unwrap_or(0);
            let ctx = py
                .detach(move || crate::io::runtime::block(async move { crate::query::ballista::remote_context(&url, tp).await }))
                .map_err(df_to_py)?;
            if let Some(b) = batch_size {
                ctx.state_ref().write().config_mut().options_mut().set("datafusion.execution.batch_size", &b.to_string()).map_err(df_to_py)?;
            }
            return Ok(PySessionContext { ctx, cache: Arc::new(PlanCache::default()) });
        }
        let mut config = SessionConfig::new();
        if let Some(p) = target_partitions {
            if p == 0 {
                return Err(PyValueError::new_err("target_partitions must be at least 1"));
            }
            config = config.with_target_partitions(p);
        }
        if let Some(b) = batch_size {
            if b == 0 {
                return Err(PyValueError::new_err("batch_size must be at least 1"));
            }
            config = config.with_batch_size(b);
        }
        Ok(PySessionContext { ctx: zrecord_context_with_config(config), cache: Arc::new(PlanCache::default()) })
    }

    /// Register the store or dataset root at `path` as table `name`.
    fn register(&self, py: Python<'_>, name: &str, path: std::path::PathBuf) -> PyResult<()> {
        self.cache.clear();
        // Opening may read from an object store: without the GIL.
        let table = py.detach(|| ZrecordTable::open(&path)).py_err()?;
        self.ctx.register_table(name, Arc::new(table)).map(|_| ()).map_err(df_to_py)
    }

    /// Register any Arrow data (pyarrow Table / RecordBatchReader, polars DataFrame, anything
    /// with `__arrow_c_stream__`) as an in-memory table, e.g. to `COPY` it into a store.
    fn register_arrow(&self, py: Python<'_>, name: &str, data: &Bound<'_, PyAny>) -> PyResult<()> {
        if !data.hasattr("__arrow_c_stream__")? {
            let ty = data.get_type().name()?;
            return Err(pyo3::exceptions::PyTypeError::new_err(format!("register_arrow needs Arrow data (an object with __arrow_c_stream__), got {ty}")));
        }
        let (batches, schema) = data.extract::<pyo3_arrow::PyTable>()?.into_inner();
        self.cache.clear();
        py.detach(|| {
            let t = datafusion::datasource::MemTable::try_new(schema, vec![batches])?;
            self.ctx.register_table(name, Arc::new(t)).map(|_| ())
        })
        .map_err(df_to_py)
    }

    /// Register aligned record sources as one table: `{"x": view_or_source, ...}` (store
    /// views, `SourceView`s, or Python record sources). Columns `_id` then the streams, in
    /// order; the same scans, filters, `gather()` and `loader()` as a table read from disk.
    fn register_sources(&self, name: &str, streams: &Bound<'_, pyo3::types::PyDict>) -> PyResult<()> {
        let streams = crate::python::source::streams_of(streams)?;
        let ds = crate::store::Dataset::from_streams(std::path::PathBuf::from(name), streams).py_err()?;
        let table = ZrecordTable::new(ds).py_err()?;
        self.cache.clear();
        self.ctx.register_table(name, Arc::new(table)).map(|_| ()).map_err(df_to_py)
    }

    /// Drop a registered table.
    fn deregister(&self, name: &str) -> PyResult<()> {
        self.cache.clear();
        self.ctx.deregister_table(name).map(|_| ()).map_err(df_to_py)
    }

    /// Registered table names (default schema).
    fn tables(&self) -> Vec<String> {
        let mut v: Vec<String> = self.ctx.catalog("datafusion").and_then(|c| c.schema("public")).map(|s| s.table_names()).unwrap_or_default();
        v.sort();
        v
    }

    /// Plan `query`. Statements (CREATE, COPY, INSERT, ...) run now; queries run when their
    /// result is read (`to_arrow()`, `to_polars()`, `__arrow_c_stream__`).
    ///
    /// `progress` (COPY ... STORED AS ZRECORD): None shows a tqdm bar of rows written when the
    /// statement runs over 2 s, True at once, False never.
    #[pyo3(signature = (query, progress = None))]
    fn sql(&self, py: Python<'_>, query: &str, progress: Option<bool>) -> PyResult<PyQueryResult> {
        let ctx = self.ctx.clone();
        let query = query.to_string();
        // A lookup shape seen before (`... WHERE _id IN (<ids>)`): its plan, with these ids.
        let cache = self.cache.clone();
        if let Some((plan, values)) = py.detach(|| runtime().block_on(cache.prepared(&ctx, &query))) {
            return Ok(PyQueryResult { df: None, done: None, prepared: Some(Prepared { plan, values, ctx, sql: query }) });
        }
        // Anything but a plain query may change the catalog or the session (DDL, which
        // DataFusion runs inside `sql`, COPY, SET, ...): cached plans may no longer apply.
        let first = query.split_whitespace().next().unwrap_or("").to_ascii_uppercase();
        if !matches!(first.as_str(), "SELECT" | "WITH" | "VALUES" | "EXPLAIN") {
            self.cache.clear();
        }
        let df = py.detach(|| runtime().block_on(ctx.sql(&query))).map_err(df_to_py)?;
        if matches!(df.logical_plan(), LogicalPlan::Copy(_)) {
            let schema: SchemaRef = df.schema().inner().clone();
            let batches = crate::python::progress::run_with_progress(py, progress, None, None, "COPY", "rows", move |done| {
                let df = crate::query::CopyProgress::attach(df, done);
                runtime().block_on(df.collect()).map_err(crate::error::Error::from)
            })?;
            return Ok(PyQueryResult { df: None, done: Some((schema, batches)), prepared: None });
        }
        let eager = matches!(df.logical_plan(), LogicalPlan::Dml(_) | LogicalPlan::Ddl(_) | LogicalPlan::Statement(_));
        if eager {
            let schema: SchemaRef = df.schema().inner().clone();
            let batches = py.detach(|| runtime().block_on(df.collect())).map_err(df_to_py)?;
            return Ok(PyQueryResult { df: None, done: Some((schema, batches)), prepared: None });
        }
        Ok(PyQueryResult { df: Some(df), done: None, prepared: None })
    }

    /// Prepare `query` once (parsed, planned) to execute many times with new values for its
    /// parameters `$1`, `$2`, ... . `WHERE _id = ANY($1)` and `FROM gather('t', $1)` take an
    /// id array: executions of such a statement reuse the physical plan and run no SQL text.
    fn prepare(&self, py: Python<'_>, query: &str) -> PyResult<PyPreparedStatement> {
        let ctx = self.ctx.clone();
        let query = query.to_string();
        let inner = py.detach(|| runtime().block_on(PreparedQuery::new(&ctx, &query))).map_err(df_to_py)?;
        Ok(PyPreparedStatement { inner: Arc::new(inner) })
    }

    fn __repr__(&self) -> String {
        format!("SessionContext(tables={:?})", self.tables())
    }
}

/// Ids from a 1-D integer array (NumPy, torch, anything DLPack) or a sequence of ints.
fn ids_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    if obj.hasattr("__dlpack__")? || obj.hasattr("__array_interface__")? {
        let im = crate::python::input::Imported::from_any(obj)?;
        return im.index_ids(u64::MAX).map_err(|e| {
            if e.is_instance_of::<pyo3::exceptions::PyIndexError>(obj.py()) {
                pyo3::exceptions::PyIndexError::new_err("ids must be non-negative")
            } else {
                e
            }
        });
    }
    let items: Vec<Bound<'_, PyAny>> = obj.try_iter().map_err(|_| pyo3::exceptions::PyTypeError::new_err(format!("ids must be an integer array or a sequence of ints, got {}", obj.get_type().name().map(|n| n.to_string()).unwrap_or_default())))?.collect::<PyResult<_>>()?;
    items
        .iter()
        .map(|x| match x.extract::<i128>() {
            Ok(i) if (0..=u64::MAX as i128).contains(&i) => Ok(i as u64),
            Ok(i) => Err(pyo3::exceptions::PyIndexError::new_err(format!("ids must be non-negative integers below 2**64, got {i}"))),
            Err(_) => Err(pyo3::exceptions::PyTypeError::new_err(format!("ids must be integers, got {}", x.get_type().name().map(|n| n.to_string()).unwrap_or_default()))),
        })
        .collect()
}

/// A Python value as a statement parameter value.
fn param_value(obj: &Bound<'_, PyAny>) -> PyResult<ScalarValue> {
    use pyo3::types::{PyBool, PyBytes, PyFloat, PyString};
    if obj.is_none() {
        return Ok(ScalarValue::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(ScalarValue::Boolean(Some(b.is_true())));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(ScalarValue::Float64(Some(f.value())));
    }
    if let Ok(t) = obj.cast::<PyString>() {
        return Ok(ScalarValue::Utf8(Some(t.to_str()?.to_string())));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(ScalarValue::Binary(Some(b.as_bytes().to_vec())));
    }
    if let Ok(i) = obj.extract::<i64>() {
        return Ok(ScalarValue::Int64(Some(i)));
    }
    if let Ok(i) = obj.extract::<u64>() {
        return Ok(ScalarValue::UInt64(Some(i)));
    }
    if obj.hasattr("__dlpack__")? || obj.hasattr("__array_interface__")? || obj.cast::<pyo3::types::PyList>().is_ok() || obj.cast::<pyo3::types::PyTuple>().is_ok() {
        return Ok(id_list(ids_of(obj)?));
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "cannot bind a {} as a statement parameter (use None, bool, int, float, str, bytes, or an id array / list of ints)",
        obj.get_type().name()?
    )))
}

/// A statement prepared by `SessionContext.prepare`: `execute(*values)` binds `$1`, `$2`, ...
/// and runs it; `lookup(ids)` binds an id array to every `_id = ANY($k)`. Results come back
/// as a `QueryResult`, already computed. Ids past the table match nothing (as in `IN`); when
/// the plan is reused (`reuses_plan`) rows come in id order, otherwise add `ORDER BY _id`.
#[pyclass(name = "PreparedStatement", module = "zrecord", frozen)]
pub struct PyPreparedStatement {
    inner: Arc<PreparedQuery>,
}

impl PyPreparedStatement {
    fn done(&self, batches: Vec<RecordBatch>) -> PyQueryResult {
        PyQueryResult { df: None, done: Some((self.inner.schema(), batches)), prepared: None }
    }
}

#[pymethods]
impl PyPreparedStatement {
    /// The parameter names, in order (`$1`, `$2`, ...).
    #[getter]
    fn parameters(&self) -> Vec<String> {
        self.inner.parameters().to_vec()
    }

    /// True when executions reuse the physical plan (every parameter is an `_id` filter or
    /// the ids of a `gather('t', $k)`).
    #[getter]
    fn reuses_plan(&self) -> bool {
        self.inner.reuses_plan()
    }

    /// Run with `values` bound to `$1`, `$2`, ... in order.
    #[pyo3(signature = (*values))]
    fn execute(&self, py: Python<'_>, values: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<PyQueryResult> {
        let values: Vec<ScalarValue> = values.iter().map(|v| param_value(&v)).collect::<PyResult<_>>()?;
        let inner = self.inner.clone();
        let batches = py.detach(|| runtime().block_on(inner.execute(values))).map_err(df_to_py)?;
        Ok(self.done(batches))
    }

    /// Run with `ids` (an integer array or a sequence of ints) bound to every `_id = ANY($k)`
    /// (rows in id order, as `IN`) and every `gather('t', $k)` (rows in the order of `ids`,
    /// duplicates kept; an id past the end raises `IndexError`).
    fn lookup(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<PyQueryResult> {
        let ids = ids_of(ids)?;
        let inner = self.inner.clone();
        let batches = py.detach(|| runtime().block_on(inner.lookup(&ids))).map_err(df_to_py)?;
        Ok(self.done(batches))
    }

    fn __repr__(&self) -> String {
        format!("PreparedStatement(parameters={:?}, reuses_plan={})", self.inner.parameters(), self.inner.reuses_plan())
    }
}

/// The result of `SessionContext.sql`: read it as a pyarrow Table, a polars DataFrame or any
/// Arrow PyCapsule stream consumer. Each read runs the query again (results are not cached).
#[pyclass(name = "QueryResult", module = "zrecord")]
pub struct PyQueryResult {
    df: Option<DataFrame>,
    done: Option<(SchemaRef, Vec<RecordBatch>)>,
    prepared: Option<Prepared>,
}

/// A query that runs through a cached plan with its own ids.
struct Prepared {
    plan: Arc<PreparedQuery>,
    values: Vec<ScalarValue>,
    ctx: SessionContext,
    /// The text as given (what `explain` plans).
    sql: String,
}

/// A DataFusion stream read synchronously on the shared runtime.
struct BlockingStream {
    schema: SchemaRef,
    stream: SendableRecordBatchStream,
}

impl Iterator for BlockingStream {
    type Item = Result<RecordBatch, ArrowError>;
    fn next(&mut self) -> Option<Self::Item> {
        runtime().block_on(self.stream.next()).map(|r| r.map_err(|e| ArrowError::ExternalError(Box::new(e))))
    }
}

impl RecordBatchReader for BlockingStream {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

impl PyQueryResult {
    fn reader(&self, py: Python<'_>) -> PyResult<Box<dyn RecordBatchReader + Send>> {
        if let Some((schema, batches)) = &self.done {
            let it = batches.clone().into_iter().map(Ok);
            return Ok(Box::new(arrow_array::RecordBatchIterator::new(it, schema.clone())));
        }
        if let Some(p) = &self.prepared {
            let batches = py.detach(|| runtime().block_on(p.plan.execute(p.values.clone()))).map_err(df_to_py)?;
            return Ok(Box::new(arrow_array::RecordBatchIterator::new(batches.into_iter().map(Ok), p.plan.schema())));
        }
        let df = self.df.clone().ok_or_else(|| PyValueError::new_err("empty result"))?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let stream = py.detach(|| runtime().block_on(df.execute_stream())).map_err(df_to_py)?;
        Ok(Box::new(BlockingStream { schema, stream }))
    }
}

#[pymethods]
impl PyQueryResult {
    /// Column names.
    #[getter]
    fn columns(&self) -> Vec<String> {
        if let Some(p) = &self.prepared {
            return p.plan.schema().fields().iter().map(|f| f.name().clone()).collect();
        }
        match (&self.done, &self.df) {
            (Some((s, _)), _) => s.fields().iter().map(|f| f.name().clone()).collect(),
            (None, Some(df)) => df.schema().fields().iter().map(|f| f.name().clone()).collect(),
            _ => vec![],
        }
    }

    /// Arrow PyCapsule stream (one pass over the result; the query runs as it is read).
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(&self, py: Python<'py>, requested_schema: Option<Bound<'py, PyCapsule>>) -> PyResult<Bound<'py, PyCapsule>> {
        let reader = self.reader(py)?;
        Ok(pyo3_arrow::ffi::to_stream_pycapsule(py, Box::new(ReaderAsArrays::new(reader)), requested_schema)?)
    }

    /// The whole result as a `pyarrow.Table`.
    fn to_arrow<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py().import("pyarrow")?.call_method1("table", (slf,))
    }

    /// Iterate `pyarrow.RecordBatch`es as the query produces them (endless for an unbounded
    /// `loader(...)` query: stop when you have enough).
    fn __iter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let reader = slf.py().import("pyarrow")?.getattr("RecordBatchReader")?.call_method1("from_stream", (slf,))?;
        reader.call_method0("__iter__")
    }

    /// The whole result as a `polars.DataFrame`.
    fn to_polars<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let table = Self::to_arrow(slf)?;
        slf.py().import("polars")?.call_method1("from_arrow", (table,))
    }

    /// The physical plan, as EXPLAIN prints it.
    fn explain(&self, py: Python<'_>) -> PyResult<String> {
        let df = match (&self.df, &self.prepared) {
            (Some(df), _) => df.clone(),
            (None, Some(p)) => py.detach(|| runtime().block_on(p.ctx.sql(&p.sql))).map_err(df_to_py)?,
            _ => return Err(PyValueError::new_err("statements have no plan to explain")),
        };
        let batches = py.detach(|| runtime().block_on(async { df.explain(false, false)?.collect().await })).map_err(df_to_py)?;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok(text.to_string())
    }

    fn __repr__(&self) -> String {
        format!("QueryResult(columns={:?})", self.columns())
    }
}

/// A RecordBatchReader as the struct-array reader pyo3-arrow exports.
struct ReaderAsArrays {
    inner: Box<dyn RecordBatchReader + Send>,
    field: arrow_schema::FieldRef,
}

impl ReaderAsArrays {
    fn new(inner: Box<dyn RecordBatchReader + Send>) -> Self {
        let field = Arc::new(arrow_schema::Field::new_struct("", inner.schema().fields().clone(), false));
        ReaderAsArrays { inner, field }
    }
}

impl Iterator for ReaderAsArrays {
    type Item = Result<arrow_array::ArrayRef, ArrowError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|r| r.map(|b| Arc::new(arrow_array::StructArray::from(b)) as arrow_array::ArrayRef))
    }
}

impl pyo3_arrow::ffi::ArrayReader for ReaderAsArrays {
    fn field(&self) -> arrow_schema::FieldRef {
        self.field.clone()
    }
}

/// A store or dataset root as a table for any DataFusion: `zrecord.SessionContext.register`
/// uses it directly, and the `datafusion` PyPI package's `SessionContext.register_table(name,
/// zrecord.Table(path))` takes it through `__datafusion_table_provider__` (datafusion-ffi).
#[pyclass(name = "Table", module = "zrecord")]
pub struct PyTable {
    table: Arc<ZrecordTable>,
}

#[pymethods]
impl PyTable {
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        Ok(PyTable { table: Arc::new(py.detach(|| ZrecordTable::open(&path)).py_err()?) })
    }

    /// Column names (`_id` first, then the streams).
    #[getter]
    fn columns(&self) -> Vec<String> {
        use datafusion::datasource::TableProvider;
        self.table.schema().fields().iter().map(|f| f.name().clone()).collect()
    }

    /// Records per stream.
    fn __len__(&self) -> usize {
        self.table.num_rows() as usize
    }

    /// The FFI table provider capsule for the `datafusion` package (55.x).
    fn __datafusion_table_provider__<'py>(&self, py: Python<'py>, session: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = logical_codec(&session)?;
        let provider = FFI_TableProvider::new_with_ffi_codec(self.table.clone(), true, Some(runtime().handle().clone()), codec);
        PyCapsule::new_with_value(py, provider, c"datafusion_table_provider")
    }

    fn __repr__(&self) -> String {
        format!("Table(path={:?}, records={})", self.table.dataset().path(), self.table.num_rows())
    }
}

/// The session's logical extension codec, from the object datafusion-python passes
/// (a SessionContext exposing `__datafusion_logical_extension_codec__`, or the capsule itself).
fn logical_codec(session: &Bound<'_, PyAny>) -> PyResult<FFI_LogicalExtensionCodec> {
    const ATTR: &str = "__datafusion_logical_extension_codec__";
    let capsule = if session.hasattr(ATTR)? { session.getattr(ATTR)?.call0()? } else { session.clone() };
    let capsule = capsule.cast::<PyCapsule>().map_err(|_| PyValueError::new_err("session must be a datafusion SessionContext or a logical extension codec capsule"))?;
    let ptr: NonNull<FFI_LogicalExtensionCodec> = capsule.pointer_checked(Some(c"datafusion_logical_extension_codec"))?.cast();
    // SAFETY: the capsule name was checked to be datafusion's logical-codec capsule, whose
    // pointer is a live FFI_LogicalExtensionCodec owned by the capsule (alive while we hold
    // `capsule`); we only clone it (a reference-counted FFI handle) before returning.
    let codec = unsafe { ptr.as_ref() };
    Ok(codec.clone())
}
