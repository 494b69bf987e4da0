//! Writers, stores and views for Python.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt, PyList, PySlice, PyTuple};

use crate::dtype::DType;
use crate::python::errors::{to_py, IntoPy};
use crate::python::input::{dtype_arg, shape_arg, Imported};
use crate::python::memory::{py_dtype, PyAllocator, PyDLTensor, PyRaggedBatch};
use crate::python::source::PySourceView;
use crate::store::{
    self, Codec, DenseStore, DenseView, DenseWriter, DictSource, Ids, RaggedStore, RaggedView, RaggedWriter, Store,
    StoreStats, WriterOptions,
};

fn options(codec: &str, dict_bytes: Option<Vec<u8>>, data_shards: usize, level: i32) -> PyResult<WriterOptions> {
    let codec: Codec = codec.parse().py_err()?;
    Ok(WriterOptions { codec, level, data_shards, dictionary: dict_bytes, ..Default::default() })
}

/// The methods both writer classes share: close (publish), abort, len, path, context manager.
macro_rules! writer_class {
    ($ty:ident, { $($extra:tt)* }) => {
        #[pymethods]
        impl $ty {
            $($extra)*

            /// Publish the store (idempotent).
            fn close(&self, py: Python<'_>) -> PyResult<()> {
                py.detach(|| {
                    let w = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
                    match w {
                        Some(w) => w.finish().map(|_| ()).map_err(to_py),
                        None => Ok(()),
                    }
                })
            }

            /// Discard everything written; nothing is published.
            fn abort(&self) {
                drop(self.inner.lock().unwrap_or_else(|p| p.into_inner()).take());
            }

            fn __len__(&self) -> usize {
                self.inner.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|w| w.len() as usize).unwrap_or(0)
            }

            #[getter]
            fn path(&self) -> crate::python::PyPath {
                crate::python::PyPath(self.path.clone())
            }

            fn __enter__(slf: Py<Self>) -> Py<Self> {
                slf
            }

            #[pyo3(signature = (exc_type, _exc = None, _tb = None))]
            fn __exit__(&self, py: Python<'_>, exc_type: Option<Bound<'_, PyAny>>, _exc: Option<Bound<'_, PyAny>>, _tb: Option<Bound<'_, PyAny>>) -> PyResult<bool> {
                match exc_type {
                    Some(t) if !t.is_none() => self.abort(),
                    _ => self.close(py)?,
                }
                Ok(false)
            }
        }
    };
}

/// Writes a dense store; `close()` (or leaving the `with` block) publishes it.
#[pyclass(name = "DenseWriter", module = "zrecord", frozen)]
pub struct PyDenseWriter {
    inner: Mutex<Option<DenseWriter>>,
    path: PathBuf,
}

writer_class!(PyDenseWriter, {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (path, dtype, item_shape, codec, dict_bytes = None, data_shards = 4, level = 3))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        dtype: &Bound<'_, PyAny>,
        item_shape: &Bound<'_, PyAny>,
        codec: &str,
        dict_bytes: Option<Vec<u8>>,
        data_shards: usize,
        level: i32,
    ) -> PyResult<Self> {
        let dtype = dtype_arg(dtype)?;
        let shape = shape_arg(item_shape)?;
        let opts = options(codec, dict_bytes, data_shards, level)?;
        let p = path.clone();
        let w = py.detach(move || DenseWriter::create(&p, dtype, &shape, opts)).py_err()?;
        Ok(PyDenseWriter { inner: Mutex::new(Some(w)), path })
    }

    /// Append a C-contiguous batch `(n, *item_shape)` from any DLPack CPU producer.
    /// `progress`: None shows a tqdm bar when the append runs over 2 s, True at once, False never.
    #[pyo3(signature = (batch, progress = None))]
    fn append(&self, py: Python<'_>, batch: &Bound<'_, PyAny>, progress: Option<bool>) -> PyResult<()> {
        let imported = Imported::from_any(batch)?;
        let view = imported.view()?;
        let total = view.shape.first().map(|&n| n as u64);
        let nbytes = Some(view.bytes.len() as u64);
        crate::python::progress::run_with_progress(py, progress, total, nbytes, "append", "rec", |done| {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let w = g.as_mut().ok_or(crate::error::Error::Closed { what: "writer" })?;
            w.set_progress(Some(done));
            let r = w.append(&view);
            w.set_progress(None);
            r
        })
    }

});

