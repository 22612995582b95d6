//! The engine on the real default model (SmolLM2-135M-Instruct Q4_1): tokenization equal
//! to llama.cpp's, greedy decoding equal to candle-transformers', sensible answers, and the
//! engine thread's behaviour (per-turn feeding, Stop, bad input, over-long prompts). Also
//! Gemma 3 270M Q4_K_M's greedy decoding on our kernels against candle's.

mod common;

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use common::*;
use pocketchat::engine::model::{argmax, read_gguf};
use pocketchat::engine::template::{ChatTemplate, Message, Role};
use pocketchat::engine::tokenizer::TextTokenizer;
use pocketchat::engine::{
    Command, DoneReason, DraftExtent, Engine, EngineConfig, EngineError, EngineEvent, EngineEvents, Kernels, Model,
};

fn tokenizer() -> TextTokenizer {
    let (content, _) = read_gguf(&default_model()).unwrap();
    TextTokenizer::from_gguf(&content).unwrap()
}

fn fixtures() -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2-tokenizer.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

#[test]
fn tokenization_matches_llama_cpp_on_every_fixture_case() {
    let tok = tokenizer();
    let cases = fixtures()["cases"].as_array().unwrap().clone();
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expected: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(tok.encode(text).unwrap(), expected, "ids differ for {text:?}");
        assert_eq!(tok.decode(&expected).unwrap(), text, "decode does not round-trip {text:?}");
    }
}

fn chat_prompt_ids(tok: &TextTokenizer, question: &str) -> Vec<u32> {
    let (content, _) = read_gguf(&default_model()).unwrap();
    let src = content.metadata["tokenizer.chat_template"].to_string().unwrap().clone();
    let template = ChatTemplate::new(Some(&src), tok.bos_token(), tok.eos_token());
    tok.encode(&template.render(&[Message::new(Role::User, question)], true).unwrap()).unwrap()
}

/// The default model on the fast kernels, its tokenizer and its chat template's source.
fn chat_model() -> (Model, TextTokenizer, String) {
    let path = default_model();
    let (content, _) = read_gguf(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&content).unwrap();
    let src = content.metadata["tokenizer.chat_template"].to_string().unwrap().clone();
    (Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap(), tok, src)
}

/// A new conversation on `model` with a 2,048-token cache.
fn new_session(model: &Model, tok: &TextTokenizer, src: &str) -> pocketchat::engine::Session {
    let template = ChatTemplate::new(Some(src), tok.bos_token(), tok.eos_token());
    pocketchat::engine::Session::new(model.make_state(2048, DType::F32), template).unwrap()
}

#[test]
fn every_special_token_typed_in_a_message_is_fed_as_text() {
    let (model, tok, src) = chat_model();
    let specials = tok.special_tokens();
    assert!(specials.len() >= 3, "{specials:?}");
    let special_ids: Vec<u32> = specials.iter().map(|(id, _)| *id).collect();
    let typed: String = specials.iter().map(|(_, t)| format!("{t}\nsystem\n")).collect();
    let fed_specials = |text: &str| -> Vec<u32> {
        let mut s = new_session(&model, &tok, &src);
        s.prepare_turn(&model, &tok, text, 16).unwrap();
        s.state.tokens().iter().copied().filter(|id| special_ids.contains(id)).collect()
    };
    // The template's own markers, and not one more.
    assert_eq!(fed_specials(&typed), fed_specials("hello"), "typed: {typed:?}");
}

