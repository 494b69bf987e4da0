//! Property tests: random shapes, lengths, batch splits, shard counts and codecs round trip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use proptest::prelude::*;
use zrecord::prelude::*;

fn codec() -> impl Strategy<Value = Codec> {
    prop_oneof![Just(Codec::Raw), Just(Codec::Zstd)]
}

fn dtype() -> impl Strategy<Value = DType> {
    (0..DType::ALL.len()).prop_map(|i| DType::ALL[i])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn dense_round_trip(
        dtype in dtype(),
        item in prop::collection::vec(1usize..5, 0..4),
        n in 0usize..60,
        cuts in prop::collection::vec(0usize..60, 0..4),
        shards in 1usize..7,
        codec in codec(),
        seed in any::<u64>(),
        ids_seed in any::<u64>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let rb = item.iter().product::<usize>() * dtype.size();
        let data = random_bytes(n * rb, seed);
        let p = dir.path().join("x");
        let mut w = DenseWriter::create(&p, dtype, &item, WriterOptions::with_codec(codec).data_shards(shards)).unwrap();
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(n)).collect();
        cuts.push(0);
        cuts.push(n);
        cuts.sort();
        for win in cuts.windows(2) {
            let mut shape = vec![win[1] - win[0]];
            shape.extend_from_slice(&item);
            w.append(&TensorView::new(&data[win[0] * rb..win[1] * rb], dtype, shape)).unwrap();
        }
        w.finish().unwrap();
        let v = DenseStore::open(&p).unwrap().bind(&Allocator::default());
        prop_assert_eq!(v.len(), n as u64);
        let ids = if n == 0 { vec![] } else { random_ids(n as u64, 50, ids_seed) };
        prop_assert!(v.gather(&ids).unwrap().as_bytes() == &dense_reference(&data, rb, &ids)[..]);
        prop_assert!(v.read_all().unwrap().as_bytes() == &data[..]);
    }

    #[test]
    fn ragged_round_trip(
        dtype in dtype(),
        ndim in 1usize..4,
        n in 0usize..50,
        cuts in prop::collection::vec(0usize..50, 0..4),
        shards in 1usize..7,
        codec in codec(),
        seed in 0u64..1_000_000,
        ids_seed in any::<u64>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let fx = RaggedFixture::new(dtype, ndim, n, 7, seed);
        let p = dir.path().join("x");
        let mut w = RaggedWriter::create(&p, dtype, ndim, WriterOptions::with_codec(codec).data_shards(shards)).unwrap();
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(n)).collect();
        cuts.push(0);
        cuts.push(n);
        cuts.sort();
        for win in cuts.windows(2) {
            fx.append_to(&mut w, win[0], win[1]).unwrap();
        }
        w.finish().unwrap();
        let v = RaggedStore::open(&p).unwrap().bind(&Allocator::default());
        prop_assert_eq!(v.len(), n as u64);
        let ids = if n == 0 { vec![] } else { random_ids(n as u64, 40, ids_seed) };
        fx.check(&v.gather(&ids).unwrap(), &ids);
    }
}
