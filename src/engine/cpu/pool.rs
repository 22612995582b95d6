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
//! - **Take over what a descheduled worker holds** ([`Pool::run_detached`], the decode
//!   matmuls). A worker descheduled in the middle of a chunk of a [`Pool::run`] job makes
//!   the caller wait for it, a whole burst of whatever runs in its place, and the two
//!   threads then advance in lockstep: with the window's short bursts on two cores, two
//!   threads decoded no faster than one. A detached job owns what it reads (an `Arc`),
//!   so nobody has to wait for a worker to leave it: when the caller runs out of chunks
//!   and a worker's chunk is late, the caller computes that chunk again itself, and
//!   whichever of the two finishes first publishes it.
//! - **Back off when the cores are shared.** For [`Pool::run`] jobs (borrowed data, so
//!   the caller must wait): when such waits take more than [`MAX_STALL_SHARE`] of the
//!   time, those jobs run on one worker fewer for [`BACKOFF`], then try the full count
//!   again ([`Contention`]). With one of two cores kept busy, two threads decoded slower
//!   than one before this; now they do not.
//!
//! The thread count can change at any time (the app's settings panel does so); workers
//! beyond the count stay parked.

use std::cell::{Cell, UnsafeCell};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
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
    /// Set for [`Pool::run_detached`]: workers take a share of it and leave at once.
    detached: Option<Arc<Detached>>,
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
            job: UnsafeCell::new(Job {
                run: noop,
                data: std::ptr::null(),
                items: 0,
                chunk: 1,
                caller: None,
                detached: None,
            }),
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
        let chunk = items.div_ceil((joinable + 1) * CHUNKS_PER_THREAD).max(1);
        let job = Job {
            run: trampoline::<F>,
            data: (&f as *const F).cast(),
            items,
            chunk,
            caller: Some(std::thread::current()),
            detached: None,
        };
        // SAFETY: the previous job is closed and its workers have left (the guard of the
        // previous call waited for that).
        unsafe { self.open(&callers, job, joinable) };
        let shared = &*self.shared;
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

    /// Publishes `job` and opens it to `joinable` workers, waking those that sleep.
    ///
    /// # Safety
    /// The caller holds the pool's lock (`callers`) and the previous job is closed with
    /// no worker joined, so nobody reads `job` now.
    unsafe fn open(&self, callers: &Callers, job: Job, joinable: usize) {
        let shared = &*self.shared;
        *shared.job.get() = job;
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
    }

    /// Runs `job` into `out` (`job.outputs()` values) on this thread and whichever
    /// workers join, without ever waiting for a worker that is not running: a chunk a
    /// worker holds too long is computed again here (see the module docs).
    pub(crate) fn run_detached(&self, job: impl Detachable + 'static, out: &mut [f32]) {
        let items = job.items();
        assert_eq!(out.len(), job.outputs(), "the output buffer must hold the job's outputs");
        if items == 0 {
            return;
        }
        if IN_JOB.with(Cell::get) {
            return job.compute(0..items, out);
        }
        let callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        // Nobody waits on a late worker here, so the back-off does not apply.
        let workers = self.shared.enabled.load(Ordering::Relaxed).min(callers.workers.len());
        if workers == 0 || items == 1 {
            drop(callers);
            return job.compute(0..items, out);
        }
        let chunk = items.div_ceil((workers + 1) * CHUNKS_PER_THREAD).max(1);
        let detached = Arc::new(Detached::new(Box::new(job), chunk, out));
        let job = Job {
            run: noop,
            data: std::ptr::null(),
            items: 0,
            chunk: 1,
            caller: Some(std::thread::current()),
            detached: Some(detached.clone()),
        };
        // SAFETY: as in `run`.
        unsafe { self.open(&callers, job, workers) };
        let close = CloseOnDrop { shared: &self.shared, armed: true };
        let _sealed = SealOnUnwind(&detached);
        IN_JOB.with(|c| c.set(true));
        let (mine, chunk_time) = detached.work_as_caller();
        // Joined workers only take their share of `detached` and leave: a short wait.
        close.finish();
        // SAFETY: closed and nobody joined, under the lock. The job (and the weights it
        // holds) lives on only in the shares of workers still at it.
        unsafe { (*self.shared.job.get()).detached = None };
        detached.finish_as_caller(&mine, chunk_time + TAKE_OVER_SLACK);
    }
}

