//! String tensors and text stages: constructors and exports against Arrow, operations against
//! plain loops, each stage on inputs with known answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, LargeStringArray, StringArray, StringViewArray};
use arrow_buffer::{Buffer, NullBuffer};
use zrecord::prelude::*;
use zrecord::text::{Cleaner, LengthUnit, OffsetType, PiiKind, PiiMasker, QualityFilter, QualityRules, Stage, StringTensor, TextPipeline};

fn corpus() -> Vec<Option<String>> {
    let mut v: Vec<Option<String>> = Vec::new();
    for i in 0..10_000usize {
        v.push(match i % 7 {
            0 => None,
            1 => Some(String::new()),
            2 => Some(format!("pre{i}")),
            3 => Some(format!("prefix-long-string-{i}-ünïcödé-{}", "x".repeat(i % 40))),
            4 => Some("préfix".to_string()),
            5 => Some(format!("{i}")),
            _ => Some("exactly12chr".to_string()),
        });
    }
    v
}

fn tensor(v: &[Option<String>]) -> StringTensor {
    StringTensor::from_opt_strs(v.iter().map(|s| s.as_deref()))
}

#[test]
fn from_arrow_shares_bytes_and_keeps_values_and_nulls() {
    let v = corpus();
    let sa = StringArray::from(v.iter().map(|s| s.as_deref()).collect::<Vec<_>>());
    let (t, copied) = StringTensor::from_arrow(&sa).unwrap();
    assert!(!copied);
    assert_eq!(t.len(), v.len());
    assert_eq!(t.null_count(), v.iter().filter(|s| s.is_none()).count());
    for (i, s) in v.iter().enumerate() {
        assert_eq!(t.value(i), s.as_deref(), "row {i}");
    }
    // The long strings point into the Utf8 array's own data buffer.
    let data = sa.values().as_ptr() as usize..sa.values().as_ptr() as usize + sa.values().len();
    for b in t.as_arrow().data_buffers() {
        assert!(data.contains(&(b.as_ptr() as usize)), "view buffer is a copy");
    }
    let la = LargeStringArray::from(v.iter().map(|s| s.as_deref()).collect::<Vec<_>>());
    let (t2, copied) = StringTensor::from_arrow(&la).unwrap();
    assert!(!copied);
    assert_eq!(t2, t);
    let sv = StringViewArray::from(v.iter().map(|s| s.as_deref()).collect::<Vec<_>>());
    let (t3, copied) = StringTensor::from_arrow(&sv).unwrap();
    assert!(!copied);
    assert_eq!(t3.as_arrow().views().as_ptr(), sv.views().as_ptr(), "Utf8View is taken as is");
    // Sliced input keeps its offset window.
    let sliced = sa.slice(3, 50);
    let (t4, _) = StringTensor::from_arrow(&sliced).unwrap();
    for i in 0..50 {
        assert_eq!(t4.value(i), v[i + 3].as_deref());
    }
    let err = StringTensor::from_arrow(&arrow_array::Int32Array::from(vec![1])).unwrap_err();
    assert!(err.to_string().contains("not a string array"), "{err}");
}

#[test]
fn exports_round_trip_through_every_offset_type() {
    let v = corpus();
    let t = tensor(&v);
    let back = t.to_string_array().unwrap();
    assert_eq!(back, StringArray::from(v.iter().map(|s| s.as_deref()).collect::<Vec<_>>()));
    let back = t.to_large_string_array().unwrap();
    assert_eq!(back, LargeStringArray::from(v.iter().map(|s| s.as_deref()).collect::<Vec<_>>()));
    for kind in [OffsetType::Int32, OffsetType::Int64, OffsetType::UInt32] {
        let (offs, data, nulls) = t.to_offsets(kind).unwrap();
        let w = kind.dtype().size();
        assert_eq!(offs.len(), (v.len() + 1) * w);
        let at = |k: usize| -> usize {
            let b = &offs[k * w..(k + 1) * w];
            match kind {
                OffsetType::Int32 => i32::from_le_bytes(b.try_into().unwrap()) as usize,
                OffsetType::Int64 => i64::from_le_bytes(b.try_into().unwrap()) as usize,
                OffsetType::UInt32 => u32::from_le_bytes(b.try_into().unwrap()) as usize,
            }
        };
        for (i, s) in v.iter().enumerate() {
            let got = std::str::from_utf8(&data[at(i)..at(i + 1)]).unwrap();
            assert_eq!(got, s.as_deref().unwrap_or(""));
        }
        assert_eq!(nulls.unwrap().null_count(), t.null_count());
        let rebuilt = match kind {
            OffsetType::Int32 => StringTensor::from_offsets(&(0..=v.len()).map(|k| at(k) as i32).collect::<Vec<_>>(), Buffer::from_vec(data), t.as_arrow().nulls().cloned()),
            OffsetType::Int64 => StringTensor::from_offsets(&(0..=v.len()).map(|k| at(k) as i64).collect::<Vec<_>>(), Buffer::from_vec(data), t.as_arrow().nulls().cloned()),
            OffsetType::UInt32 => StringTensor::from_offsets(&(0..=v.len()).map(|k| at(k) as u32).collect::<Vec<_>>(), Buffer::from_vec(data), t.as_arrow().nulls().cloned()),
        }
        .unwrap();
        assert_eq!(rebuilt, t);
    }
    for dt in [arrow_schema::DataType::Utf8, arrow_schema::DataType::LargeUtf8, arrow_schema::DataType::Utf8View] {
        let a: ArrayRef = t.to_arrow_type(&dt).unwrap();
        assert_eq!(a.data_type(), &dt);
        assert_eq!(StringTensor::from_arrow(a.as_ref()).unwrap().0, t);
    }
}