/// Writes a ragged store from packed `RaggedBatch`es.
#[pyclass(name = "RaggedWriter", module = "zrecord", frozen)]
pub struct PyRaggedWriter {
    inner: Mutex<Option<RaggedWriter>>,
    path: PathBuf,
}

writer_class!(PyRaggedWriter, {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (path, dtype, ndim, codec, dict_bytes = None, data_shards = 4, level = 3, logical = "tensor", allow_empty = false))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        dtype: &Bound<'_, PyAny>,
        ndim: usize,
        codec: &str,
        dict_bytes: Option<Vec<u8>>,
        data_shards: usize,
        level: i32,
        logical: &str,
        allow_empty: bool,
    ) -> PyResult<Self> {
        let dtype = dtype_arg(dtype)?;
        let logical: crate::store::Logical = logical.parse().py_err()?;
        let opts = options(codec, dict_bytes, data_shards, level)?.logical(logical).allow_empty(allow_empty);
        let p = path.clone();
        let w = py.detach(move || RaggedWriter::create(&p, dtype, ndim, opts)).py_err()?;
        Ok(PyRaggedWriter { inner: Mutex::new(Some(w)), path })
    }

    /// Append a `RaggedBatch` (values, int32 cu_seqlens, uint64 shapes). `progress` as for
    /// `DenseWriter.append`.
    #[pyo3(signature = (batch, progress = None))]
    fn append(&self, py: Python<'_>, batch: &Bound<'_, PyAny>, progress: Option<bool>) -> PyResult<()> {
        let b = batch.cast::<PyRaggedBatch>().map_err(|_| {
            PyTypeError::new_err("RaggedWriter.append takes a RaggedBatch (build one with RaggedBatch(values, cu_seqlens, shapes) or RaggedBatch.from_records)")
        })?;
        b.get().with_input(py, |input| {
            let total = input.shapes.shape.first().map(|&n| n as u64);
            let nbytes = Some(input.values.bytes.len() as u64);
            crate::python::progress::run_with_progress(py, progress, total, nbytes, "append", "rec", |done| {
                let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                let w = g.as_mut().ok_or(crate::error::Error::Closed { what: "writer" })?;
                w.set_progress(Some(done));
                let r = w.append(input);
                w.set_progress(None);
                r
            })
        })
    }

});

fn stats_dict<'py>(py: Python<'py>, s: StoreStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("record_count", s.record_count)?;
    d.set_item("raw_bytes", s.raw_bytes)?;
    d.set_item("stored_bytes", s.stored_bytes)?;
    d.set_item("file_bytes", s.file_bytes)?;
    d.set_item("data_shards", s.data_shards)?;
    d.set_item("level", s.level)?;
    d.set_item("compression_ratio", s.compression_ratio())?;
    Ok(d)
}

/// Open/closed flag shared by a store and its views.
#[derive(Clone, Default)]
pub(crate) struct OpenFlag(Arc<AtomicBool>);

impl OpenFlag {
    fn new() -> Self {
        OpenFlag(Arc::new(AtomicBool::new(true)))
    }
    pub(crate) fn check(&self) -> PyResult<()> {
        if self.0.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(PyValueError::new_err("the store was closed; its views can no longer be read"))
        }
    }
    fn close(&self) {
        self.0.store(false, Ordering::Release);
    }
}

