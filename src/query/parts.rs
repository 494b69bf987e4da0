//! `COPY ... STORED AS ZRECORD` of a partitioned input: one part per partition, written in
//! parallel (on one machine, or on Ballista executors), committed once.
//!
//! The plan is `ZrecordCommitExec(CoalescePartitionsExec(ZrecordPartsExec(input)))`:
//! - [`ZrecordPartsExec`] writes partition `k` of its input as a complete dataset root, part
//!   `k` (`part-0000k-<token>`), and yields one row (part, folder, records). Parts go into a
//!   hidden staging folder next to the destination (`.<name>.zrecord-tmp-<pid>-<token>`, which
//!   `zrec gc` recognises), or straight below an object-store URL (where nothing opens before
//!   the root's `dataset.json` exists).
//! - [`ZrecordCommitExec`] collects every part's row, checks each part arrived exactly once,
//!   and publishes the root: `dataset.json` (version 2, the parts in partition order) written
//!   last and create-only, then one no-replace rename of the staging folder (local), or the
//!   create-only put alone (object store). It yields the `count` row DataFusion's sinks yield.
//!
//! Records are the input partitions concatenated in partition order, ids global: the same
//! rows, in the same order, whether one process or a cluster wrote them, and read back through
//! [`crate::store::ConcatSource`] like any root.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Array, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, Partitioning, PlanProperties, ReplaceChildrenOptions,
};
use futures::StreamExt;

use crate::arrow::DatasetWriter;
use crate::store::RecordType;
use crate::error::{Error, Result};
use crate::query::sink::plan_columns;
use crate::query::table::ID_COLUMN;
use crate::store::dataset::{DatasetManifest, PartEntry, DATASET_FILE};
use crate::store::WriterOptions;

/// Where the parts of one COPY go and how they are written: everything a part writer on
/// another machine needs (the columns follow from the input schema).
#[derive(Clone, Debug)]
pub struct PartsTarget {
    /// The root being written (a local path or an object-store URL).
    pub dest: PathBuf,
    /// Names this COPY's staging folder and parts: chosen once when the statement is planned.
    pub token: u64,
    /// The process that planned the COPY (names the local staging folder, for `zrec gc`).
    pub planner_pid: u32,
    /// Writer options of every stream.
    pub options: WriterOptions,
    /// The commit only prepares (writes the manifest next to the parts as
    /// [`PartsTarget::prepared_name`]) and the client that sent the COPY publishes it
    /// ([`publish_prepared`]) once the cluster answered: a distributed COPY then publishes
    /// exactly when its client sees success (the cluster's commit runs on an executor, whose
    /// answer can be lost after it published).
    pub prepare: bool,
}

impl PartsTarget {
    /// A target for a new COPY to `dest` planned by this process.
    pub fn new(dest: PathBuf, options: WriterOptions) -> PartsTarget {
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        PartsTarget { dest, token: u64::from_le_bytes(seed) ^ t, planner_pid: std::process::id(), options, prepare: false }
    }

    fn remote(&self) -> bool {
        crate::io::is_url(&self.dest)
    }

    /// The prepared manifest's name in [`PartsTarget::parts_dir`] (prepare mode).
    pub fn prepared_name(&self) -> String {
        format!(".zrecord-prepared-{:016x}.json", self.token)
    }

    /// The folder parts are written into: the staging folder (local) or the root URL.
    fn parts_dir(&self) -> Result<PathBuf> {
        if self.remote() {
            return Ok(self.dest.clone());
        }
        let name = self
            .dest
            .file_name()
            .ok_or_else(|| Error::invalid("path", format!("'{}' has no final component", self.dest.display())))?
            .to_string_lossy()
            .into_owned();
        let parent = match self.dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok(parent.join(format!(".{name}.zrecord-tmp-{}-{}", self.planner_pid, self.token)))
    }

