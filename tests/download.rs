//! Model downloads against a real local HTTP server (tests/common/http_server.rs) that
//! serves the real default model, with the faults of real networks injected: a
//! connection cut at half the file, a restart of the app mid-download, a wrong sha256,
//! 404 and 403, a server that ignores `Range`, rate limiting, a slow server cancelled;
//! and the hostile ones that must not keep a download going for ever: a false
//! `Content-Length`, a `Range` answered from byte 0, a link gone silent, a server
//! dripping bytes, a disk that fills up, a file of the same name already there.
//!
//! The free-space tests read the disk's free space, so they run while no other test of
//! this file writes ([`disk_alone`] / [`disk_shared`]).

mod common;
#[path = "common/http_server.rs"]
mod http_server;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use http_server::{Content, Faults, TestServer};
use pocketchat::catalog::download::part_path;
use pocketchat::catalog::{download, sha256_file, DownloadError, DownloadOptions, DownloadRequest, Progress};

const NAME: &str = "model.gguf";

/// The default model's bytes and sha256, read once.
fn model() -> &'static (Arc<Vec<u8>>, String) {
    static MODEL: OnceLock<(Arc<Vec<u8>>, String)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = common::default_model();
        (Arc::new(std::fs::read(&path).unwrap()), sha256_file(&path).unwrap())
    })
}

fn server() -> TestServer {
    let (bytes, sha) = model();
    TestServer::start(Content { name: NAME.into(), bytes: bytes.clone(), linked_sha256: sha.clone() })
}

/// Held (shared) by every test that writes a file; held alone by the free-space tests.
static DISK: RwLock<()> = RwLock::new(());

fn disk_shared() -> RwLockReadGuard<'static, ()> {
    DISK.read().unwrap_or_else(|e| e.into_inner())
}

fn disk_alone() -> RwLockWriteGuard<'static, ()> {
    DISK.write().unwrap_or_else(|e| e.into_inner())
}

fn server_with(set: impl FnOnce(&mut Faults)) -> TestServer {
    let server = server();
    set(&mut server.faults.lock().unwrap());
    server
}

fn quick() -> DownloadOptions {
    DownloadOptions { backoff: Duration::from_millis(10), ..DownloadOptions::default() }
}

fn request(url: String, dir: &Path, sha256: Option<&str>) -> DownloadRequest {
    DownloadRequest { url, dest: dir.join(NAME), bytes: None, sha256: sha256.map(str::to_string) }
}

fn run(
    request: &DownloadRequest,
    options: &DownloadOptions,
) -> (Result<std::path::PathBuf, DownloadError>, Vec<Progress>) {
    let mut seen = Vec::new();
    let result = download(request, options, &mut |p| seen.push(*p));
    (result, seen)
}

fn assert_is_the_model(path: &Path) {
    assert_eq!(sha256_file(path).unwrap(), model().1, "{} is not the served file", path.display());
    assert!(!part_path(path).exists(), "the .part file was left behind");
}

#[test]
fn a_connection_cut_at_half_the_file_resumes_with_range_and_verifies() {
    let _disk = disk_shared();
    let server = server();
    let half = model().0.len() as u64 / 2;
    server.faults.lock().unwrap().cut_at.push_back(half);
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), Some(&model().1));
    let (result, progress) = run(&req, &quick());
    assert_is_the_model(&result.unwrap());
    let gets = server.gets();
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!((gets[0].range_start, gets[1].range_start), (None, Some(half)), "the second GET resumes at the cut");
    let last = progress.iter().rfind(|p| !p.verifying).unwrap();
    assert_eq!((last.bytes, last.total), (model().0.len() as u64, Some(model().0.len() as u64)));
    assert!(progress.iter().any(|p| p.verifying), "verification is shown");
}

