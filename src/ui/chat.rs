//! The chat view: the message list (auto-scrolled by the page script while the reader
//! is at the bottom), the empty / loading / error states, and the composer (Enter
//! sends, Shift+Enter adds a line, Stop while a reply streams).

use std::cell::RefCell;
use std::rc::Rc;

use dioxus::prelude::*;

use crate::engine::Command;

use super::config::UiConfig;
use super::copy;
use super::engine_link::send_command;
use super::fmt::format_rate;
use super::markdown::{MarkdownBlocks, OpenHtml};
use super::notices::{LoadFailureCard, LoadingCard, NoticeView};
use super::platform;
use super::state::{ChatState, Entry, Message, MessageMark, Phase, Role};

/// Messages, notices and the composer.
///
/// Each part reads a narrow memo of the state, so a batch of streamed tokens re-renders
/// the streaming reply and nothing else: the list itself changes only when a line is
/// added or removed, and a finished message only when its own figures change.
#[component]
pub fn ChatView(state: ReadSignal<ChatState>) -> Element {
    let phase = use_memo(move || state.read().phase.clone());
    let ids = use_memo(move || state.read().entries.iter().map(Entry::id).collect::<Vec<_>>());
    let awaiting = use_memo(move || state.read().awaiting_reply);
    let empty_with_model = use_memo(move || {
        let s = state.read();
        (s.entries.is_empty() && s.is_ready()).then(|| s.model.as_ref().map(|m| m.name.clone()).unwrap_or_default())
    });
    let composer = use_memo(move || {
        let s = state.read();
        (s.is_ready(), s.generating(), matches!(s.phase, Phase::Failed(_)), s.thinking_switch())
    });
    let (ready, generating, failed, thinking) = composer();
    let last_turn = use_memo(move || state.read().last_turn());
    let marks = use_memo(move || state.read().message_marks());
    rsx! {
        section { class: "chat",
            div { id: "messages", class: "messages", aria_live: "polite",
                div { class: "messages-inner",
                    match &*phase.read() {
                        Phase::Starting => rsx! {
                            div { class: "card loading-card", role: "status",
                                div { class: "card-title", "Starting the engine…" }
                            }
                        },
                        Phase::Loading { progress, message } => rsx! {
                            LoadingCard { progress: *progress, message: message.clone() }
                        },
                        Phase::Failed(failure) => rsx! {
                            LoadFailureCard { failure: failure.clone() }
                        },
                        Phase::Ready => rsx! {},
                    }
                    if let Some(model_name) = empty_with_model() {
                        EmptyState { model_name }
                    }
                    for id in ids.read().iter().copied() {
                        EntryView { key: "{id}", state, id, action: TurnAction::for_entry(last_turn(), id),
                            mark: marks.read().iter().find(|(m, _)| *m == id).map(|(_, mark)| *mark),
                        }
                    }
                    if awaiting() {
                        div { class: "msg msg-assistant pending",
                            div { class: "bubble", TypingDots {} }
                        }
                    }
                }
            }
            Composer { ready, generating, failed, thinking }
        }
    }
}

/// What the last turn's messages offer: the user's message can be edited, the reply
/// written again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnAction {
    Edit,
    Regenerate,
}

impl TurnAction {
    /// The action of the line `id`, given the last turn's (message, reply) ids.
    fn for_entry(last_turn: Option<(u64, u64)>, id: u64) -> Option<TurnAction> {
        match last_turn {
            Some((user, _)) if user == id => Some(TurnAction::Edit),
            Some((_, reply)) if reply == id => Some(TurnAction::Regenerate),
            _ => None,
        }
    }
}

/// One transcript line, re-rendered only when that line (or its action, or its mark)
/// changes.
#[component]
fn EntryView(state: ReadSignal<ChatState>, id: u64, action: Option<TurnAction>, mark: Option<MessageMark>) -> Element {
    let entry = use_memo(move || state.read().entry(id).cloned());
    match entry() {
        Some(Entry::Message(m)) => rsx! { MessageBubble { message: m, action, mark } },
        Some(Entry::Notice(n)) => rsx! { NoticeView { notice: n } },
        None => rsx! {},
    }
}

