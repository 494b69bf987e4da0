//! Arbitrary Arrow columns (lists, fixed-size lists, strings, binary, nulls, sliced offsets)
//! into a dataset root: a typed error at plan or append time, or a root whose columns read
//! back equal to the input.
#![no_main]

use std::sync::Arc;

use arbitrary::Arbitrary;
use arrow_array::{Array, ArrayRef, BinaryArray, FixedSizeListArray, Int32Array, ListArray, RecordBatch, StringArray};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema};
use libfuzzer_sys::fuzz_target;
use zrecord::prelude::*;

#[derive(Arbitrary, Debug)]
struct Input {
    kind: u8,
    values: Vec<i32>,
    lens: Vec<u8>,
    nulls: Vec<bool>,
    width: u8,
    strings: Vec<String>,
    slice: (u8, u8),
}

fn column(inp: &Input) -> Option<ArrayRef> {
    let nulls = |n: usize| -> Option<arrow_buffer::NullBuffer> {
        if inp.nulls.iter().any(|&b| b) {
            Some((0..n).map(|i| !inp.nulls.get(i).copied().unwrap_or(false)).collect::<Vec<bool>>().into())
        } else {
            None
        }
    };
    Some(match inp.kind % 4 {
        0 => {
            let total: usize = inp.lens.iter().map(|&l| l as usize).sum();
            let values = Int32Array::from((0..total).map(|i| inp.values.get(i % inp.values.len().max(1)).copied().unwrap_or(i as i32)).collect::<Vec<_>>());
            let offsets = OffsetBuffer::from_lengths(inp.lens.iter().map(|&l| l as usize));
            let n = inp.lens.len();
            Arc::new(ListArray::try_new(Arc::new(Field::new("item", DataType::Int32, false)), offsets, Arc::new(values), nulls(n)).ok()?)
        }
        1 => {
            let w = (inp.width % 5) as i32;
            let n = if w == 0 { inp.values.len() } else { inp.values.len() / w as usize };
            let vals = Int32Array::from(inp.values[..n * w as usize].to_vec());
            Arc::new(FixedSizeListArray::try_new(Arc::new(Field::new("item", DataType::Int32, false)), w, Arc::new(vals), nulls(n)).ok()?)
        }
        2 => Arc::new(StringArray::from_iter(inp.strings.iter().enumerate().map(|(i, s)| (!inp.nulls.get(i).copied().unwrap_or(false)).then_some(s.as_str())))),
        _ => Arc::new(BinaryArray::from_iter(inp.strings.iter().map(|s| Some(s.as_bytes())))),
    })
}

fuzz_target!(|inp: Input| {
    let Some(col) = column(&inp) else { return };
    let (a, b) = (inp.slice.0 as usize % (col.len() + 1), inp.slice.1 as usize);
    let col = col.slice(a, b.min(col.len() - a));
    let schema = Arc::new(Schema::new(vec![Field::new("c", col.data_type().clone(), col.is_nullable())]));
    let Ok(batch) = RecordBatch::try_new(schema.clone(), vec![col.clone()]) else { return };
    let dir = zrecord_fuzz::scratch();
    let root = dir.path().join("root");
    let Ok(mut w) = zrecord::arrow::DatasetWriter::for_schema(&root, &schema, WriterOptions::default()) else { return };
    if w.append(&batch).is_err() {
        return;
    }
    if w.finish().is_err() {
        return;
    }
    // Read back through SQL and compare with the input column.
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let ctx = zrecord::query::zrecord_context();
        let df = ctx.sql(&format!("SELECT c FROM '{}' ORDER BY _id", root.display())).await.expect("plans");
        let out = df.collect().await.expect("reads back");
        let got: Vec<ArrayRef> = out.iter().map(|b| b.column(0).clone()).collect();
        let got = arrow_select_concat(&got);
        if let Some(got) = got {
            assert_eq!(got.len(), col.len());
            let cast = arrow_cast(&got, col.data_type());
            if let Some(cast) = cast {
                assert_eq!(cast.to_data(), col.to_data().slice(0, col.len()), "column read back differs");
            }
        }
    });
});

fn arrow_select_concat(parts: &[ArrayRef]) -> Option<ArrayRef> {
    let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
    if refs.is_empty() {
        return None;
    }
    arrow_select::concat::concat(&refs).ok()
}

fn arrow_cast(a: &ArrayRef, to: &DataType) -> Option<ArrayRef> {
    arrow_cast::cast(a, to).ok()
}
