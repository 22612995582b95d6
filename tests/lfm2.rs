//! LFM2 (short gated convolutions beside attention) on the tiny random-weight file whose
//! logits equal llama.cpp's (`llamacpp_conformance.rs`): its recurrent state fed token by
//! token, rolled back to a checkpoint, and counted from the file's header. Then chats
//! through a `Session` on small hybrid files with real vocabularies and templates: LFM2
//! (every operation that cuts the cache) and Qwen3.5 (what holds so far).

use candle_core::{DType, Device, Tensor};
use pocketchat::engine::model::file_facts;
use pocketchat::engine::{EngineError, Kernels, Model};

mod common;
use common::lfm2::{write_lfm2_gguf, Lfm2Spec};

const TOKENS: [u32; 12] = [5, 17, 200, 3, 99, 42, 7, 255, 256, 1, 64, 128];

fn tiny(dir: &std::path::Path) -> std::path::PathBuf {
    write_lfm2_gguf(dir, "tiny-lfm2.gguf", &Lfm2Spec::tiny(), 39)
}

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_dtype(DType::F32).unwrap().to_vec2().unwrap()
}

fn assert_close(a: &[f32], b: &[f32], what: &str) {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff <= 1e-4 * scale, "{what}: differ by {diff} (largest {scale})");
}

#[test]
fn decoding_token_by_token_equals_one_forward() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    for kernels in [Kernels::Candle, Kernels::Fast] {
        let model = Model::load(&path, &Device::Cpu, kernels, |_| {}).unwrap();
        let all = rows(&model.forward_all(&TOKENS, &mut model.make_state(64, DType::F32)).unwrap());
        let mut state = model.make_state(64, DType::F32);
        for (i, &t) in TOKENS.iter().enumerate() {
            let logits = model.forward(&[t], &mut state).unwrap().to_vec1::<f32>().unwrap();
            assert_close(&logits, &all[i], &format!("{kernels:?}, position {i}"));
        }
        // In uneven chunks too: the state carries the convolution across calls.
        let mut state = model.make_state(64, DType::F32);
        let mut at = 0;
        for n in [5, 1, 4, 2] {
            let out = rows(&model.forward_all(&TOKENS[at..at + n], &mut state).unwrap());
            for (j, row) in out.iter().enumerate() {
                assert_close(row, &all[at + j], &format!("{kernels:?}, chunked, position {}", at + j));
            }
            at += n;
        }
    }
}

#[test]
fn a_state_rolled_back_to_a_checkpoint_and_refed_equals_a_fresh_prefill() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::load(&tiny(dir.path()), &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let mut state = model.make_state(64, DType::F32);
    assert!(state.is_recurrent());
    model.forward(&TOKENS[..4], &mut state).unwrap();
    state.checkpoint();
    model.forward(&TOKENS[4..9], &mut state).unwrap();
    state.checkpoint();
    model.forward(&TOKENS[9..], &mut state).unwrap();
    assert_eq!(state.checkpoint_lengths(), [4, 9]);
    // Back to 7: the checkpoint at 4 is the latest at or before it.
    let kept = state.truncate(7);
    assert_eq!(kept, 4);
    assert_eq!(state.checkpoint_lengths(), [4]);
    let refed = model.forward(&TOKENS[kept..7], &mut state).unwrap().to_vec1::<f32>().unwrap();
    let other = [77u32, 3, 9];
    let after = model.forward(&other, &mut state).unwrap().to_vec1::<f32>().unwrap();

    let mut fresh = model.make_state(64, DType::F32);
    let expected = model.forward(&TOKENS[..7], &mut fresh).unwrap().to_vec1::<f32>().unwrap();
    assert_close(&refed, &expected, "re-fed to 7");
    let expected = model.forward(&other, &mut fresh).unwrap().to_vec1::<f32>().unwrap();
    assert_close(&after, &expected, "then other tokens");
    assert_eq!(state.tokens(), fresh.tokens());
}

#[test]
fn the_header_counts_the_attention_layers_kv_and_the_recurrent_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let facts = model.facts(DType::F16);
    // Two attention layers of 2 K/V heads of 64, in f16.
    assert_eq!(facts.kv_bytes_per_token, 2 * 2 * 2 * 64 * 2);
    // Three convolutions keep (3 − 1) rows of 256 f32, and four checkpoints of them.
    assert_eq!(facts.recurrent_bytes, 5 * 3 * 2 * 256 * 4);
    let header = file_facts(&path, DType::F16, Kernels::Fast).unwrap().facts;
    assert_eq!(header.kv_bytes_per_token, facts.kv_bytes_per_token);
    assert_eq!(header.recurrent_bytes, facts.recurrent_bytes);
    let state = model.make_state(64, DType::F16);
    assert_eq!(state.checkpoint_lengths(), Vec::<usize>::new());
}

