//! The tokenizer that ships inside the GGUF, with ids that match llama.cpp's: BPE
//! (`tokenizer.ggml.model = "gpt2"`) through the `tokenizers` crate with its pre-tokenizer
//! repaired, SentencePiece (`"llama"`) through our own [`super::spm`].
//!
//! candle's `Tokenizer::from_gguf` maps unknown `tokenizer.ggml.pre` values (SmolLM's
//! `smollm`, plain `gpt2`) to `ByteLevel::default()`, which adds a prefix space: "Hello"
//! would become "ĠHello" (38699) instead of 19556, and `<|im_start|>user` would tokenize
//! "Ġuser". Those files use the GPT-2 split without a prefix space.
//!
//! Special tokens are read only in the chat template's own parts: message texts are
//! tokenized with special-token strings as plain text ([`TextTokenizer::encode_rendered`]),
//! so typing `<|im_end|><|im_start|>system` cannot forge a turn.

use candle_core::quantized::gguf_file;
use candle_core::quantized::tokenizer::TokenizerFromGguf;
use std::ops::Range;

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;
use tokenizers::Tokenizer;

use super::spm::SentencePiece;
use super::{Cause, EngineError};

pub struct TextTokenizer {
    backend: Backend,
    /// Ids that end an assistant turn (EOS, `<|im_end|>`, `<|eot_id|>`, …).
    stop_ids: Vec<u32>,
    bos_token: String,
    eos_token: String,
    /// The BOS id when the file says the model starts every text with it
    /// (`tokenizer.ggml.add_bos_token`; BPE vocabularies default to no, as in llama.cpp).
    added_bos: Option<u32>,
}

enum Backend {
    /// `inner` reads special-token strings as special tokens; `plain`, the same tokenizer,
    /// reads them as text: for what people wrote.
    Bpe {
        inner: Box<Tokenizer>,
        plain: Box<Tokenizer>,
    },
    SentencePiece(SentencePiece),
}

/// GGUF `tokenizer.ggml.pre` values whose split this tokenizer reproduces: GPT-2's
/// byte-level split (SmolLM), and the regex splits of Llama 3 and Qwen 2/3 (llama.cpp's
/// patterns) before the byte-level mapping.
pub const SUPPORTED_PRE_TOKENIZERS: &[&str] = &["smollm", "gpt2", "default", "llama-bpe", "llama3", "qwen2"];

/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3` split: case-insensitive contractions, a letter
/// run with one leading non-letter, numbers in groups of up to three.
const LLAMA3_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2` split: Llama 3's with single digits.
const QWEN2_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer for a GGUF `tokenizer.ggml.pre` value; `None` keeps the one
/// candle's loader set (for values outside [`SUPPORTED_PRE_TOKENIZERS`]).
fn pre_tokenizer(pre: Option<&str>) -> Result<Option<PreTokenizerWrapper>, EngineError> {
    let byte_level = ByteLevel::new(false, true, false);
    let split = match pre {
        None | Some("smollm" | "gpt2" | "default") => return Ok(Some(ByteLevel::new(false, true, true).into())),
        Some("llama-bpe" | "llama3") => LLAMA3_SPLIT,
        Some("qwen2") => QWEN2_SPLIT,
        Some(other) => {
            tracing::warn!(pre = other, "unknown pre-tokenizer: token ids may differ from llama.cpp's");
            return Ok(None);
        }
    };
    let split = Split::new(SplitPattern::Regex(split.into()), SplitDelimiterBehavior::Isolated, false)
        .map_err(|e| EngineError::UnsupportedTokenizer(format!("pre-tokenizer: {e}")))?;
    Ok(Some(Sequence::new(vec![split.into(), byte_level.into()]).into()))
}

/// The byte GPT-2's byte-level alphabet spells with `c` (`bytes_to_unicode`: the printable
/// bytes stand for themselves, the others for 256, 257, … in byte order); `None` for a
/// character outside that alphabet.
fn byte_level_byte(c: char) -> Option<u8> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let code = c as u32;
    if printable(code) {
        return Some(code as u8);
    }
    let shifted = code.checked_sub(256)?;
    (0..=255u32).filter(|&b| !printable(b)).nth(shifted as usize).map(|b| b as u8)
}

