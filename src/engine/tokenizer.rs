//! The tokenizer that ships inside the GGUF, with the pre-tokenizer repaired so ids match
//! llama.cpp exactly.
//!
//! candle's `Tokenizer::from_gguf` maps unknown `tokenizer.ggml.pre` values (SmolLM's
//! `smollm`, plain `gpt2`) to `ByteLevel::default()`, which adds a prefix space: "Hello"
//! would become "ĠHello" (38699) instead of 19556, and `<|im_start|>user` would tokenize
//! "Ġuser". Those files use the GPT-2 split without a prefix space.

use candle_core::quantized::gguf_file;
use candle_core::quantized::tokenizer::TokenizerFromGguf;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::Tokenizer;

use super::EngineError;

pub struct TextTokenizer {
    inner: Tokenizer,
    /// Ids that end an assistant turn (EOS, `<|im_end|>`, `<|eot_id|>`, …).
    stop_ids: Vec<u32>,
    bos_token: String,
    eos_token: String,
}

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
        let mut inner =
            Tokenizer::from_gguf(content).map_err(|e| EngineError::UnsupportedTokenizer(e.to_string()))?;
        let pre = content.metadata.get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok()).cloned();
        if matches!(pre.as_deref(), None | Some("smollm") | Some("gpt2") | Some("default")) {
            inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        }
        let token_at = |key: &str| -> Option<u32> { content.metadata.get(key).and_then(|v| v.to_u32().ok()) };
        let vocab = inner.get_vocab(true);
        let name_of = |id: Option<u32>| -> String {
            id.and_then(|id| inner.id_to_token(id)).unwrap_or_default()
        };
        let eos_id = token_at("tokenizer.ggml.eos_token_id");
        let mut stop_ids: Vec<u32> = eos_id.into_iter().collect();
        stop_ids.extend(END_OF_TURN_TOKENS.iter().filter_map(|t| vocab.get(*t).copied()));
        stop_ids.sort_unstable();
        stop_ids.dedup();
        Ok(TextTokenizer {
            bos_token: name_of(token_at("tokenizer.ggml.bos_token_id")),
            eos_token: name_of(eos_id),
            inner,
            stop_ids,
        })
    }

    /// Token ids of `text`, with special tokens such as `<|im_start|>` recognised and
    /// nothing added (the chat template already has what the model needs).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let enc = self.inner.encode(text, false).map_err(|e| EngineError::Inference(format!("tokenizer: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String, EngineError> {
        self.inner.decode(ids, false).map_err(|e| EngineError::Inference(format!("tokenizer: {e}")))
    }

    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_ids.binary_search(&id).is_ok()
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
