//! The BPE tokenizer of GGUF files with `tokenizer.ggml.model = "gpt2"` (Llama 3, Qwen,
//! SmolLM, GPT-2, StarCoder, ...) or `"gemma4"`, as llama.cpp runs it, so ids match its own:
//!
//! 1. the text is cut at special tokens (control and unknown tokens only where special
//!    tokens are allowed; user-defined ones always), longest token first;
//! 2. each text piece is cut into words by the file's pre-tokenizer
//!    ([`super::pretokenize`]);
//! 3. a word is spelled in GPT-2's byte-level alphabet (Gemma 4: kept as UTF-8), starts
//!    as one symbol per character, and the adjacent pair with the lowest merge rank is
//!    merged, again and again;
//! 4. a symbol that is no token goes out as its bytes' tokens.

use std::cmp::Reverse;
use std::collections::HashMap;

use candle_core::quantized::gguf_file::{self, Value};

use super::byte_level;
use super::merge::{merge, Symbol};
use super::pretokenize::PreTokenizer;
use super::specials::{cut_at_specials, Fragment};
use super::spm::PieceKind;
use crate::engine::EngineError;

/// SentencePiece's visible space, Gemma 4's spelling of a space.
const SPACE: &str = "\u{2581}";

/// Tokens llama.cpp makes control tokens by their text whatever the file's type says
/// (end-of-turn and fill-in-the-middle markers, `llama-vocab.cpp`): user text that spells
/// them stays text, so it cannot forge, say, Gemma 4's user-defined `<|tool_response>`.
const CONTROL_BY_NAME: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{FF5C}end\u{2581}of\u{2581}sentence\u{FF5C}>",
    "[e~[",
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<\u{FF5C}fim\u{2581}begin\u{FF5C}>",
    "<PRE>",
    "\u{2581}<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<\u{FF5C}fim\u{2581}hole\u{FF5C}>",
    "<SUF>",
    "\u{2581}<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<\u{FF5C}fim\u{2581}end\u{FF5C}>",
    "<MID>",
    "\u{2581}<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

pub struct BytePair {
    tokens: Vec<String>,
    kinds: Vec<PieceKind>,
    by_text: HashMap<String, u32>,
    /// Each text that appears in a merge, numbered, and the merges' ranks by those numbers.
    merge_parts: HashMap<String, u32>,
    ranks: HashMap<(u32, u32), u32>,
    /// Tokens matched before the split: control and unknown ones (only with special tokens
    /// allowed) and user-defined ones (always), longest first.
    specials: Vec<u32>,
    /// Tokens read as their text in decoding: control, unknown, user-defined and unused.
    verbatim: Vec<bool>,
    pre: PreTokenizer,
}

