//! The seams: a record source defined here (not in `src/`) is loaded by the Loader, scanned by
//! SQL and read through the Arrow loader without touching those layers; format-v2 logical
//! types and empty records; positional-read byte sources; metadata soundness of exported
//! ragged batches.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatchReader};
use arrow_schema::DataType;
use zrecord::arrow::{ScanColumn, Scanner};
use zrecord::loader::{Loader, LoaderBatchReader, LoaderOptions, Mode, Sampler};
use zrecord::prelude::*;
use zrecord::query::{zrecord_context, ZrecordTable};
use zrecord::store::{with_logical, LocalFolder, ReadMode, Selection, Stream};

/// A toy source: record `i` is the int32 run `[i, i + 1, ..., i + (i % 4)]` (ragged ndim 1),
/// computed on demand. It lives in this test, not in the crate.
#[derive(Debug)]
struct Runs {
    n: u64,
}

fn run(i: u64) -> Vec<i32> {
    (0..=(i % 4)).map(|k| (i + k) as i32).collect()
}

impl RecordSource for Runs {
    fn name(&self) -> String {
        "runs".into()
    }
    fn len(&self) -> u64 {
        self.n
    }

    fn record_type(&self) -> zrecord::store::RecordType {
        zrecord::store::RecordType { dtype: DType::Int32, layout: Layout::Ragged { ndim: 1 }, logical: zrecord::store::Logical::Tensor }
    }
    fn gather(&self, ids: Ids<'_>, allocator: &Allocator, _: &ReadOptions) -> Result<Batch> {
        ids.validate(self.n, Path::new("runs"))?;
        let recs: Vec<Vec<i32>> = (0..ids.len()).map(|k| run(ids.get(k))).collect();
        let shapes: Vec<[usize; 1]> = recs.iter().map(|r| [r.len()]).collect();
        let pairs: Vec<(&[i32], &[usize])> = recs.iter().zip(&shapes).map(|(r, s)| (&r[..], &s[..])).collect();
        Ok(Batch::Ragged(RaggedBatch::from_records(allocator, 1, &pairs)?))
    }
}

/// A dense toy source: record `i` is the float32 pair `[i, -i]`.
#[derive(Debug)]
struct Pairs {
    n: u64,
}

impl RecordSource for Pairs {
    fn name(&self) -> String {
        "pairs".into()
    }
    fn len(&self) -> u64 {
        self.n
    }

    fn record_type(&self) -> zrecord::store::RecordType {
        zrecord::store::RecordType { dtype: DType::Float32, layout: Layout::Dense { item_shape: vec![2] }, logical: zrecord::store::Logical::Tensor }
    }
    fn gather(&self, ids: Ids<'_>, allocator: &Allocator, _: &ReadOptions) -> Result<Batch> {
        ids.validate(self.n, Path::new("pairs"))?;
        let v: Vec<f32> = (0..ids.len()).flat_map(|k| [ids.get(k) as f32, -(ids.get(k) as f32)]).collect();
        Ok(Batch::Dense(Tensor::from_slice(allocator, &v, &[ids.len(), 2])?))
    }
}

fn toy_dataset(n: u64) -> Dataset {
    Dataset::from_streams(
        "toy".into(),
        vec![Stream::new("pairs", Arc::new(Pairs { n })), Stream::new("runs", Arc::new(Runs { n }))],
    )
    .unwrap()
}

