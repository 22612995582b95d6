//! Shared test helpers: a tiny random-weight GGUF (llama, qwen3 or gemma3 layout, BPE or
//! SentencePiece vocabulary) written by the test, and the path of the real default model.
#![allow(dead_code)]

pub mod lfm2;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

pub mod gemma4;
pub mod qwen35;

/// The default model; the test suite fetches it before running (scripts/test).
pub fn default_model() -> PathBuf {
    let p = pocketchat::catalog::default_model_path();
    assert!(p.exists(), "the default model is missing at {} — run `scripts/fetch-model.sh` (CI does)", p.display());
    p
}

/// A second real file for tests that switch models: the default model's Q8_0 copy, made
/// here on request (as `pocketchat quantize` does) when it is not in the models folder
/// yet. The app never makes or picks this file by itself.
pub fn q8_copy_of_default() -> PathBuf {
    let src = default_model();
    let copy = pocketchat::catalog::quant_sibling_path(&src, "Q8_0");
    if !copy.is_file() {
        pocketchat::catalog::quantize_q8_0(&src, &copy).expect("the Q8_0 copy of the default model");
    }
    copy
}

pub struct TinySpec {
    pub n_layers: usize,
    pub weight_dtype: GgmlDType,
    pub arch: &'static str,
    pub tokenizer_model: &'static str,
    /// Metadata written instead of (or besides) the usual entries: hostile-file tests.
    pub meta_overrides: Vec<(String, Value)>,
}

impl TinySpec {
    /// An all-f32 file of `arch` (llama, qwen3, gemma3) with `n_layers` layers and the
    /// family's tokenizer kind: the files compared across kernels and with llama.cpp.
    pub fn f32_family(arch: &'static str, n_layers: usize) -> TinySpec {
        TinySpec {
            n_layers,
            weight_dtype: GgmlDType::F32,
            arch,
            tokenizer_model: if arch == "gemma3" { "llama" } else { "gpt2" },
            meta_overrides: Vec::new(),
        }
    }
}

impl Default for TinySpec {
    fn default() -> Self {
        TinySpec {
            n_layers: 2,
            weight_dtype: GgmlDType::Q8_0,
            arch: "llama",
            tokenizer_model: "gpt2",
            meta_overrides: Vec::new(),
        }
    }
}

/// 4 heads of 64: the head size the fast attention kernels take (SmolLM2's).
pub const EMBED: usize = 256;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const FFN: usize = 128;
/// The sliding window of the tiny gemma3 file: shorter than the tests' prompts.
pub const GEMMA3_WINDOW: usize = 5;

/// A tiny SentencePiece vocabulary (Gemma's layout): pad, eos, bos, unk, the turn
/// markers, a few merged pieces with scores, and the 256 byte pieces. Values: pieces,
/// scores, kinds.
fn spm_vocab() -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut pieces: Vec<(String, f32, i32)> = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
        .iter()
        .enumerate()
        .map(|(i, p)| (p.to_string(), 0.0, if i == 3 { 2 } else { 3 }))
        .collect();
    pieces.push(("\n".into(), 0.0, 4));
    for (i, p) in ["▁", "e", "t", "o", "h", "l", "▁t", "he", "▁the", "ll", "llo", "▁he", "▁hello", "user", "model"]
        .iter()
        .enumerate()
    {
        pieces.push((p.to_string(), -(i as f32), 1));
    }
    pieces.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, 6)));
    (
        pieces.iter().map(|p| p.0.clone()).collect(),
        pieces.iter().map(|p| p.1).collect(),
        pieces.iter().map(|p| p.2).collect(),
    )
}

/// A tiny GPT2-BPE vocabulary: the 256 byte-level symbols, one merge, and two ChatML
/// special tokens.
fn vocab() -> (Vec<String>, Vec<String>) {
    let mut tokens: Vec<String> =
        tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet().into_iter().map(|c| c.to_string()).collect();
    tokens.sort();
    tokens.push("Ġt".into());
    tokens.push("<|im_start|>".into());
    tokens.push("<|im_end|>".into());
    (tokens, vec!["Ġ t".into()])
}

