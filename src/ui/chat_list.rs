//! The chat list: every saved chat (title, when it was last used, its size, whether its
//! cache is kept), the open one marked. Click a chat to switch to it (its cache is
//! restored, no re-prefill); rename, share and delete in place (delete asks once more).
//! A search field above filters the list as you type (titles at once, the chats' text
//! as the search of the folder answers); *Share all* and *Import* save every chat as
//! Markdown and JSON and add the chats of an exported JSON file ([`super::chat_transfer`]).
//! A column on wide windows, a drawer the top bar's *Chats* button opens on phones.

use dioxus::html::FileData;
use dioxus::prelude::*;

use crate::chats::{export, search, ChatStore, ChatSummary};
use crate::engine::Command;

use super::chat_transfer::{export_dir, off_thread, visible_chats, ChatFolder};
use super::clock::date_label;
use super::copy;
use super::engine_link::send_command;
use super::fmt::format_bytes;
use super::state::ChatState;

#[component]
pub fn ChatList(state: ReadSignal<ChatState>, on_pick: EventHandler<()>) -> Element {
    let chats = use_memo(move || state.read().chats.clone());
    let active = use_memo(move || state.read().active_chat.clone());
    let ready = use_memo(move || state.read().is_ready());
    let renaming = use_signal(|| None::<String>);
    let deleting = use_signal(|| None::<String>);
    let folder = use_hook(|| try_consume_context::<ChatFolder>().and_then(|f| f.0));
    let mut query = use_signal(String::new);
    let status = use_signal(|| None::<String>);
    // The search of the chats' text, again when the query or the list changes.
    let searched = folder.clone();
    let found = use_resource(move || {
        let q = query();
        let _ = chats.read();
        let store = searched.clone();
        async move {
            match store {
                Some(store) if !q.trim().is_empty() => {
                    off_thread(move || search::search(&store, &q)).await.unwrap_or_default()
                }
                _ => Vec::new(),
            }
        }
    });
    let listed = visible_chats(&chats.read(), &query.read(), found.read().as_deref().unwrap_or(&[]));
    let searching = !query.read().trim().is_empty();
    let (share_store, import_store) = (folder.clone(), folder);
    rsx! {
        nav { class: "chat-list", aria_label: copy::CHATS,
            div { class: "chat-list-head",
                h2 { {copy::CHATS} }
                button { class: "btn ghost", r#type: "button", id: "new-chat-in-list",
                    disabled: !ready(),
                    onclick: move |_| {
                        send_command(Command::NewConversation);
                        on_pick.call(());
                    },
                    {copy::NEW}
                }
            }
            input { class: "chat-search", r#type: "search", id: "chat-search",
                placeholder: copy::SEARCH_PLACEHOLDER, aria_label: copy::SEARCH_PLACEHOLDER,
                value: "{query}",
                oninput: move |e: FormEvent| query.set(e.value()),
            }
            div { class: "chat-list-tools",
                button { class: "link", r#type: "button", id: "share-all", title: copy::SHARE_ALL_TITLE,
                    disabled: chats.read().is_empty(),
                    onclick: move |_| share(share_store.clone(), None, status),
                    {copy::SHARE_ALL}
                }
                label { class: "link file-pick", title: copy::IMPORT_TITLE, id: "import-chats",
                    {copy::IMPORT}
                    input { r#type: "file", accept: ".json,application/json", aria_label: copy::IMPORT_TITLE,
                        onchange: move |e: FormEvent| import(import_store.clone(), e.files(), status),
                    }
                }
            }
            if let Some(text) = status() {
                p { class: "hint chat-list-status", role: "status", "{text}" }
            }
            if chats.read().is_empty() {
                p { class: "hint chat-list-empty", {copy::CHATS_EMPTY} }
            } else if searching && listed.is_empty() {
                p { class: "hint chat-list-empty", {copy::no_chat_holds(&query.read())} }
            }
            ul { class: "chat-items",
                for listed in listed {
                    ChatItem {
                        key: "{listed.chat.id}",
                        active: active.read().as_deref() == Some(listed.chat.id.as_str()),
                        ready: ready(),
                        chat: listed.chat,
                        snippet: listed.snippet,
                        renaming,
                        deleting,
                        status,
                        on_pick,
                    }
                }
            }
        }
    }
}

