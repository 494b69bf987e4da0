//! The native half of `zrecord.dist`: a rank (`_DistNode`) and a reader (`_DistReader`).
//! Collectives (MPI or `FileComm`) are driven from Python; what crosses them is JSON.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::dist::{DistNode, DistOptions, DistReader, Endpoint, FileComm, ReaderSpec, ShardMeta};
use crate::memory::Allocator;
use crate::python::errors::IntoPy;
use crate::python::input::{dtype_arg, shape_arg, Imported};
use crate::python::memory::PyAllocator;
use crate::python::source::{source_view_of, PySourceView};
use crate::python::store::{PyDenseStore, PyRaggedStore};
use crate::store::{ReadOptions, RecordSource, SourceView};

fn json_err(what: &str, e: serde_json::Error) -> PyErr {
    PyValueError::new_err(format!("malformed {what}: {e}"))
}

fn options(timeout: f64, transport: &str, host: Option<String>, rendezvous: Option<PathBuf>, namespace: Option<String>, max_request_bytes: usize) -> PyResult<DistOptions> {
    let rendezvous = match (rendezvous, namespace) {
        (Some(d), Some(ns)) => Some((d, ns)),
        (Some(d), None) => Some((d, "s0".to_string())),
        (None, _) => None,
    };
    Ok(DistOptions { timeout_s: timeout, transport: transport.parse().py_err()?, host, rendezvous, max_request_bytes })
}

/// One rank: its shards and the Flight server that serves them.
#[pyclass(name = "_DistNode", module = "zrecord", frozen)]
pub struct PyDistNode {
    node: DistNode,
}

#[pymethods]
impl PyDistNode {
    #[new]
    #[pyo3(signature = (rank, size, timeout = 30.0, transport = "auto", host = None, rendezvous = None, namespace = None, max_request_bytes = 64 << 20))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, rank: usize, size: usize, timeout: f64, transport: &str, host: Option<String>, rendezvous: Option<PathBuf>, namespace: Option<String>, max_request_bytes: usize) -> PyResult<Self> {
        let opts = options(timeout, transport, host, rendezvous, namespace, max_request_bytes)?;
        let node = py.detach(|| DistNode::start(rank, size, opts)).py_err()?;
        Ok(PyDistNode { node })
    }

    /// This rank's endpoint as JSON (what the collectives exchange).
    fn endpoint(&self) -> PyResult<String> {
        serde_json::to_string(self.node.endpoint()).map_err(|e| json_err("endpoint", e))
    }

    /// Every rank's endpoint JSON, in rank order.
    fn connect(&self, endpoints: Vec<String>) -> PyResult<()> {
        let eps = endpoints.iter().map(|e| serde_json::from_str::<Endpoint>(e).map_err(|e| json_err("endpoint", e))).collect::<PyResult<Vec<_>>>()?;
        self.node.connect(eps).py_err()
    }

    /// Register a C-contiguous array as this rank's shard of `name` (rows along axis 0; a 1-D
    /// array is rows of one element). Its bytes are copied once into shared memory. Returns
    /// the shard's JSON description.
    fn add_array(&self, name: &str, array: &Bound<'_, PyAny>) -> PyResult<String> {
        let im = Imported::from_any(array)?;
        let v = im.view()?;
        v.check("array").py_err()?;
        let shape = im.shape.clone();
        let (rows, item_shape) = match shape.split_first() {
            Some((&r, rest)) => (r as u64, rest.to_vec()),
            None => return Err(PyValueError::new_err("a shard needs at least one dimension (rows)")),
        };
        let meta = self.node.add_rows(name, rows, im.dtype, item_shape).py_err()?;
        // Copied while the GIL is held: the producer's buffer cannot change under us.
        self.node.update(name, 0, v.bytes).py_err()?;
        serde_json::to_string(&meta).map_err(|e| json_err("shard", e))
    }

    /// `nrows` zero rows of `dtype` and `item_shape` in shared memory.
    fn init(&self, name: &str, nrows: u64, item_shape: &Bound<'_, PyAny>, dtype: &Bound<'_, PyAny>) -> PyResult<String> {
        let meta = self.node.add_rows(name, nrows, dtype_arg(dtype)?, shape_arg(item_shape)?).py_err()?;
        serde_json::to_string(&meta).map_err(|e| json_err("shard", e))
    }

    /// Serve a zrecord store or view (or any record source) as this rank's shard.
    fn add_source(&self, name: &str, source: &Bound<'_, PyAny>) -> PyResult<String> {
        let view: SourceView = source_view_of(source, &Allocator::default(), true)?;
        let path = if let Ok(s) = source.cast::<PyDenseStore>() {
            Some(s.get().store()?.path().to_path_buf())
        } else if let Ok(s) = source.cast::<PyRaggedStore>() {
            Some(s.get().store()?.path().to_path_buf())
        } else {
            None
        };
        let path = path.filter(|p| !crate::io::is_url(p)).map(|p| crate::io::canonical(std::path::Path::new(&p)).to_string_lossy().into_owned());
        let meta = self.node.add_source(name, view.source().clone(), path).py_err()?;
        serde_json::to_string(&meta).map_err(|e| json_err("shard", e))
    }

    /// Overwrite rows `offset..` of this rank's shard `name` with `array`'s rows.
    fn update(&self, name: &str, array: &Bound<'_, PyAny>, offset: u64) -> PyResult<()> {
        let im = Imported::from_any(array)?;
        let v = im.view()?;
        v.check("array").py_err()?;
        self.node.update(name, offset, v.bytes).py_err()
    }

    /// Register `name` from every rank's shard JSON (rank order).
    fn define(&self, py: Python<'_>, name: &str, shards: Vec<String>) -> PyResult<()> {
        let metas = shards.iter().map(|s| serde_json::from_str::<ShardMeta>(s).map_err(|e| json_err("shard", e))).collect::<PyResult<Vec<_>>>()?;
        py.detach(|| self.node.define(name, metas)).py_err()
    }

    /// The node's reader (shares its connections).
    fn reader(&self) -> PyDistReader {
        PyDistReader { reader: self.node.reader().clone() }
    }

    /// Stop serving and drop every shard. Idempotent.
    fn free(&self, py: Python<'_>) {
        py.detach(|| self.node.free());
    }

    #[getter]
    fn rank(&self) -> usize {
        self.node.rank()
    }

    #[getter]
    fn address(&self) -> String {
        self.node.endpoint().addr.clone()
    }
}

