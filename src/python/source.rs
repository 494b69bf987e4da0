//! Record sources for Python.
//!
//! - `SourceView`: any record source bound to an allocator. Built from a store or view, or from
//!   a Python object that implements the record-source protocol (`PythonSource` below). New
//!   Rust sources (Zarr crops, remote and distributed stores) hand out a `SourceView` from
//!   their own thin Python class; the Loader, `ArrowLoader` and SQL take it like a store view.
//! - `DatasetWriter`: Arrow data of any producer (`__arrow_c_stream__` / `__arrow_c_array__`)
//!   streamed into a new dataset root, one batch in memory at a time, published atomically.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatchReader;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::arrow::{batch_column, stream_field, DatasetWriter};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{Allocator, RaggedBatch, Tensor};
use crate::python::errors::{to_py, IntoPy};
use crate::python::input::{dtype_arg, shape_arg, Imported};
use crate::python::memory::{py_dtype, PyAllocator, PyArrowBatch, PyDLTensor, PyRaggedBatch};
use crate::python::store::{parse_key, OpenFlag, PyDenseStore, PyRaggedStore, PyRecordIter, Selection};
use crate::store::{Batch, Ids, Layout, Logical, ReadOptions, RecordSource, SourceView, WriterOptions};

/// A record source implemented in Python: an object with `__len__`, `dtype`, either
/// `item_shape` (dense) or `ndim` (ragged), optionally `logical` and `name`, and
/// `gather(ids)` (ids: a uint64 DLPack tensor; returns an array of shape `(len(ids),
/// *item_shape)` or a `RaggedBatch`). Ids are validated before `gather` is called; what it
/// returns is checked against the declared dtype and shape, then copied into the allocator.
struct PythonSource {
    obj: Py<PyAny>,
    name: String,
    len: u64,
    dtype: DType,
    layout: Layout,
    logical: Logical,
}

impl std::fmt::Debug for PythonSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PythonSource('{}', {} x {} {})", self.name, self.len, self.dtype, self.layout)
    }
}

impl PythonSource {
    fn from_object(obj: &Bound<'_, PyAny>) -> PyResult<PythonSource> {
        let missing = |what: &str| PyTypeError::new_err(format!("a record source needs {what}; {} has none", obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()));
        if !obj.hasattr("gather")? {
            return Err(missing("a gather(ids) method"));
        }
        let len: u64 = obj.len().map_err(|_| missing("__len__"))? as u64;
        let dtype = dtype_arg(&obj.getattr("dtype").map_err(|_| missing("a dtype"))?)?;
        let layout = if let Ok(shape) = obj.getattr("item_shape") {
            Layout::Dense { item_shape: shape_arg(&shape)? }
        } else if let Ok(nd) = obj.getattr("ndim") {
            let ndim: usize = nd.extract()?;
            if ndim == 0 {
                return Err(PyValueError::new_err("a ragged source needs ndim >= 1"));
            }
            Layout::Ragged { ndim }
        } else {
            return Err(missing("item_shape (dense) or ndim (ragged)"));
        };
        let logical: Logical = match obj.getattr("logical") {
            Ok(l) => l.extract::<String>()?.parse().py_err()?,
            Err(_) => Logical::Tensor,
        };
        if logical.is_bytes() && !(dtype == DType::UInt8 && layout == (Layout::Ragged { ndim: 1 })) {
            return Err(PyValueError::new_err(format!("logical {logical} needs uint8 ndim-1 ragged records")));
        }
        let name = match obj.getattr("name") {
            Ok(n) => n.extract::<String>().unwrap_or_else(|_| "python source".into()),
            Err(_) => format!("python source {}", obj.get_type().name()?),
        };
        Ok(PythonSource { obj: obj.clone().unbind(), name, len, dtype, layout, logical })
    }

