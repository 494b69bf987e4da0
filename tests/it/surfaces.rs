//! Hostile input to the surfaces behind the door to bytes (issue 34): Arrow IPC conversion
//! inputs (announced sizes, byte mutations), `save_to_disk` file lists, FIFOs and symlinks
//! where state, metadata, tokenizer and rendezvous files are expected. Every case is a typed
//! error: no hang, no abort on an allocation, no panic, no write through a link.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use zrecord::convert::open_files;
use zrecord::demo::SplitMix64;
use zrecord::prelude::*;

use crate::common;

fn batch(n: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false), Field::new("s", DataType::Utf8, false)]));
    let s: Vec<String> = (0..n).map(|i| format!("row {i}")).collect();
    RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef, Arc::new(StringArray::from(s)) as ArrayRef]).unwrap()
}

fn ipc_stream(batches: usize) -> Vec<u8> {
    let b = batch(40);
    let mut w = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &b.schema()).unwrap();
    for _ in 0..batches {
        w.write(&b).unwrap();
    }
    w.finish().unwrap();
    w.into_inner().unwrap()
}

fn ipc_file(batches: usize) -> Vec<u8> {
    let b = batch(40);
    let mut w = arrow_ipc::writer::FileWriter::try_new(Vec::new(), &b.schema()).unwrap();
    for _ in 0..batches {
        w.write(&b).unwrap();
    }
    w.finish().unwrap();
    w.into_inner().unwrap()
}

/// Every batch of the file at `path`, or the first error (opening or reading).
fn read_all(path: &Path) -> Result<usize> {
    let input = open_files(path.to_str().unwrap())?;
    let mut rows = 0;
    for b in input.batches {
        rows += b?.num_rows();
    }
    Ok(rows)
}

/// Run `f` on a thread; it must finish within 20 s (a FIFO opened for reading would block it).
fn within_time<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("{what}: hung"))
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

/// Replace the first record batch message's body length (stream) with `to`, found by parsing.
fn patch_stream_body(bytes: &mut [u8], to: i64) {
    // Skip the schema message: continuation, length, metadata, no body.
    let meta_len = |at: usize| i32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
    let second = 8 + meta_len(0);
    let (lo, hi) = (second + 8, second + 8 + meta_len(second));
    let real = arrow_ipc::root_as_message(&bytes[lo..hi]).unwrap().bodyLength();
    for at in lo..hi - 8 {
        if i64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) == real {
            bytes[at..at + 8].copy_from_slice(&to.to_le_bytes());
            if arrow_ipc::root_as_message(&bytes[lo..hi]).is_ok_and(|m| m.bodyLength() == to) {
                return;
            }
            bytes[at..at + 8].copy_from_slice(&real.to_le_bytes());
        }
    }
    panic!("no body length field found");
}

/// Replace the first record batch block's body length in an IPC file's footer with `to`.
fn patch_file_block(bytes: &mut [u8], to: i64) {
    let n = bytes.len();
    let footer_len = i32::from_le_bytes(bytes[n - 10..n - 6].try_into().unwrap()) as usize;
    let (lo, hi) = (n - 10 - footer_len, n - 10);
    let real = arrow_ipc::root_as_footer(&bytes[lo..hi]).unwrap().recordBatches().unwrap().get(0).bodyLength();
    for at in lo..hi - 8 {
        if i64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) == real {
            bytes[at..at + 8].copy_from_slice(&to.to_le_bytes());
            if arrow_ipc::root_as_footer(&bytes[lo..hi]).is_ok_and(|f| f.recordBatches().is_some_and(|b| b.get(0).bodyLength() == to)) {
                return;
            }
            bytes[at..at + 8].copy_from_slice(&real.to_le_bytes());
        }
    }
    panic!("no block body length found");
}

