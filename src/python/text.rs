//! `zrecord.text`'s native half: the string tensor and the text stages. The Python module
//! (`python/zrecord/text.py`) wraps these with NumPy / pyarrow / polars conveniences.

use std::sync::Arc;

use arrow_array::{Array, BooleanArray};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer};
use arrow_schema::{DataType, Field};
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyList, PyString, PyTuple};

use crate::dtype::DType;
use crate::memory::{Allocator, Tensor};
use crate::python::errors::IntoPy;
use crate::python::input::Imported;
use crate::python::memory::{PyDLTensor, PyRaggedBatch};
use crate::text::{Cleaner, ExactDedup, MinHashParams, NearDedup, ShingleUnit, LengthUnit, OffsetType, PiiKind, PiiMasker, QualityFilter, QualityRules, Stage, StringTensor, TextPipeline};

fn alloc() -> Allocator {
    Allocator::cpu(0)
}

fn dl<T: crate::dtype::Element>(data: &[T]) -> PyResult<PyDLTensor> {
    Ok(PyDLTensor::new(Tensor::from_slice(&alloc(), data, &[data.len()]).py_err()?, false))
}

/// A boolean mask as a uint8 tensor (1 = true; null rows are 0).
fn mask_tensor(mask: &BooleanArray) -> PyResult<PyDLTensor> {
    let bits = match mask.nulls() {
        Some(n) => mask.values() & n.inner(),
        None => mask.values().clone(),
    };
    let v: Vec<u8> = bits.iter().map(u8::from).collect();
    let t = Tensor::from_slice(&alloc(), &v, &[v.len()]).py_err()?.reinterpret(DType::Bool, vec![v.len()]).py_err()?;
    Ok(PyDLTensor::new(t, false))
}

fn unit(name: &str) -> PyResult<LengthUnit> {
    match name {
        "chars" => Ok(LengthUnit::Chars),
        "bytes" => Ok(LengthUnit::Bytes),
        other => Err(PyValueError::new_err(format!("unit must be 'chars' or 'bytes', not '{other}'"))),
    }
}

/// Strings in Arrow's Utf8View layout (native half of `zrecord.text.StringTensor`).
#[pyclass(name = "_StringTensor", module = "zrecord", frozen)]
pub struct PyStringTensor {
    pub(crate) inner: StringTensor,
}

impl PyStringTensor {
    fn wrap(inner: StringTensor) -> Self {
        PyStringTensor { inner }
    }
}

/// A 1-D mask input (NumPy bool / uint8 array, DLPack, list of bool) as a BooleanArray.
fn mask_arg(obj: &Bound<'_, PyAny>, n: usize) -> PyResult<BooleanArray> {
    if let Ok(list) = obj.cast::<PyList>() {
        let v: Vec<bool> = list.extract()?;
        return Ok(BooleanArray::from(v));
    }
    let imp = Imported::from_any(obj)?;
    let view = imp.view()?;
    if view.shape.len() != 1 || !matches!(view.dtype, DType::Bool | DType::UInt8) {
        return Err(PyTypeError::new_err(format!("a mask must be a 1-D bool array, got {} of shape {:?}", view.dtype, view.shape)));
    }
    if view.shape[0] != n {
        return Err(PyValueError::new_err(format!("mask has {} entries for {n} strings", view.shape[0])));
    }
    if view.strides.as_ref().is_some_and(|s| s[0] != 1) {
        return Err(PyValueError::new_err("a mask must be contiguous"));
    }
    let bytes = &imp.bytes()[..n];
    Ok(BooleanArray::new(BooleanBuffer::collect_bool(n, |i| bytes[i] != 0), None))
}

