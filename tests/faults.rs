//! Faults while writing: a full disk at every point of a write (a small tmpfs mounted by the
//! test), and SIGKILL at random points of a store write, a dataset COPY and a dictionary
//! training. Never a store that opens half-written, never a destination overwritten, the error
//! names the file and the cause, and leftovers are found and removed by `zrec gc`'s code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use zrecord::prelude::*;
use zrecord::store::publish::{leftovers, remove_leftovers};

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
    let mut rng = zrecord::sample::SplitMix64::new(0x9E37_79B9_7F4A_7C15);
    for (mode, kills) in [("store", 100), ("copy", 100), ("dict", 100)] {
        let dir = tempfile::tempdir().unwrap();
        let mut killed_mid_write = 0;
        let mut k = 0;
        while k < kills {
            let (mut child, mut out) = common::spawn_helper("helper_repeated_writer", (CHILD_ENV, format!("{mode}:{}", dir.path().display())));
            let mut line = String::new();
            // Wait for the first write to start, then kill at a random moment of the next few.
            while out.read_line(&mut line).unwrap() > 0 && !line.contains("start") {
                line.clear();
            }
            std::thread::sleep(Duration::from_micros(rng.next_u64() % 40_000));
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
