//! Allocator, DLTensor and RaggedBatch for Python: DLPack and Arrow PyCapsule exports.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StructArray};
use arrow_schema::{Field, FieldRef};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyList, PyTuple};

use crate::arrow::{column_from_ragged, dense_to_arrow};
use crate::store::Logical;
use crate::dtype::DType;
use crate::memory::dlpack::{DLManagedTensor, DLManagedTensorVersioned};
use crate::memory::{Allocator, RaggedBatch, RaggedInput, Tensor, TensorView, DEFAULT_POOL_SIZE_BYTES};
use crate::python::errors::IntoPy;
use crate::python::input::Imported;

const VERSIONED: &CStr = c"dltensor_versioned";
const LEGACY: &CStr = c"dltensor";

/// The Python-visible dtype of a catalog entry: a NumPy dtype (ml_dtypes for bfloat16 and
/// float8 when installed), else the name.
pub(crate) fn py_dtype(py: Python<'_>, d: DType) -> PyResult<Py<PyAny>> {
    let m = py.import("zrecord.dtypes")?;
    Ok(m.call_method1("as_numpy", (d.name(),))?.unbind())
}

/// `(zrecord._pickle.allocator, (pool id, pid, device, pool size))`.
type AllocatorReduce<'py> = (Bound<'py, PyAny>, (usize, u32, &'static str, usize, Option<usize>));

/// A CPU placement allocator with a bounded idle pool.
#[pyclass(name = "Allocator", module = "zrecord", frozen, weakref)]
pub struct PyAllocator {
    pub(crate) inner: Allocator,
}

#[pymethods]
impl PyAllocator {
    #[new]
    /// `pool_size_bytes` bounds idle pooled bytes, `max_bytes` caps live bytes. `pool_size=`
    /// is the old name of `pool_size_bytes` (still accepted, with a DeprecationWarning).
    #[pyo3(signature = (device = "cpu", pool_size_bytes = None, max_bytes = None, *, pool_size = None))]
    fn new(py: Python<'_>, device: &str, pool_size_bytes: Option<usize>, max_bytes: Option<usize>, pool_size: Option<usize>) -> PyResult<Self> {
        if device != "cpu" {
            return Err(PyValueError::new_err(format!("device '{device}' is not supported; this build places batches on 'cpu'")));
        }
        let pool = match (pool_size_bytes, pool_size) {
            (Some(_), Some(_)) => return Err(PyTypeError::new_err("Allocator() got both pool_size_bytes and its old name pool_size")),
            (Some(b), None) => b,
            (None, Some(b)) => {
                deprecated(py, "Allocator(pool_size=...) is deprecated: use pool_size_bytes=")?;
                b
            }
            (None, None) => DEFAULT_POOL_SIZE_BYTES,
        };
        Ok(PyAllocator { inner: Allocator::cpu_with_limit(pool, max_bytes) })
    }

    /// Hard cap on live bytes (size classes), or None. A batch past it raises MemoryError.
    #[getter]
    fn max_bytes(&self) -> Option<usize> {
        self.inner.max_bytes()
    }

    /// `"cpu"`.
    #[getter]
    fn device(&self) -> &'static str {
        "cpu"
    }

    /// Bound on idle pooled bytes.
    #[getter]
    fn pool_size_bytes(&self) -> usize {
        self.inner.pool_size_bytes()
    }

    /// Old name of `pool_size_bytes` (DeprecationWarning).
    #[getter]
    fn pool_size(&self, py: Python<'_>) -> PyResult<usize> {
        deprecated(py, "Allocator.pool_size is deprecated: use pool_size_bytes")?;
        Ok(self.inner.pool_size_bytes())
    }

    /// Counters: live_bytes, idle_bytes, reused, fresh.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("live_bytes", s.live_bytes)?;
        d.set_item("idle_bytes", s.idle_bytes)?;
        d.set_item("reused", s.reused)?;
        d.set_item("fresh", s.fresh)?;
        Ok(d)
    }

    /// Stop pooling; live batches stay valid.
    fn close(&self) {
        self.inner.close();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.inner.close();
        false
    }

    fn __repr__(&self) -> String {
        match self.inner.max_bytes() {
            Some(m) => format!("Allocator('cpu', pool_size_bytes={}, max_bytes={m})", self.inner.pool_size_bytes()),
            None => format!("Allocator('cpu', pool_size_bytes={})", self.inner.pool_size_bytes()),
        }
    }

    /// Pickles as (device, pool size, pool identity): unpickled in another process it is a
    /// fresh, empty pool, shared by every view of the same original pool unpickled there.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<AllocatorReduce<'py>> {
        let f = py.import("zrecord._pickle")?.getattr("allocator")?;
        Ok((f, (self.inner.id(), std::process::id(), "cpu", self.inner.pool_size_bytes(), self.inner.max_bytes())))
    }
}

