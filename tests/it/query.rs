//! DataFusion integration: Arrow type mapping round trips, pushdown proven by read counters,
//! EXPLAIN, COPY atomicity, loader determinism against the Sampler.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, BooleanArray, FixedSizeListArray, Float32Array, Int32Array, Int64Array, LargeListArray,
    LargeStringArray, ListArray, RecordBatch, StringArray, StringViewArray, StructArray, UInt16Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Fields, Int32Type, Schema};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use zrecord::arrow::Logical;
use zrecord::store::RecordType;
use zrecord::loader::{Mode, Sampler};
use zrecord::prelude::*;
use zrecord::query::{zrecord_context, zrecord_context_with_config, zrecord_error, Dataset, SessionContextExt, ZrecordTable};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn fmt_col(a: &dyn Array) -> Vec<String> {
    let f = ArrayFormatter::try_new(a, &FormatOptions::default()).unwrap();
    (0..a.len()).map(|i| f.value(i).to_string()).collect()
}

async fn collect(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}")).collect().await.unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn column(batches: &[RecordBatch], name: &str) -> Vec<String> {
    batches.iter().flat_map(|b| fmt_col(b.column_by_name(name).unwrap().as_ref())).collect()
}

fn ext_field(name: &str, dt: DataType, ext: &str, meta: &str) -> Field {
    Field::new(name, dt, false).with_metadata(HashMap::from([
        ("ARROW:extension:name".to_string(), ext.to_string()),
        ("ARROW:extension:metadata".to_string(), meta.to_string()),
    ]))
}

