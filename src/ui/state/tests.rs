//! The reducer driven with synthetic event sequences.

use super::*;
use crate::chats::branches::BranchPoint;
use crate::engine::text::template::{Message as TMessage, Role as TRole};
use crate::engine::Cause;
use crate::memory::RamTier;
use crate::ui::copy::EVICTED_PREFIX;
use std::path::PathBuf;

fn info() -> ModelInfo {
    ModelInfo {
        path: "models/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        file_bytes: 98_000_000,
        architecture: "llama".into(),
        name: "SmolLM2 135M Instruct".into(),
        weights_quant: "Q4_1".into(),
        n_layers: 30,
        context_length: 8192,
        kv_dtype: "f32".into(),
        kv_bytes_per_token: 46_080,
        recurrent_bytes: 0,
        device: "cpu".into(),
        thinking: None,
    }
}

fn ready() -> ChatState {
    let mut s = ChatState::new();
    s.apply(EngineEvent::Loading { progress: 0.5, message: "reading weights".into() });
    s.apply(EngineEvent::Ready(info()));
    s
}

fn tok(t: &str) -> EngineEvent {
    EngineEvent::Token { text: t.into() }
}

fn stats(generated: usize, tok_s: f64) -> EngineEvent {
    EngineEvent::Stats(Stats {
        context_tokens: 120,
        budget: 1024,
        generated_tokens: generated,
        decode_tok_s: tok_s,
        ..Stats::default()
    })
}

#[test]
fn loading_then_ready() {
    let mut s = ChatState::new();
    assert_eq!(s.phase, Phase::Starting);
    assert!(!s.can_send());
    s.apply(EngineEvent::Loading { progress: 1.7, message: "x".into() });
    assert_eq!(s.phase, Phase::Loading { progress: 1.0, message: "x".into() });
    s.apply(EngineEvent::Ready(info()));
    assert!(s.is_ready() && s.can_send());
    assert_eq!(s.model.as_ref().unwrap().weights_quant, "Q4_1");
}

#[test]
fn a_turn_streams_and_finishes() {
    let mut s = ready();
    assert!(s.submit("Hi there", "10:00:00"));
    assert!(s.generating() && !s.can_send());
    assert!(!s.submit("again", "10:00:01"), "no second prompt while one runs");
    s.apply_at(EngineEvent::ReplyStarted { prompt: "Hi there".into() }, "10:00:01");
    assert_eq!(s.messages().count(), 2, "the submitted prompt is not duplicated");
    s.apply(tok("Hel"));
    s.apply(tok("lo!"));
    assert_eq!(s.current_reply().unwrap().text, "Hello!");
    assert!(s.generating());
    s.apply(stats(2, 31.5));
    s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    assert!(!s.generating() && s.can_send());
    let reply = s.messages().last().unwrap().clone();
    assert_eq!(reply.role, Role::Assistant);
    assert!(reply.finished);
    assert_eq!(reply.tokens, 2);
    assert_eq!(reply.tok_s, Some(31.5));
    assert_eq!(reply.done, Some(DoneReason::EndOfTurn));
    assert_eq!(reply.done_label(), None);
    assert_eq!(reply.time, "10:00:01");
    assert_eq!(s.replies_done, 1);
}

#[test]
fn stats_after_done_still_label_the_reply() {
    let mut s = ready();
    s.apply(EngineEvent::ReplyStarted { prompt: "q".into() });
    assert_eq!(s.messages().count(), 2, "a prompt sent elsewhere is shown");
    s.apply(tok("a"));
    s.apply(EngineEvent::Done { reason: DoneReason::Stopped });
    s.apply(stats(1, 12.0));
    let reply = s.messages().last().unwrap();
    assert_eq!(reply.tok_s, Some(12.0));
    assert_eq!(reply.done_label(), Some("Stopped"));
    // The next turn's prefill figures (no tokens generated yet) change nothing.
    s.apply(EngineEvent::ReplyStarted { prompt: "r".into() });
    s.apply(stats(0, 0.0));
    assert_eq!(s.current_reply().unwrap().tok_s, None);
    assert_eq!(s.stats.as_ref().unwrap().generated_tokens, 0);
}