#[test]
fn a_download_cancelled_mid_file_resumes_after_a_restart() {
    let _disk = disk_shared();
    let server = server();
    server.faults.lock().unwrap().delay_per_chunk = Some(Duration::from_millis(1));
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), Some(&model().1));
    let options = quick();
    let cancel = options.cancel.clone();
    let total = model().0.len() as u64;
    let result = download(&req, &options, &mut |p| {
        if p.bytes > total / 3 {
            cancel.store(true, Ordering::Relaxed);
        }
    });
    let Err(DownloadError::Cancelled { bytes }) = result else { panic!("expected a cancel, got {result:?}") };
    let kept = std::fs::metadata(part_path(&req.dest)).unwrap().len();
    assert!(kept >= total / 3 && kept == bytes && kept < total, "kept {kept} of {total}");

    // "Restart": a new download of the same request, as the app does at its next launch.
    server.faults.lock().unwrap().delay_per_chunk = None;
    let (result, _) = run(&req, &quick());
    assert_is_the_model(&result.unwrap());
    assert_eq!(server.gets().last().unwrap().range_start, Some(kept));
}

#[test]
fn a_wrong_sha256_is_refused_and_nothing_is_kept() {
    let _disk = disk_shared();
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let wrong = "0".repeat(64);
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), Some(&wrong));
    let (result, _) = run(&req, &quick());
    let err = result.unwrap_err();
    assert!(matches!(err, DownloadError::ChecksumMismatch { .. }), "{err}");
    assert!(err.to_string().contains("was deleted"), "{err}");
    assert!(!req.dest.exists() && !part_path(&req.dest).exists());
}

#[test]
fn hugging_face_linked_size_and_sha256_check_the_file() {
    let _disk = disk_shared();
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    // No sha256 in the request: the resolve redirect's X-Linked-Etag is the check.
    let url = server.url(&format!("/org/repo/resolve/main/{NAME}"));
    let (result, _) = run(&request(url.clone(), dir.path(), None), &quick());
    assert_is_the_model(&result.unwrap());
    let heads = server.seen.lock().unwrap().iter().filter(|s| s.method == "HEAD").count();
    assert_eq!(heads, 1, "the metadata comes from one HEAD");

    let (bytes, _) = model();
    let lying = TestServer::start(Content { name: NAME.into(), bytes: bytes.clone(), linked_sha256: "ab".repeat(32) });
    let dir = tempfile::tempdir().unwrap();
    let url = lying.url(&format!("/org/repo/resolve/main/{NAME}"));
    let (result, _) = run(&request(url, dir.path(), None), &quick());
    assert!(matches!(result, Err(DownloadError::ChecksumMismatch { .. })), "{result:?}");
}

#[test]
fn not_found_and_gated_files_fail_at_once_with_a_clear_error() {
    let _disk = disk_shared();
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    for (path, status, words) in [("/files/nothing.gguf", 404, "not found"), ("/files/gated.gguf", 403, "gated")] {
        let before = server.gets().len();
        let (result, _) = run(&request(server.url(path), dir.path(), None), &quick());
        let err = result.unwrap_err();
        assert!(matches!(err, DownloadError::Refused { status: s, .. } if s == status), "{err}");
        assert!(err.to_string().contains(words), "{err}");
        assert_eq!(server.gets().len() - before, 1, "{status} is not retried");
    }
    assert!(!part_path(&dir.path().join(NAME)).exists(), "a refused download leaves no .part");
}

#[test]
fn a_server_that_ignores_range_is_read_again_from_the_start() {
    let _disk = disk_shared();
    let server = server();
    server.faults.lock().unwrap().ignore_range = true;
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), Some(&model().1));
    // Half a file from an earlier attempt.
    std::fs::write(part_path(&req.dest), &model().0[..model().0.len() / 2]).unwrap();
    let (result, _) = run(&req, &quick());
    assert_is_the_model(&result.unwrap());
    let gets = server.gets();
    assert_eq!(gets.len(), 1);
    assert!(gets[0].range_start.is_some(), "a range was asked for, and the 200 answer was taken from byte 0");
}

#[test]
fn rate_limits_and_server_errors_are_retried() {
    let _disk = disk_shared();
    let server = server();
    server.faults.lock().unwrap().statuses.extend([429, 503]);
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), Some(&model().1));
    let (result, _) = run(&req, &quick());
    assert_is_the_model(&result.unwrap());

    server.faults.lock().unwrap().statuses.extend([503; 10]);
    let dir = tempfile::tempdir().unwrap();
    let options = DownloadOptions { attempts: 3, ..quick() };
    let (result, _) = run(&request(server.url(&format!("/files/{NAME}")), dir.path(), None), &options);
    let err = result.unwrap_err();
    assert!(matches!(err, DownloadError::GaveUp { attempts: 3, .. }), "{err}");
    assert!(err.to_string().contains("503"), "{err}");
}

