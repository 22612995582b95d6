//! Gemma's sliding-window layers keep only their window (`State`'s window): on the real
//! Gemma 3 270M file and the tiny Gemma 4 file, with conversations far longer than the
//! window, every logit equals that of a state keeping every position
//! ([`State::keep_every_position`], the cache as it was), step by step and through a
//! chat's turns, regenerate, edits, trims and a save and restore; and the cache of the
//! 270M at a 4K budget is under a third of the full one.

mod common;

use candle_core::{DType, Device, Tensor};
use pocketchat::engine::model::read_gguf;
use pocketchat::engine::persist::{self, ModelIdentity};
use pocketchat::engine::state::{window_rows, State};
use pocketchat::engine::template::ChatTemplate;
use pocketchat::engine::tokenizer::TextTokenizer;
use pocketchat::engine::{DraftExtent, Kernels, Model, Session};

fn gemma3() -> (Model, TextTokenizer, ChatTemplate) {
    let path = pocketchat::catalog::models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(path.is_file(), "{} is missing: run `scripts/fetch-model.sh gemma-3-270m-q4_k_m`", path.display());
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let (content, _) = read_gguf(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&content).unwrap();
    let template = ChatTemplate::for_model(&content, &tok);
    (model, tok, template)
}

/// A state keeping every position of every layer: the reference.
fn full_state(model: &Model, budget: usize, dtype: DType) -> State {
    let mut state = model.make_state(budget, dtype);
    state.keep_every_position();
    assert_eq!(state.window(), None);
    state
}

