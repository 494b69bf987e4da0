//! Importing producer memory without copying: DLPack capsules (versioned and legacy), our own
//! tensors directly, and the read-only `__array_interface__` fallback (a NumPy memmap opened
//! read-only). Also the dtype argument.

use std::ffi::{c_void, CStr};

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyString, PyTuple};

use crate::dtype::DType;
use crate::memory::dlpack::{DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use crate::memory::{Tensor, TensorView};
use crate::python::errors::IntoPy;
use crate::python::memory::PyDLTensor;

const VERSIONED: &CStr = c"dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const USED_LEGACY: &CStr = c"used_dltensor";

/// Producer memory borrowed for the duration of one call. Dropping it releases the producer
/// (calls the DLPack deleter).
pub(crate) struct Imported<'py> {
    bytes_ptr: *const u8,
    nbytes: usize,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    /// Strides in bytes as the producer gave them (None: C-contiguous).
    byte_strides: Option<Vec<isize>>,
    /// The producer's elements are in the other byte order (array interface `>` typestr).
    swapped: bool,
    /// The producer allows writes: a versioned DLPack capsule without the read-only or
    /// is-copied flag (the only kind that says so).
    pub(crate) writable: bool,
    /// Keeps the producer alive: a capsule we must release, our tensor, or the object itself.
    owner: Owner<'py>,
}

// The Tensor / Object payloads are never read: holding them keeps the producer's memory alive.
#[allow(dead_code)]
enum Owner<'py> {
    Capsule { capsule: Bound<'py, PyCapsule>, versioned: bool, managed: *mut c_void },
    Tensor(Tensor),
    Object(Bound<'py, PyAny>),
}

impl Drop for Imported<'_> {
    fn drop(&mut self) {
        if let Owner::Capsule { versioned, managed, .. } = &self.owner {
            // SAFETY: we consumed the capsule (renamed it to "used_..." so its own destructor
            // will not free it) and now own the managed tensor: its deleter is called exactly
            // once, here, with the GIL held (we hold a `Bound`).
            unsafe {
                if *versioned {
                    let m = *managed as *mut DLManagedTensorVersioned;
                    if let Some(d) = (*m).deleter {
                        d(m);
                    }
                } else {
                    let m = *managed as *mut DLManagedTensor;
                    if let Some(d) = (*m).deleter {
                        d(m);
                    }
                }
            }
        }
    }
}

impl<'py> Imported<'py> {
    /// The bytes for writing: a C-contiguous tensor whose producer allows writes, else None.
    /// Valid while `self` lives; the producer's other users may see the writes at any time.
    pub(crate) fn writable_ptr(&self) -> Option<(*mut u8, usize)> {
        (self.writable && (self.nbytes > 0 || self.shape.contains(&0))).then_some((self.bytes_ptr as *mut u8, self.nbytes))
    }

