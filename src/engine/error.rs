//! The one error type the UI sees from the engine. Variants carry what a user or a
//! caller can act on; messages are written for people, not for logs.

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("no model file at {path} — run `pocketchat fetch` to download the default model, or pass --model PATH")]
    ModelMissing { path: PathBuf },
    #[error("could not read the model file {path}: {message}")]
    ModelLoad { path: PathBuf, message: String },
    #[error("{path} is not a usable GGUF model file: {message}")]
    BadModelFile { path: PathBuf, message: String },
    #[error("model architecture `{0}` is not supported (supported: llama, qwen2)")]
    UnsupportedArchitecture(String),
    #[error("unsupported tokenizer: {0} (pocketchat reads GPT2-style BPE tokenizers from the GGUF)")]
    UnsupportedTokenizer(String),
    #[error("the message is empty")]
    EmptyPrompt,
    #[error("the conversation does not fit the token budget of {budget} tokens")]
    ContextFull { budget: usize },
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    #[error("the reply was cancelled")]
    Cancelled,
    #[error("the engine has shut down")]
    EngineGone,
    #[error("inference failed: {0}")]
    Inference(String),
}

impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        EngineError::Inference(e.to_string())
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
