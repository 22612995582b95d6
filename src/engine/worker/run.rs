//! The command loop and everything between turns: loading, the tier policy and its
//! budget, eviction on a memory warning, and the stats the settings panel shows.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};

use futures::channel::mpsc as fmpsc;

use super::device::{device_label, pick_device, set_threads};
use super::saving::before_eviction_path;
use super::{EngineConfig, Loaded, Worker};
use crate::engine::cpu::pool;
use crate::engine::model::{header_facts, read_gguf, Model};
use crate::engine::sampler::{SamplingOverrides, SamplingParams};
use crate::engine::session::Session;
use crate::engine::text::template::ChatTemplate;
use crate::engine::text::tokenizer::TextTokenizer;
use crate::engine::{Command, EngineError, EngineEvent, ModelInfo, Stats};
use crate::memory::process::{release_free_memory, rss_bytes};
use crate::memory::{self, FitClass, Policy, RamTier, TierReport, WeightQuant};

impl Worker {
    pub(super) fn new(
        config: EngineConfig,
        commands: mpsc::Receiver<Command>,
        events: fmpsc::UnboundedSender<EngineEvent>,
        interrupt: Arc<AtomicBool>,
    ) -> Worker {
        let report = TierReport::probe().with_override(config.tier_override);
        let policy = Policy::for_tier(report.effective());
        set_threads(config.threads);
        Worker {
            config,
            commands,
            events,
            interrupt,
            deferred: VecDeque::new(),
            report,
            policy,
            loaded: None,
            last_stats: Stats::default(),
            state_lock: None,
            active: None,
            regenerations: 0,
            typing: None,
            thinking: None,
        }
    }

    pub(super) fn emit(&self, event: EngineEvent) {
        // A closed stream means nobody listens any more; the engine still finishes cleanly.
        let _ = self.events.unbounded_send(event);
    }

    /// Says `warning` (a [`Policy::fit_warning`]) in the log and to the user.
    fn warn(&self, warning: Option<String>) {
        if let Some(message) = warning {
            tracing::warn!("{message}");
            self.emit(EngineEvent::Notice { message });
        }
    }

    /// The policy for the loaded model on this tier (its budget from the fit check).
    fn policy_for(&self, model: &Model) -> Policy {
        let facts = model.facts(self.config.kv_dtype);
        Policy::for_model(self.report.effective(), self.policy.quant, &facts)
    }

    /// The policy's budget (or `--budget`), never more than the model's context.
    fn tier_budget(&self) -> usize {
        let budget = self.config.budget_override.unwrap_or(self.policy.token_budget);
        match &self.loaded {
            Some(l) => budget.min(l.model.max_positions()),
            None => budget,
        }
    }

    /// This turn's budget: the tier's, lowered when live headroom cannot hold the KV
    /// growth it would need; grows back when headroom returns.
    fn budget_and_note(&self) -> (usize, Option<String>) {
        let tier = self.tier_budget();
        match &self.loaded {
            Some(l) => memory::budget_for_headroom(
                tier,
                l.session.state.capacity(),
                l.info.kv_bytes_per_token,
                (self.config.headroom)(),
            ),
            None => (tier, None),
        }
    }

    pub(super) fn budget(&self) -> usize {
        self.budget_and_note().0
    }