    /// A new part's folder name (relative to the root): this COPY's token and a random number
    /// (a Ballista task does not know which partition of the whole it writes; the commit
    /// orders the parts).
    fn part_name(&self) -> String {
        let mut r = [0u8; 8];
        let _ = getrandom::fill(&mut r);
        format!("part-{:016x}-{:016x}", self.token, u64::from_le_bytes(r))
    }

    fn join(dir: &Path, name: &str) -> PathBuf {
        if crate::io::is_url(dir) {
            PathBuf::from(format!("{}/{name}", dir.to_string_lossy().trim_end_matches('/')))
        } else {
            dir.join(name)
        }
    }
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
/// A [`PartsTarget`] as it travels to another process (Ballista executors).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct PartsSpec {
    dest: String,
    token: u64,
    planner_pid: u32,
    options: crate::query::sink::OptionsSpec,
    #[serde(default)]
    prepare: bool,
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
impl PartsSpec {
    pub(crate) fn of(t: &PartsTarget) -> PartsSpec {
        PartsSpec {
            dest: t.dest.to_string_lossy().into_owned(),
            token: t.token,
            planner_pid: t.planner_pid,
            options: crate::query::sink::OptionsSpec::of(&t.options),
            prepare: t.prepare,
        }
    }

    pub(crate) fn to_target(&self) -> Result<PartsTarget> {
        Ok(PartsTarget { dest: PathBuf::from(&self.dest), token: self.token, planner_pid: self.planner_pid, options: self.options.to_options()?, prepare: self.prepare })
    }
}

/// The schema of the rows part writers yield.
/// `path`: the part's folder; `records`; `key_source` / `key_start`: where in the input the
/// partition starts (file and byte offset, or the table's first id), which orders the parts;
/// `streams`: the part's stream entries (JSON), the same in every part.
fn parts_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("path", DataType::Utf8, false),
        Field::new("records", DataType::UInt64, false),
        Field::new("key_source", DataType::Utf8, false),
        Field::new("key_start", DataType::UInt64, false),
        Field::new("streams", DataType::Utf8, false),
    ]))
}

/// Where partition `p` of `input` starts in its source, found through operators that keep each
/// partition's rows where they were: the first file and byte offset of a file scan's group, or
/// the first id of a zrecord scan's partition. A Ballista task runs a plan restricted to its
/// own partitions (numbered from 0 again), so the partition number alone cannot order the parts;
/// this can. `("", p)` when the source is of another kind (then the plan is not split).
fn order_key(input: &Arc<dyn ExecutionPlan>, p: usize) -> (String, u64) {
    let mut node = input.clone();
    loop {
        if let Some(scan) = node.downcast_ref::<crate::query::table::ZrecordScanExec>() {
            return (String::new(), scan.partition_start(p).unwrap_or(u64::MAX));
        }
        if let Some(ds) = node.downcast_ref::<datafusion::datasource::source::DataSourceExec>() {
            if let Some(c) = ds.data_source().downcast_ref::<datafusion::datasource::physical_plan::FileScanConfig>() {
                return match c.file_groups.get(p).and_then(|g| g.files().first()) {
                    Some(f) => (f.object_meta.location.to_string(), f.range.as_ref().map_or(0, |r| r.start.max(0) as u64)),
                    // An empty group writes an empty part: anywhere will do.
                    None => (String::from("\u{10ffff}"), u64::MAX),
                };
            }
        }
        let children = node.children();
        match (node.name(), children.len()) {
            ("ProjectionExec" | "FilterExec" | "CoalesceBatchesExec" | "CooperativeExec", 1) => {
                let next = children[0].clone();
                node = next;
            }
            _ => return (String::new(), p as u64),
        }
    }
}

/// The `count` schema every DataFusion sink yields.
fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("count", DataType::UInt64, false)]))
}