#[test]
fn ipc_messages_announcing_more_than_the_file_holds_are_errors_not_allocations() {
    let dir = tempfile::tempdir().unwrap();
    for (name, to) in [("tib.arrow", 1i64 << 40), ("neg.arrow", -8), ("one_more.arrow", 0)] {
        let mut s = ipc_stream(2);
        let to = if to == 0 { s.len() as i64 } else { to };
        patch_stream_body(&mut s, to);
        let p = dir.path().join(format!("stream-{name}"));
        std::fs::write(&p, &s).unwrap();
        let e = read_all(&p).unwrap_err();
        assert!(matches!(e.root(), Error::Corrupt { .. }), "{name}: {e}");
        assert!(e.to_string().contains("Arrow IPC stream"), "{name}: {e}");

        let mut f = ipc_file(2);
        patch_file_block(&mut f, to);
        let p = dir.path().join(format!("file-{name}"));
        std::fs::write(&p, &f).unwrap();
        let e = read_all(&p).unwrap_err();
        assert!(matches!(e.root(), Error::Corrupt { .. }), "{name}: {e}");
        assert!(e.to_string().contains("Arrow IPC file"), "{name}: {e}");
    }
    // The untouched inputs read whole (the checks pass real files).
    for (name, bytes) in [("ok-stream.arrow", ipc_stream(3)), ("ok-file.arrow", ipc_file(3))] {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        assert_eq!(read_all(&p).unwrap(), 120, "{name}");
    }
    // A truncated stream (cut inside the second batch's body) and a footer length past the file.
    let s = ipc_stream(2);
    let p = dir.path().join("cut.arrow");
    std::fs::write(&p, &s[..s.len() - 40]).unwrap();
    assert!(read_all(&p).is_err());
    let mut f = ipc_file(1);
    let n = f.len();
    f[n - 10..n - 6].copy_from_slice(&(i32::MAX).to_le_bytes());
    let p = dir.path().join("footer.arrow");
    std::fs::write(&p, &f).unwrap();
    let e = read_all(&p).unwrap_err();
    assert!(e.to_string().contains("footer"), "{e}");
}

#[test]
fn byte_mutated_ipc_streams_and_files_never_panic_or_abort() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = SplitMix64::new(34);
    let (mut ok, mut failed) = (0, 0);
    for (kind, clean) in [("stream", ipc_stream(3)), ("file", ipc_file(3))] {
        for i in 0..250 {
            let mut b = clean.clone();
            // 1-4 bytes overwritten, sometimes a whole i32/i64 with an extreme value.
            for _ in 0..1 + rng.next_u64() % 4 {
                let at = (rng.next_u64() % b.len() as u64) as usize;
                match rng.next_u64() % 3 {
                    0 => b[at] = rng.next_u64() as u8,
                    1 if at + 4 <= b.len() => b[at..at + 4].copy_from_slice(&[0xFF, 0xFF, 0xFF, 0x7F]),
                    _ if at + 8 <= b.len() => b[at..at + 8].copy_from_slice(&(1i64 << 40).to_le_bytes()),
                    _ => b[at] ^= 0x80,
                }
            }
            let p = dir.path().join(format!("{kind}-{i}.arrow"));
            std::fs::write(&p, &b).unwrap();
            match read_all(&p) {
                Ok(_) => ok += 1,
                Err(_) => failed += 1,
            }
        }
    }
    // Both outcomes occur (the mutations are neither all harmless nor all caught up front).
    assert!(ok > 0 && failed > 0, "{ok} read, {failed} refused");
}

#[test]
fn save_to_disk_file_lists_stay_inside_their_folder() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside.arrow");
    std::fs::write(&outside, ipc_stream(1)).unwrap();
    let saved = dir.path().join("saved");
    std::fs::create_dir_all(saved.join("sub")).unwrap();
    std::fs::write(saved.join("sub").join("in.arrow"), ipc_stream(1)).unwrap();
    std::os::unix::fs::symlink(&outside, saved.join("link.arrow")).unwrap();
    let state = |files: &[&str]| {
        let list: Vec<serde_json::Value> = files.iter().map(|f| serde_json::json!({ "filename": f })).collect();
        std::fs::write(saved.join("state.json"), serde_json::json!({ "_data_files": list }).to_string()).unwrap();
    };
    let abs = outside.to_str().unwrap().to_string();
    for bad in ["../outside.arrow", abs.as_str(), "sub/../../outside.arrow", "link.arrow", "sub/../../saved/../outside.arrow", ""] {
        state(&["sub/in.arrow", bad]);
        let e = open_files(saved.to_str().unwrap()).err().unwrap_or_else(|| panic!("{bad:?} was read"));
        assert!(matches!(e, Error::InvalidArgument { .. }), "{bad:?}: {e}");
        assert!(e.to_string().contains("outside the folder"), "{bad:?}: {e}");
    }
    // An empty list is an error, not a panic; names inside the folder (a subfolder too) read.
    state(&[]);
    let e = open_files(saved.to_str().unwrap()).err().unwrap();
    assert!(e.to_string().contains("lists no data files"), "{e}");
    state(&["sub/in.arrow", "sub/./in.arrow"]);
    assert_eq!(read_all(&saved).unwrap(), 80);
}

