//! A conversation bound to one [`State`]: the messages, the text whose tokens the cache
//! holds, and where each turn starts, so each turn feeds only its new tokens and the
//! budget can drop whole turns.
//!
//! ```text
//!  cached text: [ system prompt ][ user 1 … assistant 1 ][ user 2 … assistant 2 ]
//!  state:       [ pinned tokens ][ turn 1               ][ turn 2               ]
//!                                ^ anchor (token, byte, message index)
//! ```
//!
//! A turn starts at its user header (e.g. `<|im_start|>user\n`), which begins with a special
//! token, so tokenizing the text piecewise at anchors gives the same ids as in one go.
//! Message texts inside it are tokenized as plain text, the template's markers with
//! special tokens ([`ChatTemplate::render_marked`]).
//!
//! A hybrid model's recurrent layers (LFM2's short convolutions, gated delta-net) cannot
//! drop their last tokens: the session checkpoints the state at every turn boundary (after
//! a prompt's prefill, after a reply, after any re-read), and every cut of the cache goes
//! back to the latest checkpoint at or before it and feeds the tokens from there again
//! ([`State::truncate`]). Regenerate, edit and a dropped draft land on a checkpoint and
//! feed nothing or the last prompt; dropping old turns (the budget, a memory warning)
//! cannot shift such a state and re-reads what is kept after them (see
//! [`Session::last_reread`]).

use super::budget::{self, Plan};
use super::model::Model;
use super::state::State;
use super::text::template::{ChatTemplate, Message, Rendered, Role};
use super::text::thinking;
use super::text::tokenizer::TextTokenizer;
use super::{Cause, EngineError, Result};
use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Anchor {
    token: usize,
    text: usize,
    message: usize,
    /// Where this turn's reply starts (token, byte in the cached text): after the prompt
    /// and the assistant header. Known for turns fed one at a time; older state files
    /// lack it.
    #[serde(default)]
    reply: Option<(usize, usize)>,
}

/// The fewest tokens fed at once when a prompt comes in pieces (typed ahead, then sent).
/// One token takes the decode kernels, whose sums round differently from the prefill's;
/// pieces of two or more give the same cache, bit for bit, as the prompt fed whole, so
/// typing ahead never changes a reply.
const MIN_FEED: usize = 2;

/// The most tokens one [`Session::draft`] call feeds: a long message pasted, or a chat's
/// history read again, goes in steps, so a command sent meanwhile waits for one step at
/// most.
pub const DRAFT_STEP: usize = 64;

/// What one [`Session::draft`] call fed, and what is left for the next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftFed {
    pub fed: usize,
    pub left: usize,
}

/// How much of a message being typed [`Session::draft`] feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftExtent {
    /// Its whole words: typing goes on.
    Words,
    /// All of it and the reply's header, keeping the logits: typing has paused.
    Whole,
}

/// The end of the cache fed from the message being typed.
#[derive(Default)]
struct Draft {
    /// Tokens after the conversation's own.
    tokens: usize,
    /// After a [`DraftExtent::Whole`] draft: the logits of its last token.
    logits: Option<candle_core::Tensor>,
}

/// Text to feed, split at turn anchors: `(byte offset in the rendered text, token ids)`.
type Pieces = Vec<(usize, Vec<u32>)>;

/// How the cache is cut when turns are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrimMode {
    /// Move the kept K/V down and re-rotate keys (no re-prefill).
    #[default]
    Shift,
    /// Reset and re-prefill the kept tokens (the simple, exact floor).
    Reprefill,
}

/// What preparing a turn did before the prompt was fed.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Tokens fed by the prefill of this turn.
    pub fed_tokens: usize,
    /// Tokens of old turns dropped to fit the budget.
    pub dropped_tokens: usize,
    /// Set when the prompt itself had to be cut (tokens kept of the user text).
    pub prompt_cut_to: Option<usize>,
    /// Of `fed_tokens`, those already in the cache from the message's draft (fed while
    /// it was typed, see [`Session::draft`]): the prefill computed only the rest.
    pub drafted_tokens: usize,
    /// Of `fed_tokens`, those of earlier turns fed again because the template renders
    /// them differently now than the cache held them (see [`Session::rebase`]: an earlier
    /// reply's thinking dropped).
    pub refed_tokens: usize,
    /// Logits after the prompt.
    pub logits: candle_core::Tensor,
}

/// What [`Session::switch_history`] kept of the cache and fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switched {
    /// Tokens of the cache kept: those before the fork.
    pub kept: usize,
    /// Tokens fed: the rest of the new branch.
    pub fed: usize,
}

/// Everything but the K/V tensors, for saving (see [`super::persist`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct SessionSnapshot {
    pub tokens: Vec<u32>,
    messages: Vec<Message>,
    cached_text: String,
    pinned_tokens: usize,
    turns: Vec<Anchor>,
    /// The first position the sliding-window layers' saved K/V hold (`State::window_base`);
    /// absent before format 5, whose files hold every position of every layer.
    #[serde(default)]
    pub window_base: usize,
}

pub struct Session {
    pub state: State,
    template: ChatTemplate,
    user_header: String,
    messages: Vec<Message>,
    cached_text: String,
    pinned_tokens: usize,
    turns: Vec<Anchor>,
    /// The end of the cache fed from the message being typed ([`Session::draft`]); not
    /// part of the conversation until `prepare_turn` takes what matches.
    draft: Draft,
    /// The messages were set by [`Session::set_history`] and their turns that cannot fit
    /// with any message were dropped (see [`Session::draft`]).
    history_fitted: bool,
    pub trim_mode: TrimMode,
    /// Tokens the last [`Session::drop_turns`] fed again because the state could not be
    /// shifted (a recurrent model's): what a notice tells the user.
    last_reread: usize,
}

impl Session {
    pub fn new(state: State, template: ChatTemplate) -> Result<Session> {
        let user_header = template.user_header()?;
        Ok(Session {
            state,
            template,
            user_header,
            messages: Vec::new(),
            cached_text: String::new(),
            pinned_tokens: 0,
            turns: Vec::new(),
            draft: Draft::default(),
            history_fitted: false,
            trim_mode: TrimMode::default(),
            last_reread: 0,
        })
    }

    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Tokens the last drop of old turns fed again: a recurrent state cannot be shifted,
    /// so what followed the dropped turns was read again (0 for a plain transformer,
    /// whose K/V move down).
    pub fn last_reread(&self) -> usize {
        self.last_reread
    }

