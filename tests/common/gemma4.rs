//! A tiny random-weight Gemma 4 (`gemma4`) GGUF, as llama.cpp's `src/models/gemma4.cpp`
//! loads it, cut down from E2B's shape but with each of its features: sliding layers with
//! heads of 64 beside global layers with heads of 128 (proportional RoPE through
//! `rope_freqs`, other bases), per-layer inputs, the last two layers reading the K/V of
//! earlier ones (one of each kind) with FFNs twice as wide, a layer without `attn_v` (its
//! keys are its values), per-layer output scales and soft-capped logits. All f32, with the
//! tiny BPE vocabulary of the other tiny files. Deterministic for a seed: llama.cpp's
//! logits for it are stored by sha256 (`scripts/llamacpp_reference.py tiny`).

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::{EMBED, FFN, HEADS, KV_HEADS};

/// Which layers slide: E2B's pattern is four sliding, one global; here two or one.
pub const SLIDING: [bool; 7] = [true, true, false, true, false, true, false];
/// The last layers read the K/V of the last earlier layer of their kind: layer 5
/// (sliding) layer 3's, layer 6 (global) layer 4's.
pub const SHARED_KV_LAYERS: usize = 2;
pub const HEAD_DIM_SLIDING: usize = 64;
pub const HEAD_DIM_GLOBAL: usize = 128;
/// Global layers rotate the first quarter of their values' frequency pairs: the
/// converter's `rope_freqs` holds 1 for those and 1e30 for the others (E2B: 0.25 of 512).
pub const ROTATED_PAIRS_GLOBAL: usize = 16;
pub const WINDOW: usize = 5;
/// Per-layer input width (E2B's is 256 for a width of 1,536).
pub const PER_LAYER: usize = 32;
/// The layer whose values are its keys (no `attn_v`).
pub const NO_VALUES_LAYER: usize = 1;
pub const SOFTCAP: f32 = 30.0;

/// A file's shape and vocabulary.
pub struct Gemma4Spec {
    /// Per layer: whether it slides.
    pub sliding: Vec<bool>,
    /// The last this many layers read an earlier layer's K/V.
    pub shared_kv_layers: usize,
    pub width: usize,
    pub per_layer: usize,
    /// Matrices' and tables' type (the norms stay f32).
    pub dtype: GgmlDType,
    /// Tokenizer keys (and the token count) to write instead of the tiny BPE vocabulary's.
    pub vocabulary: Option<(Vec<(String, Value)>, usize)>,
}

impl Gemma4Spec {
    /// The conformance file's: seven f32 layers, heads of 64 and 128, the tiny vocabulary.
    pub fn tiny() -> Gemma4Spec {
        Gemma4Spec {
            sliding: SLIDING.to_vec(),
            shared_kv_layers: SHARED_KV_LAYERS,
            width: EMBED,
            per_layer: PER_LAYER,
            dtype: GgmlDType::F32,
            vocabulary: None,
        }
    }
}

/// Writes `tiny-gemma4-7l.gguf` (the conformance file) into `dir` and returns its path.
pub fn write_tiny_gemma4(dir: &Path, seed: u64) -> PathBuf {
    write_gemma4(dir, "tiny-gemma4-7l.gguf", &Gemma4Spec::tiny(), seed)
}