#[component]
fn EmptyState(model_name: String) -> Element {
    rsx! {
        div { class: "empty",
            div { class: "empty-mark", aria_hidden: "true", "◐" }
            h2 { {copy::EMPTY_HEADLINE} }
            p {
                if model_name.is_empty() { {copy::EMPTY_MODEL_RUNS_HERE} } else { {copy::runs_on_this_device(&model_name)} }
                {copy::EMPTY_NOTHING_LEAVES}
            }
        }
    }
}

#[component]
fn TypingDots() -> Element {
    rsx! {
        span { class: "typing", aria_label: copy::WRITING,
            span {} span {} span {}
        }
    }
}

/// One message; replies render Markdown and carry a copy button and a tok/s label. The
/// user's messages offer *Edit*, the last reply *Regenerate*; a message with other
/// versions switches among them (`<` `n/m` `>`).
#[component]
pub fn MessageBubble(
    message: Message,
    #[props(default)] action: Option<TurnAction>,
    #[props(default)] mark: Option<MessageMark>,
) -> Element {
    let mut copied = use_signal(|| false);
    // The reply's Markdown, kept between renders: finished blocks are not parsed again.
    let blocks = use_hook(|| Rc::new(RefCell::new(MarkdownBlocks::default())));
    if message.role == Role::User {
        return rsx! { UserMessage { text: message.text.clone(), last: action == Some(TurnAction::Edit), mark } };
    }
    let streaming = !message.finished;
    let (finished_blocks, open) = {
        let mut b = blocks.borrow_mut();
        b.update(&message.text);
        // While the reply streams, its last line is a box of its own (see `OpenHtml`).
        let open = if streaming {
            b.open().clone()
        } else {
            OpenHtml { live: Rc::from(b.open_whole()), ..Default::default() }
        };
        (b.finished().to_vec(), open)
    };
    let text = message.text.clone();
    let meta = match (message.tok_s, message.finished) {
        (Some(rate), true) => Some(format!("{} · {}", copy::tokens(message.tokens), format_rate(rate))),
        (None, true) if message.tokens > 0 => Some(copy::tokens(message.tokens)),
        _ => None,
    };
    let class = match (streaming, message.error.is_some()) {
        (true, _) => "msg msg-assistant streaming",
        (false, true) => "msg msg-assistant failed",
        (false, false) => "msg msg-assistant",
    };
    rsx! {
        div { class,
            if let Some(label) = message.thinking_label() {
                ThinkingDisclosure { label, text: message.thinking.clone(), live: message.is_thinking() }
            }
            div { class: "bubble",
                if message.text.is_empty() && streaming {
                    TypingDots {}
                } else {
                    div { class: "md",
                        for (i, html) in finished_blocks.into_iter().enumerate() {
                            MarkdownBlock { key: "{i}", html }
                        }
                        if !open.settled.is_empty() {
                            MarkdownBlock { key: "{OPEN_SETTLED_KEY}", html: open.settled }
                        }
                        if !open.live.is_empty() {
                            MarkdownBlock { key: "{OPEN_LIVE_KEY}", html: open.live }
                        }
                    }
                }
            }
            if message.finished {
                div { class: "msg-meta",
                    if !message.text.is_empty() {
                        button { class: "copy", r#type: "button", title: copy::COPY_REPLY_TITLE,
                            onclick: move |_| {
                                platform::copy_to_clipboard(&text);
                                copied.set(true);
                            },
                            if copied() { {copy::COPIED} } else { {copy::COPY} }
                        }
                    }
                    if let Some(mark) = mark {
                        VersionSwitch { mark }
                    }
                    if action == Some(TurnAction::Regenerate) {
                        button { class: "copy", r#type: "button", id: "regenerate",
                            title: copy::REGENERATE_TITLE,
                            onclick: move |_| send_command(Command::Regenerate),
                            "data-qa": "regenerate",
                            {copy::REGENERATE}
                        }
                    }
                    if let Some(meta) = meta {
                        span { class: "toks", "{meta}" }
                    }
                    if let Some(label) = message.done_label() {
                        span { class: "done-label", "{label}" }
                    }
                    if let Some(error) = &message.error {
                        span { class: "done-label error", "{error}" }
                    }
                }
            }
        }
    }
}

