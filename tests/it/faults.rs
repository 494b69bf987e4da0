//! Faults while writing: a full disk at every point of a write (a small tmpfs mounted by the
//! test), and SIGKILL at random points of a store write, a dataset COPY and a dictionary
//! training. Never a store that opens half-written, never a destination overwritten, the error
//! names the file and the cause, and leftovers are found and removed by `zrec gc`'s code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use zrecord::prelude::*;
use zrecord::io::publish::{leftovers, remove_leftovers};

const PAGE: usize = 4096;

/// A tmpfs of `pages` pages mounted on a fresh folder; unmounted on drop. `None` where mounting
/// is not allowed (not root, or no mount namespace rights): the caller skips.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(pages: usize) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={}", pages * PAGE), "zrecord-faults", dir.path().to_str()?])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ok.then_some(SmallDisk { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Leave exactly `pages` pages free by filling the rest.
    fn leave_free(&self, pages: usize) {
        let filler = self.path().join("filler");
        let _ = std::fs::remove_file(&filler);
        let st = nix_statvfs(self.path());
        let free = st.0 * st.1;
        let want = free.saturating_sub((pages * PAGE) as u64);
        std::fs::write(&filler, vec![0xEEu8; want as usize]).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// (free blocks, block size) of the filesystem holding `p`.
fn nix_statvfs(p: &Path) -> (u64, u64) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_bavail as u64, st.f_frsize as u64)
}

fn records(n: usize, len: usize, seed: u8) -> Vec<u8> {
    (0..n * len).map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[0] ^ seed).collect()
}

/// With 0, 1, 2, ... pages free, a raw and a zstd store write fails at each of its files (data
/// shards, index, shapes, manifest) in turn until it fits: every failure is an I/O error naming
/// a file and ENOSPC, publishes nothing and leaves nothing behind.
#[test]
fn full_disk_at_every_point_of_a_write_fails_cleanly() {
    let Some(disk) = SmallDisk::mount(64) else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let data = records(8, 4000, 1);
    let ragged_values = records(1, 9000, 2);
    for (name, opts) in [("raw", WriterOptions::default().data_shards(2)), ("zstd", WriterOptions::with_codec(Codec::Zstd).data_shards(1))] {
        let mut published = false;
        let mut failures = std::collections::BTreeSet::new();
        for free in 0..24 {
            disk.leave_free(free);
            let dest = disk.path().join(format!("{name}-{free}"));
            let r = (|| -> Result<()> {
                if free % 2 == 0 {
                    let mut w = DenseWriter::create(&dest, DType::UInt8, &[4000], opts.clone())?;
                    w.append_slice(&data)?;
                    w.finish()?;
                } else {
                    let mut w = RaggedWriter::create(&dest, DType::UInt8, 1, opts.clone())?;
                    let cu = [0i32, 3000, 6000, 9000];
                    w.append(&RaggedInput::from_slices(&ragged_values, &cu, &[3000, 3000, 3000], 1))?;
                    w.finish()?;
                }
                Ok(())
            })();
            match r {
                Ok(()) => {
                    published = true;
                    let s = Store::open(&dest).unwrap();
                    assert_eq!(s.verify().unwrap(), s.len());
                    std::fs::remove_dir_all(&dest).unwrap();
                }
                Err(e) => {
                    let msg = e.to_string();
                    let root = e.root();
                    let Error::Io { path, source } = root else { panic!("free={free}: not an I/O error: {msg}") };
                    assert_eq!(source.raw_os_error(), Some(libc::ENOSPC), "free={free}: {msg}");
                    failures.insert(path.file_name().unwrap().to_string_lossy().into_owned());
                    assert!(!dest.exists(), "free={free}: a failed write published {}", dest.display());
                    assert!(Store::open(&dest).is_err());
                }
            }
            assert!(leftovers(disk.path()).unwrap().is_empty(), "free={free}: leftovers after a failed write");
        }
        assert!(published, "{name}: never fit");
        // The failures hit more than one file of the store (data, index, manifest ...).
        assert!(failures.len() >= 2, "{name}: failures only at {failures:?}");
    }
}

const CHILD_ENV: &str = "ZRECORD_FAULTS_CHILD";

