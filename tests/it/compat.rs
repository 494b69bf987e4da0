//! Format compatibility: stores written by the last version-1 release (fixtures in
//! `tests/fixtures/v1/`, made by `tests/fixtures/make_v1.rs` at commit 0b2b347) open and read
//! identically, through every path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use zrecord::prelude::*;
use zrecord::query::{zrecord_context, ZrecordTable};
use zrecord::store::{LocalFolder, ReadMode};

// The generator's formulas (tests/fixtures/make_v1.rs).
fn dense_value(id: usize, k: usize) -> f32 {
    (id * 10 + k) as f32 * 0.5
}
fn ragged_len(id: usize) -> usize {
    1 + (id * 7) % 5
}
fn ragged_value(id: usize, k: usize) -> i32 {
    (id * 100 + k) as i32 - 250
}
fn text(id: usize) -> String {
    format!("record {id}: {}", "é".repeat(id % 4))
}

const N: usize = 12;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1").join(name)
}

#[test]
fn v1_dense_and_ragged_stores_read_identically() {
    let alloc = Allocator::default();
    for mode in [ReadMode::Mmap, ReadMode::Pread] {
        let Store::Dense(d) = Store::open_at(&LocalFolder::new(fixture("dense_f32_zstd"), mode)).unwrap() else { panic!("dense") };
        assert_eq!(Store::Dense(d.clone()).format_version(), 1);
        assert_eq!((d.len(), d.item_shape(), d.codec()), (N as u64, &[2usize, 3][..], Codec::Zstd));
        let ids: Vec<u64> = (0..N as u64).rev().chain([3, 3]).collect();
        let t = d.bind(&alloc).gather(&ids).unwrap();
        let want: Vec<f32> = ids.iter().flat_map(|&i| (0..6).map(move |k| dense_value(i as usize, k))).collect();
        assert_eq!(t.as_slice::<f32>().unwrap(), &want[..]);
        assert_eq!(d.verify().unwrap(), N as u64);

        let Store::Ragged(r) = Store::open_at(&LocalFolder::new(fixture("ragged_i32_raw"), mode)).unwrap() else { panic!("ragged") };
        assert_eq!(Store::Ragged(r.clone()).logical(), Logical::Tensor);
        let b = r.bind(&alloc).gather(&ids).unwrap();
        for (k, &id) in ids.iter().enumerate() {
            let want: Vec<i32> = (0..ragged_len(id as usize)).map(|j| ragged_value(id as usize, j)).collect();
            assert_eq!(b.record(k).unwrap().as_slice::<i32>().unwrap(), &want[..]);
        }
        assert_eq!(r.verify().unwrap(), N as u64);
    }
}

#[tokio::test]
async fn v1_dataset_roots_keep_their_logical_types() {
    let ctx = zrecord_context();
    ctx.register_table("d", Arc::new(ZrecordTable::open(fixture("dataset")).unwrap())).unwrap();
    let b = ctx.sql("SELECT label, text FROM d ORDER BY _id").await.unwrap().collect().await.unwrap();
    let b = datafusion::arrow::compute::concat_batches(&b[0].schema(), &b).unwrap();
    let labels = b.column(0).as_primitive::<arrow_array::types::Int64Type>().values().to_vec();
    assert_eq!(labels, (0..N as i64).map(|i| i * i - 5).collect::<Vec<_>>());
    let texts: Vec<String> = b.column(1).as_string_view().iter().map(|s| s.unwrap().to_string()).collect();
    assert_eq!(texts, (0..N).map(text).collect::<Vec<_>>());
    // The loader() table function reads the same strings.
    let l = ctx.sql("SELECT _id, text FROM loader('d', 4, 'sequential', 0, 1)").await.unwrap().collect().await.unwrap();
    assert_eq!(l[0].column(1).as_string_view().value(3), text(3));
}
