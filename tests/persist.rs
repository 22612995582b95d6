//! Conversations survive the app being killed: a saved Session restores without
//! re-prefill and continues exactly; bad files are refused with a clear error and leave a
//! fresh, usable session.

mod common;

use candle_core::{DType, Device};
use common::*;
use pocketchat::engine::persist::{self, ModelIdentity, StateFileError};
use pocketchat::engine::template::ChatTemplate;
use pocketchat::engine::tokenizer::TextTokenizer;
use pocketchat::engine::{Command, Engine, EngineConfig, EngineEvent, Kernels, KvDtype, Model, Session};

fn tiny() -> (tempfile::TempDir, Model, TextTokenizer, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny_gguf(dir.path(), &TinySpec::default(), 21);
    let model = Model::load(&path, &Device::Cpu, Kernels::Candle, |_| {}).unwrap();
    let (content, _) = pocketchat::engine::model::read_gguf(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&content).unwrap();
    (dir, model, tok, path)
}

fn session(model: &Model, tok: &TextTokenizer) -> Session {
    session_with(model, tok, DType::F32)
}

fn session_with(model: &Model, tok: &TextTokenizer, dtype: impl Into<KvDtype>) -> Session {
    Session::new(model.make_state(256, dtype), ChatTemplate::new(None, tok.bos_token(), tok.eos_token())).unwrap()
}

fn identity() -> ModelIdentity {
    ModelIdentity { sha256: "ab".repeat(32), bytes: 1234 }
}

/// A session of `turns` (each answered "ok") saved as `DIR/chat.pcstate`, and the file's bytes.
fn saved(dir: &std::path::Path, model: &Model, tok: &TextTokenizer, turns: &[&str]) -> (Session, Vec<u8>) {
    let mut s = session(model, tok);
    for text in turns {
        s.prepare_turn(model, tok, text, 16).unwrap();
        s.finish_reply("ok");
        model.forward(&tok.encode("ok").unwrap(), &mut s.state).unwrap();
    }
    let file = dir.join("chat.pcstate");
    persist::save(&s, &identity(), &file).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    (s, bytes)
}

/// Writes `data` as `DIR/NAME`, restores it for model `id` into a fresh session and
/// returns the error, having checked that the session was left empty and usable.
fn refused(
    dir: &std::path::Path,
    model: &Model,
    tok: &TextTokenizer,
    name: &str,
    data: &[u8],
    id: &ModelIdentity,
) -> StateFileError {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    let mut fresh = session(model, tok);
    let e = persist::restore(&mut fresh, id, &p).expect_err(name);
    assert!(fresh.state.is_empty() && fresh.messages().is_empty(), "{name}");
    fresh.prepare_turn(model, tok, "hi again", 16).unwrap();
    println!("{name}: {e}");
    e
}

#[test]
fn restored_session_continues_like_the_original() {
    let (dir, model, tok, _) = tiny();
    // Files hold K/V as f16; with an f16 cache the round trip is exact.
    let mut s = session_with(&model, &tok, DType::F16);
    for text in ["first message", "second one"] {
        s.prepare_turn(&model, &tok, text, 16).unwrap();
        s.finish_reply("reply");
        model.forward(&tok.encode("reply").unwrap(), &mut s.state).unwrap();
    }
    let file = dir.path().join("chat.pcstate");
    persist::save(&s, &identity(), &file).unwrap();

    let mut restored = session_with(&model, &tok, DType::F16);
    persist::restore(&mut restored, &identity(), &file).unwrap();
    assert_eq!(restored.state.tokens(), s.state.tokens());
    assert_eq!(restored.messages(), s.messages());
    assert_eq!(restored.turn_lengths(), s.turn_lengths());

    let a = s.prepare_turn(&model, &tok, "third", 16).unwrap();
    let b = restored.prepare_turn(&model, &tok, "third", 16).unwrap();
    assert_eq!(a.fed_tokens, b.fed_tokens, "the restored session re-prefilled");
    let diff = max_abs_diff(&a.logits, &b.logits);
    assert!(diff <= 1e-5, "logits after restore differ by {diff}");
}