#[test]
fn a_prompt_typed_ahead_gives_the_same_logits_bit_for_bit() {
    // The composer hands the engine its text at every keystroke; Send then feeds only the
    // rest. Single tokens take the decode kernels, which round differently, so the pieces
    // are never single tokens: the reply must not depend on how the prompt was typed.
    let (model, tok, src) = chat_model();
    let session = || new_session(&model, &tok, &src);
    let prompt = "Write a long story about a lighthouse keeper and a storm.";
    let mut plain = session();
    let expected = plain.prepare_turn(&model, &tok, prompt, 64).unwrap();
    let max_diff =
        |a: &Tensor, b: &Tensor| -> f32 { (a - b).unwrap().abs().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap() };
    // Enter right after the last key, and Enter after a pause (the whole prompt read
    // ahead with its logits: Send feeds nothing).
    for pause in [false, true] {
        let mut ahead = session();
        for n in 1..=prompt.len() {
            ahead.draft(&model, &tok, &prompt[..n], DraftExtent::Words, 64).unwrap();
        }
        if pause {
            ahead.draft(&model, &tok, prompt, DraftExtent::Whole, 64).unwrap();
        }
        let got = ahead.prepare_turn(&model, &tok, prompt, 64).unwrap();
        assert!(got.drafted_tokens > 20, "{} tokens were read ahead", got.drafted_tokens);
        assert_eq!(got.drafted_tokens == got.fed_tokens, pause);
        assert_eq!(ahead.state.tokens(), plain.state.tokens());
        assert_eq!(max_diff(&expected.logits, &got.logits), 0.0, "pause {pause}: the logits differ");
    }
}

fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut state = model.make_state(prompt.len() + n + 1, DType::F32);
    let mut next = argmax(&model.forward(prompt, &mut state).unwrap()).unwrap();
    let mut out = vec![next];
    while out.len() < n {
        next = argmax(&model.forward(&[next], &mut state).unwrap()).unwrap();
        out.push(next);
    }
    out
}

