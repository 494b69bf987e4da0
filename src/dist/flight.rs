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
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, HandshakeResponse, PollInfo, PutResult,
    SchemaResult, Ticket,
};
use arrow_schema::{DataType, Field, Schema};
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use tonic::{Request, Response, Status, Streaming};

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
/// Gathers of shared-memory rows up to this size run on the reactor thread itself.
const INLINE_BYTES: usize = 1 << 20;
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

/// Rows received from a peer, in the order asked for.
pub(crate) enum Received {
    /// Dense rows: chunks of `FixedSizeBinary` values, each `row_bytes * rows` long.
    Dense(Vec<Buffer>),
    /// Ragged records: `(data, shape)` columns of each received batch.
    Ragged(Vec<(LargeBinaryArray, FixedSizeListArray)>),
}

impl Received {
    /// Records received.
    pub(crate) fn rows(&self, row_bytes: usize) -> usize {
        match self {
            Received::Dense(chunks) => chunks.iter().map(|c| c.len()).sum::<usize>().checked_div(row_bytes).unwrap_or(0),
            Received::Ragged(parts) => parts.iter().map(|(d, _)| d.len()).sum(),
        }
    }
}

/// Unpack the record batches of one answer.
pub(crate) fn received(batches: Vec<RecordBatch>, ragged: bool, row_bytes: usize) -> std::result::Result<Received, String> {
    if ragged {
        let mut parts = Vec::with_capacity(batches.len());
        for b in batches {
            let (Some(d), Some(s)) = (b.column_by_name("data"), b.column_by_name("shape")) else {
                return Err("an answer without data / shape columns".into());
            };
            let d = d.as_binary_opt::<i64>().ok_or("data column is not LargeBinary")?.clone();
            let s = s.as_fixed_size_list_opt().ok_or("shape column is not a FixedSizeList")?.clone();
            parts.push((d, s));
        }
        Ok(Received::Ragged(parts))
    } else {
        let mut chunks = Vec::with_capacity(batches.len());
        for b in batches {
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
            chunks.push(buf.slice_with_length(start, len));
        }
        Ok(Received::Dense(chunks))
    }
}

/// The u64 shape values of a received ragged part (`len * ndim`).
pub(crate) fn shape_values(s: &FixedSizeListArray) -> Option<&[u64]> {
    let v = s.values().as_primitive_opt::<arrow_array::types::UInt64Type>()?;
    let w = s.value_length() as usize;
    v.values().get(s.offset() * w..(s.offset() + s.len()) * w)
}

/// The Flight service of one rank.
pub(crate) struct ShardService {
    pub(crate) shards: Shards,
    pub(crate) allocator: Allocator,
}

type TonicStream<T> = BoxStream<'static, std::result::Result<T, Status>>;

fn status(e: Error) -> Status {
    match e {
        Error::IndexOutOfRange { .. } => Status::out_of_range(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

#[tonic::async_trait]
impl FlightService for ShardService {
    type HandshakeStream = TonicStream<HandshakeResponse>;
    type ListFlightsStream = TonicStream<FlightInfo>;
    type DoGetStream = TonicStream<FlightData>;
    type DoPutStream = TonicStream<PutResult>;
    type DoActionStream = TonicStream<arrow_flight::Result>;
    type ListActionsStream = TonicStream<ActionType>;
    type DoExchangeStream = TonicStream<FlightData>;

    async fn do_get(&self, request: Request<Ticket>) -> std::result::Result<Response<Self::DoGetStream>, Status> {
        let (name, ids) = decode_ticket(&request.get_ref().ticket).ok_or_else(|| Status::invalid_argument("malformed ticket"))?;
        let source = self.shards.read().map_err(|_| Status::internal("shard table poisoned"))?.get(&name).map(|s| {
            // Shared-memory rows are plain copies: in place up to INLINE_BYTES.
            let small = s.rows.as_ref().is_some_and(|r| ids.len().saturating_mul(r.row_bytes()) <= INLINE_BYTES);
            (s.source.clone(), small)
        });
        let (source, small) = source.ok_or_else(|| Status::not_found(format!("no variable '{name}' on this rank")))?;
        let allocator = self.allocator.clone();
        let gather = move || {
            let b = source.gather(Ids::List(&ids), &allocator, &ReadOptions { verify_checksums: true, parallel: false })?;
            batch_to_record_batch(&b)
        };
        // Small gathers run in place (a hand-off to another thread costs more than the copy);
        // large ones, and stores that may decode or wait for storage, off the reactor threads.
        let rb = if small { gather() } else { tokio::task::spawn_blocking(gather).await.map_err(|e| Status::internal(format!("gather task failed: {e}")))? }.map_err(status)?;
        let stream = FlightDataEncoderBuilder::new()
            .with_max_flight_data_size(FLIGHT_DATA_BYTES)
            .build(futures::stream::once(async move { Ok(rb) }))
            .map_err(|e| Status::internal(e.to_string()));
        Ok(Response::new(stream.boxed()))
    }

    async fn handshake(&self, _: Request<Streaming<HandshakeRequest>>) -> std::result::Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented("handshake"))
    }

    async fn list_flights(&self, _: Request<Criteria>) -> std::result::Result<Response<Self::ListFlightsStream>, Status> {
        Err(Status::unimplemented("list_flights"))
    }

    async fn get_flight_info(&self, _: Request<FlightDescriptor>) -> std::result::Result<Response<FlightInfo>, Status> {
        Err(Status::unimplemented("get_flight_info"))
    }

    async fn poll_flight_info(&self, _: Request<FlightDescriptor>) -> std::result::Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("poll_flight_info"))
    }

    async fn get_schema(&self, _: Request<FlightDescriptor>) -> std::result::Result<Response<SchemaResult>, Status> {
        Err(Status::unimplemented("get_schema"))
    }

    async fn do_put(&self, _: Request<Streaming<FlightData>>) -> std::result::Result<Response<Self::DoPutStream>, Status> {
        Err(Status::unimplemented("shards are read-only"))
    }

    async fn do_exchange(&self, _: Request<Streaming<FlightData>>) -> std::result::Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("do_exchange"))
    }

    async fn do_action(&self, _: Request<Action>) -> std::result::Result<Response<Self::DoActionStream>, Status> {
        Err(Status::unimplemented("do_action"))
    }

    async fn list_actions(&self, _: Request<Empty>) -> std::result::Result<Response<Self::ListActionsStream>, Status> {
        Err(Status::unimplemented("list_actions"))
    }
}

/// Serve `service` on `listener` until `stop` fires.
pub(crate) async fn serve(service: ShardService, listener: tokio::net::TcpListener, stop: tokio::sync::oneshot::Receiver<()>) {
    let svc = FlightServiceServer::new(service).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES);
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
        .add_service(svc)
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