#[test]
fn from_offsets_rejects_bad_input_naming_the_position() {
    let data = Buffer::from_vec(b"helloworld".to_vec());
    let e = StringTensor::from_offsets::<i32>(&[], data.clone(), None).unwrap_err().to_string();
    assert!(e.contains("n + 1"), "{e}");
    let e = StringTensor::from_offsets(&[0i32, 5, 3, 10], data.clone(), None).unwrap_err().to_string();
    assert!(e.contains("decrease at position 2"), "{e}");
    let e = StringTensor::from_offsets(&[0i32, 5, 11], data.clone(), None).unwrap_err().to_string();
    assert!(e.contains("offset 2 is 11, past the 10 bytes"), "{e}");
    let e = StringTensor::from_offsets(&[0i64, -1], data.clone(), None).unwrap_err().to_string();
    assert!(e.contains("offset 1 is negative"), "{e}");
    // Invalid UTF-8 in the third string at its byte 1.
    let bad = Buffer::from_vec(b"abcdef\xffgh".to_vec());
    let e = StringTensor::from_offsets(&[0u32, 2, 5, 9], bad, None).unwrap_err().to_string();
    assert!(e.contains("string 2 is not valid UTF-8") && e.contains("position 1 of the string"), "{e}");
    // A boundary inside a multi-byte char: 'é' is 2 bytes.
    let e_acute = Buffer::from_vec("aéb".as_bytes().to_vec());
    let e = StringTensor::from_offsets(&[0i32, 2, 4], e_acute, None).unwrap_err().to_string();
    assert!(e.contains("offset 1 (2) splits a multi-byte"), "{e}");
    let e = StringTensor::from_offsets(&[0i32, 5, 10], data.clone(), Some(NullBuffer::new_null(3))).unwrap_err().to_string();
    assert!(e.contains("3 entries for 2 strings"), "{e}");
    // Offsets that start past 0 (a slice) are fine.
    let t = StringTensor::from_offsets(&[2i32, 5, 10], data, None).unwrap();
    assert_eq!(t.value(0), Some("llo"));
    assert_eq!(t.value(1), Some("world"));
}

#[test]
fn from_ragged_batch_reads_utf8_records() {
    let alloc = Allocator::default();
    let strs = ["", "short", "a string longer than twelve bytes", "ünïcödé"];
    let recs: Vec<(&[u8], Vec<usize>)> = strs.iter().map(|s| (s.as_bytes(), vec![s.len()])).collect();
    let refs: Vec<(&[u8], &[usize])> = recs.iter().map(|(d, s)| (*d, s.as_slice())).collect();
    let b = RaggedBatch::from_records(&alloc, 1, &refs).unwrap();
    let t = StringTensor::from_ragged(&b).unwrap();
    for (i, s) in strs.iter().enumerate() {
        assert_eq!(t.value(i), Some(*s));
    }
    let ints = RaggedBatch::from_records::<i32>(&alloc, 1, &[(&[1, 2], &[2])]).unwrap();
    assert!(StringTensor::from_ragged(&ints).is_err());
    let bad = RaggedBatch::from_records::<u8>(&alloc, 1, &[(&[0xff, 0xfe], &[2])]).unwrap();
    assert!(StringTensor::from_ragged(&bad).unwrap_err().to_string().contains("not valid UTF-8"));
}

