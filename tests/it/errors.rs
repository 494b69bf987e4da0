//! Every validation error is typed and names the problem; a rejected append writes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]



use zrecord::prelude::*;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn dense_append_validation() {
    let d = tmp();
    let mut w = DenseWriter::create(d.path().join("x"), DType::Float32, &[2, 3], WriterOptions::default()).unwrap();
    let data = [0f32; 12];
    // Wrong dtype.
    let e = w.append(&TensorView::from_slice(&[0i32; 12], &[2, 2, 3])).unwrap_err();
    assert!(matches!(e, Error::DtypeMismatch { .. }), "{e}");
    assert!(e.to_string().contains("float32") && e.to_string().contains("int32"));
    // Wrong item shape / missing batch axis.
    for shape in [vec![2, 3, 2], vec![12], vec![4, 3], vec![2, 3]] {
        let e = w.append(&TensorView::from_slice(&data, &shape)).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{shape:?}: {e}");
    }
    // Byte length disagreeing with the shape.
    let e = w.append(&TensorView::new(&[0u8; 40], DType::Float32, vec![2, 2, 3])).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    // Non-contiguous strides (a transposed view).
    let e = w.append(&TensorView::from_slice(&data, &[2, 2, 3]).with_strides(vec![6, 1, 2])).unwrap_err();
    assert!(matches!(e, Error::NotContiguous { .. }), "{e}");
    // append_slice with a partial record.
    assert!(matches!(w.append_slice(&[0f32; 7]), Err(Error::ShapeMismatch { .. })));
    // Nothing was written by the rejected appends; a good one still works.
    assert_eq!(w.len(), 0);
    w.append(&TensorView::from_slice(&data, &[2, 2, 3]).with_strides(vec![6, 3, 1])).unwrap();
    assert_eq!(w.len(), 2);
    w.finish().unwrap();
}

fn ragged_err(w: &mut RaggedWriter, values: &[i32], cu: &[i32], shapes: &[u64], ndim: usize) -> Error {
    w.append(&RaggedInput::from_slices(values, cu, shapes, ndim)).unwrap_err()
}

#[test]
fn ragged_append_validation() {
    let d = tmp();
    let mut w = RaggedWriter::create(d.path().join("r"), DType::Int32, 1, WriterOptions::default()).unwrap();
    let v = [1, 2, 3, 4, 5];
    let cases: Vec<(&[i32], &[u64], &str)> = vec![
        (&[1, 3, 5], &[2, 2], "start at 0"),
        (&[0, 3, 3, 5], &[3, 0, 2], "empty"),
        (&[0, 3, 2, 5], &[3, 1, 3], "strictly increase"),
        (&[0, 3, 4], &[3, 1], "ends at 4"),
        (&[0, 3, 5], &[3, 3], "holds 3 elements"),
    ];
    for (cu, shapes, needle) in cases {
        let e = ragged_err(&mut w, &v, cu, shapes, 1);
        assert!(matches!(e, Error::InvalidRagged { .. }), "{needle}: {e}");
        assert!(e.to_string().contains(needle), "expected '{needle}' in '{e}'");
    }
    // Empty cu_seqlens.
    assert!(matches!(ragged_err(&mut w, &v, &[], &[], 1), Error::InvalidRagged { .. }));
    // Shapes array of the wrong ndim / count.
    let e = w.append(&RaggedInput::new(
        TensorView::from_slice(&v, &[5]),
        TensorView::from_slice(&[0i32, 5], &[2]),
        TensorView::from_slice(&[5u64, 1], &[1, 2]),
    )).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    // Wrong dtypes of each field.
    let e = w.append(&RaggedInput::new(
        TensorView::from_slice(&[1i64, 2], &[2]),
        TensorView::from_slice(&[0i32, 2], &[2]),
        TensorView::from_slice(&[2u64], &[1, 1]),
    )).unwrap_err();
    assert!(matches!(e, Error::DtypeMismatch { .. }), "{e}");
    let e = w.append(&RaggedInput::new(
        TensorView::from_slice(&v, &[5]),
        TensorView::from_slice(&[0i64, 5], &[2]),
        TensorView::from_slice(&[5u64], &[1, 1]),
    )).unwrap_err();
    assert!(matches!(e, Error::DtypeMismatch { .. }) && e.to_string().contains("cu_seqlens"), "{e}");
    let e = w.append(&RaggedInput::new(
        TensorView::from_slice(&v, &[5]),
        TensorView::from_slice(&[0i32, 5], &[2]),
        TensorView::from_slice(&[5i64], &[1, 1]),
    )).unwrap_err();
    assert!(matches!(e, Error::DtypeMismatch { .. }) && e.to_string().contains("shapes"), "{e}");
    // 2-D values.
    let e = w.append(&RaggedInput::new(
        TensorView::from_slice(&[1i32, 2, 3, 4], &[2, 2]),
        TensorView::from_slice(&[0i32, 4], &[2]),
        TensorView::from_slice(&[4u64], &[1, 1]),
    )).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    // Non-contiguous values.
    let e = w.append(&RaggedInput::new(
        TensorView::from_slice(&v, &[5]).with_strides(vec![2]),
        TensorView::from_slice(&[0i32, 5], &[2]),
        TensorView::from_slice(&[5u64], &[1, 1]),
    )).unwrap_err();
    assert!(matches!(e, Error::NotContiguous { .. }), "{e}");
    assert_eq!(w.len(), 0, "rejected appends wrote nothing");
    w.append(&RaggedInput::from_slices(&v, &[0, 2, 5], &[2, 3], 1)).unwrap();
    w.finish().unwrap();
}

