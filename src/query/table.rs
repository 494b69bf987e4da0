//! `ZrecordTable`: a store or dataset root as a DataFusion table, and its scan.

use std::fmt;
use std::sync::Arc;

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result as DfResult, Statistics};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, ReplaceChildrenOptions,
};

pub use crate::arrow::ID_COLUMN;
use crate::arrow::{ScanColumn, Scanner};
use crate::error::{Error, Result};
use crate::memory::Allocator;
use crate::query::ids::{id_filter, IdSet};
use crate::store::{Dataset, ReadOptions};
pub use crate::store::Selection;

/// A store or dataset root as a table: one column per stream plus `_id` (UInt64, the record's
/// logical id), with projection, limit and exact `_id` filter pushdown.
#[derive(Clone)]
pub struct ZrecordTable {
    dataset: Dataset,
    schema: SchemaRef,
    order: Option<Arc<Vec<u64>>>,
    allocator: Allocator,
}

impl fmt::Debug for ZrecordTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZrecordTable").field("path", &self.dataset.path()).field("records", &self.dataset.len()).finish()
    }
}

/// The allocator tables gather into unless given one: pooled, shared by every table.
fn default_allocator() -> Allocator {
    static POOL: std::sync::OnceLock<Allocator> = std::sync::OnceLock::new();
    POOL.get_or_init(|| Allocator::cpu(256 << 20)).clone()
}

impl ZrecordTable {
    /// Open a store or dataset root at `path`.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<ZrecordTable> {
        ZrecordTable::new(Dataset::open(path)?)
    }

    /// A table over an opened dataset.
    pub fn new(dataset: Dataset) -> Result<ZrecordTable> {
        let allocator = default_allocator();
        let scanner = Scanner::new(dataset.clone(), &allocator);
        let schema = scanner.schema(&scanner.all_columns())?;
        Ok(ZrecordTable { dataset, schema, order: None, allocator })
    }

    /// A scanner of the table's dataset, gathering into its allocator.
    pub fn scanner(&self) -> Scanner {
        Scanner::new(self.dataset.clone(), &self.allocator)
    }

    /// The same table restricted to `ids`, in that order, duplicates kept (each checked
    /// against the record count).
    pub fn gather(&self, ids: Vec<u64>) -> Result<ZrecordTable> {
        let n = self.dataset.len();
        if let Some(&bad) = ids.iter().find(|&&i| i >= n) {
            return Err(Error::IndexOutOfRange { index: bad as i128, len: n, store: self.dataset.path().to_path_buf() });
        }
        Ok(ZrecordTable { order: Some(Arc::new(ids)), ..self.clone() })
    }

    /// Gather into `allocator` instead of the shared default pool.
    pub fn with_allocator(mut self, allocator: Allocator) -> ZrecordTable {
        self.allocator = allocator;
        self
    }

    /// The allocator scans gather into.
    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    /// The dataset.
    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }

    /// Records the table yields without filters.
    pub fn num_rows(&self) -> u64 {
        self.order.as_ref().map(|o| o.len() as u64).unwrap_or(self.dataset.len())
    }

    /// The selection an unfiltered, unlimited scan reads.
    fn selection(&self) -> Selection {
        match &self.order {
            Some(o) => Selection::List(o.clone()),
            None => Selection::Set(IdSet::all(self.dataset.len())),
        }
    }
}

#[async_trait]
impl TableProvider for ZrecordTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> DfResult<Vec<TableProviderFilterPushDown>> {
        let n = self.dataset.len();
        Ok(filters
            .iter()
            .map(|f| if id_filter(f, n).is_some() { TableProviderFilterPushDown::Exact } else { TableProviderFilterPushDown::Unsupported })
            .collect())
    }

    fn statistics(&self) -> Option<Statistics> {
        Some(Statistics::new_unknown(&self.schema).with_num_rows(Precision::Exact(self.num_rows() as usize)))
    }

    async fn scan(&self, state: &dyn Session, projection: Option<&Vec<usize>>, filters: &[Expr], limit: Option<usize>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let n = self.dataset.len();
        let mut pushed = IdSet::all(n);
        let mut any_filter = false;
        for f in filters {
            let s = id_filter(f, n).ok_or_else(|| Error::invalid("filter", format!("filter {f} cannot be pushed into a zrecord scan")))?;
            pushed = pushed.intersect(&s);
            any_filter = true;
        }
        let mut selection = match self.selection() {
            Selection::Set(all) => Selection::Set(all.intersect(&pushed)),
            Selection::List(l) if any_filter => Selection::List(Arc::new(l.iter().copied().filter(|&i| pushed.contains(i)).collect())),
            list => list,
        };
        if let Some(k) = limit {
            selection = match selection {
                Selection::Set(s) => Selection::Set(s.truncate(k as u64)),
                Selection::List(l) if l.len() > k => Selection::List(Arc::new(l[..k].to_vec())),
                list => list,
            };
        }
        let projection: Vec<usize> = projection.cloned().unwrap_or_else(|| (0..self.schema.fields().len()).collect());
        let config = state.config();
        // Rows per batch: the session's batch_size, capped so that one batch of the projected
        // streams stays near BATCH_BYTES.
        let cols: Vec<ScanColumn> = projection.iter().map(|&c| ScanColumn::at(c)).collect();
        let batch_size = self.scanner().rows_per_batch(&cols, config.batch_size());
        let partitions = match &selection {
            // Explicit order: one ordered partition (the gather itself runs in parallel).
            Selection::List(_) => vec![selection.clone()],
            // At most one batch: one partition, gathered in parallel inside (no repartitioning
            // or coalescing cost for point lookups).
            Selection::Set(s) if s.count() <= batch_size as u64 => vec![selection.clone()],
            Selection::Set(s) => s.split(config.target_partitions()).into_iter().map(Selection::Set).collect(),
        };
        Ok(Arc::new(ZrecordScanExec::new(self.clone(), projection, selection, partitions, limit, batch_size)?))
    }
}

