//! Runs the SQL surface spec: every `sql/*.slt` file with the `sqllogictest` crate, each in a
//! fresh zrecord SessionContext, over fixtures generated here (`$FIXTURES`; `$__TEST_DIR__` is a
//! fresh folder per file for COPY outputs).
#![allow(clippy::unwrap_used, clippy::expect_used)]



use std::path::{Path, PathBuf};

use async_trait::async_trait;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::error::DataFusionError;
use datafusion::prelude::{SessionConfig, SessionContext};
use sqllogictest::{DBOutput, DefaultColumnType};
use zrecord::prelude::*;
use zrecord::query::zrecord_context_with_config;

struct Db {
    ctx: SessionContext,
}

#[async_trait]
impl sqllogictest::AsyncDB for Db {
    type Error = DataFusionError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, DataFusionError> {
        let df = self.ctx.sql(sql).await?;
        let ncols = df.schema().fields().len();
        let batches = df.collect().await?;
        let opts = FormatOptions::default().with_null("NULL");
        let mut rows = Vec::new();
        for b in &batches {
            let fmts = b.columns().iter().map(|c| ArrayFormatter::try_new(c.as_ref(), &opts)).collect::<Result<Vec<_>, _>>()?;
            for r in 0..b.num_rows() {
                rows.push(fmts.iter().map(|f| f.value(r).to_string()).map(|s| if s.is_empty() { "(empty)".into() } else { s }).collect());
            }
        }
        Ok(DBOutput::Rows { types: vec![DefaultColumnType::Any; ncols], rows })
    }

    async fn shutdown(&mut self) {}
}

/// Fixture stores (deterministic contents the .slt files state exactly):
/// - `vision/` a dataset root without dataset.json: `image` dense uint8 [2, 2] (record i =
///   [i, i+1, i+2, i+3] mod 256), `label` dense int64 () (i % 3), `tokens` ragged int32 ndim 1
///   (record i = i*10 .. i*10 + i%4 + 1); 20 records.
/// - `labels.zrec` a single dense int64 store (i * 7), 10 records, codec zstd.
/// - `grid/` ragged float32 ndim 2 (record i has shape [1 + i%2, 2], values i*0.5 + k), 4 records.
/// - `misaligned/` two streams of 3 and 4 records.
/// - `tokenizer.json` a word-level tokenizer (vocab `[UNK]` Hello world mail now < > EMAIL).
fn make_fixtures(dir: &Path) {
    let n = 20usize;
    let root = dir.join("vision");
    let image: Vec<u8> = (0..n).flat_map(|i| (0..4).map(move |k| ((i + k) % 256) as u8)).collect();
    let mut w = DenseWriter::create(root.join("image"), DType::UInt8, &[2, 2], WriterOptions::default().data_shards(2)).unwrap();
    w.append_slice(&image).unwrap();
    w.finish().unwrap();
    let label: Vec<i64> = (0..n as i64).map(|i| i % 3).collect();
    let mut w = DenseWriter::create(root.join("label"), DType::Int64, &[], WriterOptions::default()).unwrap();
    w.append_slice(&label).unwrap();
    w.finish().unwrap();
    let recs: Vec<Vec<i32>> = (0..n as i32).map(|i| (0..(i % 4 + 1)).map(|k| i * 10 + k).collect()).collect();
    let shapes: Vec<Vec<usize>> = recs.iter().map(|r| vec![r.len()]).collect();
    let packed = PackedRagged::from_records(1, recs.iter().zip(&shapes).map(|(r, s)| (&r[..], &s[..]))).unwrap();
    let mut w = RaggedWriter::create(root.join("tokens"), DType::Int32, 1, WriterOptions::with_codec(Codec::Zstd)).unwrap();
    w.append(&packed.as_input()).unwrap();
    w.finish().unwrap();

    let mut w = DenseWriter::create(dir.join("labels.zrec"), DType::Int64, &[], WriterOptions::with_codec(Codec::Zstd)).unwrap();
    w.append_slice(&(0..10i64).map(|i| i * 7).collect::<Vec<_>>()).unwrap();
    w.finish().unwrap();

    let recs: Vec<Vec<f32>> = (0..4).map(|i| (0..(1 + i % 2) * 2).map(|k| i as f32 * 0.5 + k as f32).collect()).collect();
    let shapes: Vec<Vec<usize>> = (0..4).map(|i| vec![1 + i % 2, 2]).collect();
    let packed = PackedRagged::from_records(2, recs.iter().zip(&shapes).map(|(r, s)| (&r[..], &s[..]))).unwrap();
    let mut w = RaggedWriter::create(dir.join("grid"), DType::Float32, 2, WriterOptions::default()).unwrap();
    w.append(&packed.as_input()).unwrap();
    w.finish().unwrap();

    // A word-level tokenizer.json for text_tokenize (sql/text.slt).
    std::fs::write(
        dir.join("tokenizer.json"),
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
 "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
 "model":{"type":"WordLevel","vocab":{"[UNK]":0,"Hello":1,"world":2,"mail":3,"now":4,"<":5,">":6,"EMAIL":7},"unk_token":"[UNK]"}}"#,
    )
    .unwrap();

    for (name, k) in [("a", 3i64), ("b", 4)] {
        let mut w = DenseWriter::create(dir.join("misaligned").join(name), DType::Int64, &[], WriterOptions::default()).unwrap();
        w.append_slice(&(0..k).collect::<Vec<_>>()).unwrap();
        w.finish().unwrap();
    }
}

