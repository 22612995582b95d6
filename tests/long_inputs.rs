//! Inputs far over the budget on a tiny random-weight model written by the test: a chat
//! history of 60,000 messages read again without its cache, a pasted line of megabytes
//! with no spaces, and a system prompt longer than the budget.

mod common;

use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use candle_core::{DType, Device};
use common::*;
use pocketchat::engine::template::{builtin_for, ChatTemplate, Message, Role};
use pocketchat::engine::tokenizer::TextTokenizer;
use pocketchat::engine::{DraftExtent, EngineError, Kernels, Model, Session};

/// One test at a time: one of them measures the process's peak RSS.
static SERIAL: Mutex<()> = Mutex::new(());

const BUDGET: usize = 512;
const RESERVE: usize = 16;

/// The tiny llama file (BPE vocabulary, ChatML turns) and the tiny gemma3 one
/// (SentencePiece, Gemma's turns, where a system message is a user turn).
const FAMILIES: [&str; 2] = ["llama", "gemma3"];

fn model(dir: &std::path::Path, family: &'static str) -> (Model, TextTokenizer) {
    let spec = if family == "llama" { TinySpec::default() } else { TinySpec::f32_family(family, 2) };
    let path = write_tiny_gguf(dir, &spec, 5);
    let (content, _) = pocketchat::engine::model::read_gguf(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&content).unwrap();
    (Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap(), tok)
}

/// A session with the template the engine would pick for a file without one.
fn session(model: &Model, tok: &TextTokenizer) -> Session {
    let template = ChatTemplate::new(builtin_for(tok), tok.bos_token(), tok.eos_token());
    Session::new(model.make_state(BUDGET, DType::F32), template).unwrap()
}

/// A system prompt and `turns` turns of unequal lengths.
fn history(turns: usize) -> Vec<Message> {
    let mut messages = vec![Message::new(Role::System, "You answer briefly.")];
    for i in 0..turns {
        messages.push(Message::new(Role::User, format!("question {i}{}", " and more".repeat(i % 7))));
        messages.push(Message::new(Role::Assistant, format!("answer {i}{}", " indeed".repeat(i % 5))));
    }
    messages
}

/// The system prompt and the newest `n` turns of `history`.
fn newest(history: &[Message], n: usize) -> Vec<Message> {
    let mut kept = vec![history[0].clone()];
    kept.extend_from_slice(&history[history.len() - 2 * n..]);
    kept
}

/// Before the fix each turn that did not fit rendered and tokenized the whole history
/// again: 30,000 turns took hours. Now the turns are counted from the newest end, so
/// the work follows the budget; the deadline only says whether it ends at all. The
/// turns kept are as many as fit: the same as when only those (or one more) are given.
#[test]
fn a_history_of_60000_messages_is_read_again_from_its_newest_end() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let long = history(30_000);
    assert_eq!(long.len(), 60_001);
    for family in FAMILIES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let (tx, rx) = mpsc::channel();
        // A thread of its own, so that the deadline ends the test even if it never ends.
        let history = long.clone();
        std::thread::spawn(move || {
            let (model, tok) = model(&path, family);
            let mut s = session(&model, &tok);
            s.set_history(history);
            // Typing ahead reads the history too.
            s.draft(&model, &tok, "what was the first", DraftExtent::Words, RESERVE).unwrap();
            let p = s.prepare_turn(&model, &tok, "what was the first question?", RESERVE).unwrap();
            let _ = tx.send((s.messages().to_vec(), s.state.tokens().to_vec(), p.prompt_cut_to));
        });
        let (kept, tokens, cut) = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("{family}: no prompt fed 120 s after re-reading 60,000 messages"));
        assert_eq!(cut, None);
        assert!(tokens.len() + RESERVE <= BUDGET);
        let (question, turns) = kept[1..].split_last().unwrap();
        assert_eq!(question.content, "what was the first question?");
        let n = turns.len() / 2;
        assert!(n > 0 && n < 30_000, "{family}: {n} turns kept");
        assert_eq!(&kept[..kept.len() - 1], newest(&long, n), "{family}: the system prompt and the newest turns");

        let (model, tok) = model(dir.path(), family);
        for (given, what) in [(n, "exactly the turns kept"), (n + 1, "one turn more")] {
            let mut s = session(&model, &tok);
            s.set_history(newest(&long, given));
            let p = s.prepare_turn(&model, &tok, "what was the first question?", RESERVE).unwrap();
            assert_eq!(s.messages(), kept, "{family}: given {what}");
            assert_eq!(s.state.tokens(), tokens, "{family}: given {what}");
            assert_eq!(p.fed_tokens, tokens.len());
            assert_eq!(p.prompt_cut_to, None, "{family}: given {what}");
        }
    }
}

