//! The chat store's conversations on the engine thread: the open chat's whole transcript
//! (its trimmed turns too), switching (the target's cache restored without re-prefill,
//! or its text re-read at the next message), rename, delete, the per-chat system prompt,
//! the versions of a message (a replaced turn kept as one, another one shown with the
//! cache kept up to the fork), and the record saved beside the cache after each reply.

use super::Worker;
use crate::chats::{unix_ms, ChatRecord, ChatStore, ChatStoreError, UNTITLED};
use crate::engine::budget::reply_reserve;
use crate::engine::text::template::{Message, Role};
use crate::engine::EngineEvent;

impl Worker {
    fn store(&self) -> Option<ChatStore> {
        self.config.chats.clone()
    }

    pub(super) fn notice(&self, message: String) {
        self.emit(EngineEvent::Notice { message });
    }

    /// At launch, once the model is loaded: the configured chat, else the most recent
    /// one that no other process has open, else a new one.
    pub(super) fn open_initial_chat(&mut self) {
        let Some(store) = self.store() else { return };
        let record = match self.config.open_chat.clone() {
            Some(id) => match store.lock(&id).and_then(|()| store.load(&id)) {
                Ok(record) => Some(record),
                Err(e) => {
                    store.unlock(&id);
                    self.notice(format!("{e}; starting a new chat."));
                    self.create_chat(&store)
                }
            },
            None => self.first_free_chat(&store).or_else(|| self.create_chat(&store)),
        };
        if let Some(record) = record {
            // The cap holds across restarts, also when it was lowered meanwhile.
            store.enforce_cap(Some(&record.id));
            self.activate(record);
        }
    }

    /// The most recent readable chat this process holds or can lock (another process
    /// may have the others open).
    fn first_free_chat(&self, store: &ChatStore) -> Option<ChatRecord> {
        store.list().into_iter().filter(|c| c.unreadable.is_none()).find_map(|c| {
            let was_held = store.holds(&c.id);
            store.lock(&c.id).ok()?;
            let loaded = store.load(&c.id);
            if loaded.is_err() && !was_held {
                store.unlock(&c.id);
            }
            loaded.ok()
        })
    }

    fn create_chat(&self, store: &ChatStore) -> Option<ChatRecord> {
        match store.create(UNTITLED) {
            Ok(record) => Some(record),
            Err(e) => {
                self.notice(format!("A new chat could not be saved in {}: {e}", store.dir().display()));
                None
            }
        }
    }

    /// `NewConversation` with a chat store: the open chat is saved and stays in the list.
    /// Returns false without a store.
    pub(super) fn new_chat(&mut self) -> bool {
        let Some(store) = self.store() else { return false };
        self.save();
        if let Some(record) = self.create_chat(&store) {
            self.activate(record);
        }
        true
    }

    pub(super) fn open_chat(&mut self, id: &str) {
        let Some(store) = self.store() else { return self.notice("There is no chat list here.".into()) };
        if self.active.as_ref().is_some_and(|a| a.id == id) {
            return;
        }
        match store.load(id) {
            Ok(record) => {
                self.save();
                self.activate(record);
            }
            Err(e) => self.notice(e.to_string()),
        }
    }

    pub(super) fn rename_chat(&mut self, id: &str, title: &str) {
        let Some(store) = self.store() else { return };
        match store.rename(id, title) {
            Ok(record) => {
                // The open chat is saved whole after each reply: it must carry the new
                // name too, or the next save would put the old one back.
                if let Some(active) = self.active.as_mut().filter(|a| a.id == id) {
                    active.title = record.title;
                    active.name = record.name;
                }
            }
            Err(e) => self.notice(format!("The chat could not be renamed: {e}")),
        }
        self.emit_chats();
    }

