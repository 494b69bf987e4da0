//! Distributed SQL on Apache Ballista: codecs that ship zrecord tables, scans, `gather()` and
//! `COPY ... STORED AS ZRECORD` to a scheduler and its executors, and the scheduler and executor
//! processes that know them (`zrec ballista scheduler|executor`).
//!
//! The client plans a statement with the zrecord extension (`FROM 'root'`, tables, `gather()`,
//! the text functions), Ballista sends the logical plan to the scheduler, which plans it
//! physically (a partitioned COPY becomes part writers plus one commit, see
//! [`crate::query::ZrecordPartsExec`]) and sends each stage to executors. A zrecord table travels
//! as its path (or URL), record count and gather order; a scan as its table, projection and id
//! partitions; the COPY nodes as their destination and writer options. Every process opens the
//! stores itself, so paths must mean the same on every host (a shared folder or an object-store
//! URL). Everything else (Parquet scans, filters, aggregates, shuffles) is Ballista's own.
//!
//! ```no_run
//! # async fn demo() -> datafusion::error::Result<()> {
//! // with `zrec ballista scheduler` and `zrec ballista executor` running:
//! let ctx = zrecord::query::ballista::remote_context("df://127.0.0.1:50050", 4).await?;
//! ctx.sql("COPY (SELECT * FROM 'train.parquet') TO '/shared/train' STORED AS ZRECORD").await?.collect().await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use ballista::prelude::SessionContextExt as BallistaContextExt;
use ballista_core::extension::SessionConfigExt;
use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::common::{Result as DfResult, TableReference};
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::datasource::{MemTable, TableProvider};
use datafusion::execution::{SessionState, TaskContext};
use datafusion::logical_expr::{Extension, LogicalPlan, ScalarUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::query::parts::{PartsSpec, ZrecordCommitExec, ZrecordPartsExec};
use crate::query::sink::{sink_from_spec, sink_spec, SinkSpec};
use crate::query::table::{ScanSpec, TableSpec, ZrecordScanExec, ZrecordTable};
use crate::query::sink::CLIENT_PUBLISH_OPTION;
use crate::query::ZrecordFormatFactory;

/// Starts every payload of ours: a zero byte is never the start of a protobuf message (field
/// number 0 is invalid), so nothing of Ballista's or DataFusion's is mistaken for ours.
const MAGIC: &[u8] = b"\0zrecord1";

/// What one of our payloads holds.
#[derive(Serialize, Deserialize)]
enum Node {
    Table(TableSpec),
    Format { ext: String, options: Vec<(String, String)> },
    Scan(ScanSpec),
    Sink(SinkSpec),
    Parts(PartsSpec),
    Commit { target: PartsSpec, expected: usize },
}

/// After [`MAGIC`]: a JSON [`Node`], or an in-memory table as Arrow IPC (one stream per
/// partition, each prefixed by its length).
const JSON: u8 = b'J';
const MEMORY: u8 = b'M';

fn encode(node: &Node, buf: &mut Vec<u8>) -> DfResult<()> {
    buf.extend_from_slice(MAGIC);
    buf.push(JSON);
    serde_json::to_writer(buf, node).map_err(|e| Error::invalid("plan", format!("encoding a zrecord plan node: {e}")))?;
    Ok(())
}

/// Our node in `buf`, or `None` when the payload is someone else's (or an in-memory table).
fn decode(buf: &[u8]) -> DfResult<Option<Node>> {
    match buf.strip_prefix(MAGIC).and_then(|b| b.split_first()) {
        Some((&JSON, body)) => Ok(Some(serde_json::from_slice(body).map_err(|e| Error::invalid("plan", format!("decoding a zrecord plan node: {e}")))?)),
        _ => Ok(None),
    }
}

/// An in-memory table (`zrecord_info()`, `CREATE TABLE ... AS VALUES`, registered Arrow data)
/// as Arrow IPC streams, one per partition.
fn encode_memory(t: &MemTable, buf: &mut Vec<u8>) -> DfResult<()> {
    buf.extend_from_slice(MAGIC);
    buf.push(MEMORY);
    for part in &t.batches {
        let batches = part.try_read().map_err(|_| Error::invalid("table", "an in-memory table is being written while the query is planned"))?;
        let mut ipc = Vec::new();
        {
            let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut ipc, &t.schema())?;
            for b in batches.iter() {
                w.write(b)?;
            }
            w.finish()?;
        }
        buf.extend_from_slice(&(ipc.len() as u64).to_le_bytes());
        buf.extend_from_slice(&ipc);
    }
    Ok(())
}

