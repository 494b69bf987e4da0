//! The CPU allocator: aligned regions in size classes, with a bounded pool of idle regions.

use std::alloc::{self, Layout};
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};

/// Default upper bound on the bytes an allocator keeps idle for reuse: 256 MiB.
pub const DEFAULT_POOL_SIZE_BYTES: usize = 256 << 20;

/// Alignment of every region: enough for AVX-512 loads and for DLPack consumers that want
/// 256-byte alignment.
const SMALL_ALIGN: usize = 256;
/// Regions of 64 KiB and more are page aligned.
const PAGE_ALIGN: usize = 4096;
const PAGE_ALIGN_FROM: usize = 64 << 10;

/// Round a request up to its size class: powers of two up to 4 KiB, then four classes per
/// power of two (at most 25% slack), so regions of similar batches are interchangeable.
pub(crate) fn size_class(bytes: usize) -> usize {
    let bytes = bytes.max(SMALL_ALIGN);
    if bytes <= 4096 {
        return bytes.next_power_of_two();
    }
    let top = usize::BITS - 1 - bytes.leading_zeros(); // floor(log2)
    let step = 1usize << (top - 2);
    bytes.div_ceil(step) * step
}

fn layout_for(class: usize) -> Result<Layout> {
    let align = if class >= PAGE_ALIGN_FROM { PAGE_ALIGN } else { SMALL_ALIGN };
    Layout::from_size_align(class, align)
        .map_err(|e| Error::invalid("allocation size", format!("{class} bytes: {e}")))
}

struct PoolState {
    idle: HashMap<usize, Vec<NonNull<u8>>>,
    idle_bytes: usize,
    closed: bool,
}

// SAFETY: the pointers in `idle` are exclusively owned, unaliased heap regions; moving them
// between threads is sound.
unsafe impl Send for PoolState {}

pub(crate) struct PoolInner {
    pool_size_bytes: usize,
    /// Raised by [`Allocator::keep_idle_at_least`]: the idle bound is the larger of the two.
    idle_floor: AtomicUsize,
    /// Hard cap on live bytes (size classes); `usize::MAX` when unlimited.
    max_bytes: usize,
    state: Mutex<PoolState>,
    live_bytes: AtomicU64,
    reused: AtomicU64,
    fresh: AtomicU64,
}

impl PoolInner {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding this lock cannot leave the map inconsistent (every update is a
        // single push/pop plus a counter), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn release(&self, ptr: NonNull<u8>, class: usize) {
        self.live_bytes.fetch_sub(class as u64, Ordering::Relaxed);
        let bound = match self.pool_size_bytes {
            0 => 0,
            n => n.max(self.idle_floor.load(Ordering::Relaxed)),
        };
        let mut st = self.lock();
        if !st.closed && st.idle_bytes + class <= bound {
            st.idle.entry(class).or_default().push(ptr);
            st.idle_bytes += class;
            return;
        }
        drop(st);
        free(ptr, class);
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (class, ptrs) in st.idle.drain() {
            for p in ptrs {
                free(p, class);
            }
        }
    }
}

fn free(ptr: NonNull<u8>, class: usize) {
    if let Ok(layout) = layout_for(class) {
        // SAFETY: `ptr` was returned by `alloc::alloc` with exactly this layout (the class
        // determines both size and alignment) and is owned by the caller, who gives it up.
        unsafe { alloc::dealloc(ptr.as_ptr(), layout) }
    }
}

/// Counters of an allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes held by live allocations (size classes, not requests).
    pub live_bytes: u64,
    /// Bytes idle in the pool.
    pub idle_bytes: u64,
    /// Allocations served from the pool.
    pub reused: u64,
    /// Allocations that asked the system for memory.
    pub fresh: u64,
}

/// A CPU placement allocator with a bounded pool of idle, aligned regions.
///
/// Cloning is cheap and shares the pool. Allocations stay valid after the allocator is closed
/// or dropped; closing only stops pooling.
///
/// ```
/// use zrecord::memory::Allocator;
/// let alloc = Allocator::cpu(64 << 20);
/// let a = alloc.allocate(1000).unwrap();
/// assert!(a.capacity() >= 1000);
/// assert_eq!(a.as_ptr() as usize % 256, 0);
/// ```
#[derive(Clone)]
pub struct Allocator {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("device", &"cpu")
            .field("pool_size_bytes", &self.inner.pool_size_bytes)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for Allocator {
    fn default() -> Self {
        Allocator::cpu(DEFAULT_POOL_SIZE_BYTES)
    }
}

impl Allocator {
    /// A CPU allocator keeping at most `pool_size_bytes` idle for reuse (0 disables pooling).
    pub fn cpu(pool_size_bytes: usize) -> Allocator {
        Allocator::cpu_with_limit(pool_size_bytes, None)
    }

