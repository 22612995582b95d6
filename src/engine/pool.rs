//! The engine's thread pool for the matmul tiles and the attention kernels: a pool that
//! survives sharing the CPU.
//!
//! candle's barrier pool hands each worker a slice and the caller then spins until every
//! worker has signalled: when the web view, the OS or another app holds a core, a worker
//! that is not running stalls every decode step for a whole scheduler time slice (on two
//! cores, `--threads 8` decoded at 2.3 tok/s instead of 163). This pool is built so that
//! a busy core costs its share and no more:
//!
//! - **Join, don't assign.** A job is a range of items taken in small chunks from a shared
//!   cursor. Workers *join* a job while it is open; the caller works through the cursor
//!   itself and, once it is exhausted, closes the job and waits only for the workers that
//!   joined and are finishing a chunk. A worker that was not scheduled in time never
//!   joins, and nobody waits for it.
//! - **Spin briefly, then park.** Idle workers spin for [`WORKER_SPIN`] (the gaps between
//!   the ~150 parallel regions of a decode step are a few microseconds) and then park;
//!   the caller waits for stragglers the same way. Nobody spins forever.
//! - **Never more threads than cores.** [`Pool::set_threads`] caps the count at
//!   [`available_cores`]; on Apple devices that is the performance cores only.
//! - **Back off when the cores are shared.** A worker descheduled in the middle of a chunk
//!   still makes the caller wait for it, a whole time slice. When such waits take more
//!   than [`MAX_STALL_SHARE`] of the time, the pool runs on one worker fewer for
//!   [`BACKOFF`], then tries the full count again ([`Contention`]). With one of two
//!   cores kept busy, two threads decoded slower than one before this; now they do not.
//!
//! The thread count can change at any time (the app's settings panel does so); workers
//! beyond the count stay parked.

use std::cell::{Cell, UnsafeCell};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long an idle worker looks for the next job before it parks.
const WORKER_SPIN: Duration = Duration::from_micros(50);
/// How long the caller spins for joined workers to finish before it parks.
const CALLER_SPIN: Duration = Duration::from_micros(20);
/// Chunks per thread a job is cut into: enough for a fast thread to take over a slow
/// one's share, few enough that the shared cursor is not contended.
const CHUNKS_PER_THREAD: usize = 8;

/// Straggler waits beyond this share of the time make the pool use one worker fewer.
const MAX_STALL_SHARE: f64 = 0.10;
/// How often the straggler waits are weighed.
const CONTENTION_WINDOW: Duration = Duration::from_millis(100);
/// How long the pool runs with fewer workers before it tries the full count again.
const BACKOFF: Duration = Duration::from_secs(2);

/// Below this many multiply-adds a call runs on the calling thread: waking the pool costs
/// more than it saves (a 576 x 576 decode matmul is ~330k, ~10 us on one core).
pub(crate) const PAR_MIN_MACS: usize = 256 * 1024;

// The job state word: | stop (1 bit) | generation (31 bits) | open (1 bit) | joined (31 bits) |.
const OPEN: u64 = 1 << 31;
const JOINED: u64 = OPEN - 1;
const GEN_ONE: u64 = 1 << 32;
const GEN: u64 = ((1 << 31) - 1) << 32;
/// Set when the pool is dropped: its workers end.
const STOP: u64 = 1 << 63;

/// A raw pointer the pool's threads may share; each writes a disjoint part.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub(crate) *mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    // a method, so closures capture the Sync wrapper and not its raw field
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// The cores this process should compute on: the performance cores on Apple devices, the
/// cores the process may run on (affinity, cgroup quota) elsewhere, never more than the
/// physical cores.
pub fn available_cores() -> usize {
    let allowed = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    #[cfg(target_vendor = "apple")]
    if let Some(performance) = apple_performance_cores() {
        return performance.clamp(1, allowed);
    }
    allowed.min(num_cpus::get_physical().max(1))
}

