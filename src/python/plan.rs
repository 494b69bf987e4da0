//! Training streams for Python: `EpochPlan`, its `Deal` to ranks x workers, one shard's
//! `ShardStream` (which `Loader` reads like a sampler), positions as plain dicts; `Mixture`;
//! `Packer`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::loader::{Deal, EpochPlan, Mixture, PackOptions, PackState, Packer, Position, ShardStream};
use crate::memory::{Allocator, Tensor};
use crate::python::errors::IntoPy;
use crate::python::loader::mode_arg;
use crate::python::memory::{PyAllocator, PyDLTensor};
use crate::python::source::{source_view_of, PySourceView};
use crate::store::{Batch, ConcatSource, Ids, SourceView};

/// `mode` as given, cyclic by default.
fn mode_or_cyclic(mode: Option<&Bound<'_, PyAny>>) -> PyResult<crate::loader::Mode> {
    mode.map(mode_arg).transpose().map(|m| m.unwrap_or(crate::loader::Mode::Cyclic))
}

/// Ids as a new NumPy uint64 array.
fn ids_array(py: Python<'_>, ids: Vec<u64>) -> PyResult<Bound<'_, PyAny>> {
    py.import("numpy")?.call_method1("array", (ids, "uint64"))
}

/// A position as Python sees it: `{"epoch": int, "done": int, "extra": [int, ...]}`.
pub(crate) fn position_dict<'py>(py: Python<'py>, p: &Position) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("epoch", p.epoch)?;
    d.set_item("done", p.done)?;
    d.set_item("extra", p.extra.clone())?;
    Ok(d)
}

/// Parse a position dict (from a checkpoint: untrusted); a plan checks its ranges.
pub(crate) fn position_arg(obj: &Bound<'_, PyAny>) -> PyResult<Position> {
    let bad = |why: String| PyValueError::new_err(format!("not an EpochPlan position ({why}): expected {{'epoch': int, 'done': int, 'extra': [int, ...]}}"));
    let d = obj.cast::<PyDict>().map_err(|_| bad(format!("got {}", obj.get_type().name().map(|n| n.to_string()).unwrap_or_default())))?;
    let field = |k: &str| -> PyResult<Bound<'_, PyAny>> { d.get_item(k)?.ok_or_else(|| bad(format!("no '{k}'"))) };
    let epoch: u64 = field("epoch")?.extract().map_err(|_| bad("'epoch' is not a non-negative int".into()))?;
    let done: u64 = field("done")?.extract().map_err(|_| bad("'done' is not a non-negative int".into()))?;
    let extra_obj = field("extra")?;
    let n = extra_obj.len().map_err(|_| bad("'extra' is not a list".into()))?;
    if n > crate::loader::MAX_EXTRA {
        return Err(bad(format!("{n} extra batches exceed {}", crate::loader::MAX_EXTRA)));
    }
    let extra: Vec<u64> = extra_obj.extract().map_err(|_| bad("'extra' is not a list of non-negative ints".into()))?;
    Ok(Position { epoch, done, extra })
}

/// An epoch of `n` records as base batches of `batch_size` ids (the last one partial unless
/// `drop_last`), defined without reference to ranks or workers: base batch `t` is positions
/// `[t*B, (t+1)*B)` of the epoch's order ("sequential" or "cyclic": a fresh permutation per
/// epoch) or, with "iid", the sampler's draw for it. `deal(ranks, workers, position)` hands the
/// batches an epoch still has to `ranks * workers` shards round robin; a position from
/// `Deal.position_after` continues the epoch on any other layout, no record twice, none skipped.
#[pyclass(name = "EpochPlan", module = "zrecord", frozen)]
pub struct PyEpochPlan {
    inner: EpochPlan,
}

#[pymethods]
impl PyEpochPlan {
    #[new]
    #[pyo3(signature = (n, batch_size, mode = None, seed = 0, drop_last = false))]
    fn new(n: u64, batch_size: usize, mode: Option<&Bound<'_, PyAny>>, seed: u64, drop_last: bool) -> PyResult<Self> {
        let mode = mode_or_cyclic(mode)?;
        Ok(PyEpochPlan { inner: EpochPlan::new(n, batch_size, mode, seed, drop_last).py_err()? })
    }