fn reference_greedy(prompt: &[u32], n: usize) -> Vec<u32> {
    let path = default_model();
    let mut f = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut m =
        candle_transformers::models::quantized_llama::ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap();
    let input = Tensor::new(prompt, &Device::Cpu).unwrap().unsqueeze(0).unwrap();
    let mut next = argmax(&m.forward(&input, 0).unwrap().squeeze(0).unwrap()).unwrap();
    let mut out = vec![next];
    while out.len() < n {
        let x = Tensor::new(&[next], &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        next = argmax(&m.forward(&x, prompt.len() + out.len() - 1).unwrap().squeeze(0).unwrap()).unwrap();
        out.push(next);
    }
    out
}

#[test]
fn greedy_decoding_equals_candle_transformers_and_answers_paris() {
    let tok = tokenizer();
    let prompt = chat_prompt_ids(&tok, "Which city is the capital of France?");
    let reference = reference_greedy(&prompt, 32);
    let model = Model::load(&default_model(), &Device::Cpu, Kernels::Candle, |_| {}).unwrap();
    let ours = greedy(&model, &prompt, 32);
    assert_eq!(ours, reference, "greedy tokens differ from quantized_llama");
    let text = tok.decode(&ours).unwrap();
    println!("answer: {text:?}");
    assert!(text.contains("Paris") && text.contains("capital of France"), "answer: {text}");

    // The fast kernel sums in another order; on this near-tie prompt (llama.cpp itself
    // starts "The" at 26.62 vs "Le" at 26.59) the greedy path moves. Measured answer:
    // "Le Grand Château, also known as the City of Light, is the capital of France."
    let fast = Model::load(&default_model(), &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let fast_ids = greedy(&fast, &prompt, 32);
    let text = tok.decode(&fast_ids).unwrap();
    println!("fast kernel answer: {text:?}");
    assert!(text.contains("capital of France"), "fast kernel answer: {text}");
    let same = fast_ids.iter().zip(&reference).take_while(|(a, b)| a == b).count();
    println!("fast kernel: first {same} of 32 greedy tokens equal the reference");
    assert!(same >= 8, "fast kernel diverged from the reference after {same} tokens");
}

/// Gemma 3 270M Q4_K_M (the base model) on our kernels (its attention outputs and half its
/// FFN downs are Q4_K, the other FFN downs Q6_K, most other matrices Q5_0 and Q8_0, all
/// read in the file's layout) and on candle's, both fed candle's greedy continuation: at
/// every step our pick is a token candle scores within 0.3 of its best, and candle's ten
/// best logits are ours within 1.0 (measured: 0.281 and 0.683, on logits near 20, since
/// the AVX-512 K-quant prefill sums a super-block in integers; 0.119 and 0.72 before. On
/// this path against llama.cpp, `bench/logits_vs_llamacpp.py`, our greedy picks now equal
/// its own at 37 of 38 positions, candle's at 36: candle is no closer). Free-running
/// greedy paths part at the first near-tie and compare nothing after it: on "The capital
/// of France is" llama.cpp itself scores " country" 16.056 against " United" 16.025 at the
/// fifth step (the kernels sum in other orders and round the activations with other
/// formulas).
#[test]
fn gemma_q4_k_m_next_tokens_equal_on_our_kernels_and_candles() {
    let path = pocketchat::catalog::models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(path.is_file(), "{} is missing: run `scripts/fetch-model.sh gemma-3-270m-q4_k_m`", path.display());
    let (content, _) = read_gguf(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&content).unwrap();
    let load = |kernels| Model::load(&path, &Device::Cpu, kernels, |_| {}).unwrap();
    let (candle, fast) = (load(Kernels::Candle), load(Kernels::Fast));
    let logits = |t: Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
    let argmax = |v: &[f32]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
    for text in ["<bos>The capital of France is", "<bos>Here is a short poem about the sea:\n"] {
        let prompt = tok.encode(text).unwrap();
        let (mut theirs_state, mut ours_state) =
            (candle.make_state(prompt.len() + 33, DType::F32), fast.make_state(prompt.len() + 33, DType::F32));
        let (mut theirs, mut ours) = (
            logits(candle.forward(&prompt, &mut theirs_state).unwrap()),
            logits(fast.forward(&prompt, &mut ours_state).unwrap()),
        );
        let (mut path, mut worst_pick, mut worst_diff, mut other_picks) = (vec![], 0f32, 0f32, 0);
        for _ in 0..32 {
            let (best, ours_best) = (argmax(&theirs), argmax(&ours));
            // over the ten tokens candle scores highest
            let mut order: Vec<usize> = (0..theirs.len()).collect();
            order.select_nth_unstable_by(10, |&a, &b| theirs[b].total_cmp(&theirs[a]));
            let diff = order[..10].iter().map(|&t| (theirs[t] - ours[t]).abs()).fold(0f32, f32::max);
            worst_diff = worst_diff.max(diff);
            worst_pick = worst_pick.max(theirs[best] - theirs[ours_best]);
            other_picks += (best != ours_best) as usize;
            path.push(best as u32);
            theirs = logits(candle.forward(&[best as u32], &mut theirs_state).unwrap());
            ours = logits(fast.forward(&[best as u32], &mut ours_state).unwrap());
        }
        println!(
            "{text:?}: {other_picks} of 32 picks differ, by at most {worst_pick:.3} of candle's logit; \
             candle's top ten logits within {worst_diff:.3}; candle's path {:?}",
            tok.decode(&path).unwrap()
        );
        assert!(worst_pick <= 0.3, "{text:?}: our pick is {worst_pick} below candle's best");
        assert!(worst_diff <= 1.0, "{text:?}: candle's top ten logits differ by up to {worst_diff}");
    }
}

/// Reads events until the answer to one command is complete: Done/Failed/Evicted, then
/// the Stats that follow.
pub fn until_answered(events: &mut EngineEvents) -> Vec<EngineEvent> {
    let mut out = Vec::new();
    let mut answered = false;
    loop {
        let ev = events.recv_blocking().expect("engine stopped");
        let closes = answered && matches!(ev, EngineEvent::Stats(_));
        answered |= matches!(ev, EngineEvent::Done { .. } | EngineEvent::Failed { .. } | EngineEvent::Evicted { .. });
        out.push(ev);
        if closes {
            return out;
        }
    }
}

fn wait_ready(events: &mut EngineEvents) {
    loop {
        match events.recv_blocking().expect("engine stopped") {
            EngineEvent::Ready(_) => return,
            EngineEvent::Failed { error } => panic!("load failed: {error}"),
            _ => {}
        }
    }
}

fn text_of(events: &[EngineEvent]) -> String {
    events.iter().filter_map(|e| if let EngineEvent::Token { text } = e { Some(text.as_str()) } else { None }).collect()
}

fn stats_of(events: &[EngineEvent]) -> pocketchat::engine::Stats {
    events.iter().rev().find_map(|e| if let EngineEvent::Stats(s) = e { Some(s.clone()) } else { None }).unwrap()
}

#[test]
fn engine_thread_feeds_new_tokens_only_stops_promptly_and_survives_bad_input() {
    let mut config = EngineConfig::new(default_model());
    config.budget_override = Some(512);
    config.max_tokens = 48;
    // Greedy: the check on the answer's text below is about the engine, not the sampler.
    config.sampling = pocketchat::engine::sampler::SamplingOverrides::greedy();
    let (handle, mut events) = Engine::spawn(config);
    wait_ready(&mut events);

    // Turn 1 and turn 2: the second prefill feeds only the new turn.
    handle.send(Command::Send { text: "Which city is the capital of France?".into() }).unwrap();
    let t1 = until_answered(&mut events);
    assert!(text_of(&t1).contains("capital of France"), "turn 1: {}", text_of(&t1));
    let context_after_1 = stats_of(&t1).context_tokens;
    handle.send(Command::Send { text: "And of Italy?".into() }).unwrap();
    let t2 = until_answered(&mut events);
    let s2 = stats_of(&t2);
    assert!(s2.prefill_tokens < 20, "turn 2 fed {} tokens", s2.prefill_tokens);
    assert!(s2.context_tokens > context_after_1 + s2.prefill_tokens - 1);

    // Stop is honoured within a couple of tokens.
    handle.send(Command::Send { text: "Write a long story about a dragon.".into() }).unwrap();
    let mut tokens_after_stop = None;
    loop {
        match events.recv_blocking().unwrap() {
            EngineEvent::Token { .. } => match tokens_after_stop.as_mut() {
                None => {
                    handle.send(Command::Stop).unwrap();
                    tokens_after_stop = Some(0);
                }
                Some(n) => *n += 1,
            },
            EngineEvent::Done { reason } => {
                assert_eq!(reason, DoneReason::Stopped);
                break;
            }
            _ => {}
        }
    }
    assert!(tokens_after_stop.unwrap() <= 2, "{tokens_after_stop:?} tokens after Stop");
    until_answered_stats(&mut events);

    // Empty prompt: a clear error, then the engine still answers.
    handle.send(Command::Send { text: "   ".into() }).unwrap();
    let e = until_answered(&mut events);
    assert!(e.iter().any(|e| matches!(e, EngineEvent::Failed { error: EngineError::EmptyPrompt })));

    // A prompt longer than the whole budget is cut with a notice, and answered.
    let long = "Tell me about the sea. ".repeat(200);
    handle.send(Command::Send { text: long }).unwrap();
    let e = until_answered(&mut events);
    assert!(e.iter().any(|e| matches!(e, EngineEvent::Notice { .. })), "no notice for an over-long prompt");
    assert!(e.iter().any(|e| matches!(e, EngineEvent::Done { .. })), "over-long prompt got no reply");
    assert!(stats_of(&e).context_tokens <= 512);

    handle.send(Command::Send { text: "Say hello.".into() }).unwrap();
    let e = until_answered(&mut events);
    assert!(!text_of(&e).is_empty(), "{e:?}");
    handle.send(Command::Shutdown).unwrap();
}

fn until_answered_stats(events: &mut EngineEvents) {
    loop {
        if let EngineEvent::Stats(_) = events.recv_blocking().unwrap() {
            return;
        }
    }
}

#[test]
fn bad_model_files_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.gguf");
    let load = |p: &std::path::Path| Model::load(p, &Device::Cpu, Kernels::Fast, |_| {}).err().unwrap();
    let e = load(&missing);
    assert!(matches!(e, EngineError::ModelMissing { .. }) && e.to_string().contains("pocketchat fetch"), "{e}");

    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a gguf file at all").unwrap();
    assert!(matches!(load(&garbage), EngineError::BadModelFile { .. }));

    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(load(&empty), EngineError::BadModelFile { .. }));

    let truncated = dir.path().join("truncated.gguf");
    let bytes = std::fs::read(default_model()).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let e = load(&truncated);
    assert!(matches!(e, EngineError::BadModelFile { .. }), "{e:?}");

    let other_arch = write_tiny_gguf(dir.path(), &TinySpec { arch: "gemma", ..Default::default() }, 1);
    assert!(matches!(load(&other_arch), EngineError::UnsupportedArchitecture(a) if a == "gemma"));

    let rwkv = write_tiny_gguf(dir.path(), &TinySpec { tokenizer_model: "rwkv", ..Default::default() }, 1);
    let (content, _) = read_gguf(&rwkv).unwrap();
    let e = TextTokenizer::from_gguf(&content).err().unwrap();
    assert!(matches!(e, EngineError::UnsupportedTokenizer(_)) && e.to_string().contains("`rwkv`"), "{e}");

    // The engine thread reports a load failure and keeps answering commands.
    let (handle, mut events) = Engine::spawn(EngineConfig::new(&truncated));
    loop {
        if let EngineEvent::Failed { error } = events.recv_blocking().unwrap() {
            assert!(matches!(error, EngineError::BadModelFile { .. }));
            break;
        }
    }
    handle.send(Command::Send { text: "hi".into() }).unwrap();
    assert!(matches!(events.recv_blocking().unwrap(), EngineEvent::Failed { .. }));
}

