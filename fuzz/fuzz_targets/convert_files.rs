//! Arbitrary bytes as a conversion input: an Arrow IPC stream or file, Parquet, CSV, JSON
//! lines, or a `save_to_disk` folder (`state.json` + one Arrow file). Opening and reading every
//! batch is a typed error or batches of the announced schema (no panic, no abort on sizes the
//! input announces).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    kind: u8,
    bytes: Vec<u8>,
    state: String,
}

fuzz_target!(|inp: Input| {
    let dir = zrecord_fuzz::scratch();
    let source = match inp.kind % 6 {
        k @ 0..=4 => {
            let ext = ["arrow", "parquet", "csv", "jsonl", "arrow"][k as usize];
            let mut bytes = inp.bytes.clone();
            if k == 4 {
                // Reach the IPC file reader: the file magic, then the input.
                bytes.splice(0..0, b"ARROW1\0\0".iter().copied());
            }
            let p = dir.path().join(format!("x.{ext}"));
            std::fs::write(&p, bytes).unwrap();
            p
        }
        _ => {
            let d = dir.path().join("saved");
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("data.arrow"), &inp.bytes).unwrap();
            std::fs::write(d.join("state.json"), inp.state.as_bytes()).unwrap();
            std::fs::write(dir.path().join("outside.arrow"), b"outside").unwrap();
            d
        }
    };
    let Ok(input) = zrecord::convert::open_files(source.to_str().unwrap()) else { return };
    // Every named file stays inside the source folder.
    for f in &input.files {
        assert!(f.starts_with(dir.path()) && !f.ends_with("outside.arrow"), "{}", f.display());
    }
    let schema = input.schema.clone();
    for b in input.batches.take(64) {
        match b {
            Ok(b) => assert_eq!(b.schema().fields(), schema.fields()),
            Err(_) => break,
        }
    }
});
