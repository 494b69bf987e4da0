//! The streaming pipeline: samples pushed as lists or (infinite) iterators are pulled lazily,
//! assembled into a bounded ring of pooled output slots on a background thread, and popped
//! in order. Errors are sticky; `close` returns promptly with work queued.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{Allocation, Allocator, Tensor};
use crate::zarr::assemble::{Assembler, CacheLimits, Limits, Stats};
use crate::zarr::select::Query;

/// The batches a pipeline makes: `samples` samples of `shape`, cast to `dtype`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSpec {
    /// Samples per batch.
    pub samples: usize,
    /// Shape of every sample.
    pub shape: Vec<usize>,
    /// Output element type.
    pub dtype: DType,
}

impl BatchSpec {
    /// Bytes of one batch.
    pub fn batch_bytes(&self) -> Result<usize> {
        let mut n = self.samples;
        for &d in &self.shape {
            n = n.checked_mul(d).ok_or_else(|| Error::invalid("BatchSpec", format!("{:?} x {} overflows", self.shape, self.samples)))?;
        }
        n.checked_mul(self.dtype.size()).ok_or_else(|| Error::invalid("BatchSpec", "batch size overflows"))
    }
}

/// Queue depths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// Samples pulled (and their arrays opened) ahead of the batch being assembled.
    pub lookahead_samples: usize,
    /// Output slots: batches assembled ahead of the consumer (including popped batches not yet
    /// released).
    pub prepared_batches: usize,
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits { lookahead_samples: 64, prepared_batches: 2 }
    }
}

/// A lazily pulled source of samples.
pub type QueryIter = Box<dyn Iterator<Item = Result<Query>> + Send>;

/// One assembled batch: `[n, *shape]` in a pipeline slot. The slot is reused once this and
/// every tensor shared from it are dropped.
#[derive(Debug)]
pub struct PipelineBatch {
    /// The batch.
    pub tensor: Tensor,
    /// Batch sequence number (0, 1, ...).
    pub index: u64,
}

struct State {
    inputs: VecDeque<QueryIter>,
    finished: bool,
    closed: bool,
    busy: bool,
    pending: usize,
    ready: VecDeque<PipelineBatch>,
    error: Option<Arc<Error>>,
    /// Since when the worker has waited for a slot (every slot held by unreleased batches).
    starved_since: Option<Instant>,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The pipeline (see the module docs).
pub struct Pipeline {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
    spec: BatchSpec,
    assembler: Arc<Assembler>,
    slots: usize,
}

/// How long `pop` waits on a worker starved of slots before it says so.
const STARVED_GRACE: Duration = Duration::from_millis(250);

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pipeline({:?})", self.spec)
    }
}

