//! `ZrecordTable`: a store or dataset root as a DataFusion table, and its scan.

use std::fmt;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
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

use crate::arrow::{column_from_ragged, dense_to_arrow, Logical};
use crate::error::{Error, Result};
use crate::memory::Allocator;
use crate::query::dataset::Dataset;
use crate::query::ids::{id_filter, IdSet};
use crate::query::df_err;
use crate::store::{DenseView, Ids, RaggedView, Store};

/// The virtual id column.
pub const ID_COLUMN: &str = "_id";

/// Target bytes of one output batch (rows are capped below the session's `batch_size` to stay
/// near it).
pub const BATCH_BYTES: u64 = 32 << 20;

/// Which records a table (or one scan partition) covers.
#[derive(Clone, Debug)]
pub enum Selection {
    /// Id ranges, read in id order.
    Set(IdSet),
    /// Explicit ids in the given order, duplicates kept (the `gather` table function).
    List(Arc<Vec<u64>>),
}

impl Selection {
    fn count(&self) -> u64 {
        match self {
            Selection::Set(s) => s.count(),
            Selection::List(l) => l.len() as u64,
        }
    }
}

/// A store or dataset root as a table: one column per stream plus `_id` (UInt64, the record's
/// logical id), with projection, limit and exact `_id` filter pushdown.
#[derive(Clone)]
pub struct ZrecordTable {
    dataset: Dataset,
    schema: SchemaRef,
    /// Stream index of each schema column (`None` for `_id`).
    columns: Vec<Option<usize>>,
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
        let mut fields = vec![Arc::new(Field::new(ID_COLUMN, DataType::UInt64, false))];
        let mut columns = vec![None];
        for (i, s) in dataset.streams().iter().enumerate() {
            fields.push(s.layout().field(&s.name)?);
            columns.push(Some(i));
        }
        Ok(ZrecordTable { dataset, schema: Arc::new(Schema::new(fields)), columns, order: None, allocator: default_allocator() })
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
            let s = id_filter(f, n).ok_or_else(|| df_err(Error::invalid("filter", format!("filter {f} cannot be pushed into a zrecord scan"))))?;
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
        // streams stays near BATCH_BYTES (8192 rows of 150 KB images would be 1.2 GB).
        let row_bytes: u64 = projection
            .iter()
            .filter_map(|&c| self.columns[c])
            .map(|s| {
                let st = &self.dataset.streams()[s].store;
                st.stats().raw_bytes / st.len().max(1)
            })
            .sum();
        let batch_size = config.batch_size().min((BATCH_BYTES / row_bytes.max(1)).max(1) as usize);
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
        self.projection.iter().filter_map(|&c| self.table.columns[c]).map(|s| self.table.dataset.streams()[s].name.clone()).collect()
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
        let sel = self.partitions.get(partition).cloned().ok_or_else(|| df_err(Error::invalid("partition", format!("{partition} of {}", self.partitions.len()))))?;
        // Several partitions already run in parallel: each gathers single-threaded then.
        let parallel = self.partitions.len() == 1;
        let mut sources = Vec::with_capacity(self.projection.len());
        for &c in &self.projection {
            sources.push(match self.table.columns[c] {
                None => Source::Id,
                Some(s) => {
                    let st = &self.table.dataset.streams()[s];
                    match &st.store {
                        Store::Dense(d) => {
                            let mut v = d.bind(&self.table.allocator);
                            v.set_parallel(parallel);
                            Source::Dense(st.name.clone(), v)
                        }
                        Store::Ragged(r) => {
                            let mut v = r.bind(&self.table.allocator);
                            v.set_parallel(parallel);
                            Source::Ragged(st.name.clone(), v, st.logical)
                        }
                    }
                }
            });
        }
        let iter = ScanIter { schema: self.schema.clone(), sources, chunks: Chunks::new(sel, self.batch_size) };
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), futures::stream::iter(iter))))
    }
}

/// One projected column's source.
pub(crate) enum Source {
    Id,
    Dense(String, DenseView),
    Ragged(String, RaggedView, Logical),
}

impl Source {
    /// The column of `ids`.
    pub(crate) fn column(&self, ids: &ChunkIds) -> Result<ArrayRef> {
        Ok(match self {
            Source::Id => Arc::new(UInt64Array::from(ids.to_vec())),
            Source::Dense(name, v) => dense_to_arrow(name, &v.gather_ids(ids.ids())?)?.1,
            Source::Ragged(name, v, logical) => column_from_ragged(name, &v.gather_ids(ids.ids())?, *logical)?.1,
        })
    }
}

