//! DLPack export (DLPack 1.1 ABI): `DLManagedTensorVersioned` and the legacy
//! unversioned `DLManagedTensor`. The exported tensor keeps its allocation alive until the
//! consumer calls the deleter.

use std::ffi::c_void;
use std::ptr::NonNull;

use crate::memory::Tensor;

/// DLPack major version implemented.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// DLPack minor version implemented.
pub const DLPACK_MINOR_VERSION: u32 = 1;
/// `kDLCPU`.
pub const DL_CPU: i32 = 1;
/// Flag: the consumer must not write to the tensor.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1;
/// Flag: the tensor is a copy made for the exchange.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 2;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    /// Device type (`kDLCPU` = 1).
    pub device_type: i32,
    /// Device ordinal.
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    /// Type code.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes.
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// Data pointer.
    pub data: *mut c_void,
    /// Device.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// Shape, `ndim` entries.
    pub shape: *mut i64,
    /// Strides in elements, or null for C-contiguous.
    pub strides: *mut i64,
    /// Byte offset from `data`.
    pub byte_offset: u64,
}

/// Legacy `DLManagedTensor` (capsule name `"dltensor"`).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// Owner context.
    pub manager_ctx: *mut c_void,
    /// Called by the consumer when done.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned` (capsule name `"dltensor_versioned"`).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// ABI version.
    pub version: DLPackVersion,
    /// Owner context.
    pub manager_ctx: *mut c_void,
    /// Called by the consumer when done.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// Flags (`DLPACK_FLAG_BITMASK_*`).
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// What the managed tensor owns: the tensor (hence its allocation) and the shape array the
/// `DLTensor` points into.
struct Owner {
    _tensor: Tensor,
    shape: Vec<i64>,
}

fn dl_tensor(t: &Tensor, shape: &mut [i64]) -> DLTensor {
    let (code, bits, lanes) = t.dtype().dlpack();
    DLTensor {
        data: t.data_ptr() as *mut c_void,
        device: DLDevice { device_type: DL_CPU, device_id: 0 },
        ndim: shape.len() as i32,
        dtype: DLDataType { code, bits, lanes },
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

fn owner(t: &Tensor) -> Box<Owner> {
    Box::new(Owner { _tensor: t.clone(), shape: t.shape().iter().map(|&d| d as i64).collect() })
}

unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` came from `Box::into_raw` in `to_dlpack_versioned` and the DLPack contract
    // says the deleter is called exactly once; `manager_ctx` came from `Box::into_raw(Owner)`.
    unsafe {
        let managed = Box::from_raw(p);
        drop(Box::from_raw(managed.manager_ctx.cast::<Owner>()));
    }
}

unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    if p.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`, for the legacy struct made by `to_dlpack_legacy`.
    unsafe {
        let managed = Box::from_raw(p);
        drop(Box::from_raw(managed.manager_ctx.cast::<Owner>()));
    }
}

impl Tensor {
    /// Export as a versioned DLPack managed tensor. The caller (normally a capsule) owns the
    /// result and must call its deleter exactly once.
    pub fn to_dlpack_versioned(&self, read_only: bool) -> NonNull<DLManagedTensorVersioned> {
        let mut own = owner(self);
        let dl = dl_tensor(self, &mut own.shape);
        let ctx = Box::into_raw(own);
        let managed = Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: DLPACK_MAJOR_VERSION, minor: DLPACK_MINOR_VERSION },
            manager_ctx: ctx.cast(),
            deleter: Some(delete_versioned),
            flags: if read_only { DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 },
            dl_tensor: dl,
        });
        // Box::into_raw never returns null.
        NonNull::from(Box::leak(managed))
    }

    /// Export as a legacy (unversioned) DLPack managed tensor; same ownership rules.
    pub fn to_dlpack_legacy(&self) -> NonNull<DLManagedTensor> {
        let mut own = owner(self);
        let dl = dl_tensor(self, &mut own.shape);
        let ctx = Box::into_raw(own);
        let managed = Box::new(DLManagedTensor { dl_tensor: dl, manager_ctx: ctx.cast(), deleter: Some(delete_legacy) });
        NonNull::from(Box::leak(managed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Allocator;
    use std::sync::Arc;

    #[test]
    fn versioned_export_describes_and_owns_the_tensor() {
        let a = Allocator::cpu(1 << 20);
        let t = Tensor::from_slice(&a, &[1.5f32, 2.5, 3.5, 4.5, 5.5, 6.5], &[3, 2]).unwrap();
        let ptr = t.data_ptr();
        let m = t.to_dlpack_versioned(false);
        drop(t); // the capsule alone keeps the memory alive
        // SAFETY: `m` is a live managed tensor until its deleter runs below.
        unsafe {
            let mt = m.as_ref();
            assert_eq!(mt.version, DLPackVersion { major: 1, minor: 1 });
            assert_eq!(mt.flags, 0);
            let d = &mt.dl_tensor;
            assert_eq!(d.data as *const u8, ptr);
            assert_eq!(d.ndim, 2);
            assert_eq!(std::slice::from_raw_parts(d.shape, 2), &[3, 2]);
            assert!(d.strides.is_null());
            assert_eq!(d.dtype, DLDataType { code: 2, bits: 32, lanes: 1 });
            assert_eq!(d.device, DLDevice { device_type: 1, device_id: 0 });
            let vals = std::slice::from_raw_parts(d.data as *const f32, 6);
            assert_eq!(vals, &[1.5, 2.5, 3.5, 4.5, 5.5, 6.5]);
            assert!(a.stats().live_bytes > 0);
            (mt.deleter.unwrap())(m.as_ptr());
        }
        assert_eq!(a.stats().live_bytes, 0, "deleter returned the region to the pool");
    }

    #[test]
    fn legacy_export_and_shared_allocation() {
        let a = Allocator::cpu(1 << 20);
        let t = Tensor::from_slice(&a, &[7u16; 10], &[10]).unwrap();
        let t2 = t.clone();
        let m = t.to_dlpack_legacy();
        assert_eq!(Arc::strong_count(t.allocation()), 3);
        // SAFETY: `m` is live; the deleter is called once.
        unsafe {
            let d = &m.as_ref().dl_tensor;
            assert_eq!(d.dtype, DLDataType { code: 1, bits: 16, lanes: 1 });
            (m.as_ref().deleter.unwrap())(m.as_ptr());
        }
        assert_eq!(Arc::strong_count(t2.allocation()), 2);
        let ro = t2.to_dlpack_versioned(true);
        // SAFETY: as above.
        unsafe {
            assert_eq!(ro.as_ref().flags, DLPACK_FLAG_BITMASK_READ_ONLY);
            (ro.as_ref().deleter.unwrap())(ro.as_ptr());
        }
    }
}
