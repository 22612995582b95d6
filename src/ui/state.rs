//! The app's view of the world, as a pure reducer.
//!
//! Every [`EngineEvent`] the engine emits is folded into a [`ChatState`] by
//! [`ChatState::apply_at`] (or [`ChatState::apply`] when no timestamp is wanted). The
//! reducer does no IO and touches no signal: the bridge coroutine in `app.rs` owns the
//! one `Signal<ChatState>` and calls the reducer for each event, and the tests here
//! drive it with synthetic event sequences.
//!
//! The transcript is a list of [`Entry`]s: user and assistant [`Message`]s interleaved
//! with inline [`Notice`]s (context trimmed, memory evicted, engine notes, failed turns).
//! A reply that is still streaming is the *current* reply; notices that arrive before it
//! has any text are placed above it so the streaming bubble stays at the bottom.

use serde::Serialize;

use crate::engine::template::Role as TemplateRole;
use crate::engine::{DoneReason, EngineError, EngineEvent, ModelInfo, Stats};
use crate::memory::{Policy, TierReport};

use super::fmt::format_bytes;

/// The command that installs the default model; shown when no model is installed.
pub const FETCH_COMMAND: &str = "pocketchat fetch";

/// Text of the notice shown when a memory warning evicted part of the context.
pub const EVICTED_TEXT: &str = "Memory limit reached — earlier messages were forgotten";

/// Text of the notice shown when a memory warning stopped the reply but the context had
/// nothing older to drop (every eviction notice starts with [`EVICTED_PREFIX`]).
pub const EVICTED_NOTHING_TEXT: &str =
    "Memory limit reached — the reply was stopped; there was nothing older to forget";

/// How every eviction notice begins.
pub const EVICTED_PREFIX: &str = "Memory limit reached";

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
}

/// One chat bubble.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub id: u64,
    pub role: Role,
    pub text: String,
    /// When the message was sent or the reply started (`HH:MM:SS`, may be empty).
    pub time: String,
    /// Token pieces received so far (assistant only).
    pub tokens: usize,
    /// Decode speed reported by the engine for this reply.
    pub tok_s: Option<f64>,
    /// The reply has ended (always true for user messages).
    pub finished: bool,
    /// Why the reply ended.
    pub done: Option<DoneReason>,
    /// The turn failed with this message.
    pub error: Option<String>,
}

impl Message {
    /// A short label for replies that did not end normally ("Stopped", …).
    pub fn done_label(&self) -> Option<&'static str> {
        self.done.and_then(done_label)
    }
}

/// What an inline notice is about.
#[derive(Debug, Clone, PartialEq)]
pub enum NoticeKind {
    /// Old turns were dropped to fit the token budget.
    Trimmed { dropped_tokens: usize, kept_tokens: usize },
    /// A memory warning evicted (part of) the KV cache.
    Evicted { reason: String, before_tokens: usize, after_tokens: usize, freed_bytes: u64 },
    /// Something the engine wants the user to know.
    Info,
    /// A turn failed.
    Error,
}

/// A line in the transcript that is not a message.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    pub id: u64,
    pub kind: NoticeKind,
    /// The headline ("Memory limit reached — earlier messages were forgotten").
    pub text: String,
    /// Figures under the headline (tokens before → after, bytes freed, reason).
    pub detail: Option<String>,
    pub time: String,
    /// An eviction whose conversation was saved first: offer *Restore*.
    pub restorable: bool,
}

impl Notice {
    /// CSS modifier for the notice's look.
    pub fn class(&self) -> &'static str {
        match self.kind {
            NoticeKind::Trimmed { .. } => "notice-trimmed",
            NoticeKind::Evicted { .. } => "notice-evicted",
            NoticeKind::Info => "notice-info",
            NoticeKind::Error => "notice-error",
        }
    }
}

/// One transcript line.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Message(Message),
    Notice(Notice),
}

impl Entry {
    pub fn id(&self) -> u64 {
        match self {
            Entry::Message(m) => m.id,
            Entry::Notice(n) => n.id,
        }
    }
}

/// Why the model could not be used at all.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadFailure {
    /// Headline ("No model installed").
    pub title: String,
    /// The engine's own message.
    pub message: String,
    /// A command that fixes it, shown as code (e.g. `pocketchat fetch`).
    pub command: Option<String>,
    /// The model is simply not there (as opposed to a broken file).
    pub missing: bool,
}

/// Where the engine is in its life.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// Spawned, nothing heard yet.
    Starting,
    /// Loading weights; `progress` in 0.0..=1.0.
    Loading { progress: f32, message: String },
    /// Takes prompts.
    Ready,
    /// The model could not be loaded (or the engine is gone): nothing can be sent.
    Failed(LoadFailure),
}

