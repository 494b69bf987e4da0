//! The gather crew: helper threads that join parallel gathers and stay awake for a moment
//! after each one.
//!
//! A gather of small records is short (256 × 2 KiB is ~30 µs of copying), and on this kind
//! of machine a parked thread takes tens of microseconds to wake: a pool whose threads go to
//! sleep between gathers (rayon's do, within microseconds) joins back-to-back gathers late or
//! not at all. Crew members keep looking for the next job for [`LINGER`] after their last one
//! (spinning on a counter, then yielding), so a loop of gathers finds them awake; after that
//! they park on a condition variable and cost nothing.
//!
//! Jobs are shared work lists ([`Job`]): the poster works on its own job too and never waits
//! for a member to start (see `gather::Chunks`), so a member that is late, busy with another
//! job or missing (a forked child has none) only means less parallelism.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Work that crew members can join.
pub(crate) trait Job: Send + Sync {
    /// Claim and run parts until none is left unclaimed.
    fn help(&self);
    /// True once every part has been claimed (nothing left for a member to do).
    fn exhausted(&self) -> bool;
}

/// How long a member keeps looking for new work after its last job before it parks.
const LINGER: Duration = Duration::from_micros(200);
/// Of that, how long it spins before it starts yielding its core to other runnable threads.
const SPIN: Duration = Duration::from_micros(20);
/// A parked member that has seen gathers arrive at a steady period wakes this long before
/// the next one is due (and lingers until [`LINGER`] past it).
const LEAD: Duration = Duration::from_micros(150);
/// Periods longer than this are not anticipated (a member wakes for each, so a slow one
/// costs nothing worth saving and a long one is not a loop).
const MAX_PERIOD: Duration = Duration::from_secs(1);

/// Nanoseconds from `now` until `lead` before the next burst is due, for bursts that started
/// at `start` and come every `period` (all in ns); None when that is less than `lead` away or
/// the loop seems to have stopped (no burst for four periods).
fn next_wake(now: u64, start: u64, period: u64, lead: u64) -> Option<u64> {
    if period == 0 || now < start {
        return None;
    }
    let since = now - start;
    if since > 4 * period {
        return None;
    }
    let due = start + period * (since / period + 1);
    (due > now + lead).then(|| due - now - lead)
}

/// The process's gather helpers.
pub(crate) struct Crew {
    /// The process that started the members (a forked child has none of them).
    pid: u32,
    members: usize,
    queue: Mutex<Vec<Arc<dyn Job>>>,
    /// Bumped by every post: lingering members watch it instead of taking the lock.
    posted: AtomicU64,
    /// Members waiting on `wake`.
    parked: AtomicUsize,
    wake: Condvar,
    /// Post times (ns since `epoch`): the last post, the first post after a quiet spell longer
    /// than [`LINGER`] (a "burst": one training step may gather several streams), and the
    /// time between the last two bursts. A loop that gathers, then computes for longer than
    /// members linger, posts one burst per step: members park in between and would take tens
    /// of microseconds (on a virtual machine often longer than the whole gather) to wake on
    /// the post, so the gather ran on its poster's thread alone. With the period known, a
    /// parked member wakes [`LEAD`] before the next burst is due.
    epoch: Instant,
    last_post: AtomicU64,
    burst_start: AtomicU64,
    period: AtomicU64,
}

static CREW: OnceLock<Crew> = OnceLock::new();

/// Threads a gather may use: `RAYON_NUM_THREADS` when set (as for rayon's global pool), else
/// the CPUs this process may run on. Not `rayon::current_num_threads()`: the first gather may
/// run inside a small dedicated pool (a writer's, the Zarr reader's) and must not size the
/// crew after it.
fn threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

