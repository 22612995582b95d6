//! The engine thread on a tiny random-weight GGUF written by the test (no real model):
//! commands that interrupt a running reply (Stop, MemoryWarning, NewConversation,
//! Shutdown) end it at the next token and leave the engine serving, and commands that
//! arrive during a reply wait their turn in order.
//!
//! Sampling settings come from the GGUF and change from the next reply.
//!
//! Every interrupting command here is queued right behind its `Send`, before the reply
//! starts, so the reply sees it after its first token: the outcome does not depend on
//! how fast the machine is.

mod common;

use std::sync::Arc;
use std::time::Duration;

use candle_core::quantized::gguf_file::Value;
use common::{write_tiny_gguf, TinySpec};
use pocketchat::engine::sampler::{SamplingOverrides, SamplingParams};
use pocketchat::engine::{
    Command, DoneReason, Engine, EngineConfig, EngineError, EngineEvent, EngineEvents, EngineHandle, TYPING_PAUSE,
};

/// An engine on a fresh tiny model, ready; replies of at most `max_tokens`.
fn engine(dir: &std::path::Path, max_tokens: usize) -> (EngineHandle, EngineEvents) {
    let path = write_tiny_gguf(dir, &TinySpec::default(), 11);
    let mut config = EngineConfig::new(path);
    config.max_tokens = max_tokens;
    config.budget_override = Some(256);
    // A fake headroom probe: no live memory figure, so the budget is the configured one.
    config.headroom = Arc::new(|| None);
    config.threads = Some(1);
    let (handle, mut events) = Engine::spawn(config);
    loop {
        match events.recv_blocking().expect("the engine thread is running") {
            EngineEvent::Ready(_) => break,
            EngineEvent::Failed { error } => panic!("the tiny model did not load: {error}"),
            _ => {}
        }
    }
    (handle, events)
}

/// Events up to and including the next `Done` (or `Failed`).
fn reply(events: &mut EngineEvents) -> Vec<EngineEvent> {
    until(events, |e| matches!(e, EngineEvent::Done { .. } | EngineEvent::Failed { .. }))
}

/// Events until one matches `want` (included).
fn until(events: &mut EngineEvents, want: impl Fn(&EngineEvent) -> bool) -> Vec<EngineEvent> {
    let mut seen = Vec::new();
    loop {
        let event = events.recv_blocking().expect("the engine thread is running");
        let last = want(&event);
        seen.push(event);
        if last {
            return seen;
        }
    }
}

fn done_reason(events: &[EngineEvent]) -> DoneReason {
    match events.last() {
        Some(EngineEvent::Done { reason }) => *reason,
        other => panic!("the reply did not end with Done: {other:?}"),
    }
}

fn tokens(events: &[EngineEvent]) -> usize {
    events.iter().filter(|e| matches!(e, EngineEvent::Token { .. })).count()
}

fn last_context_tokens(events: &[EngineEvent]) -> usize {
    events
        .iter()
        .rev()
        .find_map(|e| match e {
            EngineEvent::Stats(s) => Some(s.context_tokens),
            _ => None,
        })
        .expect("stats were sent")
}

fn send(handle: &EngineHandle, text: &str) {
    handle.send(Command::Send { text: text.into() }).unwrap();
}

#[test]
fn stop_ends_the_reply_at_the_next_token_and_the_engine_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, mut events) = engine(dir.path(), 200);
    send(&handle, "hello there");
    handle.send(Command::Stop).unwrap();
    let first = reply(&mut events);
    assert!(
        first.iter().any(|e| matches!(e, EngineEvent::ReplyStarted { prompt } if prompt == "hello there")),
        "{first:?}"
    );
    assert_eq!(done_reason(&first), DoneReason::Stopped);
    assert!(tokens(&first) <= 1, "stopped after its first token: {first:?}");

    // The next turn is served, and continues the conversation.
    send(&handle, "go on");
    let second = reply(&mut events);
    assert!(matches!(done_reason(&second), DoneReason::MaxTokens | DoneReason::EndOfTurn));
    let after = until(&mut events, |e| matches!(e, EngineEvent::Stats(_)));
    assert!(last_context_tokens(&after) > last_context_tokens(&first));
}

