//! SQL over record stores (DataFusion).
//!
//! - [`ZrecordTable`]: a store or dataset root as a table (one column per stream plus `_id`),
//!   with projection, limit and exact `_id` filter pushdown, partitioned over id ranges.
//! - `CREATE EXTERNAL TABLE t STORED AS ZRECORD LOCATION 'path'` and
//!   `COPY (query) TO 'path' STORED AS ZRECORD OPTIONS (codec 'zstd', level '3', data_shards '4')`.
//! - Table functions `gather('t', [ids])`, `zrecord_info('t')` and
//!   `loader('t', batch_size, mode, seed [, steps])`.
//!
//! ```no_run
//! # async fn demo() -> datafusion::error::Result<()> {
//! use zrecord::query::{zrecord_context, SessionContextExt};
//! let ctx = zrecord_context();
//! ctx.register_zrecord("train", "/data/train")?;
//! let rows = ctx.sql("SELECT _id, label FROM train WHERE _id IN (3, 1, 4)").await?.collect().await?;
//! # Ok(()) }
//! ```

/// The `ExecutionPlan` methods shared by the leaf operators here (no children, no expressions,
/// properties computed once in `self.properties`).
macro_rules! leaf_exec_methods {
    () => {
        fn properties(&self) -> &Arc<PlanProperties> {
            &self.properties
        }

        fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
            vec![]
        }

        fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>) -> DfResult<TreeNodeRecursion> {
            Ok(TreeNodeRecursion::Continue)
        }

        fn replace_children(self: Arc<Self>, _: Vec<Arc<dyn ExecutionPlan>>, _: ReplaceChildrenOptions) -> DfResult<Arc<dyn ExecutionPlan>> {
            Ok(self)
        }

        fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> DfResult<Arc<dyn ExecutionPlan>> {
            self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
        }
    };
}

/// The `ExecutionPlan` methods shared by the one-input operators here (the input in
/// `self.input`, no expressions, properties computed once in `self.properties`); the operator
/// implements `replace_children`.
macro_rules! unary_exec_methods {
    () => {
        fn properties(&self) -> &Arc<PlanProperties> {
            &self.properties
        }

        fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
            vec![&self.input]
        }

        fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>) -> DfResult<TreeNodeRecursion> {
            Ok(TreeNodeRecursion::Continue)
        }

        fn benefits_from_input_partitioning(&self) -> Vec<bool> {
            vec![false]
        }

        fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> DfResult<Arc<dyn ExecutionPlan>> {
            self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
        }
    };
}

/// Dataset roots (moved to the storage layer; re-exported here for existing callers).
pub mod dataset {
    pub use crate::arrow::DatasetWriter;
    pub use crate::store::dataset::*;
}
#[cfg(feature = "ballista")]
pub mod ballista;
pub mod cache;
mod errors;
pub(crate) mod functions;
pub mod ids;
mod parts;
mod prepared;
mod rules;
mod sink;
#[cfg(feature = "text")]
pub(crate) mod text;
pub(crate) mod table;
#[cfg(feature = "zarr")]
pub mod zarr;

use std::sync::Arc;

use datafusion::catalog::{DynamicFileCatalog, TableProvider, UrlTableFactory};
use datafusion::datasource::dynamic_file::DynamicListTableFactory;
use datafusion::error::DataFusionError;
use datafusion::optimizer::{Analyzer, AnalyzerRule};
use datafusion_session::SessionStore;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

pub use dataset::{Dataset, DatasetWriter, Stream};
pub use cache::PlanCache;
pub use parts::{PartsTarget, ZrecordCommitExec, ZrecordPartsExec};
pub use prepared::{id_list, PreparedQuery};
pub use functions::{info_batch, GatherFunction, InfoFunction, LoaderExec, LoaderFunction, LoaderTable};
pub use rules::UnsignedLiterals;
pub use sink::{plan_columns, writer_options, CopyProgress, ZrecordFormat, ZrecordFormatFactory, ZrecordTableFactory};
pub use table::{Selection, ZrecordScanExec, ZrecordTable, ID_COLUMN};

/// A zrecord error as a DataFusion error (kept whole, so callers can downcast it back); the
/// same as `DataFusionError::from`, for `map_err` where `?` cannot convert.
pub fn df_err(e: crate::Error) -> DataFusionError {
    e.into()
}

/// The zrecord error inside a DataFusion error, if that is what it is.
pub fn zrecord_error(e: &DataFusionError) -> Option<&crate::Error> {
    errors::zrecord_error_in(e)
}

