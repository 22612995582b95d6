//! The words the app shows: notice texts, labels, the chat list's search, Share and
//! Import, and the load-failure card. Kept apart from the reducer so the copy can be read (and changed)
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

/// A code block's Copy button: its label, its tooltip and its label once it has copied.
pub const COPY: &str = "Copy";
pub const COPY_CODE_TITLE: &str = "Copy code";
pub const COPIED: &str = "Copied";

/// The chat list's search field.
pub const SEARCH_PLACEHOLDER: &str = "Search chats";

/// Shown when no chat holds the text searched for.
pub fn no_chat_holds(query: &str) -> String {
    format!("No chat holds “{}”.", query.trim())
}

/// Export and import in the chat list.
pub const SHARE_ALL: &str = "Share all";
pub const SHARE_ALL_TITLE: &str = "Save every chat as Markdown (to read) and JSON (to import elsewhere)";
pub const SHARE: &str = "Share";
pub const SHARE_TITLE: &str = "Save this chat as Markdown (to read) and JSON (to import elsewhere)";
pub const IMPORT: &str = "Import";
pub const IMPORT_TITLE: &str = "Add the chats of an exported JSON file";
pub const EXPORTING: &str = "Saving…";
pub const IMPORTING: &str = "Importing…";

/// What an export wrote.
pub fn exported(e: &crate::chats::export::Exported) -> String {
    let noun = if e.chats == 1 { "chat" } else { "chats" };
    let mut text = format!("Saved {} {noun} to {} and {}", e.chats, e.markdown.display(), e.json.display());
    if !e.unreadable.is_empty() {
        text.push_str(&format!(" ({} unreadable left out)", e.unreadable.len()));
    }
    text
}

/// Why an export or import failed when its thread ended without an answer.
pub const STOPPED_EARLY: &str = "it stopped before it finished";

pub fn export_failed(why: &str) -> String {
    format!("Nothing was saved: {why}")
}

/// What an import added.
pub fn imported(count: usize) -> String {
    if count == 1 {
        "Imported 1 chat".to_string()
    } else {
        format!("Imported {count} chats")
    }
}

pub fn import_failed(why: &str) -> String {
    format!("Nothing was imported: {why}")
}
