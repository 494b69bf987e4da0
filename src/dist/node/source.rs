//! One variable as a record source ([`DistSource`]): one request per owning rank, in flight together.

#[allow(unused_imports)]
use super::*;

/// One variable of a distributed store as a [`RecordSource`]: a gather sends all rows owned
/// by one rank in one request (split past `max_request_bytes`), requests to every rank in
/// flight together, reads this rank's and same-host shards in place meanwhile, and assembles
/// the batch in the order of `ids`.
pub struct DistSource {
    pub(super) reader: DistReader,
    pub(super) var: Arc<Variable>,
}

impl std::fmt::Debug for DistSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DistSource('{}', {} rows over {} ranks)", self.var.name, self.len(), self.var.metas.len())
    }
}

/// The rows one rank contributes to a gather: its local ids and their positions in the batch.
#[derive(Default)]
pub(super) struct Group {
    pub(super) ids: Vec<u64>,
    pub(super) pos: Vec<usize>,
}

/// A message of a remote answer as it arrives: request `req` of the gather, one record batch
/// of it (the answer's messages in order), and with its last one how the request ended (its
/// time, or the failure and whether it timed out). Requests send these to the gathering
/// thread, which places each batch's rows while the next are still on the wire; the tasks
/// never touch the destination, so a gather that fails early leaves nothing writing into it.
pub(super) struct Arrival {
    pub(super) req: usize,
    pub(super) batch: Option<arrow_array::RecordBatch>,
    pub(super) done: Option<std::result::Result<u64, (String, bool)>>,
}

/// Scheduler turns a gather gives its requests' tasks to reach the wire before it reads its
/// local rows (a task hands its request to the connection's, which writes it).
const REQUEST_YIELDS: usize = 3;

/// A request in flight: the owner, the positions of its ids in the owner's group, rows placed.
pub(super) struct InFlight {
    pub(super) rank: usize,
    pub(super) range: std::ops::Range<usize>,
    pub(super) placed: usize,
}

impl DistSource {
    /// Rows per rank.
    pub fn shard_rows(&self) -> Vec<u64> {
        self.var.metas.iter().map(|m| m.rows).collect()
    }

    /// The owning rank of global row `id` and its row in that shard (`id < len`).
    pub fn owner(&self, id: u64) -> (usize, u64) {
        let r = self.var.starts.partition_point(|&s| s <= id) - 1;
        (r, id - self.var.starts[r])
    }

    pub(super) fn peer_error(&self, rank: usize, message: String, timed_out: bool) -> Error {
        let addr = self.reader.endpoint(rank).map(|e| e.addr).unwrap_or_default();
        Error::Peer { rank, variable: self.var.name.clone(), message: format!("{message} (at {addr})"), timed_out }
    }

    pub(super) fn row_bytes(&self) -> usize {
        match &self.var.layout {
            Layout::Dense { item_shape } => item_shape.iter().product::<usize>() * self.var.dtype.size(),
            Layout::Ragged { .. } => 0,
        }
    }