#[test]
fn trimmed_notice_sits_above_an_empty_reply_and_is_logged() {
    let mut s = ready();
    s.submit("long question", "");
    s.apply_at(EngineEvent::ReplyStarted { prompt: "long question".into() }, "t1");
    s.apply_at(EngineEvent::Trimmed { dropped_tokens: 300, kept_tokens: 400 }, "12:00:05");
    s.apply(tok("ok"));
    let kinds: Vec<&str> = s
        .entries
        .iter()
        .map(|e| match e {
            Entry::Message(m) if m.role == Role::User => "user",
            Entry::Message(_) => "assistant",
            Entry::Notice(_) => "notice",
        })
        .collect();
    assert_eq!(kinds, ["user", "notice", "assistant"]);
    let n = s.notices().next().unwrap();
    assert_eq!(n.text, "Earlier messages were trimmed to fit the budget (300 tokens dropped)");
    assert_eq!(n.class(), "notice-trimmed");
    assert_eq!(s.current_reply().unwrap().text, "ok", "tokens go to the reply, not the notice");
    assert_eq!(s.trims, 1);
    assert_eq!(s.log.len(), 1);
    assert_eq!(s.log[0].kind, LogKind::Trim);
    assert_eq!(s.log[0].time, "12:00:05");
}

#[test]
fn eviction_mid_reply_interrupts_and_the_next_turn_works() {
    let mut s = ready();
    s.submit("tell me a story", "");
    s.apply(EngineEvent::ReplyStarted { prompt: "tell me a story".into() });
    s.apply(tok("Once upon"));
    s.apply_at(
        EngineEvent::Evicted {
            reason: "simulated from settings".into(),
            before_tokens: 900,
            after_tokens: 450,
            freed_bytes: 20 * 1024 * 1024,
        },
        "12:01:00",
    );
    s.apply(EngineEvent::Done { reason: DoneReason::MemoryWarning });
    assert!(!s.generating());
    let last = s.entries.last().unwrap();
    match last {
        Entry::Notice(n) => {
            assert_eq!(n.text, EVICTED_TEXT);
            let d = n.detail.as_deref().unwrap();
            assert!(d.contains("900 → 450 tokens"), "{d}");
            assert!(d.contains("20.0 MiB freed"), "{d}");
            assert!(d.contains("simulated from settings"), "{d}");
        }
        other => panic!("expected the eviction notice last, got {other:?}"),
    }
    let interrupted = s.messages().last().unwrap();
    assert_eq!(interrupted.text, "Once upon");
    assert_eq!(interrupted.done_label(), Some("Interrupted by a memory warning"));
    assert_eq!(s.evictions, 1);
    assert_eq!(s.log[0].kind, LogKind::Eviction);
    assert_eq!(s.log[0].time, "12:01:00");

    assert!(s.submit("and then?", ""));
    s.apply(EngineEvent::ReplyStarted { prompt: "and then?".into() });
    s.apply(tok("The end."));
    s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    #[cfg(feature = "qa")]
    {
        let qa = s.qa_status();
        assert_eq!(qa.replies_done, 2);
        assert_eq!(qa.evictions, 1);
        assert_eq!(qa.done_reasons, ["MemoryWarning", "EndOfTurn"]);
        assert_eq!(qa.notices, [EVICTED_TEXT]);
        assert_eq!(qa.prompts, ["tell me a story", "and then?"]);
        assert!(!qa.generating);
        assert_eq!(qa.last_reply.as_deref(), Some("The end."));
    }
}