    fn gather_py(&self, py: Python<'_>, ids: Ids<'_>, allocator: &Allocator) -> PyResult<Batch> {
        let n = ids.len();
        let ids_t = match ids {
            Ids::List(l) => Tensor::from_slice(&Allocator::cpu(0), l, &[n]),
            range => Tensor::from_slice(&Allocator::cpu(0), &(0..n).map(|k| range.get(k)).collect::<Vec<_>>(), &[n]),
        }
        .py_err()?;
        let out = self.obj.bind(py).call_method1("gather", (PyDLTensor::new(ids_t, true),))?;
        match &self.layout {
            Layout::Dense { item_shape } => {
                let im = Imported::from_any(&out)?;
                let mut want = vec![n];
                want.extend_from_slice(item_shape);
                if im.dtype != self.dtype || im.shape != want {
                    return Err(PyValueError::new_err(format!(
                        "source '{}' gather returned {} {:?}, expected {} {want:?}",
                        self.name, im.dtype, im.shape, self.dtype
                    )));
                }
                let v = im.view()?;
                v.check("gathered batch").py_err()?;
                // A copy: the producer's memory is not ours to keep.
                let t = Tensor::from_slice(allocator, v.bytes, &[im.bytes().len()]).py_err()?;
                Ok(Batch::Dense(t.reinterpret(self.dtype, want).py_err()?))
            }
            Layout::Ragged { ndim } => {
                let b = out.cast::<PyRaggedBatch>().map_err(|_| PyTypeError::new_err(format!("source '{}' gather must return a RaggedBatch", self.name)))?;
                let rb = b.get().with_input(py, |input| {
                    let valid = input.validate_with(self.dtype, *ndim, true).py_err()?;
                    if valid.len != n {
                        return Err(PyValueError::new_err(format!("source '{}' gather returned {} records for {} ids", self.name, valid.len, n)));
                    }
                    RaggedBatch::copy_from_input(allocator, input).py_err()
                })?;
                Ok(Batch::Ragged(rb))
            }
        }
    }
}