/// Every supported Arrow column type, written by COPY and read back: values equal (compared
/// through Arrow's own formatter), layouts as specified, offsets of sliced inputs honoured.
#[test]
fn arrow_types_round_trip_through_copy() {
    let dir = tempfile::tempdir().unwrap();
    let n = 5usize;
    let fsl_field = Arc::new(Field::new_list_field(DataType::Float32, false));
    let fst_values = Float32Array::from((0..(n * 6) as i32).map(|x| x as f32 * 0.5).collect::<Vec<_>>());
    let fst = FixedSizeListArray::new(fsl_field.clone(), 6, Arc::new(fst_values), None);
    // Nested fixed-size lists: [n, 2, 3] int32.
    let inner = FixedSizeListArray::new(Arc::new(Field::new_list_field(DataType::Int32, false)), 3, Arc::new(Int32Array::from((0..(n * 6) as i32).collect::<Vec<_>>())), None);
    let nested = FixedSizeListArray::new(Arc::new(Field::new_list_field(inner.data_type().clone(), false)), 2, Arc::new(inner), None);
    // A sliced list (offsets not starting at 0) and a LargeList.
    let big = ListArray::from_iter_primitive::<Int32Type, _, _>((0..n + 2).map(|i| Some((0..=i as i32).map(Some).collect::<Vec<_>>())));
    let sliced = big.slice(2, n);
    let large = LargeListArray::new(
        Arc::new(Field::new_list_field(DataType::UInt16, false)),
        OffsetBuffer::from_lengths([1, 2, 3, 1, 2]),
        Arc::new(UInt16Array::from((0..9u16).collect::<Vec<_>>())),
        None,
    );
    // variable_shape_tensor: {data: List<f32>, shape: FixedSizeList<int32, 2>}.
    let shapes = [[1, 2], [2, 2], [1, 1], [3, 1], [1, 3]];
    let data = ListArray::new(
        Arc::new(Field::new_list_field(DataType::Float32, false)),
        OffsetBuffer::from_lengths(shapes.iter().map(|s| (s[0] * s[1]) as usize)),
        Arc::new(Float32Array::from((0..2 + 4 + 1 + 3 + 3).map(|x| x as f32).collect::<Vec<_>>())),
        None,
    );
    let shape = FixedSizeListArray::new(
        Arc::new(Field::new_list_field(DataType::Int32, false)),
        2,
        Arc::new(Int32Array::from(shapes.iter().flatten().copied().collect::<Vec<_>>())),
        None,
    );
    let vst_fields = Fields::from(vec![Field::new("data", data.data_type().clone(), false), Field::new("shape", shape.data_type().clone(), false)]);
    let vst = StructArray::new(vst_fields.clone(), vec![Arc::new(data) as ArrayRef, Arc::new(shape)], None);
    let words = ["a", "bb", "héllo", "a string longer than twelve", "z"];
    let columns: Vec<(Field, ArrayRef)> = vec![
        (Field::new("i64", DataType::Int64, false), Arc::new(Int64Array::from(vec![-3i64, 0, 7, i64::MAX, i64::MIN]))),
        (Field::new("flag", DataType::Boolean, false), Arc::new(BooleanArray::from(vec![true, false, true, true, false]))),
        // arrow-rs writes `permutations`; accepted on read like the spec's `permutation`.
        (
            ext_field("fst", fst.data_type().clone(), "arrow.fixed_shape_tensor", r#"{"shape":[2,3],"dim_names":null,"permutations":[0,1]}"#),
            Arc::new(fst),
        ),
        (Field::new("nested", nested.data_type().clone(), false), Arc::new(nested)),
        (Field::new("sliced", sliced.data_type().clone(), false), Arc::new(sliced)),
        (Field::new("large", large.data_type().clone(), false), Arc::new(large)),
        (ext_field("vst", DataType::Struct(vst_fields), "arrow.variable_shape_tensor", r#"{"permutation":[0,1]}"#), Arc::new(vst)),
        (Field::new("s", DataType::Utf8, false), Arc::new(StringArray::from(words.to_vec()))),
        (Field::new("ls", DataType::LargeUtf8, false), Arc::new(LargeStringArray::from(words.to_vec()))),
        (Field::new("sv", DataType::Utf8View, false), Arc::new(StringViewArray::from(words.to_vec()))),
        (Field::new("bin", DataType::Binary, false), Arc::new(BinaryArray::from(vec![&b"\x00"[..], b"\x01\x02", b"x", b"yy", b"\xff"]))),
    ];
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns.into_iter().unzip();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), arrays).unwrap();
    // Layouts decided from the schema alone.
    let layouts: Vec<RecordType> = schema.fields().iter().map(|f| RecordType::of_field(f).unwrap()).collect();
    assert_eq!(layouts[0], RecordType::dense(DType::Int64, vec![]));
    assert_eq!(layouts[1], RecordType::dense(DType::Bool, vec![]));
    assert_eq!(layouts[2], RecordType::dense(DType::Float32, vec![2, 3]));
    assert_eq!(layouts[3], RecordType::dense(DType::Int32, vec![2, 3]));
    assert_eq!(layouts[5], RecordType::ragged(DType::UInt16, 1));
    assert_eq!(layouts[6], RecordType::ragged(DType::Float32, 2));
    assert_eq!(layouts[9], RecordType::ragged(DType::UInt8, 1).with_logical(Logical::Utf8));
    assert_eq!(layouts[10], RecordType::ragged(DType::UInt8, 1).with_logical(Logical::Binary));

    let rt = rt();
    rt.block_on(async {
        let ctx = zrecord_context();
        // Two batches, the second sliced, so appends continue and offsets are honoured.
        let b1 = batch.slice(0, 2);
        let b2 = batch.slice(2, 3);
        ctx.register_table("src", Arc::new(MemTable::try_new(schema.clone(), vec![vec![b1, b2]]).unwrap())).unwrap();
        let out = dir.path().join("all");
        let q = format!("COPY src TO '{}' STORED AS ZRECORD OPTIONS (codec 'zstd')", out.display());
        let r = collect(&ctx, &q).await;
        assert_eq!(column(&r, "count"), vec!["5"]);
        ctx.register_zrecord("back", &out).unwrap();
        let got = collect(&ctx, "SELECT * FROM back ORDER BY _id").await;
        let got = datafusion::arrow::compute::concat_batches(&got[0].schema(), &got).unwrap();
        for (i, f) in schema.fields().iter().enumerate() {
            let want = fmt_col(batch.column(i).as_ref());
            let have = fmt_col(got.column_by_name(f.name()).unwrap().as_ref());
            let want: Vec<String> = match f.name().as_str() {
                // bool reads back as arrow.bool8 (int8 storage).
                "flag" => want.iter().map(|v| if v == "true" { "1".into() } else { "0".into() }).collect(),
                // Nested fixed-size lists read back as one fixed_shape_tensor (row-major, flat storage).
                "nested" => want.iter().map(|v| v.replace("], [", ", ").replace("[[", "[").replace("]]", "]")).collect(),
                _ => want,
            };
            assert_eq!(have, want, "column {}", f.name());
        }
        // Read-back types: 0-D primitive, fixed_shape_tensor, List, variable_shape_tensor, Utf8View, Binary.
        let s = got.schema();
        assert_eq!(s.field_with_name("i64").unwrap().data_type(), &DataType::Int64);
        let fst = s.field_with_name("fst").unwrap();
        assert_eq!(fst.metadata()["ARROW:extension:name"], "arrow.fixed_shape_tensor");
        assert_eq!(fst.metadata()["ARROW:extension:metadata"], r#"{"shape":[2,3]}"#);
        assert!(matches!(s.field_with_name("large").unwrap().data_type(), DataType::List(_)));
        assert_eq!(s.field_with_name("vst").unwrap().metadata()["ARROW:extension:name"], "arrow.variable_shape_tensor");
        assert_eq!(s.field_with_name("ls").unwrap().data_type(), &DataType::Utf8View);
        assert_eq!(s.field_with_name("bin").unwrap().data_type(), &DataType::Binary);
        // Our read-back schema maps to the same layouts (a second COPY is the identity).
        for f in s.fields().iter().filter(|f| f.name() != "_id") {
            let i = schema.index_of(f.name()).unwrap();
            assert_eq!(RecordType::of_field(f).unwrap(), layouts[i], "{}", f.name());
        }
    });
}

#[test]
fn unsupported_types_fail_at_plan_time_naming_the_column() {
    let bad = [
        Field::new("d", DataType::Date32, false),
        Field::new("m", DataType::Struct(Fields::from(vec![Field::new("x", DataType::Int32, false)])), false),
        Field::new("ll", DataType::List(Arc::new(Field::new_list_field(DataType::List(Arc::new(Field::new_list_field(DataType::Int32, false))), false))), false),
        ext_field("p", DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Float32, false)), 6), "arrow.fixed_shape_tensor", r#"{"shape":[2,3],"permutation":[1,0]}"#),
        ext_field("w", DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Float32, false)), 6), "arrow.fixed_shape_tensor", r#"{"shape":[4,2]}"#),
    ];
    for f in &bad {
        let e = RecordType::of_field(f).unwrap_err().to_string();
        assert!(e.contains(&format!("column '{}'", f.name())), "{e}");
    }
}

fn dataset(dir: &std::path::Path, n: usize) -> std::path::PathBuf {
    let root = dir.join("ds");
    let mut w = DenseWriter::create(root.join("a"), DType::Int64, &[2], WriterOptions::default()).unwrap();
    w.append_slice(&(0..2 * n as i64).collect::<Vec<_>>()).unwrap();
    w.finish().unwrap();
    let mut w = DenseWriter::create(root.join("b"), DType::Int32, &[], WriterOptions::with_codec(Codec::Zstd)).unwrap();
    w.append_slice(&(0..n as i32).map(|i| i % 10).collect::<Vec<_>>()).unwrap();
    w.finish().unwrap();
    root
}

