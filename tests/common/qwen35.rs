//! A tiny random-weight Qwen3.5 (`qwen35`) GGUF: every fourth layer attention (gated,
//! partial RoPE, q/k head norms), the others gated delta-net, all f32, with the tiny BPE
//! vocabulary of the other tiny files. Deterministic for a seed: llama.cpp's logits for it
//! are stored by sha256 (`scripts/llamacpp_reference.py tiny`).

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::{EMBED, FFN, HEADS, KV_HEADS};

/// Attention heads of 64 (as the other tiny files), RoPE over their first 16 values.
pub const HEAD_DIM: usize = 64;
pub const ROPE_DIM: usize = 16;
/// Delta-net: 2 query/key heads, 4 value heads (each key head serves two), heads of 32,
/// a convolution of 4 taps. Qwen3.5-4B also has twice as many value heads as key heads.
pub const SSM_K_HEADS: usize = 2;
pub const SSM_V_HEADS: usize = 4;
pub const SSM_HEAD: usize = 32;
pub const SSM_KERNEL: usize = 4;

/// Writes `tiny-qwen35-{n_layers}l.gguf` into `dir` (layer `i` is attention when
/// `(i + 1) % 4 == 0`) and returns its path.
pub fn write_tiny_qwen35(dir: &Path, n_layers: usize, seed: u64) -> PathBuf {
    write_tiny_qwen35_with(dir, n_layers, seed, Vec::new())
}

