//! Sampler and Loader for Python.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use pyo3::exceptions::{PyRuntimeError, PyStopIteration, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};
use pyo3::{PyTraverseError, PyVisit};

use crate::loader::{IdSource, Loader, LoaderHandle, LoaderOptions, Mode, PositionBatch, Sampler, SourceView};
use crate::store::Batch;
use crate::python::errors::{to_py, IntoPy};
use crate::python::input::Imported;
use crate::python::memory::{PyDLTensor, PyRaggedBatch};
use crate::python::source::{source_view_of, PySourceView};
use crate::python::store::{PyDenseView, PyRaggedView};
use crate::dtype::DType;

/// Sampling modes: `Sampler.Mode.SEQUENTIAL`, `.IID`, `.CYCLIC`.
#[pyclass(name = "SamplerMode", module = "zrecord", eq, eq_int, frozen)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms)]
pub enum PyMode {
    /// In order, wrapping.
    SEQUENTIAL,
    /// Uniform with replacement.
    IID,
    /// A fresh permutation per cycle, full batches only.
    CYCLIC,
    /// Cyclic over a block-shuffled order (blocks of contiguous records).
    BLOCK,
}

pub(crate) fn mode_arg(obj: &Bound<'_, PyAny>) -> PyResult<Mode> {
    if let Ok(m) = obj.cast::<PyMode>() {
        return Ok(match *m.get() {
            PyMode::SEQUENTIAL => Mode::Sequential,
            PyMode::IID => Mode::Iid,
            PyMode::CYCLIC => Mode::Cyclic,
            PyMode::BLOCK => Mode::Block,
        });
    }
    if let Ok(s) = obj.extract::<String>() {
        return s.parse().py_err();
    }
    Err(PyTypeError::new_err("mode must be a Sampler.Mode or one of 'sequential', 'iid', 'cyclic', 'block'"))
}

/// `(Sampler, (n, batch_size, mode, seed), step)`.
type SamplerReduce<'py> = (Bound<'py, PyAny>, (u64, usize, &'static str, u64, u64, u64), u64);

pub(crate) fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Sequential => "sequential",
        Mode::Iid => "iid",
        Mode::Cyclic => "cyclic",
        Mode::Block => "block",
    }
}

/// A stateless batch sampler. `next()` returns a borrowed uint64 array that the next draw
/// overwrites; copy it to keep it.
#[pyclass(name = "Sampler", module = "zrecord")]
pub struct PySampler {
    pub(crate) inner: Sampler,
    buf: Py<PyAny>,
    ptr: usize,
}

#[pymethods]
impl PySampler {
    #[classattr]
    #[allow(non_snake_case)]
    fn Mode(py: Python<'_>) -> Py<PyType> {
        py.get_type::<PyMode>().unbind()
    }

    #[new]
    #[pyo3(signature = (n, batch_size, mode, seed = 0, block = 64, window = 16))]
    fn new(py: Python<'_>, n: u64, batch_size: usize, mode: &Bound<'_, PyAny>, seed: u64, block: u64, window: u64) -> PyResult<Self> {
        let inner = Sampler::new(n, batch_size, mode_arg(mode)?, seed).py_err()?.with_blocks(block, window).py_err()?;
        // The array views a bytearray: it does not own its data, so NumPy refuses to resize it
        // (even with refcheck=False), and the bytearray cannot be resized while the array
        // exports it. The address read here therefore stays valid for the sampler's life.
        let np = py.import("numpy")?;
        let bytes = batch_size.checked_mul(8).ok_or_else(|| PyValueError::new_err(format!("batch_size {batch_size} is too large")))?;
        let raw = pyo3::types::PyByteArray::new_with(py, bytes, |_| Ok(()))?;
        let buf = np.call_method1("frombuffer", (raw, "uint64"))?;
        let ai = buf.getattr("__array_interface__")?;
        let (ptr, _ro): (usize, bool) = ai.get_item("data")?.extract()?;
        Ok(PySampler { inner, buf: buf.unbind(), ptr })
    }