#[test]
fn eviction_while_idle_is_a_notice() {
    let mut s = ready();
    s.apply(EngineEvent::Evicted { reason: String::new(), before_tokens: 10, after_tokens: 0, freed_bytes: 0 });
    assert_eq!(s.notices().count(), 1);
    assert_eq!(s.notices().next().unwrap().detail.as_deref(), Some("10 → 0 tokens, 0 B freed"));
    assert!(!s.generating());
}

#[test]
fn eviction_that_dropped_nothing_says_so() {
    let mut s = ready();
    s.apply(EngineEvent::ReplyStarted { prompt: "q".into() });
    s.apply(tok("The"));
    s.apply(EngineEvent::Evicted { reason: "x".into(), before_tokens: 45, after_tokens: 45, freed_bytes: 0 });
    s.apply(EngineEvent::Done { reason: DoneReason::MemoryWarning });
    let n = s.notices().next().unwrap();
    assert_eq!(n.text, EVICTED_NOTHING_TEXT);
    assert!(n.text.starts_with(EVICTED_PREFIX) && EVICTED_TEXT.starts_with(EVICTED_PREFIX));
    assert_eq!(n.class(), "notice-evicted");
    assert_eq!(s.evictions, 1);
}

#[test]
fn model_missing_tells_the_fetch_command() {
    let mut s = ChatState::new();
    s.apply(EngineEvent::Failed { error: EngineError::ModelMissing { path: PathBuf::from("models/x.gguf") } });
    match &s.phase {
        Phase::Failed(f) => {
            assert!(f.missing);
            assert_eq!(f.title, "No model installed");
            assert_eq!(f.command.as_deref(), Some(FETCH_COMMAND));
            assert!(f.message.contains("models/x.gguf"));
        }
        p => panic!("{p:?}"),
    }
    assert!(!s.can_send());
    #[cfg(feature = "qa")]
    assert!(s.qa_status().last_error.unwrap().contains("pocketchat fetch"));
}

#[test]
fn load_failure_shows_the_engine_message() {
    let mut s = ChatState::new();
    s.apply(EngineEvent::Loading { progress: 0.1, message: "opening".into() });
    s.apply(EngineEvent::Failed {
        error: EngineError::BadModelFile { path: "m.gguf".into(), message: "bad magic".into() },
    });
    match &s.phase {
        Phase::Failed(f) => {
            assert!(!f.missing);
            assert_eq!(f.command, None);
            assert!(f.message.contains("bad magic"));
        }
        p => panic!("{p:?}"),
    }
    // Any failure before Ready is a load failure too.
    let mut s = ChatState::new();
    s.apply(EngineEvent::Failed { error: EngineError::Inference(Cause::msg("boom")) });
    assert!(matches!(&s.phase, Phase::Failed(f) if f.message.contains("boom")));
}

#[test]
fn a_failed_turn_is_inline_and_the_chat_goes_on() {
    let mut s = ready();
    s.submit("hi", "");
    s.apply(EngineEvent::ReplyStarted { prompt: "hi".into() });
    s.apply(EngineEvent::Failed { error: EngineError::Inference(Cause::msg("shape mismatch")) });
    assert!(s.is_ready());
    assert!(!s.generating());
    assert_eq!(s.messages().count(), 1, "the empty reply bubble is removed");
    let n = s.notices().last().unwrap();
    assert_eq!(n.kind, NoticeKind::Error);
    assert!(n.text.contains("shape mismatch"));

    // A failure after some text keeps the text and marks the reply.
    s.submit("again", "");
    s.apply(EngineEvent::ReplyStarted { prompt: "again".into() });
    s.apply(tok("part"));
    s.apply(EngineEvent::Failed { error: EngineError::Inference(Cause::msg("kv")) });
    let reply = s.messages().last().unwrap();
    assert_eq!(reply.text, "part");
    assert!(reply.finished && reply.error.is_some());
    assert!(s.can_send());
}

#[test]
fn failed_send_before_reply_started_unblocks_the_composer() {
    let mut s = ready();
    s.submit("x", "");
    s.apply(EngineEvent::Failed { error: EngineError::EmptyPrompt });
    assert!(!s.generating());
    assert!(s.can_send());
}