    /// The bytes, valid while `self` lives.
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.nbytes == 0 {
            return &[];
        }
        // SAFETY: the producer guarantees `nbytes` readable bytes at `bytes_ptr` for as long as
        // we hold it (`owner`); for strided input `nbytes` covers the addressed span only when
        // the strides are C-contiguous, which the append path checks before reading.
        unsafe { std::slice::from_raw_parts(self.bytes_ptr, self.nbytes) }
    }

    /// A `TensorView` over the imported memory (strides carried along for validation).
    /// Input in the other byte order, or with strides that are not whole elements, is refused
    /// here: its bytes cannot be taken as they are.
    pub(crate) fn view(&self) -> PyResult<TensorView<'_>> {
        if self.swapped {
            return Err(PyTypeError::new_err(format!(
                "the {} input is in non-native (big-endian) byte order; convert it first, e.g. arr.astype(arr.dtype.newbyteorder('='))",
                self.dtype
            )));
        }
        let v = TensorView::new(self.bytes(), self.dtype, self.shape.clone());
        match &self.byte_strides {
            None => Ok(v),
            Some(b) => match elem_strides(b, self.dtype.size()) {
                Some(s) => Ok(v.with_strides(s)),
                None => Err(PyValueError::new_err(format!(
                    "input strides {b:?} (bytes) are not multiples of the {}-byte item size; make the array contiguous first (np.ascontiguousarray)",
                    self.dtype.size()
                ))),
            },
        }
    }

    /// The elements of a 1-D integer array as ids, read once (any strides, either byte
    /// order), each checked to be in `0..len` (IndexError naming the first bad one).
    pub(crate) fn index_ids(&self, len: u64) -> PyResult<Vec<u64>> {
        if self.shape.len() != 1 {
            return Err(PyValueError::new_err(format!("index arrays must be 1-D, got shape {:?}", self.shape)));
        }
        let n = self.shape[0];
        let esize = self.dtype.size();
        if !matches!(
            self.dtype,
            DType::UInt64 | DType::Int64 | DType::UInt32 | DType::Int32 | DType::UInt16 | DType::Int16 | DType::UInt8 | DType::Int8
        ) {
            return Err(PyTypeError::new_err(format!("index arrays must hold integers, got {}", self.dtype)));
        }
        let stride = match &self.byte_strides {
            Some(b) => b[0],
            None => esize as isize,
        };
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| pyo3::exceptions::PyMemoryError::new_err(format!("{n} ids")))?;
        if n == 0 {
            return Ok(out);
        }
        if self.bytes_ptr.is_null() {
            return Err(PyValueError::new_err("index array has a null data pointer"));
        }
        for k in 0..n {
            let mut b = [0u8; 8];
            // SAFETY: the producer guarantees element `k` of a 1-D array lives at
            // `data + k * stride` (its stride, in bytes) and holds `esize` readable bytes while we
            // hold it; each element is copied out once and never read again.
            unsafe { std::ptr::copy_nonoverlapping(self.bytes_ptr.wrapping_offset(k as isize * stride), b.as_mut_ptr(), esize) };
            let i = int_value(self.dtype, b, esize, self.swapped);
            if i < 0 || i >= len as i128 {
                return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                    "index {i} out of range for a view of {len} records (indices must be in 0..{len})"
                )));
            }
            out.push(i as u64);
        }
        Ok(out)
    }

    /// Import from any supported producer.
    pub(crate) fn from_any(obj: &Bound<'py, PyAny>) -> PyResult<Imported<'py>> {
        if let Ok(t) = obj.cast::<PyDLTensor>() {
            let t = t.get().tensor().clone();
            return Ok(Imported {
                bytes_ptr: t.data_ptr(),
                nbytes: t.nbytes(),
                dtype: t.dtype(),
                shape: t.shape().to_vec(),
                byte_strides: None,
                swapped: false,
                writable: false,
                owner: Owner::Tensor(t),
            });
        }
        if obj.hasattr("__dlpack__")? {
            if obj.hasattr("__dlpack_device__")? {
                let (dev, _id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
                if dev != 1 && dev != 3 {
                    return Err(PyValueError::new_err(format!(
                        "DLPack device type {dev} is not supported: zrecord appends from CPU memory; move the tensor to the CPU first"
                    )));
                }
            }
            let py = obj.py();
            let kwargs = PyDict::new(py);
            kwargs.set_item("max_version", (1, 1))?;
            let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
                Ok(c) => Ok(c),
                Err(e) if e.is_instance_of::<PyTypeError>(py) => obj.call_method0("__dlpack__"),
                Err(e) => Err(e),
            };
            match capsule {
                Ok(c) => return Imported::from_capsule(c.cast_into::<PyCapsule>()?),
                Err(e) if e.is_instance_of::<PyBufferError>(py) => {
                    // A DLPack producer that cannot export this array (a dtype DLPack/NumPy
                    // lacks, such as ml_dtypes bfloat16, or an old NumPy's read-only array):
                    // view the same memory through its array interface instead.
                    if let Ok(i) = Imported::from_array_interface(obj, true) {
                        return Ok(i);
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
        if obj.hasattr("__array_interface__")? {
            return Imported::from_array_interface(obj, false);
        }
        Err(PyTypeError::new_err(format!(
            "expected a DLPack tensor (NumPy, PyTorch, JAX, zrecord) or a read-only NumPy buffer, got {}",
            obj.get_type().name()?
        )))
    }

    fn from_capsule(capsule: Bound<'py, PyCapsule>) -> PyResult<Imported<'py>> {
        let raw = capsule.as_ptr();
        // SAFETY: `raw` is a live capsule (we hold a reference); IsValid only inspects it.
        let versioned = unsafe { ffi::PyCapsule_IsValid(raw, VERSIONED.as_ptr()) } == 1;
        // SAFETY: as above.
        let legacy = unsafe { ffi::PyCapsule_IsValid(raw, LEGACY.as_ptr()) } == 1;
        if !versioned && !legacy {
            return Err(PyValueError::new_err("the DLPack capsule was already consumed or has an unknown name"));
        }
        let name = if versioned { VERSIONED } else { LEGACY };
        // SAFETY: the capsule is valid with this name (checked just above).
        let managed = unsafe { ffi::PyCapsule_GetPointer(raw, name.as_ptr()) };
        if managed.is_null() {
            return Err(PyErr::fetch(capsule.py()));
        }
        let mut writable = false;
        // SAFETY: per the DLPack protocol the capsule holds a live managed tensor of the kind
        // its name says; we read the embedded DLTensor (appends only read, so the read-only
        // flag of a versioned tensor needs no check).
        let dl: &DLTensor = unsafe {
            if versioned {
                let m = &*(managed as *const DLManagedTensorVersioned);
                if m.version.major != 1 {
                    return Err(PyBufferError::new_err(format!("unsupported DLPack major version {}", m.version.major)));
                }
                writable = m.flags & (crate::memory::dlpack::DLPACK_FLAG_BITMASK_READ_ONLY | crate::memory::dlpack::DLPACK_FLAG_BITMASK_IS_COPIED) == 0;
                &m.dl_tensor
            } else {
                &(*(managed as *const DLManagedTensor)).dl_tensor
            }
        };
        // Consume the capsule: rename it so its destructor leaves the tensor to us.
        let used = if versioned { USED_VERSIONED } else { USED_LEGACY };
        // SAFETY: renaming a valid capsule to a static name.
        unsafe { ffi::PyCapsule_SetName(raw, used.as_ptr()) };
        let owner = Owner::Capsule { capsule, versioned, managed };
        if dl.device.device_type != 1 && dl.device.device_type != 3 {
            // Dropping an empty import releases the producer's tensor.
            drop(Imported { bytes_ptr: std::ptr::null(), nbytes: 0, dtype: DType::UInt8, shape: vec![], byte_strides: None, swapped: false, writable: false, owner });
            return Err(PyValueError::new_err(format!("DLPack device type {} is not supported: use CPU memory", dl.device.device_type)));
        }
        let dtype = DType::from_dlpack(dl.dtype.code, dl.dtype.bits, dl.dtype.lanes).py_err()?;
        let ndim = usize::try_from(dl.ndim).map_err(|_| PyValueError::new_err("negative ndim"))?;
        // SAFETY: `shape` (and `strides` when non-null) point at `ndim` int64 values.
        let shape_i: &[i64] = if ndim == 0 { &[] } else { unsafe { std::slice::from_raw_parts(dl.shape, ndim) } };
        let strides: Option<Vec<isize>> = if dl.strides.is_null() || ndim == 0 {
            None
        } else {
            // SAFETY: as above.
            Some(unsafe { std::slice::from_raw_parts(dl.strides, ndim) }.iter().map(|&s| s as isize).collect())
        };
        let mut shape = Vec::with_capacity(ndim);
        for &d in shape_i {
            shape.push(usize::try_from(d).map_err(|_| PyValueError::new_err("negative dimension in DLPack shape"))?);
        }
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| PyValueError::new_err(format!("DLPack shape {shape:?} overflows")))?;
        // Non-contiguous memory is never read as one span (append rejects it), so expose no
        // bytes at all; index arrays are read element by element through the strides.
        let nbytes = if c_contiguous(&shape, strides.as_deref()) { numel.checked_mul(dtype.size()).ok_or_else(|| PyValueError::new_err("DLPack tensor size overflows"))? } else { 0 };
        let byte_strides = strides.as_ref().map(|s| s.iter().map(|&x| x.saturating_mul(dtype.size() as isize)).collect());
        let base = dl.data as *const u8;
        // SAFETY: `byte_offset` is within the producer's allocation per the DLPack contract.
        let bytes_ptr = if base.is_null() { std::ptr::null() } else { unsafe { base.add(dl.byte_offset as usize) } };
        if bytes_ptr.is_null() && nbytes > 0 {
            return Err(PyValueError::new_err("DLPack tensor has a null data pointer"));
        }
        Ok(Imported { bytes_ptr, nbytes, dtype, shape, byte_strides, swapped: false, writable, owner })
    }

    fn from_array_interface(obj: &Bound<'py, PyAny>, allow_writable: bool) -> PyResult<Imported<'py>> {
        let ai = obj.getattr("__array_interface__")?;
        let ai = ai.cast::<PyDict>()?;
        let get = |k: &str| -> PyResult<Bound<'py, PyAny>> {
            ai.get_item(k)?.ok_or_else(|| PyValueError::new_err(format!("__array_interface__ lacks '{k}'")))
        };
        let (ptr, readonly): (usize, bool) = get("data")?.extract()?;
        if !readonly && !allow_writable {
            return Err(PyTypeError::new_err(
                "writable buffer-only objects are not accepted: pass a DLPack tensor (np.asarray(x) works for NumPy)",
            ));
        }
        let typestr: String = get("typestr")?.extract()?;
        // The first character is the byte order: '<' little, '>' big, '|' not applicable.
        let native = if cfg!(target_endian = "little") { '<' } else { '>' };
        let swapped = matches!(typestr.chars().next(), Some(c @ ('<' | '>')) if c != native);
        let dtype = match DType::from_name(&typestr) {
            Ok(d) => d,
            // Opaque typestrs ('<V2') of extension dtypes: resolve by the dtype's name.
            Err(e) => match obj.getattr("dtype").and_then(|d| d.getattr("name")).and_then(|n| n.extract::<String>()) {
                Ok(name) => DType::from_name(&name).py_err()?,
                Err(_) => return Err(crate::python::errors::to_py(e)),
            },
        };
        let swapped = swapped && dtype.size() > 1;
        let shape: Vec<usize> = get("shape")?.extract()?;
        let strides_obj = ai.get_item("strides")?;
        let byte_strides: Option<Vec<isize>> = match strides_obj {
            Some(s) if !s.is_none() => Some(s.extract()?),
            _ => None,
        };
        if byte_strides.as_ref().is_some_and(|b| b.len() != shape.len()) {
            return Err(PyValueError::new_err("__array_interface__ strides and shape differ in length"));
        }
        // Strides that are not whole elements have no element-stride form: the array is then
        // treated as non-contiguous (never read as one span), not truncated to a wrong stride.
        let contiguous = match &byte_strides {
            None => true,
            Some(b) => match elem_strides(b, dtype.size()) {
                Some(s) => c_contiguous(&shape, Some(&s)),
                None => shape.contains(&0),
            },
        };
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| PyValueError::new_err(format!("array shape {shape:?} overflows")))?;
        let nbytes = if contiguous { numel.checked_mul(dtype.size()).ok_or_else(|| PyValueError::new_err("array size overflows"))? } else { 0 };
        Ok(Imported { bytes_ptr: ptr as *const u8, nbytes, dtype, shape, byte_strides, swapped, writable: false, owner: Owner::Object(obj.clone()) })
    }
}

/// Byte strides as element strides, when every one is a whole number of items.
fn elem_strides(bytes: &[isize], item: usize) -> Option<Vec<isize>> {
    let item = item as isize;
    bytes.iter().map(|&x| (x % item == 0).then_some(x / item)).collect()
}

/// The integer in the first `esize` bytes of `b` (in the producer's byte order).
fn int_value(dtype: DType, mut b: [u8; 8], esize: usize, swapped: bool) -> i128 {
    if swapped {
        b[..esize].reverse();
    }
    match dtype {
        DType::UInt64 => u64::from_ne_bytes(b) as i128,
        DType::Int64 => i64::from_ne_bytes(b) as i128,
        DType::UInt32 => u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as i128,
        DType::Int32 => i32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as i128,
        DType::UInt16 => u16::from_ne_bytes([b[0], b[1]]) as i128,
        DType::Int16 => i16::from_ne_bytes([b[0], b[1]]) as i128,
        DType::Int8 => b[0] as i8 as i128,
        _ => b[0] as i128,
    }
}

fn c_contiguous(shape: &[usize], strides: Option<&[isize]>) -> bool {
    let Some(strides) = strides else { return true };
    if shape.contains(&0) {
        // No element is addressed: any strides describe the same (empty) array.
        return strides.len() == shape.len();
    }
    let mut expected: isize = 1;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d > 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d as isize);
    }
    strides.len() == shape.len()
}

/// Resolve a dtype argument: a catalog name, a NumPy dtype or type, or an ml_dtypes type.
pub(crate) fn dtype_arg(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    if let Ok(s) = obj.cast::<PyString>() {
        return DType::from_name(s.to_str()?).py_err();
    }
    let py = obj.py();
    let np = py.import("numpy").map_err(|_| PyTypeError::new_err("dtype must be a name string when NumPy is not installed"))?;
    let dt = np.call_method1("dtype", (obj,)).map_err(|e| PyTypeError::new_err(format!("not a dtype: {e}")))?;
    let byteorder: String = dt.getattr("byteorder")?.extract()?;
    if byteorder == ">" {
        return Err(PyTypeError::new_err(format!("non-native (big-endian) dtype {} is not supported", dt.str()?)));
    }
    if !dt.getattr("fields")?.is_none() || !dt.getattr("subdtype")?.is_none() {
        return Err(PyTypeError::new_err(format!("structured or subarray dtype {} is not supported", dt.str()?)));
    }
    let name: String = dt.getattr("name")?.extract()?;
    DType::from_name(&name).py_err()
}

/// A shape argument: a tuple / list of non-negative ints.
pub(crate) fn shape_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t.iter().map(|d| d.extract::<usize>().map_err(|_| PyValueError::new_err("item_shape entries must be non-negative ints"))).collect();
    }
    obj.extract::<Vec<usize>>().map_err(|_| PyValueError::new_err("item_shape must be a tuple of non-negative ints"))
}