/// What the settings panel's log shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogKind {
    Trim,
    Eviction,
    Restore,
}

/// The last time the engine saved the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveInfo {
    pub path: String,
    pub bytes: u64,
    pub ms: f64,
    pub time: String,
}

/// A trim or an eviction, with when it happened.
#[derive(Debug, Clone, PartialEq)]
pub struct LogEntry {
    pub time: String,
    pub kind: LogKind,
    pub text: String,
}

/// Everything the UI shows, folded from engine events.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatState {
    pub phase: Phase,
    pub entries: Vec<Entry>,
    pub model: Option<ModelInfo>,
    pub tier: Option<TierReport>,
    pub policy: Option<Policy>,
    /// The latest figures.
    pub stats: Option<Stats>,
    /// Trims and evictions, oldest first.
    pub log: Vec<LogEntry>,
    /// The last error the engine reported (for the QA status and the settings panel).
    pub last_error: Option<String>,
    /// A prompt was sent and its reply has not started yet.
    pub awaiting_reply: bool,
    pub replies_done: usize,
    pub trims: usize,
    pub evictions: usize,
    /// Why each reply ended, in order (QA).
    pub done_reasons: Vec<DoneReason>,
    /// The engine saves the conversation before evicting (a state file is configured),
    /// so eviction notices offer *Restore*. Set by the app at start.
    pub restore_available: bool,
    pub restores: usize,
    pub last_save: Option<SaveInfo>,
    /// Index of the reply that is streaming.
    current: Option<usize>,
    /// Index of the most recent finished reply (a `Stats` may follow its `Done`).
    last_reply: Option<usize>,
    /// Index of the user message submitted locally whose `ReplyStarted` is pending.
    pending_user: Option<usize>,
    next_id: u64,
}

impl Default for ChatState {
    fn default() -> Self {
        ChatState::new()
    }
}

impl ChatState {
    pub fn new() -> Self {
        ChatState {
            phase: Phase::Starting,
            entries: Vec::new(),
            model: None,
            tier: None,
            policy: None,
            stats: None,
            log: Vec::new(),
            last_error: None,
            awaiting_reply: false,
            replies_done: 0,
            trims: 0,
            evictions: 0,
            done_reasons: Vec::new(),
            restore_available: false,
            restores: 0,
            last_save: None,
            current: None,
            last_reply: None,
            pending_user: None,
            next_id: 1,
        }
    }

    /// A reply is being generated (or a prompt is waiting for one).
    pub fn generating(&self) -> bool {
        self.awaiting_reply || self.current.is_some()
    }

    pub fn is_ready(&self) -> bool {
        matches!(self.phase, Phase::Ready)
    }

    /// The composer may send now.
    pub fn can_send(&self) -> bool {
        self.is_ready() && !self.generating()
    }

    /// The reply being streamed, if any.
    pub fn current_reply(&self) -> Option<&Message> {
        match self.current.and_then(|i| self.entries.get(i)) {
            Some(Entry::Message(m)) => Some(m),
            _ => None,
        }
    }

    /// The transcript line with this id.
    pub fn entry(&self, id: u64) -> Option<&Entry> {
        // Ids grow along the transcript (notices may sit just above the newest reply).
        self.entries.iter().rev().find(|e| e.id() == id)
    }

    /// Tokens in the context, the reply being streamed included.
    pub fn live_context_tokens(&self) -> usize {
        let cached = self.stats.as_ref().map_or(0, |s| s.context_tokens);
        cached + self.current_reply().map_or(0, |m| m.tokens)
    }

    pub fn messages(&self) -> impl Iterator<Item = &Message> {
        self.entries.iter().filter_map(|e| match e {
            Entry::Message(m) => Some(m),
            Entry::Notice(_) => None,
        })
    }

    pub fn notices(&self) -> impl Iterator<Item = &Notice> {
        self.entries.iter().filter_map(|e| match e {
            Entry::Notice(n) => Some(n),
            Entry::Message(_) => None,
        })
    }

    /// The user pressed Send: shows the message at once. Returns `false` (and changes
    /// nothing) when the text is blank or a reply is still running. The caller then sends
    /// `Command::Send` to the engine.
    pub fn submit(&mut self, text: &str, now: &str) -> bool {
        if text.trim().is_empty() || self.generating() {
            return false;
        }
        let msg = self.new_message(Role::User, text.to_string(), now, true);
        self.entries.push(Entry::Message(msg));
        self.pending_user = Some(self.entries.len() - 1);
        self.awaiting_reply = true;
        true
    }

