//! The one error type the UI sees from the engine. Variants carry what a user or a
//! caller can act on; messages are written for people, not for logs. An underlying
//! error is kept as a [`Cause`], so `source()` still walks its chain.

use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("no model file at {path} — run `pocketchat fetch` to download the default model, or pass --model PATH")]
    ModelMissing { path: PathBuf },
    #[error("could not read the model file {path}: {source}")]
    ModelLoad { path: PathBuf, source: Cause },
    #[error("{path} is not a usable GGUF model file: {message}")]
    BadModelFile { path: PathBuf, message: String },
    #[error(
        "model architecture `{0}` is not supported (supported: {supported})",
        supported = crate::engine::model::SUPPORTED_ARCHITECTURES.join(", ")
    )]
    UnsupportedArchitecture(String),
    #[error("unsupported tokenizer: {0}")]
    UnsupportedTokenizer(String),
    #[error(
        "{name} needs about {footprint_mib} MiB at its smallest usable context, over this device's {ceiling_mib} MiB \
         limit: choose a smaller model or a 4-bit file (or load it anyway with --allow-too-large)"
    )]
    TooLarge { name: String, footprint_mib: u64, ceiling_mib: u64 },
    #[error("the model is not loaded yet")]
    NotReady,
    #[error("the message is empty")]
    EmptyPrompt,
    #[error("the conversation does not fit the token budget of {budget} tokens")]
    ContextFull { budget: usize },
    #[error(
        "the system prompt is {tokens} tokens long: with {reserve} tokens kept for the reply, it leaves no room for a \
         message in the token budget of {budget} tokens; shorten the system prompt"
    )]
    SystemPromptTooLong { tokens: usize, reserve: usize, budget: usize },
    #[error("the engine has shut down")]
    EngineGone,
    #[error("the tokenizer failed: {0}")]
    Tokenizer(#[source] Cause),
    #[error("the chat template failed: {0}")]
    Template(#[source] Cause),
    #[error("inference failed: {0}")]
    Inference(#[source] Cause),
}

impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        EngineError::Inference(Cause::new(e))
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// An underlying error, shared so that the events carrying it stay `Clone`. It reads as
/// the error it wraps and hands on that error's own source. Two causes are equal when
/// they read the same (events are compared in tests).
#[derive(Debug, Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync>);

impl Cause {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Cause(Arc::new(error))
    }

    /// A cause that is only a message (no underlying error value).
    pub fn msg(message: impl Into<String>) -> Self {
        Cause::from(Box::<dyn std::error::Error + Send + Sync>::from(message.into()))
    }
}

impl From<Box<dyn std::error::Error + Send + Sync>> for Cause {
    fn from(error: Box<dyn std::error::Error + Send + Sync>) -> Self {
        Cause(Arc::from(error))
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.to_string() == other.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn a_cause_keeps_the_chain_of_the_error_it_wraps() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = EngineError::ModelLoad { path: "m.gguf".into(), source: Cause::new(io) };
        assert_eq!(e.to_string(), "could not read the model file m.gguf: denied");
        assert_eq!(e.source().unwrap().to_string(), "denied");
        let clone = e.clone();
        assert_eq!(clone, e);
        assert_ne!(EngineError::Inference(Cause::msg("a")), EngineError::Inference(Cause::msg("b")));
    }
}
