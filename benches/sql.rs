//! SQL benchmarks, each against a peer measured in the same run:
//! - `SELECT <col> FROM t WHERE _id IN (<256 random ids>)` (parse + plan + pushdown + gather)
//!   vs a direct view gather of the same ids (target: within 1.5x);
//! - a full projected scan `SELECT <col> FROM t` vs DataFusion reading the same column from an
//!   Arrow IPC file (target: at least as fast).
//!
//! `ZREC_BENCH_SCALE=0.1` runs a quick, smaller version.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::hint::black_box;
use std::sync::Arc;

use common::{bench_dir, mean_ns, scale, Data, Workload};
use criterion::Throughput;
use datafusion::datasource::file_format::options::ArrowReadOptions;
use datafusion::prelude::SessionContext;
use zrecord::prelude::*;
use zrecord::query::{zrecord_context, PlanCache, PreparedQuery, ZrecordTable};
use zrecord::demo::SplitMix64;

const BATCH: usize = 256;
const BATCHES: usize = 64;

fn in_list(ids: &[u64]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

async fn rows(ctx: &SessionContext, sql: &str) -> usize {
    let b = ctx.sql(sql).await.expect("plan").collect().await.expect("run");
    b.iter().map(|b| b.num_rows()).sum()
}

fn main() {
    let mut c = common::criterion(3);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let dir = bench_dir("sql");
    let alloc = Allocator::default();
    let s = scale();
    let k = |n: f64| ((n * s) as usize).max(512);
    let workloads = [Workload::dense_vision(k(2500.0)), Workload::dense_tokens(k(100_000.0)), Workload::ragged_tokens(k(100_000.0))];
    let mut summary = Vec::new();
    for w in &workloads {
        let root = dir.join(w.name);
        // One stream named after the workload inside a dataset root.
        w.write(&root.join("x"), WriterOptions::default()).expect("write");
        let table = Arc::new(ZrecordTable::open(&root).expect("open"));
        let ctx = zrecord_context();
        ctx.register_table("t", table.clone()).expect("register");
        let mut rng = SplitMix64::new(3);
        // Sorted unique ids: the rows an IN list returns, gathered directly in the same order.
        let batches: Vec<Vec<u64>> = (0..BATCHES)
            .map(|_| {
                let mut v: Vec<u64> = (0..BATCH).map(|_| rng.below(w.n as u64)).collect();
                v.sort_unstable();
                v.dedup();
                v
            })
            .collect();
        let queries: Vec<String> = batches.iter().map(|b| format!("SELECT x FROM t WHERE _id IN ({})", in_list(b))).collect();
        let store = Store::open(root.join("x")).expect("open");
        let batch_bytes: f64 = batches.iter().map(|b| b.iter().map(|&i| w.record(i as usize).len()).sum::<usize>() as f64).sum::<f64>() / BATCHES as f64;
        let group = format!("sql_gather_{}", w.name);
        let mut g = c.benchmark_group(&group);
        g.throughput(Throughput::Bytes(batch_bytes as u64));
        let mut i = 0usize;
        g.bench_function("sql_in_list", |b| {
            b.iter(|| {
                i = (i + 1) % BATCHES;
                black_box(rt.block_on(rows(&ctx, &queries[i])))
            })
        });
        // The same queries planned once up front: what execution alone costs.
        let plans: Vec<_> = rt.block_on(async {
            let mut v = Vec::new();
            for q in &queries {
                v.push(ctx.sql(q).await.expect("plan").create_physical_plan().await.expect("physical plan"));
            }
            v
        });
        // The same SQL text through a plan cache (`_id IN` lists lifted into parameters): what
        // Python's `SessionContext.sql` does.
        let cache = PlanCache::default();
        let mut i = 0usize;
        g.bench_function("sql_in_list_cached", |b| {
            b.iter(|| {
                i = (i + 1) % BATCHES;
                black_box(rt.block_on(async {
                    let (q, values) = cache.prepared(&ctx, &queries[i]).await.expect("a lookup shape");
                    q.execute(values).await.expect("run")
                }))
            })
        });
        // Prepared once, executed with new ids: no SQL text, the physical plan reused.
        let prepared = rt.block_on(PreparedQuery::new(&ctx, "SELECT x FROM t WHERE _id = ANY($1)")).expect("prepare");
        assert!(prepared.reuses_plan());
        let mut i = 0usize;
        g.bench_function("sql_prepared", |b| {
            b.iter(|| {
                i = (i + 1) % BATCHES;
                black_box(rt.block_on(prepared.lookup(&batches[i])).expect("run"))
            })
        });
        let task = ctx.task_ctx();
        let mut i = 0usize;
        g.bench_function("sql_execute_only", |b| {
            b.iter(|| {
                i = (i + 1) % BATCHES;
                black_box(rt.block_on(datafusion::physical_plan::collect(plans[i].clone(), task.clone())).expect("run"))
            })
        });
        let mut i = 0usize;
        match &store {
            Store::Dense(d) => {
                let v = d.bind(&alloc);
                g.bench_function("direct_gather", |b| b.iter(|| { i = (i + 1) % BATCHES; black_box(v.gather(&batches[i]).expect("gather")); }));
            }
            Store::Ragged(r) => {
                let v = r.bind(&alloc);
                g.bench_function("direct_gather", |b| b.iter(|| { i = (i + 1) % BATCHES; black_box(v.gather(&batches[i]).expect("gather")); }));
            }
        }
        g.finish();

        // Full projected scan vs the same column from an Arrow IPC file.
        let ipc = dir.join(format!("{}.arrow", w.name));
        rt.block_on(rows(&ctx, &format!("COPY (SELECT x FROM t ORDER BY _id) TO '{}' STORED AS ARROW", ipc.display())));
        ctx.deregister_table("t").expect("deregister");
        ctx.register_table("t", table.clone()).expect("register");
        rt.block_on(ctx.register_arrow("ipc", ipc.to_str().expect("utf8 path"), ArrowReadOptions::default())).expect("register ipc");
        assert_eq!(rt.block_on(rows(&ctx, "SELECT x FROM ipc")), w.n);
        let total = match &w.data {
            Data::Dense { bytes, .. } => bytes.len(),
            Data::Ragged(p) => p.values.len() * 4,
        };
        let group_scan = format!("sql_scan_{}", w.name);
        let mut g = c.benchmark_group(&group_scan);
        g.throughput(Throughput::Bytes(total as u64));
        g.sample_size(10);
        g.bench_function("zrecord_scan", |b| b.iter(|| black_box(rt.block_on(rows(&ctx, "SELECT x FROM t")))));
        g.bench_function("arrow_ipc_scan", |b| b.iter(|| black_box(rt.block_on(rows(&ctx, "SELECT x FROM ipc")))));
        g.finish();
        summary.push((w.name, group, group_scan, batch_bytes, total));
    }
    c.final_summary();
    let _ = std::fs::remove_dir_all(&dir);
    println!("\n## SQL (DataFusion), {} threads\n", rayon::current_num_threads());
    println!("| workload | SQL IN (256 ids), planned each time | same text, plan cache | prepared `_id = ANY($1)` | plans made once (execute only) | direct gather | planned / direct | cached / direct (target <= 5) | prepared / direct (target <= 1.5) | execute / direct | zrecord scan | Arrow IPC scan | IPC / zrecord (target >= 1.0) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, g1, g2, bb, total) in summary {
        let (Some(sql), Some(cached), Some(prep), Some(exec), Some(direct), Some(scan), Some(ipc)) = (
            mean_ns(&g1, "sql_in_list"),
            mean_ns(&g1, "sql_in_list_cached"),
            mean_ns(&g1, "sql_prepared"),
            mean_ns(&g1, "sql_execute_only"),
            mean_ns(&g1, "direct_gather"),
            mean_ns(&g2, "zrecord_scan"),
            mean_ns(&g2, "arrow_ipc_scan"),
        ) else {
            continue;
        };
        println!(
            "| {name} | {:.0} us ({:.2} GiB/s) | {:.0} us | {:.0} us | {:.0} us | {:.0} us | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {:.1} ms ({:.2} GiB/s) | {:.1} ms | {:.2}x |",
            sql / 1e3,
            common::gib(bb, sql),
            cached / 1e3,
            prep / 1e3,
            exec / 1e3,
            direct / 1e3,
            sql / direct,
            cached / direct,
            prep / direct,
            exec / direct,
            scan / 1e6,
            common::gib(total as f64, scan),
            ipc / 1e6,
            ipc / scan
        );
    }
}