/// The in-memory table in `buf`, if that is what it holds.
fn decode_memory(buf: &[u8], schema: arrow_schema::SchemaRef) -> DfResult<Option<MemTable>> {
    let Some((&MEMORY, mut body)) = buf.strip_prefix(MAGIC).and_then(|b| b.split_first()) else { return Ok(None) };
    let mut partitions = Vec::new();
    while !body.is_empty() {
        let bad = || Error::invalid("plan", "truncated in-memory table payload");
        let (len, rest) = body.split_first_chunk::<8>().ok_or_else(bad)?;
        let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| bad())?;
        if rest.len() < len {
            return Err(bad().into());
        }
        let reader = arrow_ipc::reader::StreamReader::try_new(&rest[..len], None)?;
        partitions.push(reader.collect::<std::result::Result<Vec<_>, _>>()?);
        body = &rest[len..];
    }
    Ok(Some(MemTable::try_new(schema, partitions)?))
}

/// The text functions by name (executors and schedulers resolve them from their registry;
/// this is the fallback for a registry without them).
fn text_udf(name: &str) -> Option<Arc<ScalarUDF>> {
    #[cfg(feature = "text")]
    return crate::query::text::text_udfs().into_iter().find(|f| f.name() == name).map(Arc::new);
    #[cfg(not(feature = "text"))]
    {
        let _ = name;
        None
    }
}

