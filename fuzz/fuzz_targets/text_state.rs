//! Arbitrary text-pipeline state files (`dedup.committed`, `dedup.log`, `near.params`,
//! `near.committed`, `near.log`): opening the dedup sets is a typed error or a set that
//! inserts, commits and reopens consistently (no panic, no huge allocation).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zrecord::text::{ExactDedup, MinHashParams, NearDedup};

#[derive(Arbitrary, Debug)]
struct Input {
    committed: Vec<u8>,
    log: Vec<u8>,
    params: Vec<u8>,
    near_committed: Vec<u8>,
    near_log: Vec<u8>,
    hashes: Vec<u64>,
}

fuzz_target!(|inp: Input| {
    let dir = zrecord_fuzz::scratch();
    let exact = dir.path().join("exact");
    std::fs::create_dir_all(&exact).unwrap();
    std::fs::write(exact.join("dedup.committed"), &inp.committed).unwrap();
    std::fs::write(exact.join("dedup.log"), &inp.log).unwrap();
    if let Ok(mut d) = ExactDedup::open(&exact, 1 << 16) {
        let before = d.committed();
        if let Ok(fresh) = d.insert(&inp.hashes) {
            // A hash new to the set is reported new once.
            let mut seen = std::collections::HashSet::new();
            for (h, f) in inp.hashes.iter().zip(&fresh) {
                if *f {
                    assert!(seen.insert(*h), "hash {h} new twice");
                }
            }
            if let Ok(n) = d.commit() {
                assert!(n >= before);
                drop(d);
                let again = ExactDedup::open(&exact, 1 << 16).expect("reopen after commit");
                assert_eq!(again.committed(), n);
            }
        }
    }
    let near = dir.path().join("near");
    std::fs::create_dir_all(&near).unwrap();
    std::fs::write(near.join("near.params"), &inp.params).unwrap();
    std::fs::write(near.join("near.committed"), &inp.near_committed).unwrap();
    std::fs::write(near.join("near.log"), &inp.near_log).unwrap();
    let params = MinHashParams { num_perm: 16, ..MinHashParams::default() };
    if let Ok(mut n) = NearDedup::open(&near, params) {
        let _ = n.insert(&["an example text of some length", "another example text"]);
        let _ = n.commit();
    }
});
