//! Downloading a model file over HTTP(S) with `ureq`: progress, cancel, resume and
//! integrity.
//!
//! - The bytes go to `<file>.part` beside the target. A dropped connection, a cancel or
//!   an app restart keeps it, and the next attempt asks for the rest with `Range`. A
//!   server that ignores `Range` (answers 200, or 206 from an earlier byte) is read from
//!   where it starts again.
//! - Before anything is kept under the final name, the size and sha256 are checked
//!   (from the catalog, else from Hugging Face's `X-Linked-Size` / `X-Linked-Etag`, the
//!   LFS object's sha256) and the file is read as a GGUF. A mismatch deletes the
//!   `.part` and says so. A file already under the final name passes the same checks
//!   before it is taken as done.
//! - Free disk space ([`DownloadOptions::keep_free`] kept free) is checked before the
//!   first byte, again against each response's `Content-Length`, and before every write.
//! - Downloads always end. 401/403/404 fail at once with a sentence for people; 429, 5xx,
//!   timeouts and cut connections are retried with exponential backoff, at most
//!   [`DownloadOptions::attempts`] in a row without progress. An attempt counts as
//!   progress only when it got past the furthest byte reached so far, at the minimum rate
//!   on average: a server that restarts from byte 0, lies about the length or drips
//!   bytes cannot keep it going. An attempt ends when no byte came for
//!   [`DownloadOptions::stall_timeout`] or fewer than the minimum rate's worth in a
//!   [`DownloadOptions::rate_window`]. The reads happen on a worker thread
//!   ([`stream`]), so a cancel is seen within 50 ms even while the server sends nothing.
//! - `HF_ENDPOINT` replaces the `https://huggingface.co` prefix, as `huggingface_hub`
//!   does, for mirrors.

mod stream;

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::sha256_file;

/// Environment variable naming a Hugging Face mirror (`huggingface_hub`'s name for it).
pub const HF_ENDPOINT_ENV: &str = "HF_ENDPOINT";
const HF_PREFIX: &str = "https://huggingface.co";

/// Space left free on the disk after a download, so that the phone keeps working.
pub const DISK_MARGIN_BYTES: u64 = 64 * 1024 * 1024;
/// Progress is reported at most this often (and once at the end).
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// What to download and what it must turn out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadRequest {
    pub url: String,
    /// Final path; the bytes arrive in `<dest>.part` first.
    pub dest: PathBuf,
    /// Size in bytes when the catalog knows it.
    pub bytes: Option<u64>,
    /// sha256 (lowercase hex) when the catalog knows it.
    pub sha256: Option<String>,
}