/// A q8_0 cache is saved as its blocks: restored into a q8_0 cache it continues exactly
/// (the same bytes), at 17/32 of an f16 file's cache bytes. Restored into an f16 cache
/// its values are widened, and an f16 file restored into a q8_0 cache is quantized: both
/// continue to quantization tolerance. A format-4 file (no `kv_type`: f16) still reads.
#[test]
fn q8_0_caches_save_as_q8_0_and_convert_across_types() {
    let (dir, model, tok, _) = tiny();
    let talk = |kv: KvDtype| {
        let mut s = session_with(&model, &tok, kv);
        for text in ["first message", "second one"] {
            s.prepare_turn(&model, &tok, text, 16).unwrap();
            s.finish_reply("reply");
            model.forward(&tok.encode("reply").unwrap(), &mut s.state).unwrap();
        }
        s
    };
    let (mut q8, mut f16) = (talk(KvDtype::Q8_0), talk(KvDtype::F16));
    let (q8_file, f16_file) = (dir.path().join("q8.pcstate"), dir.path().join("f16.pcstate"));
    let q8_bytes = persist::save(&q8, &identity(), &q8_file).unwrap();
    let f16_bytes = persist::save(&f16, &identity(), &f16_file).unwrap();
    let header_len = |p: &std::path::Path| {
        let b = std::fs::read(p).unwrap();
        u32::from_le_bytes(b[12..16].try_into().unwrap()) as u64
    };
    let cache = |bytes: u64, p: &std::path::Path| bytes - 16 - header_len(p) - 4;
    assert_eq!(
        cache(q8_bytes, &q8_file) * 32,
        cache(f16_bytes, &f16_file) * 17,
        "q8_0 blocks are 34 bytes per 32 values"
    );

    let tokens = q8.state.len();
    let next = |s: &mut Session| s.prepare_turn(&model, &tok, "third", 16).unwrap().logits;
    let restored = |kv: KvDtype, file: &std::path::Path| {
        let mut r = session_with(&model, &tok, kv);
        persist::restore(&mut r, &identity(), file).unwrap();
        assert_eq!(r.state.tokens().len(), tokens);
        r
    };
    // What the saved sessions themselves give next.
    let (want_q8, want_f16) = (next(&mut q8), next(&mut f16));
    assert!(max_abs_diff(&want_q8, &want_f16) > 0.0);
    let exact = max_abs_diff(&next(&mut restored(KvDtype::Q8_0, &q8_file)), &want_q8);
    assert!(exact <= 1e-5, "q8_0 → q8_0 differs by {exact}");
    // Across types the values are converted as they are read (checked value by value in
    // `engine::kv_type`'s tests); on this random-weight model a cache's type moves the
    // logits by about 1, so here the conversations only go on.
    for (kv, file) in [(KvDtype::F16, &q8_file), (KvDtype::Q8_0, &f16_file), (KvDtype::F32, &q8_file)] {
        let got = next(&mut restored(kv, file));
        assert!(got.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|x| x.is_finite()), "{kv:?}");
    }

    // Format 4 had no `kv_type`: its K/V are f16.
    let mut old = reforge(&std::fs::read(&f16_file).unwrap(), |h| {
        h.as_object_mut().unwrap().remove("kv_type");
    });
    old[8..12].copy_from_slice(&4u32.to_le_bytes());
    let body_end = old.len() - 4;
    let crc = crc32fast::hash(&old[..body_end]);
    old[body_end..].copy_from_slice(&crc.to_le_bytes());
    let old_file = dir.path().join("format4.pcstate");
    std::fs::write(&old_file, &old).unwrap();
    let diff = max_abs_diff(&next(&mut restored(KvDtype::F16, &old_file)), &want_f16);
    assert!(diff <= 1e-5, "a format-4 file restores exactly: {diff}");
    let e = refused(
        dir.path(),
        &model,
        &tok,
        "unknown-type",
        &reforge(&old, |h| h["kv_type"] = "q4_0".into()),
        &identity(),
    );
    assert!(e.to_string().contains("unknown type"), "{e}");
}

