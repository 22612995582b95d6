//! One HTTP request on a thread of its own, its answer and body handed over a channel.
//!
//! A `read` on a socket cannot be interrupted, so the downloading thread never makes
//! one: it waits on the channel a few milliseconds at a time and can walk away at once
//! on a cancel, a stall or a rate under the minimum. The abandoned worker ends at its
//! next send (the channel is gone) or at ureq's per-read timeout.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How often the waiting thread looks at the cancel flag.
pub(super) const POLL: Duration = Duration::from_millis(50);
/// Body bytes read per message.
const CHUNK: usize = 256 * 1024;
/// Messages buffered between the worker and the writer (a few MB at most).
const QUEUE: usize = 8;

/// The status line and the headers the download needs.
#[derive(Debug)]
pub(super) struct Head {
    pub status: u16,
    pub content_length: Option<u64>,
    pub content_range: Option<String>,
    pub retry_after: Option<String>,
}

#[derive(Debug)]
pub(super) enum Event {
    Head(Head),
    Data(Vec<u8>),
    /// The body ended where the server ended it.
    End,
    /// No answer, or the body broke off: why, for people.
    Failed(String),
}

/// What [`Stream::next`] saw.
#[derive(Debug)]
pub(super) enum Next {
    Event(Event),
    /// Nothing within the wait: look at the clocks and wait again.
    Nothing,
    Cancelled,
}

/// A GET in flight.
pub(super) struct Stream {
    rx: Receiver<Event>,
}

impl Stream {
    /// Starts a GET of `url` (from byte `range_from` when given) on a worker thread. Only a
    /// 200 or 206 answer has its body read.
    pub(super) fn get(agent: &ureq::Agent, url: &str, range_from: Option<u64>) -> Stream {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let (agent, url) = (agent.clone(), url.to_string());
        let spawned = std::thread::Builder::new().name("download".into()).spawn(move || {
            let mut request = agent.get(&url);
            if let Some(start) = range_from {
                request = request.header("Range", format!("bytes={start}-"));
            }
            let response = match request.call() {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Event::Failed(describe(&e)));
                    return;
                }
            };
            let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
            let head = Head {
                status: response.status().as_u16(),
                content_length: header("content-length").and_then(|l| l.trim().parse().ok()),
                content_range: header("content-range"),
                retry_after: header("retry-after"),
            };
            let wants_body = matches!(head.status, 200 | 206);
            if tx.send(Event::Head(head)).is_err() || !wants_body {
                return;
            }
            let mut reader = response.into_body().into_reader();
            let mut buf = vec![0u8; CHUNK];
            loop {
                let event = match reader.read(&mut buf) {
                    Ok(0) => Event::End,
                    Ok(n) => Event::Data(buf[..n].to_vec()),
                    Err(e) => Event::Failed(e.to_string()),
                };
                let last = !matches!(event, Event::Data(_));
                if tx.send(event).is_err() || last {
                    return;
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a download thread");
        }
        Stream { rx }
    }

    /// The next event within `wait` (at most [`POLL`]), unless `cancel` is set first.
    pub(super) fn next(&self, wait: Duration, cancel: &AtomicBool) -> Next {
        if cancel.load(Ordering::Relaxed) {
            return Next::Cancelled;
        }
        match self.rx.recv_timeout(wait.min(POLL)) {
            Ok(event) => Next::Event(event),
            Err(RecvTimeoutError::Timeout) if cancel.load(Ordering::Relaxed) => Next::Cancelled,
            Err(RecvTimeoutError::Timeout) => Next::Nothing,
            Err(RecvTimeoutError::Disconnected) => Next::Event(Event::Failed("the download thread ended".into())),
        }
    }

    /// The next event within `deadline`: `Ok(None)` when it passed first.
    pub(super) fn next_before(&self, deadline: Instant, cancel: &AtomicBool) -> Result<Option<Event>, Cancelled> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left, cancel) {
                Next::Event(e) => return Ok(Some(e)),
                Next::Cancelled => return Err(Cancelled),
                Next::Nothing if left.is_zero() => return Ok(None),
                Next::Nothing => {}
            }
        }
    }
}

/// The cancel flag was set while waiting.
#[derive(Debug)]
pub(super) struct Cancelled;

/// Runs `f` on a thread of its own and waits for it unless `cancel` is set first
/// (`Err(Cancelled)`: the thread is left to end on its own timeouts). A thread that
/// panics or cannot start gives `T::default()`.
pub(super) fn cancellable<T: Default + Send + 'static>(
    cancel: &AtomicBool,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Cancelled> {
    let (tx, rx) = mpsc::sync_channel(1);
    if std::thread::Builder::new().name("download".into()).spawn(move || tx.send(f())).is_err() {
        return Ok(T::default());
    }
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(Cancelled);
        }
        match rx.recv_timeout(POLL) {
            Ok(value) => return Ok(value),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Ok(T::default()),
        }
    }
}

pub(super) fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(_) => "the server did not answer in time".to_string(),
        ureq::Error::HostNotFound => "host not found (offline?)".to_string(),
        ureq::Error::ConnectionFailed => "could not connect".to_string(),
        other => other.to_string(),
    }
}