/// `input`, with the file scan at its bottom split into `n` byte ranges when it is one (through
/// projections and filters, which keep each partition's order): the parts of a COPY from one
/// large file are then written in parallel, and their concatenation is the file's order.
pub(crate) fn split_scan(input: Arc<dyn ExecutionPlan>, n: usize, config: &datafusion::config::ConfigOptions) -> DfResult<Arc<dyn ExecutionPlan>> {
    let children = input.children();
    match (input.name(), children.len()) {
        ("ProjectionExec" | "FilterExec" | "CoalesceBatchesExec", 1) => {
            let child = split_scan(children[0].clone(), n, config)?;
            input.replace_children(vec![child], ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
        }
        // File scans only: their byte-range split keeps the file order (partition 0 reads the
        // first range); an in-memory source would deal its batches out by size.
        ("DataSourceExec", 0)
            if input
                .downcast_ref::<datafusion::datasource::source::DataSourceExec>()
                .is_some_and(|d| d.data_source().downcast_ref::<datafusion::datasource::physical_plan::FileScanConfig>().is_some()) =>
        {
            // Any file of more than one row group splits (DataFusion's default waits for 10 MB).
            let mut config = config.clone();
            config.optimizer.repartition_file_min_size = 0;
            let split = input.repartitioned(n, &config)?.unwrap_or(input);
            // DataFusion lets sibling partitions of a file scan steal each other's files and
            // row groups unless order must be kept: then partition k would not be byte range k.
            Ok(split.with_preserve_order(true).unwrap_or(split))
        }
        _ => Ok(input),
    }
}

/// Physical optimizer rule, run after DataFusion's: removes round-robin redistribution below a
/// part writer (added for filters and projections when a scan has fewer partitions than
/// `target_partitions`). It would deal batches to partitions in arrival order, so parts would
/// neither follow the source order nor be the same from one run to the next; without it each
/// part is one scan partition in order.
#[derive(Debug, Default)]
pub struct KeepPartOrder;

impl datafusion::physical_optimizer::PhysicalOptimizerRule for KeepPartOrder {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &datafusion::config::ConfigOptions) -> DfResult<Arc<dyn ExecutionPlan>> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        use datafusion::physical_plan::repartition::RepartitionExec;
        plan.transform_down(|node| {
            let Some(parts) = node.downcast_ref::<ZrecordPartsExec>() else { return Ok(Transformed::no(node)) };
            let input = parts.input.clone().transform_up(|n| match n.downcast_ref::<RepartitionExec>() {
                Some(r) if matches!(r.partitioning(), Partitioning::RoundRobinBatch(_)) => Ok(Transformed::yes(r.input().clone())),
                _ => Ok(Transformed::no(n)),
            })?;
            if !input.transformed {
                return Ok(Transformed::no(node));
            }
            let target = parts.target.clone();
            Ok(Transformed::new(Arc::new(ZrecordPartsExec::new(input.data, target)?) as Arc<dyn ExecutionPlan>, true, TreeNodeRecursion::Jump))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "zrecord_keep_part_order"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The COPY plan for a partitioned input (see the module documentation).
pub(crate) fn parts_plan(input: Arc<dyn ExecutionPlan>, target: PartsTarget) -> DfResult<Arc<dyn ExecutionPlan>> {
    let parts = Arc::new(ZrecordPartsExec::new(input, target.clone())?);
    let expected = parts.properties().partitioning.partition_count();
    let coalesced = Arc::new(CoalescePartitionsExec::new(parts));
    Ok(Arc::new(ZrecordCommitExec::new(coalesced, target, expected)))
}

fn properties(schema: SchemaRef, partitions: usize) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(partitions),
        EmissionType::Final,
        Boundedness::Bounded,
    ))
}

/// Writes partition `k` of its input as part `k` of a multi-part root.
#[derive(Debug)]
pub struct ZrecordPartsExec {
    input: Arc<dyn ExecutionPlan>,
    target: PartsTarget,
    columns: Vec<(String, RecordType)>,
    properties: Arc<PlanProperties>,
}