/// The read side: connections and shard tables.
#[pyclass(name = "_DistReader", module = "zrecord", frozen)]
pub struct PyDistReader {
    reader: DistReader,
}

#[pymethods]
impl PyDistReader {
    /// An independent reader (own runtime, own connections) from `spec()` JSON.
    #[staticmethod]
    fn from_spec(py: Python<'_>, spec: &str) -> PyResult<Self> {
        let spec: ReaderSpec = serde_json::from_str(spec).map_err(|e| json_err("reader spec", e))?;
        Ok(PyDistReader { reader: py.detach(|| DistReader::from_spec(&spec)).py_err()? })
    }

    /// An extra member of the group publishing in `dir` under `namespace`.
    #[staticmethod]
    #[pyo3(signature = (dir, namespace, n_core, timeout = 30.0, transport = "auto"))]
    fn join_group(py: Python<'_>, dir: PathBuf, namespace: &str, n_core: usize, timeout: f64, transport: &str) -> PyResult<Self> {
        let opts = options(timeout, transport, None, None, None, 64 << 20)?;
        Ok(PyDistReader { reader: py.detach(|| DistReader::join_group(&dir, namespace, n_core, opts)).py_err()? })
    }

    /// Read the variable the group published as `name`.
    fn join(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        py.detach(|| self.reader.join(name)).py_err()
    }

    fn spec(&self) -> PyResult<String> {
        serde_json::to_string(&self.reader.spec().py_err()?).map_err(|e| json_err("reader spec", e))
    }

    fn names(&self) -> Vec<String> {
        self.reader.names()
    }

    /// `(total rows, rows per rank)`.
    fn rows(&self, name: &str) -> PyResult<(u64, Vec<u64>)> {
        self.reader.rows(name).py_err()
    }

