//! The loader: each step draws one global batch, keeps this rank's slice, splits it into
//! contiguous per-position slices, gathers every stream of a position with the same slice, and
//! hands the position batches to a transform. Worker threads claim steps in order, at most
//! `workers + prefetch` steps are in flight beyond what the consumer holds, and a reorder
//! buffer delivers in step order whatever the worker count, so runs are reproducible and a
//! resume is one integer.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::error::{catch_panic, Error, Result};
use crate::loader::mixture::Mixture;
use crate::loader::plan::ShardStream;
use crate::loader::sampler::Sampler;
use crate::memory::Allocator;
use crate::store::{Batch, SourceView};

/// What one placement position receives at one step: its contiguous slice of this rank's
/// part of the global batch, gathered from every stream. (Named for the position, not "shard":
/// in zrecord a shard is a data file of a store.)
#[derive(Clone, Debug)]
pub struct PositionBatch {
    /// The sampler step.
    pub step: u64,
    /// The placement position (index into each stream's views).
    pub position: usize,
    /// The ids gathered (this position's contiguous slice of the global batch).
    pub ids: Vec<u64>,
    /// `(stream name, batch)` in stream order.
    pub values: Vec<(String, Batch)>,
}

/// Where ids come from: the stateless sampler, or any draw function (called in step order).
pub enum IdSource {
    /// Stateless: batch `s` computed directly.
    Stateless(Sampler),
    /// A stateful draw (e.g. a user's Python sampler), serialised in step order.
    Draw(Box<dyn FnMut() -> Result<Vec<u64>> + Send>),
    /// One shard of an epoch plan (stateless like the sampler): step `k` is the shard's `k`-th
    /// batch, running on into later epochs. The plan already dealt ranks and workers, so the
    /// loader takes it with `world_size` 1 and one view position; the last batch of an epoch
    /// may be partial.
    Plan(ShardStream),
    /// A weighted mixture of sources (stateless): step `s`'s ids in the id space of the
    /// sources concatenated (each stream a `ConcatSource` over the sources' views, in order).
    Mixture(Mixture),
}

/// The id source as the workers share it: only a stateful draw needs a lock.
enum Ids {
    Stateless(Sampler),
    Plan(ShardStream),
    Mixture(Mixture),
    Draw(Mutex<Box<dyn FnMut() -> Result<Vec<u64>> + Send>>),
}

/// The most worker threads a loader starts.
pub const MAX_WORKERS: usize = 256;
/// The most finished batches a loader keeps ready beyond those being produced.
pub const MAX_PREFETCH: usize = 1024;

/// Loader options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoaderOptions {
    /// Worker threads; 0 runs everything in the caller.
    pub workers: usize,
    /// Results that may wait ready beyond the ones being produced (>= 1).
    pub prefetch: usize,
    /// This process's rank in a data-parallel job.
    pub rank: usize,
    /// Processes in the job; each gathers only its slice of every global batch.
    pub world_size: usize,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions { workers: 4, prefetch: 4, rank: 0, world_size: 1 }
    }
}

type Transform<T> = dyn Fn(u64, Vec<PositionBatch>) -> T + Send + Sync;

struct State<T> {
    /// Bumped by every reposition: results claimed under an older generation are dropped.
    generation: u64,
    next_claim: u64,
    next_deliver: u64,
    ready: BTreeMap<u64, Result<T>>,
    closed: bool,
}

struct Shared<T> {
    streams: Vec<(String, Vec<SourceView>)>,
    global_batch: usize,
    options: LoaderOptions,
    transform: Box<Transform<T>>,
    ids: Ids,
    state: Mutex<State<T>>,
    cv: Condvar,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The global batch of `step`. Stateless samplers compute it without locking; a draw source
    /// is called under its lock, which callers take in step order.
    fn draw(&self, step: u64) -> Result<Vec<u64>> {
        let ids = match &self.ids {
            Ids::Stateless(s) => s.batch(step),
            Ids::Plan(p) => {
                let mut ids = Vec::new();
                p.fill(step, &mut ids)?;
                return Ok(ids);
            }
            Ids::Mixture(m) => {
                let mut ids = Vec::new();
                m.fill(step, &mut ids)?;
                ids
            }
            Ids::Draw(f) => (f.lock().unwrap_or_else(|p| p.into_inner()))()?,
        };
        if ids.len() != self.global_batch {
            return Err(Error::invalid("sampler", format!("drew {} ids, the loader was built for batches of {}", ids.len(), self.global_batch)));
        }
        Ok(ids)
    }

