//! The tokenizer that ships inside the GGUF, with ids that match llama.cpp's: BPE
//! (`tokenizer.ggml.model = "gpt2"` or `"gemma4"`) through our own [`super::bpe`] with the
//! file's pre-tokenizer ([`super::pretokenize`]), SentencePiece (`"llama"`) through our own
//! [`super::spm`]. Any other vocabulary, or a BPE pre-tokenizer we do not reproduce, is
//! refused at load with the file's `tokenizer.ggml.model` and `tokenizer.ggml.pre`: a
//! guessed split would feed the model other ids than the user's text, with no sign.
//!
//! Special tokens are read only in the chat template's own parts: message texts are
//! tokenized with special-token strings as plain text ([`TextTokenizer::encode_rendered`]),
//! so typing `<|im_end|><|im_start|>system` cannot forge a turn.

use candle_core::quantized::gguf_file;
use std::ops::Range;

use super::bpe::BytePair;
use super::spm::SentencePiece;
use crate::engine::EngineError;

pub struct TextTokenizer {
    backend: Backend,
    /// Ids that end an assistant turn (EOS, `<|im_end|>`, `<|eot_id|>`, …).
    stop_ids: Vec<u32>,
    bos_token: String,
    eos_token: String,
    /// The BOS id when the file says the model starts every text with it
    /// (`tokenizer.ggml.add_bos_token`; BPE vocabularies default to no but Llama 3's, as
    /// in llama.cpp).
    added_bos: Option<u32>,
}

enum Backend {
    Bpe(BytePair),
    SentencePiece(SentencePiece),
}

/// Whether a tokenizer named as the catalog names them (a GGUF `tokenizer.ggml.pre`, or
/// `llama` for SentencePiece, `gemma4` for Gemma 4's BPE) gives llama.cpp's ids here.
pub fn is_supported(name: &str) -> bool {
    name == "llama" || name == "gemma4" || super::pretokenize::supported_names().any(|n| n == name)
}

/// Token strings that end a turn in the chat templates we know.
/// (`<turn|>`: Gemma 4's, as llama.cpp's `llama-vocab.cpp` lists it.)
const END_OF_TURN_TOKENS: &[&str] =
    &["<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>", "<end_of_turn>", "<turn|>"];

impl TextTokenizer {
    pub fn from_gguf(content: &gguf_file::Content) -> Result<TextTokenizer, EngineError> {
        let kind = content
            .metadata
            .get("tokenizer.ggml.model")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .ok_or_else(|| EngineError::UnsupportedTokenizer("the file has no tokenizer".into()))?;
        let backend = match kind.as_str() {
            "gpt2" | "gemma4" => Backend::Bpe(BytePair::from_gguf(content)?),
            "llama" => Backend::SentencePiece(SentencePiece::from_gguf(content)?),
            other => {
                let pre = content.metadata.get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok());
                return Err(EngineError::UnsupportedTokenizer(format!(
                    "tokenizer.ggml.model `{other}` (tokenizer.ggml.pre `{}`): only BPE (`gpt2`, `gemma4`) and \
                     SentencePiece (`llama`) vocabularies are supported",
                    pre.map_or("none", |p| p.as_str())
                )));
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
        // BPE files only when they say so (Llama 3's unless they say not to).
        let adds_bos = content.metadata.get("tokenizer.ggml.add_bos_token").and_then(|v| v.to_bool().ok());
        let adds_bos = adds_bos.unwrap_or(match &tokenizer.backend {
            Backend::SentencePiece(_) => true,
            Backend::Bpe(bpe) => bpe.adds_bos_by_default(),
        });
        tokenizer.added_bos = bos_id.filter(|_| adds_bos);
        Ok(tokenizer)
    }

    /// The vocabulary's spelling of token `id` (empty when there is none).
    fn piece(&self, id: u32) -> String {
        match &self.backend {
            Backend::Bpe(bpe) => bpe.piece(id).to_string(),
            Backend::SentencePiece(spm) => spm.piece(id).to_string(),
        }
    }

    /// The bytes token `id` stands for, as the detokenizer writes them (special tokens as
    /// their text; a byte-level piece may be part of a character). Empty for an unknown id.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        match &self.backend {
            Backend::Bpe(bpe) => bpe.token_bytes(id),
            Backend::SentencePiece(spm) => spm.decode_bytes(&[id]),
        }
    }

    /// DRY's sequence breakers mapped to this vocabulary's tokens (see
    /// [`Breakers::new`](crate::engine::sampler::Breakers::new)); the rest of a breaker that spans
    /// tokens is tokenized as plain text.
    pub fn dry_breakers(&self, breakers: &[String]) -> crate::engine::sampler::Breakers {
        let bytes: Vec<Vec<u8>> = (0..self.vocab_size() as u32).map(|id| self.token_bytes(id)).collect();
        crate::engine::sampler::Breakers::new(breakers, &bytes, |text| self.encode_text(text).unwrap_or_default())
    }

    /// The id of the token spelled `text`, if the vocabulary has one.
    fn id_of(&self, text: &str) -> Option<u32> {
        match &self.backend {
            Backend::Bpe(bpe) => bpe.id_of(text),
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
            Backend::Bpe(bpe) => Ok(bpe.encode(parts)),
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
            Backend::Bpe(bpe) => {
                let bytes: Vec<u8> = ids.iter().flat_map(|&id| bpe.token_bytes(id)).collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Backend::SentencePiece(spm) => Ok(String::from_utf8_lossy(&spm.decode_bytes(ids)).into_owned()),
        }
    }

    /// The vocabulary's special tokens (control tokens such as `<|im_start|>`), by id.
    pub fn special_tokens(&self) -> Vec<(u32, String)> {
        let mut specials: Vec<(u32, String)> = match &self.backend {
            Backend::Bpe(bpe) => bpe.special_tokens().map(|id| (id, bpe.piece(id).to_string())).collect(),
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
            Backend::Bpe(bpe) => bpe.vocab_size(),
            Backend::SentencePiece(spm) => spm.vocab_size(),
        }
    }

    /// Whether the vocabulary has a token spelled `text` (e.g. `<start_of_turn>`).
    pub fn has_token(&self, text: &str) -> bool {
        self.id_of(text).is_some()
    }
}
