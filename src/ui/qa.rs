//! The QA hook: when `POCKETCHAT_QA_STATUS` names a file, the app rewrites it as JSON
//! after every batch of engine events it shows (at most once a frame), so an end-to-end
//! test driving the real window can read back what the user saw (replies finished,
//! evictions, notices, errors, each reply's first token and streaming rate).
//!
//! Each finished reply is also timed in the page itself: when the frame that shows its
//! first token and the one that shows it finished were painted (`painted_*`). Those are
//! what the user saw, also when the web view falls behind the UI state.
//!
//! The file also carries the on-screen rectangles (CSS pixels, relative to the webview)
//! of the controls a test clicks, so the test does not depend on guessed coordinates.
//! The components only mark those controls (`data-qa: "name"`); one script in the page
//! reads every marked control's box whenever the page changes ([`QaHook::watch_controls`]).
//!
//! Built only with the `qa` cargo feature, which the tests enable; without it `QaHook` is
//! a type with no values (`qa_off.rs`) and the app ignores `POCKETCHAT_QA_STATUS`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use dioxus::prelude::spawn;
use serde::Serialize;

use super::meter::ReplyTiming;
use super::state::{ChatState, Phase, Role};

/// The environment variable naming the status file.
pub const QA_STATUS_ENV: &str = "POCKETCHAT_QA_STATUS";

/// A control's box in CSS pixels relative to the webview's top-left corner.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct QaRect {
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
}

#[derive(Serialize)]
struct QaFile<'a> {
    #[serde(flatten)]
    status: &'a QaStatus,
    /// Seconds since the Unix epoch when written.
    written_at: f64,
    rects: &'a BTreeMap<String, QaRect>,
    /// Every finished reply as the user saw it (first token after Send, tokens shown per
    /// second), oldest first.
    reply_timings: &'a [QaReply],
    /// The model screen: downloaded keys, downloads in flight (fraction) or failed.
    models: &'a serde_json::Value,
}

/// A finished reply's timing as the UI state saw it, and as the page painted it.
#[derive(Serialize)]
struct QaReply {
    #[serde(flatten)]
    timing: ReplyTiming,
    /// From Send to the painted frame that shows the first token.
    painted_first_token_ms: Option<f64>,
    /// Tokens per second from the painted first token to the painted finished reply.
    painted_tok_s: Option<f64>,
}

/// When the current prompt was sent and its first token painted (ms since the epoch).
#[derive(Default, Clone, Copy)]
struct PaintWatch {
    sent_ms: f64,
    first_ms: Option<f64>,
}

/// Waits until `READY` holds in the page (checked after each change of the DOM), then
/// answers when the next frame has been painted (the page's clock, ms since the epoch),
/// or null after two minutes. No animation frame is requested before that, so the probe
/// adds no frames of its own while the prefill runs.
///
/// The time is sent as a message and the script waits for Rust's answer before it ends:
/// dioxus drops an eval as soon as its script ends, and a result that arrives just before
/// that was lost when the UI thread was busy (`EvalError::Finished`).
const PAINTED_WHEN: &str = r#"
var at = await new Promise(function (done) {
  function painted() {
    requestAnimationFrame(function () {
      setTimeout(function () { done(performance.timeOrigin + performance.now()); }, 0);
    });
  }
  if (READY) { painted(); return; }
  var timer;
  var watch = new MutationObserver(function () {
    if (READY) { watch.disconnect(); clearTimeout(timer); painted(); }
  });
  watch.observe(document.body, { childList: true, subtree: true, characterData: true, attributes: true });
  timer = setTimeout(function () { watch.disconnect(); done(null); }, 120000);
});
dioxus.send(at);
await dioxus.recv();"#;
/// Sends the boxes of the controls marked `data-qa` (a JSON object, name to box) now and
/// whenever they may have moved: the page changed or the window was resized, at most
/// every 150 ms, and only when some box changed. Never ends: the hook keeps listening.
const CONTROL_BOXES: &str = r#"
var last = "";
function report() {
  var boxes = {};
  document.querySelectorAll("[data-qa]").forEach(function (e) {
    var r = e.getBoundingClientRect();
    boxes[e.getAttribute("data-qa")] = { x: r.x, y: r.y, width: r.width, height: r.height };
  });
  var now = JSON.stringify(boxes);
  if (now !== last) { last = now; dioxus.send(now); }
}
var timer = null;
function soon() { if (timer === null) { timer = setTimeout(function () { timer = null; report(); }, 150); } }
new MutationObserver(soon).observe(document.body, { childList: true, subtree: true, attributes: true });
window.addEventListener("resize", soon);
report();
await new Promise(function () {});"#;
const FIRST_TOKEN_SHOWN: &str =
    "(function () { var md = document.querySelector('.msg-assistant.streaming .md'); return md && md.textContent.length > 0; })()";