#[test]
fn a_toy_source_is_loaded_by_the_loader() {
    let alloc = Allocator::cpu(1 << 20);
    let streams = vec![
        ("pairs".to_string(), vec![SourceView::new(Arc::new(Pairs { n: 50 }), &alloc)]),
        ("runs".to_string(), vec![SourceView::new(Arc::new(Runs { n: 50 }), &alloc)]),
    ];
    let sampler = Sampler::new(50, 10, Mode::Cyclic, 7).unwrap();
    let mut loader = Loader::new(streams, sampler.clone(), LoaderOptions { workers: 2, prefetch: 2, rank: 0, world_size: 1 }).unwrap();
    let mut seen = Vec::new();
    for step in 0..5 {
        let parts = loader.next_step().unwrap().unwrap();
        assert_eq!(parts.len(), 1);
        let p = &parts[0];
        assert_eq!(p.step, step);
        assert_eq!(p.ids, sampler.batch(step), "ids come from the sampler, in order");
        let pairs = p.values[0].1.as_dense().unwrap().as_slice::<f32>().unwrap().to_vec();
        let runs = p.values[1].1.as_ragged().unwrap();
        for (k, &id) in p.ids.iter().enumerate() {
            assert_eq!(&pairs[2 * k..2 * k + 2], &[id as f32, -(id as f32)]);
            assert_eq!(runs.record(k).unwrap().as_slice::<i32>().unwrap(), &run(id)[..]);
        }
        seen.extend_from_slice(&p.ids);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..50).collect::<Vec<_>>(), "one cyclic epoch covers every record once");
}

#[tokio::test]
async fn a_toy_source_is_scanned_by_sql() {
    let ctx = zrecord_context();
    ctx.register_table("toy", Arc::new(ZrecordTable::new(toy_dataset(40)).unwrap())).unwrap();
    let b = ctx.sql("SELECT _id, pairs, runs FROM toy WHERE _id IN (33, 2, 17) ORDER BY _id").await.unwrap().collect().await.unwrap();
    let b = datafusion::arrow::compute::concat_batches(&b[0].schema(), &b).unwrap();
    assert_eq!(b.column(0).as_primitive::<arrow_array::types::UInt64Type>().values(), &[2, 17, 33]);
    let runs = b.column(2).as_list::<i32>();
    for (row, id) in [2u64, 17, 33].iter().enumerate() {
        let v = runs.value(row);
        assert_eq!(v.as_primitive::<arrow_array::types::Int32Type>().values(), &run(*id)[..]);
    }
    // gather() and loader() table functions work on it too.
    let g = ctx.sql("SELECT _id FROM gather('toy', [5, 5, 1])").await.unwrap().collect().await.unwrap();
    assert_eq!(g[0].column(0).as_primitive::<arrow_array::types::UInt64Type>().values(), &[5, 5, 1]);
    let l = ctx.sql("SELECT _id, runs FROM loader('toy', 8, 'sequential', 0, 2)").await.unwrap().collect().await.unwrap();
    let ids: Vec<u64> = l.iter().flat_map(|b| b.column(0).as_primitive::<arrow_array::types::UInt64Type>().values().to_vec()).collect();
    assert_eq!(ids, (0..16).collect::<Vec<_>>());
    // Out of range ids are typed errors from the source, through SQL.
    assert!(ctx.sql("SELECT * FROM gather('toy', [40])").await.is_err());
}

#[test]
fn a_toy_source_reads_through_the_arrow_loader_and_scanner() {
    let alloc = Allocator::default();
    let streams = vec![("runs".to_string(), vec![SourceView::new(Arc::new(Runs { n: 12 }), &alloc)])];
    let r = LoaderBatchReader::new(streams, Sampler::new(12, 4, Mode::Sequential, 0).unwrap(), LoaderOptions::default(), Some(3)).unwrap();
    let schema = r.schema();
    let batches: Vec<_> = r.collect::<std::result::Result<_, _>>().unwrap();
    assert_eq!(batches.len(), 3);
    assert_eq!(schema.field(2).data_type(), batches[0].column(2).data_type(), "schema derived without a read matches the data");
    let scanner = Scanner::new(toy_dataset(12), &alloc);
    let cols = scanner.all_columns();
    let mut reader = scanner.scan(Selection::List(Arc::new(vec![11, 0])), &cols, 1).unwrap();
    let first = reader.next_batch().unwrap().unwrap();
    assert_eq!(first.num_rows(), 1);
    assert_eq!(first.column(0).as_primitive::<arrow_array::types::UInt64Type>().value(0), 11);
    assert_eq!(reader.next_batch().unwrap().unwrap().column(0).as_primitive::<arrow_array::types::UInt64Type>().value(0), 0);
    assert!(reader.next_batch().is_none());
    // A projection reads only the streams it names.
    let only_id = scanner.scan(Selection::all(12), &[ScanColumn::Id], 100).unwrap();
    assert_eq!(only_id.schema().fields().len(), 1);
}