#[test]
fn reset_clears_the_transcript_but_keeps_the_log() {
    let mut s = ready();
    s.apply(EngineEvent::ReplyStarted { prompt: "a".into() });
    s.apply(EngineEvent::Trimmed { dropped_tokens: 5, kept_tokens: 5 });
    s.apply(tok("b"));
    s.apply(EngineEvent::ConversationReset);
    assert!(s.entries.is_empty());
    assert!(!s.generating());
    assert_eq!(s.log.len(), 1);
    assert!(s.can_send());
}

#[test]
fn policy_and_stats_are_kept() {
    let mut s = ready();
    let report = TierReport {
        physical_bytes: 7 * crate::memory::GIB + crate::memory::GIB / 2,
        detected: RamTier::Phone8Gb,
        overridden: Some(RamTier::Phone6Gb),
        bf16: Some(true),
    };
    let policy = Policy::for_tier(RamTier::Phone6Gb);
    s.apply(EngineEvent::Policy { report: report.clone(), policy });
    s.apply(stats(0, 0.0));
    assert_eq!(s.tier.as_ref().unwrap().effective(), RamTier::Phone6Gb);
    assert_eq!(s.policy.unwrap().token_budget, 1024);
    let f = s.budget_fraction().unwrap();
    assert!((f - 120.0 / 1024.0).abs() < 1e-9);
}

#[test]
fn restore_offer_and_restored_conversation() {
    let mut s = ready();
    s.restore_available = true;
    s.apply(EngineEvent::ReplyStarted { prompt: "a".into() });
    s.apply(tok("b"));
    s.apply(EngineEvent::Evicted { reason: "r".into(), before_tokens: 40, after_tokens: 0, freed_bytes: 1 });
    s.apply(EngineEvent::Done { reason: DoneReason::MemoryWarning });
    assert!(s.notices().last().unwrap().restorable);
    s.apply(EngineEvent::ReplyStarted { prompt: "c".into() });
    assert_eq!(s.notices().filter(|n| n.restorable).count(), 0, "a new turn ends the offer");
    s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    s.apply(EngineEvent::Evicted { reason: "r".into(), before_tokens: 30, after_tokens: 0, freed_bytes: 1 });
    s.apply(EngineEvent::Evicted { reason: "r".into(), before_tokens: 0, after_tokens: 0, freed_bytes: 0 });
    assert_eq!(
        s.notices().filter(|n| n.restorable).count(),
        0,
        "only the newest eviction, and only when it dropped something"
    );

    s.apply_at(
        EngineEvent::Restored {
            messages: vec![
                TMessage::new(TRole::System, "sys"),
                TMessage::new(TRole::User, "a"),
                TMessage::new(TRole::Assistant, "b"),
            ],
            tokens: 40,
        },
        "09:00:00",
    );
    let texts: Vec<_> = s.messages().map(|m| (m.role, m.text.as_str())).collect();
    assert_eq!(texts, [(Role::User, "a"), (Role::Assistant, "b")]);
    assert!(s.messages().all(|m| m.finished));
    assert_eq!(s.notices().next().unwrap().text, "Conversation restored");
    assert_eq!(s.log.last().unwrap().kind, LogKind::Restore);
    assert_eq!(s.restores, 1);
    assert!(s.can_send());

    s.apply_at(EngineEvent::Saved { path: "/tmp/x.pcstate".into(), bytes: 2048, ms: 3.5 }, "09:01:00");
    assert_eq!(s.last_save.as_ref().unwrap().bytes, 2048);
}

#[test]
fn token_without_reply_started_still_shows() {
    let mut s = ready();
    s.apply(tok("x"));
    assert!(s.generating());
    assert_eq!(s.current_reply().unwrap().text, "x");
    s.apply(EngineEvent::Notice { message: "The prompt was cut to fit the budget".into() });
    assert_eq!(s.entries.len(), 2);
    s.apply(EngineEvent::Done { reason: DoneReason::MaxTokens });
    assert_eq!(s.messages().last().unwrap().done_label(), Some("Reply length limit reached"));
}