/// Saves every chat (`id: None`) or one as Markdown and JSON in [`export_dir`], and says
/// where in the list's status line.
fn share(store: Option<ChatStore>, id: Option<String>, mut status: Signal<Option<String>>) {
    let Some(store) = store else { return };
    status.set(Some(copy::EXPORTING.to_string()));
    spawn(async move {
        let done = off_thread(move || {
            let dir = export_dir(store.dir());
            match id {
                Some(id) => export::export_chat(&store, &id, &dir),
                None => export::export_all(&store, &dir),
            }
        })
        .await;
        status.set(Some(match done {
            Some(Ok(e)) => copy::exported(
                e.chats,
                &e.markdown.display().to_string(),
                &e.json.display().to_string(),
                e.unreadable.len(),
            ),
            Some(Err(e)) => copy::export_failed(&e.to_string()),
            None => copy::export_failed(copy::STOPPED_EARLY),
        }));
    });
}

/// Adds the chats of the picked file (its path on desktops, its bytes where the file
/// picker gives no path), then asks the engine for the list again.
fn import(store: Option<ChatStore>, files: Vec<FileData>, mut status: Signal<Option<String>>) {
    let (Some(store), Some(file)) = (store, files.into_iter().next()) else { return };
    let bridge = try_consume_context::<Coroutine<Command>>();
    status.set(Some(copy::IMPORTING.to_string()));
    spawn(async move {
        let path = file.path();
        let done = if path.as_os_str().is_empty() {
            match file.read_bytes().await {
                Ok(bytes) => off_thread(move || export::import_bytes(&store, &bytes)).await,
                Err(e) => return status.set(Some(copy::import_failed(&e.to_string()))),
            }
        } else {
            off_thread(move || export::import_file(&store, &path)).await
        };
        status.set(Some(match done {
            Some(Ok(imported)) => {
                if let Some(bridge) = bridge {
                    bridge.send(Command::ListChats);
                }
                copy::imported(imported.len())
            }
            Some(Err(e)) => copy::import_failed(&e.to_string()),
            None => copy::import_failed(copy::STOPPED_EARLY),
        }));
    });
}

#[component]
fn ChatItem(
    chat: ChatSummary,
    /// Where a search's text is in this chat, when not in its title.
    snippet: Option<String>,
    active: bool,
    ready: bool,
    renaming: Signal<Option<String>>,
    deleting: Signal<Option<String>>,
    status: Signal<Option<String>>,
    on_pick: EventHandler<()>,
) -> Element {
    let folder = use_hook(|| try_consume_context::<ChatFolder>().and_then(|f| f.0));
    let id = chat.id.clone();
    let is_renaming = renaming.read().as_deref() == Some(id.as_str());
    let is_deleting = deleting.read().as_deref() == Some(id.as_str());
    let cached = if chat.cache_bytes > 0 {
        copy::chat_cache(&format_bytes(chat.cache_bytes))
    } else if chat.messages > 0 {
        copy::CHAT_REREAD_WHEN_OPENED.to_string()
    } else {
        String::new()
    };
    let meta = copy::chat_meta(&date_label(chat.updated), chat.messages);
    let class = if active { "chat-item active" } else { "chat-item" };
    let (open_id, rename_id, delete_id, share_id) = (id.clone(), id.clone(), id.clone(), id.clone());
    let qa_name = format!("chat:{id}");
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
                    "data-qa": "{qa_name}",
                    span { class: "chat-title", "{chat.title}" }
                    if let Some(snippet) = &snippet {
                        span { class: "chat-snippet", "{snippet}" }
                    }
                    span { class: "chat-meta", "{meta}" }
                    if !cached.is_empty() {
                        span { class: "chat-meta", {copy::chat_tokens(chat.tokens, &cached)} }
                    }
                }
                div { class: "chat-actions",
                    button { class: "link", r#type: "button", title: copy::RENAME,
                        onclick: move |_| renaming.set(Some(rename_id.clone())),
                        {copy::RENAME}
                    }
                    button { class: "link", r#type: "button", title: copy::SHARE_TITLE,
                        onclick: move |_| share(folder.clone(), Some(share_id.clone()), status),
                        {copy::SHARE}
                    }
                    if is_deleting {
                        button { class: "link danger", r#type: "button",
                            onclick: move |_| {
                                send_command(Command::DeleteChat { id: delete_id.clone() });
                                deleting.set(None);
                            },
                            {copy::DELETE_FOR_GOOD}
                        }
                        button { class: "link", r#type: "button", onclick: move |_| deleting.set(None), {copy::KEEP} }
                    } else {
                        button { class: "link", r#type: "button", title: copy::DELETE,
                            onclick: move |_| deleting.set(Some(id.clone())),
                            {copy::DELETE}
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
            aria_label: copy::CHAT_TITLE_LABEL,
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