impl ZrecordPartsExec {
    /// Part writers over `input` (its column types are checked here).
    pub fn new(input: Arc<dyn ExecutionPlan>, target: PartsTarget) -> DfResult<ZrecordPartsExec> {
        let columns = plan_columns(&input.schema())?;
        let n = input.properties().partitioning.partition_count();
        Ok(ZrecordPartsExec { input, target, columns, properties: properties(parts_schema(), n) })
    }

    /// Where and how the parts are written.
    pub fn target(&self) -> &PartsTarget {
        &self.target
    }

    /// The input.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl DisplayAs for ZrecordPartsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ZrecordPartsExec: dest={}, parts={}, codec={}, columns=[{}]",
            self.target.dest.display(),
            self.properties.partitioning.partition_count(),
            self.target.options.codec.name(),
            self.columns.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
        )
    }
}

impl ExecutionPlan for ZrecordPartsExec {
    fn name(&self) -> &'static str {
        "ZrecordPartsExec"
    }

    // Never repartitioned: partition k of the input is one part, in order.
    unary_exec_methods!();

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::UnspecifiedDistribution]
    }

    fn replace_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>, _: ReplaceChildrenOptions) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|_| Error::invalid("plan", "ZrecordPartsExec takes one input"))?;
        Ok(Arc::new(ZrecordPartsExec::new(input, self.target.clone())?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> DfResult<SendableRecordBatchStream> {
        let progress = context.session_config().get_extension::<crate::query::CopyProgress>();
        let mut data = self.input.execute(partition, context)?;
        let (target, columns) = (self.target.clone(), self.columns.clone());
        let (key_source, key_start) = order_key(&self.input, partition);
        log::debug!("part writer for partition {partition} of {} starts at {key_source:?} {key_start}", self.properties.partitioning.partition_count());
        let streams = serde_json::to_string(&DatasetWriter::stream_entries(&self.columns)).map_err(|e| Error::invalid("plan", e.to_string()))?;
        let fut = async move {
            let run = CopyRun::join(target.token);
            let name = target.part_name();
            let dir = target.parts_dir()?;
            let dest = PartsTarget::join(&dir, &name);
            let keep: Vec<usize> = data.schema().fields().iter().enumerate().filter(|(_, f)| f.name() != ID_COLUMN).map(|(i, _)| i).collect();
            let cancelled = || -> datafusion::error::DataFusionError {
                datafusion::error::DataFusionError::Execution(format!("COPY to {}: part {name} cancelled (another part failed)", target.dest.display()))
            };
            let written = async {
                let mut writer = DatasetWriter::create(&dest, &columns, target.options.clone()).map_err(|e| e.context(format!("part {name} of {}", target.dest.display())))?;
                let mut stop = run.cancel.subscribe();
                loop {
                    if *stop.borrow_and_update() {
                        return Err(Cancel::Sibling);
                    }
                    let batch = tokio::select! {
                        b = data.next() => b,
                        _ = stop.changed() => continue,
                    };
                    let Some(batch) = batch else { break };
                    let batch = batch?.project(&keep)?;
                    // CPU work inline, as DataFusion's own operators do; encoding and writing
                    // run on the writer's shard threads.
                    writer.append(&batch)?;
                    if let Some(p) = &progress {
                        p.rows.fetch_add(batch.num_rows() as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                let n = writer.len();
                if run.is_cancelled() {
                    return Err(Cancel::Sibling);
                }
                writer.finish()?;
                Ok::<u64, Cancel>(n)
            }
            .await;
            let n = match written {
                Ok(n) => n,
                Err(e) => {
                    // The COPY fails and nothing of it will be published. This part's writer has
                    // removed its own staging already (dropped above); on an object store its
                    // objects go too. The staging folder is the commit's to remove, once every
                    // part is done: removing it here would fail siblings still writing into it
                    // with errors of their own.
                    if target.remote() {
                        cleanup_parts(&target, std::iter::once(name.as_str()));
                    }
                    return Err(match e {
                        Cancel::Sibling => cancelled(),
                        Cancel::Failed(e) => run.fail(e),
                    });
                }
            };
            let cols: Vec<Arc<dyn Array>> = vec![
                Arc::new(StringArray::from(vec![name])),
                Arc::new(UInt64Array::from(vec![n])),
                Arc::new(StringArray::from(vec![key_source])),
                Arc::new(UInt64Array::from(vec![key_start])),
                Arc::new(StringArray::from(vec![streams])),
            ];
            Ok(RecordBatch::try_new(parts_schema(), cols)?)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(parts_schema(), futures::stream::once(fut))))
    }
}

/// Publishes a multi-part root once every part is written.
#[derive(Debug)]
pub struct ZrecordCommitExec {
    input: Arc<dyn ExecutionPlan>,
    target: PartsTarget,
    /// Parts the COPY writes (the part writers' partitions when it was planned).
    expected: usize,
    properties: Arc<PlanProperties>,
}

impl ZrecordCommitExec {
    /// The commit of the `expected` parts `input` (one partition of part rows) reports.
    pub fn new(input: Arc<dyn ExecutionPlan>, target: PartsTarget, expected: usize) -> ZrecordCommitExec {
        ZrecordCommitExec { input, target, expected, properties: properties(count_schema(), 1) }
    }

    /// Parts the commit waits for.
    pub fn expected(&self) -> usize {
        self.expected
    }

    /// Where and how the parts are written.
    pub fn target(&self) -> &PartsTarget {
        &self.target
    }
}

impl DisplayAs for ZrecordCommitExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ZrecordCommitExec: dest={}, parts={}", self.target.dest.display(), self.expected)
    }
}

impl ExecutionPlan for ZrecordCommitExec {
    fn name(&self) -> &'static str {
        "ZrecordCommitExec"
    }

    unary_exec_methods!();

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
    }

    fn replace_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>, _: ReplaceChildrenOptions) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|_| Error::invalid("plan", "ZrecordCommitExec takes one input"))?;
        Ok(Arc::new(ZrecordCommitExec::new(input, self.target.clone(), self.expected)))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(Error::invalid("partition", format!("ZrecordCommitExec has one partition, not {partition}")).into());
        }
        let mut rows = self.input.execute(0, context)?;
        let (target, expected) = (self.target.clone(), self.expected);
        let fut = async move {
            let run = CopyRun::join(target.token);
            let mut parts: Vec<PartRow> = Vec::new();
            let mut failed: Option<datafusion::error::DataFusionError> = None;
            // Every part's answer is awaited, failures included: the stream ends once every part
            // writer has finished (a failure cancels the others, which stop at their next batch),
            // so the cleanup below never races a part still writing.
            while let Some(b) = rows.next().await {
                let b = match b {
                    Ok(b) => b,
                    Err(e) => {
                        run.cancel();
                        failed.get_or_insert(e);
                        continue;
                    }
                };
                let col = |i: usize| b.column(i).as_any().downcast_ref::<StringArray>().cloned();
                let num = |i: usize| b.column(i).as_any().downcast_ref::<UInt64Array>().cloned();
                let (Some(p), Some(n), Some(ks), Some(k0), Some(st)) = (col(0), num(1), col(2), num(3), col(4)) else {
                    run.cancel();
                    failed.get_or_insert(Error::invalid("plan", "ZrecordCommitExec's input is not part rows").into());
                    continue;
                };
                for i in 0..b.num_rows() {
                    parts.push(PartRow {
                        entry: PartEntry { path: p.value(i).to_string(), record_count: n.value(i) },
                        key: (ks.value(i).to_string(), k0.value(i)),
                        streams: st.value(i).to_string(),
                    });
                }
            }
            if let Some(e) = failed {
                // The input has ended, so every part writer of this process has finished.
                cleanup(&target, &target.parts_dir()?, parts.iter().map(|p| p.entry.path.as_str()));
                // The first failure wins over the cancellations (and I/O errors) it caused.
                return Err(run.first_error().unwrap_or(e));
            }
            let total = commit(&target, expected, parts)?;
            Ok(RecordBatch::try_new(count_schema(), vec![Arc::new(UInt64Array::from(vec![total]))])?)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(count_schema(), futures::stream::once(fut))))
    }
}