const REPLY_FINISHED_SHOWN: &str = "!document.querySelector('.msg-assistant.streaming')";

#[derive(Default)]
struct Inner {
    status: Option<QaStatus>,
    rects: BTreeMap<String, QaRect>,
    replies: Vec<QaReply>,
    paint: PaintWatch,
    /// The model screen (`ui::models`), as it last reported.
    models: serde_json::Value,
}

/// Writes the status file. Cheap to clone (shared inside the UI thread).
#[derive(Clone)]
pub struct QaHook {
    path: PathBuf,
    inner: Rc<RefCell<Inner>>,
}

impl QaHook {
    /// The hook writing to `path` (`Option` for the build without the feature, whose
    /// `open` gives `None`).
    pub fn open(path: PathBuf) -> Option<QaHook> {
        Some(QaHook { path, inner: Rc::new(RefCell::new(Inner::default())) })
    }

    /// Records what the chat shows now and rewrites the file.
    pub fn report_state(&self, state: &ChatState) {
        self.report_status(state.qa_status());
    }

    fn report_status(&self, status: QaStatus) {
        self.inner.borrow_mut().status = Some(status);
        self.write();
    }

    /// Records the model screen's state (see `models::bridge`) and rewrites the file.
    pub fn report_models(&self, models: serde_json::Value) {
        self.inner.borrow_mut().models = models;
        self.write();
    }

    /// Starts the page's script that reports the marked controls' boxes
    /// ([`CONTROL_BOXES`]); each report rewrites the file. Call once, from a task.
    pub fn watch_controls(&self) {
        let hook = self.clone();
        spawn(async move {
            let mut eval = dioxus::document::eval(CONTROL_BOXES);
            while let Ok(json) = eval.recv::<String>().await {
                match serde_json::from_str::<BTreeMap<String, QaRect>>(&json) {
                    Ok(rects) => {
                        hook.inner.borrow_mut().rects = rects;
                        hook.write();
                    }
                    Err(e) => tracing::warn!("the page sent unreadable control boxes: {e}"),
                }
            }
        });
    }

    /// Records a finished reply's timing (written with the next status).
    pub fn report_reply(&self, timing: ReplyTiming) {
        self.inner.borrow_mut().replies.push(QaReply { timing, painted_first_token_ms: None, painted_tok_s: None });
    }

    /// A prompt was sent: measures when the page paints its reply's first token.
    pub fn watch_first_paint(&self) {
        self.inner.borrow_mut().paint = PaintWatch { sent_ms: epoch_ms(), first_ms: None };
        let hook = self.clone();
        spawn(async move {
            let first = painted_at(FIRST_TOKEN_SHOWN).await;
            hook.inner.borrow_mut().paint.first_ms = first;
        });
    }

    /// The reply just reported ended: measures when the page paints it finished, adds
    /// the painted figures to its timing and rewrites the file.
    pub fn watch_last_paint(&self) {
        let hook = self.clone();
        spawn(async move {
            let Some(last) = painted_at(REPLY_FINISHED_SHOWN).await else { return };
            {
                let mut inner = hook.inner.borrow_mut();
                let PaintWatch { sent_ms, first_ms } = inner.paint;
                let (Some(first), Some(reply)) = (first_ms, inner.replies.last_mut()) else { return };
                reply.painted_first_token_ms = Some(first - sent_ms);
                let tokens_after_first = reply.timing.tokens.saturating_sub(1) as f64;
                reply.painted_tok_s = (last > first).then(|| tokens_after_first / ((last - first) / 1e3));
            }
            hook.write();
        });
    }

    /// Records where a control is on screen and rewrites the file.
    #[cfg(test)]
    fn report_rect(&self, name: &str, rect: QaRect) {
        self.inner.borrow_mut().rects.insert(name.to_string(), rect);
        self.write();
    }

    fn write(&self) {
        let inner = self.inner.borrow();
        let empty = QaStatus {
            phase: "starting".into(),
            replies_done: 0,
            done_reasons: vec![],
            evictions: 0,
            trims: 0,
            restores: 0,
            notices: vec![],
            generating: false,
            last_error: None,
            messages: 0,
            prompts: vec![],
            last_reply: None,
            decode_tok_s: 0.0,
            ttft_ms: 0.0,
            prefill_tokens: 0,
            drafted_tokens: 0,
            compute_threads: 0,
            chats: vec![],
            active_chat: None,
            model_name: None,
            model_path: None,
        };
        let status = inner.status.as_ref().unwrap_or(&empty);
        let written_at = epoch_ms() / 1e3;
        let file =
            QaFile { status, written_at, rects: &inner.rects, reply_timings: &inner.replies, models: &inner.models };
        match serde_json::to_vec_pretty(&file) {
            Ok(bytes) => {
                if let Err(e) = write_atomically(&self.path, &bytes) {
                    tracing::warn!("could not write the QA status to {}: {e}", self.path.display());
                }
            }
            Err(e) => tracing::warn!("could not encode the QA status: {e}"),
        }
    }
}