    /// Deletes a chat; deleting the open one opens the most recent other (or a new one).
    pub(super) fn delete_chat(&mut self, id: &str) {
        let Some(store) = self.store() else { return };
        let was_open = self.active.as_ref().is_some_and(|a| a.id == id);
        if was_open {
            self.active = None;
            self.state_lock = None;
            self.config.state_file = None;
        }
        if let Err(e) = store.delete(id) {
            self.notice(format!("The chat could not be deleted: {e}"));
        }
        if !was_open {
            return self.emit_chats();
        }
        let next = self.first_free_chat(&store);
        if let Some(record) = next.or_else(|| self.create_chat(&store)) {
            self.activate(record);
        }
    }

    /// The open chat's system prompt; the conversation is re-read with it at the next
    /// message (it comes first, so no cached token stays valid).
    pub(super) fn set_system_prompt(&mut self, text: &str) {
        let Some(active) = self.active.as_mut() else {
            return self.notice("A system prompt needs a chat from the chat list.".into());
        };
        let prompt = Some(text.trim().to_string()).filter(|t| !t.is_empty());
        if active.system_prompt == prompt {
            return;
        }
        active.system_prompt = prompt;
        let history = active.history();
        if let Some(l) = self.loaded.as_mut() {
            l.session.set_history(history);
        }
        self.save();
        self.notice("The system prompt changed: the conversation is re-read with it at your next message.".into());
        self.emit_stats();
    }

    /// The thinking switch in force: the open chat's, else the session's.
    pub(super) fn thinking_switch(&self) -> Option<bool> {
        self.active.as_ref().map_or(self.thinking, |a| a.thinking)
    }

    /// Sets the thinking switch of the open chat (or of the session without a chat store)
    /// and applies it to the turns to come; the record is saved with it.
    pub(super) fn set_thinking(&mut self, enabled: Option<bool>) {
        match self.active.as_mut() {
            Some(active) if active.thinking != enabled => active.thinking = enabled,
            Some(_) => return,
            None => self.thinking = enabled,
        }
        if let Some(l) = self.loaded.as_mut() {
            l.session.set_enable_thinking(enabled);
        }
        self.save_record();
        self.emit(EngineEvent::ThinkingSwitch { enabled });
    }

    /// Makes `record` the open chat: locked for this process (a chat open in another
    /// process is not opened: the user is told which process has it), its cache restored
    /// when it fits the record, else its text set to be re-read.
    fn activate(&mut self, mut record: ChatRecord) {
        let Some(store) = self.store() else { return };
        let _span = tracing::info_span!("open_chat", chat = %record.id).entered();
        if let Err(e) = store.lock(&record.id) {
            return self.notice(e.to_string());
        }
        if let Some(previous) = self.active.take().filter(|a| a.id != record.id) {
            store.unlock(&previous.id);
        }
        // The chat's lock covers its cache: no separate state-file lock.
        self.state_lock = None;
        let path = store.cache_path(&record.id);
        self.config.state_file = Some(path.clone());
        self.regenerations = 0;
        if let Some(l) = self.loaded.as_mut() {
            l.session.set_enable_thinking(record.thinking);
        }
        let not_resumed = self.resume(&store, &mut record, &path);
        let tokens = self.loaded.as_ref().map_or(0, |l| l.session.state.len());
        self.emit(EngineEvent::ChatOpened {
            id: record.id.clone(),
            title: record.title.clone(),
            system_prompt: record.system_prompt.clone(),
            messages: record.messages.clone(),
            tokens,
            resumed: not_resumed.is_none(),
        });
        self.emit(EngineEvent::ThinkingSwitch { enabled: record.thinking });
        self.emit_branches_of(&record);
        // After the transcript, so the UI shows it below.
        if let Some(why) = not_resumed.filter(|_| !record.messages.is_empty()) {
            let n = record.messages.len();
            self.notice(format!("“{}”: {why}; its {n} messages are re-read with your next message.", record.title));
        }
        self.active = Some(record);
        self.emit_chats();
        self.emit_stats();
    }

