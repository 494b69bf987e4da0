//! `COPY (query) TO 'path' STORED AS ZRECORD OPTIONS (...)` and
//! `CREATE EXTERNAL TABLE t STORED AS ZRECORD LOCATION 'path'`.
//!
//! COPY writes one stream per column (the virtual `_id` column is not stored: the new root
//! numbers its records from 0) and publishes the dataset root atomically once every column is
//! complete. Column types are checked when the statement is planned.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProviderFactory};
use datafusion::common::{GetExt, Result as DfResult, Statistics};
use datafusion::datasource::file_format::file_compression_type::FileCompressionType;
use datafusion::datasource::file_format::{FileFormat, FileFormatFactory};
use datafusion::datasource::physical_plan::{FileOpener, FileScanConfig, FileSinkConfig, FileSource};
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::datasource::table_schema::TableSchema;
use datafusion::datasource::TableProvider;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::CreateExternalTable;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::physical_expr::{LexRequirement, PhysicalExpr};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::StreamExt;
use datafusion::object_store::{ObjectMeta, ObjectStore};

use crate::store::{Layout, RecordType};
use crate::error::{Error, Result};
use crate::arrow::DatasetWriter;
use crate::query::table::{ZrecordTable, ID_COLUMN};
use crate::query::df_err;
use crate::query::parts::{parts_plan, split_scan, PartsTarget};
use crate::store::{Codec, WriterOptions};

/// Writer options from `COPY ... OPTIONS (codec 'zstd', level '3', data_shards '4',
/// dictionary 'path')` (keys may carry DataFusion's `format.` prefix).
pub fn writer_options(options: &HashMap<String, String>) -> Result<WriterOptions> {
    let mut w = WriterOptions::default();
    let mut dict_path = None;
    for (k, v) in options {
        let key = k.strip_prefix("format.").unwrap_or(k);
        match key {
            "codec" => w.codec = v.trim().parse::<Codec>()?,
            "level" => w.level = v.trim().parse().map_err(|_| Error::invalid("level", format!("'{v}' is not an integer")))?,
            "data_shards" => w.data_shards = v.trim().parse().map_err(|_| Error::invalid("data_shards", format!("'{v}' is not a positive integer")))?,
            "dictionary" => dict_path = Some(v.clone()),
            "allow_empty" => {
                w.allow_empty = match v.trim().to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" | "on" => true,
                    "false" | "0" | "no" | "off" => false,
                    _ => return Err(Error::invalid("allow_empty", format!("'{v}' is not a boolean (true or false)"))),
                }
            }
            other => {
                return Err(Error::invalid(
                    "option",
                    format!("unknown ZRECORD option '{other}' (known: codec, level, data_shards, dictionary, allow_empty)"),
                ))
            }
        }
    }
    if let Some(p) = dict_path {
        // Bounded like a store's own dictionary: the option names a file, which could be a
        // FIFO or a symlink to an endless device.
        w.dictionary = Some(crate::io::read_bounded(std::path::Path::new(&p), crate::store::reader::MAX_DICTIONARY_BYTES).map_err(|e| e.context(format!("COPY option dictionary '{p}'")))?);
    }
    Ok(w)
}

/// The columns a schema is written as (plan time: a bad type fails here).
pub fn plan_columns(schema: &arrow_schema::Schema) -> Result<Vec<(String, RecordType)>> {
    let mut out = Vec::new();
    for f in schema.fields() {
        if f.name() == ID_COLUMN {
            continue;
        }
        out.push((f.name().clone(), RecordType::of_field(f)?));
    }
    if out.is_empty() {
        return Err(Error::invalid("columns", "nothing to write: the query has no columns besides _id"));
    }
    Ok(out)
}