fn slt_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "slt")).collect();
    files.sort();
    files
}

#[test]
fn sql_logic_tests() {
    let fixtures = tempfile::tempdir().unwrap();
    make_fixtures(fixtures.path());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let files = slt_files();
    assert!(files.len() >= 4, "expected the sql/*.slt spec files, found {files:?}");
    let mut failures = Vec::new();
    for file in &files {
        let fx = fixtures.path().to_string_lossy().into_owned();
        let result = rt.block_on(async {
            let mut runner = sqllogictest::Runner::new(|| async {
                // Two partitions and small batches so multi-partition and multi-batch paths run.
                let config = SessionConfig::new().with_target_partitions(2).with_batch_size(8);
                Ok::<_, DataFusionError>(Db { ctx: zrecord_context_with_config(config) })
            });
            runner.set_var("FIXTURES".into(), fx);
            runner.run_file_async(file).await
        });
        if let Err(e) = result {
            failures.push(format!("{}: {}", file.display(), e.display(false)));
        }
    }
    assert!(failures.is_empty(), "sqllogictest failures:\n{}", failures.join("\n\n"));
}

/// A Ballista cluster of separate processes on loopback: `zrec ballista scheduler` and
/// executors, killed when dropped.
struct Cluster {
    /// The scheduler first, then the executors (`None` once killed).
    children: Vec<Option<std::process::Child>>,
    url: String,
    port: u16,
    /// Ports the processes listen on (scheduler, each executor's Flight and gRPC).
    listening: Vec<u16>,
    _work: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Cluster {
    fn start(executors: usize) -> Cluster {
        let bin = env!("CARGO_BIN_EXE_zrec");
        let work = tempfile::tempdir().unwrap();
        let log = |name: &str| std::fs::File::create(work.path().join(name)).unwrap();
        let port = free_port();
        let scheduler = std::process::Command::new(bin)
            .args(["ballista", "scheduler", "--bind", &format!("127.0.0.1:{port}")])
            .stdout(log("scheduler.log"))
            .stderr(log("scheduler.err"))
            .spawn()
            .unwrap();
        let mut c = Cluster { children: vec![Some(scheduler)], url: format!("df://127.0.0.1:{port}"), port, listening: vec![port], _work: work };
        // The scheduler listening before any executor starts: an executor that cannot reach
        // its scheduler at start-up exits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "the scheduler never listened\n{}", c.logs());
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        for _ in 0..executors {
            c.add_executor();
        }
        c
    }

    /// A client context once the scheduler answers and an executor runs a query (`SELECT 1`),
    /// polled for up to two minutes: the processes were just spawned and, on a loaded
    /// machine, the scheduler may not be listening yet (connection refused).
    async fn ready_context(&self, partitions: usize) -> SessionContext {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        // Every executor listening before the first query (a query then never waits on an
        // executor still starting).
        for &port in &self.listening {
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(std::time::Instant::now() < deadline, "port {port} never listened\n{}", self.logs());
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        loop {
            let attempt = async {
                let ctx = zrecord::query::ballista::remote_context(&self.url, partitions).await?;
                ctx.sql("SELECT 1").await?.collect().await?;
                Ok::<_, DataFusionError>(ctx)
            };
            let last = match tokio::time::timeout(std::time::Duration::from_secs(30), attempt).await {
                Ok(Ok(ctx)) => return ctx,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "timed out".to_string(),
            };
            assert!(std::time::Instant::now() < deadline, "cluster did not start: {last}\n{}", self.logs());
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    }

    /// Start one more executor; returns its index in `children`.
    fn add_executor(&mut self) -> usize {
        let bin = env!("CARGO_BIN_EXE_zrec");
        let i = self.children.len();
        let work = self._work.path();
        let shuffle = work.join(format!("executor-{i}"));
        std::fs::create_dir_all(&shuffle).unwrap();
        let log = |name: String| std::fs::File::create(work.join(name)).unwrap();
        let (flight, grpc) = (free_port(), free_port());
        self.listening.extend([flight, grpc]);
        let child = std::process::Command::new(bin)
            .args(["ballista", "executor", "--scheduler", &format!("127.0.0.1:{}", self.port), "--concurrent-tasks", "2"])
            .args(["--port", &flight.to_string(), "--grpc-port", &grpc.to_string()])
            .args(["--work-dir", &shuffle.to_string_lossy()])
            .stdout(log(format!("executor-{i}.log")))
            .stderr(log(format!("executor-{i}.err")))
            .spawn()
            .unwrap();
        self.children.push(Some(child));
        i
    }

    /// SIGKILL child `i`.
    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Indices of the executors still running.
    fn live_executors(&self) -> Vec<usize> {
        (1..self.children.len()).filter(|&i| self.children[i].is_some()).collect()
    }

    /// What the processes wrote (for a failing test's message).
    fn logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self._work.path()).unwrap().flatten() {
            if e.path().is_file() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let tail: String = text.chars().rev().take(3000).collect::<Vec<_>>().into_iter().rev().collect();
                out.push_str(&format!("--- {}\n{tail}\n", e.file_name().to_string_lossy()));
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The SQL spec on a Ballista cluster (scheduler and 2 executors as separate processes): the
/// same .slt files, so the same rows as single-node DataFusion. `loader.slt` (the loader runs
/// in the client process) and `prepared.slt` (parameters bound in the client) stay local.
#[test]
fn sql_logic_tests_on_ballista() {
    let fixtures = tempfile::tempdir().unwrap();
    make_fixtures(fixtures.path());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cluster = Cluster::start(2);
    // Wait for the scheduler and its executors (a query waits for an executor to run on).
    rt.block_on(cluster.ready_context(2));
    let mut failures = Vec::new();
    for file in slt_files().iter().filter(|f| !f.ends_with("loader.slt") && !f.ends_with("prepared.slt")) {
        let fx = fixtures.path().to_string_lossy().into_owned();
        let url = cluster.url.clone();
        let result = rt.block_on(async {
            let mut runner = sqllogictest::Runner::new(move || {
                let url = url.clone();
                async move { Ok::<_, DataFusionError>(Db { ctx: zrecord::query::ballista::remote_context(&url, 2).await? }) }
            });
            runner.set_var("FIXTURES".into(), fx);
            runner.add_label("ballista");
            runner.run_file_async(file).await
        });
        if let Err(e) = result {
            failures.push(format!("{}: {}", file.display(), e.display(false)));
        }
    }
    assert!(failures.is_empty(), "sqllogictest failures on Ballista:\n{}\n{}", failures.join("\n\n"), cluster.logs());
}

fn rows(batches: &[datafusion::arrow::record_batch::RecordBatch]) -> Vec<Vec<String>> {
    let opts = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for b in batches {
        let fmts = b.columns().iter().map(|c| ArrayFormatter::try_new(c.as_ref(), &opts).unwrap()).collect::<Vec<_>>();
        for r in 0..b.num_rows() {
            out.push(fmts.iter().map(|f| f.value(r).to_string()).collect());
        }
    }
    out
}

/// Every record of every stream of two roots, as bytes (dense rows, or ragged values + shapes).
fn records(root: &Path) -> Vec<(String, Vec<Vec<u8>>)> {
    let ds = zrecord::store::Dataset::open(root).unwrap();
    let alloc = Allocator::cpu(1 << 24);
    let ids: Vec<u64> = (0..ds.len()).collect();
    ds.streams()
        .iter()
        .map(|s| {
            let b = zrecord::store::SourceView::new(s.source.clone(), &alloc).gather(&ids).unwrap();
            let recs = match b {
                zrecord::store::Batch::Dense(t) => t.as_bytes().chunks(t.nbytes() / ids.len().max(1)).map(|c| c.to_vec()).collect(),
                zrecord::store::Batch::Ragged(r) => (0..r.len())
                    .map(|k| {
                        let rec = r.record(k).unwrap();
                        let mut v = rec.as_bytes().to_vec();
                        v.extend(rec.shape().iter().flat_map(|d| (*d as u64).to_le_bytes()));
                        v
                    })
                    .collect(),
            };
            (s.name.clone(), recs)
        })
        .collect()
}

/// A distributed COPY (scheduler + 2 executors, 4 partitions) of a Parquet file writes the same
/// parts as the same COPY on one machine, record by record, with the options asked for; scans,
/// filters and aggregates over it on the cluster equal single-node results.
#[test]
fn ballista_copy_equals_single_node_record_by_record() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cluster = Cluster::start(2);
    rt.block_on(async {
        let local = zrecord_context_with_config(SessionConfig::new().with_target_partitions(4));
        let src = d.join("src.parquet");
        let make = format!(
            "COPY (SELECT value AS k, value % 5 AS m, concat('row ', CAST(value AS VARCHAR)) AS s, range(0, value % 6 + 1) AS v \
             FROM generate_series(0, 3999)) TO '{}' STORED AS PARQUET OPTIONS (max_row_group_size 200)",
            src.display()
        );
        local.sql(&make).await.unwrap().collect().await.unwrap();
        let remote = cluster.ready_context(4).await;
        let copy = |out: &Path| format!("COPY (SELECT k, m, s, v FROM '{}') TO '{}' STORED AS ZRECORD OPTIONS (codec 'zstd', level '5')", src.display(), out.display());
        let (dist, one) = (d.join("dist"), d.join("one"));
        let r = tokio::time::timeout(std::time::Duration::from_secs(300), async { remote.sql(&copy(&dist)).await?.collect().await }).await.unwrap();
        let r = r.unwrap_or_else(|e| panic!("distributed COPY: {e}\n{}", cluster.logs()));
        assert_eq!(rows(&r), vec![vec!["4000".to_string()]]);
        // The cluster prepared the root and this client published it: nothing is left beside
        // it or in it (no staging folder, no prepared manifest).
        assert_eq!(zrecord::io::publish::leftovers(d).unwrap(), vec![]);
        let names: Vec<String> = std::fs::read_dir(&dist).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(names.iter().all(|n| !n.starts_with(".zrecord-prepared")), "{names:?}");
        local.sql(&copy(&one)).await.unwrap().collect().await.unwrap();

        // The same parts (one per partition), the same records in the same order.
        let (a, b) = (zrecord::store::Dataset::open(&dist).unwrap(), zrecord::store::Dataset::open(&one).unwrap());
        assert_eq!(a.parts().len(), 4, "one part per partition");
        assert_eq!(a.parts().iter().map(|p| p.record_count).collect::<Vec<_>>(), b.parts().iter().map(|p| p.record_count).collect::<Vec<_>>());
        assert_eq!(records(&dist), records(&one));
        // ... which are the source's rows in file order.
        let want = rows(&local.sql(&format!("SELECT k, m, s, v FROM '{}'", src.display())).await.unwrap().collect().await.unwrap());
        let got = rows(&local.sql(&format!("SELECT k, m, s, v FROM '{}' ORDER BY _id", dist.display())).await.unwrap().collect().await.unwrap());
        assert_eq!(got, want);
        // The options travelled to the executors.
        let info = rows(&local.sql(&format!("SELECT codec, level FROM zrecord_info('{}')", dist.display())).await.unwrap().collect().await.unwrap());
        assert!(info.iter().all(|r| r == &vec!["zstd".to_string(), "5".to_string()]), "{info:?}");

        // Queries over the distributed root on the cluster equal single-node answers.
        for q in [
            "SELECT m, count(*) AS c, sum(k) AS t, max(cardinality(v)) AS w FROM '{}' GROUP BY m ORDER BY m",
            "SELECT _id, k, s FROM '{}' WHERE _id IN (3999, 0, 1000, 2001) ORDER BY _id",
            "SELECT k, v FROM '{}' WHERE m = 3 AND k > 3900 ORDER BY k",
        ] {
            let q = q.replace("{}", &dist.to_string_lossy());
            let a = rows(&remote.sql(&q).await.unwrap().collect().await.unwrap_or_else(|e| panic!("{q}: {e}\n{}", cluster.logs())));
            let b = rows(&local.sql(&q).await.unwrap().collect().await.unwrap());
            assert_eq!(a, b, "{q}");
            assert!(!a.is_empty(), "{q}");
        }
        remote.sql(&format!("CREATE EXTERNAL TABLE t STORED AS ZRECORD LOCATION '{}'", dist.display())).await.unwrap();
        let g = rows(&remote.sql("SELECT k FROM gather('t', [3999, 5, 5, 2000])").await.unwrap().collect().await.unwrap());
        assert_eq!(g, vec![vec!["3999"], vec!["5"], vec!["5"], vec!["2000"]].into_iter().map(|r| r.into_iter().map(String::from).collect::<Vec<_>>()).collect::<Vec<_>>());

        // A destination that exists is refused by the scheduler, naming the path.
        let e = remote.sql(&copy(&dist)).await.unwrap().collect().await.unwrap_err().to_string();
        assert!(e.contains("AlreadyExists") || e.contains("already exists"), "{e}");
    });
    drop(cluster);
}

/// Executors SIGKILLed at instants spread over each query's run (scan + filter, aggregate,
/// join, distributed COPY; 24 kills, from before the first task to after the last): every
/// outcome is the single-node result or an error, within a bounded time, and a COPY publishes
/// the whole root or nothing. (ballista-scheduler 55 alone answers some of these kills with
/// wrong rows: see docs/howto/sql.md.)
#[test]
fn ballista_executor_loss_gives_the_exact_result_or_an_error() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut cluster = Cluster::start(2);
    let local = zrecord_context_with_config(SessionConfig::new().with_target_partitions(4));
    let root = d.join("root");
    rt.block_on(async {
        let q = format!("COPY (SELECT value AS k, value % 40 AS g, repeat('x', CAST(value % 13 + 1 AS INT)) AS s FROM generate_series(0, 79999)) TO '{}' STORED AS ZRECORD", root.display());
        local.sql(&q).await.unwrap().collect().await.unwrap();
    });
    let r = root.display().to_string();
    let queries: Vec<(&str, String)> = vec![
        ("scan+filter", format!("SELECT k, s FROM '{r}' WHERE g = 7 AND k % 3 = 1 ORDER BY k")),
        ("aggregate", format!("SELECT g, count(*) AS c, sum(k) AS t, max(s) AS m FROM '{r}' GROUP BY g ORDER BY g")),
        ("join", format!("SELECT a.g, count(*) AS c, sum(b.k) AS t FROM '{r}' a JOIN '{r}' b ON a.g = b.g AND a.k % 2000 = b.k % 2000 GROUP BY a.g ORDER BY a.g")),
        ("copy", String::new()),
    ];
    let copy_sql = |out: &Path| format!("COPY (SELECT k, g, s FROM '{r}' WHERE k % 2 = 0) TO '{}' STORED AS ZRECORD", out.display());
    let want: Vec<Vec<Vec<String>>> = rt.block_on(async {
        let mut out = Vec::new();
        for (_, q) in &queries[..3] {
            out.push(rows(&local.sql(q).await.unwrap().collect().await.unwrap()));
        }
        out
    });
    let copy_want = records(&{
        let one = d.join("copy-local");
        rt.block_on(async { local.sql(&copy_sql(&one)).await.unwrap().collect().await.unwrap() });
        one
    });
    let remote = rt.block_on(cluster.ready_context(8));
    // Runs query `k` (a COPY to `out`); the result rows, or the error text.
    let run = |k: usize, out: &Path| {
        let sql = if k == 3 { copy_sql(out) } else { queries[k].1.clone() };
        let remote = remote.clone();
        async move {
            let df = remote.sql(&sql).await.map_err(|e| e.to_string())?;
            df.collect().await.map(|b| rows(&b)).map_err(|e| e.to_string())
        }
    };
    // Healthy runs: exact, and how long each takes here.
    let mut took = Vec::new();
    for k in 0..4 {
        let out = d.join(format!("copy-healthy-{k}"));
        let t0 = Instant::now();
        let got = rt.block_on(run(k, &out)).unwrap_or_else(|e| panic!("{}: {e}\n{}", queries[k].0, cluster.logs()));
        took.push(t0.elapsed());
        if k == 3 {
            assert_eq!(records(&out), copy_want);
        } else {
            assert_eq!(got, want[k], "{}", queries[k].0);
        }
    }
    // Kills: query k, at a fraction of its healthy run time (from 0 to past its end).
    let fractions = [0.0, 0.2, 0.4, 0.6, 0.8, 3.0];
    let mut outcomes = Vec::new();
    for (t, &f) in fractions.iter().enumerate() {
        for k in 0..4 {
            let victim = cluster.live_executors()[(t + k) % 2];
            let out = d.join(format!("copy-{t}-{k}"));
            let delay = took[k].mul_f64(f);
            let t0 = Instant::now();
            let result = rt.block_on(async {
                let job = tokio::spawn(run(k, &out));
                tokio::time::sleep(delay).await;
                cluster.kill(victim);
                // Bounded: a lost executor is declared lost within its heartbeat timeout, and
                // the query then fails; never a hang.
                tokio::time::timeout(Duration::from_secs(60), job).await
            });
            let result = match result {
                Ok(Ok(r)) => r,
                Ok(Err(join)) => panic!("{} task: {join}", queries[k].0),
                Err(_) => panic!("{} with a kill at {delay:?}: no answer in 60 s (hang)\n{}", queries[k].0, cluster.logs()),
            };
            let elapsed = t0.elapsed();
            match &result {
                Ok(got) if k == 3 => {
                    assert_eq!(got, &vec![vec![(40000).to_string()]]);
                    assert_eq!(records(&out), copy_want, "kill at {delay:?}: the COPY published a wrong root");
                }
                Ok(got) => assert_eq!(got, &want[k], "{} with a kill at {delay:?}: wrong rows\n{}", queries[k].0, cluster.logs()),
                Err(e) => {
                    // Any error is an honest outcome (a failed fetch, a read of the final
                    // results from the dead executor, ...); the scheduler's cancellation
                    // after the loss also says why.
                    if e.contains("Cancelled") {
                        assert!(e.contains("an executor of the cluster was lost"), "{e}");
                    }
                    if k == 3 {
                        // Only the client publishes, after the cluster's answer: an error
                        // (also one that reached it after the cluster's commit prepared the
                        // root) publishes nothing.
                        assert!(!out.exists() && zrecord::store::Dataset::open(&out).is_err(), "a failed COPY published {}: {e}", out.display());
                    }
                }
            }
            let what = match &result {
                Ok(_) => "exact".to_string(),
                Err(e) => format!("error: {}", e.chars().take(300).collect::<String>()),
            };
            outcomes.push(format!("{} kill@{:.0}% of {:.2}s -> in {:.1}s {what}", queries[k].0, f * 100.0, took[k].as_secs_f64(), elapsed.as_secs_f64()));
            // A fresh executor for the next run, and a cluster that answers again (the dead
            // one is removed within its heartbeat timeout).
            cluster.add_executor();
            rt.block_on(async {
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut ok = 0;
                while ok < 2 {
                    assert!(Instant::now() < deadline, "the cluster did not recover\n{}", cluster.logs());
                    match run(0, &d).await {
                        Ok(got) if got == want[0] => ok += 1,
                        Ok(got) => panic!("a probe after a kill returned wrong rows: {} rows", got.len()),
                        Err(_) => {
                            ok = 0;
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
            });
        }
    }
    eprintln!("executor-loss outcomes:\n{}", outcomes.join("\n"));
    drop(cluster);
}
