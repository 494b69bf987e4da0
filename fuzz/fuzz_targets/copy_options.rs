//! COPY ... STORED AS ZRECORD OPTIONS parsing: arbitrary keys and values are writer options
//! or a typed error; a dictionary path that is a FIFO or a device never blocks or reads on.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    options: Vec<(u8, String)>,
}

fuzz_target!(|inp: Input| {
    let keys = ["codec", "format.codec", "level", "data_shards", "format.data_shards", "dictionary", "bogus", ""];
    let dicts = ["/dev/zero", "/dev/null", "/nonexistent", "/proc/self/status"];
    let mut map = std::collections::HashMap::new();
    for (k, v) in inp.options.iter().take(8) {
        let key = keys[*k as usize % keys.len()];
        let v = if key == "dictionary" { dicts[v.len() % dicts.len()].to_string() } else { v.clone() };
        map.insert(key.to_string(), v);
    }
    if let Ok(o) = zrecord::query::writer_options(&map) {
        // Accepted options must make a writer or fail typed, never panic.
        let dir = zrecord_fuzz::scratch();
        let _ = zrecord::prelude::DenseWriter::create(dir.path().join("s"), zrecord::prelude::DType::UInt8, &[1], o);
    }
});
