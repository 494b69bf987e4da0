//! Python side of `zrecord.zarr`: the pipeline, whole-array reads and crop sources. Queries
//! arrive normalised by `python/zrecord/zarr.py` as `(uri, level, [axis, ...])` tuples, each axis
//! `("range", start, stop)`, `("slice", start, stop, step)` or `("index", [i, ...])`.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::python::errors::{to_py, IntoPy};
use crate::python::input::dtype_arg;
use crate::python::memory::{PyAllocator, PyDLTensor};
use crate::python::source::PySourceView;
use crate::store::SourceView;
use crate::zarr::assemble::{Assembler, CacheLimits, Limits, Stats};
use crate::zarr::pipeline::{BatchSpec, Pipeline, QueryIter, QueueLimits};
use crate::zarr::select::{AxisSelection, Query};
use crate::zarr::source::{CropSource, Crops};
use crate::zarr::assemble::shared_assembler;

fn axis_of(obj: &Bound<'_, PyAny>) -> PyResult<AxisSelection> {
    let t = obj.cast::<PyTuple>().map_err(|_| PyTypeError::new_err("a query axis must be a tuple"))?;
    let kind: String = t.get_item(0)?.extract()?;
    Ok(match kind.as_str() {
        "range" => AxisSelection::Range(t.get_item(1)?.extract()?, t.get_item(2)?.extract()?),
        "slice" => AxisSelection::Slice { start: t.get_item(1)?.extract()?, stop: t.get_item(2)?.extract()?, step: t.get_item(3)?.extract()? },
        "index" => AxisSelection::Indices(t.get_item(1)?.extract()?),
        other => return Err(PyValueError::new_err(format!("unknown query axis kind '{other}'"))),
    })
}

/// A normalised query tuple -> `Query`.
pub(crate) fn query_of(obj: &Bound<'_, PyAny>) -> PyResult<Query> {
    let t = obj.cast::<PyTuple>().map_err(|_| PyTypeError::new_err("expected a Sample or IndexQuery"))?;
    if t.len() != 3 {
        return Err(PyTypeError::new_err("expected a (uri, level, axes) query tuple"));
    }
    let uri: String = t.get_item(0)?.extract()?;
    let level: Option<usize> = t.get_item(1)?.extract()?;
    let axes = t.get_item(2)?;
    let selection = axes.try_iter()?.map(|a| axis_of(&a?)).collect::<PyResult<Vec<_>>>()?;
    Ok(Query { uri, level, selection })
}

/// A Python iterator of query tuples, pulled (with the GIL) by the pipeline's thread.
struct PyQueries {
    it: Py<PyAny>,
}

impl Iterator for PyQueries {
    type Item = Result<Query>;

    fn next(&mut self) -> Option<Result<Query>> {
        Python::attach(|py| {
            let it = self.it.bind(py);
            match it.call_method0("__next__") {
                Ok(obj) => Some(query_of(&obj).map_err(|e| Error::invalid("sample", e.to_string()))),
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => None,
                Err(e) => Some(Err(Error::invalid("sample", format!("the sample iterator raised: {e}")))),
            }
        })
    }
}

fn limits_of(d: Option<&Bound<'_, PyDict>>) -> PyResult<(Limits, CacheLimits)> {
    let mut l = Limits::default();
    let mut c = CacheLimits::default();
    if let Some(d) = d {
        for (k, v) in d.iter() {
            let k: String = k.extract()?;
            match k.as_str() {
                "decode_workers" => l.decode_workers = v.extract()?,
                "max_read_bytes" => l.max_read_bytes = v.extract()?,
                "max_chunk_bytes" => l.max_chunk_bytes = v.extract()?,
                "max_memory_bytes" => l.max_memory_bytes = v.extract()?,
                "array_entries" => c.array_entries = v.extract()?,
                "shard_index_entries" => c.shard_index_entries = v.extract()?,
                "chunk_cache_bytes" => c.chunk_bytes = v.extract()?,
                other => return Err(PyTypeError::new_err(format!("unknown limit '{other}'"))),
            }
        }
    }
    Ok((l, c))
}

