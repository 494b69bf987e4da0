//! `zrec`: inspect, verify, query and demo zrecord stores.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use zrecord::prelude::*;
use zrecord::sample::{self, SplitMix64};
use zrecord::query::{zrecord_context, Dataset, SessionContextExt, ZrecordTable};
use zrecord::store::{Kind, SourceView, StoreStats};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::dataframe::DataFrameWriteOptions;

#[derive(Parser)]
#[command(name = "zrec", version, about = "Typed, immutable ML record stores")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a store's kind, dtype, shape, codec, record count, sizes and compression ratio
    /// (one row per stream for a dataset root).
    Info {
        /// Store folder or dataset root.
        path: PathBuf,
    },
    /// Check every byte of a store (every stream of a dataset root); exit code 0 when intact,
    /// 2 when corrupt.
    Verify {
        /// Store folder or dataset root.
        path: PathBuf,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// List or remove unpublished staging folders (`.NAME.zrecord-tmp-PID-N`) that killed or
    /// failed writers left in DIR. They never open as stores; only disk space is at stake.
    Gc {
        /// The folder the stores were being written into.
        dir: PathBuf,
        /// Only list what would be removed.
        #[arg(long)]
        dry_run: bool,
        /// Also remove folders whose writer process still runs here (for folders written from
        /// other machines of a shared filesystem, whose process ids mean nothing here).
        #[arg(long)]
        all: bool,
    },
    /// Run SQL (DataFusion) over stores: print an aligned table, or write the result to a file.
    Sql {
        /// The query, e.g. "SELECT _id, label FROM train WHERE _id IN (3, 1)".
        query: String,
        /// Register a store or dataset root as a table (repeatable).
        #[arg(long = "table", value_name = "NAME=PATH")]
        tables: Vec<String>,
        /// Write the result to PATH instead of printing; the format follows the extension:
        /// .parquet, .csv, .json, .arrow / .ipc.
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Rows printed at most (0: all).
        #[arg(long, default_value_t = 100)]
        max_rows: usize,
        /// Run the query on the Ballista cluster of this scheduler (HOST:PORT, as started by
        /// `zrec ballista scheduler`): scans, filters, aggregates and COPY run on its executors.
        #[arg(long, value_name = "HOST:PORT")]
        ballista: Option<String>,
        /// Partitions of scans and parts of a COPY (default: DataFusion's, the CPU count).
        #[arg(long)]
        partitions: Option<usize>,
    },
    /// Run a Ballista scheduler or executor that knows zrecord tables, scans and COPY (for
    /// `zrec sql --ballista` and `SessionContext(ballista=...)`).
    Ballista {
        #[command(subcommand)]
        role: BallistaRole,
    },
    /// Convert Parquet / Arrow IPC / CSV / JSON files (a file, a folder, a glob, or a Hugging
    /// Face `save_to_disk` folder) into a new dataset root, published atomically (Ctrl-C or an
    /// error publishes nothing).
    Convert {
        /// The source: a file, a folder of files of one kind, a glob ("data/*.parquet"), or a
        /// Hugging Face `Dataset.save_to_disk` folder.
        source: String,
        /// The dataset root to create (must not exist).
        root: PathBuf,
        /// raw, zstd or zstd_dict (zstd_dict trains a dictionary per column).
        #[arg(long, default_value = "zstd")]
        codec: String,
        /// zstd level.
        #[arg(long, default_value_t = 3)]
        level: i32,
        /// Data files (parallel writers) per stream.
        #[arg(long, default_value_t = 4)]
        data_shards: usize,
        /// Only these columns, in this order (comma-separated).
        #[arg(long, value_delimiter = ',')]
        columns: Option<Vec<String>>,
        /// Train a zstd dictionary of N bytes per column on the first input (implies zstd_dict).
        #[arg(long, value_name = "N")]
        train_dict_size: Option<usize>,
        /// Decode Hugging Face Image columns into uint8 pixels: HWC or CHW.
        #[arg(long, value_name = "HWC|CHW")]
        decode_images: Option<String>,
        /// Convert decoded images to L, LA, RGB or RGBA.
        #[arg(long)]
        image_mode: Option<String>,
        /// Resize decoded images to H,W (the column becomes dense).
        #[arg(long, value_name = "H,W", value_delimiter = ',', num_args = 2)]
        resize: Option<Vec<u32>>,
        /// Accept empty ragged records.
        #[arg(long)]
        allow_empty: bool,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Run the built-in sample: write each kind in each codec, gather random batches, report
    /// sizes and throughput against the memcpy limit.
    Demo {
        /// Working folder (default: a fresh temporary folder, removed afterwards).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Scale factor for the sample sizes.
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
    },
}

#[derive(Subcommand)]
enum BallistaRole {
    /// The scheduler: plans queries and hands their stages to executors.
    Scheduler {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:50050")]
        bind: std::net::SocketAddr,
        /// Host name clients and executors reach it by (default: the bind address).
        #[arg(long)]
        external_host: Option<String>,
    },
    /// An executor: runs tasks the scheduler hands it.
    Executor {
        /// The scheduler, HOST:PORT.
        #[arg(long, default_value = "127.0.0.1:50050")]
        scheduler: String,
        /// Host to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        bind_host: String,
        /// Host name the scheduler and other executors reach it by (default: --bind-host).
        #[arg(long)]
        external_host: Option<String>,
        /// Arrow Flight port (shuffle data).
        #[arg(long, default_value_t = 50051)]
        port: u16,
        /// gRPC port (tasks).
        #[arg(long, default_value_t = 50052)]
        grpc_port: u16,
        /// Tasks run at once (0: the CPU count).
        #[arg(long, default_value_t = 0)]
        concurrent_tasks: usize,
        /// Folder for shuffle files (default: a temporary folder).
        #[arg(long)]
        work_dir: Option<String>,
    },
}

/// Ballista's log lines on stderr, at the level `ZREC_LOG` names (error, warn, info, debug,
/// trace; default warn).
struct StderrLog(log::LevelFilter);

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= self.0
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("{} {} {}", r.level(), r.target(), r.args());
        }
    }

    fn flush(&self) {}
}

