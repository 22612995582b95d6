//! The chat list on the engine thread, on a tiny random-weight GGUF written by the test:
//! switching among chats restores each one's cache, so a resumed turn feeds only its own
//! tokens; the caches' size cap drops the oldest caches (their text stays and is re-read
//! on demand) and holds across a restart; regenerate and edit feed only the changed turn;
//! editing an earlier message keeps the old continuation as another version, across a
//! restart, and switching versions feeds only what follows the fork (on the tiny model
//! and, to the token, on the real default model).
//!
//! Token counts are what is asserted; the times are printed, never asserted.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{default_model, write_tiny_gguf, TinySpec};
use pocketchat::chats::branches::BranchPoint;
use pocketchat::chats::{ChatStore, ChatSummary};
use pocketchat::engine::sampler::SamplingOverrides;
use pocketchat::engine::template::{Message, Role};
use pocketchat::engine::{Command, Engine, EngineConfig, EngineEvent, EngineEvents, EngineHandle, Stats};

struct Chats {
    handle: EngineHandle,
    events: EngineEvents,
    /// The chat list from the latest `Chats` event.
    list: Vec<ChatSummary>,
    /// The open chat's messages with other versions, from the latest `Branches` event.
    branches: Vec<BranchPoint>,
    /// `Trimmed` events seen.
    trims: usize,
}

/// A `BranchSwitched`: the transcript shown, the tokens kept and fed, whether the cache
/// was kept; and the stats after it.
struct Switch {
    messages: Vec<Message>,
    kept: usize,
    fed: usize,
    cached: bool,
    stats: Stats,
}

/// Opened chat: (id, messages, tokens, resumed).
type Opened = (String, usize, usize, bool);

impl Chats {
    /// An engine on the tiny model with the chat store in `dir/chats`, ready, with the
    /// chat it opened at launch.
    fn start(dir: &Path, cap_bytes: u64, open: Option<&str>) -> (Chats, Opened) {
        let model = dir.join("tiny-llama-2l-Q8_0.gguf");
        let model = if model.exists() { model } else { write_tiny_gguf(dir, &TinySpec::default(), 5) };
        Chats::start_on(dir, &model, 12, 1.0, 1024, cap_bytes, open)
    }

    /// [`Chats::start`] on `model`, replies of up to `max_tokens` sampled at `temperature`,
    /// a token budget of `budget`.
    fn start_on(
        dir: &Path,
        model: &Path,
        max_tokens: usize,
        temperature: f32,
        budget: usize,
        cap_bytes: u64,
        open: Option<&str>,
    ) -> (Chats, Opened) {
        let mut config = EngineConfig::new(model.to_path_buf());
        config.max_tokens = max_tokens;
        config.budget_override = Some(budget);
        // A fake headroom probe: no live memory figure, so the budget is the configured one.
        config.headroom = Arc::new(|| None);
        config.threads = Some(1);
        config.sampling = SamplingOverrides { temperature: Some(temperature), ..Default::default() };
        config.chats = Some(ChatStore::open(dir.join("chats"), cap_bytes).unwrap());
        config.open_chat = open.map(String::from);
        let (handle, events) = Engine::spawn(config);
        let mut chats = Chats { handle, events, list: Vec::new(), branches: Vec::new(), trims: 0 };
        let opened = chats.opened();
        (chats, opened)
    }

    fn next(&mut self) -> EngineEvent {
        let event = self.events.recv_blocking().expect("the engine thread is running");
        match &event {
            EngineEvent::Failed { error } => panic!("the engine failed: {error}"),
            EngineEvent::Chats { chats, .. } => self.list = chats.clone(),
            EngineEvent::Branches { points } => self.branches = points.clone(),
            EngineEvent::Trimmed { .. } => self.trims += 1,
            _ => {}
        }
        event
    }

    /// Waits for the next `ChatOpened` and the stats after it.
    fn opened(&mut self) -> Opened {
        let opened = loop {
            if let EngineEvent::ChatOpened { id, messages, tokens, resumed, .. } = self.next() {
                break (id, messages.len(), tokens, resumed);
            }
        };
        while !matches!(self.next(), EngineEvent::Stats(_)) {}
        opened
    }