    /// Start the requests for `group` of `rank` (split into pieces of at most
    /// `max_request_bytes` for dense rows, 65536 ids for ragged ones; dense answers of
    /// SPLIT_BYTES or more into at least one piece per connection, dealt over them in turn);
    /// their answers arrive on `tx` under their index in `inflight`.
    pub(super) fn send(&self, rank: usize, group: &Group, tx: &tokio::sync::mpsc::UnboundedSender<Arrival>, inflight: &mut Vec<InFlight>) -> Result<()> {
        let rb = self.row_bytes();
        let mut per = self.reader.inner.options.max_request_bytes.checked_div(rb).map_or(1 << 16, |p| p.max(1));
        let n = group.ids.len();
        if rb > 0 && n.saturating_mul(rb) >= SPLIT_BYTES {
            // Large answers: at least one request per connection.
            per = per.min(n.div_ceil(PEER_CONNECTIONS)).max(1);
        }
        let channels = self.reader.channels(rank)?;
        let timeout = self.reader.inner.timeout;
        let rt = self.reader.inner.rt.handle()?;
        let mut at = 0;
        while at < group.ids.len() {
            let end = (at + per).min(group.ids.len());
            let ticket = flight::encode_ticket(&self.var.name, &group.ids[at..end]);
            let (ch, tx, req) = (channels[inflight.len() % channels.len()].clone(), tx.clone(), inflight.len());
            rt.spawn(async move {
                let t0 = Instant::now();
                let call = async {
                    let mut client = FlightServiceClient::new(ch).max_decoding_message_size(flight::MAX_MESSAGE_BYTES).max_encoding_message_size(flight::MAX_MESSAGE_BYTES);
                    let stream = client.do_get(Ticket { ticket: ticket.into() }).await.map_err(|s| s.message().to_string() + &format!(" [{:?}]", s.code()))?.into_inner();
                    let mut batches = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(stream.map_err(arrow_flight::error::FlightError::from));
                    // Each batch goes out as soon as the next one arrives; the last one with
                    // the outcome (one wake-up of the gathering thread for a one-message answer).
                    let mut held = None;
                    while let Some(b) = batches.try_next().await.map_err(|e| e.to_string())? {
                        if let Some(prev) = held.replace(b) {
                            if tx.send(Arrival { req, batch: Some(prev), done: None }).is_err() {
                                return Ok(None); // the gather gave up: nobody is waiting
                            }
                        }
                    }
                    Ok::<_, String>(held)
                };
                let end = match tokio::time::timeout(timeout, call).await {
                    Ok(Ok(last)) => Arrival { req, batch: last, done: Some(Ok(t0.elapsed().as_nanos() as u64)) },
                    Ok(Err(m)) => Arrival { req, batch: None, done: Some(Err((m, false))) },
                    Err(_) => Arrival { req, batch: None, done: Some(Err((format!("no answer within {:.1} s", timeout.as_secs_f64()), true))) },
                };
                let _ = tx.send(end);
            });
            inflight.push(InFlight { rank, range: at..end, placed: 0 });
            self.var.counters.requests.fetch_add(1, Ordering::Relaxed);
            at = end;
        }
        Ok(())
    }

    /// Start the requests to remote owners, then read local and same-host shards with
    /// `local`, then hand each remote answer to `remote`. Returns the rows handled.
    ///
    /// The calling thread does the requests' work: it drives the reader's runtime (the
    /// requests, their connections' I/O and the placing of each answer) until the last answer
    /// is in, so a request's round trip has no thread hand-off on this side.
    pub(super) fn run(
        &self,
        groups: &[Group],
        mut local: impl FnMut(usize, &Route, &Group) -> Result<()> + Send,
        mut remote: impl FnMut(usize, std::ops::Range<usize>, Received) -> Result<()> + Send,
    ) -> Result<()> {
        let routes: Vec<Arc<Route>> = self.var.routes.read().map_err(lock_err)?.clone();
        // Remote requests first, so they are in flight while local shards are read.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut inflight = Vec::new();
        for (r, g) in groups.iter().enumerate() {
            if !g.ids.is_empty() && matches!(*routes[r], Route::Remote) {
                self.send(r, g, &tx, &mut inflight)?;
            }
        }
        drop(tx);
        if inflight.is_empty() {
            return self.read_local(groups, &routes, &mut local);
        }
        self.reader.inner.rt.drive(async {
            // The requests' tasks write them to their connections before the local reads
            // keep this thread (the runtime's only one) busy.
            for _ in 0..REQUEST_YIELDS {
                tokio::task::yield_now().await;
            }
            self.read_local(groups, &routes, &mut local)?;
            let t1 = Instant::now();
            // Answers are placed as their messages arrive, in whatever order the owners send them.
            let (ragged, rb) = (matches!(self.var.layout, Layout::Ragged { .. }), self.row_bytes());
            let mut open = inflight.len();
            while open > 0 {
                let a = rx.recv().await.ok_or_else(|| Error::invalid("gather", format!("a request for '{}' ended without an answer", self.var.name)))?;
                let f = &mut inflight[a.req];
                if let Some(b) = a.batch {
                    let got = flight::received(b, ragged, rb).map_err(|m| self.peer_error(f.rank, m, false))?;
                    let n = got.rows(rb);
                    if f.placed + n > f.range.len() {
                        return Err(self.peer_error(f.rank, format!("answered more than the {} rows asked", f.range.len()), false));
                    }
                    let at = f.range.start + f.placed;
                    remote(f.rank, at..at + n, got)?;
                    f.placed += n;
                }
                if let Some(done) = a.done {
                    let ns = done.map_err(|(m, t)| self.peer_error(f.rank, m, t))?;
                    self.var.counters.transfer_ns.fetch_add(ns, Ordering::Relaxed);
                    if f.placed != f.range.len() {
                        return Err(self.peer_error(f.rank, format!("answered {} rows for {} ids", f.placed, f.range.len()), false));
                    }
                    open -= 1;
                }
            }
            self.var.counters.wait_ns.fetch_add(t1.elapsed().as_nanos() as u64, Ordering::Relaxed);
            Ok(())
        })?
    }