    fn stateless(&self) -> bool {
        matches!(self.ids, Ids::Stateless(_) | Ids::Plan(_) | Ids::Mixture(_))
    }

    /// Gather this rank's position batches of `step` from its global batch.
    fn produce(&self, step: u64, global: Vec<u64>) -> Result<T> {
        // A plan's batch is this rank's whole (and may be short at an epoch's end).
        let per_rank = if matches!(self.ids, Ids::Plan(_)) { global.len() } else { self.global_batch / self.options.world_size };
        let mine = &global[self.options.rank * per_rank..(self.options.rank + 1) * per_rank];
        let positions = self.streams[0].1.len();
        let per_pos = per_rank / positions;
        let mut parts = Vec::with_capacity(positions);
        for p in 0..positions {
            let ids = &mine[p * per_pos..(p + 1) * per_pos];
            let mut values = Vec::with_capacity(self.streams.len());
            for (name, views) in &self.streams {
                values.push((name.clone(), views[p].gather(ids)?));
            }
            parts.push(PositionBatch { step, position: p, ids: ids.to_vec(), values });
        }
        if self.options.workers > 0 {
            self.keep_regions_pooled(&parts);
        }
        let _guard = InTransform::enter(self as *const Self as usize);
        Ok((self.transform)(step, parts))
    }

    /// With workers, up to `workers + prefetch` steps are in flight and the consumer may still
    /// hold two more (the one it works on and the one before it): ask each allocator to keep
    /// that many steps' regions pooled, so that they are reused rather than freed and faulted in
    /// again whenever the consumer catches up (see [`Allocator::keep_idle_at_least`]).
    fn keep_regions_pooled(&self, parts: &[PositionBatch]) {
        let steps = self.options.workers + self.options.prefetch + 2;
        // Streams usually share one allocator: a short list, not a map.
        let mut per: Vec<(&Allocator, usize)> = Vec::new();
        for part in parts {
            for ((_, batch), (_, views)) in part.values.iter().zip(&self.streams) {
                let alloc = views[part.position].allocator();
                let region = match batch {
                    Batch::Dense(t) => t.allocation().capacity(),
                    Batch::Ragged(r) => r.values().allocation().capacity(),
                };
                match per.iter_mut().find(|(a, _)| a.id() == alloc.id()) {
                    Some((_, bytes)) => *bytes += region,
                    None => per.push((alloc, region)),
                }
            }
        }
        for (alloc, bytes) in per {
            alloc.keep_idle_at_least(bytes.saturating_mul(steps));
        }
    }

    fn worker(self: Arc<Self>) {
        let window = (self.options.workers + self.options.prefetch) as u64;
        let stateless = self.stateless();
        loop {
            let (step, drawn, generation) = {
                let mut st = self.lock();
                while !st.closed && st.next_claim >= st.next_deliver + window {
                    st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                if st.closed {
                    return;
                }
                let s = st.next_claim;
                st.next_claim += 1;
                // A stateful source must be drawn in step order: draw while claiming.
                let drawn = if stateless { None } else { Some(catch_panic("loader sampler", s, || self.draw(s))) };
                (s, drawn, st.generation)
            };
            // A panic (in the transform, a custom sampler, or a bug of ours) becomes this step's
            // error: a worker that died silently would leave the consumer waiting forever.
            let result = catch_panic("loader worker", step, || match drawn {
                Some(ids) => ids.and_then(|ids| self.produce(step, ids)),
                None => self.draw(step).and_then(|ids| self.produce(step, ids)),
            });
            let mut st = self.lock();
            if st.closed {
                return;
            }
            if st.generation != generation {
                // Repositioned while this step was produced: the result belongs to no one.
                continue;
            }
            st.ready.insert(step, result);
            self.cv.notify_all();
        }
    }
}

/// A deterministic, resumable loader over aligned named streams.
pub struct Loader<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    threads: Vec<JoinHandle<()>>,
}