macro_rules! store_class {
    ($ty:ident, $store:ident, { $($extra:tt)* }) => {
        impl $ty {
            pub(crate) fn store(&self) -> PyResult<$store> {
                self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone().ok_or_else(|| PyValueError::new_err("store is closed"))
            }
            fn wrap(s: $store) -> Self {
                $ty { inner: Mutex::new(Some(s)), flag: OpenFlag::new() }
            }
        }

        #[pymethods]
        impl $ty {
            $($extra)*
            #[new]
            fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
                Ok(Self::wrap(py.detach(move || $store::open(&path)).py_err()?))
            }
            fn __repr__(&self) -> String {
                match self.store() {
                    Ok(s) => format!("{s:?}"),
                    Err(_) => concat!(stringify!($store), "(<closed>)").into(),
                }
            }

            fn __len__(&self) -> PyResult<usize> {
                Ok(self.store()?.len() as usize)
            }
            #[getter]
            fn dtype(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
                py_dtype(py, self.store()?.dtype())
            }
            #[getter]
            fn codec(&self) -> PyResult<&'static str> {
                Ok(self.store()?.codec().name())
            }
            /// What the records mean: "tensor", "utf8" or "binary" (format version 2).
            #[getter]
            fn logical(&self) -> PyResult<&'static str> {
                Ok(self.store()?.logical().name())
            }
            /// The format version the store was written with.
            #[getter]
            fn format_version(&self) -> PyResult<u32> {
                Ok(self.store()?.format_version())
            }
            #[getter]
            fn path(&self) -> PyResult<crate::python::PyPath> {
                Ok(crate::python::PyPath(self.store()?.path().to_path_buf()))
            }
            /// The trained dictionary of a zstd_dict store, else None.
            #[getter]
            fn dictionary<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
                Ok(self.store()?.dictionary().map(|d| PyBytes::new(py, d)))
            }
            fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                stats_dict(py, self.store()?.stats())
            }
            /// Check every byte; returns the record count or raises CorruptStoreError.
            /// `progress`: None shows a tqdm bar when the check runs over 2 s, True at once,
            /// False never.
            #[pyo3(signature = (progress = None))]
            fn verify(&self, py: Python<'_>, progress: Option<bool>) -> PyResult<u64> {
                let s = self.store()?.clone();
                let total = s.len();
                crate::python::progress::run_with_progress(py, progress, Some(total), Some(s.stats().file_bytes), "verify", "rec", move |done| {
                    s.verify_with(&|d| {
                        done.fetch_max(d, std::sync::atomic::Ordering::Relaxed);
                    })
                })
            }
            /// Drop this process's mapped pages of the store (resident memory goes down; the next
            /// reads fault them back, same bytes). `evict=True` also asks the kernel to drop the
            /// files from the page cache (for cold-read benchmarks).
            #[pyo3(signature = (evict = false))]
            fn release_pages(&self, evict: bool) -> PyResult<()> {
                crate::store::Store::from(self.store()?).release_pages(evict);
                Ok(())
            }
            /// Bound the mapped residency: release the mapped pages each time this many bytes
            /// were gathered (None: no bound).
            fn set_max_mapped_bytes(&self, bytes: Option<u64>) -> PyResult<()> {
                crate::store::Store::from(self.store()?).set_max_mapped_bytes(bytes);
                Ok(())
            }
            /// True while gathers prefetch every page of a batch up front (the store's pages
            /// were found on storage, not in memory).
            #[getter]
            fn cold(&self) -> PyResult<bool> {
                Ok(crate::store::Store::from(self.store()?).is_cold())
            }
            /// Release the store; its views raise from now on.
            fn close(&self) {
                self.flag.close();
                self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
            }
            #[getter]
            fn closed(&self) -> bool {
                !self.flag.0.load(Ordering::Acquire)
            }
            fn __enter__(slf: Py<Self>) -> Py<Self> {
                slf
            }
            #[pyo3(signature = (*_args))]
            fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
                self.close();
                false
            }
            /// Pickles as its path; unpickling opens the store again (nothing is mapped across).
            fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
                let path = slf.get().store().map_err(|_| PyValueError::new_err("a closed store cannot be pickled"))?.path().to_path_buf();
                let py = slf.py();
                let r = (slf.get_type().into_any(), (crate::python::PyPath(path.clone()),)).into_pyobject(py)?.into_any();
                travelling(py, &path, r)
            }
        }
    };
}

