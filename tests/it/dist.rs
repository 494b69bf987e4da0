//! Distributed store: ranks as nodes in one process (each with its own Flight server on
//! loopback), values that encode their global id, both transports, ragged store shards,
//! dead and hung peers. The multi-process and cross-namespace runs are in
//! tests/python/test_dist.py.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use zrecord::dist::{DistNode, DistOptions, DistReader, ReaderSpec, ShardMeta, Transport};
use zrecord::prelude::*;
use zrecord::store::{RecordType, Store};

fn opts(transport: Transport) -> DistOptions {
    DistOptions { transport, host: Some("127.0.0.1".into()), timeout_s: 10.0, ..DistOptions::default() }
}

/// `size` nodes connected to each other.
fn group(size: usize, o: &DistOptions) -> Vec<DistNode> {
    let nodes: Vec<DistNode> = (0..size).map(|r| DistNode::start(r, size, o.clone()).unwrap()).collect();
    let eps: Vec<_> = nodes.iter().map(|n| n.endpoint().clone()).collect();
    for n in &nodes {
        n.connect(eps.clone()).unwrap();
    }
    nodes
}

/// Rank r holds `r + 2` rows of 3 int64 values; row with global id g holds [g*10, g*10+1, g*10+2].
fn add_dense(nodes: &[DistNode], name: &str) -> u64 {
    let mut metas: Vec<ShardMeta> = Vec::new();
    let mut start = 0u64;
    for (r, n) in nodes.iter().enumerate() {
        let rows = r as u64 + 2;
        let vals: Vec<i64> = (start..start + rows).flat_map(|g| (0..3).map(move |c| g as i64 * 10 + c)).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        metas.push(n.add_rows(name, rows, DType::Int64, vec![3]).unwrap());
        n.update(name, 0, &bytes).unwrap();
        start += rows;
    }
    for n in nodes {
        n.define(name, metas.clone()).unwrap();
    }
    start
}

fn want_dense(ids: &[u64]) -> Vec<i64> {
    ids.iter().flat_map(|&g| (0..3).map(move |c| g as i64 * 10 + c)).collect()
}

fn gather(reader: &DistReader, name: &str, ids: &[u64]) -> Result<Batch> {
    reader.source(name)?.gather(Ids::List(ids), &Allocator::default(), &ReadOptions::default())
}

#[test]
fn dense_rows_by_global_id_over_both_transports() {
    for t in [Transport::Flight, Transport::Auto] {
        let nodes = group(3, &opts(t));
        let total = add_dense(&nodes, "x");
        assert_eq!(total, 2 + 3 + 4);
        // Any order, repeats, every owner, from every rank.
        let ids = [8u64, 0, 4, 4, 1, 2, 7, 0, 5, 8];
        for n in &nodes {
            let b = gather(n.reader(), "x", &ids).unwrap();
            let t = b.as_dense().unwrap();
            assert_eq!(t.shape(), &[ids.len(), 3]);
            assert_eq!(t.as_slice::<i64>().unwrap(), &want_dense(&ids)[..]);
        }
        // Empty batch, and one row.
        assert_eq!(gather(nodes[0].reader(), "x", &[]).unwrap().len(), 0);
        assert_eq!(gather(nodes[2].reader(), "x", &[3]).unwrap().as_dense().unwrap().as_slice::<i64>().unwrap(), &[30, 31, 32]);
        let p = nodes[0].reader().profile("x").unwrap();
        assert_eq!(p.calls, 2);
        assert_eq!(p.rows, ids.len() as u64);
        if t == Transport::Flight {
            // Rank 0 asked ranks 1 and 2 once each (one request per owner) for the batch.
            assert_eq!(p.requests, 2, "{p:?}");
        } else {
            assert_eq!(p.requests, 0, "{p:?}");
        }
    }
}

/// Row g of the wide variables: 32768 int32 (128 KiB) holding g * 1_000_000 + column.
const WIDE: usize = 32768;

fn wide_row(g: u64) -> Vec<i32> {
    (0..WIDE as i32).map(|c| g as i32 * 1_000_000 + c).collect()
}

