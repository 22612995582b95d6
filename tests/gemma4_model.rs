//! Gemma 4's forward on the tiny random-weight file (`common::gemma4`, whose logits equal
//! llama.cpp's: `llamacpp_conformance.rs`): decoding token by token gives the logits of
//! one pass, with both kernel sets; a state truncated and re-fed gives those of a fresh
//! prefill; the layers that read an earlier layer's K/V keep none; and the memory
//! figures read from the header are those of the loaded model.

mod common;

use candle_core::{DType, Device, Tensor};
use pocketchat::engine::model::file_facts;
use pocketchat::engine::state::LayerMemory;
use pocketchat::engine::{Kernels, Model};

const TOKENS: [u32; 12] = [5, 17, 200, 3, 99, 42, 7, 255, 256, 1, 64, 128];

fn tiny(dir: &std::path::Path) -> std::path::PathBuf {
    common::gemma4::write_tiny_gemma4(dir, 41)
}

#[test]
fn gemma4_decodes_step_by_step_as_one_full_forward() {
    let dir = tempfile::tempdir().unwrap();
    // A prefill of 3 (inside the window of 5), then one token at a time past it.
    common::assert_decodes_as_one_forward(&tiny(dir.path()), &TOKENS, 3);
}

#[test]
fn candle_and_fast_kernels_agree_on_gemma4() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let run = |kernels| {
        let model = Model::load(&path, &Device::Cpu, kernels, |_| {}).unwrap();
        model.forward_all(&TOKENS, &mut model.make_state(64, DType::F32)).unwrap()
    };
    let (candle, fast) = (run(Kernels::Candle), run(Kernels::Fast));
    let diff = common::relative_diff(&fast, &candle);
    assert!(diff < 1e-4, "the kernel sets differ by {diff} of the largest logit");
}

#[test]
fn a_truncated_gemma4_state_refed_equals_a_fresh_prefill() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    for dtype in [DType::F32, DType::F16] {
        let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
        let mut state = model.make_state(64, dtype);
        assert!(!state.is_recurrent());
        model.forward(&TOKENS, &mut state).unwrap();
        assert_eq!(state.truncate(7), 7);
        let ours = model.forward(&[42, 7, 9], &mut state).unwrap();
        let prompt: Vec<u32> = TOKENS[..7].iter().copied().chain([42, 7, 9]).collect();
        let expected = model.forward(&prompt, &mut model.make_state(64, dtype)).unwrap();
        let diff = common::relative_diff(&ours, &expected);
        assert!(diff < 1e-3, "{dtype:?}: after the truncation the logits differ by {diff} of the largest");
    }
}

#[test]
fn gemma4_layers_sharing_kv_keep_none_and_the_header_facts_are_the_models() {
    use common::gemma4::{HEAD_DIM_GLOBAL, HEAD_DIM_SLIDING, SLIDING};
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    assert_eq!(model.config.n_layers, SLIDING.len());
    assert_eq!(model.config.head_dim, HEAD_DIM_GLOBAL);
    assert_eq!(model.config.ffn_length, 2 * common::FFN, "the widest FFN");
    let state = model.make_state(64, DType::F32);
    let kv = LayerMemory::KeysValues;
    let expected = [
        kv.clone(),
        kv.clone(),
        kv.clone(),
        kv.clone(),
        kv,
        LayerMemory::SharedKeysValues(3),
        LayerMemory::SharedKeysValues(4),
    ];
    assert_eq!(state.memory(), expected);
    let (s, g) = (HEAD_DIM_SLIDING, HEAD_DIM_GLOBAL);
    assert_eq!(state.stored_head_dims(), [s, s, g, s, g, 0, 0], "two head sizes; shared layers keep none");

    // K and V per token of the five layers with their own: two global keep every
    // position, three sliding their window and slack.
    let f16 = 2;
    let (global, sliding) =
        (2 * common::KV_HEADS * 2 * HEAD_DIM_GLOBAL * f16, 2 * common::KV_HEADS * 3 * HEAD_DIM_SLIDING * f16);
    let rows = pocketchat::engine::state::window_rows(common::gemma4::WINDOW);
    let loaded = model.facts(DType::F16);
    assert_eq!(loaded.kv_bytes_per_token, global as u64);
    assert_eq!(loaded.window_kv_bytes, (sliding * rows) as u64);
    let header = file_facts(&path, DType::F16, Kernels::Fast).unwrap().facts;
    assert_eq!(header, loaded);

    // The state's buffers hold what the facts say, once grown: every layer a row per
    // position while the capacity is under the window's rows, the sliding ones no more
    // than those rows after.
    let mut state = model.make_state(512, DType::F16);
    model.forward(&TOKENS, &mut state).unwrap();
    assert_eq!(state.kv_bytes(), ((global + sliding) * state.capacity()) as u64);
    let long: Vec<u32> = (0..400u32).map(|i| i % 250).collect();
    model.forward(&long, &mut state).unwrap();
    assert_eq!(state.capacity(), 512);
    assert_eq!(state.kv_bytes(), (global * 512 + sliding * rows) as u64);
    assert_eq!(state.kv_bytes(), model.kv_bytes_at(DType::F16, 512));
}

