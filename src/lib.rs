//! # zrecord
//!
//! Typed, immutable, ordered record stores for ML training data, with zero-copy gather into
//! pooled memory that leaves as DLPack tensors or Arrow arrays.
//!
//! Layers (each depends only on those below): [`dtype`] and [`error`]; [`memory`] (allocator,
//! tensors, DLPack); [`io`] (the one door to bytes: paths and URLs, local files, object stores,
//! atomic publish); [`store`] (the container: format, codecs, writers, readers, gather, the
//! [`store::RecordSource`] contract, datasets, staging);
//! [`arrow`] (Arrow-native tensor types, the dataset [`arrow::Scanner`] and writer);
//! [`loader`] (sampler and loader over record sources); [`query`] (DataFusion: tables,
//! COPY TO, gather / loader table functions; feature `sql`). Siblings of `store`: `zarr`,
//! `text` and `dist` (features of the same names). `--no-default-features` builds the core:
//! dtype, error, memory, io (local files), store, arrow, loader, convert.
#![warn(missing_docs)]
// Every unsafe block says why it is sound; every unsafe fn says what its caller must uphold.
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

// Store files hold little-endian values read in place through mmap, and string views are
// read as their in-memory bytes: big-endian targets are not supported.
#[cfg(target_endian = "big")]
compile_error!("zrecord supports little-endian targets only");

pub mod arrow;
#[cfg(feature = "cli")]
pub mod cli;
pub mod convert;
#[cfg(feature = "dist")]
pub mod dist;
pub mod dtype;
pub mod error;
pub mod io;
pub mod loader;
pub mod memory;
#[cfg(feature = "sql")]
pub mod query;
pub mod rng;
pub mod demo;
pub mod store;
#[cfg(feature = "text")]
pub mod text;
#[cfg(feature = "zarr")]
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
        train_dict, Batch, Codec, Dataset, DenseStore, DenseView, DenseWriter, Ids, Layout, Logical, RaggedStore, RaggedView, RecordType,
        RaggedWriter, ReadOptions, RecordSource, SourceView, Store, WriterOptions,
    };
}
