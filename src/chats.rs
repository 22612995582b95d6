//! The conversations on disk: one folder holding, per chat, `ID.json` (title, dates,
//! system prompt and the whole transcript) and `ID.pcstate` (its KV cache, the engine's
//! state-file format).
//!
//! ```text
//!  chats/  3f2a9c1e-1.json          what the user sees: always kept
//!          3f2a9c1e-1.pcstate       the cache: resumes the chat without re-prefill
//!          3f2a9c1e-1.before-eviction.pcstate
//! ```
//!
//! The caches together stay under a size cap: when they pass it, the caches of the chats
//! used longest ago are dropped first. Their text stays, and opening such a chat re-reads
//! it. Records are read as hostile input: a file that is too large, does not parse or
//! does not name itself is skipped, never fatal.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::engine::persist::write_atomically;
use crate::engine::template::{Message, Role};

/// The caches' size cap when none is configured.
pub const DEFAULT_CACHE_CAP_BYTES: u64 = 256 << 20;

/// A record larger than this is not read (a transcript is text: megabytes at most).
const MAX_RECORD_BYTES: u64 = 16 << 20;

/// Titles are cut to this many characters.
const MAX_TITLE_CHARS: usize = 48;

/// The title of a chat that has no message yet.
pub const UNTITLED: &str = "New chat";

/// One chat as saved: what the user sees of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRecord {
    pub id: String,
    pub title: String,
    /// Milliseconds since the Unix epoch.
    pub created: u64,
    pub updated: u64,
    /// Tokens its cache held when last saved.
    #[serde(default)]
    pub tokens: usize,
    /// The chat's own system prompt; `None` uses the model's template default.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Every user message and reply, oldest first (also those trimmed from the cache).
    #[serde(default)]
    pub messages: Vec<Message>,
}

impl ChatRecord {
    /// The messages to feed: the system prompt (when set) and the transcript.
    pub fn history(&self) -> Vec<Message> {
        let system = self.system_prompt.iter().filter(|s| !s.trim().is_empty());
        system.map(|s| Message::new(Role::System, s.clone())).chain(self.messages.iter().cloned()).collect()
    }

    /// Names an untitled chat after its first message.
    pub fn title_from_first_message(&mut self) {
        if self.title != UNTITLED {
            return;
        }
        if let Some(first) = self.messages.iter().find(|m| m.role == Role::User) {
            let title = clean_title(first.content.lines().find(|l| !l.trim().is_empty()).unwrap_or(""));
            if !title.is_empty() {
                self.title = title;
            }
        }
    }
}

