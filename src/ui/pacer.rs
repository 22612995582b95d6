//! Frame pacing between the engine and the UI.
//!
//! The engine emits a `Token` event per token, a hundred or more a second; a webview
//! that re-renders at each one spends more than a core on it and slows the engine down
//! in turn. [`pace`] moves the engine's events to a thread of their own that hands them
//! to the UI in batches: tokens at most one batch per frame ([`FRAME`]), other events (a
//! reply's start and end, figures, notices: a few per reply) at once. Nothing is dropped
//! or reordered, the engine never waits, and the first token after a quiet spell goes out
//! at once — also when the prefill's figures went out just before it.

use std::time::{Duration, Instant};

use futures::channel::mpsc::{unbounded, UnboundedReceiver};
use futures::{FutureExt, StreamExt};

use crate::engine::{EngineEvent, EngineEvents};

/// The UI shows the engine's events at most this often (30 Hz: smooth for text, and
/// half the webview's work of 60 Hz).
pub const FRAME: Duration = Duration::from_millis(33);

/// Decides when a batch may go out: one with tokens at most once per `frame`, others at
/// once.
#[derive(Debug, Clone)]
pub struct FramePacer {
    frame: Duration,
    last_tokens: Option<Instant>,
}

impl FramePacer {
    pub fn new(frame: Duration) -> FramePacer {
        FramePacer { frame, last_tokens: None }
    }

    /// When a batch that starts with `first`, arriving at `now`, may be shown: a token
    /// once a frame has passed since the last batch with tokens, anything else at once.
    pub fn due(&self, first: &EngineEvent, now: Instant) -> Instant {
        match self.last_tokens {
            Some(last) if is_token(first) && now < last + self.frame => last + self.frame,
            _ => now,
        }
    }

    /// A batch went out at `at`.
    pub fn flushed(&mut self, batch: &[EngineEvent], at: Instant) {
        if batch.iter().any(is_token) {
            self.last_tokens = Some(at);
        }
    }
}

/// A piece of a reply: its answer or its thinking.
fn is_token(event: &EngineEvent) -> bool {
    matches!(event, EngineEvent::Token { .. } | EngineEvent::Thinking { .. })
}

/// Forwards `events` in frame-paced batches from a thread of its own; the receiver ends
/// after the last batch once the engine's stream has ended.
pub fn pace(mut events: EngineEvents, frame: Duration) -> UnboundedReceiver<Vec<EngineEvent>> {
    let (tx, rx) = unbounded();
    let spawned = std::thread::Builder::new().name("pocketchat-ui-pacer".into()).spawn(move || {
        let mut pacer = FramePacer::new(frame);
        // Waits for the first event of a batch without spinning.
        while let Some(first) = events.recv_blocking() {
            let due = pacer.due(&first, Instant::now());
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
            pacer.flushed(&batch, Instant::now());
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
    fn tokens_go_out_once_per_frame_everything_else_at_once() {
        let frame = Duration::from_millis(33);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let token = EngineEvent::Token { text: "a".into() };
        let stats = EngineEvent::Stats(Default::default());
        let mut pacer = FramePacer::new(frame);
        // The prefill's figures, then the first token a moment later: both at once.
        assert_eq!(pacer.due(&stats, t0), t0);
        pacer.flushed(std::slice::from_ref(&stats), t0);
        assert_eq!(pacer.due(&token, ms(1)), ms(1), "the first token waits for nothing");
        pacer.flushed(std::slice::from_ref(&token), ms(1));
        assert_eq!(pacer.due(&token, ms(5)), ms(1) + frame, "the next tokens: at the frame's end");
        assert_eq!(pacer.due(&stats, ms(5)), ms(5), "the reply's end is not held back");
        let later = ms(500);
        assert_eq!(pacer.due(&token, later), later, "after a quiet spell: at once");
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