/// `hw.perflevel0.physicalcpu`: the performance cores of an Apple silicon chip (absent on
/// Intel Macs).
#[cfg(target_vendor = "apple")]
fn apple_performance_cores() -> Option<usize> {
    let mut count: u32 = 0;
    let mut size = std::mem::size_of::<u32>();
    // SAFETY: the name is NUL-terminated and `count`/`size` describe a u32 we own.
    let ret = unsafe {
        libc::sysctlbyname(
            c"hw.perflevel0.physicalcpu".as_ptr(),
            (&mut count as *mut u32).cast(),
            &mut size,
            std::ptr::null_mut(),
            0,
        )
    };
    (ret == 0 && count > 0).then_some(count as usize)
}

/// The pool the engine's kernels run on.
pub fn global() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool::new(available_cores()))
}

/// Runs `f` over `0..units` in chunks, on the global pool when `macs` (the call's
/// multiply-adds) make it worth a hand-off, else on this thread.
pub(crate) fn for_each_chunk(units: usize, macs: usize, f: impl Fn(Range<usize>) + Sync) {
    if macs < PAR_MIN_MACS || units <= 1 {
        f(0..units);
    } else {
        global().run(units, f);
    }
}

thread_local! {
    /// Set on pool workers and on a caller while it runs a job: a nested call runs inline.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// What the caller publishes for one job; written only while no worker can join.
struct Job {
    run: unsafe fn(*const (), Range<usize>),
    data: *const (),
    items: usize,
    chunk: usize,
    caller: Option<Thread>,
}

struct Shared {
    state: AtomicU64,
    cursor: AtomicUsize,
    job: UnsafeCell<Job>,
    /// Workers configured (the thread count minus the caller).
    enabled: AtomicUsize,
    /// Workers that may join the current job (fewer than `enabled` while backing off).
    joinable: AtomicUsize,
    /// Per worker: it is parked (or about to park) and needs an unpark for the next job.
    sleeping: Box<[AtomicBool]>,
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

// SAFETY: `job` is written by the caller only while the job is closed and no worker has
// joined it (see `Pool::run`); workers read it only between joining and leaving.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A pool of compute threads; see the module docs.
pub struct Pool {
    shared: Arc<Shared>,
    /// Serializes callers; holds the handles of the workers spawned so far.
    callers: Mutex<Callers>,
    /// Most workers this pool may have (cores - 1).
    max_workers: usize,
}

impl Pool {
    /// A pool for up to `cores` threads (the caller included), using all of them.
    pub fn new(cores: usize) -> Pool {
        let max_workers = cores.max(1) - 1;
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            cursor: AtomicUsize::new(0),
            job: UnsafeCell::new(Job { run: noop, data: std::ptr::null(), items: 0, chunk: 1, caller: None }),
            enabled: AtomicUsize::new(0),
            joinable: AtomicUsize::new(0),
            sleeping: (0..max_workers).map(|_| AtomicBool::new(false)).collect(),
            panic: Mutex::new(None),
        });
        let callers = Mutex::new(Callers { workers: Vec::new(), contention: Contention::default() });
        let pool = Pool { shared, callers, max_workers };
        pool.set_threads(cores);
        pool
    }

    /// Threads a job runs on, the caller included.
    pub fn threads(&self) -> usize {
        self.shared.enabled.load(Ordering::Relaxed) + 1
    }

    /// Sets the thread count (the caller included), capped at the cores the pool was
    /// made for; returns the count in force.
    pub fn set_threads(&self, threads: usize) -> usize {
        let wanted = threads.clamp(1, self.max_workers + 1) - 1;
        let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        callers.contention = Contention::default();
        let workers = &mut callers.workers;
        while workers.len() < wanted {
            let tid = workers.len();
            let shared = self.shared.clone();
            match std::thread::Builder::new()
                .name(format!("pocketchat-compute-{tid}"))
                .spawn(move || worker(shared, tid))
            {
                Ok(handle) => workers.push(handle.thread().clone()),
                Err(e) => {
                    tracing::warn!("could not start compute thread {tid}: {e}");
                    break;
                }
            }
        }
        let enabled = wanted.min(workers.len());
        self.shared.enabled.store(enabled, Ordering::Relaxed);
        enabled + 1
    }

    /// Runs `f` over `0..items`, in chunks, on this thread and whichever workers join.
    /// Every item is passed to `f` exactly once; returns when all calls have returned.
    pub fn run<F: Fn(Range<usize>) + Sync>(&self, items: usize, f: F) {
        if items == 0 {
            return;
        }
        if IN_JOB.with(Cell::get) {
            return f(0..items);
        }
        let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        let enabled = self.shared.enabled.load(Ordering::Relaxed).min(callers.workers.len());
        let joinable = callers.contention.workers(enabled, Instant::now());
        if joinable == 0 || items == 1 {
            drop(callers);
            return f(0..items);
        }
        let shared = &*self.shared;
        let chunk = items.div_ceil((joinable + 1) * CHUNKS_PER_THREAD).max(1);
        // SAFETY: the previous job is closed and its workers have left (the guard of the
        // previous call waited for that), so nobody reads `job` now.
        unsafe {
            *shared.job.get() = Job {
                run: trampoline::<F>,
                data: (&f as *const F).cast(),
                items,
                chunk,
                caller: Some(std::thread::current()),
            };
        }
        shared.cursor.store(0, Ordering::Relaxed);
        shared.joinable.store(joinable, Ordering::Relaxed);
        let next_gen = (shared.state.load(Ordering::Relaxed) & GEN).wrapping_add(GEN_ONE) & GEN;
        // Open the job (Release: the job and the cursor are visible to whoever joins).
        shared.state.store(next_gen | OPEN, Ordering::SeqCst);
        for (tid, handle) in callers.workers.iter().enumerate().take(joinable) {
            if shared.sleeping[tid].load(Ordering::SeqCst) {
                handle.unpark();
            }
        }
        // Closes the job and waits for joined workers, also when `f` panics here.
        let close = CloseOnDrop { shared, armed: true };
        IN_JOB.with(|c| c.set(true));
        let busy = Instant::now();
        let taken = take_chunks(shared);
        let busy = busy.elapsed();
        let waited = close.finish();
        // A chunk's time is what a worker that was running may legitimately keep us
        // waiting; the rest is a worker that was not running.
        let stalled = waited.saturating_sub(busy / taken.max(1) as u32);
        if callers.contention.record(stalled, Instant::now(), enabled) {
            tracing::debug!("compute threads stalled on a busy core; one fewer for {BACKOFF:?}");
        }
        drop(callers);
        if let Some(payload) = shared.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            std::panic::resume_unwind(payload);
        }
    }
}

