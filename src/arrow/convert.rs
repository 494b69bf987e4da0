//! Arrow columns <-> store layouts.
//!
//! Which store an Arrow column becomes ([`RecordType::of_field`], decided from the schema alone
//! so that a bad column fails at plan time), how its arrays are appended to that store without
//! copying record bytes ([`StreamWriter::append_array`]), and how gathered records leave as the
//! matching Arrow column ([`column_from_value`]).
//!
//! | Arrow column | store |
//! |---|---|
//! | primitive (incl. bool, float16, bf16 / fp8 extensions) | Dense, item shape `()` |
//! | `FixedSizeList<T, n>` (nested lists give N-D shapes) | Dense `[n]` / `[n, m, ...]` |
//! | `arrow.fixed_shape_tensor` | Dense of its shape |
//! | `List<T>` / `LargeList<T>` | Ragged, ndim 1 |
//! | `arrow.variable_shape_tensor` | Ragged, ndim of its shape field |
//! | `Utf8` / `LargeUtf8` / `Utf8View` | Ragged uint8, read back as `Utf8View` |
//! | `Binary` / `LargeBinary` / `BinaryView` | Ragged uint8, read back as `Binary` |

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BinaryArray, StringViewArray};
use arrow_buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field, FieldRef};

use crate::arrow::tensor::tensor_buffer;
use crate::arrow::{dense_to_arrow, ragged_to_arrow, EXTENSION_METADATA_KEY, EXTENSION_NAME_KEY, FIXED_SHAPE_TENSOR, VARIABLE_SHAPE_TENSOR};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{RaggedBatch, RaggedInput, Tensor, TensorView};
use crate::store::{DenseWriter, RaggedWriter};

pub use crate::store::Logical;
use crate::store::{Layout, RecordType};

fn unsupported(column: &str, dt: &DataType, why: &str) -> Error {
    Error::invalid(
        "column",
        format!(
            "column '{column}' has Arrow type {dt}, which has no zrecord layout ({why}); supported: primitive, \
             FixedSizeList / arrow.fixed_shape_tensor (Dense), List / LargeList / arrow.variable_shape_tensor \
             (Ragged), Utf8 / Binary variants (Ragged uint8)"
        ),
    )
}

fn extension_name(field: &Field) -> Option<&str> {
    field.metadata().get(EXTENSION_NAME_KEY).map(|s| s.as_str())
}

/// The element dtype of a leaf field (storage type plus element extension such as bf16).
fn element_dtype(column: &str, field: &Field) -> Result<DType> {
    match field.data_type() {
        DataType::Boolean => Ok(DType::Bool),
        dt if dt.is_primitive() || matches!(dt, DataType::FixedSizeBinary(8 | 16)) => {
            DType::from_arrow(dt, extension_name(field)).map_err(|_| unsupported(column, dt, "no matching element type"))
        }
        dt => Err(unsupported(column, dt, "not a primitive element")),
    }
}

/// Parsed `arrow.fixed_shape_tensor` metadata. Accepts the spec's `permutation` and the
/// `permutations` key some writers (arrow-rs 59) emit; a non-identity permutation is refused.
fn tensor_shape_metadata(column: &str, meta: &str) -> Result<Vec<usize>> {
    let v: serde_json::Value = serde_json::from_str(meta)
        .map_err(|e| Error::invalid("column", format!("column '{column}': bad arrow.fixed_shape_tensor metadata: {e}")))?;
    let shape = v
        .get("shape")
        .and_then(|s| s.as_array())
        .ok_or_else(|| Error::invalid("column", format!("column '{column}': arrow.fixed_shape_tensor metadata has no shape")))?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| Error::invalid("column", format!("column '{column}': arrow.fixed_shape_tensor shape is not a list of sizes")))?;
    check_identity_permutation(column, &v, shape.len())?;
    Ok(shape)
}

fn check_identity_permutation(column: &str, meta: &serde_json::Value, ndim: usize) -> Result<()> {
    for key in ["permutation", "permutations"] {
        if let Some(p) = meta.get(key).filter(|p| !p.is_null()) {
            let p: Option<Vec<u64>> = p.as_array().and_then(|a| a.iter().map(|x| x.as_u64()).collect());
            let identity: Vec<u64> = (0..ndim as u64).collect();
            if p.as_deref() != Some(&identity[..]) {
                return Err(Error::invalid(
                    "column",
                    format!("column '{column}': permuted tensors ({key} {meta}) are not supported; materialise the permutation first"),
                ));
            }
        }
    }
    Ok(())
}

