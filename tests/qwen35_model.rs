//! Qwen3.5's hybrid forward on the tiny random-weight file (`common::qwen35`, whose logits
//! equal llama.cpp's: `llamacpp_conformance.rs`): the recurrent state carried from call to
//! call gives the same logits as one pass, a truncation back to a checkpoint and the
//! tokens re-fed give those of a fresh prefill, and the memory figures read from the header
//! are those of the loaded model.

mod common;

use candle_core::{DType, Device};
use pocketchat::engine::model::file_facts;
use pocketchat::engine::state::LayerMemory;
use pocketchat::engine::{Kernels, Model};

const TOKENS: [u32; 12] = [5, 17, 200, 3, 99, 42, 7, 255, 256, 1, 64, 128];

fn tiny(dir: &std::path::Path) -> std::path::PathBuf {
    common::qwen35::write_tiny_qwen35(dir, 4, 39)
}

#[test]
fn qwen35_decodes_step_by_step_as_one_full_forward() {
    let dir = tempfile::tempdir().unwrap();
    // A prefill of 5, then one token at a time.
    common::assert_decodes_as_one_forward(&tiny(dir.path()), &TOKENS, 5);
}

#[test]
fn truncating_to_a_checkpoint_and_refeeding_equals_a_fresh_prefill() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let mut state = model.make_state(64, DType::F32);
    assert!(state.is_recurrent());
    model.forward(&TOKENS[..4], &mut state).unwrap();
    state.checkpoint();
    model.forward(&TOKENS[4..9], &mut state).unwrap();
    state.checkpoint();
    model.forward(&TOKENS[9..], &mut state).unwrap();
    assert_eq!(state.checkpoint_lengths(), [4, 9]);

    // Back to 7 tokens: the latest checkpoint at or before 7 is at 4; re-feed 4..7.
    let kept = state.truncate(7);
    assert_eq!(kept, 4);
    assert_eq!(state.tokens(), &TOKENS[..4]);
    model.forward(&TOKENS[4..7], &mut state).unwrap();
    let ours = model.forward(&[42, 7], &mut state).unwrap();
    let mut fresh = model.make_state(64, DType::F32);
    let prompt: Vec<u32> = TOKENS[..7].iter().copied().chain([42, 7]).collect();
    let expected = model.forward(&prompt, &mut fresh).unwrap();
    let diff = common::relative_diff(&ours, &expected);
    assert!(diff < 1e-4, "after the rollback the logits differ by {diff} of the largest");

    // Back to the later checkpoint: nothing to re-feed.
    let mut state = model.make_state(64, DType::F32);
    model.forward(&TOKENS[..9], &mut state).unwrap();
    state.checkpoint();
    model.forward(&TOKENS[9..], &mut state).unwrap();
    assert_eq!(state.truncate(9), 9);
    let ours = model.forward(&TOKENS[9..], &mut state).unwrap();
    let expected = model.forward(&TOKENS, &mut model.make_state(64, DType::F32)).unwrap();
    assert!(common::relative_diff(&ours, &expected) < 1e-4);

    // Before any checkpoint: back to nothing.
    assert_eq!(state.truncate(2), 0);
    let ours = model.forward(&TOKENS[..3], &mut state).unwrap();
    let expected = model.forward(&TOKENS[..3], &mut model.make_state(64, DType::F32)).unwrap();
    assert!(common::relative_diff(&ours, &expected) < 1e-4);
}

#[test]
fn qwen35_keeps_kv_for_its_attention_layer_and_a_fixed_recurrent_state_for_the_others() {
    use common::qwen35::{HEAD_DIM, SSM_HEAD, SSM_KERNEL, SSM_K_HEADS, SSM_V_HEADS};
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let state = model.make_state(64, DType::F32);
    let conv_channels = (2 * SSM_K_HEADS + SSM_V_HEADS) * SSM_HEAD;
    let delta_net =
        LayerMemory::Recurrent(vec![vec![conv_channels, SSM_KERNEL - 1], vec![SSM_V_HEADS, SSM_HEAD, SSM_HEAD]]);
    assert_eq!(state.memory(), [delta_net.clone(), delta_net.clone(), delta_net, LayerMemory::KeysValues]);

    // One attention layer's K and V per token; three layers' conv inputs and state
    // matrices, with the checkpoints they may keep.
    let kv = (2 * common::KV_HEADS * HEAD_DIM * 2) as u64;
    let one_copy = (3 * (conv_channels * (SSM_KERNEL - 1) + SSM_V_HEADS * SSM_HEAD * SSM_HEAD) * 4) as u64;
    let copies = 1 + pocketchat::engine::state::MAX_CHECKPOINTS as u64;
    let loaded = model.facts(DType::F16);
    assert_eq!(loaded.kv_bytes_per_token, kv);
    assert_eq!(loaded.recurrent_bytes, copies * one_copy);
    let header = file_facts(&path, DType::F16, Kernels::Fast).unwrap().facts;
    assert_eq!(header.kv_bytes_per_token, kv);
    assert_eq!(header.recurrent_bytes, copies * one_copy);

    // The live state's bytes: one copy before any checkpoint, whatever the length.
    let mut state = model.make_state(64, DType::F32);
    model.forward(&TOKENS, &mut state).unwrap();
    assert_eq!(state.recurrent_bytes(), one_copy);
    state.checkpoint();
    assert_eq!(state.recurrent_bytes(), 2 * one_copy);
}