#[test]
fn the_mixture_of_experts_variant_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let (mut content, mut reader) = pocketchat::engine::model::read_gguf(&path).unwrap();
    content
        .metadata
        .insert("general.architecture".into(), candle_core::quantized::gguf_file::Value::String("lfm2moe".into()));
    let moe = dir.path().join("tiny-lfm2moe.gguf");
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = content
        .tensor_infos
        .keys()
        .map(|name| (name.clone(), content.tensor(&mut reader, name, &Device::Cpu).unwrap()))
        .collect();
    let meta: Vec<(&str, &candle_core::quantized::gguf_file::Value)> =
        content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &candle_core::quantized::QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    candle_core::quantized::gguf_file::write(&mut std::fs::File::create(&moe).unwrap(), &meta, &refs).unwrap();
    let err = Model::load(&moe, &Device::Cpu, Kernels::Fast, |_| {}).err().expect("refused");
    assert_eq!(err, EngineError::UnsupportedArchitecture("lfm2moe".into()));
    assert!(err.to_string().contains("lfm2moe"), "{err}");
}

/// The hybrid family a chat test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Lfm2,
    Qwen35,
}

/// A hybrid file small enough for tests, with a real vocabulary and the family's chat
/// template. LFM2: six layers (two attention); no LFM2 vocabulary file is at hand
/// (llama.cpp's suite has none), so Qwen2's stands in: the same ChatML turn markers,
/// `<|im_end|>` as the end-of-turn token as LFM2's files have it. Qwen3.5: four layers
/// (three gated delta-net, one attention) with its own vocabulary and template.
fn chat_model(dir: &std::path::Path, family: Family) -> Option<std::path::PathBuf> {
    use candle_core::quantized::gguf_file::Value;
    let suite = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/llamacpp-suite");
    let (vocabulary, template) = match family {
        Family::Lfm2 => ("ggml-vocab-qwen2.gguf", "LFM2.5-Instruct.jinja"),
        Family::Qwen35 => ("ggml-vocab-qwen35.gguf", "Qwen3.5-4B.jinja"),
    };
    let vocabulary = suite.join(vocabulary);
    let template = std::fs::read_to_string(suite.join("templates").join(template)).ok()?;
    if !vocabulary.is_file() {
        return None;
    }
    let (mut keys, _) = common::lfm2::vocabulary_of(&vocabulary);
    let tokens = keys.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").unwrap().1.to_vec().unwrap().to_vec();
    let im_end = tokens.iter().position(|t| t.to_string().is_ok_and(|t| t == "<|im_end|>")).unwrap();
    let overrides = vec![
        ("tokenizer.chat_template".into(), Value::String(template)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(im_end as u32)),
    ];
    Some(match family {
        Family::Lfm2 => {
            let spec = Lfm2Spec {
                attention: vec![false, false, true, false, false, true],
                width: 128,
                heads: 2,
                kv_heads: 1,
                ffn: 256,
                weight_dtype: candle_core::quantized::GgmlDType::Q8_0,
                vocabulary: Some(vocabulary),
                meta_overrides: overrides,
            };
            write_lfm2_gguf(dir, "lfm2-chat.gguf", &spec, 41)
        }
        Family::Qwen35 => {
            keys.extend(overrides);
            keys.push(("qwen35.context_length".into(), Value::U32(4096)));
            common::qwen35::write_tiny_qwen35_with(dir, 4, 43, keys)
        }
    })
}

mod chat {
    use super::*;
    use pocketchat::engine::persist::{self, ModelIdentity, StateFileError};
    use pocketchat::engine::template::ChatTemplate;
    use pocketchat::engine::tokenizer::TextTokenizer;
    use pocketchat::engine::{DraftExtent, Session};

    const RESERVE: usize = 32;

    /// The family's chat file in a temporary folder (kept while the first value lives),
    /// loaded with the fast kernels.
    fn loaded(family: Family) -> (tempfile::TempDir, std::path::PathBuf, Model) {
        let dir = tempfile::tempdir().unwrap();
        let Some(path) = chat_model(dir.path(), family) else {
            panic!("models/llamacpp-suite is missing: run scripts/fetch-llamacpp-suite.sh");
        };
        let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
        (dir, path, model)
    }

