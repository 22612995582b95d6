//! Random-weight LFM2 files (`general.architecture = lfm2`): short gated convolution
//! layers beside GQA attention layers with q/k head norms, as llama.cpp's
//! `src/models/lfm2.cpp` loads them. Deterministic for a seed.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// The convolution's taps (`shortconv.l_cache`), LFM2's own.
pub const TAPS: usize = 3;

/// A file's shape and vocabulary.
pub struct Lfm2Spec {
    /// Per layer: `true` for attention, `false` for a short convolution.
    pub attention: Vec<bool>,
    pub width: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    /// Matrices' type; the embeddings are f32 with f32 matrices, Q8_0 otherwise.
    pub weight_dtype: GgmlDType,
    /// A vocabulary-only GGUF whose `tokenizer.*` keys (and token count) the file takes;
    /// `None`: the tiny byte-level BPE vocabulary of [`super::write_tiny_gguf`].
    pub vocabulary: Option<PathBuf>,
    /// Metadata written over the usual entries (a chat template, the end-of-turn token).
    pub meta_overrides: Vec<(String, Value)>,
}

impl Lfm2Spec {
    /// The conformance file: five f32 layers, conv conv attention conv attention, with
    /// the tiny files' widths (heads of 64).
    pub fn tiny() -> Lfm2Spec {
        Lfm2Spec {
            attention: vec![false, false, true, false, true],
            width: super::EMBED,
            heads: super::HEADS,
            kv_heads: super::KV_HEADS,
            ffn: super::FFN,
            weight_dtype: GgmlDType::F32,
            vocabulary: None,
            meta_overrides: Vec::new(),
        }
    }
}

/// The tokenizer keys of a vocabulary-only GGUF, and its token count.
pub fn vocabulary_of(path: &Path) -> (Vec<(String, Value)>, usize) {
    let mut f = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let n = content.metadata["tokenizer.ggml.tokens"].to_vec().unwrap().len();
    let mut keys: Vec<(String, Value)> =
        content.metadata.into_iter().filter(|(k, _)| k.starts_with("tokenizer.")).collect();
    // In one order whatever the map's, so the file's bytes depend on the seed alone.
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    (keys, n)
}

/// The tiny BPE vocabulary's keys and token count.
fn tiny_vocabulary() -> (Vec<(String, Value)>, usize) {
    let (tokens, merges) = super::vocab();
    let n = tokens.len();
    let s = |v: &str| Value::String(v.to_string());
    let keys = vec![
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("smollm")),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens.iter().map(|t| s(t)).collect())),
        ("tokenizer.ggml.merges".into(), Value::Array(merges.iter().map(|m| s(m)).collect())),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(n as u32 - 2)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(n as u32 - 1)),
    ];
    (keys, n)
}

/// Writes the file into `dir` as `name` and returns its path.
pub fn write_lfm2_gguf(dir: &Path, name: &str, spec: &Lfm2Spec, seed: u64) -> PathBuf {
    let dev = Device::Cpu;
    let (vocab_keys, n_vocab) = match &spec.vocabulary {
        Some(path) => vocabulary_of(path),
        None => tiny_vocabulary(),
    };
    let width = spec.width;
    let head_dim = width / spec.heads;
    let mut rng = super::Xorshift(seed);
    let mut rand = |shape: (usize, usize), scale: f32| rng.tensor(shape, scale, &dev);
    let q = |t: &Tensor, dt: GgmlDType| QTensor::quantize(t, dt).unwrap();
    let f32 = GgmlDType::F32;
    let w = spec.weight_dtype;
    let embedding_dtype = if w == f32 { f32 } else { GgmlDType::Q8_0 };
    let mut tensors: Vec<(String, QTensor)> =
        vec![("token_embd.weight".into(), q(&rand((n_vocab, width), 1.0), embedding_dtype))];
    for (i, &attention) in spec.attention.iter().enumerate() {
        let p = format!("blk.{i}");
        let mut norm = |len: usize| (rand((1, len), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
        let (attn_norm, ffn_norm) = (norm(width), norm(width));
        tensors.push((format!("{p}.attn_norm.weight"), q(&attn_norm, f32)));
        tensors.push((format!("{p}.ffn_norm.weight"), q(&ffn_norm, f32)));
        if attention {
            let (q_norm, k_norm) = (norm(head_dim), norm(head_dim));
            tensors.push((format!("{p}.attn_q_norm.weight"), q(&q_norm, f32)));
            tensors.push((format!("{p}.attn_k_norm.weight"), q(&k_norm, f32)));
            tensors.push((format!("{p}.attn_q.weight"), q(&rand((width, width), 0.3), w)));
            tensors.push((format!("{p}.attn_k.weight"), q(&rand((spec.kv_heads * head_dim, width), 0.3), w)));
            tensors.push((format!("{p}.attn_v.weight"), q(&rand((spec.kv_heads * head_dim, width), 0.3), w)));
            tensors.push((format!("{p}.attn_output.weight"), q(&rand((width, width), 0.3), w)));
        } else {
            tensors.push((format!("{p}.shortconv.in_proj.weight"), q(&rand((3 * width, width), 0.3), w)));
            tensors.push((format!("{p}.shortconv.out_proj.weight"), q(&rand((width, width), 0.3), w)));
            tensors.push((format!("{p}.shortconv.conv.weight"), q(&rand((width, TAPS), 0.5), f32)));
        }
        tensors.push((format!("{p}.ffn_gate.weight"), q(&rand((spec.ffn, width), 0.3), w)));
        tensors.push((format!("{p}.ffn_up.weight"), q(&rand((spec.ffn, width), 0.3), w)));
        tensors.push((format!("{p}.ffn_down.weight"), q(&rand((width, spec.ffn), 0.3), w)));
    }
    let norm = (rand((1, width), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
    tensors.push(("token_embd_norm.weight".into(), q(&norm, f32)));

    let a = "lfm2";
    let kv_per_layer: Vec<Value> =
        spec.attention.iter().map(|&att| Value::I32(if att { spec.kv_heads as i32 } else { 0 })).collect();
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.name".into(), Value::String("tiny-lfm2".into())),
        (format!("{a}.block_count"), Value::U32(spec.attention.len() as u32)),
        (format!("{a}.context_length"), Value::U32(2048)),
        (format!("{a}.embedding_length"), Value::U32(width as u32)),
        (format!("{a}.feed_forward_length"), Value::U32(spec.ffn as u32)),
        (format!("{a}.attention.head_count"), Value::U32(spec.heads as u32)),
        (format!("{a}.attention.head_count_kv"), Value::Array(kv_per_layer)),
        (format!("{a}.rope.freq_base"), Value::F32(1_000_000.0)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (format!("{a}.vocab_size"), Value::U32(n_vocab as u32)),
        (format!("{a}.shortconv.l_cache"), Value::U32(TAPS as u32)),
    ];
    meta.extend(vocab_keys);
    for (key, value) in &spec.meta_overrides {
        meta.retain(|(k, _)| k != key);
        meta.push((key.clone(), value.clone()));
    }
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
    path
}
