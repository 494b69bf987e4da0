//! Loader: stream alignment across views, in-order delivery for any worker count, exact
//! resume, bounded in-flight batches, prompt close, rank slicing and argument errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use zrecord::loader::{Batch, IdSource, Loader, LoaderOptions, Mode, PositionBatch, Sampler, SourceView};
use zrecord::prelude::*;

const N: usize = 240;

/// A dense store whose record i is [i, 2i] and a ragged one whose record i is (i % 5 + 1) copies of i.
fn fixtures(dir: &std::path::Path) -> (DenseStore, RaggedStore) {
    let dense: Vec<i64> = (0..N as i64).flat_map(|i| [i, 2 * i]).collect();
    let mut w = DenseWriter::create(dir.join("d"), DType::Int64, &[2], WriterOptions::with_codec(Codec::Zstd)).unwrap();
    w.append_slice(&dense).unwrap();
    w.finish().unwrap();
    let recs: Vec<Vec<i32>> = (0..N).map(|i| vec![i as i32; i % 5 + 1]).collect();
    let shapes: Vec<Vec<usize>> = recs.iter().map(|r| vec![r.len()]).collect();
    let packed = PackedRagged::from_records(1, recs.iter().zip(&shapes).map(|(r, s)| (&r[..], &s[..]))).unwrap();
    let mut w = RaggedWriter::create(dir.join("r"), DType::Int32, 1, WriterOptions::default()).unwrap();
    w.append(&packed.as_input()).unwrap();
    w.finish().unwrap();
    (DenseStore::open(dir.join("d")).unwrap(), RaggedStore::open(dir.join("r")).unwrap())
}

fn streams(d: &DenseStore, r: &RaggedStore, positions: usize) -> Vec<(String, Vec<SourceView>)> {
    let allocs: Vec<Allocator> = (0..positions).map(|_| Allocator::cpu(8 << 20)).collect();
    vec![
        ("x".to_string(), allocs.iter().map(|a| SourceView::from(d.bind(a))).collect()),
        ("tok".to_string(), allocs.iter().map(|a| SourceView::from(r.bind(a))).collect()),
    ]
}

fn check_aligned(shards: &[PositionBatch]) {
    for sh in shards {
        let Batch::Dense(x) = &sh.values[0].1 else { panic!("x is dense") };
        let Batch::Ragged(t) = &sh.values[1].1 else { panic!("tok is ragged") };
        let xs = x.as_slice::<i64>().unwrap();
        for (k, &id) in sh.ids.iter().enumerate() {
            assert_eq!(xs[2 * k], id as i64);
            assert_eq!(xs[2 * k + 1], 2 * id as i64);
            let rec = t.record(k).unwrap();
            assert_eq!(rec.as_slice::<i32>().unwrap(), &vec![id as i32; id as usize % 5 + 1][..]);
        }
    }
}

fn run(workers: usize, steps: usize, start: u64) -> Vec<Vec<u64>> {
    let dir = tempfile::tempdir().unwrap();
    let (d, r) = fixtures(dir.path());
    let s = Sampler::new(N as u64, 24, Mode::Cyclic, 9).unwrap();
    let mut l = Loader::new(streams(&d, &r, 3), s, LoaderOptions { workers, prefetch: 2, ..Default::default() }).unwrap();
    l.seek(start).unwrap();
    let mut out = Vec::new();
    for _ in 0..steps {
        let shards = l.next().unwrap().unwrap();
        assert_eq!(shards.len(), 3);
        check_aligned(&shards);
        out.push(shards.iter().flat_map(|s| s.ids.clone()).collect());
    }
    l.close();
    out
}

#[test]
fn order_and_alignment_for_any_worker_count() {
    let s = Sampler::new(N as u64, 24, Mode::Cyclic, 9).unwrap();
    let want: Vec<Vec<u64>> = (0..30).map(|k| s.batch(k)).collect();
    for workers in [0, 1, 4] {
        assert_eq!(run(workers, 30, 0), want, "workers={workers}");
    }
}

#[test]
fn resume_is_exact() {
    let full = run(3, 100, 0);
    let mut split = run(2, 40, 0);
    split.extend(run(4, 60, 40));
    assert_eq!(full, split);
}

