//! Python side of dataset conversion: `Converter` (the Rust [`Converter`] fed record batches
//! from Python, work done with the GIL released) and `open_files` (Parquet / Arrow / CSV /
//! JSON files as an Arrow stream). `zrecord.convert` (pure Python) drives both.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use arrow_array::RecordBatchReader;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{open_files as open_file_input, ConvertOptions, Converter, ImageOptions};
use crate::error::Error;
use crate::python::errors::{to_py, IntoPy};
use crate::python::source::arrow_reader;
use crate::store::{Codec, WriterOptions};

fn json_arg(name: &str, s: Option<String>) -> PyResult<Option<serde_json::Value>> {
    s.map(|s| serde_json::from_str(&s).map_err(|e| PyValueError::new_err(format!("{name} is not valid JSON: {e}")))).transpose()
}

/// Streams Arrow record batches into a new dataset root (see `zrecord.convert`).
#[pyclass(name = "Converter", module = "zrecord")]
pub struct PyConverter {
    path: PathBuf,
    state: Mutex<Option<Converter>>,
    rows: AtomicU64,
    bytes: AtomicU64,
}

impl PyConverter {
    fn push(&self, py: Python<'_>, reader: Box<dyn RecordBatchReader + Send>) -> PyResult<u64> {
        py.detach(|| {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let c = state.as_mut().ok_or(Error::Closed { what: "converter" })?;
            let before = c.rows();
            let mut r = Ok(());
            for b in reader {
                r = b.map_err(Error::from).and_then(|b| c.push(&b));
                if r.is_err() {
                    break;
                }
            }
            self.rows.store(c.rows(), Ordering::Relaxed);
            self.bytes.store(c.bytes(), Ordering::Relaxed);
            let rows = c.rows() - before;
            if r.is_err() {
                // Nothing of a failed conversion is published: drop removes the staging folder.
                *state = None;
            }
            r.map(|()| rows)
        })
        .py_err()
    }
}

#[pymethods]
impl PyConverter {
    /// Plan a conversion of data with Arrow schema `schema` (anything with
    /// `__arrow_c_schema__`) into a new root at `root`; every column is checked here.
    #[new]
    #[pyo3(signature = (root, schema, codec = "zstd", level = 3, data_shards = 4, dictionary = None, allow_empty = false, columns = None,
                        train_dict = None, decode_images = None, image_mode = None, resize = None, features = None, metadata = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        root: PathBuf,
        schema: pyo3_arrow::PySchema,
        codec: &str,
        level: i32,
        data_shards: usize,
        dictionary: Option<Vec<u8>>,
        allow_empty: bool,
        columns: Option<Vec<String>>,
        train_dict: Option<usize>,
        decode_images: Option<&str>,
        image_mode: Option<&str>,
        resize: Option<(u32, u32)>,
        features: Option<String>,
        metadata: Option<String>,
    ) -> PyResult<Self> {
        let codec: Codec = codec.parse().py_err()?;
        let mut options = ConvertOptions {
            writer: WriterOptions { codec, level, data_shards, dictionary, allow_empty, ..Default::default() },
            columns,
            train_dict,
            features: json_arg("features", features)?,
            ..Default::default()
        };
        match json_arg("metadata", metadata)? {
            Some(serde_json::Value::Object(m)) => options.metadata = m,
            Some(_) => return Err(PyTypeError::new_err("metadata must be a JSON object")),
            None => {}
        }
        if let Some(layout) = decode_images {
            let mut im = ImageOptions::new(layout.parse().py_err()?);
            im.mode = image_mode.map(|m| m.parse()).transpose().py_err()?;
            if let Some((h, w)) = resize {
                if h == 0 || w == 0 || (h as u64) * (w as u64) > (1 << 28) {
                    return Err(PyValueError::new_err(format!("resize=({h}, {w}): sizes must be >= 1 and at most 2^28 pixels")));
                }
            }
            im.resize = resize;
            options.images = Some(im);
        } else if image_mode.is_some() || resize.is_some() {
            return Err(PyValueError::new_err("image_mode and resize need decode_images=\"HWC\" or \"CHW\""));
        }
        let schema = schema.into_inner();
        let c = py.detach(|| Converter::new(&root, &schema, options)).py_err()?;
        Ok(PyConverter { path: root, state: Mutex::new(Some(c)), rows: Default::default(), bytes: Default::default() })
    }

    /// Convert Arrow data (a record batch or a stream of them: `__arrow_c_array__` /
    /// `__arrow_c_stream__`); returns the rows it added.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<u64> {
        let reader = arrow_reader(data, "Converter.write")?;
        self.push(py, reader)
    }

    /// Rows converted so far.
    #[getter]
    fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// Record payload bytes converted so far (before compression).
    #[getter]
    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    #[getter]
    fn path(&self) -> crate::python::PyPath {
        crate::python::PyPath(self.path.clone())
    }

    /// Publish the root; returns `{"path", "rows", "bytes", "streams": [(name, record type, codec)]}`
    /// (record type as text: `"float32 dense [2, 3]"`, `"uint8 ragged ndim 3"`).
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.state.lock().unwrap_or_else(|p| p.into_inner()).take();
        let c = c.ok_or_else(|| to_py(Error::Closed { what: "converter (finished, aborted, or failed: nothing more is published)" }))?;
        let report = py.detach(|| c.finish()).py_err()?;
        let d = PyDict::new(py);
        d.set_item("path", report.path)?;
        d.set_item("rows", report.rows)?;
        d.set_item("bytes", report.bytes)?;
        let streams: Vec<(String, String, String)> =
            report.streams.into_iter().map(|(n, l, c)| (n, l.to_string(), c.name().to_string())).collect();
        d.set_item("streams", streams)?;
        Ok(d)
    }

    /// Discard everything; nothing is published (idempotent).
    fn abort(&self, py: Python<'_>) {
        py.detach(|| drop(self.state.lock().unwrap_or_else(|p| p.into_inner()).take()));
    }

    fn __repr__(&self) -> String {
        format!("Converter('{}', {} rows)", self.path.display(), self.rows())
    }
}

/// Open Parquet / Arrow IPC / CSV / JSON files (a path, folder, glob or Hugging Face
/// `save_to_disk` folder). Returns `(reader, info)`: an Arrow stream (`__arrow_c_stream__`)
/// and a dict with `total_rows`, `features` (JSON or None), `metadata` (JSON: the source for
/// `dataset.json`), `files`, `format`.
#[pyfunction]
pub fn open_files<'py>(py: Python<'py>, source: &str) -> PyResult<(pyo3_arrow::PyRecordBatchReader, Bound<'py, PyDict>)> {
    let input = py.detach(|| open_file_input(source)).py_err()?;
    let d = PyDict::new(py);
    d.set_item("total_rows", input.total_rows)?;
    d.set_item("features", input.features.as_ref().map(|f| f.to_string()))?;
    d.set_item("metadata", serde_json::Value::Object(input.metadata()).to_string())?;
    d.set_item("files", input.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>())?;
    d.set_item("format", format!("{:?}", input.format).to_lowercase())?;
    let batches = input.batches.map(|r| r.map_err(|e| arrow_schema::ArrowError::ExternalError(Box::new(e))));
    let reader = arrow_array::RecordBatchIterator::new(batches, input.schema);
    Ok((pyo3_arrow::PyRecordBatchReader::new(Box::new(reader)), d))
}