impl Pipeline {
    /// A pipeline; fails when the memory budget cannot hold `queues.prepared_batches` output
    /// slots plus the workers' read buffers and decode scratch.
    pub fn new(spec: BatchSpec, limits: Limits, queues: QueueLimits, cache: CacheLimits) -> Result<Pipeline> {
        if spec.samples == 0 || spec.samples > 1 << 20 {
            return Err(Error::invalid("BatchSpec.samples", format!("{} (1..=1048576)", spec.samples)));
        }
        if spec.shape.is_empty() || spec.shape.contains(&0) {
            return Err(Error::invalid("BatchSpec.shape", format!("{:?}: every axis must be positive", spec.shape)));
        }
        if queues.prepared_batches == 0 || queues.prepared_batches > 1024 {
            return Err(Error::invalid("prepared_batches", format!("{} (1..=1024)", queues.prepared_batches)));
        }
        if queues.lookahead_samples > 1 << 24 {
            return Err(Error::invalid("lookahead_samples", format!("{} is more than 16777216", queues.lookahead_samples)));
        }
        let batch = spec.batch_bytes()?;
        let need = batch
            .checked_mul(queues.prepared_batches)
            .and_then(|b| b.checked_add(limits.scratch_bytes()))
            .and_then(|b| b.checked_add(cache.chunk_bytes))
            .unwrap_or(usize::MAX);
        if need > limits.max_memory_bytes {
            return Err(Error::MemoryLimit { bytes: need, live: 0, max_bytes: limits.max_memory_bytes }.context(format!(
                "pipeline budget: {} output slot(s) of {batch} bytes + {} workers x ({} read + {} decode) bytes + {} bytes of chunk cache",
                queues.prepared_batches,
                limits.workers(),
                limits.max_read_bytes,
                limits.max_chunk_bytes,
                cache.chunk_bytes
            )));
        }
        let assembler = Arc::new(Assembler::new(limits, cache)?);
        let allocator = Allocator::cpu(0);
        let slots = (0..queues.prepared_batches).map(|_| allocator.allocate(batch).map(Arc::new)).collect::<Result<Vec<_>>>()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State { inputs: VecDeque::new(), finished: false, closed: false, busy: false, pending: 0, ready: VecDeque::new(), error: None, starved_since: None }),
            cv: Condvar::new(),
        });
        let worker = {
            let (shared, assembler, spec) = (shared.clone(), assembler.clone(), spec.clone());
            std::thread::Builder::new()
                .name("zrecord-zarr-pipeline".into())
                .spawn(move || work(shared, assembler, spec, queues.lookahead_samples, slots))
                .map_err(|e| Error::io("zrecord-zarr-pipeline thread", e))?
        };
        Ok(Pipeline { shared, worker: Mutex::new(Some(worker)), spec, assembler, slots: queues.prepared_batches })
    }

    /// The batch spec.
    pub fn spec(&self) -> &BatchSpec {
        &self.spec
    }

    /// Queue `samples` (pulled lazily, after earlier pushes).
    pub fn push(&self, samples: QueryIter) -> Result<()> {
        let mut st = self.shared.lock();
        if st.closed {
            return Err(Error::Closed { what: "pipeline" });
        }
        if st.finished {
            return Err(Error::invalid("push", "the pipeline was finished; no more samples can be pushed"));
        }
        st.inputs.push_back(samples);
        self.shared.cv.notify_all();
        Ok(())
    }

    /// No more pushes: a tail shorter than a batch becomes a last, shorter batch.
    pub fn finish(&self) {
        self.shared.lock().finished = true;
        self.shared.cv.notify_all();
    }

    /// The next batch, waiting up to `timeout` (forever when `None`). Errors: the pipeline's
    /// sticky error, [`Error::Closed`], a timeout, or nothing left to make.
    pub fn pop(&self, timeout: Option<Duration>) -> Result<PipelineBatch> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = self.shared.lock();
        loop {
            if let Some(b) = st.ready.pop_front() {
                self.shared.cv.notify_all();
                return Ok(b);
            }
            if let Some(e) = &st.error {
                return Err(Error::Shared(e.clone()));
            }
            if st.closed {
                return Err(Error::Closed { what: "pipeline" });
            }
            if st.starved_since.is_some_and(|t| t.elapsed() > STARVED_GRACE) {
                return Err(Error::invalid(
                    "pop",
                    format!("all {} output slots are held by batches that were not released (release each batch, or let its arrays go, before popping more)", self.slots),
                ));
            }
            if !st.busy && st.inputs.is_empty() {
                if st.pending == 0 {
                    return Err(Error::invalid("pop", "no samples pending: push samples before pop"));
                }
                if !st.finished && st.pending < self.spec.samples {
                    return Err(Error::invalid(
                        "pop",
                        format!("{} samples pending, fewer than a batch of {}: push more, or finish() to emit them as a shorter last batch", st.pending, self.spec.samples),
                    ));
                }
            }
            st = match deadline {
                None => self.shared.cv.wait_timeout(st, STARVED_GRACE).unwrap_or_else(|p| p.into_inner()).0,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(Error::Timeout { what: format!("pop: no batch within {:?}", timeout.unwrap_or_default()) });
                    }
                    self.shared.cv.wait_timeout(st, (d - now).min(STARVED_GRACE)).unwrap_or_else(|p| p.into_inner()).0
                }
            };
        }
    }

    /// Tell the pipeline a popped batch was released (wakes the worker at once instead of at
    /// its next poll).
    pub fn notify_released(&self) {
        let mut st = self.shared.lock();
        // The worker re-marks itself starved if the freed slot is still shared elsewhere.
        st.starved_since = None;
        drop(st);
        self.shared.cv.notify_all();
    }

    /// Stop: queued samples are dropped, the worker finishes at most the batch in hand.
    pub fn close(&self) {
        {
            let mut st = self.shared.lock();
            st.closed = true;
            st.inputs.clear();
            st.ready.clear();
            self.shared.cv.notify_all();
        }
        let handle = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// True after `close`.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }

    /// Per-stage statistics.
    pub fn stats(&self) -> Stats {
        self.assembler.stats()
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.close();
    }
}