#[test]
fn a_slow_download_is_cancelled_promptly_and_keeps_its_part() {
    let _disk = disk_shared();
    let server = server();
    server.faults.lock().unwrap().delay_per_chunk = Some(Duration::from_millis(200));
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), None);
    let options = quick();
    let cancel: Arc<AtomicBool> = options.cancel.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        cancel.store(true, Ordering::Relaxed);
        Instant::now()
    });
    let (result, _) = run(&req, &options);
    let cancelled_at = canceller.join().unwrap();
    assert!(matches!(result, Err(DownloadError::Cancelled { .. })), "{result:?}");
    // One 64 KiB chunk takes 200 ms here; the cancel is seen within 50 ms all the same.
    assert!(cancelled_at.elapsed() < Duration::from_secs(5), "the cancel took {:?}", cancelled_at.elapsed());
    assert!(part_path(&req.dest).exists(), "a cancelled download keeps its .part to resume");
    assert!(!req.dest.exists());
}

#[test]
fn a_file_that_is_not_a_gguf_is_refused() {
    let _disk = disk_shared();
    let text = Arc::new(b"<html>Sign in to continue</html>".repeat(100));
    let server = TestServer::start(Content { name: NAME.into(), bytes: text, linked_sha256: String::new() });
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), None);
    let (result, _) = run(&req, &quick());
    assert!(matches!(result, Err(DownloadError::NotGguf { .. })), "{result:?}");
    assert!(!req.dest.exists() && !part_path(&req.dest).exists());
}

#[test]
fn the_cli_fetches_a_hugging_face_url_through_hf_endpoint() {
    let _disk = disk_shared();
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pocketchat"))
        .args(["fetch", &format!("https://huggingface.co/org/repo/resolve/main/{NAME}")])
        .env("HF_ENDPOINT", &server.base)
        .env("POCKETCHAT_MODELS_DIR", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(Path::new(&path), dir.path().join(NAME));
    assert_is_the_model(Path::new(&path));
    assert!(stderr.contains("100%") && stderr.contains("verifying"), "progress is shown: {stderr}");
}

#[test]
fn the_cli_lists_the_catalog_with_fit_as_json() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pocketchat"))
        .args(["models", "--tier", "6gb", "--json"])
        .env("POCKETCHAT_MODELS_DIR", tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert!(rows.len() >= 20, "{rows:?}");
    for r in rows {
        for key in ["id", "name", "params", "bits", "bytes", "fits", "budget"] {
            assert!(r.get(key).is_some(), "{key} missing in {r}");
        }
    }
    let default = rows.iter().find(|r| r["id"] == "smollm2-135m-instruct-q4_1").unwrap();
    assert_eq!(default["fits"], true);
    let big = rows.iter().find(|r| r["id"] == "gemma-3-4b-it-q8_0").unwrap();
    assert_eq!((big["fits"].as_bool(), big["budget"].as_u64()), (Some(false), Some(0)));
}

/// Short deadlines for the cases that must end: attempts, stall and rate window are
/// set here, in one place, so that each runs in a few seconds.
fn strict() -> DownloadOptions {
    DownloadOptions {
        attempts: 3,
        stall_timeout: Duration::from_secs(1),
        rate_window: Duration::from_secs(1),
        min_bytes_per_sec: 1024,
        ..quick()
    }
}

/// Runs `request` and asserts that it gave up (rather than looping) within a generous
/// minute, after at most `attempts` GETs; returns the error's text.
fn assert_gives_up(server: &TestServer, req: &DownloadRequest, options: &DownloadOptions, furthest: u64) -> String {
    let started = Instant::now();
    let (result, _) = run(req, options);
    let err = result.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
    let DownloadError::GaveUp { attempts, furthest: got, .. } = &err else { panic!("expected GaveUp, got {err:?}") };
    assert_eq!((*attempts, *got), (options.attempts, furthest), "{err}");
    let gets = server.gets().len() as u32;
    assert!(gets <= options.attempts, "{gets} GETs for {} attempts", options.attempts);
    assert!(!req.dest.exists());
    err.to_string()
}

#[test]
fn a_server_announcing_twice_the_length_and_ignoring_range_gives_up() {
    let _disk = disk_shared();
    let total = model().0.len() as u64;
    let server = server_with(|f| {
        f.announce_length = Some(2 * total);
        f.ignore_range = true;
    });
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), None);
    let err = assert_gives_up(&server, &req, &strict(), total);
    assert!(err.contains(&format!("no further than byte {total}")), "{err}");
}