#[test]
fn answers_larger_than_one_flight_message_over_memory_and_store_shards() {
    // 60 rows of 128 KiB per rank: an answer of more than 32 rows is cut into several
    // FlightData messages (4 MiB each), each framed straight from the shard.
    let dir = tempfile::tempdir().unwrap();
    let nodes = group(2, &opts(Transport::Flight));
    let (mut mem, mut sto) = (Vec::new(), Vec::new());
    for (r, n) in nodes.iter().enumerate() {
        let rows: Vec<i32> = (r as u64 * 60..(r as u64 + 1) * 60).flat_map(wide_row).collect();
        mem.push(n.add_rows("mem", 60, DType::Int32, vec![WIDE]).unwrap());
        n.update("mem", 0, &rows.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        let p = dir.path().join(format!("wide{r}"));
        let mut w = DenseWriter::create(&p, DType::Int32, &[WIDE], WriterOptions::default()).unwrap();
        w.append_slice(&rows).unwrap();
        w.finish().unwrap();
        let store = Store::open(&p).unwrap();
        sto.push(n.add_source("sto", store.source(), None).unwrap());
    }
    for n in &nodes {
        n.define("mem", mem.clone()).unwrap();
        n.define("sto", sto.clone()).unwrap();
    }
    // 90 ids of rank 1 in a scrambled order with repeats, and a few of rank 0.
    let ids: Vec<u64> = (0..90u64).map(|k| 60 + (k * 37) % 60).chain([0, 59, 119, 60]).collect();
    for name in ["mem", "sto"] {
        let b = gather(nodes[0].reader(), name, &ids).unwrap();
        let t = b.as_dense().unwrap();
        assert_eq!(t.shape(), &[ids.len(), WIDE]);
        let v = t.as_slice::<i32>().unwrap();
        for (k, &g) in ids.iter().enumerate() {
            assert!(v[k * WIDE..(k + 1) * WIDE] == wide_row(g)[..], "{name}: row {k} is not global row {g}");
        }
        // 11 MiB from rank 1: one request per connection (two), both in flight together.
        assert_eq!(nodes[0].reader().profile(name).unwrap().requests, 2, "{name}: one request per connection to rank 1");
    }
}

/// The shards are served in Flight's wire format: a plain arrow-flight client reads them
/// (`DoGet` with a ticket of name length u32 LE, name, ids u64 LE); other methods answer
/// UNIMPLEMENTED; a bad ticket or an unknown name is an error, not a hang.
#[test]
fn any_flight_client_reads_a_shard() {
    use arrow_array::cast::AsArray;
    use arrow_array::Array;
    use futures::TryStreamExt;
    let nodes = group(2, &opts(Transport::Flight));
    add_dense(&nodes, "x");
    let addr = format!("http://{}", nodes[1].endpoint().addr);
    let ticket = |name: &str, ids: &[u64]| {
        let mut t = (name.len() as u32).to_le_bytes().to_vec();
        t.extend_from_slice(name.as_bytes());
        ids.iter().for_each(|i| t.extend_from_slice(&i.to_le_bytes()));
        arrow_flight::Ticket { ticket: t.into() }
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(addr).unwrap().connect().await.unwrap();
        let mut client = arrow_flight::flight_service_client::FlightServiceClient::new(ch);
        // Local rows 2, 0, 2 of rank 1 are global rows 4, 2, 4.
        let stream = client.do_get(ticket("x", &[2, 0, 2])).await.unwrap().into_inner();
        let batches: Vec<_> = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(stream.map_err(arrow_flight::error::FlightError::from))
            .try_collect()
            .await
            .unwrap();
        let rows: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let a = b.column(0).as_fixed_size_binary();
                (0..a.len()).flat_map(|k| a.value(k).chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>()).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(rows, want_dense(&[4, 2, 4]));
        let e = client.list_flights(arrow_flight::Criteria::default()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unimplemented);
        let e = client.do_get(ticket("nope", &[0])).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
        let e = client.do_get(ticket("x", &[3])).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
        let e = client.do_get(arrow_flight::Ticket { ticket: vec![9, 0, 0, 0, b'x'].into() }).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    });
}

#[test]
fn big_batches_split_into_requests_within_the_size_limit() {
    let o = DistOptions { max_request_bytes: 5 * 24, ..opts(Transport::Flight) };
    let nodes = group(2, &o);
    add_dense(&nodes, "x");
    let ids: Vec<u64> = (0..200).map(|k| [2u64, 3, 4][k % 3]).collect();
    let b = gather(nodes[0].reader(), "x", &ids).unwrap();
    assert_eq!(b.as_dense().unwrap().as_slice::<i64>().unwrap(), &want_dense(&ids)[..]);
    assert_eq!(nodes[0].reader().profile("x").unwrap().requests, 40);
}

