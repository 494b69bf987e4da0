//! Dataset conversion from files and Arrow batches: every type rule, Hugging Face features,
//! dictionary training, errors before publish, and the `zrec convert` command.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::field_reassign_with_default)]

use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int32Type, Int64Type, UInt8Type};
use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array, ListArray, RecordBatch, StructArray};
use arrow_schema::{DataType, Field, Schema};
use zrecord::arrow::Scanner;
use zrecord::store::RecordType;
use zrecord::convert::{convert_batches, open_files, ConvertOptions, Converter, ImageLayout, ImageOptions};
use zrecord::prelude::*;
use zrecord::store::Selection;

fn tokens(n: usize) -> ListArray {
    ListArray::from_iter_primitive::<Int32Type, _, _>((0..n).map(|i| Some((0..(i % 7 + 1) as i32).map(|k| Some(i as i32 * 10 + k)).collect::<Vec<_>>())))
}

fn sample_batch(n: usize) -> RecordBatch {
    let label = Int64Array::from_iter_values((0..n as i64).map(|i| i % 3));
    let text: arrow_array::StringArray = (0..n).map(|i| Some(format!("row {i}"))).collect();
    let emb = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        4,
        Arc::new(Float32Array::from_iter_values((0..n * 4).map(|x| x as f32 * 0.5))),
        None,
    )
    .unwrap();
    RecordBatch::try_from_iter(vec![
        ("tokens", Arc::new(tokens(n)) as ArrayRef),
        ("label", Arc::new(label) as ArrayRef),
        ("text", Arc::new(text) as ArrayRef),
        ("emb", Arc::new(emb) as ArrayRef),
    ])
    .unwrap()
}

/// Every stream of a root read back through the scanner, in id order.
fn read_back(root: &Path) -> RecordBatch {
    let ds = Dataset::open(root).unwrap();
    let scanner = Scanner::new(ds.clone(), &Allocator::default());
    let cols = scanner.all_columns();
    let mut r = scanner.scan(Selection::all(ds.len()), &cols, 1 << 20).unwrap();
    let b = r.next_batch().unwrap().unwrap();
    assert!(r.next_batch().is_none());
    b
}

fn i32_rows(a: &dyn Array) -> Vec<Vec<i32>> {
    let l = a.as_list::<i32>();
    (0..l.len()).map(|i| l.value(i).as_primitive::<Int32Type>().values().to_vec()).collect()
}

fn check_sample(b: &RecordBatch, n: usize) {
    let want = sample_batch(n);
    assert_eq!(i32_rows(b.column_by_name("tokens").unwrap()), i32_rows(want.column(0)));
    assert_eq!(b.column_by_name("label").unwrap().as_primitive::<Int64Type>().values(), want.column(1).as_primitive::<Int64Type>().values());
    let text = b.column_by_name("text").unwrap();
    let text: Vec<String> = text.as_string_view().iter().map(|s| s.unwrap().to_string()).collect();
    assert_eq!(text, (0..n).map(|i| format!("row {i}")).collect::<Vec<_>>());
    let emb = b.column_by_name("emb").unwrap().as_fixed_size_list().values().as_primitive::<Float32Type>().values().to_vec();
    assert_eq!(emb, (0..n * 4).map(|x| x as f32 * 0.5).collect::<Vec<_>>());
}

