//! The engine's wire protocol: commands go in over a channel, events come out as a
//! `futures::Stream`. Everything here is plain data (Clone + Debug) so the UI can fold
//! events into its own state without touching the engine thread.

use crate::memory::{Policy, RamTier, TierReport};

/// What the UI (or the CLI) asks the engine to do. Commands are handled in order;
/// `Stop` and `MemoryWarning` also interrupt a running reply at the next token.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Append a user message to the conversation and generate a reply.
    Send { text: String },
    /// The message being typed, sent as it changes: the engine feeds its whole words
    /// ahead of `Send` while it has nothing else to do, so the reply starts sooner. Never
    /// part of the conversation or saved; a draft queued behind newer commands is skipped.
    Draft { text: String },
    /// Stop the reply being generated (the conversation keeps what was said so far).
    Stop,
    /// Start a new conversation (keeps the model loaded). With a chat store the old one
    /// stays in the list; without one it is forgotten.
    NewConversation,
    /// Write the last reply again (a new sample): the cache goes back to the reply's
    /// start, nothing before it is fed again. With a chat store the old reply stays as
    /// another version of it.
    Regenerate,
    /// Replace the last user message with `text` and answer it: only that turn is fed.
    /// With a chat store the old turn stays as another version.
    EditLast { text: String },
    /// Replace the open chat's user message `index` (in its transcript, from 0) with
    /// `text` and answer it: the old message and what followed stay as another version
    /// (chat store only; without one, only the last message). The cache is kept up to
    /// that message.
    EditMessage { index: usize, text: String },
    /// Show version `version` (from 0) of the open chat's message `index`: the cache is
    /// kept up to where the versions part and the rest of that version is fed
    /// (`BranchSwitched` says how much).
    SwitchBranch { index: usize, version: usize },
    /// Switch to the chat with this id (chat store only); stops a running reply first.
    OpenChat { id: String },
    /// Rename a chat (chat store only).
    RenameChat { id: String, title: String },
    /// Delete a chat, its text and its caches (chat store only); stops a running reply
    /// first when it is the open chat.
    DeleteChat { id: String },
    /// Send the chat list again (chats were added to the folder: an import).
    ListChats,
    /// The open chat's own system prompt; empty goes back to the model's default. The
    /// conversation is re-read with it at the next message.
    SetSystemPrompt { text: String },
    /// The open chat's "Think before answering" switch: the chat template's
    /// `enable_thinking` for its turns from now on (regenerated and edited ones too, and
    /// the message read ahead while typed); `None` goes back to the template's default.
    /// Kept in the chat's record; without a chat store, for the session. Models whose
    /// template has no such switch ignore it (`ModelInfo::thinking`).
    SetThinking { enabled: Option<bool> },
    /// The OS (or the QA button) reports memory pressure: stop, evict, report.
    MemoryWarning { reason: String },
    /// Override the tier policy (QA selector); `None` goes back to the detected tier.
    SetPolicy { tier: Option<RamTier> },
    /// Compute on this many threads from the next step on (capped at the cores there are);
    /// `None` goes back to the configured count.
    SetThreads { threads: Option<usize> },
    /// Load another model file (the app's model screen): the conversation is saved, the
    /// new file loads with `Loading` progress and the open chat goes on with it (re-read
    /// at the next message). That exact file is loaded, whatever the tier prefers; a file
    /// the fit check calls too large loads only with `allow_too_large`. Its sampling
    /// defaults come from its GGUF, then `recommended_sampling` (the catalog's).
    SwitchModel {
        path: std::path::PathBuf,
        display_name: Option<String>,
        recommended_sampling: crate::engine::sampler::SamplingOverrides,
        allow_too_large: bool,
    },
    /// Save the conversation to the state file now (the app going to the background).
    Save,
    /// Bring back the conversation saved just before the last memory-warning eviction.
    RestoreEvicted,
    /// Sample replies with these settings from the next reply on; the default (no field
    /// set) goes back to the model's own.
    SetSampling { overrides: crate::engine::sampler::SamplingOverrides },
    /// Shut the engine thread down (saves first when a state file is configured).
    Shutdown,
}

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoneReason {
    /// The model produced an end-of-turn token.
    EndOfTurn,
    /// `max_tokens` reached.
    MaxTokens,
    /// The user pressed Stop.
    Stopped,
    /// A memory warning interrupted the reply.
    MemoryWarning,
    /// The reply would not fit the token budget any more.
    BudgetExhausted,
}