fn ballista(role: BallistaRole) -> Result<()> {
    use zrecord::query::ballista::{run_executor, run_scheduler, ExecutorOptions, SchedulerOptions};
    let level = std::env::var("ZREC_LOG").ok().and_then(|l| l.parse::<log::LevelFilter>().ok()).unwrap_or(log::LevelFilter::Warn);
    if log::set_logger(Box::leak(Box::new(StderrLog(level)))).is_ok() {
        log::set_max_level(level);
    }
    let rt = zrecord::io::runtime::build("zrec", None, Some(32 << 20))?;
    rt.block_on(async {
        match role {
            BallistaRole::Scheduler { bind, external_host } => {
                eprintln!("zrec ballista scheduler listening on {bind}");
                run_scheduler(SchedulerOptions { bind, external_host }).await
            }
            BallistaRole::Executor { scheduler, bind_host, external_host, port, grpc_port, concurrent_tasks, work_dir } => {
                eprintln!("zrec ballista executor on {bind_host}:{port} (gRPC {grpc_port}) for scheduler {scheduler}");
                run_executor(ExecutorOptions { bind_host, external_host, port, grpc_port, scheduler, concurrent_tasks, work_dir }).await
            }
        }
    })
}

fn human(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{b} B") } else { format!("{v:.2} {}", units[u]) }
}