/// Prose of about `words` words, different in each paragraph.
fn prose(seed: usize, words: usize) -> String {
    let nouns = ["lighthouse", "harbour", "keeper", "lamp", "ship", "storm", "island", "rope", "gull", "tide"];
    let verbs = ["watched", "counted", "mended", "lit", "crossed", "heard", "followed", "painted"];
    (0..words / 8)
        .map(|i| {
            let k = seed * 31 + i * 7;
            format!(
                "The {} {} the {} {} times near the {} before the {}.",
                nouns[k % nouns.len()],
                verbs[(k / 3) % verbs.len()],
                nouns[(k / 5) % nouns.len()],
                k % 97,
                nouns[(k / 7) % nouns.len()],
                nouns[(k / 11) % nouns.len()],
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn assert_same(a: &Tensor, b: &Tensor, what: &str) {
    let diff = common::relative_diff(a, b);
    assert!(diff < 1e-5, "{what}: the logits differ by {diff} of the largest");
}

/// Prefill past the window, then a greedy decode: every step's logits are the full
/// cache's, while the sliding layers hold at most their window and slack.
#[test]
fn gemma3_windowed_cache_gives_the_full_caches_logits_step_by_step() {
    let (model, tok, _) = gemma3();
    let window = model.config.sliding_window.expect("gemma3 slides");
    let mut tokens = tok.encode(&format!("<bos>{}", prose(1, 1600))).unwrap();
    tokens.truncate(1700);
    assert!(tokens.len() > 2 * window_rows(window), "{} tokens", tokens.len());
    for dtype in [DType::F16, DType::F32] {
        let mut win = model.make_state(4096, dtype);
        let mut full = full_state(&model, 4096, dtype);
        assert_eq!(win.window(), Some(window));
        let a = model.forward(&tokens, &mut win).unwrap();
        let b = model.forward(&tokens, &mut full).unwrap();
        assert_same(&a, &b, "after the prefill");
        assert!(win.window_base() > 0, "the window moved");
        let mut next = pocketchat::engine::model::argmax(&b).unwrap();
        // Through at least one more move of the window (every WINDOW_SLACK tokens).
        for step in 0..300 {
            let a = model.forward(&[next], &mut win).unwrap();
            let b = model.forward(&[next], &mut full).unwrap();
            assert_same(&a, &b, &format!("{dtype:?} decode step {step}"));
            next = pocketchat::engine::model::argmax(&b).unwrap();
        }
        assert_eq!(win.tokens(), full.tokens());
        assert!(win.len() - win.window_base() <= window_rows(window));
        assert!(win.kv_bytes() * 2 < full.kv_bytes(), "{} vs {}", win.kv_bytes(), full.kv_bytes());
    }
}

/// The done-when of issue 29's sixth item: Gemma 3 270M with 4K tokens in its cache
/// holds at most a third of the K/V bytes of a cache keeping every position.
#[test]
fn gemma3_at_a_4k_budget_holds_a_third_of_the_full_cache() {
    let (model, tok, _) = gemma3();
    let text = format!("<bos>{}", prose(2, 4000));
    let mut tokens = tok.encode(&text).unwrap();
    assert!(tokens.len() >= 4096, "{}", tokens.len());
    tokens.truncate(4096);
    let mut state = model.make_state(4096, DType::F16);
    model.forward(&tokens, &mut state).unwrap();
    let c = &model.config;
    let full = (2 * c.n_layers * c.n_kv_heads * c.head_dim * 2 * 4096) as u64;
    let windowed = state.kv_bytes();
    println!("gemma-3-270m, 4096 tokens, f16 cache: {windowed} bytes windowed, {full} bytes keeping every position");
    assert!(windowed * 3 <= full, "{windowed} bytes windowed, {full} bytes full");
    // The model's own figures for the memory policy are what the state holds.
    assert_eq!(model.kv_bytes_at(DType::F16, 4096), windowed);
    let facts = model.facts(DType::F16);
    assert_eq!(facts.kv_bytes_per_token * 4096 + facts.window_kv_bytes, windowed);
}

/// Logits of one conversation computed in different chunks (a re-feed from the start
/// against the cache of turn-by-turn prefills): the f16 cache of the real file rounds
/// them otherwise, and the K-quant layers round their inputs to 8 bits per 256 values
/// (so one input that rounds the other way moves a whole step of that scale): they agree
/// to a few hundredths of the largest logit (measured up to 0.068) and on the greedy
/// token. (Where the windowed state is fed again, the test also checks it exactly against
/// a fresh prefill.)
fn assert_near(a: &Tensor, b: &Tensor, what: &str) {
    let diff = common::relative_diff(a, b);
    println!("{what}: {diff} of the largest logit");
    assert!(diff < 0.1, "{what}: the logits differ by {diff} of the largest");
    let (x, y) = (pocketchat::engine::model::argmax(a).unwrap(), pocketchat::engine::model::argmax(b).unwrap());
    assert_eq!(x, y, "{what}: the greedy token");
}

fn reply(s: &mut Session, model: &Model, tok: &TextTokenizer, text: &str) {
    model.forward(&tok.encode_text(text).unwrap(), &mut s.state).unwrap();
    s.finish_reply(text);
}

/// A chat whose history passes the window many times over: each turn's logits, a
/// regenerate after a reply longer than the slack, an edit of an older message (whose
/// window is gone: fed again from the start), a budget trim and a save and restore all
/// give the logits of a session keeping every position.
#[test]
fn a_gemma3_chat_past_the_window_matches_the_full_cache_at_every_turn() {
    let (model, tok, template) = gemma3();
    let (_, _, template_again) = gemma3();
    let budget = 4096;
    let mut win = Session::new(model.make_state(budget, DType::F16), template).unwrap();
    let mut full = Session::new(full_state(&model, budget, DType::F16), template_again).unwrap();
    let turn = |s: &mut Session, i: usize| s.prepare_turn(&model, &tok, &prose(10 + i, 100), 400).unwrap();
    for i in 0..4 {
        let (a, b) = (turn(&mut win, i), turn(&mut full, i));
        assert_eq!(win.state.tokens(), full.state.tokens());
        assert_eq!(a.fed_tokens, b.fed_tokens, "turn {i}");
        assert_same(&a.logits, &b.logits, &format!("turn {i}"));
        let answer = prose(50 + i, 160);
        reply(&mut win, &model, &tok, &answer);
        reply(&mut full, &model, &tok, &answer);
    }
    assert!(win.state.window_base() > 0);

    // Regenerate after a reply longer than the slack: the reply's start is out of the
    // window, so the state is fed again from the start.
    let (a, _, fed_win) = win.rewind_reply(&model).unwrap().unwrap();
    let (b, _, fed_full) = full.rewind_reply(&model).unwrap().unwrap();
    assert_eq!(fed_full, 1);
    assert_eq!(fed_win, win.state.len(), "fed again from the start");
    // Fed again from the start, the windowed state is a fresh prefill (exactly); the full
    // one decodes over K/V computed in other chunks, which the real file's f16 cache
    // rounds otherwise (a few hundredths of the largest logit).
    let fresh = model.forward(win.state.tokens(), &mut full_state(&model, budget, DType::F16)).unwrap();
    assert_same(&a, &fresh, "regenerate, fed again from the start");
    assert_near(&a, &b, "regenerate: windowed (fed again) and full (one token)");
    let answer = "A short answer this time.";
    reply(&mut win, &model, &tok, answer);
    reply(&mut full, &model, &tok, answer);

    // A short reply stays inside the window: regenerate feeds one token.
    let (a, _, fed) = win.rewind_reply(&model).unwrap().unwrap();
    let (b, _, _) = full.rewind_reply(&model).unwrap().unwrap();
    assert_eq!(fed, 1, "the window before the reply is held");
    assert_near(&a, &b, "regenerate a short reply");
    reply(&mut win, &model, &tok, answer);
    reply(&mut full, &model, &tok, answer);

    // Edit the second message.
    let index = win.messages().iter().position(|m| m.content == prose(11, 100)).unwrap();
    assert!(win.rewind_to_message(&model, index));
    assert!(full.rewind_to_message(&model, index));
    let (a, b) = (turn(&mut win, 20), turn(&mut full, 20));
    assert_eq!(win.state.tokens(), full.state.tokens());
    assert_near(&a.logits, &b.logits, "edit of an older message: windowed (fed again) and full (the turn)");
    let answer = prose(70, 160);
    reply(&mut win, &model, &tok, &answer);
    reply(&mut full, &model, &tok, &answer);

    // Save and restore mid-chat: the held rows and the base come back.
    let dir = tempfile::tempdir().unwrap();
    let id = ModelIdentity { sha256: "gemma3-window".into(), bytes: 1 };
    let (win_file, full_file) = (dir.path().join("win.pcstate"), dir.path().join("full.pcstate"));
    persist::save(&win, &id, &win_file).unwrap();
    persist::save(&full, &id, &full_file).unwrap();
    let (win_bytes, full_bytes) =
        (std::fs::metadata(&win_file).unwrap().len(), std::fs::metadata(&full_file).unwrap().len());
    assert!(win_bytes * 3 < full_bytes * 2, "{win_bytes} vs {full_bytes} bytes saved");
    let (_, _, template) = gemma3();
    let mut restored = Session::new(model.make_state(budget, DType::F16), template).unwrap();
    persist::restore(&mut restored, &id, &win_file).unwrap();
    assert_eq!(restored.state.window_base(), win.state.window_base());
    assert_eq!(restored.state.tokens(), full.state.tokens());
    // A file holding every position (as before format 5) restores into a windowed state,
    // which keeps the last rows it has room for.
    let (_, _, template) = gemma3();
    let mut from_full = Session::new(model.make_state(budget, DType::F16), template).unwrap();
    persist::restore(&mut from_full, &id, &full_file).unwrap();
    let len = from_full.state.len();
    assert_eq!(from_full.state.window_base(), len - window_rows(model.config.sliding_window.unwrap()));

    // A smaller budget trims the oldest turns: the windowed sessions re-read what they
    // keep (their window would not survive a shift), the full one shifts; the tokens
    // kept are the same, the logits those of a fresh prefill of them.
    let small = win.state.len() + 200;
    for s in [&mut win, &mut restored, &mut full, &mut from_full] {
        s.set_budget(small);
    }
    let mut trimmed = 0;
    for i in 0..3 {
        let (a, b, c) = (turn(&mut win, 30 + i), turn(&mut restored, 30 + i), turn(&mut full, 30 + i));
        let d = turn(&mut from_full, 30 + i);
        assert_eq!(win.state.tokens(), full.state.tokens(), "turn {i} after the edit");
        assert_eq!(restored.state.tokens(), full.state.tokens());
        assert_eq!(from_full.state.tokens(), full.state.tokens());
        assert_same(&a.logits, &b.logits, &format!("restored, turn {i}"));
        if c.dropped_tokens == 0 || from_full.last_reread() == 0 {
            // The full session's K/V, the window of them.
            assert_same(&d.logits, &c.logits, &format!("restored from a full file, turn {i}"));
        }
        if c.dropped_tokens == 0 || win.last_reread() == 0 {
            // Nothing dropped, or dropped before the held window: shifted as the full
            // cache. The windowed cache was read afresh at the edit and the full one was
            // not, so they are f16 rounding apart (as at the regenerate above).
            assert_near(&a.logits, &c.logits, &format!("turn {i} after the edit"));
        } else {
            let fresh = model.forward(win.state.tokens(), &mut model.make_state(budget, DType::F16)).unwrap();
            assert_same(&a.logits, &fresh, &format!("turn {i}, trimmed and read again"));
        }
        println!("turn {i}: {} dropped, {} read again", c.dropped_tokens, win.last_reread());
        trimmed += c.dropped_tokens;
        for s in [&mut win, &mut restored, &mut full, &mut from_full] {
            reply(s, &model, &tok, &prose(80 + i, 160));
        }
    }
    assert!(trimmed > 0, "the budget dropped old turns");

    // A long message typed ahead: the draft stops before the window would move (an edit
    // of it could not go back in place), Send feeds the rest.
    let long = prose(90, 300);
    win.set_budget(budget);
    full.set_budget(budget);
    let (base_before, conversation, room) = (win.state.window_base(), win.len(), win.state.room_before_window_moves());
    assert!(tok.encode_text(&long).unwrap().len() > room, "a message longer than the room");
    while win.draft(&model, &tok, &long, DraftExtent::Whole, 100).unwrap().left > 0 {}
    assert_eq!(win.state.window_base(), base_before, "the draft did not move the window");
    assert_eq!(win.state.len() - conversation, room, "fed up to the room");
    let (a, b) =
        (win.prepare_turn(&model, &tok, &long, 100).unwrap(), full.prepare_turn(&model, &tok, &long, 100).unwrap());
    assert_eq!(win.state.tokens(), full.state.tokens());
    assert_near(&a.logits, &b.logits, "a long message typed ahead: windowed (in draft steps) and full (one prefill)");
    let answer = "Noted.";
    reply(&mut win, &model, &tok, answer);
    reply(&mut full, &model, &tok, answer);
}

/// The tiny Gemma 4 (window 5): token by token past the window's rows, and in one
/// forward split into parts, the logits are the full cache's; a shift that keeps the
/// window moves the held rows, one that would lose it is refused; a truncation keeps
/// what the window allows and otherwise empties the state.
#[test]
fn gemma4_windowed_cache_decodes_shifts_and_truncates_as_the_full_cache() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::gemma4::write_tiny_gemma4(dir.path(), 41);
    let window = common::gemma4::WINDOW;
    let tokens: Vec<u32> = (0..480u32).map(|i| (i * 37 + 11) % 250).collect();
    for kernels in [Kernels::Candle, Kernels::Fast] {
        let model = Model::load(&path, &Device::Cpu, kernels, |_| {}).unwrap();
        let reference = model.forward_all(&tokens, &mut full_state(&model, 512, DType::F32)).unwrap();
        let mut win = model.make_state(512, DType::F32);
        assert_eq!(win.window(), Some(window));
        let all = model.forward_all(&tokens, &mut win).unwrap();
        let diff = common::relative_diff(&all, &reference);
        assert!(diff < 1e-4, "{kernels:?}: one forward in parts differs by {diff}");

        let mut win = model.make_state(512, DType::F32);
        model.forward(&tokens[..3], &mut win).unwrap();
        for (i, &t) in tokens.iter().enumerate().skip(3) {
            let row = model.forward(&[t], &mut win).unwrap();
            let diff = common::relative_diff(&row, &reference.get(i).unwrap());
            assert!(diff < 1e-4, "{kernels:?}: position {i} differs by {diff}");
            assert!(win.len() - win.window_base() <= window_rows(window));
        }
        let base = win.window_base();
        assert!(base > 0);

        // A shift of old positions (before the held rows) keeps the window.
        let mut full = full_state(&model, 512, DType::F32);
        model.forward(&tokens, &mut full).unwrap();
        assert!(win.can_shift_out(10, 60));
        model.shift_out(&mut win, 10, 60).unwrap();
        model.shift_out(&mut full, 10, 60).unwrap();
        assert_eq!(win.window_base(), base - 50);
        let (a, b) = (model.forward(&[7], &mut win).unwrap(), model.forward(&[7], &mut full).unwrap());
        assert!(common::relative_diff(&a, &b) < 1e-4, "{kernels:?}: after a shift");
        // One reaching into the last window would lose it.
        let len = win.len();
        assert!(!win.can_shift_out(10, len - 2));
        assert!(model.shift_out(&mut win, 10, len - 2).is_err());

        // Truncation: inside the held window it keeps the tokens, before it nothing.
        let base = win.window_base();
        assert_eq!(win.truncate(base + window - 1), base + window - 1);
        assert_eq!(win.truncate(base + window - 2), 0);
        assert!(win.is_empty() && win.window_base() == 0);
    }
}

/// Not a check: `cargo test --no-default-features --test sliding_window prefill_speed --
/// --ignored --nocapture` times 256-token prefill chunks of Gemma 3 270M past the window,
/// windowed and full, alternating.
#[test]
#[ignore = "measurement only: prints timings, asserts none"]
fn prefill_speed() {
    let (model, tok, _) = gemma3();
    let mut tokens = tok.encode(&format!("<bos>{}", prose(3, 3000))).unwrap();
    tokens.truncate(3072);
    for round in 0..2 {
        for windowed in [true, false] {
            let mut state = model.make_state(4096, DType::F16);
            if !windowed {
                state.keep_every_position();
            }
            model.forward(&tokens[..1024], &mut state).unwrap();
            let t = std::time::Instant::now();
            for chunk in tokens[1024..].chunks(256) {
                model.forward(chunk, &mut state).unwrap();
            }
            println!(
                "round {round} windowed {windowed}: {:.0} ms for 2048 tokens after 1024",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}