    /// Sends a command that answers with a reply; returns the prefill's stats, the
    /// reply's text and the stats after it.
    fn turn(&mut self, command: Command) -> (Stats, String, Stats) {
        self.handle.send(command).unwrap();
        let mut prefill = None;
        let mut text = String::new();
        loop {
            match self.next() {
                EngineEvent::Stats(s) if prefill.is_none() => prefill = Some(s),
                EngineEvent::Token { text: piece } => text.push_str(&piece),
                EngineEvent::Done { .. } => break,
                _ => {}
            }
        }
        let after = loop {
            if let EngineEvent::Stats(s) = self.next() {
                break s;
            }
        };
        (prefill.expect("stats after the prefill"), text, after)
    }

    fn send(&mut self, text: &str) -> (Stats, String, Stats) {
        self.turn(Command::Send { text: text.into() })
    }

    /// Shows version `version` of message `index`.
    fn switch(&mut self, index: usize, version: usize) -> Switch {
        self.handle.send(Command::SwitchBranch { index, version }).unwrap();
        let (messages, kept, fed, cached) = loop {
            if let EngineEvent::BranchSwitched { messages, kept_tokens, fed_tokens, cached } = self.next() {
                break (messages, kept_tokens, fed_tokens, cached);
            }
        };
        let stats = loop {
            if let EngineEvent::Stats(s) = self.next() {
                break s;
            }
        };
        Switch { messages, kept, fed, cached, stats }
    }

    fn open(&mut self, command: Command) -> Opened {
        self.handle.send(command).unwrap();
        self.opened()
    }

    fn shutdown(self) {
        self.handle.send(Command::Shutdown).unwrap();
        let mut events = self.events;
        while events.recv_blocking().is_some() {}
    }
}

const TURNS: [&str; 3] = ["tell me about the sea", "tell me more", "and then what"];

/// Three chats of three turns each; returns their ids, oldest first.
fn three_chats(chats: &mut Chats, first: Opened) -> Vec<String> {
    let mut ids = vec![first.0];
    for chat in 0..3 {
        if chat > 0 {
            ids.push(chats.open(Command::NewConversation).0);
        }
        for text in TURNS {
            chats.send(&format!("{text} ({chat})"));
        }
    }
    ids
}

#[test]
fn switching_among_three_chats_resumes_each_from_its_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (mut chats, first) = Chats::start(dir.path(), 1 << 30, None);
    assert_eq!((first.1, first.2), (0, 0), "a first launch opens a new, empty chat");
    let ids = three_chats(&mut chats, first);

    // The same message as each chat's second turn: in a chat that never left memory it
    // would feed exactly as many tokens as that turn did.
    let second_turn = |chat: usize| format!("{} ({chat})", TURNS[1]);
    for (chat, id) in ids.iter().enumerate() {
        let (opened_id, messages, tokens, resumed) = chats.open(Command::OpenChat { id: id.clone() });
        assert_eq!(&opened_id, id);
        assert!(resumed, "chat {chat} was restored from its cache");
        assert_eq!(messages, 6, "three turns of chat {chat}");
        let (prefill, _, after) = chats.send(&second_turn(chat));
        let (fresh_prefill, ..) = {
            // The control: a new chat's second turn, the same text.
            chats.open(Command::NewConversation);
            chats.send("warm up");
            chats.send(&second_turn(chat))
        };
        eprintln!(
            "chat {chat}: resumed at {tokens} tokens; its next turn fed {} tokens, first token {:.1} ms (a turn in a chat that never left: {} tokens, {:.1} ms)",
            prefill.prefill_tokens, prefill.prefill_ms, fresh_prefill.prefill_tokens, fresh_prefill.prefill_ms
        );
        assert_eq!(prefill.prefill_tokens, fresh_prefill.prefill_tokens, "only the new turn was fed");
        assert!(after.context_tokens > tokens + prefill.prefill_tokens, "the cache grew from where it was");
        assert!(prefill.prefill_tokens * 2 < tokens, "far less than re-reading the chat");
    }

    // Each chat kept its whole transcript: its three turns and the one sent on return.
    let store = ChatStore::open(dir.path().join("chats"), 1 << 30).unwrap();
    for (chat, id) in ids.iter().enumerate() {
        let record = store.load(id).unwrap();
        let users: Vec<&str> =
            record.messages.iter().filter(|m| m.role == Role::User).map(|m| m.content.as_str()).collect();
        let want: Vec<String> = TURNS.iter().map(|t| format!("{t} ({chat})")).chain([second_turn(chat)]).collect();
        assert_eq!(users, want, "chat {chat}");
        assert_eq!(record.title, format!("{} ({chat})", TURNS[0]), "named after its first message");
    }
    chats.shutdown();

    // After a restart the most recent chat opens, from its cache.
    let (chats, opened) = Chats::start(dir.path(), 1 << 30, None);
    assert!(opened.3, "resumed after a restart");
    chats.shutdown();
}