#[test]
fn fifos_where_files_are_expected_are_errors_not_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    // Zarr metadata (v3 and v2).
    for name in ["zarr.json", ".zarray"] {
        let a = d.join(format!("z-{}", name.trim_start_matches('.')));
        std::fs::create_dir_all(&a).unwrap();
        mkfifo(&a.join(name));
        let uri = a.to_str().unwrap().to_string();
        let r = within_time(name, move || zrecord::zarr::ArrayMeta::open(&uri, None).map(|_| ()));
        let e = r.unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{name}: {e}");
    }
    // Text dedup state: the committed counts and the near-dedup parameters.
    let exact = d.join("exact");
    std::fs::create_dir_all(&exact).unwrap();
    mkfifo(&exact.join("dedup.committed"));
    let p = exact.clone();
    let e = within_time("dedup.committed", move || zrecord::text::ExactDedup::open(&p, 1 << 20).map(|_| ())).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    let near = d.join("near");
    std::fs::create_dir_all(&near).unwrap();
    mkfifo(&near.join("near.params"));
    let p = near.clone();
    let e = within_time("near.params", move || zrecord::text::NearDedup::open(&p, Default::default()).map(|_| ())).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    // A tokenizer file.
    let tok = d.join("tokenizer.json");
    mkfifo(&tok);
    let e = within_time("tokenizer.json", move || zrecord::text::Tokenizer::from_file(&tok).map(|_| ())).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    // A rendezvous message planted as a FIFO where rank 1's message will be read.
    let rv = d.join("rv");
    std::fs::create_dir_all(&rv).unwrap();
    mkfifo(&rv.join("g.0.1"));
    let p = rv.clone();
    let e = within_time("rendezvous", move || {
        let mut c = zrecord::dist::FileComm::new(&p, 0, 2, "g").unwrap().with_timeout(Duration::from_secs(5));
        c.allgather(b"hello").map(|_| ())
    })
    .unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

#[test]
fn dedup_state_files_are_never_written_through_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["dedup.log", "dedup.committed"] {
        let victim: PathBuf = dir.path().join(format!("victim-{name}"));
        std::fs::write(&victim, b"precious").unwrap();
        let state = dir.path().join(format!("state-{name}"));
        std::fs::create_dir_all(&state).unwrap();
        std::os::unix::fs::symlink(&victim, state.join(name)).unwrap();
        match zrecord::text::ExactDedup::open(&state, 1 << 20) {
            Err(e) => assert!(e.to_string().contains("symbolic link") || e.to_string().contains("not a regular file") || e.to_string().contains("dedup"), "{name}: {e}"),
            Ok(mut d) => {
                // Opened: then committing must replace the link, not write through it.
                let _ = d.insert(&[1, 2, 3]);
                let _ = d.commit();
            }
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "{name}: the link's target changed");
    }
}

fn zarr_v3(dir: &Path, shape: u64, chunk: u64, codecs: serde_json::Value) {
    std::fs::create_dir_all(dir.join("c")).unwrap();
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [shape], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": codecs,
    });
    std::fs::write(dir.join("zarr.json"), meta.to_string()).unwrap();
}

fn zstd_frame(data_len: usize, byte: u8) -> Vec<u8> {
    let mut e = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    e.include_checksum(true).unwrap();
    e.include_contentsize(false).unwrap();
    let block = vec![byte; 1 << 20];
    let mut left = data_len;
    while left > 0 {
        let n = left.min(block.len());
        std::io::Write::write_all(&mut e, &block[..n]).unwrap();
        left -= n;
    }
    e.finish().unwrap()
}