#[test]
fn operations_match_plain_loops() {
    let v = corpus();
    let t = tensor(&v);
    for prefix in ["", "p", "pre", "pref", "prefix-", "préfix", "prefix-long-string-1", "zzz", "exactly12chr", "exactly12chrX"] {
        let m = t.starts_with(prefix);
        for (i, s) in v.iter().enumerate() {
            let want = s.as_deref().map(|s| s.starts_with(prefix));
            assert_eq!(m.is_valid(i).then(|| m.value(i)), want, "prefix {prefix:?} row {i}");
        }
        let f = t.filter_by_prefix(prefix).unwrap();
        let want: Vec<&str> = v.iter().flatten().filter(|s| s.starts_with(prefix)).map(String::as_str).collect();
        assert_eq!((0..f.len()).map(|i| f.value(i).unwrap()).collect::<Vec<_>>(), want);
        let e = t.eq_scalar(prefix);
        for (i, s) in v.iter().enumerate() {
            assert_eq!(e.is_valid(i).then(|| e.value(i)), s.as_deref().map(|s| s == prefix), "eq {prefix:?} row {i}");
        }
    }
    let rev: Vec<Option<String>> = v.iter().rev().cloned().collect();
    let e = t.eq(&tensor(&rev)).unwrap();
    for i in 0..v.len() {
        let want = match (&v[i], &rev[i]) {
            (Some(a), Some(b)) => Some(a == b),
            _ => None,
        };
        assert_eq!(e.is_valid(i).then(|| e.value(i)), want);
    }
    assert!(t.eq(&tensor(&v[..3])).is_err());
    let chars = t.lengths(LengthUnit::Chars);
    let bytes = t.lengths(LengthUnit::Bytes);
    for (i, s) in v.iter().enumerate() {
        if let Some(s) = s {
            assert_eq!(chars.value(i) as usize, s.chars().count());
            assert_eq!(bytes.value(i) as usize, s.len());
        } else {
            assert!(chars.is_null(i));
        }
    }
    for (lo, hi) in [(0, 0), (1, 5), (5, 12), (13, 60), (6, 6)] {
        for unit in [LengthUnit::Chars, LengthUnit::Bytes] {
            let m = t.length_between(lo, hi, unit);
            for (i, s) in v.iter().enumerate() {
                let want = s.as_deref().map(|s| (lo..=hi).contains(&if unit == LengthUnit::Chars { s.chars().count() } else { s.len() }));
                assert_eq!(m.is_valid(i).then(|| m.value(i)), want, "{lo}..={hi} {unit:?} row {i} {s:?}");
            }
        }
    }
    let h = t.hash(7);
    for (i, s) in v.iter().enumerate() {
        if let Some(s) = s {
            assert_eq!(h.value(i), twox_hash::XxHash3_64::oneshot_with_seed(7, s.as_bytes()));
        }
    }
    // XXH3-64 of the empty input (published test vector).
    assert_eq!(StringTensor::from_strs([""]).hash(0).value(0), 0x2D06_8005_38D3_94C2);
    let ids = [5u64, 0, 5, 9999, 3];
    let tk = t.take(&ids).unwrap();
    for (k, &i) in ids.iter().enumerate() {
        assert_eq!(tk.value(k), v[i as usize].as_deref());
    }
    let e = t.take(&[1, 10_000]).unwrap_err();
    assert!(matches!(e, Error::IndexOutOfRange { index: 10_000, .. }), "{e}");
    let mask = arrow_array::BooleanArray::from((0..v.len()).map(|i| i % 3 == 0).collect::<Vec<_>>());
    let f = t.filter(&mask).unwrap();
    let want: Vec<Option<&str>> = v.iter().enumerate().filter(|(i, _)| i % 3 == 0).map(|(_, s)| s.as_deref()).collect();
    assert_eq!((0..f.len()).map(|i| f.value(i)).collect::<Vec<_>>(), want);
    assert_eq!(f.compact(), f);
    assert!(t.filter(&arrow_array::BooleanArray::from(vec![true])).is_err());
    let c = StringTensor::concat(&[&t, &f, &tk]).unwrap();
    assert_eq!(c.len(), t.len() + f.len() + tk.len());
    assert_eq!(c.value(t.len() + f.len()), tk.value(0));
}

#[test]
fn cleaner_rules() {
    let c = Cleaner::default();
    assert_eq!(c.clean("  a\r\nb\rc\u{2028}d  "), "a\nb\nc\nd");
    assert_eq!(c.clean("x\u{0}y\u{7}z\u{feff}\u{200b}"), "xyz");
    assert_eq!(c.clean("tab\there\nnext"), "tab\there\nnext");
    // NFC: e + combining acute -> é.
    assert_eq!(c.clean("cafe\u{301}"), "caf\u{e9}");
    assert_eq!(c.clean("already clean"), "already clean");
    let mut out = String::new();
    assert!(!c.clean_into("already clean", &mut out), "unchanged text reports no change");
    let collapse = Cleaner { collapse_whitespace: true, ..Cleaner::default() };
    assert_eq!(collapse.clean("a   b\t\tc  \n\n\n\n  d \n e"), "a b c\n\nd\ne");
    let keep = Cleaner { normalize_newlines: false, strip_control: false, nfc: false, trim: false, collapse_whitespace: false };
    assert_eq!(keep.clean(" a\r\n\u{7}cafe\u{301} "), " a\r\n\u{7}cafe\u{301} ");
}

const GOOD_DOC: &str = "The history of the printing press is a story of how ideas travel. Before movable type, \
books were copied by hand, which made them rare and expensive. Gutenberg's press changed that, and within \
fifty years printers in many cities of Europe were producing books in large numbers. This spread of \
knowledge had consequences that are still being studied by historians today, and it shaped the way \
we think about science, religion, and politics with lasting effect.";

#[test]
fn quality_filter_gopher_rules() {
    let q = QualityFilter::default();
    assert!(q.keep(GOOD_DOC), "{:?}", QualityFilter::stats(GOOD_DOC));
    assert!(!q.keep("too short to be a document"));
    let spam = "buy now ".repeat(60);
    assert!(!q.keep(&spam), "repetition");
    let symbols = format!("{} {}", GOOD_DOC, "# # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # # #");
    assert!(!q.keep(&symbols), "symbols");
    let dup_lines = (0..20).map(|_| "the same line of text with the words".to_string()).collect::<Vec<_>>().join("\n");
    assert!(!q.keep(&dup_lines));
    let s = QualityFilter::stats("a b\na b\n\n# c...\n- d");
    assert_eq!((s.chars, s.words, s.lines), (19, 8, 4));
    assert!((s.dup_line_frac - 0.25).abs() < 1e-12);
    assert!((s.bullet_line_frac - 0.25).abs() < 1e-12);
    assert!((s.ellipsis_line_frac - 0.25).abs() < 1e-12);
    assert!((s.symbol_word_ratio - 2.0 / 8.0).abs() < 1e-12);
    // Every rule off keeps everything; a single rule set by name.
    let none = QualityFilter::new(QualityRules::default());
    assert!(none.keep(""));
    let mut r = QualityRules::default();
    r.set("min_words", Some(3.0)).unwrap();
    assert!(!QualityFilter::new(r.clone()).keep("two words"));
    assert!(QualityFilter::new(r.clone()).keep("three words here"));
    assert!(r.set("min_words", Some(2.5)).is_err());
    assert!(r.set("max_top_ngram_frac_5", Some(0.1)).is_err());
    assert!(r.set("nonsense", Some(0.1)).is_err());
    assert!(QualityRules::preset("nope").is_err());
}