#[test]
fn the_cache_cap_drops_the_oldest_caches_keeps_their_text_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut chats, first) = Chats::start(dir.path(), 1 << 30, None);
    let ids = three_chats(&mut chats, first);
    chats.shutdown();
    let store = ChatStore::open(dir.path().join("chats"), 1 << 30).unwrap();
    let one_cache = store.cache_bytes_of(&ids[2]);
    assert!(ids.iter().all(|id| store.cache_bytes_of(id) > 0), "every chat has a cache");

    // Restarted with room for about one and a half caches: the most recent chat opens
    // and keeps its cache; the two older ones lose theirs, oldest first.
    let cap = one_cache * 3 / 2;
    let (mut chats, opened) = Chats::start(dir.path(), cap, None);
    assert_eq!(opened.0, ids[2]);
    assert!(opened.3, "the open chat keeps its cache");
    let caches: Vec<u64> = ids.iter().map(|id| store.cache_bytes_of(id)).collect();
    assert_eq!(&caches[..2], [0, 0], "the older caches went: {caches:?}");
    assert!(store.cache_bytes() <= cap);

    // An older chat keeps its text and is re-read at its next message.
    let (_, messages, tokens, resumed) = chats.open(Command::OpenChat { id: ids[0].clone() });
    assert_eq!((messages, tokens, resumed), (6, 0, false));
    let (prefill, _, _) = chats.send("one more thing");
    let (resumed_prefill, ..) = chats.send("and another");
    eprintln!(
        "re-read: {} tokens in {:.1} ms; the next turn: {} tokens in {:.1} ms",
        prefill.prefill_tokens, prefill.prefill_ms, resumed_prefill.prefill_tokens, resumed_prefill.prefill_ms
    );
    assert!(prefill.prefill_tokens > 4 * resumed_prefill.prefill_tokens, "the whole chat was re-read once");
    let list = chats.list.clone();
    let others: u64 = list.iter().filter(|c| c.id != ids[0]).map(|c| c.cache_bytes).sum();
    assert!(list[0].cache_bytes + others <= cap || others == 0, "the open chat alone may pass the cap: {list:?}");
    assert_eq!(list[0].id, ids[0], "the chat just used is first");
    assert!(list.iter().all(|c| c.messages >= 6), "no chat lost its text: {list:?}");
    chats.shutdown();
}

#[test]
fn regenerate_and_edit_feed_only_the_changed_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (mut chats, _) = Chats::start(dir.path(), 1 << 30, None);
    chats.send("hello there");
    let (second, reply, before) = chats.send("tell me a story");

    // Regenerate: one token fed again (the prompt's last), a new sample.
    let (prefill, again, after) = chats.turn(Command::Regenerate);
    assert_eq!(prefill.prefill_tokens, 1);
    assert_eq!(prefill.context_tokens, second.context_tokens, "back at the end of the prompt");
    assert_ne!(again, reply, "a regenerated reply is a new sample");
    assert!(after.context_tokens >= prefill.context_tokens && before.context_tokens >= second.context_tokens);
    eprintln!("regenerate: fed {} token, first token {:.1} ms", prefill.prefill_tokens, prefill.prefill_ms);

    // Edit: the last turn is taken back and the new text (as long as the old) fed. The
    // original turn also fed the close of the reply before it (`<|im_end|>` and a
    // newline), which stays cached: two tokens fewer, and the same prompt length.
    let (edited, ..) = chats.turn(Command::EditLast { text: "tell me a fable".into() });
    assert_eq!(edited.prefill_tokens + 2, second.prefill_tokens);
    assert_eq!(edited.context_tokens, second.context_tokens);
    eprintln!("edit: fed {} tokens, first token {:.1} ms", edited.prefill_tokens, edited.prefill_ms);
    chats.shutdown();

    let store = ChatStore::open(dir.path().join("chats"), 1 << 30).unwrap();
    let record = store.load(&store.list()[0].id).unwrap();
    let users: Vec<&str> =
        record.messages.iter().filter(|m| m.role == Role::User).map(|m| m.content.as_str()).collect();
    assert_eq!(users, ["hello there", "tell me a fable"], "the edit replaced the message");
    assert_eq!(record.messages.len(), 4);
}

