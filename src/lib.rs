//! # zrecord
//!
//! Typed, immutable, ordered record stores for ML training data, with zero-copy gather into
//! pooled memory that leaves as DLPack tensors or Arrow arrays.
//!
//! Layers (each depends only on those below): [`dtype`] and [`error`]; [`store`] (the
//! container: format, codecs, writers, readers, gather); [`memory`] (allocator, tensors,
//! DLPack); [`arrow`] (Arrow-native tensor types); [`loader`] (sampler and loader);
//! [`query`] (DataFusion: tables, COPY TO, gather / loader table functions).
#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod arrow;
pub mod dtype;
pub mod loader;
pub mod error;
pub mod memory;
pub mod query;
pub mod sample;
pub mod store;
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
        train_dict, Codec, DenseStore, DenseView, DenseWriter, Ids, RaggedStore, RaggedView, RaggedWriter, Store,
        WriterOptions,
    };
}