    /// Folds one event without a timestamp.
    pub fn apply(&mut self, event: EngineEvent) {
        self.apply_at(event, "");
    }

    /// Folds one event; `now` labels messages, notices and log lines (e.g. `14:02:31`).
    pub fn apply_at(&mut self, event: EngineEvent, now: &str) {
        match event {
            EngineEvent::Loading { progress, message } => {
                let progress = if progress.is_finite() { progress.clamp(0.0, 1.0) } else { 0.0 };
                self.phase = Phase::Loading { progress, message };
            }
            EngineEvent::Ready(info) => {
                self.model = Some(info);
                self.phase = Phase::Ready;
            }
            EngineEvent::Policy { report, policy } => {
                self.tier = Some(report);
                self.policy = Some(policy);
            }
            EngineEvent::ReplyStarted { prompt } => {
                self.awaiting_reply = false;
                // Restoring now would throw the new turn away: the offer ends here.
                self.clear_restorable();
                if self.pending_user.take().is_none() {
                    // Sent by someone else (CLI, tests): show the prompt too.
                    let msg = self.new_message(Role::User, prompt, now, true);
                    self.entries.push(Entry::Message(msg));
                }
                self.finish_current(None);
                let reply = self.new_message(Role::Assistant, String::new(), now, false);
                self.entries.push(Entry::Message(reply));
                self.current = Some(self.entries.len() - 1);
            }
            EngineEvent::Token { text } => {
                if self.current.is_none() {
                    let reply = self.new_message(Role::Assistant, String::new(), now, false);
                    self.entries.push(Entry::Message(reply));
                    self.current = Some(self.entries.len() - 1);
                    self.awaiting_reply = false;
                }
                if let Some(m) = self.current_mut() {
                    m.text.push_str(&text);
                    m.tokens += 1;
                }
            }
            EngineEvent::Stats(stats) => {
                if stats.generated_tokens > 0 && stats.decode_tok_s.is_finite() && stats.decode_tok_s > 0.0 {
                    let target = self.current.or(self.last_reply);
                    if let Some(Entry::Message(m)) = target.and_then(|i| self.entries.get_mut(i)) {
                        if m.tokens > 0 && (!m.finished || m.tok_s.is_none()) {
                            m.tok_s = Some(stats.decode_tok_s);
                            // The engine counts tokens; pieces can merge several.
                            m.tokens = m.tokens.max(stats.generated_tokens);
                        }
                    }
                }
                self.stats = Some(stats);
            }
            EngineEvent::Trimmed { dropped_tokens, kept_tokens } => {
                self.trims += 1;
                self.log.push(LogEntry {
                    time: now.to_string(),
                    kind: LogKind::Trim,
                    text: format!("Trimmed {dropped_tokens} tokens to fit the budget, kept {kept_tokens}"),
                });
                let notice = self.new_notice(
                    NoticeKind::Trimmed { dropped_tokens, kept_tokens },
                    format!("Earlier messages were trimmed to fit the budget ({dropped_tokens} tokens dropped)"),
                    Some(format!("{kept_tokens} tokens kept")),
                    now,
                );
                self.insert_notice(notice);
            }
            EngineEvent::Evicted { reason, before_tokens, after_tokens, freed_bytes } => {
                self.evictions += 1;
                let figures = format!("{before_tokens} → {after_tokens} tokens, {} freed", format_bytes(freed_bytes));
                self.log.push(LogEntry {
                    time: now.to_string(),
                    kind: LogKind::Eviction,
                    text: format!("Memory warning ({reason}): {figures}"),
                });
                let detail = if reason.trim().is_empty() { figures } else { format!("{figures} · {reason}") };
                let headline = if after_tokens < before_tokens { EVICTED_TEXT } else { EVICTED_NOTHING_TEXT };
                // Only the newest eviction can be restored (the engine keeps one copy).
                self.clear_restorable();
                let mut notice = self.new_notice(
                    NoticeKind::Evicted { reason, before_tokens, after_tokens, freed_bytes },
                    headline.to_string(),
                    Some(detail),
                    now,
                );
                notice.restorable = self.restore_available && after_tokens < before_tokens;
                self.insert_notice(notice);
            }
            EngineEvent::Notice { message } => {
                let notice = self.new_notice(NoticeKind::Info, message, None, now);
                self.insert_notice(notice);
            }
            EngineEvent::Done { reason } => {
                self.awaiting_reply = false;
                self.pending_user = None;
                self.finish_current(Some(reason));
                self.replies_done += 1;
                self.done_reasons.push(reason);
            }
            EngineEvent::Failed { error } => self.fail(error, now),
            EngineEvent::ConversationReset => self.clear_transcript(),
            EngineEvent::Restored { messages, tokens } => {
                self.clear_transcript();
                self.restores += 1;
                let shown: Vec<(Role, String)> = messages
                    .into_iter()
                    .filter_map(|m| match m.role {
                        TemplateRole::User => Some((Role::User, m.content)),
                        TemplateRole::Assistant => Some((Role::Assistant, m.content)),
                        TemplateRole::System => None,
                    })
                    .collect();
                let count = shown.len();
                for (role, text) in shown {
                    let msg = self.new_message(role, text, now, true);
                    self.entries.push(Entry::Message(msg));
                }
                let noun = if count == 1 { "message" } else { "messages" };
                self.log.push(LogEntry {
                    time: now.to_string(),
                    kind: LogKind::Restore,
                    text: format!("Restored {count} {noun} ({tokens} tokens) without re-prefill"),
                });
                let notice = self.new_notice(
                    NoticeKind::Info,
                    "Conversation restored".to_string(),
                    Some(format!("{count} {noun}, {tokens} tokens, no re-prefill")),
                    now,
                );
                self.entries.push(Entry::Notice(notice));
            }
            EngineEvent::Saved { path, bytes, ms } => {
                self.last_save = Some(SaveInfo { path, bytes, ms, time: now.to_string() });
            }
        }
    }