    fn session(model: &Model, path: &std::path::Path, budget: usize) -> (Session, TextTokenizer) {
        let (content, _) = pocketchat::engine::model::read_gguf(path).unwrap();
        let tok = TextTokenizer::from_gguf(&content).unwrap();
        let template = ChatTemplate::for_model(&content, &tok);
        // An f16 cache, as the app keeps and saves it. The replies here do not think:
        // Qwen3.5's switch is off (LFM2.5's template has none).
        let mut session = Session::new(model.make_state(budget, DType::F16), template).unwrap();
        session.set_enable_thinking(Some(false));
        (session, tok)
    }

    /// Ends the turn as the engine does: the reply's tokens enter the cache as they are
    /// decoded, then its text is recorded.
    fn reply_with(s: &mut Session, model: &Model, tok: &TextTokenizer, reply: &str) {
        model.forward(&tok.encode_text(reply).unwrap(), &mut s.state).unwrap();
        s.finish_reply(reply);
    }

    /// The logits of a fresh prefill of the session's tokens.
    fn fresh(model: &Model, s: &Session) -> Vec<f32> {
        let mut state = model.make_state(s.state.max_tokens(), s.state.dtype());
        model.forward(s.state.tokens(), &mut state).unwrap().to_vec1().unwrap()
    }

    fn logits(t: &Tensor) -> Vec<f32> {
        t.to_vec1().unwrap()
    }