/// A reply's thinking, collapsed under its label ("Thinking…" while written, then
/// "Thought for N tokens"); opened, it shows the text as written.
#[component]
fn ThinkingDisclosure(label: String, text: String, live: bool) -> Element {
    let class = if live { "thinking live" } else { "thinking" };
    rsx! {
        details { class,
            summary { class: "thinking-label", "{label}" }
            div { class: "thinking-text", "{text.trim()}" }
        }
    }
}

/// `<` `n/m` `>` at a message with other versions: shows the one before or after (the
/// engine keeps the cache up to where they part).
#[component]
fn VersionSwitch(mark: MessageMark) -> Element {
    let Some(versions) = mark.versions else { return rsx! {} };
    let (index, shown, count) = (mark.index, versions.shown, versions.count);
    let label = format!("{}/{count}", shown + 1);
    rsx! {
        span { class: "versions",
            button { class: "copy version-prev", r#type: "button", title: copy::PREVIOUS_VERSION, aria_label: copy::PREVIOUS_VERSION,
                disabled: !mark.changeable || shown == 0,
                onclick: move |_| send_command(Command::SwitchBranch { index, version: shown - 1 }),
                "<"
            }
            span { class: "version-label", "{label}" }
            button { class: "copy version-next", r#type: "button", title: copy::NEXT_VERSION, aria_label: copy::NEXT_VERSION,
                disabled: !mark.changeable || shown + 1 >= count,
                onclick: move |_| send_command(Command::SwitchBranch { index, version: shown + 1 }),
                ">"
            }
        }
    }
}