/// Copy a 1-D array argument's bytes (validated copies: the producer may change its memory
/// while the GIL is released).
fn owned_bytes(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<(DType, Vec<u8>)> {
    let imp = Imported::from_any(obj)?;
    let view = imp.view()?;
    if view.shape.len() != 1 {
        return Err(PyValueError::new_err(format!("{what} must be 1-D, got shape {:?}", view.shape)));
    }
    if view.strides.as_ref().is_some_and(|s| s[0] != 1) {
        return Err(PyValueError::new_err(format!("{what} must be contiguous")));
    }
    Ok((view.dtype, imp.bytes().to_vec()))
}

#[pymethods]
impl PyStringTensor {
    /// From a list (or any iterable) of `str` / `None`.
    #[staticmethod]
    fn from_list(py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut b = arrow_array::builder::StringViewBuilder::new();
        for item in items.try_iter()? {
            let item = item?;
            if item.is_none() {
                b.append_null();
            } else if let Ok(s) = item.cast::<PyString>() {
                b.append_value(s.to_str()?);
            } else {
                return Err(PyTypeError::new_err(format!("strings must be str or None, got {}", item.get_type().name()?)));
            }
        }
        let _ = py;
        Ok(Self::wrap(StringTensor::new(b.finish())))
    }

    /// From any Arrow string array or chunked array / stream (pyarrow, polars, arro3, ...);
    /// returns the tensor and whether string bytes were copied.
    #[staticmethod]
    fn from_arrow(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<(Self, bool)> {
        let any: pyo3_arrow::input::AnyArray = obj.extract()?;
        let chunked = any.into_chunked_array()?;
        let (chunks, _) = chunked.into_inner();
        py.detach(move || {
            let mut parts = Vec::with_capacity(chunks.len());
            let mut copied = false;
            for c in &chunks {
                let (t, cp) = StringTensor::from_arrow(c.as_ref())?;
                copied |= cp;
                parts.push(t);
            }
            if parts.len() == 1 {
                return Ok((parts.pop().unwrap_or_else(|| StringTensor::from_strs(std::iter::empty::<&str>())), copied));
            }
            let refs: Vec<&StringTensor> = parts.iter().collect();
            Ok((StringTensor::concat(&refs)?, copied))
        })
        .py_err()
        .map(|(t, c)| (Self::wrap(t), c))
    }

    /// From offsets (int32 / int64 / uint32, n + 1 entries) and UTF-8 bytes (uint8), with an
    /// optional validity mask (true = valid). Both are copied, then validated.
    #[staticmethod]
    #[pyo3(signature = (offsets, data, validity = None))]
    fn from_offsets(py: Python<'_>, offsets: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>, validity: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let (odt, obytes) = owned_bytes(offsets, "offsets")?;
        let (ddt, dbytes) = owned_bytes(data, "data")?;
        if !matches!(ddt, DType::UInt8 | DType::Int8) {
            return Err(PyTypeError::new_err(format!("string data must be uint8, got {ddt}")));
        }
        let n = match odt {
            DType::Int32 | DType::UInt32 => obytes.len() / 4,
            DType::Int64 => obytes.len() / 8,
            other => return Err(PyTypeError::new_err(format!("offsets must be int32, int64 or uint32, got {other}"))),
        };
        let nulls = match validity {
            Some(v) if !v.is_none() => {
                let m = mask_arg(v, n.saturating_sub(1))?;
                Some(NullBuffer::new(m.values().clone()))
            }
            _ => None,
        };
        let t = py
            .detach(move || {
                let buf = Buffer::from_vec(dbytes);
                match odt {
                    DType::Int32 => StringTensor::from_offsets(&pod::<i32>(&obytes), buf, nulls),
                    DType::UInt32 => StringTensor::from_offsets(&pod::<u32>(&obytes), buf, nulls),
                    _ => StringTensor::from_offsets(&pod::<i64>(&obytes), buf, nulls),
                }
            })
            .py_err()?;
        Ok(Self::wrap(t))
    }

    /// From a gathered ragged utf8 batch (shares its memory).
    #[staticmethod]
    fn from_batch(py: Python<'_>, batch: &Bound<'_, PyRaggedBatch>) -> PyResult<Self> {
        let b = batch.get().to_owned_batch(py)?;
        Ok(Self::wrap(StringTensor::from_ragged(&b).py_err()?))
    }

    /// Concatenate tensors.
    #[staticmethod]
    fn concat(py: Python<'_>, parts: Vec<PyRef<'_, PyStringTensor>>) -> PyResult<Self> {
        let owned: Vec<StringTensor> = parts.iter().map(|p| p.inner.clone()).collect();
        let t = py.detach(move || StringTensor::concat(&owned.iter().collect::<Vec<_>>())).py_err()?;
        Ok(Self::wrap(t))
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __getitem__(&self, i: isize) -> PyResult<Option<String>> {
        let n = self.inner.len() as isize;
        let k = if i < 0 { i + n } else { i };
        if k < 0 || k >= n {
            return Err(PyIndexError::new_err(format!("index {i} out of range for {n} strings")));
        }
        Ok(self.inner.value(k as usize).map(str::to_string))
    }

    fn to_list(&self) -> Vec<Option<String>> {
        (0..self.inner.len()).map(|i| self.inner.value(i).map(str::to_string)).collect()
    }

    #[getter]
    fn null_count(&self) -> usize {
        self.inner.null_count()
    }

    /// Bytes of string data the rows address.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.total_bytes()
    }

    /// Arrow export of the given type: `string_view` (zero-copy), `string` / `large_string`
    /// (one copy of the bytes).
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_array__<'py>(&self, py: Python<'py>, requested_schema: Option<Bound<'py, PyCapsule>>) -> PyResult<Bound<'py, PyTuple>> {
        let array: Arc<dyn Array> = Arc::new(self.inner.as_arrow().clone());
        let field = Arc::new(Field::new("", DataType::Utf8View, true));
        Ok(pyo3_arrow::ffi::to_array_pycapsules(py, field, &array, requested_schema)?)
    }

    /// An object exporting the strings as Arrow `kind` through `__arrow_c_array__`.
    fn _export(&self, py: Python<'_>, kind: &str) -> PyResult<PyArrowExport> {
        let dt = match kind {
            "string_view" | "utf8_view" => DataType::Utf8View,
            "string" | "utf8" => DataType::Utf8,
            "large_string" | "large_utf8" => DataType::LargeUtf8,
            other => return Err(PyValueError::new_err(format!("type must be 'string_view', 'string' or 'large_string', not '{other}'"))),
        };
        let t = self.inner.clone();
        let array = py.detach(|| t.to_arrow_type(&dt)).py_err()?;
        Ok(PyArrowExport { array, field: Arc::new(Field::new("", dt, true)) })
    }

    /// (offsets, data) tensors of the exchange layout (one copy), offsets `int32`, `int64` or
    /// `uint32`.
    #[pyo3(signature = (offsets = "int64"))]
    fn to_buffers(&self, py: Python<'_>, offsets: &str) -> PyResult<(PyDLTensor, PyDLTensor)> {
        let kind = OffsetType::parse(offsets).py_err()?;
        let t = self.inner.clone();
        let (offs, data, _) = py.detach(|| t.to_offsets(kind)).py_err()?;
        let a = alloc();
        let n = offs.len() / kind.dtype().size();
        let o = Tensor::from_slice(&a, &offs, &[offs.len()]).py_err()?.reinterpret(kind.dtype(), vec![n]).py_err()?;
        let d = Tensor::from_slice(&a, &data, &[data.len()]).py_err()?;
        Ok((PyDLTensor::new(o, false), PyDLTensor::new(d, false)))
    }

    /// Validity as a bool tensor (true = valid).
    fn validity(&self) -> PyResult<PyDLTensor> {
        let a = self.inner.as_arrow();
        let v = BooleanArray::new(a.nulls().map(|n| n.inner().clone()).unwrap_or_else(|| BooleanBuffer::new_set(a.len())), None);
        mask_tensor(&v)
    }

    fn starts_with(&self, py: Python<'_>, prefix: &str) -> PyResult<PyDLTensor> {
        let m = py.detach(|| self.inner.starts_with(prefix));
        mask_tensor(&m)
    }

    fn filter_by_prefix(&self, py: Python<'_>, prefix: &str) -> PyResult<Self> {
        Ok(Self::wrap(py.detach(|| self.inner.filter_by_prefix(prefix)).py_err()?))
    }

    /// Equality with a `str` (broadcast) or another tensor (elementwise).
    fn eq(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyDLTensor> {
        if let Ok(s) = other.cast::<PyString>() {
            let s = s.to_str()?.to_string();
            let m = py.detach(|| self.inner.eq_scalar(&s));
            return mask_tensor(&m);
        }
        let o = other.cast::<PyStringTensor>().map_err(|_| PyTypeError::new_err("compare with a str or a StringTensor"))?.get().inner.clone();
        let m = py.detach(|| self.inner.eq(&o)).py_err()?;
        mask_tensor(&m)
    }

    #[pyo3(signature = (unit = "chars"))]
    fn lengths(&self, py: Python<'_>, unit: &str) -> PyResult<PyDLTensor> {
        let u = self::unit(unit)?;
        let l = py.detach(|| self.inner.lengths(u));
        dl(l.values())
    }

    #[pyo3(signature = (min = 0, max = usize::MAX, unit = "chars"))]
    fn length_between(&self, py: Python<'_>, min: usize, max: usize, unit: &str) -> PyResult<PyDLTensor> {
        let u = self::unit(unit)?;
        let m = py.detach(|| self.inner.length_between(min, max, u));
        mask_tensor(&m)
    }

    /// The rows with `min <= length <= max` (one pass, no mask crosses to Python).
    #[pyo3(signature = (min = 0, max = usize::MAX, unit = "chars"))]
    fn filter_length(&self, py: Python<'_>, min: usize, max: usize, unit: &str) -> PyResult<Self> {
        let u = self::unit(unit)?;
        Ok(Self::wrap(py.detach(|| self.inner.filter_length(min, max, u)).py_err()?))
    }

    #[pyo3(signature = (seed = 0))]
    fn hash(&self, py: Python<'_>, seed: u64) -> PyResult<PyDLTensor> {
        let h = py.detach(|| self.inner.hash(seed));
        dl(h.values())
    }

    fn take(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<Self> {
        let ids: Vec<u64> = if let Ok(list) = ids.cast::<PyList>() {
            let n = self.inner.len() as i128;
            list.iter()
                .map(|x| {
                    let i: i128 = x.extract()?;
                    if i < 0 || i >= n {
                        return Err(PyIndexError::new_err(format!("index {i} out of range for {n} strings")));
                    }
                    Ok(i as u64)
                })
                .collect::<PyResult<_>>()?
        } else {
            Imported::from_any(ids)?.index_ids(self.inner.len() as u64)?
        };
        Ok(Self::wrap(py.detach(|| self.inner.take(&ids)).py_err()?))
    }

    fn filter(&self, py: Python<'_>, mask: &Bound<'_, PyAny>) -> PyResult<Self> {
        let m = mask_arg(mask, self.inner.len())?;
        if m.len() != self.inner.len() {
            return Err(PyValueError::new_err(format!("mask has {} entries for {} strings", m.len(), self.inner.len())));
        }
        Ok(Self::wrap(py.detach(|| self.inner.filter(&m)).py_err()?))
    }

    fn compact(&self, py: Python<'_>) -> Self {
        Self::wrap(py.detach(|| self.inner.compact()))
    }

    fn __repr__(&self) -> String {
        format!("StringTensor(len={}, nulls={}, bytes={})", self.inner.len(), self.inner.null_count(), self.inner.total_bytes())
    }
}

fn pod<T: Copy + Default>(bytes: &[u8]) -> Vec<T> {
    let w = std::mem::size_of::<T>();
    let n = bytes.len() / w;
    let mut out = vec![T::default(); n];
    // SAFETY: `out` has room for `n * w` bytes and T is a plain integer (callers use i32 / u32
    // / i64): any bit pattern is valid; the regions do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr() as *mut u8, n * w) };
    out
}

/// An Arrow array leaving through `__arrow_c_array__`.
#[pyclass(name = "_ArrowExport", module = "zrecord", frozen)]
pub struct PyArrowExport {
    array: Arc<dyn Array>,
    field: arrow_schema::FieldRef,
}

#[pymethods]
impl PyArrowExport {
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_array__<'py>(&self, py: Python<'py>, requested_schema: Option<Bound<'py, PyCapsule>>) -> PyResult<Bound<'py, PyTuple>> {
        Ok(pyo3_arrow::ffi::to_array_pycapsules(py, self.field.clone(), &self.array, requested_schema)?)
    }
}

/// A fused text pipeline built from stage specs (native half of `zrecord.text` stages).
#[pyclass(name = "_TextPipeline", module = "zrecord", frozen)]
pub struct PyTextPipeline {
    inner: TextPipeline,
}

fn cleaner_from(d: &Bound<'_, PyDict>) -> PyResult<Cleaner> {
    let mut c = Cleaner::default();
    for (k, v) in d.iter() {
        let k: String = k.extract()?;
        let v: bool = v.extract().map_err(|_| PyTypeError::new_err(format!("cleaner option {k} takes a bool")))?;
        match k.as_str() {
            "normalize_newlines" => c.normalize_newlines = v,
            "strip_control" => c.strip_control = v,
            "collapse_whitespace" => c.collapse_whitespace = v,
            "nfc" => c.nfc = v,
            "trim" => c.trim = v,
            other => return Err(PyTypeError::new_err(format!("unknown cleaner option '{other}' (normalize_newlines, strip_control, collapse_whitespace, nfc, trim)"))),
        }
    }
    Ok(c)
}

fn rules_from(preset: &str, d: &Bound<'_, PyDict>) -> PyResult<QualityRules> {
    let mut r = QualityRules::preset(preset).py_err()?;
    for (k, v) in d.iter() {
        let k: String = k.extract()?;
        let v: Option<f64> = v.extract().map_err(|_| PyTypeError::new_err(format!("quality rule {k} takes a number or None")))?;
        r.set(&k, v).py_err()?;
    }
    Ok(r)
}

fn masker_from(kinds: Option<Vec<String>>, placeholders: Option<&Bound<'_, PyDict>>) -> PyResult<PiiMasker> {
    let kinds: Vec<PiiKind> = match kinds {
        None => PiiKind::ALL.to_vec(),
        Some(k) => k.iter().map(|s| PiiKind::parse(s)).collect::<Result<_, _>>().py_err()?,
    };
    let mut ph = Vec::new();
    if let Some(d) = placeholders {
        for (k, v) in d.iter() {
            let k: String = k.extract()?;
            let v: String = v.extract()?;
            if k == "ip" {
                ph.push((PiiKind::Ipv4, v.clone()));
                ph.push((PiiKind::Ipv6, v));
            } else {
                ph.push((PiiKind::parse(&k).py_err()?, v));
            }
        }
    }
    PiiMasker::new(&kinds, &ph).py_err()
}

#[pymethods]
impl PyTextPipeline {
    /// `stages`: a list of `("clean", {opts})`, `("quality", preset, {rules})`,
    /// `("pii", kinds or None, {placeholders} or None)`, `("dedup", ExactDedup)`,
    /// `("near_dedup", NearDedup)`, or a built `_TextPipeline` whose stages are reused.
    #[new]
    fn new(stages: &Bound<'_, PyList>) -> PyResult<Self> {
        let mut out = Vec::new();
        for s in stages.iter() {
            // A built pipeline (a stage object's own) lends its compiled stages: the PII
            // patterns are compiled once per PIIMasker, not once per pipeline built from it.
            if let Ok(p) = s.cast::<PyTextPipeline>() {
                out.extend(p.get().inner.stages().iter().cloned());
                continue;
            }
            let t = s.cast::<PyTuple>().map_err(|_| PyTypeError::new_err("a stage spec is a tuple or a _TextPipeline"))?;
            let kind: String = t.get_item(0)?.extract()?;
            match kind.as_str() {
                "clean" => out.push(Stage::Clean(cleaner_from(t.get_item(1)?.cast::<PyDict>()?)?)),
                "quality" => {
                    let preset: String = t.get_item(1)?.extract()?;
                    out.push(Stage::Quality(QualityFilter::new(rules_from(&preset, t.get_item(2)?.cast::<PyDict>()?)?)));
                }
                "pii" => {
                    let kinds: Option<Vec<String>> = t.get_item(1)?.extract()?;
                    let ph = t.get_item(2)?;
                    let ph = if ph.is_none() { None } else { Some(ph.cast::<PyDict>()?.clone()) };
                    out.push(Stage::Pii(masker_from(kinds, ph.as_ref())?));
                }
                "dedup" => {
                    let d = t.get_item(1)?;
                    let d = d.cast::<PyExactDedup>().map_err(|_| PyTypeError::new_err("a dedup stage takes an ExactDedup"))?;
                    out.push(Stage::Dedup(d.get().inner.clone()));
                }
                "near_dedup" => {
                    let d = t.get_item(1)?;
                    let d = d.cast::<PyNearDedup>().map_err(|_| PyTypeError::new_err("a near_dedup stage takes a NearDedup"))?;
                    out.push(Stage::NearDedup(d.get().inner.clone()));
                }
                other => return Err(PyValueError::new_err(format!("unknown stage '{other}' (clean, quality, pii, dedup, near_dedup)"))),
            }
        }
        Ok(PyTextPipeline { inner: TextPipeline::new(out) })
    }

    /// Run over a tensor: (text, keep mask).
    fn run(&self, py: Python<'_>, strings: &Bound<'_, PyStringTensor>) -> PyResult<(PyStringTensor, PyDLTensor)> {
        let t = strings.get().inner.clone();
        let out = py.detach(|| self.inner.run(&t)).py_err()?;
        Ok((PyStringTensor::wrap(out.text), mask_tensor(&out.keep)?))
    }

    /// PII spans of one `str` found by the first pii stage: (kind, start, end), char indices.
    fn pii_find(&self, text: &str) -> PyResult<Vec<(String, usize, usize)>> {
        pii_find(&self.inner, text)
    }

    /// Run over one `str`: (text, kept).
    fn run_one(&self, text: &str) -> PyResult<(String, bool)> {
        let (mut a, mut b) = (String::new(), String::new());
        let (rewritten, keep) = self.inner.run_one(text, &mut a, &mut b).py_err()?;
        Ok((if rewritten { a } else { text.to_string() }, keep))
    }
}

/// Quality statistics of every string: a dict of column name -> tensor (float64, or uint64 for
/// counts).
#[pyfunction]
pub(crate) fn _quality_stats<'py>(py: Python<'py>, strings: &Bound<'py, PyStringTensor>) -> PyResult<Bound<'py, PyDict>> {
    use rayon::prelude::*;
    let t = strings.get().inner.clone();
    let stats: Vec<crate::text::QualityStats> = py.detach(|| (0..t.len()).into_par_iter().map(|i| QualityFilter::stats(t.value(i).unwrap_or(""))).collect());
    let d = PyDict::new(py);
    type Count = fn(&crate::text::QualityStats) -> usize;
    type Frac = fn(&crate::text::QualityStats) -> f64;
    let counts: [(&str, Count); 4] = [("chars", |s| s.chars), ("words", |s| s.words), ("lines", |s| s.lines), ("stop_words", |s| s.stop_words)];
    for (name, f) in counts {
        let v: Vec<u64> = stats.iter().map(|s| f(s) as u64).collect();
        d.set_item(name, Py::new(py, dl(&v)?)?)?;
    }
    let floats: [(&str, Frac); 10] = [
        ("mean_word_len", |s| s.mean_word_len),
        ("symbol_word_ratio", |s| s.symbol_word_ratio),
        ("digit_frac", |s| s.digit_frac),
        ("alpha_word_frac", |s| s.alpha_word_frac),
        ("entropy", |s| s.entropy),
        ("dup_line_frac", |s| s.dup_line_frac),
        ("dup_line_char_frac", |s| s.dup_line_char_frac),
        ("bullet_line_frac", |s| s.bullet_line_frac),
        ("ellipsis_line_frac", |s| s.ellipsis_line_frac),
        ("top_2gram_frac", |s| s.top_ngram_frac[0]),
    ];
    for (name, f) in floats {
        let v: Vec<f64> = stats.iter().map(f).collect();
        d.set_item(name, Py::new(py, dl(&v)?)?)?;
    }
    for n in 3..=4 {
        let v: Vec<f64> = stats.iter().map(|s| s.top_ngram_frac[n - 2]).collect();
        d.set_item(format!("top_{n}gram_frac"), Py::new(py, dl(&v)?)?)?;
    }
    for n in 5..=10 {
        let v: Vec<f64> = stats.iter().map(|s| s.dup_ngram_frac[n - 5]).collect();
        d.set_item(format!("dup_{n}gram_frac"), Py::new(py, dl(&v)?)?)?;
    }
    Ok(d)
}

/// Validated PII spans in one string: (kind, start, end) in characters (Python indices), by the
/// pipeline's first PII stage.
fn pii_find(p: &TextPipeline, text: &str) -> PyResult<Vec<(String, usize, usize)>> {
    let m = p.stages().iter().find_map(|s| if let Stage::Pii(m) = s { Some(m) } else { None }).ok_or_else(|| PyValueError::new_err("this pipeline has no pii stage"))?;
    let spans = m.find(text);
    let char_at = |b: usize| text[..b].chars().count();
    Ok(spans.into_iter().map(|(k, r)| (k.name().to_string(), char_at(r.start), char_at(r.end))).collect())
}

/// Exact dedup state (native half of `zrecord.text.ExactDedup`).
#[pyclass(name = "_ExactDedup", module = "zrecord", frozen)]
pub struct PyExactDedup {
    inner: std::sync::Arc<std::sync::Mutex<ExactDedup>>,
}

impl PyExactDedup {
    fn lock(&self) -> std::sync::MutexGuard<'_, ExactDedup> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyExactDedup {
    /// In memory (`path=None`) or persistent in the folder `path`; `committed` opens the folder
    /// at that many committed hashes (a count from the caller's own checkpoint).
    #[new]
    #[pyo3(signature = (path = None, max_memory = 1 << 30, committed = None))]
    fn new(py: Python<'_>, path: Option<std::path::PathBuf>, max_memory: usize, committed: Option<u64>) -> PyResult<Self> {
        let d = py
            .detach(|| match (path, committed) {
                (None, _) => Ok(ExactDedup::in_memory(max_memory)),
                (Some(p), None) => ExactDedup::open(p, max_memory),
                (Some(p), Some(c)) => ExactDedup::open_at(p, max_memory, c),
            })
            .py_err()?;
        Ok(PyExactDedup { inner: std::sync::Arc::new(std::sync::Mutex::new(d)) })
    }

    /// Durably record what was inserted since the last commit; returns the committed count.
    fn commit(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.lock().commit()).py_err()
    }

    /// Durably record the inserts made up to when the set held `count` hashes.
    fn commit_upto(&self, py: Python<'_>, count: u64) -> PyResult<u64> {
        py.detach(|| self.lock().commit_upto(count)).py_err()
    }

    #[getter]
    fn committed(&self) -> u64 {
        self.lock().committed()
    }

    fn __len__(&self) -> usize {
        self.lock().len() as usize
    }
}

/// MinHash + LSH near-duplicate state (native half of `zrecord.text.NearDedup`).
#[pyclass(name = "_NearDedup", module = "zrecord", frozen)]
pub struct PyNearDedup {
    inner: std::sync::Arc<std::sync::Mutex<NearDedup>>,
    num_perm: usize,
}

impl PyNearDedup {
    fn lock(&self) -> std::sync::MutexGuard<'_, NearDedup> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyNearDedup {
    /// In memory (`path=None`) or persistent in the folder `path`; `committed` opens the folder
    /// at that many committed signatures (a count from the caller's own checkpoint).
    #[new]
    #[pyo3(signature = (threshold = 0.8, num_perm = 128, shingle = 5, unit = "chars", bands = None, seed = 1, path = None, committed = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, threshold: f64, num_perm: usize, shingle: usize, unit: &str, bands: Option<usize>, seed: u64, path: Option<std::path::PathBuf>, committed: Option<u64>) -> PyResult<Self> {
        let unit = match unit {
            "chars" => ShingleUnit::Chars,
            "words" => ShingleUnit::Words,
            other => return Err(PyValueError::new_err(format!("unit must be 'chars' or 'words', not '{other}'"))),
        };
        let params = MinHashParams { num_perm, shingle, unit, seed, threshold, bands };
        let d = py
            .detach(|| match (path, committed) {
                (None, _) => NearDedup::new(params),
                (Some(p), None) => NearDedup::open(p, params),
                (Some(p), Some(c)) => NearDedup::open_at(p, params, c),
            })
            .py_err()?;
        Ok(PyNearDedup { inner: std::sync::Arc::new(std::sync::Mutex::new(d)), num_perm })
    }

    /// Durably record every kept signature; returns the committed count.
    fn commit(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.lock().commit()).py_err()
    }

    /// Durably record the signatures kept up to when `count` texts were kept.
    fn commit_upto(&self, py: Python<'_>, count: u64) -> PyResult<u64> {
        py.detach(|| self.lock().commit_upto(count)).py_err()
    }

    #[getter]
    fn committed(&self) -> u64 {
        self.lock().committed()
    }

    /// Signatures of the strings (nulls as empty), uint64 [n, num_perm]; nothing is indexed.
    fn signatures(&self, py: Python<'_>, strings: &Bound<'_, PyStringTensor>) -> PyResult<PyDLTensor> {
        use rayon::prelude::*;
        let t = strings.get().inner.clone();
        let inner = self.inner.clone();
        let flat: Vec<u64> = py.detach(move || {
            let d = inner.lock().unwrap_or_else(|p| p.into_inner());
            (0..t.len()).into_par_iter().flat_map_iter(|i| d.signature(t.value(i).unwrap_or(""))).collect()
        });
        let n = flat.len() / self.num_perm.max(1);
        Ok(PyDLTensor::new(Tensor::from_slice(&alloc(), &flat, &[n, self.num_perm]).py_err()?, true))
    }

    /// The permutation parameters (a, b) as uint64 arrays.
    fn permutations(&self) -> PyResult<(PyDLTensor, PyDLTensor)> {
        let d = self.lock();
        let (a, b) = d.permutations();
        Ok((dl(a)?, dl(b)?))
    }

    /// (bands, rows per band).
    #[getter]
    fn bands(&self) -> (usize, usize) {
        self.lock().bands()
    }

    fn __len__(&self) -> usize {
        self.lock().len()
    }
}

/// A Hugging Face tokenizer (native half of `zrecord.text.Tokenizer`).
#[pyclass(name = "_Tokenizer", module = "zrecord", frozen)]
pub struct PyTokenizer {
    inner: crate::text::Tokenizer,
}

#[pymethods]
impl PyTokenizer {
    #[new]
    #[pyo3(signature = (path = None, json = None, add_special_tokens = true))]
    fn new(path: Option<std::path::PathBuf>, json: Option<String>, add_special_tokens: bool) -> PyResult<Self> {
        let t = match (path, json) {
            (Some(p), None) => crate::text::Tokenizer::from_file(p),
            (None, Some(j)) => crate::text::Tokenizer::from_json(&j),
            _ => return Err(PyValueError::new_err("give exactly one of path= or json=")),
        }
        .py_err()?;
        Ok(PyTokenizer { inner: t.with_special_tokens(add_special_tokens) })
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    /// Ragged int32 batch of token ids (one record per string).
    fn encode(&self, py: Python<'_>, strings: &Bound<'_, PyStringTensor>) -> PyResult<PyRaggedBatch> {
        let t = strings.get().inner.clone();
        let b = py.detach(|| self.inner.encode(&t, &alloc())).py_err()?;
        Ok(PyRaggedBatch::owned(b))
    }

    /// (ids int32 [n, L], attention mask bool [n, L]).
    #[pyo3(signature = (strings, max_length = None, pad_id = 0))]
    fn encode_padded(&self, py: Python<'_>, strings: &Bound<'_, PyStringTensor>, max_length: Option<usize>, pad_id: i32) -> PyResult<(PyDLTensor, PyDLTensor)> {
        let t = strings.get().inner.clone();
        let (ids, mask) = py.detach(|| self.inner.encode_padded(&t, max_length, pad_id, &alloc())).py_err()?;
        Ok((PyDLTensor::new(ids, true), PyDLTensor::new(mask, true)))
    }
}
