//! LFM2 (short gated convolutions beside attention) on the tiny random-weight file whose
//! logits equal llama.cpp's (`llamacpp_conformance.rs`): its recurrent state fed token by
//! token, rolled back to a checkpoint, and counted from the file's header.

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
