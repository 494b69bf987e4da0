//! Python bindings (feature `python`): thin wrappers over the Rust API, no logic of their own
//! beyond argument conversion. The GIL is released during append, gather and verify.

mod cli;
mod convert;
mod dataset;
mod dist;
mod errors;
mod input;
mod loader;
mod plan;
mod memory;
mod progress;
mod source;
mod sql;
mod store;
mod text;
mod zarr;

use pyo3::prelude::*;

/// A store path for Python: `pathlib.Path` for a local path, `str` for an object-store URL
/// (pathlib would fold `s3://b/x` into `s3:/b/x`).
pub(crate) struct PyPath(pub(crate) std::path::PathBuf);

impl<'py> pyo3::IntoPyObject<'py> for PyPath {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if crate::io::is_url(&self.0) {
            Ok(pyo3::types::PyString::new(py, &self.0.to_string_lossy()).into_any())
        } else {
            Ok(self.0.into_pyobject(py)?.into_any())
        }
    }
}

/// The `zrecord._zrecord` extension module.
// Free-threaded CPython: every class is `frozen` with interior locks or uses PyO3's
// thread-safe borrow checking, and no state lives in the module, so the module does not ask
// for the GIL.
#[pymodule(gil_used = false)]
fn _zrecord(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CorruptStoreError", py.get_type::<errors::CorruptStoreError>())?;
    m.add_class::<memory::PyAllocator>()?;
    m.add_class::<memory::PyDLTensor>()?;
    m.add_class::<memory::PyRaggedBatch>()?;
    m.add_class::<memory::PyArrowBatch>()?;
    m.add_class::<store::PyDenseWriter>()?;
    m.add_class::<store::PyRaggedWriter>()?;
    m.add_class::<store::PyDenseStore>()?;
    m.add_class::<store::PyRaggedStore>()?;
    m.add_class::<store::PyDenseView>()?;
    m.add_class::<store::PyRaggedView>()?;
    m.add_class::<store::PyRecordIter>()?;
    m.add_class::<source::PySourceView>()?;
    m.add_class::<source::PyDatasetWriter>()?;
    m.add_class::<dataset::PyDataset>()?;
    m.add_class::<convert::PyConverter>()?;
    m.add_function(wrap_pyfunction!(convert::open_files, m)?)?;
    m.add_class::<loader::PySampler>()?;
    m.add_class::<loader::PyMode>()?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<loader::PyArrowLoader>()?;
    m.add_class::<plan::PyEpochPlan>()?;
    m.add_class::<plan::PyDeal>()?;
    m.add_class::<plan::PyShardStream>()?;
    m.add_class::<plan::PyMixture>()?;
    m.add_class::<plan::PyPacker>()?;
    m.add_class::<sql::PySessionContext>()?;
    m.add_class::<sql::PyQueryResult>()?;
    m.add_class::<sql::PyPreparedStatement>()?;
    m.add_class::<sql::PyTable>()?;
    m.add_class::<text::PyStringTensor>()?;
    m.add_class::<text::PyArrowExport>()?;
    m.add_class::<text::PyTextPipeline>()?;
    m.add_class::<text::PyExactDedup>()?;
    m.add_class::<text::PyNearDedup>()?;
    m.add_class::<text::PyTokenizer>()?;
    m.add_function(wrap_pyfunction!(text::_quality_stats, m)?)?;
    m.add_class::<dist::PyDistNode>()?;
    m.add_class::<dist::PyDistReader>()?;
    m.add_class::<dist::PyFileComm>()?;
    m.add_class::<zarr::PyZarrPipeline>()?;
    m.add_class::<zarr::PyZarrReader>()?;
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(store::open, m)?)?;
    m.add_function(wrap_pyfunction!(store::_is_store, m)?)?;
    m.add_function(wrap_pyfunction!(store::_read_state, m)?)?;
    m.add_function(wrap_pyfunction!(store::_write_state, m)?)?;
    m.add_function(wrap_pyfunction!(store::_storage_options_registered, m)?)?;
    m.add_function(wrap_pyfunction!(store::register_storage_options, m)?)?;
    m.add_function(wrap_pyfunction!(store::train_dict, m)?)?;
    m.add_function(wrap_pyfunction!(store::dtype_names, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