/// The user's message; any can be edited in place and sent again: the chat goes on from
/// the edited message, what followed stays as another version, and the cache is kept up
/// to it. The last one's Edit keeps its id (`edit-last`) for the QA driver.
#[component]
fn UserMessage(text: String, last: bool, mark: Option<MessageMark>) -> Element {
    let mut editing = use_signal(|| false);
    let mut draft = use_signal(|| text.clone());
    let editable = mark.is_some_and(|m| m.changeable);
    let index = mark.map_or(0, |m| m.index);
    if editing() && editable {
        let send = move || {
            let text = draft.peek().trim().to_string();
            if !text.is_empty() {
                send_command(Command::EditMessage { index, text });
            }
            editing.set(false);
        };
        let mut send_on_enter = send;
        let mut send_on_click = send;
        let rows = (draft.read().matches('\n').count() + 1).clamp(2, 8);
        return rsx! {
            div { class: "msg msg-user editing",
                textarea { class: "bubble-edit", aria_label: copy::EDIT_FIELD_LABEL, autofocus: true,
                    rows: "{rows}",
                    value: "{draft}",
                    oninput: move |e: FormEvent| draft.set(e.value()),
                    onkeydown: move |e: KeyboardEvent| {
                        if e.key() == Key::Enter && !e.modifiers().contains(Modifiers::SHIFT) && !e.is_composing() {
                            e.prevent_default();
                            send_on_enter();
                        } else if e.key() == Key::Escape {
                            editing.set(false);
                        }
                    },
                }
                div { class: "msg-meta",
                    button { class: "copy", r#type: "button", onclick: move |_| editing.set(false), {copy::CANCEL} }
                    button { class: "btn primary small", r#type: "button", id: "send-edit",
                        onclick: move |_| send_on_click(),
                        {copy::SEND}
                    }
                }
            }
        };
    }
    rsx! {
        div { class: "msg msg-user",
            div { class: "bubble", "{text}" }
            if editable || mark.is_some_and(|m| m.versions.is_some()) {
                div { class: "msg-meta",
                    if let Some(mark) = mark {
                        VersionSwitch { mark }
                    }
                    if editable {
                        button { class: "copy", r#type: "button", id: last.then_some("edit-last"), title: copy::EDIT_TITLE,
                            onclick: move |_| {
                                draft.set(text.clone());
                                editing.set(true);
                            },
                            {copy::EDIT}
                        }
                    }
                }
            }
        }
    }
}

/// Keys of a reply's open Markdown block, its settled lines and its live last line
/// (finished blocks are keyed by position).
const OPEN_SETTLED_KEY: &str = "open-settled";
const OPEN_LIVE_KEY: &str = "open-live";

/// Rendered Markdown of one or more blocks; equal `Rc`s compare in O(1), so a finished
/// block is never rendered again.
#[component]
fn MarkdownBlock(html: Rc<str>) -> Element {
    rsx! {
        div { class: "mdb", dangerous_inner_html: "{html}" }
    }
}

/// The input row. Enter sends, Shift+Enter inserts a newline; Stop while generating.
#[component]
pub fn Composer(
    ready: bool,
    generating: bool,
    failed: bool,
    /// The model's thinking switch for this chat (`None`: the model has none).
    #[props(default)]
    thinking: Option<bool>,
) -> Element {
    let mut draft = use_signal(String::new);
    let type_ahead = use_hook(|| try_consume_context::<UiConfig>().unwrap_or_default().type_ahead);
    let can_send = ready && !generating;
    let mut submit = move || {
        let text = draft.peek().trim().to_string();
        if text.is_empty() || !can_send {
            return;
        }
        send_command(Command::Send { text });
        // The page script has already emptied the field (assets/page.js).
        draft.set(String::new());
    };
    let rows = (draft.read().matches('\n').count() + 1).clamp(1, 6);
    let placeholder = if failed {
        copy::COMPOSER_NO_MODEL
    } else if !ready {
        copy::LOADING_MODEL
    } else {
        copy::COMPOSER_PLACEHOLDER
    };
    rsx! {
        form { class: "composer",
            onsubmit: move |e: FormEvent| {
                e.prevent_default();
                submit();
            },
            // Uncontrolled on purpose: writing `value` back on every input event races
            // with fast typing over the webview bridge and drops characters. The page
            // script clears the field when Enter sends (see assets/page.js).
            textarea {
                id: "composer-input",
                class: "composer-input",
                rows: "{rows}",
                placeholder,
                autofocus: true,
                disabled: failed,
                aria_label: copy::COMPOSER_LABEL,
                "data-can-send": if can_send { "true" } else { "false" },
                oninput: move |e: FormEvent| {
                    let text = e.value();
                    // The engine reads the text as it is typed ([`Command::Draft`]).
                    if type_ahead {
                        send_command(Command::Draft { text: text.clone() });
                    }
                    draft.set(text);
                },
                onkeydown: move |e: KeyboardEvent| {
                    if e.key() == Key::Enter && !e.modifiers().contains(Modifiers::SHIFT) && !e.is_composing() {
                        e.prevent_default();
                        submit();
                    }
                },
                "data-qa": "composer",
            }
            if let Some(on) = thinking {
                button { class: if on { "btn think-toggle on" } else { "btn think-toggle" },
                    r#type: "button", id: "think-toggle",
                    title: copy::THINK_SWITCH_TITLE, aria_pressed: if on { "true" } else { "false" },
                    disabled: !ready,
                    onclick: move |_| send_command(Command::SetThinking { enabled: Some(!on) }),
                    {copy::THINK_SWITCH}
                }
            }
            if generating {
                button { class: "btn stop", r#type: "button", id: "stop-button",
                    onclick: move |_| send_command(Command::Stop),
                    span { class: "stop-square", aria_hidden: "true" }
                    {copy::STOP}
                }
            } else {
                button { class: "btn primary send", r#type: "submit", id: "send-button",
                    disabled: !can_send || draft.read().trim().is_empty(),
                    {copy::SEND}
                }
            }
        }
    }
}