/// How hard to try. [`DownloadOptions::default`] suits people; tests shorten the waits.
#[derive(Debug, Clone)]
pub struct DownloadOptions {
    /// Attempts in a row without progress before giving up (see [`made_progress`]).
    pub attempts: u32,
    /// Wait before the first retry; doubled each time, capped at 30 s.
    pub backoff: Duration,
    pub connect_timeout: Duration,
    /// No byte (nor an answer to a request) for this long ends the attempt.
    pub stall_timeout: Duration,
    /// Fewer than `min_bytes_per_sec` times this many seconds' worth of bytes in one such
    /// window ends the attempt: a server dripping a byte now and then does not hold it.
    pub rate_window: Duration,
    /// The slowest rate accepted, in bytes per second, measured over `rate_window`.
    pub min_bytes_per_sec: u64,
    /// Bytes left free on the disk: the download stops (keeping its `.part`) rather
    /// than go below.
    pub keep_free: u64,
    /// Set to stop: the download ends with [`DownloadError::Cancelled`] within 50 ms, even
    /// in a read that waits for the server, and keeps its `.part`.
    pub cancel: Arc<AtomicBool>,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        DownloadOptions {
            attempts: 5,
            backoff: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(15),
            stall_timeout: Duration::from_secs(30),
            rate_window: Duration::from_secs(60),
            min_bytes_per_sec: 4096,
            keep_free: DISK_MARGIN_BYTES,
            cancel: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// Where a download stands, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub bytes: u64,
    pub total: Option<u64>,
    /// Recent rate in bytes per second (0 until measured).
    pub bytes_per_sec: f64,
    /// Time left at the recent rate, when the total is known.
    pub eta: Option<Duration>,
    /// True while the finished file is being checked (sha256, GGUF).
    pub verifying: bool,
}

impl Progress {
    /// Fraction done in 0..=1, when the total is known.
    pub fn fraction(&self) -> Option<f64> {
        self.total.filter(|t| *t > 0).map(|t| (self.bytes as f64 / t as f64).min(1.0))
    }
}

/// Why a download did not produce a file. Messages are written for the person waiting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DownloadError {
    #[error("{url}: {message}")]
    Refused { url: String, status: u16, message: String },
    #[error("{url}: gave up after {attempts} attempts in a row that got no further than byte {furthest}: {last}")]
    GaveUp { url: String, attempts: u32, furthest: u64, last: String },
    #[error("download cancelled after {bytes} bytes; run it again to resume from there")]
    Cancelled { bytes: u64 },
    /// Sizes in MiB.
    #[error(
        "not enough disk space in {dir}: the download needs {needed} MiB more and {available} MiB are free \
         ({keep_free} MiB are kept free)"
    )]
    DiskFull { dir: PathBuf, needed: u64, available: u64, keep_free: u64 },
    /// Sizes in MiB.
    #[error(
        "stopped writing {path} after {bytes} bytes to keep {keep_free} MiB free on its disk ({available} MiB \
         are free); free some space and run it again to resume"
    )]
    NoRoomLeft { path: PathBuf, bytes: u64, available: u64, keep_free: u64 },
    #[error("{path} is {actual} bytes, not the expected {expected}: the download is corrupt and was deleted")]
    SizeMismatch { path: PathBuf, expected: u64, actual: u64 },
    #[error(
        "checksum mismatch for {path}: expected sha256 {expected}, got {actual}: the download is corrupt \
         or not the file asked for, and was deleted"
    )]
    ChecksumMismatch { path: PathBuf, expected: String, actual: String },
    #[error("{url} is not a usable GGUF model file ({message}); it was deleted")]
    NotGguf { url: String, message: String },
    #[error("another download of {0} is running")]
    Busy(PathBuf),
    /// The cause is in the message and not a `source`, so that a report of the chain
    /// does not print it twice.
    #[error("{action} {path}: {cause}")]
    Io { action: &'static str, path: PathBuf, cause: io::Error },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> DownloadError {
    let path = path.to_path_buf();
    move |cause| DownloadError::Io { action, path, cause }
}

const MIB: u64 = 1024 * 1024;

/// The file name a GGUF URL downloads to: its last path segment, without query or
/// fragment. `Err` says why a URL names no `.gguf` file (or a hidden one).
pub fn file_name_of_url(url: &str) -> Result<String, String> {
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(format!("{url} is not an http(s) URL"));
    }
    let path = url.split(['?', '#']).next().unwrap_or_default();
    let name = path.rsplit('/').next().unwrap_or_default();
    if !name.to_ascii_lowercase().ends_with(".gguf") || name.starts_with('.') || name.contains('\\') {
        return Err(format!("{url} does not name a .gguf file"));
    }
    Ok(name.to_string())
}

/// `url` with its `https://huggingface.co` prefix replaced by `endpoint` (trailing
/// slashes ignored). Other URLs, and an empty endpoint, are left alone.
pub fn with_hf_endpoint(url: &str, endpoint: Option<&str>) -> String {
    let endpoint = endpoint.map(|e| e.trim_end_matches('/')).filter(|e| !e.is_empty());
    match (endpoint, url.strip_prefix(HF_PREFIX)) {
        (Some(e), Some(rest)) if rest.is_empty() || rest.starts_with('/') => format!("{e}{rest}"),
        _ => url.to_string(),
    }
}