    fn close(a: &[f32], b: &[f32], what: &str) {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff <= 1e-3 * scale, "{what}: differ by {diff} (largest {scale})");
    }

    fn message(i: usize) -> String {
        format!("Turn {i}: tell me something about lighthouses, storms and the number {}.", i * 7)
    }

    fn answer(i: usize) -> String {
        format!("Here is answer {i}: the keeper lit the lamp {} times.", i + 2)
    }

    /// A 12-turn chat: each turn feeds only its own tokens, and the logits after every
    /// prompt equal a fresh prefill's. Returns the session after the last reply.
    fn twelve_turns(model: &Model, path: &std::path::Path, budget: usize, family: Family) -> (Session, TextTokenizer) {
        let (mut s, tok) = session(model, path, budget);
        // The end of a turn as the template writes it after a reply.
        let turn_close = tok.encode("<|im_end|>\n").unwrap().len();
        for i in 0..12 {
            let p = s.prepare_turn(model, &tok, &message(i), RESERVE).unwrap();
            assert_eq!(p.dropped_tokens, 0);
            match family {
                Family::Lfm2 => assert_eq!(p.refed_tokens, 0, "turn {i}: only its new tokens are fed"),
                // Qwen3.5's template renders a finished reply without the empty think block
                // its generation prompt opened: the session goes back to the checkpoint at
                // the reply's header and feeds the reply again as it renders now (with the
                // close of its turn), nothing before it.
                Family::Qwen35 if i > 0 => {
                    let reply = tok.encode_text(&answer(i - 1)).unwrap().len() + turn_close;
                    assert_eq!(p.refed_tokens, reply, "turn {i}: the last reply alone is fed again");
                }
                Family::Qwen35 => assert_eq!(p.refed_tokens, 0),
            }
            if i > 0 {
                let new = p.fed_tokens - p.refed_tokens;
                assert!(new < 60, "turn {i} fed {new} new tokens");
            }
            close(&logits(&p.logits), &fresh(model, &s), &format!("turn {i}"));
            reply_with(&mut s, model, &tok, &answer(i));
        }
        // LFM2.5's turn markers: `<|im_end|>` ends a reply and closes every turn (the
        // last reply's close comes with the next prompt).
        let im_end = tok.encode("<|im_end|>").unwrap();
        assert_eq!(im_end.len(), 1);
        assert!(tok.is_stop(im_end[0]));
        assert_eq!(s.state.tokens().iter().filter(|&&t| t == im_end[0]).count(), 2 * 12 - 1);
        (s, tok)
    }

    pub fn a_twelve_turn_chat_rolls_back_to_checkpoints_and_matches_a_fresh_prefill(family: Family) {
        let (dir, path, model) = loaded(family);
        let (mut s, tok) = twelve_turns(&model, &path, 4096, family);
        let end = s.state.len();
        assert_eq!(s.state.checkpoint_lengths().last(), Some(&end), "a checkpoint after the reply");

        // Regenerate: back to the checkpoint before the last prompt, which is fed again.
        let checkpoints = s.state.checkpoint_lengths();
        let (regenerated, prompt, fed) = s.rewind_reply(&model).unwrap().unwrap();
        assert_eq!(prompt, message(11));
        // The checkpoints: …, the last turn's start, its reply's start, its end.
        let n = checkpoints.len();
        assert_eq!(fed, checkpoints[n - 2] - checkpoints[n - 3], "only the last prompt is fed again");
        close(&logits(&regenerated), &fresh(&model, &s), "regenerate");
        reply_with(&mut s, &model, &tok, "another answer");

        // A draft typed and dropped: the cache is the conversation's again, at a checkpoint.
        // (On Qwen3.5 the draft first feeds the last reply again as it renders now; that is
        // the conversation's, and stays.)
        s.draft(&model, &tok, "something I will not send", DraftExtent::Whole, RESERVE).unwrap();
        let conversation = s.state.tokens()[..s.len()].to_vec();
        assert!(s.state.len() > conversation.len());
        assert!(s.state.checkpoint_lengths().contains(&conversation.len()));
        s.discard_draft();
        assert_eq!(s.state.tokens(), &conversation[..]);
        let p = s.prepare_turn(&model, &tok, "after the draft", RESERVE).unwrap();
        close(&logits(&p.logits), &fresh(&model, &s), "after a dropped draft");
        reply_with(&mut s, &model, &tok, "fine");

        // Edit the last message: back to the checkpoint at its turn's start.
        let before = s.state.len();
        assert_eq!(s.rewind_turn(&model).as_deref(), Some("after the draft"));
        let p = s.prepare_turn(&model, &tok, "an edited message", RESERVE).unwrap();
        assert!(p.fed_tokens < 30, "only the edited turn is fed ({} of {before})", p.fed_tokens);
        close(&logits(&p.logits), &fresh(&model, &s), "edit");
        reply_with(&mut s, &model, &tok, "edited answer");

        // Edit an older message, before every checkpoint kept: fed again from the latest
        // checkpoint before it (or the start), never shifted.
        let index = s.messages().iter().position(|m| m.content == message(9)).unwrap();
        assert!(s.rewind_to_message(&model, index));
        let p = s.prepare_turn(&model, &tok, "an older message edited", RESERVE).unwrap();
        close(&logits(&p.logits), &fresh(&model, &s), "edit of an older message");
        reply_with(&mut s, &model, &tok, "older edited answer");

        // Save and restore: the recurrent state and its checkpoints come back.
        let file = dir.path().join("chat.pcstate");
        let identity = ModelIdentity { sha256: "lfm2-chat".into(), bytes: 1 };
        persist::save(&s, &identity, &file).unwrap();
        let (mut restored, _) = session(&model, &path, 4096);
        persist::restore(&mut restored, &identity, &file).unwrap();
        assert_eq!(restored.state.tokens(), s.state.tokens());
        assert_eq!(restored.state.checkpoint_lengths(), s.state.checkpoint_lengths());
        // Regenerate right after the restore: the saved checkpoint before the last prompt.
        let (again, _, _) = restored.rewind_reply(&model).unwrap().expect("the last reply is cached");
        close(&logits(&again), &fresh(&model, &restored), "regenerate after a restore");
        reply_with(&mut restored, &model, &tok, "older edited answer");
        let a = s.prepare_turn(&model, &tok, "after saving", RESERVE).unwrap();
        let b = restored.prepare_turn(&model, &tok, "after saving", RESERVE).unwrap();
        assert_eq!(restored.state.tokens(), s.state.tokens());
        close(&logits(&b.logits), &logits(&a.logits), "restored");
        close(&logits(&b.logits), &fresh(&model, &restored), "restored, fresh");

        // A state file of another shape (the tiny LFM2's) is refused.
        let tiny_path = tiny(dir.path());
        let tiny_model = Model::load(&tiny_path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
        let (mut other, other_tok) = session(&tiny_model, &tiny_path, 256);
        other.prepare_turn(&tiny_model, &other_tok, "hi", 16).unwrap();
        let other_file = dir.path().join("other.pcstate");
        persist::save(&other, &identity, &other_file).unwrap();
        let err = persist::restore(&mut restored, &identity, &other_file).unwrap_err();
        assert_eq!(err, StateFileError::OtherModel("different layer shapes".into()));
        assert!(restored.is_empty());
    }

    /// A saved LFM2 chat with its header rewritten by `edit` (and its version).
    fn rewritten(file: &std::path::Path, version: u32, edit: impl Fn(&mut serde_json::Value)) -> std::path::PathBuf {
        let bytes = std::fs::read(file).unwrap();
        let len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        let mut header: serde_json::Value = serde_json::from_slice(&bytes[16..16 + len]).unwrap();
        edit(&mut header);
        let json = serde_json::to_vec(&header).unwrap();
        let mut out = bytes[..8].to_vec();
        out.extend(version.to_le_bytes());
        out.extend((json.len() as u32).to_le_bytes());
        out.extend(json);
        out.extend(&bytes[16 + len..]);
        let path = file.with_extension(format!("v{version}.pcstate"));
        std::fs::write(&path, out).unwrap();
        path
    }

    pub fn state_files_without_the_recurrent_state_or_with_a_wrong_one_are_refused(family: Family) {
        let (dir, path, model) = loaded(family);
        let (mut s, tok) = session(&model, &path, 1024);
        s.prepare_turn(&model, &tok, "a question", RESERVE).unwrap();
        reply_with(&mut s, &model, &tok, "an answer");
        let file = dir.path().join("chat.pcstate");
        let identity = ModelIdentity { sha256: "lfm2-chat".into(), bytes: 1 };
        persist::save(&s, &identity, &file).unwrap();
        let (mut other, _) = session(&model, &path, 1024);
        persist::restore(&mut other, &identity, &file).unwrap();
        assert_eq!(other.state.tokens(), s.state.tokens());

        // A format-2 file (K/V only) cannot hold this model's state.
        let old = rewritten(&file, 2, |h| {
            let h = h.as_object_mut().unwrap();
            h.remove("recurrent");
            h.remove("recurrent_lengths");
        });
        let err = persist::restore(&mut other, &identity, &old).unwrap_err();
        assert_eq!(err, StateFileError::OtherModel("different layer shapes".into()));
        assert!(other.is_empty());
        // Checkpoints past the conversation's end.
        let len = s.state.len();
        let wrong = rewritten(&file, 3, |h| h["recurrent_lengths"] = serde_json::json!([len, len + 5]));
        let err = persist::restore(&mut other, &identity, &wrong).unwrap_err();
        assert!(matches!(err, StateFileError::Damaged(_)), "{err}");
        // Another convolution width.
        let wrong = rewritten(&file, 3, |h| h["recurrent"][0][0] = serde_json::json!([2, 64]));
        let err = persist::restore(&mut other, &identity, &wrong).unwrap_err();
        assert_eq!(err, StateFileError::OtherModel("different layer shapes".into()));
    }

    pub fn typing_ahead_feeds_each_token_once_and_send_matches_a_fresh_prefill(family: Family) {
        let (_dir, path, model) = loaded(family);
        let (mut s, tok) = session(&model, &path, 4096);
        s.prepare_turn(&model, &tok, "a first question", RESERVE).unwrap();
        reply_with(&mut s, &model, &tok, "a first answer");
        let base = s.state.len();
        // Typed one character at a time, as the composer sends it: each word's tokens
        // are fed once (a recurrent state never gives part of its draft back).
        let text = "tell me about the lighthouse keeper and the long winter storms of that year";
        let fed: usize =
            (1..=text.len()).map(|n| s.draft(&model, &tok, &text[..n], DraftExtent::Words, RESERVE).unwrap().fed).sum();
        // (Qwen3.5's first draft feeds the last reply again as it renders now: that is
        // the conversation's, not the draft's.)
        let drafted = s.state.len() - s.len();
        assert_eq!(fed, drafted, "every drafted token fed once");
        if family == Family::Lfm2 {
            assert_eq!(s.len(), base);
        }
        let p = s.prepare_turn(&model, &tok, text, RESERVE).unwrap();
        assert_eq!(p.drafted_tokens, drafted);
        close(&logits(&p.logits), &fresh(&model, &s), "typed ahead, then sent");
    }

    /// Qwen3.5 thinking: each reply thinks in the `<think>` its generation prompt opened;
    /// the next turn's render drops that thinking, so the session goes back to the
    /// checkpoint at the reply's header and feeds the answer alone again. The cache then
    /// holds exactly the tokens of the conversation rendered afresh.
    pub fn thinking_leaves_the_cache_and_each_turn_feeds_only_the_last_answer_again(family: Family) {
        let (_dir, path, model) = loaded(family);
        let (mut s, tok) = session(&model, &path, 4096);
        s.set_enable_thinking(Some(true));
        let (content, _) = pocketchat::engine::model::read_gguf(&path).unwrap();
        let mut template = ChatTemplate::for_model(&content, &tok);
        template.set_enable_thinking(Some(true));
        let turn_close = tok.encode("<|im_end|>\n").unwrap().len();
        for i in 0..6 {
            let p = s.prepare_turn(&model, &tok, &message(i), RESERVE).unwrap();
            if i > 0 {
                let answer = tok.encode_text(&answer(i - 1)).unwrap().len() + turn_close;
                assert_eq!(p.refed_tokens, answer, "turn {i}: the last answer alone is fed again");
            }
            let rendered = template.render_marked(s.messages(), true).unwrap();
            let expected = tok.encode_rendered(&rendered.text, 0..rendered.text.len(), &rendered.bodies).unwrap();
            assert_eq!(s.state.tokens(), &expected[..], "turn {i}: the cache is the conversation rendered afresh");
            close(&logits(&p.logits), &fresh(&model, &s), &format!("turn {i}"));
            assert!(s.reply_opens_thinking());
            // The reply as the model writes it: its thinking, the closing tag (a special
            // token), then the answer.
            let reply = format!("Let me think about turn {i}.\n</think>\n\n{}", answer(i));
            model.forward(&tok.encode(&reply).unwrap(), &mut s.state).unwrap();
            s.finish_reply(&reply);
            let last = s.messages().last().unwrap();
            assert_eq!(last.content, answer(i));
            assert!(last.thinking.as_deref().is_some_and(|t| t.contains(&format!("turn {i}"))), "{last:?}");
        }
    }

    pub fn trimming_and_eviction_rebuild_the_recurrent_state_and_match_a_fresh_prefill(family: Family) {
        let (_dir, path, model) = loaded(family);
        let (mut s, tok) = twelve_turns(&model, &path, 4096, family);
        let total = s.state.len();

        // A budget the chat overflows: old turns go, what follows them is read again.
        s.set_budget(total * 2 / 3);
        let p = s.prepare_turn(&model, &tok, "one more question", RESERVE).unwrap();
        assert!(p.dropped_tokens > 0);
        // What the cache keeps of the chat before the new turn: read again at most once
        // (Qwen3.5's last reply, fed again as it renders now, is part of it).
        let kept = s.state.len() - (p.fed_tokens - p.refed_tokens);
        assert!(s.last_reread() > 0 && s.last_reread() <= kept, "re-read {} of {kept}", s.last_reread());
        close(&logits(&p.logits), &fresh(&model, &s), "after trimming");
        reply_with(&mut s, &model, &tok, "trimmed answer");

        // A memory warning: down to half, rebuilt, and the next turn is exact.
        let before = s.state.len();
        s.evict_to(&model, before / 2).unwrap();
        assert!(s.state.len() <= before / 2 && !s.state.is_empty());
        assert!(s.last_reread() > 0);
        assert_eq!(s.state.checkpoint_lengths().last(), Some(&s.state.len()));
        let p = s.prepare_turn(&model, &tok, "after the warning", RESERVE).unwrap();
        close(&logits(&p.logits), &fresh(&model, &s), "after eviction");
    }
}

