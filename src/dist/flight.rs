//! The cross-host transport: each rank serves its shards over Arrow Flight (`DoGet`), a
//! ticket naming a variable and the ids wanted; the answer is one Arrow record batch per
//! Flight message group. Dense rows travel as `FixedSizeBinary(row_bytes)` (the gathered
//! batch's buffer is sent as is), ragged records as `LargeBinary` values plus a
//! `FixedSizeList<UInt64>` shape column.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, FixedSizeBinaryArray, FixedSizeListArray, LargeBinaryArray, RecordBatch, UInt64Array};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{FlightData, Ticket};
use bytes::Bytes;
use arrow_schema::{DataType, Field, Schema};
use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use tonic::{Request, Response, Status};

use crate::arrow::tensor_buffer;
use crate::error::{Error, Result};
use crate::memory::Allocator;
use crate::store::{Batch, Ids, ReadOptions, RecordSource};

/// Largest gRPC message either side accepts (a single record may be this large).
pub(crate) const MAX_MESSAGE_BYTES: usize = 1 << 31;
/// HTTP/2 flow-control windows: gRPC's 64 KiB default stalls a multi-megabyte answer on a
/// window update per 64 KiB; batches of rows want the whole answer in flight.
pub(crate) const STREAM_WINDOW: u32 = 16 << 20;
pub(crate) const CONNECTION_WINDOW: u32 = 64 << 20;
/// HTTP/2 frames up to 1 MiB (the 16 KiB default cuts a row of 1 MB into 64 frames).
pub(crate) const MAX_FRAME: u32 = 1 << 20;
/// Flight messages are cut at about this many bytes of rows.
const FLIGHT_DATA_BYTES: usize = 4 << 20;

/// One shard this rank serves: a record source, and its shared-memory rows when it is one.
#[derive(Clone)]
pub(crate) struct Served {
    pub(crate) source: Arc<dyn RecordSource>,
    pub(crate) rows: Option<Arc<crate::dist::shard::SharedRows>>,
}

/// The shards this rank serves, by variable name.
pub(crate) type Shards = Arc<RwLock<HashMap<String, Served>>>;

/// `name` and `ids` as ticket bytes: name length (u32 LE), name, then the ids (u64 LE).
pub(crate) fn encode_ticket(name: &str, ids: &[u64]) -> Vec<u8> {
    let mut t = Vec::with_capacity(4 + name.len() + 8 * ids.len());
    t.extend_from_slice(&(name.len() as u32).to_le_bytes());
    t.extend_from_slice(name.as_bytes());
    for id in ids {
        t.extend_from_slice(&id.to_le_bytes());
    }
    t
}

fn decode_ticket(t: &[u8]) -> Option<(String, Vec<u64>)> {
    let n = u32::from_le_bytes(t.get(..4)?.try_into().ok()?) as usize;
    let name = std::str::from_utf8(t.get(4..4usize.checked_add(n)?)?).ok()?.to_string();
    let rest = &t[4 + n..];
    if !rest.len().is_multiple_of(8) {
        return None;
    }
    Some((name, rest.chunks_exact(8).map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect()))
}