impl BytePair {
    pub fn from_gguf(content: &gguf_file::Content) -> Result<BytePair, EngineError> {
        let bad = |m: String| EngineError::UnsupportedTokenizer(m);
        let text = |key: &str| content.metadata.get(key).and_then(|v| v.to_string().ok()).cloned();
        let model = text("tokenizer.ggml.model").unwrap_or_default();
        let pre = PreTokenizer::for_vocabulary(&model, text("tokenizer.ggml.pre").as_deref()).map_err(bad)?;
        let strings = |key: &str| -> Result<Vec<String>, EngineError> {
            match content.metadata.get(key) {
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|v| v.to_string().cloned().map_err(|_| bad(format!("`{key}` holds a non-string"))))
                    .collect(),
                Some(_) => Err(bad(format!("`{key}` is not an array"))),
                None => Err(bad(format!("the file has no `{key}`"))),
            }
        };
        let mut tokens = strings("tokenizer.ggml.tokens")?;
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize / 2 {
            return Err(bad(format!("the vocabulary has {n} tokens")));
        }
        let mut kinds: Vec<PieceKind> = match content.metadata.get("tokenizer.ggml.token_type") {
            Some(Value::Array(items)) if items.len() == n => {
                items.iter().map(|v| PieceKind::from_gguf(v.to_i32().unwrap_or(1))).collect()
            }
            Some(_) => return Err(bad("`tokenizer.ggml.token_type` does not match the tokens".into())),
            None => vec![PieceKind::Normal; n],
        };
        // The BOS/EOS/padding tokens the file names are control tokens even where it gives no
        // types (as candle's reader had it; llama.cpp also makes end-of-turn tokens control).
        for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"] {
            if let Some(id) = content.metadata.get(key).and_then(|v| v.to_u32().ok()).filter(|&id| (id as usize) < n) {
                if kinds[id as usize] == PieceKind::Normal {
                    kinds[id as usize] = PieceKind::Control;
                }
            }
        }
        for (kind, token) in kinds.iter_mut().zip(&tokens) {
            if *kind != PieceKind::Control && CONTROL_BY_NAME.contains(&token.as_str()) {
                *kind = PieceKind::Control;
            }
        }
        // As llama.cpp: an empty token gets a placeholder text, and of equal texts the last
        // token is the one text maps to.
        for (i, t) in tokens.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
        }
        let by_text: HashMap<String, u32> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();

        let mut merge_parts = HashMap::new();
        let mut ranks = HashMap::new();
        for (rank, merge) in strings("tokenizer.ggml.merges")?.iter().enumerate() {
            // Split at the first space after the first character (a part may be a space).
            let cut = merge.char_indices().nth(1).and_then(|(i, _)| merge[i..].find(' ').map(|j| i + j));
            let (left, right) = cut.map_or(("", ""), |c| (&merge[..c], &merge[c + 1..]));
            let mut number = |part: &str| {
                let next = merge_parts.len() as u32;
                *merge_parts.entry(part.to_string()).or_insert(next)
            };
            let key = (number(left), number(right));
            ranks.entry(key).or_insert(rank as u32);
        }

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                matches!(kinds[id as usize], PieceKind::Control | PieceKind::Unknown | PieceKind::UserDefined)
            })
            .collect();
        specials.sort_by(|&a, &b| tokens[b as usize].len().cmp(&tokens[a as usize].len()).then(a.cmp(&b)));
        let verbatim = kinds
            .iter()
            .map(|k| matches!(k, PieceKind::Control | PieceKind::Unknown | PieceKind::UserDefined | PieceKind::Unused))
            .collect();
        Ok(BytePair { tokens, kinds, by_text, merge_parts, ranks, specials, verbatim, pre })
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The vocabulary's spelling of token `id`.
    pub fn piece(&self, id: u32) -> &str {
        &self.tokens[id as usize]
    }

    pub fn id_of(&self, text: &str) -> Option<u32> {
        self.by_text.get(text).copied()
    }

    /// Texts start with BOS unless the file says otherwise.
    pub fn adds_bos_by_default(&self) -> bool {
        self.pre.adds_bos_by_default()
    }

    /// Tokens decoded as their text: control tokens and the like, by id.
    pub fn special_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.tokens.len() as u32).filter(|&id| self.verbatim[id as usize])
    }

    /// The bytes token `id` stands for (empty for an unknown id).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(piece) = self.tokens.get(id as usize) else { return Vec::new() };
        if self.verbatim[id as usize] {
            return piece.as_bytes().to_vec();
        }
        if !self.pre.byte_encodes() {
            if self.kinds[id as usize] == PieceKind::Byte {
                if let Some(b) = super::spm::byte_of_piece(piece) {
                    return vec![b];
                }
            }
            return piece.replace(SPACE, " ").into_bytes();
        }
        let mut out = Vec::with_capacity(piece.len());
        for c in piece.chars() {
            match byte_level::byte_of_char(c) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        out
    }

    /// Token ids of `parts`, each `(text, special)`: with `special`, control tokens written
    /// in the text are recognised; without, they are read as plain text.
    pub fn encode(&self, parts: &[(&str, bool)]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut spelled = String::new();
        for &(text, special) in parts {
            for fragment in self.cut_at_specials(text, special) {
                match fragment {
                    Fragment::Token(id) => out.push(id),
                    Fragment::Text(raw) => {
                        let escaped;
                        let raw = if self.pre.escapes_spaces() {
                            escaped = raw.replace(' ', SPACE);
                            escaped.as_str()
                        } else {
                            raw
                        };
                        for word in self.pre.split(raw) {
                            let word = if self.pre.byte_encodes() {
                                byte_level::encode(word, &mut spelled);
                                spelled.as_str()
                            } else {
                                word
                            };
                            self.merge(word, &mut out);
                        }
                    }
                }
            }
        }
        out
    }

    /// Step 1: `text` cut at the special tokens it contains, longest first.
    fn cut_at_specials<'a>(&self, text: &'a str, special: bool) -> Vec<Fragment<'a>> {
        let allowed =
            self.specials.iter().copied().filter(|&id| special || self.kinds[id as usize] == PieceKind::UserDefined);
        cut_at_specials(text, allowed.map(|id| (id, self.piece(id))))
    }

    /// The merge rank of the pair `left` + `right`, if the file has that merge.
    fn rank(&self, left: &str, right: &str) -> Option<u32> {
        let key = (*self.merge_parts.get(left)?, *self.merge_parts.get(right)?);
        self.ranks.get(&key).copied()
    }

    /// Steps 3 and 4 for one spelled word.
    fn merge(&self, word: &str, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        let whole = self.id_of(word);
        let keep_whole = (self.pre.ignores_merges() || (!self.pre.byte_encodes() && word.bytes().all(|b| b == b'\n')))
            && whole.is_some();
        let mut symbols = if keep_whole {
            vec![Symbol { start: 0, len: word.len(), prev: -1, next: -1 }]
        } else {
            Symbol::chars(word)
        };
        // Lowest rank first.
        merge(word, &mut symbols, |joined, split| self.rank(&joined[..split], &joined[split..]).map(Reverse));

        for s in symbols.iter().filter(|s| s.len > 0) {
            let piece = s.text(word);
            match self.id_of(piece) {
                Some(id) => out.push(id),
                // As llama.cpp: each byte on its own, as a one-byte token (byte-level
                // vocabularies) or `<0xXX>` (Gemma 4); a byte with neither is dropped.
                None => out.extend(piece.bytes().filter_map(|b| {
                    if self.pre.byte_encodes() {
                        std::str::from_utf8(&[b]).ok().and_then(|s| self.id_of(s))
                    } else {
                        self.id_of(&format!("<0x{b:02X}>"))
                    }
                })),
            }
        }
    }
}
