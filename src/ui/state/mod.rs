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

use crate::chats::branches::BranchPoint;
use crate::chats::ChatSummary;
use crate::engine::sampler::{SamplingOverrides, SamplingParams};
use crate::engine::text::template::{Message as TemplateMessage, Role as TemplateRole};
use crate::engine::{DoneReason, EngineError, EngineEvent, ModelInfo, Stats};
use crate::memory::{Policy, TierReport};

use super::copy;
use super::copy::{EVICTED_NOTHING_TEXT, EVICTED_TEXT, FETCH_COMMAND, VERSION_REREAD_TEXT};
use super::fmt::format_bytes;

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
    /// What a thinking model wrote before its answer (empty: none), shown collapsed.
    pub thinking: String,
    /// When the message was sent or the reply started (`HH:MM:SS`, may be empty).
    pub time: String,
    /// Token pieces received so far (assistant only), the thinking's included.
    pub tokens: usize,
    /// Of `tokens`, the thinking's (the engine's count once the reply ends; 0 for a reply
    /// read back from a saved chat).
    pub thinking_tokens: usize,
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

    /// The reply is still writing its thinking (no answer yet).
    pub fn is_thinking(&self) -> bool {
        !self.finished && self.text.is_empty() && !self.thinking.is_empty()
    }

    /// The thinking disclosure's label: "Thinking…" while it is written, then "Thought
    /// for N tokens"; `None` for a reply without thinking.
    pub fn thinking_label(&self) -> Option<String> {
        match (self.thinking.is_empty(), self.is_thinking()) {
            (true, _) => None,
            (false, true) => Some(copy::THINKING.to_string()),
            (false, false) => Some(copy::thought_for(self.thinking_tokens)),
        }
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

/// What a message offers beside its text: its place in the chat (what the engine's
/// `EditMessage` and `SwitchBranch` name), its other versions, and whether it can be edited
/// or switched now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageMark {
    /// Its index among the chat's messages.
    pub index: usize,
    /// `shown + 1` of `count` versions, when it has others.
    pub versions: Option<BranchPoint>,
    /// Ready and nothing streaming: it may be edited or another version shown.
    pub changeable: bool,
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

impl LoadFailure {
    /// A file that is there but cannot be used (or a failure before the model was ready).
    pub(crate) fn broken(message: &str) -> LoadFailure {
        LoadFailure {
            title: copy::LOAD_FAILED_TITLE.into(),
            message: message.to_string(),
            command: None,
            missing: false,
        }
    }
}

/// A short label for replies that did not end normally.
fn done_label(reason: DoneReason) -> Option<&'static str> {
    match reason {
        DoneReason::EndOfTurn => None,
        DoneReason::MaxTokens => Some(copy::DONE_MAX_TOKENS),
        DoneReason::Stopped => Some(copy::DONE_STOPPED),
        DoneReason::MemoryWarning => Some(copy::DONE_MEMORY_WARNING),
        DoneReason::BudgetExhausted => Some(copy::DONE_BUDGET_EXHAUSTED),
    }
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

/// The sampling settings as the engine reported them (`EngineEvent::Sampling`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingView {
    /// What replies use now.
    pub params: SamplingParams,
    /// The model's own defaults.
    pub defaults: SamplingParams,
    /// The user's changes (the settings panel sends them back changed).
    pub overrides: SamplingOverrides,
}