/// Logical plans: zrecord tables (with their `gather()` order) and the `ZRECORD` file type,
/// everything else through Ballista's codec.
#[derive(Debug, Default)]
pub struct ZrecordLogicalCodec {
    inner: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for ZrecordLogicalCodec {
    fn try_decode(&self, buf: &[u8], inputs: &[LogicalPlan], ctx: &TaskContext) -> DfResult<Extension> {
        self.inner.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> DfResult<()> {
        self.inner.try_encode(node, buf)
    }

    fn try_decode_table_provider(&self, buf: &[u8], table_ref: &TableReference, schema: arrow_schema::SchemaRef, ctx: &TaskContext) -> DfResult<Arc<dyn TableProvider>> {
        if let Some(t) = decode_memory(buf, schema.clone())? {
            return Ok(Arc::new(t));
        }
        match decode(buf)? {
            Some(Node::Table(spec)) => {
                let t = ZrecordTable::from_spec(&spec)?;
                if t.schema().fields() != schema.fields() {
                    return Err(Error::invalid("table", format!("{} ({table_ref}) has other columns here than where the query was planned", spec.path)).into());
                }
                Ok(Arc::new(t))
            }
            Some(_) => Err(Error::invalid("plan", format!("table {table_ref}: not a zrecord table payload")).into()),
            None => self.inner.try_decode_table_provider(buf, table_ref, schema, ctx),
        }
    }

    fn try_encode_table_provider(&self, table_ref: &TableReference, node: Arc<dyn TableProvider>, buf: &mut Vec<u8>) -> DfResult<()> {
        if let Some(t) = node.downcast_ref::<ZrecordTable>() {
            return encode(&Node::Table(t.spec().map_err(|e| e.context(format!("table {table_ref}")))?), buf);
        }
        if let Some(t) = node.downcast_ref::<MemTable>() {
            return encode_memory(t, buf);
        }
        self.inner.try_encode_table_provider(table_ref, node, buf)
    }

    fn try_decode_file_format(&self, buf: &[u8], ctx: &TaskContext) -> DfResult<Arc<dyn FileFormatFactory>> {
        match decode(buf)? {
            Some(Node::Format { ext, options }) => Ok(Arc::new(ZrecordFormatFactory::with_options(if ext == "zrec" { "zrec" } else { "zrecord" }, options))),
            Some(_) => Err(Error::invalid("plan", "not a zrecord file format payload").into()),
            None => self.inner.try_decode_file_format(buf, ctx),
        }
    }

    fn try_encode_file_format(&self, buf: &mut Vec<u8>, node: Arc<dyn FileFormatFactory>) -> DfResult<()> {
        if let Some(f) = node.downcast_ref::<ZrecordFormatFactory>() {
            return encode(&Node::Format { ext: node.get_ext(), options: f.options().to_vec() }, buf);
        }
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> DfResult<Arc<ScalarUDF>> {
        match text_udf(name) {
            Some(f) => Ok(f),
            None => self.inner.try_decode_udf(name, buf),
        }
    }
}

/// Physical plans: zrecord scans, COPY sinks, part writers and commits, everything else
/// (shuffles included) through Ballista's codec.
#[derive(Debug, Default)]
pub struct ZrecordPhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for ZrecordPhysicalCodec {
    fn try_decode(&self, buf: &[u8], inputs: &[Arc<dyn ExecutionPlan>], ctx: &TaskContext, conv: &dyn PhysicalProtoConverterExtension) -> DfResult<Arc<dyn ExecutionPlan>> {
        let one_input = |what: &str| -> DfResult<Arc<dyn ExecutionPlan>> {
            match inputs {
                [i] => Ok(i.clone()),
                _ => Err(Error::invalid("plan", format!("{what} takes one input, got {}", inputs.len())).into()),
            }
        };
        match decode(buf)? {
            Some(Node::Scan(spec)) => Ok(Arc::new(ZrecordScanExec::from_spec(&spec)?)),
            Some(Node::Sink(spec)) => sink_from_spec(&spec, one_input("a zrecord sink")?),
            Some(Node::Parts(spec)) => Ok(Arc::new(ZrecordPartsExec::new(one_input("ZrecordPartsExec")?, spec.to_target()?)?)),
            Some(Node::Commit { target, expected }) => Ok(Arc::new(ZrecordCommitExec::new(one_input("ZrecordCommitExec")?, target.to_target()?, expected))),
            Some(Node::Table(_) | Node::Format { .. }) => Err(Error::invalid("plan", "a logical payload in a physical plan").into()),
            None => self.inner.try_decode(buf, inputs, ctx, conv),
        }
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>, conv: &dyn PhysicalProtoConverterExtension) -> DfResult<()> {
        if let Some(scan) = node.downcast_ref::<ZrecordScanExec>() {
            return encode(&Node::Scan(scan.spec()?), buf);
        }
        if let Some(spec) = scan_of_file_groups(&node) {
            return encode(&Node::Scan(spec?), buf);
        }
        if let Some(spec) = sink_spec(&node) {
            return encode(&Node::Sink(spec), buf);
        }
        if let Some(p) = node.downcast_ref::<ZrecordPartsExec>() {
            return encode(&Node::Parts(PartsSpec::of(p.target())), buf);
        }
        if let Some(c) = node.downcast_ref::<ZrecordCommitExec>() {
            return encode(&Node::Commit { target: PartsSpec::of(c.target()), expected: c.expected() }, buf);
        }
        if node.name() == "LoaderExec" {
            return Err(Error::invalid("plan", "loader() runs in the client process; it cannot be distributed").into());
        }
        self.inner.try_encode(node, buf, conv)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> DfResult<Arc<ScalarUDF>> {
        match text_udf(name) {
            Some(f) => Ok(f),
            None => self.inner.try_decode_udf(name, buf),
        }
    }
}

/// On the scheduler, a multi-partition zrecord scan stands in as a file scan: one file group per
/// partition, one "file" (the table's path, its id range as the byte range) per id range.
///
/// Ballista hands each task a plan restricted to the task's partitions, and only knows how to
/// restrict file scans (and in-memory ones): any other leaf would run every partition in every
/// task, duplicating rows. Written as a file scan, the scheduler slices the groups like
/// Parquet's, and the codec turns what is left back into a [`ZrecordScanExec`] over exactly those
/// id ranges. It is never executed as a file scan.
#[derive(Clone)]
struct ScanAsFiles {
    spec: ScanSpec,
    table_schema: datafusion::datasource::table_schema::TableSchema,
    metrics: datafusion::physical_plan::metrics::ExecutionPlanMetricsSet,
}

impl datafusion::datasource::physical_plan::FileSource for ScanAsFiles {
    fn create_file_opener(
        &self,
        _store: Arc<dyn object_store::ObjectStore>,
        _config: &datafusion::datasource::physical_plan::FileScanConfig,
        _partition: usize,
    ) -> DfResult<Arc<dyn datafusion::datasource::physical_plan::FileOpener>> {
        Err(Error::invalid("plan", format!("the zrecord scan of {} runs on executors (its plan was not encoded by the zrecord codec)", self.spec.table_path())).into())
    }

    fn table_schema(&self) -> &datafusion::datasource::table_schema::TableSchema {
        &self.table_schema
    }

    fn with_batch_size(&self, _batch_size: usize) -> Arc<dyn datafusion::datasource::physical_plan::FileSource> {
        Arc::new(self.clone())
    }

    fn metrics(&self) -> &datafusion::physical_plan::metrics::ExecutionPlanMetricsSet {
        &self.metrics
    }

    fn file_type(&self) -> &str {
        "zrecord"
    }

    fn supports_repartitioning(&self) -> bool {
        false
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn datafusion::physical_expr::PhysicalExpr>) -> DfResult<datafusion::common::tree_node::TreeNodeRecursion>,
    ) -> DfResult<datafusion::common::tree_node::TreeNodeRecursion> {
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    }
}

/// Scheduler rule: multi-partition zrecord scans as [`ScanAsFiles`] file scans.
#[derive(Debug, Default)]
struct ScansAsFileGroups;

impl datafusion::physical_optimizer::PhysicalOptimizerRule for ScansAsFileGroups {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &datafusion::config::ConfigOptions) -> DfResult<Arc<dyn ExecutionPlan>> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        use datafusion::datasource::listing::PartitionedFile;
        use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder};
        plan.transform_up(|node| {
            let Some(scan) = node.downcast_ref::<ZrecordScanExec>() else { return Ok(Transformed::no(node)) };
            if scan.partition_count() < 2 {
                return Ok(Transformed::no(node));
            }
            let spec = scan.spec()?;
            let Some(parts) = spec.partition_ranges() else { return Ok(Transformed::no(node)) };
            let groups: Vec<FileGroup> = parts
                .iter()
                .map(|ranges| FileGroup::new(ranges.iter().map(|&(a, b)| PartitionedFile::new(spec.table_path().to_string(), b).with_range(a as i64, b as i64)).collect()))
                .collect();
            let source = ScanAsFiles {
                table_schema: datafusion::datasource::table_schema::TableSchema::from(node.schema()),
                spec,
                metrics: Default::default(),
            };
            let config = FileScanConfigBuilder::new(datafusion::execution::object_store::ObjectStoreUrl::local_filesystem(), Arc::new(source)).with_file_groups(groups).build();
            Ok(Transformed::yes(datafusion::datasource::source::DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "zrecord_scans_as_file_groups"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The [`ZrecordScanExec`] a restricted [`ScanAsFiles`] file scan stands for.
fn scan_of_file_groups(node: &Arc<dyn ExecutionPlan>) -> Option<DfResult<ScanSpec>> {
    let ds = node.downcast_ref::<datafusion::datasource::source::DataSourceExec>()?;
    let config = ds.data_source().downcast_ref::<datafusion::datasource::physical_plan::FileScanConfig>()?;
    let source = config.file_source().downcast_ref::<ScanAsFiles>()?;
    let mut parts = Vec::with_capacity(config.file_groups.len());
    for g in &config.file_groups {
        let mut ranges = Vec::new();
        for f in g.files() {
            match &f.range {
                Some(r) if r.start >= 0 && r.end >= r.start => ranges.push((r.start as u64, r.end as u64)),
                _ => return Some(Err(Error::invalid("plan", "a zrecord scan's file group lost its id range").into())),
            }
        }
        parts.push(ranges);
    }
    Some(Ok(source.spec.with_partition_ranges(parts)))
}

/// A session config carrying Ballista's settings and the zrecord codecs.
pub fn ballista_config(target_partitions: usize) -> SessionConfig {
    let mut config = SessionConfig::new_with_ballista()
        .with_ballista_logical_extension_codec(Arc::new(ZrecordLogicalCodec::default()))
        .with_ballista_physical_extension_codec(Arc::new(ZrecordPhysicalCodec::default()))
        // The static distributed planner: stages keep the partitions the scheduler planned. The
        // adaptive one re-plans stages and re-deals partitions to tasks, which breaks "partition
        // k of a COPY is part k" (two tasks wrote the same part under it).
        .set_bool(ballista_core::config::BALLISTA_ADAPTIVE_PLANNER_ENABLED, false)
        // A file scan's "keep the order" flag does not survive plan serialization, and without
        // it sibling partitions steal each other's row groups: a COPY's part k would not hold
        // byte range k of its source. Executors get this setting with the session's.
        .set_bool("datafusion.execution.enable_file_stream_work_stealing", false);
    if target_partitions > 0 {
        config = config.with_target_partitions(target_partitions);
    }
    config
}

/// The session state a scheduler plans with: the zrecord extension on `config`.
fn scheduler_state(config: SessionConfig) -> DfResult<SessionState> {
    let config = config
        .with_ballista_logical_extension_codec(Arc::new(ZrecordLogicalCodec::default()))
        .with_ballista_physical_extension_codec(Arc::new(ZrecordPhysicalCodec::default()));
    let state = crate::query::zrecord_context_with_config(config).state();
    Ok(datafusion::execution::SessionStateBuilder::new_from_existing(state).with_physical_optimizer_rule(Arc::new(ScansAsFileGroups)).build())
}

/// Ballista's client planner, except for statements that only describe the client's catalog
/// (`DESCRIBE t`), which plan here.
#[derive(Debug)]
struct LocalFirst {
    remote: Arc<dyn datafusion::execution::context::QueryPlanner + Send + Sync>,
}

#[async_trait::async_trait]
impl datafusion::execution::context::QueryPlanner for LocalFirst {
    async fn create_physical_plan(&self, plan: &LogicalPlan, session: &dyn datafusion::catalog::Session) -> DfResult<Arc<dyn ExecutionPlan>> {
        match plan {
            LogicalPlan::DescribeTable(_) => {
                use datafusion::physical_planner::PhysicalPlanner;
                datafusion::physical_planner::DefaultPhysicalPlanner::default().create_physical_plan(plan, session).await
            }
            LogicalPlan::Explain(_) | LogicalPlan::Analyze(_) => self.remote.create_physical_plan(plan, session).await,
            LogicalPlan::Copy(c) => match client_copy(c)? {
                // A COPY to zrecord: the cluster writes and prepares the root, this client
                // publishes it once the cluster answered (ClientPublish).
                Some((copy, target)) => {
                    let input = Arc::new(ClusterErrors { input: self.remote.create_physical_plan(&copy, session).await? });
                    Ok(Arc::new(ClientPublish { input, target }))
                }
                None => Ok(Arc::new(ClusterErrors { input: self.remote.create_physical_plan(plan, session).await? })),
            },
            _ => Ok(Arc::new(ClusterErrors { input: self.remote.create_physical_plan(plan, session).await? })),
        }
    }
}

/// A COPY to zrecord as this client sends it: its format carries [`CLIENT_PUBLISH_OPTION`]
/// (this process and a fresh token), and the target the client publishes. `None` for other COPYs.
fn client_copy(c: &datafusion::logical_expr::dml::CopyTo) -> DfResult<Option<(LogicalPlan, crate::query::parts::PartsTarget)>> {
    use datafusion::datasource::file_format::{format_as_file_type, DefaultFileType};
    let Some(f) = c.file_type.as_any().downcast_ref::<DefaultFileType>() else { return Ok(None) };
    let factory = f.as_format_factory();
    let Some(z) = factory.downcast_ref::<ZrecordFormatFactory>() else { return Ok(None) };
    let dest = crate::io::local_path(std::path::Path::new(&c.output_url));
    let mut target = crate::query::parts::PartsTarget::new(dest, crate::store::WriterOptions::default());
    target.prepare = true;
    let mut options: Vec<(String, String)> = z.options().iter().filter(|(k, _)| k.trim_start_matches("format.") != CLIENT_PUBLISH_OPTION).cloned().collect();
    options.push((CLIENT_PUBLISH_OPTION.to_string(), format!("{}:{:016x}", target.planner_pid, target.token)));
    let ext = if factory.get_ext() == "zrec" { "zrec" } else { "zrecord" };
    let file_type = format_as_file_type(Arc::new(ZrecordFormatFactory::with_options(ext, options)));
    let copy = datafusion::logical_expr::dml::CopyTo::new(c.input.clone(), c.output_url.clone(), c.partition_by.clone(), file_type, c.options.clone());
    Ok(Some((LogicalPlan::Copy(copy), target)))
}

/// The client's end of a COPY to zrecord on the cluster: the cluster's answer (the `count`
/// row, after its commit prepared the root) and then the publish, here
/// ([`crate::query::parts::publish_prepared`]); on an error from the cluster nothing is
/// published and the parts are removed. So the root exists exactly when the COPY succeeded,
/// also when the executor that committed dies before its answer arrives.
#[derive(Debug)]
struct ClientPublish {
    input: Arc<dyn ExecutionPlan>,
    target: crate::query::parts::PartsTarget,
}

impl datafusion::physical_plan::DisplayAs for ClientPublish {
    fn fmt_as(&self, _t: datafusion::physical_plan::DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ZrecordClientPublish: dest={}", self.target.dest.display())
    }
}

impl ExecutionPlan for ClientPublish {
    fn name(&self) -> &'static str {
        "ZrecordClientPublish"
    }

    fn properties(&self) -> &Arc<datafusion::physical_plan::PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn datafusion::physical_expr::PhysicalExpr>) -> DfResult<datafusion::common::tree_node::TreeNodeRecursion>,
    ) -> DfResult<datafusion::common::tree_node::TreeNodeRecursion> {
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|_| Error::invalid("plan", "ZrecordClientPublish takes one input"))?;
        Ok(Arc::new(ClientPublish { input, target: self.target.clone() }))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> DfResult<datafusion::execution::SendableRecordBatchStream> {
        use futures::StreamExt;
        if partition != 0 {
            return Err(Error::invalid("partition", format!("ZrecordClientPublish has one partition, not {partition}")).into());
        }
        let target = self.target.clone();
        let input = self.input.execute(0, context);
        let schema = self.input.schema();
        let out_schema = schema.clone();
        let fut = async move {
            let answer: DfResult<Vec<arrow_array::RecordBatch>> = match input {
                Ok(stream) => stream.collect::<Vec<_>>().await.into_iter().collect(),
                Err(e) => Err(e),
            };
            let batches = match answer {
                Ok(b) => b,
                Err(e) => {
                    let t = target.clone();
                    let _ = tokio::task::spawn_blocking(move || crate::query::parts::abandon_prepared(&t)).await;
                    return Err(e);
                }
            };
            let count: u64 = batches
                .iter()
                .filter_map(|b| b.column(0).as_any().downcast_ref::<arrow_array::UInt64Array>().map(|a| a.values().iter().sum::<u64>()))
                .sum();
            let published = tokio::task::spawn_blocking(move || crate::query::parts::publish_prepared(&target, count))
                .await
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
            let count = published?;
            Ok(arrow_array::RecordBatch::try_new(out_schema, vec![Arc::new(arrow_array::UInt64Array::from(vec![count]))])?)
        };
        Ok(Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, futures::stream::once(fut))))
    }
}

/// The client's side of a query on the cluster, its errors explained: Ballista reports a job the
/// scheduler stopped as `Job ... failed: Cancelled`, which is what a zrecord scheduler does to
/// every running query when it loses an executor (see [`run_scheduler`]).
#[derive(Debug)]
struct ClusterErrors {
    input: Arc<dyn ExecutionPlan>,
}

impl datafusion::physical_plan::DisplayAs for ClusterErrors {
    fn fmt_as(&self, _t: datafusion::physical_plan::DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ZrecordClusterErrors")
    }
}

fn explain_cluster_error(e: datafusion::error::DataFusionError) -> datafusion::error::DataFusionError {
    let full = e.to_string();
    let text = full.strip_prefix("Execution error: ").unwrap_or(&full);
    if text.trim_end().ends_with("failed: Cancelled") {
        return datafusion::error::DataFusionError::Execution(format!(
            "{text}: the scheduler stopped the query, because an executor of the cluster was lost while it ran (a zrecord cluster \
             fails such queries rather than re-run stages, which could give wrong results; run the query again) or because it was cancelled"
        ));
    }
    e
}

impl ExecutionPlan for ClusterErrors {
    fn name(&self) -> &'static str {
        "ZrecordClusterErrors"
    }