    fn clear_transcript(&mut self) {
        self.entries.clear();
        self.current = None;
        self.last_reply = None;
        self.pending_user = None;
        self.awaiting_reply = false;
    }

    fn clear_restorable(&mut self) {
        for entry in &mut self.entries {
            if let Entry::Notice(n) = entry {
                n.restorable = false;
            }
        }
    }

    fn fail(&mut self, error: EngineError, now: &str) {
        let message = error.to_string();
        self.last_error = Some(message.clone());
        self.awaiting_reply = false;
        self.pending_user = None;
        let load_error = match &error {
            EngineError::ModelMissing { .. } => Some(LoadFailure {
                title: "No model installed".into(),
                message: message.clone(),
                command: Some(FETCH_COMMAND.into()),
                missing: true,
            }),
            EngineError::ModelLoad { .. }
            | EngineError::BadModelFile { .. }
            | EngineError::UnsupportedArchitecture(_)
            | EngineError::UnsupportedTokenizer(_) => Some(load_failure(&message)),
            EngineError::EngineGone => Some(LoadFailure {
                title: "The engine stopped".into(),
                message: message.clone(),
                command: None,
                missing: false,
            }),
            // Before the model is ready, any failure means the model is unusable.
            _ if !self.is_ready() => Some(load_failure(&message)),
            _ => None,
        };
        if let Some(failure) = load_error {
            self.finish_current(None);
            self.phase = Phase::Failed(failure);
            return;
        }
        // A failed turn: the reply (if any) ends with an inline error.
        if let Some(i) = self.current.take() {
            let empty = matches!(&self.entries[i], Entry::Message(m) if m.text.is_empty());
            if empty && i + 1 == self.entries.len() {
                self.entries.pop();
            } else if let Entry::Message(m) = &mut self.entries[i] {
                m.finished = true;
                m.error = Some(message.clone());
                self.last_reply = Some(i);
            }
        }
        let notice = self.new_notice(NoticeKind::Error, format!("This reply failed: {message}"), None, now);
        self.entries.push(Entry::Notice(notice));
    }

    fn current_mut(&mut self) -> Option<&mut Message> {
        match self.current.and_then(|i| self.entries.get_mut(i)) {
            Some(Entry::Message(m)) => Some(m),
            _ => None,
        }
    }

    fn finish_current(&mut self, reason: Option<DoneReason>) {
        if let Some(i) = self.current.take() {
            if let Some(Entry::Message(m)) = self.entries.get_mut(i) {
                m.finished = true;
                m.done = reason.or(m.done);
            }
            self.last_reply = Some(i);
        }
    }

