//! Incremental detokenization that only emits complete text: a multi-byte character split
//! over several byte tokens is held back until it is whole, and text is taken as the
//! difference of two decodes so merges at token boundaries come out right.

use super::tokenizer::TextTokenizer;
use crate::engine::EngineError;

#[derive(Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix: usize,
    /// End of the text already emitted (as an index into `ids`).
    read: usize,
}

impl Detokenizer {
    /// Adds a token and returns the text it completes, if any.
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<Option<String>, EngineError> {
        self.ids.push(id);
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let now = tok.decode(&self.ids[self.prefix..])?;
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') && now.is_char_boundary(before.len()) {
            let text = now[before.len()..].to_string();
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(Some(text))
        } else {
            Ok(None)
        }
    }

    /// Whatever is still held back (an incomplete character at the end of a reply).
    pub fn flush(&mut self, tok: &TextTokenizer) -> Result<Option<String>, EngineError> {
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let now = tok.decode(&self.ids[self.prefix..])?;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        if now.len() > before.len() && now.is_char_boundary(before.len()) {
            Ok(Some(now[before.len()..].to_string()))
        } else {
            Ok(None)
        }
    }
}