/// Table `t` over `root` in a context of 4 partitions and batches of 64 rows; its stores count
/// the records gathered through them.
fn counted_table(root: &std::path::Path) -> (SessionContext, Arc<ZrecordTable>) {
    let ctx = zrecord_context_with_config(SessionConfig::new().with_target_partitions(4).with_batch_size(64));
    let table = Arc::new(ZrecordTable::open(root).unwrap());
    ctx.register_table("t", table.clone()).unwrap();
    (ctx, table)
}

/// A counting reader: every store counts the records gathered through it.
#[test]
fn pushdown_reads_only_selected_records_and_streams() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, table) = counted_table(&dataset(dir.path(), 1000));
    let reads = || table.dataset().streams().iter().map(|s| s.store().unwrap().records_read()).collect::<Vec<_>>();
    rt().block_on(async {

        let r = collect(&ctx, "SELECT a FROM t WHERE _id IN (500, 3, 7, 3)").await;
        let mut a = column(&r, "a");
        a.sort();
        assert_eq!(a, vec!["[1000, 1001]", "[14, 15]", "[6, 7]"]);
        assert_eq!(reads(), vec![3, 0], "only 3 records of stream a were read, none of b");

        let r = collect(&ctx, "SELECT _id FROM t WHERE _id BETWEEN 10 AND 29 AND b = 3 ORDER BY _id").await;
        assert_eq!(column(&r, "_id"), vec!["13", "23"]);
        assert_eq!(reads(), vec![3, 20], "the _id range bounded the scan of b");

        let r = collect(&ctx, "SELECT b FROM t LIMIT 5").await;
        assert_eq!(r.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
        assert_eq!(reads(), vec![3, 25], "LIMIT 5 read 5 records");

        let r = collect(&ctx, "SELECT count(*) FROM t").await;
        assert_eq!(column(&r, "count(*)"), vec!["1000"]);
        assert_eq!(reads(), vec![3, 25], "COUNT(*) reads nothing");

        let r = collect(&ctx, "SELECT _id FROM t WHERE _id > 990").await;
        assert_eq!(r.iter().map(|b| b.num_rows()).sum::<usize>(), 9);
        assert_eq!(reads(), vec![3, 25], "an _id-only projection reads no stream");

        // Full scan: every record once, output batches bounded by batch_size, 4 partitions.
        let r = collect(&ctx, "SELECT b FROM t").await;
        assert_eq!(r.iter().map(|b| b.num_rows()).sum::<usize>(), 1000);
        assert!(r.iter().all(|b| b.num_rows() <= 64));
        assert_eq!(reads(), vec![3, 1025]);

        // EXPLAIN shows what was pushed down.
        let r = collect(&ctx, "EXPLAIN SELECT a FROM t WHERE _id IN (3, 7) AND b > 1 LIMIT 10").await;
        let plan = column(&r, "plan").join("\n");
        assert!(plan.contains("ZrecordScanExec"), "{plan}");
        assert!(plan.contains("ids=[3, 7] (2 of 1000)"), "{plan}");
        assert!(plan.contains("streams=[a, b]"), "{plan}");
        let r = collect(&ctx, "EXPLAIN SELECT b FROM t LIMIT 10").await;
        let plan = column(&r, "plan").join("\n");
        assert!(plan.contains("ids=[0..10] (10 of 1000)") && plan.contains("limit=10"), "{plan}");
    });
}

#[test]
fn copy_failure_publishes_nothing_and_errors_stay_typed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 50);
    let rt = rt();
    rt.block_on(async {
        let ctx = zrecord_context();
        ctx.register_zrecord("t", &root).unwrap();
        // A null half-way through the second column: the error names it, nothing is published,
        // no temporary folder is left behind.
        let out = dir.path().join("out");
        let q = format!("COPY (SELECT a, CASE WHEN _id = 30 THEN NULL ELSE b END AS b FROM t ORDER BY _id) TO '{}' STORED AS ZRECORD", out.display());
        let e = ctx.sql(&q).await.unwrap().collect().await.unwrap_err();
        assert!(e.to_string().contains("column 'b' has a null at row 30"), "{e}");
        assert!(matches!(zrecord_error(&e), Some(Error::InvalidArgument { .. })), "{e:?}");
        assert!(!out.exists());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers.len(), 1, "only the source dataset remains: {leftovers:?}");
        // Existing destination: typed AlreadyExists.
        let q = format!("COPY (SELECT b FROM t) TO '{}' STORED AS ZRECORD", root.display());
        let e = ctx.sql(&q).await.unwrap().collect().await.unwrap_err();
        assert!(matches!(zrecord_error(&e), Some(Error::AlreadyExists { .. })), "{e:?}");
        // Out-of-range gather: typed IndexOutOfRange.
        let e = ctx.sql("SELECT * FROM gather('t', [50])").await.unwrap_err();
        assert!(matches!(zrecord_error(&e), Some(Error::IndexOutOfRange { index: 50, len: 50, .. })), "{e:?}");
        // A successful COPY reads back equal, in order.
        let out = dir.path().join("ok");
        collect(&ctx, &format!("COPY (SELECT a, b FROM t WHERE _id >= 40 ORDER BY _id) TO '{}' STORED AS ZRECORD", out.display())).await;
        let ds = Dataset::open(&out).unwrap();
        assert_eq!(ds.len(), 10);
        assert_eq!(ds.streams().iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), vec!["a", "b"]);
        let alloc = Allocator::cpu(1 << 20);
        let Some(Store::Dense(b)) = ds.streams()[1].store() else { panic!("b is dense") };
        let all = b.bind(&alloc).read_all().unwrap();
        assert_eq!(all.as_slice::<i32>().unwrap(), &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    });
}