    /// Appends a notice; above the streaming reply while that has no text yet.
    fn insert_notice(&mut self, notice: Notice) {
        if let Some(i) = self.current {
            let empty = matches!(&self.entries[i], Entry::Message(m) if m.text.is_empty());
            if empty && i + 1 == self.entries.len() {
                self.entries.insert(i, Entry::Notice(notice));
                self.current = Some(i + 1);
                return;
            }
        }
        self.entries.push(Entry::Notice(notice));
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn new_message(&mut self, role: Role, text: String, now: &str, finished: bool) -> Message {
        Message {
            id: self.take_id(),
            role,
            text,
            time: now.to_string(),
            tokens: 0,
            tok_s: None,
            finished,
            done: None,
            error: None,
        }
    }

    fn new_notice(&mut self, kind: NoticeKind, text: String, detail: Option<String>, now: &str) -> Notice {
        Notice { id: self.take_id(), kind, text, detail, time: now.to_string(), restorable: false }
    }

    /// Fraction of the token budget in use (0.0..=1.0), when known.
    pub fn budget_fraction(&self) -> Option<f64> {
        let s = self.stats.as_ref()?;
        let budget = if s.budget > 0 { s.budget } else { self.policy?.token_budget };
        (budget > 0).then(|| (s.context_tokens as f64 / budget as f64).clamp(0.0, 1.0))
    }

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
            last_reply: self.messages().filter(|m| m.role == Role::Assistant).last().map(|m| m.text.clone()),
            decode_tok_s: self.stats.as_ref().map_or(0.0, |s| s.decode_tok_s),
            ttft_ms: self.stats.as_ref().map_or(0.0, |s| s.ttft_ms),
            compute_threads: self.stats.as_ref().map_or(0, |s| s.compute_threads),
        }
    }
}

fn load_failure(message: &str) -> LoadFailure {
    LoadFailure {
        title: "The model could not be loaded".into(),
        message: message.to_string(),
        command: None,
        missing: false,
    }
}

