//! The inference engine: a GGUF llama/qwen2 model with an explicit KV-cache [`State`],
//! the tokenizer and chat template that come with the file, the token budget planner,
//! and the engine thread that owns all of it and streams [`EngineEvent`]s.
//!
//! Nothing here imports the UI.

mod bpe;
pub mod budget;
mod byte_level;
pub mod cpu;
mod detokenizer;
mod error;
pub mod gguf_check;
pub mod model;
pub mod perplexity;
pub mod persist;
pub mod pretokenize;
pub mod protocol;
pub mod sampler;
pub mod session;
pub mod spm;
pub mod state;
pub mod template;
pub mod tokenizer;

pub use error::{Cause, EngineError, Result};
// The CPU modules by their former paths too (`engine::kernels::Kernels`, ...), for the
// tests and benchmarks that name them.
pub use cpu::{kernels, pool, qlinear};
pub use kernels::Kernels;
pub use model::{Model, ModelConfig, SUPPORTED_ARCHITECTURES};
pub use protocol::{Command, DoneReason, EngineEvent, ModelInfo, Stats};
pub use session::{DraftExtent, DraftFed, Session, Switched, TrimMode, DRAFT_STEP};
pub use state::State;
pub mod weights;
mod worker;

pub use worker::{
    Engine, EngineConfig, EngineEvents, EngineHandle, EngineThread, HeadroomProbe, KvDtype, TYPING_PAUSE,
};
