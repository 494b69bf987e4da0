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
    let packed = zrecord::demo::tokens_ragged(300, 1);
    let mut w = RaggedWriter::create(&p, DType::Int32, 1, WriterOptions::with_codec(Codec::Zstd).level(5)).unwrap();
    w.append(&packed.as_input()).unwrap();
    w.finish().unwrap();

    let out = zrec().arg("info").arg(&p).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in ["format        zrecord v2", "logical       tensor", "ragged", "int32", "ndim          1", "zstd (level 5)", "records       300", "ratio"] {
        assert!(text.contains(needle), "missing '{needle}' in\n{text}");
    }
    // A version-1 store (checked-in fixture) reports its version; a v2 string store its type.
    let v1 = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1/dense_f32_zstd");
    let t1 = String::from_utf8(zrec().arg("info").arg(&v1).output().unwrap().stdout).unwrap();
    assert!(t1.contains("format        zrecord v1") && t1.contains("item_shape    [2, 3]"), "{t1}");
    let s = dir.path().join("text");
    let mut w = RaggedWriter::create(&s, DType::UInt8, 1, WriterOptions::default().logical(zrecord::store::Logical::Utf8).allow_empty(true)).unwrap();
    w.append(&PackedRagged::from_records(1, [(&b"ab"[..], &[2usize][..]), (&b""[..], &[0usize][..])]).unwrap().as_input()).unwrap();
    w.finish().unwrap();
    let ts = String::from_utf8(zrec().arg("info").arg(&s).output().unwrap().stdout).unwrap();
    assert!(ts.contains("logical       utf8") && ts.contains("empty records allowed"), "{ts}");
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

#[test]
fn sql_prints_tables_writes_files_and_reports_errors() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut w = DenseWriter::create(root.join("label"), DType::Int64, &[], WriterOptions::default()).unwrap();
    w.append_slice(&(0..10i64).map(|i| i % 3).collect::<Vec<_>>()).unwrap();
    w.finish().unwrap();
    let mut w = DenseWriter::create(root.join("x"), DType::Float32, &[2], WriterOptions::with_codec(Codec::Zstd)).unwrap();
    w.append_slice(&(0..20).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    w.finish().unwrap();
    let table = format!("t={}", root.display());

    let out = zrec().args(["sql", "SELECT label, count(*) AS n FROM t GROUP BY label ORDER BY label", "--table", &table]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().filter(|l| l.starts_with("| ")).map(|l| l.split('|').map(str::trim).filter(|c| !c.is_empty()).collect()).collect();
    assert_eq!(rows, vec![vec!["label", "n"], vec!["0", "4"], vec!["1", "3"], vec!["2", "3"]], "{text}");
    assert!(text.contains("(3 rows)"), "{text}");

    let out = zrec().args(["sql", "SELECT _id, x FROM gather('t', [4, 1])", "--table", &table]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("| 4   | [8.0, 9.0] |") && text.contains("| 1   | [2.0, 3.0] |"), "{text}");

    // Files: Parquet / CSV / Arrow, read back by zrec sql itself.
    for ext in ["parquet", "csv", "arrow"] {
        let f = dir.path().join(format!("out.{ext}"));
        let out = zrec().args(["sql", "SELECT _id, label FROM t WHERE _id >= 7", "--table", &table, "-o"]).arg(&f).output().unwrap();
        assert!(out.status.success(), "{ext}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("3 rows written"), "{ext}");
        assert!(f.exists());
    }
    let csv = std::fs::read_to_string(dir.path().join("out.csv")).unwrap();
    let mut lines: Vec<&str> = csv.lines().collect();
    lines[1..].sort();
    assert_eq!(lines, vec!["_id,label", "7,1", "8,2", "9,0"]);

    // info on a dataset root: one row per stream.
    let out = zrec().arg("info").arg(&root).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("label") && text.contains("float32") && text.contains("10 records per stream"), "{text}");
    // A readable table: sizes with units, ratios, and a total row summing the streams.
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].split_whitespace().collect::<Vec<_>>().starts_with(&["stream", "kind", "dtype", "shape"]), "{text}");
    assert!(text.contains(" B ") || text.contains(" B\n") || text.contains("B  "), "{text}");
    let total = lines.iter().find(|l| l.starts_with("total")).unwrap_or_else(|| panic!("no total row: {text}"));
    assert!(total.trim_end().ends_with('x'), "{total}");
    let out = zrec().args(["verify", "--quiet"]).arg(&root).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("20 records verified"));

    // Errors: exit 1 with DataFusion's / zrecord's message.
    let out = zrec().args(["sql", "SELECT * FROM gather('t', [99])", "--table", &table]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("index 99 out of range"));
    let out = zrec().args(["sql", "SELECT 1", "--table", "nonsense"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected NAME=PATH"));
}

#[test]
fn gc_lists_and_removes_leftovers_of_dead_writers() {
    let dir = tempfile::tempdir().unwrap();
    let dead = dir.path().join(".train.zrecord-tmp-999999999-0");
    std::fs::create_dir_all(&dead).unwrap();
    std::fs::write(dead.join("data-000.bin"), [1u8; 1000]).unwrap();
    let live = dir.path().join(format!(".val.zrecord-tmp-{}-0", std::process::id()));
    std::fs::create_dir_all(&live).unwrap();
    let out = zrec().args(["gc", "--dry-run"]).arg(dir.path()).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("would remove") && text.contains("1000 bytes") && text.contains("kept"), "{text}");
    assert!(dead.exists());
    let out = zrec().arg("gc").arg(dir.path()).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("removed"));
    assert!(!dead.exists() && live.exists(), "only the dead writer's folder goes");
    let out = zrec().args(["gc", "--all"]).arg(dir.path()).output().unwrap();
    assert!(out.status.success() && !live.exists());
    let out = zrec().args(["gc", "/nonexistent/zrecord"]).output().unwrap();
    assert!(!out.status.success());
}