#[test]
fn reloading_shows_progress_again() {
    let mut s = ready();
    s.apply(EngineEvent::Loading { progress: 0.2, message: "loading Q8_0".into() });
    assert!(!s.can_send());
    s.apply(EngineEvent::Ready(info()));
    assert!(s.can_send());
}

#[cfg(feature = "qa")]
#[test]
fn qa_status_serializes() {
    let s = ready();
    let json = serde_json::to_string(&s.qa_status()).unwrap();
    assert!(json.contains("\"replies_done\":0"), "{json}");
    assert!(json.contains("\"phase\":\"ready\""), "{json}");
}

#[test]
fn sampling_settings_are_kept_for_the_settings_panel() {
    use crate::engine::sampler::{SamplingOverrides, SamplingParams};
    let mut s = ready();
    assert_eq!(s.sampling, None);
    let defaults = SamplingParams::default();
    let overrides = SamplingOverrides::greedy();
    s.apply(EngineEvent::Sampling { params: overrides.apply(defaults), defaults, overrides });
    let view = s.sampling.unwrap();
    assert_eq!(view.params.temperature, 0.0);
    assert_eq!(view.defaults, defaults);
    assert_eq!(view.overrides, overrides);
}

fn chat(id: &str, title: &str, messages: usize, cache_bytes: u64) -> crate::chats::ChatSummary {
    crate::chats::ChatSummary {
        id: id.into(),
        title: title.into(),
        created: 1,
        updated: 2,
        tokens: 40,
        messages,
        cache_bytes,
        unreadable: None,
    }
}

#[test]
fn opening_a_chat_shows_its_transcript_and_says_how_it_resumed() {
    let mut s = ready();
    s.apply(EngineEvent::Chats {
        chats: vec![chat("b", "Second", 0, 0), chat("a", "First", 2, 4096)],
        active: Some("b".into()),
        cache_bytes: 4096,
        cache_cap_bytes: 1 << 20,
    });
    assert_eq!(s.chat_caches, Some((4096, 1 << 20)));
    s.submit("in the second chat", "09:00:00");
    s.apply(EngineEvent::ReplyStarted { prompt: "in the second chat".into() });
    s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });

    let messages = vec![TMessage::new(TRole::User, "a"), TMessage::new(TRole::Assistant, "b")];
    s.apply_at(
        EngineEvent::ChatOpened {
            id: "a".into(),
            title: "First".into(),
            system_prompt: Some("Be brief.".into()),
            messages: messages.clone(),
            tokens: 40,
            resumed: true,
        },
        "09:01:00",
    );
    let texts: Vec<_> = s.messages().map(|m| (m.role, m.text.as_str())).collect();
    assert_eq!(texts, [(Role::User, "a"), (Role::Assistant, "b")]);
    assert_eq!(s.active_chat.as_deref(), Some("a"));
    assert_eq!(s.system_prompt.as_deref(), Some("Be brief."));
    assert_eq!(s.notices().last().unwrap().text, "Chat resumed from its cache");
    assert!(s.log.last().unwrap().text.contains("no re-prefill"), "{:?}", s.log);
    assert!(s.can_send());

    // Without its cache: no "resumed" notice (the engine says why it re-reads).
    s.apply(EngineEvent::ChatOpened {
        id: "a".into(),
        title: "First".into(),
        system_prompt: None,
        messages,
        tokens: 0,
        resumed: false,
    });
    assert_eq!(s.notices().count(), 0);
    assert!(s.log.last().unwrap().text.contains("re-read"), "{:?}", s.log);
}