unsafe extern "C" fn versioned_capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by CPython with the capsule being destroyed. If it still carries the
    // original name, no consumer took ownership, so we call the deleter (exactly once).
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr()) as *mut DLManagedTensorVersioned;
            if let Some(d) = p.as_ref().and_then(|m| m.deleter) {
                d(p);
            }
        }
    }
}

unsafe extern "C" fn legacy_capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: as above, for the legacy capsule name.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr()) as *mut DLManagedTensor;
            if let Some(d) = p.as_ref().and_then(|m| m.deleter) {
                d(p);
            }
        }
    }
}

/// Export a tensor as a DLPack capsule (versioned when the consumer asks for >= 1.0).
pub(crate) fn dlpack_capsule<'py>(py: Python<'py>, t: &Tensor, versioned: bool, read_only: bool) -> PyResult<Bound<'py, PyCapsule>> {
    if versioned {
        let m = t.to_dlpack_versioned(read_only);
        // SAFETY: `m` is a live managed tensor owned by the capsule from now on; the destructor
        // frees it unless a consumer renames the capsule (then the consumer calls the deleter).
        unsafe { PyCapsule::new_with_pointer_and_destructor(py, m.cast::<c_void>(), VERSIONED, Some(versioned_capsule_destructor)) }
    } else {
        let m = t.to_dlpack_legacy();
        // SAFETY: as above, legacy form.
        unsafe { PyCapsule::new_with_pointer_and_destructor(py, m.cast::<c_void>(), LEGACY, Some(legacy_capsule_destructor)) }
    }
}

/// A DLPack-only CPU tensor living in a pooled allocation.
#[pyclass(name = "DLTensor", module = "zrecord", frozen)]
pub struct PyDLTensor {
    tensor: Tensor,
    /// True when axis 0 is a batch of records (Arrow export makes one row per record).
    batched: bool,
    /// Exported with DLPack's read-only flag (batch metadata: `cu_seqlens`, `shapes`).
    read_only: bool,
}

impl PyDLTensor {
    pub(crate) fn new(tensor: Tensor, batched: bool) -> Self {
        PyDLTensor { tensor, batched, read_only: false }
    }

    /// A tensor exported read-only where the consumer honours DLPack's flag (versioned
    /// DLPack; NumPy >= 2.1 then makes a read-only array). Rust re-checks such metadata
    /// before trusting it anyway: legacy DLPack has no flag.
    pub(crate) fn read_only(tensor: Tensor) -> Self {
        PyDLTensor { tensor, batched: false, read_only: true }
    }

    pub(crate) fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    fn arrow(&self) -> PyResult<(FieldRef, ArrayRef)> {
        if self.batched {
            dense_to_arrow("data", &self.tensor).py_err()
        } else {
            let mut shape = vec![1];
            shape.extend_from_slice(self.tensor.shape());
            let one = self.tensor.reshaped(shape).py_err()?;
            dense_to_arrow("data", &one).py_err()
        }
    }
}