#[test]
fn a_server_ignoring_range_and_cutting_at_half_gives_up() {
    let _disk = disk_shared();
    let half = model().0.len() as u64 / 2;
    let server = server_with(|f| {
        f.ignore_range = true;
        f.cut_always_at = Some(half);
    });
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), Some(&model().1));
    let err = assert_gives_up(&server, &req, &strict(), half);
    assert!(err.contains(&format!("no further than byte {half}")), "{err}");
}

#[test]
fn a_range_answered_with_206_from_byte_0_is_taken_from_there_and_cannot_loop() {
    let _disk = disk_shared();
    let half = model().0.len() as u64 / 2;
    // Once: the restart from byte 0 is read and the file completes.
    let server = server_with(|f| {
        f.range_from_zero = true;
        f.cut_at.push_back(half);
    });
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), Some(&model().1));
    let (result, _) = run(&req, &strict());
    assert_is_the_model(&result.unwrap());
    assert_eq!(server.gets().len(), 2);

    // Every time, cut at half: the attempts run out.
    let server = server_with(|f| {
        f.range_from_zero = true;
        f.cut_always_at = Some(half);
    });
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), Some(&model().1));
    assert_gives_up(&server, &req, &strict(), half);
}

#[test]
fn a_server_dripping_a_byte_at_a_time_is_dropped_under_the_minimum_rate() {
    let _disk = disk_shared();
    // A byte every 200 ms never trips the 1 s stall deadline; the minimum rate ends it.
    let server = server_with(|f| f.drip = Some(Duration::from_millis(200)));
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), None);
    let options = strict();
    let started = Instant::now();
    let err = run(&req, &options).0.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
    assert!(matches!(err, DownloadError::GaveUp { attempts: 3, .. }), "{err}");
    assert!(err.to_string().contains("too slow"), "{err}");
    assert_eq!(server.gets().len(), 3);
}

#[test]
fn a_connection_gone_silent_is_dropped_at_the_stall_deadline_and_resumed() {
    let _disk = disk_shared();
    let half = model().0.len() as u64 / 2;
    let server = server_with(|f| f.hang_at.push_back(half));
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), Some(&model().1));
    let options = DownloadOptions { min_bytes_per_sec: 0, ..strict() };
    let started = Instant::now();
    let (result, _) = run(&req, &options);
    assert_is_the_model(&result.unwrap());
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
    let gets = server.gets();
    assert_eq!((gets.len(), gets[1].range_start), (2, Some(half)), "{gets:?}");
}

/// Cancels `options` 300 ms from now and returns when it did.
fn cancel_soon(options: &DownloadOptions) -> std::thread::JoinHandle<Instant> {
    let cancel = options.cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        cancel.store(true, Ordering::Relaxed);
        Instant::now()
    })
}

#[test]
fn cancel_interrupts_a_read_that_waits_for_the_server() {
    let _disk = disk_shared();
    // Headers and 100 KB, then silence; the default 30 s deadlines are in force.
    let server = server_with(|f| f.hang_at.push_back(100_000));
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), None);
    let options = quick();
    let canceller = cancel_soon(&options);
    let (result, _) = run(&req, &options);
    let cancelled_at = canceller.join().unwrap();
    assert!(cancelled_at.elapsed() < Duration::from_secs(3), "the cancel took {:?}", cancelled_at.elapsed());
    assert!(matches!(result, Err(DownloadError::Cancelled { bytes: 100_000 })), "{result:?}");
    assert_eq!(std::fs::metadata(part_path(&req.dest)).unwrap().len(), 100_000, "the .part is kept to resume");
}

