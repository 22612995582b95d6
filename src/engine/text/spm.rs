//! The SentencePiece tokenizer of GGUF files with `tokenizer.ggml.model = "llama"` (Gemma,
//! Llama 2, Mistral, Phi-3, TinyLlama), as llama.cpp runs it, so ids match its own:
//!
//! 1. the text is cut at special tokens (control and unknown tokens only where special
//!    tokens are allowed; user-defined ones such as Gemma's `\n\n` or `<table>` always),
//!    longest token first;
//! 2. each text piece gets a leading space when the file says `add_space_prefix` and the
//!    piece starts the text or follows a special token, and spaces become `▁`;
//! 3. the piece starts as one symbol per character; the adjacent pair whose merge is a
//!    vocabulary token with the highest score is merged, again and again;
//! 4. a character that is no piece goes out as its bytes' tokens `<0xXX>` (byte
//!    fallback).
//!
//! The vocabulary is kept as one string blob with an index sorted by text (a binary
//! search per lookup): Gemma's 262,144 pieces take ~5 MB this way instead of ~20 MB of
//! `String`s and a hash map.

use std::cmp::Ordering;

use candle_core::quantized::gguf_file::{self, Value};

use super::merge::{merge, Symbol};
use super::specials::{cut_at_specials, Fragment};
use crate::engine::EngineError;

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl PieceKind {
    pub(crate) fn from_gguf(value: i32) -> PieceKind {
        match value {
            2 => PieceKind::Unknown,
            3 => PieceKind::Control,
            4 => PieceKind::UserDefined,
            5 => PieceKind::Unused,
            6 => PieceKind::Byte,
            _ => PieceKind::Normal,
        }
    }
}

/// SentencePiece's visible space.
const SPACE: &str = "\u{2581}";

pub struct SentencePiece {
    /// Every piece's text, back to back; piece `i` is `blob[spans[i].0..spans[i].1]`.
    blob: String,
    spans: Vec<(u32, u32)>,
    /// Piece ids sorted by text, for [`SentencePiece::id_of`].
    by_text: Vec<u32>,
    scores: Vec<f32>,
    kinds: Vec<PieceKind>,
    /// The token of each byte for byte fallback.
    byte_ids: Vec<u32>,
    /// Control, unknown and user-defined pieces, longest first: llama.cpp's cutting order.
    specials: Vec<u32>,
    add_space_prefix: bool,
}

impl SentencePiece {
    pub fn from_gguf(content: &gguf_file::Content) -> Result<SentencePiece, EngineError> {
        let bad = |m: String| EngineError::UnsupportedTokenizer(m);
        let array = |key: &str| match content.metadata.get(key) {
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(_) => Err(bad(format!("`{key}` is not an array"))),
            None => Ok(None),
        };
        let tokens = array("tokenizer.ggml.tokens")?.ok_or_else(|| bad("the file has no token list".into()))?;
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize / 2 {
            return Err(bad(format!("the vocabulary has {n} tokens")));
        }
        let mut blob = String::new();
        let mut spans = Vec::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            let text = t.to_string().map_err(|_| bad(format!("token {i} is not a string")))?;
            let start = blob.len();
            blob.push_str(text);
            if blob.len() > u32::MAX as usize {
                return Err(bad("the vocabulary's text is over 4 GiB".into()));
            }
            spans.push((start as u32, blob.len() as u32));
        }
        let per_token =
            |key: &str, read: &dyn Fn(&Value) -> Option<f64>, default: f64| -> Result<Vec<f64>, EngineError> {
                match array(key)? {
                    None => Ok(vec![default; n]),
                    Some(items) if items.len() != n => {
                        Err(bad(format!("`{key}` has {} entries for {n} tokens", items.len())))
                    }
                    Some(items) => items
                        .iter()
                        .enumerate()
                        .map(|(i, v)| read(v).ok_or_else(|| bad(format!("`{key}` entry {i} is not a number"))))
                        .collect(),
                }
            };
        let scores = per_token("tokenizer.ggml.scores", &|v| v.to_f32().ok().map(f64::from), 0.0)?;
        let types = per_token("tokenizer.ggml.token_type", &|v| v.to_i32().ok().map(f64::from), 1.0)?;
        let scores: Vec<f32> = scores.into_iter().map(|s| if s.is_finite() { s as f32 } else { f32::MIN }).collect();
        let kinds: Vec<PieceKind> = types.into_iter().map(|t| PieceKind::from_gguf(t as i32)).collect();
        let add_space_prefix =
            content.metadata.get("tokenizer.ggml.add_space_prefix").and_then(|v| v.to_bool().ok()).unwrap_or(true);
        let unknown = content.metadata.get("tokenizer.ggml.unknown_token_id").and_then(|v| v.to_u32().ok());