/// Arrow fields as record types: which store an Arrow column is written to, and the field a
/// record type reads back as.
impl RecordType {
    /// The record type of an Arrow field, or a clear error naming the column and its type.
    pub fn of_field(field: &Field) -> Result<RecordType> {
        let name = field.name();
        let dt = field.data_type();
        match extension_name(field) {
            Some(FIXED_SHAPE_TENSOR) => {
                let DataType::FixedSizeList(child, size) = dt else {
                    return Err(unsupported(name, dt, "arrow.fixed_shape_tensor needs FixedSizeList storage"));
                };
                let meta = field.metadata().get(EXTENSION_METADATA_KEY).map(|s| s.as_str()).unwrap_or("{}");
                let shape = tensor_shape_metadata(name, meta)?;
                let numel: usize = shape.iter().product();
                if numel != *size as usize {
                    return Err(Error::invalid(
                        "column",
                        format!("column '{name}': fixed_shape_tensor shape {shape:?} holds {numel} elements but its list size is {size}"),
                    ));
                }
                return Ok(RecordType::dense(element_dtype(name, child)?, shape));
            }
            Some(VARIABLE_SHAPE_TENSOR) => {
                let (dtype, ndim) = variable_shape_storage(name, dt)?;
                if let Some(meta) = field.metadata().get(EXTENSION_METADATA_KEY) {
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(meta) {
                        check_identity_permutation(name, &v, ndim)?;
                    }
                }
                return Ok(RecordType::ragged(dtype, ndim));
            }
            _ => {}
        }
        match dt {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                Ok(RecordType::ragged(DType::UInt8, 1).with_logical(Logical::Utf8))
            }
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
                Ok(RecordType::ragged(DType::UInt8, 1).with_logical(Logical::Binary))
            }
            DataType::FixedSizeList(_, _) => {
                let mut shape = Vec::new();
                let mut cur: &Field = field;
                while let DataType::FixedSizeList(child, size) = cur.data_type() {
                    if extension_name(child) == Some(FIXED_SHAPE_TENSOR) {
                        return Err(unsupported(name, dt, "a tensor extension nested in a list"));
                    }
                    shape.push(*size as usize);
                    cur = child;
                }
                Ok(RecordType::dense(element_dtype(name, cur)?, shape))
            }
            DataType::List(child) | DataType::LargeList(child) => {
                if matches!(child.data_type(), DataType::List(_) | DataType::LargeList(_)) {
                    return Err(unsupported(
                        name,
                        dt,
                        "nested variable-length lists: pad the inner lists to one length (FixedSizeList, HF List(..., length=n) or \
                         ArrayND) or flatten each row to {values: List, shape: FixedSizeList<uint64, ndim>}",
                    ));
                }
                Ok(RecordType::ragged(element_dtype(name, child)?, 1))
            }
            // The plain struct `{values: List<T>, shape: FixedSizeList<uint64, ndim>}` (no
            // extension metadata needed): an N-D ragged tensor per row.
            DataType::Struct(fields) if fields.len() == 2 => {
                let (dtype, ndim) = variable_shape_storage(name, dt)?;
                Ok(RecordType::ragged(dtype, ndim))
            }
            _ => match element_dtype(name, field) {
                Ok(dtype) => Ok(RecordType::dense(dtype, vec![])),
                Err(_) => Err(unsupported(name, dt, "not a tensor, list or string type")),
            },
        }
    }

    /// The Arrow field this layout reads back as.
    pub fn field(&self, name: &str) -> Result<FieldRef> {
        let alloc = crate::memory::Allocator::cpu(0);
        let dtype = &self.dtype;
        Ok(match &self.layout {
            Layout::Dense { item_shape } => {
                let mut shape = vec![0];
                shape.extend_from_slice(item_shape);
                let t = Tensor::from_slice::<u8>(&alloc, &[], &[0])?.reinterpret(*dtype, shape)?;
                dense_to_arrow(name, &t)?.0
            }
            Layout::Ragged { ndim } => {
                let b = RaggedBatch::copy_from_input(&alloc, &empty_ragged_input(*dtype, *ndim))?;
                column_from_ragged(name, &b, self.logical)?.0
            }
        })
    }
}

