//! Build a store from the input, damage it at the structure level (manifest fields, index
//! entries, shape rows, dictionary, file sizes and bytes, with checksums recomputed so the
//! gates do not hide the parsers), then open, gather, verify, load and scan it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zrecord_fuzz::{exercise, mutate, scratch, write_store, StoreCase};

fuzz_target!(|case: StoreCase| {
    let dir = scratch();
    let path = dir.path().join("s");
    let Some(written) = write_store(&case, &path) else { return };
    mutate(&path, &case.mutations);
    exercise(&path, &written, &case.ids);
});
