//! pocketchat: on-device chat with a persistent KV cache, memory-aware token budgets and
//! graceful eviction on memory warnings. See `docs/architecture.md`.

pub mod calendar;
pub mod catalog;
pub mod chats;
pub mod engine;
pub mod files;
pub mod gguf;
pub mod memory;
pub mod transcript;
#[cfg(feature = "ui")]
pub mod ui;