fn masked(text: &str) -> String {
    PiiMasker::default().mask(text)
}

#[test]
fn pii_masking_validates_candidates() {
    assert_eq!(masked("write to ada.lovelace+ml@example.co.uk today"), "write to <EMAIL> today");
    assert_eq!(masked("not an email: a@b, x@localhost"), "not an email: a@b, x@localhost");
    assert_eq!(masked("card 4111 1111 1111 1111 ok"), "card <CREDIT_CARD> ok");
    assert_eq!(masked("card 4111-1111-1111-1111"), "card <CREDIT_CARD>");
    assert_eq!(masked("bad luhn 4111 1111 1111 1112"), "bad luhn 4111 1111 1111 1112");
    assert_eq!(masked("order 1234567890123456"), "order 1234567890123456", "no issuer, no Luhn");
    assert_eq!(masked("ssn 123-45-6789."), "ssn <SSN>.");
    assert_eq!(masked("ssn 000-12-3456 666-12-3456 900-12-3456 123-00-4567"), "ssn 000-12-3456 666-12-3456 900-12-3456 123-00-4567");
    assert_eq!(masked("host 192.168.1.20 up"), "host <IP_ADDRESS> up");
    assert_eq!(masked("v1.2.3.4 and version 1.2.3.4 and release: 2.0.1.7"), "v1.2.3.4 and version 1.2.3.4 and release: 2.0.1.7");
    assert_eq!(masked("1.2.3.4.5 and 256.1.1.1 and 01.2.3.4"), "1.2.3.4.5 and 256.1.1.1 and 01.2.3.4");
    assert_eq!(masked("ipv6 2001:db8::8a2e:370:7334 and ::1."), "ipv6 <IP_ADDRESS> and <IP_ADDRESS>.");
    assert_eq!(masked("at 12:30:45 and mac 00:1a:2b:3c:4d:5e"), "at 12:30:45 and mac 00:1a:2b:3c:4d:5e");
    assert_eq!(masked("call (415) 555-2671 or +44 20 7946 0958"), "call <PHONE> or <PHONE>");
    assert_eq!(masked("call 415-555-2671"), "call <PHONE>");
    assert_eq!(masked("date 2024-01-15 and code 123-456-7890"), "date 2024-01-15 and code 123-456-7890", "area code 1xx is not NANP");
    assert_eq!(masked("key sk_live_4eC39HqLyjWDarjtT1zdp7dc"), "key <API_KEY>");
    assert_eq!(masked("tok ghp_0123456789abcdefghijABCDEFGHIJ012345"), "tok <API_KEY>");
    assert_eq!(masked("aws AKIAIOSFODNN7EXAMPLE"), "aws <API_KEY>");
    assert_eq!(masked("hf hf_abcdefghijklmnopqrstuvwxyz0123456789"), "hf <API_KEY>");
    assert_eq!(masked("plain words only"), "plain words only");
    let spans = PiiMasker::default().find("mail a@example.org, ssn 123-45-6789");
    assert_eq!(spans.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![PiiKind::Email, PiiKind::Ssn]);
    let only_email = PiiMasker::new(&[PiiKind::Email], &[(PiiKind::Email, "[e]".into())]).unwrap();
    assert_eq!(only_email.mask("a@example.org 123-45-6789"), "[e] 123-45-6789");
}

/// Code is not an address book: slices are not IPv6 addresses, while the same short forms in
/// prose still are. AWS key ids are found whatever else the document holds. IBANs are masked
/// only when their country, length and mod-97 check hold.
#[test]
fn pii_leaves_code_alone_finds_keys_anywhere_and_checks_ibans() {
    for code in ["x = a[::2]", "y = b[1::3] + c[:, ::2]", "rev = s[::-1]", "m[::4, 1::2]", "cafe::bad::face()"] {
        assert_eq!(masked(code), code, "code text is kept");
    }
    assert_eq!(masked("loopback is ::1, link-local fe80::1 (here)"), "loopback is <IP_ADDRESS>, link-local <IP_ADDRESS> (here)");
    assert_eq!(masked("host [2001:db8:85a3::8a2e:370:7334]:443"), "host [<IP_ADDRESS>]:443");
    // A digit-free AWS key id: masked alone, and the same with digits or an @ elsewhere.
    let key = "AKIAABCDEFGHIJKLMNOP";
    assert_eq!(masked(&format!("key {key}")), "key <API_KEY>");
    assert_eq!(masked(&format!("key {key} at 10am")), "key <API_KEY> at 10am");
    assert_eq!(masked(&format!("ping a@example.org, key {key}")), "ping <EMAIL>, key <API_KEY>");
    assert_eq!(masked("ASIAZZZZZZZZZZZZZZZZ"), "<API_KEY>");
    let only_email = PiiMasker::new(&[PiiKind::Email], &[]).unwrap();
    assert_eq!(only_email.mask(&format!("key {key}")), format!("key {key}"));
    // IBANs: grouped, compact, followed by words or punctuation; wrong check digits, lengths
    // and countries are left alone.
    assert_eq!(masked("pay DE89 3704 0044 0532 0130 00 today"), "pay <IBAN> today");
    assert_eq!(masked("to GB82 WEST 1234 5698 7654 32."), "to <IBAN>.");
    assert_eq!(masked("FR14 2004 1010 0505 0001 3M02 606, NL91ABNA0417164300"), "<IBAN>, <IBAN>");
    assert_eq!(masked("BE68539007547034 WORD and NO9386011117947"), "<IBAN> WORD and <IBAN>");
    assert_eq!(masked("CH9300762011623852957"), "<IBAN>");
    for bad in ["DE89 3704 0044 0532 0130 01", "DE89 3704 0044 0532 0130", "ZZ89 3704 0044 0532 0130 00", "NL91ABNA04171643001"] {
        assert!(!masked(bad).contains("<IBAN>"), "{bad}: {}", masked(bad));
    }
    let spans = PiiMasker::default().find("iban DE89370400440532013000 ok");
    assert_eq!(spans, vec![(PiiKind::Iban, 5..27)]);
    assert_eq!(PiiKind::parse("iban").unwrap(), PiiKind::Iban);
    let only_iban = PiiMasker::new(&[PiiKind::Iban], &[(PiiKind::Iban, "[acct]".into())]).unwrap();
    assert_eq!(only_iban.mask("a@example.org DE89 3704 0044 0532 0130 00"), "a@example.org [acct]");
}