    /// Read every local and same-host shard's rows of `groups` with `local`.
    fn read_local(&self, groups: &[Group], routes: &[Arc<Route>], local: &mut impl FnMut(usize, &Route, &Group) -> Result<()>) -> Result<()> {
        let t0 = Instant::now();
        for (r, g) in groups.iter().enumerate() {
            if g.ids.is_empty() {
                continue;
            }
            let owner = match &*routes[r] {
                Route::Remote => continue,
                Route::Local { owner, .. } | Route::Shared { owner, .. } => owner,
            };
            if owner.as_ref().is_some_and(|o| o.exited()) {
                return Err(self.peer_error(r, "the rank's process exited".into(), false));
            }
            local(r, &routes[r], g)?;
        }
        self.var.counters.local_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Dense rows `groups` straight into `out` (each position written once).
    pub(super) fn gather_dense(&self, groups: &[Group], out: &Out, options: &ReadOptions) -> Result<()> {
        let rb = self.row_bytes();
        let written = AtomicU64::new(0);
        self.run(
            groups,
            |_, route, g| {
                match route {
                    Route::Shared { rows, .. } => rows.copy_rows_to(&g.ids, &g.pos, out, options.parallel)?,
                    Route::Local { source, .. } => {
                        let b = source.gather(Ids::List(&g.ids), &self.reader.inner.staging, options)?;
                        let t = b.into_dense(&self.var.name)?;
                        for (k, &p) in g.pos.iter().enumerate() {
                            out.put(p, &t.as_bytes()[k * rb..(k + 1) * rb])?;
                        }
                    }
                    Route::Remote => {}
                }
                written.fetch_add(g.ids.len() as u64, Ordering::Relaxed);
                Ok(())
            },
            |r, range, got| {
                let Received::Dense(rows) = got else { return Err(self.peer_error(r, "sent ragged rows".into(), false)) };
                for (&p, row) in groups[r].pos[range.clone()].iter().zip(rows.as_slice().chunks_exact(rb.max(1))) {
                    out.put(p, row)?;
                }
                written.fetch_add(range.len() as u64, Ordering::Relaxed);
                Ok(())
            },
        )?;
        let n: usize = groups.iter().map(|g| g.ids.len()).sum();
        if written.load(Ordering::Relaxed) != n as u64 {
            return Err(Error::invalid("gather", format!("{} of {n} rows of '{}' arrived", written.load(Ordering::Relaxed), self.var.name)));
        }
        Ok(())
    }

    /// Ragged records of `groups`, packed in the order of their positions.
    pub(super) fn gather_ragged(&self, groups: &[Group], n: usize, ndim: usize, allocator: &Allocator, options: &ReadOptions) -> Result<Batch> {
        let mut local: Vec<(usize, Batch)> = Vec::new();
        let mut remote: Vec<(usize, std::ops::Range<usize>, Received)> = Vec::new();
        self.run(
            groups,
            |r, route, g| {
                let source: &Arc<dyn RecordSource> = match route {
                    Route::Local { source, .. } => source,
                    _ => return Err(Error::WrongKind { path: self.var.name.clone().into(), expected: "ragged", found: "dense" }),
                };
                local.push((r, source.gather(Ids::List(&g.ids), allocator, options)?));
                Ok(())
            },
            |r, range, got| {
                remote.push((r, range, got));
                Ok(())
            },
        )?;
        let dtype = self.var.dtype;
        let mut slots: Vec<Option<TensorView<'_>>> = (0..n).map(|_| None).collect();
        for (r, b) in &local {
            let rb = b.as_ragged().ok_or_else(|| Error::WrongKind { path: self.var.name.clone().into(), expected: "ragged", found: "dense" })?;
            let (cu, shapes, values) = (rb.cu_seqlens_slice(), rb.shapes_slice(), rb.values().as_bytes());
            for (k, &p) in groups[*r].pos.iter().enumerate() {
                let (a, z) = (cu[k] as usize * dtype.size(), cu[k + 1] as usize * dtype.size());
                let shape = shapes[k * ndim..(k + 1) * ndim].iter().map(|&d| d as usize).collect();
                slots[p] = Some(TensorView::new(&values[a..z], dtype, shape));
            }
        }
        for (r, range, got) in &remote {
            let Received::Ragged(data, shape_col) = got else { return Err(self.peer_error(*r, "sent dense rows".into(), false)) };
            let shapes = flight::shape_values(shape_col).ok_or_else(|| self.peer_error(*r, "malformed shape column".into(), false))?;
            if shape_col.value_length() as usize != ndim || shapes.len() != data.len() * ndim {
                return Err(self.peer_error(*r, format!("shapes of {} dims, {ndim} expected", shape_col.value_length()), false));
            }
            for k in 0..data.len() {
                let shape = shapes[k * ndim..(k + 1) * ndim].iter().map(|&d| d as usize).collect();
                slots[groups[*r].pos[range.start + k]] = Some(TensorView::new(data.value(k), dtype, shape));
            }
        }
        let views: Vec<TensorView<'_>> = slots.into_iter().enumerate().map(|(k, s)| s.ok_or_else(|| Error::invalid("gather", format!("row {k} of '{}' never arrived", self.var.name)))).collect::<Result<_>>()?;
        Ok(Batch::Ragged(RaggedBatch::pack(allocator, dtype, ndim, views.iter())?))
    }

    /// Group `ids` by owning rank (validated against the length first).
    pub(super) fn groups(&self, ids: &Ids<'_>) -> Result<Vec<Group>> {
        ids.validate(self.len(), Path::new(&self.var.name))?;
        let mut groups: Vec<Group> = (0..self.var.metas.len()).map(|_| Group::default()).collect();
        for k in 0..ids.len() {
            let (r, local) = self.owner(ids.get(k));
            groups[r].ids.push(local);
            groups[r].pos.push(k);
        }
        let c = &self.var.counters;
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.rows.fetch_add(ids.len() as u64, Ordering::Relaxed);
        Ok(groups)
    }

    /// Retry once after a peer failure if the rank restarted (a new endpoint published).
    pub(super) fn retrying<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        match f() {
            Err(Error::Peer { rank, .. }) if self.reader.refresh(rank)? => f(),
            other => other,
        }
    }