/// The per-stream info batch as an aligned text table: sizes with units, ratios as `N.NNx`, and
/// a total row.
fn info_table(batch: &datafusion::arrow::record_batch::RecordBatch) -> Result<String> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{Float64Type, UInt64Type};
    let col = |name: &str| batch.column_by_name(name).ok_or_else(|| Error::invalid("info", format!("no column {name}")));
    let text = |name: &str| -> Result<Vec<String>> {
        let c = col(name)?;
        let a = c.as_string_opt::<i32>().ok_or_else(|| Error::invalid("info", format!("{name} is not text")))?;
        Ok((0..a.len()).map(|i| a.value(i).to_string()).collect())
    };
    let num = |name: &str| -> Result<Vec<u64>> {
        let c = col(name)?;
        let a = c.as_primitive_opt::<UInt64Type>().ok_or_else(|| Error::invalid("info", format!("{name} is not u64")))?;
        Ok(a.values().to_vec())
    };
    let ratio = col("compression_ratio")?.as_primitive_opt::<Float64Type>().map(|a| a.values().to_vec()).unwrap_or_default();
    let (raw, stored, files, records) = (num("raw_bytes")?, num("stored_bytes")?, num("file_bytes")?, num("records")?);
    let header = ["stream", "kind", "dtype", "shape", "logical", "codec", "records", "raw", "stored", "on disk", "ratio"];
    let mut rows: Vec<Vec<String>> = Vec::new();
    let (names, kinds, dtypes, shapes, logicals, codecs) = (text("stream")?, text("kind")?, text("dtype")?, text("shape")?, text("logical")?, text("codec")?);
    for i in 0..batch.num_rows() {
        rows.push(vec![
            names[i].clone(),
            kinds[i].clone(),
            dtypes[i].clone(),
            shapes[i].clone(),
            logicals[i].clone(),
            codecs[i].clone(),
            records[i].to_string(),
            human(raw[i]),
            human(stored[i]),
            human(files[i]),
            format!("{:.2}x", ratio.get(i).copied().unwrap_or(1.0)),
        ]);
    }
    let (tr, ts): (u64, u64) = (raw.iter().sum(), stored.iter().sum());
    let total_ratio = if ts == 0 { 1.0 } else { tr as f64 / ts as f64 };
    let blank = String::new();
    rows.push(vec!["total".into(), blank.clone(), blank.clone(), blank.clone(), blank.clone(), blank, String::new(), human(tr), human(ts), human(files.iter().sum()), format!("{total_ratio:.2}x")]);
    let widths: Vec<usize> = (0..header.len()).map(|c| rows.iter().map(|r| r[c].len()).chain([header[c].len()]).max().unwrap_or(0)).collect();
    let numeric = |c: usize| c >= 6;
    let line = |cells: Vec<String>| -> String {
        cells
            .iter()
            .enumerate()
            .map(|(c, v)| if numeric(c) { format!("{v:>w$}", w = widths[c]) } else { format!("{v:<w$}", w = widths[c]) })
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = vec![line(header.iter().map(|h| h.to_string()).collect())];
    out.push(widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
    let n = rows.len();
    for (i, r) in rows.into_iter().enumerate() {
        if i + 1 == n {
            out.push(widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
        }
        out.push(line(r));
    }
    Ok(out.join("\n"))
}

fn info(path: PathBuf) -> Result<()> {
    if !zrecord::store::is_store(&path)? {
        // A dataset root: one row per stream, sizes with units, and a total row.
        let table = ZrecordTable::open(&path)?;
        let batch = zrecord::query::info_batch(&table)?;
        let ds = table.dataset();
        println!("dataset root {}  ({} records per stream, {} streams)", path.display(), ds.len(), ds.streams().len());
        if let Some(src) = ds.metadata().and_then(|m| m.get("source")).and_then(|s| s.get("kind")).and_then(|k| k.as_str()) {
            println!("converted from {src}");
        }
        println!("{}", info_table(&batch)?);
        return Ok(());
    }
    let s = Store::open(&path)?;
    let st: StoreStats = s.stats();
    println!("path          {}", path.display());
    println!("format        zrecord v{}", s.format_version());
    println!("kind          {}", s.kind().name());
    println!("dtype         {}", s.dtype());
    println!("logical       {}", s.logical());
    if s.allows_empty() {
        println!("empty records allowed");
    }
    match s.kind() {
        Kind::Dense => println!("item_shape    {:?}", s.item_shape()),
        Kind::Ragged => println!("ndim          {}", s.ndim()),
    }
    println!("codec         {}{}", s.codec(), if st.level != 0 { format!(" (level {})", st.level) } else { String::new() });
    println!("records       {}", st.record_count);
    println!("data_shards   {}", st.data_shards);
    println!("raw bytes     {} ({})", st.raw_bytes, human(st.raw_bytes));
    println!("stored bytes  {} ({})", st.stored_bytes, human(st.stored_bytes));
    println!("on disk       {} ({})", st.file_bytes, human(st.file_bytes));
    println!("ratio         {:.3}x", st.compression_ratio());
    Ok(())
}

struct ConvertArgs {
    source: String,
    root: PathBuf,
    codec: String,
    level: i32,
    data_shards: usize,
    columns: Option<Vec<String>>,
    train_dict_size: Option<usize>,
    decode_images: Option<String>,
    image_mode: Option<String>,
    resize: Option<Vec<u32>>,
    allow_empty: bool,
    quiet: bool,
}

fn convert(a: ConvertArgs) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use zrecord::convert::{convert_batches, open_files, ConvertOptions, ImageOptions, DEFAULT_DICT_SIZE};
    let codec: Codec = a.codec.parse()?;
    let mut options = ConvertOptions {
        writer: WriterOptions { codec, level: a.level, data_shards: a.data_shards, allow_empty: a.allow_empty, ..Default::default() },
        columns: a.columns,
        train_dict: a.train_dict_size.or((codec == Codec::ZstdDict).then_some(DEFAULT_DICT_SIZE)),
        ..Default::default()
    };
    if let Some(layout) = a.decode_images {
        let mut im = ImageOptions::new(layout.parse()?);
        im.mode = a.image_mode.map(|m| m.parse()).transpose()?;
        im.resize = a.resize.map(|r| (r[0], r[1]));
        options.images = Some(im);
    } else if a.image_mode.is_some() || a.resize.is_some() {
        return Err(Error::invalid("decode_images", "--image-mode and --resize need --decode-images HWC|CHW"));
    }
    let input = open_files(&a.source)?;
    options.features = input.features.clone();
    options.metadata = input.metadata();
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // A second Ctrl-C while cleaning up still ends the process at once.
        let _ = ctrlc::set_handler(move || {
            if stop.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
    }
    let bar = if a.quiet { ProgressBar::hidden() } else { ProgressBar::new(input.total_rows.unwrap_or(0)) };
    let style = match input.total_rows {
        Some(_) => "{elapsed_precise} [{bar:30}] {pos}/{len} rows  {msg}  ETA {eta}",
        None => "{elapsed_precise} {pos} rows  {msg}",
    };
    bar.set_style(ProgressStyle::with_template(style).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> "));
    let t0 = Instant::now();
    let mut progress = |rows: u64, bytes: u64| {
        bar.set_position(rows);
        let secs = t0.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!("{} ({:.1} MiB/s)", human(bytes), bytes as f64 / secs / (1 << 20) as f64));
    };
    let r = convert_batches(&a.root, &input.schema, input.batches, options, &mut progress, &|| stop.load(Ordering::SeqCst));
    bar.finish_and_clear();
    let report = match r {
        Ok(r) => r,
        Err(e) if stop.load(Ordering::SeqCst) => {
            eprintln!("interrupted: nothing was published at {}", a.root.display());
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "converted {} rows ({}) into {} in {:.2} s ({:.0} rows/s)",
        report.rows,
        human(report.bytes),
        report.path.display(),
        secs,
        report.rows as f64 / secs.max(1e-9)
    );
    for (name, layout, codec) in &report.streams {
        println!("  {name:<20} {layout:?}  {codec}");
    }
    Ok(())
}

fn verify(path: PathBuf, quiet: bool) -> Result<u64> {
    if !zrecord::store::is_store(&path)? {
        let ds = Dataset::open(&path)?;
        let mut total = 0;
        if !ds.parts().is_empty() {
            // A multi-part root: every part is a root of its own.
            for p in ds.parts() {
                total += verify(path.join(&p.path), quiet)?;
            }
            return Ok(total);
        }
        for st in ds.streams() {
            let store = st.store().ok_or_else(|| Error::invalid("verify", format!("stream '{}' is not a local store", st.name)))?;
            total += verify(store.path().to_path_buf(), quiet)?;
        }
        return Ok(total);
    }
    let s = Store::open(&path)?;
    let pb = if quiet { ProgressBar::hidden() } else { ProgressBar::new(s.len()) };
    pb.set_style(
        ProgressStyle::with_template("{spinner} verify [{bar:40}] {pos}/{len} records ({per_sec}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let r = s.verify_with(&|done| pb.set_position(done));
    pb.finish_and_clear();
    r
}

fn gib_s(bytes: f64, secs: f64) -> f64 {
    bytes / secs / (1u64 << 30) as f64
}

fn memcpy_limit(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src); // fault the pages in first
    let t = Instant::now();
    let reps = 10;
    for _ in 0..reps {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
    }
    gib_s((bytes * reps) as f64, t.elapsed().as_secs_f64())
}

fn demo(dir: Option<PathBuf>, scale: f64) -> Result<()> {
    let tmp;
    let root = match dir {
        Some(d) => d,
        None => {
            tmp = std::env::temp_dir().join(format!("zrec-demo-{}", std::process::id()));
            tmp.clone()
        }
    };
    let n_img = ((400.0 * scale) as usize).max(16);
    let n_tok = ((20_000.0 * scale) as usize).max(64);
    println!("zrecord demo in {}  (images: {n_img} x uint8[3,224,224]; tokens: {n_tok} x int32[512]; ragged: {n_tok} int32 sequences)", root.display());
    let images = sample::vision(n_img, 3, 224, 224, 1);
    let tokens = sample::tokens_dense(n_tok, 512, 2);
    let ragged = sample::tokens_ragged(n_tok, 3);
    let alloc = Allocator::default();
    let limit = memcpy_limit(256 * 3 * 224 * 224);
    println!("memcpy limit (one contiguous buffer, this machine): {limit:.2} GiB/s\n");
    println!("{:<14} {:<10} {:>10} {:>10} {:>7} {:>11} {:>12} {:>14} {:>9}", "workload", "codec", "raw", "stored", "ratio", "write GiB/s", "gather GiB/s", "records/s", "x memcpy");
    let mut rng = SplitMix64::new(42);
    for codec in Codec::ALL {
        // Dense vision.
        for (name, kind) in [("dense-vision", 0), ("dense-tokens", 1), ("ragged-tokens", 2)] {
            let path = root.join(format!("{name}-{codec}"));
            let dict = if codec == Codec::ZstdDict {
                let samples: Vec<Vec<u8>> = match kind {
                    0 => images.chunks(3 * 224 * 224).take(64).map(|c| c.to_vec()).collect(),
                    1 => tokens.chunks(512).take(2000).map(|c| c.iter().flat_map(|x| x.to_le_bytes()).collect()).collect(),
                    _ => ragged.cu_seqlens.windows(2).take(2000).map(|w| ragged.values[w[0] as usize..w[1] as usize].iter().flat_map(|x| x.to_le_bytes()).collect()).collect(),
                };
                Some(train_dict(&samples[..], 64 << 10)?)
            } else {
                None
            };
            let opts = WriterOptions { codec, dictionary: dict, ..Default::default() };
            let t = Instant::now();
            let n = match kind {
                0 => { let mut w = DenseWriter::create(&path, DType::UInt8, &[3, 224, 224], opts)?; w.append_slice(&images)?; w.finish()?; n_img }
                1 => { let mut w = DenseWriter::create(&path, DType::Int32, &[512], opts)?; w.append_slice(&tokens)?; w.finish()?; n_tok }
                _ => { let mut w = RaggedWriter::create(&path, DType::Int32, 1, opts)?; w.append(&ragged.as_input())?; w.finish()?; n_tok }
            };
            let wsecs = t.elapsed().as_secs_f64();
            let store = Store::open(&path)?;
            let st = store.stats();
            // Gather random batches of 256 for ~0.5 s.
            let t = Instant::now();
            let (mut bytes, mut recs) = (0usize, 0usize);
            while t.elapsed().as_secs_f64() < 0.5 {
                let ids: Vec<u64> = (0..256).map(|_| rng.below(n as u64)).collect();
                bytes += SourceView::new(store.source(), &alloc).gather(&ids)?.nbytes();
                recs += 256;
            }
            let gsecs = t.elapsed().as_secs_f64();
            let g = gib_s(bytes as f64, gsecs);
            println!(
                "{:<14} {:<10} {:>10} {:>10} {:>6.2}x {:>11.2} {:>12.2} {:>14.0} {:>8.2}x",
                name, codec.name(), human(st.raw_bytes), human(st.stored_bytes), st.compression_ratio(),
                gib_s(st.raw_bytes as f64, wsecs), g, recs as f64 / gsecs, g / limit
            );
            store.verify()?;
        }
    }
    sql_demo(&root, n_tok, &alloc)?;
    if tmp_is(&root) {
        let _ = std::fs::remove_dir_all(&root);
    }
    println!("\nall stores verified; transcode, SQL and Python APIs: see README.md");
    Ok(())
}

struct SqlArgs {
    ballista: Option<String>,
    partitions: Option<usize>,
}

fn sql(query: &str, tables: &[String], output: Option<PathBuf>, max_rows: usize, args: SqlArgs) -> std::result::Result<(), String> {
    let rt = zrecord::io::runtime::build("zrec", None, None).map_err(|e| e.to_string())?;
    rt.block_on(async {
        if args.partitions == Some(0) {
            return Err("--partitions must be at least 1".to_string());
        }
        let ctx = match &args.ballista {
            Some(url) => zrecord::query::ballista::remote_context(url, args.partitions.unwrap_or(0)).await.map_err(|e| format!("--ballista {url}: {e}"))?,
            None => match args.partitions {
                Some(p) => zrecord::query::zrecord_context_with_config(datafusion::prelude::SessionConfig::new().with_target_partitions(p)),
                None => zrecord_context(),
            },
        };
        for t in tables {
            let (name, path) = t.split_once('=').ok_or_else(|| format!("--table '{t}': expected NAME=PATH"))?;
            ctx.register_zrecord(name, path).map_err(|e| format!("--table {name}: {e}"))?;
        }
        let df = ctx.sql(query).await.map_err(|e| e.to_string())?;
        if let Some(out) = output {
            let ext = out.extension().map(|e| e.to_string_lossy().to_lowercase()).unwrap_or_default();
            let path = out.to_string_lossy().into_owned();
            let single = DataFrameWriteOptions::new().with_single_file_output(true);
            let rows: usize = match ext.as_str() {
                "parquet" => count(df.write_parquet(&path, single, None).await),
                "csv" => count(df.write_csv(&path, single, None).await),
                "json" => count(df.write_json(&path, single, None).await),
                "arrow" | "ipc" => {
                    let schema = df.schema().inner().clone();
                    let batches = df.collect().await.map_err(|e| e.to_string())?;
                    let f = std::fs::File::create_new(&out).map_err(|e| format!("{}: {e}", out.display()))?;
                    let mut w = datafusion::arrow::ipc::writer::FileWriter::try_new(f, &schema).map_err(|e| e.to_string())?;
                    for b in &batches {
                        w.write(b).map_err(|e| e.to_string())?;
                    }
                    w.finish().map_err(|e| e.to_string())?;
                    Ok(batches.iter().map(|b| b.num_rows()).sum())
                }
                other => Err(format!("--output: unknown extension '{other}' (use .parquet, .csv, .json, .arrow)")),
            }?;
            eprintln!("{rows} rows written to {}", out.display());
            return Ok(());
        }
        let batches = if args.ballista.is_none() && matches!(df.logical_plan(), datafusion::logical_expr::LogicalPlan::Copy(_)) {
            copy_with_progress(df).await?
        } else {
            df.collect().await.map_err(|e| e.to_string())?
        };
        let total: usize = batches.iter().map(|b| b.num_rows()).sum();
        let mut shown = Vec::new();
        let mut left = if max_rows == 0 { usize::MAX } else { max_rows };
        for b in &batches {
            if left == 0 {
                break;
            }
            let k = b.num_rows().min(left);
            shown.push(b.slice(0, k));
            left -= k;
        }
        if shown.is_empty() {
            if let Some(b) = batches.first() {
                shown.push(b.slice(0, 0));
            }
        }
        println!("{}", pretty_format_batches(&shown).map_err(|e| e.to_string())?);
        let printed: usize = shown.iter().map(|b| b.num_rows()).sum();
        if printed < total {
            println!("({total} rows, first {printed} shown; --max-rows 0 prints all)");
        } else {
            println!("({total} rows)");
        }
        Ok(())
    })
}

/// Run a `COPY ... STORED AS ZRECORD` with a spinner of the rows written so far (from the sink,
/// through a `CopyProgress` session extension); drawn only on a terminal.
async fn copy_with_progress(df: datafusion::dataframe::DataFrame) -> std::result::Result<Vec<datafusion::arrow::record_batch::RecordBatch>, String> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let rows = Arc::new(AtomicU64::new(0));
    let df = zrecord::query::CopyProgress::attach(df, rows.clone());
    let pb = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} COPY {human_pos} rows written ({per_sec}, {elapsed})") {
        pb.set_style(style);
    }
    let done = Arc::new(AtomicBool::new(false));
    let ticker = {
        let (pb, rows, done) = (pb.clone(), rows.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                pb.set_position(rows.load(Ordering::Relaxed));
                pb.tick();
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        })
    };
    let r = df.collect().await;
    done.store(true, Ordering::Relaxed);
    let _ = ticker.join();
    pb.finish_and_clear();
    r.map_err(|e| e.to_string())
}

