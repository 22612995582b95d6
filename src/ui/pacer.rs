//! Frame pacing between the engine and the UI.
//!
//! The engine emits a `Token` event per token, a hundred or more a second; a webview
//! that re-renders at each one spends more than a core on it and slows the engine down
//! in turn. [`pace`] moves the engine's events to a thread of their own that hands them
//! to the UI in batches, at most one batch per frame ([`FRAME`]). Nothing is dropped or
//! reordered, the engine never waits, and the first event after a quiet spell (the first
//! token of a reply, a Stop being answered) goes out at once.

use std::time::{Duration, Instant};

use futures::channel::mpsc::{unbounded, UnboundedReceiver};
use futures::{FutureExt, StreamExt};

use crate::engine::{EngineEvent, EngineEvents};

/// The UI shows the engine's events at most this often (30 Hz: smooth for text, and
/// half the webview's work of 60 Hz).
pub const FRAME: Duration = Duration::from_millis(33);

/// Decides when a batch may go out: at most one per `frame`.
#[derive(Debug, Clone)]
pub struct FramePacer {
    frame: Duration,
    last_flush: Option<Instant>,
}

impl FramePacer {
    pub fn new(frame: Duration) -> FramePacer {
        FramePacer { frame, last_flush: None }
    }

    /// When events that arrived at `now` may be shown: at once when a frame has passed
    /// since the last batch, else when it will have.
    pub fn due(&self, now: Instant) -> Instant {
        match self.last_flush {
            Some(last) if now < last + self.frame => last + self.frame,
            _ => now,
        }
    }

    /// A batch went out at `at`.
    pub fn flushed(&mut self, at: Instant) {
        self.last_flush = Some(at);
    }
}

/// Forwards `events` in frame-paced batches from a thread of its own; the receiver ends
/// after the last batch once the engine's stream has ended.
pub fn pace(mut events: EngineEvents, frame: Duration) -> UnboundedReceiver<Vec<EngineEvent>> {
    let (tx, rx) = unbounded();
    let spawned = std::thread::Builder::new().name("pocketchat-ui-pacer".into()).spawn(move || {
        let mut pacer = FramePacer::new(frame);
        // Waits for the first event of a batch without spinning.
        while let Some(first) = events.recv_blocking() {
            let due = pacer.due(Instant::now());
            let wait = due.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            let mut batch = vec![first];
            let mut ended = false;
            loop {
                match events.next().now_or_never() {
                    Some(Some(event)) => batch.push(event),
                    Some(None) => {
                        ended = true;
                        break;
                    }
                    None => break,
                }
            }
            pacer.flushed(Instant::now());
            if tx.unbounded_send(batch).is_err() || ended {
                return;
            }
        }
    });
    if let Err(e) = spawned {
        // Without the thread the UI would never hear from the engine: say so loudly; the
        // receiver ends at once and the app shows the engine as gone.
        tracing::error!("could not start the UI pacing thread: {e}");
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_batch_goes_at_once_then_one_per_frame() {
        let frame = Duration::from_millis(33);
        let t0 = Instant::now();
        let mut pacer = FramePacer::new(frame);
        assert_eq!(pacer.due(t0), t0, "nothing shown yet: at once");
        pacer.flushed(t0);
        let t = t0 + Duration::from_millis(5);
        assert_eq!(pacer.due(t), t0 + frame, "within a frame: at its end");
        let later = t0 + Duration::from_millis(500);
        assert_eq!(pacer.due(later), later, "after a quiet spell: at once");
        pacer.flushed(later);
        assert_eq!(pacer.due(later), later + frame);
    }

    #[test]
    fn every_event_arrives_in_order_and_the_batches_end_with_the_engine() {
        use crate::engine::{Command, Engine, EngineConfig};
        // No model there: the engine reports the failed load and waits for commands.
        let (engine, events) = Engine::spawn(EngineConfig::new("/nonexistent/pocketchat-test.gguf"));
        let batches = pace(events, Duration::from_millis(20));
        engine.send(Command::NewConversation).unwrap();
        engine.send(Command::Shutdown).unwrap();
        let all: Vec<EngineEvent> = futures::executor::block_on_stream(batches).flatten().collect();
        let names: Vec<&str> = all
            .iter()
            .map(|e| match e {
                EngineEvent::Loading { .. } => "loading",
                EngineEvent::Failed { .. } => "failed",
                EngineEvent::ConversationReset => "reset",
                EngineEvent::Stats(_) => "stats",
                _ => "other",
            })
            .collect();
        assert_eq!(names, ["loading", "failed", "reset", "stats"]);
    }
}