/// What one part writer reported.
struct PartRow {
    entry: PartEntry,
    key: (String, u64),
    streams: String,
}

/// Check the parts and publish the root; on failure remove what the parts wrote.
fn commit(target: &PartsTarget, expected: usize, mut parts: Vec<PartRow>) -> Result<u64> {
    let dir = target.parts_dir()?;
    let result = (|| {
        if parts.len() != expected {
            return Err(Error::invalid("parts", format!("COPY to {}: {} parts reported, {expected} expected", target.dest.display(), parts.len())));
        }
        // Source order: by file and offset (or first id); equal keys keep the order reported.
        parts.sort_by(|a, b| a.key.cmp(&b.key));
        for p in &parts {
            log::debug!("COPY to {}: part {} ({} records) starts at {:?}", target.dest.display(), p.entry.path, p.entry.record_count, p.key);
        }
        if parts.windows(2).any(|w| w[0].key == w[1].key && w[0].key.1 != u64::MAX) {
            return Err(Error::invalid("parts", format!("COPY to {}: two parts start at the same place of the input (written twice?)", target.dest.display())));
        }
        let first = parts.first().ok_or_else(|| Error::invalid("parts", format!("COPY to {}: no part was written", target.dest.display())))?;
        if parts.iter().any(|p| p.streams != first.streams) {
            return Err(Error::invalid("parts", format!("COPY to {}: parts disagree on their streams", target.dest.display())));
        }
        let entries: Vec<crate::store::dataset::StreamEntry> = serde_json::from_str(&first.streams).map_err(|e| Error::invalid("parts", e.to_string()))?;
        let manifest = DatasetManifest::with_parts(entries, parts.iter().map(|p| p.entry.clone()).collect());
        let bytes = manifest.to_bytes()?;
        if target.prepare {
            let url = dir.to_string_lossy().trim_end_matches('/').to_string();
            crate::io::resolve(&url, crate::io::ReadMode::Mmap)?.put_create(&target.prepared_name(), bytes)?;
        } else if target.remote() {
            let url = target.dest.to_string_lossy().trim_end_matches('/').to_string();
            crate::io::resolve(&url, crate::io::ReadMode::Mmap)?.put_create(DATASET_FILE, bytes)?;
        } else {
            crate::io::publish::publish_folder(&dir, &target.dest, DATASET_FILE, &bytes)?;
        }
        Ok(manifest.record_count)
    })();
    if result.is_err() {
        cleanup(target, &dir, parts.iter().map(|p| p.entry.path.as_str()));
    }
    result
}

