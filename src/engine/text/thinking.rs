//! A reply's thinking told apart from its answer while it streams. Thinking models
//! (Qwen3, Qwen3.5, SmolLM3, the DeepSeek-R1 distills) write `<think>…</think>` before
//! the answer. In their vocabularies the tags are tokens of their own, but they reach us
//! as text like any other piece (the detokenizer writes them out), so they are found in
//! the text:
//!
//! - a tag may come in pieces (`</th` then `ink>`): a piece that could be the start of the
//!   tag is held back until the next one says whether it is;
//! - the opening tag counts only before the answer has begun (a reply that talks *about*
//!   `<think>` later keeps it as text); the closing tag only while thinking;
//! - a generation prompt may open the thinking itself (Qwen3.5's ends in `<think>\n`):
//!   the reply then starts inside it ([`ThinkSplitter::new`] with `opened`);
//! - a reply that never closes the tag (stopped, out of tokens) is all thinking.
//!
//! The newlines the templates put around the tags are not part of either text.

/// The tag that opens a model's thinking.
pub const OPEN: &str = "<think>";
/// The tag that closes it.
pub const CLOSE: &str = "</think>";

/// A piece of a reply, told apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Thinking(String),
    Answer(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Only whitespace so far: an opening tag may still come.
    Start,
    Thinking,
    Answer,
}

/// Splits a streaming reply into thinking and answer (see the module docs).
#[derive(Debug, Clone)]
pub struct ThinkSplitter {
    phase: Phase,
    /// Text not yet given out: whitespace at the start, or what may be a tag's beginning.
    held: String,
    /// Whether the thinking (or the answer) has had any text yet: the newlines after a
    /// tag are dropped until it has.
    thinking_started: bool,
    answer_started: bool,
    /// Whether the reply had thinking (a tag, or a prompt that opened it).
    thought: bool,
    thinking: String,
    answer: String,
}

impl ThinkSplitter {
    /// A splitter for a reply whose prompt `opened` the thinking already (see
    /// [`prompt_opens_thinking`]).
    pub fn new(opened: bool) -> ThinkSplitter {
        ThinkSplitter {
            phase: if opened { Phase::Thinking } else { Phase::Start },
            held: String::new(),
            thinking_started: false,
            answer_started: false,
            thought: opened,
            thinking: String::new(),
            answer: String::new(),
        }
    }

    /// Whether the reply is inside its thinking now (a token just pushed belongs to it).
    pub fn is_thinking(&self) -> bool {
        self.phase == Phase::Thinking
    }

    /// Takes the next piece of the reply's text; returns what can be shown of it now, in
    /// order (at most one thinking and one answer piece).
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        self.held.push_str(text);
        loop {
            match self.phase {
                Phase::Start => {
                    let rest = self.held.trim_start();
                    if rest.is_empty() || (OPEN.starts_with(rest) && rest.len() < OPEN.len()) {
                        return out; // whitespace, or the tag's beginning: wait
                    }
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        self.held = after.to_string();
                        self.phase = Phase::Thinking;
                        self.thought = true;
                    } else {
                        self.phase = Phase::Answer;
                        // No thinking: the reply is the answer exactly as written.
                        self.answer_started = true;
                    }
                }
                Phase::Thinking => {
                    if let Some(at) = self.held.find(CLOSE) {
                        let thought = self.held[..at].to_string();
                        self.held = self.held[at + CLOSE.len()..].to_string();
                        self.give_thinking(&thought, &mut out);
                        self.phase = Phase::Answer;
                        continue;
                    }
                    let keep = partial_suffix(&self.held, CLOSE);
                    let ready = self.held[..self.held.len() - keep].to_string();
                    self.held.drain(..self.held.len() - keep);
                    self.give_thinking(&ready, &mut out);
                    return out;
                }
                Phase::Answer => {
                    let text = std::mem::take(&mut self.held);
                    self.give_answer(&text, &mut out);
                    return out;
                }
            }
        }
    }

    /// The end of the reply: what was held back is given out.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.phase {
            Phase::Thinking => self.give_thinking(&held, &mut out),
            Phase::Start | Phase::Answer => {
                self.answer_started = true;
                self.give_answer(&held, &mut out);
            }
        }
        out
    }

    /// The thinking so far without the newlines around it; `None` when the reply had none
    /// (or an empty block: thinking switched off).
    pub fn thinking(&self) -> Option<&str> {
        Some(self.thinking.trim_end_matches('\n')).filter(|t| self.thought && !t.is_empty())
    }

    /// The answer so far.
    pub fn answer(&self) -> &str {
        &self.answer
    }

    fn give_thinking(&mut self, text: &str, out: &mut Vec<Piece>) {
        let text = if self.thinking_started { text } else { text.trim_start_matches('\n') };
        if text.is_empty() {
            return;
        }
        self.thinking_started = true;
        self.thinking.push_str(text);
        push_piece(out, Piece::Thinking(text.to_string()));
    }

    fn give_answer(&mut self, text: &str, out: &mut Vec<Piece>) {
        let text = if self.answer_started { text } else { text.trim_start_matches('\n') };
        if text.is_empty() {
            return;
        }
        self.answer_started = true;
        self.answer.push_str(text);
        push_piece(out, Piece::Answer(text.to_string()));
    }
}