#[test]
fn loader_table_function_matches_the_sampler() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 100);
    let rt = rt();
    rt.block_on(async {
        let ctx = zrecord_context();
        ctx.register_zrecord("t", &root).unwrap();
        for (mode, name) in [(Mode::Sequential, "sequential"), (Mode::Iid, "iid"), (Mode::Cyclic, "cyclic")] {
            let r = collect(&ctx, &format!("SELECT _step, _id, b FROM loader('t', 16, '{name}', 42, 9)")).await;
            assert_eq!(r.len(), 9, "one batch per step");
            let s = Sampler::new(100, 16, mode, 42).unwrap();
            for (step, b) in r.iter().enumerate() {
                let ids = fmt_col(b.column(1).as_ref());
                let want: Vec<String> = s.batch(step as u64).iter().map(|i| i.to_string()).collect();
                assert_eq!(ids, want, "{name} step {step}");
                assert!(fmt_col(b.column(0).as_ref()).iter().all(|v| v == &step.to_string()));
                let labels = fmt_col(b.column(2).as_ref());
                let want: Vec<String> = s.batch(step as u64).iter().map(|i| (i % 10).to_string()).collect();
                assert_eq!(labels, want);
            }
        }
        // Endless loader: LIMIT bounds it, and only the needed steps are gathered.
        let table = ZrecordTable::open(&root).unwrap();
        let before = table.dataset().streams()[0].store().unwrap().records_read();
        ctx.register_table("t2", Arc::new(table.clone())).unwrap();
        let r = collect(&ctx, "SELECT a FROM loader('t2', 10, 'iid', 1) LIMIT 25").await;
        assert_eq!(r.iter().map(|b| b.num_rows()).sum::<usize>(), 25);
        assert_eq!(table.dataset().streams()[0].store().unwrap().records_read() - before, 30, "3 steps of 10");
        assert_eq!(table.dataset().streams()[1].store().unwrap().records_read(), 0, "unselected stream never read");
    });
}

/// Large records: output batches are capped near 32 MiB whatever the session batch_size.
#[test]
fn scan_batches_are_capped_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big");
    let rec = 1usize << 20;
    let mut w = DenseWriter::create(&p, DType::UInt8, &[rec], WriterOptions::default()).unwrap();
    let data: Vec<u8> = (0..40 * rec).map(|i| (i / rec) as u8).collect();
    w.append_slice(&data).unwrap();
    w.finish().unwrap();
    rt().block_on(async {
        let ctx = zrecord_context_with_config(SessionConfig::new().with_target_partitions(1));
        ctx.register_zrecord("big", &p).unwrap();
        let r = collect(&ctx, "SELECT big FROM big").await;
        assert_eq!(r.iter().map(|b| b.num_rows()).collect::<Vec<_>>(), vec![32, 8]);
        let last = r[1].column(0).as_any().downcast_ref::<FixedSizeListArray>().unwrap();
        assert_eq!(last.value(7).to_data().buffers()[0].as_slice()[..rec].iter().filter(|&&b| b == 39).count(), rec);
    });
}