impl Crew {
    /// The crew of this process: one member fewer than the process's gather threads (the
    /// poster is the last worker), started on first use. `None` when there are no members: one thread
    /// configured, no thread could be started, or this is a forked child of the process that
    /// started them (threads do not survive `fork`).
    pub(crate) fn get() -> Option<&'static Crew> {
        let crew = CREW.get_or_init(|| Crew {
            pid: std::process::id(),
            members: threads().saturating_sub(1),
            queue: Mutex::new(Vec::new()),
            posted: AtomicU64::new(0),
            parked: AtomicUsize::new(0),
            wake: Condvar::new(),
            epoch: Instant::now(),
            last_post: AtomicU64::new(0),
            burst_start: AtomicU64::new(0),
            period: AtomicU64::new(0),
        });
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            for i in 0..crew.members {
                let spawned = std::thread::Builder::new().name(format!("zrecord-gather-{i}")).spawn(move || crew.work());
                if spawned.is_err() {
                    // Fewer members only means less parallelism: posters never wait for one.
                    break;
                }
            }
        });
        (crew.members > 0 && crew.pid == std::process::id()).then_some(crew)
    }

    /// Members (helpers a gather may hope for besides its own thread).
    pub(crate) fn members(&self) -> usize {
        self.members
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<dyn Job>>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Offer `job` to the crew, waking up to `wanted` parked members.
    pub(crate) fn post(&self, job: Arc<dyn Job>, wanted: usize) {
        let now = self.now_ns();
        let prev = self.last_post.swap(now, Ordering::Relaxed);
        if now.saturating_sub(prev) > LINGER.as_nanos() as u64 {
            let last = self.burst_start.swap(now, Ordering::Relaxed);
            let period = now.saturating_sub(last);
            self.period.store(if last == 0 || period > MAX_PERIOD.as_nanos() as u64 { 0 } else { period }, Ordering::Relaxed);
        }
        self.lock().push(job);
        self.posted.fetch_add(1, Ordering::SeqCst);
        let parked = self.parked.load(Ordering::SeqCst);
        for _ in 0..wanted.min(parked) {
            self.wake.notify_one();
        }
    }

    fn now_ns(&self) -> u64 {
        (self.epoch.elapsed().as_nanos() as u64).max(1)
    }

    /// How long a member that is about to park may sleep before the next burst is due, when
    /// posts come at a steady period and the next is still more than [`LEAD`] away.
    fn sleep_before_next(&self) -> Option<Duration> {
        // No period is known (0) until a second burst: `next_wake` then declines.
        let (start, period) = (self.burst_start.load(Ordering::Relaxed), self.period.load(Ordering::Relaxed));
        next_wake(self.now_ns(), start, period, LEAD.as_nanos() as u64).map(Duration::from_nanos)
    }

    /// Take `job` off the queue (its poster is done with it).
    pub(crate) fn retire(&self, job: &Arc<dyn Job>) {
        self.lock().retain(|j| !Arc::ptr_eq(j, job));
    }

    /// The oldest job with parts left; exhausted jobs are dropped on the way.
    fn next(queue: &mut Vec<Arc<dyn Job>>) -> Option<Arc<dyn Job>> {
        queue.retain(|j| !j.exhausted());
        queue.first().cloned()
    }

    /// A member's life: run jobs, linger, park.
    fn work(&self) {
        // Timed waits wake within microseconds of their deadline, not the default 50 us slack.
        // SAFETY: prctl(PR_SET_TIMERSLACK) only sets this thread's timer slack (no pointers).
        #[cfg(target_os = "linux")]
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong);
        }
        let mut seen = u64::MAX;
        let mut idle_since = Instant::now();
        // How long to linger from `idle_since` (longer after waking ahead of a due burst).
        let mut linger = LINGER;
        loop {
            let posted = self.posted.load(Ordering::SeqCst);
            if posted != seen {
                seen = posted;
                let job = Crew::next(&mut self.lock());
                if let Some(job) = job {
                    job.help();
                    // More may be queued behind it: look again at once.
                    seen = u64::MAX;
                    idle_since = Instant::now();
                }
                continue;
            }
            let idle = idle_since.elapsed();
            if idle < SPIN {
                for _ in 0..16 {
                    std::hint::spin_loop();
                }
            } else if idle < linger {
                std::thread::yield_now();
            } else {
                let mut q = self.lock();
                linger = LINGER;
                if Crew::next(&mut q).is_none() {
                    self.parked.fetch_add(1, Ordering::SeqCst);
                    q = match self.sleep_before_next() {
                        Some(d) => {
                            linger = LEAD + LINGER;
                            self.wake.wait_timeout(q, d).unwrap_or_else(|p| p.into_inner()).0
                        }
                        _ => self.wake.wait(q).unwrap_or_else(|p| p.into_inner()),
                    };
                    self.parked.fetch_sub(1, Ordering::SeqCst);
                }
                drop(q);
                seen = u64::MAX;
                idle_since = Instant::now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::next_wake;

    #[test]
    fn members_wake_ahead_of_the_next_due_burst() {
        // Bursts every 1000 ns from t=5000; 100 ns of lead.
        assert_eq!(next_wake(5200, 5000, 1000, 100), Some(700));
        // Past one due time without a burst: the one after it.
        assert_eq!(next_wake(6300, 5000, 1000, 100), Some(600));
        // Within the lead of the next one: no sleep (linger instead).
        assert_eq!(next_wake(5950, 5000, 1000, 100), None);
        // A loop that stopped, or no period known: park until woken.
        assert_eq!(next_wake(9500, 5000, 1000, 100), None);
        assert_eq!(next_wake(5200, 5000, 0, 100), None);
        assert_eq!(next_wake(4000, 5000, 1000, 100), None);
    }
}