/// The `.part` file a download of `dest` writes to.
pub fn part_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".part");
    dest.with_file_name(name)
}

/// Downloads `request` (resuming its `.part`), verifies it and renames it into place.
/// `progress` is called from this thread at most every 100 ms. A file already at
/// `dest` is returned as is when it passes the checks a download would (size and sha256
/// where known, GGUF); otherwise it is downloaded again and replaced once verified.
pub fn download(
    request: &DownloadRequest,
    options: &DownloadOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<PathBuf, DownloadError> {
    let _span = tracing::info_span!("download", url = %request.url, dest = %request.dest.display()).entered();
    let url = with_hf_endpoint(&request.url, std::env::var(HF_ENDPOINT_ENV).ok().as_deref());
    let agent = agent(options);
    // The linked metadata needs a request; a file checked by the catalog's sha256 does not.
    let mut linked = None;
    if request.dest.is_file() {
        let known = match request.sha256 {
            Some(_) => Linked::default(),
            None => linked.insert(linked_metadata(&agent, &url, options)?).clone(),
        };
        let (bytes, sha) = expected(request, &known);
        let len = std::fs::metadata(&request.dest).map_or(0, |m| m.len());
        progress(&Progress { bytes: len, total: Some(len), bytes_per_sec: 0.0, eta: None, verifying: true });
        match verify(&url, &request.dest, bytes, sha.as_deref()) {
            Ok(()) => return Ok(request.dest.clone()),
            Err(e) => tracing::warn!(
                path = %request.dest.display(),
                reason = %mismatch(&e),
                "the file already there is not the one asked for; downloading it again"
            ),
        }
    }
    let dir = request.dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err("cannot create", dir))?;
    let part_path = part_path(&request.dest);
    let mut part = OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(&part_path)
        .map_err(io_err("cannot open", &part_path))?;
    lock_exclusive(&part, &request.dest)?;

    let fetched = match linked {
        Some(l) => Ok(l),
        None => linked_metadata(&agent, &url, options),
    }
    .and_then(|linked| {
        let (expected_bytes, expected_sha) = expected(request, &linked);
        let mut fetcher =
            Fetcher { agent, url: &url, options, part: &mut part, part_path: &part_path, dir, total: expected_bytes };
        fetcher.check_disk_space(expected_bytes)?;
        fetcher.fetch(progress)?;
        Ok((expected_bytes, expected_sha))
    });
    let (expected_bytes, expected_sha) = match fetched {
        Ok(expected) => expected,
        Err(e) => {
            let kept = part.metadata().map_or(0, |m| m.len());
            // An empty .part resumes nothing: leave no trace of a download that never started.
            if kept == 0 {
                let _ = std::fs::remove_file(&part_path);
            }
            return Err(match e {
                DownloadError::Cancelled { .. } => DownloadError::Cancelled { bytes: kept },
                other => other,
            });
        }
    };

    let bytes = part.metadata().map_err(io_err("cannot read", &part_path))?.len();
    progress(&Progress { bytes, total: Some(bytes), bytes_per_sec: 0.0, eta: None, verifying: true });
    if let Err(e) = verify(&url, &part_path, expected_bytes, expected_sha.as_deref()) {
        let _ = std::fs::remove_file(&part_path);
        return Err(e);
    }
    part.sync_all().map_err(io_err("cannot write", &part_path))?;
    std::fs::rename(&part_path, &request.dest).map_err(io_err("cannot rename to", &request.dest))?;
    super::exclude_from_backup(&request.dest);
    tracing::info!(bytes, "download complete");
    Ok(request.dest.clone())
}

/// The size and sha256 the file must have: the request's, else the linked ones.
fn expected(request: &DownloadRequest, linked: &Linked) -> (Option<u64>, Option<String>) {
    (request.bytes.or(linked.bytes), request.sha256.clone().or_else(|| linked.sha256.clone()))
}