/// The per-layer token table is read a row per token in place: mapped, not copied, and
/// not counted by the fit as resident (a chat touches the rows of its tokens only).
#[test]
fn the_per_layer_table_is_mapped_and_not_counted_resident() {
    use common::gemma4::{PER_LAYER, SLIDING};
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let table = (model.config.vocab_size * SLIDING.len() * PER_LAYER * 4) as u64;
    assert_eq!(model.config.lookup_table_bytes, table);
    assert!(model.config.mapped_weight_bytes > table);
    let facts = model.facts(DType::F16);
    assert_eq!(facts.mapped_bytes, model.config.mapped_weight_bytes - table);
    assert!(facts.weights_bytes < table, "{} on the heap", facts.weights_bytes);
}

/// `path`'s file with one more f32 tensor `name` of `rows × columns`, written beside it.
fn with_extra_tensor(path: &std::path::Path, name: &str, (rows, columns): (usize, usize)) -> std::path::PathBuf {
    use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
    let mut f = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut tensors: Vec<(String, QTensor)> =
        content.tensor_infos.keys().map(|n| (n.clone(), content.tensor(&mut f, n, &Device::Cpu).unwrap())).collect();
    let extra = Tensor::zeros((rows, columns), DType::F32, &Device::Cpu).unwrap();
    tensors.push((name.into(), QTensor::quantize(&extra, GgmlDType::F32).unwrap()));
    let out = path.with_file_name(format!("with-{name}.gguf"));
    let meta: Vec<(&str, &gguf_file::Value)> = content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut std::fs::File::create(&out).unwrap(), &meta, &refs).unwrap();
    out
}

/// A file holding a vision tower besides the text model is refused, saying why; so is
/// one with mixture-of-experts layers (26B-A4B's router), which would run wrong.
#[test]
fn gemma4_files_with_a_vision_tower_or_experts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let with_vision = with_extra_tensor(&path, "v.patch_embd.weight", (8, 8));
    let err = Model::load(&with_vision, &Device::Cpu, Kernels::Fast, |_| {}).err().expect("refused");
    assert!(err.to_string().contains("vision or audio tower"), "{err}");
    let with_experts = with_extra_tensor(&path, "blk.0.ffn_gate_inp.weight", (4, common::EMBED));
    let err = Model::load(&with_experts, &Device::Cpu, Kernels::Fast, |_| {}).err().expect("refused");
    assert!(err.to_string().contains("mixture-of-experts"), "{err}");
}

/// A Gemma 4 conversation saved to a state file (format 4: each layer's head size, none
/// for the layers reading another's K/V) and restored gives the logits of a fresh prefill
/// and the same next step as the live one; a file with other head sizes is refused.
#[test]
fn a_gemma4_conversation_is_saved_and_restored_with_each_layers_head_size() {
    use common::gemma4::HEAD_DIM_GLOBAL;
    use pocketchat::engine::persist::{self, ModelIdentity, StateFileError};
    use pocketchat::engine::template::ChatTemplate;
    use pocketchat::engine::Session;
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    let session = || Session::new(model.make_state(64, DType::F16), ChatTemplate::new(None, "<bos>", "<eos>")).unwrap();
    let mut live = session();
    model.forward(&TOKENS, &mut live.state).unwrap();
    let id = ModelIdentity { sha256: "ab".repeat(32), bytes: 1234 };
    let file = dir.path().join("chat.pcstate");
    persist::save(&live, &id, &file).unwrap();

    let mut restored = session();
    persist::restore(&mut restored, &id, &file).unwrap();
    assert_eq!(restored.state.tokens(), live.state.tokens());
    let next = [9u32, 33];
    let a = model.forward(&next, &mut live.state).unwrap();
    let b = model.forward(&next, &mut restored.state).unwrap();
    let mut fresh = model.make_state(64, DType::F16);
    let expected = model.forward(&[&TOKENS[..], &next[..]].concat(), &mut fresh).unwrap();
    assert!(common::relative_diff(&b, &a) < 1e-4, "restored and live differ");
    assert!(common::relative_diff(&b, &expected) < 1e-3, "restored and a fresh prefill differ");

    // A file whose layers have other head sizes is another model's.
    let bytes = std::fs::read(&file).unwrap();
    let len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[16..16 + len]).unwrap();
    header["kv_head_dims"][0] = serde_json::json!(HEAD_DIM_GLOBAL);
    let json = serde_json::to_vec(&header).unwrap();
    let mut other = bytes[..12].to_vec();
    other.extend((json.len() as u32).to_le_bytes());
    other.extend(json);
    other.extend(&bytes[16 + len..]);
    let other_file = dir.path().join("other.pcstate");
    std::fs::write(&other_file, other).unwrap();
    let mut refused = session();
    let err = persist::restore(&mut refused, &id, &other_file).unwrap_err();
    assert_eq!(err, StateFileError::OtherModel("different layer shapes".into()));
    assert!(refused.is_empty());
}