/// Everything the UI shows, folded from engine events.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatState {
    pub phase: Phase,
    pub entries: Vec<Entry>,
    pub model: Option<ModelInfo>,
    pub tier: Option<TierReport>,
    pub policy: Option<Policy>,
    /// The sampling settings in force, the model's defaults and the user's changes.
    pub sampling: Option<SamplingView>,
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
    /// The saved chats, most recent first, and the open one (empty without a chat store).
    pub chats: Vec<ChatSummary>,
    pub active_chat: Option<String>,
    /// The open chat's own system prompt (`None`: the model's default).
    pub system_prompt: Option<String>,
    /// The open chat's "Think before answering" switch (`None`: the model's default).
    pub thinking: Option<bool>,
    /// Bytes of the chats' caches on disk and their cap.
    pub chat_caches: Option<(u64, u64)>,
    /// The open chat's messages that have other versions.
    pub branches: Vec<BranchPoint>,
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
            sampling: None,
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
            chats: Vec::new(),
            active_chat: None,
            system_prompt: None,
            thinking: None,
            chat_caches: None,
            branches: Vec::new(),
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

    /// The "Think before answering" switch as shown: `None` when the model has none (its
    /// template reads no `enable_thinking`), else whether it is on for the open chat.
    pub fn thinking_switch(&self) -> Option<bool> {
        let default = self.model.as_ref()?.thinking?;
        Some(self.thinking.unwrap_or(default))
    }

    /// Tokens in the context, the reply being streamed included.
    pub fn live_context_tokens(&self) -> usize {
        let cached = self.stats.as_ref().map_or(0, |s| s.context_tokens);
        cached + self.current_reply().map_or(0, |m| m.tokens)
    }

    pub fn messages(&self) -> impl DoubleEndedIterator<Item = &Message> {
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
            EngineEvent::Sampling { params, defaults, overrides } => {
                self.sampling = Some(SamplingView { params, defaults, overrides });
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
                if let Some(m) = self.streaming_reply(now) {
                    m.text.push_str(&text);
                    m.tokens += 1;
                }
            }
            EngineEvent::Thinking { text } => {
                if let Some(m) = self.streaming_reply(now) {
                    m.thinking.push_str(&text);
                    m.tokens += 1;
                    m.thinking_tokens += 1;
                }
            }
            EngineEvent::ThinkingSwitch { enabled } => self.thinking = enabled,
            EngineEvent::Stats(stats) => {
                if stats.generated_tokens > 0 && stats.decode_tok_s.is_finite() && stats.decode_tok_s > 0.0 {
                    let target = self.current.or(self.last_reply);
                    if let Some(Entry::Message(m)) = target.and_then(|i| self.entries.get_mut(i)) {
                        if m.tokens > 0 && (!m.finished || m.tok_s.is_none()) {
                            m.tok_s = Some(stats.decode_tok_s);
                            // The engine counts tokens; pieces can merge several.
                            m.tokens = m.tokens.max(stats.generated_tokens);
                            if !m.thinking.is_empty() {
                                m.thinking_tokens = m.thinking_tokens.max(stats.thinking_tokens);
                            }
                        }
                    }
                }
                self.stats = Some(stats);
            }
            EngineEvent::Trimmed { dropped_tokens, kept_tokens } => {
                self.trims += 1;
                self.log_at(LogKind::Trim, copy::trimmed_log(dropped_tokens, kept_tokens), now);
                let notice = self.new_notice(
                    NoticeKind::Trimmed { dropped_tokens, kept_tokens },
                    copy::trimmed_text(dropped_tokens),
                    Some(copy::trimmed_detail(kept_tokens)),
                    now,
                );
                self.insert_notice(notice);
            }
            EngineEvent::Evicted { reason, before_tokens, after_tokens, freed_bytes } => {
                self.evictions += 1;
                let figures = copy::evicted_figures(before_tokens, after_tokens, &format_bytes(freed_bytes));
                self.log_at(LogKind::Eviction, copy::evicted_log(&reason, &figures), now);
                let detail = if reason.trim().is_empty() { figures } else { copy::evicted_detail(&figures, &reason) };
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
            EngineEvent::ConversationReset => {
                self.clear_transcript();
                self.branches.clear();
            }
            EngineEvent::Restored { messages, tokens } => {
                self.restores += 1;
                let count = self.show_transcript(messages, now);
                self.log_at(LogKind::Restore, copy::restored_log(count, tokens), now);
                self.push_resumed_notice(copy::CONVERSATION_RESTORED, count, tokens, now);
            }
            EngineEvent::Saved { path, bytes, ms } => {
                self.last_save = Some(SaveInfo { path, bytes, ms, time: now.to_string() });
            }
            EngineEvent::Chats { chats, active, cache_bytes, cache_cap_bytes } => {
                self.chats = chats;
                self.active_chat = active;
                self.chat_caches = Some((cache_bytes, cache_cap_bytes));
            }
            EngineEvent::ChatOpened { id, title, system_prompt, messages, tokens, resumed } => {
                self.active_chat = Some(id);
                self.system_prompt = system_prompt;
                // Its own come next (`Branches`).
                self.branches.clear();
                let count = self.show_transcript(messages, now);
                if count > 0 {
                    self.log_at(LogKind::Restore, copy::opened_log(&title, count, tokens, resumed), now);
                    if resumed {
                        self.restores += 1;
                        self.push_resumed_notice(copy::CHAT_RESUMED, count, tokens, now);
                    }
                }
            }
            EngineEvent::Rewound { kept } => {
                self.branches.retain(|p| p.index < kept);
                self.rewind(kept);
            }
            EngineEvent::Branches { points } => self.branches = points,
            EngineEvent::BranchSwitched { messages, kept_tokens, fed_tokens, cached } => {
                self.show_transcript(messages, now);
                let line = if cached {
                    copy::version_shown_log(kept_tokens, fed_tokens)
                } else {
                    copy::VERSION_SHOWN_REREAD_LOG.to_string()
                };
                self.log_at(LogKind::Restore, line, now);
                if !cached {
                    let notice = self.new_notice(NoticeKind::Info, VERSION_REREAD_TEXT.to_string(), None, now);
                    self.entries.push(Entry::Notice(notice));
                }
            }
        }
    }

    fn log_at(&mut self, kind: LogKind, text: String, now: &str) {
        self.log.push(LogEntry { time: now.to_string(), kind, text });
    }

    /// The notice under a conversation brought back from its cache.
    fn push_resumed_notice(&mut self, headline: &str, count: usize, tokens: usize, now: &str) {
        let detail = copy::resumed_detail(count, tokens);
        let notice = self.new_notice(NoticeKind::Info, headline.to_string(), Some(detail), now);
        self.entries.push(Entry::Notice(notice));
    }

    /// Replaces the transcript with a conversation's messages (all finished); returns
    /// how many are shown.
    fn show_transcript(&mut self, messages: Vec<TemplateMessage>, now: &str) -> usize {
        self.clear_transcript();
        let mut count = 0;
        for m in messages {
            let role = match m.role {
                TemplateRole::User => Role::User,
                TemplateRole::Assistant => Role::Assistant,
                TemplateRole::System => continue,
            };
            let mut msg = self.new_message(role, m.content, now, true);
            msg.thinking = m.thinking.unwrap_or_default();
            self.entries.push(Entry::Message(msg));
            count += 1;
        }
        count
    }

    /// The last turn was taken back: only the first `kept` messages stay (and the lines
    /// before them). When the last one kept is the user's, its new reply is awaited.
    fn rewind(&mut self, kept: usize) {
        let mut seen = 0;
        let cut = self
            .entries
            .iter()
            .position(|e| {
                if matches!(e, Entry::Message(_)) {
                    seen += 1;
                }
                seen > kept
            })
            .unwrap_or(self.entries.len());
        self.entries.truncate(cut);
        self.current = None;
        self.last_reply = None;
        let last_is_user = matches!(self.entries.last(), Some(Entry::Message(m)) if m.role == Role::User);
        self.pending_user = last_is_user.then(|| self.entries.len() - 1);
        self.awaiting_reply = true;
    }

    /// The last user message and the last reply, when a turn can be edited or written
    /// again now (ready, nothing streaming, a reply after the message).
    pub fn last_turn(&self) -> Option<(u64, u64)> {
        if !self.can_send() {
            return None;
        }
        let mut messages = self.messages().rev();
        let reply = messages.next().filter(|m| m.role == Role::Assistant)?;
        let user = messages.next().filter(|m| m.role == Role::User)?;
        Some((user.id, reply.id))
    }

    /// Each message's [`MessageMark`], by message id, in order.
    pub fn message_marks(&self) -> Vec<(u64, MessageMark)> {
        let changeable = self.can_send();
        self.messages()
            .enumerate()
            .map(|(index, m)| {
                let versions = self.branches.iter().find(|p| p.index == index).copied();
                (m.id, MessageMark { index, versions, changeable })
            })
            .collect()
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
                title: copy::NO_MODEL_TITLE.into(),
                message: message.clone(),
                command: Some(FETCH_COMMAND.into()),
                missing: true,
            }),
            EngineError::ModelLoad { .. }
            | EngineError::BadModelFile { .. }
            | EngineError::UnsupportedArchitecture(_)
            | EngineError::UnsupportedTokenizer(_)
            | EngineError::TooLarge { .. } => Some(LoadFailure::broken(&message)),
            EngineError::EngineGone => Some(LoadFailure {
                title: copy::ENGINE_STOPPED_TITLE.into(),
                message: message.clone(),
                command: None,
                missing: false,
            }),
            // Before the model is ready, any failure means the model is unusable.
            _ if !self.is_ready() => Some(LoadFailure::broken(&message)),
            _ => None,
        };
        if let Some(failure) = load_error {
            self.finish_current(None);
            self.phase = Phase::Failed(failure);
            return;
        }
        // A failed turn: the reply (if any) ends with an inline error.
        if let Some(i) = self.current.take() {
            let empty = matches!(&self.entries[i], Entry::Message(m) if m.text.is_empty() && m.thinking.is_empty());
            if empty && i + 1 == self.entries.len() {
                self.entries.pop();
            } else if let Entry::Message(m) = &mut self.entries[i] {
                m.finished = true;
                m.error = Some(message.clone());
                self.last_reply = Some(i);
            }
        }
        let notice = self.new_notice(NoticeKind::Error, copy::reply_failed(&message), None, now);
        self.entries.push(Entry::Notice(notice));
    }

    /// The reply being streamed, started here when its `ReplyStarted` was not seen.
    fn streaming_reply(&mut self, now: &str) -> Option<&mut Message> {
        if self.current.is_none() {
            let reply = self.new_message(Role::Assistant, String::new(), now, false);
            self.entries.push(Entry::Message(reply));
            self.current = Some(self.entries.len() - 1);
            self.awaiting_reply = false;
        }
        self.current_mut()
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
            let empty = matches!(&self.entries[i], Entry::Message(m) if m.text.is_empty() && m.thinking.is_empty());
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
            thinking: String::new(),
            time: now.to_string(),
            tokens: 0,
            thinking_tokens: 0,
            tok_s: None,
            finished,
            done: None,
            error: None,
        }
    }

    fn new_notice(&mut self, kind: NoticeKind, text: String, detail: Option<String>, now: &str) -> Notice {
        Notice { id: self.take_id(), kind, text, detail, time: now.to_string(), restorable: false }
    }

    /// The token budget in force: the engine's last figure, else the policy's.
    pub fn budget(&self) -> Option<usize> {
        match &self.stats {
            Some(s) if s.budget > 0 => Some(s.budget),
            _ => self.policy.map(|p| p.token_budget),
        }
    }

    /// The memory ceiling in force: the engine's last figure, else the policy's.
    pub fn ceiling_bytes(&self) -> Option<u64> {
        match &self.stats {
            Some(s) if s.ceiling_bytes > 0 => Some(s.ceiling_bytes),
            _ => self.policy.map(|p| p.ceiling_bytes),
        }
    }

    /// Fraction of the token budget in use (0.0..=1.0), when known.
    pub fn budget_fraction(&self) -> Option<f64> {
        let s = self.stats.as_ref()?;
        let budget = self.budget()?;
        (budget > 0).then(|| (s.context_tokens as f64 / budget as f64).clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests;