/// A two-turn transcript: hello / hi, how are you / fine.
fn two_turns() -> ChatState {
    let mut s = ready();
    for (prompt, reply) in [("hello", "hi"), ("how are you", "fine")] {
        s.submit(prompt, "");
        s.apply(EngineEvent::ReplyStarted { prompt: prompt.into() });
        s.apply(tok(reply));
        s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    }
    s
}

#[test]
fn regenerate_keeps_the_message_and_replaces_the_reply() {
    let mut s = two_turns();
    let (user, reply) = s.last_turn().expect("the last turn can be changed");
    assert_eq!(s.entry(user).map(|e| matches!(e, Entry::Message(m) if m.text == "how are you")), Some(true));
    assert_eq!(s.entry(reply).map(|e| matches!(e, Entry::Message(m) if m.text == "fine")), Some(true));

    s.apply(EngineEvent::Rewound { kept: 3 });
    assert!(s.generating() && s.last_turn().is_none(), "waiting for the new reply");
    s.apply(EngineEvent::ReplyStarted { prompt: "how are you".into() });
    s.apply(tok("great"));
    s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    let texts: Vec<_> = s.messages().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["hello", "hi", "how are you", "great"], "the message is not shown twice");
}

#[test]
fn edit_replaces_the_last_turn() {
    let mut s = two_turns();
    s.apply(EngineEvent::Rewound { kept: 2 });
    s.apply(EngineEvent::ReplyStarted { prompt: "how old are you".into() });
    s.apply(tok("young"));
    s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    let texts: Vec<_> = s.messages().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["hello", "hi", "how old are you", "young"]);
    assert!(s.last_turn().is_some());
}

#[test]
fn no_turn_can_be_changed_while_a_reply_streams_or_before_any_reply() {
    let mut s = ready();
    assert!(s.last_turn().is_none());
    s.submit("hello", "");
    s.apply(EngineEvent::ReplyStarted { prompt: "hello".into() });
    s.apply(tok("h"));
    assert!(s.last_turn().is_none());
}

fn point(index: usize, shown: usize, count: usize) -> BranchPoint {
    BranchPoint { index, shown, count }
}

/// The marks of the messages, by their text.
fn marks(s: &ChatState) -> Vec<(String, MessageMark)> {
    let marks = s.message_marks();
    s.messages()
        .zip(marks)
        .map(|(m, (id, mark))| {
            assert_eq!(m.id, id);
            (m.text.clone(), mark)
        })
        .collect()
}

#[test]
fn editing_an_earlier_message_shows_its_versions_and_switching_shows_the_branch() {
    let mut s = two_turns();
    let all = marks(&s);
    assert_eq!(all.iter().map(|(_, m)| m.index).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert!(all.iter().all(|(_, m)| m.changeable && m.versions.is_none()), "any message may be edited: {all:?}");

    // Message 0 edited: only what comes before it stays while the new reply comes.
    s.apply(EngineEvent::Branches { points: vec![point(2, 1, 2)] });
    s.apply(EngineEvent::Rewound { kept: 0 });
    assert!(s.branches.is_empty(), "the versions after the edited message are not on the page any more");
    assert!(s.generating());
    assert!(marks(&s).iter().all(|(_, m)| !m.changeable), "nothing is edited or switched while a reply comes");
    s.apply(EngineEvent::ReplyStarted { prompt: "good morning".into() });
    s.apply(tok("morning"));
    s.apply(EngineEvent::Branches { points: vec![point(0, 1, 2)] });
    s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    let now = marks(&s);
    assert_eq!(now[0].0, "good morning");
    assert_eq!(now[0].1.versions, Some(point(0, 1, 2)));
    assert!(now[0].1.changeable && now[1].1.versions.is_none());

    // Version 1 shown: the transcript is the branch's, with its own versions.
    let m = |role, text: &str| TMessage::new(role, text);
    s.apply(EngineEvent::BranchSwitched {
        messages: vec![
            m(TRole::User, "hello"),
            m(TRole::Assistant, "hi"),
            m(TRole::User, "how are you"),
            m(TRole::Assistant, "fine"),
        ],
        kept_tokens: 12,
        fed_tokens: 30,
        cached: true,
    });
    s.apply(EngineEvent::Branches { points: vec![point(0, 0, 2), point(2, 1, 2)] });
    let texts: Vec<_> = s.messages().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["hello", "hi", "how are you", "fine"]);
    assert!(!s.generating() && s.notices().count() == 0);
    let versions: Vec<_> = marks(&s).iter().map(|(_, m)| m.versions).collect();
    assert_eq!(versions, [Some(point(0, 0, 2)), None, Some(point(2, 1, 2)), None]);
    assert!(s.log.last().unwrap().text.contains("12 cached tokens kept, 30 fed"), "{:?}", s.log);

    // A version the cache could not keep says it is read again.
    s.apply(EngineEvent::BranchSwitched {
        messages: vec![m(TRole::User, "x"), m(TRole::Assistant, "y")],
        kept_tokens: 0,
        fed_tokens: 0,
        cached: false,
    });
    assert_eq!(s.notices().last().unwrap().text, crate::ui::copy::VERSION_REREAD_TEXT);

    // Another chat: its own versions only.
    s.apply(EngineEvent::ChatOpened {
        id: "b".into(),
        title: "other".into(),
        system_prompt: None,
        messages: vec![m(TRole::User, "x")],
        tokens: 0,
        resumed: false,
    });
    assert!(s.branches.is_empty());
}