/// A slot is free when only the worker holds it.
fn free_slot(slots: &mut [Arc<Allocation>]) -> Option<usize> {
    slots.iter_mut().position(|s| Arc::get_mut(s).is_some())
}

fn work(shared: Arc<Shared>, assembler: Arc<Assembler>, spec: BatchSpec, lookahead: usize, mut slots: Vec<Arc<Allocation>>) {
    let mut buffer: VecDeque<Query> = VecDeque::new();
    let mut index = 0u64;
    let fail = |e: Error| {
        let mut st = shared.lock();
        if st.error.is_none() {
            st.error = Some(Arc::new(e));
        }
        st.busy = false;
        shared.cv.notify_all();
    };
    loop {
        // Pull samples: a batch's worth plus the lookahead, as far as inputs have them.
        let want = spec.samples + lookahead;
        loop {
            if buffer.len() >= want {
                break;
            }
            let input = {
                let mut st = shared.lock();
                loop {
                    if st.closed {
                        return;
                    }
                    if let Some(it) = st.inputs.pop_front() {
                        st.busy = true;
                        break Some(it);
                    }
                    st.busy = false;
                    st.pending = buffer.len();
                    if buffer.len() >= spec.samples || (st.finished && !buffer.is_empty()) {
                        break None;
                    }
                    shared.cv.notify_all();
                    st = shared.cv.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            let Some(mut it) = input else { break };
            // Pull without the lock (a Python generator takes the GIL).
            let mut exhausted = false;
            while buffer.len() < want {
                match it.next() {
                    Some(Ok(q)) => buffer.push_back(q),
                    Some(Err(e)) => return fail(e.context(format!("pulling sample {}", index * spec.samples as u64 + buffer.len() as u64))),
                    None => {
                        exhausted = true;
                        break;
                    }
                }
            }
            let mut st = shared.lock();
            if !exhausted && !st.closed {
                st.inputs.push_front(it);
            }
            st.pending = buffer.len();
        }
        // Warm the metadata of the lookahead samples (errors surface when they are assembled).
        for q in buffer.iter().skip(spec.samples) {
            let _ = assembler.array(&q.uri, q.level);
        }
        // A free slot.
        let slot = loop {
            {
                let mut st = shared.lock();
                if st.closed {
                    return;
                }
                st.busy = true;
            }
            if let Some(i) = free_slot(&mut slots) {
                shared.lock().starved_since = None;
                break i;
            }
            let mut st = shared.lock();
            if st.starved_since.is_none() {
                st.starved_since = Some(Instant::now());
            }
            let _ = shared.cv.wait_timeout(st, Duration::from_millis(1));
        };
        let n = buffer.len().min(spec.samples);
        let batch: Vec<Query> = buffer.drain(..n).collect();
        let result = match Arc::get_mut(&mut slots[slot]) {
            Some(alloc) => assembler.assemble_into(&batch, spec.dtype, &spec.shape, alloc),
            None => Err(Error::invalid("slot", "a pipeline slot was taken while assembling")),
        };
        match result {
            Ok(shape) => {
                // SAFETY: `assemble_into` wrote every element of the batch's bytes; the slot is
                // written again only once every tensor sharing it is gone (`free_slot`).
                let tensor = unsafe { Tensor::from_initialized(slots[slot].clone(), 0, spec.dtype, shape) };
                let mut st = shared.lock();
                if st.closed {
                    return;
                }
                st.ready.push_back(PipelineBatch { tensor, index });
                st.pending = buffer.len();
                index += 1;
                shared.cv.notify_all();
            }
            Err(e) => return fail(e.context(format!("batch {index}"))),
        }
    }
}