    /// Records per epoch.
    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    /// Base batches per epoch.
    #[getter]
    fn batches(&self) -> u64 {
        self.inner.batches()
    }

    #[getter]
    fn batch_size(&self) -> usize {
        self.inner.batch_size()
    }

    #[getter]
    fn drop_last(&self) -> bool {
        self.inner.drop_last()
    }

    /// "sequential", "iid", "cyclic" or "block".
    #[getter]
    fn mode(&self) -> &'static str {
        crate::python::loader::mode_name(self.inner.mode())
    }

    /// The ids of base batch `t` of `epoch` (uint64 array).
    fn ids<'py>(&self, py: Python<'py>, epoch: u64, t: u64) -> PyResult<Bound<'py, PyAny>> {
        let mut out = Vec::new();
        self.inner.fill(epoch, t, &mut out).py_err()?;
        ids_array(py, out)
    }

    /// Deal the batches `position` has not consumed (default: all of epoch 0) to
    /// `ranks * workers` shards.
    #[pyo3(signature = (ranks = 1, workers = 1, position = None))]
    fn deal(&self, ranks: u64, workers: u64, position: Option<&Bound<'_, PyAny>>) -> PyResult<PyDeal> {
        let from = match position {
            Some(p) => position_arg(p)?,
            None => Position::default(),
        };
        Ok(PyDeal { inner: self.inner.deal(&from, ranks, workers).py_err()? })
    }

    fn __repr__(&self) -> String {
        format!(
            "EpochPlan({} records, {} batches of {}, {}, drop_last={})",
            self.inner.len(),
            self.inner.batches(),
            self.inner.batch_size(),
            crate::python::loader::mode_name(self.inner.mode()),
            if self.inner.drop_last() { "True" } else { "False" }
        )
    }
}

/// An epoch's remaining base batches dealt to `ranks x workers` shards: shard
/// `s = rank * workers + worker` reads the remaining batches `s, s + S, s + 2S, ...`.
#[pyclass(name = "Deal", module = "zrecord", frozen)]
pub struct PyDeal {
    inner: Deal,
}

#[pymethods]
impl PyDeal {
    #[getter]
    fn ranks(&self) -> u64 {
        self.inner.ranks()
    }

    #[getter]
    fn workers(&self) -> u64 {
        self.inner.workers()
    }

    /// The epoch this deal reads.
    #[getter]
    fn epoch(&self) -> u64 {
        self.inner.start().epoch
    }

    /// The position the deal starts from.
    #[getter]
    fn start<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        position_dict(py, self.inner.start())
    }

    /// Batches shard (`rank`, `worker`) reads in this epoch.
    fn shard_len(&self, rank: u64, worker: u64) -> PyResult<u64> {
        self.inner.shard_len(rank, worker).py_err()
    }

    /// Batches rank `rank` reads in this epoch (all its workers).
    fn rank_len(&self, rank: u64) -> PyResult<u64> {
        if rank >= self.inner.ranks() {
            return Err(PyValueError::new_err(format!("rank {rank} is outside the {} ranks of the deal", self.inner.ranks())));
        }
        Ok(self.inner.rank_len(rank))
    }

    /// The base batch shard (`rank`, `worker`) reads at its step `i`.
    fn shard_batch(&self, rank: u64, worker: u64, i: u64) -> PyResult<u64> {
        self.inner.shard_batch(rank, worker, i).py_err()
    }

    /// The ids shard (`rank`, `worker`) reads at its step `i` (uint64 array).
    fn ids<'py>(&self, py: Python<'py>, rank: u64, worker: u64, i: u64) -> PyResult<Bound<'py, PyAny>> {
        let mut out = Vec::new();
        self.inner.fill(rank, worker, i, &mut out).py_err()?;
        ids_array(py, out)
    }

    /// The position once rank `r` consumed `consumed[r]` batches (each rank's loader takes its
    /// workers round robin, as PyTorch's DataLoader does). A finished epoch gives the next
    /// epoch's start. Pass it to `EpochPlan.deal` on any layout to continue.
    fn position_after<'py>(&self, py: Python<'py>, consumed: Vec<u64>) -> PyResult<Bound<'py, PyDict>> {
        let p = self.inner.position_after(&consumed).py_err()?;
        position_dict(py, &p)
    }

    /// Shard (`rank`, `worker`)'s batches as an endless stream over epochs, for `Loader`.
    fn stream(&self, rank: u64, worker: u64) -> PyResult<PyShardStream> {
        Ok(PyShardStream { inner: ShardStream::new(&self.inner, rank, worker).py_err()? })
    }

    fn __repr__(&self) -> String {
        let s = self.inner.start();
        format!("Deal(epoch {}, {} ranks x {} workers, from batch {} + {} extra)", s.epoch, self.inner.ranks(), self.inner.workers(), s.done, s.extra.len())
    }
}