#[test]
fn a_thinking_reply_streams_its_thinking_apart_and_counts_it() {
    let mut s = ready();
    assert_eq!(s.thinking_switch(), None, "SmolLM2's template has no switch");
    s.apply(EngineEvent::Ready(ModelInfo { thinking: Some(true), ..info() }));
    assert_eq!(s.thinking_switch(), Some(true), "the model's default");
    s.apply(EngineEvent::ThinkingSwitch { enabled: Some(false) });
    assert_eq!(s.thinking_switch(), Some(false), "the chat's own");

    assert!(s.submit("is 91 prime", "10:00:00"));
    s.apply(EngineEvent::ReplyStarted { prompt: "is 91 prime".into() });
    s.apply(EngineEvent::Thinking { text: "try ".into() });
    s.apply(EngineEvent::Thinking { text: "7".into() });
    let m = s.current_reply().unwrap();
    assert_eq!((m.thinking.as_str(), m.text.as_str()), ("try 7", ""));
    assert!(m.is_thinking());
    assert_eq!(m.thinking_label().as_deref(), Some(copy::THINKING));
    // A notice while only the thinking streams goes below it, not above the reply.
    s.apply(EngineEvent::Notice { message: "note".into() });
    assert!(matches!(s.entries.last(), Some(Entry::Notice(_))));
    s.apply(tok("No."));
    s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    s.apply(EngineEvent::Stats(Stats {
        generated_tokens: 9,
        thinking_tokens: 6,
        decode_tok_s: 20.0,
        ..Stats::default()
    }));
    let m = s.messages().last().unwrap();
    assert_eq!((m.text.as_str(), m.tokens, m.thinking_tokens), ("No.", 9, 6));
    assert_eq!(m.thinking_label().as_deref(), Some("Thought for 6 tokens"));

    // A saved chat shows the thinking it kept (its count is not saved).
    s.apply(EngineEvent::ChatOpened {
        id: "c".into(),
        title: "Primes".into(),
        system_prompt: None,
        messages: vec![
            TMessage::new(TRole::User, "is 91 prime"),
            TMessage::new(TRole::Assistant, "No.").with_thinking(Some("try 7".into())),
        ],
        tokens: 20,
        resumed: true,
    });
    let m = s.messages().last().unwrap();
    assert_eq!((m.thinking.as_str(), m.thinking_label().as_deref()), ("try 7", Some("Thought")));
    // A reply without thinking has no disclosure.
    assert_eq!(s.messages().next().unwrap().thinking_label(), None);
}