#[test]
fn in_flight_is_bounded_and_close_is_prompt_while_blocked() {
    let dir = tempfile::tempdir().unwrap();
    let (d, r) = fixtures(dir.path());
    let s = Sampler::new(N as u64, 8, Mode::Iid, 1).unwrap();
    let mut l = Loader::new(streams(&d, &r, 1), s, LoaderOptions { workers: 3, prefetch: 2, ..Default::default() }).unwrap();
    let fill = |l: &Loader<Vec<PositionBatch>>| {
        let t = std::time::Instant::now();
        while l.in_flight() < 5 && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    fill(&l);
    assert_eq!(l.in_flight(), 5, "workers + prefetch steps, then everyone blocks");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(l.in_flight(), 5, "never more");
    l.next().unwrap().unwrap();
    fill(&l);
    assert_eq!(l.in_flight(), 5);
    l.close(); // joins workers that are blocked on the full window
    assert!(l.is_closed());
    assert!(l.next().is_none());
}

/// Workers hold up to `workers + prefetch` batches, plus the consumer's: with a pool smaller
/// than that, regions must still be reused rather than freed and allocated again each time the
/// consumer catches up (the loader raises the allocator's idle floor to its working set).
#[test]
fn workers_reuse_their_regions_even_past_the_pool_size() {
    let dir = tempfile::tempdir().unwrap();
    const REC: usize = 2048; // int64 values: 16 KiB records, 256 KiB batches
    let data: Vec<i64> = (0..N as i64).flat_map(|i| (0..REC as i64).map(move |j| i * 10_000 + j)).collect();
    let mut w = DenseWriter::create(dir.path().join("big"), DType::Int64, &[REC], WriterOptions::default()).unwrap();
    w.append_slice(&data).unwrap();
    w.finish().unwrap();
    let store = DenseStore::open(dir.path().join("big")).unwrap();
    let alloc = Allocator::cpu(16 * REC * 8); // room for one idle batch
    let (workers, prefetch) = (4, 4);
    let s = Sampler::new(N as u64, 16, Mode::Iid, 3).unwrap();
    let mut l = Loader::new(vec![("x".into(), vec![SourceView::from(store.bind(&alloc))])], s, LoaderOptions { workers, prefetch, ..Default::default() }).unwrap();
    for _ in 0..300 {
        let parts = l.next().unwrap().unwrap();
        let Batch::Dense(x) = &parts[0].values[0].1 else { panic!("dense") };
        let xs = x.as_slice::<i64>().unwrap();
        for (k, &id) in parts[0].ids.iter().enumerate() {
            assert_eq!(xs[k * REC], id as i64 * 10_000);
            assert_eq!(xs[k * REC + REC - 1], id as i64 * 10_000 + REC as i64 - 1);
        }
    }
    l.close();
    let st = alloc.stats();
    // In flight: at most workers + prefetch claimed steps plus the one the consumer holds.
    assert!(st.fresh as usize <= workers + prefetch + 1, "{st:?}");
    assert!(st.reused + st.fresh >= 300, "one region per step: {st:?}");
}

#[test]
fn ranks_gather_their_slice_of_the_global_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (d, r) = fixtures(dir.path());
    let s = Sampler::new(N as u64, 12, Mode::Iid, 4).unwrap();
    let global = s.batch(0);
    for rank in 0..3 {
        let opts = LoaderOptions { workers: 0, prefetch: 1, rank, world_size: 3 };
        let mut l = Loader::new(streams(&d, &r, 2), s.clone(), opts).unwrap();
        let shards = l.next().unwrap().unwrap();
        check_aligned(&shards);
        let ids: Vec<u64> = shards.iter().flat_map(|s| s.ids.clone()).collect();
        assert_eq!(ids, global[rank * 4..(rank + 1) * 4]);
        assert_eq!(shards[0].ids.len(), 2);
    }
}

#[test]
fn transform_and_custom_draws() {
    let dir = tempfile::tempdir().unwrap();
    let (d, r) = fixtures(dir.path());
    let mut k = 0u64;
    let draw = Box::new(move || {
        k += 1;
        Ok(vec![k, k + 1, k + 2, k + 3])
    });
    let mut l = Loader::with_draw(streams(&d, &r, 2), draw, 4, LoaderOptions { workers: 2, prefetch: 1, ..Default::default() }, |step, shards| {
        (step, shards.iter().map(|s| s.ids.len()).sum::<usize>(), shards[1].ids[0])
    })
    .unwrap();
    for step in 0..10u64 {
        let (s, n, first_of_second) = l.next().unwrap().unwrap();
        assert_eq!((s, n, first_of_second), (step, 4, step + 3), "draws delivered in order");
    }
    assert!(l.seek(3).is_err(), "a custom draw cannot be repositioned");
}