    pub(super) fn run(mut self) {
        self.load();
        while let Some(command) = self.next_command() {
            if !matches!(command, Command::Draft { .. }) {
                self.typing = None;
            }
            if !matches!(command, Command::Send { .. } | Command::Draft { .. }) {
                // Whatever else happens to the conversation starts from its own tokens.
                if let Some(l) = self.loaded.as_mut() {
                    l.session.discard_draft();
                }
            }
            match command {
                Command::Draft { text } => self.draft(text),
                Command::Send { text } => {
                    if self.send(&text) {
                        break;
                    }
                }
                Command::Stop => {}
                Command::NewConversation => self.new_conversation(),
                Command::Regenerate => {
                    if self.regenerate() {
                        break;
                    }
                }
                Command::EditLast { text } => {
                    if self.edit_last(&text) {
                        break;
                    }
                }
                Command::EditMessage { index, text } => {
                    if self.edit_message(index, &text) {
                        break;
                    }
                }
                Command::SwitchBranch { index, version } => self.switch_branch(index, version),
                Command::OpenChat { id } => self.open_chat(&id),
                Command::RenameChat { id, title } => self.rename_chat(&id, &title),
                Command::DeleteChat { id } => self.delete_chat(&id),
                Command::ListChats => self.emit_chats(),
                Command::SetSystemPrompt { text } => self.set_system_prompt(&text),
                Command::SetThinking { enabled } => self.set_thinking(enabled),
                Command::MemoryWarning { reason } => self.evict(&reason),
                Command::SetPolicy { tier } => self.set_policy(tier),
                Command::SetThreads { threads } => {
                    set_threads(threads.or(self.config.threads));
                    self.emit_stats();
                }
                Command::SwitchModel { path, display_name, recommended_sampling, allow_too_large } => {
                    self.switch_model(path, display_name, recommended_sampling, allow_too_large)
                }
                Command::Save => self.save(),
                Command::SetSampling { overrides } => {
                    self.config.sampling = overrides;
                    self.emit_sampling();
                }
                Command::RestoreEvicted => match self.config.state_file.as_ref().map(|p| before_eviction_path(p)) {
                    Some(path) if path.exists() => {
                        if let Err(e) = self.restore_from(&path) {
                            self.emit(EngineEvent::Notice { message: format!("{e}. Starting a fresh conversation.") });
                        }
                        self.emit_stats();
                    }
                    _ => self
                        .emit(EngineEvent::Notice { message: "There is no evicted conversation to restore.".into() }),
                },
                Command::Shutdown => {
                    self.save();
                    break;
                }
            }
        }
        tracing::info!("engine thread stopped");
    }

    fn load(&mut self) {
        self.loaded = None;
        self.emit(EngineEvent::Loading { progress: 0.0, message: "Opening the model".into() });
        match self.try_load() {
            Ok(loaded) => {
                self.emit(EngineEvent::Ready(loaded.info.clone()));
                let warning = self.policy.fit_warning(&loaded.info.name);
                self.loaded = Some(loaded);
                self.emit(EngineEvent::Policy { report: self.report.clone(), policy: self.policy });
                self.emit_sampling();
                if self.config.chats.is_some() {
                    // Reloaded (another model): the open chat again, else the launch one.
                    let open = self.active.take().map(|a| a.id).or(self.config.open_chat.take());
                    self.config.open_chat = open;
                    self.open_initial_chat();
                    // After the chat's transcript, which would take it off the screen (the
                    // opening sends the first Stats: the CLI prints what comes before it).
                    self.warn(warning);
                    return;
                }
                if let Some(path) = self.config.state_file.clone() {
                    self.lock_state_file(&path);
                }
                // The lock may have moved this conversation to a free name beside the file.
                if let Some(path) = self.config.state_file.clone() {
                    if path.exists() || path.is_symlink() {
                        self.restore_or_save_beside(&path);
                    }
                }
                self.warn(warning);
                self.emit_stats();
            }
            Err(error) => {
                // The app and the CLI show the error itself.
                tracing::debug!("model load failed: {error}");
                self.emit(EngineEvent::Failed { error });
            }
        }
    }