#[test]
fn pipeline_fuses_stages_and_reuses_untouched_rows() {
    let docs = vec![
        Some("  Contact ada@example.org\r\n".to_string()),
        None,
        Some("clean and long enough to live in a buffer".to_string()),
        Some(GOOD_DOC.to_string()),
        Some(format!("  {GOOD_DOC} mail me at bob@example.com  ")),
    ];
    let t = tensor(&docs);
    let pipe = TextPipeline::new(vec![Stage::Clean(Cleaner::default()), Stage::Pii(PiiMasker::default())]);
    let out = pipe.run(&t).unwrap();
    assert_eq!(out.text.value(0), Some("Contact <EMAIL>"));
    assert_eq!(out.text.value(1), None);
    assert_eq!(out.text.value(2), docs[2].as_deref());
    assert_eq!(out.text.as_arrow().views()[2], t.as_arrow().views()[2], "an untouched row keeps its view");
    assert_eq!(out.text.value(4), Some(format!("{GOOD_DOC} mail me at <EMAIL>").as_str()));
    assert_eq!((0..5).map(|i| out.keep.value(i)).collect::<Vec<_>>(), vec![true, false, true, true, true]);
    // A quality filter in the middle drops rows; later stages do not run on them.
    let pipe = TextPipeline::new(vec![Stage::Clean(Cleaner::default()), Stage::Quality(QualityFilter::default()), Stage::Pii(PiiMasker::default())]);
    let out = pipe.run(&t).unwrap();
    assert_eq!((0..5).map(|i| out.keep.value(i)).collect::<Vec<_>>(), vec![false, false, false, true, true]);
    assert_eq!(out.text.value(0), Some("Contact ada@example.org"), "dropped after cleaning, before masking");
    let kept = out.kept().unwrap();
    assert_eq!(kept.len(), 2);
    assert_eq!(kept.value(1), Some(format!("{GOOD_DOC} mail me at <EMAIL>").as_str()));
    // Fused equals stage by stage, over many rows (parallel tasks).
    let many: Vec<Option<String>> = (0..20_000).map(|i| Some(format!("  row {i}\r\n mail u{i}@example.org {}", if i % 2 == 0 { GOOD_DOC } else { "" }))).collect();
    let mt = tensor(&many);
    let fused = pipe.run(&mt).unwrap();
    let mut cur = mt.clone();
    let mut keep = vec![true; many.len()];
    for stage in pipe.stages() {
        let o = TextPipeline::new(vec![stage.clone()]).run(&cur).unwrap();
        for (i, k) in keep.iter_mut().enumerate() {
            if *k && !o.keep.value(i) {
                *k = false;
            }
        }
        // Rows dropped earlier keep the text they had.
        let next: Vec<Option<String>> = (0..many.len()).map(|i| if keep[i] || !o.keep.value(i) { o.text.value(i) } else { cur.value(i) }.map(str::to_string)).collect();
        cur = tensor(&next);
    }
    for (i, &k) in keep.iter().enumerate() {
        assert_eq!(fused.keep.value(i), k, "row {i}");
        if k {
            assert_eq!(fused.text.value(i), cur.value(i), "row {i}");
        }
    }
}

#[test]
fn sql_text_functions_on_a_utf8_store() {
    // A utf8 store read back through SQL, cleaned and masked by the scalar functions.
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let path = dir.path().join("docs");
    let texts = ["  hello\r\nworld ", "mail ada@example.org"];
    let arr: ArrayRef = Arc::new(StringArray::from(texts.to_vec()));
    let batch = arrow_array::RecordBatch::try_from_iter([("text", arr)]).unwrap();
    let mut w = zrecord::arrow::DatasetWriter::for_schema(&path, &batch.schema(), WriterOptions::default()).unwrap();
    w.append(&batch).unwrap();
    w.finish().unwrap();
    let ctx = zrecord::query::zrecord_context();
    let sql = format!("SELECT pii_mask(text_clean(text)) AS t FROM '{}' ORDER BY _id", path.display());
    let batches = rt.block_on(async { ctx.sql(&sql).await.unwrap().collect().await.unwrap() });
    let col = batches[0].column(0);
    let (t, _) = StringTensor::from_arrow(col.as_ref()).unwrap();
    assert_eq!(t.value(0), Some("hello\nworld"));
    assert_eq!(t.value(1), Some("mail <EMAIL>"));
    let _ = col.as_string_view();
}

const WORD_LEVEL: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
 "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
 "model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":2,"foo":3,"!":4},"unk_token":"[UNK]"}}"#;