#[test]
fn parquet_files_convert_in_order_with_row_counts() {
    let dir = tempfile::tempdir().unwrap();
    // Two files: rows 0..300 and 300..500 (the glob reads them in path order).
    let all = sample_batch(500);
    for (name, lo, len) in [("part-0.parquet", 0, 300), ("part-1.parquet", 300, 200)] {
        let f = std::fs::File::create(dir.path().join(name)).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(f, all.schema(), None).unwrap();
        w.write(&all.slice(lo, len)).unwrap();
        w.close().unwrap();
    }
    let input = open_files(&format!("{}/*.parquet", dir.path().display())).unwrap();
    assert_eq!(input.total_rows, Some(500));
    let root = dir.path().join("root");
    let mut seen = Vec::new();
    let report = convert_batches(&root, &input.schema.clone(), input.batches, ConvertOptions::default(), &mut |r, _| seen.push(r), &|| false).unwrap();
    assert_eq!(report.rows, 500);
    assert_eq!(seen.last(), Some(&500));
    check_sample(&read_back(&root), 500);
    // A folder of parquet files is the same source.
    let again = open_files(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(again.files.len(), 2);
}

#[test]
fn csv_and_json_lines_convert_with_inferred_types() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "id,score,name\n1,0.5,ab\n2,1.5,cde\n3,2.5,f\n").unwrap();
    let input = open_files(csv.to_str().unwrap()).unwrap();
    let root = dir.path().join("csv_root");
    convert_batches(&root, &input.schema.clone(), input.batches, ConvertOptions::default(), &mut |_, _| {}, &|| false).unwrap();
    let b = read_back(&root);
    assert_eq!(b.column_by_name("id").unwrap().as_primitive::<Int64Type>().values().to_vec(), vec![1, 2, 3]);
    let names: Vec<&str> = b.column_by_name("name").unwrap().as_string_view().iter().map(|s| s.unwrap()).collect();
    assert_eq!(names, vec!["ab", "cde", "f"]);

    let json = dir.path().join("t.jsonl");
    std::fs::write(&json, "{\"ids\": [1, 2, 3], \"y\": 1}\n{\"ids\": [4], \"y\": 0}\n").unwrap();
    let input = open_files(json.to_str().unwrap()).unwrap();
    let root = dir.path().join("json_root");
    convert_batches(&root, &input.schema.clone(), input.batches, ConvertOptions::default(), &mut |_, _| {}, &|| false).unwrap();
    let b = read_back(&root);
    let ids = b.column_by_name("ids").unwrap().as_list::<i32>();
    assert_eq!(ids.value(0).as_primitive::<Int64Type>().values().to_vec(), vec![1, 2, 3]);
    assert_eq!(ids.value(1).as_primitive::<Int64Type>().values().to_vec(), vec![4]);
}

/// A Hugging Face-shaped schema: ArrayND as nested lists plus its features JSON.
fn hf_batch() -> (RecordBatch, serde_json::Value) {
    // a2: Array2D((2, 3)), a3: Array3D((None, 2, 2)) -> rows have 1 and 2 outer rows.
    let inner = |v: Vec<f32>, d: usize| -> ListArray {
        let offs: Vec<i32> = (0..=v.len() / d).map(|i| (i * d) as i32).collect();
        ListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            arrow_buffer::OffsetBuffer::new(offs.into()),
            Arc::new(Float32Array::from(v)),
            None,
        )
        .unwrap()
    };
    let wrap = |child: ListArray, offs: Vec<i32>| -> ListArray {
        ListArray::try_new(Arc::new(Field::new("item", child.data_type().clone(), true)), arrow_buffer::OffsetBuffer::new(offs.into()), Arc::new(child), None).unwrap()
    };
    // Two rows of Array2D (2, 3): values 0..12.
    let a2 = wrap(inner((0..12).map(|x| x as f32).collect(), 3), vec![0, 2, 4]);
    // Array3D (None, 2, 2): row 0 has 1 x 2 x 2, row 1 has 2 x 2 x 2 (values 100..112).
    let lvl2 = inner((100..112).map(|x| x as f32).collect(), 2); // 6 lists of 2
    let lvl1 = wrap(lvl2, vec![0, 2, 4, 6]); // 3 lists of 2
    let a3 = wrap(lvl1, vec![0, 1, 3]);
    let label = Int64Array::from(vec![1, 0]);
    let b = RecordBatch::try_from_iter(vec![("a2", Arc::new(a2) as ArrayRef), ("a3", Arc::new(a3) as ArrayRef), ("label", Arc::new(label) as ArrayRef)]).unwrap();
    let features = serde_json::json!({
        "a2": {"shape": [2, 3], "dtype": "float32", "_type": "Array2D"},
        "a3": {"shape": [null, 2, 2], "dtype": "float32", "_type": "Array3D"},
        "label": {"names": ["neg", "pos"], "_type": "ClassLabel"}
    });
    (b, features)
}

#[test]
fn hugging_face_array_features_become_dense_and_ragged_streams_and_metadata_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (b, features) = hf_batch();
    let root = dir.path().join("hf");
    let mut opts = ConvertOptions::default();
    opts.features = Some(features.clone());
    let mut c = Converter::new(&root, &b.schema(), opts).unwrap();
    c.push(&b).unwrap();
    let report = c.finish().unwrap();
    assert_eq!(report.streams[0].1, RecordType::dense(DType::Float32, vec![2, 3]));
    assert_eq!(report.streams[1].1, RecordType::ragged(DType::Float32, 3));
    let ds = Dataset::open(&root).unwrap();
    let meta = ds.metadata().unwrap();
    assert_eq!(meta["huggingface"]["class_labels"]["label"], serde_json::json!(["neg", "pos"]));
    assert_eq!(meta["huggingface"]["features"], features);
    let a2 = ds.streams()[0].store().unwrap();
    let Store::Dense(a2) = a2 else { panic!("dense") };
    let t = a2.bind(&Allocator::default()).gather(&[1, 0]).unwrap();
    assert_eq!(t.as_slice::<f32>().unwrap(), &[6., 7., 8., 9., 10., 11., 0., 1., 2., 3., 4., 5.]);
    let Store::Ragged(a3) = ds.streams()[1].store().unwrap() else { panic!("ragged") };
    let r = a3.bind(&Allocator::default()).gather(&[1, 0]).unwrap();
    assert_eq!(r.shapes_slice(), &[2, 2, 2, 1, 2, 2]);
    assert_eq!(r.values().as_slice::<f32>().unwrap(), &(104..112).chain(100..104).map(|x| x as f32).collect::<Vec<_>>()[..]);
}