/// Prepared statements: `_id = ANY($1)` / `_id = $1` reuse the physical plan (bound scans read
/// exactly the bound ids: read counters), other parameters re-plan per execution; both agree
/// with the same query written with literals.
#[test]
fn prepared_statements_bind_ids_and_reuse_the_plan() {
    use datafusion::common::ScalarValue;
    use zrecord::query::PreparedQuery;
    let dir = tempfile::tempdir().unwrap();
    let (ctx, table) = counted_table(&dataset(dir.path(), 1000));
    let reads = || table.dataset().streams().iter().map(|s| s.store().unwrap().records_read()).collect::<Vec<_>>();
    rt().block_on(async {

        let q = PreparedQuery::new(&ctx, "SELECT _id, a FROM t WHERE _id = ANY($1)").await.unwrap();
        assert!(q.reuses_plan(), "{q:?}");
        assert_eq!(q.parameters(), ["$1"]);
        let plan = datafusion::physical_plan::displayable(q.physical_plan().unwrap().as_ref()).indent(false).to_string();
        assert!(plan.contains("ids=bound at execution from ANY($1)"), "{plan}");
        assert_eq!(reads(), vec![0, 0], "preparing reads nothing");
        // Ids in any order, duplicates and ids past the end: rows in id order, as IN.
        let r = q.lookup(&[500, 3, 7, 3, 1000, u64::MAX]).await.unwrap();
        assert_eq!(column(&r, "_id"), vec!["3", "7", "500"]);
        assert_eq!(column(&r, "a"), vec!["[6, 7]", "[14, 15]", "[1000, 1001]"]);
        assert_eq!(reads(), vec![3, 0], "exactly the bound ids of stream a were read");
        // Each execution binds afresh; the plan is not changed by executing it.
        let r = q.lookup(&[999]).await.unwrap();
        assert_eq!(column(&r, "a"), vec!["[1998, 1999]"]);
        let r = q.lookup(&[]).await.unwrap();
        assert_eq!(r.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
        // execute() with a list value, against the literal query.
        let list = ScalarValue::List(ScalarValue::new_list_nullable(&[ScalarValue::Int64(Some(42)), ScalarValue::Int64(None), ScalarValue::Int64(Some(-1)), ScalarValue::Int64(Some(8))], &DataType::Int64));
        let r = q.execute(vec![list]).await.unwrap();
        let want = collect(&ctx, "SELECT _id, a FROM t WHERE _id IN (42, 8) ORDER BY _id").await;
        assert_eq!(column(&r, "a"), column(&want, "a"));
        assert_eq!(column(&r, "_id"), vec!["8", "42"]);
        // More ids than one output batch: batches of at most 64 rows, all of them, in order.
        let many: Vec<u64> = (0..300).map(|i| (i * 7) % 1000).collect();
        let r = q.lookup(&many).await.unwrap();
        assert!(r.iter().all(|b| b.num_rows() <= 64));
        let mut want: Vec<u64> = many.clone();
        want.sort_unstable();
        want.dedup();
        assert_eq!(column(&r, "_id"), want.iter().map(|i| i.to_string()).collect::<Vec<_>>());

        // Parameters combined with literal filters, other columns, aggregates and LIMIT.
        let q = PreparedQuery::new(&ctx, "SELECT count(*) AS n, sum(b) AS s FROM t WHERE _id = ANY($1) AND _id < 500 AND b > 2").await.unwrap();
        assert!(q.reuses_plan());
        let ids: Vec<u64> = (0..1000).step_by(3).collect();
        let r = q.lookup(&ids).await.unwrap();
        let lit = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
        let want = collect(&ctx, &format!("SELECT count(*) AS n, sum(b) AS s FROM t WHERE _id IN ({lit}) AND _id < 500 AND b > 2")).await;
        assert_eq!((column(&r, "n"), column(&r, "s")), (column(&want, "n"), column(&want, "s")));
        assert_ne!(column(&r, "n"), vec!["0"], "the statistics of an unbound scan are not an exact 0");
        let q = PreparedQuery::new(&ctx, "SELECT _id FROM t WHERE _id = ANY($1) LIMIT 2").await.unwrap();
        assert_eq!(column(&q.lookup(&[9, 1, 5, 7]).await.unwrap(), "_id"), vec!["1", "5"]);

        // One id.
        let q = PreparedQuery::new(&ctx, "SELECT b FROM t WHERE _id = $1").await.unwrap();
        assert!(q.reuses_plan());
        assert_eq!(column(&q.execute(vec![ScalarValue::UInt64(Some(13))]).await.unwrap(), "b"), vec!["3"]);
        assert_eq!(q.execute(vec![ScalarValue::UInt64(Some(5000))]).await.unwrap().iter().map(|b| b.num_rows()).sum::<usize>(), 0);
        let e = q.lookup(&[1, 2]).await.unwrap_err();
        assert!(e.to_string().contains("not an id list"), "{e}");

        // A parameter that is not an _id filter: parsed once, re-planned per execution.
        let q = PreparedQuery::new(&ctx, "SELECT _id FROM t WHERE b = $1 AND _id < $2 ORDER BY _id").await.unwrap();
        assert!(!q.reuses_plan());
        assert_eq!(q.parameters(), ["$1", "$2"]);
        let r = q.execute(vec![ScalarValue::Int32(Some(4)), ScalarValue::UInt64(Some(40))]).await.unwrap();
        assert_eq!(column(&r, "_id"), vec!["4", "14", "24", "34"]);
        // A declared PREPARE statement works the same.
        let q = PreparedQuery::new(&ctx, "PREPARE p(BIGINT[]) AS SELECT _id FROM t WHERE _id = ANY($1)").await.unwrap();
        assert!(q.reuses_plan());
        assert_eq!(column(&q.lookup(&[2, 1]).await.unwrap(), "_id"), vec!["1", "2"]);

        // Errors: wrong number of values, wrong value types, statements, named or gapped parameters.
        let q = PreparedQuery::new(&ctx, "SELECT _id FROM t WHERE _id = ANY($1)").await.unwrap();
        let e = q.execute(vec![]).await.unwrap_err();
        assert!(e.to_string().contains("1 parameters, 0 values"), "{e}");
        let e = q.execute(vec![ScalarValue::Utf8(Some("x".into()))]).await.unwrap_err();
        assert!(e.to_string().contains("$1 binds _id values"), "{e}");
        assert!(matches!(zrecord_error(&e), Some(zrecord::Error::InvalidArgument { .. })), "{e:?}");
        for bad in ["CREATE TABLE x AS SELECT 1", "SELECT _id FROM t WHERE _id = ANY($2)", "SELECT _id FROM t WHERE _id = ANY($ids)"] {
            let e = PreparedQuery::new(&ctx, bad).await.unwrap_err();
            assert!(matches!(zrecord_error(&e), Some(zrecord::Error::InvalidArgument { .. })), "{bad}: {e}");
        }
        // Running the parameterised plan without binding it is an error, not an empty result.
        let df = ctx.sql("SELECT _id FROM t WHERE _id = ANY($1)").await.unwrap();
        assert!(df.collect().await.is_err());

        // SQL PREPARE / EXECUTE: values given as SQL literals.
        collect(&ctx, "PREPARE q(BIGINT[]) AS SELECT _id, b FROM t WHERE _id = ANY($1)").await;
        let r = collect(&ctx, "EXECUTE q([17, 3, 17])").await;
        assert_eq!(column(&r, "_id"), vec!["3", "17"]);
        assert_eq!(column(&r, "b"), vec!["3", "7"]);
    });
}

/// `gather('t', $1)` prepared: the plan is reused, each execution reads exactly the bound ids
/// in their order with duplicates (as the literal `gather('t', [...])`), filters and other
/// parameters combine with it, bad ids are typed errors; the plan cache lifts the literal
/// lists of gathers over registered tables (never over paths).
#[test]
fn prepared_gathers_keep_order_and_duplicates() {
    use datafusion::common::ScalarValue;
    use zrecord::query::{PlanCache, PreparedQuery};
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 1000);
    let (ctx, table) = counted_table(&root);
    let reads = || table.dataset().streams().iter().map(|s| s.store().unwrap().records_read()).collect::<Vec<_>>();
    let list = |v: &[Option<i64>]| ScalarValue::List(ScalarValue::new_list_nullable(&v.iter().map(|&x| ScalarValue::Int64(x)).collect::<Vec<_>>(), &DataType::Int64));
    rt().block_on(async {
        let q = PreparedQuery::new(&ctx, "SELECT _id, a FROM gather('t', $1)").await.unwrap();
        assert!(q.reuses_plan(), "{q:?}");
        assert_eq!(q.parameters(), ["$1"]);
        let plan = datafusion::physical_plan::displayable(q.physical_plan().unwrap().as_ref()).indent(false).to_string();
        assert!(plan.contains("ids=bound at execution from gather($1)"), "{plan}");
        assert_eq!(reads(), vec![0, 0], "preparing reads nothing");
        let ids = [500u64, 3, 7, 3, 999, 0];
        let r = q.lookup(&ids).await.unwrap();
        assert_eq!(column(&r, "_id"), ids.iter().map(|i| i.to_string()).collect::<Vec<_>>(), "given order, duplicates kept");
        let want = collect(&ctx, "SELECT _id, a FROM gather('t', [500, 3, 7, 3, 999, 0])").await;
        assert_eq!(column(&r, "a"), column(&want, "a"));
        assert_eq!(column(&r, "a")[..2], ["[1000, 1001]".to_string(), "[6, 7]".to_string()]);
        assert_eq!(reads()[1], 0, "stream b is not read");
        // Each execution binds afresh: another order, more rows than one batch, none at all.
        let many: Vec<u64> = (0..300).map(|i| (i * 7919) % 1000).rev().collect();
        let r = q.lookup(&many).await.unwrap();
        assert_eq!(column(&r, "_id"), many.iter().map(|i| i.to_string()).collect::<Vec<_>>());
        assert!(r.iter().all(|b| b.num_rows() <= 64));
        assert_eq!(q.lookup(&[]).await.unwrap().iter().map(|b| b.num_rows()).sum::<usize>(), 0);
        // execute() with a list of signed integers.
        let r = q.execute(vec![list(&[Some(9), Some(2), Some(9)])]).await.unwrap();
        assert_eq!(column(&r, "_id"), vec!["9", "2", "9"]);

        // Bad ids: past the end (IndexError in Python), negative, NULL, not a list.
        let e = q.lookup(&[1, 1000]).await.unwrap_err();
        assert!(matches!(zrecord_error(&e), Some(zrecord::Error::IndexOutOfRange { index: 1000, len: 1000, .. })), "{e:?}");
        for (bad, what) in [(list(&[Some(1), Some(-4)]), "negative"), (list(&[Some(1), None]), "NULL"), (ScalarValue::Int64(Some(3)), "list of integers")] {
            let e = q.execute(vec![bad]).await.unwrap_err();
            assert!(matches!(zrecord_error(&e), Some(zrecord::Error::InvalidArgument { .. })), "{e:?}");
            assert!(e.to_string().contains("$1") && e.to_string().contains(what), "{e}");
        }

        // Literal filters keep the gather's order; an `_id` list parameter filters it too.
        let q = PreparedQuery::new(&ctx, "SELECT _id FROM gather('t', $1) WHERE _id < 100").await.unwrap();
        assert!(q.reuses_plan());
        assert_eq!(column(&q.lookup(&[500, 50, 3, 700, 3]).await.unwrap(), "_id"), vec!["50", "3", "3"]);
        let q = PreparedQuery::new(&ctx, "SELECT _id FROM gather('t', $1) WHERE _id = ANY($2)").await.unwrap();
        assert!(q.reuses_plan());
        assert_eq!(q.parameters(), ["$1", "$2"]);
        let r = q.execute(vec![list(&[Some(8), Some(1), Some(5), Some(8)]), list(&[Some(8), Some(5), Some(77)])]).await.unwrap();
        assert_eq!(column(&r, "_id"), vec!["8", "5", "8"]);
        // Aggregates see the bound rows (the unbound scan's statistics are not an exact 0).
        let q = PreparedQuery::new(&ctx, "SELECT count(*) AS n, sum(b) AS s FROM gather('t', $1)").await.unwrap();
        let r = q.lookup(&[13, 13, 14]).await.unwrap();
        assert_eq!((column(&r, "n"), column(&r, "s")), (vec!["3".to_string()], vec!["10".to_string()]));
        // A parameter outside the scan: re-planned per execution, the gather still bound.
        let q = PreparedQuery::new(&ctx, "SELECT _id FROM gather('t', $1) WHERE b = $2").await.unwrap();
        assert!(!q.reuses_plan());
        let r = q.execute(vec![list(&[Some(24), Some(4), Some(5), Some(14), Some(4)]), ScalarValue::Int32(Some(4))]).await.unwrap();
        assert_eq!(column(&r, "_id"), vec!["24", "4", "14", "4"]);

        // SQL PREPARE / EXECUTE bind placeholders of expressions, not a table function's
        // argument: errors, never rows of an unbound gather.
        let e = ctx.sql("PREPARE g(BIGINT[]) AS SELECT _id FROM gather('t', $1)").await.unwrap_err();
        assert!(e.to_string().contains("parameters"), "{e}");
        let e = ctx.sql("SELECT _id FROM gather('t', $1)").await.unwrap().collect().await.unwrap_err();
        assert!(e.to_string().contains("prepared statement's execution"), "{e}");

        // The plan cache: literal gathers of a registered table share one prepared shape.
        let cache = PlanCache::default();
        for ids in [vec![5u64, 2, 5], vec![999, 0]] {
            let text = format!("SELECT _id FROM gather('t', [{}])", ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", "));
            let (q, values) = cache.prepared(&ctx, &text).await.expect("cached");
            assert_eq!(column(&q.execute(values).await.unwrap(), "_id"), ids.iter().map(|i| i.to_string()).collect::<Vec<_>>());
        }
        assert_eq!(cache.len(), 1);
        // Ids past the table go the usual way, which refuses them while planning.
        assert!(cache.prepared(&ctx, "SELECT _id FROM gather('t', [1, 1000])").await.is_none());
        let e = ctx.sql("SELECT _id FROM gather('t', [1, 1000])").await.unwrap_err();
        assert!(matches!(zrecord_error(&e), Some(zrecord::Error::IndexOutOfRange { index: 1000, .. })), "{e:?}");
        // A path names whatever is there now: never cached (and still answered by plain SQL).
        let by_path = format!("SELECT _id FROM gather('{}', [3, 1])", root.display());
        assert!(cache.prepared(&ctx, &by_path).await.is_none());
        assert_eq!(column(&collect(&ctx, &by_path).await, "_id"), vec!["3", "1"]);
    });
}

