//! Tensor and ragged batch -> Arrow arrays without copying record bytes.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::{make_array, Array, ArrayRef, FixedSizeListArray, Int32Array, ListArray, RecordBatch, StructArray};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema};

use crate::arrow::{EXTENSION_METADATA_KEY, EXTENSION_NAME_KEY, FIXED_SHAPE_TENSOR, VARIABLE_SHAPE_TENSOR};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{RaggedBatch, Tensor};

fn arrow_err(e: arrow_schema::ArrowError) -> Error {
    Error::Arrow(e)
}

/// The tensor's bytes as an Arrow buffer sharing its allocation.
pub fn tensor_buffer(t: &Tensor) -> Buffer {
    let len = t.nbytes();
    let Some(ptr) = NonNull::new(t.data_ptr() as *mut u8) else { return Buffer::from_vec(Vec::<u8>::new()) };
    // SAFETY: `ptr..ptr + len` is initialised, immutable memory of the tensor's allocation
    // (the `Tensor` contract), and the owner keeps that allocation alive for as long as the
    // buffer (or any slice of it) exists.
    unsafe { Buffer::from_custom_allocation(ptr, len, t.allocation().clone()) }
}

/// The Arrow field of one element of `dtype` (with extension metadata where Arrow lacks the
/// type), named `item` as Arrow list children are.
pub fn element_field(dtype: DType) -> Field {
    let f = Field::new_list_field(dtype.arrow_type(), false);
    match dtype.arrow_extension() {
        Some(ext) => {
            let meta = if ext == "arrow.bool8" { String::new() } else { "{}".to_string() };
            f.with_metadata(HashMap::from([
                (EXTENSION_NAME_KEY.to_string(), ext.to_string()),
                (EXTENSION_METADATA_KEY.to_string(), meta),
            ]))
        }
        None => f,
    }
}

fn flat_values(t: &Tensor, numel: usize) -> Result<ArrayRef> {
    let data = ArrayData::builder(t.dtype().arrow_type())
        .len(numel)
        .add_buffer(tensor_buffer(t))
        .build()
        .map_err(arrow_err)?;
    Ok(make_array(data))
}

fn ext_field(name: &str, data_type: DataType, ext: &str, meta: String) -> Field {
    Field::new(name, data_type, false).with_metadata(HashMap::from([
        (EXTENSION_NAME_KEY.to_string(), ext.to_string()),
        (EXTENSION_METADATA_KEY.to_string(), meta),
    ]))
}

/// A dense batch `[n, *item_shape]` as an `arrow.fixed_shape_tensor` column of `n` rows (a
/// plain primitive column when the item shape is `()`).
pub fn dense_to_arrow(name: &str, t: &Tensor) -> Result<(FieldRef, ArrayRef)> {
    let shape = t.shape();
    let (&n, item) = shape.split_first().ok_or_else(|| Error::invalid("tensor", "a 0-d tensor has no batch axis"))?;
    if item.is_empty() {
        // 0-D items: the plain primitive column (with the element extension where Arrow lacks
        // the type, e.g. bf16).
        let field = element_field(t.dtype()).with_name(name);
        return Ok((Arc::new(field), flat_values(t, n)?));
    }
    let per: usize = item.iter().product();
    let size = i32::try_from(per).map_err(|_| Error::invalid("tensor", format!("item of {per} elements exceeds Arrow's FixedSizeList limit")))?;
    let child = Arc::new(element_field(t.dtype()));
    let values = flat_values(t, n * per)?;
    // With the length given: items of zero elements (a 0 in the item shape) still make `n` rows.
    let list = FixedSizeListArray::try_new_with_length(child, size, values, None, n).map_err(arrow_err)?;
    Ok(fixed_shape_column(name, list, item))
}

/// `list` (one row per item, `product(item_shape)` elements each) as an
/// `arrow.fixed_shape_tensor` column.
pub(crate) fn fixed_shape_column(name: &str, list: FixedSizeListArray, item_shape: &[usize]) -> (FieldRef, ArrayRef) {
    let meta = format!("{{\"shape\":[{}]}}", item_shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","));
    let field = ext_field(name, list.data_type().clone(), FIXED_SHAPE_TENSOR, meta);
    (Arc::new(field), Arc::new(list))
}

/// `data` (one list of elements per row) and `shape` (one row of extents per row) as the
/// `arrow.variable_shape_tensor` struct column.
pub(crate) fn variable_shape_column(name: &str, data: ListArray, shape: FixedSizeListArray) -> Result<(FieldRef, ArrayRef)> {
    let fields = Fields::from(vec![
        Field::new("data", data.data_type().clone(), false),
        Field::new("shape", shape.data_type().clone(), false),
    ]);
    let st = StructArray::try_new(fields, vec![Arc::new(data) as ArrayRef, Arc::new(shape) as ArrayRef], None).map_err(arrow_err)?;
    let field = ext_field(name, st.data_type().clone(), VARIABLE_SHAPE_TENSOR, "{}".to_string());
    Ok((Arc::new(field), Arc::new(st)))
}