/// Qwen3.5's own chat template (`Qwen3.5-4B.jinja` of llama.cpp's suite) and the session's
/// turn markers: a turn starts at `<|im_start|>user\n`, messages are found in the render,
/// and the text of an earlier turn is stable, except for the reply: the generation prompt
/// opens a `<think>` block that the template leaves out once a later user message exists.
/// So the cached text and the next render part right after the previous turn's
/// `<|im_start|>assistant\n`: the point a recurrent state needs a checkpoint at to avoid
/// re-reading the turn (a KV cache truncates there and re-feeds the reply). A reply kept
/// with its reasoning (`…</think>\n\nanswer`) is rewritten by the template and refused.
#[test]
fn qwen35_template_turns_start_at_the_user_header_and_part_at_the_think_block() {
    use pocketchat::engine::template::{ChatTemplate, Message, Role};
    let dir = std::env::var_os("POCKETCHAT_LLAMACPP_SUITE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/llamacpp-suite"));
    let path = dir.join("templates/Qwen3.5-4B.jinja");
    let source = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-llamacpp-suite.sh)", path.display()));
    let template = ChatTemplate::parse(&source, "", "<|im_end|>").unwrap();
    assert_eq!(template.user_header().unwrap(), "<|im_start|>user\n");

    let first = [Message::new(Role::System, "be brief"), Message::new(Role::User, "hello there")];
    let prompt = template.render(&first, true).unwrap();
    assert_eq!(prompt, "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n<think>\n");
    // What the cache holds after the reply (decoded tokens: reasoning, then the answer).
    let cached = format!("{prompt}mulling\n</think>\n\nok sure<|im_end|>\n");

    let mut second = first.to_vec();
    // The reply as its answer only: a text holding `</think>` is split by the template (it
    // keeps what follows), so render_marked could not find it and refuses it.
    let with_reasoning = Message::new(Role::Assistant, "mulling\n</think>\n\nok sure");
    let refused = [first[0].clone(), first[1].clone(), with_reasoning, Message::new(Role::User, "more")];
    assert!(template.render_marked(&refused, true).is_err());
    second.push(Message::new(Role::Assistant, "ok sure"));
    second.push(Message::new(Role::User, "tell me more"));
    let rendered = template.render_marked(&second, true).unwrap();
    let bodies: Vec<&str> = rendered.bodies.iter().map(|r| &rendered.text[r.clone()]).collect();
    assert_eq!(bodies, ["be brief", "hello there", "ok sure", "tell me more"]);
    let common = cached.bytes().zip(rendered.text.bytes()).take_while(|(a, b)| a == b).count();
    let parted_after = "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n";
    assert!(cached[..common].ends_with(parted_after), "they part at {common}: {:?}", &cached[..common]);
    assert!(rendered.text[common..].starts_with("ok sure<|im_end|>\n<|im_start|>user\ntell me more"));
}

/// A file whose last block is a multi-token-prediction head (`nextn_predict_layers`,
/// counted in `block_count`, as recent conversions write Qwen3.5) runs the blocks before
/// it only, as llama.cpp does.
#[test]
fn the_draft_head_block_of_a_qwen35_file_is_not_run() {
    use candle_core::quantized::gguf_file::Value;
    let dir = tempfile::tempdir().unwrap();
    let with_head = common::qwen35::write_tiny_qwen35_with(
        dir.path(),
        4,
        39,
        vec![("qwen35.nextn_predict_layers".into(), Value::U32(1))],
    );
    let model = Model::load(&with_head, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    assert_eq!(model.config.n_layers, 3);
    let state = model.make_state(64, DType::F32);
    assert!(state.memory().iter().all(|m| *m != LayerMemory::KeysValues), "three delta-net layers");
    let facts = file_facts(&with_head, DType::F16, Kernels::Fast).unwrap().facts;
    assert_eq!(facts.kv_bytes_per_token, 0);
    assert_eq!(facts.recurrent_bytes, model.facts(DType::F16).recurrent_bytes);
    let logits = model.forward(&TOKENS, &mut model.make_state(64, DType::F32)).unwrap();
    assert!(logits.to_vec1::<f32>().unwrap().iter().all(|x| x.is_finite()));
}

/// A q8_0 KV cache decodes token by token as one forward over it does, up to what
/// quantizing the cache moves the logits (`common::assert_q8_0_cache_decodes_as_one_forward`).
#[test]
fn a_q8_0_cache_decodes_token_by_token_as_one_forward() {
    let dir = tempfile::tempdir().unwrap();
    common::assert_q8_0_cache_decodes_as_one_forward(&tiny(dir.path()), &TOKENS);
}