    fn try_load(&mut self) -> Result<Loaded, EngineError> {
        let path = self.config.model_path.clone();
        let device = pick_device();
        // The header is read once: for the weights' bits, the tokenizer, the template,
        // the sampling defaults and the model itself.
        let (content, reader) = read_gguf(&path)?;
        // The engine loads exactly `model_path`, never a copy in other bits: the policy
        // takes the file's own (the load below says what is wrong with a file whose facts
        // cannot be read).
        if let Ok(facts) = header_facts(&path, &content, self.config.kv_dtype, self.config.kernels) {
            self.policy.quant = WeightQuant::from_bits(facts.bits_per_weight);
        }
        let tokenizer = TextTokenizer::from_gguf(&content)?;
        let template = ChatTemplate::for_model(&content, &tokenizer);
        let recommended = self.config.recommended_sampling.apply(SamplingParams::default());
        let sampling_defaults = SamplingParams::from_gguf_over(recommended, &content.metadata);
        let dry_breakers = Arc::new(tokenizer.dry_breakers(&self.config.dry_sequence_breakers));
        let events = self.events.clone();
        let model = Model::load_read(&path, &content, reader, &device, self.config.kernels, |p| {
            let _ = events.unbounded_send(EngineEvent::Loading { progress: p, message: "Loading weights".into() });
        })?;
        drop(content);
        if tokenizer.vocab_size() > model.config.vocab_size {
            return Err(EngineError::BadModelFile {
                path,
                message: format!(
                    "the tokenizer has {} tokens but the embedding table only {} rows",
                    tokenizer.vocab_size(),
                    model.config.vocab_size
                ),
            });
        }
        self.policy = self.policy_for(&model);
        if self.policy.fit == FitClass::TooLarge && !self.config.allow_too_large {
            let facts = model.facts(self.config.kv_dtype);
            return Err(EngineError::TooLarge {
                name: self.config.display_name.clone().unwrap_or_else(|| model.config.name.clone()),
                footprint_mib: memory::fit::footprint_at(&facts, memory::fit::MIN_CHAT_TOKENS) / memory::MIB,
                ceiling_mib: self.policy.ceiling_bytes / memory::MIB,
            });
        }
        let thinking = template.thinking_default();
        let state = model.make_state(self.budget(), self.config.kv_dtype);
        // A KV type the heads do not suit (q8_0 with heads of 48) is refused now, not at the
        // first prompt.
        if let Some(message) =
            state.stored_head_dims().into_iter().find_map(|d| self.config.kv_dtype.check_head_dim(d).err())
        {
            return Err(EngineError::BadModelFile { path, message });
        }
        let mut session = Session::new(state, template)?;
        session.trim_mode = self.config.trim_mode;
        session.set_enable_thinking(self.thinking_switch());
        let c = &model.config;
        let weights_quant = match &c.requantized_from {
            Some(from) => format!("{:?} (requantized from {from})", c.weights_dtype),
            None => format!("{:?}", c.weights_dtype),
        };
        let info = ModelInfo {
            path: path.display().to_string(),
            file_bytes: c.file_bytes,
            architecture: c.architecture.clone(),
            name: self.config.display_name.clone().unwrap_or_else(|| c.name.clone()),
            weights_quant,
            n_layers: c.n_layers,
            context_length: c.context_length,
            kv_dtype: format!("{:?}", self.config.kv_dtype),
            kv_bytes_per_token: model.kv_bytes_per_token(self.config.kv_dtype),
            recurrent_bytes: model.recurrent_bytes(),
            device: device_label(model.device()),
            thinking,
        };
        Ok(Loaded { model, tokenizer, session, info, sampling_defaults, dry_breakers, identity: None })
    }

    fn stats(&self) -> Stats {
        let mut s = self.last_stats.clone();
        (s.budget, s.budget_note) = self.budget_and_note();
        s.tier_budget = self.tier_budget();
        s.ceiling_bytes = self.policy.ceiling_bytes;
        s.rss_bytes = rss_bytes().unwrap_or(0);
        s.footprint_bytes = memory::footprint_bytes().unwrap_or(0);
        s.compute_threads = pool::global().threads();
        s.available_cores = pool::available_cores();
        if let Some(l) = &self.loaded {
            s.context_tokens = l.session.len();
            s.kv_bytes = l.session.state.bytes();
            let facts = l.model.facts(self.config.kv_dtype);
            s.predicted_footprint_bytes = memory::fit::footprint_at(&facts, s.tier_budget);
            s.mapped_weights_bytes = facts.mapped_bytes;
        }
        s
    }

    /// The model's sampling defaults (the chat defaults before a model is loaded).
    fn sampling_defaults(&self) -> SamplingParams {
        self.loaded.as_ref().map(|l| l.sampling_defaults).unwrap_or_default()
    }

    /// The sampling settings a reply uses now: the overrides over the model's defaults.
    pub(super) fn sampling(&self) -> SamplingParams {
        self.config.sampling.apply(self.sampling_defaults())
    }

    fn emit_sampling(&self) {
        let (defaults, overrides) = (self.sampling_defaults(), self.config.sampling);
        self.emit(EngineEvent::Sampling { params: self.sampling(), defaults, overrides });
    }

    pub(super) fn emit_stats(&mut self) {
        self.last_stats = self.stats();
        self.emit(EngineEvent::Stats(self.last_stats.clone()));
    }

