//! The `zrec` command line: info, verify (exit codes), demo.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use zrecord::prelude::*;

fn zrec() -> Command {
    Command::new(env!("CARGO_BIN_EXE_zrec"))
}

#[test]
fn info_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tok");
    let packed = zrecord::sample::tokens_ragged(300, 1);
    let mut w = RaggedWriter::create(&p, DType::Int32, 1, WriterOptions::with_codec(Codec::Zstd).level(5)).unwrap();
    w.append(&packed.as_input()).unwrap();
    w.finish().unwrap();

    let out = zrec().arg("info").arg(&p).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in ["ragged", "int32", "ndim          1", "zstd (level 5)", "records       300", "ratio"] {
        assert!(text.contains(needle), "missing '{needle}' in\n{text}");
    }
    let raw = packed.values.len() * 4;
    assert!(text.contains(&format!("raw bytes     {raw} ")), "{text}");

    let out = zrec().args(["verify", "--quiet"]).arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("300 records verified"));

    // Flip one byte in a data shard: verify exits 2 and names the file.
    let shard = p.join("data-001.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xFF;
    std::fs::write(&shard, bytes).unwrap();
    let out = zrec().args(["verify", "--quiet"]).arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CORRUPT") && err.contains("data-001.bin"), "{err}");

    // Not a store: exit 1 with a clear message.
    let out = zrec().arg("info").arg(dir.path().join("missing")).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no zrecord store"));
}

#[test]
fn demo_runs_on_the_builtin_sample() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("demo");
    let out = zrec().args(["demo", "--scale", "0.02", "--dir"]).arg(&work).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for w in ["dense-vision", "dense-tokens", "ragged-tokens"] {
        for c in ["raw", "zstd", "zstd_dict"] {
            assert!(text.lines().any(|l| l.starts_with(w) && l.split_whitespace().nth(1) == Some(c)), "no {w}/{c} row in\n{text}");
            assert!(Store::open(work.join(format!("{w}-{c}"))).is_ok());
        }
    }
    assert!(text.contains("all stores verified"));
}