/// Child process: repeatedly writes `<dir>/w<i>` (mode: store, copy or dict), announcing each
/// start, until killed.
#[test]
#[ignore = "helper process for killed_at_random_points"]
fn helper_repeated_writer() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let (mode, dir) = spec.split_once(':').unwrap();
    let dir = PathBuf::from(dir);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for i in 0.. {
        let dest = dir.join(format!("w{}-{i}", std::process::id()));
        println!("start {i}");
        match mode {
            "store" => {
                let mut w = DenseWriter::create(&dest, DType::UInt8, &[1000], WriterOptions::with_codec(Codec::Zstd).data_shards(2)).unwrap();
                for k in 0..4 {
                    w.append_slice(&records(64, 1000, k)).unwrap();
                }
                w.finish().unwrap();
            }
            "copy" => rt.block_on(async {
                let ctx = zrecord::query::zrecord_context();
                let q = format!(
                    "COPY (SELECT value AS a, value * 2 AS b FROM generate_series(0, 19999)) TO '{}' STORED AS ZRECORD OPTIONS (codec 'zstd')",
                    dest.display()
                );
                ctx.sql(&q).await.unwrap().collect().await.unwrap();
            }),
            _ => {
                let samples: Vec<Vec<u8>> = (0..400).map(|k| records(1, 600, k as u8)).collect();
                let dict = zrecord::store::train_dict(&samples[..], 8192).unwrap();
                let mut w = DenseWriter::create(&dest, DType::UInt8, &[600], WriterOptions::zstd_dict(dict)).unwrap();
                w.append_slice(&samples.concat()).unwrap();
                w.finish().unwrap();
            }
        }
        println!("done {i}");
    }
}

/// Check every output of a killed child: each either does not exist or is complete.
fn check_outputs(dir: &Path, mode: &str) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') {
            // A staging folder (never the destination) opens only once its manifest, written
            // last, is complete: killed between that and the rename. Then it is whole.
            if let Ok(s) = Store::open(&p) {
                s.verify().unwrap_or_else(|e| panic!("staging folder {name} opens half-written: {e}"));
            }
            if let Ok(d) = zrecord::store::Dataset::open(&p) {
                for s in d.streams() {
                    s.store().unwrap().verify().unwrap();
                }
            }
            continue;
        }
        match mode {
            "copy" => {
                let d = zrecord::store::Dataset::open(&p).unwrap_or_else(|e| panic!("{name}: published but does not open: {e}"));
                assert_eq!(d.len(), 20000);
                for s in d.streams() {
                    s.store().unwrap().verify().unwrap();
                }
            }
            _ => {
                let s = Store::open(&p).unwrap_or_else(|e| panic!("{name}: published but does not open: {e}"));
                assert_eq!(s.verify().unwrap(), if mode == "store" { 256 } else { 400 });
            }
        }
    }
}

#[test]
fn killed_at_random_points_never_publishes_half_a_store() {
    let mut rng = zrecord::demo::SplitMix64::new(0x9E37_79B9_7F4A_7C15);
    for (mode, kills) in [("store", 100), ("copy", 100), ("dict", 100)] {
        let dir = tempfile::tempdir().unwrap();
        // How long one write takes in this build (sanitizers and debug builds are several times
        // slower): kills are spread over one and a half of them.
        let one_write_us = {
            let (mut child, mut out) = common::spawn_helper("faults::helper_repeated_writer", (CHILD_ENV, format!("{mode}:{}", dir.path().display())));
            let mut line = String::new();
            let mut started = None;
            while out.read_line(&mut line).unwrap() > 0 {
                if line.contains("start 0") {
                    started = Some(std::time::Instant::now());
                } else if line.contains("done 0") {
                    break;
                }
                line.clear();
            }
            child.kill().unwrap();
            child.wait().unwrap();
            let us = started.expect("the writer started").elapsed().as_micros() as u64;
            remove_leftovers(dir.path(), false).unwrap();
            for e in std::fs::read_dir(dir.path()).unwrap() {
                std::fs::remove_dir_all(e.unwrap().path()).unwrap();
            }
            us.max(1000)
        };
        let mut killed_mid_write = 0;
        let mut k = 0;
        while k < kills {
            let (mut child, mut out) = common::spawn_helper("faults::helper_repeated_writer", (CHILD_ENV, format!("{mode}:{}", dir.path().display())));
            let mut line = String::new();
            // Wait for the first write to start, then kill at a random moment of the next few.
            while out.read_line(&mut line).unwrap() > 0 && !line.contains("start") {
                line.clear();
            }
            std::thread::sleep(Duration::from_micros(rng.next_u64() % (one_write_us * 3 / 2)));
            child.kill().unwrap();
            child.wait().unwrap();
            k += 1;
            check_outputs(dir.path(), mode);
            // Leftovers of the dead child are removable; then everything left opens.
            let before = leftovers(dir.path()).unwrap();
            assert!(before.len() <= 1, "{before:?}");
            killed_mid_write += before.len();
            assert!(before.iter().all(|l| !l.writer_alive));
            remove_leftovers(dir.path(), false).unwrap();
            assert!(leftovers(dir.path()).unwrap().is_empty());
            // Restart numbering in a fresh folder now and then, so outputs do not pile up.
            if k % 10 == 0 {
                for e in std::fs::read_dir(dir.path()).unwrap() {
                    std::fs::remove_dir_all(e.unwrap().path()).unwrap();
                }
            }
        }
        // Most kills land inside a write (dictionary runs spend most of their time training,
        // before the writer starts: those kills must simply leave nothing).
        let floor = if mode == "dict" { 1 } else { kills / 4 };
        assert!(killed_mid_write >= floor, "{mode}: only {killed_mid_write} kills hit a write");
    }
}