    /// Restores the chat's cache when it holds the end of the record's conversation, or
    /// that and one turn more (the process ended between saving the cache and the
    /// record: the turn is added to the record); otherwise the cache is dropped (it is
    /// derived from the text) and the text is set to be re-read at the next message.
    /// Returns why it was not restored.
    fn resume(&mut self, store: &ChatStore, record: &mut ChatRecord, path: &std::path::Path) -> Option<String> {
        let history = record.history();
        let why = if path.exists() || path.is_symlink() {
            match self.restore_session(path) {
                Ok(()) => {
                    let Some(l) = self.loaded.as_ref() else { return Some("no model is loaded".into()) };
                    if cache_matches(l.session.messages(), &history) {
                        return None;
                    }
                    if let Some(turn) = turn_ahead(l.session.messages(), &history) {
                        record.messages.extend(turn);
                        record.updated = unix_ms();
                        record.title_from_first_message();
                        if let Err(e) = store.save(record) {
                            self.notice(format!("The chat “{}” could not be saved: {e}", record.title));
                        }
                        return None;
                    }
                    "its cache did not match its text".to_string()
                }
                Err(e) => format!("its cache could not be used ({e})"),
            }
        } else {
            "it has no cache on disk (imported, or dropped by the caches' size cap)".to_string()
        };
        if path.exists() || path.is_symlink() {
            // This process holds the chat (see `activate`): its caches are ours to drop.
            if let Err(e) = store.drop_caches(&record.id) {
                tracing::warn!("the cache of {} stays: {e}", record.id);
            }
        }
        if let Some(l) = self.loaded.as_mut() {
            l.session.set_history(history);
        }
        Some(why)
    }

    /// Records a finished turn in the open chat: the session's last user message and
    /// reply replace the transcript's last `replaces` messages.
    pub(super) fn record_turn(&mut self, replaces: usize) {
        let (Some(active), Some(l)) = (self.active.as_mut(), self.loaded.as_ref()) else { return };
        let turn: Vec<Message> = l.session.messages().iter().rev().take(2).rev().cloned().collect();
        let keep = active.messages.len().saturating_sub(replaces);
        // What it replaces stays as another version.
        active.replace_from(keep, turn);
        active.updated = unix_ms();
        active.title_from_first_message();
        self.emit_branches();
    }

    /// Tells the UI which messages of the open chat have other versions.
    pub(super) fn emit_branches(&self) {
        if let Some(active) = &self.active {
            self.emit_branches_of(active);
        }
    }

    fn emit_branches_of(&self, record: &ChatRecord) {
        self.emit(EngineEvent::Branches { points: record.branch_points() });
    }

    /// Shows version `version` of the open chat's message `index`: the cache is kept up
    /// to where the versions part and only the rest is fed (or, when the cache cannot be
    /// kept, the chat is re-read at the next message); record and cache are saved.
    pub(super) fn switch_branch(&mut self, index: usize, version: usize) {
        let Some(active) = self.active.as_mut() else {
            return self.notice("Versions of a message need a chat from the chat list.".into());
        };
        if let Err(why) = active.switch_version(index, version) {
            return self.notice(format!("That version could not be shown: {why}."));
        }
        let history = active.history();
        let messages = active.messages.clone();
        let started = std::time::Instant::now();
        let budget = self.budget();
        let reserve = reply_reserve(budget, self.config.max_tokens);
        let (kept, fed, cached) = match self.loaded.as_mut() {
            Some(l) => {
                l.session.set_budget(budget);
                match l.session.switch_history(&l.model, &l.tokenizer, &history, reserve) {
                    Ok(Some(s)) => (s.kept, s.fed, true),
                    Ok(None) => {
                        l.session.set_history(history);
                        (0, 0, false)
                    }
                    Err(e) => {
                        tracing::warn!("the version could not be fed: {e}");
                        l.session.set_history(history);
                        (0, 0, false)
                    }
                }
            }
            None => (0, 0, false),
        };
        self.last_stats.prefill_tokens = fed;
        self.last_stats.prefill_ms = started.elapsed().as_secs_f64() * 1e3;
        self.last_stats.drafted_tokens = 0;
        self.last_stats.generated_tokens = 0;
        self.last_stats.ttft_ms = 0.0;
        self.last_stats.decode_tok_s = 0.0;
        tracing::info!("version {} of message {}: kept {kept} cached tokens, fed {fed}", version + 1, index + 1);
        self.emit(EngineEvent::BranchSwitched { messages, kept_tokens: kept, fed_tokens: fed, cached });
        self.emit_branches();
        if !cached {
            // The cache on disk holds the other version: it goes (this process holds the
            // chat), and the version is re-read at the next message, as a chat without one.
            if let (Some(store), Some(active)) = (self.store(), self.active.as_ref()) {
                if let Err(e) = store.drop_caches(&active.id) {
                    tracing::warn!("the cache of {} stays: {e}", active.id);
                }
            }
            self.save_record();
        } else {
            self.save();
        }
        self.emit_stats();
    }

