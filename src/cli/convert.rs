//! `zrec convert SOURCE ROOT`: files or a Hugging Face dataset into a dataset root.

use super::*;

pub(super) struct ConvertArgs {
    pub(super) source: String,
    pub(super) root: PathBuf,
    pub(super) codec: String,
    pub(super) level: i32,
    pub(super) data_shards: usize,
    pub(super) columns: Option<Vec<String>>,
    pub(super) train_dict_size: Option<usize>,
    pub(super) decode_images: Option<String>,
    pub(super) image_mode: Option<String>,
    pub(super) resize: Option<Vec<u32>>,
    pub(super) allow_empty: bool,
    pub(super) quiet: bool,
}

pub(super) fn convert(a: ConvertArgs) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use crate::convert::{convert_batches, open_files, ConvertOptions, ImageOptions, DEFAULT_DICT_SIZE};
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
        println!("  {name:<20} {layout}  {codec}");
    }
    Ok(())
}