#[test]
fn tokenizer_encodes_ragged_and_padded() {
    use zrecord::text::Tokenizer;
    let tk = Tokenizer::from_json(WORD_LEVEL).unwrap();
    assert_eq!(tk.vocab_size(), 5);
    let texts = StringTensor::from_opt_strs([Some("hello world!"), None, Some("foo bar hello"), Some("")]);
    let alloc = Allocator::default();
    let b = tk.encode(&texts, &alloc).unwrap();
    assert_eq!(b.cu_seqlens_slice(), &[0, 3, 3, 6, 6]);
    assert_eq!(b.values().as_slice::<i32>().unwrap(), &[1, 2, 4, 3, 0, 1]);
    let (ids, mask) = tk.encode_padded(&texts, None, -1, &alloc).unwrap();
    assert_eq!(ids.shape(), &[4, 3]);
    assert_eq!(ids.as_slice::<i32>().unwrap(), &[1, 2, 4, -1, -1, -1, 3, 0, 1, -1, -1, -1]);
    assert_eq!(mask.as_bytes(), &[1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0]);
    let (ids, _) = tk.encode_padded(&texts, Some(2), 0, &alloc).unwrap();
    assert_eq!(ids.as_slice::<i32>().unwrap(), &[1, 2, 0, 0, 3, 0, 0, 0]);
    assert!(Tokenizer::from_json("{}").is_err());
    let e = Tokenizer::from_file("/nonexistent/tokenizer.json").unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
}

#[test]
fn near_dedup_drops_near_copies_only() {
    use zrecord::text::{MinHashParams, NearDedup};
    let base: Vec<String> = (0..40u64).map(|d| (0..60u64).map(|w| format!("w{}", zrecord::text::splitmix64(d, w) % 5000)).collect::<Vec<_>>().join(" ")).collect();
    let mut texts: Vec<String> = Vec::new();
    let mut want = Vec::new();
    for (i, b) in base.iter().enumerate() {
        texts.push(b.clone());
        want.push(true);
        if i % 2 == 0 {
            texts.push(b.replacen("w", "x", 1));
            want.push(false);
        }
    }
    let mut nd = NearDedup::new(MinHashParams { threshold: 0.7, ..MinHashParams::default() }).unwrap();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    assert_eq!(nd.insert(&refs), want);
    assert_eq!(nd.len(), base.len());
    // Checked in order: the same texts again are all near duplicates now.
    assert!(nd.insert(&refs).iter().all(|k| !k));
    assert!(NearDedup::new(MinHashParams { threshold: 0.0, ..MinHashParams::default() }).is_err());
    assert!(NearDedup::new(MinHashParams { num_perm: 0, ..MinHashParams::default() }).is_err());
    assert!(NearDedup::new(MinHashParams { bands: Some(129), ..MinHashParams::default() }).is_err());
}

#[test]
fn exact_dedup_log_survives_reopen_and_cuts_uncommitted_tail() {
    use zrecord::text::ExactDedup;
    let dir = tempfile::tempdir().unwrap();
    let mut d = ExactDedup::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(d.insert(&[1, 2, 1, 3]).unwrap(), vec![true, true, false, true]);
    assert_eq!(d.commit_upto(2).unwrap(), 2);
    assert!(d.commit_upto(1).is_err());
    assert_eq!(d.insert(&[4]).unwrap(), vec![true]);
    drop(d);
    let mut d = ExactDedup::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(d.committed(), 2);
    assert_eq!(d.insert(&[1, 2, 3, 4]).unwrap(), vec![false, false, true, true]);
    // Spilling: a tiny memory bound moves hashes to sorted runs; answers stay exact.
    let mut s = ExactDedup::open(dir.path().join("spill"), 100).unwrap();
    let hs: Vec<u64> = (0..2000).map(|i| i * 7).collect();
    assert!(s.insert(&hs).unwrap().iter().all(|&k| k));
    assert!(s.insert(&hs).unwrap().iter().all(|&k| !k));
    let mut m = ExactDedup::in_memory(100);
    assert!(matches!(m.insert(&hs), Err(Error::MemoryLimit { .. })));
}

#[test]
fn view_filters_match_mask_filters() {
    let v = corpus();
    let t = tensor(&v);
    for prefix in ["", "p", "pre", "pref", "prefix-long", "préfix", "zzz"] {
        let want: Vec<&str> = v.iter().flatten().filter(|s| s.starts_with(prefix)).map(String::as_str).collect();
        let got = t.filter_by_prefix(prefix).unwrap();
        assert_eq!((0..got.len()).map(|i| got.value(i).unwrap()).collect::<Vec<_>>(), want, "{prefix:?}");
    }
    for (lo, hi) in [(0, 0), (1, 5), (6, 12), (13, 80)] {
        for unit in [LengthUnit::Chars, LengthUnit::Bytes] {
            let want: Vec<&str> = v.iter().flatten().filter(|s| (lo..=hi).contains(&if unit == LengthUnit::Chars { s.chars().count() } else { s.len() })).map(String::as_str).collect();
            let got = t.filter_length(lo, hi, unit).unwrap();
            assert_eq!(got.null_count(), 0);
            assert_eq!((0..got.len()).map(|i| got.value(i).unwrap()).collect::<Vec<_>>(), want, "{lo}..={hi} {unit:?}");
        }
    }
}