/// One shard's batches over epochs: the (resumed) epoch of its deal, then every later epoch
/// dealt afresh on the same layout. `Loader(streams, stream)` reads it like a sampler (step `k`
/// is the shard's `k`-th batch; the last batch of an epoch may be short).
#[pyclass(name = "ShardStream", module = "zrecord", frozen)]
pub struct PyShardStream {
    pub(crate) inner: ShardStream,
}

#[pymethods]
impl PyShardStream {
    /// Batches left in the deal's epoch.
    #[getter]
    fn first_len(&self) -> u64 {
        self.inner.first_len()
    }

    /// Batches in every later epoch.
    #[getter]
    fn epoch_len(&self) -> u64 {
        self.inner.epoch_len()
    }

    /// `(epoch, base batch)` of step `k`.
    fn locate(&self, k: u64) -> PyResult<(u64, u64)> {
        self.inner.locate(k).py_err()
    }

    /// The ids of step `k` (uint64 array).
    fn ids<'py>(&self, py: Python<'py>, k: u64) -> PyResult<Bound<'py, PyAny>> {
        let mut out = Vec::new();
        self.inner.fill(k, &mut out).py_err()?;
        ids_array(py, out)
    }
}

/// Mean elements per record of a ragged source (tokens per document): from the store's
/// statistics when it is one store, else from up to 4096 evenly spaced records (all of them
/// when there are fewer).
fn mean_elements(view: &SourceView) -> crate::error::Result<f64> {
    let src = view.source();
    let n = src.len();
    if let Some(store) = src.store() {
        if store.len() == n {
            let itemsize = src.dtype().size() as f64;
            return Ok(store.stats().raw_bytes as f64 / itemsize / n as f64);
        }
    }
    let k = n.min(4096);
    let ids: Vec<u64> = (0..k).map(|i| (i as u128 * n as u128 / k as u128) as u64).collect();
    match view.gather_ids(Ids::List(&ids))? {
        Batch::Ragged(r) => Ok(r.cu_seqlens_slice().last().copied().unwrap_or(0) as f64 / k as f64),
        Batch::Dense(_) => Err(crate::error::Error::invalid("by", "tokens are counted in a ragged stream; this one is dense")),
    }
}

/// Several datasets mixed in set proportions: `Mixture({name: (streams, weight)}, batch_size)`
/// where `streams` is one source's `{stream: view}` (the same stream names in every source) or
/// a single view. Every global batch of `batch_size` ids holds each source at its weight (by
/// records, or by tokens with `by="tokens"`: weights divided by each source's mean record
/// length in its ragged token stream), spread evenly: over any window the counts are within a
/// couple of records of the weights (a fixed low-discrepancy pattern, no drift). Each source
/// walks its own epochs in `mode`; `epochs(step)` reports them; `max_epochs` makes starting a
/// further epoch of any source an error naming it. Stateless: a step number is the whole
/// state. `Loader(mix.streams, mix, ...)` reads it (rank / world_size slicing and workers as
/// with a sampler).
#[pyclass(name = "Mixture", module = "zrecord", frozen)]
pub struct PyMixture {
    pub(crate) inner: Mixture,
    names: Vec<String>,
    streams: Vec<(String, SourceView)>,
}

