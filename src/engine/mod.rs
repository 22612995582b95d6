//! The inference engine: a GGUF llama/qwen2 model with an explicit KV-cache [`State`],
//! the tokenizer and chat template that come with the file, the token budget planner,
//! and the engine thread that owns all of it and streams [`EngineEvent`]s.
//!
//! Nothing here imports the UI.

pub mod budget;
pub mod cpu;
mod error;
pub mod kv_type;
pub mod model;
pub mod perplexity;
pub mod persist;
pub mod protocol;
pub mod sampler;
pub mod session;
pub mod state;
pub mod text;

pub use error::{Cause, EngineError, Result};
// The CPU modules by their former paths too (`engine::kernels::Kernels`, ...), for the
// tests and benchmarks that name them.
pub use cpu::{kernels, pool, qlinear};
// The text modules by their former paths too (`engine::template::Message`, ...).
pub use kernels::Kernels;
pub use model::{Model, ModelConfig, SUPPORTED_ARCHITECTURES};
pub use protocol::{Command, DoneReason, EngineEvent, ModelInfo, Stats};
pub use session::{DraftExtent, DraftFed, Session, Switched, TrimMode, DRAFT_STEP};
pub use state::State;
pub use text::{pretokenize, spm, template, tokenizer};
pub mod weights;
mod worker;

pub use worker::{
    Engine, EngineConfig, EngineEvents, EngineHandle, EngineThread, HeadroomProbe, KvDtype, TYPING_PAUSE,
};