/// Add zrecord's table factory, file format and table functions to a context.
pub fn register_zrecord_extension(ctx: &SessionContext) -> datafusion::error::Result<()> {
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        state.table_factories_mut().insert("ZRECORD".into(), Arc::new(ZrecordTableFactory));
        state.table_factories_mut().insert("ZREC".into(), Arc::new(ZrecordTableFactory));
        state.register_file_format(Arc::new(ZrecordFormatFactory::new("zrecord")), true)?;
        state.register_file_format(Arc::new(ZrecordFormatFactory::new("zrec")), true)?;
    }
    ctx.register_udtf("gather", Arc::new(GatherFunction));
    ctx.register_udtf("zrecord_info", Arc::new(InfoFunction));
    ctx.register_udtf("loader", Arc::new(LoaderFunction));
    #[cfg(feature = "zarr")]
    ctx.register_udtf("zarr_crops", Arc::new(zarr::ZarrCropsFunction));
    #[cfg(feature = "text")]
    for f in text::text_udfs() {
        ctx.register_udf(f);
    }
    Ok(())
}

/// `FROM '<path>'`: stores and dataset roots open as zrecord tables, anything else goes to
/// DataFusion's file tables (`FROM 'train.parquet'`, CSV, JSON, Arrow IPC).
#[derive(Debug)]
struct UrlTables {
    files: Arc<DynamicListTableFactory>,
}

#[async_trait::async_trait]
impl UrlTableFactory for UrlTables {
    async fn try_new(&self, url: &str) -> datafusion::error::Result<Option<Arc<dyn TableProvider>>> {
        let p = std::path::Path::new(url.strip_prefix("file://").unwrap_or(url));
        if crate::io::is_url(p) {
            // A store or dataset root on an object store opens as a zrecord table; any other
            // object (Parquet, CSV, ...) goes to DataFusion's file tables through the same
            // connected object store, registered for its bucket.
            let owned = url.to_string();
            let found = tokio::task::spawn_blocking(move || -> crate::Result<Option<ZrecordTable>> {
                let remote = crate::io::resolve(&owned, crate::io::ReadMode::Mmap)?;
                if remote.exists(crate::store::format::MANIFEST)? || remote.exists(dataset::DATASET_FILE)? {
                    return Ok(Some(ZrecordTable::open(&owned)?));
                }
                Ok(None)
            })
            .await
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))??;
            if let Some(t) = found {
                return Ok(Some(Arc::new(t)));
            }
            #[cfg(feature = "remote")]
            if let Some(session) = self.files.session_store().get_session().upgrade() {
                if let Ok((root, store)) = crate::io::object::object_store_for(url) {
                    if let Ok(u) = url::Url::parse(&root) {
                        session.read().runtime_env().register_object_store(&u, store);
                    }
                }
            }
            return self.files.try_new(url).await;
        }
        if p.join(crate::store::format::MANIFEST).exists() || p.join(dataset::DATASET_FILE).exists() {
            return Ok(Some(Arc::new(ZrecordTable::open(p)?)));
        }
        self.files.try_new(url).await
    }
}

/// A new context with DataFusion's defaults plus the zrecord extension.
pub fn zrecord_context() -> SessionContext {
    zrecord_context_with_config(SessionConfig::new())
}

/// [`zrecord_context`] with a given configuration.
pub fn zrecord_context_with_config(config: SessionConfig) -> SessionContext {
    // Building a fresh state and registering into it cannot fail.
    zrecord_context_finished(config, Ok).unwrap_or_else(|_| SessionContext::new())
}

/// A zrecord context whose state `finish` completes before the context is made (Ballista's
/// client planner goes in there).
pub(crate) fn zrecord_context_finished(
    config: SessionConfig,
    finish: impl FnOnce(datafusion::execution::SessionState) -> datafusion::error::Result<datafusion::execution::SessionState>,
) -> datafusion::error::Result<SessionContext> {
    // Typing `_id` literals as UInt64 first saves the Decimal128 coercion of every literal.
    let mut analyzer: Vec<Arc<dyn AnalyzerRule + Send + Sync>> = vec![Arc::new(UnsignedLiterals), Arc::new(sink::CopyOptionsInFormat)];
    analyzer.extend(Analyzer::new().rules);
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_analyzer_rules(analyzer)
        .with_physical_optimizer_rule(Arc::new(parts::KeepPartOrder))
        .build();
    // URL tables (as `SessionContext::enable_url_table`, with zrecord paths first).
    let files = Arc::new(DynamicListTableFactory::new(SessionStore::new()));
    let catalogs = Arc::new(DynamicFileCatalog::new(state.catalog_list().clone(), Arc::new(UrlTables { files: files.clone() })));
    let state = finish(SessionStateBuilder::new_from_existing(state).with_catalog_list(catalogs).build())?;
    let ctx = SessionContext::new_with_state(state);
    files.session_store().with_state(ctx.state_weak_ref());
    register_zrecord_extension(&ctx)?;
    Ok(ctx)
}

/// `ctx.register_zrecord(name, path)`.
pub trait SessionContextExt {
    /// Register the store or dataset root at `path` as table `name`.
    fn register_zrecord(&self, name: &str, path: impl AsRef<std::path::Path>) -> datafusion::error::Result<()>;
}

impl SessionContextExt for SessionContext {
    fn register_zrecord(&self, name: &str, path: impl AsRef<std::path::Path>) -> datafusion::error::Result<()> {
        let table = ZrecordTable::open(path)?;
        self.register_table(name, Arc::new(table))?;
        Ok(())
    }
}