/// An opened dense store (unbound: `bind` an allocator to read).
#[pyclass(name = "DenseStore", module = "zrecord", frozen)]
pub struct PyDenseStore {
    inner: Mutex<Option<DenseStore>>,
    flag: OpenFlag,
}

store_class!(PyDenseStore, DenseStore, {
    #[getter]
    fn item_shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.store()?.item_shape())
    }
    #[getter]
    fn ndim(&self) -> PyResult<usize> {
        Ok(self.store()?.item_shape().len())
    }
    /// A placement view reading into `allocator`. `verify_checksums=False` skips the
    /// per-record checksum on reads (bounds are always checked).
    #[pyo3(signature = (allocator, verify_checksums = true))]
    fn bind(&self, py: Python<'_>, allocator: &PyAllocator, verify_checksums: bool) -> PyResult<Py<PyDenseView>> {
        let mut view = self.store()?.bind(&allocator.inner);
        view.set_verify_checksums(verify_checksums);
        PyDenseView::create(py, view, self.flag.clone())
    }
});

/// An opened ragged store.
#[pyclass(name = "RaggedStore", module = "zrecord", frozen)]
pub struct PyRaggedStore {
    inner: Mutex<Option<RaggedStore>>,
    flag: OpenFlag,
}

store_class!(PyRaggedStore, RaggedStore, {
    #[getter]
    fn ndim(&self) -> PyResult<usize> {
        Ok(self.store()?.ndim())
    }
    #[pyo3(signature = (allocator, verify_checksums = true))]
    fn bind(&self, py: Python<'_>, allocator: &PyAllocator, verify_checksums: bool) -> PyResult<Py<PyRaggedView>> {
        let mut view = self.store()?.bind(&allocator.inner);
        view.set_verify_checksums(verify_checksums);
        PyRaggedView::create(py, view, self.flag.clone())
    }
});

/// Open whichever kind of store is at `path`.
#[pyfunction]
pub(crate) fn open(py: Python<'_>, path: PathBuf) -> PyResult<Py<PyAny>> {
    let store = py.detach(move || Store::open(&path)).py_err()?;
    wrap_store(py, store)
}

/// The state file at `path` through the door to bytes: a regular file of at most `max_bytes`
/// (`None` when missing); a FIFO, device or folder is an error, never a hang.
#[pyfunction]
pub(crate) fn _read_state(py: Python<'_>, path: PathBuf, max_bytes: u64) -> PyResult<Option<Py<pyo3::types::PyBytes>>> {
    let bytes = py.detach(|| crate::io::read_optional(&path, max_bytes)).py_err()?;
    Ok(bytes.map(|b| pyo3::types::PyBytes::new(py, &b).unbind()))
}

/// Replace the state file at `path` with `data` atomically and durably (never through a
/// symlink).
#[pyfunction]
pub(crate) fn _write_state(py: Python<'_>, path: PathBuf, data: Vec<u8>) -> PyResult<()> {
    py.detach(move || crate::io::write_atomic(&path, &data)).py_err()
}

/// Whether `path` (a folder or URL) is a single store (else a dataset root, or nothing).
#[pyfunction]
pub(crate) fn _is_store(py: Python<'_>, path: PathBuf) -> PyResult<bool> {
    py.detach(move || crate::store::Dataset::is_store(&path)).py_err()
}