        let mut spm = SentencePiece {
            blob,
            spans,
            by_text: (0..n as u32).collect(),
            scores,
            kinds,
            byte_ids: Vec::new(),
            specials: Vec::new(),
            add_space_prefix,
        };
        let mut by_text = std::mem::take(&mut spm.by_text);
        by_text.sort_by(|&a, &b| spm.piece(a).cmp(spm.piece(b)).then(a.cmp(&b)));
        spm.by_text = by_text;
        let fallback = unknown.filter(|&u| (u as usize) < n).unwrap_or(0);
        spm.byte_ids = (0..=255u8)
            .map(|b| {
                spm.id_of(&format!("<0x{b:02X}>"))
                    .or_else(|| std::str::from_utf8(&[b]).ok().and_then(|s| spm.id_of(s)))
                    .unwrap_or(fallback)
            })
            .collect();
        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                matches!(spm.kind(id), PieceKind::Control | PieceKind::Unknown | PieceKind::UserDefined)
                    && !spm.piece(id).is_empty()
            })
            .collect();
        specials.sort_by(|&a, &b| spm.piece(b).len().cmp(&spm.piece(a).len()).then(a.cmp(&b)));
        spm.specials = specials;
        Ok(spm)
    }

    /// Pieces in the vocabulary (never zero: an empty one is refused at load).
    pub fn vocab_size(&self) -> usize {
        self.spans.len()
    }

    /// The text of piece `id` as the vocabulary spells it (`▁` for spaces).
    pub fn piece(&self, id: u32) -> &str {
        let (a, b) = self.spans[id as usize];
        &self.blob[a as usize..b as usize]
    }

    pub fn kind(&self, id: u32) -> PieceKind {
        self.kinds[id as usize]
    }

    /// The id of the piece spelled `text`, when there is one (of equal pieces the last,
    /// as in llama.cpp's map).
    pub fn id_of(&self, text: &str) -> Option<u32> {
        let after = self.by_text.partition_point(|&id| self.piece(id) <= text);
        after.checked_sub(1).map(|i| self.by_text[i]).filter(|&id| self.piece(id) == text)
    }

    /// Control and unknown pieces (`<bos>`, `<start_of_turn>`), by id.
    pub fn control_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.specials.iter().copied().filter(|&id| matches!(self.kind(id), PieceKind::Control | PieceKind::Unknown))
    }

    /// Token ids of `parts`, each `(text, special)`: with `special`, control tokens written
    /// in the text are recognised; without, they are read as plain text. A space prefix
    /// (when the file asks for one) goes at the start and after each special token, as
    /// when llama.cpp tokenizes the parts as one text.
    pub fn encode(&self, parts: &[(&str, bool)]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut after_special = true;
        for &(text, special) in parts {
            for fragment in self.cut_at_specials(text, special) {
                match fragment {
                    Fragment::Token(id) => {
                        out.push(id);
                        after_special = true;
                    }
                    Fragment::Text(raw) => {
                        let mut text = String::with_capacity(raw.len() + 3);
                        if self.add_space_prefix && after_special {
                            text.push(' ');
                        }
                        text.push_str(raw);
                        self.merge(&text.replace(' ', SPACE), &mut out);
                        after_special = false;
                    }
                }
            }
        }
        out
    }

    /// Bytes of the text of `ids`: `▁` back to spaces, byte pieces as their byte, control
    /// pieces as their text, unused pieces as nothing.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            if id as usize >= self.vocab_size() {
                continue;
            }
            let piece = self.piece(id);
            match self.kind(id) {
                PieceKind::Normal => out.extend_from_slice(piece.replace(SPACE, " ").as_bytes()),
                PieceKind::Byte => match byte_of_piece(piece) {
                    Some(b) => out.push(b),
                    None => out.extend_from_slice(piece.as_bytes()),
                },
                PieceKind::Control | PieceKind::Unknown | PieceKind::UserDefined => {
                    out.extend_from_slice(piece.as_bytes())
                }
                PieceKind::Unused => {}
            }
        }
        out
    }

    /// Step 1: `text` cut at the special pieces it contains, longest piece first.
    fn cut_at_specials<'a>(&self, text: &'a str, special: bool) -> Vec<Fragment<'a>> {
        let allowed = self.specials.iter().copied().filter(|&id| special || self.kind(id) == PieceKind::UserDefined);
        cut_at_specials(text, allowed.map(|id| (id, self.piece(id))))
    }

    /// Steps 3 and 4 for one piece of escaped text.
    fn merge(&self, text: &str, out: &mut Vec<u32>) {
        let mut symbols = Symbol::chars(text);
        if symbols.is_empty() {
            return;
        }
        // Highest score first.
        merge(text, &mut symbols, |joined, _| self.id_of(joined).map(|id| Score(self.scores[id as usize])));
        // Every merge made a piece, so only single characters can be missing from the
        // vocabulary: those go out as their bytes.
        let mut i = 0isize;
        while i >= 0 {
            let s = &symbols[i as usize];
            let piece = s.text(text);
            match self.id_of(piece) {
                Some(id) => out.push(id),
                None => out.extend(piece.bytes().map(|b| self.byte_ids[b as usize])),
            }
            i = s.next;
        }
    }
}