/// Why a file failed [`verify`], without the "was deleted" of the error's message.
fn mismatch(e: &DownloadError) -> String {
    match e {
        DownloadError::SizeMismatch { expected, actual, .. } => format!("{actual} bytes, not {expected}"),
        DownloadError::ChecksumMismatch { expected, actual, .. } => format!("sha256 {actual}, not {expected}"),
        DownloadError::NotGguf { message, .. } => format!("not a usable GGUF: {message}"),
        other => other.to_string(),
    }
}

fn agent(options: &DownloadOptions) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(options.connect_timeout))
        .timeout_recv_response(Some(options.stall_timeout))
        .timeout_per_read(Some(options.stall_timeout))
        .user_agent(concat!("pocketchat/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent()
}

/// Size and sha256 that Hugging Face puts on the redirect of a `resolve` URL.
#[derive(Debug, Default, Clone)]
struct Linked {
    bytes: Option<u64>,
    sha256: Option<String>,
}

/// Reads `X-Linked-Size` and `X-Linked-Etag` from a HEAD of `url` without following its
/// redirect. Anything else (no such headers, HEAD refused, no connection) gives nothing:
/// the GET that follows reports real errors. Only a cancel is an error.
fn linked_metadata(agent: &ureq::Agent, url: &str, options: &DownloadOptions) -> Result<Linked, DownloadError> {
    let (agent, url) = (agent.clone(), url.to_string());
    let head = stream::cancellable(&options.cancel, move || {
        let Ok(response) = agent.head(&url).config().max_redirects(0).build().call() else {
            return Linked::default();
        };
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let bytes = header("x-linked-size").and_then(|s| s.trim().parse().ok());
        let sha256 =
            header("x-linked-etag").map(|s| s.trim().trim_start_matches("W/").trim_matches('"').to_ascii_lowercase());
        let sha256 = sha256.filter(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()));
        Linked { bytes, sha256 }
    });
    let linked = head.map_err(|stream::Cancelled| DownloadError::Cancelled { bytes: 0 })?;
    if linked.bytes.is_some() || linked.sha256.is_some() {
        tracing::debug!(?linked, "linked metadata");
    }
    Ok(linked)
}

/// Whether an attempt that brought the furthest byte reached forward by `gained` bytes
/// in `took` counts as progress (and starts the count of attempts again): it must have
/// gone past the furthest byte, at `min_bytes_per_sec` or better on average (counting
/// at least one second). A server that sends the same first half again, or a byte per
/// connection, does not reset the count, so the attempt limit is reached.
pub fn made_progress(gained: u64, took: Duration, min_bytes_per_sec: u64) -> bool {
    gained > 0 && gained as f64 >= min_bytes_per_sec as f64 * took.as_secs_f64().max(1.0)
}

/// One download's connection attempts, appending to the `.part` file.
struct Fetcher<'a> {
    agent: ureq::Agent,
    url: &'a str,
    options: &'a DownloadOptions,
    part: &'a mut File,
    part_path: &'a Path,
    /// The folder whose free space is watched.
    dir: &'a Path,
    total: Option<u64>,
}

/// An attempt that did not finish the file and may be tried again.
struct Retry {
    /// For the log and the final error.
    reason: String,
    /// The server's `Retry-After`, else the backoff applies.
    wait: Option<Duration>,
}

impl Retry {
    fn after(reason: String) -> Option<Retry> {
        Some(Retry { reason, wait: None })
    }
}