/// A chat through a `Session` on a small Gemma 4 file with the real vocabulary
/// (`ggml-vocab-gemma-4.gguf`, 262,144 pieces) and chat template (llama.cpp's suite):
/// four layers (sliding, global, and two reading their K/V), Q8_0, width 64. Each turn
/// feeds its own tokens and at most the last reply again, after every prompt the logits
/// equal a fresh prefill's, and `<turn|>` ends a reply.
#[test]
fn a_gemma4_chat_with_its_real_vocabulary_matches_a_fresh_prefill_each_turn() {
    use candle_core::quantized::gguf_file::Value;
    use candle_core::quantized::GgmlDType;
    use common::gemma4::{write_gemma4, Gemma4Spec};
    use pocketchat::engine::template::ChatTemplate;
    use pocketchat::engine::tokenizer::TextTokenizer;
    use pocketchat::engine::Session;
    let suite = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/llamacpp-suite");
    let template = std::fs::read_to_string(suite.join("templates/google-gemma-4-31B-it.jinja"))
        .expect("models/llamacpp-suite is missing: run scripts/fetch-llamacpp-suite.sh");
    let (mut keys, n_vocab) = common::lfm2::vocabulary_of(&suite.join("ggml-vocab-gemma-4.gguf"));
    keys.push(("tokenizer.chat_template".into(), Value::String(template)));
    let spec = Gemma4Spec {
        sliding: vec![true, false, true, false],
        shared_kv_layers: 2,
        width: 64,
        per_layer: 32,
        dtype: GgmlDType::Q8_0,
        vocabulary: Some((keys, n_vocab)),
    };
    let dir = tempfile::tempdir().unwrap();
    let path = write_gemma4(dir.path(), "gemma4-chat.gguf", &spec, 43);
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap();
    assert_eq!(model.config.vocab_size, 262_144);
    let (content, _) = pocketchat::engine::model::read_gguf(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&content).unwrap();
    let mut s = Session::new(model.make_state(2048, DType::F16), ChatTemplate::for_model(&content, &tok)).unwrap();
    let reply_of = |i: usize| format!("Answer {i}: the keeper lit the lamp {} times.", i + 2);
    for i in 0..4 {
        let message = format!("Turn {i}: tell me about lighthouses and the number {}.", i * 7);
        let before = s.state.len();
        let p = s.prepare_turn(&model, &tok, &message, 32).unwrap();
        assert_eq!(p.dropped_tokens, 0);
        // The turn's own tokens are fed, and (as with Qwen3.5) the last reply again: the
        // template renders a finished reply otherwise than the cache holds it after the
        // generation prompt, so the session cuts back and re-feeds it.
        let refed = p.fed_tokens - (s.state.len() - before);
        let last_reply = if i == 0 { 0 } else { tok.encode_text(&reply_of(i - 1)).unwrap().len() };
        assert!(refed <= last_reply + 8, "turn {i}: {refed} tokens fed again, the last reply is {last_reply}");
        let fresh = model.forward(s.state.tokens(), &mut model.make_state(2048, DType::F16)).unwrap();
        let diff = common::relative_diff(&p.logits, &fresh);
        assert!(diff < 1e-3, "turn {i}: the logits differ from a fresh prefill's by {diff} of the largest");
        let reply = reply_of(i);
        model.forward(&tok.encode_text(&reply).unwrap(), &mut s.state).unwrap();
        s.finish_reply(&reply);
    }
    let end_of_turn = tok.encode("<turn|>").unwrap();
    assert_eq!(end_of_turn.len(), 1);
    assert!(tok.is_stop(end_of_turn[0]), "`<turn|>` ends a reply");
}

/// A q8_0 KV cache decodes token by token as one forward over it does, up to what
/// quantizing the cache moves the logits (`common::assert_q8_0_cache_decodes_as_one_forward`).
#[test]
fn a_q8_0_cache_decodes_token_by_token_as_one_forward() {
    let dir = tempfile::tempdir().unwrap();
    common::assert_q8_0_cache_decodes_as_one_forward(&tiny(dir.path()), &TOKENS);
}