#[test]
fn too_many_values_and_oversized_records() {
    // More than i32::MAX values in one packed append, backed by a sparse 2 GiB file so the
    // test needs no real memory: rejected before any record is read.
    let d = tmp();
    let f = d.path().join("big.bin");
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&f).unwrap();
    let n: u64 = i32::MAX as u64 + 1;
    file.set_len(n + 64).unwrap();
    // SAFETY: the file is private to this test and not modified while mapped.
    let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
    let mut w = RaggedWriter::create(d.path().join("r"), DType::UInt8, 1, WriterOptions::default()).unwrap();
    let e = w.append(&RaggedInput::new(
        TensorView::new(&map[..n as usize], DType::UInt8, vec![n as usize]),
        TensorView::from_slice(&[0i32, 1], &[2]),
        TensorView::from_slice(&[1u64], &[1, 1]),
    )).unwrap_err();
    assert!(matches!(e, Error::TooManyValues { .. }), "{e}");
    // A ragged record over 2 GiB (int64 values: 2^28 + 1 elements = 2 GiB + 8 bytes).
    let mut w64 = RaggedWriter::create(d.path().join("r64"), DType::Int64, 1, WriterOptions::default()).unwrap();
    let k = (1usize << 28) + 1;
    let e = w64.append(&RaggedInput::new(
        TensorView::new(&map[..k * 8], DType::Int64, vec![k]),
        TensorView::from_slice(&[0i32, k as i32], &[2]),
        TensorView::from_slice(&[k as u64], &[1, 1]),
    )).unwrap_err();
    assert!(matches!(e, Error::RecordTooLarge { .. }), "{e}");
    // A dense item shape over 2 GiB.
    let e = DenseWriter::create(d.path().join("d"), DType::Float32, &[1 << 20, 513], WriterOptions::default()).err().unwrap();
    assert!(matches!(e, Error::RecordTooLarge { .. }), "{e}");
    assert!(!d.path().join("d").exists());
}