#[test]
fn large_tensors_split_masks_over_the_pool_with_the_same_answers() {
    // Past 2^16 rows the view predicates run in parallel chunks: row count not a multiple of
    // 64, nulls, inline and out-of-line rows.
    let n = 600_001usize;
    let v: Vec<Option<String>> = (0..n)
        .map(|i| match i % 5 {
            0 => None,
            1 => Some(format!("pre{}", i % 97)),
            2 => Some(format!("prefix-long-{i}-ü")),
            3 => Some("x".repeat(i % 30)),
            _ => Some(format!("{i}")),
        })
        .collect();
    let t = tensor(&v);
    // Prefixes past the view's 4 bytes: compared inside the view for short rows (up to 12
    // bytes), in the buffer for long ones, both on the pool.
    for prefix in ["pre", "pre1", "pre12", "prefix-l", "xxxxxxxxx", "xxxxxxxxxxxx", "xxxxxxxxxxxxx", "prefix-long-1", "x"] {
        let m = t.starts_with(prefix);
        let f = t.filter_by_prefix(prefix).unwrap();
        let mut k = 0;
        for (i, s) in v.iter().enumerate() {
            assert_eq!(m.is_valid(i).then(|| m.value(i)), s.as_deref().map(|s| s.starts_with(prefix)), "{prefix:?} row {i}");
            if let Some(s) = s.as_deref().filter(|s| s.starts_with(prefix)) {
                assert_eq!(f.value(k), Some(s));
                k += 1;
            }
        }
        assert_eq!(f.len(), k);
    }
    let m = t.length_between(5, 14, LengthUnit::Chars);
    for (i, s) in v.iter().enumerate() {
        assert_eq!(m.is_valid(i).then(|| m.value(i)), s.as_deref().map(|s| (5..=14).contains(&s.chars().count())), "row {i}");
    }
    // A mask with nulls: null entries drop the row like false ones; null rows it keeps stay null.
    let mask = arrow_array::BooleanArray::from((0..n).map(|i| (i % 3 != 0).then_some(i % 2 == 0)).collect::<Vec<_>>());
    let f = t.filter(&mask).unwrap();
    let want: Vec<Option<&str>> = v.iter().enumerate().filter(|(i, _)| i % 3 != 0 && i % 2 == 0).map(|(_, s)| s.as_deref()).collect();
    assert_eq!(f.null_count(), want.iter().filter(|s| s.is_none()).count());
    assert!(f.null_count() > 0);
    assert_eq!((0..f.len()).map(|i| f.value(i)).collect::<Vec<_>>(), want);
}

#[test]
fn dense_selections_without_nulls_keep_every_matching_row_in_order() {
    // No nulls and most rows kept: the branchless copy path of the filter, and long rows
    // whose prefix past 4 bytes is compared in the buffer with the next word prefetched;
    // sizes below and above the parallel threshold, not multiples of 64.
    for n in [1usize, 63, 64, 65, 1000, 70_001] {
        let v: Vec<Option<String>> = (0..n)
            .map(|i| Some(match i % 10 {
                0 => format!("other-{i}"),
                1 => format!("prefix-long-{}", "y".repeat(i % 13)),
                2 => format!("prefix-lonG-{i}-{}", "z".repeat(20)),
                _ => format!("prefix-long-{i}-{}", "x".repeat(i % 50)),
            }))
            .collect();
        let t = tensor(&v);
        assert_eq!(t.null_count(), 0);
        for prefix in ["prefix-long", "prefix-long-1", "prefix", "p", "other-"] {
            let want: Vec<&str> = v.iter().flatten().filter(|s| s.starts_with(prefix)).map(String::as_str).collect();
            let got = t.filter_by_prefix(prefix).unwrap();
            assert_eq!(got.null_count(), 0);
            assert_eq!((0..got.len()).map(|i| got.value(i).unwrap()).collect::<Vec<_>>(), want, "n={n} {prefix:?}");
        }
        let mask = arrow_array::BooleanArray::from((0..n).map(|i| i % 7 != 3).collect::<Vec<_>>());
        let f = t.filter(&mask).unwrap();
        let want: Vec<&str> = v.iter().enumerate().filter(|(i, _)| i % 7 != 3).map(|(_, s)| s.as_deref().unwrap()).collect();
        assert_eq!((0..f.len()).map(|i| f.value(i).unwrap()).collect::<Vec<_>>(), want, "n={n} mask");
    }
}

#[test]
fn near_dedup_persists_committed_signatures_and_cuts_the_rest() {
    use zrecord::text::{MinHashParams, NearDedup};
    let docs: Vec<String> = (0..30u64).map(|d| (0..50u64).map(|w| format!("w{}", zrecord::text::splitmix64(d, w) % 5000)).collect::<Vec<_>>().join(" ")).collect();
    let near: Vec<String> = docs.iter().map(|d| d.replacen("w", "x", 1)).collect();
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let params = MinHashParams { threshold: 0.7, ..MinHashParams::default() };
    let dir = tempfile::tempdir().unwrap();
    let mut d = NearDedup::open(dir.path(), params.clone()).unwrap();
    assert!(d.insert(&refs(&docs[..20])).iter().all(|&k| k));
    assert_eq!(d.commit_upto(12).unwrap(), 12);
    assert!(d.commit_upto(11).is_err());
    assert!(d.commit_upto(21).is_err());
    drop(d); // 8 kept signatures never committed
    let mut d = NearDedup::open(dir.path(), params.clone()).unwrap();
    assert_eq!((d.len(), d.committed()), (12, 12));
    // Near copies of the 12 committed documents are dropped, of the 8 uncommitted ones kept.
    let got = d.insert(&refs(&near[..20]));
    assert_eq!(got, (0..20).map(|i| i >= 12).collect::<Vec<_>>());
    assert_eq!(d.commit().unwrap(), 20);
    // Opened at a checkpoint's count: the log is cut back to it.
    let mut d = NearDedup::open_at(dir.path(), params.clone(), 12).unwrap();
    assert_eq!(d.len(), 12);
    assert_eq!(d.insert(&refs(&near[12..13])), vec![true]);
    // A checkpoint naming more than the log holds, or other parameters: refused.
    let e = NearDedup::open_at(dir.path(), params.clone(), 99).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    let e = NearDedup::open(dir.path(), MinHashParams { num_perm: 64, ..params.clone() }).unwrap_err();
    assert!(e.to_string().contains("num_perm=128"), "{e}");
}