fn empty_ragged_input(dtype: DType, ndim: usize) -> RaggedInput<'static> {
    static ZERO: [i32; 1] = [0];
    RaggedInput::new(
        TensorView::new(&[], dtype, vec![0]),
        TensorView::from_slice(&ZERO[..], &[1]),
        TensorView::new(&[], DType::UInt64, vec![0, ndim]),
    )
}

/// `(dtype, ndim)` of a variable_shape_tensor storage struct `{data: List<T>, shape:
/// FixedSizeList<int32 | int64 | uint32 | uint64, ndim>}` (field `values` is accepted for `data`).
fn variable_shape_storage(column: &str, dt: &DataType) -> Result<(DType, usize)> {
    let DataType::Struct(fields) = dt else {
        return Err(unsupported(column, dt, "arrow.variable_shape_tensor needs Struct storage"));
    };
    let data = fields.iter().find(|f| f.name() == "data" || f.name() == "values");
    let shape = fields.iter().find(|f| f.name() == "shape");
    let (Some(data), Some(shape)) = (data, shape) else {
        return Err(unsupported(column, dt, "variable_shape_tensor storage needs 'data' and 'shape' fields"));
    };
    let (DataType::List(child) | DataType::LargeList(child)) = data.data_type() else {
        return Err(unsupported(column, dt, "variable_shape_tensor 'data' must be a List"));
    };
    let DataType::FixedSizeList(sc, ndim) = shape.data_type() else {
        return Err(unsupported(column, dt, "variable_shape_tensor 'shape' must be a FixedSizeList"));
    };
    if !matches!(sc.data_type(), DataType::Int32 | DataType::Int64 | DataType::UInt32 | DataType::UInt64) {
        return Err(unsupported(column, dt, "variable_shape_tensor 'shape' must hold integers"));
    }
    if *ndim < 1 {
        return Err(unsupported(column, dt, "variable_shape_tensor needs ndim >= 1"));
    }
    Ok((element_dtype(column, child)?, *ndim as usize))
}

/// A stream writer of either kind.
pub enum StreamWriter {
    /// Fixed-shape records.
    Dense(DenseWriter),
    /// Variable-shape records.
    Ragged(RaggedWriter),
}

fn nulls_in(nulls: Option<&NullBuffer>, offset: usize, len: usize) -> usize {
    nulls.map(|n| n.slice(offset, len).null_count()).unwrap_or(0)
}

fn null_error(column: &str, row: u64) -> Error {
    Error::invalid("column", format!("column '{column}' has a null at row {row}; zrecord stores hold no nulls (filter or fill them first)"))
}

fn first_null(column: &str, a: &dyn Array, base: u64) -> Error {
    let row = (0..a.len()).find(|&i| a.is_null(i)).unwrap_or(0) as u64;
    null_error(column, base + row)
}

fn empty_error(column: &str, row: u64) -> Error {
    Error::invalid(
        "column",
        format!("column '{column}' row {row} is empty; ragged records must be nonempty (drop or pad empty values first, or write with allow_empty)"),
    )
}

/// The bytes of elements `[start, start + count)` of a flat primitive (or fixed-size binary)
/// array's data, with the data's own offset applied.
fn element_bytes(data: &ArrayData, dtype: DType, start: usize, count: usize) -> Result<&[u8]> {
    let size = dtype.size();
    let buf = data.buffers().first().ok_or_else(|| Error::invalid("column", "array has no value buffer"))?;
    let lo = (data.offset() + start) * size;
    let hi = lo + count * size;
    buf.as_slice().get(lo..hi).ok_or_else(|| Error::invalid("column", "array value buffer is shorter than its length"))
}

/// Boolean bits unpacked to one byte each.
fn unpack_bools(data: &ArrayData, start: usize, count: usize) -> Vec<u8> {
    let bools = arrow_array::BooleanArray::from(data.clone());
    (start..start + count).map(|i| bools.value(i) as u8).collect()
}

