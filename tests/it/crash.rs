//! A writer process killed mid-write leaves no openable store and the destination free.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::BufRead;

use zrecord::prelude::*;

const CHILD_ENV: &str = "ZRECORD_CRASH_CHILD_PATH";

/// Run only as the child of `killed_writer_leaves_nothing`: appends until killed.
#[test]
#[ignore = "helper process for killed_writer_leaves_nothing"]
fn helper_writer_that_gets_killed() {
    let Ok(path) = std::env::var(CHILD_ENV) else { return };
    let mut w = DenseWriter::create(&path, DType::UInt8, &[4096], WriterOptions::with_codec(Codec::Zstd).data_shards(3)).unwrap();
    let chunk = zrecord::demo::vision(8, 1, 64, 64, 1);
    for i in 0.. {
        w.append_slice(&chunk).unwrap();
        if i == 2 {
            println!("appending");
        }
    }
}

#[test]
fn killed_writer_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let (mut child, mut out) = common::spawn_helper("crash::helper_writer_that_gets_killed", (CHILD_ENV, path.display().to_string()));
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited before appending");
        if line.contains("appending") {
            break;
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(150));
    child.kill().unwrap();
    child.wait().unwrap();

    assert!(!path.exists(), "destination must not exist after a crash");
    assert!(matches!(Store::open(&path), Err(Error::NotFound { .. })));
    // The crashed writer's hidden temp folder holds data but no manifest: it does not open.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    assert!(leftovers[0].file_name().unwrap().to_string_lossy().starts_with(".store.zrecord-tmp-"));
    assert!(std::fs::read_dir(&leftovers[0]).unwrap().count() > 0);
    assert!(Store::open(&leftovers[0]).is_err());
    // The destination is free for a new writer.
    let mut w = DenseWriter::create(&path, DType::UInt8, &[4096], WriterOptions::default()).unwrap();
    w.append_slice(&[9u8; 8192]).unwrap();
    w.finish().unwrap();
    assert_eq!(DenseStore::open(&path).unwrap().len(), 2);
}
