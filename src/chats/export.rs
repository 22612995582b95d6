//! Chats out of the store and into another one: `pocketchat chats --export DIR` and
//! `--import FILE`, and the app's Share and Import.
//!
//! An export is two new files in the folder it is given, named by the date (all chats)
//! or by the chat's title (one chat), with `-2`, `-3`, … when that name is taken: an
//! export never replaces a file.
//!
//! ```text
//!  pocketchat-chats-2026-12-02.md     for reading: each chat's title, dates, system
//!                                     prompt and messages under role headings, verbatim
//!  pocketchat-chats-2026-12-02.json   for moving: {"format":"pocketchat-chats",
//!                                     "version":1,"chats":[record, …]}
//! ```
//!
//! The JSON holds each chat's record whole, as the store saves it (serde), so a field the
//! record gains later travels without this file changing. An import reads such a file
//! (one chat or many) as hostile input: over [`MAX_IMPORT_BYTES`], not JSON, another
//! format or version, or one chat failing the store's own checks (those of a record
//! file), and it is refused with a message and nothing is written. Each imported chat
//! gets a new id (importing a file twice makes two chats), so no chat is ever replaced,
//! and no cache: it is re-read when opened. Everything else is kept as exported,
//! `created` and `updated` included; `tokens` (what its cache held) becomes 0.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{clean_title, unix_ms, ChatRecord, ChatStore, ChatStoreError, MAX_RECORD_BYTES};
use crate::files::write_atomically;
use crate::transcript::Role;

/// The `format` tag of an export.
pub const FORMAT: &str = "pocketchat-chats";

/// The envelope's version this build writes and reads.
pub const VERSION: u32 = 1;

/// The largest file an import reads (four records of the largest size); an export that
/// would be larger is refused, so that every export can be imported again.
pub const MAX_IMPORT_BYTES: u64 = 4 * MAX_RECORD_BYTES;

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    format: &'a str,
    version: u32,
    chats: &'a [ChatRecord],
}

/// The envelope's tag and version, read before its chats.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    version: Option<u64>,
}