#[test]
fn a_memory_warning_mid_reply_evicts_says_so_and_the_next_turn_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, mut events) = engine(dir.path(), 200);
    send(&handle, "a first message to fill the cache a little");
    handle.send(Command::MemoryWarning { reason: "test warning".into() }).unwrap();
    let first = reply(&mut events);
    assert_eq!(done_reason(&first), DoneReason::MemoryWarning);
    let evicted = until(&mut events, |e| matches!(e, EngineEvent::Evicted { .. }));
    match evicted.last().unwrap() {
        EngineEvent::Evicted { reason, before_tokens, after_tokens, .. } => {
            assert_eq!(reason, "test warning");
            assert!(*before_tokens > 0 && after_tokens < before_tokens, "{before_tokens} -> {after_tokens}");
        }
        _ => unreachable!(),
    }
    send(&handle, "still there?");
    let next = reply(&mut events);
    assert!(next.iter().any(|e| matches!(e, EngineEvent::ReplyStarted { .. })));
    assert!(!next.iter().any(|e| matches!(e, EngineEvent::Failed { .. })), "{next:?}");
}

#[test]
fn new_conversation_mid_reply_stops_it_and_clears_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, mut events) = engine(dir.path(), 200);
    send(&handle, "remember this");
    handle.send(Command::NewConversation).unwrap();
    let first = reply(&mut events);
    assert_eq!(done_reason(&first), DoneReason::Stopped);
    until(&mut events, |e| matches!(e, EngineEvent::ConversationReset));
    let after = until(&mut events, |e| matches!(e, EngineEvent::Stats(_)));
    assert_eq!(last_context_tokens(&after), 0, "the cache is empty after a new conversation");
}

#[test]
fn commands_sent_during_a_reply_wait_their_turn_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, mut events) = engine(dir.path(), 4);
    send(&handle, "first");
    send(&handle, "second");
    handle.send(Command::SetThreads { threads: Some(1) }).unwrap();
    send(&handle, "third");
    // Interrupts the first reply; the three commands before it wait.
    handle.send(Command::Stop).unwrap();
    assert_eq!(done_reason(&reply(&mut events)), DoneReason::Stopped);
    let mut prompts = Vec::new();
    for _ in 0..2 {
        let events = reply(&mut events);
        assert_ne!(done_reason(&events), DoneReason::Stopped, "a deferred turn runs to its end");
        prompts.extend(events.iter().filter_map(|e| match e {
            EngineEvent::ReplyStarted { prompt } => Some(prompt.clone()),
            _ => None,
        }));
    }
    assert_eq!(prompts, ["second", "third"]);
}

#[test]
fn shutdown_mid_reply_ends_the_thread_and_later_sends_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, mut events) = engine(dir.path(), 200);
    send(&handle, "hello");
    handle.send(Command::Shutdown).unwrap();
    assert_eq!(done_reason(&reply(&mut events)), DoneReason::Stopped);
    // The thread ends and drops its end of the stream.
    while events.recv_blocking().is_some() {}
    assert_eq!(handle.send(Command::Send { text: "anyone?".into() }), Err(EngineError::EngineGone));
}

#[test]
fn an_empty_message_fails_that_turn_only() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, mut events) = engine(dir.path(), 4);
    send(&handle, "   ");
    let failed = reply(&mut events);
    assert!(matches!(failed.last(), Some(EngineEvent::Failed { error: EngineError::EmptyPrompt })), "{failed:?}");
    send(&handle, "hi");
    assert!(matches!(done_reason(&reply(&mut events)), DoneReason::MaxTokens | DoneReason::EndOfTurn));
}

/// The sampling settings in force, from the next `Sampling` event.
fn sampling(events: &mut EngineEvents) -> (SamplingParams, SamplingParams) {
    match until(events, |e| matches!(e, EngineEvent::Sampling { .. })).pop() {
        Some(EngineEvent::Sampling { params, defaults, .. }) => (params, defaults),
        _ => unreachable!(),
    }
}

