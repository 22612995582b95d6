//! The engine thread. (API fixed; body being written.)

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll};

use futures::channel::mpsc as fmpsc;
use futures::Stream;

use super::{Command, EngineError, EngineEvent};
use crate::memory::RamTier;

/// KV cache element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
}

/// How to start the engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The GGUF to load. For the 8-bit policy the engine looks for the Q8_0 sibling.
    pub model_path: PathBuf,
    /// QA override of the detected tier (`POCKETCHAT_TIER` is read by `EngineConfig::from_env`).
    pub tier_override: Option<RamTier>,
    /// Overrides the tier's token budget (tests, soak).
    pub budget_override: Option<usize>,
    pub kv_dtype: KvDtype,
    pub temperature: f64,
    pub max_tokens: usize,
    pub seed: u64,
    /// Follow the tier policy's quantization (load/make the Q8_0 file for 8-bit tiers).
    pub follow_policy_quant: bool,
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
            seed: 299792458,
            follow_policy_quant: false,
        }
    }
}

/// Sends commands to the engine thread. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    /// Set by `Stop`/`MemoryWarning` so a running decode loop notices at the next token.
    interrupt: Arc<AtomicBool>,
}

impl EngineHandle {
    /// Queues a command. `Stop` and `MemoryWarning` also interrupt the running reply.
    pub fn send(&self, command: Command) -> Result<(), EngineError> {
        if matches!(command, Command::Stop | Command::MemoryWarning { .. } | Command::NewConversation | Command::Shutdown) {
            self.interrupt.store(true, Ordering::SeqCst);
        }
        self.commands.send(command).map_err(|_| EngineError::EngineGone)
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
    /// Blocking receive for threads that are not async (CLI, tests).
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
        let _ = (config, rx);
        let _ = etx.unbounded_send(EngineEvent::Failed { error: EngineError::Inference("engine not built yet".into()) });
        (EngineHandle { commands: tx, interrupt }, EngineEvents { inner: erx })
    }
}
