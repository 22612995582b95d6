//! One chat turn: the prompt is planned against the budget and prefilled, then the
//! reply is sampled, streamed and fed token by token until it ends or is interrupted.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::device::with_autorelease_pool;
use super::Worker;
use crate::engine::budget::reply_reserve;
use crate::engine::detokenizer::Detokenizer;
use crate::engine::sampler::Sampler;
use crate::engine::{Command, DoneReason, EngineError, EngineEvent};

/// What a reply's interruption asked for, applied once the reply has ended cleanly.
#[derive(Default)]
struct Interruption {
    reason: Option<DoneReason>,
    evict: Option<String>,
    clear: bool,
    shutdown: bool,
}

/// How a reply ended and what it produced.
struct ReplyOutcome {
    reason: DoneReason,
    text: String,
    generated: usize,
    decode_s: f64,
    ttft_ms: f64,
    interruption: Interruption,
}

impl Worker {
    /// Runs one turn. Returns true when the engine must shut down.
    pub(super) fn send(&mut self, text: &str) -> bool {
        if self.loaded.is_none() {
            self.emit(EngineEvent::Failed { error: EngineError::NotReady });
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

        let outcome = match self.decode(prepared.logits, started) {
            Ok(outcome) => outcome,
            Err(error) => {
                self.emit(EngineEvent::Failed { error });
                self.emit_stats();
                return false;
            }
        };
        let l = self.loaded.as_mut().expect("checked above");
        l.session.finish_reply(&outcome.text);
        self.last_stats.generated_tokens = outcome.generated;
        self.last_stats.ttft_ms = outcome.ttft_ms;
        self.last_stats.decode_tok_s =
            if outcome.decode_s > 0.0 { outcome.generated as f64 / outcome.decode_s } else { 0.0 };
        self.emit(EngineEvent::Done { reason: outcome.reason });
        let interruption = outcome.interruption;
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
    fn decode(&mut self, mut logits: candle_core::Tensor, started: Instant) -> Result<ReplyOutcome, EngineError> {
        // A new sampler per reply: a reply is the same for the same conversation and seed.
        let mut sampler = Sampler::new(self.sampling());
        let mut detok = Detokenizer::default();
        let mut text = String::new();
        let mut generated = 0usize;
        let mut ttft_ms = 0.0;
        let mut interruption = Interruption::default();
        let decode_start = Instant::now();
        let _span = tracing::info_span!("decode").entered();
        let reason = loop {
            let l = self.loaded.as_mut().expect("decode runs with a model");
            let next = sampler.sample(&logits.to_vec1::<f32>()?, l.session.state.tokens());
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
            if let Some(piece) = detok.push(&l.tokenizer, next)? {
                text.push_str(&piece);
                self.emit(EngineEvent::Token { text: piece });
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
        if let Some(piece) = detok.flush(&l.tokenizer)? {
            text.push_str(&piece);
            self.emit(EngineEvent::Token { text: piece });
        }
        let decode_s = decode_start.elapsed().as_secs_f64();
        Ok(ReplyOutcome { reason, text, generated, decode_s, ttft_ms, interruption })
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
