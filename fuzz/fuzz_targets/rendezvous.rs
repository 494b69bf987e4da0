//! Arbitrary rendezvous files (rank endpoints, a variable's shard descriptions) read by a
//! joining reader: a typed error or a variable whose rows add up, never a panic, a hang past
//! the timeout or a huge allocation. Flight transport only: nothing is opened or connected.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zrecord::dist::{DistOptions, DistReader, Transport};

#[derive(Arbitrary, Debug)]
struct Input {
    ranks: u8,
    endpoints: Vec<Vec<u8>>,
    var: Vec<u8>,
}

fuzz_target!(|inp: Input| {
    let dir = zrecord_fuzz::scratch();
    let n = (inp.ranks % 3 + 1) as usize;
    for (r, e) in inp.endpoints.iter().take(n).enumerate() {
        std::fs::write(dir.path().join(format!("fz.node.{r}")), e).unwrap();
    }
    std::fs::write(dir.path().join("fz.var.x"), &inp.var).unwrap();
    let options = DistOptions { timeout_s: 0.05, transport: Transport::Flight, ..DistOptions::default() };
    let Ok(reader) = DistReader::join_group(dir.path(), "fz", n, options) else { return };
    assert_eq!(reader.size(), n);
    if reader.join("x").is_ok() {
        // The variable's rows are the sum of its shards' (checked, no overflow).
        let metas: Vec<zrecord::dist::ShardMeta> = serde_json::from_slice(&inp.var).expect("joined from valid JSON");
        assert_eq!(metas.len(), n);
        let total = metas.iter().try_fold(0u64, |a, m| a.checked_add(m.rows)).expect("row count fits");
        let (rows, per_rank) = reader.rows("x").expect("joined variable");
        assert_eq!(rows, total);
        assert_eq!(per_rank, metas.iter().map(|m| m.rows).collect::<Vec<_>>());
    }
});