    /// Saves the open chat's record (its tokens now) and keeps the caches under the cap.
    pub(super) fn save_record(&mut self) {
        let Some(store) = self.store() else { return };
        let tokens = self.loaded.as_ref().map_or(0, |l| l.session.state.len());
        let Some(active) = self.active.as_mut() else { return };
        active.tokens = tokens;
        let (saved, id, title) = (store.save(active), active.id.clone(), active.title.clone());
        match saved {
            Ok(()) => {}
            // Names the chat and says what to do already.
            Err(e @ ChatStoreError::TooLarge { .. }) => self.notice(e.to_string()),
            Err(e) => self.notice(format!("The chat “{title}” could not be saved: {e}")),
        }
        for chat in store.enforce_cap(Some(&id)) {
            tracing::info!("dropped the cache of “{}” ({} bytes) to stay under the cap", chat.title, chat.cache_bytes);
        }
        self.emit_chats();
    }

    pub(super) fn emit_chats(&self) {
        let Some(store) = self.store() else { return };
        let chats = store.list();
        let cache_bytes = chats.iter().map(|c| c.cache_bytes).sum();
        self.emit(EngineEvent::Chats {
            chats,
            active: self.active.as_ref().map(|a| a.id.clone()),
            cache_bytes,
            cache_cap_bytes: store.cache_cap_bytes(),
        });
    }

    /// Whether the open chat's transcript ends with the turn of `user` (a message and its
    /// reply): 2 messages to replace when that turn is answered again, else 0.
    pub(super) fn transcript_ends_with_turn(&self, user: &str) -> usize {
        match self.active.as_ref().map(|a| a.messages.as_slice()) {
            Some([.., u, a]) if u.role == Role::User && u.content == user && a.role == Role::Assistant => 2,
            _ => 0,
        }
    }

    /// Says how much of the transcript a rewind kept: the open chat's messages less those
    /// `replaces` takes (the user's message stays when `keeps_prompt`); without a store,
    /// the session's.
    pub(super) fn emit_rewound(&self, replaces: usize, keeps_prompt: bool) {
        let kept = match &self.active {
            Some(a) => a.messages.len() - replaces.min(a.messages.len()) + usize::from(keeps_prompt && replaces == 2),
            None => self
                .loaded
                .as_ref()
                .map_or(0, |l| l.session.messages().iter().filter(|m| m.role != Role::System).count()),
        };
        self.emit(EngineEvent::Rewound { kept });
    }