/// Writes a random-weight llama GGUF into `dir` and returns its path.
///
/// `arch` "qwen3" adds q/k head norms; "gemma3" adds those, the post-attention and post-FFN
/// norms, and a sliding window of [`GEMMA3_WINDOW`] positions. `tokenizer_model` "llama"
/// writes a SentencePiece vocabulary.
pub fn write_tiny_gguf(dir: &Path, spec: &TinySpec, seed: u64) -> PathBuf {
    let dev = Device::Cpu;
    let spm = spec.tokenizer_model == "llama";
    let (tokens, merges) = vocab();
    let (spm_tokens, spm_scores, spm_kinds) = spm_vocab();
    let tokens = if spm { spm_tokens } else { tokens };
    let n_vocab = tokens.len();
    let (head_norms, post_norms) = match spec.arch {
        "qwen3" => (true, false),
        "gemma3" => (true, true),
        _ => (false, false),
    };
    let mut rng = Xorshift(seed);
    let mut rand = |shape: (usize, usize), scale: f32| rng.tensor(shape, scale, &dev);
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let q = |t: &Tensor, dt: GgmlDType| QTensor::quantize(t, dt).unwrap();
    // An all-f32 file has f32 embeddings too: scripts/llamacpp_reference.py writes the
    // same file for llama.cpp without having to reproduce ggml's 8-bit rounding.
    let embedding_dtype = if spec.weight_dtype == GgmlDType::F32 { GgmlDType::F32 } else { GgmlDType::Q8_0 };
    tensors.push(("token_embd.weight".into(), q(&rand((n_vocab, EMBED), 1.0), embedding_dtype)));
    let head_dim = EMBED / HEADS;
    for i in 0..spec.n_layers {
        let p = format!("blk.{i}");
        let w = spec.weight_dtype;
        tensors.push((format!("{p}.attn_q.weight"), q(&rand((EMBED, EMBED), 0.3), w)));
        tensors.push((format!("{p}.attn_k.weight"), q(&rand((KV_HEADS * head_dim, EMBED), 0.3), w)));
        tensors.push((format!("{p}.attn_v.weight"), q(&rand((KV_HEADS * head_dim, EMBED), 0.3), w)));
        tensors.push((format!("{p}.attn_output.weight"), q(&rand((EMBED, EMBED), 0.3), w)));
        tensors.push((format!("{p}.ffn_gate.weight"), q(&rand((FFN, EMBED), 0.3), w)));
        tensors.push((format!("{p}.ffn_up.weight"), q(&rand((FFN, EMBED), 0.3), w)));
        tensors.push((format!("{p}.ffn_down.weight"), q(&rand((EMBED, FFN), 0.3), w)));
        let norm = (rand((1, EMBED), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
        tensors.push((format!("{p}.attn_norm.weight"), q(&norm, GgmlDType::F32)));
        tensors.push((format!("{p}.ffn_norm.weight"), q(&norm, GgmlDType::F32)));
        if head_norms {
            let head = (rand((1, head_dim), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
            tensors.push((format!("{p}.attn_q_norm.weight"), q(&head, GgmlDType::F32)));
            let head = (rand((1, head_dim), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
            tensors.push((format!("{p}.attn_k_norm.weight"), q(&head, GgmlDType::F32)));
        }
        if post_norms {
            let norm = (rand((1, EMBED), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
            tensors.push((format!("{p}.post_attention_norm.weight"), q(&norm, GgmlDType::F32)));
            let norm = (rand((1, EMBED), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
            tensors.push((format!("{p}.post_ffw_norm.weight"), q(&norm, GgmlDType::F32)));
        }
    }
    let norm = (rand((1, EMBED), 0.2) + 1.0).unwrap().squeeze(0).unwrap();
    tensors.push(("output_norm.weight".into(), q(&norm, GgmlDType::F32)));

    let a = spec.arch;
    let s = |v: &str| Value::String(v.to_string());
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), s(a)),
        ("general.name".into(), s("tiny-test")),
        (format!("{a}.attention.head_count"), Value::U32(HEADS as u32)),
        (format!("{a}.attention.head_count_kv"), Value::U32(KV_HEADS as u32)),
        (format!("{a}.block_count"), Value::U32(spec.n_layers as u32)),
        (format!("{a}.embedding_length"), Value::U32(EMBED as u32)),
        (format!("{a}.feed_forward_length"), Value::U32(FFN as u32)),
        (format!("{a}.context_length"), Value::U32(512)),
        (format!("{a}.rope.dimension_count"), Value::U32(head_dim as u32)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (format!("{a}.rope.freq_base"), Value::F32(10_000.0)),
        ("tokenizer.ggml.model".into(), s(spec.tokenizer_model)),
        ("tokenizer.ggml.pre".into(), s("smollm")),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens.iter().map(|t| s(t)).collect())),
        ("tokenizer.ggml.merges".into(), Value::Array(merges.iter().map(|t| s(t)).collect())),
    ];
    if spm {
        meta.retain(|(k, _)| k != "tokenizer.ggml.merges" && k != "tokenizer.ggml.pre");
        meta.extend([
            ("tokenizer.ggml.scores".into(), Value::Array(spm_scores.iter().map(|&x| Value::F32(x)).collect())),
            ("tokenizer.ggml.token_type".into(), Value::Array(spm_kinds.iter().map(|&x| Value::I32(x)).collect())),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(2)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
            ("tokenizer.ggml.unknown_token_id".into(), Value::U32(3)),
            ("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false)),
        ]);
    } else {
        meta.extend([
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(n_vocab as u32 - 2)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(n_vocab as u32 - 1)),
        ]);
    }
    if spec.arch == "gemma3" {
        meta.push((format!("{a}.attention.sliding_window"), Value::U32(GEMMA3_WINDOW as u32)));
    }
    if head_norms {
        meta.push((format!("{a}.attention.key_length"), Value::U32(head_dim as u32)));
        meta.push((format!("{a}.attention.value_length"), Value::U32(head_dim as u32)));
    }
    for (key, value) in &spec.meta_overrides {
        meta.retain(|(k, _)| k != key);
        meta.push((key.clone(), value.clone()));
    }
    let path = dir.join(format!("tiny-{a}-{}l-{:?}.gguf", spec.n_layers, spec.weight_dtype));
    let mut f = std::fs::File::create(&path).unwrap();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
    path
}

/// Largest absolute difference between two tensors of the same shape.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// Largest difference between two logits rows, relative to the largest logit of `b`.
pub fn relative_diff(a: &Tensor, b: &Tensor) -> f32 {
    let scale = b.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
    max_abs_diff(a, b) / scale
}

/// The model at `path`, with each kernel set, decodes `tokens` one at a time after a
/// prefill of the first `prefill` and gets the logits of one forward over all of them
/// (within 1e-4 of the largest logit).
pub fn assert_decodes_as_one_forward(path: &Path, tokens: &[u32], prefill: usize) {
    use pocketchat::engine::{Kernels, Model};
    for kernels in [Kernels::Candle, Kernels::Fast] {
        let model = Model::load(path, &Device::Cpu, kernels, |_| {}).unwrap();
        let full = model.forward_all(tokens, &mut model.make_state(64, candle_core::DType::F32)).unwrap();
        let mut state = model.make_state(64, candle_core::DType::F32);
        let mut rows = vec![model.forward(&tokens[..prefill], &mut state).unwrap()];
        for &t in &tokens[prefill..] {
            rows.push(model.forward(&[t], &mut state).unwrap());
        }
        assert_eq!(state.len(), tokens.len());
        for (i, row) in rows.iter().enumerate() {
            let at = prefill - 1 + i;
            let diff = relative_diff(row, &full.get(at).unwrap());
            assert!(diff < 1e-4, "{kernels:?}: position {at} differs by {diff} of the largest logit");
        }
    }
}

/// A q8_0 KV cache (of the attention layers) decodes `tokens` one at a time as one
/// forward over it does, with both kernel sets, up to rounding: a row's keys computed in a
/// batch or alone differ in their last bits, which can move a value to the next q8_0 step.
/// So the two may differ by no more than quantizing the cache moves the logits at all (one
/// forward over a q8_0 cache against one over an f32 cache).
pub fn assert_q8_0_cache_decodes_as_one_forward(path: &Path, tokens: &[u32]) {
    use pocketchat::engine::{Kernels, KvDtype, Model};
    for kernels in [Kernels::Candle, Kernels::Fast] {
        let model = Model::load(path, &Device::Cpu, kernels, |_| {}).unwrap();
        let all = |kv: KvDtype| model.forward_all(tokens, &mut model.make_state(64, kv)).unwrap();
        let (q8_0, f32) = (all(KvDtype::Q8_0), all(KvDtype::F32));
        let mut state = model.make_state(64, KvDtype::Q8_0);
        let steps: Vec<Tensor> = tokens.iter().map(|&t| model.forward(&[t], &mut state).unwrap()).collect();
        let steps = Tensor::stack(&steps, 0).unwrap();
        let (diff, quantization) = (relative_diff(&steps, &q8_0), relative_diff(&q8_0, &f32));
        println!("{kernels:?}: token by token {diff}, q8_0 against f32 {quantization} of the largest logit");
        assert!(diff <= quantization, "{kernels:?}: token by token the logits differ by {diff} of the largest");
    }
}

/// The tiny files' random weights: xorshift64 values spread over (-scale, scale), one fixed
/// sequence per seed (the files' sha256 are in the llama.cpp fixture).
pub struct Xorshift(pub u64);

impl Xorshift {
    pub fn tensor(&mut self, shape: (usize, usize), scale: f32, dev: &Device) -> Tensor {
        let data: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 % 10_000) as f32 / 10_000.0 - 0.5) * 2.0 * scale
            })
            .collect();
        Tensor::from_vec(data, shape, dev).unwrap()
    }
}
