//! A small HTTP/1.1 file server on 127.0.0.1 for the download tests, with the faults a
//! real network and real hosts produce: a connection cut mid-file, a server that ignores
//! `Range`, error statuses, rate limiting, a slow link, and Hugging Face's `resolve`
//! redirect with `X-Linked-Size` / `X-Linked-Etag`. It answers one request per
//! connection (`Connection: close`).

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
    let (ignore_range, delay, cut) = {
        let mut f = faults.lock().unwrap();
        let cut = if method == "GET" { f.cut_at.pop_front() } else { None };
        (f.ignore_range, f.delay_per_chunk, cut)
    };
    let start = match range_start {
        Some(s) if !ignore_range && s < total => s,
        Some(_) if !ignore_range => {
            return respond(&mut out, "416 Range Not Satisfiable", &format!("Content-Range: bytes */{total}\r\n"))
        }
        _ => 0,
    };
    let body = &content.bytes[start as usize..];
    if start > 0 {
        write!(out, "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{}/{total}\r\n", total - 1)?;
    } else {
        write!(out, "HTTP/1.1 200 OK\r\nAccept-Ranges: bytes\r\n")?;
    }
    write!(out, "Content-Length: {}\r\nConnection: close\r\n\r\n", body.len())?;
    if method == "HEAD" {
        return Ok(());
    }
    let limit = cut.map_or(body.len(), |c| (c.saturating_sub(start) as usize).min(body.len()));
    for chunk in body[..limit].chunks(64 * 1024) {
        out.write_all(chunk)?;
        if let Some(d) = delay {
            thread::sleep(d);
        }
    }
    out.flush()?;
    // Dropping the stream closes it: a cut body ends early.
    Ok(())
}