/// Storage options for object-store URLs at or below `prefix`; `pickle_secrets`: whether
/// objects pickled for other processes carry the secret ones too. Private: the public name is
/// `zrecord.set_storage_options` (one name for one thing).
#[pyfunction]
#[pyo3(name = "_set_storage_options", signature = (prefix, options, pickle_secrets = true))]
pub(crate) fn register_storage_options(py: Python<'_>, prefix: String, options: std::collections::HashMap<String, String>, pickle_secrets: bool) -> PyResult<()> {
    let mut opts: Vec<(String, String)> = options.into_iter().collect();
    opts.sort();
    py.detach(move || crate::io::object::register_storage_options_with(&prefix, opts, pickle_secrets)).py_err()
}

/// Whether this process has storage options registered for exactly `prefix`.
#[pyfunction]
pub(crate) fn _storage_options_registered(prefix: String) -> bool {
    crate::io::object::storage_options_registered(&prefix)
}

/// `reduce` (a `(callable, args)` pickle recipe for an object reading `path`), made to carry
/// the storage options registered for `path` when it is a URL: unpickling registers them in
/// the receiving process (unless it registered its own for that prefix) before the object opens.
pub(crate) fn travelling<'py>(py: Python<'py>, path: &std::path::Path, reduce: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let Some((prefix, options)) = crate::io::object::options_to_pickle(&path.to_string_lossy()) else { return Ok(reduce) };
    let (f, args): (Bound<'py, PyAny>, Bound<'py, PyAny>) = reduce.extract()?;
    let opts = pyo3::types::PyDict::new(py);
    for (k, v) in options {
        opts.set_item(k, v)?;
    }
    let wrap = py.import("zrecord._pickle")?.getattr("with_storage_options")?;
    Ok((wrap, (prefix, opts, f, args)).into_pyobject(py)?.into_any())
}

/// An opened store as its Python class.
pub(crate) fn wrap_store(py: Python<'_>, store: Store) -> PyResult<Py<PyAny>> {
    match store {
        Store::Dense(s) => Ok(Py::new(py, PyDenseStore::wrap(s))?.into_any()),
        Store::Ragged(s) => Ok(Py::new(py, PyRaggedStore::wrap(s))?.into_any()),
    }
}

/// A parsed index expression.
pub(crate) enum Selection {
    One(u64),
    List(Vec<u64>),
    Range { start: u64, step: i64, len: usize },
}

impl Selection {
    pub(crate) fn ids(&self) -> PyResult<Ids<'_>> {
        Ok(match self {
            Selection::One(i) => Ids::List(std::slice::from_ref(i)),
            Selection::List(v) => Ids::List(v),
            Selection::Range { start, step, len } => Ids::Range { start: *start, step: *step, len: *len },
        })
    }
}

fn index_value(x: &Bound<'_, PyAny>, len: u64) -> PyResult<u64> {
    let i: i128 = match x.extract() {
        Ok(i) => i,
        // An int too large for 128 bits is still an int: out of range, not the wrong type.
        Err(_) if x.is_instance_of::<PyInt>() => {
            let neg = x.lt(0i32)?;
            return Err(PyIndexError::new_err(format!(
                "index {} out of range for a view of {len} records (indices must be in 0..{len})",
                if neg { "below -2^127" } else { "past 2^127" }
            )));
        }
        Err(_) => return Err(PyTypeError::new_err(format!("indices must be integers, got {}", x.get_type().name().map(|n| n.to_string()).unwrap_or_default()))),
    };
    if i < 0 || i >= len as i128 {
        return Err(PyIndexError::new_err(format!("index {i} out of range for a view of {len} records (indices must be in 0..{len})")));
    }
    Ok(i as u64)
}

