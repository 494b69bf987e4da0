//! The `zrec` command line (feature `cli`): inspect, verify, query, convert and demo zrecord
//! stores, run Ballista processes. The `zrec` binary and the Python package's `zrec` console
//! entry point (`python -m zrecord`) both call [`run`], so pip users get the same commands
//! without a Rust toolchain.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use crate::prelude::*;
use crate::demo::SplitMix64;
use crate::query::{zrecord_context, Dataset, SessionContextExt};
use crate::store::{Kind, SourceView, StoreStats};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::dataframe::DataFrameWriteOptions;

mod cluster;
mod convert;
mod demo;
mod gc;
mod info;
mod sql;
mod verify;

use cluster::ballista;
use convert::{convert, ConvertArgs};
use demo::demo;
use gc::gc;
use info::info;
use sql::{sql, SqlArgs};
use verify::verify;

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

/// Run `zrec` with `args` (the first is the program name, as in `std::env::args_os()`) and
/// return its exit code: 0 done, 1 an error, 2 a corrupt store or a usage error (clap's code;
/// `--help` and `--version` print and return 0). Never exits the process itself, so a host
/// process (the Python entry point) keeps control; stdout and stderr are flushed on return.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let code = match Cli::try_parse_from(args) {
        // A reader that closes stdout early (`zrec sql ... | head`): SIGPIPE stays ignored (the
        // servers and clients here must see EPIPE on sockets, not die), so printing fails; that
        // ends the command with the shell's SIGPIPE status instead of a panic escaping.
        Ok(cli) => match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dispatch(cli))) {
            Ok(code) => code,
            Err(p) => {
                let msg = p.downcast_ref::<String>().map(String::as_str).or_else(|| p.downcast_ref::<&str>().copied()).unwrap_or("");
                if msg.contains("Broken pipe") {
                    return 141;
                }
                std::panic::resume_unwind(p)
            }
        },
        Err(e) => {
            let _ = e.print();
            u8::try_from(e.exit_code()).unwrap_or(2)
        }
    };
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    code
}

fn dispatch(cli: Cli) -> u8 {
    let r = match cli.command {
        Command::Info { path } => info(path),
        Command::Verify { path, quiet } => match verify(path.clone(), quiet) {
            Ok(n) => {
                println!("ok: {} records verified in {}", n, path.display());
                Ok(())
            }
            Err(e) if e.is_corruption() => {
                eprintln!("CORRUPT: {e}");
                return 2;
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
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("error: {e}");
                    1
                }
            };
        }
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            if e.is_corruption() { 2 } else { 1 }
        }
    }
}