/// A job for [`Pool::run_detached`]: pure, writing `outputs` values, so that an item range
/// computed twice (by a late worker and by the caller) gives the same values.
pub(crate) trait Detachable: Send + Sync {
    /// Items the job is cut into.
    fn items(&self) -> usize;
    /// Values the job writes, all items together.
    fn outputs(&self) -> usize;
    /// Where the values of `items` go among the job's outputs (contiguous, in item order).
    fn output_range(&self, items: Range<usize>) -> Range<usize>;
    /// Computes `items` into `out` (`output_range(items).len()` values).
    fn compute(&self, items: Range<usize>, out: &mut [f32]);
}

/// How long past its own chunk time the caller waits for a worker's chunk before it
/// computes that chunk itself.
const TAKE_OVER_SLACK: Duration = Duration::from_micros(2);

/// If the caller unwinds out of a detached job, `out` goes with it: no worker may publish
/// into it afterwards.
struct SealOnUnwind<'a>(&'a Detached);

impl Drop for SealOnUnwind<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for chunk in self.0.chunks.iter() {
            loop {
                match chunk.compare_exchange(OPEN_CHUNK, TAKEN_OVER, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) | Err(DONE) | Err(TAKEN_OVER) => break,
                    // a worker copies its chunk in: a moment
                    Err(_) => std::hint::spin_loop(),
                }
            }
        }
    }
}

// Where a chunk of a detached job stands. The caller keeps track of its own chunks.
/// Not published: nobody took it, or a worker computes it into its own buffer.
const OPEN_CHUNK: u8 = 0;
/// A worker finished it first and copies it into the outputs.
const PUBLISHING: u8 = 1;
/// In the outputs.
const DONE: u8 = 2;
/// Taken over by the caller, which computes it straight into the outputs.
const TAKEN_OVER: u8 = 3;

/// A detached job's shared state: the job, where its chunks stand and its outputs.
struct Detached {
    job: Box<dyn Detachable>,
    chunk: usize,
    cursor: AtomicUsize,
    chunks: Box<[AtomicU8]>,
    /// The caller's output buffer. Written only by whoever moved a chunk to PUBLISHING or
    /// TAKEN_OVER (or the caller, for chunks it took from the cursor), and never once the
    /// caller has returned: by then every chunk is DONE or the caller's.
    out: SendPtr<f32>,
    out_len: usize,
}

impl Detached {
    fn new(job: Box<dyn Detachable>, chunk: usize, out: &mut [f32]) -> Detached {
        let chunks = job.items().div_ceil(chunk);
        Detached {
            job,
            chunk,
            cursor: AtomicUsize::new(0),
            chunks: (0..chunks).map(|_| AtomicU8::new(OPEN_CHUNK)).collect(),
            out: SendPtr(out.as_mut_ptr()),
            out_len: out.len(),
        }
    }

    fn items_of(&self, c: usize) -> Range<usize> {
        c * self.chunk..self.job.items().min((c + 1) * self.chunk)
    }