/// What callers share under the pool's lock.
struct Callers {
    workers: Vec<Thread>,
    contention: Contention,
}

/// Weighs the time callers spend waiting for workers that were not running, and lowers
/// the worker count for a while when it is too much (see the module docs).
#[derive(Debug, Default)]
struct Contention {
    window_start: Option<Instant>,
    stalled: Duration,
    /// Workers left out until `until`.
    fewer: usize,
    until: Option<Instant>,
}

impl Contention {
    /// Workers a job may use now, of `enabled`.
    fn workers(&mut self, enabled: usize, now: Instant) -> usize {
        if self.until.is_some_and(|until| now >= until) {
            self.fewer = 0;
            self.until = None;
        }
        enabled.saturating_sub(self.fewer)
    }

    /// A job ended at `now` after waiting `stalled` for descheduled workers; returns true
    /// when this makes the pool use one worker fewer.
    fn record(&mut self, stalled: Duration, now: Instant, enabled: usize) -> bool {
        let start = *self.window_start.get_or_insert(now);
        self.stalled += stalled;
        let elapsed = now.saturating_duration_since(start);
        if elapsed < CONTENTION_WINDOW {
            return false;
        }
        let too_much = self.stalled.as_secs_f64() > MAX_STALL_SHARE * elapsed.as_secs_f64();
        self.window_start = Some(now);
        self.stalled = Duration::ZERO;
        if too_much && self.fewer < enabled {
            self.fewer += 1;
            self.until = Some(now + BACKOFF);
            return true;
        }
        false
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Workers of a dropped pool (tests make their own) stop at their next wake-up.
        self.shared.enabled.store(0, Ordering::SeqCst);
        self.shared.joinable.store(0, Ordering::SeqCst);
        self.shared.state.fetch_or(STOP, Ordering::SeqCst);
        for handle in self.callers.lock().unwrap_or_else(|e| e.into_inner()).workers.iter() {
            handle.unpark();
        }
    }
}