impl Fetcher<'_> {
    fn have(&self) -> Result<u64, DownloadError> {
        Ok(self.part.metadata().map_err(io_err("cannot read", self.part_path))?.len())
    }

    /// Keeps the first `len` bytes of the `.part` and appends after them.
    fn truncate(&mut self, len: u64) -> Result<(), DownloadError> {
        self.part.set_len(len).map_err(io_err("cannot truncate", self.part_path))?;
        self.part.seek(io::SeekFrom::End(0)).map_err(io_err("cannot seek", self.part_path))?;
        Ok(())
    }

    fn cancelled(&mut self) -> Result<DownloadError, DownloadError> {
        self.part.flush().map_err(io_err("cannot write", self.part_path))?;
        Ok(DownloadError::Cancelled { bytes: self.have()? })
    }

    /// Refuses a download of `total` bytes (of which the `.part` holds some) that would
    /// leave less than `keep_free` on the disk.
    fn check_disk_space(&self, total: Option<u64>) -> Result<(), DownloadError> {
        let Some(total) = total else {
            return Ok(());
        };
        self.check_room_for(total.saturating_sub(self.have()?))
    }

    fn check_room_for(&self, needed: u64) -> Result<(), DownloadError> {
        let Some(available) = free_disk_bytes(self.dir) else {
            return Ok(());
        };
        if needed.saturating_add(self.options.keep_free) > available {
            return Err(DownloadError::DiskFull {
                dir: self.dir.to_path_buf(),
                needed: needed.div_ceil(MIB),
                available: available / MIB,
                keep_free: self.options.keep_free / MIB,
            });
        }
        Ok(())
    }

    /// Writes `bytes` unless that would leave less than `keep_free` on the disk (a
    /// length the server did not announce, or announced wrong, is held to it too).
    fn write(&mut self, bytes: &[u8], have: u64) -> Result<(), DownloadError> {
        if let Some(available) = free_disk_bytes(self.dir) {
            if (bytes.len() as u64).saturating_add(self.options.keep_free) > available {
                self.part.flush().map_err(io_err("cannot write", self.part_path))?;
                return Err(DownloadError::NoRoomLeft {
                    path: self.part_path.to_path_buf(),
                    bytes: have,
                    available: available / MIB,
                    keep_free: self.options.keep_free / MIB,
                });
            }
        }
        self.part.write_all(bytes).map_err(io_err("cannot write", self.part_path))
    }

    fn fetch(&mut self, progress: &mut dyn FnMut(&Progress)) -> Result<(), DownloadError> {
        let mut failures = 0u32;
        let mut backoff = self.options.backoff;
        let mut meter = RateMeter::new();
        let mut furthest = self.have()?;
        loop {
            if self.options.cancel.load(Ordering::Relaxed) {
                return Err(DownloadError::Cancelled { bytes: self.have()? });
            }
            let started = Instant::now();
            let Some(Retry { reason, wait }) = self.attempt(progress, &mut meter)? else {
                return Ok(());
            };
            let have = self.have()?;
            if made_progress(have.saturating_sub(furthest), started.elapsed(), self.options.min_bytes_per_sec) {
                failures = 0;
                backoff = self.options.backoff;
            }
            furthest = furthest.max(have);
            failures += 1;
            if failures >= self.options.attempts {
                return Err(DownloadError::GaveUp {
                    url: self.url.to_string(),
                    attempts: failures,
                    furthest,
                    last: reason,
                });
            }
            let wait = wait.unwrap_or(backoff).min(Duration::from_secs(30));
            tracing::warn!(%reason, furthest, wait_ms = wait.as_millis() as u64, "download interrupted; retrying");
            self.sleep_unless_cancelled(wait);
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
    }

    fn sleep_unless_cancelled(&self, wait: Duration) {
        let until = Instant::now() + wait;
        while Instant::now() < until && !self.options.cancel.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
        }
    }

    /// One request for what is missing. `Ok(None)`: the file is complete.
    fn attempt(
        &mut self,
        progress: &mut dyn FnMut(&Progress),
        meter: &mut RateMeter,
    ) -> Result<Option<Retry>, DownloadError> {
        let mut have = self.have()?;
        if self.total.is_some_and(|t| have > t) {
            self.truncate(0)?;
            have = 0;
        }
        if self.total == Some(have) && have > 0 {
            return Ok(None);
        }
        let stream = stream::Stream::get(&self.agent, self.url, (have > 0).then_some(have));
        let options = self.options;
        let cancel = &options.cancel;
        // ureq's own timeouts end a request with no answer; this is the backstop.
        let answer_by = Instant::now() + self.options.connect_timeout + self.options.stall_timeout + stream::POLL;
        let head = match stream.next_before(answer_by, cancel) {
            Err(stream::Cancelled) => return Err(self.cancelled()?),
            Ok(Some(stream::Event::Head(head))) => head,
            Ok(Some(stream::Event::Failed(reason))) => return Ok(Retry::after(reason)),
            Ok(_) => return Ok(Retry::after("the server did not answer in time".into())),
        };
        match head.status {
            206 => {
                let range = head.content_range.as_deref().and_then(parse_content_range);
                match range {
                    Some((start, total)) if start <= have => {
                        if start < have {
                            tracing::warn!(
                                have,
                                start,
                                "the server answered from an earlier byte; taking it from there"
                            );
                            self.truncate(start)?;
                            have = start;
                        }
                        self.total = self.total.or(total);
                    }
                    _ => {
                        return Ok(Retry::after(format!(
                            "the server answered a request for bytes from {have} with {}",
                            head.content_range.as_deref().unwrap_or("no Content-Range")
                        )))
                    }
                }
            }
            200 => {
                if have > 0 {
                    tracing::warn!(have, "the server ignored Range; downloading from the start");
                    self.truncate(0)?;
                    have = 0;
                }
                self.total = self.total.or(head.content_length);
            }
            416 if have > 0 => {
                // Asked past the end: what we have is the whole file (or garbage the check will catch).
                return Ok(None);
            }
            429 | 500..=599 => {
                let wait = head.retry_after.and_then(|s| s.trim().parse::<u64>().ok()).map(Duration::from_secs);
                let reason = if head.status == 429 {
                    "rate limited (HTTP 429)".to_string()
                } else {
                    format!("server error (HTTP {})", head.status)
                };
                return Ok(Some(Retry { reason, wait }));
            }
            status => return Err(refused(self.url, status)),
        }
        // The answer's own length, whatever the catalog or the first answer said.
        if let Some(length) = head.content_length {
            self.check_room_for(length)?;
        }
        self.receive(&stream, have, progress, meter)
    }

    /// Appends the body of `stream` to the `.part`, which holds `have` bytes, until it
    /// ends, breaks off, stalls or falls under the minimum rate.
    fn receive(
        &mut self,
        stream: &stream::Stream,
        mut have: u64,
        progress: &mut dyn FnMut(&Progress),
        meter: &mut RateMeter,
    ) -> Result<Option<Retry>, DownloadError> {
        let options = self.options;
        let mut last_byte = Instant::now();
        let mut window = (Instant::now(), 0u64);
        let mut last_report = Instant::now() - PROGRESS_EVERY;
        loop {
            match stream.next(stream::POLL, &options.cancel) {
                stream::Next::Cancelled => return Err(self.cancelled()?),
                stream::Next::Nothing => {}
                stream::Next::Event(stream::Event::Data(bytes)) => {
                    self.write(&bytes, have)?;
                    have += bytes.len() as u64;
                    meter.add(bytes.len() as u64);
                    last_byte = Instant::now();
                    window.1 += bytes.len() as u64;
                    if last_report.elapsed() >= PROGRESS_EVERY {
                        last_report = Instant::now();
                        progress(&meter.progress(have, self.total));
                    }
                }
                stream::Next::Event(stream::Event::End) => break,
                stream::Next::Event(stream::Event::Failed(e)) => {
                    return Ok(Retry::after(format!("connection lost after {have} bytes: {e}")));
                }
                stream::Next::Event(stream::Event::Head(_)) => {}
            }
            if last_byte.elapsed() >= options.stall_timeout {
                let secs = options.stall_timeout.as_secs_f64();
                return Ok(Retry::after(format!("no data for {secs:.0} s after {have} bytes")));
            }
            let span = window.0.elapsed();
            if span >= options.rate_window {
                if (window.1 as f64) < options.min_bytes_per_sec as f64 * span.as_secs_f64() {
                    return Ok(Retry::after(format!(
                        "too slow: {} bytes in {:.0} s, under the minimum of {} bytes/s (at {have} bytes)",
                        window.1,
                        span.as_secs_f64(),
                        options.min_bytes_per_sec
                    )));
                }
                window = (Instant::now(), 0);
            }
        }
        progress(&meter.progress(have, self.total));
        match self.total {
            Some(total) if have < total => Ok(Retry::after(format!("connection closed at {have} of {total} bytes"))),
            _ => Ok(None),
        }
    }
}