/// One batch worth of ids: a contiguous run or an explicit list.
pub(crate) enum ChunkIds {
    Run(u64, usize),
    List(Vec<u64>),
}

impl ChunkIds {
    fn ids(&self) -> Ids<'_> {
        match self {
            ChunkIds::Run(start, len) => Ids::Range { start: *start, step: 1, len: *len },
            ChunkIds::List(l) => Ids::List(l),
        }
    }

    fn len(&self) -> usize {
        match self {
            ChunkIds::Run(_, n) => *n,
            ChunkIds::List(l) => l.len(),
        }
    }

    fn to_vec(&self) -> Vec<u64> {
        match self {
            ChunkIds::Run(s, n) => (*s..*s + *n as u64).collect(),
            ChunkIds::List(l) => l.clone(),
        }
    }
}

/// Cuts a selection into batches of at most `batch_size` ids.
struct Chunks {
    sel: Selection,
    range: usize,
    at: u64,
    batch_size: usize,
}

impl Chunks {
    fn new(sel: Selection, batch_size: usize) -> Chunks {
        let at = match &sel {
            Selection::Set(s) => s.ranges().first().map(|r| r.start).unwrap_or(0),
            Selection::List(_) => 0,
        };
        Chunks { sel, range: 0, at, batch_size }
    }
}

impl Iterator for Chunks {
    type Item = ChunkIds;

    fn next(&mut self) -> Option<ChunkIds> {
        match &self.sel {
            Selection::List(l) => {
                let lo = self.at as usize;
                if lo >= l.len() {
                    return None;
                }
                let hi = (lo + self.batch_size).min(l.len());
                self.at = hi as u64;
                Some(ChunkIds::List(l[lo..hi].to_vec()))
            }
            Selection::Set(s) => {
                // Take up to batch_size ids, range by range; one piece is a contiguous run.
                let ranges = s.ranges();
                let mut pieces: Vec<(u64, usize)> = Vec::new();
                let mut want = self.batch_size;
                while want > 0 && self.range < ranges.len() {
                    let r = &ranges[self.range];
                    let take = ((r.end - self.at) as usize).min(want);
                    pieces.push((self.at, take));
                    self.at += take as u64;
                    want -= take;
                    if self.at >= r.end {
                        self.range += 1;
                        self.at = ranges.get(self.range).map(|n| n.start).unwrap_or(self.at);
                    }
                }
                match pieces[..] {
                    [] => None,
                    [(start, len)] => Some(ChunkIds::Run(start, len)),
                    _ => Some(ChunkIds::List(pieces.iter().flat_map(|&(s, n)| s..s + n as u64).collect())),
                }
            }
        }
    }
}

struct ScanIter {
    schema: SchemaRef,
    sources: Vec<Source>,
    chunks: Chunks,
}

impl Iterator for ScanIter {
    type Item = DfResult<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let ids = self.chunks.next()?;
        let build = || -> Result<RecordBatch> {
            let cols = self.sources.iter().map(|s| s.column(&ids)).collect::<Result<Vec<_>>>()?;
            let opts = RecordBatchOptions::new().with_row_count(Some(ids.len()));
            RecordBatch::try_new_with_options(self.schema.clone(), cols, &opts).map_err(|e| Error::invalid("arrow", e.to_string()))
        };
        Some(build().map_err(df_err))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(sel: Selection, bs: usize) -> Vec<Vec<u64>> {
        Chunks::new(sel, bs).map(|c| c.to_vec()).collect()
    }

    #[test]
    fn chunks_cover_selection_in_order() {
        let s = IdSet::from_ranges(vec![0..5, 7..8, 10..13]);
        assert_eq!(collect(Selection::Set(s.clone()), 4), vec![vec![0, 1, 2, 3], vec![4, 7, 10, 11], vec![12]]);
        assert_eq!(collect(Selection::Set(s), 100), vec![vec![0, 1, 2, 3, 4, 7, 10, 11, 12]]);
        assert!(collect(Selection::Set(IdSet::empty()), 4).is_empty());
        assert_eq!(collect(Selection::List(Arc::new(vec![5, 1, 5])), 2), vec![vec![5, 1], vec![5]]);
        // A chunk inside one range is a contiguous run.
        assert!(matches!(Chunks::new(Selection::Set(IdSet::all(10)), 4).next(), Some(ChunkIds::Run(0, 4))));
    }
}
