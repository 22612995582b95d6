//! The words the app shows for what the engine reports: notice texts, labels and the
//! load-failure card's headlines. Kept apart from the reducer so the copy can be read
//! (and changed) in one place; plain strings only, no types of the engine or the state.

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