#[test]
fn writer_argument_errors() {
    let d = tmp();
    let p = d.path().join("x");
    let bad = |o: WriterOptions| DenseWriter::create(&p, DType::UInt8, &[4], o).err().unwrap();
    assert!(matches!(bad(WriterOptions::default().data_shards(0)), Error::InvalidArgument { name: "data_shards", .. }));
    assert!(matches!(bad(WriterOptions::default().data_shards(256)), Error::InvalidArgument { name: "data_shards", .. }));
    assert!(matches!(bad(WriterOptions::with_codec(Codec::ZstdDict)), Error::InvalidCodec { .. }));
    assert!(matches!(bad(WriterOptions { dictionary: Some(vec![1; 300]), ..Default::default() }), Error::InvalidCodec { .. }));
    assert!(matches!(bad(WriterOptions::with_codec(Codec::Zstd).level(99)), Error::InvalidArgument { name: "level", .. }));
    assert!(!p.exists(), "failed creates leave nothing");
    assert!(matches!(RaggedWriter::create(&p, DType::Int32, 0, WriterOptions::default()), Err(Error::InvalidArgument { name: "ndim", .. })));
    assert!(matches!("complex256".parse::<DType>(), Err(Error::UnknownDtype { .. })));
    assert!(matches!("lz4".parse::<Codec>(), Err(Error::InvalidCodec { .. })));
    // 255 shards is allowed.
    let mut w = DenseWriter::create(&p, DType::UInt8, &[4], WriterOptions::default().data_shards(255)).unwrap();
    w.append_slice(&[7u8; 4000]).unwrap();
    w.finish().unwrap();
    let v = DenseStore::open(&p).unwrap().bind(&Allocator::default());
    assert_eq!(v.read_all().unwrap().as_bytes(), &[7u8; 4000][..]);
}

#[test]
fn existing_destination_is_never_overwritten() {
    let d = tmp();
    let p = d.path().join("x");
    std::fs::create_dir(&p).unwrap();
    assert!(matches!(DenseWriter::create(&p, DType::UInt8, &[1], WriterOptions::default()), Err(Error::AlreadyExists { .. })));
    std::fs::remove_dir(&p).unwrap();
    // Destination created by someone else between create and finish: publish refuses.
    let mut w = DenseWriter::create(&p, DType::UInt8, &[1], WriterOptions::default()).unwrap();
    w.append_slice(&[1u8, 2]).unwrap();
    std::fs::create_dir(&p).unwrap();
    std::fs::write(p.join("keep.txt"), b"mine").unwrap();
    assert!(matches!(w.finish(), Err(Error::AlreadyExists { .. })));
    assert_eq!(std::fs::read(p.join("keep.txt")).unwrap(), b"mine");
    // The temp folder was cleaned up.
    let leftovers: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
}

#[test]
fn dropped_writer_publishes_nothing() {
    let d = tmp();
    let p = d.path().join("x");
    {
        let mut w = DenseWriter::create(&p, DType::UInt8, &[3], WriterOptions::with_codec(Codec::Zstd)).unwrap();
        w.append_slice(&[1u8; 300]).unwrap();
    }
    assert!(!p.exists());
    assert!(matches!(DenseStore::open(&p), Err(Error::NotFound { .. })));
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "temp folder removed");
    // The path is free for a new writer.
    DenseWriter::create(&p, DType::UInt8, &[3], WriterOptions::default()).unwrap().finish().unwrap();
    assert_eq!(DenseStore::open(&p).unwrap().len(), 0);
}

#[test]
fn out_of_range_reads() {
    let d = tmp();
    let p = d.path().join("x");
    let mut w = DenseWriter::create(&p, DType::UInt16, &[2], WriterOptions::default()).unwrap();
    w.append_slice(&[1u16, 2, 3, 4, 5, 6]).unwrap();
    w.finish().unwrap();
    let alloc = Allocator::cpu(1 << 20);
    let v = DenseStore::open(&p).unwrap().bind(&alloc);
    let e = v.gather(&[0, 1, 3]).unwrap_err();
    assert!(matches!(e, Error::IndexOutOfRange { index: 3, len: 3, .. }), "{e}");
    assert!(e.to_string().contains("index 3 out of range") && e.to_string().contains("of 3 records"));
    assert_eq!(alloc.stats().fresh, 0, "no work before the range check");
    assert!(v.get(u64::MAX).is_err());
    assert!(v.range(2..4).is_err());
    assert!(v.gather_ids(zrecord::store::Ids::Range { start: 0, step: 2, len: 3 }).is_err());
    assert!(v.gather_ids(zrecord::store::Ids::Range { start: 1, step: -1, len: 3 }).is_err());
    assert!(matches!(DenseStore::open(d.path().join("nope")), Err(Error::NotFound { .. })));
    let empty_dir = d.path().join("plain");
    std::fs::create_dir(&empty_dir).unwrap();
    let e = DenseStore::open(&empty_dir).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }) && e.to_string().contains("manifest"), "{e}");
}