// ---------------------------------------------------------------------------------------------
// EIO: one write or fsync fails (tests/fixtures/eio_preload.c, preloaded into a child process)

const EIO_CHILD_ENV: &str = "ZRECORD_FAULTS_EIO_CHILD";
/// Marks the helper's result line in its output.
const RESULT: &str = "EIO-RESULT ";

/// Build the EIO shim with the system C compiler. `None` where there is none (the caller skips).
fn build_eio_shim(dir: &Path) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eio_preload.c");
    let out = dir.join("eio_preload.so");
    let ok = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then_some(out)
}

/// Child process: one write of kind `mode` to `dest`, then `EIO-RESULT ok`, or
/// `EIO-RESULT err<TAB>path<TAB>errno<TAB>message` with the innermost I/O error.
#[test]
#[ignore = "helper process for one_eio_at_every_write_and_fsync_fails_cleanly"]
fn helper_eio_writer() {
    let Ok(spec) = std::env::var(EIO_CHILD_ENV) else { return };
    let (mode, dest) = spec.split_once(':').unwrap();
    let dest = PathBuf::from(dest);
    let r: Result<()> = (|| {
        match mode {
            "dense" => {
                let mut w = DenseWriter::create(&dest, DType::UInt8, &[500], WriterOptions::with_codec(Codec::Zstd).data_shards(2))?;
                w.append_slice(&records(40, 500, 1))?;
                w.append_slice(&records(40, 500, 2))?;
                w.finish()?;
            }
            "ragged" => {
                let mut w = RaggedWriter::create(&dest, DType::UInt8, 1, WriterOptions::default())?;
                let values = records(1, 9000, 3);
                let cu = [0i32, 1000, 6000, 9000];
                w.append(&RaggedInput::from_slices(&values, &cu, &[1000, 5000, 3000], 1))?;
                w.finish()?;
            }
            "dict" => {
                let samples: Vec<Vec<u8>> = (0..200).map(|k| records(1, 600, k as u8)).collect();
                let dict = zrecord::store::train_dict(&samples[..], 4096)?;
                let mut w = DenseWriter::create(&dest, DType::UInt8, &[600], WriterOptions::zstd_dict(dict))?;
                w.append_slice(&samples.concat())?;
                w.finish()?;
            }
            _ => {
                let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                rt.block_on(async {
                    let ctx = zrecord::query::zrecord_context();
                    let q = format!(
                        "COPY (SELECT value AS a, value * 2 AS b FROM generate_series(0, 2999)) TO '{}' STORED AS ZRECORD OPTIONS (codec 'zstd')",
                        dest.display()
                    );
                    ctx.sql(&q).await?.collect().await?;
                    Ok::<_, datafusion::error::DataFusionError>(())
                })?;
            }
        }
        Ok(())
    })();
    match r {
        Ok(()) => println!("{RESULT}ok"),
        Err(e) => {
            let msg = e.to_string().replace(['\t', '\n'], " ");
            match e.root() {
                Error::Io { path, source } => println!("{RESULT}err\t{}\t{}\t{msg}", path.display(), source.raw_os_error().unwrap_or(-1)),
                other => println!("{RESULT}err\t-\t-1\t{msg} (root: {other})"),
            }
        }
    }
}