fn push_piece(out: &mut Vec<Piece>, piece: Piece) {
    match (out.last_mut(), piece) {
        (Some(Piece::Thinking(a)), Piece::Thinking(b)) | (Some(Piece::Answer(a)), Piece::Answer(b)) => a.push_str(&b),
        (_, piece) => out.push(piece),
    }
}

/// The length of the longest end of `text` that is a beginning of `tag` (and shorter than it).
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// Whether a rendered prompt's generation prompt (its text after `from`, the end of the
/// last message) leaves the thinking open: it has an opening tag after any closing one,
/// as Qwen3.5's `<|im_start|>assistant\n<think>\n` does.
pub fn prompt_opens_thinking(prompt_tail: &str) -> bool {
    prompt_tail.rfind(OPEN) > prompt_tail.rfind(CLOSE)
}

/// A whole reply as written told apart: `(thinking, answer)` (see [`ThinkSplitter`]).
pub fn split_reply(raw: &str, opened: bool) -> (Option<String>, String) {
    let mut s = ThinkSplitter::new(opened);
    s.push(raw);
    s.finish();
    (s.thinking().map(str::to_string), s.answer.clone())
}

/// A reply as the model writes it, from its thinking and answer: what a template that
/// knows nothing of `reasoning_content` is given for the message.
pub fn join_reply(thinking: Option<&str>, answer: &str) -> String {
    match thinking {
        Some(t) => format!("{OPEN}\n{t}\n{CLOSE}\n\n{answer}"),
        None => answer.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` one by one; the thinking and answer as streamed, and as finished.
    fn stream(chunks: &[&str], opened: bool) -> (String, String, Option<String>) {
        let mut s = ThinkSplitter::new(opened);
        let (mut thinking, mut answer) = (String::new(), String::new());
        let pieces = chunks.iter().flat_map(|c| s.push(c)).collect::<Vec<_>>();
        for piece in pieces.into_iter().chain(s.finish()) {
            match piece {
                Piece::Thinking(t) => thinking.push_str(&t),
                Piece::Answer(a) => answer.push_str(&a),
            }
        }
        assert_eq!(answer, s.answer(), "streamed and finished answers agree");
        (thinking, answer, s.thinking().map(str::to_string))
    }

    #[test]
    fn thinking_then_answer() {
        let (t, a, done) = stream(&["<think>", "\nweigh it", " up\n", "</think>", "\n\n", "Yes."], false);
        assert_eq!((t.as_str(), a.as_str()), ("weigh it up\n", "Yes."));
        assert_eq!(done.as_deref(), Some("weigh it up"));
    }

    #[test]
    fn tags_split_across_pieces_are_found() {
        let (_, a, done) = stream(&["  <th", "ink>\nplan", "</", "thi", "nk>\n\nok <thi", "nk> stays"], false);
        assert_eq!(done.as_deref(), Some("plan"));
        assert_eq!(a, "ok <think> stays", "an opening tag inside the answer is text");
        // Every split point of one reply gives the same result.
        let raw = "<think>\nab</think>\n\ncd";
        for at in 0..=raw.len() {
            let (_, a, done) = stream(&[&raw[..at], &raw[at..]], false);
            assert_eq!((done.as_deref(), a.as_str()), (Some("ab"), "cd"), "split at {at}");
        }
    }

    #[test]
    fn a_reply_without_tags_is_all_answer_exactly() {
        let (t, a, done) = stream(&["\n", " Hello", " <b>", "world</think>"], false);
        assert_eq!((t.as_str(), done), ("", None));
        assert_eq!(a, "\n Hello <b>world</think>");
        let (_, a, _) = stream(&["<", "thin"], false);
        assert_eq!(a, "<thin", "a tag's beginning at the end is text");
    }

    #[test]
    fn an_unclosed_reply_is_all_thinking() {
        let (t, a, done) = stream(&["<think>\nstill going</th"], false);
        assert_eq!((t.as_str(), a.as_str()), ("still going</th", ""));
        assert_eq!(done.as_deref(), Some("still going</th"));
    }

    #[test]
    fn a_prompt_that_opened_the_thinking_starts_inside_it() {
        let (t, a, done) = stream(&["reason", "ing\n</think>\n\n", "Answer"], true);
        assert_eq!((t.as_str(), a.as_str(), done.as_deref()), ("reasoning\n", "Answer", Some("reasoning")));
        // An empty thinking block (thinking switched off) is no thinking to show.
        let (t, a, done) = stream(&["</think>\n\nHi"], true);
        assert_eq!((t.as_str(), a.as_str(), done.as_deref()), ("", "Hi", None));
    }

    #[test]
    fn generation_prompts_that_open_the_thinking() {
        assert!(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!prompt_opens_thinking("<|im_start|>assistant\n"));
    }

    #[test]
    fn whole_replies_split_and_join() {
        assert_eq!(split_reply("<think>\nx\n</think>\n\ny", false), (Some("x".into()), "y".into()));
        assert_eq!(split_reply("y", false), (None, "y".into()));
        assert_eq!(join_reply(Some("x"), "y"), "<think>\nx\n</think>\n\ny");
        assert_eq!(join_reply(None, "y"), "y");
    }
}