#[derive(Deserialize)]
struct EnvelopeIn {
    chats: Vec<ChatRecord>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("there are no chats to export")]
    NoChats,
    #[error("there is no chat named {0:?}")]
    NoSuchChat(String),
    #[error(
        "the export would be {bytes} bytes, more than the {MAX_IMPORT_BYTES} an import reads; export the chats one by one (--chat NAME)"
    )]
    TooLarge { bytes: u64 },
    #[error("{}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Store(#[from] ChatStoreError),
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{} could not be read: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("the file is {bytes} bytes, more than the {MAX_IMPORT_BYTES} an import reads")]
    TooLarge { bytes: u64 },
    #[error("the file is not valid JSON ({0}); it may be cut short or damaged")]
    NotJson(String),
    #[error("the file is not a pocketchat export ({0})")]
    NotAnExport(String),
    #[error("the file is an export of version {0}, which this pocketchat does not read (it reads version {VERSION})")]
    Version(u64),
    #[error("the file holds no chats")]
    NoChats,
    #[error("chat {index} in the file (“{title}”) is refused: {why}")]
    BadChat { index: usize, title: String, why: String },
    #[error("the chats could not be saved: {0}")]
    Store(#[from] ChatStoreError),
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Exported {
    pub markdown: PathBuf,
    pub json: PathBuf,
    /// Chats written.
    pub chats: usize,
    /// Ids of chats left out because their record could not be read.
    pub unreadable: Vec<String>,
}

/// Exports every readable chat, the most recent first, into `dir` (made when missing).
pub fn export_all(store: &ChatStore, dir: &Path) -> Result<Exported, ExportError> {
    let mut records = Vec::new();
    let mut unreadable = Vec::new();
    for chat in store.list() {
        match store.load(&chat.id) {
            Ok(r) => records.push(r),
            Err(ChatStoreError::NotFound(_)) => {}
            Err(_) => unreadable.push(chat.id),
        }
    }
    if records.is_empty() {
        return Err(ExportError::NoChats);
    }
    let stem = format!("pocketchat-chats-{}", utc_date(unix_ms()));
    let mut exported = write_export(&records, dir, &stem)?;
    exported.unreadable = unreadable;
    Ok(exported)
}

/// Exports the chat with this id into `dir`, its files named after its title.
pub fn export_chat(store: &ChatStore, id: &str, dir: &Path) -> Result<Exported, ExportError> {
    let record = store.load(id)?;
    let slug = slug(&record.title);
    let stem = if slug.is_empty() { format!("pocketchat-chat-{}", record.id) } else { format!("pocketchat-{slug}") };
    write_export(std::slice::from_ref(&record), dir, &stem)
}

/// The id of the chat `what` means: the newest chat of that name, else the chat of that id.
pub fn chat_id_for(store: &ChatStore, what: &str) -> Result<String, ExportError> {
    if let Some(found) = store.find_by_name(what)? {
        return Ok(found.id);
    }
    match store.load(what) {
        Ok(r) => Ok(r.id),
        Err(ChatStoreError::NotFound(_) | ChatStoreError::BadId(_)) => Err(ExportError::NoSuchChat(what.to_string())),
        Err(e) => Err(e.into()),
    }
}

fn write_export(records: &[ChatRecord], dir: &Path, stem: &str) -> Result<Exported, ExportError> {
    let json = serde_json::to_vec_pretty(&EnvelopeOut { format: FORMAT, version: VERSION, chats: records })
        .map_err(|e| ExportError::Store(ChatStoreError::Io(io::Error::other(e))))?;
    if json.len() as u64 > MAX_IMPORT_BYTES {
        return Err(ExportError::TooLarge { bytes: json.len() as u64 });
    }
    let markdown = to_markdown(records);
    std::fs::create_dir_all(dir).map_err(|source| ExportError::Write { path: dir.to_path_buf(), source })?;
    let (md_path, json_path) = free_names(dir, stem);
    for (path, bytes) in [(&md_path, markdown.as_bytes()), (&json_path, &json[..])] {
        write_atomically(path, bytes).map_err(|source| ExportError::Write { path: path.clone(), source })?;
    }
    Ok(Exported { markdown: md_path, json: json_path, chats: records.len(), unreadable: Vec::new() })
}

/// `stem.md` and `stem.json` in `dir`, or with the first suffix `-2`, `-3`, … for which
/// neither exists.
fn free_names(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    let taken = |p: &Path| std::fs::symlink_metadata(p).is_ok();
    (1u32..)
        .map(|n| if n == 1 { stem.to_string() } else { format!("{stem}-{n}") })
        .map(|s| (dir.join(format!("{s}.md")), dir.join(format!("{s}.json"))))
        .find(|(md, json)| !taken(md) && !taken(json))
        .expect("some suffix is free")
}

/// A title as part of a file name: lowercase letters and digits, other runs as one `-`,
/// at most 48 characters.
fn slug(title: &str) -> String {
    let mut out = String::new();
    for c in title.chars().flat_map(char::to_lowercase) {
        if c.is_alphanumeric() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.chars().take(48).collect::<String>().trim_end_matches('-').to_string()
}

/// The chats as one Markdown document: per chat its title, dates, system prompt and
/// messages under role headings, the messages' text as written (a fence a message leaves
/// open is closed, so that it does not swallow the headings after it).
pub fn to_markdown(records: &[ChatRecord]) -> String {
    let mut md = String::new();
    for (i, r) in records.iter().enumerate() {
        if i > 0 {
            md.push_str("\n---\n\n");
        }
        md.push_str(&format!("# {}\n\n", r.name.as_deref().unwrap_or(&r.title)));
        let count = r.messages.len();
        let noun = if count == 1 { "message" } else { "messages" };
        md.push_str(&format!(
            "*Started {} · last used {} · {count} {noun}*\n\n",
            utc_date_time(r.created),
            utc_date_time(r.updated)
        ));
        if let Some(system) = r.system_prompt.as_deref().filter(|s| !s.trim().is_empty()) {
            push_section(&mut md, "System prompt", system);
        }
        for m in &r.messages {
            let heading = match m.role {
                Role::User => "User",
                Role::Assistant => "Assistant",
                Role::System => "System",
            };
            match m.thinking.as_deref().filter(|t| !t.trim().is_empty()) {
                Some(thinking) => {
                    md.push_str(&format!("## {heading}\n\n"));
                    push_thinking(&mut md, thinking);
                    push_text(&mut md, &m.content);
                }
                None => push_section(&mut md, heading, &m.content),
            }
        }
    }
    md
}

/// A reply's thinking as a collapsed `<details>` block (GitHub and most Markdown viewers
/// show it closed under "Thinking"); its text as written, a `</details>` in it escaped.
fn push_thinking(md: &mut String, thinking: &str) {
    md.push_str("<details>\n<summary>Thinking</summary>\n\n");
    push_text(md, &thinking.replace("</details>", "&lt;/details>"));
    md.push_str("</details>\n\n");
}

fn push_section(md: &mut String, heading: &str, text: &str) {
    md.push_str(&format!("## {heading}\n\n"));
    push_text(md, text);
}

/// A message's text as written, a fence it leaves open closed, and a blank line.
fn push_text(md: &mut String, text: &str) {
    md.push_str(text.trim_end_matches('\n'));
    md.push('\n');
    if let Some(fence) = open_fence(text) {
        md.push_str(&fence);
        md.push('\n');
    }
    md.push('\n');
}

/// The fence (``` or ~~~, as long as its opener) that `text` leaves open, if any.
fn open_fence(text: &str) -> Option<String> {
    let mut open: Option<(char, usize)> = None;
    for line in text.lines() {
        let line = line.trim_start_matches(' ');
        let Some(c) = line.chars().next().filter(|c| *c == '`' || *c == '~') else { continue };
        let run = line.chars().take_while(|&x| x == c).count();
        if run < 3 {
            continue;
        }
        match open {
            None => open = Some((c, run)),
            Some((oc, orun)) if oc == c && run >= orun && line[run..].trim().is_empty() => open = None,
            Some(_) => {}
        }
    }
    open.map(|(c, run)| c.to_string().repeat(run))
}

/// Imports the chats of an export file into the store: all of them, or none when any is
/// refused (see the module's doc). Returns the new records.
pub fn import_file(store: &ChatStore, path: &Path) -> Result<Vec<ChatRecord>, ImportError> {
    let read = |source| ImportError::Read { path: path.to_path_buf(), source };
    let file = crate::files::open_regular(path).map_err(read)?;
    let len = file.metadata().map_err(read)?.len();
    if len > MAX_IMPORT_BYTES {
        return Err(ImportError::TooLarge { bytes: len });
    }
    let mut bytes = Vec::new();
    file.take(MAX_IMPORT_BYTES + 1).read_to_end(&mut bytes).map_err(read)?;
    if bytes.len() as u64 > MAX_IMPORT_BYTES {
        return Err(ImportError::TooLarge { bytes: bytes.len() as u64 });
    }
    import_bytes(store, &bytes)
}

/// [`import_file`] of a file's bytes.
pub fn import_bytes(store: &ChatStore, bytes: &[u8]) -> Result<Vec<ChatRecord>, ImportError> {
    let records = read_export(bytes)?;
    let mut imported: Vec<ChatRecord> = Vec::with_capacity(records.len());
    for mut record in records {
        let saved = store.new_id(unix_ms()).and_then(|id| {
            record.id = id;
            let saved = store.save(&record);
            store.unlock(&record.id);
            saved
        });
        if let Err(e) = saved {
            // All or nothing: the chats this import wrote go again.
            for done in &imported {
                let _ = store.delete(&done.id);
            }
            return Err(e.into());
        }
        imported.push(record);
    }
    Ok(imported)
}

/// The chats of an export, checked as the store checks its own records and ready to be
/// saved under new ids (`tokens` 0: they come without a cache).
pub fn read_export(bytes: &[u8]) -> Result<Vec<ChatRecord>, ImportError> {
    if bytes.len() as u64 > MAX_IMPORT_BYTES {
        return Err(ImportError::TooLarge { bytes: bytes.len() as u64 });
    }
    let not_json = |e: serde_json::Error| ImportError::NotJson(e.to_string());
    let head: Head = serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ImportError::NotAnExport(e.to_string()),
        _ => not_json(e),
    })?;
    match head.format.as_deref() {
        Some(FORMAT) => {}
        Some(other) => return Err(ImportError::NotAnExport(format!("its format is {other:?}, not {FORMAT:?}"))),
        None => return Err(ImportError::NotAnExport(format!("it has no \"format\": {FORMAT:?}"))),
    }
    match head.version {
        Some(v) if v == u64::from(VERSION) => {}
        Some(v) => return Err(ImportError::Version(v)),
        None => return Err(ImportError::NotAnExport("it has no version".into())),
    }
    let envelope: EnvelopeIn =
        serde_json::from_slice(bytes).map_err(|e| ImportError::NotAnExport(format!("its chats do not read: {e}")))?;
    if envelope.chats.is_empty() {
        return Err(ImportError::NoChats);
    }
    let mut records = envelope.chats;
    for (i, record) in records.iter_mut().enumerate() {
        let refuse = |title: &str, why: String| ImportError::BadChat { index: i + 1, title: clean_title(title), why };
        record.check_and_clean().map_err(|why| refuse(&record.title, why))?;
        record.tokens = 0;
        let bytes = serde_json::to_vec_pretty(&*record).map(|j| j.len() as u64).unwrap_or(u64::MAX);
        if bytes > MAX_RECORD_BYTES {
            let why = format!("{bytes} bytes, more than the {MAX_RECORD_BYTES} a chat may hold");
            return Err(refuse(&record.title, why));
        }
    }
    Ok(records)
}

