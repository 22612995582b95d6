//! A small HTTP/1.1 file server on 127.0.0.1 for the download tests, with the faults a
//! real network and real hosts produce: a connection cut mid-file, a server that ignores
//! `Range` (or answers it from byte 0), error statuses, rate limiting, a slow link, a
//! link that goes silent, a server dripping bytes, a false or missing `Content-Length`,
//! and Hugging Face's `resolve` redirect with `X-Linked-Size` / `X-Linked-Etag`. It
//! answers one request per connection (`Connection: close`).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// The first byte asked for by a `Range: bytes=N-` header.
    pub range_start: Option<u64>,
}

/// What the server does; change it between requests through [`TestServer::faults`].
#[derive(Debug, Default)]
pub struct Faults {
    /// The next GETs of a file send their headers, then only this many body bytes, then close.
    pub cut_at: VecDeque<u64>,
    /// Answer 200 with the whole file even when a range is asked for.
    pub ignore_range: bool,
    /// Statuses answered to the next requests instead of the file (e.g. 429, 503).
    pub statuses: VecDeque<u16>,
    /// Pause after each 64 KiB of body.
    pub delay_per_chunk: Option<Duration>,
    /// Every GET of a file stops at this byte of the file and closes.
    pub cut_always_at: Option<u64>,
    /// The next GETs of a file send up to this byte of the file, then nothing for a
    /// minute with the connection open.
    pub hang_at: VecDeque<u64>,
    /// Send the body one byte per interval.
    pub drip: Option<Duration>,
    /// Answer a `Range` with `206` and the file from byte 0.
    pub range_from_zero: bool,
    /// `Content-Length` (and the total of `Content-Range`) announced instead of the real one.
    pub announce_length: Option<u64>,
    /// Send no `Content-Length`: the body ends when the connection closes.
    pub no_length: bool,
}

pub struct TestServer {
    pub base: String,
    pub faults: Arc<Mutex<Faults>>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

/// What the server serves: `/files/NAME` and `/org/repo/resolve/main/NAME` (a redirect
/// to `/files/NAME` with the linked size and `linked_sha256`, as Hugging Face sends).
pub struct Content {
    pub name: String,
    pub bytes: Arc<Vec<u8>>,
    pub linked_sha256: String,
}

impl TestServer {
    pub fn start(content: Content) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let faults = Arc::new(Mutex::new(Faults::default()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let content = Arc::new(content);
        let (f, s) = (faults.clone(), seen.clone());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (f, s, c) = (f.clone(), s.clone(), content.clone());
                thread::spawn(move || {
                    let _ = serve(stream, &c, &f, &s);
                });
            }
        });
        TestServer { base, faults, seen }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn gets(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().iter().filter(|s| s.method == "GET").cloned().collect()
    }
}

fn serve(stream: TcpStream, content: &Content, faults: &Mutex<Faults>, seen: &Mutex<Vec<Seen>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut range_start = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.trim().eq_ignore_ascii_case("range") {
                range_start = value.trim().strip_prefix("bytes=").and_then(|r| r.trim_end_matches('-').parse().ok());
            }
        }
    }
    seen.lock().unwrap().push(Seen { method: method.clone(), path: path.clone(), range_start });
    let mut out = stream;
    let respond = |out: &mut TcpStream, status: &str, headers: &str| {
        write!(out, "HTTP/1.1 {status}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n")
    };

    let status = faults.lock().unwrap().statuses.pop_front();
    if let Some(code) = status {
        let extra = if code == 429 { "Retry-After: 0\r\n" } else { "" };
        return respond(&mut out, &format!("{code} Fault"), extra);
    }
    let resolve_prefix = "/org/repo/resolve/main/";
    if let Some(name) = path.strip_prefix(resolve_prefix) {
        if name != content.name {
            return respond(&mut out, "404 Not Found", "");
        }
        let headers = format!(
            "Location: /files/{name}\r\nX-Linked-Size: {}\r\nX-Linked-Etag: \"{}\"\r\n",
            content.bytes.len(),
            content.linked_sha256
        );
        return respond(&mut out, "302 Found", &headers);
    }
    match path.strip_prefix("/files/") {
        Some(name) if name == content.name => {}
        Some("gated.gguf") => return respond(&mut out, "403 Forbidden", ""),
        _ => return respond(&mut out, "404 Not Found", ""),
    }

    let total = content.bytes.len() as u64;
    let (ignore_range, delay, cut, hang, drip, from_zero, announce, no_length) = {
        let mut f = faults.lock().unwrap();
        let get = method == "GET";
        let cut = if get { f.cut_at.pop_front().or(f.cut_always_at) } else { None };
        let hang = if get { f.hang_at.pop_front() } else { None };
        (f.ignore_range, f.delay_per_chunk, cut, hang, f.drip, f.range_from_zero, f.announce_length, f.no_length)
    };
    let start = match range_start {
        Some(_) if from_zero => 0,
        Some(s) if !ignore_range && s < total => s,
        Some(_) if !ignore_range => {
            return respond(&mut out, "416 Range Not Satisfiable", &format!("Content-Range: bytes */{total}\r\n"))
        }
        _ => 0,
    };
    let body = &content.bytes[start as usize..];
    let announced_total = announce.unwrap_or(total);
    if range_start.is_some() && (start > 0 || from_zero) {
        write!(
            out,
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{}/{announced_total}\r\n",
            announced_total - 1
        )?;
    } else {
        write!(out, "HTTP/1.1 200 OK\r\nAccept-Ranges: bytes\r\n")?;
    }
    if !no_length {
        write!(out, "Content-Length: {}\r\n", announced_total - start)?;
    }
    write!(out, "Connection: close\r\n\r\n")?;
    if method == "HEAD" {
        return Ok(());
    }
    let end_at = |c: u64| (c.saturating_sub(start) as usize).min(body.len());
    let limit = cut.map_or(body.len(), end_at).min(hang.map_or(body.len(), end_at));
    if let Some(interval) = drip {
        for byte in &body[..limit] {
            out.write_all(std::slice::from_ref(byte))?;
            out.flush()?;
            thread::sleep(interval);
        }
        return Ok(());
    }
    for chunk in body[..limit].chunks(64 * 1024) {
        out.write_all(chunk)?;
        if let Some(d) = delay {
            thread::sleep(d);
        }
    }
    out.flush()?;
    if hang.is_some() {
        // Silent, with the connection open: only the client's deadlines end the wait.
        thread::sleep(Duration::from_secs(60));
    }
    // Dropping the stream closes it: a cut body ends early.
    Ok(())
}