impl StreamWriter {
    /// A writer for records of `record_type` at `path`.
    pub fn create(path: &std::path::Path, record_type: &RecordType, options: crate::store::WriterOptions) -> Result<StreamWriter> {
        let (dtype, logical) = (&record_type.dtype, &record_type.logical);
        Ok(match &record_type.layout {
            // `allow_empty` is about ragged records (a dense record always has its one shape):
            // a dataset writer's option reaches its ragged columns only.
            Layout::Dense { item_shape } => StreamWriter::Dense(DenseWriter::create(path, *dtype, item_shape, options.allow_empty(false))?),
            Layout::Ragged { ndim } => {
                StreamWriter::Ragged(RaggedWriter::create(path, *dtype, *ndim, options.logical(*logical))?)
            }
        })
    }

    /// Records written so far.
    pub fn len(&self) -> u64 {
        match self {
            StreamWriter::Dense(w) => w.len(),
            StreamWriter::Ragged(w) => w.len(),
        }
    }

    /// True before the first record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Publish.
    pub fn finish(self) -> Result<std::path::PathBuf> {
        match self {
            StreamWriter::Dense(w) => w.finish(),
            StreamWriter::Ragged(w) => w.finish(),
        }
    }

    /// Append every row of `array` (column `column` of records `record_type`). Record bytes are read
    /// in place from the Arrow buffers; only offsets are rebased and shapes computed. Nulls and
    /// (for ragged) empty rows are refused with the column name and absolute row number.
    pub fn append_array(&mut self, column: &str, record_type: &RecordType, array: &dyn Array) -> Result<()> {
        let base = self.len();
        if array.is_empty() {
            return Ok(());
        }
        if array.logical_null_count() > 0 {
            return Err(first_null(column, array, base));
        }
        let dtype = &record_type.dtype;
        match (self, &record_type.layout) {
            (StreamWriter::Dense(w), Layout::Dense { item_shape }) => {
                let n = array.len();
                let per: usize = item_shape.iter().product();
                let mut data = array.to_data();
                let mut start = 0usize; // element index into `data`
                let mut count = n;
                // Descend the FixedSizeList levels (one for fixed_shape_tensor, one per dim for
                // nested lists): the element range scales by each list size.
                while let DataType::FixedSizeList(_, size) = data.data_type().clone() {
                    let size = size as usize;
                    let child = data.child_data().first().cloned().ok_or_else(|| Error::invalid("column", "list without child"))?;
                    start = (data.offset() + start) * size;
                    count *= size;
                    if nulls_in(child.nulls(), start, count) > 0 {
                        return Err(Error::invalid("column", format!("column '{column}' has null elements inside a tensor")));
                    }
                    data = child;
                }
                if count != n * per {
                    return Err(Error::invalid("column", format!("column '{column}': array type {} does not match its plan", array.data_type())));
                }
                let mut shape = vec![n];
                shape.extend_from_slice(item_shape);
                if *dtype == DType::Bool && *data.data_type() == DataType::Boolean {
                    let bytes = unpack_bools(&data, start, count);
                    return w.append(&TensorView::new(&bytes, *dtype, shape));
                }
                let bytes = element_bytes(&data, *dtype, start, count)?;
                w.append(&TensorView::new(bytes, *dtype, shape))
            }
            (StreamWriter::Ragged(w), Layout::Ragged { ndim }) => match record_type.logical {
                Logical::Tensor => append_ragged_tensor(w, column, *dtype, *ndim, array, base),
                Logical::Utf8 | Logical::Binary => append_bytes(w, column, array, base),
            },
            _ => Err(Error::invalid("column", format!("column '{column}': writer kind does not match its layout"))),
        }
    }
}

/// Offsets of a (Large)List / string / binary array as absolute i64 positions into its values.
fn offsets_of(data: &ArrayData, large: bool) -> Vec<i64> {
    let n = data.len();
    let buf = &data.buffers()[0];
    if large {
        let o: ScalarBuffer<i64> = ScalarBuffer::new(buf.clone(), data.offset(), n + 1);
        o.to_vec()
    } else {
        let o: ScalarBuffer<i32> = ScalarBuffer::new(buf.clone(), data.offset(), n + 1);
        o.iter().map(|&x| x as i64).collect()
    }
}

/// Rebased int32 cu_seqlens, checking nonempty rows and the int32 limit.
fn rebase(column: &str, offs: &[i64], base: u64, allow_empty: bool) -> Result<Vec<i32>> {
    let first = offs[0];
    let total = offs[offs.len() - 1] - first;
    if total > i32::MAX as i64 {
        return Err(Error::TooManyValues { count: total as u64, limit: i32::MAX as u64 });
    }
    let mut cu = Vec::with_capacity(offs.len());
    for (i, &o) in offs.iter().enumerate() {
        if i > 0 && (o < offs[i - 1] || (o == offs[i - 1] && !allow_empty)) {
            return Err(empty_error(column, base + i as u64 - 1));
        }
        cu.push((o - first) as i32);
    }
    Ok(cu)
}