#[pymethods]
impl PyDLTensor {
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        if let Some(s) = stream {
            if !s.is_none() {
                let v: i64 = s.extract().unwrap_or(-1);
                if v != -1 && v != 0 {
                    return Err(PyBufferError::new_err("stream must be None for CPU tensors"));
                }
            }
        }
        if let Some(dev) = dl_device {
            if dev != (1, 0) {
                return Err(PyBufferError::new_err(format!("cannot export a CPU tensor to device {dev:?}")));
            }
        }
        let versioned = max_version.map(|(major, _)| major >= 1).unwrap_or(false);
        if copy == Some(true) {
            let a = Allocator::cpu(0);
            let fresh = Tensor::from_slice(&a, self.tensor.as_bytes(), &[self.tensor.nbytes()]).py_err()?;
            let t = fresh.reinterpret(self.tensor.dtype(), self.tensor.shape().to_vec()).py_err()?;
            return dlpack_capsule(py, &t, versioned, false);
        }
        dlpack_capsule(py, &self.tensor, versioned, self.read_only)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (1, 0)
    }

    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_array__<'py>(&self, py: Python<'py>, requested_schema: Option<Bound<'py, PyCapsule>>) -> PyResult<Bound<'py, PyTuple>> {
        let (field, array) = self.arrow()?;
        Ok(pyo3_arrow::ffi::to_array_pycapsules(py, field, &array, requested_schema)?)
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.shape())
    }

    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        py_dtype(py, self.tensor.dtype())
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.tensor.ndim()
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.tensor.nbytes()
    }

    #[getter]
    fn device(&self) -> (i32, i32) {
        (1, 0)
    }

    /// Address of the first element (for zero-copy checks).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.tensor.data_ptr() as usize
    }

    fn __len__(&self) -> PyResult<usize> {
        self.tensor.shape().first().copied().ok_or_else(|| PyTypeError::new_err("len() of a 0-d tensor"))
    }

    fn __repr__(&self) -> String {
        format!("DLTensor(shape={:?}, dtype={}, device=cpu)", self.tensor.shape(), self.tensor.dtype())
    }
}

enum RaggedRepr {
    Owned(RaggedBatch),
    Foreign { values: Py<PyAny>, cu_seqlens: Py<PyAny>, shapes: Py<PyAny> },
}

/// A packed batch of variable-shape records: values, int32 cu_seqlens, uint64 shapes.
#[pyclass(name = "RaggedBatch", module = "zrecord", frozen)]
pub struct PyRaggedBatch {
    repr: RaggedRepr,
    /// What the records are: tensors, or UTF-8 / binary strings (uint8 ndim-1 records), as the
    /// stream they were read from says. Decides the Arrow export and `to_pylist`.
    logical: Logical,
}

impl PyRaggedBatch {
    pub(crate) fn owned(b: RaggedBatch) -> Self {
        PyRaggedBatch { repr: RaggedRepr::Owned(b), logical: Logical::Tensor }
    }

    /// A batch read from a stream of `logical` records (strings stay strings on every path).
    pub(crate) fn owned_as(b: RaggedBatch, logical: Logical) -> Self {
        PyRaggedBatch { repr: RaggedRepr::Owned(b), logical }
    }

    /// Run `f` over this batch as append input (importing foreign fields zero-copy).
    pub(crate) fn with_input<R>(&self, py: Python<'_>, f: impl FnOnce(&RaggedInput<'_>) -> PyResult<R>) -> PyResult<R> {
        match &self.repr {
            RaggedRepr::Owned(b) => f(&b.as_input()),
            RaggedRepr::Foreign { values, cu_seqlens, shapes } => {
                let v = Imported::from_any(values.bind(py))?;
                let c = Imported::from_any(cu_seqlens.bind(py))?;
                let s = Imported::from_any(shapes.bind(py))?;
                f(&RaggedInput::new(v.view()?, c.view()?, s.view()?))
            }
        }
    }

    /// Field 0 (values), 1 (cu_seqlens) or 2 (shapes): a DLTensor view of an owned batch, or
    /// the producer's own object for a batch built from foreign fields.
    fn part(&self, py: Python<'_>, which: usize) -> PyResult<Py<PyAny>> {
        match &self.repr {
            RaggedRepr::Owned(b) => {
                let t = [b.values(), b.cu_seqlens(), b.shapes()][which].clone();
                let t = if which == 0 { PyDLTensor::new(t, false) } else { PyDLTensor::read_only(t) };
                Ok(Py::new(py, t)?.into_any())
            }
            RaggedRepr::Foreign { values, cu_seqlens, shapes } => Ok([values, cu_seqlens, shapes][which].clone_ref(py)),
        }
    }

    /// The batch as an owned (pooled) RaggedBatch, packing foreign fields once if needed.
    pub(crate) fn to_owned_batch(&self, py: Python<'_>) -> PyResult<RaggedBatch> {
        match &self.repr {
            RaggedRepr::Owned(b) => Ok(b.clone()),
            RaggedRepr::Foreign { .. } => self.with_input(py, |i| RaggedBatch::copy_from_input(&Allocator::cpu(0), i).py_err()),
        }
    }
}