    /// For a last turn that is no longer cached (trimmed, evicted): sets the open chat's
    /// history without that turn to be re-read, and returns its user message.
    pub(super) fn reread_without_last_turn(&mut self) -> Option<String> {
        let active = self.active.as_ref()?;
        let [.., user, reply] = active.messages.as_slice() else { return None };
        if user.role != Role::User || reply.role != Role::Assistant {
            return None;
        }
        let prompt = user.content.clone();
        let mut history = active.history();
        history.truncate(history.len() - 2);
        self.loaded.as_mut()?.session.set_history(history);
        Some(prompt)
    }

    /// The open chat's transcript (the session's messages without a store).
    pub(super) fn transcript(&self) -> Vec<Message> {
        match (&self.active, &self.loaded) {
            (Some(a), _) => a.messages.clone(),
            (None, Some(l)) => l.session.messages().iter().filter(|m| m.role != Role::System).cloned().collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// The turn a restored cache holds past the end of its chat's record: the cache matches
/// the record once its last turn (a user message and a reply) is set aside, and it holds
/// at least one message of the record besides (a cache trimmed to that one turn is not
/// known to follow the record).
fn turn_ahead(cached: &[Message], history: &[Message]) -> Option<[Message; 2]> {
    let [before @ .., user, reply] = cached else { return None };
    if user.role != Role::User || reply.role != Role::Assistant || !cache_matches(before, history) {
        return None;
    }
    let record_turns = history.iter().filter(|m| m.role != Role::System).count();
    let cached_turns = before.iter().filter(|m| m.role != Role::System).count();
    (record_turns == 0 || cached_turns > 0).then(|| [user.clone(), reply.clone()])
}

/// A restored cache belongs to a chat when it holds the chat's system prompt and the end
/// of its conversation (older turns may have been trimmed out of the cache).
fn cache_matches(cached: &[Message], history: &[Message]) -> bool {
    let split = |m: &[Message]| match m.first() {
        Some(first) if first.role == Role::System => (Some(first.clone()), m[1..].to_vec()),
        _ => (None, m.to_vec()),
    };
    let (cached_system, cached_turns) = split(cached);
    let (system, turns) = split(history);
    cached_system == system && turns.ends_with(&cached_turns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_matches_the_end_of_its_chat() {
        let m = |role, text: &str| Message::new(role, text);
        let history = [
            m(Role::System, "s"),
            m(Role::User, "a"),
            m(Role::Assistant, "b"),
            m(Role::User, "c"),
            m(Role::Assistant, "d"),
        ];
        assert!(cache_matches(&history, &history));
        assert!(cache_matches(&[m(Role::System, "s"), m(Role::User, "c"), m(Role::Assistant, "d")], &history));
        assert!(!cache_matches(&[m(Role::User, "c"), m(Role::Assistant, "d")], &history), "system prompt differs");
        assert!(!cache_matches(&[m(Role::System, "s"), m(Role::User, "a"), m(Role::Assistant, "b")], &history));
        assert!(cache_matches(&[m(Role::System, "s")], &[m(Role::System, "s")]));
    }

    #[test]
    fn a_cache_one_turn_ahead_of_its_record_gives_that_turn() {
        let m = |role, text: &str| Message::new(role, text);
        let record = [m(Role::System, "s"), m(Role::User, "a"), m(Role::Assistant, "b")];
        let mut cached = record.to_vec();
        cached.extend([m(Role::User, "c"), m(Role::Assistant, "d")]);
        assert_eq!(turn_ahead(&cached, &record), Some([m(Role::User, "c"), m(Role::Assistant, "d")]));
        assert_eq!(turn_ahead(&cached[2..], &record[..1]), None, "the system prompt differs");
        assert_eq!(turn_ahead(&[m(Role::System, "s"), m(Role::User, "c"), m(Role::Assistant, "d")], &record), None);
        assert_eq!(turn_ahead(&record, &record[..1]), Some([m(Role::User, "a"), m(Role::Assistant, "b")]));
        assert_eq!(turn_ahead(&cached[..4], &record), None, "an unanswered message is no turn");
    }
}
