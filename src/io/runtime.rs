//! The crate's tokio runtimes, built in one place: the shared I/O runtime every remote read
//! and write runs on ([`shared`], [`block`]), and [`build`] for the runtimes a process front
//! end owns (the CLI, the Python SQL session, a distributed rank's server).

use std::future::Future;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// A multi-threaded runtime with every driver enabled: `name` for its threads, `workers`
/// threads (tokio's default, one per core, when `None`), `stack` bytes of stack per thread
/// (tokio's default when `None`).
pub fn build(name: &str, workers: Option<usize>, stack: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.thread_name(name).enable_all();
    if let Some(n) = workers {
        b.worker_threads(n.max(1));
    }
    if let Some(s) = stack {
        b.thread_stack_size(s);
    }
    b.build().map_err(|e| Error::invalid("runtime", format!("cannot start the {name} runtime: {e}")))
}

/// A runtime without threads of its own (every driver enabled): its tasks and I/O make progress
/// only while some thread blocks on it ([`drive`]), so a caller that waits on a request does the
/// request's work itself, with no thread hand-off on either end of it.
pub fn build_current(name: &str) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| Error::invalid("runtime", format!("cannot start the {name} runtime: {e}")))
}

/// Run `f` to completion on `rt` from the calling thread (its spawned tasks and I/O with it).
/// A caller inside a runtime cannot block on another one: there `f` runs on a scoped thread
/// of its own while the caller waits.
pub fn drive<F>(rt: &tokio::runtime::Runtime, f: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return rt.block_on(f);
    }
    std::thread::scope(|s| match s.spawn(|| rt.block_on(f)).join() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    })
}

/// The shared I/O runtime (2 threads, `zrecord-io`); callers block on it from any thread:
/// rayon workers, DataFusion's runtime, Python threads.
pub fn shared() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| build("zrecord-io", Some(2), None).unwrap_or_else(|e| panic!("{e}")))
}

/// Run `f` on the shared I/O runtime and wait for it (safe inside another runtime's thread
/// too). A panic in `f` is resumed on the caller.
pub fn block<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handle = shared().spawn(f);
    match futures::executor::block_on(handle) {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
