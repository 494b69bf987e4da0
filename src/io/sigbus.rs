//! SIGBUS containment for memory-mapped store files.
//!
//! A mapped file that another process truncates makes every later access to the lost pages
//! raise SIGBUS, which kills the process. Stores are immutable once published and their files
//! are checked at open, but a careless `truncate`, a full disk on a network filesystem or a
//! tool rewriting a store in place can still cut a file under a running reader. Every mapping a
//! store makes is registered here; a process-wide SIGBUS handler that finds the faulting
//! address inside a registered mapping puts a zero page over the lost page (so the access
//! completes), and counts the fault against that mapping. Readers check the count after each
//! gather and turn it into a typed [`Error::Corrupt`](crate::error::Error) — the zeros are never
//! returned as data. Faults anywhere else go to the handler that was installed before ours (or
//! to the default action, which ends the process as before).

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Registered mappings at most; beyond that a mapping is simply not guarded.
const SLOTS: usize = 4096;

const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const ACTIVE: u8 = 2;

struct Slot {
    state: AtomicU8,
    start: AtomicUsize,
    len: AtomicUsize,
    faults: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot { state: AtomicU8::new(FREE), start: AtomicUsize::new(0), len: AtomicUsize::new(0), faults: AtomicU64::new(0) };
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];

/// The action that was installed for SIGBUS before ours.
static PREVIOUS: OnceLock<Option<libc::sigaction>> = OnceLock::new();

/// A registered mapping; unregisters on drop (drop it before unmapping).
#[derive(Debug)]
pub(crate) struct Guard {
    slot: Option<usize>,
}

impl Guard {
    /// Register `len` mapped bytes at `start`.
    pub(crate) fn register(start: *const u8, len: usize) -> Guard {
        if len == 0 || !install() {
            return Guard { slot: None };
        }
        for (i, s) in TABLE.iter().enumerate() {
            if s.state.compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                s.start.store(start as usize, Ordering::Relaxed);
                s.len.store(len, Ordering::Relaxed);
                s.faults.store(0, Ordering::Relaxed);
                s.state.store(ACTIVE, Ordering::Release);
                return Guard { slot: Some(i) };
            }
        }
        Guard { slot: None }
    }

    /// Faults contained in this mapping so far (nonzero: the file was cut under the reader).
    #[inline]
    pub(crate) fn faults(&self) -> u64 {
        self.slot.map(|i| TABLE[i].faults.load(Ordering::Acquire)).unwrap_or(0)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            TABLE[i].state.store(FREE, Ordering::Release);
        }
    }
}

/// Install the handler once per process; false when it could not be installed.
fn install() -> bool {
    PREVIOUS
        .get_or_init(|| {
            // SAFETY: plain sigaction(2) calls with zero-initialised, fully set-up structs; the
            // handler only does async-signal-safe work (atomics, mmap, sigaction, a call to the
            // previous handler).
            unsafe {
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = handler as *const () as usize;
                new.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK;
                libc::sigemptyset(&mut new.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(libc::SIGBUS, &new, &mut old) != 0 {
                    return None;
                }
                Some(old)
            }
        })
        .is_some()
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in TABLE.iter() {
        if s.state.load(Ordering::Acquire) != ACTIVE {
            continue;
        }
        let (start, len) = (s.start.load(Ordering::Relaxed), s.len.load(Ordering::Relaxed));
        if addr >= start && addr < start + len {
            // SAFETY: sysconf is async-signal-safe in practice (a read of a cached value).
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
            let at = addr & !(page - 1);
            // SAFETY: `at..at + page` lies inside a live mapping of ours (registered, not yet
            // unregistered: the reader holds it while it reads); MAP_FIXED replaces that one
            // page of the file mapping with an anonymous zero page, which the mapping's own
            // munmap later removes with the rest.
            let p = unsafe {
                libc::mmap(at as *mut libc::c_void, page, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED, -1, 0)
            };
            if p != libc::MAP_FAILED {
                s.faults.fetch_add(1, Ordering::AcqRel);
                return;
            }
        }
    }
    chain(sig, info, ctx);
}

/// Not ours: hand the signal to whoever had it before.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let prev = PREVIOUS.get().copied().flatten();
    // SAFETY: restoring or calling the previously installed action, as the kernel would have.
    unsafe {
        match prev {
            Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(p.sa_sigaction);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(p.sa_sigaction);
                    f(sig);
                }
            }
            _ => {
                // Default action: restore it; returning re-runs the access, which now ends the
                // process with SIGBUS exactly as without this handler.
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut dfl.sa_mask);
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn truncated_mapping_reads_zeros_and_counts_the_fault() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::File::create(&p).unwrap().write_all(&vec![7u8; 3 * 4096]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        // SAFETY: test mapping of a private temp file.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let g = Guard::register(map.as_ptr(), map.len());
        assert_eq!(map[5000], 7);
        assert_eq!(g.faults(), 0);
        std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(4096).unwrap();
        // Reading past the new end would be SIGBUS; it reads a zero page and counts instead.
        // SAFETY: (test) the address lies inside the live mapping `map` (3 pages long).
        let v = unsafe { std::ptr::read_volatile(map.as_ptr().add(2 * 4096 + 10)) };
        assert_eq!(v, 0);
        assert!(g.faults() >= 1);
        assert_eq!(map[10], 7, "pages still backed by the file are untouched");
        drop(g);
        drop(map);
    }
}