/// A gathered batch as the record batch sent back.
pub(crate) fn batch_to_record_batch(batch: &Batch) -> Result<RecordBatch> {
    let n = batch.len();
    let (fields, columns): (Vec<Field>, Vec<ArrayRef>) = match batch {
        Batch::Dense(t) => {
            let row = t.nbytes().checked_div(n).unwrap_or(0);
            let a = FixedSizeBinaryArray::try_new(row as i32, tensor_buffer(t), None)?;
            (vec![Field::new("rows", DataType::FixedSizeBinary(row as i32), false)], vec![Arc::new(a)])
        }
        Batch::Ragged(r) => {
            let size = r.dtype().size() as i64;
            let offsets: Vec<i64> = r.cu_seqlens_slice().iter().map(|&c| c as i64 * size).collect();
            let values = LargeBinaryArray::try_new(OffsetBuffer::new(ScalarBuffer::from(offsets)), tensor_buffer(r.values()), None)?;
            let ndim = r.ndim();
            let shapes = UInt64Array::from(r.shapes_slice().to_vec());
            let item = Arc::new(Field::new("item", DataType::UInt64, false));
            let shape = FixedSizeListArray::try_new(item.clone(), ndim as i32, Arc::new(shapes), None)?;
            (
                vec![Field::new("data", DataType::LargeBinary, false), Field::new("shape", DataType::FixedSizeList(item, ndim as i32), false)],
                vec![Arc::new(values), Arc::new(shape)],
            )
        }
    };
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

/// One answer message's rows, in the order asked for.
pub(crate) enum Received {
    /// Dense rows: `FixedSizeBinary` values, `row_bytes * rows` long.
    Dense(Buffer),
    /// Ragged records: the `data` and `shape` columns.
    Ragged(LargeBinaryArray, FixedSizeListArray),
}

impl Received {
    /// Records received.
    pub(crate) fn rows(&self, row_bytes: usize) -> usize {
        match self {
            Received::Dense(rows) => rows.len().checked_div(row_bytes).unwrap_or(0),
            Received::Ragged(d, _) => d.len(),
        }
    }
}

/// Unpack one record batch of an answer.
pub(crate) fn received(b: RecordBatch, ragged: bool, row_bytes: usize) -> std::result::Result<Received, String> {
    if ragged {
        let (Some(d), Some(s)) = (b.column_by_name("data"), b.column_by_name("shape")) else {
            return Err("an answer without data / shape columns".into());
        };
        let d = d.as_binary_opt::<i64>().ok_or("data column is not LargeBinary")?.clone();
        let s = s.as_fixed_size_list_opt().ok_or("shape column is not a FixedSizeList")?.clone();
        return Ok(Received::Ragged(d, s));
    }
    let rows = b.column_by_name("rows").ok_or("an answer without a rows column")?;
    let a = rows.as_fixed_size_binary_opt().ok_or("rows column is not FixedSizeBinary")?;
    if a.value_length() as usize != row_bytes {
        return Err(format!("rows of {} bytes, {row_bytes} expected", a.value_length()));
    }
    let data = a.to_data();
    let buf = data.buffers().first().ok_or("rows column without a buffer")?;
    let (start, len) = (a.offset() * row_bytes, a.len() * row_bytes);
    if start + len > buf.len() {
        return Err(format!("rows column of {} bytes, {} expected", buf.len(), start + len));
    }
    Ok(Received::Dense(buf.slice_with_length(start, len)))
}

/// The u64 shape values of a received ragged part (`len * ndim`).
pub(crate) fn shape_values(s: &FixedSizeListArray) -> Option<&[u64]> {
    let v = s.values().as_primitive_opt::<arrow_array::types::UInt64Type>()?;
    let w = s.value_length() as usize;
    v.values().get(s.offset() * w..(s.offset() + s.len()) * w)
}

/// What the Flight service of one rank reads: its shards and where gathers of store-backed
/// shards land.
pub(crate) struct ShardService {
    pub(crate) shards: Shards,
    pub(crate) allocator: Allocator,
}

fn status(e: Error) -> Status {
    match e {
        Error::IndexOutOfRange { .. } => Status::out_of_range(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

/// One message of a `DoGet` answer. Dense rows are written into the gRPC frame by the encoder
/// itself: shared-memory rows straight from the shard, store rows from one gathered buffer
/// (no Arrow IPC body is assembled first). Everything else (the schema, ragged batches) is an
/// ordinary `FlightData`.
pub(crate) enum Reply {
    Message(FlightData),
    /// Rows `ids[range]` of a shared-memory shard.
    Shared { header: Bytes, rows: Arc<crate::dist::shard::SharedRows>, ids: Arc<Vec<u64>>, range: std::ops::Range<usize> },
    /// Rows already gathered (a slice of one buffer).
    Gathered { header: Bytes, data: Buffer },
}

/// `n` bytes padded to the 8-byte multiple Arrow IPC bodies use.
fn padded(n: usize) -> usize {
    n.next_multiple_of(8)
}

/// The IPC message header (a flatbuffer `Message` of a `RecordBatch`) of `rows` dense rows of
/// `row_bytes` each in one `FixedSizeBinary` column without nulls: validity buffer empty, the
/// values at body offset 0.
fn dense_header(rows: usize, row_bytes: usize) -> Bytes {
    use arrow_ipc::{Buffer as IpcBuffer, FieldNode, MessageBuilder, MessageHeader, MetadataVersion, RecordBatchBuilder};
    let data = rows * row_bytes;
    let mut fbb = flatbuffers::FlatBufferBuilder::with_capacity(256);
    let nodes = fbb.create_vector(&[FieldNode::new(rows as i64, 0)]);
    let buffers = fbb.create_vector(&[IpcBuffer::new(0, 0), IpcBuffer::new(0, data as i64)]);
    let mut batch = RecordBatchBuilder::new(&mut fbb);
    batch.add_length(rows as i64);
    batch.add_nodes(nodes);
    batch.add_buffers(buffers);
    let batch = batch.finish();
    let mut message = MessageBuilder::new(&mut fbb);
    message.add_version(MetadataVersion::V5);
    message.add_header_type(MessageHeader::RecordBatch);
    message.add_header(batch.as_union_value());
    message.add_bodyLength(padded(data) as i64);
    let message = message.finish();
    fbb.finish(message, None);
    Bytes::copy_from_slice(fbb.finished_data())
}

/// The schema message every dense answer starts with.
fn dense_schema(row_bytes: usize) -> FlightData {
    let schema = Schema::new(vec![Field::new("rows", DataType::FixedSizeBinary(row_bytes as i32), false)]);
    FlightData::from(arrow_flight::SchemaAsIpc::new(&schema, &arrow_ipc::writer::IpcWriteOptions::default()))
}

/// Encodes [`Reply`]s as `FlightData` protobuf messages; decodes `Ticket`s.
#[derive(Clone, Copy, Default)]
struct ReplyCodec;

impl tonic::codec::Codec for ReplyCodec {
    type Encode = Reply;
    type Decode = Ticket;
    type Encoder = ReplyCodec;
    type Decoder = ReplyCodec;

    fn encoder(&mut self) -> ReplyCodec {
        ReplyCodec
    }

    fn decoder(&mut self) -> ReplyCodec {
        ReplyCodec
    }
}

impl tonic::codec::Decoder for ReplyCodec {
    type Item = Ticket;
    type Error = Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> std::result::Result<Option<Ticket>, Status> {
        prost::Message::decode(src).map(Some).map_err(|e| Status::invalid_argument(format!("malformed ticket: {e}")))
    }
}

impl tonic::codec::Encoder for ReplyCodec {
    type Item = Reply;
    type Error = Status;

    fn encode(&mut self, item: Reply, dst: &mut tonic::codec::EncodeBuf<'_>) -> std::result::Result<(), Status> {
        use bytes::BufMut;
        use prost::encoding::{encode_key, encode_varint, WireType};
        let (header, data) = match item {
            Reply::Message(m) => return prost::Message::encode(&m, dst).map_err(|e| Status::internal(e.to_string())),
            Reply::Shared { header, rows, ids, range } => (header, Err((rows, ids, range))),
            Reply::Gathered { header, data } => (header, Ok(data)),
        };
        let len = match &data {
            Ok(b) => b.len(),
            Err((rows, _, range)) => range.len() * rows.row_bytes(),
        };
        // FlightData: data_header = 2, data_body = 1000 (both length-delimited).
        encode_key(2, WireType::LengthDelimited, dst);
        encode_varint(header.len() as u64, dst);
        dst.put_slice(&header);
        encode_key(1000, WireType::LengthDelimited, dst);
        encode_varint(padded(len) as u64, dst);
        match data {
            Ok(b) => dst.put_slice(b.as_slice()),
            Err((rows, ids, range)) => {
                dst.reserve(len);
                let chunk = dst.chunk_mut();
                if chunk.len() < len {
                    return Err(Status::internal("encode buffer smaller than reserved"));
                }
                let pos: Vec<usize> = (0..range.len()).collect();
                // SAFETY: `chunk` is the buffer's spare capacity, at least `len` writable bytes
                // (checked above), ours alone until `advance_mut`; `copy_rows_to` writes each
                // of its `len / row_bytes` rows once (it checks the ids against the shard first).
                let out = unsafe { crate::dist::node::Out::new(chunk.as_mut_ptr(), len, rows.row_bytes()) };
                rows.copy_rows_to(&ids[range], &pos, &out, false).map_err(status)?;
                // SAFETY: the `len` bytes after the buffer's end were all written just above.
                unsafe { dst.advance_mut(len) };
            }
        }
        dst.put_bytes(0, padded(len) - len);
        Ok(())
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        // Small answers (the schema and a few rows) leave in one write, so a reader waiting
        // for them wakes once; a message past 32 KiB is sent as soon as it is encoded.
        tonic::codec::BufferSettings::new(64 << 10, 32 << 10)
    }
}

type ReplyStream = BoxStream<'static, std::result::Result<Reply, Status>>;

/// A dense answer of `n` rows of `rb` bytes: the schema, then one message per range of about
/// FLIGHT_DATA_BYTES of rows (at least one row each).
fn dense_replies(n: usize, rb: usize, message: impl Fn(std::ops::Range<usize>) -> Reply) -> ReplyStream {
    let per = (FLIGHT_DATA_BYTES / rb.max(1)).max(1);
    let messages = (0..n).step_by(per).map(|at| Ok(message(at..(at + per).min(n))));
    futures::stream::iter(std::iter::once(Ok(Reply::Message(dense_schema(rb)))).chain(messages).collect::<Vec<_>>()).boxed()
}

impl ShardService {
    /// The answer to one ticket: dense rows cut into messages of about FLIGHT_DATA_BYTES.
    async fn do_get(&self, ticket: &[u8]) -> std::result::Result<ReplyStream, Status> {
        let (name, ids) = decode_ticket(ticket).ok_or_else(|| Status::invalid_argument("malformed ticket"))?;
        let served = self.shards.read().map_err(|_| Status::internal("shard table poisoned"))?.get(&name).cloned();
        let served = served.ok_or_else(|| Status::not_found(format!("no variable '{name}' on this rank")))?;
        if let Some(rows) = served.rows {
            // Shared-memory rows: checked here, copied by the encoder into each frame.
            let (n, rb) = (rows.len(), rows.row_bytes());
            if let Some(&bad) = ids.iter().find(|&&i| i >= n) {
                return Err(status(Error::IndexOutOfRange { index: bad as i128, len: n, store: name.into() }));
            }
            let ids = Arc::new(ids);
            return Ok(dense_replies(ids.len(), rb, |range| Reply::Shared { header: dense_header(range.len(), rb), rows: rows.clone(), ids: ids.clone(), range }));
        }
        let (source, allocator) = (served.source, self.allocator.clone());
        // Stores may decode or wait for storage: gathered off the reactor threads.
        let batch = tokio::task::spawn_blocking(move || source.gather(Ids::List(&ids), &allocator, &ReadOptions { verify_checksums: true, parallel: false }))
            .await
            .map_err(|e| Status::internal(format!("gather task failed: {e}")))?
            .map_err(status)?;
        if let Batch::Dense(t) = &batch {
            let (n, buf) = (batch.len(), tensor_buffer(t));
            let rb = t.nbytes().checked_div(n).unwrap_or(0);
            return Ok(dense_replies(n, rb, |r| Reply::Gathered { header: dense_header(r.len(), rb), data: buf.slice_with_length(r.start * rb, r.len() * rb) }));
        }
        let rb = batch_to_record_batch(&batch).map_err(status)?;
        let stream = FlightDataEncoderBuilder::new()
            .with_max_flight_data_size(FLIGHT_DATA_BYTES)
            .build(futures::stream::once(async move { Ok(rb) }))
            .map_ok(Reply::Message)
            .map_err(|e| Status::internal(e.to_string()));
        Ok(stream.boxed())
    }
}

/// Answer one `DoGet` ticket the way a rank serving `source` as variable `name` does, and
/// drain the reply: the number of reply messages and the row bytes they carry, or the error
/// status. For the `flight_ticket` fuzz target (hostile tickets); not part of the API.
#[doc(hidden)]
pub fn answer_ticket(name: &str, source: Arc<dyn RecordSource>, ticket: &[u8]) -> std::result::Result<(usize, usize), String> {
    let shards: Shards = Arc::new(RwLock::new(HashMap::from([(name.to_string(), Served { source, rows: None })])));
    let service = ShardService { shards, allocator: Allocator::default() };
    let ticket = ticket.to_vec();
    crate::io::runtime::block(async move {
        let mut stream = service.do_get(&ticket).await.map_err(|s| s.message().to_string())?;
        let (mut messages, mut bytes) = (0, 0);
        while let Some(reply) = stream.next().await {
            messages += 1;
            bytes += match reply.map_err(|s| s.message().to_string())? {
                Reply::Message(m) => m.data_body.len(),
                Reply::Shared { rows, range, .. } => range.len() * rows.row_bytes(),
                Reply::Gathered { data, .. } => data.len(),
            };
        }
        Ok((messages, bytes))
    })
}

/// `DoGet` of the Flight protocol served with [`ReplyCodec`].
struct DoGet(Arc<ShardService>);

impl tonic::server::ServerStreamingService<Ticket> for DoGet {
    type Response = Reply;
    type ResponseStream = ReplyStream;
    type Future = BoxFuture<'static, std::result::Result<Response<ReplyStream>, Status>>;

    fn call(&mut self, request: Request<Ticket>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.do_get(&request.get_ref().ticket).await.map(Response::new) })
    }
}

const FLIGHT_SERVICE: &str = "arrow.flight.protocol.FlightService";

/// The Flight service of one rank: `DoGet` (shards are read-only; the other methods answer
/// `UNIMPLEMENTED`). Any Flight client reads it: the wire format is Flight's.
#[derive(Clone)]
pub(crate) struct FlightShards(Arc<ShardService>);

impl tonic::server::NamedService for FlightShards {
    const NAME: &'static str = FLIGHT_SERVICE;
}

impl tonic::codegen::Service<tonic::codegen::http::Request<tonic::body::Body>> for FlightShards {
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, std::result::Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::result::Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::codegen::http::Request<tonic::body::Body>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            if req.uri().path() != format!("/{FLIGHT_SERVICE}/DoGet") {
                return Ok(Status::unimplemented(format!("{} (shards are served by DoGet only)", req.uri().path())).into_http());
            }
            let mut grpc = tonic::server::Grpc::new(ReplyCodec).apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            Ok(grpc.server_streaming(DoGet(service), req).await)
        })
    }
}

/// Serve `service` on `listener` until `stop` fires.
pub(crate) async fn serve(service: ShardService, listener: tokio::net::TcpListener, stop: tokio::sync::oneshot::Receiver<()>) {
    let incoming = futures::stream::unfold(listener, |l| async move {
        let r = l.accept().await.map(|(s, _)| {
            let _ = s.set_nodelay(true);
            s
        });
        Some((r, l))
    });
    let _ = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(STREAM_WINDOW))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        .max_frame_size(Some(MAX_FRAME))
        .add_service(FlightShards(Arc::new(service)))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop.await;
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_round_trip_and_garbage_is_refused() {
        let t = encode_ticket("feat", &[3, 0, u64::MAX]);
        assert_eq!(decode_ticket(&t), Some(("feat".to_string(), vec![3, 0, u64::MAX])));
        assert_eq!(decode_ticket(&t[..t.len() - 1]), None);
        assert_eq!(decode_ticket(&[255, 255, 255, 255, b'a']), None);
        assert_eq!(decode_ticket(&[]), None);
    }
}