/// Run `f` holding the GIL, from any thread in any state. Gathers reach Python from the
/// loader's Rust threads, DataFusion's runtime, and from threads where a consumer (pyarrow
/// reading our Arrow stream) released the GIL inside a call pyo3 still counts as attached, so
/// `Python::attach` (which trusts that count) is not enough there.
fn with_python<R>(f: impl FnOnce(Python<'_>) -> R) -> R {
    struct Release(pyo3::ffi::PyGILState_STATE);
    impl Drop for Release {
        fn drop(&mut self) {
            // SAFETY: pairs with the `PyGILState_Ensure` below, on the same thread.
            unsafe { pyo3::ffi::PyGILState_Release(self.0) }
        }
    }
    // SAFETY: `PyGILState_Ensure` makes this thread hold the GIL whatever its state (it takes
    // the GIL if the thread's state is detached, and nests if it is held); the token is used
    // only inside `f`, while `_release` keeps the GIL held; its drop restores the prior state.
    let _release = Release(unsafe { pyo3::ffi::PyGILState_Ensure() });
    // SAFETY: the GIL is held (above) for as long as `f` runs.
    f(unsafe { Python::assume_attached() })
}

impl RecordSource for PythonSource {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn record_type(&self) -> crate::store::RecordType {
        crate::store::RecordType { dtype: self.dtype, layout: self.layout.clone(), logical: self.logical }
    }

    fn gather(&self, ids: Ids<'_>, allocator: &Allocator, _options: &ReadOptions) -> Result<Batch> {
        ids.validate(self.len, std::path::Path::new(&self.name))?;
        with_python(|py| {
            self.gather_py(py, ids, allocator)
                .map_err(|e| Error::invalid("record source", format!("'{}' gather failed: {}", self.name, e.value(py))))
        })
    }
}

/// Any record source bound to an allocator: `view[i]`, `view[[i, j]]`, `view[a:b]`,
/// `view.gather(ids)`, `view.to_arrow_batch()`; accepted by `Loader`, `ArrowLoader` and
/// `SessionContext.register_sources`. `DenseView` and `RaggedView` (a store's views) are its
/// subclasses: every read method is this class's.
#[pyclass(name = "SourceView", module = "zrecord", frozen, subclass)]
pub struct PySourceView {
    view: SourceView,
    /// `(callable, args)` that rebuild this view in another process (for pickling), if known.
    reduce: Option<Py<PyAny>>,
    /// The store's open flag for a store's view: reads raise once the store was closed.
    flag: Option<OpenFlag>,
    /// The stream's one name: the view's `name`, its `to_arrow` column, its SQL column.
    stream: String,
}

impl PySourceView {
    /// A view with a known recipe for pickling: `reduce` is a `(callable, args)` tuple. Named
    /// as its source names itself (`named` renames it).
    pub(crate) fn with_reduce(view: SourceView, reduce: Option<Py<PyAny>>) -> Self {
        let stream = view.source().name();
        PySourceView { view, reduce, flag: None, stream }
    }

    /// The same view under the stream name `stream` (a dataset root's stream).
    pub(crate) fn named(mut self, stream: impl Into<String>) -> Self {
        self.stream = stream.into();
        self
    }

    /// The base part of a store's typed view (`DenseView`, `RaggedView`).
    pub(crate) fn of_store(view: SourceView, flag: OpenFlag, path: &std::path::Path) -> Self {
        PySourceView { view, reduce: None, flag: Some(flag), stream: crate::store::dataset::stream_name_of(path) }
    }

    /// The stream's name (`name` in Python).
    pub(crate) fn stream_name(&self) -> &str {
        &self.stream
    }

    fn check(&self) -> PyResult<()> {
        match &self.flag {
            Some(f) => f.check(),
            None => Ok(()),
        }
    }

    pub(crate) fn view_clone(&self) -> PyResult<SourceView> {
        self.check()?;
        Ok(self.view.clone())
    }

    fn batch_to_py(&self, py: Python<'_>, b: Batch, one: bool) -> PyResult<Py<PyAny>> {
        Ok(match b {
            Batch::Dense(t) if one => Py::new(py, PyDLTensor::new(t.index_axis0(0).py_err()?, false))?.into_any(),
            Batch::Dense(t) => Py::new(py, PyDLTensor::new(t, true))?.into_any(),
            Batch::Ragged(r) => Py::new(py, PyRaggedBatch::owned_as(r, self.view.source().logical()))?.into_any(),
        })
    }

    fn gather_sel(&self, py: Python<'_>, sel: &Selection) -> PyResult<Batch> {
        self.check()?;
        let ids = sel.ids()?;
        py.detach(|| self.view.gather_ids(ids)).py_err()
    }
}

/// A view of any source-like object: our views and stores, or a Python record source.
pub(crate) fn source_view_of(obj: &Bound<'_, PyAny>, allocator: &Allocator, verify_checksums: bool) -> PyResult<SourceView> {
    let options = ReadOptions { verify_checksums, parallel: true };
    if let Ok(v) = obj.cast::<PySourceView>() {
        return v.get().view_clone();
    }
    let source: Arc<dyn RecordSource> = if let Ok(s) = obj.cast::<PyDenseStore>() {
        Arc::new(s.get().store()?)
    } else if let Ok(s) = obj.cast::<PyRaggedStore>() {
        Arc::new(s.get().store()?)
    } else {
        Arc::new(PythonSource::from_object(obj)?)
    };
    Ok(SourceView::new(source, allocator).with_options(options))
}

#[pymethods]
impl PySourceView {
    /// Bind `source` (a store, a view, or a Python object implementing the record-source
    /// protocol) to `allocator`.
    #[new]
    #[pyo3(signature = (source, allocator = None, verify_checksums = true))]
    fn new(source: &Bound<'_, PyAny>, allocator: Option<&PyAllocator>, verify_checksums: bool) -> PyResult<Self> {
        let py = source.py();
        let alloc = allocator.map(|a| a.inner.clone()).unwrap_or_default();
        let view = source_view_of(source, &alloc, verify_checksums)?;
        let args = || -> PyResult<Py<PyAny>> {
            let args = (source.clone(), PyAllocator { inner: alloc.clone() }, verify_checksums).into_pyobject(py)?;
            Ok((py.get_type::<PySourceView>(), args).into_pyobject(py)?.into_any().unbind())
        };
        // A plain SourceView rebinds by its own recipe; a store's typed view (a subclass) or
        // a store pickles itself, and this view is rebuilt around it.
        let (reduce, stream) = if let Ok(v) = source.cast_exact::<PySourceView>() {
            (v.get().reduce.as_ref().map(|r| r.clone_ref(py)), v.get().stream.clone())
        } else if let Ok(v) = source.cast::<PySourceView>() {
            (Some(args()?), v.get().stream.clone())
        } else {
            // A store is named as its stream folder; a Python source by its `name`, else "data".
            let stream = match view.source().store() {
                Some(s) => crate::store::dataset::stream_name_of(s.path()),
                None => source.getattr("name").ok().and_then(|n| n.extract::<String>().ok()).unwrap_or_else(|| "data".into()),
            };
            (Some(args()?), stream)
        };
        Ok(PySourceView { view, reduce, flag: None, stream })
    }

    /// Pickles by how it was made: the store, view or Python source it wraps (which must be
    /// picklable itself), the allocator's pool settings and `verify_checksums`; a dataset
    /// stream as (root, stream name).
    fn __reduce__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.reduce {
            Some(r) => Ok(r.clone_ref(py)),
            None => Err(PyTypeError::new_err(format!("SourceView '{}' was built in Rust and cannot be pickled", self.view.source().name()))),
        }
    }

    /// Whether reads check record checksums.
    #[getter]
    fn verify_checksums(&self) -> bool {
        self.view.options().verify_checksums
    }

    fn __len__(&self) -> PyResult<usize> {
        self.check()?;
        Ok(self.view.len() as usize)
    }

    fn __iter__(slf: Bound<'_, Self>) -> PyResult<PyRecordIter> {
        slf.get().check()?;
        let len = slf.get().view.len();
        Ok(PyRecordIter::new(slf.into_any().unbind(), len))
    }

    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        py_dtype(py, self.view.source().dtype())
    }

    /// "dense" or "ragged".
    #[getter]
    fn kind(&self) -> &'static str {
        self.view.source().layout().kind_name()
    }

    /// The record shape of a dense source, else None.
    #[getter]
    fn item_shape<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        match self.view.source().layout() {
            Layout::Dense { item_shape } => Ok(Some(PyTuple::new(py, item_shape)?)),
            Layout::Ragged { .. } => Ok(None),
        }
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.view.source().layout().ndim()
    }

    #[getter]
    fn logical(&self) -> &'static str {
        self.view.source().logical().name()
    }

    /// The stream's name: a dataset root's stream name, a store's (`root/000-t` is `t`, a
    /// lone store its folder name), a Python source's `name`. `to_arrow` names its column so.
    #[getter]
    fn name(&self) -> String {
        self.stream.clone()
    }

    #[getter]
    fn allocator(&self) -> PyAllocator {
        PyAllocator { inner: self.view.allocator().clone() }
    }

    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let sel = parse_key(key, self.view.len())?;
        let one = matches!(sel, Selection::One(_));
        let b = self.gather_sel(py, &sel)?;
        self.batch_to_py(py, b, one)
    }

    /// Gather ids (any index expression) as one batch.
    fn gather(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let sel = match parse_key(ids, self.view.len())? {
            Selection::One(i) => Selection::List(vec![i]),
            s => s,
        };
        let b = self.gather_sel(py, &sel)?;
        self.batch_to_py(py, b, false)
    }

    /// The records (all, or `indices`) as a `pyarrow.Table` with one column named as the
    /// stream (`name`); the table shares the gathered memory.
    #[pyo3(signature = (indices = None))]
    fn to_arrow(&self, py: Python<'_>, indices: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
        let batch = self.to_arrow_batch(py, indices)?;
        crate::python::memory::arrow_table(py, batch)
    }

    /// The records (all, or `indices`) as an Arrow record batch with one column named as the
    /// stream, of the Arrow type SQL gives the source: `arrow.fixed_shape_tensor` (dense),
    /// `List<T>` or `arrow.variable_shape_tensor` (ragged), `string_view` / `binary_view`.
    #[pyo3(signature = (indices = None))]
    fn to_arrow_batch(&self, py: Python<'_>, indices: Option<&Bound<'_, PyAny>>) -> PyResult<PyArrowBatch> {
        self.check()?;
        let sel = match indices {
            Some(k) => match parse_key(k, self.view.len())? {
                Selection::One(i) => Selection::List(vec![i]),
                s => s,
            },
            None => Selection::Range { start: 0, step: 1, len: self.view.len() as usize },
        };
        let b = self.gather_sel(py, &sel)?;
        let src = self.view.source();
        let field = stream_field(&self.stream, src.as_ref()).py_err()?;
        let col = batch_column(&self.stream, src.as_ref(), &b).py_err()?;
        let schema = Arc::new(arrow_schema::Schema::new(vec![field]));
        Ok(PyArrowBatch::new(arrow_array::RecordBatch::try_new(schema, vec![col]).map_err(|e| PyValueError::new_err(e.to_string()))?))
    }

    fn __repr__(&self) -> String {
        let s = self.view.source();
        format!("SourceView('{}', {} records, {} {}, {})", self.stream, s.len(), s.dtype(), s.layout(), s.logical())
    }
}