fn append_ragged_tensor(w: &mut RaggedWriter, column: &str, dtype: DType, ndim: usize, array: &dyn Array, base: u64) -> Result<()> {
    let data = array.to_data();
    let n = data.len();
    let (list, shapes): (ArrayData, Vec<u64>) = match data.data_type() {
        DataType::Struct(fields) => {
            // variable_shape_tensor: {data: List<T>, shape: FixedSizeList<int, ndim>}.
            let idx = |name: &str| fields.iter().position(|f| f.name() == name);
            let di = idx("data").or_else(|| idx("values")).ok_or_else(|| Error::invalid("column", "no data field"))?;
            let si = idx("shape").ok_or_else(|| Error::invalid("column", "no shape field"))?;
            let st = array.as_struct();
            let shape_col = st.column(si).as_fixed_size_list();
            let mut shapes = Vec::with_capacity(n * ndim);
            let sv = arrow_cast_to_u64(shape_col.values())?;
            for i in 0..n {
                let lo = shape_col.value_offset(i) as usize;
                shapes.extend_from_slice(&sv[lo..lo + ndim]);
            }
            (st.column(di).to_data(), shapes)
        }
        _ => (data.clone(), Vec::new()),
    };
    let large = matches!(list.data_type(), DataType::LargeList(_));
    let offs = offsets_of(&list, large);
    let cu = rebase(column, &offs, base, w.allows_empty())?;
    let shapes = if shapes.is_empty() { cu.windows(2).map(|p| (p[1] - p[0]) as u64).collect() } else { shapes };
    let child = list.child_data().first().cloned().ok_or_else(|| Error::invalid("column", "list without child"))?;
    let (start, count) = (offs[0] as usize, (offs[n] - offs[0]) as usize);
    if nulls_in(child.nulls(), start, count) > 0 {
        return Err(Error::invalid("column", format!("column '{column}' has null elements inside a record")));
    }
    let bool_bytes;
    let bytes = if dtype == DType::Bool && *child.data_type() == DataType::Boolean {
        bool_bytes = unpack_bools(&child, start, count);
        &bool_bytes[..]
    } else {
        element_bytes(&child, dtype, start, count)?
    };
    let input = RaggedInput::new(
        TensorView::new(bytes, dtype, vec![count]),
        TensorView::from_slice(&cu[..], &[cu.len()]),
        TensorView::from_slice(&shapes[..], &[n, ndim]),
    );
    w.append(&input)
}

fn arrow_cast_to_u64(a: &ArrayRef) -> Result<Vec<u64>> {
    use arrow_array::types::{Int32Type, Int64Type, UInt32Type, UInt64Type};
    let neg = || Error::invalid("column", "negative dimension in a variable_shape_tensor shape");
    Ok(match a.data_type() {
        DataType::Int32 => a.as_primitive::<Int32Type>().values().iter().map(|&d| u64::try_from(d).map_err(|_| neg())).collect::<Result<_>>()?,
        DataType::Int64 => a.as_primitive::<Int64Type>().values().iter().map(|&d| u64::try_from(d).map_err(|_| neg())).collect::<Result<_>>()?,
        DataType::UInt32 => a.as_primitive::<UInt32Type>().values().iter().map(|&d| d as u64).collect(),
        DataType::UInt64 => a.as_primitive::<UInt64Type>().values().to_vec(),
        dt => return Err(Error::invalid("column", format!("shape values of type {dt}"))),
    })
}