fn source_streams(py: Python<'_>, name: &str, obj: &Bound<'_, PyAny>, allocator: &Allocator) -> PyResult<Vec<(String, SourceView)>> {
    let _ = py;
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut out = Vec::new();
        for (k, v) in d.iter() {
            let stream: String = k.extract().map_err(|_| PyTypeError::new_err(format!("source '{name}': stream names must be strings")))?;
            out.push((stream, source_view_of(&v, allocator, true)?));
        }
        if out.is_empty() {
            return Err(PyValueError::new_err(format!("source '{name}' has no streams")));
        }
        Ok(out)
    } else {
        Ok(vec![("data".to_string(), source_view_of(obj, allocator, true)?)])
    }
}

#[pymethods]
impl PyMixture {
    #[new]
    #[pyo3(signature = (sources, batch_size, mode = None, seed = 0, by = "records", max_epochs = None, tokens = None, allocator = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        sources: &Bound<'_, PyDict>,
        batch_size: usize,
        mode: Option<&Bound<'_, PyAny>>,
        seed: u64,
        by: &str,
        max_epochs: Option<u64>,
        tokens: Option<String>,
        allocator: Option<&PyAllocator>,
    ) -> PyResult<Self> {
        let mode = mode_or_cyclic(mode)?;
        if by != "records" && by != "tokens" {
            return Err(PyValueError::new_err(format!("by must be 'records' or 'tokens', got '{by}'")));
        }
        let alloc = allocator.map(|a| a.inner.clone()).unwrap_or_default();
        let mut names = Vec::new();
        let mut weights = Vec::new();
        let mut per_source: Vec<Vec<(String, SourceView)>> = Vec::new();
        for (k, v) in sources.iter() {
            let name: String = k.extract().map_err(|_| PyTypeError::new_err("source names must be strings"))?;
            let (streams, weight): (Bound<'_, PyAny>, f64) =
                v.extract().map_err(|_| PyTypeError::new_err(format!("source '{name}' must be a (streams, weight) pair")))?;
            per_source.push(source_streams(py, &name, &streams, &alloc)?);
            names.push(name);
            weights.push(weight);
        }
        let first = per_source.first().ok_or_else(|| PyValueError::new_err("a mixture needs at least one source"))?;
        let stream_names: Vec<String> = first.iter().map(|(s, _)| s.clone()).collect();
        let mut lens = Vec::with_capacity(per_source.len());
        for (name, streams) in names.iter().zip(&per_source) {
            let mine: Vec<&String> = streams.iter().map(|(s, _)| s).collect();
            if mine.len() != stream_names.len() || stream_names.iter().any(|s| !mine.contains(&s)) {
                return Err(PyValueError::new_err(format!("source '{name}' has streams {mine:?}; '{}' has {stream_names:?}: every source needs the same streams", names[0])));
            }
            let n = streams[0].1.len();
            if let Some((s, v)) = streams.iter().find(|(_, v)| v.len() != n) {
                return Err(PyValueError::new_err(format!("source '{name}': stream '{s}' holds {} records, '{}' {n}", v.len(), streams[0].0)));
            }
            lens.push(n);
        }
        if by == "tokens" {
            let ragged: Vec<&String> = first.iter().filter(|(_, v)| matches!(v.source().layout(), crate::store::Layout::Ragged { .. })).map(|(s, _)| s).collect();
            let stream = match (&tokens, ragged.as_slice()) {
                (Some(t), _) => t.clone(),
                (None, [one]) => (*one).clone(),
                (None, _) => return Err(PyValueError::new_err(format!("by='tokens' needs tokens=<stream name>: the ragged streams are {ragged:?}"))),
            };
            for (k, streams) in per_source.iter().enumerate() {
                let v = streams.iter().find(|(s, _)| *s == stream).map(|(_, v)| v.clone()).ok_or_else(|| PyValueError::new_err(format!("source '{}' has no stream '{stream}'", names[k])))?;
                let mean = py.detach(|| mean_elements(&v)).py_err()?;
                if mean <= 0.0 {
                    return Err(PyValueError::new_err(format!("source '{}': its '{stream}' records hold no tokens", names[k])));
                }
                weights[k] /= mean;
            }
        }
        let inner = Mixture::new(&lens, &weights, batch_size, mode, seed, max_epochs).py_err()?;
        let mut streams = Vec::new();
        for s in &stream_names {
            let parts: Vec<_> = per_source.iter().map(|src| src.iter().find(|(n, _)| n == s).map(|(_, v)| v.source().clone())).collect::<Option<Vec<_>>>().ok_or_else(|| PyValueError::new_err(format!("stream '{s}' is missing from a source")))?;
            let concat = ConcatSource::new(s.clone(), parts).map_err(|e| PyValueError::new_err(format!("stream '{s}': {e}")))?;
            streams.push((s.clone(), SourceView::new(std::sync::Arc::new(concat), &alloc)));
        }
        Ok(PyMixture { inner, names, streams })
    }

    /// `{stream: [SourceView]}` over all sources (ids as the mixture draws them), for `Loader`.
    #[getter]
    fn streams<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, view) in &self.streams {
            let v = Py::new(py, PySourceView::with_reduce(view.clone(), None).named(name.clone()))?;
            d.set_item(name, vec![v])?;
        }
        Ok(d)
    }

    /// Source names, in id order.
    #[getter]
    fn sources(&self) -> Vec<String> {
        self.names.clone()
    }

    /// Each source's share of the records of a batch (what the weights became).
    #[getter]
    fn shares<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (i, n) in self.names.iter().enumerate() {
            let (a, period) = self.inner.share(i);
            d.set_item(n, a as f64 / period as f64)?;
        }
        Ok(d)
    }

    #[getter]
    fn batch_size(&self) -> usize {
        self.inner.batch_size()
    }

    /// Records of all sources (ids are below this).
    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    /// The global ids of step `step` (uint64 array, in slot order).
    fn batch<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Bound<'py, PyAny>> {
        let mut out = Vec::new();
        self.inner.fill(step, &mut out).py_err()?;
        ids_array(py, out)
    }

    /// `{source: epoch}` at step `step` (before it is drawn).
    fn epochs<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (n, e) in self.names.iter().zip(self.inner.epochs(step)) {
            d.set_item(n, e)?;
        }
        Ok(d)
    }

    /// `{source: records drawn}` before step `step`.
    fn consumed<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (n, c) in self.names.iter().zip(self.inner.consumed(step)) {
            d.set_item(n, c)?;
        }
        Ok(d)
    }

    /// The source index of each global id (int64 array; `sources[k]` names it).
    fn source_of<'py>(&self, py: Python<'py>, ids: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let ids = crate::python::input::Imported::from_any(ids)?.index_ids(self.inner.len())?;
        let out: Vec<i64> = ids.iter().map(|&id| self.inner.source_of(id).map(|s| s as i64).unwrap_or(-1)).collect();
        py.import("numpy")?.call_method1("array", (out, "int64"))
    }

    /// The id where each source's records start (`source k` holds ids `starts[k]..`).
    #[getter]
    fn starts(&self) -> Vec<u64> {
        (0..self.inner.sources()).map(|i| self.inner.start(i)).collect()
    }

    fn __repr__(&self) -> String {
        let parts: Vec<String> = self
            .names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let (a, d) = self.inner.share(i);
                format!("{n}: {:.4}", a as f64 / d as f64)
            })
            .collect();
        format!("Mixture({{{}}}, batch_size={})", parts.join(", "), self.inner.batch_size())
    }
}