/// Writes a Gemma 4 file of `spec` into `dir` as `name` and returns its path.
pub fn write_gemma4(dir: &Path, name: &str, spec: &Gemma4Spec, seed: u64) -> PathBuf {
    let dev = Device::Cpu;
    let (tokens, merges) = super::vocab();
    let n_vocab = spec.vocabulary.as_ref().map_or(tokens.len(), |(_, n)| *n);
    let n_layers = spec.sliding.len();
    let own = n_layers - spec.shared_kv_layers;
    let (width, per_layer) = (spec.width, spec.per_layer);
    // One sequence for the norms, one for the matrices.
    let mut norms = super::Xorshift(seed);
    let mut matrices = super::Xorshift(seed.wrapping_mul(31).wrapping_add(7));
    let f32 = |t: Tensor| QTensor::quantize(&t, GgmlDType::F32).unwrap();
    let dtype = spec.dtype;
    let mut matrix =
        |shape: (usize, usize), scale: f32| QTensor::quantize(&matrices.tensor(shape, scale, &dev), dtype).unwrap();
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut norm = |name: String, len: usize, tensors: &mut Vec<(String, QTensor)>| {
        let w = (norms.tensor((1, len), 0.2, &dev) + 1.0).unwrap().squeeze(0).unwrap();
        tensors.push((name, f32(w)));
    };
    tensors.push(("token_embd.weight".into(), matrix((n_vocab, width), 1.0)));
    tensors.push(("per_layer_token_embd.weight".into(), matrix((n_vocab, n_layers * per_layer), 1.0)));
    tensors.push(("per_layer_model_proj.weight".into(), matrix((n_layers * per_layer, width), 0.3)));
    norm("per_layer_proj_norm.weight".into(), per_layer, &mut tensors);
    // Proportional RoPE of the global layers: the first pairs turn, the others do not.
    let factors: Vec<f32> =
        (0..HEAD_DIM_GLOBAL / 2).map(|i| if i < ROTATED_PAIRS_GLOBAL { 1.0 } else { 1e30 }).collect();
    tensors.push(("rope_freqs.weight".into(), f32(Tensor::from_vec(factors, HEAD_DIM_GLOBAL / 2, &dev).unwrap())));
    let mut ffn_lengths = Vec::new();
    for (i, &sliding) in spec.sliding.iter().enumerate() {
        let p = format!("blk.{i}");
        let hd = if sliding { HEAD_DIM_SLIDING } else { HEAD_DIM_GLOBAL };
        norm(format!("{p}.attn_norm.weight"), width, &mut tensors);
        tensors.push((format!("{p}.attn_q.weight"), matrix((HEADS * hd, width), 0.3)));
        norm(format!("{p}.attn_q_norm.weight"), hd, &mut tensors);
        if i < own {
            tensors.push((format!("{p}.attn_k.weight"), matrix((KV_HEADS * hd, width), 0.3)));
            if i != NO_VALUES_LAYER {
                tensors.push((format!("{p}.attn_v.weight"), matrix((KV_HEADS * hd, width), 0.3)));
            }
            norm(format!("{p}.attn_k_norm.weight"), hd, &mut tensors);
        }
        tensors.push((format!("{p}.attn_output.weight"), matrix((width, HEADS * hd), 0.3)));
        norm(format!("{p}.post_attention_norm.weight"), width, &mut tensors);
        // E2B's layers that share K/V have FFNs twice as wide.
        let ffn = if i < own { FFN } else { 2 * FFN };
        ffn_lengths.push(ffn);
        norm(format!("{p}.ffn_norm.weight"), width, &mut tensors);
        tensors.push((format!("{p}.ffn_gate.weight"), matrix((ffn, width), 0.3)));
        tensors.push((format!("{p}.ffn_up.weight"), matrix((ffn, width), 0.3)));
        tensors.push((format!("{p}.ffn_down.weight"), matrix((width, ffn), 0.3)));
        norm(format!("{p}.post_ffw_norm.weight"), width, &mut tensors);
        tensors.push((format!("{p}.inp_gate.weight"), matrix((per_layer, width), 0.3)));
        tensors.push((format!("{p}.proj.weight"), matrix((width, per_layer), 0.3)));
        norm(format!("{p}.post_norm.weight"), width, &mut tensors);
        let scale = 0.5 + 0.1 * i as f32;
        tensors.push((format!("{p}.layer_output_scale.weight"), f32(Tensor::new(&[scale], &dev).unwrap())));
    }
    norm("output_norm.weight".into(), width, &mut tensors);

    let a = "gemma4";
    let s = |v: &str| Value::String(v.to_string());
    let u = |v: usize| Value::U32(v as u32);
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), s(a)),
        ("general.name".into(), s("tiny-test")),
        (format!("{a}.attention.head_count"), u(HEADS)),
        (format!("{a}.attention.head_count_kv"), u(KV_HEADS)),
        (format!("{a}.attention.key_length"), u(HEAD_DIM_GLOBAL)),
        (format!("{a}.attention.value_length"), u(HEAD_DIM_GLOBAL)),
        (format!("{a}.attention.key_length_swa"), u(HEAD_DIM_SLIDING)),
        (format!("{a}.attention.value_length_swa"), u(HEAD_DIM_SLIDING)),
        (format!("{a}.rope.dimension_count"), u(HEAD_DIM_GLOBAL)),
        (format!("{a}.rope.dimension_count_swa"), u(HEAD_DIM_SLIDING)),
        (format!("{a}.block_count"), u(n_layers)),
        (format!("{a}.embedding_length"), u(width)),
        (format!("{a}.embedding_length_per_layer_input"), u(per_layer)),
        (format!("{a}.feed_forward_length"), Value::Array(ffn_lengths.iter().map(|&f| u(f)).collect())),
        (format!("{a}.context_length"), u(512)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (format!("{a}.rope.freq_base"), Value::F32(1_000_000.0)),
        (format!("{a}.rope.freq_base_swa"), Value::F32(10_000.0)),
        (format!("{a}.attention.sliding_window"), u(WINDOW)),
        (
            format!("{a}.attention.sliding_window_pattern"),
            Value::Array(spec.sliding.iter().map(|&b| Value::Bool(b)).collect()),
        ),
        (format!("{a}.attention.shared_kv_layers"), u(spec.shared_kv_layers)),
        (format!("{a}.final_logit_softcapping"), Value::F32(SOFTCAP)),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("smollm")),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens.iter().map(|t| s(t)).collect())),
        ("tokenizer.ggml.merges".into(), Value::Array(merges.iter().map(|t| s(t)).collect())),
        ("tokenizer.ggml.bos_token_id".into(), u(n_vocab - 2)),
        ("tokenizer.ggml.eos_token_id".into(), u(n_vocab - 1)),
    ];
    if let Some((keys, _)) = &spec.vocabulary {
        meta.retain(|(k, _)| !k.starts_with("tokenizer."));
        meta.extend(keys.iter().cloned());
    }
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
    path
}