fn stats_dict<'py>(py: Python<'py>, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("samples", s.samples)?;
    d.set_item("batches", s.batches)?;
    d.set_item("reads", s.reads)?;
    d.set_item("bytes_read", s.bytes_read)?;
    d.set_item("selected_bytes", s.selected_bytes)?;
    d.set_item("output_bytes", s.output_bytes)?;
    d.set_item("read_amplification", s.read_amplification())?;
    d.set_item("chunks_decoded", s.chunks_decoded)?;
    d.set_item("chunks_filled", s.chunks_filled)?;
    d.set_item("decode_seconds", s.decode_seconds)?;
    d.set_item("read_seconds", s.read_seconds)?;
    d.set_item("assemble_seconds", s.assemble_seconds)?;
    d.set_item("array_cache_hits", s.array_cache_hits)?;
    d.set_item("array_cache_misses", s.array_cache_misses)?;
    d.set_item("index_cache_hits", s.index_cache_hits)?;
    d.set_item("index_cache_misses", s.index_cache_misses)?;
    d.set_item("chunk_cache_hits", s.chunk_cache_hits)?;
    Ok(d)
}

/// The Rust pipeline (wrapped by `zrecord.zarr.Pipeline`).
#[pyclass(name = "_ZarrPipeline", module = "zrecord", frozen)]
pub struct PyZarrPipeline {
    inner: Arc<Pipeline>,
}

#[pymethods]
impl PyZarrPipeline {
    #[new]
    #[pyo3(signature = (samples, shape, dtype, limits = None, lookahead_samples = 64, prepared_batches = 2))]
    fn new(samples: usize, shape: Vec<usize>, dtype: &Bound<'_, PyAny>, limits: Option<&Bound<'_, PyDict>>, lookahead_samples: usize, prepared_batches: usize) -> PyResult<Self> {
        let dtype = dtype_arg(dtype)?;
        let (l, c) = limits_of(limits)?;
        let p = Pipeline::new(BatchSpec { samples, shape, dtype }, l, QueueLimits { lookahead_samples, prepared_batches }, c).py_err()?;
        Ok(PyZarrPipeline { inner: Arc::new(p) })
    }

    /// Queue an iterator of query tuples (pulled lazily).
    fn push(&self, it: &Bound<'_, PyAny>) -> PyResult<()> {
        let it = it.try_iter()?.into_any().unbind();
        let q: QueryIter = Box::new(PyQueries { it });
        self.inner.push(q).py_err()
    }

    fn finish(&self) {
        self.inner.finish()
    }

    /// `(DLTensor, index)`.
    #[pyo3(signature = (timeout = None))]
    fn pop(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<(PyDLTensor, u64)> {
        let t = match timeout {
            None => None,
            Some(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s.min(1e9))),
            Some(s) => return Err(PyValueError::new_err(format!("timeout must be a non-negative number of seconds, got {s}"))),
        };
        let inner = self.inner.clone();
        let b = py.detach(move || inner.pop(t)).py_err()?;
        Ok((PyDLTensor::new(b.tensor, true), b.index))
    }

    fn notify_released(&self) {
        self.inner.notify_released()
    }

    fn close(&self, py: Python<'_>) {
        let inner = self.inner.clone();
        py.detach(move || inner.close())
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.inner.stats())
    }
}

impl Drop for PyZarrPipeline {
    fn drop(&mut self) {
        // The worker may be waiting for the GIL (pulling a Python generator): close without it.
        let inner = self.inner.clone();
        Python::attach(|py| py.detach(move || inner.close()));
    }
}

/// An assembler for one-shot reads and crop sources (wrapped by `zrecord.zarr`).
#[pyclass(name = "_ZarrReader", module = "zrecord", frozen)]
pub struct PyZarrReader {
    inner: Arc<Assembler>,
}

#[pymethods]
impl PyZarrReader {
    #[new]
    #[pyo3(signature = (limits = None))]
    fn new(limits: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        if limits.is_none() {
            return Ok(PyZarrReader { inner: shared_assembler() });
        }
        let (l, c) = limits_of(limits)?;
        Ok(PyZarrReader { inner: Arc::new(Assembler::new(l, c).py_err()?) })
    }

