//! Store-to-store conversion is read-then-append: build a raw token store, train a dictionary
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! on it, and transcode it to `zstd_dict` by appending gathered batches.
//!
//! Run: `cargo run --example transcode [WORKDIR]`

use zrecord::prelude::*;

fn main() -> Result<()> {
    let root = std::env::args().nth(1).map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("zrecord-transcode-{}", std::process::id())));
    let src = root.join("tokens-raw");
    let dst = root.join("tokens-zstd-dict");

    // 1. A raw ragged store of token sequences.
    let tokens = zrecord::demo::tokens_ragged(20_000, 42);
    let mut w = RaggedWriter::create(&src, DType::Int32, 1, WriterOptions::default())?;
    w.append(&tokens.as_input())?;
    w.finish()?;

    // 2. Train a dictionary on the settled source, then copy it batch by batch.
    let alloc = Allocator::default();
    let source = RaggedStore::open(&src)?.bind(&alloc);
    let dictionary = train_dict(&source, 64 << 10)?;
    let mut w = RaggedWriter::create(&dst, source.dtype(), source.ndim(), WriterOptions::zstd_dict(dictionary))?;
    let batch = 4096u64;
    for start in (0..source.len()).step_by(batch as usize) {
        let part = source.range(start..(start + batch).min(source.len()))?;
        w.append(&part.as_input())?; // a gathered batch is valid append input
    }
    w.finish()?;

    // 3. Same records, smaller store.
    let out = RaggedStore::open(&dst)?;
    let check = out.bind(&alloc).gather(&[0, 19_999, 7])?;
    let want = source.gather(&[0, 19_999, 7])?;
    assert_eq!(check.values().as_bytes(), want.values().as_bytes());
    assert_eq!(check.cu_seqlens_slice(), want.cu_seqlens_slice());
    let (a, b) = (source.store().stats(), out.stats());
    println!("{}: {} records, {} stored bytes (raw)", src.display(), a.record_count, a.stored_bytes);
    println!("{}: {} records, {} stored bytes (zstd_dict, {:.2}x)", dst.display(), b.record_count, b.stored_bytes, b.compression_ratio());
    out.verify()?;
    if std::env::args().nth(1).is_none() {
        std::fs::remove_dir_all(&root).ok();
    }
    Ok(())
}