    /// Draw the next batch into the reusable buffer and return it (borrowed).
    fn next(&mut self, py: Python<'_>) -> Py<PyAny> {
        let step = self.inner.step();
        self.inner.seek(step + 1);
        // SAFETY: `ptr` addresses the `batch_size` uint64 elements of the bytearray behind the
        // NumPy array this sampler owns (`self.buf` keeps both alive; neither can be resized,
        // see `new`). `&mut self` excludes other calls on this sampler; Python readers see the
        // new batch, which is the documented borrowed-buffer contract.
        let out = unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u64, self.inner.batch_size()) };
        self.inner.fill(step, out);
        self.buf.clone_ref(py)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> Py<PyAny> {
        self.next(py)
    }

    /// Position at `step` (O(1)).
    fn seek(&mut self, step: u64) {
        self.inner.seek(step);
    }

    /// The batch at `step` as a new array (the sampler does not move).
    fn batch<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Bound<'py, PyAny>> {
        let v = self.inner.batch(step);
        let np = py.import("numpy")?;
        np.call_method1("array", (v, "uint64"))
    }

    #[getter]
    fn step(&self) -> u64 {
        self.inner.step()
    }
    #[getter]
    fn batch_size(&self) -> usize {
        self.inner.batch_size()
    }
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.seed()
    }
    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }
    /// The sampling mode: "sequential", "iid" or "cyclic".
    #[getter]
    fn mode(&self) -> &'static str {
        mode_name(self.inner.mode())
    }

    /// The ids at positions `start..stop` of epoch `epoch`'s order (sequential: the identity;
    /// cyclic: that cycle's permutation, the one its batches walk). Splits an epoch exactly
    /// across workers and ranks, remainder included. Iid has no epoch order (ValueError).
    fn epoch_order<'py>(&self, py: Python<'py>, epoch: u64, start: u64, stop: u64) -> PyResult<Bound<'py, PyAny>> {
        if stop < start || stop > self.inner.len() {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("positions {start}..{stop} are outside the {} positions of an epoch", self.inner.len())));
        }
        let len = usize::try_from(stop - start).map_err(|_| PyValueError::new_err("range too large"))?;
        let mut out = Vec::new();
        out.try_reserve_exact(len).map_err(|_| pyo3::exceptions::PyMemoryError::new_err(format!("{len} ids do not fit in memory")))?;
        out.resize(len, 0u64);
        let inner = self.inner.clone();
        let out = py.detach(move || inner.order(epoch, start, &mut out).map(|_| out)).py_err()?;
        py.import("numpy")?.call_method1("array", (out, "uint64"))
    }

    /// Pickles as its parameters and current step.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<SamplerReduce<'py>> {
        let s = &slf.borrow().inner;
        let (block, window) = s.blocks();
        Ok((slf.get_type().into_any(), (s.len(), s.batch_size(), mode_name(s.mode()), s.seed(), block, window), s.step()))
    }

    fn __setstate__(&mut self, step: u64) {
        self.inner.seek(step);
    }

    fn __repr__(&self) -> String {
        format!("Sampler(n={}, batch_size={}, mode={:?}, seed={}, step={})", self.inner.len(), self.inner.batch_size(), self.inner.mode(), self.inner.seed(), self.inner.step())
    }
}

/// A step as a worker leaves it: finished in Python, or the gathered parts for the consumer to
/// wrap and transform (see [`Finisher`]).
enum Produced {
    Done(Py<PyAny>),
    Parts(Vec<PositionBatch>),
}

type StepResult = PyResult<Produced>;

/// Below this cost per step (wrapping the gathered buffers in Python objects plus the
/// transform), a loader with workers leaves the Python part to the consumer thread.
const DEFER_BELOW_NS: u64 = 200_000;

/// Where a step's Python part runs. In a worker it needs the GIL: for a cheap transform the
/// hand-offs (a worker taking the GIL from the consumer and giving it back, about a dozen
/// futex calls per step) cost more than the transform, and workers delivered 0.6x of a loader
/// without workers on 256-record token batches. So the workers measure what the Python part
/// costs (a running average) and, once it is cheap, hand the gathered parts to the consumer,
/// which runs it with the GIL it holds anyway; expensive transforms (which can release the GIL
/// and run in parallel) stay in the workers.
struct Finisher {
    refs: Arc<RwLock<LoaderRefs>>,
    has_transform: bool,
    /// Average cost of the Python part in ns, and how many steps it covers.
    cost_ns: AtomicU64,
    samples: AtomicU64,
    /// Each stream's logical type (strings stay strings in the batches handed out).
    logicals: std::collections::HashMap<String, crate::store::Logical>,
}

impl Finisher {
    fn defer(&self) -> bool {
        self.samples.load(Ordering::Relaxed) >= 4 && self.cost_ns.load(Ordering::Relaxed) < DEFER_BELOW_NS
    }