    /// Variable `name` as a `SourceView`.
    #[pyo3(signature = (name, allocator = None, verify_checksums = true))]
    fn view(&self, py: Python<'_>, name: &str, allocator: Option<&PyAllocator>, verify_checksums: bool) -> PyResult<PySourceView> {
        let source = self.reader.source(name).py_err()?;
        let alloc = allocator.map(|a| a.inner.clone()).unwrap_or_default();
        let view = SourceView::new(source, &alloc).with_options(ReadOptions { verify_checksums, parallel: true });
        // Pickled as what reconnects: the reader's spec (endpoints, shards, options) and the
        // name; the other process reads through a reader of its own (spawned DataLoader workers).
        let f = py.import("zrecord._pickle")?.getattr("dist_view")?;
        let args = (self.spec()?, name.to_string(), PyAllocator { inner: alloc }, verify_checksums);
        let reduce = (f, args).into_pyobject(py)?.into_any().unbind();
        Ok(PySourceView::with_reduce(view, Some(reduce)).named(name))
    }

    /// Dense rows `ids` written straight into `out` (a writable C-contiguous DLPack tensor
    /// holding exactly `len(ids)` rows of the variable's size; the caller checked its dtype).
    /// False, with nothing written, when `out` does not say it is writable in place (a
    /// read-only or copied export, or a producer without versioned DLPack).
    fn get_batch_into(&self, py: Python<'_>, name: &str, ids: &Bound<'_, PyAny>, out: &Bound<'_, PyAny>) -> PyResult<bool> {
        let source = self.reader.source(name).py_err()?;
        let ids = Imported::from_any(ids)?.index_ids(source.len())?;
        let im = Imported::from_any(out)?;
        let Some((ptr, len)) = im.writable_ptr() else { return Ok(false) };
        let addr = ptr as usize;
        // SAFETY: `im` keeps `out`'s memory alive until after the call (it is dropped at the end
        // of this function, with the GIL held); the producer marked it writable and it is
        // C-contiguous and `len` bytes long. Python code racing on the same array while the
        // GIL is released sees torn rows, never memory outside the array.
        py.detach(|| unsafe { source.gather_into(crate::store::Ids::List(&ids), addr as *mut u8, len, &ReadOptions::default()) }).py_err()?;
        drop(im);
        Ok(true)
    }

    /// `name`'s counters as a dict.
    fn profile<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        let p = self.reader.profile(name).py_err()?;
        let d = PyDict::new(py);
        d.set_item("calls", p.calls)?;
        d.set_item("rows", p.rows)?;
        d.set_item("bytes", p.bytes)?;
        d.set_item("requests", p.requests)?;
        d.set_item("local", p.local_s)?;
        d.set_item("wait", p.wait_s)?;
        d.set_item("transfer", p.transfer_s)?;
        Ok(d)
    }
}

/// File-based `allgather` / `barrier` for ranks without MPI.
#[pyclass(name = "_FileComm", module = "zrecord", subclass)]
pub struct PyFileComm {
    comm: FileComm,
}

#[pymethods]
impl PyFileComm {
    #[new]
    #[pyo3(signature = (dir, rank, size, ns, timeout = 120.0))]
    fn new(dir: PathBuf, rank: usize, size: usize, ns: &str, timeout: f64) -> PyResult<Self> {
        if !(timeout.is_finite() && timeout > 0.0 && timeout < 1e7) {
            return Err(PyValueError::new_err(format!("timeout {timeout} s; give a positive number of seconds")));
        }
        let comm = FileComm::new(dir, rank, size, ns).py_err()?.with_timeout(std::time::Duration::from_secs_f64(timeout));
        Ok(PyFileComm { comm })
    }

    /// Every rank's `obj` (bytes), in rank order. `zrecord.dist.FileComm.allgather` pickles.
    fn _allgather_bytes(&mut self, py: Python<'_>, msg: &[u8]) -> PyResult<Vec<Vec<u8>>> {
        let msg = msg.to_vec();
        let comm = &mut self.comm;
        py.detach(|| comm.allgather(&msg)).py_err()
    }

    fn barrier(&mut self, py: Python<'_>) -> PyResult<()> {
        let comm = &mut self.comm;
        py.detach(|| comm.barrier()).py_err()
    }

    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    #[getter]
    fn size(&self) -> usize {
        self.comm.size()
    }

    #[getter]
    fn dir(&self) -> PathBuf {
        self.comm.dir().to_path_buf()
    }

    #[getter]
    fn ns(&self) -> String {
        self.comm.ns().to_string()
    }
}
