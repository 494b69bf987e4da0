//! `zarr_crops('uri', [d0, d1, ...], count [, seed [, level]])`: seeded random crops of a Zarr
//! array as a table (`_id`, `crop` as `arrow.fixed_shape_tensor`), like any zrecord table.

use std::sync::Arc;

use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl};
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::datasource::TableProvider;

use crate::query::df_err;
use crate::query::functions::{arg_err, int_arg, literal, string_arg};
use crate::query::table::ZrecordTable;
use crate::store::{Dataset, Stream};
use crate::zarr::assemble::shared_assembler;
use crate::zarr::source::{CropSource, Crops};

/// The `zarr_crops` table function.
#[derive(Debug, Default)]
pub struct ZarrCropsFunction;

impl TableFunctionImpl for ZarrCropsFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        const F: &str = "zarr_crops";
        let exprs = args.exprs();
        if !(3..=5).contains(&exprs.len()) {
            return Err(arg_err(F, "expects ('uri', [crop shape], count [, seed [, level]])"));
        }
        let uri = string_arg(F, exprs, 0, "uri")?;
        let shape: Vec<u64> = match literal(F, exprs, 1, "crop shape")? {
            ScalarValue::List(l) => {
                let a = datafusion::arrow::compute::cast(l.values(), &datafusion::arrow::datatypes::DataType::Int64)?;
                let a = a.as_any().downcast_ref::<arrow_array::Int64Array>().ok_or_else(|| arg_err(F, "crop shape must be integers"))?;
                a.values().iter().map(|&v| u64::try_from(v).map_err(|_| arg_err(F, format!("crop extent {v} is negative")))).collect::<DfResult<_>>()?
            }
            v => return Err(arg_err(F, format!("crop shape must be a list like [16, 64, 64], got {v}"))),
        };
        let count = u64::try_from(int_arg(F, exprs, 2, "count")?).map_err(|_| arg_err(F, "count must be positive"))?;
        let seed = if exprs.len() > 3 { int_arg(F, exprs, 3, "seed")? as u64 } else { 0 };
        let level = if exprs.len() > 4 { Some(usize::try_from(int_arg(F, exprs, 4, "level")?).map_err(|_| arg_err(F, "level must be >= 0"))?) } else { None };
        let src = CropSource::new(shared_assembler(), &uri, level, Crops::Random { shape, count, seed }, None).map_err(df_err)?;
        let ds = Dataset::from_streams(uri.clone().into(), vec![Stream::new("crop", Arc::new(src))]).map_err(df_err)?;
        Ok(Arc::new(ZrecordTable::new(ds).map_err(df_err)?))
    }
}