/// The chat tests on LFM2.
mod lfm2_chat {
    use super::{chat, Family::Lfm2};

    #[test]
    fn a_twelve_turn_chat_rolls_back_to_checkpoints_and_matches_a_fresh_prefill() {
        chat::a_twelve_turn_chat_rolls_back_to_checkpoints_and_matches_a_fresh_prefill(Lfm2)
    }

    #[test]
    fn state_files_without_the_recurrent_state_or_with_a_wrong_one_are_refused() {
        chat::state_files_without_the_recurrent_state_or_with_a_wrong_one_are_refused(Lfm2)
    }

    #[test]
    fn typing_ahead_feeds_each_token_once_and_send_matches_a_fresh_prefill() {
        chat::typing_ahead_feeds_each_token_once_and_send_matches_a_fresh_prefill(Lfm2)
    }

    #[test]
    fn trimming_and_eviction_rebuild_the_recurrent_state_and_match_a_fresh_prefill() {
        chat::trimming_and_eviction_rebuild_the_recurrent_state_and_match_a_fresh_prefill(Lfm2)
    }
}

/// The chat tests on Qwen3.5, whose template renders a finished reply without the think
/// block its generation prompt opened (empty with thinking off): each turn also feeds the
/// last answer again.
mod qwen35_chat {
    use super::{chat, Family::Qwen35};