/// Each stage alone, run only on the rows every earlier stage kept (the definition the fused
/// pipeline must match): the kept mask and the kept rows' texts.
fn stage_by_stage(stages: &[Stage], rows: &[Option<String>]) -> (Vec<bool>, Vec<Option<String>>) {
    let mut cur = rows.to_vec();
    let mut keep: Vec<bool> = rows.iter().map(Option::is_some).collect();
    for st in stages {
        let idx: Vec<usize> = (0..rows.len()).filter(|&i| keep[i]).collect();
        let sub = StringTensor::from_opt_strs(idx.iter().map(|&i| cur[i].as_deref()));
        let o = TextPipeline::new(vec![st.clone()]).run(&sub).unwrap();
        for (k, &i) in idx.iter().enumerate() {
            cur[i] = o.text.value(k).map(str::to_string);
            keep[i] &= o.keep.value(k);
        }
    }
    (keep, cur)
}

#[test]
fn fused_dedup_stages_decide_in_row_order_like_separate_stages() {
    use std::sync::{Arc, Mutex};
    use zrecord::text::{ExactDedup, MinHashParams, NearDedup};
    let rows: Vec<Option<String>> = (0..30_000usize)
        .map(|i| match i % 11 {
            0 => None,
            _ => Some(format!("  doc {} mail u{}@example.org {}\r\n", i % 4000, i % 4000, if i % 3 == 0 { GOOD_DOC } else { "short" })),
        })
        .collect();
    let stages = || {
        vec![
            Stage::Clean(Cleaner::default()),
            Stage::Dedup(Arc::new(Mutex::new(ExactDedup::in_memory(1 << 30)))),
            Stage::Quality(QualityFilter::new(QualityRules::preset("none").unwrap())),
            Stage::Pii(PiiMasker::default()),
            Stage::NearDedup(Arc::new(Mutex::new(NearDedup::new(MinHashParams { threshold: 0.9, num_perm: 32, ..MinHashParams::default() }).unwrap()))),
        ]
    };
    let fused = TextPipeline::new(stages()).run(&tensor(&rows)).unwrap();
    let (keep, text) = stage_by_stage(&stages(), &rows);
    let kept = keep.iter().filter(|&&k| k).count();
    let distinct = rows.iter().flatten().collect::<std::collections::HashSet<_>>().len();
    assert!(distinct < rows.len() - rows.len() / 11, "exact duplicates in the input");
    assert!(kept > 100 && kept < distinct, "{kept} kept of {distinct} distinct: near dedup must drop rows too");
    for i in 0..rows.len() {
        assert_eq!(fused.keep.value(i), keep[i], "row {i}");
        // Every row's text, dropped or kept, is where the separate stages left it: a row the
        // exact dedup dropped was never masked (the pass stops there for it).
        assert_eq!(fused.text.value(i), text[i].as_deref(), "row {i}");
    }
    let masked = |i: usize| !fused.text.value(i).unwrap().contains("@example.org");
    assert!((0..rows.len()).filter(|&i| keep[i]).all(masked), "kept rows are masked");
    let mut seen = std::collections::HashSet::new();
    let clean = Cleaner::default();
    let dup_dropped: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].as_deref().is_some_and(|r| !seen.insert(clean.clean(r)))).collect();
    assert!(dup_dropped.len() > 10_000, "{} exact duplicates", dup_dropped.len());
    assert!(dup_dropped.iter().all(|&i| !fused.keep.value(i) && !masked(i)), "a row the dedup dropped is not masked");
    // The same state listed twice is locked once and consulted at both places, row by row
    // (as `run_one` does): " a " is new at the first check and "a" at the second; "a" is then
    // seen at the first check; "b", " b " and "c" each pass the first check and are seen at
    // the second (their cleaned text was just recorded).
    let shared = Arc::new(Mutex::new(ExactDedup::in_memory(1 << 20)));
    let twice = TextPipeline::new(vec![Stage::Dedup(shared.clone()), Stage::Clean(Cleaner::default()), Stage::Dedup(shared)]);
    let small: Vec<Option<String>> = vec![Some(" a ".into()), Some("a".into()), Some("b".into()), Some(" b ".into()), Some("c".into())];
    let fused = twice.run(&tensor(&small)).unwrap();
    assert_eq!((0..5).map(|i| fused.keep.value(i)).collect::<Vec<_>>(), vec![true, false, false, false, false]);
    let shared = Arc::new(Mutex::new(ExactDedup::in_memory(1 << 20)));
    let one_by_one = TextPipeline::new(vec![Stage::Dedup(shared.clone()), Stage::Clean(Cleaner::default()), Stage::Dedup(shared)]);
    let (mut a, mut b) = (String::new(), String::new());
    let kept: Vec<bool> = small.iter().map(|s| one_by_one.run_one(s.as_deref().unwrap(), &mut a, &mut b).unwrap().1).collect();
    assert_eq!(kept, vec![true, false, false, false, false]);
}