/// `bytes START-END/TOTAL` → (START, TOTAL when not `*`).
fn parse_content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let rest = value.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let start = range.split_once('-')?.0.trim().parse().ok()?;
    Some((start, total.trim().parse().ok()))
}

fn refused(url: &str, status: u16) -> DownloadError {
    let message = match status {
        401 | 403 => format!(
            "access denied (HTTP {status}): the file is private or gated. Accept its license on the model's \
             page and download it there, or use another file"
        ),
        404 => "not found (HTTP 404): the file is not at that address; check the URL".to_string(),
        _ => format!("the server refused the download (HTTP {status})"),
    };
    DownloadError::Refused { url: url.to_string(), status, message }
}

/// Checks the finished `.part` against what is expected, then reads it as a GGUF.
fn verify(url: &str, part: &Path, bytes: Option<u64>, sha256: Option<&str>) -> Result<(), DownloadError> {
    let _span = tracing::info_span!("verify").entered();
    let actual_bytes = std::fs::metadata(part).map_err(io_err("cannot read", part))?.len();
    if let Some(expected) = bytes.filter(|b| *b != actual_bytes) {
        return Err(DownloadError::SizeMismatch { path: part.to_path_buf(), expected, actual: actual_bytes });
    }
    if let Some(expected) = sha256 {
        let actual = sha256_file(part).map_err(io_err("cannot read", part))?;
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(DownloadError::ChecksumMismatch {
                path: part.to_path_buf(),
                expected: expected.to_string(),
                actual,
            });
        }
    }
    let file = File::open(part).map_err(io_err("cannot read", part))?;
    crate::gguf::read(&mut io::BufReader::new(file))
        .map(|_| ())
        .map_err(|e| DownloadError::NotGguf { url: url.to_string(), message: e.to_string() })
}