pub(crate) fn parse_key<'py>(key: &Bound<'py, PyAny>, len: u64) -> PyResult<Selection> {
    if key.is_instance_of::<PyInt>() {
        return Ok(Selection::One(index_value(key, len)?));
    }
    if let Ok(s) = key.cast::<PySlice>() {
        let ind = s.indices(len as isize)?;
        let n = ind.slicelength;
        return Ok(Selection::Range { start: if n == 0 { 0 } else { ind.start as u64 }, step: ind.step as i64, len: n });
    }
    if let Ok(t) = key.cast::<PyTuple>() {
        return Ok(Selection::List(t.iter().map(|x| index_value(&x, len)).collect::<PyResult<_>>()?));
    }
    if let Ok(l) = key.cast::<PyList>() {
        return Ok(Selection::List(l.iter().map(|x| index_value(&x, len)).collect::<PyResult<_>>()?));
    }
    // NumPy integer scalars and 0-d integer arrays index one record, like Python ints.
    let zero_d = match key.getattr("ndim") {
        Ok(nd) => nd.extract::<usize>().map(|n| n == 0).unwrap_or(false),
        Err(_) => true,
    };
    if zero_d && key.hasattr("__index__")? {
        let i = key.call_method0("__index__")?;
        return Ok(Selection::One(index_value(&i, len)?));
    }
    if key.hasattr("__dlpack__")? || key.hasattr("__array_interface__")? {
        // Copied once and checked: the caller's array may change while the GIL is released.
        return Ok(Selection::List(Imported::from_any(key)?.index_ids(len)?));
    }
    Err(PyTypeError::new_err(format!("unsupported index type {}", key.get_type().name()?)))
}

/// Iterator over a view's records.
#[pyclass(name = "RecordIter", module = "zrecord")]
pub struct PyRecordIter {
    view: Py<PyAny>,
    next: u64,
    len: u64,
}

impl PyRecordIter {
    pub(crate) fn new(view: Py<PyAny>, len: u64) -> Self {
        PyRecordIter { view, next: 0, len }
    }
}

#[pymethods]
impl PyRecordIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if self.next >= self.len {
            return Ok(None);
        }
        let i = self.next;
        self.next += 1;
        Ok(Some(self.view.bind(py).get_item(i)?.unbind()))
    }
}

/// What a store's typed view adds to `SourceView`: the store behind it (path, codec) and
/// pickling as (store path, allocator, verify_checksums). Reads are `SourceView`'s.
macro_rules! store_view_class {
    ($ty:ident, $view:ident, $name:literal) => {
        impl $ty {
            /// The view as its Python class: a `SourceView` subclass.
            fn create(py: Python<'_>, view: $view, flag: OpenFlag) -> PyResult<Py<$ty>> {
                let base = PySourceView::of_store(view.clone().into(), flag.clone(), view.store().path());
                Py::new(py, PyClassInitializer::from(base).add_subclass($ty { view, flag }))
            }

            pub(crate) fn view_clone(&self) -> PyResult<$view> {
                self.flag.check()?;
                Ok(self.view.clone())
            }
        }

        #[pymethods]
        impl $ty {
            /// Pickles as (store path, allocator, verify_checksums): unpickling opens the store
            /// again and binds it (views of one allocator share one pool again after unpickling).
            fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                self.flag.check().map_err(|_| PyValueError::new_err("a view of a closed store cannot be pickled"))?;
                let f = py.import("zrecord._pickle")?.getattr("view")?;
                let path = self.view.store().path().to_path_buf();
                let r = (f, (crate::python::PyPath(path.clone()), PyAllocator { inner: self.view.allocator().clone() }, self.view.verify_checksums())).into_pyobject(py)?.into_any();
                travelling(py, &path, r)
            }

            /// The path of the store this view reads.
            #[getter]
            fn path(&self) -> crate::python::PyPath {
                crate::python::PyPath(self.view.store().path().to_path_buf())
            }

            /// The store's codec: "raw", "zstd" or "zstd_dict".
            #[getter]
            fn codec(&self) -> &'static str {
                self.view.codec().name()
            }

            fn __repr__(slf: &Bound<'_, Self>) -> String {
                let v = &slf.get().view;
                let name = slf.as_super().get().stream_name();
                format!(concat!($name, "('{}', {} records, {} {}, {})"), name, v.len(), v.dtype(), crate::store::RecordSource::layout(&v.store()), v.codec().name())
            }
        }
    };
}

