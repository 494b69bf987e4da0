//! Loading: a stateless sampler (sequential, iid, cyclic permutations without a dataset-sized
//! array, O(1) seek) and a loader that gathers aligned named streams (any
//! [`RecordSource`](crate::store::RecordSource), through [`SourceView`]s) across placement
//! positions with worker threads, a bounded prefetch window, in-order delivery and exact resume;
//! epoch plans ([`EpochPlan`]) deal an epoch to ranks x workers and resume it on another layout.

mod arrow;
mod mixture;
mod pack;
mod pipeline;
mod plan;
mod sampler;

pub use arrow::{loader_schema, position_record_batch, LoaderBatchReader, STEP_COLUMN};
pub use pipeline::{IdSource, Loader, LoaderHandle, LoaderOptions, PositionBatch, TransformGuard, MAX_PREFETCH, MAX_WORKERS};
pub use mixture::Mixture;
pub use pack::{PackOptions, PackState, Packed, Packer, MAX_LOOKAHEAD, MAX_PACKED_TOKENS};
pub use plan::{Deal, EpochPlan, Position, ShardStream, MAX_EXTRA, MAX_SHARDS};
pub use sampler::{Mode, Sampler, DEFAULT_BLOCK, DEFAULT_WINDOW, MAX_BATCH_SIZE};

pub use crate::store::{Batch, SourceView};