    #[test]
    fn a_twelve_turn_chat_rolls_back_to_checkpoints_and_matches_a_fresh_prefill() {
        chat::a_twelve_turn_chat_rolls_back_to_checkpoints_and_matches_a_fresh_prefill(Qwen35)
    }

    #[test]
    fn state_files_without_the_recurrent_state_or_with_a_wrong_one_are_refused() {
        chat::state_files_without_the_recurrent_state_or_with_a_wrong_one_are_refused(Qwen35)
    }

    #[test]
    fn typing_ahead_feeds_each_token_once_and_send_matches_a_fresh_prefill() {
        chat::typing_ahead_feeds_each_token_once_and_send_matches_a_fresh_prefill(Qwen35)
    }

    #[test]
    fn trimming_and_eviction_rebuild_the_recurrent_state_and_match_a_fresh_prefill() {
        chat::trimming_and_eviction_rebuild_the_recurrent_state_and_match_a_fresh_prefill(Qwen35)
    }

    #[test]
    fn thinking_leaves_the_cache_and_each_turn_feeds_only_the_last_answer_again() {
        chat::thinking_leaves_the_cache_and_each_turn_feeds_only_the_last_answer_again(Qwen35)
    }
}

/// What each operation on a recurrent state costs against reading the chat again, on an
/// LFM2.5-1.2B- or Qwen3.5-0.8B-shaped file (`bench/shaped_model.py lfm2.5-1.2b`,
/// `qwen3.5-0.8b`): prints time and tokens fed; asserts nothing about time. Run by hand:
///
/// ```text
/// POCKETCHAT_HYBRID_SHAPED=/work/shaped/LFM2.5-1.2B-shaped.Q4_K_M.gguf \
///   cargo test --no-default-features --test lfm2 -- --ignored --nocapture recurrent_costs
/// ```
#[test]
#[ignore = "a measurement on a 1.2B-shaped file: run by hand"]
fn recurrent_costs() {
    use pocketchat::engine::persist::{self, ModelIdentity};
    use pocketchat::engine::template::ChatTemplate;
    use pocketchat::engine::tokenizer::TextTokenizer;
    use pocketchat::engine::{DraftExtent, Session};
    use std::time::Instant;

    let var = |name: &str| std::env::var(name).ok();
    let path = var("POCKETCHAT_HYBRID_SHAPED").or_else(|| var("POCKETCHAT_LFM2_SHAPED"));
    let path = std::path::PathBuf::from(path.expect("POCKETCHAT_HYBRID_SHAPED: a hybrid model's file"));
    let turns: usize = std::env::var("POCKETCHAT_TURNS").ok().and_then(|t| t.parse().ok()).unwrap_or(12);
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let (content, _) = pocketchat::engine::model::read_gguf(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&content).unwrap();
    // Replies without thinking (Qwen3.5's switch off; LFM2.5's template has none).
    let new_session = || {
        let mut s = Session::new(model.make_state(8192, DType::F16), ChatTemplate::for_model(&content, &tok)).unwrap();
        s.set_enable_thinking(Some(false));
        s
    };
    let mut s = new_session();
    let reserve = 256;
    let prompt = |i: usize| {
        format!("Question {i}: what did the keeper of the lighthouse write in the log on night {i}, and why?")
    };
    let reply = |i: usize| "The keeper wrote about the storm, the ships and the lamp. ".repeat(2 + i % 3);
    let feed_reply = |s: &mut Session, text: &str| {
        model.forward(&tok.encode_text(text).unwrap(), &mut s.state).unwrap();
        s.finish_reply(text);
    };
    let t = Instant::now();
    let (mut fed, mut refed) = (0, 0);
    for i in 0..turns {
        let p = s.prepare_turn(&model, &tok, &prompt(i), reserve).unwrap();
        (fed, refed) = (fed + p.fed_tokens, refed + p.refed_tokens);
        feed_reply(&mut s, &reply(i));
    }
    let tokens = s.state.len();
    println!("chat: {turns} turns, {tokens} tokens, built in {:.1} s", t.elapsed().as_secs_f64());
    println!("prompts fed {fed} tokens, {refed} of them earlier replies fed again as they render now");
    println!(
        "state: KV {} B/token (f16), recurrent {} B now, {} B with {} checkpoints",
        model.kv_bytes_per_token(DType::F16),
        s.state.recurrent_bytes() / (1 + s.state.checkpoint_lengths().len() as u64),
        s.state.recurrent_bytes(),
        s.state.checkpoint_lengths().len()
    );
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let row = |what: &str, fed: usize, ms: f64| println!("| {what} | {fed} | {ms:.0} |");
    println!("| operation | tokens fed | ms |");
    println!("|---|---:|---:|");
    let t = Instant::now();
    let mut fresh = model.make_state(8192, DType::F16);
    model.forward(s.state.tokens(), &mut fresh).unwrap();
    row("re-read of the whole chat (the floor without checkpoints)", tokens, ms(t));
    drop(fresh);

    // Fed by an operation: what the state holds after it, less what it kept.
    let kept_at = |s: &Session, cut: usize| s.state.checkpoint_lengths().into_iter().filter(|&c| c <= cut).max();
    // Checkpoints: …, the previous reply's end, the last prompt's end, the last reply's end.
    let start = s.state.checkpoint_lengths().into_iter().rev().nth(1).unwrap();
    let kept = kept_at(&s, start - 1).unwrap_or(0);
    let t = Instant::now();
    let (_, _, fed) = s.rewind_reply(&model).unwrap().unwrap();
    assert_eq!(fed, start - kept);
    row("regenerate (rewind_reply)", fed, ms(t));
    feed_reply(&mut s, &reply(0));

    let t = Instant::now();
    let mut fed = 0;
    loop {
        let step = s.draft(&model, &tok, "a message typed and then dropped", DraftExtent::Whole, reserve).unwrap();
        fed += step.fed;
        if step.left == 0 {
            break;
        }
    }
    let typed = ms(t);
    let t = Instant::now();
    s.discard_draft();
    row(&format!("dropped draft ({fed} tokens typed ahead in {typed:.0} ms)"), 0, ms(t));

    // Tokens an edit re-fed to reach the turn's start: from the checkpoint before it.
    let refed =
        |checkpoints: &[usize], at: usize| at - checkpoints.iter().copied().filter(|&c| c <= at).max().unwrap_or(0);
    let checkpoints = s.state.checkpoint_lengths();
    let t = Instant::now();
    s.rewind_turn(&model).unwrap();
    let again = refed(&checkpoints, s.state.len());
    let p = s.prepare_turn(&model, &tok, "an edited question about the lighthouse", reserve).unwrap();
    row("edit of the last message (rewind_turn + its prompt)", again + p.fed_tokens, ms(t));
    feed_reply(&mut s, &reply(1));

    let index = s.messages().iter().position(|m| m.content == prompt(turns / 2)).unwrap();
    let (checkpoints, messages) = (s.state.checkpoint_lengths(), s.messages().len());
    let t = Instant::now();
    assert!(s.rewind_to_message(&model, index));
    let again = refed(&checkpoints, s.state.len());
    let p = s.prepare_turn(&model, &tok, "an edited older question", reserve).unwrap();
    row(&format!("edit of message {index} of {messages} (older than every checkpoint)"), again + p.fed_tokens, ms(t));
    for i in 0..turns - turns / 2 - 1 {
        feed_reply(&mut s, &reply(i));
        s.prepare_turn(&model, &tok, &prompt(turns / 2 + 1 + i), reserve).unwrap();
    }
    feed_reply(&mut s, &reply(3));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chat.pcstate");
    let identity = ModelIdentity { sha256: "shaped".into(), bytes: 1 };
    let t = Instant::now();
    let bytes = persist::save(&s, &identity, &file).unwrap();
    let saved = ms(t);
    let mut restored = new_session();
    let t = Instant::now();
    persist::restore(&mut restored, &identity, &file).unwrap();
    row(&format!("save ({bytes} B, {saved:.0} ms) and restore"), 0, ms(t));
    drop(restored);

    let len = s.state.len();
    s.set_budget(len * 3 / 4 + reserve);
    let t = Instant::now();
    let p = s.prepare_turn(&model, &tok, &prompt(99), reserve).unwrap();
    row(
        &format!("trim of {} old tokens before a turn (+{} prompt tokens)", p.dropped_tokens, p.fed_tokens),
        s.last_reread() + p.fed_tokens,
        ms(t),
    );
    feed_reply(&mut s, &reply(2));
    s.set_budget(8192);

    let len = s.state.len();
    let t = Instant::now();
    s.evict_to(&model, len / 2).unwrap();
    row(&format!("memory-warning eviction to half ({len} → {} tokens)", s.state.len()), s.last_reread(), ms(t));
}

/// A q8_0 KV cache decodes token by token as one forward over it does, up to what
/// quantizing the cache moves the logits (`common::assert_q8_0_cache_decodes_as_one_forward`).
#[test]
fn a_q8_0_cache_decodes_token_by_token_as_one_forward() {
    let dir = tempfile::tempdir().unwrap();
    common::assert_q8_0_cache_decodes_as_one_forward(&tiny(dir.path()), &TOKENS);
}
