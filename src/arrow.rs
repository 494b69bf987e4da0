//! Arrow-native tensor types, zero-copy: a dense batch is an `arrow.fixed_shape_tensor` column
//! (FixedSizeList storage), a 1-D ragged batch a `List<T>` column whose offsets are
//! `cu_seqlens`, and an N-D ragged batch an `arrow.variable_shape_tensor` column
//! (Struct<data: List<T>, shape: FixedSizeList<int32, ndim>>). Buffers point into the batch's
//! pooled allocation, which stays alive while any Arrow array refers to it.

mod convert;
mod dataset_writer;
mod scan;
mod tensor;

pub use convert::{column_from_ragged, Logical, StreamWriter};
pub use dataset_writer::DatasetWriter;
pub use scan::{batch_column, record_bytes_hint, stream_field, ScanColumn, ScanReader, Scanner, BATCH_BYTES, ID_COLUMN};
pub use tensor::{dense_to_arrow, element_field, ragged_to_arrow, tensor_buffer, to_record_batch};
pub(crate) use tensor::{fixed_shape_column, variable_shape_column};

/// `ARROW:extension:name`.
pub const EXTENSION_NAME_KEY: &str = "ARROW:extension:name";
/// `ARROW:extension:metadata`.
pub const EXTENSION_METADATA_KEY: &str = "ARROW:extension:metadata";
/// Canonical fixed-shape tensor extension.
pub const FIXED_SHAPE_TENSOR: &str = "arrow.fixed_shape_tensor";
/// Canonical variable-shape tensor extension.
pub const VARIABLE_SHAPE_TENSOR: &str = "arrow.variable_shape_tensor";