#[test]
fn a_cache_one_turn_ahead_of_its_record_is_restored_and_the_record_gets_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (mut chats, first) = Chats::start(dir.path(), 1 << 30, None);
    chats.send("hello there");
    chats.send("tell me a story");
    chats.shutdown();

    // A kill between the cache save and the record save: the cache has the last turn,
    // the record does not.
    let store = ChatStore::open(dir.path().join("chats"), 1 << 30).unwrap();
    let mut record = store.load(&first.0).unwrap();
    record.messages.truncate(2);
    store.save(&record).unwrap();
    let cache_bytes = store.cache_bytes_of(&first.0);

    let (chats, (id, messages, tokens, resumed)) = Chats::start(dir.path(), 1 << 30, None);
    assert_eq!(id, first.0);
    assert!(resumed, "the cache ahead of its record was restored");
    assert_eq!(messages, 4, "with the turn the record missed");
    assert!(tokens > 0);
    assert!(store.cache_bytes_of(&first.0) >= cache_bytes, "the cache was kept");
    chats.shutdown();
    let users: Vec<String> = store
        .load(&first.0)
        .unwrap()
        .messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.content.clone())
        .collect();
    assert_eq!(users, ["hello there", "tell me a story"]);
}

#[test]
fn a_second_engine_on_the_same_folder_never_opens_the_chat_the_first_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (mut first, (held, ..)) = Chats::start(dir.path(), 1 << 30, None);
    first.send("hello from the first");

    // At launch the most recent chat is the held one: the second engine starts another.
    let (mut second, (opened, ..)) = Chats::start(dir.path(), 1 << 30, None);
    assert_ne!(opened, held, "the second engine opened the chat the first holds");
    second.handle.send(Command::OpenChat { id: held.clone() }).unwrap();
    let notice = loop {
        match second.next() {
            EngineEvent::Notice { message } => break message,
            EngineEvent::ChatOpened { id, .. } => panic!("opened {id}, held by the first engine"),
            _ => {}
        }
    };
    assert!(notice.contains("open in another pocketchat"), "{notice}");
    second.send("hello from the second");
    first.send("more from the first");
    second.shutdown();
    first.shutdown();

    let store = ChatStore::open(dir.path().join("chats"), 1 << 30).unwrap();
    let users = |id: &str| -> Vec<String> {
        let record = store.load(id).unwrap();
        record.messages.iter().filter(|m| m.role == Role::User).map(|m| m.content.clone()).collect()
    };
    assert_eq!(users(&held), ["hello from the first", "more from the first"]);
    assert_eq!(users(&opened), ["hello from the second"]);
}

fn users(messages: &[Message]) -> Vec<&str> {
    messages.iter().filter(|m| m.role == Role::User).map(|m| m.content.as_str()).collect()
}

fn point(index: usize, shown: usize, count: usize) -> BranchPoint {
    BranchPoint { index, shown, count }
}