fn count(r: datafusion::error::Result<Vec<datafusion::arrow::record_batch::RecordBatch>>) -> std::result::Result<usize, String> {
    let batches = r.map_err(|e| e.to_string())?;
    // The writers answer with one `count` row.
    Ok(batches
        .first()
        .and_then(|b| b.column(0).as_any().downcast_ref::<datafusion::arrow::array::UInt64Array>().map(|c| c.value(0) as usize))
        .unwrap_or(0))
}

/// SQL over the stores just written: a COPY into a dataset root, a gather query, and 256-id
/// gathers through DataFusion next to direct view gathers.
fn sql_demo(root: &std::path::Path, n: usize, alloc: &Allocator) -> Result<()> {
    let q = |e: datafusion::error::DataFusionError| Error::invalid("sql", e.to_string());
    let rt = zrecord::io::runtime::build("zrec", None, None)?;
    let src = root.join("ragged-tokens-zstd");
    let sub = root.join("sql-subset");
    rt.block_on(async {
        let ctx = zrecord_context();
        ctx.register_zrecord("src", &src).map_err(q)?;
        let copy = format!(
            "COPY (SELECT \"ragged-tokens-zstd\" AS tokens, cardinality(\"ragged-tokens-zstd\") AS len FROM src WHERE _id < 1000 ORDER BY _id) TO '{}' STORED AS ZRECORD OPTIONS (codec 'zstd')",
            sub.display()
        );
        ctx.sql(&copy).await.map_err(q)?.collect().await.map_err(q)?;
        ctx.register_zrecord("sub", &sub).map_err(q)?;
        let sql = "SELECT _id, len, tokens[1] AS first_token FROM gather('sub', [5, 0, 5]) ";
        let batches = ctx.sql(sql).await.map_err(q)?.collect().await.map_err(q)?;
        println!("\nSQL: COPY (first 1000 ragged records) TO a dataset root, then\n  {sql}");
        println!("{}", pretty_format_batches(&batches)?);
        let Store::Ragged(store) = Store::open(&src)? else { return Err(Error::invalid("demo", "expected a ragged store")) };
        let view = store.bind(alloc);
        let mut rng = SplitMix64::new(7);
        let (mut t_sql, mut t_direct) = (0.0, 0.0);
        for _ in 0..20 {
            let mut ids: Vec<u64> = (0..256).map(|_| rng.below(n as u64)).collect();
            ids.sort_unstable();
            ids.dedup();
            let list = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
            let t = Instant::now();
            let b = ctx.sql(&format!("SELECT \"ragged-tokens-zstd\" FROM src WHERE _id IN ({list})")).await.map_err(q)?.collect().await.map_err(q)?;
            t_sql += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let g = view.gather(&ids)?;
            t_direct += t.elapsed().as_secs_f64();
            if b.iter().map(|b| b.num_rows()).sum::<usize>() != g.len() {
                return Err(Error::invalid("demo", "SQL and direct gathers disagree"));
            }
        }
        println!("SQL gather of 256 random ids (parse + plan + pushdown + gather): {:.0} us; direct view gather {:.0} us ({:.2}x)", t_sql / 20.0 * 1e6, t_direct / 20.0 * 1e6, t_sql / t_direct);
        Ok(())
    })
}

