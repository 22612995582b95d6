//! How the engine is started: the model file, the policy overrides, the KV cache's
//! element type, the reply limits and where the conversation is saved.

use std::path::PathBuf;
use std::sync::Arc;

use crate::chats::ChatStore;
use crate::engine::cpu::kernels::Kernels;
use crate::engine::sampler::{SamplingOverrides, DEFAULT_BREAKERS};
use crate::engine::session::TrimMode;
use crate::memory::{self, RamTier};

pub use crate::engine::kv_type::KvDtype;

/// Reads the memory the process may still use (live headroom); `None` when unknown.
pub type HeadroomProbe = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

/// How to start the engine. Everything the engine needs from outside arrives here: it
/// reads no environment variable and no catalog itself (main and the app do).
#[derive(Clone)]
pub struct EngineConfig {
    /// The GGUF to load: exactly this file, whatever the tier (which of a model's
    /// published files a tier gets is chosen before, from the catalog).
    pub model_path: PathBuf,
    /// The name the settings panel shows; `None` uses the GGUF's `general.name`.
    pub display_name: Option<String>,
    /// QA override of the detected tier.
    pub tier_override: Option<RamTier>,
    /// Overrides the token budget computed from the model and the tier (tests, soak).
    pub budget_override: Option<usize>,
    /// Loads a model the fit check says is too large for the device (it may be killed).
    pub allow_too_large: bool,
    /// The KV cache's element type: f16 by default (half the memory of f32 for the same
    /// tokens, and faster late in a conversation; f32 for checks; q8_0 for 17/32 of f16's
    /// memory).
    pub kv_dtype: KvDtype,
    /// Sampling settings that replace the model's defaults (the rest come from the GGUF's
    /// `general.sampling.*` keys, else `recommended_sampling`, else the chat defaults).
    pub sampling: SamplingOverrides,
    /// The settings the model's authors recommend (the catalog's, from the model card or
    /// `generation_config.json`): the model's defaults where its GGUF carries no
    /// `general.sampling.*` key. Empty for files the catalog does not know.
    pub recommended_sampling: SamplingOverrides,
    /// DRY's sequence breakers (strings, mapped to the model's tokens at load); llama.cpp's
    /// [`DEFAULT_BREAKERS`] by default, empty for none.
    pub dry_sequence_breakers: Vec<String>,
    pub max_tokens: usize,
    pub trim_mode: TrimMode,
    pub kernels: Kernels,
    /// Where the conversation is saved (after each reply, on `Save`, on `Shutdown`) and
    /// restored from at launch. `None` keeps conversations in memory only.
    pub state_file: Option<PathBuf>,
    /// The app's conversations: each chat's text and cache saved apart, the open one's
    /// cache at [`ChatStore::cache_path`]. When set, `state_file` is managed by the store.
    pub chats: Option<ChatStore>,
    /// The chat to open at launch (an id of `chats`); `None` opens the most recent one,
    /// or a new one when there is none.
    pub open_chat: Option<String>,
    /// Live headroom source used to shrink a turn's budget when memory is short (the
    /// platform's by default; tests pass a fake).
    pub headroom: HeadroomProbe,
    /// Threads for the CPU kernels (capped at [`pool::available_cores`]); `None` uses
    /// every available core.
    pub threads: Option<usize>,
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("model_path", &self.model_path)
            .field("tier_override", &self.tier_override)
            .field("budget_override", &self.budget_override)
            .field("allow_too_large", &self.allow_too_large)
            .field("kv_dtype", &self.kv_dtype)
            .field("max_tokens", &self.max_tokens)
            .field("state_file", &self.state_file)
            .field("chats", &self.chats.as_ref().map(|c| c.dir()))
            .field("open_chat", &self.open_chat)
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

impl EngineConfig {
    pub fn new(model_path: impl Into<PathBuf>) -> Self {
        EngineConfig {
            model_path: model_path.into(),
            display_name: None,
            tier_override: None,
            budget_override: None,
            allow_too_large: false,
            kv_dtype: KvDtype::F16,
            sampling: SamplingOverrides::default(),
            recommended_sampling: SamplingOverrides::default(),
            dry_sequence_breakers: DEFAULT_BREAKERS.iter().map(|b| b.to_string()).collect(),
            max_tokens: 512,
            trim_mode: TrimMode::Shift,
            kernels: Kernels::Fast,
            state_file: None,
            chats: None,
            open_chat: None,
            headroom: Arc::new(memory::process::available_bytes),
            threads: None,
        }
    }
}
