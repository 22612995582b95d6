//! The engine thread: one std thread owns the model, the conversation's [`State`], the
//! tokenizer and the device. Commands arrive over a channel and are handled in order (a
//! serial prompt queue); events leave as a `futures::Stream`. A running reply notices
//! `Stop`, `MemoryWarning`, `NewConversation` and `Shutdown` at the next token through
//! one atomic flag.
//!
//! - [`config`]: [`EngineConfig`], how the engine is started;
//! - [`handle`]: [`EngineHandle`] and [`EngineEvents`], the two ends callers hold;
//! - `run`: the command loop, loading, policy, eviction and stats;
//! - `turn`: one chat turn, from the prompt to the last token of the reply;
//! - `saving`: the conversation's state file (lock, save, restore);
//! - `chats`: the chat store's conversations (open, switch, rename, delete);
//! - `device`: the device and the CPU threads.
//!
//! [`State`]: crate::engine::State

mod chats;
mod config;
mod device;
mod handle;
mod run;
mod saving;
mod turn;
mod typing;

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};

use futures::channel::mpsc as fmpsc;

pub use config::{EngineConfig, HeadroomProbe, KvDtype};
pub use handle::{EngineEvents, EngineHandle};
pub use typing::TYPING_PAUSE;

use super::model::Model;
use super::persist::{self, ModelIdentity};
use super::sampler::{Breakers, SamplingParams};
use super::session::Session;
use super::text::tokenizer::TextTokenizer;
use super::{Command, EngineEvent, ModelInfo, Stats};
use crate::chats::ChatRecord;
use crate::memory::{Policy, TierReport};

pub struct Engine;

impl Engine {
    /// Starts the engine thread; loading happens there and is reported by events. The
    /// thread is detached: see [`Engine::start`] for one the caller waits for.
    pub fn spawn(config: EngineConfig) -> (EngineHandle, EngineEvents) {
        let (handle, events, _thread) = Engine::start(config);
        (handle, events)
    }

    /// [`Engine::spawn`], also returning the thread, so that a caller about to exit can
    /// let its last save finish ([`EngineThread::shutdown`]) instead of cutting it off
    /// with a temporary file left behind.
    pub fn start(config: EngineConfig) -> (EngineHandle, EngineEvents, EngineThread) {
        let (tx, rx) = mpsc::channel();
        let (etx, erx) = fmpsc::unbounded();
        let interrupt = Arc::new(AtomicBool::new(false));
        let flag = interrupt.clone();
        let thread = std::thread::Builder::new()
            .name("pocketchat-engine".into())
            .spawn(move || Worker::new(config, rx, etx, flag).run())
            .expect("spawning the engine thread");
        let handle = EngineHandle { commands: tx, interrupt };
        (handle.clone(), EngineEvents { inner: erx }, EngineThread { thread, handle })
    }
}

/// The engine thread, to be shut down and waited for.
pub struct EngineThread {
    thread: std::thread::JoinHandle<()>,
    handle: EngineHandle,
}

impl EngineThread {
    /// Sends `Shutdown` (the conversation is saved) and waits until the thread has ended.
    pub fn shutdown(self) {
        let _ = self.handle.send(Command::Shutdown);
        if self.thread.join().is_err() {
            tracing::error!("the engine thread panicked");
        }
    }
}

/// Everything that exists once a model is loaded.
struct Loaded {
    model: Model,
    tokenizer: TextTokenizer,
    session: Session,
    info: ModelInfo,
    /// The model's sampling defaults (its GGUF's, else the chat defaults).
    sampling_defaults: SamplingParams,
    /// DRY's sequence breakers as this model's tokens.
    dry_breakers: Arc<Breakers>,
    /// sha256 + size of the model file, computed on first save/restore.
    identity: Option<ModelIdentity>,
}

/// The engine thread's state; its methods live in the submodules by job.
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
    /// The open chat of the chat store (its whole transcript, the trimmed turns too).
    active: Option<ChatRecord>,
    /// Replies written again for the same prompt: each gets its own seed.
    regenerations: u64,
    /// The message being typed, while it is read ahead.
    typing: Option<typing::Typing>,
    /// The thinking switch without a chat store (`Command::SetThinking`); with one, the
    /// open chat's record holds it.
    thinking: Option<bool>,
}