#[test]
fn gather_errors_reach_the_consumer_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (d, r) = fixtures(dir.path());
    // Draws an out-of-range id at step 2.
    let mut k = 0u64;
    let draw = Box::new(move || {
        k += 1;
        Ok(vec![if k == 3 { 10_000 } else { k }, 0])
    });
    let mut l = Loader::with_draw(streams(&d, &r, 1), draw, 2, LoaderOptions { workers: 2, prefetch: 2, ..Default::default() }, |_, s| s).unwrap();
    assert!(l.next().unwrap().is_ok());
    assert!(l.next().unwrap().is_ok());
    let e = l.next().unwrap().unwrap_err();
    assert!(matches!(e, Error::IndexOutOfRange { .. }), "{e}");
    assert!(l.next().unwrap().is_ok());
}

#[test]
fn argument_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (d, r) = fixtures(dir.path());
    let s = || Sampler::new(N as u64, 12, Mode::Iid, 0).unwrap();
    let a = Allocator::default();
    let bad = |st: Vec<(String, Vec<SourceView>)>, smp: Sampler, o: LoaderOptions| Loader::new(st, smp, o).err().unwrap();
    assert!(matches!(bad(vec![], s(), LoaderOptions::default()), Error::InvalidArgument { .. }));
    assert!(matches!(bad(vec![("x".into(), vec![])], s(), LoaderOptions::default()), Error::InvalidArgument { .. }));
    let two = vec![("x".into(), vec![SourceView::from(d.bind(&a)), SourceView::from(d.bind(&a))]), ("t".into(), vec![SourceView::from(r.bind(&a))])];
    assert!(bad(two, s(), LoaderOptions::default()).to_string().contains("one view per position"));
    // Unequal lengths.
    let mut w = DenseWriter::create(dir.path().join("short"), DType::Int64, &[2], WriterOptions::default()).unwrap();
    w.append_slice(&[1i64, 2]).unwrap();
    w.finish().unwrap();
    let short = DenseStore::open(dir.path().join("short")).unwrap();
    let uneq = vec![("x".into(), vec![SourceView::from(d.bind(&a))]), ("s".into(), vec![SourceView::from(short.bind(&a))])];
    assert!(bad(uneq, s(), LoaderOptions::default()).to_string().contains("equal lengths"));
    // Batch not divisible by positions x world size; prefetch 0; rank out of range.
    let five = Sampler::new(N as u64, 5, Mode::Iid, 0).unwrap();
    assert!(bad(streams(&d, &r, 2), five, LoaderOptions::default()).to_string().contains("divide evenly"));
    assert!(bad(streams(&d, &r, 1), s(), LoaderOptions { prefetch: 0, ..Default::default() }).to_string().contains("prefetch"));
    assert!(bad(streams(&d, &r, 1), s(), LoaderOptions { rank: 2, world_size: 2, ..Default::default() }).to_string().contains("rank"));
    let big = Sampler::new(N as u64 + 1, 12, Mode::Iid, 0).unwrap();
    assert!(bad(streams(&d, &r, 1), big, LoaderOptions::default()).to_string().contains("sampler"));
    let _ = IdSource::Stateless(s());
}

#[test]
fn arrow_record_batch_reader() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int64Type, UInt64Type};
    use arrow_array::RecordBatchReader;
    let dir = tempfile::tempdir().unwrap();
    let (d, r) = fixtures(dir.path());
    let s = Sampler::new(N as u64, 8, Mode::Cyclic, 2).unwrap();
    let want: Vec<Vec<u64>> = (0..3).map(|k| s.batch(k)).collect();
    let reader = zrecord::loader::LoaderBatchReader::new(streams(&d, &r, 2), s, LoaderOptions { workers: 2, ..Default::default() }, Some(3)).unwrap();
    let schema = reader.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["_step", "_id", "x", "tok"]);
    assert_eq!(schema.field(2).metadata()["ARROW:extension:name"], "arrow.fixed_shape_tensor");
    let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 6, "3 steps x 2 positions");
    for (k, b) in batches.iter().enumerate() {
        let step = k / 2;
        let pos = k % 2;
        assert!(b.column(0).as_primitive::<UInt64Type>().values().iter().all(|&s| s == step as u64));
        let ids = b.column(1).as_primitive::<UInt64Type>().values().to_vec();
        assert_eq!(ids, want[step][pos * 4..(pos + 1) * 4]);
        let x = b.column(2).as_fixed_size_list();
        for (row, &id) in ids.iter().enumerate() {
            assert_eq!(x.value(row).as_primitive::<Int64Type>().values().to_vec(), vec![id as i64, 2 * id as i64]);
        }
        let tok = b.column(3).as_list::<i32>();
        assert_eq!(tok.value(0).len(), ids[0] as usize % 5 + 1);
    }
}
