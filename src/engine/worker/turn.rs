//! One chat turn: the prompt is planned against the budget and prefilled, then the
//! reply is sampled, streamed and fed token by token until it ends or is interrupted.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::device::with_autorelease_pool;
use super::Worker;
use crate::engine::budget::reply_reserve;
use crate::engine::sampler::Sampler;
use crate::engine::text::detokenizer::Detokenizer;
use crate::engine::text::template::Role;
use crate::engine::text::thinking::{Piece, ThinkSplitter};
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
    /// Of `generated`, the tokens of the reply's thinking.
    thinking: usize,
    decode_s: f64,
    ttft_ms: f64,
    interruption: Interruption,
}

impl Worker {
    /// Runs one turn. Returns true when the engine must shut down.
    pub(super) fn send(&mut self, text: &str) -> bool {
        self.regenerations = 0;
        self.answer(text, 0)
    }

    /// Answers `text` as a new turn that replaces the transcript's last `replaces`
    /// messages (0 for a new message, 2 for an edited one).
    fn answer(&mut self, text: &str, replaces: usize) -> bool {
        if self.loaded.is_none() {
            self.emit(EngineEvent::Failed { error: EngineError::NotReady });
            return false;
        }
        self.emit(EngineEvent::ReplyStarted { prompt: text.to_string() });
        let started = Instant::now();
        let budget = self.budget();
        let reserve = reply_reserve(budget, self.config.max_tokens);
        let l = self.loaded.as_mut().expect("checked above");
        l.session.set_budget(budget);
        let prepared = match l.session.prepare_turn(&l.model, &l.tokenizer, text, reserve) {
            Ok(p) => p,
            Err(error) => {
                self.emit(EngineEvent::Failed { error });
                self.emit_stats();
                return false;
            }
        };
        let kept = l.session.state.len() - prepared.fed_tokens;
        let reread = l.session.last_reread();
        if prepared.dropped_tokens > 0 {
            self.emit(EngineEvent::Trimmed { dropped_tokens: prepared.dropped_tokens, kept_tokens: kept });
            if reread > 0 {
                self.emit(EngineEvent::Notice { message: reread_notice(reread) });
            }
        }
        if let Some(n) = prepared.prompt_cut_to {
            self.emit(EngineEvent::Notice {
                message: format!(
                    "Your message was longer than the {budget}-token budget; only its last {n} tokens were kept."
                ),
            });
        }
        self.last_stats.drafted_tokens = prepared.drafted_tokens;
        self.reply(prepared.logits, prepared.fed_tokens - prepared.drafted_tokens, started, replaces)
    }

    /// Writes the last reply again with the next seed. Only the last prompt token is fed
    /// again (a recurrent model's last prompt); when the last turn is no longer cached, the chat store's transcript is
    /// re-read instead.
    pub(super) fn regenerate(&mut self) -> bool {
        let Some(l) = self.loaded.as_mut() else {
            self.emit(EngineEvent::Failed { error: EngineError::NotReady });
            return false;
        };
        let started = Instant::now();
        match l.session.rewind_reply(&l.model) {
            Ok(Some((logits, prompt, fed))) => {
                let replaces = self.transcript_ends_with_turn(&prompt);
                self.emit_rewound(replaces, true);
                self.emit(EngineEvent::ReplyStarted { prompt });
                self.regenerations += 1;
                self.last_stats.drafted_tokens = 0;
                self.reply(logits, fed, started, replaces)
            }
            Ok(None) => match self.reread_without_last_turn() {
                Some(prompt) => {
                    self.emit_rewound(2, true);
                    self.regenerations += 1;
                    self.answer(&prompt, 2)
                }
                None => {
                    self.emit(EngineEvent::Notice { message: "There is no reply to write again.".into() });
                    false
                }
            },
            Err(error) => {
                self.emit(EngineEvent::Failed { error });
                self.emit_stats();
                false
            }
        }
    }

    /// Replaces the last user message with `text` and answers it; only that turn is fed.
    pub(super) fn edit_last(&mut self, text: &str) -> bool {
        let Some(l) = self.loaded.as_mut() else {
            self.emit(EngineEvent::Failed { error: EngineError::NotReady });
            return false;
        };
        if text.trim().is_empty() {
            self.emit(EngineEvent::Failed { error: EngineError::EmptyPrompt });
            return false;
        }
        let replaces = match l.session.rewind_turn(&l.model) {
            Some(old) => self.transcript_ends_with_turn(&old),
            None if self.reread_without_last_turn().is_some() => 2,
            None => {
                self.emit(EngineEvent::Notice { message: "There is no message to edit.".into() });
                return false;
            }
        };
        self.emit_rewound(replaces, false);
        self.regenerations = 0;
        self.answer(text, replaces)
    }