#[derive(Debug)]
struct Liar;

impl RecordSource for Liar {
    fn name(&self) -> String {
        "liar".into()
    }
    fn len(&self) -> u64 {
        10
    }

    fn record_type(&self) -> zrecord::store::RecordType {
        zrecord::store::RecordType { dtype: DType::Float32, layout: Layout::Dense { item_shape: vec![3] }, logical: zrecord::store::Logical::Tensor }
    }
    fn gather(&self, ids: Ids<'_>, allocator: &Allocator, _: &ReadOptions) -> Result<Batch> {
        // Wrong item shape: a broken source must give an error, not a wrong column.
        Ok(Batch::Dense(Tensor::from_slice(allocator, &vec![0f32; ids.len() * 2], &[ids.len(), 2])?))
    }
}

#[test]
fn a_source_that_breaks_the_contract_is_an_error() {
    let v = SourceView::new(Arc::new(Liar), &Allocator::default());
    let e = v.gather(&[1, 2]).unwrap_err();
    assert!(e.to_string().contains("liar"), "{e}");
}

fn write_texts(path: &Path, texts: &[&str], options: WriterOptions) -> Result<std::path::PathBuf> {
    let bytes: Vec<&[u8]> = texts.iter().map(|t| t.as_bytes()).collect();
    let shapes: Vec<[usize; 1]> = bytes.iter().map(|b| [b.len()]).collect();
    let packed = PackedRagged::from_records(1, bytes.iter().zip(&shapes).map(|(b, s)| (*b, &s[..])))?;
    let mut w = RaggedWriter::create(path, DType::UInt8, 1, options)?;
    w.append(&packed.as_input())?;
    w.finish()
}

#[tokio::test]
async fn v2_utf8_stores_read_back_as_strings_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let texts = ["hello", "", "zürich", "a string longer than twelve bytes", ""];
    let p = dir.path().join("text");
    write_texts(&p, &texts, WriterOptions::with_codec(Codec::Zstd).logical(Logical::Utf8).allow_empty(true)).unwrap();
    let store = Store::open(&p).unwrap();
    assert_eq!((store.logical(), store.format_version(), store.allows_empty()), (Logical::Utf8, 2, true));
    let want: Vec<Option<&str>> = texts.iter().map(|t| Some(*t)).collect();
    // SQL over the store opened alone.
    let ctx = zrecord_context();
    ctx.register_table("t", Arc::new(ZrecordTable::open(&p).unwrap())).unwrap();
    let b = ctx.sql("SELECT text FROM t ORDER BY _id").await.unwrap().collect().await.unwrap();
    assert_eq!(b[0].schema().field(0).data_type(), &DataType::Utf8View);
    assert_eq!(b[0].column(0).as_string_view().iter().collect::<Vec<_>>(), want);
    // The Arrow loader.
    let alloc = Allocator::default();
    let streams = vec![("text".to_string(), vec![SourceView::new(store.source(), &alloc)])];
    let r = LoaderBatchReader::new(streams, Sampler::new(5, 5, Mode::Sequential, 0).unwrap(), LoaderOptions::default(), Some(1)).unwrap();
    let lb = r.into_iter().next().unwrap().unwrap();
    assert_eq!(lb.column(2).as_string_view().iter().collect::<Vec<_>>(), want);
    // The scanner.
    let scanner = Scanner::new(Dataset::open(&p).unwrap(), &alloc);
    let sb = scanner.scan(Selection::all(5), &[ScanColumn::Stream(0)], 10).unwrap().next_batch().unwrap().unwrap();
    assert_eq!(sb.column(0).as_string_view().iter().collect::<Vec<_>>(), want);
    // Plain ragged views still return the bytes.
    let RaggedStore { .. } = match &store { Store::Ragged(r) => r.clone(), Store::Dense(_) => panic!() };
    let Store::Ragged(rs) = store else { panic!() };
    let b = rs.bind(&alloc).gather(&[2, 1]).unwrap();
    assert_eq!(b.cu_seqlens_slice(), &[0, "zürich".len() as i32, "zürich".len() as i32]);
    assert_eq!(b.shapes_slice(), &[7, 0]);
}

