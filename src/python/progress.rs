//! Progress for long calls from Python: the work runs on a scoped thread with the GIL
//! released and reports into an atomic; the calling thread wakes every 100 ms to move a tqdm
//! bar (`zrecord._progress.bar`: tqdm when installed, shown after 2 s unless
//! `progress=True`, never with `progress=False` or `ZRECORD_PROGRESS=0`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use pyo3::prelude::*;

use crate::error::Result;
use crate::python::errors::IntoPy;

/// Run `work(done)` with a progress bar of `total` units (`nbytes`: the input size when known;
/// small inputs get no bar unless asked for); `work` stores the absolute count done
/// so far in `done` (from any thread; `fetch_max` keeps it monotone).
pub(crate) fn run_with_progress<T: Send>(
    py: Python<'_>,
    progress: Option<bool>,
    total: Option<u64>,
    nbytes: Option<u64>,
    desc: &str,
    unit: &str,
    work: impl FnOnce(Arc<AtomicU64>) -> Result<T> + Send,
) -> PyResult<T> {
    let bar = py.import("zrecord._progress")?.call_method1("bar", (total, desc, unit, progress, nbytes))?;
    if bar.is_none() {
        return py.detach(move || work(Arc::new(AtomicU64::new(0)))).py_err();
    }
    let done = Arc::new(AtomicU64::new(0));
    let finished_flag = (Mutex::new(false), Condvar::new());
    let mut shown = 0u64;
    let result = std::thread::scope(|scope| -> PyResult<Result<T>> {
        let (worker_done, flag_ref) = (done.clone(), &finished_flag);
        let handle = scope.spawn(move || {
            // Set the flag even if `work` panics, so the waiting loop ends.
            struct Finish<'a>(&'a (Mutex<bool>, Condvar));
            impl Drop for Finish<'_> {
                fn drop(&mut self) {
                    *self.0 .0.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    self.0 .1.notify_all();
                }
            }
            let _finish = Finish(flag_ref);
            work(worker_done)
        });
        loop {
            let finished = py.detach(|| {
                let g = flag_ref.0.lock().unwrap_or_else(|p| p.into_inner());
                let (g, _) = flag_ref.1.wait_timeout_while(g, Duration::from_millis(100), |f| !*f).unwrap_or_else(|p| p.into_inner());
                *g
            });
            let now = done.load(Ordering::Relaxed);
            if now > shown {
                bar.call_method1("update", (now - shown,))?;
                shown = now;
            }
            if finished {
                break;
            }
        }
        Ok(py.detach(|| handle.join()).unwrap_or_else(|_| Err(crate::error::Error::invalid("progress", "the worker thread panicked"))))
    });
    let _ = bar.call_method0("close");
    result?.py_err()
}