/// Bytes per second over the last few seconds.
struct RateMeter {
    window: std::collections::VecDeque<(Instant, u64)>,
}

impl RateMeter {
    const WINDOW: Duration = Duration::from_secs(3);

    fn new() -> RateMeter {
        RateMeter { window: std::collections::VecDeque::new() }
    }

    fn add(&mut self, n: u64) {
        let now = Instant::now();
        self.window.push_back((now, n));
        while self.window.front().is_some_and(|(t, _)| now.duration_since(*t) > Self::WINDOW) {
            self.window.pop_front();
        }
    }

    fn progress(&self, bytes: u64, total: Option<u64>) -> Progress {
        let rate = match (self.window.front(), self.window.back()) {
            (Some((first, _)), Some((last, _))) if last > first => {
                let sum: u64 = self.window.iter().skip(1).map(|(_, n)| n).sum();
                sum as f64 / last.duration_since(*first).as_secs_f64()
            }
            _ => 0.0,
        };
        let eta = match total {
            // A hostile total (up to u64::MAX) at a crawl must not overflow a Duration.
            Some(t) if rate > 0.0 => Duration::try_from_secs_f64(t.saturating_sub(bytes) as f64 / rate).ok(),
            _ => None,
        };
        Progress { bytes, total, bytes_per_sec: rate, eta, verifying: false }
    }
}