    fn properties(&self) -> &Arc<datafusion::physical_plan::PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn datafusion::physical_expr::PhysicalExpr>) -> DfResult<datafusion::common::tree_node::TreeNodeRecursion>,
    ) -> DfResult<datafusion::common::tree_node::TreeNodeRecursion> {
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|_| Error::invalid("plan", "ZrecordClusterErrors takes one input"))?;
        Ok(Arc::new(ClusterErrors { input }))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> DfResult<datafusion::execution::SendableRecordBatchStream> {
        use futures::StreamExt;
        let stream = self.input.execute(partition, context).map_err(explain_cluster_error)?;
        let schema = stream.schema();
        Ok(Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, stream.map(|r| r.map_err(explain_cluster_error)))))
    }
}

/// A context whose queries run on the Ballista cluster of the scheduler at `url`
/// (`df://host:port`), with the zrecord extension (`FROM 'root'`, `CREATE EXTERNAL TABLE ...
/// STORED AS ZRECORD`, `gather()`, COPY ... STORED AS ZRECORD). `target_partitions` (0: the
/// default) is the parallelism of scans and of a COPY's parts.
pub async fn remote_context(url: &str, target_partitions: usize) -> DfResult<SessionContext> {
    let url = if url.contains("://") { url.to_string() } else { format!("df://{url}") };
    crate::query::zrecord_context_finished(ballista_config(target_partitions), |state| {
        // Ballista's client planner: the plan is sent to the scheduler (its own thread: the
        // connection is made inside a runtime of its own by the planner when it runs).
        let state = futures::executor::block_on(SessionContext::remote_with_state(&url, state))?.state();
        let remote = state.query_planner().clone();
        Ok(datafusion::execution::SessionStateBuilder::new_from_existing(state).with_query_planner(Arc::new(LocalFirst { remote })).build())
    })
}