#[test]
fn bad_state_files_are_refused_and_leave_a_fresh_session() {
    let (dir, model, tok, _) = tiny();
    let (_, bytes) = saved(dir.path(), &model, &tok, &["hello"]);
    let check = |name: &str, data: &[u8], id: &ModelIdentity, want: fn(&StateFileError) -> bool| {
        let e = refused(dir.path(), &model, &tok, name, data, id);
        assert!(want(&e), "{name}: unexpected error {e:?}");
    };
    let other = ModelIdentity { sha256: "cd".repeat(32), bytes: 1234 };
    check("other-model", &bytes, &other, |e| matches!(e, StateFileError::OtherModel(_)));
    check("truncated", &bytes[..bytes.len() - 100], &identity(), |e| matches!(e, StateFileError::Damaged(_)));
    check("header-cut", &bytes[..40], &identity(), |e| matches!(e, StateFileError::Damaged(_)));
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&99u32.to_le_bytes());
    check("newer", &newer, &identity(), |e| matches!(e, StateFileError::NewerFormat(99)));
    check("garbage", b"definitely not a state file", &identity(), |e| matches!(e, StateFileError::NotAStateFile));
    let mut missing = session(&model, &tok);
    assert!(matches!(
        persist::restore(&mut missing, &identity(), &dir.path().join("none")),
        Err(StateFileError::Missing(_))
    ));
}

#[test]
fn altered_or_padded_files_are_refused_before_use() {
    let (dir, model, tok, _) = tiny();
    let (_, bytes) = saved(dir.path(), &model, &tok, &["hello"]);
    let refuse = |name: &str, data: &[u8], why: &str| {
        let e = refused(dir.path(), &model, &tok, name, data, &identity());
        assert!(matches!(e, StateFileError::Damaged(_)) && e.to_string().contains(why), "{name}: {e}");
    };
    // 500 flipped bytes in the cache: the checksum says so.
    let mut flipped = bytes.clone();
    let body_end = flipped.len() - 4;
    for b in &mut flipped[body_end - 500..body_end] {
        *b ^= 0x55;
    }
    refuse("flipped", &flipped, "checksum");
    // A body of NaNs, with a checksum that matches it: still refused.
    let mut nans = bytes.clone();
    let header_len = u32::from_le_bytes(nans[12..16].try_into().unwrap()) as usize;
    for pair in nans[16 + header_len..body_end].chunks_exact_mut(2) {
        pair.copy_from_slice(&half::f16::NAN.to_le_bytes());
    }
    let crc = crc32fast::hash(&nans[..body_end]);
    nans[body_end..].copy_from_slice(&crc.to_le_bytes());
    refuse("nans", &nans, "not numbers");
    // Padding: the sizes in the header do not add up to the file's, so the body is not read.
    let mut padded = bytes.clone();
    padded.resize(bytes.len() + (1 << 20), 0);
    refuse("padded", &padded, "its header describes");
    // A header length past the end of the file.
    let mut long_header = bytes.clone();
    long_header[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    refuse("long-header", &long_header, "header");
}

/// Rewrites a state file's JSON header with `edit` and makes its sizes and checksum
/// right again: what a forger would do.
fn reforge(bytes: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let header_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[16..16 + header_len]).unwrap();
    edit(&mut header);
    let json = serde_json::to_vec(&header).unwrap();
    let mut out = bytes[..12].to_vec();
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&bytes[16 + header_len..bytes.len() - 4]);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

#[test]
fn forged_headers_with_a_good_checksum_are_range_checked() {
    let (dir, model, tok, _) = tiny();
    let (_, bytes) = saved(dir.path(), &model, &tok, &["hello", "again", "and again"]);
    // The untouched file restores (the forger's tool is sound).
    let mut fresh = session(&model, &tok);
    let p = dir.path().join("same");
    std::fs::write(&p, reforge(&bytes, |_| {})).unwrap();
    persist::restore(&mut fresh, &identity(), &p).unwrap();
    let forged = |name: &str, data: Vec<u8>| refused(dir.path(), &model, &tok, name, &data, &identity()).to_string();
    let e = forged("big-id", reforge(&bytes, |h| h["session"]["tokens"][0] = 1_000_000.into()));
    assert!(e.contains("vocabulary"), "{e}");
    let e = forged("unordered", reforge(&bytes, |h| h["session"]["turns"].as_array_mut().unwrap().swap(0, 1)));
    assert!(e.contains("inconsistent"), "{e}");
}