#[cfg(unix)]
fn lock_exclusive(file: &File, dest: &Path) -> Result<(), DownloadError> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a file descriptor we own; the lock goes with the file.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(DownloadError::Busy(dest.to_path_buf()));
    }
    Ok(())
}

#[cfg(not(unix))]
fn lock_exclusive(_file: &File, _dest: &Path) -> Result<(), DownloadError> {
    Ok(())
}

/// Bytes the current user may still write in `dir`'s file system.
#[cfg(unix)]
pub fn free_disk_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a zeroed struct for the kernel to fill.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

#[cfg(not(unix))]
pub fn free_disk_bytes(_dir: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_endpoint_replaces_only_the_hugging_face_prefix() {
        let url = "https://huggingface.co/org/repo/resolve/main/m.gguf";
        assert_eq!(
            with_hf_endpoint(url, Some("http://mirror:8080/")),
            "http://mirror:8080/org/repo/resolve/main/m.gguf"
        );
        assert_eq!(with_hf_endpoint(url, None), url);
        assert_eq!(file_name_of_url("https://h/r/resolve/main/M.Q4.gguf?download=1").unwrap(), "M.Q4.gguf");
        assert!(file_name_of_url("https://h/r/model.bin").is_err());
        assert!(file_name_of_url("https://h/.gguf").is_err());
        assert!(file_name_of_url("file:///etc/m.gguf").is_err());
        assert_eq!(with_hf_endpoint(url, Some("")), url);
        let other = "https://huggingface.com.evil/x.gguf";
        assert_eq!(with_hf_endpoint(other, Some("http://mirror")), other);
        assert_eq!(with_hf_endpoint("https://huggingface.cox/x", Some("http://m")), "https://huggingface.cox/x");
    }

    #[test]
    fn content_range_is_parsed() {
        assert_eq!(parse_content_range("bytes 100-199/1000"), Some((100, Some(1000))));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(parse_content_range("items 1-2/3"), None);
        assert_eq!(parse_content_range("bytes x-2/3"), None);
    }

    #[test]
    fn progress_means_past_the_furthest_byte_at_the_minimum_rate() {
        let second = Duration::from_secs(1);
        assert!(!made_progress(0, second, 0), "nothing past the furthest byte is no progress");
        assert!(made_progress(1, second, 0));
        assert!(made_progress(50_000_000, Duration::from_secs(40), 4096), "fast, then a stall");
        assert!(!made_progress(3, Duration::from_secs(60), 4096), "a byte every 20 s");
        assert!(!made_progress(1, Duration::from_millis(5), 4096), "a byte per connection");
        assert!(made_progress(4096, Duration::from_millis(5), 4096));
    }

    #[test]
    fn part_file_sits_beside_the_target() {
        assert_eq!(part_path(Path::new("/m/a.gguf")), PathBuf::from("/m/a.gguf.part"));
    }

    #[test]
    fn progress_fraction_needs_a_total() {
        let p = Progress { bytes: 50, total: Some(200), bytes_per_sec: 0.0, eta: None, verifying: false };
        assert_eq!(p.fraction(), Some(0.25));
        assert_eq!(Progress { total: None, ..p }.fraction(), None);
        assert_eq!(Progress { total: Some(0), ..p }.fraction(), None);
    }

    #[test]
    fn an_io_error_names_its_cause_once() {
        let e = io_err("cannot write", Path::new("/m/a.gguf.part"))(io::Error::from_raw_os_error(28));
        assert!(std::error::Error::source(&e).is_none());
        let text = format!("{:#}", anyhow::Error::from(e));
        assert_eq!(text.matches("os error 28").count(), 1, "{text}");
        assert!(text.contains("/m/a.gguf.part"), "{text}");
    }

    #[test]
    fn errors_name_the_status_for_people() {
        let e = refused("http://x/m.gguf", 404).to_string();
        assert!(e.contains("not found") && e.contains("404"), "{e}");
        let e = refused("http://x/m.gguf", 403).to_string();
        assert!(e.contains("gated"), "{e}");
    }
}