/// [`write_tiny_qwen35`] with metadata entries added (or replaced). Overrides that bring
/// their own `tokenizer.ggml.tokens` (a real vocabulary) size the embedding table by it.
pub fn write_tiny_qwen35_with(dir: &Path, n_layers: usize, seed: u64, overrides: Vec<(String, Value)>) -> PathBuf {
    let dev = Device::Cpu;
    let (tokens, merges) = super::vocab();
    let n_vocab = overrides
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .map_or(tokens.len(), |(_, v)| v.to_vec().map_or(0, |t| t.len()));
    let mut rng = super::Xorshift(seed);
    let mut rand = |shape: (usize, usize), scale: f32| rng.tensor(shape, scale, &dev);
    let f32 = |t: Tensor| QTensor::quantize(&t, GgmlDType::F32).unwrap();
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    tensors.push(("token_embd.weight".into(), f32(rand((n_vocab, EMBED), 1.0))));
    let key_width = SSM_K_HEADS * SSM_HEAD;
    let value_width = SSM_V_HEADS * SSM_HEAD;
    let conv_channels = 2 * key_width + value_width;
    for i in 0..n_layers {
        let p = format!("blk.{i}");
        let norm = (rand((1, EMBED), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
        tensors.push((format!("{p}.attn_norm.weight"), f32(norm)));
        let norm = (rand((1, EMBED), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
        tensors.push((format!("{p}.post_attention_norm.weight"), f32(norm)));
        if (i + 1) % 4 == 0 {
            tensors.push((format!("{p}.attn_q.weight"), f32(rand((2 * HEADS * HEAD_DIM, EMBED), 0.3))));
            tensors.push((format!("{p}.attn_k.weight"), f32(rand((KV_HEADS * HEAD_DIM, EMBED), 0.3))));
            tensors.push((format!("{p}.attn_v.weight"), f32(rand((KV_HEADS * HEAD_DIM, EMBED), 0.3))));
            tensors.push((format!("{p}.attn_output.weight"), f32(rand((EMBED, HEADS * HEAD_DIM), 0.3))));
            let head = (rand((1, HEAD_DIM), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
            tensors.push((format!("{p}.attn_q_norm.weight"), f32(head)));
            let head = (rand((1, HEAD_DIM), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
            tensors.push((format!("{p}.attn_k_norm.weight"), f32(head)));
        } else {
            tensors.push((format!("{p}.attn_qkv.weight"), f32(rand((conv_channels, EMBED), 0.3))));
            tensors.push((format!("{p}.attn_gate.weight"), f32(rand((value_width, EMBED), 0.3))));
            tensors.push((format!("{p}.ssm_conv1d.weight"), f32(rand((conv_channels, SSM_KERNEL), 0.5))));
            let dt = rand((1, SSM_V_HEADS), 1.0).squeeze(0).unwrap();
            tensors.push((format!("{p}.ssm_dt.bias"), f32(dt)));
            // -exp(A_log), as the converter writes it: decay rates between -e^-1 and -e.
            let a = rand((1, SSM_V_HEADS), 1.0).exp().unwrap().neg().unwrap().squeeze(0).unwrap();
            tensors.push((format!("{p}.ssm_a"), f32(a)));
            tensors.push((format!("{p}.ssm_beta.weight"), f32(rand((SSM_V_HEADS, EMBED), 0.3))));
            tensors.push((format!("{p}.ssm_alpha.weight"), f32(rand((SSM_V_HEADS, EMBED), 0.3))));
            let norm = (rand((1, SSM_HEAD), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
            tensors.push((format!("{p}.ssm_norm.weight"), f32(norm)));
            tensors.push((format!("{p}.ssm_out.weight"), f32(rand((EMBED, value_width), 0.3))));
        }
        tensors.push((format!("{p}.ffn_gate.weight"), f32(rand((FFN, EMBED), 0.3))));
        tensors.push((format!("{p}.ffn_up.weight"), f32(rand((FFN, EMBED), 0.3))));
        tensors.push((format!("{p}.ffn_down.weight"), f32(rand((EMBED, FFN), 0.3))));
    }
    let norm = (rand((1, EMBED), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
    tensors.push(("output_norm.weight".into(), f32(norm)));

    let a = "qwen35";
    let s = |v: &str| Value::String(v.to_string());
    let u = |v: usize| Value::U32(v as u32);
    // Text positions are the same in every section, so the sections (summing to half the
    // rotated values, as Qwen3.5's 11 + 11 + 10 of 64) do not change the rotation.
    let sections = Value::Array([3, 3, 2, 0].iter().map(|&x| Value::I32(x)).collect());
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), s(a)),
        ("general.name".into(), s("tiny-test")),
        (format!("{a}.attention.head_count"), u(HEADS)),
        (format!("{a}.attention.head_count_kv"), u(KV_HEADS)),
        (format!("{a}.attention.key_length"), u(HEAD_DIM)),
        (format!("{a}.attention.value_length"), u(HEAD_DIM)),
        (format!("{a}.block_count"), u(n_layers)),
        (format!("{a}.embedding_length"), u(EMBED)),
        (format!("{a}.feed_forward_length"), u(FFN)),
        (format!("{a}.context_length"), u(512)),
        (format!("{a}.rope.dimension_count"), u(ROPE_DIM)),
        (format!("{a}.rope.dimension_sections"), sections),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (format!("{a}.rope.freq_base"), Value::F32(10_000_000.0)),
        (format!("{a}.full_attention_interval"), u(4)),
        (format!("{a}.ssm.conv_kernel"), u(SSM_KERNEL)),
        (format!("{a}.ssm.state_size"), u(SSM_HEAD)),
        (format!("{a}.ssm.group_count"), u(SSM_K_HEADS)),
        (format!("{a}.ssm.time_step_rank"), u(SSM_V_HEADS)),
        (format!("{a}.ssm.inner_size"), u(value_width)),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("smollm")),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens.iter().map(|t| s(t)).collect())),
        ("tokenizer.ggml.merges".into(), Value::Array(merges.iter().map(|t| s(t)).collect())),
        ("tokenizer.ggml.bos_token_id".into(), u(n_vocab - 2)),
        ("tokenizer.ggml.eos_token_id".into(), u(n_vocab - 1)),
    ];
    for (key, value) in overrides {
        meta.retain(|(k, _)| *k != key);
        meta.push((key, value));
    }
    let path = dir.join(format!("tiny-qwen35-{n_layers}l.gguf"));
    let mut f = std::fs::File::create(&path).unwrap();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
    path
}