#[test]
fn cancel_interrupts_a_server_that_never_answers() {
    let _disk = disk_shared();
    // Accepts connections and says nothing.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/files/{NAME}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().take(4).collect();
        std::thread::sleep(Duration::from_secs(60));
        drop(held);
    });
    let dir = tempfile::tempdir().unwrap();
    let options = quick();
    let canceller = cancel_soon(&options);
    let (result, _) = run(&request(url, dir.path(), None), &options);
    let cancelled_at = canceller.join().unwrap();
    assert!(cancelled_at.elapsed() < Duration::from_secs(3), "the cancel took {:?}", cancelled_at.elapsed());
    assert!(matches!(result, Err(DownloadError::Cancelled { bytes: 0 })), "{result:?}");
    assert!(!part_path(&dir.path().join(NAME)).exists());
}

/// Free bytes in `dir`'s file system.
fn free_in(dir: &Path) -> u64 {
    pocketchat::catalog::download::free_disk_bytes(dir).expect("statvfs")
}

#[test]
fn the_answers_content_length_is_checked_against_free_space() {
    let _disk = disk_alone();
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    // No size in the request nor from a HEAD: only the GET's Content-Length tells it.
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), None);
    // As if the disk had 20 MB more than the margin: the 98 MB file does not fit.
    let options = DownloadOptions { keep_free: free_in(dir.path()) - 20_000_000, ..quick() };
    let err = run(&req, &options).0.unwrap_err();
    assert!(matches!(err, DownloadError::DiskFull { .. }), "{err}");
    assert!(err.to_string().contains("not enough disk space"), "{err}");
    assert_eq!(server.gets().len(), 1, "one GET, and no retry");
    assert!(!req.dest.exists() && !part_path(&req.dest).exists(), "nothing written");
}

#[test]
fn free_space_is_kept_while_writing_a_body_of_unknown_length() {
    let _disk = disk_alone();
    let server = server_with(|f| f.no_length = true);
    let dir = tempfile::tempdir().unwrap();
    let req = request(server.url(&format!("/files/{NAME}")), dir.path(), None);
    let room = 10_000_000;
    let options = DownloadOptions { keep_free: free_in(dir.path()) - room, ..quick() };
    let err = run(&req, &options).0.unwrap_err();
    assert!(matches!(err, DownloadError::NoRoomLeft { .. }), "{err}");
    assert!(err.to_string().contains("resume"), "{err}");
    let kept = std::fs::metadata(part_path(&req.dest)).unwrap().len();
    // Other processes write to this disk too: only "stopped near the limit" is certain.
    assert!(kept > 0 && kept < model().0.len() as u64 / 2, "kept {kept} bytes with {room} bytes of room");
    assert!(!req.dest.exists());
}

#[test]
fn a_file_already_there_is_taken_only_after_the_checks_of_a_download() {
    let _disk = disk_shared();
    let server = server();
    let (bytes, _) = model();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join(NAME);

    // Not a GGUF, no checksum known: downloaded again and replaced.
    std::fs::write(&dest, b"<html>Sign in</html>").unwrap();
    let (result, _) = run(&request(server.url(&format!("/files/{NAME}")), dir.path(), None), &quick());
    assert_is_the_model(&result.unwrap());
    assert_eq!(server.gets().len(), 1);

    // A GGUF cut short, with Hugging Face's size and sha256: replaced.
    std::fs::write(&dest, &bytes[..bytes.len() / 2]).unwrap();
    let resolve = server.url(&format!("/org/repo/resolve/main/{NAME}"));
    let (result, _) = run(&request(resolve.clone(), dir.path(), None), &quick());
    assert_is_the_model(&result.unwrap());
    let gets = server.gets().len();
    assert!(gets > 1, "downloaded again");

    // The right file: taken as it is, without a GET.
    let (result, _) = run(&request(resolve, dir.path(), None), &quick());
    assert_is_the_model(&result.unwrap());
    assert_eq!(server.gets().len(), gets, "no download of a file that passes the checks");
}

#[test]
fn the_cli_fetch_of_a_url_replaces_a_file_of_that_name_that_is_not_a_gguf() {
    let _disk = disk_shared();
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(NAME), b"not a model").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pocketchat"))
        .args(["fetch", &server.url(&format!("/files/{NAME}"))])
        .env("POCKETCHAT_MODELS_DIR", dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_is_the_model(&dir.path().join(NAME));
    assert_eq!(server.gets().len(), 1);
}