/// Streams Arrow data into a new dataset root: `with DatasetWriter(path) as w: w.write(data)`.
#[pyclass(name = "DatasetWriter", module = "zrecord")]
pub struct PyDatasetWriter {
    path: PathBuf,
    options: WriterOptions,
    /// One lock for the whole state, taken with the GIL released (a write may read a
    /// Python-backed stream, which needs the GIL).
    state: Mutex<WriterState>,
    /// Records appended per stream (readable while a write runs, and after publish).
    rows: std::sync::atomic::AtomicU64,
}

enum WriterState {
    /// No data yet: streams and layouts come from the first schema.
    Empty,
    Open(DatasetWriter),
    /// Published, aborted, or failed half-way (then nothing is published).
    Closed,
}

impl PyDatasetWriter {
    fn lock(&self) -> std::sync::MutexGuard<'_, WriterState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The append itself; runs without the GIL (a Python-backed reader takes it per batch).
    fn append_reader_detached(&self, reader: Box<dyn RecordBatchReader + Send>) -> Result<u64> {
        {
            let mut state = self.lock();
            if matches!(*state, WriterState::Empty) {
                *state = WriterState::Open(DatasetWriter::for_schema(&self.path, &reader.schema(), self.options.clone())?);
            }
            let WriterState::Open(w) = &mut *state else { return Err(Error::Closed { what: "dataset writer" }) };
            let r = w.append_reader(reader);
            self.rows.store(w.len(), std::sync::atomic::Ordering::Relaxed);
            if r.is_err() {
                // A half-appended batch leaves streams of unequal length: publish nothing.
                *state = WriterState::Closed;
            }
            r
        }
    }
}