#[test]
fn columns_without_a_layout_fail_before_anything_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let image = StructArray::from(vec![
        (Arc::new(Field::new("bytes", DataType::Binary, true)), Arc::new(arrow_array::BinaryArray::from(vec![&b"x"[..]])) as ArrayRef),
        (Arc::new(Field::new("path", DataType::Utf8, true)), Arc::new(arrow_array::StringArray::from(vec![Some("a.png")])) as ArrayRef),
    ]);
    let b = RecordBatch::try_from_iter(vec![("img", Arc::new(image) as ArrayRef)]).unwrap();
    let mut opts = ConvertOptions::default();
    opts.features = Some(serde_json::json!({"img": {"_type": "Image"}}));
    let root = dir.path().join("x");
    let e = Converter::new(&root, &b.schema(), opts.clone()).err().unwrap().to_string();
    assert!(e.contains("column 'img' (HF feature Image)") && e.contains("decode_images"), "{e}");
    opts.features = Some(serde_json::json!({"img": {"_type": "Audio"}}));
    let e = Converter::new(&root, &b.schema(), opts).err().unwrap().to_string();
    assert!(e.contains("Audio") && e.contains("array"), "{e}");
    // Nested dynamic lists.
    let mut nested = ListBuilder::new(ListBuilder::new(StringBuilder::new()));
    nested.values().values().append_value("a");
    nested.values().append(true);
    nested.append(true);
    let b = RecordBatch::try_from_iter(vec![("nested", Arc::new(nested.finish()) as ArrayRef)]).unwrap();
    let e = Converter::new(&root, &b.schema(), ConvertOptions::default()).err().unwrap().to_string();
    assert!(e.contains("nested variable-length lists"), "{e}");
    // A null column, and a column list naming a missing column.
    let b = RecordBatch::try_from_iter(vec![("n", Arc::new(arrow_array::NullArray::new(2)) as ArrayRef)]).unwrap();
    assert!(Converter::new(&root, &b.schema(), ConvertOptions::default()).err().unwrap().to_string().contains("null"));
    let b = sample_batch(3);
    let mut opts = ConvertOptions::default();
    opts.columns = Some(vec!["label".into(), "nope".into()]);
    assert!(Converter::new(&root, &b.schema(), opts).err().unwrap().to_string().contains("no column 'nope'"));
    // Nulls in data, found in the second batch: the first batch was written, nothing published.
    let with_null = RecordBatch::try_from_iter(vec![("v", Arc::new(Int32Array::from(vec![Some(1), None])) as ArrayRef)]).unwrap();
    let ok = RecordBatch::try_from_iter(vec![("v", Arc::new(Int32Array::from(vec![Some(5), Some(6)])) as ArrayRef)]).unwrap();
    let mut c = Converter::new(&root, &ok.schema(), ConvertOptions::default()).unwrap();
    c.push(&ok).unwrap();
    // Small batches are staged before they are written: the error comes at the latest at finish.
    let e = match c.push(&with_null) {
        Err(e) => e.to_string(),
        Ok(()) => c.finish().err().unwrap().to_string(),
    };
    assert!(e.contains("column 'v' has a null at row 3"), "{e}");
    assert!(!root.exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(leftovers.is_empty(), "staging folders left behind: {leftovers:?}");
    // A cancelled conversion publishes nothing either.
    let b = sample_batch(10);
    let r = convert_batches(&root, &b.schema(), vec![Ok(b.clone()), Ok(b.clone())].into_iter(), ConvertOptions::default(), &mut |_, _| {}, &|| true);
    assert!(r.unwrap_err().to_string().contains("interrupted"));
    assert!(!root.exists());
}