/// Where a scheduler listens.
#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// Address to bind (`127.0.0.1:50050`).
    pub bind: SocketAddr,
    /// The host name executors and clients reach it by (default: the bind address).
    pub external_host: Option<String>,
}

/// Seconds between an executor's heartbeats (zrecord executors; Ballista's default is 60).
pub const EXECUTOR_HEARTBEAT_SECONDS: u64 = 1;
/// Seconds without a heartbeat after which the scheduler declares an executor lost (Ballista's
/// default is 180): bounds how long a query waits on a task of a dead executor before failing.
pub const EXECUTOR_TIMEOUT_SECONDS: u64 = 6;

/// Run a Ballista scheduler that plans with the zrecord extension, until the process ends.
///
/// Every query on a zrecord cluster returns the exact result or an error, also when executors
/// die: ballista-scheduler 55 answers an executor loss (and a failed shuffle fetch) by rolling
/// stages back and running them again, but the outputs the rolled-back stages had already
/// published downstream are not withdrawn, so the rerun's rows are read beside the old ones
/// (wrong results, silently; see docs/howto/sql.md). Here neither recovery runs: a failed fetch
/// fails its stage at once (`stage_max_failures = 1`), and an executor loss fails every running
/// job before the scheduler sees the loss ([`LossGuard`]). Lost executors are detected within
/// [`EXECUTOR_TIMEOUT_SECONDS`] of their last heartbeat (or at once when a task cannot be
/// launched on them).
pub async fn run_scheduler(opts: SchedulerOptions) -> Result<()> {
    use ballista_scheduler::cluster::BallistaCluster;
    use ballista_scheduler::config::SchedulerConfig;
    let config = SchedulerConfig {
        bind_host: opts.bind.ip().to_string(),
        bind_port: opts.bind.port(),
        external_host: opts.external_host.unwrap_or_else(|| opts.bind.ip().to_string()),
        override_logical_codec: Some(Arc::new(ZrecordLogicalCodec::default())),
        override_physical_codec: Some(Arc::new(ZrecordPhysicalCodec::default())),
        override_session_builder: Some(Arc::new(scheduler_state)),
        override_config_producer: Some(Arc::new(|| ballista_config(0))),
        stage_max_failures: 1,
        executor_timeout_seconds: EXECUTOR_TIMEOUT_SECONDS,
        expire_dead_executor_interval_seconds: 1,
        no_executors_grace_period_seconds: EXECUTOR_TIMEOUT_SECONDS,
        ..SchedulerConfig::default()
    };
    let config = Arc::new(config);
    config.validate().map_err(ballista_err)?;
    let memory = BallistaCluster::new_from_config(&config).await.map_err(ballista_err)?;
    let guard = Arc::new(LossGuard { inner: memory.cluster_state(), scheduler: std::sync::OnceLock::new() });
    let cluster = BallistaCluster::new(guard.clone(), memory.job_state());
    let scheduler = ballista_scheduler::scheduler_process::create_scheduler::<LogicalPlanNode, PhysicalPlanNode>(cluster, config).await.map_err(ballista_err)?;
    let _ = guard.scheduler.set(scheduler.clone());
    log::info!("zrecord Ballista scheduler listening on {}", opts.bind);
    ballista_scheduler::scheduler_process::start_grpc_service(opts.bind, scheduler).await.map_err(ballista_err)
}

