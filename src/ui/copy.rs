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

// The top bar (ui/app.rs).

/// The app's name: the window title and the top bar's heading.
pub const APP_NAME: &str = "pocketchat";

/// The status chip while the engine starts, loads (`fraction` 0–1), writes or waits.
pub const STATUS_STARTING: &str = "Starting…";
pub fn status_loading(fraction: f32) -> String {
    format!("Loading {:.0}%", fraction * 100.0)
}
pub const STATUS_WRITING: &str = "Writing…";
pub const STATUS_READY: &str = "Ready";

/// The top bar's buttons; `CHATS` also heads the chat list, `MODELS` the model screen and
/// `SETTINGS` names the settings panel.
pub const CHATS: &str = "Chats";
pub const NEW_CHAT: &str = "New chat";
pub const MODELS: &str = "Models";
pub const SETTINGS: &str = "Settings";

/// Closes the settings panel or the model screen.
pub const DONE: &str = "Done";

// The chat view (ui/chat.rs).

/// The empty chat: a headline, where the model runs (named once one is loaded) and that
/// nothing leaves the device.
pub const EMPTY_HEADLINE: &str = "What's on your mind?";
pub const EMPTY_MODEL_RUNS_HERE: &str = "The model runs on this device.";
pub fn runs_on_this_device(model_name: &str) -> String {
    format!("{model_name} runs on this device.")
}
pub const EMPTY_NOTHING_LEAVES: &str = " Nothing you type leaves it.";

/// The typing dots' label while a reply has no text yet.
pub const WRITING: &str = "Writing";

/// A reply's buttons: its Copy button's tooltip, and Regenerate.
pub const COPY_REPLY_TITLE: &str = "Copy reply";
pub const REGENERATE: &str = "Regenerate";
pub const REGENERATE_TITLE: &str = "Write this reply again";

/// A reply's length in tokens, beside its speed.
pub fn tokens(n: usize) -> String {
    if n == 1 {
        "1 token".to_string()
    } else {
        format!("{n} tokens")
    }
}

/// A user's message: its Edit button, the field it opens, and the field's buttons.
pub const EDIT: &str = "Edit";
pub const EDIT_FIELD_LABEL: &str = "Edit your message";
pub const CANCEL: &str = "Cancel";
pub const SEND: &str = "Send";

/// The composer: its placeholder without a model, while loading and when ready, its
/// label, and the Stop button shown while a reply streams.
pub const COMPOSER_NO_MODEL: &str = "No model loaded";
pub const LOADING_MODEL: &str = "Loading the model…";
pub const COMPOSER_PLACEHOLDER: &str = "Message pocketchat";
pub const COMPOSER_LABEL: &str = "Message";
pub const STOP: &str = "Stop";

// The chat list (ui/chat_list.rs).

/// Its New button, and the text shown while there is no chat.
pub const NEW: &str = "New";
pub const CHATS_EMPTY: &str = "Your chats are kept on this device.";

/// A chat's lines under its title: when it was last used and its messages, then its
/// tokens and its cache on disk (or that it is read again when opened).
pub fn chat_meta(date: &str, messages: usize) -> String {
    let noun = if messages == 1 { "message" } else { "messages" };
    format!("{date} · {messages} {noun}")
}
pub fn chat_cache(size: &str) -> String {
    format!("cache {size}")
}
pub const CHAT_REREAD_WHEN_OPENED: &str = "re-read when opened";
pub fn chat_tokens(tokens: usize, cached: &str) -> String {
    format!("{tokens} tokens · {cached}")
}

/// A chat's actions, and the field that renames it.
pub const RENAME: &str = "Rename";
pub const DELETE: &str = "Delete";
pub const DELETE_FOR_GOOD: &str = "Delete for good";
pub const KEEP: &str = "Keep";
pub const CHAT_TITLE_LABEL: &str = "Chat title";

// Notices and cards in the transcript (ui/notices.rs).

/// The Restore button under an eviction notice.
pub const RESTORE: &str = "Restore";
pub const RESTORE_TITLE: &str = "Bring back the conversation as it was before the memory warning";

