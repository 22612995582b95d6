//! The Dioxus app: a chat view streaming replies from the engine, a settings panel with
//! the memory policy's figures, and the bridge between them and the engine thread.
//!
//! - [`state`]: the pure reducer [`ChatState`] that folds `EngineEvent`s.
//! - [`app`]: [`launch`], the root component and the bridge coroutine.
//! - [`chat`], [`chat_list`], [`settings`], [`notices`]: components; [`markdown`]:
//!   reply rendering; [`chat_transfer`]: the chat list's search, Share and Import.
//! - [`models`]: the model screen (catalog, downloads, switching models).
//! - [`copy`]: the words shown for what the engine reports.
//! - [`qa`]: the `POCKETCHAT_QA_STATUS` file the end-to-end test reads (cargo feature
//!   `qa`; without it, a hook that is never there).
//! - [`pacer`]: engine events to the UI in frame-paced batches; [`meter`]: the reply's
//!   speed as shown.

pub mod app;
pub mod chat;
pub mod chat_list;
pub mod chat_transfer;
mod clock;
pub mod config;
pub mod copy;
pub mod engine_link;
pub mod fmt;
mod lifecycle;
pub mod markdown;
pub mod meter;
pub mod models;
mod monitor;
pub mod notices;
pub mod pacer;
mod platform;
#[cfg(feature = "qa")]
pub mod qa;
#[cfg(not(feature = "qa"))]
#[path = "qa_off.rs"]
pub mod qa;
pub mod settings;
pub mod state;

pub use app::{launch, App, Shell};
pub use state::ChatState;