    /// Wrap `parts` and run the transform (the GIL held).
    fn finish(&self, py: Python<'_>, parts: Vec<PositionBatch>) -> PyResult<Py<PyAny>> {
        let started = std::time::Instant::now();
        let list = parts_to_py(py, parts, &self.logicals)?;
        let r = match LoaderRefs::get(&self.refs, py, |r| &r.transform) {
            Some(f) => f.bind(py).call1((list,)).map(Bound::unbind),
            None if self.has_transform => Err(PyValueError::new_err("loader is closed")),
            None => Ok(list.into_any().unbind()),
        };
        // One sample counts at most 5x the threshold: a single preemption or page-fault storm
        // must not move cheap transforms back to the workers for many steps.
        let ns = (started.elapsed().as_nanos().min(u64::MAX as u128) as u64).min(5 * DEFER_BELOW_NS);
        let n = self.samples.fetch_add(1, Ordering::Relaxed);
        let avg = if n == 0 { ns } else { (self.cost_ns.load(Ordering::Relaxed).saturating_mul(7) + ns) / 8 };
        self.cost_ns.store(avg, Ordering::Relaxed);
        r
    }
}

fn parts_to_py<'py>(py: Python<'py>, parts: Vec<PositionBatch>, logicals: &std::collections::HashMap<String, crate::store::Logical>) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for s in parts {
        let d = PyDict::new(py);
        for (name, v) in s.values {
            match v {
                Batch::Dense(t) => d.set_item(name, Py::new(py, PyDLTensor::new(t, true))?)?,
                Batch::Ragged(b) => {
                    let logical = logicals.get(name.as_str()).copied().unwrap_or_default();
                    d.set_item(name, Py::new(py, PyRaggedBatch::owned_as(b, logical))?)?
                }
            }
        }
        list.append(d)?;
    }
    Ok(list)
}

fn ids_from_py(obj: &Bound<'_, PyAny>) -> crate::error::Result<Vec<u64>> {
    let im = Imported::from_any(obj).map_err(|e| crate::error::Error::invalid("sampler", format!("next() must return a 1-D integer array: {e}")))?;
    if !matches!(im.dtype, DType::UInt64 | DType::Int64) {
        return Err(crate::error::Error::invalid("sampler", format!("next() must return uint64 or int64 ids, got {}", im.dtype)));
    }
    // Read once into an owned vector (the array may change after this call); ranges are
    // checked against the streams by the gather.
    im.index_ids(u64::MAX).map_err(|e| crate::error::Error::invalid("sampler", format!("next() returned unusable ids: {e}")))
}

/// Endless, deterministic, resumable batches from aligned named streams.
#[pyclass(name = "Loader", module = "zrecord")]
pub struct PyLoader {
    inner: Mutex<Option<Loader<StepResult>>>,
    /// Position / close access that never waits on `inner` (which `__next__` holds while the
    /// transform runs): a transform may call `state_dict()` or `close()` on its own loader.
    handle: LoaderHandle,
    /// The Python objects the loader calls, held only here (the worker closures borrow them
    /// from this slot), so that the garbage collector sees every reference: a transform or
    /// sampler that refers back to its loader makes a cycle it can then break.
    refs: Arc<RwLock<LoaderRefs>>,
    finisher: Arc<Finisher>,
}

/// See [`PyLoader::refs`].
#[derive(Default)]
struct LoaderRefs {
    transform: Option<Py<PyAny>>,
    sampler: Option<Py<PyAny>>,
}

impl LoaderRefs {
    /// A new reference to the field `pick` chooses (taken with the GIL held, dropped after
    /// the call); `None` once the loader was cleared.
    fn get(slot: &RwLock<LoaderRefs>, py: Python<'_>, pick: fn(&LoaderRefs) -> &Option<Py<PyAny>>) -> Option<Py<PyAny>> {
        pick(&slot.read().unwrap_or_else(|p| p.into_inner())).as_ref().map(|f| f.clone_ref(py))
    }
}

fn stream_views(streams: &Bound<'_, PyDict>) -> PyResult<Vec<(String, Vec<SourceView>)>> {
    let mut out = Vec::new();
    for (k, v) in streams.iter() {
        let name: String = k.extract().map_err(|_| PyTypeError::new_err("stream names must be strings"))?;
        let mut views = Vec::new();
        for item in v.try_iter().map_err(|_| PyTypeError::new_err(format!("stream '{name}' must map to a list of views")))? {
            let item = item?;
            if item.is_instance_of::<PyDenseView>() || item.is_instance_of::<PyRaggedView>() || item.is_instance_of::<PySourceView>() {
                views.push(source_view_of(&item, &Default::default(), true)?);
            } else {
                return Err(PyTypeError::new_err(format!(
                    "stream '{name}' holds a {}, expected DenseView, RaggedView or SourceView",
                    item.get_type().name()?
                )));
            }
        }
        out.push((name, views));
    }
    Ok(out)
}

