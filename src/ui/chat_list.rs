//! The chat list: every saved chat (title, when it was last used, its size, whether its
//! cache is kept), the open one marked. Click a chat to switch to it (its cache is
//! restored, no re-prefill); rename and delete in place (delete asks once more).
//! A column on wide windows, a drawer the top bar's *Chats* button opens on phones.

use dioxus::prelude::*;

use crate::chats::ChatSummary;
use crate::engine::Command;

use super::clock::date_label;
use super::engine_link::send_command;
use super::fmt::format_bytes;
use super::qa;
use super::state::ChatState;

#[component]
pub fn ChatList(state: ReadSignal<ChatState>, on_pick: EventHandler<()>) -> Element {
    let chats = use_memo(move || state.read().chats.clone());
    let active = use_memo(move || state.read().active_chat.clone());
    let ready = use_memo(move || state.read().is_ready());
    let renaming = use_signal(|| None::<String>);
    let deleting = use_signal(|| None::<String>);
    rsx! {
        nav { class: "chat-list", aria_label: "Chats",
            div { class: "chat-list-head",
                h2 { "Chats" }
                button { class: "btn ghost", r#type: "button", id: "new-chat-in-list",
                    disabled: !ready(),
                    onclick: move |_| {
                        send_command(Command::NewConversation);
                        on_pick.call(());
                    },
                    "New"
                }
            }
            if chats.read().is_empty() {
                p { class: "hint chat-list-empty", "Your chats are kept on this device." }
            }
            ul { class: "chat-items",
                for chat in chats.read().iter().cloned() {
                    ChatItem {
                        key: "{chat.id}",
                        active: active.read().as_deref() == Some(chat.id.as_str()),
                        ready: ready(),
                        chat,
                        renaming,
                        deleting,
                        on_pick,
                    }
                }
            }
        }
    }
}

#[component]
fn ChatItem(
    chat: ChatSummary,
    active: bool,
    ready: bool,
    renaming: Signal<Option<String>>,
    deleting: Signal<Option<String>>,
    on_pick: EventHandler<()>,
) -> Element {
    let id = chat.id.clone();
    let is_renaming = renaming.read().as_deref() == Some(id.as_str());
    let is_deleting = deleting.read().as_deref() == Some(id.as_str());
    let cached = if chat.cache_bytes > 0 {
        format!("cache {}", format_bytes(chat.cache_bytes))
    } else if chat.messages > 0 {
        "re-read when opened".to_string()
    } else {
        String::new()
    };
    let noun = if chat.messages == 1 { "message" } else { "messages" };
    let meta = format!("{} · {} {noun}", date_label(chat.updated), chat.messages);
    let class = if active { "chat-item active" } else { "chat-item" };
    let (open_id, rename_id, delete_id, track_id) = (id.clone(), id.clone(), id.clone(), id.clone());
    rsx! {
        li { class,
            if is_renaming {
                RenameField { id: id.clone(), title: chat.title.clone(), renaming }
            } else {
                button { class: "chat-open", r#type: "button",
                    aria_current: if active { "true" } else { "false" },
                    title: "{chat.title}",
                    disabled: !ready,
                    onclick: move |_| {
                        if !active {
                            send_command(Command::OpenChat { id: open_id.clone() });
                        }
                        on_pick.call(());
                    },
                    onmounted: move |e: MountedEvent| qa::track_named(format!("chat:{track_id}"), e.data()),
                    span { class: "chat-title", "{chat.title}" }
                    span { class: "chat-meta", "{meta}" }
                    if !cached.is_empty() {
                        span { class: "chat-meta", "{chat.tokens} tokens · {cached}" }
                    }
                }
                div { class: "chat-actions",
                    button { class: "link", r#type: "button", title: "Rename",
                        onclick: move |_| renaming.set(Some(rename_id.clone())),
                        "Rename"
                    }
                    if is_deleting {
                        button { class: "link danger", r#type: "button",
                            onclick: move |_| {
                                send_command(Command::DeleteChat { id: delete_id.clone() });
                                deleting.set(None);
                            },
                            "Delete for good"
                        }
                        button { class: "link", r#type: "button", onclick: move |_| deleting.set(None), "Keep" }
                    } else {
                        button { class: "link", r#type: "button", title: "Delete",
                            onclick: move |_| deleting.set(Some(id.clone())),
                            "Delete"
                        }
                    }
                }
            }
        }
    }
}

/// The title as an input: Enter or leaving the field renames, Escape cancels.
#[component]
fn RenameField(id: String, title: String, renaming: Signal<Option<String>>) -> Element {
    let mut draft = use_signal(|| title.clone());
    let (enter, blur) = ((id.clone(), title.clone()), (id, title));
    rsx! {
        input { class: "chat-rename", r#type: "text", value: "{draft}", autofocus: true,
            aria_label: "Chat title",
            oninput: move |e: FormEvent| draft.set(e.value()),
            onkeydown: move |e: KeyboardEvent| {
                if e.key() == Key::Enter {
                    rename(&enter.0, &enter.1, &draft.peek(), renaming);
                } else if e.key() == Key::Escape {
                    renaming.set(None);
                }
            },
            onblur: move |_| rename(&blur.0, &blur.1, &draft.peek(), renaming),
        }
    }
}

/// Sends the new title when it is one, and leaves the field.
fn rename(id: &str, old: &str, draft: &str, mut renaming: Signal<Option<String>>) {
    let title = draft.trim();
    if !title.is_empty() && title != old {
        send_command(Command::RenameChat { id: id.to_string(), title: title.to_string() });
    }
    renaming.set(None);
}