    /// How dropped turns leave the cache: a recurrent state is always rebuilt.
    fn cut_mode(&self) -> TrimMode {
        if self.state.is_recurrent() {
            TrimMode::Reprefill
        } else {
            self.trim_mode
        }
    }

    /// Cuts the cache to its first `n` tokens. A recurrent state goes back to its latest
    /// checkpoint at or before `n`, and the tokens from there to `n` are fed again (in one
    /// call, as a prompt is); returns how many were. On an error the session is set to
    /// re-read its conversation.
    fn cut_cache(&mut self, model: &Model, n: usize) -> Result<usize> {
        let tokens = self.state.tokens()[..n.min(self.state.len())].to_vec();
        let kept = self.state.truncate(n);
        if kept >= tokens.len() {
            return Ok(0);
        }
        let _span = tracing::info_span!("refeed", tokens = tokens.len() - kept, from = kept).entered();
        match model.forward(&tokens[kept..], &mut self.state) {
            Ok(_) => Ok(tokens.len() - kept),
            Err(e) => {
                let messages = std::mem::take(&mut self.messages);
                self.set_history(messages);
                Err(e)
            }
        }
    }

    /// Tokens of the conversation in the cache (without a draft).
    pub fn len(&self) -> usize {
        self.state.len() - self.draft.tokens
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token length of each cached turn, oldest first.
    pub fn turn_lengths(&self) -> Vec<usize> {
        let ends = self.turns.iter().skip(1).map(|a| a.token).chain(std::iter::once(self.len()));
        self.turns.iter().zip(ends).map(|(a, end)| end - a.token).collect()
    }

    /// The conversation for saving; a draft must have been dropped first (it is not part
    /// of the conversation, and the K/V saved beside this are the whole cache's).
    pub(crate) fn snapshot(&self) -> SessionSnapshot {
        debug_assert_eq!(self.draft.tokens, 0, "a draft is never saved");
        SessionSnapshot {
            tokens: self.state.tokens().to_vec(),
            messages: self.messages.clone(),
            cached_text: self.cached_text.clone(),
            pinned_tokens: self.pinned_tokens,
            turns: self.turns.clone(),
            window_base: self.state.window_base(),
        }
    }

    /// Puts a saved conversation back, K/V included: no re-prefill. `check_snapshot`
    /// first; then the conversation is cleared, `fill` writes the saved K/V into the
    /// state one layer at a time (`State::import_layer`, never a second copy of the whole
    /// cache), and the snapshot's text and turns take its place. If `fill` fails, the
    /// session is left empty.
    pub(crate) fn restore<E>(
        &mut self,
        snap: SessionSnapshot,
        fill: impl FnOnce(&mut State) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E>
    where
        E: From<EngineError>,
    {
        self.check_snapshot(&snap)?;
        self.clear();
        self.state.begin_import(snap.tokens.len(), snap.window_base)?;
        if let Err(e) = fill(&mut self.state) {
            self.clear();
            return Err(e);
        }
        self.state.finish_import(snap.tokens);
        self.state.checkpoint();
        self.messages = snap.messages;
        self.cached_text = snap.cached_text;
        self.pinned_tokens = snap.pinned_tokens;
        self.turns = snap.turns;
        Ok(())
    }

    /// Whether a saved conversation's bookkeeping is consistent with itself and with
    /// this model's vocabulary.
    fn check_snapshot(&self, snap: &SessionSnapshot) -> Result<()> {
        let consistent = snap.pinned_tokens <= snap.tokens.len()
            && snap.turns.iter().all(|a| {
                a.token <= snap.tokens.len() && a.text <= snap.cached_text.len() && a.message <= snap.messages.len()
            })
            && snap.turns.iter().all(|a| snap.cached_text.is_char_boundary(a.text))
            && snap.turns.iter().filter_map(|a| a.reply).all(|(token, text)| {
                token <= snap.tokens.len() && text <= snap.cached_text.len() && snap.cached_text.is_char_boundary(text)
            })
            && snap.turns.first().is_none_or(|a| snap.pinned_tokens <= a.token)
            && self.state.can_import(snap.tokens.len(), snap.window_base)
            && snap
                .turns
                .windows(2)
                .all(|w| w[0].token < w[1].token && w[0].text < w[1].text && w[0].message < w[1].message);
        if !consistent {
            return Err(EngineError::Inference(Cause::msg("inconsistent turn bookkeeping")));
        }
        if let Some(id) = snap.tokens.iter().find(|&&id| id as usize >= self.state.vocab_size()) {
            return Err(EngineError::Inference(Cause::msg(format!("token id {id} is outside the vocabulary"))));
        }
        Ok(())
    }

    /// Forgets the conversation; the K/V buffers stay allocated.
    pub fn clear(&mut self) {
        self.clear_cache();
        self.messages.clear();
        self.cached_text.clear();
        self.pinned_tokens = 0;
        self.turns.clear();
        self.history_fitted = false;
    }

    /// Adds the user's message and prefills its tokens, dropping old turns first when the
    /// budget requires it. `reserve` tokens are kept free for the reply.
    pub fn prepare_turn(
        &mut self,
        model: &Model,
        tok: &TextTokenizer,
        user_text: &str,
        reserve: usize,
    ) -> Result<Prepared> {
        if user_text.trim().is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let (mut dropped_tokens, mut prompt_cut_to) = (0, None);
        let budget = self.state.max_tokens();
        // A message far over the budget (a paste) is tokenized only as far as its end can
        // be fed; it is then cut like any over-long message.
        let mut user_text = tail_over(tok, user_text, budget.saturating_sub(reserve))?.to_string();
        // History read again from its text (a resumed chat without its cache) keeps its
        // newest turns that fit, never losing the new message for them.
        let mut fitted = false;
        let mut refed_tokens = 0;
        if self.is_empty() {
            self.fit_history(tok, &user_text, reserve)?;
            fitted = true;
        } else {
            refed_tokens = self.rebase(model, tok, &user_text)?;
        }
        let mut cuts = 0;
        while cuts < 3 {
            let (pieces, from_scratch, rendered) = self.pieces_for(tok, &user_text)?;
            let new_tokens: usize = pieces.iter().map(|(_, ids)| ids.len()).sum();
            let (pinned, turns) = if from_scratch {
                (pieces.first().map(|(_, ids)| ids.len()).unwrap_or(0), Vec::new())
            } else {
                (self.pinned_tokens, self.turn_lengths())
            };
            let plan =
                budget::plan(pinned, &turns, new_tokens - if from_scratch { pinned } else { 0 }, reserve, budget);
            // A cache the new render does not continue is read again from its text too.
            if from_scratch && plan != Plan::Fits && !fitted {
                self.fit_history(tok, &user_text, reserve)?;
                fitted = true;
                continue;
            }
            cuts += 1;
            match plan {
                Plan::Fits => {
                    let header = self.reply_header_end(tok, &user_text, &rendered, &pieces)?;
                    let (logits, drafted_tokens) =
                        self.feed(model, &user_text, rendered.text, pieces, header, from_scratch)?;
                    return Ok(Prepared {
                        fed_tokens: new_tokens + refed_tokens,
                        dropped_tokens,
                        prompt_cut_to,
                        drafted_tokens,
                        refed_tokens,
                        logits,
                    });
                }
                Plan::DropTurns { turns, tokens } => {
                    self.drop_turns(model, turns)?;
                    dropped_tokens += tokens;
                }
                Plan::CutPrompt { turns, tokens, keep_prompt_tokens } => {
                    if turns > 0 {
                        self.drop_turns(model, turns)?;
                        dropped_tokens += tokens;
                    }
                    // Keep the end of the message; leave room for the template's own tokens.
                    let ids = tok.encode_text(&user_text)?;
                    let overhead = new_tokens.saturating_sub(ids.len()) + 8;
                    let keep = keep_prompt_tokens.saturating_sub(overhead);
                    if keep == 0 {
                        // Every turn is gone: what leaves no room is the system prompt (with
                        // its template markers), when the chat has one.
                        if self.messages.first().is_some_and(|m| m.role == Role::System) {
                            let tokens =
                                if from_scratch { new_tokens } else { pinned + new_tokens }.saturating_sub(ids.len());
                            return Err(EngineError::SystemPromptTooLong { tokens, reserve, budget });
                        }
                        return Err(EngineError::ContextFull { budget });
                    }
                    user_text = tok.decode(&ids[ids.len().saturating_sub(keep)..])?;
                    prompt_cut_to = Some(keep);
                }
            }
        }
        Err(EngineError::ContextFull { budget })
    }

    /// Makes the cache hold the conversation as it renders now, when that is not what it
    /// holds: a template that drops an earlier reply's thinking (Qwen3's, Qwen3.5's), or
    /// one whose generation prompt (`<think>\n\n</think>` with thinking off) is not how it
    /// renders the finished reply. The cache is cut back to the last point both share, a
    /// reply's start or else a turn's start (or a message text in it), and the history
    /// after it is fed as it renders
    /// now with `user_text` as the next message (whose own turn is left to the caller).
    /// Usually that is the last reply's answer: the thinking it no longer shows leaves the
    /// cache. A recurrent state goes back to its checkpoint at or before the cut (the
    /// reply's header, see [`Session::reply_header_end`]) and feeds what follows it again.
    /// Returns the tokens fed; 0 when the cache is continued as it is, or when no such
    /// point is cached or the history does not fit the budget (the caller then reads the
    /// conversation again from its text).
    fn rebase(&mut self, model: &Model, tok: &TextTokenizer, user_text: &str) -> Result<usize> {
        let (rendered, from_scratch) = self.render_with(user_text)?;
        if !from_scratch {
            return Ok(0);
        }
        let shared = common_prefix(&rendered.text, &self.cached_text);
        // (turns kept, token, text byte)
        let points = self.turns.iter().enumerate().flat_map(|(i, a)| {
            std::iter::once((i, a.token, a.text)).chain(a.reply.map(|(token, text)| (i + 1, token, text)))
        });
        let Some((mut kept_turns, mut kept, mut text_at)) =
            points.filter(|&(_, token, text)| text <= shared && token <= self.len()).max_by_key(|&(_, _, text)| text)
        else {
            return Ok(0);
        };
        // Cut at a turn's start, the turn may still be kept up to a message text of it
        // (Qwen3 with thinking off: its reply's answer, after the generation prompt's empty
        // `<think></think>` that the finished reply's render lacks), when the cached
        // tokens up to there are the new render's own.
        let mut inside_turn = false;
        let turn_start = self.turns.get(kept_turns).is_some_and(|a| a.text == text_at);
        if let Some(body) = rendered.bodies.iter().map(|b| b.start).filter(|&b| text_at < b && b <= shared).max() {
            let ids = tok.encode_rendered(&rendered.text, text_at..body, &rendered.bodies)?;
            if turn_start && self.state.tokens().get(kept..kept + ids.len()) == Some(ids.as_slice()) {
                (kept_turns, kept, text_at, inside_turn) = (kept_turns + 1, kept + ids.len(), body, true);
            }
        }
        let ranges = self.piece_ranges(&rendered, text_at, rendered.text.len());
        // The last piece is the new message's turn.
        let Some((_, history)) = ranges.split_last() else { return Ok(0) };
        let user_indices: Vec<usize> =
            self.messages.iter().enumerate().filter(|(_, m)| m.role == Role::User).map(|(i, _)| i).collect();
        let refed_turns = history.len().saturating_sub(1);
        let Some(first_refed) = user_indices.len().checked_sub(refed_turns) else { return Ok(0) };
        let mut ids = Vec::new();
        let mut anchors = Vec::new();
        for (i, range) in history.iter().enumerate() {
            if i > 0 {
                let message = user_indices[first_refed + i - 1];
                anchors.push(Anchor { token: kept + ids.len(), text: range.start, message, reply: None });
            }
            ids.extend(tok.encode_rendered(&rendered.text, range.clone(), &rendered.bodies)?);
        }
        // Room for the reply and the new message is the caller's to make (by dropping old
        // turns, which this feed makes possible for a cache over its budget).
        if kept + ids.len() > self.state.max_tokens() {
            return Ok(0);
        }
        let _span = tracing::info_span!("rebase", kept, fed = ids.len()).entered();
        self.discard_draft();
        let refed = self.cut_cache(model, kept)?;
        self.turns.truncate(kept_turns);
        if inside_turn {
            // Where its reply starts is not known any more.
            if let Some(a) = self.turns.last_mut() {
                a.reply = None;
            }
        }
        if !ids.is_empty() {
            if let Err(e) = model.forward(&ids, &mut self.state) {
                self.set_history(self.messages.clone());
                return Err(e);
            }
        }
        // The new turn starts here: an edit of its message comes back to this point.
        self.state.checkpoint();
        self.turns.extend(anchors);
        let end = history.last().map_or(text_at, |r| r.end);
        self.cached_text = rendered.text[..end].to_string();
        Ok(refed + ids.len())
    }

    /// The text to feed for a new user message, split at turn anchors and tokenized:
    /// `(byte offset in the rendered text, ids)`. The first piece belongs to the previous
    /// turn (or is the system prompt when starting from scratch). Also says whether the
    /// cache starts from scratch, and returns the whole rendered conversation.
    fn pieces_for(&self, tok: &TextTokenizer, user_text: &str) -> Result<(Pieces, bool, Rendered)> {
        let (rendered, from_scratch) = self.render_with(user_text)?;
        let pieces = self.pieces_between(tok, &rendered, from_scratch, rendered.text.len())?;
        Ok((pieces, from_scratch, rendered))
    }

    /// Where a recurrent state wants a checkpoint inside the new turn: the end of the
    /// reply's header, when the generation prompt goes on past what the finished reply
    /// will render (Qwen3.5's `<|im_start|>assistant\n` then `<think>\n\n</think>\n\n`
    /// with thinking off, `<think>\n` with it on; once another message follows, the reply
    /// renders as its answer alone). The next turn cuts the cache back there
    /// ([`Session::rebase`]) and feeds only the reply again, not this prompt too.
    ///
    /// Found by rendering the conversation as it will be a turn later (a reply, then
    /// another message) and comparing. Returns the count of the new tokens (all of
    /// `pieces`) before that point; `None` for a plain transformer (a K/V cache cuts
    /// anywhere), when the whole prompt lasts, or when the two sides of the point would
    /// not tokenize as the prompt does or would leave fewer than [`MIN_FEED`] tokens.
    fn reply_header_end(
        &self,
        tok: &TextTokenizer,
        user_text: &str,
        rendered: &Rendered,
        pieces: &Pieces,
    ) -> Result<Option<usize>> {
        let Some(((start, turn), earlier)) = pieces.split_last() else { return Ok(None) };
        if !self.state.is_recurrent() {
            return Ok(None);
        }
        let mut later = self.messages.clone();
        later.push(Message::new(Role::User, user_text));
        later.push(Message::new(Role::Assistant, "a reply"));
        later.push(Message::new(Role::User, "a message"));
        // A template that refuses this shape of conversation gets no such checkpoint.
        let Ok(later) = self.template.render_marked(&later, true) else { return Ok(None) };
        let at = common_prefix(&rendered.text, &later.text);
        if at <= *start || at >= rendered.text.len() {
            return Ok(None);
        }
        let head = tok.encode_rendered(&rendered.text, *start..at, &rendered.bodies)?;
        let tail = tok.encode_rendered(&rendered.text, at..rendered.text.len(), &rendered.bodies)?;
        let splits_cleanly = head.len() + tail.len() == turn.len() && turn.starts_with(&head) && turn.ends_with(&tail);
        if !splits_cleanly || head.len() < MIN_FEED || tail.len() < MIN_FEED {
            return Ok(None);
        }
        Ok(Some(earlier.iter().map(|(_, ids)| ids.len()).sum::<usize>() + head.len()))
    }

    /// The conversation rendered with `user_text` as the next message, ready for the
    /// reply; and whether its tokens start from scratch (the cache holds none of it).
    fn render_with(&self, user_text: &str) -> Result<(Rendered, bool)> {
        let mut messages = self.messages.clone();
        messages.push(Message::new(Role::User, user_text));
        let rendered = self.template.render_marked(&messages, true)?;
        let from_scratch = self.is_empty() || !rendered.text.starts_with(&self.cached_text);
        Ok((rendered, from_scratch))
    }

    /// The pieces of `rendered` not yet in the cache, up to byte `end`.
    fn pieces_between(
        &self,
        tok: &TextTokenizer,
        rendered: &Rendered,
        from_scratch: bool,
        end: usize,
    ) -> Result<Pieces> {
        let from = if from_scratch { 0 } else { self.cached_text.len() };
        self.piece_ranges(rendered, from, end)
            .into_iter()
            .map(|r| Ok((r.start, tok.encode_rendered(&rendered.text, r, &rendered.bodies)?)))
            .collect()
    }

    /// The byte ranges of `rendered.text[from..end]`'s pieces: cut before every user header
    /// (the template's, not one typed in a message). The first piece (possibly empty)
    /// closes the previous turn, or is the system prompt when starting from scratch.
    fn piece_ranges(&self, rendered: &Rendered, from: usize, end: usize) -> Vec<Range<usize>> {
        let full = &rendered.text[..end];
        let mut cuts = vec![from];
        let mut search = from;
        while let Some(i) = full[search..].find(&self.user_header) {
            let at = search + i;
            if !rendered.bodies.iter().any(|b| b.contains(&at)) {
                cuts.push(at);
            }
            search = at + self.user_header.len();
        }
        (0..cuts.len()).map(|i| cuts[i]..cuts.get(i + 1).copied().unwrap_or(end)).collect()
    }

    /// Drops the oldest turns of a history about to be read again from its text (the
    /// cache holds none of it) that do not fit the budget with `user_text` as the next
    /// message and `reserve` tokens kept for the reply; as many of the newest turns as fit
    /// stay.
    ///
    /// Turns are counted from the newest end: the newest 1, 2, 4, … turns are rendered
    /// (after the system prompt, before the new message) until they overflow, and each
    /// render's pieces are tokenized newest first only until the budget is passed. The
    /// overflowing render says how many of its turns fit; that count is confirmed with a
    /// render of it and of one more (or searched by halves, for a template that renders a
    /// turn differently when fewer precede it). No render holds much more than twice what
    /// fits, so the work follows the budget, not the length of the history: the whole
    /// history is never rendered nor tokenized.
    fn fit_history(&mut self, tok: &TextTokenizer, user_text: &str, reserve: usize) -> Result<()> {
        let starts = turn_starts(&self.messages);
        let total = starts.len();
        let Some(&head) = starts.first() else { return Ok(()) };
        let _span = tracing::info_span!("fit_history", turns = total).entered();
        // `lo` newest turns fit; `hi` do not.
        let (mut lo, mut hi, mut guess) = (0, total + 1, None);
        let mut next = 1;
        loop {
            let k = next.min(total);
            next = k * 2;
            match self.newest_overflow(tok, &starts, k, user_text, reserve)? {
                None if k == total => {
                    lo = k;
                    break;
                }
                None => lo = k,
                Some(overflow) => {
                    hi = k;
                    guess = Some(k.saturating_sub(overflow));
                    break;
                }
            }
        }
        let mut probe = guess;
        while hi - lo > 1 {
            let k = probe.take().filter(|&g| lo < g && g < hi).unwrap_or(lo + (hi - lo) / 2);
            if self.newest_overflow(tok, &starts, k, user_text, reserve)?.is_none() {
                lo = k;
                // The guess fits: one more must not.
                if guess == Some(k) {
                    probe = Some(k + 1);
                }
            } else {
                hi = k;
            }
        }
        let keep_from = starts.get(total - lo).copied().unwrap_or(self.messages.len());
        self.messages.drain(head..keep_from);
        Ok(())
    }

    /// Renders the messages before the first turn (the system prompt), the newest `k`
    /// turns (`starts` are where the turns begin) and `user_text` as the next message, and
    /// says how many of the rendered turns' pieces must go for it to fit with `reserve`
    /// tokens kept free: `None` when it fits. Pieces are tokenized newest first and only
    /// until the budget is passed.
    fn newest_overflow(
        &self,
        tok: &TextTokenizer,
        starts: &[usize],
        k: usize,
        user_text: &str,
        reserve: usize,
    ) -> Result<Option<usize>> {
        let mut messages = self.messages[..starts[0]].to_vec();
        if k > 0 {
            messages.extend_from_slice(&self.messages[starts[starts.len() - k]..]);
        }
        messages.push(Message::new(Role::User, user_text));
        let rendered = self.template.render_marked(&messages, true)?;
        let ranges = self.piece_ranges(&rendered, 0, rendered.text.len());
        let tokens =
            |r: &Range<usize>| tok.encode_rendered(&rendered.text, r.clone(), &rendered.bodies).map(|t| t.len());
        let budget = self.state.max_tokens();
        let turns = ranges.len().saturating_sub(2);
        // The system prompt and the new message stay whatever happens.
        let mut used = reserve + tokens(&ranges[0])?;
        if let [_, .., last] = ranges.as_slice() {
            used += tokens(last)?;
        }
        if used > budget {
            return Ok(Some(turns));
        }
        for (i, range) in ranges[1..ranges.len().max(2) - 1].iter().enumerate().rev() {
            // A message far over what is left (an old paste) is not tokenized whole.
            let room = budget - used;
            let overlong = |b: &&Range<usize>| b.start >= range.start && b.end <= range.end && b.len() > room;
            for body in rendered.bodies.iter().filter(overlong) {
                let text = &rendered.text[body.clone()];
                if tail_over(tok, text, room)?.len() < text.len() {
                    return Ok(Some(i + 1));
                }
            }
            used += tokens(range)?;
            if used > budget {
                return Ok(Some(i + 1));
            }
        }
        Ok(None)
    }

    /// Feeds the new turn's pieces; tokens of a draft that match them are kept, not fed
    /// again. A recurrent state is checkpointed after the first `header` of them too (see
    /// [`Session::reply_header_end`]). Returns the logits and how many tokens the draft
    /// supplied.
    fn feed(
        &mut self,
        model: &Model,
        user_text: &str,
        full: String,
        pieces: Pieces,
        header: Option<usize>,
        from_scratch: bool,
    ) -> Result<(candle_core::Tensor, usize)> {
        let mut messages = self.messages.clone();
        messages.push(Message::new(Role::User, user_text));
        if from_scratch {
            if !self.is_empty() {
                // The conversation is read again from its text: nothing cached carries over.
                self.clear_cache();
            }
            self.turns.clear();
            self.pinned_tokens = pieces.first().map(|(_, ids)| ids.len()).unwrap_or(0);
        }
        let mut ids = Vec::new();
        let base = self.len();
        let user_indices: Vec<usize> =
            messages.iter().enumerate().filter(|(_, m)| m.role == Role::User).map(|(i, _)| i).collect();
        // Anchors of the turns this feed starts: all pieces after the first.
        let new_turns = pieces.len().saturating_sub(1);
        let first_new_user = user_indices.len().saturating_sub(new_turns);
        for (i, (text_at, piece)) in pieces.into_iter().enumerate() {
            if i > 0 {
                let message = user_indices.get(first_new_user + i - 1).copied().unwrap_or(messages.len() - 1);
                self.turns.push(Anchor { token: base + ids.len(), text: text_at, message, reply: None });
            }
            ids.extend(piece);
        }
        let (logits, drafted) = match self.whole_draft_logits(base, &ids) {
            Some(logits) => (logits, ids.len()),
            None => {
                let drafted = self.keep_draft(model, base, &ids, true)?;
                let _span = tracing::info_span!("prefill", tokens = ids.len() - drafted, drafted, pos = base).entered();
                match self.prefill(model, &ids, drafted, header) {
                    Ok(logits) => (logits, drafted),
                    Err(e) => {
                        // Nothing half-done stays behind: the cache goes back to before this turn
                        // (or to nothing, read again, where the window before it is gone).
                        self.turns.retain(|a| a.token < base);
                        self.drop_after(base);
                        return Err(e);
                    }
                }
            }
        };
        self.messages = messages;
        // The reply starts here: regenerate comes back to this point.
        self.state.checkpoint();
        if let Some(last) = self.turns.last_mut() {
            last.reply = Some((self.state.len(), full.len()));
        }
        self.cached_text = full;
        Ok((logits, drafted))
    }

    /// Feeds `ids[from..]` and returns the last logits; when `header` falls inside (with
    /// at least [`MIN_FEED`] tokens on its side), in two calls with a checkpoint between.
    fn prefill(
        &mut self,
        model: &Model,
        ids: &[u32],
        from: usize,
        header: Option<usize>,
    ) -> Result<candle_core::Tensor> {
        if let Some(at) = header.filter(|&at| at >= from + MIN_FEED && at < ids.len()) {
            model.forward(&ids[from..at], &mut self.state)?;
            self.state.checkpoint();
            return model.forward(&ids[at..], &mut self.state);
        }
        model.forward(&ids[from..], &mut self.state)
    }

    /// Keeps the draft (the tokens after `base`) as far as it matches `ids`, and drops
    /// the rest of it; returns the count kept. What is left of `ids` to feed is at least
    /// [`MIN_FEED`] tokens, or none when the draft holds them all and no logits are
    /// `wanted`.
    ///
    /// A recurrent state cannot give back part of a draft (it would go back to the
    /// checkpoint at the conversation's end and read the whole draft again at each word),
    /// so a draft that `ids` continue is kept whole even when one token is left to feed;
    /// one that differs goes back to that checkpoint.
    ///
    /// A draft longer than the sliding-window layers' slack may have moved their window
    /// past the conversation's end: the conversation is then fed again up to `base`.
    fn keep_draft(&mut self, model: &Model, base: usize, ids: &[u32], wanted: bool) -> Result<usize> {
        let draft = &self.state.tokens()[base..];
        let same = draft.iter().zip(ids).take_while(|(a, b)| a == b).count();
        let continued = self.state.is_recurrent() && same == draft.len() && (same < ids.len() || !wanted);
        let keep = if (same == ids.len() && !wanted) || continued {
            same
        } else {
            same.min(ids.len().saturating_sub(MIN_FEED))
        };
        let tokens = self.state.tokens()[..base].to_vec();
        let kept = self.state.truncate(base + keep);
        self.draft = Draft::default();
        if kept < base {
            let _span = tracing::info_span!("refeed", tokens = base - kept, from = kept).entered();
            if let Err(e) = model.forward(&tokens[kept..], &mut self.state) {
                self.set_history(self.messages.clone());
                return Err(e);
            }
        }
        Ok(kept.saturating_sub(base))
    }

    /// The logits of a whole-prompt draft that is exactly `ids` (the tokens after
    /// `base`), which then becomes part of the conversation; `None` otherwise.
    fn whole_draft_logits(&mut self, base: usize, ids: &[u32]) -> Option<candle_core::Tensor> {
        let logits = self.draft.logits.take()?;
        (self.state.tokens()[base..] == *ids).then(|| {
            self.draft = Draft::default();
            logits
        })
    }

    /// Drops the cache's tokens after `base` (the conversation's end); where the state
    /// cannot go back there (see [`State::truncate`]) the conversation is set to be read
    /// again.
    fn drop_after(&mut self, base: usize) {
        if self.state.truncate(base) < base {
            self.set_history(self.messages.clone());
        }
    }

    /// Empties the cache (the conversation's text stays).
    fn clear_cache(&mut self) {
        self.state.reset();
        self.draft = Draft::default();
    }

    /// Feeds the message being typed ahead of its Send, so that Send prefills only what
    /// changed since, or nothing. `typed` is trimmed, as the composer sends it; fed are
    /// its words up to the last whitespace while typing goes on ([`DraftExtent::Words`]:
    /// a word still being typed may yet tokenize differently), or all of it with the
    /// reply's header once typing pauses ([`DraftExtent::Whole`]: its logits are kept,
    /// and a Send of exactly that text feeds nothing). A new conversation's system prompt
    /// and the template's user header come first. Each call feeds only the tokens that
    /// differ from the draft already cached, at most [`DRAFT_STEP`] of them: call again
    /// while some are `left`. The draft fits the budget with `reserve` tokens to spare or
    /// is not fed; [`Session::discard_draft`] drops it, and every other change of the
    /// conversation does so first.
    pub fn draft(
        &mut self,
        model: &Model,
        tok: &TextTokenizer,
        typed: &str,
        extent: DraftExtent,
        reserve: usize,
    ) -> Result<DraftFed> {
        let typed = typed.trim();
        if typed.is_empty() {
            self.discard_draft();
            return Ok(DraftFed::default());
        }
        // A paste over the budget is not read ahead (Send keeps its end), nor tokenized whole.
        if tail_over(tok, typed, self.state.max_tokens().saturating_sub(reserve))?.len() < typed.len() {
            self.discard_draft();
            return Ok(DraftFed::default());
        }
        // A history to read again first loses the turns that cannot fit with any message
        // (those fit with an empty one), so each step renders only what may be fed.
        if self.is_empty() && !self.history_fitted {
            self.fit_history(tok, "", reserve)?;
            self.history_fitted = true;
        }
        let (mut rendered, mut from_scratch) = self.render_with(typed)?;
        if from_scratch && !self.is_empty() && self.draft.tokens == 0 {
            // A history the template renders differently now is fed again first (it is
            // part of the conversation, not of the draft): Send then has only its turn.
            self.rebase(model, tok, typed)?;
            (rendered, from_scratch) = self.render_with(typed)?;
        }
        // A cache the new render still does not continue (no point both share is cached,
        // or the history would not fit) is read again at Send. An empty cache (a new chat,
        // or a history to read again) or a continued one drafts.
        if from_scratch && !self.is_empty() {
            return Ok(DraftFed::default());
        }
        let Some(body) = rendered.bodies.last() else { return Ok(DraftFed::default()) };
        let end = match extent {
            DraftExtent::Words => {
                body.start + typed.rfind(char::is_whitespace).map_or(0, |at| typed[..at].trim_end().len())
            }
            DraftExtent::Whole => rendered.text.len(),
        };
        let pieces = self.pieces_between(tok, &rendered, from_scratch, end)?;
        let ids: Vec<u32> = pieces.into_iter().flat_map(|(_, ids)| ids).collect();
        let base = self.len();
        if base + ids.len() + reserve > self.state.max_tokens() {
            self.discard_draft();
            return Ok(DraftFed::default());
        }
        let whole = extent == DraftExtent::Whole;
        if whole && self.draft.logits.is_some() && self.state.tokens()[base..] == ids[..] {
            return Ok(DraftFed::default());
        }
        let kept = self.keep_draft(model, base, &ids, whole)?;
        // One step, never leaving a single token for the next.
        let mut until = ids.len().min(kept + DRAFT_STEP);
        if ids.len() - until < MIN_FEED {
            until = ids.len();
        }
        // A draft never moves the sliding-window layers' window: an edit of it could not
        // go back to the conversation's end without reading it all again. What would is
        // left to Send.
        let room = self.state.room_before_window_moves();
        let capped = until - kept > room;
        if capped {
            until = kept + room;
        }
        let mut logits = None;
        if kept < until {
            let _span = tracing::info_span!("draft", tokens = until - kept, pos = base + kept, whole).entered();
            match model.forward(&ids[kept..until], &mut self.state) {
                Ok(l) => logits = Some(l),
                Err(e) => {
                    self.drop_after(base);
                    return Err(e);
                }
            }
        }
        let done = until == ids.len();
        self.draft = Draft { tokens: self.state.len() - base, logits: logits.filter(|_| whole && done) };
        let left = if capped { 0 } else { ids.len() - until };
        Ok(DraftFed { fed: until - kept, left })
    }

    /// Sets the token budget; a draft that does not fit under it is dropped.
    pub fn set_budget(&mut self, budget: usize) {
        if self.state.len() > budget {
            self.discard_draft();
        }
        self.state.set_max_tokens(budget);
    }

    /// Drops the draft from the cache (see [`Session::draft`]).
    pub fn discard_draft(&mut self) {
        let len = self.len();
        let kept = self.state.truncate(len);
        self.draft = Draft::default();
        if kept < len {
            // No checkpoint at the conversation's end (never so after a turn): read it
            // again rather than keep a state that is not the conversation's.
            let messages = std::mem::take(&mut self.messages);
            self.set_history(messages);
        }
    }

    /// Records the reply whose tokens were just fed to the model, as it was written: the
    /// cache holds it whole, the message its answer and thinking apart (see
    /// [`thinking::split_reply`]).
    pub fn finish_reply(&mut self, reply_text: &str) {
        let (thought, answer) = thinking::split_reply(reply_text, self.reply_opens_thinking());
        self.cached_text.push_str(reply_text);
        self.messages.push(Message::new(Role::Assistant, answer).with_thinking(thought));
        // The next turn (or a draft, or an edit of it) starts here.
        self.state.checkpoint();
    }

    /// Whether the prompt the next reply answers left the thinking open (Qwen3.5's
    /// generation prompt ends in `<think>\n`): the reply then starts inside it. Read from
    /// the cached text of the last turn after its user message, before the reply is added.
    pub fn reply_opens_thinking(&self) -> bool {
        let Some(a) = self.turns.last() else { return false };
        let Some(turn) = self.cached_text.get(a.text..) else { return false };
        let user = self.messages.get(a.message).map_or("", |m| m.content.trim());
        let tail = turn.rfind(user).map_or(turn, |at| &turn[at + user.len()..]);
        thinking::prompt_opens_thinking(tail)
    }

    /// Sets the template's `enable_thinking` (`None`: the template's default) for the
    /// turns to come. The cache is kept as far as the conversation renders the same (for
    /// Qwen3 only the generation prompt changes; SmolLM3's system prompt changes with it,
    /// so its chat is read again).
    pub fn set_enable_thinking(&mut self, enabled: Option<bool>) {
        if self.template.enable_thinking() != enabled {
            self.discard_draft();
            self.template.set_enable_thinking(enabled);
        }
    }

    /// Drops the `count` oldest turns from the cache, the text and the messages.
    pub fn drop_turns(&mut self, model: &Model, count: usize) -> Result<usize> {
        self.discard_draft();
        self.last_reread = 0;
        let count = count.min(self.turns.len());
        if count == 0 {
            return Ok(0);
        }
        let _span = tracing::info_span!("trim", turns = count).entered();
        let first = self.turns[0];
        let (end_tok, end_txt, end_msg) = match self.turns.get(count) {
            Some(a) => (a.token, a.text, a.message),
            None => (self.state.len(), self.cached_text.len(), self.messages.len()),
        };
        let dropped = end_tok - first.token;
        // A sliding-window state shifts while its window stays held, else it is re-read.
        match self.cut_mode() {
            TrimMode::Shift if self.state.can_shift_out(first.token, end_tok) => {
                model.shift_out(&mut self.state, first.token, end_tok)?
            }
            TrimMode::Shift | TrimMode::Reprefill => {
                let tokens = self.state.tokens().to_vec();
                // What comes before the dropped turns stays where a checkpoint holds it.
                let from = self.state.truncate(first.token);
                let refeed: Vec<u32> = tokens[from..first.token].iter().chain(&tokens[end_tok..]).copied().collect();
                if !refeed.is_empty() {
                    if let Err(e) = model.forward(&refeed, &mut self.state) {
                        let messages = std::mem::take(&mut self.messages);
                        self.set_history(messages);
                        return Err(e);
                    }
                }
                self.state.checkpoint();
                self.last_reread = refeed.len();
            }
        }
        self.cached_text.replace_range(first.text..end_txt, "");
        self.messages.drain(first.message..end_msg);
        self.turns.drain(..count);
        for a in self.turns.iter_mut() {
            a.token -= dropped;
            a.text -= end_txt - first.text;
            a.message -= end_msg - first.message;
            if let Some((token, text)) = a.reply.as_mut() {
                *token -= dropped;
                *text -= end_txt - first.text;
            }
        }
        Ok(dropped)
    }

    /// Replaces the conversation with `history` (its text only): the cache is emptied and
    /// the next turn re-reads the history, dropping its oldest turns if they do not fit.
    pub fn set_history(&mut self, history: Vec<Message>) {
        self.clear();
        self.messages = history;
    }

    /// Takes the last reply back so it can be written again: the cache goes back to where
    /// the reply started, less its last prompt token, which is fed again for the logits
    /// (one token, not a re-prefill; a recurrent state feeds the last prompt from the
    /// checkpoint before it). Returns the logits, the user text the reply answers and the
    /// tokens fed; `None` when the last turn is no longer in the cache.
    pub fn rewind_reply(&mut self, model: &Model) -> Result<Option<(candle_core::Tensor, String, usize)>> {
        self.discard_draft();
        let Some(&Anchor { message, reply: Some((token, text)), .. }) = self.turns.last() else { return Ok(None) };
        let text_ok = text <= self.cached_text.len() && self.cached_text.is_char_boundary(text);
        if token == 0
            || token > self.state.len()
            || !text_ok
            || self.messages.get(message).is_none_or(|m| m.role != Role::User)
        {
            return Ok(None);
        }
        let _span = tracing::info_span!("rewind", tokens = self.state.len() - token).entered();
        // Back to before the last prompt token (a recurrent state: to the checkpoint
        // before the prompt), which is fed again for the logits with what else must be.
        let tokens = self.state.tokens()[..token].to_vec();
        let kept = self.state.truncate(token - 1);
        self.messages.truncate(message + 1);
        self.cached_text.truncate(text);
        let logits = model.forward(&tokens[kept..], &mut self.state)?;
        self.state.checkpoint();
        Ok(Some((logits, self.messages[message].content.clone(), token - kept)))
    }

    /// Takes the last turn (the user's message and its reply) back, so an edited message
    /// can be sent in its place and only that turn is fed. Returns the message taken back;
    /// `None` when the last turn is no longer in the cache.
    ///
    /// A recurrent state goes back to the checkpoint after the reply before, and the close
    /// of that reply (the template's end-of-turn marker, fed with this turn's prompt) is
    /// fed again; `None`, the session set to re-read, if that fails.
    pub fn rewind_turn(&mut self, model: &Model) -> Option<String> {
        self.discard_draft();
        let &Anchor { token, text, message, .. } = self.turns.last()?;
        let user = self.messages.get(message).filter(|m| m.role == Role::User)?.content.clone();
        self.cut_cache(model, token).ok()?;
        self.state.checkpoint();
        self.cached_text.truncate(text);
        self.messages.truncate(message);
        self.turns.pop();
        Some(user)
    }

    /// Takes the conversation back to just before message `index` (a user message that
    /// starts a cached turn): cache, text and messages, so an edited message can be sent
    /// in its place and only it is fed. False (nothing changed) when no cached turn starts
    /// there.
    ///
    /// A recurrent state goes back to its latest checkpoint before the message and feeds
    /// the tokens from there to it again (false, the session set to re-read, if that fails).
    pub fn rewind_to_message(&mut self, model: &Model, index: usize) -> bool {
        self.discard_draft();
        let Some(i) = self.turns.iter().position(|a| a.message == index) else { return false };
        if self.messages.get(index).is_none_or(|m| m.role != Role::User) {
            return false;
        }
        let Anchor { token, text, .. } = self.turns[i];
        if self.cut_cache(model, token).is_err() {
            return false;
        }
        self.state.checkpoint();
        self.cached_text.truncate(text);
        self.messages.truncate(index);
        self.turns.truncate(i);
        true
    }

    /// Makes `history` the conversation (another branch of the same chat) keeping the
    /// cache up to the last point both share, a turn's start or its reply's, and feeding
    /// only the rest: each prompt as the turn fed it, each reply as text. `None` (nothing
    /// changed, a draft dropped) when the cache holds no such point (its turns trimmed),
    /// the rest is not alternating turns, or it does not fit with `reserve` tokens to
    /// spare: the caller then sets it to be re-read ([`Session::set_history`]).
    pub fn switch_history(
        &mut self,
        model: &Model,
        tok: &TextTokenizer,
        history: &[Message],
        reserve: usize,
    ) -> Result<Option<Switched>> {
        self.discard_draft();
        if self.turns.is_empty() {
            // Nothing cached past the system prompt (or a history set to be re-read).
            return Ok(None);
        }
        let same = self.messages.iter().zip(history).take_while(|(a, b)| a == b).count();
        // (turns kept, token, text byte, messages kept)
        let cut = if same == self.messages.len() {
            Some((self.turns.len(), self.len(), self.cached_text.len(), same))
        } else {
            self.turns.iter().enumerate().rev().find_map(|(i, a)| match a.reply {
                Some((token, text)) if a.message < same => Some((i + 1, token, text, a.message + 1)),
                _ if a.message <= same => Some((i, a.token, a.text, a.message)),
                _ => None,
            })
        };
        let Some((kept_turns, kept, text_at, from)) = cut else { return Ok(None) };
        let mut text = self.cached_text[..text_at].to_string();
        let mut ids = Vec::new();
        let mut anchors: Vec<Anchor> = Vec::new();
        for i in from..history.len() {
            let after_user = i > 0 && history[i - 1].role == Role::User;
            match history[i].role {
                Role::Assistant if after_user => {
                    text.push_str(&history[i].content);
                    ids.extend(tok.encode_text(&history[i].content)?);
                }
                Role::User if !after_user => {
                    let rendered = self.template.render_marked(&history[..=i], true)?;
                    if !rendered.text.starts_with(&text) {
                        return Ok(None);
                    }
                    let ranges = self.piece_ranges(&rendered, text.len(), rendered.text.len());
                    // The close of the turn before, then this one from its user header.
                    let [close, turn] = ranges.as_slice() else { return Ok(None) };
                    ids.extend(tok.encode_rendered(&rendered.text, close.clone(), &rendered.bodies)?);
                    let token = kept + ids.len();
                    ids.extend(tok.encode_rendered(&rendered.text, turn.clone(), &rendered.bodies)?);
                    let reply = Some((kept + ids.len(), rendered.text.len()));
                    anchors.push(Anchor { token, text: turn.start, message: i, reply });
                    text = rendered.text;
                }
                _ => return Ok(None),
            }
            if kept + ids.len() + reserve > self.state.max_tokens() {
                return Ok(None);
            }
        }
        let _span = tracing::info_span!("switch_history", kept, fed = ids.len()).entered();
        // A recurrent state goes back to a checkpoint: what follows it is fed again.
        let tokens = self.state.tokens()[..kept].to_vec();
        let from = self.state.truncate(kept);
        let ids: Vec<u32> = tokens[from..].iter().copied().chain(ids).collect();
        let kept = from;
        self.turns.truncate(kept_turns);
        if !ids.is_empty() {
            if let Err(e) = model.forward(&ids, &mut self.state) {
                self.set_history(history.to_vec());
                return Err(e);
            }
        }
        self.state.checkpoint();
        self.turns.extend(anchors);
        self.messages = history.to_vec();
        self.cached_text = text;
        self.history_fitted = false;
        Ok(Some(Switched { kept, fed: ids.len() }))
    }

    /// Evicts down to `target` tokens: oldest turns first; everything when the pinned
    /// prompt alone is larger. Returns tokens dropped.
    pub fn evict_to(&mut self, model: &Model, target: usize) -> Result<usize> {
        let _span = tracing::info_span!("evict", target).entered();
        self.discard_draft();
        let before = self.state.len();
        let count = budget::turns_to_fit(self.pinned_tokens, &self.turn_lengths(), target);
        self.drop_turns(model, count)?;
        if self.state.len() > target {
            self.clear();
        }
        Ok(before - self.state.len())
    }
}

/// The length in bytes of the longest start `a` and `b` share (at a character boundary).
fn common_prefix(a: &str, b: &str) -> usize {
    let same = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    (0..=same).rev().find(|&n| a.is_char_boundary(n)).unwrap_or(0)
}

/// Where each turn of `messages` begins, oldest first: the first message after the leading
/// system messages, then every user message after it. A turn is a user message and what
/// answers it; the leading system messages belong to none.
fn turn_starts(messages: &[Message]) -> Vec<usize> {
    let Some(first) = messages.iter().position(|m| m.role != Role::System) else { return Vec::new() };
    std::iter::once(first).chain((first + 1..messages.len()).filter(|&i| messages[i].role == Role::User)).collect()
}

/// The end of `text` holding more than `room` tokens, found without tokenizing all of a
/// text far longer than that: ends of growing length, from about four bytes a token and
/// doubling, are tokenized until one holds that many. `text` itself when it holds no more
/// (it may fit). A pasted message of any length costs at most about twice the tokenizing
/// the budget needs.
fn tail_over<'a>(tok: &TextTokenizer, text: &'a str, room: usize) -> Result<&'a str> {
    let mut bytes = room.saturating_mul(4).max(256);
    while bytes < text.len() {
        let mut start = text.len() - bytes;
        while !text.is_char_boundary(start) {
            start += 1;
        }
        let tail = &text[start..];
        if tok.encode_text(tail)?.len() > room {
            return Ok(tail);
        }
        bytes = bytes.saturating_mul(2);
    }
    Ok(text)
}