#[test]
fn updates_are_seen_by_every_reader() {
    for t in [Transport::Flight, Transport::Auto] {
        let nodes = group(2, &opts(t));
        add_dense(&nodes, "x");
        nodes[1].update("x", 1, &[0xffu8; 24]).unwrap();
        let b = gather(nodes[0].reader(), "x", &[3, 2]).unwrap();
        assert_eq!(b.as_dense().unwrap().as_slice::<i64>().unwrap(), &[-1, -1, -1, 20, 21, 22]);
        // A reader never writes another rank's shard.
        assert!(matches!(nodes[0].update("y", 0, &[0; 24]), Err(Error::InvalidArgument { .. })));
    }
}

/// Rank r's ragged store: `r + 3` records, record g (global) of length g % 4 + 1 filled with g.
fn ragged_stores(dir: &std::path::Path, size: usize) -> Vec<Store> {
    let mut g = 0i32;
    (0..size)
        .map(|r| {
            let p = dir.join(format!("rank{r}"));
            let mut w = RaggedWriter::create(&p, DType::Int32, 1, WriterOptions::with_codec(Codec::Zstd)).unwrap();
            let recs: Vec<(Vec<i32>, [usize; 1])> = (0..r + 3)
                .map(|_| {
                    let n = (g % 4 + 1) as usize;
                    g += 1;
                    (vec![g - 1; n], [n])
                })
                .collect();
            let packed = PackedRagged::from_records(1, recs.iter().map(|(v, s)| (&v[..], &s[..]))).unwrap();
            w.append(&packed.as_input()).unwrap();
            w.finish().unwrap();
            Store::open(&p).unwrap()
        })
        .collect()
}

#[test]
fn ragged_store_shards_come_back_packed() {
    let dir = tempfile::tempdir().unwrap();
    let stores = ragged_stores(dir.path(), 3);
    for t in [Transport::Flight, Transport::Auto] {
        let nodes = group(3, &opts(t));
        let metas: Vec<_> = nodes.iter().zip(&stores).map(|(n, s)| n.add_source("tok", s.source(), Some(s.path().to_string_lossy().into_owned())).unwrap()).collect();
        for n in &nodes {
            n.define("tok", metas.clone()).unwrap();
        }
        let ids = [11u64, 0, 5, 5, 3, 9, 1];
        let b = gather(nodes[1].reader(), "tok", &ids).unwrap();
        let rb = b.as_ragged().unwrap();
        assert_eq!(rb.len(), ids.len());
        for (k, &g) in ids.iter().enumerate() {
            let rec = rb.record(k).unwrap();
            assert_eq!(rec.as_slice::<i32>().unwrap(), &vec![g as i32; (g % 4 + 1) as usize][..], "row {k} (id {g}) over {t:?}");
        }
    }
}