#[test]
fn editing_an_earlier_message_branches_and_both_branches_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut chats, _) = Chats::start(dir.path(), 1 << 30, None);
    chats.send("hello there");
    let (second, ..) = chats.send("tell me a story");
    let (_, _, end) = chats.send("and then what");
    assert!(chats.branches.is_empty());

    // Editing message 3 (the user's second) keeps the cache up to it: the turn before and
    // the close of its reply (`<|im_end|>` and a newline).
    let (edited, ..) = chats.turn(Command::EditMessage { index: 2, text: "tell me a fable".into() });
    let fork = edited.context_tokens - edited.prefill_tokens;
    assert_eq!(fork, second.context_tokens - second.prefill_tokens + 2, "kept up to the edited message");
    assert_eq!(chats.branches, [point(2, 1, 2)]);

    // Back to version 1: the cache is kept up to the fork and the rest of it fed.
    let back = chats.switch(2, 0);
    eprintln!(
        "switch to version 1 of message 3: kept {} tokens, fed {} (the branch held {}), {:.1} ms",
        back.kept, back.fed, end.context_tokens, back.stats.prefill_ms
    );
    assert!(back.cached);
    assert_eq!(users(&back.messages), ["hello there", "tell me a story", "and then what"]);
    assert_eq!(back.kept, fork, "the cache is kept up to the fork");
    assert_eq!(back.stats.prefill_tokens, back.fed, "the stats count what was fed");
    assert_eq!(back.stats.context_tokens, back.kept + back.fed);
    assert_eq!(chats.branches, [point(2, 0, 2)]);
    // Its replies are fed as text: with random weights they need not tokenize as sampled.
    assert!(back.fed > 0 && back.fed < end.context_tokens);

    // A reply written again is a version of the reply; switching between the two keeps
    // the cache up to the reply's start.
    let (again, ..) = chats.turn(Command::Regenerate);
    assert_eq!(chats.branches, [point(2, 0, 2), point(5, 1, 2)]);
    let first_reply = chats.switch(5, 0);
    assert_eq!(first_reply.messages[..5], back.messages[..5]);
    assert_eq!(first_reply.messages[5], back.messages[5], "the reply as it was first written");
    assert_eq!(first_reply.kept, again.context_tokens, "kept up to the reply's start");
    assert_eq!(first_reply.stats.context_tokens, first_reply.kept + first_reply.fed);
    assert_eq!(chats.branches, [point(2, 0, 2), point(5, 0, 2)]);
    chats.switch(5, 1);
    chats.shutdown();

    // After a restart the chat opens from its cache, with every version.
    let (mut chats, opened) = Chats::start(dir.path(), 1 << 30, None);
    assert!(opened.3, "resumed from its cache");
    assert_eq!(opened.1, 6);
    assert_eq!(chats.branches, [point(2, 0, 2), point(5, 1, 2)]);
    let fable = chats.switch(2, 1);
    assert_eq!(users(&fable.messages), ["hello there", "tell me a fable"]);
    assert_eq!((fable.kept, fable.cached), (fork, true));
    assert_eq!(chats.branches, [point(2, 1, 2)]);

    // Editing the first message forks at the start; the versions below travel with theirs.
    let (first, ..) = chats.turn(Command::EditMessage { index: 0, text: "good morning".into() });
    assert_eq!(chats.branches, [point(0, 1, 2)]);
    let old = chats.switch(0, 0);
    assert_eq!(users(&old.messages), ["hello there", "tell me a fable"]);
    assert_eq!(old.kept, first.context_tokens - first.prefill_tokens, "kept: what comes before the first message");
    assert_eq!(chats.branches, [point(0, 0, 2), point(2, 1, 2)]);
    chats.shutdown();

    let store = ChatStore::open(dir.path().join("chats"), 1 << 30).unwrap();
    let mut record = store.load(&store.list()[0].id).unwrap();
    assert_eq!(users(&record.messages), ["hello there", "tell me a fable"]);
    for (index, version, want) in
        [(2, 0, vec!["hello there", "tell me a story", "and then what"]), (0, 1, vec!["good morning"])]
    {
        record.switch_version(index, version).unwrap();
        assert_eq!(users(&record.messages), want);
    }
}

#[test]
fn switching_branch_on_the_real_model_feeds_exactly_the_tokens_after_the_fork() {
    let dir = tempfile::tempdir().unwrap();
    let model = default_model();
    let (mut chats, _) = Chats::start_on(dir.path(), &model, 24, 0.0, 1024, 1 << 30, None);
    chats.send("What is the capital of Germany?");
    let (_, italy, italy_end) = chats.send("And of Italy?");
    let (france, paris, france_end) = chats.turn(Command::EditMessage { index: 2, text: "And of France?".into() });
    let fork = france.context_tokens - france.prefill_tokens;
    eprintln!(
        "Italy: {italy:?} ({} tokens); France: {paris:?} ({} tokens); fork at {fork}",
        italy_end.context_tokens, france_end.context_tokens
    );

    for (version, end, question) in [(0, &italy_end, "And of Italy?"), (1, &france_end, "And of France?")] {
        let switched = chats.switch(2, version);
        eprintln!(
            "version {}: kept {} tokens, fed {} ({:.1} ms); a re-read would feed {}",
            version + 1,
            switched.kept,
            switched.fed,
            switched.stats.prefill_ms,
            end.context_tokens
        );
        assert!(switched.cached);
        assert_eq!(users(&switched.messages)[1], question);
        assert_eq!(switched.kept, fork, "the cache up to the fork is kept");
        assert_eq!(switched.fed, end.context_tokens - fork, "exactly the tokens after the fork are fed");
        assert_eq!(switched.stats.context_tokens, end.context_tokens, "the branch's cache as it was");
    }
    // The branch shown goes on from its cache: the next turn feeds only itself.
    let (next, ..) = chats.send("And of Spain?");
    assert_eq!(next.context_tokens - next.prefill_tokens, france_end.context_tokens);
    chats.shutdown();
}