#[test]
fn saving_to_a_path_ending_in_part_works() {
    let (dir, model, tok, _) = tiny();
    let mut s = session(&model, &tok);
    s.prepare_turn(&model, &tok, "hello", 16).unwrap();
    let file = dir.path().join("chat.part");
    persist::save(&s, &identity(), &file).unwrap();
    persist::save(&s, &identity(), &file).unwrap();
    let mut fresh = session(&model, &tok);
    persist::restore(&mut fresh, &identity(), &file).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "the model and chat.part, nothing else");
}

#[test]
fn saving_never_replaces_a_file_that_is_not_ours() {
    let (dir, model, tok, gguf) = tiny();
    let mut s = session(&model, &tok);
    s.prepare_turn(&model, &tok, "hello", 16).unwrap();
    let ours = dir.path().join("ours.pcstate");
    persist::save(&s, &identity(), &ours).unwrap();
    let mut newer = std::fs::read(&ours).unwrap();
    newer[8..12].copy_from_slice(&99u32.to_le_bytes());
    let other = ModelIdentity { sha256: "cd".repeat(32), bytes: 1234 };
    let others = dir.path().join("others.pcstate");
    persist::save(&s, &other, &others).unwrap();
    let cases: [(&str, Vec<u8>); 4] = [
        ("model.gguf", std::fs::read(&gguf).unwrap()),
        ("notes.txt", b"my notes".to_vec()),
        ("newer.pcstate", newer),
        ("others.pcstate", std::fs::read(&others).unwrap()),
    ];
    for (name, data) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, &data).unwrap();
        let e = persist::save(&s, &identity(), &p).unwrap_err();
        assert!(matches!(e, StateFileError::WontOverwrite { .. }), "{name}: {e:?}");
        assert_eq!(std::fs::read(&p).unwrap(), data, "{name} was changed");
        println!("{name}: {e}");
    }
    // Its own file is replaced; no temporary file is left behind either way.
    persist::save(&s, &identity(), &ours).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(persist::free_path_beside(&ours), dir.path().join("ours-2.pcstate"));
}

#[test]
fn the_engine_keeps_a_file_it_cannot_use_and_saves_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = write_tiny_gguf(dir.path(), &TinySpec::default(), 21);
    let session_file = dir.path().join("precious.txt");
    std::fs::write(&session_file, b"not a conversation").unwrap();
    let mut config = EngineConfig::new(gguf);
    config.state_file = Some(session_file.clone());
    config.max_tokens = 4;
    let (handle, mut events) = Engine::spawn(config);
    let start = collect_until_stats_after(&mut events, |e| matches!(e, EngineEvent::Ready(_)));
    let notices: Vec<String> = start
        .iter()
        .filter_map(|e| if let EngineEvent::Notice { message } = e { Some(message.clone()) } else { None })
        .collect();
    assert!(notices.iter().any(|n| n.contains("left as it is") && n.contains("precious-2.txt")), "{notices:?}");
    handle.send(Command::Send { text: "hello".into() }).unwrap();
    let evs = collect_until_stats_after(&mut events, |e| matches!(e, EngineEvent::Done { .. }));
    assert!(
        evs.iter().any(|e| matches!(e, EngineEvent::Saved { path, .. } if path.ends_with("precious-2.txt"))),
        "{evs:?}"
    );
    handle.send(Command::Shutdown).unwrap();
    while events.recv_blocking().is_some() {}
    assert_eq!(std::fs::read(&session_file).unwrap(), b"not a conversation");
    assert!(dir.path().join("precious-2.txt").exists());
}

