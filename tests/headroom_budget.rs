//! The turn's budget follows live memory headroom (a fake probe here): it shrinks when
//! the KV growth would not fit, says why, and grows back when memory returns.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pocketchat::engine::{Command, Engine, EngineConfig, EngineEvent, EngineEvents, KvDtype, Stats};
use pocketchat::memory::MIB;

fn answer(events: &mut EngineEvents) -> Stats {
    let mut done = false;
    loop {
        match events.recv_blocking().expect("engine stopped") {
            EngineEvent::Done { .. } | EngineEvent::Failed { .. } => done = true,
            EngineEvent::Stats(s) if done => return s,
            _ => {}
        }
    }
}

#[test]
fn budget_shrinks_with_headroom_and_grows_back() {
    // FakeProbe: the test sets the "free memory" the engine sees.
    let fake_headroom = Arc::new(AtomicU64::new(4096 * MIB));
    let probe = fake_headroom.clone();
    let mut config = EngineConfig::new(common::default_model());
    config.budget_override = Some(512);
    config.max_tokens = 8;
    // f16 KV (the default): 23,040 bytes per token of SmolLM2.
    config.kv_dtype = KvDtype::F16;
    config.headroom = Arc::new(move || Some(probe.load(Ordering::SeqCst)));
    let (handle, mut events) = Engine::spawn(config);

    handle.send(Command::Send { text: "Hello!".into() }).unwrap();
    let s = answer(&mut events);
    assert_eq!((s.budget, s.tier_budget, s.budget_note.clone()), (512, 512, None));

    // Memory gets tight: 64 MiB safety + room for 100 more tokens beyond the 256 allocated.
    fake_headroom.store(64 * MIB + 100 * 23_040, Ordering::SeqCst);
    handle.send(Command::Send { text: "Tell me about cats.".into() }).unwrap();
    let s = answer(&mut events);
    assert_eq!(s.budget, 356, "{s:?}");
    assert_eq!(s.tier_budget, 512);
    assert!(s.budget_note.as_deref().unwrap_or("").contains("356 tokens"), "{:?}", s.budget_note);
    assert!(s.context_tokens <= 356);

    // Memory comes back.
    fake_headroom.store(4096 * MIB, Ordering::SeqCst);
    handle.send(Command::Send { text: "Thanks.".into() }).unwrap();
    let s = answer(&mut events);
    assert_eq!((s.budget, s.budget_note), (512, None));
    handle.send(Command::Shutdown).unwrap();
}