/// Sequence packing: the documents of a ragged token view (in the epoch order of `mode`,
/// this rank's share), or of a `Mixture` (its records slot by slot, from its ragged stream
/// `tokens`), packed into `[rows, seq_len]` windows, first fit within a window of
/// `lookahead` documents; a document longer than `seq_len` is cut into whole rows and its rest
/// waits (nothing is dropped). Each step gives `{"tokens", "position_ids", "document_ids",
/// "cu_seqlens", "efficiency"}`: DLTensors `[rows, seq_len]` (tokens in the source dtype, padding
/// `pad_id`; positions restart at each document; document ids -1 on padding), int32 segment
/// boundaries over the rows laid end to end (padding runs included), and the fraction of real
/// tokens. `state_dict()` / `load_state_dict()` resume exactly (cursor and window, no replay).
#[pyclass(name = "Packer", module = "zrecord")]
pub struct PyPacker {
    inner: std::sync::Mutex<Packer>,
    real: std::sync::atomic::AtomicU64,
    total: std::sync::atomic::AtomicU64,
}

fn state_dict<'py>(py: Python<'py>, s: &PackState) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("step", s.step)?;
    d.set_item("base", s.base)?;
    d.set_item("cursor", s.cursor)?;
    d.set_item("window", s.window.iter().map(|&(a, b)| vec![a, b]).collect::<Vec<_>>())?;
    d.set_item("rank", s.rank)?;
    d.set_item("world_size", s.world_size)?;
    Ok(d)
}