#[pymethods]
impl PyLoader {
    #[new]
    #[pyo3(signature = (streams, sampler, workers = 4, prefetch = 4, transform = None, rank = 0, world_size = 1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        streams: &Bound<'_, PyDict>,
        sampler: &Bound<'_, PyAny>,
        workers: usize,
        prefetch: usize,
        transform: Option<Py<PyAny>>,
        rank: usize,
        world_size: usize,
    ) -> PyResult<Self> {
        let views = stream_views(streams)?;
        let options = LoaderOptions { workers, prefetch, rank, world_size };
        let has_transform = transform.is_some();
        let refs = Arc::new(RwLock::new(LoaderRefs { transform, sampler: None }));
        let logicals = views.iter().filter_map(|(n, v)| v.first().map(|v| (n.clone(), v.source().logical()))).collect();
        let finisher = Arc::new(Finisher { refs: refs.clone(), has_transform, cost_ns: AtomicU64::new(0), samples: AtomicU64::new(0), logicals });
        let fin = finisher.clone();
        let make = move |_step: u64, parts: Vec<PositionBatch>| -> StepResult {
            // Only workers defer (without workers this already runs on the consumer).
            if workers > 0 && fin.defer() {
                return Ok(Produced::Parts(parts));
            }
            Python::attach(|py| fin.finish(py, parts).map(Produced::Done))
        };
        let loader = if let Ok(m) = sampler.cast::<crate::python::plan::PyMixture>() {
            let inner = m.get().inner.clone();
            py.detach(move || Loader::with_transform(views, IdSource::Mixture(inner), options, make)).py_err()?
        } else if let Ok(s) = sampler.cast::<crate::python::plan::PyShardStream>() {
            let inner = s.get().inner.clone();
            py.detach(move || Loader::with_transform(views, IdSource::Plan(inner), options, make)).py_err()?
        } else if let Ok(s) = sampler.cast::<PySampler>() {
            let inner = s.borrow().inner.clone();
            let start = inner.step();
            let mut l = py.detach(move || Loader::with_transform(views, IdSource::Stateless(inner), options, make)).py_err()?;
            if start != 0 {
                py.detach(|| l.seek(start)).py_err()?;
            }
            l
        } else {
            if !sampler.hasattr("next")? {
                return Err(PyTypeError::new_err("sampler must be a zrecord.Sampler, a zrecord.ShardStream or an object with next() returning a 1-D uint64/int64 array"));
            }
            let first = ids_from_py(&sampler.call_method0("next")?).py_err()?;
            let batch = first.len();
            refs.write().unwrap_or_else(|p| p.into_inner()).sampler = Some(sampler.clone().unbind());
            let slot = refs.clone();
            let mut pending = Some(first);
            let draw = Box::new(move || -> crate::error::Result<Vec<u64>> {
                if let Some(f) = pending.take() {
                    return Ok(f);
                }
                Python::attach(|py| {
                    let obj = LoaderRefs::get(&slot, py, |r| &r.sampler).ok_or(crate::error::Error::Closed { what: "loader" })?;
                    let r = obj.bind(py).call_method0("next").map_err(|e| crate::error::Error::invalid("sampler", format!("next() raised: {e}")))?;
                    ids_from_py(&r)
                })
            });
            py.detach(|| Loader::with_draw(views, draw, batch, options, make)).py_err()?
        };
        let handle = loader.handle();
        Ok(PyLoader { inner: Mutex::new(Some(loader)), handle, refs, finisher })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // Never block the collector: a writer holds the lock only while clearing.
        if let Ok(r) = self.refs.try_read() {
            visit.call(&r.transform)?;
            visit.call(&r.sampler)?;
        }
        Ok(())
    }

    /// Break a reference cycle through the transform or sampler: close and drop the loader
    /// (joining its workers with the GIL released, as on drop).
    fn __clear__(&mut self) {
        self.handle.close();
        let l = self.inner.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if l.is_some() {
            Python::attach(|py| py.detach(move || drop(l)));
        }
        *self.refs.write().unwrap_or_else(|p| p.into_inner()) = LoaderRefs::default();
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            g.as_mut().and_then(|l| l.next_step())
        });
        match r {
            None => Err(PyStopIteration::new_err("loader closed")),
            Some(Err(e)) => Err(to_py(e)),
            Some(Ok(Ok(Produced::Done(obj)))) => Ok(obj),
            Some(Ok(Ok(Produced::Parts(parts)))) => {
                let _inside = self.handle.enter_transform();
                self.finisher.finish(py, parts)
            }
            Some(Ok(Err(e))) => Err(e),
        }
    }

    /// `{"step": n}`: the step the next batch belongs to.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Without the GIL: a worker drawing from a Python sampler holds the loader's lock while
        // it waits for the GIL.
        let (closed, step) = py.detach(|| (self.handle.is_closed(), self.handle.state()));
        let Some(step) = step.filter(|_| !closed) else {
            return Err(PyValueError::new_err("loader is closed"));
        };
        let d = PyDict::new(py);
        d.set_item("step", step)?;
        Ok(d)
    }

    /// Resume from a `state_dict()`: no batch repeated or skipped.
    fn load_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let step: u64 = state.get_item("step")?.ok_or_else(|| PyValueError::new_err("state has no 'step'"))?.extract()?;
        if self.handle.in_transform() {
            return Err(PyRuntimeError::new_err("load_state_dict() called from inside this loader's own transform; reposition it between batches"));
        }
        py.detach(|| match self.inner.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(l) if !l.is_closed() => l.seek(step).map_err(to_py),
            _ => Err(PyValueError::new_err("loader is closed")),
        })
    }

    /// Stop all worker threads (also those blocked on a full queue). Idempotent. From inside
    /// the loader's own transform it only marks the loader closed: the batch being made is
    /// the last, and the threads are joined when the loader is next used or dropped.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.handle.close());
        if self.handle.in_transform() {
            return;
        }
        let l = py.detach(|| self.inner.lock().unwrap_or_else(|p| p.into_inner()).take());
        py.detach(move || drop(l));
    }

    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| self.handle.is_closed())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }
}