#[test]
fn two_engines_on_one_state_file_save_to_two_files() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = write_tiny_gguf(dir.path(), &TinySpec::default(), 21);
    let shared = dir.path().join("chat.pcstate");
    let start = |text: &str| {
        let mut config = EngineConfig::new(gguf.clone());
        config.state_file = Some(shared.clone());
        config.max_tokens = 4;
        let (handle, mut events) = Engine::spawn(config);
        let start = collect_until_stats_after(&mut events, |e| matches!(e, EngineEvent::Ready(_)));
        handle.send(Command::Send { text: text.into() }).unwrap();
        let evs = collect_until_stats_after(&mut events, |e| matches!(e, EngineEvent::Done { .. }));
        let saved =
            evs.iter().find_map(|e| if let EngineEvent::Saved { path, .. } = e { Some(path.clone()) } else { None });
        (handle, events, start, saved.expect("saved"))
    };
    let (first, mut first_events, _, first_saved) = start("one");
    let (second, mut second_events, notices, second_saved) = start("two");
    assert!(first_saved.ends_with("chat.pcstate"), "{first_saved}");
    assert!(second_saved.ends_with("chat-2.pcstate"), "{second_saved}");
    assert!(
        notices
            .iter()
            .any(|e| matches!(e, EngineEvent::Notice { message } if message.contains("in use by another pocketchat"))),
        "{notices:?}"
    );
    for (handle, events) in [(first, &mut first_events), (second, &mut second_events)] {
        handle.send(Command::Shutdown).unwrap();
        while events.recv_blocking().is_some() {}
    }
}

fn collect_until_stats_after(
    events: &mut pocketchat::engine::EngineEvents,
    stop: fn(&EngineEvent) -> bool,
) -> Vec<EngineEvent> {
    let mut out = Vec::new();
    let mut seen = false;
    loop {
        let ev = events.recv_blocking().expect("engine stopped");
        let closes = seen && matches!(ev, EngineEvent::Stats(_));
        seen |= stop(&ev);
        out.push(ev);
        if closes {
            return out;
        }
    }
}

#[test]
fn the_engine_restores_a_real_conversation_at_launch_without_re_prefill() {
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("conversation.pcstate");
    let mut config = EngineConfig::new(default_model());
    config.state_file = Some(state_file.clone());
    config.max_tokens = 24;
    config.budget_override = Some(1024);

    let (handle, mut events) = Engine::spawn(config.clone());
    collect_until_stats_after(&mut events, |e| matches!(e, EngineEvent::Ready(_)));
    for text in ["Which city is the capital of France?", "Name a famous museum there."] {
        handle.send(Command::Send { text: text.into() }).unwrap();
        let evs = collect_until_stats_after(&mut events, |e| matches!(e, EngineEvent::Done { .. }));
        assert!(evs.iter().any(|e| matches!(e, EngineEvent::Saved { .. })), "no save after the reply");
    }
    handle.send(Command::Shutdown).unwrap();
    while events.recv_blocking().is_some() {}
    assert!(state_file.exists());

    // "Relaunch": the conversation comes back with its messages and K/V.
    let (handle, mut events) = Engine::spawn(config);
    let start = collect_until_stats_after(&mut events, |e| matches!(e, EngineEvent::Restored { .. }));
    let (messages, tokens) = start
        .iter()
        .find_map(|e| {
            if let EngineEvent::Restored { messages, tokens } = e {
                Some((messages.clone(), *tokens))
            } else {
                None
            }
        })
        .expect("no Restored event");
    assert_eq!(messages.len(), 4);
    assert!(tokens > 50);
    handle.send(Command::Send { text: "And of Spain?".into() }).unwrap();
    let evs = collect_until_stats_after(&mut events, |e| matches!(e, EngineEvent::Done { .. }));
    let fed = evs
        .iter()
        .rev()
        .find_map(|e| if let EngineEvent::Stats(s) = e { Some(s.prefill_tokens) } else { None })
        .unwrap();
    assert!(fed < 20, "after restore the turn fed {fed} tokens (re-prefill?)");

    handle.send(Command::Shutdown).unwrap();
    while events.recv_blocking().is_some() {}

    // A damaged state file is refused with a notice, kept, and the app starts fresh.
    std::fs::write(&state_file, b"PCSTATE\0garbage").unwrap();
    let mut config = EngineConfig::new(default_model());
    config.state_file = Some(state_file);
    let (handle, mut events) = Engine::spawn(config);
    let start = collect_until_stats_after(&mut events, |e| matches!(e, EngineEvent::Notice { .. }));
    assert!(
        start.iter().any(|e| matches!(e, EngineEvent::Notice { message } if message.contains("damaged") && message.contains("left as it is"))),
        "{start:?}"
    );
    assert!(!start.iter().any(|e| matches!(e, EngineEvent::Restored { .. })));
    handle.send(Command::Shutdown).unwrap();
}