/// ChatML with a note before the first message after the system prompt: a turn renders
/// longer when it is the oldest one kept. Still the most turns that fit are kept, and
/// the question whole. (Gemma's turns, above, are the case where the count read off an
/// overflowing render is one short and the search must find the last turn.)
const NOTE_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% if loop.index0 == 1 %}(Earlier messages of this conversation were left out to fit the budget; it goes on from here, and the reply follows the newest message, in the same tone, with the same names, keeping to what was said below and never to what was left out.) {% endif %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

#[test]
fn the_most_turns_that_fit_are_kept_when_the_oldest_kept_turn_renders_longer() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = model(dir.path(), "llama");
    let session = || {
        let template = ChatTemplate::new(Some(NOTE_TEMPLATE), tok.bos_token(), tok.eos_token());
        Session::new(model.make_state(BUDGET, DType::F32), template).unwrap()
    };
    let long = history(300);
    let question = "what was the first question?";
    let mut s = session();
    s.set_history(long.clone());
    let p = s.prepare_turn(&model, &tok, question, RESERVE).unwrap();
    assert_eq!(p.prompt_cut_to, None, "the question is whole");
    let kept = s.messages().to_vec();
    let n = (kept.len() - 2) / 2;
    assert!(n > 0 && n < 300, "{n} turns kept");
    assert!(s.state.len() + RESERVE <= BUDGET);
    assert_eq!(&kept[..kept.len() - 1], newest(&long, n));
    for given in [n, n + 1] {
        let mut s = session();
        s.set_history(newest(&long, given));
        let p = s.prepare_turn(&model, &tok, question, RESERVE).unwrap();
        assert_eq!(s.messages(), kept, "given {given} turns");
        assert_eq!(p.prompt_cut_to, None, "given {given} turns");
    }
    // One turn more does not fit (its text counted the way the template renders it).
    let mut more = newest(&long, n + 1);
    more.push(Message::new(Role::User, question));
    let rendered = ChatTemplate::new(Some(NOTE_TEMPLATE), "", "").render_marked(&more, true).unwrap();
    let tokens = tok.encode_rendered(&rendered.text, 0..rendered.text.len(), &rendered.bodies).unwrap().len();
    assert!(tokens + RESERVE > BUDGET, "{tokens} tokens for {} turns would have fit", n + 1);
}

/// A 4 MB line with no spaces used to be tokenized whole before it was cut to the
/// budget (hundreds of MB for its tokens); now only an end of it about twice what the
/// budget holds is, also when a chat that holds it is read again.
#[test]
fn a_pasted_line_is_cut_before_it_is_tokenized_whole() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = model(dir.path(), "llama");
    let mut line = String::with_capacity(4 << 20);
    let mut x = 7u64;
    while line.len() < 4 << 20 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        line.push(char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[(x >> 33) as usize % 36]));
    }
    let Some(before) = pocketchat::memory::process::peak_rss_bytes() else {
        eprintln!("no peak RSS on this system: skipped");
        return;
    };
    let mut s = session(&model, &tok);
    // Typed ahead (pasted into the composer) it is not read: it cannot fit.
    assert_eq!(s.draft(&model, &tok, &line, DraftExtent::Whole, RESERVE).unwrap().fed, 0);
    let p = s.prepare_turn(&model, &tok, &line, RESERVE).unwrap();
    let grown = pocketchat::memory::process::peak_rss_bytes().unwrap().saturating_sub(before);
    let kept = p.prompt_cut_to.expect("the line was cut");
    assert!(kept < BUDGET, "{kept} tokens kept");
    let sent = &s.messages().last().unwrap().content;
    assert!(!sent.is_empty() && line.ends_with(sent.as_str()), "the line's end is kept");
    assert!(s.state.len() + RESERVE <= BUDGET);
    assert!(grown < 64 << 20, "the peak RSS grew by {:.1} MB for a 4 MB line", grown as f64 / 1e6);

    // The transcript keeps the whole line: read again without the cache, the turn that
    // holds it does not fit and is not tokenized whole either.
    let mut s = session(&model, &tok);
    let mut history = history(2);
    history.push(Message::new(Role::User, line.clone()));
    history.push(Message::new(Role::Assistant, "That is a long line."));
    s.set_history(history.clone());
    s.prepare_turn(&model, &tok, "and now?", RESERVE).unwrap();
    assert_eq!(s.messages(), [&history[..1], &[Message::new(Role::User, "and now?")]].concat());
    let grown = pocketchat::memory::process::peak_rss_bytes().unwrap().saturating_sub(before);
    assert!(grown < 64 << 20, "the peak RSS grew by {:.1} MB reading the line again", grown as f64 / 1e6);
}

/// A system prompt that leaves no room used to fail every message with "does not fit"
/// without a word about the system prompt.
#[test]
fn a_system_prompt_longer_than_the_budget_is_named_with_its_size() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let system = "Always answer in the style of a lighthouse keeper. ".repeat(20);
    for (family, earlier) in FAMILIES.into_iter().flat_map(|f| [(f, 0), (f, 3)]) {
        let dir = tempfile::tempdir().unwrap();
        let (model, tok) = model(dir.path(), family);
        let mut s = session(&model, &tok);
        let mut messages = history(earlier);
        messages[0] = Message::new(Role::System, system.clone());
        s.set_history(messages);
        let e = s.prepare_turn(&model, &tok, "hello", RESERVE).unwrap_err();
        let EngineError::SystemPromptTooLong { tokens, reserve, budget } = e.clone() else {
            panic!("{family}, with {earlier} turns before: {e}")
        };
        assert_eq!((reserve, budget), (RESERVE, BUDGET));
        let system_tokens = tok.encode_text(&system).unwrap().len();
        assert!(tokens >= system_tokens && tokens + RESERVE > BUDGET, "{tokens} tokens");
        let text = e.to_string();
        assert!(text.contains("system prompt") && text.contains(&format!("{tokens} tokens")), "{text}");
        assert!(text.contains(&BUDGET.to_string()), "{text}");
        assert_eq!(s.state.len(), 0, "nothing was fed");
    }
}
