//! Thinking models across turns: a session with the real templates of Qwen3, Qwen3.5 and
//! SmolLM3 (llama.cpp's suite, `scripts/fetch-llamacpp-suite.sh`) on a tiny random-weight
//! file. Qwen3's template drops an earlier reply's thinking, so the next turn's render no
//! longer continues the cache: the session cuts the cache back to the reply's start and
//! feeds the answer again (not the whole chat), and the cache then holds exactly what a
//! fresh read of the chat would. The cost of that on a Qwen3-shaped file is measured by
//! the ignored `thinking_turn_costs_on_a_qwen3_shaped_file` (see docs/models.md).

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device};
use common::*;
use pocketchat::engine::template::{ChatTemplate, Message, Role};
use pocketchat::engine::tokenizer::TextTokenizer;
use pocketchat::engine::{Kernels, Model, Session};

fn suite_template(name: &str, tok: &TextTokenizer) -> ChatTemplate {
    let dir = std::env::var_os("POCKETCHAT_LLAMACPP_SUITE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/llamacpp-suite"));
    let path = dir.join("templates").join(name);
    let source = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-llamacpp-suite.sh)", path.display()));
    ChatTemplate::parse(&source, tok.bos_token(), tok.eos_token()).unwrap()
}

fn tiny(dir: &Path) -> (Model, TextTokenizer) {
    let path = write_tiny_gguf(dir, &TinySpec::default(), 5);
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let (content, _) = pocketchat::engine::model::read_gguf(&path).unwrap();
    (model, TextTokenizer::from_gguf(&content).unwrap())
}

/// Ends the turn with `reply` as the engine does: its tokens enter the cache as
/// generated, its text is recorded.
fn reply_with(s: &mut Session, model: &Model, tok: &TextTokenizer, reply: &str) {
    model.forward(&tok.encode(reply).unwrap(), &mut s.state).unwrap();
    s.finish_reply(reply);
}

/// The tokens a fresh read of the session's conversation with `next` as the next message
/// gives: what the cache must hold once that turn is fed.
fn fresh_read(template: &ChatTemplate, tok: &TextTokenizer, s: &Session, next: &str) -> Vec<u32> {
    let mut messages = s.messages().to_vec();
    messages.push(Message::new(Role::User, next));
    let r = template.render_marked(&messages, true).unwrap();
    tok.encode_rendered(&r.text, 0..r.text.len(), &r.bodies).unwrap()
}

#[test]
fn qwen3_drops_the_last_replys_thinking_and_feeds_only_its_answer_again() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let template = || suite_template("Qwen-Qwen3-0.6B.jinja", &tok);
    let mut s = Session::new(model.make_state(512, DType::F32), template()).unwrap();
    s.prepare_turn(&model, &tok, "is 91 prime", 16).unwrap();
    assert!(!s.reply_opens_thinking());
    reply_with(&mut s, &model, &tok, "<think>\ntry 7 times 13\n</think>\n\nno, 7 times 13");
    let last = s.messages().last().unwrap();
    assert_eq!((last.content.as_str(), last.thinking.as_deref()), ("no, 7 times 13", Some("try 7 times 13")));
    let with_thinking = s.len();

    let expected = fresh_read(&template(), &tok, &s, "and 93");
    let p = s.prepare_turn(&model, &tok, "and 93", 16).unwrap();
    assert_eq!(s.state.tokens(), expected, "the cache is what a fresh read of the chat gives");
    // Only the answer (and the turn's close) was fed again, not the chat.
    assert_eq!(p.refed_tokens, tok.encode("no, 7 times 13<|im_end|>\n").unwrap().len());
    assert!(s.len() < with_thinking + p.fed_tokens - p.refed_tokens, "the thinking left the cache");

    // The next turn goes on the same way; turns that lost their thinking stay as they are.
    reply_with(&mut s, &model, &tok, "<think>\n3 divides it\n</think>\n\nno");
    let expected = fresh_read(&template(), &tok, &s, "thanks");
    let p = s.prepare_turn(&model, &tok, "thanks", 16).unwrap();
    assert_eq!(s.state.tokens(), expected);
    assert_eq!(p.refed_tokens, tok.encode("no<|im_end|>\n").unwrap().len());
    assert_eq!(s.turn_lengths().len(), 3);
}

#[test]
fn the_answer_is_fed_again_while_the_next_message_is_typed() {
    use pocketchat::engine::DraftExtent;
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let template = || suite_template("Qwen-Qwen3-0.6B.jinja", &tok);
    let mut s = Session::new(model.make_state(512, DType::F32), template()).unwrap();
    s.prepare_turn(&model, &tok, "is 91 prime", 16).unwrap();
    reply_with(
        &mut s,
        &model,
        &tok,
        "<think>
try 7
</think>

no",
    );
    let expected = fresh_read(&template(), &tok, &s, "and 93");
    s.draft(&model, &tok, "and 93", DraftExtent::Whole, 16).unwrap();
    let p = s.prepare_turn(&model, &tok, "and 93", 16).unwrap();
    assert_eq!(p.refed_tokens, 0, "fed while typing");
    assert_eq!(p.drafted_tokens, p.fed_tokens, "the whole turn was read ahead");
    assert_eq!(s.state.tokens(), expected);
}