/// The card shown when no model is installed: why a file is needed (before the
/// command), and what to do after it.
pub const MODEL_MISSING_WHY: &str = "pocketchat runs the model on this device, so it needs the model file first. Download the default model (SmolLM2 135M Instruct, about 100 MB) with:";
pub const MODEL_MISSING_THEN: &str = "then start the app again. On iPhone, download a model in the Models screen, or copy the .gguf file into the app's Documents folder with Finder file sharing.";

// The settings panel (ui/settings.rs).

/// Its heading, the actions at its top, and the last error.
pub const SETTINGS_HEADING: &str = "Memory & model";
pub const SETTINGS_SIMULATE_WARNING: &str = "Simulate memory warning";
pub const SETTINGS_SIMULATE_WARNING_HINT: &str =
    "Does what iOS's memory warning does: stops the reply, frees part of the context and says so.";
pub const SETTINGS_RESET_CONTEXT: &str = "Reset context";
pub const SETTINGS_LAST_ERROR: &str = "Last error";

/// The reason the Simulate button gives the engine (the log shows it).
pub const SIMULATED_REASON: &str = "simulated from settings";

/// A figure not measured yet.
pub const NO_FIGURE: &str = "—";

/// `used` of `total` (figures already written out, such as "12 MiB").
pub fn used_of(used: &str, total: &str) -> String {
    format!("{used} of {total}")
}

/// The Context section.
pub const CONTEXT: &str = "Context";
pub const TOKEN_BUDGET: &str = "Token budget";
pub const FIGURES_AFTER_FIRST_REPLY: &str = "Figures appear after the first reply.";
pub const TOKENS_IN_CONTEXT: &str = "Tokens in context";
pub const PREDICTED_FOOTPRINT: &str = "Predicted footprint (dirty)";
pub fn budget_of_tier(budget: usize, tier_budget: usize) -> String {
    format!("{budget} of the tier's {tier_budget} tokens")
}
pub const KV_CACHE: &str = "KV cache";
pub const DIRTY_MEMORY: &str = "Dirty memory (counted by the OS)";
pub const MAPPED_WEIGHTS: &str = "Weights mapped from the file (clean)";
pub const RESIDENT_MEMORY: &str = "Resident memory";
/// The speed figure: the reply's pace as shown while it streams, else the last decode.
pub const SPEED_SHOWN_NOW: &str = "Shown now";
pub const SPEED_DECODE: &str = "Decode";
pub const FIRST_TOKEN: &str = "First token";
pub const LAST_PREFILL: &str = "Last prefill";

/// The last prefill: `fed` tokens read in `time`, and `ahead` more read while the
/// message was typed.
pub fn prefill_fed(fed: usize, time: &str) -> String {
    format!("{fed} tokens in {time}")
}
pub fn prefill_all_ahead(ahead: usize) -> String {
    format!("none: all {ahead} tokens were read as you typed")
}
pub fn prefill_fed_and_ahead(fed: usize, time: &str, ahead: usize) -> String {
    format!("{fed} tokens in {time} (+{ahead} read as you typed)")
}

/// The This chat section: the system prompt's field and the chats' caches on disk.
pub const THIS_CHAT: &str = "This chat";
pub const SAVED_CHAT_CACHES: &str = "Saved chat caches";
pub const CHAT_CACHES_HINT: &str = "Past the cap, the caches of the chats used longest ago go first; their text stays and is re-read when you open them.";
pub const SYSTEM_PROMPT: &str = "System prompt";
pub const SYSTEM_PROMPT_PLACEHOLDER: &str = "The model's default";
pub const SAVE_SYSTEM_PROMPT: &str = "Save system prompt";

/// The Generation section: the sampling settings, their reset, and what makes a reply
/// repeatable.
pub const GENERATION: &str = "Generation";
pub const GENERATION_BEFORE_LOAD: &str = "Shown once the model is loaded.";
pub const TEMPERATURE: &str = "Temperature";
pub const TOP_K: &str = "Top-k";
pub const TOP_P: &str = "Top-p";
pub const MIN_P: &str = "Min-p";
pub const REPEAT_PENALTY: &str = "Repeat penalty";
pub const DRY_MULTIPLIER: &str = "DRY multiplier (0 = off)";
pub const DRY_BASE: &str = "DRY base";
pub const DRY_ALLOWED_LENGTH: &str = "DRY allowed length";
pub const RESET_SAMPLING: &str = "Reset to the model's defaults";
pub const GREEDY_HINT: &str = "Temperature 0: greedy, the same reply every time.";
pub fn seed_hint(seed: u64) -> String {
    format!("Seed {seed}: the same conversation gives the same reply.")
}
/// Beside a setting changed from the model's default.
pub fn model_default(default: f32) -> String {
    format!(" model: {default}")
}

