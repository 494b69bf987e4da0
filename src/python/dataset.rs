//! Dataset roots for Python: `zrecord.Dataset(path)` opens a root of aligned named streams
//! (what `convert`, `write_dataset` and `COPY ... STORED AS ZRECORD` publish) and binds its
//! streams to an allocator as `SourceView`s, the form the Loader, SQL and the torch / Grain
//! adapters take.

use std::path::PathBuf;

use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::python::errors::IntoPy;
use crate::python::memory::PyAllocator;
use crate::python::source::PySourceView;
use crate::store::{Dataset, ReadOptions, SourceView, Stream};

/// An opened dataset root: `len(ds)` records in every stream, `ds.streams` (names in column
/// order), `ds.metadata` (conversion source, Hugging Face features), `ds.bind(allocator)` ->
/// `{name: SourceView}`, `ds.view(name)`.
#[pyclass(name = "Dataset", module = "zrecord", frozen)]
pub struct PyDataset {
    inner: Dataset,
}

impl PyDataset {
    fn stream(&self, name: &str) -> PyResult<&Stream> {
        self.inner.streams().iter().find(|s| s.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.inner.streams().iter().map(|s| s.name.as_str()).collect();
            PyKeyError::new_err(format!("dataset {} has no stream '{name}' (streams: {})", self.inner.path().display(), names.join(", ")))
        })
    }

    fn bind_stream(&self, py: Python<'_>, stream: &Stream, allocator: &PyAllocator, verify_checksums: bool) -> PyResult<PySourceView> {
        let options = ReadOptions { verify_checksums, parallel: true };
        let view = SourceView::new(stream.source.clone(), &allocator.inner).with_options(options);
        let f = py.import("zrecord._pickle")?.getattr("dataset_stream")?;
        let args = (crate::python::PyPath(self.inner.path().to_path_buf()), stream.name.clone(), PyAllocator { inner: allocator.inner.clone() }, verify_checksums);
        let reduce = crate::python::store::travelling(py, self.inner.path(), (f, args).into_pyobject(py)?.into_any())?.unbind();
        Ok(PySourceView::with_reduce(view, Some(reduce)).named(stream.name.clone()))
    }
}

#[pymethods]
impl PyDataset {
    /// Open the dataset root at `path` (its `dataset.json` and every stream's store).
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        Ok(PyDataset { inner: py.detach(move || Dataset::open(&path)).py_err()? })
    }

    /// Records per stream.
    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    /// The root folder.
    #[getter]
    fn path(&self) -> crate::python::PyPath {
        crate::python::PyPath(self.inner.path().to_path_buf())
    }

    /// Stream names in column order.
    #[getter]
    fn streams(&self) -> Vec<String> {
        self.inner.streams().iter().map(|s| s.name.clone()).collect()
    }

    /// `dataset.json`'s `metadata` as a dict (source, Hugging Face features, class names), or None.
    #[getter]
    fn metadata(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match self.inner.metadata() {
            None => Ok(None),
            Some(v) => {
                let text = serde_json::to_string(v).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
                Ok(Some(py.import("json")?.call_method1("loads", (text,))?.unbind()))
            }
        }
    }

    /// The store of stream `name` (DenseStore / RaggedStore).
    fn __getitem__(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        let stream = self.stream(name)?;
        match stream.store() {
            Some(store) => crate::python::store::wrap_store(py, store),
            None => Err(PyKeyError::new_err(format!("stream '{name}' is not a local store"))),
        }
    }

    fn __contains__(&self, name: &str) -> bool {
        self.inner.streams().iter().any(|s| s.name == name)
    }

    /// Stream `name` bound to `allocator` (a fresh default one when None).
    #[pyo3(signature = (name, allocator = None, verify_checksums = true))]
    fn view(&self, py: Python<'_>, name: &str, allocator: Option<&PyAllocator>, verify_checksums: bool) -> PyResult<PySourceView> {
        let stream = self.stream(name)?;
        let alloc = allocator.map(|a| PyAllocator { inner: a.inner.clone() }).unwrap_or_else(|| PyAllocator { inner: Default::default() });
        self.bind_stream(py, stream, &alloc, verify_checksums)
    }

    /// Every stream (or those named in `streams`, in that order) bound to one allocator:
    /// `{name: SourceView}`, the form `Loader(streams=...)` takes (wrap each view in a list).
    #[pyo3(signature = (allocator = None, verify_checksums = true, streams = None))]
    fn bind<'py>(
        &self,
        py: Python<'py>,
        allocator: Option<&PyAllocator>,
        verify_checksums: bool,
        streams: Option<Vec<String>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let alloc = allocator.map(|a| PyAllocator { inner: a.inner.clone() }).unwrap_or_else(|| PyAllocator { inner: Default::default() });
        let names = streams.unwrap_or_else(|| self.streams());
        let out = PyDict::new(py);
        for name in names {
            let stream = self.stream(&name)?;
            out.set_item(&name, Py::new(py, self.bind_stream(py, stream, &alloc, verify_checksums)?)?)?;
        }
        Ok(out)
    }

    /// Pickles as its path; unpickling opens the root again.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let path = slf.get().inner.path().to_path_buf();
        let r = (slf.get_type().into_any(), (crate::python::PyPath(path.clone()),)).into_pyobject(py)?.into_any();
        crate::python::store::travelling(py, &path, r)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let names = PyList::new(py, self.streams()).map(|l| l.to_string()).unwrap_or_default();
        format!("Dataset({:?}, {} records, streams={names})", self.inner.path(), self.inner.len())
    }
}