#[test]
fn logical_types_are_checked_at_create() {
    let dir = tempfile::tempdir().unwrap();
    let e = RaggedWriter::create(dir.path().join("a"), DType::Int32, 1, WriterOptions::default().logical(Logical::Utf8)).err().unwrap();
    assert!(matches!(e, Error::InvalidArgument { name: "logical", .. }), "{e}");
    let e = DenseWriter::create(dir.path().join("b"), DType::UInt8, &[3], WriterOptions::default().allow_empty(true)).err().unwrap();
    assert!(matches!(e, Error::InvalidArgument { name: "allow_empty", .. }), "{e}");
    // A version-1 store read as strings through with_logical; a wrong one is refused.
    let src = Arc::new(Pairs { n: 1 });
    assert!(with_logical(src, Logical::Utf8).is_err());
}

#[test]
fn empty_records_round_trip_when_allowed_and_are_refused_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    // 2-D records with zero extents, interleaved with nonempty ones.
    let recs: Vec<(Vec<i16>, [usize; 2])> = (0..40)
        .map(|i| {
            let shape = if i % 3 == 0 { [0, i % 5] } else { [i % 4 + 1, 2] };
            ((0..(shape[0] * shape[1]) as i16).map(|v| v * i as i16).collect(), shape)
        })
        .collect();
    let packed = PackedRagged::from_records(2, recs.iter().map(|(d, s)| (&d[..], &s[..]))).unwrap();
    for codec in [Codec::Raw, Codec::Zstd] {
        let p = dir.path().join(format!("e-{codec}"));
        let mut w = RaggedWriter::create(&p, DType::Int16, 2, WriterOptions::with_codec(codec).allow_empty(true).data_shards(3)).unwrap();
        w.append(&packed.as_input()).unwrap();
        w.finish().unwrap();
        for mode in [ReadMode::Mmap, ReadMode::Pread] {
            let Store::Ragged(s) = Store::open_at(&LocalFolder::new(&p, mode)).unwrap() else { panic!() };
            let ids: Vec<u64> = (0..40).rev().chain([0, 3, 3]).collect();
            let b = s.bind(&Allocator::default()).gather(&ids).unwrap();
            for (k, &id) in ids.iter().enumerate() {
                let (data, shape) = &recs[id as usize];
                let t = b.record(k).unwrap();
                assert_eq!(t.shape(), &shape[..], "{codec} {mode:?} record {id}");
                assert_eq!(t.as_slice::<i16>().unwrap(), &data[..]);
            }
            assert_eq!(s.verify().unwrap(), 40);
        }
    }
    // The default writer refuses empty records, writing nothing.
    let p = dir.path().join("strict");
    let mut w = RaggedWriter::create(&p, DType::Int16, 2, WriterOptions::default()).unwrap();
    let e = w.append(&packed.as_input()).unwrap_err();
    assert!(matches!(e, Error::InvalidRagged { .. }) && e.to_string().contains("allow_empty"), "{e}");
    assert_eq!(w.len(), 0);
}

