//! The tokenizer that ships inside the GGUF, with the pre-tokenizer repaired so ids match
//! llama.cpp exactly.
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
use tokenizers::Tokenizer;

use super::{Cause, EngineError};

pub struct TextTokenizer {
    inner: Tokenizer,
    /// The same tokenizer with special-token strings read as text: for what people wrote.
    plain: Tokenizer,
    /// Ids that end an assistant turn (EOS, `<|im_end|>`, `<|eot_id|>`, …).
    stop_ids: Vec<u32>,
    bos_token: String,
    eos_token: String,
    /// The BOS id when the file says the model starts every text with it
    /// (`tokenizer.ggml.add_bos_token`; BPE vocabularies default to no, as in llama.cpp).
    added_bos: Option<u32>,
}

/// GGUF `tokenizer.ggml.pre` values whose pre-tokenizer (GPT-2 byte-level) this
/// tokenizer reproduces; others (Llama 3's, Qwen's) split text differently.
pub const SUPPORTED_PRE_TOKENIZERS: &[&str] = &["smollm", "gpt2", "default"];

/// Token strings that end a turn in the chat templates we know.
const END_OF_TURN_TOKENS: &[&str] = &["<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>"];

impl TextTokenizer {
    pub fn from_gguf(content: &gguf_file::Content) -> Result<TextTokenizer, EngineError> {
        let kind = content
            .metadata
            .get("tokenizer.ggml.model")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .ok_or_else(|| EngineError::UnsupportedTokenizer("the file has no tokenizer".into()))?;
        if kind != "gpt2" {
            return Err(EngineError::UnsupportedTokenizer(format!(
                "`{kind}` (SentencePiece and other non-BPE tokenizers are not supported)"
            )));
        }
        let mut inner = Tokenizer::from_gguf(content).map_err(|e| EngineError::UnsupportedTokenizer(e.to_string()))?;
        let pre = content.metadata.get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok()).cloned();
        if pre.as_deref().is_none_or(|p| SUPPORTED_PRE_TOKENIZERS.contains(&p)) {
            inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        }
        let token_at = |key: &str| -> Option<u32> { content.metadata.get(key).and_then(|v| v.to_u32().ok()) };
        let vocab = inner.get_vocab(true);
        let name_of = |id: Option<u32>| -> String { id.and_then(|id| inner.id_to_token(id)).unwrap_or_default() };
        let eos_id = token_at("tokenizer.ggml.eos_token_id");
        let mut stop_ids: Vec<u32> = eos_id.into_iter().collect();
        stop_ids.extend(END_OF_TURN_TOKENS.iter().filter_map(|t| vocab.get(*t).copied()));
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let bos_id = token_at("tokenizer.ggml.bos_token_id");
        let bos_token = name_of(bos_id);
        let eos_token = name_of(eos_id);
        let adds_bos = content.metadata.get("tokenizer.ggml.add_bos_token").and_then(|v| v.to_bool().ok());
        let added_bos = bos_id.filter(|id| adds_bos == Some(true) && (*id as usize) < vocab.len());
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        Ok(TextTokenizer { bos_token, eos_token, inner, plain, stop_ids, added_bos })
    }

    /// Token ids of `text`, with special tokens such as `<|im_start|>` recognised and
    /// nothing added (the chat template already has what the model needs): for the
    /// template's own text, never for what people wrote.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let enc = self.inner.encode(text, false).map_err(|e| EngineError::Tokenizer(Cause::from(e)))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of `text` with special-token strings read as plain text.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let enc = self.plain.encode(text, false).map_err(|e| EngineError::Tokenizer(Cause::from(e)))?;
        Ok(enc.get_ids().to_vec())
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
        let mut ids = Vec::new();
        let mut at = range.start;
        for body in bodies {
            let (start, end) = (body.start.max(range.start), body.end.min(range.end));
            if start >= end {
                continue;
            }
            ids.extend(self.encode(&text[at..start])?);
            ids.extend(self.encode_text(&text[start..end])?);
            at = end;
        }
        ids.extend(self.encode(&text[at..range.end])?);
        Ok(ids)
    }

    /// Text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String, EngineError> {
        self.inner.decode(ids, false).map_err(|e| EngineError::Tokenizer(Cause::from(e)))
    }

    /// The vocabulary's special tokens (control tokens such as `<|im_start|>`), by id.
    pub fn special_tokens(&self) -> Vec<(u32, String)> {
        let mut specials: Vec<(u32, String)> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (id, t.content))
            .collect();
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
        self.inner.get_vocab_size(true)
    }
}