#[pymethods]
impl PyRaggedBatch {
    #[new]
    #[pyo3(signature = (values, cu_seqlens, shapes, logical = "tensor"))]
    fn new(py: Python<'_>, values: Py<PyAny>, cu_seqlens: Py<PyAny>, shapes: Py<PyAny>, logical: &str) -> PyResult<Self> {
        let logical: Logical = logical.parse().py_err()?;
        let b = PyRaggedBatch { repr: RaggedRepr::Foreign { values, cu_seqlens, shapes }, logical };
        if logical.is_bytes() {
            let v = b.to_owned_batch(py)?;
            if v.dtype() != DType::UInt8 || v.ndim() != 1 {
                return Err(PyValueError::new_err(format!("logical '{logical}' needs uint8 ndim-1 records, got {} ndim {}", v.dtype(), v.ndim())));
            }
        }
        Ok(b)
    }

    /// Pack a finite iterable of arrays (one dtype, one ndim >= 1) into a batch.
    #[staticmethod]
    fn from_records(py: Python<'_>, records: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut imported = Vec::new();
        for r in records.try_iter()? {
            imported.push(Imported::from_any(&r?)?);
        }
        let Some(first) = imported.first() else {
            return Err(PyValueError::new_err("from_records needs at least one record (the dtype and ndim come from it)"));
        };
        let (dtype, ndim) = (first.dtype, first.shape.len());
        if ndim == 0 {
            return Err(PyValueError::new_err("ragged records need ndim >= 1; store scalars in a dense store with item_shape ()"));
        }
        let mut views: Vec<(TensorView<'_>, usize)> = Vec::with_capacity(imported.len());
        for (i, im) in imported.iter().enumerate() {
            if im.dtype != dtype {
                return Err(PyTypeError::new_err(format!("record {i} has dtype {}, record 0 has {dtype}", im.dtype)));
            }
            if im.shape.len() != ndim {
                return Err(PyValueError::new_err(format!("record {i} has ndim {}, record 0 has {ndim}", im.shape.len())));
            }
            let v = im.view()?;
            v.check(&format!("record {i}")).py_err()?;
            views.push((v, i));
        }
        let b = py.detach(|| RaggedBatch::pack(&Allocator::cpu(0), dtype, ndim, views.iter().map(|(v, _)| v))).py_err()?;
        Ok(PyRaggedBatch::owned(b))
    }

    #[getter]
    fn values(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.part(py, 0)
    }

    #[getter]
    fn cu_seqlens(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.part(py, 1)
    }

    #[getter]
    fn shapes(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.part(py, 2)
    }

    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let d = match &self.repr {
            RaggedRepr::Owned(b) => b.dtype(),
            RaggedRepr::Foreign { values, .. } => Imported::from_any(values.bind(py))?.dtype,
        };
        py_dtype(py, d)
    }