/// The scan of a [`ZrecordTable`]: gathers the selected records of the projected streams,
/// `batch_size` at a time, into pooled memory shared with the output arrays.
#[derive(Debug)]
pub struct ZrecordScanExec {
    table: ZrecordTable,
    projection: Vec<usize>,
    schema: SchemaRef,
    selection: Selection,
    partitions: Vec<Selection>,
    limit: Option<usize>,
    batch_size: usize,
    properties: Arc<PlanProperties>,
}

impl ZrecordScanExec {
    fn new(table: ZrecordTable, projection: Vec<usize>, selection: Selection, partitions: Vec<Selection>, limit: Option<usize>, batch_size: usize) -> DfResult<Self> {
        let schema = Arc::new(table.schema.project(&projection)?);
        // Partitions are ascending, disjoint id ranges: each partition is ordered by `_id`, so
        // `ORDER BY _id` costs a merge, not a sort.
        let id_pos = projection.iter().position(|&c| c == 0);
        let eq = match (&selection, id_pos) {
            (Selection::Set(_), Some(pos)) => {
                let col = Arc::new(datafusion::physical_expr::expressions::Column::new(ID_COLUMN, pos));
                EquivalenceProperties::new_with_orderings(schema.clone(), [[datafusion::physical_expr::PhysicalSortExpr::new_default(col)]])
            }
            _ => EquivalenceProperties::new(schema.clone()),
        };
        let properties = PlanProperties::new(
            eq,
            Partitioning::UnknownPartitioning(partitions.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(ZrecordScanExec { table, projection, schema, selection, partitions, limit, batch_size: batch_size.max(1), properties: Arc::new(properties) })
    }

    /// Ids the scan reads (all partitions).
    pub fn selection(&self) -> &Selection {
        &self.selection
    }

    /// Names of the streams the scan reads.
    pub fn streams_read(&self) -> Vec<String> {
        self.projection
            .iter()
            .filter_map(|&c| match ScanColumn::at(c) {
                ScanColumn::Stream(s) => Some(self.table.dataset.streams()[s].name.clone()),
                ScanColumn::Id => None,
            })
            .collect()
    }
}

impl DisplayAs for ZrecordScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let n = self.table.dataset.len();
        write!(f, "ZrecordScanExec: path={}, streams=[{}]", self.table.dataset.path().display(), self.streams_read().join(", "))?;
        match &self.selection {
            Selection::Set(s) if s.count() == n => write!(f, ", ids=all {n}")?,
            Selection::Set(s) => write!(f, ", ids={s} ({} of {n})", s.count())?,
            Selection::List(l) => write!(f, ", ids=gather of {} in given order", l.len())?,
        }
        if let Some(l) = self.limit {
            write!(f, ", limit={l}")?;
        }
        write!(f, ", partitions={}, batch_size={}", self.partitions.len(), self.batch_size)
    }
}

impl ExecutionPlan for ZrecordScanExec {
    fn name(&self) -> &'static str {
        "ZrecordScanExec"
    }

    leaf_exec_methods!();

    fn statistics_from_inputs(&self, _input: &[Arc<Statistics>], args: &datafusion::physical_plan::statistics::StatisticsArgs) -> DfResult<Arc<Statistics>> {
        let rows = match args.partition() {
            Some(p) => self.partitions.get(p).map(|s| s.count()).unwrap_or(0),
            None => self.selection.count(),
        };
        Ok(Arc::new(Statistics::new_unknown(&self.schema).with_num_rows(Precision::Exact(rows as usize))))
    }

    fn execute(&self, partition: usize, _context: Arc<TaskContext>) -> DfResult<SendableRecordBatchStream> {
        let sel = self
            .partitions
            .get(partition)
            .cloned()
            .ok_or_else(|| Error::invalid("partition", format!("{partition} of {}", self.partitions.len())))?;
        // Several partitions already run in parallel: each gathers single-threaded then.
        let options = ReadOptions { parallel: self.partitions.len() == 1, ..ReadOptions::default() };
        let cols: Vec<ScanColumn> = self.projection.iter().map(|&c| ScanColumn::at(c)).collect();
        let reader = self.table.scanner().with_options(options).scan(sel, &cols, self.batch_size)?;
        let stream = futures::stream::iter(reader.map(|r| r.map_err(datafusion::error::DataFusionError::from)));
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), stream)))
    }
}
