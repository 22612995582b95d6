//! The chat list's search, Share and Import, done on the chats folder itself (reading
//! records, writing new files and new chats: nothing the engine holds), each on a thread
//! of its own so the window never waits for the disk.

use std::path::{Path, PathBuf};

use crate::chats::search::{find_ignoring_case, ChatMatch};
use crate::chats::{ChatStore, ChatSummary};

/// The chats folder, for the chat list (the app provides it from its launch
/// configuration; without one, as in tests, search filters titles only and Share and
/// Import do nothing).
#[derive(Clone)]
pub struct ChatFolder(pub Option<ChatStore>);

/// Where the app saves exports: Documents on iOS (the Files app shows it), else the
/// Downloads folder when there is one, else `chat-exports/` beside the chats folder.
pub fn export_dir(chats_dir: &Path) -> PathBuf {
    match crate::files::home_dir() {
        Some(home) if cfg!(target_os = "ios") => home.join("Documents"),
        Some(home) if home.join("Downloads").is_dir() => home.join("Downloads"),
        _ => chats_dir.with_file_name("chat-exports"),
    }
}

/// Runs `f` on a thread of its own; `None` when it panicked.
pub async fn off_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = futures::channel::oneshot::channel();
    std::thread::Builder::new()
        .name("chat-files".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.await.ok()
}

/// A chat as the list shows it while a search is typed.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedChat {
    pub chat: ChatSummary,
    /// Where the search text is, when it is not in the title.
    pub snippet: Option<String>,
}

/// The chats the list shows for `query`: all of them when it is blank; else, in the
/// list's order, those whose title holds it (ignoring case) and those the search of
/// their text found (`found`, with the snippet of the first match).
pub fn visible_chats(chats: &[ChatSummary], query: &str, found: &[ChatMatch]) -> Vec<ListedChat> {
    let query = query.trim();
    chats
        .iter()
        .filter_map(|chat| {
            if query.is_empty() || find_ignoring_case(&chat.title, query).is_some() {
                return Some(ListedChat { chat: chat.clone(), snippet: None });
            }
            let hit = found.iter().find(|m| m.id == chat.id)?;
            Some(ListedChat { chat: chat.clone(), snippet: Some(hit.snippet.clone()) })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chats::search::Place;
    use crate::transcript::Role;

    fn summary(id: &str, title: &str) -> ChatSummary {
        ChatSummary {
            id: id.into(),
            title: title.into(),
            created: 0,
            updated: 0,
            tokens: 0,
            messages: 2,
            cache_bytes: 0,
            unreadable: None,
        }
    }

    #[test]
    fn the_search_keeps_the_lists_order_and_shows_where_the_text_is() {
        let chats = [summary("c", "Lisbon trip"), summary("b", "Recipes"), summary("a", "Packing list")];
        let ids = |listed: Vec<ListedChat>| listed.into_iter().map(|l| (l.chat.id, l.snippet)).collect::<Vec<_>>();
        assert_eq!(visible_chats(&chats, "  ", &[]).len(), 3, "a blank search shows every chat");
        assert_eq!(ids(visible_chats(&chats, "LIS", &[])), [("c".into(), None), ("a".into(), None)]);
        let found = ChatMatch {
            id: "b".into(),
            title: "Recipes".into(),
            updated: 0,
            place: Place::Message { number: 2, role: Role::Assistant },
            snippet: "…a pinch of salt and a list of…".into(),
        };
        assert_eq!(
            ids(visible_chats(&chats, "list", std::slice::from_ref(&found))),
            [("b".into(), Some("…a pinch of salt and a list of…".into())), ("a".into(), None)],
            "text matches join title matches, in the list's order"
        );
        assert!(visible_chats(&chats, "porto", &[]).is_empty());
    }
}