/// The `ZRECORD` file type (`STORED AS ZRECORD`; `.zrec` / `.zrecord` targets are detected).
#[derive(Debug, Default)]
pub struct ZrecordFormatFactory {
    ext: &'static str,
    /// COPY options carried by the factory itself (see [`CopyOptionsInFormat`]); the options a
    /// statement passes to `create` come on top.
    options: Vec<(String, String)>,
}

impl ZrecordFormatFactory {
    /// The factory for one extension (`zrecord` or `zrec`).
    pub fn new(ext: &'static str) -> Self {
        ZrecordFormatFactory { ext, options: Vec::new() }
    }

    /// The factory with COPY options of its own (sorted by key).
    pub fn with_options(ext: &'static str, mut options: Vec<(String, String)>) -> Self {
        options.sort();
        ZrecordFormatFactory { ext, options }
    }

    /// The COPY options the factory carries.
    pub fn options(&self) -> &[(String, String)] {
        &self.options
    }
}

/// Analyzer rule: a `COPY ... STORED AS ZRECORD OPTIONS (...)` plan carries its options in its
/// file format too. DataFusion's plan serialization (Ballista's client to scheduler) keeps the
/// file format but drops a COPY's options; this way a distributed COPY writes with the codec
/// and level asked for.
#[derive(Debug, Default)]
pub struct CopyOptionsInFormat;

impl datafusion::optimizer::AnalyzerRule for CopyOptionsInFormat {
    fn analyze(&self, plan: datafusion::logical_expr::LogicalPlan, _config: &datafusion::config::ConfigOptions) -> DfResult<datafusion::logical_expr::LogicalPlan> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        use datafusion::datasource::file_format::format_as_file_type;
        use datafusion::logical_expr::{dml::CopyTo, LogicalPlan};
        plan.transform_up(|p| {
            let LogicalPlan::Copy(c) = &p else { return Ok(Transformed::no(p)) };
            let Some(f) = c.file_type.as_any().downcast_ref::<datafusion::datasource::file_format::DefaultFileType>() else { return Ok(Transformed::no(p)) };
            let Some(z) = f.as_format_factory().downcast_ref::<ZrecordFormatFactory>() else { return Ok(Transformed::no(p)) };
            if c.options.is_empty() {
                return Ok(Transformed::no(p));
            }
            if c.options.keys().any(|k| k.trim_start_matches("format.") == CLIENT_PUBLISH_OPTION) {
                return Err(Error::invalid("option", format!("'{CLIENT_PUBLISH_OPTION}' is reserved (a Ballista client sets it)")).into());
            }
            let mut merged: HashMap<String, String> = z.options.iter().cloned().collect();
            merged.extend(c.options.iter().map(|(k, v)| (k.clone(), v.clone())));
            let factory = Arc::new(ZrecordFormatFactory::with_options(z.ext, merged.into_iter().collect()));
            let copy = CopyTo::new(c.input.clone(), c.output_url.clone(), c.partition_by.clone(), format_as_file_type(factory), HashMap::new());
            Ok(Transformed::yes(LogicalPlan::Copy(copy)))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "zrecord_copy_options_in_format"
    }
}

impl GetExt for ZrecordFormatFactory {
    fn get_ext(&self) -> String {
        self.ext.to_string()
    }
}

impl FileFormatFactory for ZrecordFormatFactory {
    fn create(&self, _state: &dyn Session, format_options: &HashMap<String, String>) -> DfResult<Arc<dyn FileFormat>> {
        let mut all: HashMap<String, String> = self.options.iter().map(|(k, v)| (k.trim_start_matches("format.").to_string(), v.clone())).collect();
        all.extend(format_options.iter().map(|(k, v)| (k.trim_start_matches("format.").to_string(), v.clone())));
        let client = match all.remove(CLIENT_PUBLISH_OPTION) {
            Some(v) => {
                let parsed = v.split_once(':').and_then(|(pid, token)| Some((pid.parse::<u32>().ok()?, u64::from_str_radix(token, 16).ok()?)));
                Some(parsed.ok_or_else(|| Error::invalid("option", format!("'{CLIENT_PUBLISH_OPTION}' is '{v}', not <pid>:<hex token>")))?)
            }
            None => None,
        };
        Ok(Arc::new(ZrecordFormat { options: writer_options(&all)?, client }))
    }