    /// # Safety
    /// This thread holds chunk `c`, and the caller is still in `run_detached`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn out_of(&self, c: usize) -> &mut [f32] {
        let r = self.job.output_range(self.items_of(c));
        assert!(r.start <= r.end && r.end <= self.out_len);
        std::slice::from_raw_parts_mut(self.out.get().add(r.start), r.len())
    }

    /// The caller computes chunks from the cursor straight into the outputs; returns which
    /// chunks it took and its mean time per chunk.
    fn work_as_caller(&self) -> (Vec<bool>, Duration) {
        let started = Instant::now();
        let mut mine = vec![false; self.chunks.len()];
        let mut taken = 0u32;
        loop {
            let c = self.cursor.fetch_add(1, Ordering::Relaxed);
            if c >= self.chunks.len() {
                return (mine, started.elapsed() / taken.max(1));
            }
            // SAFETY: a cursor index is handed out once; only the caller takes chunks over.
            self.job.compute(self.items_of(c), unsafe { self.out_of(c) });
            mine[c] = true;
            taken += 1;
        }
    }

    /// A worker computes chunks from the cursor into `scratch` and publishes those the
    /// caller did not take over meanwhile.
    fn work_as_worker(&self, scratch: &mut Vec<f32>) {
        loop {
            let c = self.cursor.fetch_add(1, Ordering::Relaxed);
            if c >= self.chunks.len() {
                return;
            }
            let items = self.items_of(c);
            scratch.clear();
            scratch.resize(self.job.output_range(items.clone()).len(), 0.0);
            self.job.compute(items, scratch);
            let won = self.chunks[c].compare_exchange(OPEN_CHUNK, PUBLISHING, Ordering::Acquire, Ordering::Relaxed);
            if won.is_ok() {
                // SAFETY: held as PUBLISHING, so the caller is still waiting for it.
                unsafe { self.out_of(c) }.copy_from_slice(scratch);
                self.chunks[c].store(DONE, Ordering::Release);
            }
        }
    }

    /// The caller, out of chunks, waits for the workers' ones; those not published after
    /// `patience` (their worker most likely descheduled) it computes itself.
    fn finish_as_caller(&self, mine: &[bool], patience: Duration) {
        let deadline = Instant::now() + patience;
        let mut late = false;
        let mut spins = 0u32;
        for (c, chunk) in self.chunks.iter().enumerate().filter(|(c, _)| !mine[*c]) {
            loop {
                match chunk.load(Ordering::Acquire) {
                    DONE => break,
                    OPEN_CHUNK if late => {
                        let taken =
                            chunk.compare_exchange(OPEN_CHUNK, TAKEN_OVER, Ordering::Acquire, Ordering::Relaxed);
                        if taken.is_ok() {
                            // SAFETY: held as TAKEN_OVER; the worker will not publish it.
                            self.job.compute(self.items_of(c), unsafe { self.out_of(c) });
                            break;
                        }
                    }
                    _ => {
                        std::hint::spin_loop();
                        spins = spins.wrapping_add(1);
                        late |= spins.is_multiple_of(32) && Instant::now() >= deadline;
                    }
                }
            }
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
    let mut scratch = Vec::new();
    loop {
        let Some(state) = wait_for_job(&shared, tid, seen_gen) else { return };
        // Join: only while the job we saw is still open (the generation guards against
        // joining a later job with a stale view).
        if shared.state.compare_exchange(state, state + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            continue;
        }
        seen_gen = state & GEN;
        // SAFETY: joined, so the job stays as it is until we leave.
        let (caller, detached) = unsafe {
            let job = &*shared.job.get();
            (job.caller.clone(), job.detached.clone())
        };
        if let Some(detached) = detached {
            // Our share of the job keeps it alive: leave at once, then work.
            leave(&shared, caller);
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| detached.work_as_worker(&mut scratch))).is_err()
            {
                // The caller computes the chunk we held again and meets the panic itself.
                tracing::error!("a compute thread panicked in a detached job");
            }
            continue;
        }
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            take_chunks(&shared);
        })) {
            shared.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(payload);
        }
        leave(&shared, caller);
    }
}