type Scheduler = ballista_scheduler::scheduler_server::SchedulerServer<LogicalPlanNode, PhysicalPlanNode>;

/// The scheduler's cluster state (executors, task slots), unchanged but for one step: when an
/// executor is removed (its heartbeats stopped, a task could not be launched on it, or it
/// stopped), every running job is cancelled *before* the removal, so the cancellations are
/// queued ahead of the scheduler's own `ExecutorLost` event, whose stage rollback would
/// otherwise mix a rerun's outputs with the ones already published (ballista-scheduler 55).
/// A job cancelled this way fails with Ballista's "Cancelled"; the scheduler logs which
/// executor was lost.
struct LossGuard {
    inner: Arc<dyn ballista_scheduler::cluster::ClusterState>,
    scheduler: std::sync::OnceLock<Scheduler>,
}

#[async_trait::async_trait]
impl ballista_scheduler::cluster::ClusterState for LossGuard {
    async fn init(&self) -> ballista_core::error::Result<()> {
        self.inner.init().await
    }

    async fn bind_schedulable_tasks(
        &self,
        distribution: ballista_scheduler::config::TaskDistributionPolicy,
        active_jobs: Arc<std::collections::HashMap<ballista_core::JobId, ballista_scheduler::state::task_manager::JobInfoCache>>,
        executors: Option<std::collections::HashSet<String>>,
    ) -> ballista_core::error::Result<Vec<ballista_scheduler::cluster::BoundTask>> {
        self.inner.bind_schedulable_tasks(distribution, active_jobs, executors).await
    }

