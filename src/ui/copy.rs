//! The words the app shows: notice texts, labels, the load-failure card's headlines and
//! the chat list's search, Share and Import. Kept apart from the reducer so the copy can
//! be read (and changed) in one place; plain strings only, no types of the engine or the
//! state.

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

/// Headlines of the card shown when the model cannot be used.
pub const NO_MODEL_TITLE: &str = "No model installed";
pub const LOAD_FAILED_TITLE: &str = "The model could not be loaded";
pub const ENGINE_STOPPED_TITLE: &str = "The engine stopped";

/// Labels of replies that did not end normally: the reply length limit, the Stop button,
/// a memory warning, the token budget.
pub const DONE_MAX_TOKENS: &str = "Reply length limit reached";
pub const DONE_STOPPED: &str = "Stopped";
pub const DONE_MEMORY_WARNING: &str = "Interrupted by a memory warning";
pub const DONE_BUDGET_EXHAUSTED: &str = "Token budget reached";

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

/// What an export wrote: `chats` chats into the files `markdown` and `json`, leaving out
/// `unreadable` chats whose record could not be read.
pub fn exported(chats: usize, markdown: &str, json: &str, unreadable: usize) -> String {
    let noun = if chats == 1 { "chat" } else { "chats" };
    let mut text = format!("Saved {chats} {noun} to {markdown} and {json}");
    if unreadable > 0 {
        text.push_str(&format!(" ({unreadable} unreadable left out)"));
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

/// The notice under a version of a message that the cache could not keep.
pub const VERSION_REREAD_TEXT: &str = "This version is read again at your next message";

/// The settings log's line for another version of a message shown: the cache kept up to
/// the fork (followed by the figures), or not.
pub const VERSION_SHOWN_LOG: &str = "Showed another version";
pub const VERSION_SHOWN_REREAD_LOG: &str = "Showed another version: it is read again at the next message";

/// Labels of the version switch (`<` `n/m` `>`) at a message with other versions.
pub const PREVIOUS_VERSION: &str = "Previous version";
pub const NEXT_VERSION: &str = "Next version";

/// What the Edit button of a message says it does.
pub const EDIT_TITLE: &str = "Edit your message (what followed stays as another version)";

/// The settings panel's row for a hybrid model's recurrent state (shown only when the
/// model has one): its label, and what the figure holds besides the state itself.
pub const RECURRENT_STATE_LABEL: &str = "Recurrent state";
pub const RECURRENT_STATE_CHECKPOINTS: &str = "turn checkpoints";

/// The composer's switch for models that can think before they answer.
pub const THINK_SWITCH: &str = "Think before answering";
pub const THINK_SWITCH_TITLE: &str =
    "The model reasons step by step before it answers (slower, often better); applies to this chat";

/// The disclosure above a reply while its thinking is written.
pub const THINKING: &str = "Thinking…";

/// The disclosure above a reply that thought, once the answer has begun.
pub fn thought_for(tokens: usize) -> String {
    match tokens {
        0 => "Thought".to_string(),
        1 => "Thought for 1 token".to_string(),
        n => format!("Thought for {n} tokens"),
    }
}
