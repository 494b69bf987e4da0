//! Profiling harness (not a benchmark): repeated IID gathers of 256 from one store.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `cargo run --release --example profile_gather -- PATH [SECONDS] [nocheck]`
use zrecord::prelude::*;
use zrecord::demo::SplitMix64;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or_else(|| Error::invalid("args", "usage: profile_gather PATH [SECONDS] [nocheck]"))?;
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let check = args.get(3).map(|s| s != "nocheck").unwrap_or(true);
    let store = Store::open(path)?;
    let alloc = Allocator::default();
    let mut rng = SplitMix64::new(1);
    let n = store.len();
    let t = std::time::Instant::now();
    let mut recs = 0u64;
    let mut bytes = 0usize;
    while t.elapsed().as_secs_f64() < secs {
        let ids: Vec<u64> = (0..256).map(|_| rng.below(n)).collect();
        bytes += match &store {
            Store::Dense(s) => { let mut v = s.bind(&alloc); v.set_verify_checksums(check); v.gather(&ids)?.nbytes() }
            Store::Ragged(s) => { let mut v = s.bind(&alloc); v.set_verify_checksums(check); v.gather(&ids)?.values().nbytes() }
        };
        recs += 256;
    }
    let e = t.elapsed().as_secs_f64();
    println!("{:.0} records/s, {:.2} GiB/s", recs as f64 / e, bytes as f64 / e / (1u64 << 30) as f64);
    Ok(())
}
