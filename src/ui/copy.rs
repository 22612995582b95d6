//! The words the app shows for what the engine reports: notice texts, labels and the
//! load-failure card. Kept apart from the reducer so the copy can be read (and changed)
//! in one place.

use crate::engine::DoneReason;

use super::state::LoadFailure;

/// The command that installs the default model; shown when no model is installed.
pub const FETCH_COMMAND: &str = "pocketchat fetch";

/// Text of the notice shown when a memory warning evicted part of the context.
pub const EVICTED_TEXT: &str = "Memory limit reached — earlier messages were forgotten";

/// Text of the notice shown when a memory warning stopped the reply but the context had
/// nothing older to drop (every eviction notice starts with [`EVICTED_PREFIX`]).
pub const EVICTED_NOTHING_TEXT: &str =
    "Memory limit reached — the reply was stopped; there was nothing older to forget";

/// How every eviction notice begins.
pub const EVICTED_PREFIX: &str = "Memory limit reached";

/// The card shown when the model could not be loaded.
pub(crate) fn load_failure(message: &str) -> LoadFailure {
    LoadFailure {
        title: "The model could not be loaded".into(),
        message: message.to_string(),
        command: None,
        missing: false,
    }
}

/// A short label for replies that did not end normally.
pub fn done_label(reason: DoneReason) -> Option<&'static str> {
    match reason {
        DoneReason::EndOfTurn => None,
        DoneReason::MaxTokens => Some("Reply length limit reached"),
        DoneReason::Stopped => Some("Stopped"),
        DoneReason::MemoryWarning => Some("Interrupted by a memory warning"),
        DoneReason::BudgetExhausted => Some("Token budget reached"),
    }
}