    fn default(&self) -> Arc<dyn FileFormat> {
        Arc::new(ZrecordFormat { options: WriterOptions::default(), client: None })
    }
}

/// The file-format option a Ballista client adds to the COPYs it sends (`<pid>:<hex token>`):
/// the cluster writes and prepares the root, the client publishes it
/// ([`crate::query::parts::publish_prepared`]). Reserved: a COPY statement cannot set it.
pub const CLIENT_PUBLISH_OPTION: &str = "zrecord_client_publish";

/// The format object DataFusion plans COPY with.
#[derive(Debug)]
pub struct ZrecordFormat {
    options: WriterOptions,
    /// Set on a cluster planning a client's COPY: (the client's pid, the COPY's token).
    client: Option<(u32, u64)>,
}

fn not_a_file() -> datafusion::error::DataFusionError {
    df_err(Error::invalid(
        "format",
        "zrecord stores are folders, not files: read them with CREATE EXTERNAL TABLE ... STORED AS ZRECORD LOCATION '<path>' or register_zrecord",
    ))
}

#[async_trait]
impl FileFormat for ZrecordFormat {
    fn get_ext(&self) -> String {
        "zrecord".into()
    }

    fn get_ext_with_compression(&self, _c: &FileCompressionType) -> DfResult<String> {
        Ok(self.get_ext())
    }

    fn compression_type(&self) -> Option<FileCompressionType> {
        None
    }

    async fn infer_schema(&self, _state: &dyn Session, _store: &Arc<dyn ObjectStore>, _objects: &[ObjectMeta]) -> DfResult<SchemaRef> {
        Err(not_a_file())
    }

    async fn infer_stats(&self, _state: &dyn Session, _store: &Arc<dyn ObjectStore>, _schema: SchemaRef, _object: &ObjectMeta) -> DfResult<Statistics> {
        Err(not_a_file())
    }

    async fn create_physical_plan(&self, _state: &dyn Session, _conf: FileScanConfig) -> DfResult<Arc<dyn ExecutionPlan>> {
        Err(not_a_file())
    }

    async fn create_writer_physical_plan(
        &self,
        input: Arc<dyn ExecutionPlan>,
        state: &dyn Session,
        conf: FileSinkConfig,
        _order: Option<LexRequirement>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if !conf.table_partition_cols.is_empty() {
            return Err(Error::invalid("partition_by", "PARTITIONED BY is not supported for ZRECORD (a dataset root is one aligned set of streams)").into());
        }
        let schema = input.schema();
        let columns = plan_columns(&schema)?;
        let path = local_path(&conf.original_url)?;
        if crate::io::is_url(&path) {
            let remote = crate::io::resolve(&path, crate::io::ReadMode::Mmap)?;
            for name in [crate::store::format::MANIFEST, crate::store::dataset::DATASET_FILE] {
                if remote.exists(name)? {
                    return Err(Error::AlreadyExists { path }.into());
                }
            }
        } else if crate::io::path_taken(&path) {
            return Err(Error::AlreadyExists { path }.into());
        }
        // A partitioned input (or one large file, split by byte range) is written one part per
        // partition, in parallel, and committed once; one partition is a plain root.
        let target = state.config_options().execution.target_partitions;
        let input = if target > 1 { split_scan(input, target, state.config_options())? } else { input };
        if let Some((pid, token)) = self.client {
            // A client's COPY on a cluster: parts and a prepared commit, whatever the
            // partitioning; the client publishes.
            let target = PartsTarget { dest: path, token, planner_pid: pid, options: self.options.clone(), prepare: true };
            return parts_plan(input, target);
        }
        if input.properties().partitioning.partition_count() > 1 {
            return parts_plan(input, PartsTarget::new(path, self.options.clone()));
        }
        let sink = ZrecordSink { path, columns, options: self.options.clone(), schema: conf.output_schema.clone() };
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }

    fn file_source(&self, table_schema: TableSchema) -> Arc<dyn FileSource> {
        Arc::new(NoFileSource { table_schema, metrics: ExecutionPlanMetricsSet::new() })
    }
}

/// A local path (`file://` prefix dropped) or an object-store URL, kept as a path.
fn local_path(url: &str) -> Result<std::path::PathBuf> {
    Ok(crate::io::local_path(std::path::Path::new(url)))
}

/// Listing-table scans of zrecord "files" are refused with a clear message.
#[derive(Clone)]
struct NoFileSource {
    table_schema: TableSchema,
    metrics: ExecutionPlanMetricsSet,
}

impl FileSource for NoFileSource {
    fn create_file_opener(&self, _os: Arc<dyn ObjectStore>, _c: &FileScanConfig, _p: usize) -> DfResult<Arc<dyn FileOpener>> {
        Err(not_a_file())
    }

    fn table_schema(&self) -> &TableSchema {
        &self.table_schema
    }

    fn with_batch_size(&self, _batch_size: usize) -> Arc<dyn FileSource> {
        Arc::new(self.clone())
    }

    fn metrics(&self) -> &ExecutionPlanMetricsSet {
        &self.metrics
    }

    fn file_type(&self) -> &str {
        "zrecord"
    }

    fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }
}

/// Writes the COPY input into a new dataset root.
#[derive(Debug)]
struct ZrecordSink {
    path: std::path::PathBuf,
    columns: Vec<(String, RecordType)>,
    options: WriterOptions,
    schema: SchemaRef,
}

impl DisplayAs for ZrecordSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cols: Vec<String> = self.columns.iter().map(|(n, l)| format!("{n}: {}", layout_name(l))).collect();
        write!(f, "ZrecordSink: path={}, codec={}, columns=[{}]", self.path.display(), self.options.codec.name(), cols.join(", "))
    }
}

fn layout_name(l: &RecordType) -> String {
    match &l.layout {
        Layout::Dense { item_shape } => format!("dense {} {item_shape:?}", l.dtype),
        Layout::Ragged { ndim } => format!("ragged {} ndim {ndim} ({})", l.dtype, l.logical.name()),
    }
}

#[async_trait]
impl DataSink for ZrecordSink {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(&self, mut data: SendableRecordBatchStream, context: &Arc<TaskContext>) -> DfResult<u64> {
        let progress = context.session_config().get_extension::<CopyProgress>();
        let keep: Vec<usize> = data.schema().fields().iter().enumerate().filter(|(_, f)| f.name() != ID_COLUMN).map(|(i, _)| i).collect();
        let mut writer = DatasetWriter::create(&self.path, &self.columns, self.options.clone())?;
        while let Some(batch) = data.next().await {
            let batch = batch?.project(&keep)?;
            // CPU work inline, as DataFusion's own operators do; encoding and writing run on
            // the writer's shard threads.
            writer.append(&batch)?;
            if let Some(p) = &progress {
                p.rows.store(writer.len(), std::sync::atomic::Ordering::Relaxed);
            }
        }
        let n = writer.len();
        writer.finish()?;
        Ok(n)
    }
}

/// Rows a `COPY ... STORED AS ZRECORD` has written so far, for a progress display: put one in
/// the session config of the statement (`SessionConfig::with_extension`) and read it while the
/// statement runs.
#[derive(Debug, Default)]
pub struct CopyProgress {
    /// Records appended to every stream so far.
    pub rows: Arc<std::sync::atomic::AtomicU64>,
}

