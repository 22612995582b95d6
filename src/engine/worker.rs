//! The engine thread: one std thread owns the model, the conversation's [`State`], the
//! tokenizer and the device. Commands arrive over a channel and are handled in order (a
//! serial prompt queue); events leave as a `futures::Stream`. A running reply notices
//! `Stop`, `MemoryWarning`, `NewConversation` and `Shutdown` at the next token through
//! one atomic flag.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll};
use std::time::Instant;

use candle_core::{DType, Device};
use candle_transformers::generation::LogitsProcessor;
use futures::channel::mpsc as fmpsc;
use futures::Stream;

use super::budget::reply_reserve;
use super::detokenizer::Detokenizer;
use super::model::{read_gguf, MatmulKernel, Model, PREFILL_CHUNK};
use super::persist::{self, ModelIdentity, StateFileError};
use super::pool;
use super::session::{Session, TrimMode};
use super::template::ChatTemplate;
use super::tokenizer::TextTokenizer;
use super::{Command, DoneReason, EngineError, EngineEvent, ModelInfo, Stats};
use crate::memory::process::{release_free_memory, rss_bytes};
use crate::memory::{self, Policy, RamTier, TierReport, WeightQuant};

/// KV cache element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
}

impl KvDtype {
    pub fn dtype(self) -> DType {
        match self {
            KvDtype::F32 => DType::F32,
            KvDtype::F16 => DType::F16,
        }
    }
}

/// Reads the memory the process may still use (live headroom); `None` when unknown.
pub type HeadroomProbe = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

/// How to start the engine.
#[derive(Clone)]
pub struct EngineConfig {
    /// The GGUF to load (the 4-bit file; for 8-bit policies its Q8_0 sibling is used when
    /// `follow_policy_quant` is set).
    pub model_path: PathBuf,
    /// QA override of the detected tier.
    pub tier_override: Option<RamTier>,
    /// Overrides the tier's token budget (tests, soak).
    pub budget_override: Option<usize>,
    pub kv_dtype: KvDtype,
    pub temperature: f64,
    pub max_tokens: usize,
    pub seed: u64,
    /// Load the Q8_0 variant for tiers whose policy says 8-bit (made on first use).
    pub follow_policy_quant: bool,
    pub trim_mode: TrimMode,
    pub kernel: MatmulKernel,
    /// Where the conversation is saved (after each reply, on `Save`, on `Shutdown`) and
    /// restored from at launch. `None` keeps conversations in memory only.
    pub state_file: Option<PathBuf>,
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
            .field("kv_dtype", &self.kv_dtype)
            .field("max_tokens", &self.max_tokens)
            .field("state_file", &self.state_file)
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

impl EngineConfig {
    pub fn new(model_path: impl Into<PathBuf>) -> Self {
        EngineConfig {
            model_path: model_path.into(),
            tier_override: None,
            budget_override: None,
            kv_dtype: KvDtype::F32,
            temperature: 0.0,
            max_tokens: 512,
            seed: 299_792_458,
            follow_policy_quant: false,
            trim_mode: TrimMode::Shift,
            kernel: MatmulKernel::Fast,
            state_file: None,
            headroom: Arc::new(memory::process::available_bytes),
            threads: None,
        }
    }
}

/// Sends commands to the engine thread. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    interrupt: Arc<AtomicBool>,
}

