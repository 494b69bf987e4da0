//! Loading: a stateless sampler (sequential, iid, cyclic permutations without a dataset-sized
//! array, O(1) seek) and a loader that gathers aligned named streams across placement views
//! with worker threads, a bounded prefetch window, in-order delivery and exact resume.

mod arrow;
mod pipeline;
mod sampler;

pub use arrow::LoaderBatchReader;
pub(crate) use arrow::value_column;
pub use pipeline::{IdSource, Loader, LoaderOptions, Shard, StreamView, Value};


pub use sampler::{Mode, Sampler};
