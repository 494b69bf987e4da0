//! Arbitrary Zarr metadata (v3 `zarr.json` or v2 `.zarray`) and chunk / shard bytes: opening
//! and reading a crop is a typed error or a tensor of the crop's shape, under small limits
//! (no hang, no allocation past them, no panic).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zrecord::prelude::*;
use zrecord::zarr::{Assembler, CacheLimits, Limits, Query};

#[derive(Arbitrary, Debug)]
struct Input {
    v2: bool,
    meta: String,
    chunk: Vec<u8>,
    crop: Vec<(i16, i16)>,
}

fuzz_target!(|inp: Input| {
    let dir = zrecord_fuzz::scratch();
    let a = dir.path().join("a.zarr");
    std::fs::create_dir_all(a.join("c").join("0")).unwrap();
    std::fs::write(a.join(if inp.v2 { ".zarray" } else { "zarr.json" }), inp.meta.as_bytes()).unwrap();
    // The first chunk / shard under the usual keys of both versions and separators (a key
    // whose parent is another key's file, `c/0/0/0` under the file `c/0/0`, is left out).
    for key in ["0", "0.0", "0.0.0", "c/0", "c/0/0", "c/0/0/0"] {
        let p = a.join(key);
        if !p.is_dir() {
            let _ = std::fs::write(p, &inp.chunk);
        }
    }
    let limits = Limits { decode_workers: 1, max_read_bytes: 1 << 20, max_chunk_bytes: 1 << 20, max_memory_bytes: 64 << 20 };
    let Ok(asm) = Assembler::new(limits, CacheLimits::default()) else { return };
    let uri = a.to_str().unwrap();
    let Ok(meta) = zrecord::zarr::ArrayMeta::open(uri, None) else { return };
    let _ = meta.chunk_bytes();
    let crop: Vec<(i64, i64)> = inp.crop.iter().take(4).map(|&(lo, hi)| (lo as i64, hi as i64)).collect();
    if let Ok(t) = asm.gather(&[Query::crop(uri, &crop)], None, None, &Allocator::cpu(0)) {
        let want: Vec<usize> = std::iter::once(1).chain(crop.iter().map(|&(lo, hi)| (hi - lo) as usize)).collect();
        assert_eq!(t.shape(), &want[..], "crop {crop:?}");
    }
});