/// A chat in the list.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatSummary {
    pub id: String,
    pub title: String,
    pub created: u64,
    pub updated: u64,
    pub tokens: usize,
    /// User messages and replies.
    pub messages: usize,
    /// Bytes of its caches on disk (0: it will be re-read when opened).
    pub cache_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ChatStoreError {
    #[error("there is no chat {0:?}")]
    NotFound(String),
    #[error("{0:?} is not a chat id")]
    BadId(String),
    #[error("the chat {id:?} could not be read: {why}")]
    Unreadable { id: String, why: String },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// The chats folder and its cache cap.
#[derive(Debug, Clone)]
pub struct ChatStore {
    dir: PathBuf,
    cache_cap_bytes: u64,
}

impl ChatStore {
    /// The store in `dir` (made when missing).
    pub fn open(dir: impl Into<PathBuf>, cache_cap_bytes: u64) -> io::Result<ChatStore> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(ChatStore { dir, cache_cap_bytes })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn cache_cap_bytes(&self) -> u64 {
        self.cache_cap_bytes
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Where the chat's KV cache is saved.
    pub fn cache_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.pcstate"))
    }

    /// Every cache file of a chat: the cache and its copy from before an eviction.
    fn cache_files(&self, id: &str) -> [PathBuf; 2] {
        [self.cache_path(id), self.dir.join(format!("{id}.before-eviction.pcstate"))]
    }

    /// Bytes of a chat's caches on disk.
    pub fn cache_bytes_of(&self, id: &str) -> u64 {
        self.cache_files(id).iter().filter_map(|p| std::fs::symlink_metadata(p).ok()).map(|m| m.len()).sum()
    }

    /// Bytes of every chat's caches.
    pub fn cache_bytes(&self) -> u64 {
        self.list().iter().map(|c| c.cache_bytes).sum()
    }

    /// Every readable chat, the most recently used first.
    pub fn list(&self) -> Vec<ChatSummary> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut chats: Vec<ChatSummary> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").filter(|id| valid_id(id)).map(String::from))
            .filter_map(|id| match self.load(&id) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!("{e}; left out of the list");
                    None
                }
            })
            .map(|r| ChatSummary {
                cache_bytes: self.cache_bytes_of(&r.id),
                messages: r.messages.len(),
                id: r.id,
                title: r.title,
                created: r.created,
                updated: r.updated,
                tokens: r.tokens,
            })
            .collect();
        chats.sort_by(|a, b| b.updated.cmp(&a.updated).then_with(|| b.id.cmp(&a.id)));
        chats
    }

    /// The chat with this title (the newest when several have it).
    pub fn find_by_title(&self, title: &str) -> Option<ChatSummary> {
        let title = clean_title(title);
        self.list().into_iter().find(|c| c.title == title)
    }

    pub fn load(&self, id: &str) -> Result<ChatRecord, ChatStoreError> {
        if !valid_id(id) {
            return Err(ChatStoreError::BadId(id.to_string()));
        }
        let path = self.record_path(id);
        let unreadable = |why: String| ChatStoreError::Unreadable { id: id.to_string(), why };
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ChatStoreError::NotFound(id.to_string())),
            Err(e) => return Err(e.into()),
        };
        if !meta.is_file() || meta.len() > MAX_RECORD_BYTES {
            return Err(unreadable(format!("not a file of at most {MAX_RECORD_BYTES} bytes")));
        }
        let record: ChatRecord =
            serde_json::from_slice(&std::fs::read(&path)?).map_err(|e| unreadable(e.to_string()))?;
        if record.id != id {
            return Err(unreadable(format!("it names itself {:?}", record.id)));
        }
        Ok(record)
    }

    /// A new, empty chat (saved).
    pub fn create(&self, title: &str) -> Result<ChatRecord, ChatStoreError> {
        let now = unix_ms();
        let id = (1u32..)
            .map(|n| format!("{now:x}-{n}"))
            .find(|id| !self.record_path(id).exists() && !self.cache_path(id).exists())
            .expect("some id is free");
        let title = clean_title(title);
        let title = if title.is_empty() { UNTITLED.to_string() } else { title };
        let record =
            ChatRecord { id, title, created: now, updated: now, tokens: 0, system_prompt: None, messages: Vec::new() };
        self.save(&record)?;
        Ok(record)
    }

    /// Writes the record (atomically: a crash leaves the old one or the new one).
    pub fn save(&self, record: &ChatRecord) -> Result<(), ChatStoreError> {
        if !valid_id(&record.id) {
            return Err(ChatStoreError::BadId(record.id.clone()));
        }
        let json = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
        write_atomically(&self.record_path(&record.id), &json)?;
        Ok(())
    }

    pub fn rename(&self, id: &str, title: &str) -> Result<ChatRecord, ChatStoreError> {
        let mut record = self.load(id)?;
        let title = clean_title(title);
        if !title.is_empty() {
            record.title = title;
            self.save(&record)?;
        }
        Ok(record)
    }

    /// Removes the chat: its record, its caches and their lock files.
    pub fn delete(&self, id: &str) -> Result<(), ChatStoreError> {
        if !valid_id(id) {
            return Err(ChatStoreError::BadId(id.to_string()));
        }
        self.drop_caches(id);
        match std::fs::remove_file(self.record_path(id)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ChatStoreError::NotFound(id.to_string())),
            other => Ok(other?),
        }
    }

    /// Removes a chat's caches (its text stays): it will be re-read when opened.
    pub fn drop_caches(&self, id: &str) {
        for path in self.cache_files(id) {
            let _ = std::fs::remove_file(&path);
            if let Some(name) = path.file_name() {
                let _ = std::fs::remove_file(path.with_file_name(format!(".{}.lock", name.to_string_lossy())));
            }
        }
    }

    /// Drops the caches of the chats used longest ago until the rest fit the cap; the
    /// chat `keep` (the open one) keeps its cache. Returns the chats whose caches went.
    pub fn enforce_cap(&self, keep: Option<&str>) -> Vec<ChatSummary> {
        let chats = self.list();
        let mut total: u64 = chats.iter().map(|c| c.cache_bytes).sum();
        let mut dropped = Vec::new();
        for chat in chats.into_iter().rev() {
            if total <= self.cache_cap_bytes {
                break;
            }
            if chat.cache_bytes == 0 || Some(chat.id.as_str()) == keep {
                continue;
            }
            let _span = tracing::info_span!("drop_cache", chat = %chat.id, bytes = chat.cache_bytes).entered();
            self.drop_caches(&chat.id);
            total -= chat.cache_bytes;
            dropped.push(chat);
        }
        dropped
    }
}

/// Ids are made here ([`ChatStore::create`]); anything else (a path, a dot, a slash) is
/// refused, so an id from outside can never name a file elsewhere.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// One line, trimmed, at most [`MAX_TITLE_CHARS`] characters (an ellipsis when cut).
fn clean_title(title: &str) -> String {
    let one_line: String = title.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= MAX_TITLE_CHARS {
        return one_line;
    }
    let cut: String = one_line.chars().take(MAX_TITLE_CHARS - 1).collect();
    format!("{}…", cut.trim_end())
}