#[test]
fn trained_dictionaries_per_column_fall_back_to_zstd_when_too_small() {
    let dir = tempfile::tempdir().unwrap();
    let b = sample_batch(2000);
    let root = dir.path().join("dict");
    let mut opts = ConvertOptions::default();
    opts.train_dict = Some(4096);
    let mut c = Converter::new(&root, &b.schema(), opts).unwrap();
    for k in 0..4 {
        c.push(&b.slice(k * 500, 500)).unwrap();
    }
    let report = c.finish().unwrap();
    let codecs: Vec<Codec> = report.streams.iter().map(|s| s.2).collect();
    // Tokens and text train; 8-byte labels and 16-byte embeddings of 2000 rows may or may not:
    // whatever was chosen is what the store says.
    assert_eq!(codecs[0], Codec::ZstdDict);
    let ds = Dataset::open(&root).unwrap();
    for (s, c) in ds.streams().iter().zip(&codecs) {
        assert_eq!(s.store().unwrap().codec(), *c);
    }
    check_sample(&read_back(&root), 2000);
}

#[test]
fn images_decode_in_rust_and_a_save_to_disk_style_folder_reads_as_arrow_streams() {
    use image::{ImageFormat, Rgb, RgbImage};
    let dir = tempfile::tempdir().unwrap();
    let png = |w: u32, h: u32, seed: u8| {
        let img = RgbImage::from_fn(w, h, |x, y| Rgb([x as u8 ^ seed, y as u8, seed]));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Png).unwrap();
        (out.into_inner(), img.into_raw())
    };
    let imgs = [png(5, 4, 1), png(3, 7, 2)];
    let image = StructArray::from(vec![
        (Arc::new(Field::new("bytes", DataType::Binary, true)), Arc::new(arrow_array::BinaryArray::from(imgs.iter().map(|i| &i.0[..]).collect::<Vec<_>>())) as ArrayRef),
        (Arc::new(Field::new("path", DataType::Utf8, true)), Arc::new(arrow_array::StringArray::from(vec![None::<&str>, None])) as ArrayRef),
    ]);
    let hf_meta = serde_json::json!({"info": {"features": {"img": {"_type": "Image"}, "y": {"dtype": "int64", "_type": "Value"}}}}).to_string();
    let schema = Arc::new(Schema::new(vec![Field::new("img", image.data_type().clone(), true), Field::new("y", DataType::Int64, true)]).with_metadata([("huggingface".to_string(), hf_meta)].into()));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(image), Arc::new(Int64Array::from(vec![7, 8]))]).unwrap();
    // An HF save_to_disk folder: state.json + Arrow IPC stream files.
    let src = dir.path().join("saved");
    std::fs::create_dir(&src).unwrap();
    let mut w = arrow_ipc::writer::StreamWriter::try_new(std::fs::File::create(src.join("data-00000-of-00001.arrow")).unwrap(), &schema).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
    std::fs::write(src.join("state.json"), r#"{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}"#).unwrap();
    std::fs::write(src.join("dataset_info.json"), r#"{"description": "two pictures", "features": {"img": {"_type": "Image"}, "y": {"dtype": "int64", "_type": "Value"}}}"#).unwrap();
    let input = open_files(src.to_str().unwrap()).unwrap();
    assert!(input.features.is_some());
    let root = dir.path().join("pix");
    let mut opts = ConvertOptions::default();
    opts.features = input.features.clone();
    opts.images = Some(ImageOptions::new(ImageLayout::Hwc));
    convert_batches(&root, &input.schema.clone(), input.batches, opts, &mut |_, _| {}, &|| false).unwrap();
    let ds = Dataset::open(&root).unwrap();
    let Store::Ragged(img) = ds.streams()[0].store().unwrap() else { panic!("ragged") };
    let r = img.bind(&Allocator::default()).gather(&[0, 1]).unwrap();
    assert_eq!(r.shapes_slice(), &[4, 5, 3, 7, 3, 3]);
    let px = r.values().as_slice::<u8>().unwrap();
    assert_eq!(&px[..60], &imgs[0].1[..]);
    assert_eq!(&px[60..], &imgs[1].1[..]);
    // Resized: dense [2, 2, 3].
    let input = open_files(src.to_str().unwrap()).unwrap();
    let mut opts = ConvertOptions::default();
    opts.images = Some(ImageOptions { layout: ImageLayout::Chw, mode: None, resize: Some((2, 2)) });
    let root2 = dir.path().join("pix2");
    let rep = convert_batches(&root2, &input.schema.clone(), input.batches, opts, &mut |_, _| {}, &|| false).unwrap();
    assert_eq!(rep.streams[0].1, RecordType::dense(DType::UInt8, vec![3, 2, 2]));
    let b = read_back(&root2);
    assert_eq!(b.column_by_name("y").unwrap().as_primitive::<Int64Type>().values().to_vec(), vec![7, 8]);
    assert_eq!(b.column_by_name("img").unwrap().as_fixed_size_list().values().as_primitive::<UInt8Type>().len(), 24);
    // A DatasetDict folder names its splits.
    let dd = dir.path().join("dd");
    std::fs::create_dir(&dd).unwrap();
    std::fs::write(dd.join("dataset_dict.json"), r#"{"splits": ["train", "test"]}"#).unwrap();
    let e = open_files(dd.to_str().unwrap()).err().unwrap().to_string();
    assert!(e.contains("DatasetDict") && e.contains("train"), "{e}");
}

#[test]
fn zrec_convert_command_converts_csv_and_refuses_an_existing_root() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "a,b\n1,x\n2,yy\n").unwrap();
    let root = dir.path().join("out");
    let run = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_zrec")).args(args).output().unwrap();
    let out = run(&["convert", csv.to_str().unwrap(), root.to_str().unwrap(), "--quiet", "--codec", "raw", "--columns", "b,a"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("converted 2 rows"));
    let ds = Dataset::open(&root).unwrap();
    assert_eq!(ds.streams().iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), vec!["b", "a"]);
    let out = run(&["convert", csv.to_str().unwrap(), root.to_str().unwrap(), "--quiet"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists"));
}

/// `rows` rows of `width` int32 each, row `r` (global id `base + r`) holding `id * width + k`;
/// `null_at` (a global id) is a null row.
fn wide_rows(base: usize, rows: usize, width: usize, null_at: Option<usize>) -> RecordBatch {
    let a = ListArray::from_iter_primitive::<Int32Type, _, _>((base..base + rows).map(|id| {
        (Some(id) != null_at).then(|| (0..width).map(|k| Some((id * width + k) as i32)).collect::<Vec<_>>())
    }));
    RecordBatch::try_from_iter(vec![("t", Arc::new(a) as ArrayRef)]).unwrap()
}

#[test]
fn groups_write_behind_the_caller_in_order_and_a_failed_group_publishes_nothing() {
    // 1024 rows x 16 KiB = 16 MiB a batch: every push hands a group to the writer thread.
    let (rows, width, batches) = (1024, 4096, 5);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ok");
    let mut opts = ConvertOptions::default();
    opts.writer = WriterOptions::with_codec(Codec::Raw);
    let mut c = Converter::new(&root, &wide_rows(0, 1, width, None).schema(), opts.clone()).unwrap();
    for b in 0..batches {
        c.push(&wide_rows(b * rows, rows, width, None)).unwrap();
    }
    let report = c.finish().unwrap();
    assert_eq!(report.rows, (rows * batches) as u64);
    let got = i32_rows(read_back(&root).column_by_name("t").unwrap());
    assert_eq!(got.len(), rows * batches);
    for (id, row) in got.iter().enumerate() {
        assert!(row.len() == width && row[0] == (id * width) as i32 && row[width - 1] == (id * width + width - 1) as i32, "row {id}");
    }
    // A null in the third group: the writer thread stops there while the caller goes on
    // staging; a later push or finish reports the row, nothing is published, no staging
    // folder remains (the converter waits for its thread when dropped).
    let bad = dir.path().join("bad");
    let null_id = 2 * rows + 17;
    let mut c = Converter::new(&bad, &wide_rows(0, 1, width, None).schema(), opts.clone()).unwrap();
    let mut err = None;
    for b in 0..batches {
        if let Err(e) = c.push(&wide_rows(b * rows, rows, width, Some(null_id))) {
            err = Some(e.to_string());
            break;
        }
    }
    let e = match err {
        Some(e) => {
            // Once failed, the converter refuses more input and cannot publish.
            assert!(c.push(&wide_rows(0, 1, width, None)).is_err());
            assert!(c.finish().is_err());
            e
        }
        None => c.finish().err().unwrap().to_string(),
    };
    assert!(e.contains(&format!("column 't' has a null at row {null_id}")), "{e}");
    assert!(!bad.exists());
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).filter(|n| n != "ok").collect();
    assert!(left.is_empty(), "staging folders left behind: {left:?}");
    // Dropped mid-conversion with a group in flight: nothing remains either.
    let dropped = dir.path().join("dropped");
    let mut c = Converter::new(&dropped, &wide_rows(0, 1, width, None).schema(), opts).unwrap();
    c.push(&wide_rows(0, rows, width, None)).unwrap();
    c.push(&wide_rows(rows, rows, width, None)).unwrap();
    drop(c);
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).filter(|n| n != "ok").collect();
    assert!(left.is_empty(), "staging folders left behind: {left:?}");
}