    /// A CPU allocator whose live allocations never exceed `max_bytes` (counted in size
    /// classes): a request past the cap fails with [`Error::MemoryLimit`] instead of asking the
    /// system. `None` is unlimited. Idle pooled regions count toward the cap only while live.
    ///
    /// ```
    /// use zrecord::memory::Allocator;
    /// let alloc = Allocator::cpu_with_limit(0, Some(1 << 20));
    /// let a = alloc.allocate(600 << 10).unwrap();
    /// assert!(alloc.allocate(600 << 10).is_err());
    /// drop(a);
    /// assert!(alloc.allocate(600 << 10).is_ok());
    /// ```
    pub fn cpu_with_limit(pool_size_bytes: usize, max_bytes: Option<usize>) -> Allocator {
        Allocator {
            inner: Arc::new(PoolInner {
                pool_size_bytes,
                idle_floor: AtomicUsize::new(0),
                max_bytes: max_bytes.unwrap_or(usize::MAX),
                state: Mutex::new(PoolState { idle: HashMap::new(), idle_bytes: 0, closed: false }),
                live_bytes: AtomicU64::new(0),
                reused: AtomicU64::new(0),
                fresh: AtomicU64::new(0),
            }),
        }
    }

    /// An identity for this pool, equal for clones of one allocator (used to share one pool
    /// again when several pickled views of it are unpickled together).
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The idle-pool bound in bytes.
    pub fn pool_size_bytes(&self) -> usize {
        self.inner.pool_size_bytes
    }

    /// Keep up to `bytes` idle for reuse even when that is more than the pool size (never
    /// lowers the bound; no effect on an allocator built without pooling). A loader with
    /// worker threads calls it with its working set (the regions of every batch it may hold at
    /// once): otherwise, whenever its consumer catches up and the regions in flight fall below
    /// that set, the surplus over the pool size is freed and allocated again a moment later,
    /// page faults and all (dense 38 MiB batches, 4 workers: a quarter of all regions).
    /// Memory stays within what the loader held live at its peak.
    ///
    /// ```
    /// use zrecord::memory::Allocator;
    /// let alloc = Allocator::cpu(1 << 20);
    /// let (a, b) = (alloc.allocate(1 << 20).unwrap(), alloc.allocate(1 << 20).unwrap());
    /// alloc.keep_idle_at_least(2 << 20);
    /// drop((a, b));
    /// assert_eq!(alloc.stats().idle_bytes, 2 << 20);
    /// ```
    pub fn keep_idle_at_least(&self, bytes: usize) {
        self.inner.idle_floor.fetch_max(bytes, Ordering::Relaxed);
    }

    /// The hard cap on live bytes, if any.
    pub fn max_bytes(&self) -> Option<usize> {
        (self.inner.max_bytes != usize::MAX).then_some(self.inner.max_bytes)
    }

