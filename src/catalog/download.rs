//! Downloading a model file over HTTP(S) with `ureq`: progress, cancel, resume and
//! integrity.
//!
//! - The bytes go to `<file>.part` beside the target. A dropped connection, a cancel or
//!   an app restart keeps it, and the next attempt asks for the rest with `Range`. A
//!   server that ignores `Range` (answers 200) is read from the start again.
//! - Before anything is kept under the final name, the size and sha256 are checked
//!   (from the catalog, else from Hugging Face's `X-Linked-Size` / `X-Linked-Etag`, the
//!   LFS object's sha256) and the file is read as a GGUF. A mismatch deletes the
//!   `.part` and says so.
//! - Free disk space is checked before the first byte. 401/403/404 fail at once with a
//!   sentence for people; 429, 5xx, timeouts and cut connections are retried with
//!   exponential backoff (a retry that made progress starts the count again).
//! - `HF_ENDPOINT` replaces the `https://huggingface.co` prefix, as `huggingface_hub`
//!   does, for mirrors.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::sha256_file;

/// Environment variable naming a Hugging Face mirror (`huggingface_hub`'s name for it).
pub const HF_ENDPOINT_ENV: &str = "HF_ENDPOINT";
const HF_PREFIX: &str = "https://huggingface.co";

/// Space left free on the disk after a download, so that the phone keeps working.
const DISK_MARGIN_BYTES: u64 = 64 * 1024 * 1024;
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
    /// Failed attempts in a row before giving up (an attempt that received bytes resets it).
    pub attempts: u32,
    /// Wait before the first retry; doubled each time, capped at 30 s.
    pub backoff: Duration,
    pub connect_timeout: Duration,
    /// A read that waits longer than this counts as a dropped connection.
    pub read_timeout: Duration,
    /// Set to stop: the download ends with [`DownloadError::Cancelled`] and keeps its `.part`.
    pub cancel: Arc<AtomicBool>,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        DownloadOptions {
            attempts: 5,
            backoff: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(30),
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
    #[error("{url}: gave up after {attempts} attempts: {last}")]
    GaveUp { url: String, attempts: u32, last: String },
    #[error("download cancelled after {bytes} bytes; run it again to resume from there")]
    Cancelled { bytes: u64 },
    #[error(
        "not enough disk space in {dir}: the download needs {needed} MB more and {available} MB are free \
         (64 MB are kept free)"
    )]
    DiskFull { dir: PathBuf, needed: u64, available: u64 },
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
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> DownloadError {
    let path = path.to_path_buf();
    move |source| DownloadError::Io { action, path, source }
}

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
/// `dest` with the expected sha256 (or, with none known, any file) is returned as is.
pub fn download(
    request: &DownloadRequest,
    options: &DownloadOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<PathBuf, DownloadError> {
    let _span = tracing::info_span!("download", url = %request.url, dest = %request.dest.display()).entered();
    let url = with_hf_endpoint(&request.url, std::env::var(HF_ENDPOINT_ENV).ok().as_deref());
    if request.dest.is_file() && already_there(request)? {
        return Ok(request.dest.clone());
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

    let agent = agent(options);
    let linked = linked_metadata(&agent, &url);
    let expected_bytes = request.bytes.or(linked.bytes);
    let expected_sha = request.sha256.clone().or(linked.sha256);
    let mut fetcher =
        Fetcher { agent, url: &url, options, part: &mut part, part_path: &part_path, total: expected_bytes };
    let fetched = fetcher.check_disk_space(dir).and_then(|()| fetcher.fetch(progress));
    drop(fetcher);
    if let Err(e) = fetched {
        // An empty .part resumes nothing: leave no trace of a download that never started.
        if part.metadata().is_ok_and(|m| m.len() == 0) {
            let _ = std::fs::remove_file(&part_path);
        }
        return Err(e);
    }

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

/// True when `dest` is already the requested file (with no sha256 known, any file is).
fn already_there(request: &DownloadRequest) -> Result<bool, DownloadError> {
    let Some(expected) = request.sha256.as_deref() else {
        return Ok(true);
    };
    let actual = sha256_file(&request.dest).map_err(io_err("cannot read", &request.dest))?;
    if actual == expected {
        return Ok(true);
    }
    tracing::warn!(path = %request.dest.display(), %actual, "file has the wrong sha256; downloading it again");
    Ok(false)
}

fn agent(options: &DownloadOptions) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(options.connect_timeout))
        .timeout_recv_response(Some(options.read_timeout))
        .timeout_per_read(Some(options.read_timeout))
        .user_agent(concat!("pocketchat/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent()
}

/// Size and sha256 that Hugging Face puts on the redirect of a `resolve` URL.
#[derive(Debug, Default)]
struct Linked {
    bytes: Option<u64>,
    sha256: Option<String>,
}

/// Reads `X-Linked-Size` and `X-Linked-Etag` from a HEAD of `url` without following its
/// redirect. Anything else (no such headers, HEAD refused, no connection) gives nothing:
/// the GET that follows reports real errors.
fn linked_metadata(agent: &ureq::Agent, url: &str) -> Linked {
    let head = agent.head(url).config().max_redirects(0).build().call();
    let Ok(response) = head else {
        return Linked::default();
    };
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let bytes = header("x-linked-size").and_then(|s| s.trim().parse().ok());
    let sha256 =
        header("x-linked-etag").map(|s| s.trim().trim_start_matches("W/").trim_matches('"').to_ascii_lowercase());
    let sha256 = sha256.filter(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()));
    if bytes.is_some() || sha256.is_some() {
        tracing::debug!(?bytes, ?sha256, "linked metadata");
    }
    Linked { bytes, sha256 }
}

/// One download's connection attempts, appending to the `.part` file.
struct Fetcher<'a> {
    agent: ureq::Agent,
    url: &'a str,
    options: &'a DownloadOptions,
    part: &'a mut File,
    part_path: &'a Path,
    total: Option<u64>,
}

/// An attempt that did not finish the file but is worth another try.
struct Retry {
    /// For the log and the final error.
    reason: String,
    /// The server's `Retry-After`, else the backoff applies.
    wait: Option<Duration>,
    /// Bytes arrived: the failure count starts again.
    progressed: bool,
}

impl Fetcher<'_> {
    fn have(&self) -> Result<u64, DownloadError> {
        Ok(self.part.metadata().map_err(io_err("cannot read", self.part_path))?.len())
    }

    fn restart(&mut self) -> Result<(), DownloadError> {
        self.part.set_len(0).map_err(io_err("cannot truncate", self.part_path))?;
        self.part.seek(io::SeekFrom::End(0)).map_err(io_err("cannot seek", self.part_path))?;
        Ok(())
    }

    fn check_disk_space(&self, dir: &Path) -> Result<(), DownloadError> {
        let (Some(total), Some(available)) = (self.total, free_disk_bytes(dir)) else {
            return Ok(());
        };
        let needed = total.saturating_sub(self.have()?);
        if needed.saturating_add(DISK_MARGIN_BYTES) > available {
            return Err(DownloadError::DiskFull {
                dir: dir.to_path_buf(),
                needed: needed.div_ceil(1_000_000),
                available: available / 1_000_000,
            });
        }
        Ok(())
    }

    fn fetch(&mut self, progress: &mut dyn FnMut(&Progress)) -> Result<(), DownloadError> {
        let mut failures = 0u32;
        let mut backoff = self.options.backoff;
        let mut meter = RateMeter::new();
        loop {
            if self.options.cancel.load(Ordering::Relaxed) {
                return Err(DownloadError::Cancelled { bytes: self.have()? });
            }
            match self.attempt(progress, &mut meter)? {
                None => return Ok(()),
                Some(Retry { reason, wait, progressed }) => {
                    if progressed {
                        failures = 0;
                        backoff = self.options.backoff;
                    }
                    failures += 1;
                    if failures >= self.options.attempts {
                        return Err(DownloadError::GaveUp {
                            url: self.url.to_string(),
                            attempts: failures,
                            last: reason,
                        });
                    }
                    let wait = wait.unwrap_or(backoff).min(Duration::from_secs(30));
                    tracing::warn!(%reason, wait_ms = wait.as_millis() as u64, "download interrupted; retrying");
                    self.sleep_unless_cancelled(wait);
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
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
            self.restart()?;
            have = 0;
        }
        if self.total == Some(have) && have > 0 {
            return Ok(None);
        }
        let mut request = self.agent.get(self.url);
        if have > 0 {
            request = request.header("Range", format!("bytes={have}-"));
        }
        let mut response = match request.call() {
            Ok(r) => r,
            Err(e) => return Ok(Some(Retry { reason: describe(&e), wait: None, progressed: false })),
        };
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        match status {
            206 => {
                let range = header("content-range").and_then(|r| parse_content_range(&r));
                match range {
                    Some((start, total)) if start == have => {
                        self.total = self.total.or(total);
                    }
                    _ => {
                        tracing::warn!(have, ?range, "the server answered another range; starting over");
                        self.restart()?;
                        return Ok(Some(Retry {
                            reason: "unexpected range".into(),
                            wait: Some(Duration::ZERO),
                            progressed: true,
                        }));
                    }
                }
            }
            200 => {
                if have > 0 {
                    tracing::warn!(have, "the server ignored Range; downloading from the start");
                    self.restart()?;
                    have = 0;
                }
                let length = header("content-length").and_then(|l| l.trim().parse::<u64>().ok());
                self.total = self.total.or(length);
            }
            416 if have > 0 => {
                // Asked past the end: what we have is the whole file (or garbage the check will catch).
                return Ok(None);
            }
            429 | 500..=599 => {
                let wait = header("retry-after").and_then(|s| s.trim().parse::<u64>().ok()).map(Duration::from_secs);
                let reason = if status == 429 {
                    "rate limited (HTTP 429)".to_string()
                } else {
                    format!("server error (HTTP {status})")
                };
                return Ok(Some(Retry { reason, wait, progressed: false }));
            }
            _ => return Err(refused(self.url, status)),
        }

        let start = have;
        let mut reader = response.body_mut().as_reader();
        let mut buf = vec![0u8; 256 * 1024];
        let mut last_report = Instant::now() - PROGRESS_EVERY;
        loop {
            if self.options.cancel.load(Ordering::Relaxed) {
                self.part.flush().map_err(io_err("cannot write", self.part_path))?;
                return Err(DownloadError::Cancelled { bytes: have });
            }
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    let reason = format!("connection lost after {have} bytes: {e}");
                    return Ok(Some(Retry { reason, wait: None, progressed: have > start }));
                }
            };
            self.part.write_all(&buf[..n]).map_err(io_err("cannot write", self.part_path))?;
            have += n as u64;
            meter.add(n as u64);
            if last_report.elapsed() >= PROGRESS_EVERY {
                last_report = Instant::now();
                progress(&meter.progress(have, self.total));
            }
        }
        progress(&meter.progress(have, self.total));
        match self.total {
            Some(total) if have < total => {
                let reason = format!("connection closed at {have} of {total} bytes");
                Ok(Some(Retry { reason, wait: None, progressed: have > start }))
            }
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

fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(_) => "the server did not answer in time".to_string(),
        ureq::Error::HostNotFound => "host not found (offline?)".to_string(),
        ureq::Error::ConnectionFailed => "could not connect".to_string(),
        other => other.to_string(),
    }
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
    crate::engine::gguf_check::read(&mut io::BufReader::new(file))
        .map(|_| ())
        .map_err(|message| DownloadError::NotGguf { url: url.to_string(), message })
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
            Some(t) if rate > 0.0 => Some(Duration::from_secs_f64(t.saturating_sub(bytes) as f64 / rate)),
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
    fn errors_name_the_status_for_people() {
        let e = refused("http://x/m.gguf", 404).to_string();
        assert!(e.contains("not found") && e.contains("404"), "{e}");
        let e = refused("http://x/m.gguf", 403).to_string();
        assert!(e.contains("gated"), "{e}");
    }
}