struct CloseOnDrop<'a> {
    shared: &'a Shared,
    armed: bool,
}

impl CloseOnDrop<'_> {
    /// Closes the job and waits for the workers that joined it; returns how long.
    fn finish(mut self) -> Duration {
        self.armed = false;
        close_and_wait(self.shared)
    }
}

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            if std::thread::panicking() {
                // The caller's own panic wins; a worker's would be stale at the next job.
                self.shared.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
            }
            close_and_wait(self.shared);
        }
    }
}

fn close_and_wait(shared: &Shared) -> Duration {
    IN_JOB.with(|c| c.set(false));
    let state = shared.state.fetch_and(!OPEN, Ordering::SeqCst) & !OPEN;
    let started = Instant::now();
    if state & JOINED == 0 {
        return Duration::ZERO;
    }
    while shared.state.load(Ordering::Acquire) & JOINED != 0 {
        if started.elapsed() < CALLER_SPIN {
            std::hint::spin_loop();
        } else {
            // The last worker to leave unparks us; the timeout is only a safety net.
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }
    started.elapsed()
}

unsafe fn trampoline<F: Fn(Range<usize>)>(data: *const (), range: Range<usize>) {
    (*data.cast::<F>())(range)
}

unsafe fn noop(_: *const (), _: Range<usize>) {}

/// Takes chunks from the cursor until it runs out. Called by the caller and by workers
/// that joined the job, so `job` is stable meanwhile.
fn take_chunks(shared: &Shared) -> usize {
    // SAFETY: see the callers: the job is live and not being rewritten.
    let job = unsafe { &*shared.job.get() };
    let mut taken = 0;
    loop {
        let start = shared.cursor.fetch_add(job.chunk, Ordering::Relaxed);
        if start >= job.items {
            return taken;
        }
        taken += 1;
        // SAFETY: `data` points at the caller's `F`, alive until the job is closed and
        // every joined worker has left.
        unsafe { (job.run)(job.data, start..job.items.min(start + job.chunk)) };
    }
}

fn worker(shared: Arc<Shared>, tid: usize) {
    IN_JOB.with(|c| c.set(true));
    let mut seen_gen = 0u64;
    loop {
        let Some(state) = wait_for_job(&shared, tid, seen_gen) else { return };
        // Join: only while the job we saw is still open (the generation guards against
        // joining a later job with a stale view).
        if shared.state.compare_exchange(state, state + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            continue;
        }
        seen_gen = state & GEN;
        // SAFETY: joined, so the job stays as it is until we leave.
        let caller = unsafe { (*shared.job.get()).caller.clone() };
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            take_chunks(&shared);
        })) {
            shared.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(payload);
        }
        let before = shared.state.fetch_sub(1, Ordering::AcqRel);
        if before & OPEN == 0 && before & JOINED == 1 {
            if let Some(caller) = caller {
                caller.unpark();
            }
        }
    }
}

