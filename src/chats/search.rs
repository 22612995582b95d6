//! Search across chats (`pocketchat chats --grep TEXT`, the app's search field): the chats
//! whose title, system prompt or messages hold a text, ignoring case, each with a short
//! snippet around its first match.

use std::ops::Range;

use serde::Serialize;

use super::{clean_name, ChatRecord, ChatStore};
use crate::transcript::Role;

/// Characters of context a snippet shows before and after the match.
const SNIPPET_BEFORE: usize = 30;
const SNIPPET_AFTER: usize = 50;

/// A chat that holds the text searched for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMatch {
    pub id: String,
    pub title: String,
    pub updated: u64,
    /// Where the first match is.
    pub place: Place,
    /// One line around the first match (`…` where it is cut).
    pub snippet: String,
}

/// Where in a chat a match is: its title (or whole name), its system prompt or a message
/// (numbered from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "in")]
pub enum Place {
    Title,
    SystemPrompt,
    Message { number: usize, role: Role },
}

impl Place {
    pub fn label(&self) -> String {
        match self {
            Place::Title => "title".into(),
            Place::SystemPrompt => "system prompt".into(),
            Place::Message { number, role: Role::User } => format!("message {number} (user)"),
            Place::Message { number, role: Role::Assistant } => format!("message {number} (assistant)"),
            Place::Message { number, role: Role::System } => format!("message {number} (system)"),
        }
    }
}

/// The readable chats holding `text` (ignoring case), the most recently used first; an
/// empty or blank text matches nothing.
pub fn search(store: &ChatStore, text: &str) -> Vec<ChatMatch> {
    if text.trim().is_empty() {
        return Vec::new();
    }
    let mut found: Vec<ChatMatch> =
        store.ids().into_iter().filter_map(|id| store.load(&id).ok()).filter_map(|r| find_in(&r, text)).collect();
    found.sort_by(|a, b| b.updated.cmp(&a.updated).then_with(|| b.id.cmp(&a.id)));
    found
}

/// The first place `record` holds `text` (ignoring case): its name or title, its system
/// prompt, then its messages in order.
pub fn find_in(record: &ChatRecord, text: &str) -> Option<ChatMatch> {
    let name = record.name.as_deref().unwrap_or(&record.title);
    let places =
        [(Place::Title, name), (Place::SystemPrompt, record.system_prompt.as_deref().unwrap_or(""))].into_iter().chain(
            record
                .messages
                .iter()
                .enumerate()
                .map(|(i, m)| (Place::Message { number: i + 1, role: m.role }, m.content.as_str())),
        );
    places.into_iter().find_map(|(place, haystack)| {
        let at = find_ignoring_case(haystack, text)?;
        Some(ChatMatch {
            id: record.id.clone(),
            title: record.title.clone(),
            updated: record.updated,
            place,
            snippet: snippet(haystack, at),
        })
    })
}

/// Where `needle` first occurs in `haystack`, comparing lowercase characters; `None` for
/// an empty needle.
pub fn find_ignoring_case(haystack: &str, needle: &str) -> Option<Range<usize>> {
    let needle: Vec<char> = needle.chars().flat_map(char::to_lowercase).collect();
    let first = *needle.first()?;
    haystack.char_indices().find_map(|(start, c)| {
        if c.to_lowercase().next() != Some(first) {
            return None;
        }
        let len = match_len(&haystack[start..], &needle)?;
        Some(start..start + len)
    })
}

/// Bytes of `hay`'s start that match `needle` (lowercase characters), if it does.
fn match_len(hay: &str, needle: &[char]) -> Option<usize> {
    let mut want = needle.iter().peekable();
    for (at, c) in hay.char_indices() {
        for lower in c.to_lowercase() {
            match want.next() {
                Some(&w) if w == lower => {}
                Some(_) => return None,
                // The needle ended inside this character's lowercase form.
                None => return Some(at + c.len_utf8()),
            }
        }
        if want.peek().is_none() {
            return Some(at + c.len_utf8());
        }
    }
    None
}

/// One line of `text` around `at`: a few words either side, whitespace and control
/// characters as single spaces, `…` where it is cut.
pub fn snippet(text: &str, at: Range<usize>) -> String {
    let start = text[..at.start].char_indices().rev().nth(SNIPPET_BEFORE - 1).map_or(0, |(i, _)| i);
    let end = text[at.end..].char_indices().nth(SNIPPET_AFTER).map_or(text.len(), |(i, _)| at.end + i);
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    out.push_str(&clean_name(&text[start..end]));
    if end < text.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::Message;

    #[test]
    fn matches_ignore_case_also_beyond_ascii() {
        assert_eq!(find_ignoring_case("The Capital of ITALY", "italy"), Some(15..20));
        assert_eq!(find_ignoring_case("Straße in ÄRHUS", "ärhus"), Some(11..17));
        assert_eq!(find_ignoring_case("abc", ""), None);
        assert_eq!(find_ignoring_case("abc", "abcd"), None);
        assert_eq!(find_ignoring_case("aab", "ab"), Some(1..3));
    }

    #[test]
    fn snippets_are_one_line_around_the_match() {
        let text = format!("{}\nthe needle is\there{}", "x".repeat(100), "y".repeat(100));
        let at = find_ignoring_case(&text, "NEEDLE").unwrap();
        let s = snippet(&text, at);
        assert!(s.starts_with('…') && s.ends_with('…'), "{s}");
        assert!(s.contains("the needle is here"), "{s}");
        assert!(!s.contains('\n') && !s.contains('\t'), "{s}");
        assert_eq!(snippet("short needle", 6..12), "short needle");
    }

    #[test]
    fn a_chat_is_found_by_title_system_prompt_or_message() {
        let r = ChatRecord {
            id: "a-1".into(),
            title: "Trip".into(),
            name: Some("Trip to Lisbon".into()),
            created: 0,
            updated: 0,
            tokens: 0,
            system_prompt: Some("You are a travel agent.".into()),
            thinking: None,
            messages: vec![Message::new(Role::User, "Where to eat?"), Message::new(Role::Assistant, "Try PASTÉIS.")],
            forks: Vec::new(),
        };
        assert_eq!(find_in(&r, "lisbon").unwrap().place, Place::Title);
        assert_eq!(find_in(&r, "AGENT").unwrap().place, Place::SystemPrompt);
        let m = find_in(&r, "pastéis").unwrap();
        assert_eq!(m.place, Place::Message { number: 2, role: Role::Assistant });
        assert_eq!(m.snippet, "Try PASTÉIS.");
        assert_eq!(m.place.label(), "message 2 (assistant)");
        assert!(find_in(&r, "Porto").is_none());
    }
}