/// A reader that counts the rows passing through into `done` (progress display).
struct CountingReader {
    inner: Box<dyn RecordBatchReader + Send>,
    done: Arc<std::sync::atomic::AtomicU64>,
}

impl Iterator for CountingReader {
    type Item = std::result::Result<arrow_array::RecordBatch, arrow_schema::ArrowError>;
    fn next(&mut self) -> Option<Self::Item> {
        let b = self.inner.next();
        if let Some(Ok(batch)) = &b {
            self.done.fetch_add(batch.num_rows() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        b
    }
}

impl RecordBatchReader for CountingReader {
    fn schema(&self) -> arrow_schema::SchemaRef {
        self.inner.schema()
    }
}

#[pymethods]
impl PyDatasetWriter {
    /// A writer of a new dataset root at `path` (which must not exist). Streams and their
    /// layouts come from the schema of the first data written.
    #[new]
    #[pyo3(signature = (path, codec = "zstd", level = 3, data_shards = 4, dict_bytes = None, allow_empty = false))]
    fn new(path: PathBuf, codec: &str, level: i32, data_shards: usize, dict_bytes: Option<Vec<u8>>, allow_empty: bool) -> PyResult<Self> {
        // Checked again when the first write creates the staging folder; here for an early error.
        if crate::io::path_taken(&path) {
            return Err(to_py(Error::AlreadyExists { path }));
        }
        let codec = codec.parse().py_err()?;
        let options = WriterOptions { codec, level, data_shards, dictionary: dict_bytes, allow_empty, ..Default::default() };
        Ok(PyDatasetWriter { path, options, state: Mutex::new(WriterState::Empty), rows: Default::default() })
    }

    /// Append Arrow data (anything with `__arrow_c_stream__` or `__arrow_c_array__`), one
    /// record batch at a time. Returns the rows written by this call.
    /// `progress`: None shows a tqdm bar of rows when the write runs over 2 s, True at once,
    /// False never.
    #[pyo3(signature = (data, progress = None))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, progress: Option<bool>) -> PyResult<u64> {
        let total: Option<u64> = data.getattr("num_rows").ok().and_then(|n| n.extract().ok());
        let nbytes: Option<u64> = data.getattr("nbytes").ok().and_then(|n| n.extract().ok());
        let reader = arrow_reader(data, "DatasetWriter.write")?;
        crate::python::progress::run_with_progress(py, progress, total, nbytes, "write", "rows", move |done| {
            self.append_reader_detached(Box::new(CountingReader { inner: reader, done }))
        })
    }

    /// Records written per stream.
    fn __len__(&self) -> usize {
        self.rows.load(std::sync::atomic::Ordering::Relaxed) as usize
    }

    #[getter]
    fn path(&self) -> crate::python::PyPath {
        crate::python::PyPath(self.path.clone())
    }

    /// Publish the dataset root (idempotent). Nothing written yet is an error.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| match std::mem::replace(&mut *self.lock(), WriterState::Closed) {
            WriterState::Open(w) => w.finish().map(|_| ()).map_err(to_py),
            WriterState::Closed => Ok(()),
            WriterState::Empty => Err(PyValueError::new_err("nothing was written: a dataset needs a schema (write at least one batch, even an empty one)")),
        })
    }

    /// Discard everything; nothing is published.
    fn abort(&self, py: Python<'_>) {
        // Dropping the writer removes its staging folder.
        py.detach(|| drop(std::mem::replace(&mut *self.lock(), WriterState::Closed)));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (exc_type = None, _exc = None, _tb = None))]
    fn __exit__(&self, py: Python<'_>, exc_type: Option<Bound<'_, PyAny>>, _exc: Option<Bound<'_, PyAny>>, _tb: Option<Bound<'_, PyAny>>) -> PyResult<bool> {
        if exc_type.is_some_and(|e| !e.is_none()) {
            self.abort(py);
        } else {
            self.close(py)?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("DatasetWriter('{}', {} records)", self.path.display(), self.__len__())
    }
}