#[test]
fn zarr_chunks_and_shard_indexes_are_bounded_before_they_are_decoded_or_read() {
    use zrecord::zarr::{Assembler, CacheLimits, Limits, Query};
    let dir = tempfile::tempdir().unwrap();
    let asm = Assembler::new(Limits { decode_workers: 1, ..Limits::default() }, CacheLimits::default()).unwrap();
    let zstd_checksum = serde_json::json!([{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 1, "checksum": true}}]);
    // A zstd chunk with a checksum, honest: read back exactly.
    let ok = dir.path().join("ok.zarr");
    zarr_v3(&ok, 64, 64, zstd_checksum.clone());
    std::fs::write(ok.join("c").join("0"), zstd_frame(64, 7)).unwrap();
    let t = asm.read(ok.to_str().unwrap(), None, None, &Allocator::default()).unwrap();
    assert_eq!(t.as_slice::<u8>().unwrap(), &[7u8; 64][..]);
    // The same chunk expanding to 256 MiB (a few KiB stored, no content size in the header):
    // an error at the chunk's 64 bytes, not a 256 MiB decode.
    let bomb = dir.path().join("bomb.zarr");
    zarr_v3(&bomb, 64, 64, zstd_checksum);
    let frame = zstd_frame(256 << 20, 0);
    assert!(frame.len() < 64 << 10, "{}", frame.len());
    std::fs::write(bomb.join("c").join("0"), frame).unwrap();
    let e = asm.read(bomb.to_str().unwrap(), None, None, &Allocator::default()).unwrap_err();
    assert!(matches!(e, Error::Codec { .. }), "{e}");
    // A shard of 2^28 inner chunks: a 4 GiB index by metadata alone, refused before any read
    // (no shard file exists; the index size alone decides).
    let sharded = dir.path().join("sharded.zarr");
    let per = 1u64 << 28;
    zarr_v3(
        &sharded,
        per,
        per,
        serde_json::json!([{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [1], "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]),
    );
    std::fs::write(sharded.join("c").join("0"), b"tiny").unwrap();
    let e = asm.gather(&[Query::crop(sharded.to_str().unwrap(), &[(0, 4)])], None, None, &Allocator::default()).unwrap_err();
    assert!(e.to_string().contains("max_read_bytes") && e.to_string().contains("shard index"), "{e}");
}

const LIMITED_ENV: &str = "ZRECORD_SURFACES_LIMITED_DIR";

/// Run only as the child of `inputs_announcing_gigabytes_fail_inside_a_memory_limit`: under a
/// 3 GiB address-space limit, a 4 GiB zstd chunk bomb and a 1 TiB IPC body must be errors
/// (an unbounded decode or allocation would abort this process).
#[test]
#[ignore = "helper process for inputs_announcing_gigabytes_fail_inside_a_memory_limit"]
fn helper_bounded_reads_under_a_memory_limit() {
    use zrecord::zarr::{Assembler, CacheLimits, Limits};
    let Ok(dir) = std::env::var(LIMITED_ENV) else { return };
    let dir = PathBuf::from(dir);
    let limit = libc::rlimit { rlim_cur: 3 << 30, rlim_max: 3 << 30 };
    // SAFETY: setrlimit reads the struct passed by reference.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
    let asm = Assembler::new(Limits { decode_workers: 1, ..Limits::default() }, CacheLimits::default()).unwrap();
    let e = asm.read(dir.join("bomb.zarr").to_str().unwrap(), None, None, &Allocator::default()).unwrap_err();
    println!("zarr: {e}");
    let e = read_all(&dir.join("tib.arrow")).unwrap_err();
    println!("ipc: {e}");
    println!("done");
}

#[test]
fn inputs_announcing_gigabytes_fail_inside_a_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.zarr");
    zarr_v3(&bomb, 64, 64, serde_json::json!([{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 1, "checksum": true}}]));
    std::fs::write(bomb.join("c").join("0"), zstd_frame(4 << 30, 0)).unwrap();
    let mut s = ipc_stream(1);
    patch_stream_body(&mut s, 1 << 40);
    std::fs::write(dir.path().join("tib.arrow"), s).unwrap();
    let (mut child, out) = common::spawn_helper("surfaces::helper_bounded_reads_under_a_memory_limit", (LIMITED_ENV, dir.path().display().to_string()));
    let lines: Vec<String> = std::io::BufRead::lines(out).map_while(|l| l.ok()).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {lines:?}");
    assert!(lines.iter().any(|l| l.contains("zarr: ") && l.contains("chunk")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("ipc: ") && l.contains("body")), "{lines:?}");
    assert!(lines.iter().any(|l| l == "done"), "{lines:?}");
}

fn ticket(name: &str, ids: &[u64]) -> Vec<u8> {
    let mut t = (name.len() as u32).to_le_bytes().to_vec();
    t.extend_from_slice(name.as_bytes());
    ids.iter().for_each(|i| t.extend_from_slice(&i.to_le_bytes()));
    t
}

#[test]
fn flight_tickets_out_of_range_or_malformed_are_statuses_and_the_rank_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.zrec");
    let mut w = DenseWriter::create(&p, DType::UInt16, &[3], WriterOptions::default()).unwrap();
    w.append_slice(&(0..30u16).collect::<Vec<_>>()).unwrap();
    w.finish().unwrap();
    let source = Store::open(&p).unwrap().source();
    let answer = |t: &[u8]| zrecord::dist::answer_ticket("v", source.clone(), t);
    // Exactly the rows named: schema + one message of 2 rows x 6 bytes.
    assert_eq!(answer(&ticket("v", &[9, 0])), Ok((2, 12)));
    assert_eq!(answer(&ticket("v", &[])), Ok((1, 0)));
    let hostile: Vec<Vec<u8>> = vec![
        ticket("v", &[10]),
        ticket("v", &[3, u64::MAX]),
        ticket("w", &[0]),
        ticket("v", &[0])[..11].to_vec(),
        vec![0xff, 0xff, 0xff, 0x7f, b'v'],
        vec![1, 0, 0, 0, 0xc3],
        Vec::new(),
    ];
    for t in &hostile {
        let e = answer(t).expect_err(&format!("ticket {t:?} answered"));
        assert!(e.contains("out of range") || e.contains("malformed") || e.contains("no variable 'w'"), "{t:?}: {e}");
        assert_eq!(answer(&ticket("v", &[2])), Ok((2, 6)), "the rank keeps serving after {t:?}");
    }
}
