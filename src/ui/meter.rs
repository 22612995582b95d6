//! What the user sees of a reply's speed: when its first token reached the screen after
//! Send, and how fast the rest followed. The bridge feeds it the times at which it
//! applies each batch of engine events to the UI state (the webview paints that state
//! within the next frame); the settings panel's live figures and the QA status file (for
//! the end-to-end test's app-versus-CLI comparison) read it.

use std::time::Instant;

use serde::Serialize;

use crate::engine::EngineEvent;

/// The settings panel's figures during a reply, refreshed a few times a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LiveFigures {
    /// Tokens in the context, the streaming reply's included.
    pub context_tokens: usize,
    /// Tokens shown per second so far.
    pub reply_tok_s: f64,
}

/// One finished reply as the user saw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplyTiming {
    /// Token events shown.
    pub tokens: usize,
    /// From Send to the first token on screen.
    pub first_token_ms: f64,
    /// Tokens shown per second from the first token to the last one.
    pub shown_tok_s: f64,
}

/// Follows the reply being shown.
#[derive(Debug, Default)]
pub struct ReplyMeter {
    sent_at: Option<Instant>,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    tokens: usize,
}

impl ReplyMeter {
    /// The user sent a prompt at `at`.
    pub fn sent(&mut self, at: Instant) {
        *self = ReplyMeter { sent_at: Some(at), ..ReplyMeter::default() };
    }

    /// A batch of events was applied to the UI state at `at`; returns the reply's figures
    /// when the batch ends it.
    pub fn shown(&mut self, events: &[EngineEvent], at: Instant) -> Option<ReplyTiming> {
        let mut finished = None;
        for event in events {
            match event {
                EngineEvent::Token { .. } | EngineEvent::Thinking { .. } => {
                    self.tokens += 1;
                    self.first_at.get_or_insert(at);
                    self.last_at = Some(at);
                }
                EngineEvent::Done { .. } => finished = Some(self.timing()),
                _ => {}
            }
        }
        if finished.is_some() {
            *self = ReplyMeter::default();
        }
        finished
    }

    /// Tokens shown so far in the reply being streamed.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Tokens shown per second so far (0 until two batches have been shown).
    pub fn rate(&self) -> f64 {
        match (self.first_at, self.last_at) {
            (Some(first), Some(last)) if last > first => (self.tokens - 1) as f64 / (last - first).as_secs_f64(),
            _ => 0.0,
        }
    }

    fn timing(&self) -> ReplyTiming {
        let first_token_ms = match (self.sent_at, self.first_at) {
            (Some(sent), Some(first)) => (first - sent).as_secs_f64() * 1e3,
            _ => 0.0,
        };
        ReplyTiming { tokens: self.tokens, first_token_ms, shown_tok_s: self.rate() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DoneReason;
    use std::time::Duration;

    fn tokens(n: usize) -> Vec<EngineEvent> {
        (0..n).map(|i| EngineEvent::Token { text: format!("t{i}") }).collect()
    }

    #[test]
    fn a_reply_seen_in_batches() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut meter = ReplyMeter::default();
        meter.sent(t0);
        assert_eq!(meter.shown(&[EngineEvent::ReplyStarted { prompt: "q".into() }], ms(10)), None);
        assert_eq!(meter.shown(&tokens(1), ms(50)), None);
        assert_eq!(meter.rate(), 0.0);
        assert_eq!(meter.shown(&tokens(4), ms(83)), None);
        assert_eq!(meter.tokens(), 5);
        let mut last = tokens(4);
        last.push(EngineEvent::Done { reason: DoneReason::EndOfTurn });
        let timing = meter.shown(&last, ms(116)).expect("done");
        assert_eq!(timing.tokens, 9);
        assert!((timing.first_token_ms - 50.0).abs() < 1e-6);
        // 8 tokens after the first, in 66 ms.
        assert!((timing.shown_tok_s - 8.0 / 0.066).abs() < 1e-6, "{}", timing.shown_tok_s);
        assert_eq!(meter.tokens(), 0, "the next reply starts from zero");
    }
}