/// Strings / binary: offsets arrays are appended in place, view arrays are packed first.
fn append_bytes(w: &mut RaggedWriter, column: &str, array: &dyn Array, base: u64) -> Result<()> {
    let data = array.to_data();
    let n = data.len();
    match data.data_type() {
        DataType::Utf8View | DataType::BinaryView => {
            let allow_empty = w.allows_empty();
            let mut values = Vec::new();
            let mut cu = Vec::with_capacity(n + 1);
            cu.push(0i32);
            let push = |values: &mut Vec<u8>, cu: &mut Vec<i32>, b: &[u8], i: usize| -> Result<()> {
                if b.is_empty() && !allow_empty {
                    return Err(empty_error(column, base + i as u64));
                }
                values.extend_from_slice(b);
                let end = i32::try_from(values.len()).map_err(|_| Error::TooManyValues { count: values.len() as u64, limit: i32::MAX as u64 })?;
                cu.push(end);
                Ok(())
            };
            if let DataType::Utf8View = data.data_type() {
                for (i, s) in array.as_string_view().iter().enumerate() {
                    push(&mut values, &mut cu, s.unwrap_or_default().as_bytes(), i)?;
                }
            } else {
                for (i, s) in array.as_binary_view().iter().enumerate() {
                    push(&mut values, &mut cu, s.unwrap_or_default(), i)?;
                }
            }
            let shapes: Vec<u64> = cu.windows(2).map(|p| (p[1] - p[0]) as u64).collect();
            w.append(&RaggedInput::from_slices(&values[..], &cu[..], &shapes[..], 1))
        }
        dt => {
            let large = matches!(dt, DataType::LargeUtf8 | DataType::LargeBinary);
            let offs = offsets_of(&data, large);
            let cu = rebase(column, &offs, base, w.allows_empty())?;
            let shapes: Vec<u64> = cu.windows(2).map(|p| (p[1] - p[0]) as u64).collect();
            let (start, count) = (offs[0] as usize, (offs[n] - offs[0]) as usize);
            let bytes = data.buffers()[1].as_slice().get(start..start + count).ok_or_else(|| Error::invalid("column", "string data shorter than its offsets"))?;
                    w.append(&RaggedInput::new(
                TensorView::new(bytes, DType::UInt8, vec![count]),
                TensorView::from_slice(&cu[..], &[cu.len()]),
                TensorView::from_slice(&shapes[..], &[n, 1]),
            ))
        }
    }
}

/// A gathered ragged batch as the Arrow column of its logical type: tensors as `List<T>` /
/// variable_shape_tensor, strings as `Utf8View` (views into the batch's memory, UTF-8 checked),
/// bytes as `Binary` (offsets are the batch's `cu_seqlens`). No record bytes are copied.
pub fn column_from_ragged(name: &str, b: &RaggedBatch, logical: Logical) -> Result<(FieldRef, ArrayRef)> {
    match logical {
        Logical::Tensor => ragged_to_arrow(name, b),
        Logical::Binary | Logical::Utf8 => {
            b.check()?;
            if b.dtype() != DType::UInt8 || b.ndim() != 1 {
                return Err(Error::invalid("stream", format!("stream '{name}' is {} ndim {}, not uint8 ndim 1 bytes", b.dtype(), b.ndim())));
            }
            let values = tensor_buffer(b.values());
            let offsets = OffsetBuffer::new(ScalarBuffer::<i32>::new(tensor_buffer(b.cu_seqlens()), 0, b.len() + 1));
            if logical == Logical::Binary {
                let arr = BinaryArray::try_new(offsets, values, None)?;
                return Ok((Arc::new(Field::new(name, DataType::Binary, false)), Arc::new(arr)));
            }
            let arr = string_views(&offsets, values)?;
            Ok((Arc::new(Field::new(name, DataType::Utf8View, false)), Arc::new(arr)))
        }
    }
}

/// `Utf8View` over one data buffer addressed by `offsets` (validated as UTF-8 by Arrow).
fn string_views(offsets: &OffsetBuffer<i32>, values: Buffer) -> Result<StringViewArray> {
    let bytes = values.as_slice();
    let mut views = Vec::with_capacity(offsets.len() - 1);
    for w in offsets.windows(2) {
        let (lo, hi) = (w[0] as usize, w[1] as usize);
        let s = &bytes[lo..hi];
        let len = s.len() as u32;
        let view = if len <= 12 {
            let mut raw = [0u8; 16];
            raw[..4].copy_from_slice(&len.to_le_bytes());
            raw[4..4 + s.len()].copy_from_slice(s);
            u128::from_le_bytes(raw)
        } else {
            arrow_data::ByteView::new(len, &s[..4]).with_buffer_index(0).with_offset(lo as u32).as_u128()
        };
        views.push(view);
    }
    StringViewArray::try_new(ScalarBuffer::from(views), vec![values], None).map_err(|e| Error::invalid("column", format!("stored string is not valid UTF-8: {e}")))
}