    async fn unbind_tasks(&self, executor_slots: Vec<ballista_scheduler::cluster::ExecutorSlot>) -> ballista_core::error::Result<()> {
        self.inner.unbind_tasks(executor_slots).await
    }

    async fn register_executor(&self, metadata: ballista_core::serde::scheduler::ExecutorMetadata, spec: ballista_core::serde::scheduler::ExecutorData) -> ballista_core::error::Result<()> {
        self.inner.register_executor(metadata, spec).await
    }

    async fn save_executor_metadata(&self, metadata: ballista_core::serde::scheduler::ExecutorMetadata) -> ballista_core::error::Result<()> {
        self.inner.save_executor_metadata(metadata).await
    }

    async fn get_executor_metadata(&self, executor_id: &str) -> ballista_core::error::Result<ballista_core::serde::scheduler::ExecutorMetadata> {
        self.inner.get_executor_metadata(executor_id).await
    }

    async fn registered_executor_metadata(&self) -> Vec<ballista_core::serde::scheduler::ExecutorMetadata> {
        self.inner.registered_executor_metadata().await
    }

    async fn save_executor_heartbeat(&self, heartbeat: ballista_core::serde::protobuf::ExecutorHeartbeat) -> ballista_core::error::Result<()> {
        self.inner.save_executor_heartbeat(heartbeat).await
    }