/// A `Packer.state_dict()` read back (checked; `base`, `rank` and `world_size` default to a
/// state of this packer's rank taken before they were recorded).
fn pack_state_of(state: &Bound<'_, PyAny>, rank: u64, world_size: u64) -> PyResult<PackState> {
    let bad = |why: &str| {
        PyValueError::new_err(format!(
            "not a Packer state ({why}): expected {{'step': int, 'base': int, 'cursor': int, 'window': [[int, int], ...], 'rank': int, 'world_size': int}}"
        ))
    };
    let d = state.cast::<PyDict>().map_err(|_| bad("not a dict"))?;
    let get = |k: &str| d.get_item(k).ok().flatten().ok_or_else(|| bad(&format!("no '{k}'")));
    let int = |k: &str, default: Option<u64>| -> PyResult<u64> {
        match (d.get_item(k).ok().flatten(), default) {
            (Some(v), _) => v.extract().map_err(|_| bad(&format!("'{k}' is not a non-negative int"))),
            (None, Some(x)) => Ok(x),
            (None, None) => Err(bad(&format!("no '{k}'"))),
        }
    };
    let w = get("window")?;
    if w.len().map_err(|_| bad("'window' is not a list"))? > crate::loader::MAX_LOOKAHEAD {
        return Err(bad("the window is longer than any lookahead"));
    }
    let window: Vec<[u64; 2]> = w.extract().map_err(|_| bad("'window' is not a list of [document, offset] pairs"))?;
    Ok(PackState {
        step: int("step", None)?,
        base: int("base", Some(0))?,
        cursor: int("cursor", None)?,
        window: window.into_iter().map(|[d, o]| (d, o)).collect(),
        rank: int("rank", Some(rank))?,
        world_size: int("world_size", Some(world_size))?,
    })
}