    /// `"tensor"`, `"utf8"` or `"binary"`: what the records are (from the stream they were read
    /// from). utf8 / binary batches export to Arrow as `string_view` / `binary` and
    /// `to_pylist()` gives `str` / `bytes`.
    #[getter]
    fn logical(&self) -> &'static str {
        self.logical.name()
    }

    /// The records as Python objects: `str` (utf8 records, validated), `bytes` (binary) or one
    /// NumPy array per record, shape restored (tensor records; views of the batch's memory).
    fn to_pylist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let b = self.to_owned_batch(py)?;
        b.check().py_err()?;
        if !self.logical.is_bytes() {
            let np = py.import("numpy")?;
            let ts = b.to_tensors().py_err()?;
            let items: Vec<Bound<'py, PyAny>> =
                ts.into_iter().map(|t| np.call_method1("from_dlpack", (Py::new(py, PyDLTensor::new(t, false))?,))).collect::<PyResult<_>>()?;
            return PyList::new(py, items);
        }
        if b.dtype() != DType::UInt8 || b.ndim() != 1 {
            return Err(PyValueError::new_err(format!("a {} batch needs uint8 ndim-1 records, got {} ndim {}", self.logical, b.dtype(), b.ndim())));
        }
        let bytes = b.values().as_bytes();
        let offs = b.cu_seqlens_slice();
        let out = PyList::empty(py);
        for (i, w) in offs.windows(2).enumerate() {
            let s = &bytes[w[0] as usize..w[1] as usize];
            if self.logical == Logical::Utf8 {
                let s = std::str::from_utf8(s).map_err(|e| PyValueError::new_err(format!("record {i} is not valid UTF-8: {e}")))?;
                out.append(pyo3::types::PyString::new(py, s))?;
            } else {
                out.append(pyo3::types::PyBytes::new(py, s))?;
            }
        }
        Ok(out)
    }

    #[getter]
    fn ndim(&self, py: Python<'_>) -> PyResult<usize> {
        match &self.repr {
            RaggedRepr::Owned(b) => Ok(b.ndim()),
            RaggedRepr::Foreign { shapes, .. } => Ok(Imported::from_any(shapes.bind(py))?.shape.get(1).copied().unwrap_or(0)),
        }
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        match &self.repr {
            RaggedRepr::Owned(b) => Ok(b.len()),
            RaggedRepr::Foreign { cu_seqlens, .. } => {
                Ok(Imported::from_any(cu_seqlens.bind(py))?.shape.first().copied().unwrap_or(0).saturating_sub(1))
            }
        }
    }

    /// Per-record, shape-restored DLTensor views (no copy).
    fn to_tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let b = self.to_owned_batch(py)?;
        let ts = b.to_tensors().py_err()?;
        let items: Vec<Py<PyDLTensor>> = ts.into_iter().map(|t| Py::new(py, PyDLTensor::new(t, false))).collect::<PyResult<_>>()?;
        PyList::new(py, items)
    }

    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_array__<'py>(&self, py: Python<'py>, requested_schema: Option<Bound<'py, PyCapsule>>) -> PyResult<Bound<'py, PyTuple>> {
        let b = self.to_owned_batch(py)?;
        let (field, array) = column_from_ragged("data", &b, self.logical).py_err()?;
        Ok(pyo3_arrow::ffi::to_array_pycapsules(py, field, &array, requested_schema)?)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.to_owned_batch(py) {
            Ok(b) if self.logical.is_bytes() => format!("RaggedBatch(records={}, logical={}, bytes={})", b.len(), self.logical, b.values().numel()),
            Ok(b) => format!("RaggedBatch(records={}, dtype={}, ndim={}, values={})", b.len(), b.dtype(), b.ndim(), b.values().numel()),
            Err(_) => "RaggedBatch(<invalid fields>)".to_string(),
        }
    }
}

/// A RecordBatch leaving through the Arrow PyCapsule interface.
#[pyclass(name = "ArrowBatch", module = "zrecord", frozen)]
pub struct PyArrowBatch {
    batch: RecordBatch,
}

impl PyArrowBatch {
    pub(crate) fn new(batch: RecordBatch) -> Self {
        PyArrowBatch { batch }
    }
}

#[pymethods]
impl PyArrowBatch {
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_array__<'py>(&self, py: Python<'py>, requested_schema: Option<Bound<'py, PyCapsule>>) -> PyResult<Bound<'py, PyTuple>> {
        let st: StructArray = self.batch.clone().into();
        let field: FieldRef = Arc::new(Field::new_struct("", st.fields().clone(), false).with_metadata(self.batch.schema().metadata().clone()));
        Ok(pyo3_arrow::ffi::to_array_pycapsules(py, field, &st, requested_schema)?)
    }

    #[getter]
    fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }
}

/// Emit a `DeprecationWarning` (stack level: the caller's line).
fn deprecated(py: Python<'_>, msg: &str) -> PyResult<()> {
    let cat = py.get_type::<pyo3::exceptions::PyDeprecationWarning>();
    let msg = std::ffi::CString::new(msg).map_err(|e| PyValueError::new_err(e.to_string()))?;
    PyErr::warn(py, &cat, &msg, 1)
}

/// `pyarrow.Table.from_batches([pyarrow.record_batch(batch)])`: a view's records as a table
/// sharing the gathered memory (the Arrow PyCapsule interface carries it, no copy).
pub(crate) fn arrow_table(py: Python<'_>, batch: PyArrowBatch) -> PyResult<Py<PyAny>> {
    let pa = py.import("pyarrow")?;
    let rb = pa.call_method1("record_batch", (batch,))?;
    let table = pa.getattr("Table")?.call_method1("from_batches", (vec![rb],))?;
    Ok(table.unbind())
}
