//! `zrec sql QUERY`: run SQL over stores and files (locally or on a Ballista cluster).

use super::*;

pub(super) struct SqlArgs {
    pub(super) ballista: Option<String>,
    pub(super) partitions: Option<usize>,
}

pub(super) fn sql(query: &str, tables: &[String], output: Option<PathBuf>, max_rows: usize, args: SqlArgs) -> std::result::Result<(), String> {
    let rt = crate::io::runtime::build("zrec", None, None).map_err(|e| e.to_string())?;
    rt.block_on(async {
        if args.partitions == Some(0) {
            return Err("--partitions must be at least 1".to_string());
        }
        let ctx = match &args.ballista {
            Some(url) => crate::query::ballista::remote_context(url, args.partitions.unwrap_or(0)).await.map_err(|e| format!("--ballista {url}: {e}"))?,
            None => match args.partitions {
                Some(p) => crate::query::zrecord_context_with_config(datafusion::prelude::SessionConfig::new().with_target_partitions(p)),
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
            // Never replace a file: refused up front, and the DataFusion writers (which would
            // overwrite) write a staging file that is renamed into place without replacing.
            if crate::io::path_taken(&out) {
                return Err(format!("--output {}: {}", out.display(), crate::Error::AlreadyExists { path: out.clone() }));
            }
            let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let staging = crate::io::publish::parent_of(&out).join(crate::io::publish::staging_name(&name));
            let path = staging.to_string_lossy().into_owned();
            let single = DataFrameWriteOptions::new().with_single_file_output(true);
            let publish = |r: std::result::Result<usize, String>| -> std::result::Result<usize, String> {
                let done = r.and_then(|n| crate::io::publish::rename_noreplace(&staging, &out).map(|()| n).map_err(|e| format!("--output {}: {e}", out.display())));
                if done.is_err() {
                    let _ = crate::io::remove_file(&staging);
                }
                done
            };
            let rows: usize = match ext.as_str() {
                "parquet" => publish(count(df.write_parquet(&path, single, None).await)),
                "csv" => publish(count(df.write_csv(&path, single, None).await)),
                "json" => publish(count(df.write_json(&path, single, None).await)),
                "arrow" | "ipc" => {
                    let schema = df.schema().inner().clone();
                    let batches = df.collect().await.map_err(|e| e.to_string())?;
                    let f = crate::io::create_new(&out).map_err(|e| e.to_string())?;
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
pub(super) async fn copy_with_progress(df: datafusion::dataframe::DataFrame) -> std::result::Result<Vec<datafusion::arrow::record_batch::RecordBatch>, String> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let rows = Arc::new(AtomicU64::new(0));
    let df = crate::query::CopyProgress::attach(df, rows.clone());
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

pub(super) fn count(r: datafusion::error::Result<Vec<datafusion::arrow::record_batch::RecordBatch>>) -> std::result::Result<usize, String> {
    let batches = r.map_err(|e| e.to_string())?;
    // The writers answer with one `count` row.
    Ok(batches
        .first()
        .and_then(|b| b.column(0).as_any().downcast_ref::<datafusion::arrow::array::UInt64Array>().map(|c| c.value(0) as usize))
        .unwrap_or(0))
}