/// Waits until a job newer than `seen_gen` is open and this worker may join it; returns
/// the state word seen, or `None` when the pool is gone.
fn wait_for_job(shared: &Shared, tid: usize, seen_gen: u64) -> Option<u64> {
    let ready =
        |state: u64| state & OPEN != 0 && state & GEN != seen_gen && tid < shared.joinable.load(Ordering::Relaxed);
    let mut started = Instant::now();
    let mut spins = 0u32;
    loop {
        let state = shared.state.load(Ordering::Acquire);
        if state & STOP != 0 {
            return None;
        }
        if ready(state) {
            return Some(state);
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) || started.elapsed() < WORKER_SPIN {
            std::hint::spin_loop();
            continue;
        }
        // Park; the caller unparks sleeping workers after opening a job. The flag is set
        // before the last look, so either we see the job or the caller sees the flag.
        shared.sleeping[tid].store(true, Ordering::SeqCst);
        let state = shared.state.load(Ordering::SeqCst);
        if state & STOP == 0 && !ready(state) {
            std::thread::park();
        }
        shared.sleeping[tid].store(false, Ordering::SeqCst);
        started = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn counts(pool: &Pool, items: usize) -> Vec<u32> {
        let seen: Vec<AtomicU32> = (0..items).map(|_| AtomicU32::new(0)).collect();
        pool.run(items, |range| {
            for i in range {
                seen[i].fetch_add(1, Ordering::Relaxed);
            }
        });
        seen.into_iter().map(AtomicU32::into_inner).collect()
    }

    #[test]
    fn every_item_runs_exactly_once_at_any_thread_count() {
        let pool = Pool::new(4);
        for threads in [1, 2, 3, 4] {
            assert_eq!(pool.set_threads(threads), threads);
            for items in [1, 2, 7, 64, 1000, 4097] {
                // Many jobs in a row: workers join, leave and park between them.
                for _ in 0..20 {
                    assert!(counts(&pool, items).iter().all(|&c| c == 1), "{threads} threads, {items} items");
                }
            }
        }
    }

    #[test]
    fn thread_count_is_capped_at_the_pools_cores() {
        let pool = Pool::new(2);
        assert_eq!(pool.set_threads(1000), 2);
        assert_eq!(pool.threads(), 2);
        assert_eq!(pool.set_threads(0), 1);
        assert!(counts(&pool, 100).iter().all(|&c| c == 1));
        assert!(available_cores() >= 1);
    }

    #[test]
    fn workers_take_part_when_they_are_free() {
        let pool = Pool::new(2);
        let ids = Mutex::new(std::collections::HashSet::new());
        // Slow items: a free worker joins long before the caller could finish alone.
        pool.run(64, |range| {
            ids.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(Duration::from_micros(200 * range.len() as u64));
        });
        assert_eq!(ids.lock().unwrap().len(), 2);
    }

    #[test]
    fn nested_calls_run_inline() {
        let pool = Pool::new(3);
        let total = AtomicUsize::new(0);
        pool.run(8, |outer| {
            for _ in outer {
                pool.run(4, |inner| {
                    total.fetch_add(inner.len(), Ordering::Relaxed);
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 32);
    }

    #[test]
    fn a_panic_in_a_job_reaches_the_caller_and_the_pool_goes_on() {
        let pool = Pool::new(2);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(64, |range| {
                if range.contains(&40) {
                    panic!("item 40");
                }
            })
        }));
        assert!(caught.is_err());
        assert!(counts(&pool, 500).iter().all(|&c| c == 1));
    }

    #[test]
    fn long_stalls_cost_a_worker_for_a_while() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut c = Contention::default();
        assert_eq!(c.workers(1, t0), 1);
        // Short waits (a chunk finishing) never add up to a tenth of the time.
        for i in 0..200 {
            assert!(!c.record(Duration::from_micros(5), t0 + Duration::from_micros(500 * i), 1));
        }
        assert_eq!(c.workers(1, ms(100)), 1);
        // 3 ms stalls every 10 ms: a worker fewer, until the back-off ends.
        let mut backed_off = false;
        for i in 1..=20 {
            backed_off |= c.record(Duration::from_millis(3), ms(100 + 10 * i), 1);
        }
        assert!(backed_off);
        assert_eq!(c.workers(1, ms(400)), 0);
        assert_eq!(c.workers(1, ms(300) + BACKOFF), 1, "then the full count is tried again");
    }

    #[test]
    fn more_threads_than_cores_still_finish_every_job() {
        // Oversubscribed on purpose (a pool made for 8 on whatever this machine has):
        // jobs must not wait for workers that were never scheduled.
        let pool = Pool::new(8);
        for _ in 0..2000 {
            assert!(counts(&pool, 33).iter().all(|&c| c == 1));
        }
    }
}