/// Whether a tokenizer named as the catalog names them (a GGUF `tokenizer.ggml.pre`, or
/// `llama` for SentencePiece) gives llama.cpp's ids here.
pub fn is_supported(name: &str) -> bool {
    name == "llama" || SUPPORTED_PRE_TOKENIZERS.contains(&name)
}

/// Token strings that end a turn in the chat templates we know.
const END_OF_TURN_TOKENS: &[&str] =
    &["<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>", "<end_of_turn>"];

impl TextTokenizer {
    pub fn from_gguf(content: &gguf_file::Content) -> Result<TextTokenizer, EngineError> {
        let kind = content
            .metadata
            .get("tokenizer.ggml.model")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .ok_or_else(|| EngineError::UnsupportedTokenizer("the file has no tokenizer".into()))?;
        let backend = match kind.as_str() {
            "gpt2" => {
                let mut inner =
                    Tokenizer::from_gguf(content).map_err(|e| EngineError::UnsupportedTokenizer(e.to_string()))?;
                let pre = content.metadata.get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok()).cloned();
                if let Some(pre) = pre_tokenizer(pre.as_deref())? {
                    inner.with_pre_tokenizer(Some(pre));
                }
                let mut plain = inner.clone();
                plain.set_encode_special_tokens(true);
                Backend::Bpe { inner: Box::new(inner), plain: Box::new(plain) }
            }
            "llama" => Backend::SentencePiece(SentencePiece::from_gguf(content)?),
            other => {
                return Err(EngineError::UnsupportedTokenizer(format!(
                    "`{other}` (BPE `gpt2` and SentencePiece `llama` tokenizers are supported)"
                )))
            }
        };
        let token_at = |key: &str| -> Option<u32> { content.metadata.get(key).and_then(|v| v.to_u32().ok()) };
        let mut tokenizer = TextTokenizer {
            backend,
            stop_ids: Vec::new(),
            bos_token: String::new(),
            eos_token: String::new(),
            added_bos: None,
        };
        let vocab_size = tokenizer.vocab_size();
        let known = |id: Option<u32>| id.filter(|&id| (id as usize) < vocab_size);
        let (bos_id, eos_id) =
            (known(token_at("tokenizer.ggml.bos_token_id")), known(token_at("tokenizer.ggml.eos_token_id")));
        tokenizer.bos_token = bos_id.map(|id| tokenizer.piece(id)).unwrap_or_default();
        tokenizer.eos_token = eos_id.map(|id| tokenizer.piece(id)).unwrap_or_default();
        let mut stop_ids: Vec<u32> = eos_id.into_iter().collect();
        stop_ids.extend(END_OF_TURN_TOKENS.iter().filter_map(|t| tokenizer.id_of(t)));
        stop_ids.sort_unstable();
        stop_ids.dedup();
        tokenizer.stop_ids = stop_ids;
        // As in llama.cpp: SentencePiece files start texts with BOS unless they say not to,
        // BPE files only when they say so.
        let adds_bos = content.metadata.get("tokenizer.ggml.add_bos_token").and_then(|v| v.to_bool().ok());
        let adds_bos = adds_bos.unwrap_or(matches!(tokenizer.backend, Backend::SentencePiece(_)));
        tokenizer.added_bos = bos_id.filter(|_| adds_bos);
        Ok(tokenizer)
    }

    /// The vocabulary's spelling of token `id` (empty when there is none).
    fn piece(&self, id: u32) -> String {
        match &self.backend {
            Backend::Bpe { inner, .. } => inner.id_to_token(id).unwrap_or_default(),
            Backend::SentencePiece(spm) => spm.piece(id).to_string(),
        }
    }

    /// The bytes token `id` stands for, as the detokenizer writes them (special tokens as
    /// their text; a byte-level piece may be part of a character). Empty for an unknown id.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        match &self.backend {
            Backend::Bpe { inner, .. } => {
                let Some(piece) = inner.id_to_token(id) else { return Vec::new() };
                let special = inner.get_added_vocabulary().is_special_token(&piece);
                let mut out = Vec::with_capacity(piece.len());
                for c in piece.chars() {
                    match byte_level_byte(c).filter(|_| !special) {
                        Some(b) => out.push(b),
                        None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                out
            }
            Backend::SentencePiece(spm) => spm.decode_bytes(&[id]),
        }
    }

    /// DRY's sequence breakers mapped to this vocabulary's tokens (see
    /// [`Breakers::new`](super::sampler::Breakers::new)); the rest of a breaker that spans
    /// tokens is tokenized as plain text.
    pub fn dry_breakers(&self, breakers: &[String]) -> super::sampler::Breakers {
        let bytes: Vec<Vec<u8>> = (0..self.vocab_size() as u32).map(|id| self.token_bytes(id)).collect();
        super::sampler::Breakers::new(breakers, &bytes, |text| self.encode_text(text).unwrap_or_default())
    }

    /// The id of the token spelled `text`, if the vocabulary has one.
    fn id_of(&self, text: &str) -> Option<u32> {
        match &self.backend {
            Backend::Bpe { inner, .. } => inner.token_to_id(text),
            Backend::SentencePiece(spm) => spm.id_of(text),
        }
    }

    /// Token ids of `text`, with special tokens such as `<|im_start|>` recognised and
    /// nothing added (the chat template already has what the model needs): for the
    /// template's own text, never for what people wrote.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        self.encode_parts(&[(text, true)])
    }

    /// Token ids of `text` with special-token strings read as plain text.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        self.encode_parts(&[(text, false)])
    }

    /// Token ids of `parts`, each `(text, special)`: with `special`, special-token strings
    /// are special tokens; without, plain text.
    fn encode_parts(&self, parts: &[(&str, bool)]) -> Result<Vec<u32>, EngineError> {
        match &self.backend {
            Backend::Bpe { inner, plain } => {
                let mut ids = Vec::new();
                for &(text, special) in parts {
                    let tokenizer = if special { inner } else { plain };
                    let enc = tokenizer.encode(text, false).map_err(|e| EngineError::Tokenizer(Cause::from(e)))?;
                    ids.extend_from_slice(enc.get_ids());
                }
                Ok(ids)
            }
            // One call, so a space prefix goes only where one text would get it.
            Backend::SentencePiece(spm) => Ok(spm.encode(parts)),
        }
    }

    /// Token ids of `text[range]`, a part of a rendered conversation whose message texts
    /// are at `bodies` (sorted, not overlapping): those are read as plain text, the rest
    /// (the template's markers) with special tokens.
    pub fn encode_rendered(
        &self,
        text: &str,
        range: Range<usize>,
        bodies: &[Range<usize>],
    ) -> Result<Vec<u32>, EngineError> {
        let mut parts = Vec::new();
        let mut at = range.start;
        for body in bodies {
            let (start, end) = (body.start.max(range.start), body.end.min(range.end));
            if start >= end {
                continue;
            }
            parts.push((&text[at..start], true));
            parts.push((&text[start..end], false));
            at = end;
        }
        parts.push((&text[at..range.end], true));
        parts.retain(|(t, _)| !t.is_empty());
        self.encode_parts(&parts)
    }

    /// Text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String, EngineError> {
        match &self.backend {
            Backend::Bpe { inner, .. } => inner.decode(ids, false).map_err(|e| EngineError::Tokenizer(Cause::from(e))),
            Backend::SentencePiece(spm) => Ok(String::from_utf8_lossy(&spm.decode_bytes(ids)).into_owned()),
        }
    }

    /// The vocabulary's special tokens (control tokens such as `<|im_start|>`), by id.
    pub fn special_tokens(&self) -> Vec<(u32, String)> {
        let mut specials: Vec<(u32, String)> = match &self.backend {
            Backend::Bpe { inner, .. } => inner
                .get_added_tokens_decoder()
                .into_iter()
                .filter(|(_, t)| t.special)
                .map(|(id, t)| (id, t.content))
                .collect(),
            Backend::SentencePiece(spm) => spm.control_tokens().map(|id| (id, spm.piece(id).to_string())).collect(),
        };
        specials.sort();
        specials
    }

    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_ids.binary_search(&id).is_ok()
    }

    /// The BOS id the model expects at the start of a text, when it expects one.
    pub fn added_bos(&self) -> Option<u32> {
        self.added_bos
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::Bpe { inner, .. } => inner.get_vocab_size(true),
            Backend::SentencePiece(spm) => spm.vocab_size(),
        }
    }

    /// Whether the vocabulary has a token spelled `text` (e.g. `<start_of_turn>`).
    pub fn has_token(&self, text: &str) -> bool {
        self.id_of(text).is_some()
    }
}