/// What the engine tells its subscribers.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// Model loading; `progress` in 0.0..=1.0.
    Loading { progress: f32, message: String },
    /// The model is loaded and the engine takes commands.
    Ready(ModelInfo),
    /// The memory policy in force (sent after `Ready` and after each `SetPolicy`).
    Policy { report: TierReport, policy: Policy },
    /// A reply started for the user message `text` (after queuing).
    ReplyStarted { prompt: String },
    /// A piece of the reply's answer, UTF-8 complete.
    Token { text: String },
    /// A piece of the reply's thinking (what a thinking model writes in
    /// `<think>…</think>` before its answer; the tags are not in it).
    Thinking { text: String },
    /// Figures after each prefill and at the end of each reply.
    Stats(Stats),
    /// Old turns were dropped to fit the budget before a turn.
    Trimmed { dropped_tokens: usize, kept_tokens: usize },
    /// A memory warning evicted (part of) the KV cache.
    Evicted { reason: String, before_tokens: usize, after_tokens: usize, freed_bytes: u64 },
    /// Something the user should know that is not an error (e.g. a prompt was cut).
    Notice { message: String },
    /// The reply ended.
    Done { reason: DoneReason },
    /// A command failed; the engine keeps serving unless the error is a load failure.
    Failed { error: crate::engine::EngineError },
    /// The conversation was cleared.
    ConversationReset,
    /// The last turn was taken back (regenerate, edit): the transcript keeps its first
    /// `kept` user messages and replies; a `ReplyStarted` follows.
    Rewound { kept: usize },
    /// The chat list changed (or the open chat did), with the caches' size and cap.
    Chats { chats: Vec<crate::chats::ChatSummary>, active: Option<String>, cache_bytes: u64, cache_cap_bytes: u64 },
    /// A chat was opened: its whole transcript, and whether its cache was restored
    /// (`resumed`, no re-prefill) or will be re-read at the next message.
    ChatOpened {
        id: String,
        title: String,
        system_prompt: Option<String>,
        messages: Vec<crate::engine::text::template::Message>,
        tokens: usize,
        resumed: bool,
    },
    /// The open chat's "Think before answering" switch (`None`: the model's default;
    /// see `ModelInfo::thinking`), after `ChatOpened` and after each `SetThinking`.
    ThinkingSwitch { enabled: Option<bool> },
    /// The open chat's messages that have other versions (after `ChatOpened`, after each
    /// reply and after `BranchSwitched`).
    Branches { points: Vec<crate::chats::branches::BranchPoint> },
    /// Another version of a message is shown: the transcript as it is now. `fed_tokens`
    /// were fed after the `kept_tokens` the versions share; `cached` is false when the
    /// cache could not be kept (the chat is re-read at the next message).
    BranchSwitched {
        messages: Vec<crate::engine::text::template::Message>,
        kept_tokens: usize,
        fed_tokens: usize,
        cached: bool,
    },
    /// A saved conversation was loaded (at launch, or by `RestoreEvicted`) without re-prefill.
    Restored { messages: Vec<crate::engine::text::template::Message>, tokens: usize },
    /// The conversation was written to the state file.
    Saved { path: String, bytes: u64, ms: f64 },
    /// The sampling settings in force (after `Ready` and after each `SetSampling`), and the
    /// model's own defaults they start from.
    Sampling {
        params: crate::engine::sampler::SamplingParams,
        defaults: crate::engine::sampler::SamplingParams,
        overrides: crate::engine::sampler::SamplingOverrides,
    },
}

/// What the loaded model is, for the settings panel.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub path: String,
    pub file_bytes: u64,
    pub architecture: String,
    pub name: String,
    /// The real dtype of the loaded matmul weights, e.g. "Q4_1" or "Q8_0 (requantized from Q4_1)".
    pub weights_quant: String,
    pub n_layers: usize,
    pub context_length: usize,
    pub kv_dtype: String,
    pub kv_bytes_per_token: u64,
    /// Bytes of a hybrid model's recurrent state with its turn checkpoints at most
    /// ([`crate::engine::Model::recurrent_bytes`]); 0 for a plain transformer.
    pub recurrent_bytes: u64,
    pub device: String,
    /// The chat template's thinking switch (`enable_thinking`): `None` when it has none,
    /// else whether the model thinks by default.
    pub thinking: Option<bool>,
}

/// Live figures: the settings panel's token bar and memory lines.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Tokens in the KV cache now.
    pub context_tokens: usize,
    /// The token budget in force for this turn.
    pub budget: usize,
    /// The tier's (or the override's) static budget; `budget` is lower when live memory
    /// headroom is short, and `budget_note` then says why.
    pub tier_budget: usize,
    pub budget_note: Option<String>,
    /// Bytes of the KV cache buffers now allocated.
    pub kv_bytes: u64,
    /// Predicted footprint, the dirty memory jetsam counts: weights copied to the heap +
    /// KV at full budget + the prefill's activations + runtime overhead.
    pub predicted_footprint_bytes: u64,
    /// The process's dirty memory now (`RssAnon`; `phys_footprint` on Apple; 0 when unknown).
    pub footprint_bytes: u64,
    /// Weights read in place from the mapped file: clean pages, outside the footprint.
    pub mapped_weights_bytes: u64,
    /// The tier's memory ceiling.
    pub ceiling_bytes: u64,
    /// Resident set size of the process now (0 when unknown).
    pub rss_bytes: u64,
    /// Tokens fed by the last prefill and how long it took.
    pub prefill_tokens: usize,
    pub prefill_ms: f64,
    /// Tokens of the last prompt fed ahead, while it was typed (not in `prefill_tokens`).
    pub drafted_tokens: usize,
    /// Time from Send to the first token of the last reply.
    pub ttft_ms: f64,
    pub decode_tok_s: f64,
    pub generated_tokens: usize,
    /// Of `generated_tokens`, those of the reply's thinking (its tags included).
    pub thinking_tokens: usize,
    /// Threads the CPU kernels run on now, and the cores they may use.
    pub compute_threads: usize,
    pub available_cores: usize,
}