/// The Device section.
pub const DEVICE: &str = "Device";
pub const DETECTING_MEMORY: &str = "Detecting memory…";
pub const PHYSICAL_MEMORY: &str = "Physical memory";
pub const DETECTED_TIER: &str = "Detected tier";
pub const BF16: &str = "BF16 (newer chip)";
pub const YES: &str = "yes";
pub const NO: &str = "no";
pub const TIER: &str = "Tier";
pub fn tier_auto(detected: &str) -> String {
    format!("Auto ({detected})")
}
pub fn tier_overridden(detected: &str) -> String {
    format!("Overridden for QA — detected {detected}.")
}
pub const POLICY: &str = "Policy";
pub fn policy(weights: &str, tokens: usize, ceiling: &str) -> String {
    format!("{weights} weights · {tokens} tokens · {ceiling} ceiling")
}
pub const BUDGET_SET_BY: &str = "Budget set by";
pub const COMPUTE_THREADS: &str = "Compute threads";
pub fn threads_of_cores(threads: usize, cores: usize) -> String {
    format!("{threads} of {cores} cores")
}

/// The Model section.
pub const MODEL: &str = "Model";
pub const NO_MODEL_YET: &str = "No model loaded yet.";
pub const FILE: &str = "File";
pub const FILE_SIZE: &str = "File size";
pub const WEIGHTS_LOADED: &str = "Weights (loaded)";
pub const ARCHITECTURE: &str = "Architecture";
pub fn architecture(name: &str, layers: usize) -> String {
    format!("{name} · {layers} layers")
}
pub fn kv_per_token(dtype: &str, bytes: &str) -> String {
    format!("{dtype} · {bytes} per token")
}
pub fn recurrent_state(bytes: &str, checkpoints: usize) -> String {
    format!("{bytes} · with {checkpoints} {RECURRENT_STATE_CHECKPOINTS}")
}
pub const RUNS_ON: &str = "Runs on";

/// The Trims and evictions section: the last save, then the log.
pub const TRIMS_AND_EVICTIONS: &str = "Trims and evictions";
pub const SAVED: &str = "Saved";
pub fn saved_at(bytes: &str, time_taken: &str, at: &str) -> String {
    format!("{bytes} in {time_taken} at {at}")
}
pub const NONE_YET: &str = "None yet.";

// The model screen (ui/models/).

/// Its field that downloads a GGUF by URL.
pub const ADD_BY_URL: &str = "Add by URL";
pub const MODEL_URL_PLACEHOLDER: &str = "https://huggingface.co/…/model.gguf";
pub const DOWNLOAD: &str = "Download";

/// A model's row: the token budget it would get and why, the tier's pick, what is not
/// supported, and the transfer under way.
pub fn model_budget(budget: usize, why: &str) -> String {
    format!("{budget} tokens · {why}")
}
pub const TIER_PICK: &str = "The file of this model for this device: the most bits that fit";
pub fn not_supported_yet(why: &str) -> String {
    format!("Not supported yet: {why}")
}
pub const VERIFYING: &str = "Verifying";
pub const DOWNLOADING: &str = "Downloading";

/// A model's actions.
pub const IN_USE: &str = "In use";
pub const USE: &str = "Use";
pub const USE_ANYWAY: &str = "Use anyway";
pub const RESUME: &str = "Resume";
pub const DELETE_FOR_GOOD_ASK: &str = "Delete for good?";

/// A model's details: a catalog entry (parameters, quantization, size, license), a file
/// found in the folder (with its bits per weight once read), one being added by URL.
pub fn catalog_detail(params: &str, quant: &str, size: &str, license: &str) -> String {
    format!("{params} params · {quant} · {size} · {license}")
}
pub fn added_file(size: &str) -> String {
    format!("added file · {size}")
}
pub fn added_file_bits(bits_per_weight: f64, size: &str) -> String {
    format!("added file · {bits_per_weight:.1} bits per weight · {size}")
}
pub fn from_url(url: &str) -> String {
    format!("from {url}")
}
/// How a catalog entry without a URL gets onto the device.
pub fn fetched_elsewhere(id: &str) -> String {
    format!("Fetched with `{FETCH_COMMAND} {id}` on a computer.")
}
/// Why a model that does not fit gets no budget.
pub const DOES_NOT_FIT: &str = "does not fit";

