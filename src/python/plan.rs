//! Epoch plans for Python: `EpochPlan`, its `Deal` to ranks x workers, one shard's
//! `ShardStream` (which `Loader` reads like a sampler), positions as plain dicts.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::loader::{Deal, EpochPlan, Position, ShardStream};
use crate::python::errors::IntoPy;
use crate::python::loader::mode_arg;

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
        let mode = match mode {
            Some(m) => mode_arg(m)?,
            None => crate::loader::Mode::Cyclic,
        };
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

    /// "sequential", "iid" or "cyclic".
    #[getter]
    fn mode(&self) -> &'static str {
        crate::python::loader::mode_name(self.inner.mode())
    }

    /// The ids of base batch `t` of `epoch` (uint64 array).
    fn ids<'py>(&self, py: Python<'py>, epoch: u64, t: u64) -> PyResult<Bound<'py, PyAny>> {
        let mut out = Vec::new();
        self.inner.fill(epoch, t, &mut out).py_err()?;
        py.import("numpy")?.call_method1("array", (out, "uint64"))
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
        py.import("numpy")?.call_method1("array", (out, "uint64"))
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
        py.import("numpy")?.call_method1("array", (out, "uint64"))
    }
}