/// The largest prepared manifest a client reads back (a manifest lists one entry per part).
#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
const MAX_PREPARED_BYTES: u64 = 64 << 20;

/// The client's half of a prepared COPY ([`PartsTarget::prepare`]): the cluster answered
/// `count` records, so read the manifest its commit prepared, check it, and publish the root
/// (local: the manifest written create-only and the staging folder renamed into place;
/// object store: the create-only put of `dataset.json`). On failure nothing is published and
/// the parts are removed (best effort).
#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
pub fn publish_prepared(target: &PartsTarget, count: u64) -> Result<u64> {
    let dir = target.parts_dir()?;
    let url = dir.to_string_lossy().trim_end_matches('/').to_string();
    let result = (|| {
        let loc = crate::io::resolve(&url, crate::io::ReadMode::Mmap)?;
        let name = target.prepared_name();
        let bytes = loc
            .read_small(&name, MAX_PREPARED_BYTES)?
            .ok_or_else(|| Error::invalid("copy", format!("COPY to {}: the cluster reported success but prepared no manifest", target.dest.display())))?;
        let manifest: DatasetManifest = serde_json::from_slice(&bytes).map_err(|e| Error::invalid("copy", format!("COPY to {}: the prepared manifest: {e}", target.dest.display())))?;
        if manifest.record_count != count {
            return Err(Error::invalid("copy", format!("COPY to {}: the cluster reported {count} records, its manifest {}", target.dest.display(), manifest.record_count)));
        }
        loc.delete(&name)?;
        if target.remote() {
            loc.put_create(DATASET_FILE, bytes)?;
        } else {
            crate::io::publish::publish_folder(&dir, &target.dest, DATASET_FILE, &bytes)?;
        }
        Ok(count)
    })();
    if result.is_err() {
        abandon_prepared(target);
    }
    result
}

