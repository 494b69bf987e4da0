//! Arbitrary `DoGet` tickets against a rank serving a dense and a ragged store: every ticket is
//! answered with rows that exist (exactly the bytes of the ids it names) or a status, never a
//! panic, a huge allocation or a rank that stops serving.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use zrecord::prelude::*;

const ROWS: u64 = 40;
const ROW: usize = 12;

struct Served {
    _dir: tempfile::TempDir,
    dense: Arc<dyn RecordSource>,
    ragged: Arc<dyn RecordSource>,
}

fn served() -> &'static Served {
    static S: OnceLock<Served> = OnceLock::new();
    S.get_or_init(|| {
        let dir = zrecord_fuzz::scratch();
        let d = dir.path().join("dense.zrec");
        let mut w = DenseWriter::create(&d, DType::UInt8, &[ROW], WriterOptions::default()).unwrap();
        w.append_slice(&(0..ROWS as usize * ROW).map(|i| i as u8).collect::<Vec<u8>>()).unwrap();
        w.finish().unwrap();
        let r = dir.path().join("ragged.zrec");
        let mut w = RaggedWriter::create(&r, DType::UInt8, 1, WriterOptions::with_codec(Codec::Zstd)).unwrap();
        let lens: Vec<u64> = (0..ROWS).map(|i| i % 7 + 1).collect();
        let cu: Vec<i32> = std::iter::once(0).chain(lens.iter().scan(0i32, |a, &l| { *a += l as i32; Some(*a) })).collect();
        let values: Vec<u8> = (0..*cu.last().unwrap()).map(|i| i as u8).collect();
        w.append(&RaggedInput::from_slices(&values, &cu, &lens, 1)).unwrap();
        w.finish().unwrap();
        let dense = Store::open(&d).unwrap().source();
        let ragged = Store::open(&r).unwrap().source();
        Served { _dir: dir, dense, ragged }
    })
}

fuzz_target!(|ticket: &[u8]| {
    let s = served();
    // The ids a well-formed ticket names (u32 name length, name, u64 ids): in range, the reply
    // carries exactly their rows; any id out of range, a status.
    let ids: Option<Vec<u64>> = ticket.get(..4).and_then(|n| {
        let n = u32::from_le_bytes(n.try_into().ok()?) as usize;
        let rest = ticket.get(4usize.checked_add(n)?..)?;
        rest.len().is_multiple_of(8).then(|| rest.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
    });
    for (name, source) in [("dense", &s.dense), ("ragged", &s.ragged)] {
        let got = zrecord::dist::answer_ticket(name, source.clone(), ticket);
        let named = ticket.get(4..).is_some_and(|t| t.starts_with(name.as_bytes())) && ticket.get(..4) == Some(&(name.len() as u32).to_le_bytes()[..]);
        match (&got, &ids) {
            (Ok((_, bytes)), Some(ids)) if named && name == "dense" => {
                assert!(ids.iter().all(|&i| i < ROWS), "ids out of range answered: {ids:?}");
                assert_eq!(*bytes, ids.len() * ROW, "dense reply bytes");
            }
            (Ok(_), Some(ids)) if named => assert!(ids.iter().all(|&i| i < ROWS), "ids out of range answered: {ids:?}"),
            (Ok(_), _) => panic!("a ticket not naming '{name}' was answered: {ticket:?}"),
            (Err(_), Some(ids)) if named && ids.iter().all(|&i| i < ROWS) => panic!("a valid ticket was refused: {got:?}"),
            (Err(_), _) => {}
        }
    }
    // The rank keeps serving: a valid ticket after any hostile one is answered.
    let ok = zrecord::dist::answer_ticket("dense", s.dense.clone(), &[5, 0, 0, 0, b'd', b'e', b'n', b's', b'e', 3, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(ok, Ok((2, ROW)));
});
