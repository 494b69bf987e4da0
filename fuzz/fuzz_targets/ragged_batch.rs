//! Arbitrary packed ragged input (values, offsets, shapes, ndim, dtype): validation accepts
//! it or names the problem; an accepted batch appends and reads back byte for byte.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zrecord::prelude::*;

#[derive(Arbitrary, Debug)]
struct Input {
    dtype: u8,
    ndim: u8,
    values: Vec<u8>,
    cu: Vec<i32>,
    shapes: Vec<u64>,
    allow_empty: bool,
}

fuzz_target!(|inp: Input| {
    let dtypes = [DType::UInt8, DType::Int16, DType::Int32, DType::Float64];
    let dtype = dtypes[inp.dtype as usize % dtypes.len()];
    let ndim = (inp.ndim % 4) as usize;
    let n = inp.cu.len().saturating_sub(1);
    let vals = inp.values.len() / dtype.size();
    let values = TensorView::new(&inp.values[..vals * dtype.size()], dtype, vec![vals]);
    let cu_bytes: Vec<u8> = inp.cu.iter().flat_map(|c| c.to_ne_bytes()).collect();
    let cu = TensorView::new(&cu_bytes, DType::Int32, vec![inp.cu.len()]);
    let rows = if ndim == 0 { 0 } else { inp.shapes.len() / ndim };
    let sh_bytes: Vec<u8> = inp.shapes[..rows * ndim].iter().flat_map(|c| c.to_ne_bytes()).collect();
    let shapes = TensorView::new(&sh_bytes, DType::UInt64, vec![rows, ndim]);
    let input = RaggedInput::new(values, cu, shapes);
    // The in-memory copy and a store must agree with the input when it is accepted.
    let alloc = Allocator::cpu_with_limit(0, Some(64 << 20));
    let Ok(batch) = RaggedBatch::copy_from_input(&alloc, &input) else { return };
    assert_eq!(batch.len(), n);
    assert_eq!(batch.values().as_bytes(), &inp.values[..vals * dtype.size()]);
    let dir = zrecord_fuzz::scratch();
    let p = dir.path().join("r");
    let Ok(mut w) = RaggedWriter::create(&p, dtype, ndim, WriterOptions::default().allow_empty(inp.allow_empty)) else { return };
    if w.append(&input).is_err() || n == 0 {
        return;
    }
    w.finish().expect("an accepted batch publishes");
    let Store::Ragged(s) = Store::open(&p).expect("opens") else { panic!("kind") };
    let back = s.bind(&alloc).read_all().expect("reads back");
    assert_eq!(back.values().as_bytes(), batch.values().as_bytes());
    assert_eq!(back.cu_seqlens_slice(), batch.cu_seqlens_slice());
});