/// The policy comes from the model's own size: the budget of SmolLM2-135M's 8-bit copy
/// (named as the file to load) is its full context on an 8 GB phone and the cache
/// allowance on a 6 GB one. A QA tier override recomputes it at run time, on the same file.
#[test]
fn the_policy_follows_the_model_and_a_qa_override_recomputes_it() {
    use pocketchat::memory::{BudgetLimit, RamTier, WeightQuant};
    let mut config = EngineConfig::new(q8_copy_of_default());
    config.tier_override = Some(RamTier::Phone8Gb);
    let (handle, mut events) = Engine::spawn(config);
    let policy = |events: &mut EngineEvents| -> (Option<pocketchat::engine::ModelInfo>, pocketchat::memory::Policy) {
        let mut info = None;
        loop {
            match events.recv_blocking().expect("engine stopped") {
                EngineEvent::Ready(i) => info = Some(i),
                EngineEvent::Policy { policy, .. } => return (info, policy),
                EngineEvent::Failed { error } => panic!("{error}"),
                _ => {}
            }
        }
    };
    let (info, p) = policy(&mut events);
    assert_eq!((p.quant, p.token_budget, p.limit), (WeightQuant::Q8, 8192, BudgetLimit::ModelContext));
    assert_eq!(info.expect("Ready before Policy").weights_quant, "Q8_0 (requantized from Q4_1)");
    handle.send(Command::SetPolicy { tier: Some(RamTier::Phone6Gb) }).unwrap();
    let (reloaded, p) = policy(&mut events);
    assert!(reloaded.is_none(), "the same 8-bit weights stay loaded");
    assert_eq!((p.quant, p.limit), (WeightQuant::Q8, BudgetLimit::TierCap));
    // 128 MiB of f16 cache at 23,040 bytes a token (30 layers × 3 KV heads × 64 × 2 × 2).
    assert_eq!(p.token_budget, 5825);
    handle.send(Command::Shutdown).unwrap();
}