#[test]
fn pread_byte_sources_read_what_mmap_reads() {
    let dir = tempfile::tempdir().unwrap();
    let n = 300usize;
    let data: Vec<u32> = (0..n as u32 * 16).map(|v| v.wrapping_mul(2_654_435_761)).collect();
    let ids: Vec<u64> = (0..n as u64).map(|i| (i * 37) % n as u64).chain([5, 5, 299]).collect();
    for (name, opts) in [
        ("raw", WriterOptions::default()),
        ("zstd", WriterOptions::with_codec(Codec::Zstd)),
        ("dict", WriterOptions::zstd_dict(zrecord::store::train_dict(&vec![vec![7u8; 64]; 200][..], 4096).unwrap_or_else(|_| vec![1; 64]))),
    ] {
        let p = dir.path().join(name);
        let mut w = match DenseWriter::create(&p, DType::UInt32, &[16], opts.clone()) {
            Ok(w) => w,
            Err(_) => continue, // a tiny dictionary may be refused by zstd: nothing to compare
        };
        w.append_slice(&data).unwrap();
        w.finish().unwrap();
        let alloc = Allocator::default();
        let mapped = DenseStore::open(&p).unwrap().bind(&alloc).gather(&ids).unwrap();
        let Store::Dense(pread) = Store::open_at(&LocalFolder::new(&p, ReadMode::Pread)).unwrap() else { panic!() };
        let got = pread.bind(&alloc).gather(&ids).unwrap();
        assert_eq!(got.as_bytes(), mapped.as_bytes(), "{name}");
        assert_eq!(pread.verify().unwrap(), n as u64);
    }
    // Damage is caught the same way through positional reads.
    let p = dir.path().join("zstd");
    let shard = p.join("data-000.bin"); // one small window: every record is in shard 0
    let mut bytes = std::fs::read(&shard).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 0x40;
    std::fs::write(&shard, &bytes).unwrap();
    let Store::Dense(s) = Store::open_at(&LocalFolder::new(&p, ReadMode::Pread)).unwrap() else { panic!() };
    let all: Vec<u64> = (0..n as u64).collect();
    assert!(s.bind(&Allocator::default()).gather(&all).unwrap_err().is_corruption());
    assert!(s.verify().unwrap_err().is_corruption());
}

#[test]
fn written_garbage_in_exported_metadata_is_an_error_not_a_wild_read() {
    let alloc = Allocator::default();
    let recs: Vec<Vec<i32>> = vec![vec![1, 2, 3], vec![4], vec![5, 6]];
    let shapes: Vec<[usize; 1]> = recs.iter().map(|r| [r.len()]).collect();
    let pairs: Vec<(&[i32], &[usize])> = recs.iter().zip(&shapes).map(|(r, s)| (&r[..], &s[..])).collect();
    for (field, value) in [("cu", 1_000_000i64), ("cu", -5), ("shapes", 1 << 40)] {
        let b = RaggedBatch::from_records(&alloc, 1, &pairs).unwrap();
        assert_eq!(b.to_tensors().unwrap().len(), 3);
        // A DLPack consumer that ignores the read-only flag writes through the exported pointer.
        let t = if field == "cu" { b.cu_seqlens() } else { b.shapes() };
        let dl = t.to_dlpack_versioned(true);
        // SAFETY (test): simulate a foreign writer; the pointer and length come from the export.
        unsafe {
            let m = dl.as_ptr();
            let p = (*m).dl_tensor.data as *mut u8;
            if field == "cu" {
                *(p as *mut i32).add(2) = value as i32;
            } else {
                *(p as *mut u64).add(1) = value as u64;
            }
            ((*m).deleter.unwrap())(m);
        }
        let e = b.to_tensors().unwrap_err();
        assert!(matches!(e, Error::InvalidRagged { .. }), "{field}={value}: {e}");
        assert!(b.record(1).is_err());
        assert!(zrecord::arrow::ragged_to_arrow("x", &b).is_err());
    }
}