#[test]
fn bad_ids_names_and_shapes_are_typed_errors() {
    let nodes = group(2, &opts(Transport::Flight));
    let total = add_dense(&nodes, "x");
    assert!(matches!(gather(nodes[0].reader(), "x", &[0, total]), Err(Error::IndexOutOfRange { .. })));
    assert_eq!(nodes[0].reader().profile("x").unwrap().requests, 0, "nothing is sent for a bad id");
    assert!(matches!(nodes[0].reader().source("nope"), Err(Error::InvalidArgument { .. })));
    // Shards that disagree on dtype or row shape cannot form a variable.
    let a = nodes[0].add_rows("y", 2, DType::Int64, vec![3]).unwrap();
    let b = nodes[1].add_rows("y", 2, DType::Float64, vec![3]).unwrap();
    assert!(matches!(nodes[0].define("y", vec![a.clone(), b]), Err(Error::ShapeMismatch { .. })));
    let c = nodes[1].add_rows("z", 2, DType::Int64, vec![4]).unwrap();
    assert!(matches!(nodes[0].define("y", vec![a.clone(), c]), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(nodes[0].define("y", vec![a.clone()]), Err(Error::InvalidArgument { .. })));
    // Names are unique per rank.
    assert!(matches!(nodes[0].add_rows("y", 1, DType::Int64, vec![3]), Err(Error::InvalidArgument { .. })));
    assert!(matches!(nodes[0].add_rows("a/b", 1, DType::Int64, vec![3]), Err(Error::InvalidArgument { .. })));
    // Absurd settings.
    assert!(DistNode::start(2, 2, opts(Transport::Auto)).is_err());
    assert!(DistNode::start(0, 1, DistOptions { timeout_s: -1.0, ..opts(Transport::Auto) }).is_err());
    assert!(DistNode::start(0, 1, DistOptions { timeout_s: f64::NAN, ..opts(Transport::Auto) }).is_err());
}

#[test]
fn a_stopped_rank_is_an_error_naming_it() {
    let nodes = group(3, &opts(Transport::Flight));
    add_dense(&nodes, "x");
    nodes[2].free();
    let t0 = Instant::now();
    let e = gather(nodes[0].reader(), "x", &[0, 6]).unwrap_err();
    assert!(matches!(e, Error::Peer { rank: 2, .. }), "{e}");
    assert!(e.to_string().contains("'x'"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    // Rows of live ranks still come.
    assert_eq!(gather(nodes[0].reader(), "x", &[2]).unwrap().len(), 1);
}

#[test]
fn a_rank_that_never_answers_times_out() {
    // Rank 1's endpoint points at a socket that accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let o = DistOptions { timeout_s: 0.5, ..opts(Transport::Flight) };
    let n0 = DistNode::start(0, 2, o).unwrap();
    let mut ep1 = n0.endpoint().clone();
    ep1.rank = 1;
    ep1.addr = addr.to_string();
    ep1.host = "elsewhere".into();
    n0.connect(vec![n0.endpoint().clone(), ep1]).unwrap();
    let m0 = n0.add_rows("x", 1, DType::UInt8, vec![1]).unwrap();
    let m1 = ShardMeta { rank: 1, ..m0.clone() };
    n0.define("x", vec![m0, m1]).unwrap();
    let t0 = Instant::now();
    let e = gather(n0.reader(), "x", &[1]).unwrap_err();
    assert!(matches!(e, Error::Peer { rank: 1, timed_out: true, .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    drop(silent);
}

#[test]
fn shard_descriptions_carry_one_record_type_and_disagreements_are_refused() {
    let n0 = DistNode::start(0, 2, opts(Transport::Flight)).unwrap();
    let mut ep1 = n0.endpoint().clone();
    ep1.rank = 1;
    n0.connect(vec![n0.endpoint().clone(), ep1]).unwrap();
    let m0 = n0.add_rows("x", 3, DType::Float32, vec![2, 2]).unwrap();
    // The wire form names the record type once (dtype by name, tagged layout, logical).
    let json: serde_json::Value = serde_json::to_value(&m0).unwrap();
    assert_eq!(json["dtype"], "float32");
    assert_eq!(json["layout"], serde_json::json!({"kind": "dense", "item_shape": [2, 2]}));
    assert_eq!(json["logical"], "tensor");
    let back: ShardMeta = serde_json::from_value(json).unwrap();
    assert_eq!(back, m0);
    assert_eq!(back.record_type, RecordType::dense(DType::Float32, vec![2, 2]));
    // Rank 1 announcing another dtype, shape or layout kind: a shape mismatch naming both.
    for other in [RecordType::dense(DType::Float64, vec![2, 2]), RecordType::dense(DType::Float32, vec![4]), RecordType::ragged(DType::Float32, 2)] {
        let m1 = ShardMeta { rank: 1, record_type: other.clone(), fd: None, ..m0.clone() };
        let e = n0.define("x", vec![m0.clone(), m1]).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        assert!(e.to_string().contains(&other.to_string()), "{e}");
    }
    // Ragged records of zero dimensions are no record type at all.
    let mut bad = serde_json::to_value(&m0).unwrap();
    bad["layout"] = serde_json::json!({"kind": "ragged", "ndim": 0});
    let bad: ShardMeta = serde_json::from_value(bad).unwrap();
    let e = n0.define("x", vec![bad.clone(), ShardMeta { rank: 1, ..bad }]).unwrap_err();
    assert!(e.to_string().contains("0 dimensions"), "{e}");
    // An unknown dtype name does not parse.
    let mut unknown = serde_json::to_value(&m0).unwrap();
    unknown["dtype"] = serde_json::json!("float99");
    assert!(serde_json::from_value::<ShardMeta>(unknown).is_err());
}

#[test]
fn independent_readers_and_extra_members() {
    let dir = tempfile::tempdir().unwrap();
    let o = DistOptions { rendezvous: Some((dir.path().to_path_buf(), "g".into())), ..opts(Transport::Flight) };
    let nodes = group(2, &o);
    add_dense(&nodes, "x");
    // A reader built from the spec (what fork_reader sends to a worker).
    let spec: ReaderSpec = serde_json::from_str(&serde_json::to_string(&nodes[0].reader().spec().unwrap()).unwrap()).unwrap();
    let r = DistReader::from_spec(&spec).unwrap();
    assert_eq!(gather(&r, "x", &[4, 0]).unwrap().as_dense().unwrap().as_slice::<i64>().unwrap(), &want_dense(&[4, 0])[..]);
    // An extra member finds the group and its variable through the rendezvous folder.
    let extra = DistReader::join_group(dir.path(), "g", 2, opts(Transport::Auto)).unwrap();
    extra.join("x").unwrap();
    assert_eq!(extra.rows("x").unwrap(), (5, vec![2, 3]));
    assert_eq!(gather(&extra, "x", &[1, 3]).unwrap().as_dense().unwrap().as_slice::<i64>().unwrap(), &want_dense(&[1, 3])[..]);
    let e = DistReader::join_group(dir.path(), "none", 2, DistOptions { timeout_s: 0.2, ..opts(Transport::Auto) }).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    // The loader reads a distributed variable like any source.
    let view = SourceView::new(nodes[1].reader().source("x").unwrap() as Arc<dyn RecordSource>, &Allocator::default());
    let b = view.gather(&[4, 1]).unwrap();
    assert_eq!(b.as_dense().unwrap().as_slice::<i64>().unwrap(), &want_dense(&[4, 1])[..]);
}

/// A peer is untrusted: answers with more rows than asked, fewer, rows of another width or
/// garbage are errors naming the rank, and nothing lands outside the batch.
#[test]
fn a_peer_answering_wrong_rows_is_an_error_naming_it() {
    use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
    use arrow_flight::*;
    use futures::stream::{BoxStream, StreamExt, TryStreamExt};
    use tonic::{Request, Response, Status, Streaming};

    /// Answers every ticket with `rows` rows of `width` bytes (ids ignored), or bytes that are
    /// not Arrow at all.
    struct Liar {
        rows: usize,
        width: i32,
        garbage: bool,
    }
    type S<T> = BoxStream<'static, std::result::Result<T, Status>>;
    #[tonic::async_trait]
    impl FlightService for Liar {
        type HandshakeStream = S<HandshakeResponse>;
        type ListFlightsStream = S<FlightInfo>;
        type DoGetStream = S<FlightData>;
        type DoPutStream = S<PutResult>;
        type DoActionStream = S<arrow_flight::Result>;
        type ListActionsStream = S<ActionType>;
        type DoExchangeStream = S<FlightData>;
        async fn do_get(&self, _: Request<Ticket>) -> std::result::Result<Response<S<FlightData>>, Status> {
            if self.garbage {
                let junk = FlightData { data_header: vec![7u8; 40].into(), data_body: vec![1u8; 64].into(), ..Default::default() };
                return Ok(Response::new(futures::stream::iter([Ok(junk)]).boxed()));
            }
            let a = arrow_array::FixedSizeBinaryArray::try_new(self.width, vec![0xABu8; self.rows * self.width as usize].into(), None).unwrap();
            let b = arrow_array::RecordBatch::try_from_iter([("rows", std::sync::Arc::new(a) as arrow_array::ArrayRef)]).unwrap();
            let s = arrow_flight::encode::FlightDataEncoderBuilder::new().build(futures::stream::iter([Ok(b)])).map_err(|e| Status::internal(e.to_string()));
            Ok(Response::new(s.boxed()))
        }
        async fn handshake(&self, _: Request<Streaming<HandshakeRequest>>) -> std::result::Result<Response<S<HandshakeResponse>>, Status> {
            Err(Status::unimplemented(""))
        }
        async fn list_flights(&self, _: Request<Criteria>) -> std::result::Result<Response<S<FlightInfo>>, Status> {
            Err(Status::unimplemented(""))
        }
        async fn get_flight_info(&self, _: Request<FlightDescriptor>) -> std::result::Result<Response<FlightInfo>, Status> {
            Err(Status::unimplemented(""))
        }
        async fn poll_flight_info(&self, _: Request<FlightDescriptor>) -> std::result::Result<Response<PollInfo>, Status> {
            Err(Status::unimplemented(""))
        }
        async fn get_schema(&self, _: Request<FlightDescriptor>) -> std::result::Result<Response<SchemaResult>, Status> {
            Err(Status::unimplemented(""))
        }
        async fn do_put(&self, _: Request<Streaming<FlightData>>) -> std::result::Result<Response<S<PutResult>>, Status> {
            Err(Status::unimplemented(""))
        }
        async fn do_exchange(&self, _: Request<Streaming<FlightData>>) -> std::result::Result<Response<S<FlightData>>, Status> {
            Err(Status::unimplemented(""))
        }
        async fn do_action(&self, _: Request<Action>) -> std::result::Result<Response<S<arrow_flight::Result>>, Status> {
            Err(Status::unimplemented(""))
        }
        async fn list_actions(&self, _: Request<Empty>) -> std::result::Result<Response<S<ActionType>>, Status> {
            Err(Status::unimplemented(""))
        }
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    // Rank 1's shard: 4 rows of 3 int64 (24 bytes). Ids 5, 7 are its rows 1, 3.
    for (rows, width, garbage, what) in [(3, 24, false, "more than"), (1, 24, false, "answered 1 rows for 2"), (2, 16, false, "rows of 16 bytes"), (0, 0, true, "")] {
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let svc = FlightServiceServer::new(Liar { rows, width, garbage });
        rt.spawn(tonic::transport::Server::builder().add_service(svc).serve_with_incoming(futures::stream::unfold(listener, |l| async move { Some((l.accept().await.map(|(s, _)| s), l)) })));
        let nodes = group(2, &opts(Transport::Flight));
        let m0 = nodes[0].add_rows("x", 4, DType::Int64, vec![3]).unwrap();
        let m1 = nodes[1].add_rows("x", 4, DType::Int64, vec![3]).unwrap();
        let mut eps: Vec<_> = nodes.iter().map(|n| n.endpoint().clone()).collect();
        eps[1].addr = addr.to_string();
        eps[1].host = "another-host".into();
        nodes[0].connect(eps).unwrap();
        nodes[0].define("x", vec![m0, m1]).unwrap();
        let e = gather(nodes[0].reader(), "x", &[5, 0, 7]).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Peer { rank: 1, .. }), "{msg}");
        assert!(msg.contains(what), "{msg}");
        // A direct write into a caller's buffer fails the same way and leaves the rows
        // outside the batch untouched.
        let mut out = vec![7i64; 3 * 3 + 3];
        let src = nodes[0].reader().source("x").unwrap();
        // SAFETY: `out` holds 12 int64; the gather may write the first 9 (72 bytes) and the
        // vector outlives the call.
        let e = unsafe { src.gather_into(Ids::List(&[5, 0, 7]), out.as_mut_ptr().cast::<u8>(), 72, &ReadOptions::default()) }.unwrap_err();
        assert!(matches!(e, Error::Peer { rank: 1, .. }), "{e}");
        assert_eq!(&out[9..], &[7, 7, 7]);
    }
}

/// A reader's runtime has no threads: whoever waits for an answer drives it. Threads sharing
/// one reader take turns driving (each gets its own rows), and a gather from inside a tokio
/// runtime (multi-threaded, current-thread, a blocking task: where DataFusion calls sources)
/// is driven from a thread of its own. Batches mix this rank's rows (read in place) with
/// two other ranks' (over Flight).
#[test]
fn gathers_from_many_threads_and_from_inside_runtimes_share_one_reader() {
    let nodes = group(3, &opts(Transport::Flight));
    let total = add_dense(&nodes, "x");
    let reader = nodes[0].reader().clone();
    let batch = |seed: u64, n: usize| -> Vec<u64> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 33) % total
            })
            .collect()
    };
    let check = |reader: &DistReader, ids: &[u64]| {
        let b = gather(reader, "x", ids).unwrap();
        assert_eq!(b.as_dense().unwrap().as_slice::<i64>().unwrap(), &want_dense(ids)[..], "ids {ids:?}");
    };
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (reader, check, batch) = (&reader, &check, &batch);
            s.spawn(move || {
                for k in 0..150u64 {
                    check(reader, &batch(t * 1000 + k, 1 + (k as usize % 17)));
                }
            });
        }
    });
    let ids = batch(7, 33);
    let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    multi.block_on(async { check(&reader, &ids) });
    let r2 = reader.clone();
    let ids2 = ids.clone();
    multi.block_on(async move { tokio::task::spawn_blocking(move || check(&r2, &ids2)).await.unwrap() });
    let current = tokio::runtime::Builder::new_current_thread().build().unwrap();
    current.block_on(async { check(&reader, &ids) });
    let p = reader.profile("x").unwrap();
    assert!(p.requests >= 600, "{p:?}");
}