/// `2026-12-02` (UTC) of milliseconds since the Unix epoch.
fn utc_date(ms: u64) -> String {
    let (y, m, d, _, _) = civil(ms);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `2026-12-02 11:16 UTC`.
fn utc_date_time(ms: u64) -> String {
    let (y, m, d, hh, mm) = civil(ms);
    format!("{y:04}-{m:02}-{d:02} {hh:02}:{mm:02} UTC")
}

/// Year, month, day, hour and minute (UTC) of milliseconds since the Unix epoch.
fn civil(ms: u64) -> (i64, u32, u32, u32, u32) {
    let secs = (ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = crate::calendar::civil_from_days(days);
    (y, m, d, (rem / 3600) as u32, (rem % 3600 / 60) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::Message;

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc_date_time(0), "1970-01-01 00:00 UTC");
        // 2024-02-29 23:59:30 UTC, a leap day.
        assert_eq!(utc_date_time(1_709_251_170_000), "2024-02-29 23:59 UTC");
        assert_eq!(utc_date(1_798_761_600_000), "2027-01-01");
    }

    #[test]
    fn slugs_keep_letters_and_digits() {
        assert_eq!(slug("Trip to Lisbon, 2026!"), "trip-to-lisbon-2026");
        assert_eq!(slug("  ../../etc/passwd "), "etc-passwd");
        assert_eq!(slug("Größe — 日本"), "größe-日本");
        assert_eq!(slug("!!!"), "");
    }

    #[test]
    fn markdown_keeps_messages_verbatim_and_closes_an_open_fence() {
        let record = ChatRecord {
            id: "x-1".into(),
            title: "Code".into(),
            name: None,
            created: 0,
            updated: 60_000,
            tokens: 0,
            system_prompt: Some("Be brief.".into()),
            thinking: None,
            messages: vec![
                Message::new(Role::User, "Show me\n```rust\nfn main() {}\n```"),
                Message::new(Role::Assistant, "Half a fence:\n~~~~py\nprint(1)"),
                Message::new(Role::User, "thanks"),
            ],
            forks: Vec::new(),
        };
        let md = to_markdown(std::slice::from_ref(&record));
        assert!(
            md.starts_with("# Code\n\n*Started 1970-01-01 00:00 UTC · last used 1970-01-01 00:01 UTC · 3 messages*")
        );
        assert!(md.contains("## System prompt\n\nBe brief.\n"), "{md}");
        assert!(md.contains("## User\n\nShow me\n```rust\nfn main() {}\n```\n\n## Assistant"), "{md}");
        assert!(md.contains("print(1)\n~~~~\n\n## User\n\nthanks\n"), "{md}");
        assert_eq!(open_fence("```\na\n```\n"), None);
        // A reply's thinking: collapsed above its answer.
        let record = ChatRecord {
            messages: vec![
                Message::new(Role::User, "Is 91 prime?"),
                Message::new(Role::Assistant, "No: 7 * 13.").with_thinking(Some("Try 7.\n```\nopen".into())),
            ],
            ..record
        };
        let md = to_markdown(&[record]);
        assert!(
            md.contains(
                "## Assistant\n\n<details>\n<summary>Thinking</summary>\n\nTry 7.\n```\nopen\n```\n\n</details>\n\nNo: 7 * 13.\n"
            ),
            "{md}"
        );
        assert_eq!(open_fence("````\n```\n"), Some("````".into()));
    }
}
