//! The QA hook of a build without the `qa` cargo feature (the app people run): a type
//! with no values, so every `Option<QaHook>` is `None` and the calls on it compile to
//! nothing. See `qa.rs` for the hook itself.

use std::path::PathBuf;

use super::meter::ReplyTiming;
use super::state::ChatState;

/// The environment variable the QA build reads; this one only warns that it is ignored.
pub const QA_STATUS_ENV: &str = "POCKETCHAT_QA_STATUS";

#[derive(Clone)]
pub enum QaHook {}

impl QaHook {
    /// `None`: this build writes no status file.
    pub fn open(_path: PathBuf) -> Option<QaHook> {
        None
    }

    pub fn report_state(&self, _state: &ChatState) {
        match *self {}
    }

    pub fn report_models(&self, _models: serde_json::Value) {
        match *self {}
    }

    pub fn report_reply(&self, _timing: ReplyTiming) {
        match *self {}
    }

    pub fn watch_controls(&self) {
        match *self {}
    }

    pub fn watch_first_paint(&self) {
        match *self {}
    }

    pub fn watch_last_paint(&self) {
        match *self {}
    }
}