/// Milliseconds since the Unix epoch (chats used within one second still sort).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(cap: u64) -> (tempfile::TempDir, ChatStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = ChatStore::open(dir.path().join("chats"), cap).unwrap();
        (dir, store)
    }

    #[test]
    fn create_rename_list_delete() {
        let (_dir, s) = store(1 << 20);
        let a = s.create("").unwrap();
        assert_eq!(a.title, UNTITLED);
        let b = s.create("  Trip\n to   Lisbon ").unwrap();
        assert_eq!(b.title, "Trip to Lisbon");
        assert_ne!(a.id, b.id);
        assert_eq!(s.list().len(), 2);
        s.rename(&a.id, "Recipes").unwrap();
        assert_eq!(s.find_by_title("Recipes").unwrap().id, a.id);
        s.delete(&a.id).unwrap();
        assert!(matches!(s.load(&a.id), Err(ChatStoreError::NotFound(_))));
        assert_eq!(s.list().iter().map(|c| c.id.clone()).collect::<Vec<_>>(), [b.id]);
    }

    #[test]
    fn titles_come_from_the_first_message_and_are_cut() {
        let mut r = ChatRecord {
            id: "x".into(),
            title: UNTITLED.into(),
            created: 0,
            updated: 0,
            tokens: 0,
            system_prompt: Some("Be brief.".into()),
            messages: vec![Message::new(
                Role::User,
                "\n  What is a lighthouse for, and who keeps one running at night?",
            )],
        };
        r.title_from_first_message();
        assert_eq!(r.title.chars().count(), MAX_TITLE_CHARS);
        assert!(r.title.starts_with("What is a lighthouse for") && r.title.ends_with('…'), "{}", r.title);
        assert_eq!(r.history()[0], Message::new(Role::System, "Be brief."));
        r.title_from_first_message();
        assert!(r.title.ends_with('…'), "a named chat keeps its name");
    }

    #[test]
    fn ids_from_outside_cannot_name_other_files() {
        let (_dir, s) = store(1 << 20);
        for id in ["", "../x", "a/b", ".hidden", "a.json", &"x".repeat(65)] {
            assert!(matches!(s.load(id), Err(ChatStoreError::BadId(_))), "{id:?}");
            assert!(matches!(s.delete(id), Err(ChatStoreError::BadId(_))), "{id:?}");
        }
    }

    #[test]
    fn hostile_records_are_left_out_not_fatal() {
        let (_dir, s) = store(1 << 20);
        let good = s.create("good").unwrap();
        std::fs::write(s.dir().join("garbage.json"), b"{ not json").unwrap();
        std::fs::write(s.dir().join("liar.json"), serde_json::to_vec(&good).unwrap()).unwrap();
        std::fs::create_dir(s.dir().join("folder.json")).unwrap();
        std::fs::write(s.dir().join("notes.txt"), b"hello").unwrap();
        let list = s.list();
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(list[0].id, good.id);
        assert!(matches!(s.load("liar"), Err(ChatStoreError::Unreadable { .. })));
    }

    #[test]
    fn the_cap_drops_the_oldest_caches_first_and_keeps_text_and_the_open_chat() {
        let (_dir, s) = store(2500);
        let mut ids = Vec::new();
        for (i, title) in ["old", "middle", "new"].iter().enumerate() {
            let mut r = s.create(title).unwrap();
            r.updated = 100 + i as u64;
            r.messages.push(Message::new(Role::User, "hi"));
            s.save(&r).unwrap();
            std::fs::write(s.cache_path(&r.id), vec![0u8; 1000]).unwrap();
            ids.push(r.id);
        }
        assert_eq!(s.cache_bytes(), 3000);
        // The oldest chat is open: the middle one's cache goes instead.
        let dropped = s.enforce_cap(Some(&ids[0]));
        assert_eq!(dropped.iter().map(|c| c.id.clone()).collect::<Vec<_>>(), [ids[1].clone()]);
        assert!(s.cache_path(&ids[0]).exists() && !s.cache_path(&ids[1]).exists());
        assert_eq!(s.load(&ids[1]).unwrap().messages.len(), 1, "the text stays");
        assert_eq!(s.cache_bytes(), 2000);
        // A store opened again (a restart) with a lower cap enforces it on the next call.
        let again = ChatStore::open(s.dir(), 1500).unwrap();
        let dropped = again.enforce_cap(None);
        assert_eq!(dropped.iter().map(|c| c.id.clone()).collect::<Vec<_>>(), [ids[0].clone()]);
        assert_eq!(again.cache_bytes(), 1000);
    }
}