    pub(super) fn new_conversation(&mut self) {
        if self.new_chat() {
            return;
        }
        if let Some(l) = self.loaded.as_mut() {
            l.session.clear();
        }
        self.emit(EngineEvent::ConversationReset);
        self.emit_stats();
    }

    fn set_policy(&mut self, tier: Option<RamTier>) {
        self.report = self.report.clone().with_override(tier);
        // The same file stays loaded: only its budget and ceiling follow the tier.
        self.policy = match &self.loaded {
            Some(l) => self.policy_for(&l.model),
            None => Policy { quant: self.policy.quant, ..Policy::for_tier(self.report.effective()) },
        };
        let budget = self.budget();
        if let Some(l) = self.loaded.as_mut() {
            if l.session.state.len() > budget {
                let _ = l.session.evict_to(&l.model, budget / 2);
            }
            l.session.state.set_max_tokens(budget);
        }
        self.emit(EngineEvent::Policy { report: self.report.clone(), policy: self.policy });
        self.warn(self.loaded.as_ref().and_then(|l| self.policy.fit_warning(&l.info.name)));
        self.emit_stats();
    }

    /// Loads another file; when it cannot be loaded (the error is reported), the model
    /// that was loaded before comes back, so the app keeps working.
    fn switch_model(
        &mut self,
        path: PathBuf,
        display_name: Option<String>,
        recommended_sampling: SamplingOverrides,
        allow_too_large: bool,
    ) {
        let _span = tracing::info_span!("switch_model", path = %path.display()).entered();
        self.save();
        let had_model = self.loaded.is_some();
        let history = self.loaded.as_ref().map(|l| l.session.messages().to_vec()).unwrap_or_default();
        let before = self.config.clone();
        // Another model's conversation is not this state file's: a fresh lock follows.
        self.state_lock = None;
        self.config.model_path = path;
        self.config.display_name = display_name;
        self.config.recommended_sampling = recommended_sampling;
        self.config.allow_too_large = allow_too_large;
        self.load();
        if self.loaded.is_none() && had_model {
            self.notice(format!("Going back to {}.", before.display_name.as_deref().unwrap_or("the previous model")));
            self.config = before;
            self.load();
        }
        // A chat store re-opens the chat itself; otherwise the text goes on with the new
        // model, re-read at the next message (another model's cache means nothing to it).
        if self.config.chats.is_none() && !history.is_empty() {
            if let Some(l) = self.loaded.as_mut().filter(|l| l.session.messages().is_empty()) {
                let n = history.len();
                l.session.set_history(history);
                self.notice(format!("The conversation's {n} messages are re-read with your next message."));
                self.emit_stats();
            }
        }
    }

    /// Evicts to half the budget — or the whole conversation when it is already that
    /// small — gives the memory back and says so.
    pub(super) fn evict(&mut self, reason: &str) {
        let half = self.budget() / 2;
        if let Some(path) = self.config.state_file.as_ref().map(|p| before_eviction_path(p)) {
            // Kept so the user can bring the conversation back once memory allows.
            self.save_to(&path);
        }
        let Some(l) = self.loaded.as_mut() else { return };
        let _span = tracing::info_span!("evict", reason).entered();
        let before_tokens = l.session.state.len();
        let target = if before_tokens > half { half } else { 0 };
        let before_bytes = l.session.state.bytes();
        if let Err(e) = l.session.evict_to(&l.model, target) {
            tracing::warn!("eviction by shifting failed ({e}); clearing the conversation");
            l.session.clear();
        }
        if let Err(e) = l.session.state.shrink_to_fit() {
            tracing::warn!("could not shrink the KV buffers: {e}");
        }
        let _ = l.model.device().synchronize();
        release_free_memory();
        let after_tokens = l.session.state.len();
        let freed_bytes = before_bytes.saturating_sub(l.session.state.bytes());
        let reread = if after_tokens > 0 { l.session.last_reread() } else { 0 };
        self.emit(EngineEvent::Evicted { reason: reason.to_string(), before_tokens, after_tokens, freed_bytes });
        if reread > 0 {
            self.emit(EngineEvent::Notice { message: super::turn::reread_notice(reread) });
        }
        self.emit_stats();
    }
}