    /// Dense rows `ids` straight into `len` bytes at `dst` (no intermediate batch).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes for the duration of the call, and not
    /// read or written by anyone else meanwhile.
    pub unsafe fn gather_into(&self, ids: Ids<'_>, dst: *mut u8, len: usize, options: &ReadOptions) -> Result<()> {
        let rb = self.row_bytes();
        if !matches!(self.var.layout, Layout::Dense { .. }) {
            return Err(Error::WrongKind { path: self.var.name.clone().into(), expected: "dense", found: "ragged" });
        }
        if ids.len().checked_mul(rb) != Some(len) {
            return Err(Error::ShapeMismatch { expected: format!("{} bytes for {} rows of {rb} bytes", ids.len().saturating_mul(rb), ids.len()), found: format!("{len} bytes") });
        }
        let groups = self.groups(&ids)?;
        if len == 0 {
            // No bytes to move (no ids, or records of zero elements): nothing to ask anyone.
            return Ok(());
        }
        let out = Out { ptr: dst, len, row: rb };
        self.retrying(|| self.gather_dense(&groups, &out, options))?;
        self.var.counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Destination of a dense gather: `len` bytes at `ptr`, written one row at a time.
pub(crate) struct Out {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) row: usize,
}

// SAFETY: an `Out` is only shared while rows are written to distinct positions (every id of a
// gather has its own position), so no two threads write the same bytes.
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

impl Out {
    /// `len` bytes at `ptr` in rows of `row` bytes.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes while the `Out` is used, and not read or
    /// written by anyone else meanwhile.
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize, row: usize) -> Out {
        Out { ptr, len, row }
    }