/// Arrow data from Python as a batch reader: a stream (`__arrow_c_stream__`) or one record
/// batch (`__arrow_c_array__`); anything else is a `TypeError` naming `what` wanted it.
pub(crate) fn arrow_reader(data: &Bound<'_, PyAny>, what: &str) -> PyResult<Box<dyn RecordBatchReader + Send>> {
    if data.hasattr("__arrow_c_stream__")? {
        return data.extract::<pyo3_arrow::PyRecordBatchReader>()?.into_reader();
    }
    if data.hasattr("__arrow_c_array__")? {
        let batch = data.extract::<pyo3_arrow::PyRecordBatch>()?.into_inner();
        let schema = batch.schema();
        return Ok(Box::new(arrow_array::RecordBatchIterator::new(vec![Ok(batch)], schema)));
    }
    Err(PyTypeError::new_err(format!("{what} needs Arrow data (__arrow_c_stream__ or __arrow_c_array__), got {}", data.get_type().name()?)))
}

/// A `dict` of stream name -> store, view or record source, as `register_sources` streams.
pub(crate) fn streams_of(streams: &Bound<'_, PyDict>) -> PyResult<Vec<crate::store::Stream>> {
    let mut out = Vec::new();
    for (k, v) in streams.iter() {
        let name: String = k.extract().map_err(|_| PyTypeError::new_err("stream names must be strings"))?;
        let view = source_view_of(&v, &Allocator::default(), true)?;
        out.push(crate::store::Stream::new(name, view.source().clone()));
    }
    Ok(out)
}