    /// The whole array as one tensor.
    #[pyo3(signature = (uri, level = None, dtype = None, allocator = None))]
    fn read(&self, py: Python<'_>, uri: String, level: Option<usize>, dtype: Option<&Bound<'_, PyAny>>, allocator: Option<PyRef<'_, PyAllocator>>) -> PyResult<PyDLTensor> {
        let dtype: Option<DType> = dtype.map(dtype_arg).transpose()?;
        let alloc = allocator.map(|a| a.inner.clone()).unwrap_or_else(|| crate::memory::Allocator::cpu(0));
        let inner = self.inner.clone();
        let t = py.detach(move || inner.read(&uri, level, dtype, &alloc)).py_err()?;
        Ok(PyDLTensor::new(t, false))
    }

    /// A batch of queries as one tensor `[n, *shape]`.
    #[pyo3(signature = (queries, dtype = None, allocator = None))]
    fn gather(&self, py: Python<'_>, queries: &Bound<'_, PyAny>, dtype: Option<&Bound<'_, PyAny>>, allocator: Option<PyRef<'_, PyAllocator>>) -> PyResult<PyDLTensor> {
        let qs = queries.try_iter()?.map(|q| query_of(&q?)).collect::<PyResult<Vec<_>>>()?;
        if qs.is_empty() {
            return Err(PyValueError::new_err("gather needs at least one query"));
        }
        let dtype: Option<DType> = dtype.map(dtype_arg).transpose()?;
        let alloc = allocator.map(|a| a.inner.clone()).unwrap_or_else(crate::query::table::default_allocator);
        let inner = self.inner.clone();
        let t = py.detach(move || inner.gather(&qs, dtype, None, &alloc)).py_err()?;
        Ok(PyDLTensor::new(t, true))
    }

    /// `{shape, chunks, dtype, fill_value_bytes, zarr_format, sharded}` of an array.
    #[pyo3(signature = (uri, level = None))]
    fn info<'py>(&self, py: Python<'py>, uri: String, level: Option<usize>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.inner.array(&uri, level).py_err()?;
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &m.shape)?)?;
        d.set_item("chunks", PyTuple::new(py, &m.read_chunk)?)?;
        d.set_item("dtype", m.dtype.name())?;
        d.set_item("zarr_format", m.zarr_format)?;
        d.set_item("sharded", m.is_sharded())?;
        d.set_item("path", m.location.path().to_string_lossy().to_string())?;
        Ok(d)
    }

    /// Crops of one array as a record source bound to `allocator`.
    #[pyo3(signature = (uri, allocator, level = None, crops = None, shape = None, count = None, seed = 0, dtype = None))]
    #[allow(clippy::too_many_arguments)]
    fn crops(
        &self,
        py: Python<'_>,
        uri: String,
        allocator: PyRef<'_, PyAllocator>,
        level: Option<usize>,
        crops: Option<Vec<Vec<(i64, i64)>>>,
        shape: Option<Vec<u64>>,
        count: Option<u64>,
        seed: u64,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PySourceView> {
        let dtype: Option<DType> = dtype.map(dtype_arg).transpose()?;
        let spec = match (crops, shape, count) {
            (Some(c), None, None) => Crops::List(c),
            (None, Some(shape), Some(count)) => Crops::Random { shape, count, seed },
            _ => return Err(PyValueError::new_err("give either crops=[aabb, ...] or shape=... with count=...")),
        };
        let inner = self.inner.clone();
        // Named as the array (the last part of its path), as a stream is named by its folder.
        let stream = uri.trim_end_matches('/').rsplit('/').next().filter(|s| !s.is_empty()).unwrap_or("crops").to_string();
        let src = py.detach(move || CropSource::new(inner, &uri, level, spec, dtype)).map_err(to_py)?;
        let view = SourceView::new(Arc::new(src), &allocator.inner);
        Ok(PySourceView::with_reduce(view, None).named(stream))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.inner.stats())
    }
}