impl Loader<Vec<PositionBatch>> {
    /// A loader yielding the position batches of each step.
    pub fn new(streams: Vec<(String, Vec<SourceView>)>, sampler: Sampler, options: LoaderOptions) -> Result<Self> {
        Loader::with_transform(streams, IdSource::Stateless(sampler), options, |_, parts| parts)
    }
}

impl<T: Send + 'static> Loader<T> {
    /// A loader whose steps are `transform(step, parts)`.
    pub fn with_transform(
        streams: Vec<(String, Vec<SourceView>)>,
        ids: IdSource,
        options: LoaderOptions,
        transform: impl Fn(u64, Vec<PositionBatch>) -> T + Send + Sync + 'static,
    ) -> Result<Self> {
        let global_batch = match &ids {
            IdSource::Stateless(s) => s.batch_size(),
            IdSource::Plan(p) => p.batch_size(),
            IdSource::Mixture(m) => m.batch_size(),
            IdSource::Draw(_) => 0,
        };
        Self::build(streams, ids, global_batch, options, Box::new(transform))
    }

    /// A loader over a stateful id source that yields `batch_size` ids per draw.
    pub fn with_draw(
        streams: Vec<(String, Vec<SourceView>)>,
        draw: Box<dyn FnMut() -> Result<Vec<u64>> + Send>,
        batch_size: usize,
        options: LoaderOptions,
        transform: impl Fn(u64, Vec<PositionBatch>) -> T + Send + Sync + 'static,
    ) -> Result<Self> {
        Self::build(streams, IdSource::Draw(draw), batch_size, options, Box::new(transform))
    }

    fn build(
        streams: Vec<(String, Vec<SourceView>)>,
        ids: IdSource,
        global_batch: usize,
        options: LoaderOptions,
        transform: Box<Transform<T>>,
    ) -> Result<Self> {
        if streams.is_empty() {
            return Err(Error::invalid("streams", "at least one named stream is needed"));
        }
        let positions = streams[0].1.len();
        let mut len = None;
        for (name, views) in &streams {
            if views.is_empty() {
                return Err(Error::invalid("streams", format!("stream '{name}' has no views")));
            }
            if views.len() != positions {
                return Err(Error::invalid("streams", format!("stream '{name}' has {} views, '{}' has {positions}; every stream needs one view per position", views.len(), streams[0].0)));
            }
            for v in views {
                match len {
                    None => len = Some(v.len()),
                    Some(l) if l != v.len() => {
                        return Err(Error::invalid("streams", format!("stream '{name}' has a view of {} records, others have {l}; aligned streams need equal lengths", v.len())))
                    }
                    _ => {}
                }
            }
        }
        if options.prefetch == 0 {
            return Err(Error::invalid("prefetch", "must be at least 1"));
        }
        if options.prefetch > MAX_PREFETCH {
            return Err(Error::invalid("prefetch", format!("{} exceeds the limit of {MAX_PREFETCH} batches in flight", options.prefetch)));
        }
        if options.workers > MAX_WORKERS {
            return Err(Error::invalid("workers", format!("{} exceeds the limit of {MAX_WORKERS} worker threads", options.workers)));
        }
        if global_batch > crate::loader::sampler::MAX_BATCH_SIZE {
            return Err(Error::invalid(
                "batch_size",
                format!("{global_batch} exceeds the largest batch a loader draws ({} ids)", crate::loader::sampler::MAX_BATCH_SIZE),
            ));
        }
        if options.world_size == 0 || options.rank >= options.world_size {
            return Err(Error::invalid("rank", format!("rank {} is not in 0..{}", options.rank, options.world_size)));
        }
        let parts = options.world_size.checked_mul(positions).filter(|&p| p <= global_batch.max(1));
        if global_batch == 0 || parts.is_none_or(|p| !global_batch.is_multiple_of(p)) {
            return Err(Error::invalid(
                "batch_size",
                format!("the global batch of {global_batch} must divide evenly by world_size {} x {positions} view positions", options.world_size),
            ));
        }
        if let (IdSource::Stateless(s), Some(l)) = (&ids, len) {
            if s.len() > l {
                return Err(Error::invalid("sampler", format!("the sampler draws from {} ids but the streams hold {l} records", s.len())));
            }
        }
        if let (IdSource::Mixture(m), Some(l)) = (&ids, len) {
            if m.len() > l {
                return Err(Error::invalid("mixture", format!("the mixture's sources hold {} records but the streams hold {l}", m.len())));
            }
        }
        if let IdSource::Plan(p) = &ids {
            if options.world_size != 1 || positions != 1 {
                return Err(Error::invalid("plan", "an epoch plan's shard is read with world_size 1 and one view position (the plan dealt ranks and workers already)"));
            }
            if let Some(l) = len {
                if p.records() > l {
                    return Err(Error::invalid("plan", format!("the plan covers {} records but the streams hold {l}", p.records())));
                }
            }
        }
        let mut streams = streams;
        if options.workers > 0 {
            // Parallelism comes from the workers (one batch each), not from within a gather.
            for (_, views) in &mut streams {
                for v in views.iter_mut() {
                    v.set_parallel(false);
                }
            }
        }
        let shared = Arc::new(Shared {
            streams,
            global_batch,
            options,
            transform,
            ids: match ids {
                IdSource::Stateless(s) => Ids::Stateless(s),
                IdSource::Plan(p) => Ids::Plan(p),
                IdSource::Mixture(m) => Ids::Mixture(m),
                IdSource::Draw(f) => Ids::Draw(Mutex::new(f)),
            },
            state: Mutex::new(State { generation: 0, next_claim: 0, next_deliver: 0, ready: BTreeMap::new(), closed: false }),
            cv: Condvar::new(),
        });
        let mut l = Loader { shared, threads: Vec::new() };
        l.start();
        Ok(l)
    }

    fn start(&mut self) {
        for i in 0..self.shared.options.workers {
            let s = self.shared.clone();
            let h = std::thread::Builder::new().name(format!("zrecord-loader-{i}")).spawn(move || s.worker());
            if let Ok(h) = h {
                self.threads.push(h);
            }
        }
    }

    fn stop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.closed = true;
            self.shared.cv.notify_all();
        }
        let me = std::thread::current().id();
        for h in self.threads.drain(..) {
            // A worker that ends up dropping its own loader (from its transform) must not wait
            // for itself: it exits on its own once the transform returns (closed is set).
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }

    /// A handle for reading the position and closing the loader from anywhere, its own
    /// transform included, without the `&mut` access that `next_step` holds.
    pub fn handle(&self) -> LoaderHandle {
        let shared: Arc<dyn HandleOps> = self.shared.clone();
        LoaderHandle { key: shared.key(), shared: Arc::downgrade(&shared) }
    }

    /// The next step's result, in step order. `None` after `close`.
    pub fn next_step(&mut self) -> Option<Result<T>> {
        if self.shared.options.workers == 0 || self.threads.is_empty() {
            let step = {
                let mut st = self.shared.lock();
                if st.closed {
                    return None;
                }
                let s = st.next_deliver;
                st.next_deliver += 1;
                st.next_claim = st.next_deliver;
                s
            };
            return Some(self.shared.draw(step).and_then(|ids| self.shared.produce(step, ids)));
        }
        let mut st = self.shared.lock();
        loop {
            if st.closed {
                return None;
            }
            let want = st.next_deliver;
            if let Some(r) = st.ready.remove(&want) {
                st.next_deliver += 1;
                self.shared.cv.notify_all();
                return Some(r);
            }
            st = self.shared.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The step the next delivered result belongs to: save it to resume.
    pub fn state(&self) -> u64 {
        self.shared.lock().next_deliver
    }

    /// Resume from `step` (stops and restarts the workers; nothing is repeated or skipped).
    /// Refused from inside this loader's own transform (the step being produced would be lost).
    pub fn seek(&mut self, step: u64) -> Result<()> {
        if InTransform::active(Arc::as_ptr(&self.shared) as usize) {
            return Err(Error::invalid("step", "a loader cannot be repositioned from inside its own transform"));
        }
        if !self.shared.stateless() {
            let st = self.shared.lock();
            if st.next_deliver != step {
                return Err(Error::invalid("step", "a custom sampler cannot be repositioned; seek it yourself and build a new loader"));
            }
            return Ok(());
        }
        let was_open = !self.shared.lock().closed;
        self.stop();
        {
            let mut st = self.shared.lock();
            st.ready.clear();
            st.generation += 1;
            st.next_claim = step;
            st.next_deliver = step;
            st.closed = !was_open;
        }
        if was_open {
            self.start();
        }
        Ok(())
    }

    /// Stop all workers promptly (also those blocked on a full window). Idempotent.
    pub fn close(&mut self) {
        self.stop();
        self.shared.lock().ready.clear();
    }

    /// True after `close`.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }

    /// Batches produced but not yet delivered (bounded by `workers + prefetch`).
    pub fn in_flight(&self) -> u64 {
        let st = self.shared.lock();
        st.next_claim - st.next_deliver
    }
}

/// Position and close access to a [`Loader`] (see [`Loader::handle`]). It does not keep the
/// loader alive: a transform may hold its own loader's handle without making a reference cycle
/// (once the loader is dropped the handle reports it closed).
pub struct LoaderHandle {
    shared: std::sync::Weak<dyn HandleOps>,
    /// The loader's identity for [`LoaderHandle::in_transform`].
    key: usize,
}

trait HandleOps: Send + Sync {
    fn state(&self) -> u64;
    fn signal_close(&self);
    fn closed(&self) -> bool;
    fn key(&self) -> usize;
}

impl<T: Send> HandleOps for Shared<T> {
    fn state(&self) -> u64 {
        self.lock().next_deliver
    }
    fn signal_close(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.ready.clear();
        self.cv.notify_all();
    }
    fn closed(&self) -> bool {
        self.lock().closed
    }
    fn key(&self) -> usize {
        self as *const Self as usize
    }
}

impl LoaderHandle {
    /// The step the next delivered result belongs to; `None` once the loader was dropped.
    pub fn state(&self) -> Option<u64> {
        self.shared.upgrade().map(|s| s.state())
    }

    /// Close without waiting for the workers: every waiting or later `next_step` returns
    /// `None` and workers exit after their current step. The owner joins them on drop.
    pub fn close(&self) {
        if let Some(s) = self.shared.upgrade() {
            s.signal_close();
        }
    }

    /// True once closed (or dropped).
    pub fn is_closed(&self) -> bool {
        self.shared.upgrade().is_none_or(|s| s.closed())
    }

    /// True while the calling thread runs this loader's transform.
    pub fn in_transform(&self) -> bool {
        InTransform::active(self.key)
    }

    /// Mark the calling thread as running this loader's transform until the guard drops: for
    /// a consumer that finishes a step its workers left unfinished (the same re-entry rules
    /// then apply as inside a worker).
    pub fn enter_transform(&self) -> TransformGuard {
        TransformGuard(InTransform::enter(self.key))
    }
}

/// See [`LoaderHandle::enter_transform`].
pub struct TransformGuard(#[allow(dead_code)] InTransform);

thread_local! {
    /// Loaders (by their shared state's address) whose transform this thread is running.
    static IN_TRANSFORM: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Marks the current thread as inside a loader's transform until dropped.
struct InTransform(usize);

impl InTransform {
    fn enter(key: usize) -> InTransform {
        IN_TRANSFORM.with(|v| v.borrow_mut().push(key));
        InTransform(key)
    }

    fn active(key: usize) -> bool {
        IN_TRANSFORM.with(|v| v.borrow().contains(&key))
    }
}

impl Drop for InTransform {
    fn drop(&mut self) {
        IN_TRANSFORM.with(|v| {
            let mut v = v.borrow_mut();
            if let Some(i) = v.iter().rposition(|&k| k == self.0) {
                v.remove(i);
            }
        });
    }
}

impl<T: Send + 'static> Iterator for Loader<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        self.next_step()
    }
}

impl<T: Send + 'static> Drop for Loader<T> {
    fn drop(&mut self) {
        self.stop();
    }
}