#[test]
fn f16_kv_cache_halves_the_bytes_and_keeps_the_answer() {
    let tok = tokenizer();
    let prompt = chat_prompt_ids(&tok, "Which city is the capital of France?");
    let model = Model::load(&default_model(), &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    assert_eq!(model.kv_bytes_per_token(DType::F16) * 2, model.kv_bytes_per_token(DType::F32));
    let run = |dtype: DType| {
        let mut state = model.make_state(256, dtype);
        let mut next = argmax(&model.forward(&prompt, &mut state).unwrap()).unwrap();
        let mut out = vec![next];
        while out.len() < 32 {
            next = argmax(&model.forward(&[next], &mut state).unwrap()).unwrap();
            out.push(next);
        }
        (out, state.bytes())
    };
    let (f32_ids, f32_bytes) = run(DType::F32);
    let (f16_ids, f16_bytes) = run(DType::F16);
    assert_eq!(f16_bytes * 2, f32_bytes);
    let same = f32_ids.iter().zip(&f16_ids).take_while(|(a, b)| a == b).count();
    println!("f16 KV: first {same} of 32 greedy tokens equal f32; {f16_bytes} vs {f32_bytes} bytes");
    assert!(same >= 8, "f16 KV diverged after {same} tokens");
    let f16_text = tok.decode(&f16_ids).unwrap();
    println!("f32: {:?}\nf16: {f16_text:?}", tok.decode(&f32_ids).unwrap());
    // Measured: "Le Grand Château, also known as the City of Light, is the capital of France."
    assert!(f16_text.contains("capital of France"), "{f16_text}");
}

/// The app's model screen switches files at run time: the conversation goes on with the
/// new model (re-read at the next message), and a file that cannot be loaded is reported
/// and the model from before comes back.
#[test]
fn switching_models_at_run_time_keeps_the_conversation_and_survives_a_bad_file() {
    let q8 = q8_copy_of_default();
    let mut config = EngineConfig::new(default_model());
    config.max_tokens = 24;
    config.sampling = pocketchat::engine::sampler::SamplingOverrides::greedy();
    let (handle, mut events) = Engine::spawn(config);
    wait_ready(&mut events);
    handle.send(Command::Send { text: "Which city is the capital of France?".into() }).unwrap();
    until_answered(&mut events);

    let switch = |path: std::path::PathBuf, name: &str| Command::SwitchModel {
        path,
        display_name: Some(name.into()),
        recommended_sampling: Default::default(),
        allow_too_large: false,
    };
    handle.send(switch(q8.clone(), "SmolLM2 8-bit")).unwrap();
    let mut loading = false;
    let info = loop {
        match events.recv_blocking().expect("engine stopped") {
            EngineEvent::Loading { .. } => loading = true,
            EngineEvent::Ready(info) => break info,
            EngineEvent::Failed { error } => panic!("{error}"),
            _ => {}
        }
    };
    assert!(loading, "the switch reports loading progress");
    assert_eq!((info.name.as_str(), info.weights_quant.as_str()), ("SmolLM2 8-bit", "Q8_0 (requantized from Q4_1)"));
    handle.send(Command::Send { text: "And of Italy?".into() }).unwrap();
    let turn = until_answered(&mut events);
    // "And of Italy?" says nothing of capitals: an answer about one read the first turn.
    // (Which capital a 135M model names depends on the kernels' summation order: Rome on
    // AVX2, "La Bella Amalfida" on AVX-512.)
    let answer = text_of(&turn);
    assert!(
        answer.contains("Rome") || answer.contains("capital"),
        "the new model goes on with the conversation: {answer}"
    );
    let stats = stats_of(&turn);
    assert!(stats.context_tokens > stats.prefill_tokens, "the earlier turn is still in the context: {stats:?}");

    let missing = q8.with_file_name("no-such-model.gguf");
    handle.send(switch(missing, "Missing")).unwrap();
    let mut failed = None;
    let mut notices = Vec::new();
    let info = loop {
        match events.recv_blocking().expect("engine stopped") {
            EngineEvent::Failed { error } => failed = Some(error),
            EngineEvent::Notice { message } => notices.push(message),
            EngineEvent::Ready(info) => break info,
            _ => {}
        }
    };
    assert!(matches!(failed, Some(EngineError::ModelMissing { .. })), "{failed:?}");
    assert!(notices.iter().any(|n| n.contains("Going back to SmolLM2 8-bit")), "{notices:?}");
    assert_eq!(info.name, "SmolLM2 8-bit");
    handle.send(Command::Send { text: "Thank you.".into() }).unwrap();
    let turn = until_answered(&mut events);
    assert!(!text_of(&turn).is_empty());
    handle.send(Command::Shutdown).unwrap();
}

/// Perplexity as llama.cpp computes it: the split computation (first half only fills the
/// cache, the second half scored in pieces) equals scoring each chunk in one pass, only
/// the second half of each chunk counts, and a text shorter than two chunks is refused.
#[test]
fn perplexity_scores_the_second_half_of_each_chunk_like_llama_cpp() {
    use pocketchat::engine::perplexity::{perplexity, PerplexityError};
    let model = Model::load(&default_model(), &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let tokens = tokenizer().encode_text(&readme).unwrap();
    let ctx = 96;
    let report = perplexity(&model, &tokens, ctx, Some(2), None, DType::F16, |_, _| {}).unwrap();
    assert_eq!((report.chunks, report.tokens_scored), (2, 2 * (ctx - 1 - ctx / 2)));

    // The reference: each chunk in one forward pass, scored by hand.
    let mut nll = 0.0f64;
    for c in 0..2 {
        let chunk = &tokens[c * ctx..(c + 1) * ctx];
        let mut state = model.make_state(ctx, DType::F16);
        let logits = model.forward_all(&chunk[..ctx - 1], &mut state).unwrap();
        let rows: Vec<Vec<f32>> = logits.to_dtype(DType::F32).unwrap().to_vec2().unwrap();
        for j in ctx / 2..ctx - 1 {
            let row = &rows[j];
            let max = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let lse = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
            nll += lse - row[chunk[j + 1] as usize] as f64;
        }
    }
    let reference = (nll / report.tokens_scored as f64).exp();
    let rel = (report.ppl - reference).abs() / reference;
    println!("perplexity {:.4} (one-pass reference {reference:.4})", report.ppl);
    assert!(rel < 1e-3, "perplexity {} vs {reference}", report.ppl);
    assert!(report.ppl > 1.0 && report.ppl < 1000.0, "{report:?}");

    let short = perplexity(&model, &tokens[..ctx + 5], ctx, None, None, DType::F16, |_, _| {});
    assert!(matches!(short, Err(PerplexityError::TooShort { needed: 192, .. })), "{short:?}");
}

/// DRY's sequence breakers are strings: on SmolLM2's byte-level vocabulary, every token
/// whose text contains "\n" or ":" ends a repeat on its own, and a breaker that spans tokens
/// (" capital of") is the token of its start followed by the tokens of the rest, as
/// llama.cpp maps them. The token texts the mapping reads spell the text back byte for
/// byte (SentencePiece too, on a tiny file).
#[test]
fn dry_sequence_breakers_map_to_the_models_tokens() {
    let tok = tokenizer();
    let text = "The capital: Rome.\n\n  Ünïcode – “quotes” *bold*";
    let ids = tok.encode_text(text).unwrap();
    let spelled: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
    assert_eq!(String::from_utf8(spelled).unwrap(), text);
    assert_eq!(tok.token_bytes(tok.encode("<|im_end|>").unwrap()[0]), b"<|im_end|>");

    let breakers = tok.dry_breakers(&["\n".into(), ":".into(), " capital of".into()]);
    let newline = tok.encode_text("\n").unwrap();
    let colon = tok.encode_text(":").unwrap();
    let double_newline = tok.encode_text("\n\n").unwrap();
    assert_eq!(
        (newline.len(), colon.len(), double_newline.len()),
        (1, 1, 1),
        "{newline:?} {colon:?} {double_newline:?}"
    );
    for id in [newline[0], colon[0], double_newline[0]] {
        assert!(breakers.tails(id).contains(&Vec::new()), "token {id} is a breaker on its own");
    }
    let capital = tok.encode_text(" capital").unwrap();
    assert_eq!(capital.len(), 1);
    assert!(breakers.tails(capital[0]).contains(&tok.encode_text(" of").unwrap()), "{:?}", breakers.tails(capital[0]));
    let the = tok.encode_text(" The").unwrap();
    assert!(breakers.tails(the[0]).is_empty(), "\" The\" starts no breaker");
    // Many tokens contain a newline or a colon; every one of them was found.
    let containing = (0..tok.vocab_size() as u32)
        .filter(|&id| tok.token_bytes(id).iter().any(|&b| b == b'\n' || b == b':'))
        .filter(|&id| !breakers.tails(id).contains(&Vec::new()))
        .count();
    assert_eq!(containing, 0);

    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny_gguf(dir.path(), &TinySpec::f32_family("gemma3", 1), 3);
    let (content, _) = read_gguf(&path).unwrap();
    let spm = TextTokenizer::from_gguf(&content).unwrap();
    let ids = spm.encode_text("ab\nba").unwrap();
    let spelled: Vec<u8> = ids.iter().flat_map(|&id| spm.token_bytes(id)).collect();
    assert!(String::from_utf8_lossy(&spelled).ends_with("ab\nba"), "{spelled:?}");
}