    /// Replaces the open chat's user message `index` with `text` and answers it: the old
    /// message and what followed become another version, the cache goes back to just
    /// before that message (or, when that turn is no longer cached, the chat up to it is
    /// re-read). Without a chat store only the last message can be edited.
    pub(super) fn edit_message(&mut self, index: usize, text: &str) -> bool {
        let Some(active) = self.active.as_ref() else {
            let last = self.transcript().iter().rposition(|m| m.role == Role::User);
            if last == Some(index) {
                return self.edit_last(text);
            }
            self.emit(EngineEvent::Notice { message: "Only the last message can be edited here.".into() });
            return false;
        };
        if active.messages.get(index).is_none_or(|m| m.role != Role::User) {
            self.emit(EngineEvent::Notice { message: format!("There is no message {} of yours to edit.", index + 1) });
            return false;
        }
        let Some(l) = self.loaded.as_mut() else {
            self.emit(EngineEvent::Failed { error: EngineError::NotReady });
            return false;
        };
        if text.trim().is_empty() {
            self.emit(EngineEvent::Failed { error: EngineError::EmptyPrompt });
            return false;
        }
        let mut history = active.history();
        let system = history.len() - active.messages.len();
        // The session holds the whole transcript unless old turns were trimmed from it.
        let whole = l.session.messages() == history.as_slice();
        if !(whole && l.session.rewind_to_message(&l.model, system + index)) {
            history.truncate(system + index);
            l.session.set_history(history);
        }
        let replaces = active.messages.len() - index;
        self.emit(EngineEvent::Rewound { kept: index });
        self.regenerations = 0;
        let shutdown = self.answer(text, replaces);
        self.settle_unanswered_edit(index);
        shutdown
    }

    /// After an edit that was not answered (the turn failed before its reply): the chat
    /// is as it was, so the session is set to re-read it and the transcript is shown again.
    fn settle_unanswered_edit(&mut self, index: usize) {
        let (Some(active), Some(l)) = (self.active.as_ref(), self.loaded.as_mut()) else { return };
        let answered = active.messages.len() == index + 2 && l.session.messages().last() == active.messages.last();
        if answered {
            return;
        }
        l.session.set_history(active.history());
        let messages = active.messages.clone();
        self.emit(EngineEvent::BranchSwitched { messages, kept_tokens: 0, fed_tokens: 0, cached: false });
        self.emit_branches();
    }

    /// Decodes the reply to a prefilled prompt (`fed` tokens in `started`'s time so far)
    /// and records the turn.
    fn reply(&mut self, logits: candle_core::Tensor, fed: usize, started: Instant, replaces: usize) -> bool {
        self.last_stats.prefill_tokens = fed;
        self.last_stats.prefill_ms = started.elapsed().as_secs_f64() * 1e3;
        self.emit_stats();
        let outcome = match self.decode(logits, started) {
            Ok(outcome) => outcome,
            Err(error) => {
                self.emit(EngineEvent::Failed { error });
                self.emit_stats();
                return false;
            }
        };
        let l = self.loaded.as_mut().expect("checked above");
        l.session.finish_reply(&outcome.text);
        self.record_turn(replaces);
        self.last_stats.generated_tokens = outcome.generated;
        self.last_stats.thinking_tokens = outcome.thinking;
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
        // A new sampler per reply: a reply is the same for the same conversation and seed;
        // a regenerated one takes the next seeds.
        let mut params = self.sampling();
        params.seed = params.seed.wrapping_add(self.regenerations);
        let breakers = self.loaded.as_ref().map(|l| l.dry_breakers.clone()).unwrap_or_default();
        let mut sampler = Sampler::with_breakers(params, breakers);
        let mut detok = Detokenizer::default();
        let opened = self.loaded.as_ref().is_some_and(|l| l.session.reply_opens_thinking());
        let mut split = ThinkSplitter::new(opened);
        let mut text = String::new();
        let mut generated = 0usize;
        let mut thinking = 0usize;
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
            let was_thinking = split.is_thinking();
            if let Some(piece) = detok.push(&l.tokenizer, next)? {
                text.push_str(&piece);
                let pieces = split.push(&piece);
                self.emit_pieces(pieces);
            }
            if was_thinking || split.is_thinking() {
                thinking += 1;
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
            let pieces = split.push(&piece);
            self.emit_pieces(pieces);
        }
        let pieces = split.finish();
        self.emit_pieces(pieces);
        let decode_s = decode_start.elapsed().as_secs_f64();
        Ok(ReplyOutcome { reason, text, generated, thinking, decode_s, ttft_ms, interruption })
    }

    /// Streams a reply's pieces: the answer as `Token`s, the thinking as `Thinking`.
    fn emit_pieces(&self, pieces: Vec<Piece>) {
        for piece in pieces {
            self.emit(match piece {
                Piece::Answer(text) => EngineEvent::Token { text },
                Piece::Thinking(text) => EngineEvent::Thinking { text },
            });
        }
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
                switch @ (Command::OpenChat { .. } | Command::DeleteChat { .. }) => {
                    out.reason.get_or_insert(DoneReason::Stopped);
                    self.deferred.push_back(switch);
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

/// What a notice says when dropping old turns made the model read the rest again.
pub(super) fn reread_notice(tokens: usize) -> String {
    format!(
        "This model keeps a running state that cannot forget old turns, so the {tokens} tokens kept were read again."
    )
}
