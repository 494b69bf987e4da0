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
use crate::query::ids::{id_filter, param_filter, BoundIds, IdParam, IdSet};
use crate::store::{Dataset, ReadOptions};
pub use crate::store::Selection;

/// A store or dataset root as a table: one column per stream plus `_id` (UInt64, the record's
/// logical id), with projection, limit and exact `_id` filter pushdown.
#[derive(Clone)]
pub struct ZrecordTable {
    dataset: Dataset,
    schema: SchemaRef,
    order: Option<Arc<Vec<u64>>>,
    /// `gather('t', $1)` in a prepared statement: the order comes from that parameter.
    order_param: Option<IdParam>,
    allocator: Allocator,
}

impl fmt::Debug for ZrecordTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZrecordTable").field("path", &self.dataset.path()).field("records", &self.dataset.len()).finish()
    }
}

/// The allocator tables (and one-off Zarr gathers) place batches in unless given one: pooled,
/// shared.
pub(crate) fn default_allocator() -> Allocator {
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
        Ok(ZrecordTable { dataset, schema, order: None, order_param: None, allocator })
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
        Ok(ZrecordTable { order: Some(Arc::new(ids)), order_param: None, ..self.clone() })
    }

    /// The same table gathered in the order of the ids a statement parameter (`$1`) binds at
    /// each execution (`gather('t', $1)` in a prepared statement).
    pub fn gather_param(&self, placeholder: &str) -> ZrecordTable {
        ZrecordTable { order: None, order_param: Some(IdParam::gather(placeholder)), ..self.clone() }
    }

    /// The parameter this table's gather order comes from, if any.
    pub fn order_parameter(&self) -> Option<&IdParam> {
        self.order_param.as_ref()
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
            .map(|f| {
                if id_filter(f, n).is_some() || param_filter(f).is_some() {
                    TableProviderFilterPushDown::Exact
                } else {
                    TableProviderFilterPushDown::Unsupported
                }
            })
            .collect())
    }

    fn statistics(&self) -> Option<Statistics> {
        if self.order_param.is_some() {
            // Unknown until bound (an exact count would let the optimizer answer for the scan).
            return Some(Statistics::new_unknown(&self.schema));
        }
        Some(Statistics::new_unknown(&self.schema).with_num_rows(Precision::Exact(self.num_rows() as usize)))
    }

    async fn scan(&self, state: &dyn Session, projection: Option<&Vec<usize>>, filters: &[Expr], limit: Option<usize>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let n = self.dataset.len();
        let mut pushed = IdSet::all(n);
        let mut params: Vec<IdParam> = self.order_param.iter().cloned().collect();
        let mut any_filter = false;
        for f in filters {
            match (id_filter(f, n), param_filter(f)) {
                (Some(s), _) => pushed = pushed.intersect(&s),
                (None, Some(p)) => params.push(p),
                (None, None) => return Err(Error::invalid("filter", format!("filter {f} cannot be pushed into a zrecord scan")).into()),
            }
            any_filter = true;
        }
        let projection: Vec<usize> = projection.cloned().unwrap_or_else(|| (0..self.schema.fields().len()).collect());
        let config = state.config();
        // Rows per batch: the session's batch_size, capped so that one batch of the projected
        // streams stays near BATCH_BYTES.
        let cols: Vec<ScanColumn> = projection.iter().map(|&c| ScanColumn::at(c)).collect();
        let batch_size = self.scanner().rows_per_batch(&cols, config.batch_size());
        if !params.is_empty() {
            // Ids bound at execution ([`ZrecordScanExec::bind`]): one partition (a point lookup
            // gathers in parallel inside), its selection computed when the values are known.
            let bound = Bound { base: pushed, params, limit, any_filter };
            // A gather's order is the parameter's: no `_id` order to promise (an empty list
            // selection says so); filters alone select ids in id order.
            let unbound = if self.order_param.is_some() { Selection::List(Arc::new(Vec::new())) } else { Selection::Set(IdSet::empty()) };
            return Ok(Arc::new(ZrecordScanExec::new(self.clone(), projection, unbound, vec![], limit, batch_size, Some(Arc::new(bound)))?));
        }
        let selection = self.restrict(&pushed, any_filter, limit);
        let partitions = self.partitions(&selection, batch_size, config.target_partitions());
        Ok(Arc::new(ZrecordScanExec::new(self.clone(), projection, selection, partitions, limit, batch_size, None)?))
    }
}

