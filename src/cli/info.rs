//! `zrec info PATH`: a store's or a dataset root's description.

use super::*;

/// The streams of a dataset as an aligned text table: sizes with units, ratios as `N.NNx`, and
/// a total row.
pub(super) fn info_table(infos: &[crate::store::StreamInfo]) -> Result<String> {
    use crate::store::Layout;
    let header = ["stream", "kind", "dtype", "shape", "logical", "codec", "records", "raw", "stored", "on disk", "ratio"];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for i in infos {
        let rt = &i.source.record_type;
        let shape = match &rt.layout {
            Layout::Dense { item_shape } => format!("{item_shape:?}"),
            Layout::Ragged { ndim } => format!("ndim {ndim}"),
        };
        rows.push(vec![
            i.name.clone(),
            rt.layout.kind_name().to_string(),
            rt.dtype.to_string(),
            shape,
            rt.logical.name().to_string(),
            i.codec.map(|c| c.name().to_string()).unwrap_or_else(|| "-".into()),
            i.source.len.to_string(),
            human(i.stats.raw_bytes),
            human(i.stats.stored_bytes),
            human(i.stats.file_bytes),
            format!("{:.2}x", i.stats.compression_ratio()),
        ]);
    }
    let (tr, ts): (u64, u64) = (infos.iter().map(|i| i.stats.raw_bytes).sum(), infos.iter().map(|i| i.stats.stored_bytes).sum());
    let total_ratio = if ts == 0 { 1.0 } else { tr as f64 / ts as f64 };
    let blank = String::new();
    rows.push(vec!["total".into(), blank.clone(), blank.clone(), blank.clone(), blank.clone(), blank, String::new(), human(tr), human(ts), human(infos.iter().map(|i| i.stats.file_bytes).sum()), format!("{total_ratio:.2}x")]);
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

pub(super) fn info(path: PathBuf) -> Result<()> {
    if !crate::store::is_store(&path)? {
        // A dataset root: one row per stream, sizes with units, and a total row.
        let ds = crate::store::Dataset::open(&path)?;
        let infos = ds.stream_infos()?;
        println!("dataset root {}  ({} records per stream, {} streams)", path.display(), ds.len(), ds.streams().len());
        if let Some(src) = ds.metadata().and_then(|m| m.get("source")).and_then(|s| s.get("kind")).and_then(|k| k.as_str()) {
            println!("converted from {src}");
        }
        println!("{}", info_table(&infos)?);
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