impl Drop for PyLoader {
    fn drop(&mut self) {
        // Workers may be waiting for the GIL inside a transform: join them with it released.
        let l = self.inner.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if l.is_some() {
            Python::attach(|py| py.detach(move || drop(l)));
        }
    }
}

/// Record batches of a LoaderBatchReader as struct arrays, for the Arrow C stream interface.
struct StructReader {
    inner: crate::loader::LoaderBatchReader,
    field: arrow_schema::FieldRef,
}

impl Iterator for StructReader {
    type Item = Result<arrow_array::ArrayRef, arrow_schema::ArrowError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|r| r.map(|b| std::sync::Arc::new(arrow_array::StructArray::from(b)) as arrow_array::ArrayRef))
    }
}

impl pyo3_arrow::ffi::ArrayReader for StructReader {
    fn field(&self) -> arrow_schema::FieldRef {
        self.field.clone()
    }
}

/// The loader's steps as an Arrow stream (`__arrow_c_stream__`): one record batch per step and
/// view position with columns `_step`, `_id` and one per stream. Consumable once;
/// `pyarrow.RecordBatchReader.from_stream(obj)` or `pyarrow.table(obj)` (with `steps`) read it.
#[pyclass(name = "ArrowLoader", module = "zrecord")]
pub struct PyArrowLoader {
    reader: Mutex<Option<crate::loader::LoaderBatchReader>>,
}

#[pymethods]
impl PyArrowLoader {
    #[new]
    #[pyo3(signature = (streams, sampler, steps = None, workers = 4, prefetch = 4, rank = 0, world_size = 1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        streams: &Bound<'_, PyDict>,
        sampler: &Bound<'_, PySampler>,
        steps: Option<u64>,
        workers: usize,
        prefetch: usize,
        rank: usize,
        world_size: usize,
    ) -> PyResult<Self> {
        let views = stream_views(streams)?;
        let s = sampler.borrow().inner.clone();
        let options = LoaderOptions { workers, prefetch, rank, world_size };
        let r = py.detach(move || crate::loader::LoaderBatchReader::new(views, s, options, steps)).py_err()?;
        Ok(PyArrowLoader { reader: Mutex::new(Some(r)) })
    }

    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(&self, py: Python<'py>, requested_schema: Option<Bound<'py, pyo3::types::PyCapsule>>) -> PyResult<Bound<'py, pyo3::types::PyCapsule>> {
        use arrow_array::RecordBatchReader;
        let reader = self.reader.lock().unwrap_or_else(|p| p.into_inner()).take().ok_or_else(|| PyValueError::new_err("this Arrow stream was already consumed"))?;
        let schema = reader.schema();
        let field = std::sync::Arc::new(arrow_schema::Field::new_struct("", schema.fields().clone(), false));
        Ok(pyo3_arrow::ffi::to_stream_pycapsule(py, Box::new(StructReader { inner: reader, field }), requested_schema)?)
    }
}