/// A short label for replies that did not end normally.
pub fn done_label(reason: DoneReason) -> Option<&'static str> {
    match reason {
        DoneReason::EndOfTurn => None,
        DoneReason::MaxTokens => Some("Reply length limit reached"),
        DoneReason::Stopped => Some("Stopped"),
        DoneReason::MemoryWarning => Some("Interrupted by a memory warning"),
        DoneReason::BudgetExhausted => Some("Token budget reached"),
    }
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
    pub compute_threads: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::RamTier;
    use std::path::PathBuf;

    fn info() -> ModelInfo {
        ModelInfo {
            path: "models/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            file_bytes: 98_000_000,
            architecture: "llama".into(),
            name: "SmolLM2 135M Instruct".into(),
            weights_quant: "Q4_1".into(),
            n_layers: 30,
            context_length: 8192,
            kv_dtype: "f32".into(),
            kv_bytes_per_token: 46_080,
            device: "cpu".into(),
        }
    }

    fn ready() -> ChatState {
        let mut s = ChatState::new();
        s.apply(EngineEvent::Loading { progress: 0.5, message: "reading weights".into() });
        s.apply(EngineEvent::Ready(info()));
        s
    }

    fn tok(t: &str) -> EngineEvent {
        EngineEvent::Token { text: t.into() }
    }

    fn stats(generated: usize, tok_s: f64) -> EngineEvent {
        EngineEvent::Stats(Stats {
            context_tokens: 120,
            budget: 1024,
            generated_tokens: generated,
            decode_tok_s: tok_s,
            ..Stats::default()
        })
    }

    #[test]
    fn loading_then_ready() {
        let mut s = ChatState::new();
        assert_eq!(s.phase, Phase::Starting);
        assert!(!s.can_send());
        s.apply(EngineEvent::Loading { progress: 1.7, message: "x".into() });
        assert_eq!(s.phase, Phase::Loading { progress: 1.0, message: "x".into() });
        s.apply(EngineEvent::Ready(info()));
        assert!(s.is_ready() && s.can_send());
        assert_eq!(s.model.as_ref().unwrap().weights_quant, "Q4_1");
    }

    #[test]
    fn a_turn_streams_and_finishes() {
        let mut s = ready();
        assert!(s.submit("Hi there", "10:00:00"));
        assert!(s.generating() && !s.can_send());
        assert!(!s.submit("again", "10:00:01"), "no second prompt while one runs");
        s.apply_at(EngineEvent::ReplyStarted { prompt: "Hi there".into() }, "10:00:01");
        assert_eq!(s.messages().count(), 2, "the submitted prompt is not duplicated");
        s.apply(tok("Hel"));
        s.apply(tok("lo!"));
        assert_eq!(s.current_reply().unwrap().text, "Hello!");
        assert!(s.generating());
        s.apply(stats(2, 31.5));
        s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
        assert!(!s.generating() && s.can_send());
        let reply = s.messages().last().unwrap().clone();
        assert_eq!(reply.role, Role::Assistant);
        assert!(reply.finished);
        assert_eq!(reply.tokens, 2);
        assert_eq!(reply.tok_s, Some(31.5));
        assert_eq!(reply.done, Some(DoneReason::EndOfTurn));
        assert_eq!(reply.done_label(), None);
        assert_eq!(reply.time, "10:00:01");
        assert_eq!(s.replies_done, 1);
    }

    #[test]
    fn stats_after_done_still_label_the_reply() {
        let mut s = ready();
        s.apply(EngineEvent::ReplyStarted { prompt: "q".into() });
        assert_eq!(s.messages().count(), 2, "a prompt sent elsewhere is shown");
        s.apply(tok("a"));
        s.apply(EngineEvent::Done { reason: DoneReason::Stopped });
        s.apply(stats(1, 12.0));
        let reply = s.messages().last().unwrap();
        assert_eq!(reply.tok_s, Some(12.0));
        assert_eq!(reply.done_label(), Some("Stopped"));
        // The next turn's prefill figures (no tokens generated yet) change nothing.
        s.apply(EngineEvent::ReplyStarted { prompt: "r".into() });
        s.apply(stats(0, 0.0));
        assert_eq!(s.current_reply().unwrap().tok_s, None);
        assert_eq!(s.stats.as_ref().unwrap().generated_tokens, 0);
    }

    #[test]
    fn trimmed_notice_sits_above_an_empty_reply_and_is_logged() {
        let mut s = ready();
        s.submit("long question", "");
        s.apply_at(EngineEvent::ReplyStarted { prompt: "long question".into() }, "t1");
        s.apply_at(EngineEvent::Trimmed { dropped_tokens: 300, kept_tokens: 400 }, "12:00:05");
        s.apply(tok("ok"));
        let kinds: Vec<&str> = s
            .entries
            .iter()
            .map(|e| match e {
                Entry::Message(m) if m.role == Role::User => "user",
                Entry::Message(_) => "assistant",
                Entry::Notice(_) => "notice",
            })
            .collect();
        assert_eq!(kinds, ["user", "notice", "assistant"]);
        let n = s.notices().next().unwrap();
        assert_eq!(n.text, "Earlier messages were trimmed to fit the budget (300 tokens dropped)");
        assert_eq!(n.class(), "notice-trimmed");
        assert_eq!(s.current_reply().unwrap().text, "ok", "tokens go to the reply, not the notice");
        assert_eq!(s.trims, 1);
        assert_eq!(s.log.len(), 1);
        assert_eq!(s.log[0].kind, LogKind::Trim);
        assert_eq!(s.log[0].time, "12:00:05");
    }

    #[test]
    fn eviction_mid_reply_interrupts_and_the_next_turn_works() {
        let mut s = ready();
        s.submit("tell me a story", "");
        s.apply(EngineEvent::ReplyStarted { prompt: "tell me a story".into() });
        s.apply(tok("Once upon"));
        s.apply_at(
            EngineEvent::Evicted {
                reason: "simulated from settings".into(),
                before_tokens: 900,
                after_tokens: 450,
                freed_bytes: 20 * 1024 * 1024,
            },
            "12:01:00",
        );
        s.apply(EngineEvent::Done { reason: DoneReason::MemoryWarning });
        assert!(!s.generating());
        let last = s.entries.last().unwrap();
        match last {
            Entry::Notice(n) => {
                assert_eq!(n.text, EVICTED_TEXT);
                let d = n.detail.as_deref().unwrap();
                assert!(d.contains("900 → 450 tokens"), "{d}");
                assert!(d.contains("20.0 MiB freed"), "{d}");
                assert!(d.contains("simulated from settings"), "{d}");
            }
            other => panic!("expected the eviction notice last, got {other:?}"),
        }
        let interrupted = s.messages().last().unwrap();
        assert_eq!(interrupted.text, "Once upon");
        assert_eq!(interrupted.done_label(), Some("Interrupted by a memory warning"));
        assert_eq!(s.evictions, 1);
        assert_eq!(s.log[0].kind, LogKind::Eviction);
        assert_eq!(s.log[0].time, "12:01:00");

        assert!(s.submit("and then?", ""));
        s.apply(EngineEvent::ReplyStarted { prompt: "and then?".into() });
        s.apply(tok("The end."));
        s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
        let qa = s.qa_status();
        assert_eq!(qa.replies_done, 2);
        assert_eq!(qa.evictions, 1);
        assert_eq!(qa.done_reasons, ["MemoryWarning", "EndOfTurn"]);
        assert_eq!(qa.notices, [EVICTED_TEXT]);
        assert_eq!(qa.prompts, ["tell me a story", "and then?"]);
        assert!(!qa.generating);
        assert_eq!(qa.last_reply.as_deref(), Some("The end."));
    }

    #[test]
    fn eviction_while_idle_is_a_notice() {
        let mut s = ready();
        s.apply(EngineEvent::Evicted { reason: String::new(), before_tokens: 10, after_tokens: 0, freed_bytes: 0 });
        assert_eq!(s.notices().count(), 1);
        assert_eq!(s.notices().next().unwrap().detail.as_deref(), Some("10 → 0 tokens, 0 B freed"));
        assert!(!s.generating());
    }

    #[test]
    fn eviction_that_dropped_nothing_says_so() {
        let mut s = ready();
        s.apply(EngineEvent::ReplyStarted { prompt: "q".into() });
        s.apply(tok("The"));
        s.apply(EngineEvent::Evicted { reason: "x".into(), before_tokens: 45, after_tokens: 45, freed_bytes: 0 });
        s.apply(EngineEvent::Done { reason: DoneReason::MemoryWarning });
        let n = s.notices().next().unwrap();
        assert_eq!(n.text, EVICTED_NOTHING_TEXT);
        assert!(n.text.starts_with(EVICTED_PREFIX) && EVICTED_TEXT.starts_with(EVICTED_PREFIX));
        assert_eq!(n.class(), "notice-evicted");
        assert_eq!(s.evictions, 1);
    }

    #[test]
    fn model_missing_tells_the_fetch_command() {
        let mut s = ChatState::new();
        s.apply(EngineEvent::Failed { error: EngineError::ModelMissing { path: PathBuf::from("models/x.gguf") } });
        match &s.phase {
            Phase::Failed(f) => {
                assert!(f.missing);
                assert_eq!(f.title, "No model installed");
                assert_eq!(f.command.as_deref(), Some(FETCH_COMMAND));
                assert!(f.message.contains("models/x.gguf"));
            }
            p => panic!("{p:?}"),
        }
        assert!(!s.can_send());
        assert!(s.qa_status().last_error.unwrap().contains("pocketchat fetch"));
    }

    #[test]
    fn load_failure_shows_the_engine_message() {
        let mut s = ChatState::new();
        s.apply(EngineEvent::Loading { progress: 0.1, message: "opening".into() });
        s.apply(EngineEvent::Failed {
            error: EngineError::BadModelFile { path: "m.gguf".into(), message: "bad magic".into() },
        });
        match &s.phase {
            Phase::Failed(f) => {
                assert!(!f.missing);
                assert_eq!(f.command, None);
                assert!(f.message.contains("bad magic"));
            }
            p => panic!("{p:?}"),
        }
        // Any failure before Ready is a load failure too.
        let mut s = ChatState::new();
        s.apply(EngineEvent::Failed { error: EngineError::Inference("boom".into()) });
        assert!(matches!(&s.phase, Phase::Failed(f) if f.message.contains("boom")));
    }

    #[test]
    fn a_failed_turn_is_inline_and_the_chat_goes_on() {
        let mut s = ready();
        s.submit("hi", "");
        s.apply(EngineEvent::ReplyStarted { prompt: "hi".into() });
        s.apply(EngineEvent::Failed { error: EngineError::Inference("shape mismatch".into()) });
        assert!(s.is_ready());
        assert!(!s.generating());
        assert_eq!(s.messages().count(), 1, "the empty reply bubble is removed");
        let n = s.notices().last().unwrap();
        assert_eq!(n.kind, NoticeKind::Error);
        assert!(n.text.contains("shape mismatch"));

        // A failure after some text keeps the text and marks the reply.
        s.submit("again", "");
        s.apply(EngineEvent::ReplyStarted { prompt: "again".into() });
        s.apply(tok("part"));
        s.apply(EngineEvent::Failed { error: EngineError::OutOfMemory("kv".into()) });
        let reply = s.messages().last().unwrap();
        assert_eq!(reply.text, "part");
        assert!(reply.finished && reply.error.is_some());
        assert!(s.can_send());
    }

    #[test]
    fn failed_send_before_reply_started_unblocks_the_composer() {
        let mut s = ready();
        s.submit("x", "");
        s.apply(EngineEvent::Failed { error: EngineError::EmptyPrompt });
        assert!(!s.generating());
        assert!(s.can_send());
    }

    #[test]
    fn reset_clears_the_transcript_but_keeps_the_log() {
        let mut s = ready();
        s.apply(EngineEvent::ReplyStarted { prompt: "a".into() });
        s.apply(EngineEvent::Trimmed { dropped_tokens: 5, kept_tokens: 5 });
        s.apply(tok("b"));
        s.apply(EngineEvent::ConversationReset);
        assert!(s.entries.is_empty());
        assert!(!s.generating());
        assert_eq!(s.log.len(), 1);
        assert!(s.can_send());
    }

    #[test]
    fn policy_and_stats_are_kept() {
        let mut s = ready();
        let report = TierReport {
            physical_bytes: 7 * crate::memory::GIB + crate::memory::GIB / 2,
            detected: RamTier::Phone8Gb,
            overridden: Some(RamTier::Phone6Gb),
            bf16: Some(true),
        };
        let policy = Policy::for_tier(RamTier::Phone6Gb);
        s.apply(EngineEvent::Policy { report: report.clone(), policy });
        s.apply(stats(0, 0.0));
        assert_eq!(s.tier.as_ref().unwrap().effective(), RamTier::Phone6Gb);
        assert_eq!(s.policy.unwrap().token_budget, 1024);
        let f = s.budget_fraction().unwrap();
        assert!((f - 120.0 / 1024.0).abs() < 1e-9);
    }

    #[test]
    fn restore_offer_and_restored_conversation() {
        use crate::engine::template::{Message as TMessage, Role as TRole};
        let mut s = ready();
        s.restore_available = true;
        s.apply(EngineEvent::ReplyStarted { prompt: "a".into() });
        s.apply(tok("b"));
        s.apply(EngineEvent::Evicted { reason: "r".into(), before_tokens: 40, after_tokens: 0, freed_bytes: 1 });
        s.apply(EngineEvent::Done { reason: DoneReason::MemoryWarning });
        assert!(s.notices().last().unwrap().restorable);
        s.apply(EngineEvent::ReplyStarted { prompt: "c".into() });
        assert_eq!(s.notices().filter(|n| n.restorable).count(), 0, "a new turn ends the offer");
        s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
        s.apply(EngineEvent::Evicted { reason: "r".into(), before_tokens: 30, after_tokens: 0, freed_bytes: 1 });
        s.apply(EngineEvent::Evicted { reason: "r".into(), before_tokens: 0, after_tokens: 0, freed_bytes: 0 });
        assert_eq!(
            s.notices().filter(|n| n.restorable).count(),
            0,
            "only the newest eviction, and only when it dropped something"
        );

        s.apply_at(
            EngineEvent::Restored {
                messages: vec![
                    TMessage::new(TRole::System, "sys"),
                    TMessage::new(TRole::User, "a"),
                    TMessage::new(TRole::Assistant, "b"),
                ],
                tokens: 40,
            },
            "09:00:00",
        );
        let texts: Vec<_> = s.messages().map(|m| (m.role, m.text.as_str())).collect();
        assert_eq!(texts, [(Role::User, "a"), (Role::Assistant, "b")]);
        assert!(s.messages().all(|m| m.finished));
        assert_eq!(s.notices().next().unwrap().text, "Conversation restored");
        assert_eq!(s.log.last().unwrap().kind, LogKind::Restore);
        assert_eq!(s.restores, 1);
        assert!(s.can_send());

        s.apply_at(EngineEvent::Saved { path: "/tmp/x.pcstate".into(), bytes: 2048, ms: 3.5 }, "09:01:00");
        assert_eq!(s.last_save.as_ref().unwrap().bytes, 2048);
    }

    #[test]
    fn token_without_reply_started_still_shows() {
        let mut s = ready();
        s.apply(tok("x"));
        assert!(s.generating());
        assert_eq!(s.current_reply().unwrap().text, "x");
        s.apply(EngineEvent::Notice { message: "The prompt was cut to fit the budget".into() });
        assert_eq!(s.entries.len(), 2);
        s.apply(EngineEvent::Done { reason: DoneReason::MaxTokens });
        assert_eq!(s.messages().last().unwrap().done_label(), Some("Reply length limit reached"));
    }

    #[test]
    fn reloading_shows_progress_again() {
        let mut s = ready();
        s.apply(EngineEvent::Loading { progress: 0.2, message: "loading Q8_0".into() });
        assert!(!s.can_send());
        s.apply(EngineEvent::Ready(info()));
        assert!(s.can_send());
    }

    #[test]
    fn qa_status_serializes() {
        let s = ready();
        let json = serde_json::to_string(&s.qa_status()).unwrap();
        assert!(json.contains("\"replies_done\":0"), "{json}");
        assert!(json.contains("\"phase\":\"ready\""), "{json}");
    }
}
