//! Zarr batch assembly: crops and index queries over Zarr v3 / v2 arrays (sharded or not, NGFF
//! multiscale images) assembled into pooled tensors.
//!
//! - [`meta`]: open an array from a URI (metadata and codec chains through `zarrs`), NGFF levels.
//! - [`select`]: `Query` = per-axis crop ranges (out-of-bounds filled), NumPy slices or index
//!   lists.
//! - [`assemble`]: the [`Assembler`] plans a batch (every chunk read once, adjacent inner chunks of
//!   a shard merged into one read, metadata and shard indexes in bounded LRU caches), decodes on
//!   a bounded pool and writes each sample's voxels straight into its output slot, cast.
//! - [`pipeline`]: the streaming [`Pipeline`] (lazy pushes, bounded slots, sticky errors).
//! - [`source`]: [`CropSource`], crops as a record source (Loader, SQL, Python views).
//!
//! ```no_run
//! use zrecord::zarr::{Assembler, CacheLimits, Limits, Query};
//! use zrecord::memory::Allocator;
//! let asm = Assembler::new(Limits::default(), CacheLimits::default()).unwrap();
//! let q = Query::crop("/data/image.zarr/0", &[(0, 16), (0, 64), (0, 64)]);
//! let batch = asm.gather(&[q], None, None, &Allocator::default()).unwrap();
//! assert_eq!(batch.shape(), &[1, 16, 64, 64]);
//! ```

pub(crate) mod cast;
pub mod assemble;
pub mod meta;
pub mod pipeline;
pub mod select;
pub mod source;

pub use assemble::{Assembler, CacheLimits, Limits, Stats};
pub use meta::ArrayMeta;
pub use pipeline::{BatchSpec, Pipeline, PipelineBatch, QueryIter, QueueLimits};
pub use select::{AxisSelection, Query};
pub use source::{CropSource, Crops};