impl CopyProgress {
    /// `df` (a COPY plan) with its session config carrying a `CopyProgress` that counts into
    /// `rows`: collect the returned frame and read `rows` from another thread meanwhile.
    pub fn attach(df: datafusion::dataframe::DataFrame, rows: Arc<std::sync::atomic::AtomicU64>) -> datafusion::dataframe::DataFrame {
        let (state, plan) = df.into_parts();
        let config = state.config().clone().with_extension(Arc::new(CopyProgress { rows }));
        let state = datafusion::execution::SessionStateBuilder::new_from_existing(state).with_config(config).build();
        datafusion::dataframe::DataFrame::new(state, plan)
    }
}

/// `CREATE EXTERNAL TABLE t STORED AS ZRECORD LOCATION 'path'`.
#[derive(Debug, Default)]
pub struct ZrecordTableFactory;

#[async_trait]
impl TableProviderFactory for ZrecordTableFactory {
    async fn create(&self, _state: &dyn Session, cmd: &CreateExternalTable) -> DfResult<Arc<dyn TableProvider>> {
        let [location] = &cmd.locations[..] else {
            return Err(Error::invalid("location", "a ZRECORD table takes exactly one LOCATION (a store or dataset root)").into());
        };
        if !cmd.options.is_empty() {
            // OPTIONS are storage options of an object-store LOCATION ('aws_endpoint' ...).
            if !location.contains("://") || location.starts_with("file://") {
                let keys: Vec<&String> = cmd.options.keys().collect();
                return Err(Error::invalid("option", format!("a local ZRECORD table takes no OPTIONS (got {keys:?}); OPTIONS are storage options of URL locations")).into());
            }
            let opts: Vec<(String, String)> = cmd.options.iter().map(|(k, v)| (k.trim_start_matches("format.").to_string(), v.clone())).collect();
            crate::io::register_storage_options(location, opts)?;
        }
        let path = local_path(location)?;
        let table = ZrecordTable::open(&path)?;
        Ok(Arc::new(table))
    }
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
/// Writer options as they travel to another process (Ballista executors).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct OptionsSpec {
    codec: String,
    level: i32,
    data_shards: usize,
    dictionary: Option<Vec<u8>>,
    #[serde(default)]
    allow_empty: bool,
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
impl OptionsSpec {
    pub(crate) fn of(o: &WriterOptions) -> OptionsSpec {
        OptionsSpec { codec: o.codec.name().to_string(), level: o.level, data_shards: o.data_shards, dictionary: o.dictionary.clone(), allow_empty: o.allow_empty }
    }

    pub(crate) fn to_options(&self) -> Result<WriterOptions> {
        Ok(WriterOptions { codec: self.codec.parse::<Codec>()?, level: self.level, data_shards: self.data_shards, dictionary: self.dictionary.clone(), allow_empty: self.allow_empty, ..WriterOptions::default() })
    }
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
/// A single-partition COPY's sink as it travels to another process.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct SinkSpec {
    path: String,
    options: OptionsSpec,
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
/// The spec of `plan` if it is a `DataSinkExec` writing a zrecord root.
pub(crate) fn sink_spec(plan: &Arc<dyn ExecutionPlan>) -> Option<SinkSpec> {
    let exec = plan.downcast_ref::<DataSinkExec>()?;
    let sink: &dyn std::any::Any = exec.sink();
    let sink = sink.downcast_ref::<ZrecordSink>()?;
    Some(SinkSpec { path: sink.path.to_string_lossy().into_owned(), options: OptionsSpec::of(&sink.options) })
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
/// The `DataSinkExec` a [`SinkSpec`] describes, over `input` (its columns are checked again).
pub(crate) fn sink_from_spec(spec: &SinkSpec, input: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    let schema = input.schema();
    let columns = plan_columns(&schema)?;
    let sink = ZrecordSink { path: std::path::PathBuf::from(&spec.path), columns, options: spec.options.to_options()?, schema: schema.clone() };
    Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
}
