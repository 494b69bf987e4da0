//! Placement memory: a pooled CPU allocator, the tensors that own its regions, and their
//! DLPack export. Every gathered batch owns one exclusive [`Allocation`]; it returns to its
//! allocator's idle pool when the last consumer (tensor, DLPack capsule, Arrow buffer) drops it.

pub mod dlpack;
mod pool;
mod tensor;

pub use pool::{Allocation, Allocator, AllocatorStats, DEFAULT_POOL_SIZE_BYTES};
#[cfg(any(feature = "dist", feature = "zarr"))]
pub(crate) use tensor::numel;
pub(crate) use tensor::RaggedLayout;
pub use tensor::{PackedRagged, RaggedBatch, RaggedInput, Tensor, TensorView, ValidRagged};