/// A ragged batch as `List<T>` (ndim 1; offsets are `cu_seqlens`) or
/// `arrow.variable_shape_tensor` (ndim > 1).
pub fn ragged_to_arrow(name: &str, b: &RaggedBatch) -> Result<(FieldRef, ArrayRef)> {
    b.check()?;
    let child = Arc::new(element_field(b.dtype()));
    let total = b.values().numel();
    let values = flat_values(b.values(), total)?;
    let offsets_buf = tensor_buffer(b.cu_seqlens());
    let offsets = OffsetBuffer::new(ScalarBuffer::<i32>::new(offsets_buf, 0, b.len() + 1));
    let list = ListArray::try_new(child, offsets, values, None).map_err(arrow_err)?;
    if b.ndim() == 1 {
        let field = Field::new(name, list.data_type().clone(), false);
        return Ok((Arc::new(field), Arc::new(list)));
    }
    let nd = b.ndim();
    let mut shape32 = Vec::with_capacity(b.len() * nd);
    for &d in b.shapes_slice() {
        shape32.push(i32::try_from(d).map_err(|_| Error::invalid("shape", format!("dimension {d} exceeds int32 (variable_shape_tensor)")))?);
    }
    let shape_child = Arc::new(Field::new_list_field(DataType::Int32, false));
    let shape = FixedSizeListArray::try_new(shape_child, nd as i32, Arc::new(Int32Array::from(shape32)), None).map_err(arrow_err)?;
    variable_shape_column(name, list, shape)
}

/// Columns of equal length as one RecordBatch.
pub fn to_record_batch(columns: Vec<(FieldRef, ArrayRef)>) -> Result<RecordBatch> {
    let (fields, arrays): (Vec<FieldRef>, Vec<ArrayRef>) = columns.into_iter().unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).map_err(arrow_err)
}

#[cfg(test)]
mod tests {
    #[test]
    fn zero_element_items_keep_their_row_count() {
        let t = crate::memory::Tensor::from_slice::<i32>(&crate::memory::Allocator::cpu(0), &[], &[3, 0]).unwrap();
        let (_, a) = super::dense_to_arrow("x", &t).unwrap();
        assert_eq!(a.len(), 3);
    }

    use super::*;
    use crate::memory::Allocator;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float32Type, Int16Type};

    #[test]
    fn dense_is_zero_copy_fixed_shape_tensor() {
        let a = Allocator::cpu(1 << 20);
        let data: Vec<f32> = (0..24).map(|x| x as f32).collect();
        let t = Tensor::from_slice(&a, &data, &[4, 2, 3]).unwrap();
        let (field, arr) = dense_to_arrow("x", &t).unwrap();
        assert_eq!(field.metadata()[EXTENSION_NAME_KEY], FIXED_SHAPE_TENSOR);
        assert_eq!(field.metadata()[EXTENSION_METADATA_KEY], "{\"shape\":[2,3]}");
        let fsl = arr.as_fixed_size_list();
        assert_eq!(fsl.len(), 4);
        assert_eq!(fsl.value_length(), 6);
        let vals = fsl.values().as_primitive::<Float32Type>();
        assert_eq!(vals.values().as_ptr() as *const u8, t.data_ptr(), "no copy");
        assert_eq!(fsl.value(3).as_primitive::<Float32Type>().values().to_vec(), vec![18.0, 19.0, 20.0, 21.0, 22.0, 23.0]);
        // The Arrow array alone keeps the allocation alive.
        drop(t);
        assert!(a.stats().live_bytes > 0);
        drop(arr);
        assert_eq!(a.stats().live_bytes, 0);
        // Arrow's own extension type parser accepts our metadata.
        use arrow_schema::extension::FixedShapeTensor;
        let ext = field.try_extension_type::<FixedShapeTensor>().unwrap();
        assert_eq!(ext.dimensions(), 2);
    }

    #[test]
    fn ragged_list_and_variable_shape() {
        let a = Allocator::cpu(1 << 20);
        let r0 = [1i16, 2, 3, 4, 5, 6];
        let r1 = [7i16, 8];
        let b = RaggedBatch::from_records(&a, 1, &[(&r0[..], &[6][..]), (&r1[..], &[2][..])]).unwrap();
        let (f, arr) = ragged_to_arrow("t", &b).unwrap();
        assert!(matches!(f.data_type(), DataType::List(_)));
        let l = arr.as_list::<i32>();
        assert_eq!(l.value_offsets(), &[0, 6, 8]);
        assert_eq!(l.value(1).as_primitive::<Int16Type>().values().to_vec(), vec![7, 8]);
        assert_eq!(l.values().as_primitive::<Int16Type>().values().as_ptr() as *const u8, b.values().data_ptr());
        let b2 = RaggedBatch::from_records(&a, 2, &[(&r0[..], &[2, 3][..]), (&r1[..], &[1, 2][..])]).unwrap();
        let (f2, arr2) = ragged_to_arrow("t", &b2).unwrap();
        assert_eq!(f2.metadata()[EXTENSION_NAME_KEY], VARIABLE_SHAPE_TENSOR);
        let st = arr2.as_struct();
        let shape = st.column(1).as_fixed_size_list();
        assert_eq!(shape.values().as_primitive::<arrow_array::types::Int32Type>().values().to_vec(), vec![2, 3, 1, 2]);
        let rb = to_record_batch(vec![(f2, arr2)]).unwrap();
        assert_eq!(rb.num_rows(), 2);
    }

    #[test]
    fn every_dtype_exports() {
        let a = Allocator::cpu(1 << 20);
        for d in DType::ALL {
            let bytes = vec![0u8; 3 * 2 * d.size()];
            let t = {
                let src = Tensor::from_slice(&a, &bytes, &[bytes.len()]).unwrap();
                // Reinterpret the bytes as dtype `d`, shape [3, 2].
                src.reinterpret(d, vec![3, 2]).unwrap()
            };
            let (f, arr) = dense_to_arrow("x", &t).unwrap();
            assert_eq!(arr.len(), 3, "{d}");
            let child = match f.data_type() {
                DataType::FixedSizeList(c, 2) => c.clone(),
                other => panic!("{other}"),
            };
            assert_eq!(DType::from_arrow(child.data_type(), child.metadata().get(EXTENSION_NAME_KEY).map(|s| s.as_str())).unwrap(), d);
        }
    }
}