fn reply_text(events: &[EngineEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Token { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn sampling_starts_from_the_models_defaults_and_changes_from_the_next_reply() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec {
        meta_overrides: vec![
            ("general.sampling.temp".into(), Value::F32(0.6)),
            ("general.sampling.top_k".into(), Value::I32(20)),
            ("general.sampling.penalty_repeat".into(), Value::F32(1.2)),
        ],
        ..TinySpec::default()
    };
    let path = write_tiny_gguf(dir.path(), &spec, 11);
    let mut config = EngineConfig::new(path);
    config.max_tokens = 4;
    config.headroom = Arc::new(|| None);
    let (handle, mut events) = Engine::spawn(config);
    let (params, defaults) = sampling(&mut events);
    assert_eq!((defaults.temperature, defaults.top_k), (0.6, 20), "the GGUF's keys");
    assert_eq!(defaults.top_p, SamplingParams::default().top_p, "the chat default where the file says nothing");
    assert_eq!(params, defaults);
    assert_eq!(defaults.repeat_penalty, 1.2, "the GGUF's penalty");
    assert_eq!((defaults.dry_multiplier, defaults.dry_allowed_length), (0.8, 2), "DRY on by default");

    // Greedy is the model's most likely token: every penalty off, unless set explicitly.
    handle.send(Command::SetSampling { overrides: SamplingOverrides::greedy() }).unwrap();
    let (params, defaults) = sampling(&mut events);
    assert_eq!(params.temperature, 0.0);
    assert_eq!((params.repeat_penalty, params.dry_multiplier), (1.0, 0.0));
    assert_eq!(defaults.temperature, 0.6);
    let explicit = SamplingOverrides { dry_multiplier: Some(0.5), ..SamplingOverrides::greedy() };
    handle.send(Command::SetSampling { overrides: explicit }).unwrap();
    let (params, _) = sampling(&mut events);
    assert_eq!((params.repeat_penalty, params.dry_multiplier), (1.0, 0.5));
    handle.send(Command::SetSampling { overrides: SamplingOverrides::default() }).unwrap();
    assert_eq!(sampling(&mut events).0, defaults, "reset to the model's defaults");
}

#[test]
fn the_same_conversation_and_seed_give_the_same_reply() {
    let dir = tempfile::tempdir().unwrap();
    let mut replies = Vec::new();
    for _ in 0..2 {
        let (handle, mut events) = engine(dir.path(), 24);
        send(&handle, "tell me a story");
        replies.push(reply_text(&reply(&mut events)));
    }
    assert!(!replies[0].is_empty());
    assert_eq!(replies[0], replies[1]);
}

/// Sends `text` the way the composer does while it is typed: a draft per character.
fn type_ahead(handle: &EngineHandle, text: &str) {
    for n in 1..=text.len() {
        handle.send(Command::Draft { text: text[..n].into() }).unwrap();
    }
}

#[test]
fn typing_ahead_changes_no_reply_and_no_draft_outlives_another_command() {
    let dir = tempfile::tempdir().unwrap();
    let mut runs = Vec::new();
    // The first message is sent while typing goes on, the second after a pause.
    let messages = [("tell me a story", Duration::from_millis(100)), ("and another one", TYPING_PAUSE * 3)];
    for ahead in [false, true] {
        let (handle, mut events) = engine(dir.path(), 24);
        let mut seen = Vec::new();
        for (message, wait) in messages {
            if ahead {
                type_ahead(&handle, message);
                // Time to read it ahead: a draft that Send has already overtaken is skipped.
                std::thread::sleep(wait);
            }
            send(&handle, message);
            if ahead {
                // The next message typed while this reply streams waits for the reply.
                type_ahead(&handle, "typed while the reply streams");
            }
            let r = reply(&mut events);
            assert_eq!(done_reason(&r), DoneReason::MaxTokens);
            let stats = r.iter().rev().find_map(|e| match e {
                EngineEvent::Stats(s) => Some(s.clone()),
                _ => None,
            });
            let (fed, drafted) = stats.map(|s| (s.prefill_tokens, s.drafted_tokens)).unwrap();
            assert_eq!(drafted > 0, ahead, "{message:?}: {drafted} tokens read ahead");
            assert_eq!(fed == 0, ahead && wait > TYPING_PAUSE, "{message:?}: {fed} tokens fed at Send");
            seen.push(reply_text(&r));
        }
        // A memory warning finds the conversation's tokens only, draft or not (the
        // draft typed during the last reply is read ahead meanwhile).
        std::thread::sleep(TYPING_PAUSE * 2);
        handle.send(Command::MemoryWarning { reason: "test".into() }).unwrap();
        let evicted = until(&mut events, |e| matches!(e, EngineEvent::Evicted { .. }));
        let Some(EngineEvent::Evicted { before_tokens, .. }) = evicted.last() else { unreachable!() };
        seen.push(before_tokens.to_string());
        runs.push(seen);
    }
    assert_eq!(runs[0], runs[1], "the same replies and cache with and without typing ahead");
}