impl EngineHandle {
    /// Queues a command; `Stop`, `MemoryWarning`, `NewConversation` and `Shutdown` also
    /// interrupt the running reply at its next token.
    pub fn send(&self, command: Command) -> Result<(), EngineError> {
        let interrupts = matches!(
            command,
            Command::Stop | Command::MemoryWarning { .. } | Command::NewConversation | Command::Shutdown
        );
        self.commands.send(command).map_err(|_| EngineError::EngineGone)?;
        if interrupts {
            self.interrupt.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// The engine's events as a `futures::Stream`.
pub struct EngineEvents {
    inner: fmpsc::UnboundedReceiver<EngineEvent>,
}

impl Stream for EngineEvents {
    type Item = EngineEvent;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<EngineEvent>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

impl EngineEvents {
    /// Blocking receive for code that is not async (CLI, tests).
    pub fn recv_blocking(&mut self) -> Option<EngineEvent> {
        futures::executor::block_on(futures::StreamExt::next(self))
    }
}

pub struct Engine;

impl Engine {
    /// Starts the engine thread; loading happens there and is reported by events.
    pub fn spawn(config: EngineConfig) -> (EngineHandle, EngineEvents) {
        let (tx, rx) = mpsc::channel();
        let (etx, erx) = fmpsc::unbounded();
        let interrupt = Arc::new(AtomicBool::new(false));
        let flag = interrupt.clone();
        std::thread::Builder::new()
            .name("pocketchat-engine".into())
            .spawn(move || Worker::new(config, rx, etx, flag).run())
            .expect("spawning the engine thread");
        (EngineHandle { commands: tx, interrupt }, EngineEvents { inner: erx })
    }
}

/// Everything that exists once a model is loaded.
struct Loaded {
    model: Model,
    tokenizer: TextTokenizer,
    session: Session,
    info: ModelInfo,
    /// sha256 + size of the model file, computed on first save/restore.
    identity: Option<ModelIdentity>,
}

impl Loaded {
    fn identity(&mut self) -> Result<ModelIdentity, StateFileError> {
        if self.identity.is_none() {
            let path = self.model.path();
            let sha256 = crate::catalog::sha256_file(path).map_err(|e| StateFileError::Io(e.to_string()))?;
            self.identity = Some(ModelIdentity { sha256, bytes: self.info.file_bytes });
        }
        Ok(self.identity.clone().expect("set above"))
    }
}

struct Worker {
    config: EngineConfig,
    commands: mpsc::Receiver<Command>,
    events: fmpsc::UnboundedSender<EngineEvent>,
    interrupt: Arc<AtomicBool>,
    /// Commands that arrived during a reply and wait their turn.
    deferred: VecDeque<Command>,
    report: TierReport,
    policy: Policy,
    loaded: Option<Loaded>,
    last_stats: Stats,
    /// Held on the state file this conversation is saved to.
    state_lock: Option<persist::StateLock>,
}

/// What a reply's interruption asked for, applied once the reply has ended cleanly.
#[derive(Default)]
struct Interruption {
    reason: Option<DoneReason>,
    evict: Option<String>,
    clear: bool,
    shutdown: bool,
}

impl Worker {
    fn new(
        config: EngineConfig,
        commands: mpsc::Receiver<Command>,
        events: fmpsc::UnboundedSender<EngineEvent>,
        interrupt: Arc<AtomicBool>,
    ) -> Worker {
        // Detection also applies `POCKETCHAT_TIER`; an explicit override wins over both.
        let mut report = TierReport::detect();
        if config.tier_override.is_some() {
            report = report.with_override(config.tier_override);
        }
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
        }
    }

    fn emit(&self, event: EngineEvent) {
        // A closed stream means nobody listens any more; the engine still finishes cleanly.
        let _ = self.events.unbounded_send(event);
    }

    /// The tier's (or overridden) token budget.
    /// The tier's budget (or `--budget`), never more than the model's context.
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

    fn budget(&self) -> usize {
        self.budget_and_note().0
    }

    fn run(mut self) {
        self.load();
        loop {
            let command = match self.deferred.pop_front() {
                Some(c) => c,
                None => match self.commands.recv() {
                    Ok(c) => c,
                    Err(_) => break,
                },
            };
            match command {
                Command::Send { text } => {
                    if self.send(&text) {
                        break;
                    }
                }
                Command::Stop => {}
                Command::NewConversation => self.new_conversation(),
                Command::MemoryWarning { reason } => self.evict(&reason),
                Command::SetPolicy { tier } => self.set_policy(tier),
                Command::SetThreads { threads } => {
                    set_threads(threads.or(self.config.threads));
                    self.emit_stats();
                }
                Command::Save => self.save(),
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

    fn model_path_for_policy(&self) -> Result<PathBuf, EngineError> {
        if self.config.follow_policy_quant && self.policy.quant == WeightQuant::Q8 {
            crate::catalog::ensure_q8_variant(&self.config.model_path)
                .map_err(|e| EngineError::ModelLoad { path: self.config.model_path.clone(), message: e.to_string() })
        } else {
            Ok(self.config.model_path.clone())
        }
    }

    fn load(&mut self) {
        self.loaded = None;
        self.emit(EngineEvent::Loading { progress: 0.0, message: "Opening the model".into() });
        match self.try_load() {
            Ok(loaded) => {
                self.emit(EngineEvent::Ready(loaded.info.clone()));
                self.loaded = Some(loaded);
                self.emit(EngineEvent::Policy { report: self.report.clone(), policy: self.policy });
                if let Some(path) = self.config.state_file.clone() {
                    self.lock_state_file(&path);
                }
                // The lock may have moved this conversation to a free name beside the file.
                if let Some(path) = self.config.state_file.clone() {
                    if path.exists() || path.is_symlink() {
                        self.restore_or_save_beside(&path);
                    }
                }
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
        let path = self.model_path_for_policy()?;
        let device = pick_device();
        let (content, _) = read_gguf(&path)?;
        let tokenizer = TextTokenizer::from_gguf(&content)?;
        let template_src = content.metadata.get("tokenizer.chat_template").and_then(|v| v.to_string().ok()).cloned();
        drop(content);
        let events = self.events.clone();
        let model = Model::load(&path, &device, self.config.kernel, |p| {
            let _ = events.unbounded_send(EngineEvent::Loading { progress: p, message: "Loading weights".into() });
        })?;
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
        let template = ChatTemplate::new(template_src.as_deref(), tokenizer.bos_token(), tokenizer.eos_token());
        let mut session = Session::new(model.make_state(self.budget(), self.config.kv_dtype.dtype()), template)?;
        session.trim_mode = self.config.trim_mode;
        let c = &model.config;
        let weights_quant = match &c.requantized_from {
            Some(from) => format!("{:?} (requantized from {from})", c.weights_dtype),
            None => format!("{:?}", c.weights_dtype),
        };
        let info = ModelInfo {
            path: path.display().to_string(),
            file_bytes: c.file_bytes,
            architecture: c.architecture.clone(),
            name: display_name(&path).unwrap_or_else(|| c.name.clone()),
            weights_quant,
            n_layers: c.n_layers,
            context_length: c.context_length,
            kv_dtype: format!("{:?}", self.config.kv_dtype),
            kv_bytes_per_token: model.kv_bytes_per_token(self.config.kv_dtype.dtype()),
            device: device_label(model.device()),
        };
        Ok(Loaded { model, tokenizer, session, info, identity: None })
    }

    /// Saves the conversation to the configured state file, if any.
    fn save(&mut self) {
        if let Some(path) = self.config.state_file.clone() {
            self.save_to(&path);
        }
    }

    fn save_to(&mut self, path: &std::path::Path) {
        let Some(l) = self.loaded.as_mut() else { return };
        let started = Instant::now();
        let result = l.identity().and_then(|id| persist::save(&l.session, &id, path));
        match result {
            Ok(bytes) => self.emit(EngineEvent::Saved {
                path: path.display().to_string(),
                bytes,
                ms: started.elapsed().as_secs_f64() * 1e3,
            }),
            Err(e) => self.emit(EngineEvent::Notice { message: format!("The conversation could not be saved: {e}") }),
        }
    }

    /// Loads a saved conversation (announced with `Restored`); on an error the
    /// conversation is a fresh one and the caller says why.
    fn restore_from(&mut self, path: &std::path::Path) -> Result<(), StateFileError> {
        let Some(l) = self.loaded.as_mut() else { return Ok(()) };
        l.identity().and_then(|id| persist::restore(&mut l.session, &id, path))?;
        let messages = l.session.messages().to_vec();
        let tokens = l.session.state.len();
        self.emit(EngineEvent::Restored { messages, tokens });
        Ok(())
    }

    /// Locks `path` for this process; when another pocketchat holds it, this conversation
    /// is saved under a free name beside it instead, and the user is told.
    fn lock_state_file(&mut self, path: &std::path::Path) {
        let mut candidate = path.to_path_buf();
        for _ in 0..100 {
            if let Some(lock) = persist::StateLock::try_acquire(&candidate) {
                self.state_lock = Some(lock);
                if candidate != path {
                    self.emit(EngineEvent::Notice {
                        message: format!(
                            "{} is in use by another pocketchat; this conversation will be saved to {}.",
                            path.display(),
                            candidate.display()
                        ),
                    });
                    self.config.state_file = Some(candidate);
                }
                return;
            }
            candidate = persist::free_path_beside(&candidate);
        }
    }

    /// Restores the configured state file; when it holds something that must be kept
    /// (not a state file, another model's, a newer format's, a damaged one), it is left
    /// as it is and this conversation is saved under a free name beside it.
    fn restore_or_save_beside(&mut self, path: &std::path::Path) {
        let Err(e) = self.restore_from(path) else { return };
        let message = if e.keeps_the_file() {
            let beside = persist::free_path_beside(path);
            let message = format!(
                "{e}. {} was left as it is; this conversation will be saved to {}.",
                path.display(),
                beside.display()
            );
            self.config.state_file = Some(beside.clone());
            self.lock_state_file(&beside);
            message
        } else {
            format!("{e}. Starting a fresh conversation.")
        };
        self.emit(EngineEvent::Notice { message });
    }

    fn stats(&self) -> Stats {
        let mut s = self.last_stats.clone();
        (s.budget, s.budget_note) = self.budget_and_note();
        s.tier_budget = self.tier_budget();
        s.ceiling_bytes = self.policy.ceiling_bytes;
        s.rss_bytes = rss_bytes().unwrap_or(0);
        s.compute_threads = pool::global().threads();
        s.available_cores = pool::available_cores();
        if let Some(l) = &self.loaded {
            s.context_tokens = l.session.state.len();
            s.kv_bytes = l.session.state.bytes();
            let m = &l.model.config;
            let scratch = memory::prefill_scratch_bytes(
                PREFILL_CHUNK,
                m.n_heads,
                m.embedding_length,
                m.ffn_length,
                s.tier_budget,
            );
            s.predicted_footprint_bytes =
                memory::predicted_footprint(l.info.file_bytes, l.info.kv_bytes_per_token, s.tier_budget, scratch);
        }
        s
    }

    fn emit_stats(&mut self) {
        self.last_stats = self.stats();
        self.emit(EngineEvent::Stats(self.last_stats.clone()));
    }

    fn new_conversation(&mut self) {
        if let Some(l) = self.loaded.as_mut() {
            l.session.clear();
        }
        self.emit(EngineEvent::ConversationReset);
        self.emit_stats();
    }

    fn set_policy(&mut self, tier: Option<RamTier>) {
        self.report = self.report.clone().with_override(tier);
        let old = self.policy;
        self.policy = Policy::for_tier(self.report.effective());
        if self.config.follow_policy_quant && old.quant != self.policy.quant {
            self.load();
            return;
        }
        let budget = self.budget();
        if let Some(l) = self.loaded.as_mut() {
            if l.session.state.len() > budget {
                let _ = l.session.evict_to(&l.model, budget / 2);
            }
            l.session.state.set_max_tokens(budget);
        }
        self.emit(EngineEvent::Policy { report: self.report.clone(), policy: self.policy });
        self.emit_stats();
    }

    /// Evicts to half the budget — or the whole conversation when it is already that
    /// small — gives the memory back and says so.
    fn evict(&mut self, reason: &str) {
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
        self.emit(EngineEvent::Evicted { reason: reason.to_string(), before_tokens, after_tokens, freed_bytes });
        self.emit_stats();
    }

    /// Runs one turn. Returns true when the engine must shut down.
    fn send(&mut self, text: &str) -> bool {
        if self.loaded.is_none() {
            self.emit(EngineEvent::Failed {
                error: EngineError::ModelLoad {
                    path: self.config.model_path.clone(),
                    message: "no model is loaded".into(),
                },
            });
            return false;
        }
        self.emit(EngineEvent::ReplyStarted { prompt: text.to_string() });
        let started = Instant::now();
        let budget = self.budget();
        let reserve = reply_reserve(budget, self.config.max_tokens);
        let l = self.loaded.as_mut().expect("checked above");
        l.session.state.set_max_tokens(budget);
        let prepared = match l.session.prepare_turn(&l.model, &l.tokenizer, text, reserve) {
            Ok(p) => p,
            Err(error) => {
                self.emit(EngineEvent::Failed { error });
                self.emit_stats();
                return false;
            }
        };
        let prefill_ms = started.elapsed().as_secs_f64() * 1e3;
        let kept = l.session.state.len() - prepared.fed_tokens;
        if prepared.dropped_tokens > 0 {
            self.emit(EngineEvent::Trimmed { dropped_tokens: prepared.dropped_tokens, kept_tokens: kept });
        }
        if let Some(n) = prepared.prompt_cut_to {
            self.emit(EngineEvent::Notice {
                message: format!(
                    "Your message was longer than the {budget}-token budget; only its last {n} tokens were kept."
                ),
            });
        }
        self.last_stats.prefill_tokens = prepared.fed_tokens;
        self.last_stats.prefill_ms = prefill_ms;
        self.emit_stats();

        let (reason, reply, generated, decode_s, ttft_ms, interruption) =
            match self.decode(prepared.logits.expect("prefill returns logits"), started) {
                Ok(r) => r,
                Err(error) => {
                    self.emit(EngineEvent::Failed { error });
                    self.emit_stats();
                    return false;
                }
            };
        let l = self.loaded.as_mut().expect("checked above");
        l.session.finish_reply(&reply);
        self.last_stats.generated_tokens = generated;
        self.last_stats.ttft_ms = ttft_ms;
        self.last_stats.decode_tok_s = if decode_s > 0.0 { generated as f64 / decode_s } else { 0.0 };
        self.emit(EngineEvent::Done { reason });
        if interruption.evict.is_none() && !interruption.clear {
            self.save();
        }
        if let Some(reason) = interruption.evict {
            self.evict(&reason);
        } else {
            self.emit_stats();
        }
        if interruption.clear {
            self.new_conversation();
        }
        interruption.shutdown
    }

    /// The decode loop: sample, stream, feed, check the interrupt flag.
    #[allow(clippy::type_complexity)]
    fn decode(
        &mut self,
        mut logits: candle_core::Tensor,
        started: Instant,
    ) -> Result<(DoneReason, String, usize, f64, f64, Interruption), EngineError> {
        let temperature = (self.config.temperature > 0.0).then_some(self.config.temperature);
        let mut sampler = LogitsProcessor::new(self.config.seed, temperature, None);
        let mut detok = Detokenizer::default();
        let mut reply = String::new();
        let mut generated = 0usize;
        let mut ttft_ms = 0.0;
        let mut interruption = Interruption::default();
        let decode_start = Instant::now();
        let _span = tracing::info_span!("decode").entered();
        let reason = loop {
            let l = self.loaded.as_mut().expect("decode runs with a model");
            let next = sampler.sample(&logits)?;
            if l.tokenizer.is_stop(next) {
                break DoneReason::EndOfTurn;
            }
            // Every emitted token is also fed, so the cache always encodes the reply text.
            if l.session.state.len() + 1 > l.session.state.max_tokens() {
                break DoneReason::BudgetExhausted;
            }
            if generated == 0 {
                ttft_ms = started.elapsed().as_secs_f64() * 1e3;
            }
            generated += 1;
            if let Some(text) = detok.push(&l.tokenizer, next)? {
                reply.push_str(&text);
                self.emit(EngineEvent::Token { text });
            }
            let l = self.loaded.as_mut().expect("decode runs with a model");
            logits = with_autorelease_pool(|| l.model.forward(&[next], &mut l.session.state))?;
            if generated >= self.config.max_tokens {
                break DoneReason::MaxTokens;
            }
            if self.interrupt.swap(false, Ordering::SeqCst) {
                self.drain_interrupts(&mut interruption);
                if let Some(reason) = interruption.reason {
                    break reason;
                }
            }
        };
        let l = self.loaded.as_mut().expect("decode runs with a model");
        // An incomplete character held back at the end of the reply.
        if let Some(text) = detok.flush(&l.tokenizer)? {
            reply.push_str(&text);
            self.emit(EngineEvent::Token { text });
        }
        let decode_s = decode_start.elapsed().as_secs_f64();
        Ok((reason, reply, generated, decode_s, ttft_ms, interruption))
    }

    /// Reads the commands that arrived during a reply: interrupting ones end it, the others
    /// wait in order.
    fn drain_interrupts(&mut self, out: &mut Interruption) {
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Stop => {
                    out.reason.get_or_insert(DoneReason::Stopped);
                }
                Command::MemoryWarning { reason } => {
                    out.reason = Some(DoneReason::MemoryWarning);
                    out.evict = Some(reason);
                }
                Command::NewConversation => {
                    out.reason.get_or_insert(DoneReason::Stopped);
                    out.clear = true;
                }
                Command::Shutdown => {
                    out.reason.get_or_insert(DoneReason::Stopped);
                    out.shutdown = true;
                }
                other => self.deferred.push_back(other),
            }
        }
    }
}

/// The catalog's name for a known model file ("SmolLM2-135M-Instruct"), which reads
/// better than the GGUF's `general.name`.
fn display_name(path: &std::path::Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    crate::catalog::catalog().models.iter().find(|e| e.file == file).map(|e| e.name.clone())
}

/// Where the conversation is kept just before a memory-warning eviction.
pub fn before_eviction_path(state_file: &std::path::Path) -> PathBuf {
    state_file.with_extension("before-eviction.pcstate")
}

/// Metal on Apple devices when built with `metal`, CUDA with `cuda`, else the CPU.
fn pick_device() -> Device {
    #[cfg(feature = "metal")]
    if let Ok(d) = Device::new_metal(0) {
        return d;
    }
    #[cfg(feature = "cuda")]
    if let Ok(d) = Device::new_cuda(0) {
        return d;
    }
    Device::Cpu
}

fn device_label(device: &Device) -> String {
    match device {
        Device::Cpu => "CPU".into(),
        Device::Metal(_) => "Metal".into(),
        Device::Cuda(_) => "CUDA".into(),
    }
}

/// Sets the CPU kernels' thread count; `None` uses every available core.
fn set_threads(threads: Option<usize>) {
    let wanted = threads.unwrap_or_else(pool::available_cores);
    let got = pool::global().set_threads(wanted);
    if got != wanted {
        tracing::warn!("{wanted} compute threads asked for; using {got}, the cores available");
    }
}

/// candle's Metal backend leaks autoreleased objects when run outside a pool
/// (huggingface/candle#2271), so every decode step runs in one on Apple platforms.
fn with_autorelease_pool<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(target_vendor = "apple")]
    {
        objc2::rc::autoreleasepool(|_| f())
    }
    #[cfg(not(target_vendor = "apple"))]
    {
        f()
    }
}