impl ZrecordTable {
    /// The table's records within `pushed` (the `_id` filters), first `limit` of them.
    fn restrict(&self, pushed: &IdSet, any_filter: bool, limit: Option<usize>) -> Selection {
        let n = self.dataset.len();
        let mut selection = match self.selection() {
            // Filters only ever select ids of the table: nothing to intersect.
            Selection::Set(_) if pushed.ranges().last().is_none_or(|r| r.end <= n) => Selection::Set(pushed.clone()),
            Selection::Set(all) => Selection::Set(all.intersect(pushed)),
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
        selection
    }

    /// How a scan of `selection` splits into partitions.
    fn partitions(&self, selection: &Selection, batch_size: usize, target: usize) -> Vec<Selection> {
        match selection {
            // Explicit order: one ordered partition (the gather itself runs in parallel).
            Selection::List(_) => vec![selection.clone()],
            // At most one batch: one partition, gathered in parallel inside (no repartitioning
            // or coalescing cost for point lookups).
            Selection::Set(s) if s.count() <= batch_size as u64 => vec![selection.clone()],
            Selection::Set(s) => s.split(target).into_iter().map(Selection::Set).collect(),
        }
    }
}

/// The `_id` filters of a scan whose ids come from statement parameters.
#[derive(Debug)]
struct Bound {
    /// The literal `_id` filters (intersected with every parameter's ids).
    base: IdSet,
    params: Vec<IdParam>,
    limit: Option<usize>,
    /// True when the scan had filters (a gather's ids are then filtered).
    any_filter: bool,
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
    /// Set when the selection comes from statement parameters not yet bound.
    params: Option<Arc<Bound>>,
    properties: Arc<PlanProperties>,
}

impl ZrecordScanExec {
    #[allow(clippy::too_many_arguments)]
    fn new(
        table: ZrecordTable,
        projection: Vec<usize>,
        selection: Selection,
        partitions: Vec<Selection>,
        limit: Option<usize>,
        batch_size: usize,
        params: Option<Arc<Bound>>,
    ) -> DfResult<Self> {
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
        // An unbound scan has the one partition its bound versions will have.
        let parts = if params.is_some() { 1 } else { partitions.len() };
        let properties = PlanProperties::new(
            eq,
            Partitioning::UnknownPartitioning(parts),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(ZrecordScanExec { table, projection, schema, selection, partitions, limit, batch_size: batch_size.max(1), params, properties: Arc::new(properties) })
    }

    /// Records in the scanned table's dataset.
    pub fn table_len(&self) -> u64 {
        self.table.dataset.len()
    }

    /// The statement parameters this scan takes its ids from (empty when none).
    pub fn parameters(&self) -> Vec<IdParam> {
        self.params.as_ref().map(|b| b.params.clone()).unwrap_or_default()
    }

    /// This scan with its parameters bound: `value(param)` gives the ids each parameter
    /// selects (a filter's already within the table; a gather's are checked here). The bound
    /// scan is the one partition of the same ids a literal filter (or a literal gather) would
    /// read: the plan around it is reused as it is.
    pub fn bind(&self, value: &mut dyn FnMut(&IdParam) -> Result<BoundIds>) -> DfResult<ZrecordScanExec> {
        let Some(b) = &self.params else {
            return Err(Error::invalid("parameters", "this scan has no parameters to bind").into());
        };
        let mut pushed = b.base.clone();
        let mut table = self.table.clone();
        let mut any_filter = b.any_filter;
        for p in &b.params {
            match value(p)? {
                BoundIds::Set(s) => pushed = pushed.intersect(&s),
                BoundIds::Order(ids) if p.gather => {
                    table = self.table.gather(Arc::unwrap_or_clone(ids))?;
                    any_filter = b.params.len() > 1 || b.base.count() < self.table.dataset.len();
                }
                BoundIds::Order(_) => return Err(Error::invalid("parameter", format!("{} is an _id filter, not a gather order", p.id)).into()),
            }
        }
        if table.order.is_none() && table.order_param.is_some() {
            return Err(Error::invalid("parameter", "the gather order was not bound").into());
        }
        let selection = table.restrict(&pushed, any_filter, b.limit);
        // One partition, as planned (the parents were planned for it).
        let partitions = vec![selection.clone()];
        Ok(ZrecordScanExec {
            table,
            projection: self.projection.clone(),
            schema: self.schema.clone(),
            selection,
            partitions,
            limit: self.limit,
            batch_size: self.batch_size,
            params: None,
            properties: self.properties.clone(),
        })
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
            _ if self.params.is_some() => {
                let p = self.parameters().iter().map(IdParam::display).collect::<Vec<_>>();
                write!(f, ", ids=bound at execution from {}", p.join(", "))?
            }
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
        if self.params.is_some() {
            // Unknown until bound (an exact 0 would let the optimizer answer for the scan).
            return Ok(Arc::new(Statistics::new_unknown(&self.schema)));
        }
        let rows = match args.partition() {
            Some(p) => self.partitions.get(p).map(|s| s.count()).unwrap_or(0),
            None => self.selection.count(),
        };
        Ok(Arc::new(Statistics::new_unknown(&self.schema).with_num_rows(Precision::Exact(rows as usize))))
    }

    fn execute(&self, partition: usize, _context: Arc<TaskContext>) -> DfResult<SendableRecordBatchStream> {
        if let Some(b) = &self.params {
            let p = b.params.iter().map(|p| p.id.as_str()).collect::<Vec<_>>().join(", ");
            if b.params.iter().any(|p| p.gather) {
                // SQL's EXECUTE binds the placeholders of expressions; a table function's
                // argument was consumed when the statement was planned.
                return Err(Error::invalid("parameters", format!("the ids of gather('...', {p}) are bound only by a prepared statement's execution (PreparedQuery, Python's SessionContext.prepare), not by SQL PREPARE / EXECUTE")).into());
            }
            return Err(Error::invalid("parameters", format!("statement parameters {p} are not bound: execute the statement through PreparedQuery (or EXECUTE with values)")).into());
        }
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

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
/// Ids of a scan as they travel to another process (Ballista executors).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum SelectionSpec {
    /// Ascending id ranges `[start, end)`.
    Ranges(Vec<(u64, u64)>),
    /// Explicit ids in order.
    List(Vec<u64>),
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
impl SelectionSpec {
    fn of(s: &Selection) -> SelectionSpec {
        match s {
            Selection::Set(set) => SelectionSpec::Ranges(set.ranges().iter().map(|r| (r.start, r.end)).collect()),
            Selection::List(l) => SelectionSpec::List(l.to_vec()),
        }
    }

    fn to_selection(&self, n: u64, what: &str) -> Result<Selection> {
        let bad = |id: u64| Error::IndexOutOfRange { index: id as i128, len: n, store: what.into() };
        match self {
            SelectionSpec::Ranges(r) => {
                if let Some(&(a, b)) = r.iter().find(|(a, b)| a > b || *b > n) {
                    return Err(bad(a.max(b.saturating_sub(1))));
                }
                Ok(Selection::Set(IdSet::from_ranges(r.iter().map(|&(a, b)| a..b).collect())))
            }
            SelectionSpec::List(l) => match l.iter().find(|&&i| i >= n) {
                Some(&i) => Err(bad(i)),
                None => Ok(Selection::List(Arc::new(l.clone()))),
            },
        }
    }
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
/// A [`ZrecordTable`] as it travels to another process: where its dataset is and the gather
/// order, if any. Only tables opened from a path (or URL) can travel.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct TableSpec {
    pub(crate) path: String,
    pub(crate) records: u64,
    pub(crate) order: Option<Vec<u64>>,
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
impl ZrecordTable {
    /// What another process needs to open this table again.
    pub(crate) fn spec(&self) -> Result<TableSpec> {
        let path = self.dataset.path().to_string_lossy().into_owned();
        if let Some(p) = &self.order_param {
            return Err(Error::invalid("parameters", format!("a gather whose ids come from {} cannot be sent to other processes before it is bound", p.id)));
        }
        if path.is_empty() || !self.dataset.is_opened() {
            return Err(Error::invalid("table", "a table assembled in memory (no path) cannot be sent to other processes"));
        }
        Ok(TableSpec { path, records: self.dataset.len(), order: self.order.as_ref().map(|o| o.to_vec()) })
    }

    /// Open the table `spec` describes; the dataset must still hold the records it held.
    pub(crate) fn from_spec(spec: &TableSpec) -> Result<ZrecordTable> {
        let t = ZrecordTable::open(&spec.path)?;
        if t.dataset.len() != spec.records {
            return Err(Error::invalid(
                "table",
                format!("{} holds {} records here but {} where the query was planned", spec.path, t.dataset.len(), spec.records),
            ));
        }
        match &spec.order {
            Some(o) => t.gather(o.clone()),
            None => Ok(t),
        }
    }
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
/// A [`ZrecordScanExec`] as it travels to another process.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct ScanSpec {
    table: TableSpec,
    projection: Vec<usize>,
    selection: SelectionSpec,
    partitions: Vec<SelectionSpec>,
    limit: Option<usize>,
    batch_size: usize,
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
impl ZrecordScanExec {
    /// What another process needs to run this scan (parameters must be bound first).
    pub(crate) fn spec(&self) -> Result<ScanSpec> {
        if self.params.is_some() {
            return Err(Error::invalid("parameters", "a scan with unbound statement parameters cannot be sent to other processes"));
        }
        Ok(ScanSpec {
            table: self.table.spec()?,
            projection: self.projection.clone(),
            selection: SelectionSpec::of(&self.selection),
            partitions: self.partitions.iter().map(SelectionSpec::of).collect(),
            limit: self.limit,
            batch_size: self.batch_size,
        })
    }

    /// The scan `spec` describes, over its table opened here.
    pub(crate) fn from_spec(spec: &ScanSpec) -> DfResult<ZrecordScanExec> {
        let table = ZrecordTable::from_spec(&spec.table)?;
        let n = table.dataset.len();
        let width = table.schema.fields().len();
        if let Some(&c) = spec.projection.iter().find(|&&c| c >= width) {
            return Err(Error::invalid("projection", format!("column {c} of a table of {width}")).into());
        }
        let selection = spec.selection.to_selection(n, &spec.table.path)?;
        let partitions = spec.partitions.iter().map(|p| p.to_selection(n, &spec.table.path)).collect::<Result<Vec<_>>>()?;
        ZrecordScanExec::new(table, spec.projection.clone(), selection, partitions, spec.limit, spec.batch_size, None)
    }
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
impl ScanSpec {
    /// The id ranges of every partition, when every partition is a set of ranges (a gather
    /// list is one ordered partition: `None`).
    pub(crate) fn partition_ranges(&self) -> Option<Vec<Vec<(u64, u64)>>> {
        self.partitions
            .iter()
            .map(|p| match p {
                SelectionSpec::Ranges(r) => Some(r.clone()),
                SelectionSpec::List(_) => None,
            })
            .collect()
    }

    /// The same scan over other partitions (a Ballista task's share of them).
    pub(crate) fn with_partition_ranges(&self, parts: Vec<Vec<(u64, u64)>>) -> ScanSpec {
        ScanSpec { partitions: parts.into_iter().map(SelectionSpec::Ranges).collect(), ..self.clone() }
    }

    /// Where the table is.
    pub(crate) fn table_path(&self) -> &str {
        &self.table.path
    }
}

#[cfg_attr(not(feature = "ballista"), allow(dead_code))]
impl ZrecordScanExec {
    /// The first id partition `p` reads (a position in the table that orders partitions).
    pub(crate) fn partition_start(&self, p: usize) -> Option<u64> {
        match self.partitions.get(p)? {
            Selection::Set(s) => s.ranges().first().map(|r| r.start),
            Selection::List(l) => l.first().copied(),
        }
    }

    /// Partitions of the scan.
    pub(crate) fn partition_count(&self) -> usize {
        self.partitions.len()
    }
}