/// A download's progress: "12.0 of 93.5 MiB · 2.1 MiB/s · 40 s left", or verifying.
pub const VERIFYING_NOW: &str = "Verifying…";
pub fn per_second(rate: &str) -> String {
    format!(" · {rate}/s")
}
pub fn seconds_left(seconds: u64) -> String {
    format!(" · {seconds} s left")
}

/// The model screen's notices.
pub fn already_in_folder(file: &str) -> String {
    format!("{file} is already in the models folder.")
}
pub fn loading_named(name: &str) -> String {
    format!("Loading {name}…")
}
pub fn downloaded_and_verified(name: &str) -> String {
    format!("Downloaded and verified {name}.")
}
pub fn download_cancelled(name: &str) -> String {
    format!("Cancelled {name}; Download resumes where it stopped.")
}
pub fn download_not_started(why: &str) -> String {
    format!("Could not start the download: {why}")
}
pub const MODEL_NO_LONGER_LISTED: &str = "That model is no longer listed.";
pub fn model_downloading(name: &str) -> String {
    format!("{name} is downloading: cancel it first.")
}
pub fn model_in_use(name: &str) -> String {
    format!("{name} is in use: switch to another model first.")
}
pub fn model_deleted(name: &str) -> String {
    format!("Deleted {name}.")
}
pub fn model_not_deleted(name: &str, errors: &str) -> String {
    format!("Could not delete {name}: {errors}")
}

// Notices and log lines written by the chat state (ui/state/).

/// The settings log's line and the notice (with its detail) when the context was trimmed
/// to fit the budget.
pub fn trimmed_log(dropped_tokens: usize, kept_tokens: usize) -> String {
    format!("Trimmed {dropped_tokens} tokens to fit the budget, kept {kept_tokens}")
}
pub fn trimmed_text(dropped_tokens: usize) -> String {
    format!("Earlier messages were trimmed to fit the budget ({dropped_tokens} tokens dropped)")
}
pub fn trimmed_detail(kept_tokens: usize) -> String {
    format!("{kept_tokens} tokens kept")
}

/// A memory warning's figures (`freed` written out, such as "12 MiB"), its log line, and
/// the notice's detail with the warning's reason.
pub fn evicted_figures(before_tokens: usize, after_tokens: usize, freed: &str) -> String {
    format!("{before_tokens} → {after_tokens} tokens, {freed} freed")
}
pub fn evicted_log(reason: &str, figures: &str) -> String {
    format!("Memory warning ({reason}): {figures}")
}
pub fn evicted_detail(figures: &str, reason: &str) -> String {
    format!("{figures} · {reason}")
}

/// A conversation brought back from its cache: the log line, the notices' headlines and
/// their detail.
pub fn restored_log(count: usize, tokens: usize) -> String {
    let noun = if count == 1 { "message" } else { "messages" };
    format!("Restored {count} {noun} ({tokens} tokens) without re-prefill")
}
pub const CONVERSATION_RESTORED: &str = "Conversation restored";
pub const CHAT_RESUMED: &str = "Chat resumed from its cache";
pub fn resumed_detail(count: usize, tokens: usize) -> String {
    let noun = if count == 1 { "message" } else { "messages" };
    format!("{count} {noun}, {tokens} tokens, no re-prefill")
}

/// The log line of a chat opened: from its cache, or read again at the next message.
pub fn opened_log(title: &str, count: usize, tokens: usize, resumed: bool) -> String {
    let how = if resumed { "resumed from its cache, no re-prefill" } else { "re-read at your next message" };
    format!("Opened “{title}”: {count} messages, {tokens} tokens, {how}")
}

/// The log line for another version shown when the cache kept up to the fork.
pub fn version_shown_log(kept_tokens: usize, fed_tokens: usize) -> String {
    format!("{VERSION_SHOWN_LOG}: {kept_tokens} cached tokens kept, {fed_tokens} fed")
}

/// The notice under a reply that failed.
pub fn reply_failed(message: &str) -> String {
    format!("This reply failed: {message}")
}