/// A piece's score, ordered as llama.cpp orders them (`total_cmp`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score(f32);

impl Eq for Score {}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The byte of a `<0xXX>` piece.
pub(crate) fn byte_of_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::{Content, VersionedMagic};

    /// A hand-made vocabulary: pieces with scores and kinds, plus the 256 byte pieces.
    fn vocab(pieces: &[(&str, f32, i32)], add_space_prefix: bool) -> SentencePiece {
        let mut all: Vec<(String, f32, i32)> = pieces.iter().map(|&(p, s, k)| (p.to_string(), s, k)).collect();
        all.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, 6)));
        let mut metadata = std::collections::HashMap::new();
        metadata.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
        metadata.insert(
            "tokenizer.ggml.tokens".into(),
            Value::Array(all.iter().map(|t| Value::String(t.0.clone())).collect()),
        );
        metadata.insert("tokenizer.ggml.scores".into(), Value::Array(all.iter().map(|t| Value::F32(t.1)).collect()));
        metadata
            .insert("tokenizer.ggml.token_type".into(), Value::Array(all.iter().map(|t| Value::I32(t.2)).collect()));
        metadata.insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(add_space_prefix));
        let content = Content {
            magic: VersionedMagic::GgufV3,
            metadata,
            tensor_infos: Default::default(),
            tensor_data_offset: 0,
        };
        SentencePiece::from_gguf(&content).unwrap()
    }

    const PIECES: &[(&str, f32, i32)] = &[
        ("<unk>", 0.0, 2),
        ("<bos>", 0.0, 3),
        ("<start_of_turn>", 0.0, 3),
        ("\n\n", 0.0, 4),
        ("▁", -1.0, 1),
        ("h", -2.0, 1),
        ("e", -2.0, 1),
        ("l", -2.0, 1),
        ("o", -2.0, 1),
        ("he", -5.0, 1),
        ("ll", -3.0, 1),
        ("▁h", -4.0, 1),
        ("▁he", -6.0, 1),
        ("llo", -3.5, 1),
        ("▁hello", -7.0, 1),
        ("<", -2.0, 1),
        ("s", -2.0, 1),
    ];

    fn pieces(spm: &SentencePiece, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&id| spm.piece(id).to_string()).collect()
    }

    #[test]
    fn the_best_scoring_pair_merges_first_down_to_whole_words() {
        let spm = vocab(PIECES, false);
        // "ll" (-3) merges before "he" (-5); then "llo"; "▁h", "▁he"; at last "▁hello".
        assert_eq!(pieces(&spm, &spm.encode(&[(" hello", false)])), ["▁hello"]);
        assert_eq!(pieces(&spm, &spm.encode(&[("hell", false)])), ["he", "ll"]);
    }

    #[test]
    fn characters_outside_the_vocabulary_fall_back_to_their_bytes() {
        let spm = vocab(PIECES, false);
        let ids = spm.encode(&[("hé", false)]);
        assert_eq!(pieces(&spm, &ids), ["h", "<0xC3>", "<0xA9>"]);
        assert_eq!(String::from_utf8(spm.decode_bytes(&ids)).unwrap(), "hé");
    }

    #[test]
    fn control_tokens_only_where_special_tokens_are_allowed_user_defined_always() {
        let spm = vocab(PIECES, false);
        let special = pieces(&spm, &spm.encode(&[("<start_of_turn>he\n\nhe", true)]));
        assert_eq!(special, ["<start_of_turn>", "he", "\n\n", "he"]);
        let plain = pieces(&spm, &spm.encode(&[("<start_of_turn>he\n\nhe", false)]));
        assert!(!plain.contains(&"<start_of_turn>".to_string()), "{plain:?}");
        assert!(plain.contains(&"\n\n".to_string()), "{plain:?}");
        assert_eq!(
            spm.control_tokens().map(|id| spm.piece(id)).collect::<Vec<_>>(),
            ["<start_of_turn>", "<unk>", "<bos>"]
        );
    }

    #[test]
    fn a_space_prefix_goes_at_the_start_and_after_special_tokens_only() {
        let spm = vocab(PIECES, true);
        let ids = spm.encode(&[("hello", true), ("<bos>", true), ("hello", false), ("hello", false)]);
        assert_eq!(pieces(&spm, &ids), ["▁hello", "<bos>", "▁hello", "he", "llo"]);
        assert_eq!(String::from_utf8(spm.decode_bytes(&ids)).unwrap(), " hello<bos> hellohello");
    }

    #[test]
    fn equal_pieces_resolve_to_the_last_like_llama_cpp() {
        let spm = vocab(&[("a", 0.0, 1), ("a", 0.0, 1), ("b", 0.0, 1)], false);
        assert_eq!(spm.id_of("a"), Some(1));
        assert_eq!(spm.id_of("b"), Some(2));
        assert_eq!(spm.id_of("c"), None);
    }
}