#[test]
fn qwen3_with_thinking_off_feeds_only_the_last_answer_again() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let mut off = suite_template("Qwen-Qwen3-0.6B.jinja", &tok);
    off.set_enable_thinking(Some(false));
    let mut s = Session::new(model.make_state(512, DType::F32), suite_template("Qwen-Qwen3-0.6B.jinja", &tok)).unwrap();
    s.set_enable_thinking(Some(false));
    s.prepare_turn(&model, &tok, "hello", 16).unwrap();
    // The generation prompt's empty block is closed: the reply is all answer.
    assert!(!s.reply_opens_thinking());
    reply_with(&mut s, &model, &tok, "hi there");
    assert_eq!(s.messages().last().unwrap().thinking, None);
    // The finished reply renders without the empty block: the cache goes back to where
    // the answer starts in the new render and only the answer is fed again.
    let expected = fresh_read(&off, &tok, &s, "how are you");
    let p = s.prepare_turn(&model, &tok, "how are you", 16).unwrap();
    assert_eq!(s.state.tokens(), expected);
    assert_eq!(p.refed_tokens, tok.encode("hi there<|im_end|>\n").unwrap().len());
    // And again at the next turn (the turn cut into keeps its anchor: trimming and
    // editing still see three turns).
    reply_with(&mut s, &model, &tok, "fine");
    let expected = fresh_read(&off, &tok, &s, "good");
    let p = s.prepare_turn(&model, &tok, "good", 16).unwrap();
    assert_eq!(s.state.tokens(), expected);
    assert_eq!(p.refed_tokens, tok.encode("fine<|im_end|>\n").unwrap().len());
    assert_eq!(s.turn_lengths().len(), 3);
}

#[test]
fn qwen35_opens_the_thinking_in_its_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let mut s = Session::new(model.make_state(512, DType::F32), suite_template("Qwen3.5-4B.jinja", &tok)).unwrap();
    s.prepare_turn(&model, &tok, "hello", 16).unwrap();
    assert!(s.reply_opens_thinking(), "the generation prompt ends in <think>");
    reply_with(&mut s, &model, &tok, "greet back\n</think>\n\nhi");
    let last = s.messages().last().unwrap();
    assert_eq!((last.content.as_str(), last.thinking.as_deref()), ("hi", Some("greet back")));
    let expected = fresh_read(&suite_template("Qwen3.5-4B.jinja", &tok), &tok, &s, "bye");
    s.prepare_turn(&model, &tok, "bye", 16).unwrap();
    assert_eq!(s.state.tokens(), expected);
    // With thinking off the block is closed in the prompt.
    s.set_enable_thinking(Some(false));
    reply_with(&mut s, &model, &tok, "bye");
    s.prepare_turn(&model, &tok, "again", 16).unwrap();
    assert!(!s.reply_opens_thinking());
}

#[test]
fn smollm3_keeps_the_reply_as_written_and_continues_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let template = || suite_template("HuggingFaceTB-SmolLM3-3B.jinja", &tok);
    let mut s = Session::new(model.make_state(512, DType::F32), template()).unwrap();
    // A short system prompt of its own (the default one is long for a byte-level vocabulary).
    s.set_history(vec![Message::new(Role::System, "Be brief.")]);
    s.prepare_turn(&model, &tok, "hello", 16).unwrap();
    reply_with(&mut s, &model, &tok, "<think>\ngreet\n</think>\n\nhi");
    assert_eq!(s.messages().last().unwrap().thinking.as_deref(), Some("greet"));
    // Its template reads no `reasoning_content`: the reply is given as written, which it
    // keeps in the history, so the cache is continued as it is.
    let p = s.prepare_turn(&model, &tok, "bye", 16).unwrap();
    assert_eq!(p.refed_tokens, 0);
    let expected = fresh_read(&template(), &tok, &s, "bye");
    assert!(expected.len() > s.len(), "expected holds the next message again");
}