fn tmp_is(root: &std::path::Path) -> bool {
    root.file_name().map(|n| n.to_string_lossy().starts_with("zrec-demo-")).unwrap_or(false) && root.starts_with(std::env::temp_dir())
}

/// `zrec gc URL`: data folders below the store (or the stores of a dataset root) at URL that
/// no manifest names: uploads of writers that crashed or lost a race.
fn gc_remote(url: &str, dry_run: bool) -> zrecord::Result<()> {
    use zrecord::store::publish::remote_leftovers;
    let zrecord::io::Uri::Remote(root) = zrecord::io::Uri::parse(url)? else {
        return Err(zrecord::Error::invalid("url", format!("'{url}' is not an object-store URL")));
    };
    let mut found = remote_leftovers(&root, !dry_run)?;
    for d in root.list_dirs()? {
        if !d.starts_with("upload-") {
            found.extend(remote_leftovers(&root.join(&d), !dry_run)?);
        }
    }
    for (u, n) in &found {
        if dry_run {
            println!("would remove: {u}/");
        } else {
            println!("removed: {u}/ ({n} objects)");
        }
    }
    println!("{} leftover data folder(s){}", found.len(), if dry_run { " (dry run)" } else { " removed" });
    Ok(())
}

fn gc(dir: &std::path::Path, dry_run: bool, all: bool) -> zrecord::Result<()> {
    use zrecord::io::publish::{leftovers, remove_leftovers};
    if zrecord::io::is_url(dir) {
        return gc_remote(dir.to_str().unwrap_or_default(), dry_run);
    }
    let found = if dry_run { leftovers(dir)? } else { remove_leftovers(dir, all)? };
    let mut total = 0;
    for l in &found {
        let state = if l.writer_alive { "writer running" } else { "writer gone" };
        let verb = if dry_run && (all || !l.writer_alive) { "would remove" } else if dry_run { "kept" } else { "removed" };
        println!("{verb}: {} (for {}, pid {}, {state}, {} bytes)", l.path.display(), l.dest.display(), l.pid, l.bytes);
        if verb != "kept" {
            total += l.bytes;
        }
    }
    println!("{} leftover folder(s), {total} bytes{}", found.len(), if dry_run { " (dry run)" } else { " freed" });
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Info { path } => info(path),
        Command::Verify { path, quiet } => match verify(path.clone(), quiet) {
            Ok(n) => {
                println!("ok: {} records verified in {}", n, path.display());
                Ok(())
            }
            Err(e) if e.is_corruption() => {
                eprintln!("CORRUPT: {e}");
                return ExitCode::from(2);
            }
            Err(e) => Err(e),
        },
        Command::Demo { dir, scale } => demo(dir, scale),
        Command::Gc { dir, dry_run, all } => gc(&dir, dry_run, all),
        Command::Convert { source, root, codec, level, data_shards, columns, train_dict_size, decode_images, image_mode, resize, allow_empty, quiet } => {
            convert(ConvertArgs { source, root, codec, level, data_shards, columns, train_dict_size, decode_images, image_mode, resize, allow_empty, quiet })
        }
        Command::Ballista { role } => ballista(role),
        Command::Sql { query, tables, output, max_rows, ballista, partitions } => {
            return match sql(&query, &tables, output, max_rows, SqlArgs { ballista, partitions }) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            };
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(if e.is_corruption() { 2 } else { 1 })
        }
    }
}
