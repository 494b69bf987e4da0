//! The loader: each step draws one global batch, keeps this rank's slice, splits it into
//! contiguous per-position slices, gathers every stream of a position with the same slice, and
//! hands the position batches to a transform. Worker threads claim steps in order, at most
//! `workers + prefetch` steps are in flight beyond what the consumer holds, and a reorder
//! buffer delivers in step order whatever the worker count, so runs are reproducible and a
//! resume is one integer.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::loader::sampler::Sampler;
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
}

/// The id source as the workers share it: only a stateful draw needs a lock.
enum Ids {
    Stateless(Sampler),
    Draw(Mutex<Box<dyn FnMut() -> Result<Vec<u64>> + Send>>),
}

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
            Ids::Draw(f) => (f.lock().unwrap_or_else(|p| p.into_inner()))()?,
        };
        if ids.len() != self.global_batch {
            return Err(Error::invalid("sampler", format!("drew {} ids, the loader was built for batches of {}", ids.len(), self.global_batch)));
        }
        Ok(ids)
    }

    fn stateless(&self) -> bool {
        matches!(self.ids, Ids::Stateless(_))
    }

    /// Gather this rank's position batches of `step` from its global batch.
    fn produce(&self, step: u64, global: Vec<u64>) -> Result<T> {
        let per_rank = self.global_batch / self.options.world_size;
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
        Ok((self.transform)(step, parts))
    }

    fn worker(self: Arc<Self>) {
        let window = (self.options.workers + self.options.prefetch) as u64;
        let stateless = self.stateless();
        loop {
            let (step, drawn) = {
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
                let drawn = if stateless { None } else { Some(self.draw(s)) };
                (s, drawn)
            };
            let result = match drawn {
                Some(ids) => ids.and_then(|ids| self.produce(step, ids)),
                None => self.draw(step).and_then(|ids| self.produce(step, ids)),
            };
            let mut st = self.lock();
            if st.closed {
                return;
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
        if options.world_size == 0 || options.rank >= options.world_size {
            return Err(Error::invalid("rank", format!("rank {} is not in 0..{}", options.rank, options.world_size)));
        }
        if global_batch == 0 || global_batch % (options.world_size * positions) != 0 {
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
                IdSource::Draw(f) => Ids::Draw(Mutex::new(f)),
            },
            state: Mutex::new(State { next_claim: 0, next_deliver: 0, ready: BTreeMap::new(), closed: false }),
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
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
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
    pub fn seek(&mut self, step: u64) -> Result<()> {
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