#[test]
fn a_version_the_cache_no_longer_holds_is_re_read_at_the_next_message() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_tiny_gguf(dir.path(), &TinySpec::default(), 5);
    let (mut chats, _) = Chats::start_on(dir.path(), &model, 12, 1.0, 200, 1 << 30, None);
    for text in ["hello there", "tell me a story", "and then what", "go on", "and after that", "the end"] {
        chats.send(text);
    }
    assert!(chats.trims > 0, "the first turns were trimmed from the cache");

    // Message 3's turn is no longer cached: the chat up to it is re-read with the edit.
    let (edited, ..) = chats.turn(Command::EditMessage { index: 2, text: "tell me a fable".into() });
    assert_eq!(edited.context_tokens, edited.prefill_tokens, "re-read from its text");
    assert_eq!(chats.branches, [point(2, 1, 2)]);

    // The six turns of version 1 do not fit the budget: read again at the next message.
    let old = chats.switch(2, 0);
    assert!(!old.cached && old.fed == 0, "cached {} fed {}", old.cached, old.fed);
    assert_eq!(users(&old.messages).len(), 6);
    let (next, ..) = chats.send("one more");
    assert_eq!(next.context_tokens, next.prefill_tokens, "re-read from its text");
    assert!(next.context_tokens <= 200);
    chats.shutdown();

    let store = ChatStore::open(dir.path().join("chats"), 1 << 30).unwrap();
    let record = store.load(&store.list()[0].id).unwrap();
    assert_eq!(users(&record.messages).len(), 7, "version 1 and the message after it");
    assert_eq!(record.branch_points(), [point(2, 0, 2)]);
}

#[test]
fn an_edit_that_fails_leaves_the_chat_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (mut chats, _) = Chats::start(dir.path(), 1 << 30, None);
    chats.send("hello there");
    chats.send("tell me a story");
    // A system prompt longer than the budget: the edited turn cannot be fed.
    chats.handle.send(Command::SetSystemPrompt { text: "be brief ".repeat(600) }).unwrap();
    chats.handle.send(Command::EditMessage { index: 2, text: "tell me a fable".into() }).unwrap();
    let (mut failed, mut shown) = (None, None);
    while shown.is_none() {
        match chats.events.recv_blocking().expect("the engine thread is running") {
            EngineEvent::Failed { error } => failed = Some(error.to_string()),
            EngineEvent::BranchSwitched { messages, cached, .. } => shown = Some((messages, cached)),
            _ => {}
        }
    }
    assert!(failed.is_some_and(|e| e.contains("system prompt")));
    let (messages, cached) = shown.unwrap();
    assert_eq!(users(&messages), ["hello there", "tell me a story"], "the transcript as it was");
    assert!(!cached);
    chats.handle.send(Command::SetSystemPrompt { text: String::new() }).unwrap();
    while !matches!(chats.next(), EngineEvent::Stats(_)) {}
    let (next, ..) = chats.send("go on");
    assert_eq!(next.context_tokens, next.prefill_tokens, "the chat is re-read with the message after it");
    chats.shutdown();
    let store = ChatStore::open(dir.path().join("chats"), 1 << 30).unwrap();
    let record = store.load(&store.list()[0].id).unwrap();
    assert_eq!(users(&record.messages), ["hello there", "tell me a story", "go on"]);
    assert!(record.forks.is_empty());
}

/// The thinking switch belongs to the open chat: echoed, saved in its record (kept across
/// a restart), and another chat starts at the model's default.
#[test]
fn the_thinking_switch_is_saved_with_its_chat() {
    let dir = tempfile::tempdir().unwrap();
    let (mut chats, (first, ..)) = Chats::start(dir.path(), 1 << 30, None);
    chats.handle.send(Command::SetThinking { enabled: Some(false) }).unwrap();
    while !matches!(chats.next(), EngineEvent::ThinkingSwitch { enabled: Some(false) }) {}
    chats.send("hello");
    chats.shutdown();
    let store = ChatStore::open(dir.path().join("chats"), 1 << 30).unwrap();
    assert_eq!(store.load(&first).unwrap().thinking, Some(false));

    let (mut chats, _) = Chats::start(dir.path(), 1 << 30, Some(&first));
    chats.handle.send(Command::NewConversation).unwrap();
    let (second, ..) = chats.opened();
    assert_ne!(second, first);
    chats.shutdown();
    assert_eq!(store.load(&second).unwrap().thinking, None, "a new chat has the model's default");
    assert_eq!(store.load(&first).unwrap().thinking, Some(false));
}