/// Milliseconds since the Unix epoch (the page's `performance.timeOrigin` clock).
fn epoch_ms() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0)
}

/// See [`PAINTED_WHEN`]; `None` without a web view (or when it never got ready).
async fn painted_at(ready: &str) -> Option<f64> {
    let script = PAINTED_WHEN.replace("READY", ready);
    let mut eval = dioxus::document::eval(&script);
    match eval.recv::<Option<f64>>().await {
        Ok(at) => {
            // Lets the script end.
            let _ = eval.send(true);
            at
        }
        Err(e) => {
            tracing::warn!("the page did not time its frame: {e}");
            None
        }
    }
}

/// Writes to a sibling temporary file and renames it, so readers never see half a file.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// The QA status file's content.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QaStatus {
    pub phase: String,
    pub replies_done: usize,
    pub done_reasons: Vec<String>,
    pub evictions: usize,
    pub trims: usize,
    pub restores: usize,
    /// Texts of the notices in the transcript now.
    pub notices: Vec<String>,
    pub generating: bool,
    pub last_error: Option<String>,
    pub messages: usize,
    /// The user's messages as shown (the end-to-end test checks its typing arrived whole).
    pub prompts: Vec<String>,
    pub last_reply: Option<String>,
    /// The engine's figures for the last reply: decode rate and first-token time (from
    /// the engine receiving the prompt), and the compute threads it ran on.
    pub decode_tok_s: f64,
    pub ttft_ms: f64,
    /// The last prompt's tokens fed after Send, and those fed while it was typed.
    pub prefill_tokens: usize,
    pub drafted_tokens: usize,
    pub compute_threads: usize,
    /// The chat list (id and title, most recent first) and the open chat.
    pub chats: Vec<QaChat>,
    pub active_chat: Option<String>,
    /// The loaded model's name and file (the model screen switches them).
    pub model_name: Option<String>,
    pub model_path: Option<String>,
}

/// A chat in the QA status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QaChat {
    pub id: String,
    pub title: String,
    pub messages: usize,
}

impl ChatState {
    /// What the end-to-end test reads back (`POCKETCHAT_QA_STATUS`).
    pub fn qa_status(&self) -> QaStatus {
        QaStatus {
            phase: match &self.phase {
                Phase::Starting => "starting",
                Phase::Loading { .. } => "loading",
                Phase::Ready => "ready",
                Phase::Failed(_) => "failed",
            }
            .to_string(),
            replies_done: self.replies_done,
            done_reasons: self.done_reasons.iter().map(|r| format!("{r:?}")).collect(),
            evictions: self.evictions,
            trims: self.trims,
            restores: self.restores,
            notices: self.notices().map(|n| n.text.clone()).collect(),
            generating: self.generating(),
            last_error: self.last_error.clone(),
            messages: self.messages().count(),
            prompts: self.messages().filter(|m| m.role == Role::User).map(|m| m.text.clone()).collect(),
            last_reply: self.messages().rfind(|m| m.role == Role::Assistant).map(|m| m.text.clone()),
            decode_tok_s: self.stats.as_ref().map_or(0.0, |s| s.decode_tok_s),
            ttft_ms: self.stats.as_ref().map_or(0.0, |s| s.ttft_ms),
            prefill_tokens: self.stats.as_ref().map_or(0, |s| s.prefill_tokens),
            drafted_tokens: self.stats.as_ref().map_or(0, |s| s.drafted_tokens),
            compute_threads: self.stats.as_ref().map_or(0, |s| s.compute_threads),
            chats: self
                .chats
                .iter()
                .map(|c| QaChat { id: c.id.clone(), title: c.title.clone(), messages: c.messages })
                .collect(),
            active_chat: self.active_chat.clone(),
            model_name: self.model.as_ref().map(|m| m.name.clone()),
            model_path: self.model.as_ref().map(|m| m.path.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ui::state::ChatState;

    #[test]
    fn writes_status_and_rects_as_json() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qa.json");
        let hook = QaHook::open(path.clone()).unwrap();
        hook.report_status(ChatState::new().qa_status());
        hook.report_reply(ReplyTiming { tokens: 3, first_token_ms: 80.0, shown_tok_s: 110.0 });
        hook.report_rect("simulate_warning", QaRect { x: 10.0, y: 20.0, width: 100.0, height: 40.0 });
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["replies_done"], 0);
        assert_eq!(v["generating"], false);
        assert_eq!(v["rects"]["simulate_warning"]["width"], 100.0);
        assert_eq!(v["reply_timings"][0]["shown_tok_s"], 110.0);
        assert!(v["written_at"].as_f64().unwrap() > 0.0);
    }
}