/// Runs `f` on a thread and fails when it has not returned within a generous deadline
/// (a blocked `open` would never return).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(120)).unwrap_or_else(|_| panic!("{what} blocked"))
}

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Issue #34, item 8: a FIFO in a state file's place blocked the restore (and the save's
/// check) forever. It is refused unopened, for reading and for writing, and left as is.
#[test]
fn a_fifo_in_the_state_files_place_is_refused_without_blocking() {
    let (dir, model, tok, _) = tiny();
    let fifo = dir.path().join("chat.pcstate");
    mkfifo(&fifo);
    let mut fresh = session(&model, &tok);
    let e = persist::restore(&mut fresh, &identity(), &fifo).unwrap_err();
    assert!(matches!(e, StateFileError::NotRegular(_)), "{e:?}");
    assert!(e.to_string().contains("chat.pcstate is a FIFO"), "{e}");
    assert!(e.keeps_the_file());
    let e = persist::save(&fresh, &identity(), &fifo).unwrap_err();
    assert!(matches!(e, StateFileError::WontOverwrite { .. }), "{e:?}");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
    assert!(persist::check_state_path(&fifo).unwrap_err().contains("is a FIFO"));
    assert!(persist::check_state_path(std::path::Path::new("/dev/null")).unwrap_err().contains("is a device"));
    // No folder is made for a state file.
    let nested = dir.path().join("missing").join("chat.pcstate");
    let e = persist::save(&fresh, &identity(), &nested).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert!(!dir.path().join("missing").exists());
}

/// Issue #34, items 8 and 17, on the engine (the app's and the library's path): a FIFO
/// or a device as the state file is reported at start, nothing is written beside it,
/// and the conversation goes on unsaved.
#[test]
fn the_engine_starts_with_a_fifo_or_a_device_as_its_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = write_tiny_gguf(dir.path(), &TinySpec::default(), 21);
    let fifo = dir.path().join("chat.pcstate");
    mkfifo(&fifo);
    let before_dev: Vec<_> = std::fs::read_dir("/dev").unwrap().map(|e| e.unwrap().file_name()).collect();
    for (state_file, why) in [(fifo.clone(), "is a FIFO"), ("/dev/null".into(), "is a device")] {
        let mut config = EngineConfig::new(gguf.clone());
        config.state_file = Some(state_file);
        config.max_tokens = 4;
        let notices = within("the engine's start", move || {
            let (handle, mut events) = Engine::spawn(config);
            let start = collect_until_stats_after(&mut events, |e| matches!(e, EngineEvent::Ready(_)));
            handle.send(Command::Send { text: "hello".into() }).unwrap();
            let reply = collect_until_stats_after(&mut events, |e| matches!(e, EngineEvent::Done { .. }));
            assert!(!reply.iter().any(|e| matches!(e, EngineEvent::Saved { .. })), "{reply:?}");
            handle.send(Command::Shutdown).unwrap();
            while events.recv_blocking().is_some() {}
            start
                .into_iter()
                .filter_map(|e| if let EngineEvent::Notice { message } = e { Some(message) } else { None })
                .collect::<Vec<_>>()
        });
        assert!(notices.iter().any(|n| n.contains(why) && n.contains("will not be saved")), "{notices:?}");
    }
    let after_dev: Vec<_> = std::fs::read_dir("/dev").unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(after_dev.iter().all(|n| before_dev.contains(n)), "written into /dev");
    let mut names: Vec<_> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names.len(), 2, "the model and the FIFO, nothing beside them: {names:?}");
}