/// For a dense zstd store (two shards), a ragged raw store, a zstd_dict store and a COPY to a
/// dataset: the n-th write, then the n-th fsync, of each file of the output fails once with EIO,
/// for n = 0, 1, ... until the output is written without reaching it; then once per directory
/// fsync. Every failure is an I/O error naming the file and the cause; nothing is published
/// (except when only the parent's fsync after the rename failed: then the output is whole and
/// verifies); no staging folder is left behind; the error is never swallowed (a transient EIO
/// followed by successful calls must still fail the write).
#[test]
fn one_eio_at_every_write_and_fsync_fails_cleanly() {
    if cfg!(zrecord_sanitize) {
        // The sanitizer runtime's own write / fsync interceptors reach libc past the shim.
        eprintln!("skipped under a sanitizer (its interceptors bypass the preloaded shim)");
        return;
    }
    let tools = tempfile::tempdir().unwrap();
    let Some(shim) = build_eio_shim(tools.path()) else {
        eprintln!("skipped: no C compiler to build the EIO shim");
        return;
    };
    let files: &[(&str, &[&str])] = &[
        ("dense", &["data-000", "data-001", "index.bin", "manifest.json"]),
        ("ragged", &["data-000", "index.bin", "shapes.bin", "manifest.json"]),
        ("dict", &["dictionary.zstd", "data-000", "index.bin", "manifest.json"]),
        ("copy", &["data-000", "index.bin", "manifest.json", "dataset.json"]),
    ];
    let mut injected = 0;
    for &(mode, names) in files {
        let mut cases: Vec<(&str, &str)> = names.iter().flat_map(|n| [("write", *n), ("fsync", *n)]).collect();
        cases.push(("fsyncdir", ""));
        for (op, pattern) in cases {
            let mut n = 0;
            loop {
                assert!(n < 200, "{mode} {op} {pattern}: still failing after {n} calls");
                let dir = tempfile::tempdir().unwrap();
                let dest = dir.path().join("out");
                let envs = [
                    (EIO_CHILD_ENV, format!("{mode}:{}", dest.display())),
                    ("ZRECORD_EIO", format!("{op}:{pattern}:{n}")),
                    ("LD_PRELOAD", shim.display().to_string()),
                ];
                let (mut child, mut out) = common::spawn_helper_with("faults::helper_eio_writer", &envs);
                let mut text = String::new();
                std::io::Read::read_to_string(&mut out, &mut text).unwrap();
                assert!(child.wait().unwrap().success(), "{mode} {op} {pattern} #{n}: child failed: {text}");
                // The test harness prints "test helper_eio_writer ... " before the helper's own
                // output on the same line: take what follows the marker.
                let line = text.split(RESULT).nth(1).and_then(|r| r.lines().next()).unwrap_or_else(|| panic!("no result line: {text}"));
                let ctx = format!("{mode} {op}:{pattern}:{n}");
                assert!(leftovers(dir.path()).unwrap().is_empty(), "{ctx}: staging folder left behind");
                if line == "ok" {
                    // The n-th call never happened: every earlier one was failed in turn.
                    assert!(n > 0, "{ctx}: no call matched (the shim is not in effect, or the file is not written)");
                    check_eio_output(&dest, mode, &ctx);
                    break;
                }
                injected += 1;
                let parts: Vec<&str> = line.splitn(4, '\t').collect();
                let (path, errno, msg) = (parts[1], parts[2], parts[3]);
                assert_eq!(errno, libc::EIO.to_string(), "{ctx}: not EIO: {msg}");
                assert!(msg.contains("Input/output error"), "{ctx}: the cause is not named: {msg}");
                if op != "fsyncdir" {
                    assert!(path.contains(pattern), "{ctx}: the error names {path}");
                }
                let file_name = Path::new(path).file_name().unwrap().to_string_lossy().into_owned();
                assert!(msg.contains(&file_name), "{ctx}: the message does not name {file_name}: {msg}");
                if dest.exists() {
                    // Only the parent folder's fsync after the rename may fail once published.
                    assert_eq!(op, "fsyncdir", "{ctx}: published after an error: {msg}");
                    check_eio_output(&dest, mode, &ctx);
                } else {
                    assert!(Store::open(&dest).is_err());
                }
                n += 1;
            }
        }
    }
    eprintln!("{injected} single EIO failures injected");
    assert!(injected >= 40, "only {injected} injected failures");
}

fn check_eio_output(dest: &Path, mode: &str, ctx: &str) {
    if mode == "copy" {
        let d = zrecord::store::Dataset::open(dest).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(d.len(), 3000);
        for s in d.streams() {
            s.store().unwrap().verify().unwrap();
        }
    } else {
        let s = Store::open(dest).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(s.verify().unwrap(), if mode == "dense" { 80 } else if mode == "ragged" { 3 } else { 200 });
    }
}