/// A dense store bound to an allocator: a `SourceView` whose reads return `DLTensor`s
/// (`view[i]`, `view[[i, j]]`, `view[a:b:c]`, `view.gather(ids)`), plus the store's path and codec.
#[pyclass(name = "DenseView", module = "zrecord", frozen, extends = PySourceView)]
pub struct PyDenseView {
    view: DenseView,
    flag: OpenFlag,
}
store_view_class!(PyDenseView, DenseView, "DenseView");

/// A ragged store bound to an allocator: a `SourceView` whose reads return `RaggedBatch`es.
#[pyclass(name = "RaggedView", module = "zrecord", frozen, extends = PySourceView)]
pub struct PyRaggedView {
    view: RaggedView,
    flag: OpenFlag,
}
store_view_class!(PyRaggedView, RaggedView, "RaggedView");

/// Train a zstd dictionary from a view, store, batch, or an iterable of arrays / bytes.
#[pyfunction]
#[pyo3(signature = (source, max_size = store::DEFAULT_DICT_SIZE, progress = None))]
pub(crate) fn train_dict<'py>(py: Python<'py>, source: &Bound<'py, PyAny>, max_size: usize, progress: Option<bool>) -> PyResult<Bound<'py, PyBytes>> {
    let samples: Vec<Vec<u8>> = if let Ok(v) = source.cast::<PyDenseView>() {
        let v = v.get().view_clone()?;
        py.detach(move || v.dict_samples(store::DICT_SAMPLE_RECORDS)).py_err()?
    } else if let Ok(v) = source.cast::<PyRaggedView>() {
        let v = v.get().view_clone()?;
        py.detach(move || v.dict_samples(store::DICT_SAMPLE_RECORDS)).py_err()?
    } else if let Ok(s) = source.cast::<PyDenseStore>() {
        let s = Store::Dense(s.get().store()?);
        py.detach(move || s.dict_samples(store::DICT_SAMPLE_RECORDS)).py_err()?
    } else if let Ok(s) = source.cast::<PyRaggedStore>() {
        let s = Store::Ragged(s.get().store()?);
        py.detach(move || s.dict_samples(store::DICT_SAMPLE_RECORDS)).py_err()?
    } else if let Ok(t) = source.cast::<PyDLTensor>() {
        t.get().tensor().dict_samples(store::DICT_SAMPLE_RECORDS).py_err()?
    } else if let Ok(b) = source.cast::<PyRaggedBatch>() {
        b.get().to_owned_batch(py)?.dict_samples(store::DICT_SAMPLE_RECORDS).py_err()?
    } else {
        let mut out = Vec::new();
        for item in source.try_iter().map_err(|_| PyTypeError::new_err("train_dict takes a view, a store, a batch or an iterable of arrays"))? {
            let item = item?;
            if let Ok(b) = item.cast::<PyBytes>() {
                out.push(b.as_bytes().to_vec());
            } else {
                out.push(Imported::from_any(&item)?.bytes().to_vec());
            }
            if out.len() >= store::DICT_SAMPLE_RECORDS {
                break;
            }
        }
        out
    };
    let d = crate::python::progress::run_with_progress(py, progress, None, None, "train_dict", "dict", move |_| {
        crate::store::codec::train_dict_from_samples(samples.iter().map(|s| s.as_slice()), max_size)
    })?;
    Ok(PyBytes::new(py, &d))
}

/// Names of the dtype catalog.
#[pyfunction]
pub(crate) fn dtype_names() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.name()).collect()
}
