//! `zrec demo`: the built-in sample, end to end (write, gather, loader, SQL).

use super::*;

pub(super) fn gib_s(bytes: f64, secs: f64) -> f64 {
    bytes / secs / (1u64 << 30) as f64
}

pub(super) fn memcpy_limit(bytes: usize) -> f64 {
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

pub(super) fn demo(dir: Option<PathBuf>, scale: f64) -> Result<()> {
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
    let images = crate::demo::vision(n_img, 3, 224, 224, 1);
    let tokens = crate::demo::tokens_dense(n_tok, 512, 2);
    let ragged = crate::demo::tokens_ragged(n_tok, 3);
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
        let _ = crate::io::remove_tree(&root);
    }
    println!("\nall stores verified; transcode, SQL and Python APIs: see README.md");
    Ok(())
}

/// SQL over the stores just written: a COPY into a dataset root, a gather query, and 256-id
/// gathers through DataFusion next to direct view gathers.
pub(super) fn sql_demo(root: &std::path::Path, n: usize, alloc: &Allocator) -> Result<()> {
    let q = |e: datafusion::error::DataFusionError| Error::invalid("sql", e.to_string());
    let rt = crate::io::runtime::build("zrec", None, None)?;
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

pub(super) fn tmp_is(root: &std::path::Path) -> bool {
    root.file_name().map(|n| n.to_string_lossy().starts_with("zrec-demo-")).unwrap_or(false) && root.starts_with(std::env::temp_dir())
}