    /// Take an exclusive region of at least `bytes` bytes (uninitialised).
    pub fn allocate(&self, bytes: usize) -> Result<Allocation> {
        // Past this no size class exists (rounding up would wrap) and no machine has the memory.
        if bytes > isize::MAX as usize / 2 {
            return Err(Error::OutOfMemory { bytes });
        }
        let class = size_class(bytes);
        let layout = layout_for(class)?;
        // Reserve first so that concurrent requests cannot pass the cap together.
        let live = self.inner.live_bytes.fetch_add(class as u64, Ordering::Relaxed);
        if live + class as u64 > self.inner.max_bytes as u64 {
            self.inner.live_bytes.fetch_sub(class as u64, Ordering::Relaxed);
            return Err(Error::MemoryLimit { bytes, live: live as usize, max_bytes: self.inner.max_bytes });
        }
        match self.take(class, layout) {
            Ok(ptr) => Ok(Allocation { ptr, class, pool: self.inner.clone() }),
            Err(e) => {
                self.inner.live_bytes.fetch_sub(class as u64, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// A region of exactly `class` bytes: an idle one from the pool or a fresh one.
    fn take(&self, class: usize, layout: Layout) -> Result<NonNull<u8>> {
        let reused = {
            let mut st = self.inner.lock();
            if st.closed {
                return Err(Error::Closed { what: "allocator" });
            }
            let p = st.idle.get_mut(&class).and_then(|v| v.pop());
            if p.is_some() {
                st.idle_bytes -= class;
            }
            p
        };
        let ptr = match reused {
            Some(p) => {
                self.inner.reused.fetch_add(1, Ordering::Relaxed);
                p
            }
            None => {
                // SAFETY: `layout` has a nonzero size (classes are >= 256 bytes).
                let raw = unsafe { alloc::alloc(layout) };
                let p = NonNull::new(raw).ok_or(Error::OutOfMemory { bytes: class })?;
                self.inner.fresh.fetch_add(1, Ordering::Relaxed);
                p
            }
        };
        Ok(ptr)
    }

    /// Stop pooling and free idle regions. Live allocations remain valid; further `allocate`
    /// calls fail with [`Error::Closed`].
    pub fn close(&self) {
        let drained: Vec<(usize, Vec<NonNull<u8>>)> = {
            let mut st = self.inner.lock();
            st.closed = true;
            st.idle_bytes = 0;
            st.idle.drain().collect()
        };
        for (class, ptrs) in drained {
            for p in ptrs {
                free(p, class);
            }
        }
    }

    /// True after [`Allocator::close`].
    pub fn is_closed(&self) -> bool {
        self.inner.lock().closed
    }

    /// Current counters.
    pub fn stats(&self) -> AllocatorStats {
        let idle = self.inner.lock().idle_bytes as u64;
        AllocatorStats {
            live_bytes: self.inner.live_bytes.load(Ordering::Relaxed),
            idle_bytes: idle,
            reused: self.inner.reused.load(Ordering::Relaxed),
            fresh: self.inner.fresh.load(Ordering::Relaxed),
        }
    }
}

/// One exclusive, aligned region from an [`Allocator`]. Returned to the pool on drop.
pub struct Allocation {
    ptr: NonNull<u8>,
    class: usize,
    pool: Arc<PoolInner>,
}

// SAFETY: an Allocation exclusively owns its region; the pool handle is Sync.
unsafe impl Send for Allocation {}
// SAFETY: shared access only hands out `*const` pointers / shared slices of initialised bytes
// (see `Tensor`); mutation needs `&mut self`.
unsafe impl Sync for Allocation {}
impl std::panic::RefUnwindSafe for Allocation {}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Allocation({:p}, {} bytes)", self.ptr, self.class)
    }
}

impl Allocation {
    /// Usable size in bytes (the size class, at least the request).
    pub fn capacity(&self) -> usize {
        self.class
    }

    /// Start of the region.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start of the region, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The whole region as possibly-uninitialised bytes.
    pub fn as_uninit_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: the region is `class` bytes long, exclusively ours for the lifetime of
        // `&mut self`, and `MaybeUninit<u8>` makes no claim about initialisation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast(), self.class) }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.pool.release(self.ptr, self.class);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_cover_requests_with_bounded_slack() {
        for n in [1usize, 255, 256, 257, 4095, 4096, 4097, 5000, 150_528, 38_535_168, 1 << 30] {
            let c = size_class(n);
            assert!(c >= n, "{n} -> {c}");
            assert!(c <= (n.max(256) as f64 * 1.34) as usize + 1 || n <= 4096, "{n} -> {c}");
            assert_eq!(size_class(c), c, "classes are fixed points");
        }
    }

    #[test]
    fn regions_are_aligned_and_reused() {
        let a = Allocator::cpu(1 << 20);
        let p1 = {
            let x = a.allocate(100_000).unwrap();
            assert_eq!(x.as_ptr() as usize % PAGE_ALIGN, 0);
            x.as_ptr() as usize
        };
        assert_eq!(a.stats().idle_bytes as usize, size_class(100_000));
        let x = a.allocate(99_000).unwrap(); // same class
        assert_eq!(x.as_ptr() as usize, p1);
        assert_eq!(a.stats().reused, 1);
        assert_eq!(a.stats().idle_bytes, 0);
        let small = a.allocate(10).unwrap();
        assert_eq!(small.as_ptr() as usize % SMALL_ALIGN, 0);
    }

    #[test]
    fn idle_pool_is_bounded() {
        let a = Allocator::cpu(300_000);
        let xs: Vec<_> = (0..5).map(|_| a.allocate(100_000).unwrap()).collect();
        drop(xs);
        let st = a.stats();
        assert!(st.idle_bytes <= 300_000, "{st:?}");
        assert_eq!(st.live_bytes, 0);
        let none = Allocator::cpu(0);
        drop(none.allocate(1000).unwrap());
        assert_eq!(none.stats().idle_bytes, 0);
    }

    /// The idle floor a loader asks for keeps its working set pooled past the pool size, only
    /// ever rises, and does not turn pooling on for an allocator built without it.
    #[test]
    fn idle_floor_keeps_a_working_set() {
        let a = Allocator::cpu(100_000);
        a.keep_idle_at_least(3 * size_class(100_000));
        a.keep_idle_at_least(1); // never lowers it
        let xs: Vec<_> = (0..4).map(|_| a.allocate(100_000).unwrap()).collect();
        drop(xs);
        assert_eq!(a.stats().idle_bytes as usize, 3 * size_class(100_000), "three kept, the fourth freed");
        let again: Vec<_> = (0..4).map(|_| a.allocate(100_000).unwrap()).collect();
        assert_eq!((a.stats().reused, a.stats().fresh), (3, 5));
        drop(again);
        let none = Allocator::cpu(0);
        none.keep_idle_at_least(1 << 20);
        drop(none.allocate(1000).unwrap());
        assert_eq!(none.stats().idle_bytes, 0);
    }

    #[test]
    fn allocation_outlives_closed_allocator() {
        let a = Allocator::cpu(1 << 20);
        let mut x = a.allocate(4096).unwrap();
        a.close();
        assert!(matches!(a.allocate(1), Err(Error::Closed { .. })));
        drop(a);
        // Still writable and readable after the allocator is gone.
        for b in x.as_uninit_mut().iter_mut() {
            b.write(7);
        }
        // SAFETY: every byte was just written.
        let s = unsafe { std::slice::from_raw_parts(x.as_ptr(), x.capacity()) };
        assert!(s.iter().all(|&b| b == 7));
    }

    #[test]
    fn max_bytes_caps_live_allocations() {
        let a = Allocator::cpu_with_limit(1 << 20, Some(1 << 20));
        assert_eq!(a.max_bytes(), Some(1 << 20));
        let x = a.allocate(512 << 10).unwrap();
        let y = a.allocate(512 << 10).unwrap();
        match a.allocate(1) {
            Err(Error::MemoryLimit { bytes: 1, live, max_bytes }) => {
                assert_eq!(live, 1 << 20);
                assert_eq!(max_bytes, 1 << 20);
            }
            other => panic!("expected MemoryLimit, got {other:?}"),
        }
        assert_eq!(a.stats().live_bytes, 1 << 20, "a refused request leaves no reservation");
        drop(x);
        // The freed region is idle in the pool and reusable under the cap.
        let z = a.allocate(512 << 10).unwrap();
        assert_eq!(a.stats().reused, 1);
        assert!(a.allocate(usize::MAX / 4).is_err());
        drop((y, z));
        assert_eq!(a.stats().live_bytes, 0);
        assert_eq!(Allocator::cpu(0).max_bytes(), None);
    }

    #[test]
    fn max_bytes_holds_under_concurrency() {
        let a = Allocator::cpu_with_limit(0, Some(8 * 4096));
        let peak = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..500 {
                        if let Ok(r) = a.allocate(4096) {
                            peak.fetch_max(a.stats().live_bytes, Ordering::Relaxed);
                            drop(r);
                        }
                    }
                });
            }
        });
        assert!(peak.load(Ordering::Relaxed) <= 8 * 4096);
        assert_eq!(a.stats().live_bytes, 0);
    }

    #[test]
    fn concurrent_allocate_and_release() {
        let a = Allocator::cpu(8 << 20);
        std::thread::scope(|s| {
            for t in 0..4 {
                let a = a.clone();
                s.spawn(move || {
                    for i in 0..200 {
                        let mut x = a.allocate(1000 + (i * 37 + t) % 50_000).unwrap();
                        x.as_uninit_mut()[0].write(1);
                    }
                });
            }
        });
        assert_eq!(a.stats().live_bytes, 0);
    }
}