/// The client's half of a prepared COPY that failed: remove what its parts wrote (best
/// effort; `zrec gc` finds what a part writer still running leaves later). Nothing of it was
/// or will be published: only the client publishes.
#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
pub fn abandon_prepared(target: &PartsTarget) {
    let Ok(dir) = target.parts_dir() else { return };
    if target.remote() {
        let url = dir.to_string_lossy().trim_end_matches('/').to_string();
        let Ok(loc) = crate::io::resolve(&url, crate::io::ReadMode::Mmap) else { return };
        let name = target.prepared_name();
        if let Ok(Some(bytes)) = loc.read_small(&name, MAX_PREPARED_BYTES) {
            if let Ok(m) = serde_json::from_slice::<DatasetManifest>(&bytes) {
                cleanup_parts(target, m.parts.iter().map(|p| p.path.as_str()));
            }
        }
        let _ = loc.delete(&name);
    } else {
        let _ = crate::io::remove_tree(&dir);
    }
}

/// Remove the parts of a COPY that will not be published (best effort: `zrec gc` finds what
/// is left).
fn cleanup<'a>(target: &PartsTarget, dir: &Path, parts: impl Iterator<Item = &'a str>) {
    if target.remote() {
        cleanup_parts(target, parts);
    } else {
        let _ = crate::io::remove_tree(dir);
    }
}

/// Remove these parts of a COPY to an object store.
fn cleanup_parts<'a>(target: &PartsTarget, parts: impl Iterator<Item = &'a str>) {
    let url = target.dest.to_string_lossy().trim_end_matches('/').to_string();
    if let Ok(remote) = crate::io::resolve(&url, crate::io::ReadMode::Mmap) {
        for p in parts {
            let _ = remote.delete(p);
        }
    }
}

/// Why a part writer stopped early.
enum Cancel {
    /// Another part failed first.
    Sibling,
    /// This part failed.
    Failed(datafusion::error::DataFusionError),
}

impl From<datafusion::error::DataFusionError> for Cancel {
    fn from(e: datafusion::error::DataFusionError) -> Cancel {
        Cancel::Failed(e)
    }
}

impl From<Error> for Cancel {
    fn from(e: Error) -> Cancel {
        Cancel::Failed(e.into())
    }
}

impl From<arrow_schema::ArrowError> for Cancel {
    fn from(e: arrow_schema::ArrowError) -> Cancel {
        Cancel::Failed(e.into())
    }
}

/// What the part writers and the commit of one COPY share within a process (keyed by the
/// COPY's token): the first failure and a cancel signal. On a
/// Ballista cluster each process has its own, so part writers of one executor still cancel each
/// other, and the commit sees the first error that reached it.
struct CopyRun {
    token: u64,
    cancel: tokio::sync::watch::Sender<bool>,
    first: std::sync::Mutex<Option<Arc<datafusion::error::DataFusionError>>>,
}

type Runs = std::sync::Mutex<std::collections::HashMap<u64, std::sync::Weak<CopyRun>>>;

fn runs() -> &'static Runs {
    static RUNS: std::sync::OnceLock<Runs> = std::sync::OnceLock::new();
    RUNS.get_or_init(Default::default)
}

