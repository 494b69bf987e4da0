//! Profiling harness (not a benchmark): loader configurations over one store, alternated in one
//! process for ten rounds (this VM's memory speed drifts between minutes, so only ratios within
//! a round mean much), each against the first configuration. No transform: the batches are
//! dropped, or the last `hold` kept alive (what a prefetching loader holds in flight).
//!
//! `cargo run --example profile_loader -- PATH BATCHES W,P[,HOLD] ...`, e.g.
//! `... /data/vision 200 0,4 0,4,8 2,4 2,1 4,4`
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::VecDeque;

use zrecord::loader::{Loader, LoaderOptions, Mode, Sampler};
use zrecord::prelude::*;
use zrecord::store::SourceView;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = || Error::invalid("args", "usage: profile_loader PATH BATCHES W,P[,HOLD] ...");
    let store = Store::open(args.get(1).ok_or_else(usage)?)?;
    let batches: usize = args.get(2).and_then(|s| s.parse().ok()).ok_or_else(usage)?;
    let mut cfgs = Vec::new();
    for a in &args[3..] {
        let v: Vec<usize> = a.split(',').map(|x| x.parse().map_err(|_| usage())).collect::<Result<_>>()?;
        cfgs.push((v[0], *v.get(1).unwrap_or(&4), *v.get(2).unwrap_or(&1)));
    }
    if cfgs.is_empty() {
        return Err(usage());
    }
    let n = store.len();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); cfgs.len()];
    for round in 0..10 {
        let mut line = format!("round {round}:");
        for (i, &(workers, prefetch, hold)) in cfgs.iter().enumerate() {
            let alloc = Allocator::default();
            let view = SourceView::new(store.source(), &alloc);
            let options = LoaderOptions { workers, prefetch, rank: 0, world_size: 1 };
            let mut l = Loader::new(vec![("data".into(), vec![view])], Sampler::new(n, 256, Mode::Iid, 1)?, options)?;
            let mut held = VecDeque::new();
            let mut step = |l: &mut Loader<_>| -> Result<()> {
                held.push_back(l.next_step().ok_or(Error::Closed { what: "loader" })??);
                if held.len() > hold {
                    held.pop_front();
                }
                Ok(())
            };
            for _ in 0..10 {
                step(&mut l)?;
            }
            let t = std::time::Instant::now();
            for _ in 0..batches {
                step(&mut l)?;
            }
            let r = (batches * 256) as f64 / t.elapsed().as_secs_f64();
            rates[i].push(r);
            line += &format!("  w{workers}p{prefetch}h{hold} {r:.0}");
        }
        println!("{line}");
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (i, (w, p, h)) in cfgs.iter().enumerate() {
        let ratios = rates[i].iter().zip(&rates[0]).map(|(a, b)| a / b).collect();
        println!("workers={w} prefetch={p} hold={h}: median {:.0} records/s, {:.2}x the first (median of per-round ratios)", median(rates[i].clone()), median(ratios));
    }
    Ok(())
}