    async fn remove_executor(&self, executor_id: &str) -> ballista_core::error::Result<()> {
        if let Some(scheduler) = self.scheduler.get() {
            let jobs: Vec<ballista_core::JobId> = scheduler.state.task_manager.get_running_job_cache().keys().cloned().collect();
            for job in jobs {
                log::warn!("executor {executor_id} is lost: cancelling job {job} (its result could otherwise be wrong: stages are not re-run on a zrecord cluster)");
                if let Err(e) = scheduler.cancel_job(job.clone()).await {
                    log::error!("could not cancel job {job} after losing executor {executor_id}: {e}");
                }
            }
        }
        self.inner.remove_executor(executor_id).await
    }

    fn executor_heartbeats(&self) -> std::collections::HashMap<String, ballista_core::serde::protobuf::ExecutorHeartbeat> {
        self.inner.executor_heartbeats()
    }

    fn get_executor_heartbeat(&self, executor_id: &str) -> Option<ballista_core::serde::protobuf::ExecutorHeartbeat> {
        self.inner.get_executor_heartbeat(executor_id)
    }

    async fn cluster_state_events(&self) -> ballista_core::error::Result<ballista_scheduler::cluster::ClusterStateEventStream> {
        self.inner.cluster_state_events().await
    }
}

/// Where an executor listens and which scheduler it serves.
#[derive(Clone, Debug)]
pub struct ExecutorOptions {
    /// Host to bind (`127.0.0.1`).
    pub bind_host: String,
    /// Host name the scheduler and other executors reach it by (default: `bind_host`).
    pub external_host: Option<String>,
    /// Arrow Flight port (shuffle data).
    pub port: u16,
    /// gRPC port (tasks).
    pub grpc_port: u16,
    /// The scheduler (`host:port`).
    pub scheduler: String,
    /// Tasks run at once (0: the number of CPUs).
    pub concurrent_tasks: usize,
    /// Where shuffle files go (default: a temporary folder).
    pub work_dir: Option<String>,
}

/// Run a Ballista executor that runs zrecord plans, until the process ends.
pub async fn run_executor(opts: ExecutorOptions) -> Result<()> {
    use ballista_core::registry::BallistaFunctionRegistry;
    use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
    let (host, port) = opts
        .scheduler
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| Error::invalid("scheduler", format!("'{}' is not host:port", opts.scheduler)))?;
    let mut registry = BallistaFunctionRegistry::default();
    // Array functions (`cardinality`, `make_array`, ...) are planned on the client with
    // DataFusion's defaults; Ballista's registry leaves them out.
    for f in datafusion::functions_nested::all_default_nested_functions() {
        registry.scalar_functions.entry(f.name().to_string()).or_insert(f);
    }
    #[cfg(feature = "text")]
    for f in crate::query::text::text_udfs() {
        registry.scalar_functions.insert(f.name().to_string(), Arc::new(f));
    }
    let mut config = ExecutorProcessConfig {
        bind_host: opts.bind_host.clone(),
        external_host: Some(opts.external_host.unwrap_or(opts.bind_host)),
        port: opts.port,
        grpc_port: opts.grpc_port,
        scheduler_host: host,
        scheduler_port: port,
        work_dir: opts.work_dir,
        override_logical_codec: Some(Arc::new(ZrecordLogicalCodec::default())),
        override_physical_codec: Some(Arc::new(ZrecordPhysicalCodec::default())),
        override_function_registry: Some(Arc::new(registry)),
        override_config_producer: Some(Arc::new(|| ballista_config(0))),
        executor_heartbeat_interval_seconds: EXECUTOR_HEARTBEAT_SECONDS,
        ..ExecutorProcessConfig::default()
    };
    if opts.concurrent_tasks > 0 {
        config.vcores = opts.concurrent_tasks;
    }
    start_executor_process(Arc::new(config)).await.map_err(ballista_err)
}

fn ballista_err(e: ballista_core::error::BallistaError) -> Error {
    Error::invalid("ballista", e.to_string())
}

impl fmt::Display for SchedulerOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bind)
    }
}