impl CopyRun {
    /// This process's state of the COPY named `token` (made by whichever of its operators runs
    /// first; gone when the last one drops it).
    fn join(token: u64) -> Arc<CopyRun> {
        let mut runs = runs().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(run) = runs.get(&token).and_then(|w| w.upgrade()) {
            return run;
        }
        runs.retain(|_, w| w.strong_count() > 0);
        let run = Arc::new(CopyRun {
            token,
            cancel: tokio::sync::watch::channel(false).0,
            first: std::sync::Mutex::new(None),
        });
        runs.insert(token, Arc::downgrade(&run));
        run
    }

    fn is_cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    fn cancel(&self) {
        self.cancel.send_replace(true);
    }

    /// Record a part's failure (the first one recorded is the COPY's error), cancel the others,
    /// and return the error to report for this part.
    fn fail(&self, e: datafusion::error::DataFusionError) -> datafusion::error::DataFusionError {
        let e = Arc::new(e);
        {
            let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(|| e.clone());
        }
        log::debug!("COPY {:016x}: a part failed, cancelling the others: {e}", self.token);
        self.cancel();
        datafusion::error::DataFusionError::Shared(e)
    }

    fn first_error(&self) -> Option<datafusion::error::DataFusionError> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone().map(datafusion::error::DataFusionError::Shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Int64Array;
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;

    /// A prepared COPY of 2 partitions (x = 0..10): the commit's answer and its target.
    fn prepared(dest: &Path) -> (u64, PartsTarget) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
            let part = |a: i64| RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from_iter_values(a..a + 5))]).unwrap();
            let ctx = SessionContext::new();
            ctx.register_table("t", Arc::new(MemTable::try_new(schema.clone(), vec![vec![part(0)], vec![part(5)]]).unwrap())).unwrap();
            let input = ctx.table("t").await.unwrap().create_physical_plan().await.unwrap();
            let mut target = PartsTarget::new(dest.to_path_buf(), WriterOptions::default());
            target.prepare = true;
            let plan = parts_plan(input, target.clone()).unwrap();
            let out = datafusion::physical_plan::collect(plan, ctx.task_ctx()).await.unwrap();
            let count = out[0].column(0).as_any().downcast_ref::<UInt64Array>().unwrap().value(0);
            (count, target)
        })
    }

    #[test]
    fn a_prepared_copy_is_published_only_by_its_client() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("root");
        let (count, target) = prepared(&dest);
        assert_eq!(count, 10);
        // The commit prepared the root and published nothing.
        assert!(!dest.exists());
        assert!(target.parts_dir().unwrap().join(target.prepared_name()).is_file());
        // A client that saw a wrong answer refuses it, publishes nothing and removes the parts.
        assert!(matches!(publish_prepared(&target, 9), Err(Error::InvalidArgument { .. })));
        assert!(!dest.exists() && !target.parts_dir().unwrap().exists());

        let (count, target) = prepared(&dest);
        assert_eq!(publish_prepared(&target, count).unwrap(), 10);
        let ds = crate::store::Dataset::open(&dest).unwrap();
        assert_eq!(ds.len(), 10);
        assert!(!dest.join(target.prepared_name()).exists(), "the prepared manifest is not part of the root");
        assert!(crate::io::publish::leftovers(dir.path()).unwrap().is_empty());
        // A second publish of the same name is refused (nothing replaced).
        let (count, again) = prepared(&dest);
        assert!(publish_prepared(&again, count).is_err());
        assert_eq!(crate::store::Dataset::open(&dest).unwrap().len(), 10);

        // A client that saw an error abandons the prepared root: nothing published, nothing left.
        let other = dir.path().join("other");
        let (_, target) = prepared(&other);
        abandon_prepared(&target);
        assert!(!other.exists() && crate::store::Dataset::open(&other).is_err());
        assert!(crate::io::publish::leftovers(dir.path()).unwrap().is_empty());
        // ... and a client that saw success but finds no prepared manifest publishes nothing.
        let (count, target) = prepared(&other);
        std::fs::remove_file(target.parts_dir().unwrap().join(target.prepared_name())).unwrap();
        assert!(publish_prepared(&target, count).is_err());
        assert!(!other.exists());
    }
}