/// A COPY of a partitioned input writes one part per partition, in parallel, and commits the
/// root once: it reads back (SQL and Rust) as the source rows in source order, equal to a
/// one-partition COPY of the same query; gathers across parts keep their order.
#[test]
fn partitioned_copy_writes_parts_and_reads_back_in_source_order() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    rt().block_on(async {
        let one = zrecord_context_with_config(SessionConfig::new().with_target_partitions(1));
        let src = d.join("src.parquet");
        // One Parquet file of 30 row groups: the COPY splits it by byte range into partitions.
        let make = format!(
            "COPY (SELECT value AS k, value % 7 AS m, CAST(value * 3 AS VARCHAR) AS s, range(value, value + value % 4 + 1) AS v \
             FROM generate_series(0, 2999)) TO '{}' STORED AS PARQUET OPTIONS (max_row_group_size 100)",
            src.display()
        );
        collect(&one, &make).await;
        let four = zrecord_context_with_config(SessionConfig::new().with_target_partitions(4).with_batch_size(64));
        let parted = d.join("parted");
        let copy = |out: &std::path::Path| format!("COPY (SELECT k, m, s, v FROM '{}' WHERE m <> 3) TO '{}' STORED AS ZRECORD", src.display(), out.display());
        let plan = column(&collect(&four, &format!("EXPLAIN {}", copy(&parted))).await, "plan").join("\n");
        assert!(plan.contains("ZrecordCommitExec") && plan.contains("ZrecordPartsExec") && plan.contains("parts=4"), "{plan}");
        let r = collect(&four, &copy(&parted)).await;
        let expected_rows = (0..3000).filter(|v| v % 7 != 3).count();
        assert_eq!(column(&r, "count"), vec![expected_rows.to_string()]);
        let single = d.join("single");
        collect(&one, &copy(&single)).await;

        // The root lists 4 parts in order (dataset.json version 2); the one-partition COPY is
        // a plain root (version 1).
        let m: serde_json::Value = serde_json::from_slice(&std::fs::read(parted.join("dataset.json")).unwrap()).unwrap();
        assert_eq!(m["version"], 2);
        let parts = m["parts"].as_array().unwrap();
        assert_eq!(parts.len(), 4);
        assert_eq!(parts.iter().map(|p| p["record_count"].as_u64().unwrap()).sum::<u64>(), expected_rows as u64);
        // Byte ranges of the file: most partitions get row groups (an empty part is a valid part).
        assert!(parts.iter().filter(|p| p["record_count"].as_u64().unwrap() > 0).count() >= 3, "the file was split: {m}");
        let m1: serde_json::Value = serde_json::from_slice(&std::fs::read(single.join("dataset.json")).unwrap()).unwrap();
        assert_eq!(m1["version"], 1);
        assert!(m1.get("parts").is_none());
        let hidden: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with('.')).collect();
        assert!(hidden.is_empty(), "no staging folder left: {hidden:?}");

        // Both read back as the source's rows in source order, _id numbering them.
        let want = collect(&one, &format!("SELECT k, m, s, v FROM '{}' WHERE m <> 3", src.display())).await;
        for root in [&parted, &single] {
            let ctx = zrecord_context_with_config(SessionConfig::new().with_target_partitions(3).with_batch_size(50));
            ctx.register_zrecord("t", root).unwrap();
            let got = collect(&ctx, "SELECT _id, k, m, s, v FROM t ORDER BY _id").await;
            for c in ["k", "m", "s", "v"] {
                assert_eq!(column(&got, c), column(&want, c), "column {c} of {}", root.display());
            }
            assert_eq!(column(&got, "_id"), (0..expected_rows).map(|i| i.to_string()).collect::<Vec<_>>());
            // gather across part boundaries, repeats, any order.
            let n = expected_rows;
            let ids = [n - 1, 0, n / 2, 0, n / 4 + 1, 3 * n / 4];
            let list = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
            let g = collect(&ctx, &format!("SELECT k, v FROM gather('t', [{list}])")).await;
            let wk = column(&want, "k");
            let wv = column(&want, "v");
            assert_eq!(column(&g, "k"), ids.iter().map(|&i| wk[i].clone()).collect::<Vec<_>>());
            assert_eq!(column(&g, "v"), ids.iter().map(|&i| wv[i].clone()).collect::<Vec<_>>());
            let agg = collect(&ctx, "SELECT m, count(*) AS c, sum(k) AS t FROM t GROUP BY m ORDER BY m").await;
            let agg_want = collect(&one, &format!("SELECT m, count(*) AS c, sum(k) AS t FROM '{}' WHERE m <> 3 GROUP BY m ORDER BY m", src.display())).await;
            assert_eq!((column(&agg, "c"), column(&agg, "t")), (column(&agg_want, "c"), column(&agg_want, "t")));
        }

        // Rust API: one source per stream over the parts; a batch spanning parts equals the
        // one-partition root's.
        let (a, b) = (Dataset::open(&parted).unwrap(), Dataset::open(&single).unwrap());
        assert_eq!(a.parts().len(), 4);
        assert_eq!((a.len(), b.len()), (expected_rows as u64, expected_rows as u64));
        let alloc = Allocator::cpu(1 << 22);
        let ids: Vec<u64> = (0..expected_rows as u64).rev().step_by(37).collect();
        for (sa, sb) in a.streams().iter().zip(b.streams()) {
            assert_eq!(sa.name, sb.name);
            assert_eq!(sa.logical(), sb.logical());
            let va = zrecord::store::SourceView::new(sa.source.clone(), &alloc).gather(&ids).unwrap();
            let vb = zrecord::store::SourceView::new(sb.source.clone(), &alloc).gather(&ids).unwrap();
            match (va, vb) {
                (zrecord::store::Batch::Dense(x), zrecord::store::Batch::Dense(y)) => assert_eq!(x.as_bytes(), y.as_bytes()),
                (zrecord::store::Batch::Ragged(x), zrecord::store::Batch::Ragged(y)) => {
                    assert_eq!(x.values().as_bytes(), y.values().as_bytes());
                    assert_eq!(x.cu_seqlens_slice(), y.cu_seqlens_slice());
                    assert_eq!(x.shapes_slice(), y.shapes_slice());
                }
                _ => panic!("stream {} differs in kind", sa.name),
            }
        }

        // An existing destination is refused before anything is written.
        let e = four.sql(&copy(&parted)).await.unwrap().collect().await.unwrap_err();
        assert!(matches!(zrecord_error(&e), Some(Error::AlreadyExists { .. })), "{e:?}");
        // A failing part (a null in one partition) publishes nothing.
        let bad = d.join("bad");
        let q = format!("COPY (SELECT k, CASE WHEN k = 2900 THEN NULL ELSE m END AS m FROM '{}') TO '{}' STORED AS ZRECORD", src.display(), bad.display());
        let e = four.sql(&q).await.unwrap().collect().await.unwrap_err();
        assert!(e.to_string().contains("column 'm' has a null"), "{e}");
        assert!(!bad.exists() && Dataset::open(&bad).is_err());

        // A root whose parts disagree with its dataset.json does not open.
        let broken = d.join("broken");
        copy_dir(&parted, &broken);
        let mut m2 = m.clone();
        m2["parts"][1]["record_count"] = serde_json::json!(m2["parts"][1]["record_count"].as_u64().unwrap() + 1);
        m2["record_count"] = serde_json::json!(m2["record_count"].as_u64().unwrap() + 1);
        std::fs::write(broken.join("dataset.json"), serde_json::to_vec(&m2).unwrap()).unwrap();
        assert!(matches!(Dataset::open(&broken), Err(Error::Corrupt { .. })));
        m2 = m.clone();
        m2["parts"][0]["path"] = serde_json::json!("../single");
        std::fs::write(broken.join("dataset.json"), serde_json::to_vec(&m2).unwrap()).unwrap();
        assert!(matches!(Dataset::open(&broken), Err(Error::Corrupt { .. })));
    });
}

