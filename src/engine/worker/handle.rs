//! The two ends the engine thread hands out: [`EngineHandle`] sends commands,
//! [`EngineEvents`] streams what happened.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll};

use futures::channel::mpsc as fmpsc;
use futures::Stream;

use crate::engine::{Command, EngineError, EngineEvent};

/// Sends commands to the engine thread. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    pub(super) commands: mpsc::Sender<Command>,
    pub(super) interrupt: Arc<AtomicBool>,
}

impl EngineHandle {
    /// Queues a command; `Stop`, `MemoryWarning`, `NewConversation`, `OpenChat`,
    /// `DeleteChat` and `Shutdown` also interrupt the running reply at its next token.
    pub fn send(&self, command: Command) -> Result<(), EngineError> {
        let interrupts = matches!(
            command,
            Command::Stop
                | Command::MemoryWarning { .. }
                | Command::NewConversation
                | Command::OpenChat { .. }
                | Command::DeleteChat { .. }
                | Command::Shutdown
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
    pub(super) inner: fmpsc::UnboundedReceiver<EngineEvent>,
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