    /// Row `pos` of the destination, `row` bytes, bounds-checked.
    pub(crate) fn row_ptr(&self, pos: usize) -> Result<*mut u8> {
        match pos.checked_add(1).and_then(|e| e.checked_mul(self.row)) {
            Some(end) if end <= self.len => Ok(self.ptr.wrapping_add(pos * self.row)),
            _ => Err(Error::invalid("gather", format!("row {pos} lies outside the {}-byte destination", self.len))),
        }
    }

    /// Bytes per row.
    pub(crate) fn row(&self) -> usize {
        self.row
    }

    pub(super) fn put(&self, pos: usize, src: &[u8]) -> Result<()> {
        if src.len() != self.row {
            return Err(Error::invalid("gather", format!("a row of {} bytes, {} expected", src.len(), self.row)));
        }
        let dst = self.row_ptr(pos)?;
        // SAFETY: `dst..dst + row` lies in the destination (checked); the source is a separate
        // buffer (a received or gathered batch, never the destination).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, self.row) };
        Ok(())
    }
}

impl RecordSource for DistSource {
    fn name(&self) -> String {
        format!("distributed variable '{}'", self.var.name)
    }

    fn len(&self) -> u64 {
        self.var.starts[self.var.starts.len() - 1]
    }

    fn record_type(&self) -> crate::store::RecordType {
        crate::store::RecordType { dtype: self.var.dtype, layout: self.var.layout.clone(), logical: self.var.logical }
    }

    fn gather(&self, ids: Ids<'_>, allocator: &Allocator, options: &ReadOptions) -> Result<Batch> {
        let n = ids.len();
        let b = match &self.var.layout {
            Layout::Dense { item_shape } => {
                let bytes = n.checked_mul(self.row_bytes()).ok_or_else(|| Error::invalid("ids", format!("{n} rows overflow")))?;
                let mut alloc = allocator.allocate(bytes)?;
                let dst = alloc.as_uninit_mut().as_mut_ptr().cast::<u8>();
                // SAFETY: `dst` is the fresh allocation's `bytes` writable bytes, ours alone.
                unsafe { self.gather_into(ids, dst, bytes, options)? };
                let mut shape = vec![n];
                shape.extend_from_slice(item_shape);
                // SAFETY: gather_into wrote every row (it fails unless all `n` rows arrived).
                return Ok(Batch::Dense(unsafe { Tensor::from_initialized(Arc::new(alloc), 0, self.var.dtype, shape) }));
            }
            Layout::Ragged { ndim } => {
                let groups = self.groups(&ids)?;
                let mut owners = groups.iter().enumerate().filter(|(_, g)| !g.ids.is_empty());
                let single = match (owners.next(), owners.next()) {
                    (Some((r, g)), None) => Some((r, g)),
                    _ => None,
                };
                let route = single.map(|(r, _)| self.var.routes.read().map(|routes| routes[r].clone())).transpose().map_err(lock_err)?;
                match (single, route.as_deref()) {
                    // One owner read in place: its batch is already in the order of `ids`.
                    (Some((r, g)), Some(Route::Local { source, owner })) => {
                        if owner.as_ref().is_some_and(|o| o.exited()) {
                            return Err(self.peer_error(r, "the rank's process exited".into(), false));
                        }
                        source.gather(Ids::List(&g.ids), allocator, options)?
                    }
                    _ => self.retrying(|| self.gather_ragged(&groups, n, *ndim, allocator, options))?,
                }
            }
        };
        self.var.counters.bytes.fetch_add(b.nbytes() as u64, Ordering::Relaxed);
        Ok(b)
    }
}
