//! # zrecord
//!
//! Typed, immutable, ordered record stores for ML training data, with zero-copy gather into
//! pooled memory that leaves as DLPack tensors or Arrow arrays.
//!
//! Layers (each depends only on those below): [`dtype`] and [`error`]; [`memory`] (allocator,
//! tensors, DLPack); [`store`] (the container: format, codecs, byte sources, writers, readers,
//! gather, the [`store::RecordSource`] contract, datasets, the shared publish step);
//! [`arrow`] (Arrow-native tensor types, the dataset [`arrow::Scanner`] and writer);
//! [`loader`] (sampler and loader over record sources); [`query`] (DataFusion: tables,
//! COPY TO, gather / loader table functions).
#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

// Store files hold little-endian values read in place through mmap, and string views are
// read as their in-memory bytes: big-endian targets are not supported.
#[cfg(target_endian = "big")]
compile_error!("zrecord supports little-endian targets only");

pub mod arrow;
pub mod convert;
pub mod dist;
pub mod dtype;
pub mod loader;
pub mod error;
pub mod memory;
pub mod query;
pub mod sample;
pub mod store;
pub mod text;
pub mod zarr;
#[cfg(feature = "python")]
mod python;

pub use dtype::DType;
pub use error::{Error, Result};

/// The common imports.
pub mod prelude {
    pub use crate::dtype::DType;
    pub use crate::error::{Error, Result};
    pub use crate::memory::{Allocator, PackedRagged, RaggedBatch, RaggedInput, Tensor, TensorView};
    pub use crate::store::{
        train_dict, Batch, Codec, Dataset, DenseStore, DenseView, DenseWriter, Ids, Layout, Logical, RaggedStore, RaggedView,
        RaggedWriter, ReadOptions, RecordSource, SourceView, Store, WriterOptions,
    };
}