#[pymethods]
impl PyPacker {
    #[new]
    #[pyo3(signature = (view, seq_len, rows = 1, mode = None, seed = 0, lookahead = 64, pad_id = 0, rank = 0, world_size = 1, tokens = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        view: &Bound<'_, PyAny>,
        seq_len: usize,
        rows: usize,
        mode: Option<&Bound<'_, PyAny>>,
        seed: u64,
        lookahead: usize,
        pad_id: i64,
        rank: u64,
        world_size: u64,
        tokens: Option<String>,
    ) -> PyResult<Self> {
        let options = PackOptions { rows, seq_len, lookahead, pad_id };
        let inner = if let Ok(m) = view.cast::<PyMixture>() {
            // A mixture's documents, slot by slot, from its token stream.
            let m = m.get();
            if mode.is_some() {
                return Err(PyValueError::new_err("a mixture orders its documents itself: give mode and seed to the Mixture"));
            }
            let ragged: Vec<&(String, SourceView)> = m.streams.iter().filter(|(_, v)| matches!(v.source().layout(), crate::store::Layout::Ragged { .. })).collect();
            let (_, v) = match (&tokens, ragged.as_slice()) {
                (Some(t), _) => m.streams.iter().find(|(s, _)| s == t).ok_or_else(|| PyValueError::new_err(format!("the mixture has no stream '{t}'")))?,
                (None, [one]) => *one,
                (None, _) => return Err(PyValueError::new_err("give tokens=<stream name>: the mixture has several ragged streams (or none)")),
            };
            Packer::with_mixture(v.clone(), m.inner.clone(), rank, world_size, options).py_err()?
        } else {
            let mode = mode_or_cyclic(mode)?;
            let v = source_view_of(view, &Allocator::default(), true)?;
            Packer::new(v, mode, seed, rank, world_size, options).py_err()?
        };
        Ok(PyPacker { inner: std::sync::Mutex::new(inner), real: Default::default(), total: Default::default() })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (b, alloc) = py
            .detach(|| {
                let mut p = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                p.next_batch().map(|b| (b, p.allocator().clone()))
            })
            .py_err()?;
        let shape = b.tokens.shape().to_vec();
        let cells = b.position_ids.len() as u64;
        self.real.fetch_add(b.real_tokens, std::sync::atomic::Ordering::Relaxed);
        self.total.fetch_add(cells, std::sync::atomic::Ordering::Relaxed);
        let d = PyDict::new(py);
        d.set_item("tokens", PyDLTensor::new(b.tokens, true))?;
        d.set_item("position_ids", PyDLTensor::new(Tensor::from_slice(&alloc, &b.position_ids, &shape).py_err()?, true))?;
        d.set_item("document_ids", PyDLTensor::new(Tensor::from_slice(&alloc, &b.document_ids, &shape).py_err()?, true))?;
        let n = b.cu_seqlens.len();
        d.set_item("cu_seqlens", PyDLTensor::new(Tensor::from_slice(&alloc, &b.cu_seqlens, &[n]).py_err()?, true))?;
        d.set_item("efficiency", b.real_tokens as f64 / cells.max(1) as f64)?;
        Ok(d)
    }

    /// Real tokens / all tokens of every batch packed so far by this object.
    #[getter]
    fn efficiency(&self) -> f64 {
        let t = self.total.load(std::sync::atomic::Ordering::Relaxed);
        self.real.load(std::sync::atomic::Ordering::Relaxed) as f64 / t.max(1) as f64
    }

    /// The epoch of the document stream (of this rank's next document).
    #[getter]
    fn epoch(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).epoch()
    }

    /// `{"step", "cursor", "window": [[document, tokens placed], ...]}`.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.lock().unwrap_or_else(|p| p.into_inner()).state();
        state_dict(py, &s)
    }

    /// Resume from a `state_dict()` of this rank, or from the list of every rank's
    /// `state_dict()` of a run on any world size (elastic: the documents the old ranks pulled
    /// but had not placed are dealt to the new ranks, and the stream continues where no old
    /// rank had reached, so no token is packed twice or skipped). Checked: ValueError on a
    /// state that does not fit.
    fn load_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let (rank, world) = {
            let p = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let s = p.state();
            (s.rank, s.world_size)
        };
        if state.is_instance_of::<PyDict>() {
            let st = pack_state_of(state, rank, world)?;
            return py.detach(|| self.inner.lock().unwrap_or_else(|p| p.into_inner()).restore(&st)).py_err();
        }
        let n = state.len().map_err(|_| PyTypeError::new_err("load_state_dict takes a state_dict() or a list of every rank's state_dict()"))?;
        if n > u32::MAX as usize {
            return Err(PyValueError::new_err(format!("{n} states: more than any world size")));
        }
        let states: Vec<PackState> = state.try_iter()?.map(|s| pack_state_of(&s?, rank, world)).collect::<PyResult<_>>()?;
        py.detach(|| self.inner.lock().unwrap_or_else(|p| p.into_inner()).restore_elastic(&states)).py_err()
    }

    /// The states of `world_size` new ranks dealt from `states`, every rank's `state_dict()`
    /// of a run (what `load_state_dict(states)` does for this packer's rank).
    fn reshard<'py>(&self, py: Python<'py>, states: &Bound<'py, PyAny>, world_size: u64) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let p = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let s = p.state();
        let states: Vec<PackState> = states.try_iter()?.map(|x| pack_state_of(&x?, s.rank, s.world_size)).collect::<PyResult<_>>()?;
        let out = p.reshard(&states, world_size).py_err()?;
        out.iter().map(|st| state_dict(py, st)).collect()
    }
}