/// A worker leaves the job it joined; the last one out of a closed job wakes its caller.
fn leave(shared: &Shared, caller: Option<Thread>) {
    let before = shared.state.fetch_sub(1, Ordering::AcqRel);
    if before & OPEN == 0 && before & JOINED == 1 {
        if let Some(caller) = caller {
            caller.unpark();
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

    /// A test double for a decode matmul: item `i` writes `2 i` and `i + 1`, after
    /// `before` has seen the range.
    struct Doubles<F = fn(&Range<usize>)> {
        items: usize,
        before: F,
    }

    fn plain(items: usize) -> Doubles {
        Doubles { items, before: |_| {} }
    }

    impl<F: Fn(&Range<usize>) + Send + Sync> Detachable for Doubles<F> {
        fn items(&self) -> usize {
            self.items
        }
        fn outputs(&self) -> usize {
            2 * self.items
        }
        fn output_range(&self, items: Range<usize>) -> Range<usize> {
            2 * items.start..2 * items.end
        }
        fn compute(&self, items: Range<usize>, out: &mut [f32]) {
            (self.before)(&items);
            for (i, o) in items.zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&[2.0 * i as f32, i as f32 + 1.0]);
            }
        }
    }

    fn doubles(items: usize) -> Vec<f32> {
        (0..items).flat_map(|i| [2.0 * i as f32, i as f32 + 1.0]).collect()
    }

    #[test]
    fn detached_jobs_write_every_output_at_any_thread_count() {
        let pool = Pool::new(4);
        for threads in [1, 2, 3, 4] {
            pool.set_threads(threads);
            for items in [1, 2, 7, 64, 1000] {
                for _ in 0..20 {
                    let mut out = vec![f32::NAN; 2 * items];
                    pool.run_detached(plain(items), &mut out);
                    assert_eq!(out, doubles(items), "{threads} threads, {items} items");
                }
            }
        }
    }

    #[test]
    fn a_detached_job_does_not_wait_for_a_stuck_worker() {
        let pool = Pool::new(2);
        let caller = std::thread::current().id();
        let release = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let worker_started = Arc::new(AtomicBool::new(false));
        let worker_finished = Arc::new(AtomicBool::new(false));
        // A test double for a worker descheduled in the middle of a chunk: on the worker,
        // a chunk blocks until the test releases it; the caller starts once it does.
        let stuck_on_workers = {
            let (release, started, finished) = (release.clone(), worker_started.clone(), worker_finished.clone());
            move |_: &Range<usize>| {
                if std::thread::current().id() == caller {
                    let t0 = Instant::now();
                    while !started.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(10) {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                } else {
                    started.store(true, Ordering::SeqCst);
                    let (lock, cvar) = &*release;
                    let released = lock.lock().unwrap();
                    let _ = cvar.wait_timeout_while(released, Duration::from_secs(10), |r| !*r).unwrap();
                    finished.store(true, Ordering::SeqCst);
                }
            }
        };
        let mut out = vec![f32::NAN; 128];
        pool.run_detached(Doubles { items: 64, before: stuck_on_workers }, &mut out);
        // The caller computed the stuck worker's chunk itself and returned.
        assert!(worker_started.load(Ordering::SeqCst));
        assert!(!worker_finished.load(Ordering::SeqCst), "the caller waited for the stuck worker");
        assert_eq!(out, doubles(64));
        // Released, the worker drops its stale chunk and serves the next jobs.
        *release.0.lock().unwrap() = true;
        release.1.notify_all();
        for _ in 0..100 {
            let mut out = vec![f32::NAN; 2 * 300];
            pool.run_detached(plain(300), &mut out);
            assert_eq!(out, doubles(300));
            assert!(counts(&pool, 300).iter().all(|&c| c == 1));
        }
    }

    #[test]
    fn a_panic_in_a_detached_job_reaches_the_caller_and_the_pool_goes_on() {
        let pool = Pool::new(2);
        let panics_at_40 = |items: &Range<usize>| assert!(!items.contains(&40), "item 40");
        for _ in 0..20 {
            let mut out = vec![0.0; 128];
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.run_detached(Doubles { items: 64, before: panics_at_40 }, &mut out)
            }));
            assert!(caught.is_err());
            let mut out = vec![f32::NAN; 2 * 500];
            pool.run_detached(plain(500), &mut out);
            assert_eq!(out, doubles(500));
        }
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