/// A partitioned COPY where a part fails at a random place while its siblings are busy
/// writing (8 parts on 2 cores, and an unrelated COPY running at the same time): the error is
/// always the failing part's own (never a sibling's cancellation or a missing staging file),
/// nothing is published, no staging folder stays behind, and the concurrent COPY is unharmed.
#[test]
fn partitioned_copy_first_failure_wins_under_contention() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    rt().block_on(async {
        let one = zrecord_context_with_config(SessionConfig::new().with_target_partitions(1));
        let src = d.join("src.parquet");
        let rows = 16_000u64;
        collect(
            &one,
            &format!(
                "COPY (SELECT value AS k, value % 5 AS m, repeat('x', CAST(value % 64 + 1 AS INT)) AS s FROM generate_series(0, {})) \
                 TO '{}' STORED AS PARQUET OPTIONS (max_row_group_size 250)",
                rows - 1,
                src.display()
            ),
        )
        .await;
        let eight = zrecord_context_with_config(SessionConfig::new().with_target_partitions(8).with_batch_size(50));
        // A fixed-seed walk over failing rows: first, last, near part boundaries, inside parts,
        // and two failing parts at once.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % rows
        };
        let mut cases: Vec<Vec<u64>> = vec![vec![0], vec![rows - 1], vec![rows / 8], vec![rows / 2 - 1]];
        cases.extend((0..8).map(|_| vec![next()]));
        cases.extend((0..4).map(|_| vec![next(), next()]));
        for (i, bad_rows) in cases.iter().enumerate() {
            let list = bad_rows.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
            let bad = d.join(format!("bad{i}"));
            let good = d.join(format!("good{i}"));
            let q_bad = format!(
                "COPY (SELECT k, CASE WHEN k IN ({list}) THEN NULL ELSE m END AS m, s FROM '{}') TO '{}' STORED AS ZRECORD",
                src.display(),
                bad.display()
            );
            let q_good = format!("COPY (SELECT k, m, s FROM '{}' WHERE k % 3 = 1) TO '{}' STORED AS ZRECORD", src.display(), good.display());
            let (b, g) = tokio::join!(async { eight.sql(&q_bad).await.unwrap().collect().await }, async { eight.sql(&q_good).await.unwrap().collect().await });
            let e = b.expect_err("a COPY with a null in a non-null column fails");
            let msg = e.to_string();
            assert!(msg.contains("column 'm' has a null"), "case {i} (rows {list}): {msg}");
            assert!(matches!(zrecord_error(&e), Some(Error::InvalidArgument { .. })), "case {i}: {e:?}");
            assert!(!bad.exists() && Dataset::open(&bad).is_err(), "case {i}: nothing is published");
            let g = g.unwrap();
            assert_eq!(column(&g, "count"), vec![(rows / 3).to_string()], "case {i}: the concurrent COPY");
            let ds = Dataset::open(&good).unwrap();
            assert_eq!(ds.len(), rows / 3);
            let left: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with('.')).collect();
            assert!(left.is_empty(), "case {i}: staging left behind: {left:?}");
        }
        // The last good root reads back as the filtered source, in order.
        let ctx = zrecord_context();
        let last = d.join(format!("good{}", cases.len() - 1));
        ctx.register_zrecord("t", &last).unwrap();
        let got = collect(&ctx, "SELECT k FROM t ORDER BY _id").await;
        assert_eq!(column(&got, "k"), (0..rows).filter(|k| k % 3 == 1).map(|k| k.to_string()).collect::<Vec<_>>());
    });
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}
