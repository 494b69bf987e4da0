//! `CropSource`: a list of crops (or seeded random crops) over one Zarr array, as a record
//! source. Record `i` is crop `i`; the loader, the scanner, SQL and Python take it like a store.

use std::path::Path;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Allocator;
use crate::rng::SplitMix64;
use crate::store::{Batch, Ids, Layout, ReadOptions, RecordSource};
use crate::zarr::assemble::Assembler;
use crate::zarr::meta::ArrayMeta;
use crate::zarr::select::Query;

/// Which crops a [`CropSource`] serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Crops {
    /// Explicit AABBs (all of one extent); may reach past the array (filled).
    List(Vec<Vec<(i64, i64)>>),
    /// `count` crops of `shape` placed uniformly inside the array; crop `i` depends only on
    /// `(seed, i)`.
    Random {
        /// Crop extent per axis.
        shape: Vec<u64>,
        /// Number of crops (records).
        count: u64,
        /// Seed.
        seed: u64,
    },
}

/// Crops of one array as records.
#[derive(Debug)]
pub struct CropSource {
    assembler: Arc<Assembler>,
    meta: Arc<ArrayMeta>,
    level: Option<usize>,
    crops: Crops,
    dtype: DType,
    shape: Vec<usize>,
}

impl CropSource {
    /// Crops of the array at `uri` (NGFF `level` for a multiscale group), cast to `dtype`
    /// (the array's type when `None`).
    pub fn new(assembler: Arc<Assembler>, uri: &str, level: Option<usize>, crops: Crops, dtype: Option<DType>) -> Result<CropSource> {
        let meta = assembler.array(uri, level)?;
        let nd = meta.shape.len();
        let shape: Vec<usize> = match &crops {
            Crops::List(list) => {
                let first = list.first().ok_or_else(|| Error::invalid("crops", "an empty crop list"))?;
                let ext = |c: &Vec<(i64, i64)>| -> Result<Vec<usize>> {
                    if c.len() != nd {
                        return Err(Error::invalid("crops", format!("a crop of {} axes for a {nd}-d array", c.len())));
                    }
                    c.iter().map(|&(a, b)| usize::try_from(b.saturating_sub(a)).ok().filter(|_| b > a).ok_or_else(|| Error::invalid("crops", format!("range ({a}, {b}) is empty or reversed")))).collect()
                };
                let s0 = ext(first)?;
                for (i, c) in list.iter().enumerate() {
                    if ext(c)? != s0 {
                        return Err(Error::invalid("crops", format!("crop {i} has extent {:?}; every crop must be {s0:?}", ext(c)?)));
                    }
                }
                s0
            }
            Crops::Random { shape, count, .. } => {
                if shape.len() != nd {
                    return Err(Error::invalid("shape", format!("{shape:?} for a {nd}-d array")));
                }
                if *count == 0 {
                    return Err(Error::invalid("count", "must be positive"));
                }
                for (d, (&c, &s)) in shape.iter().zip(&meta.shape).enumerate() {
                    if c == 0 || c > s {
                        return Err(Error::invalid("shape", format!("axis {d}: crop {c} does not fit the array's {s}")));
                    }
                }
                shape.iter().map(|&c| c as usize).collect()
            }
        };
        let dtype = dtype.unwrap_or(meta.dtype);
        crate::zarr::cast::kernel(meta.dtype, dtype)?;
        Ok(CropSource { assembler, meta, level, crops, dtype, shape })
    }

    /// Crop `i`'s AABB.
    pub fn crop(&self, i: u64) -> Vec<(i64, i64)> {
        match &self.crops {
            Crops::List(l) => l[i as usize].clone(),
            Crops::Random { shape, seed, .. } => {
                // A generator per crop, keyed by (seed, i): crop i never depends on the others.
                let mut r = SplitMix64::new(seed ^ SplitMix64::new(i).next_u64());
                shape
                    .iter()
                    .zip(&self.meta.shape)
                    .map(|(&c, &s)| {
                        let o = r.below(s - c + 1) as i64;
                        (o, o + c as i64)
                    })
                    .collect()
            }
        }
    }

    /// The crop shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The array.
    pub fn array(&self) -> &Arc<ArrayMeta> {
        &self.meta
    }
}

impl RecordSource for CropSource {
    fn name(&self) -> String {
        format!("zarr crops of '{}'", self.meta.uri)
    }

    fn len(&self) -> u64 {
        match &self.crops {
            Crops::List(l) => l.len() as u64,
            Crops::Random { count, .. } => *count,
        }
    }

    fn record_type(&self) -> crate::store::RecordType {
        crate::store::RecordType { dtype: self.dtype, layout: Layout::Dense { item_shape: self.shape.clone() }, logical: crate::store::Logical::Tensor }
    }

    fn gather(&self, ids: Ids<'_>, allocator: &Allocator, _options: &ReadOptions) -> Result<Batch> {
        ids.validate(self.len(), Path::new(&self.meta.uri))?;
        let queries: Vec<Query> = (0..ids.len())
            .map(|k| {
                let mut q = Query::crop(self.meta.uri.clone(), &self.crop(ids.get(k)));
                q.level = self.level;
                q
            })
            .collect();
        if queries.is_empty() {
            let mut shape = vec![0];
            shape.extend_from_slice(&self.shape);
            return Ok(Batch::Dense(crate::memory::Tensor::from_slice::<u8>(allocator, &[], &[0])?.reinterpret(self.dtype, shape)?));
        }
        Ok(Batch::Dense(self.assembler.gather(&queries, Some(self.dtype), Some(&self.shape), allocator)?))
    }
}