/// The engine thread on a tiny file carrying Qwen3.5's template, whose generation prompt
/// opens the thinking: the reply streams as `Thinking` (no answer: random weights never
/// close it), its tokens are counted as thinking, and the switch turned off closes the
/// block in the prompt, so the next reply is all answer.
#[test]
fn the_engine_streams_a_reply_that_starts_inside_its_thinking() {
    use candle_core::quantized::gguf_file::Value;
    use pocketchat::engine::{Command, Engine, EngineConfig, EngineEvent, EngineEvents, Stats};
    let dir = tempfile::tempdir().unwrap();
    let source = std::fs::read_to_string(
        std::env::var_os("POCKETCHAT_LLAMACPP_SUITE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/llamacpp-suite"))
            .join("templates/Qwen3.5-4B.jinja"),
    )
    .unwrap();
    let spec = TinySpec {
        meta_overrides: vec![("tokenizer.chat_template".into(), Value::String(source))],
        ..Default::default()
    };
    let mut config = EngineConfig::new(write_tiny_gguf(dir.path(), &spec, 11));
    config.max_tokens = 8;
    config.budget_override = Some(256);
    config.headroom = std::sync::Arc::new(|| None);
    config.threads = Some(1);
    let (handle, mut events) = Engine::spawn(config);
    let next = |events: &mut EngineEvents| events.recv_blocking().expect("the engine thread is running");
    loop {
        match next(&mut events) {
            EngineEvent::Ready(info) => break assert_eq!(info.thinking, Some(true), "Qwen3.5 thinks by default"),
            EngineEvent::Failed { error } => panic!("{error}"),
            _ => {}
        }
    }
    // One reply: (thinking, answer, the stats after it).
    let mut turn = |text: &str| {
        handle.send(Command::Send { text: text.into() }).unwrap();
        let (mut thinking, mut answer) = (String::new(), String::new());
        loop {
            match next(&mut events) {
                EngineEvent::Thinking { text } => thinking.push_str(&text),
                EngineEvent::Token { text } => answer.push_str(&text),
                EngineEvent::Done { .. } => break,
                EngineEvent::Failed { error } => panic!("{error}"),
                _ => {}
            }
        }
        let stats: Stats = loop {
            if let EngineEvent::Stats(s) = next(&mut events) {
                break s;
            }
        };
        (thinking, answer, stats)
    };
    let (thinking, answer, stats) = turn("hello");
    assert!(!thinking.is_empty() && answer.is_empty(), "{thinking:?} / {answer:?}");
    assert_eq!((stats.generated_tokens, stats.thinking_tokens), (8, 8));

    handle.send(Command::SetThinking { enabled: Some(false) }).unwrap();
    let (thinking, answer, stats) = turn("again");
    assert!(thinking.is_empty() && !answer.is_empty(), "{thinking:?} / {answer:?}");
    assert_eq!(stats.thinking_tokens, 0);
    handle.send(Command::Shutdown).unwrap();
    while events.recv_blocking().is_some() {}
}

/// Turn costs on a file shaped like Qwen3 0.6B (real vocabulary and template, random
/// weights: `python3 bench/shaped_model.py qwen3-0.6b --out /work/shaped`): a chat of
/// replies that think, fed (a) as the session does (the last answer fed again), (b) read
/// again from its text every turn (what the session did before: the render did not
/// continue the cache), (c) kept as generated (nothing fed again, the thinking stays in
/// the cache). Prints one line per turn.
///
///     POCKETCHAT_QWEN3_SHAPED=/work/shaped/Qwen3-0.6B-shaped.Q4_K_M.gguf \
///       cargo test --release --no-default-features --test thinking_turns -- --ignored --nocapture
#[test]
#[ignore = "needs the Qwen3-shaped file; prints figures"]
fn thinking_turn_costs_on_a_qwen3_shaped_file() {
    let path = std::env::var_os("POCKETCHAT_QWEN3_SHAPED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/shaped/Qwen3-0.6B-shaped.Q4_K_M.gguf"));
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let (content, _) = pocketchat::engine::model::read_gguf(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&content).unwrap();
    let template = || ChatTemplate::for_model(&content, &tok);
    let thinking: String = (0..40).map(|i| format!("step {i}: check the sum again. ")).collect();
    let answer: String = (0..20).map(|i| format!("Point {i} holds. ")).collect();
    let reply = format!("<think>\n{thinking}\n</think>\n\n{answer}");
    println!(
        "reply: {} tokens ({} thinking)",
        tok.encode(&reply).unwrap().len(),
        tok.encode(&format!("<think>\n{thinking}\n</think>")).unwrap().len()
    );
    let mut sessions: Vec<Session> =
        (0..2).map(|_| Session::new(model.make_state(4096, DType::F32), template()).unwrap()).collect();
    let reply_tokens = tok.encode(&reply).unwrap().len();
    let close = tok.encode("<|im_end|>\n").unwrap().len();
    // (c) keeps every reply as generated: each turn feeds the close of the last reply and
    // its own prompt, which is (a)'s feed less what (a) feeds again.
    let mut kept_cache = 0;
    println!("turn | (a) refed fed ms cache | (b) fed ms cache | (c) fed cache");
    for turn in 0..6 {
        let prompt = format!("Question {turn}: is the sum of the first {turn} odd numbers a square?");
        let mut line = format!("{turn}");
        for (i, s) in sessions.iter_mut().enumerate() {
            if i == 1 {
                s.set_history(s.messages().to_vec());
            }
            let started = Instant::now();
            let p = s.prepare_turn(&model, &tok, &prompt, 512).unwrap();
            let ms = started.elapsed().as_secs_f64() * 1e3;
            match i {
                0 => line += &format!(" | {} {} {ms:.0} {}", p.refed_tokens, p.fed_tokens, s.len()),
                _ => line += &format!(" | {} {ms:.0} {}", p.fed_tokens, s.len()),
            }
            if i == 0 {
                let fed = p.fed_tokens - p.refed_tokens + if turn > 0 { close } else { 0 };
                kept_cache += fed;
                line += &format!(" | (c) {fed} {kept_cache}");
                kept_cache += reply_tokens;
            }
            reply_with(s, &model, &tok, &reply);
        }
        println!("{line}");
    }
}
