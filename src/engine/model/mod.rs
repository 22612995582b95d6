//! A llama-family transformer (architectures `llama`, `qwen2`, `qwen3`, `gemma3`,
//! `smollm3`, `lfm2`, `qwen35`, `gemma4`) over GGUF weights, with the KV cache kept
//! outside the model in a [`State`], like Core ML's `MLState`.
//!
//! ```text
//!   model.make_state(capacity) ──▶ State { per-layer K/V, token ids, len }
//!   model.forward(&new_tokens, &mut state) ──▶ logits of the last new token
//!                                        (appends K/V at positions len..len+n)
//! ```
//!
//! Unlike candle-transformers' `quantized_llama`, the cache never resets itself, the
//! token-embedding table stays quantized (rows are looked up, not a 113 MB f32 copy), the
//! tied output matrix shares that same tensor, RoPE angles are computed for the positions
//! of each call, and grouped-query attention reads the shared K/V heads without copying
//! them.
//!
//! What the families add to llama's block, as llama.cpp runs them:
//! - `qwen2`: biases on q, k and v; half-split ("neox") RoPE.
//! - `qwen3`: an RMSNorm over each q and k head before RoPE; no biases.
//! - `gemma3`: embeddings scaled by √width; q/k head norms; RMSNorms after attention and
//!   after the FFN as well as before; a GELU-gated FFN; five of every six layers attend
//!   to a sliding window of the last `attention.sliding_window` positions with RoPE base
//!   10,000, the sixth to everything with `rope.freq_base`.
//! - `smollm3`: llama's block; every fourth layer attends without rotary embeddings.
//! - `lfm2`: the layers whose `attention.head_count_kv` is 0 mix with a short gated
//!   convolution ([`short_conv`]) and keep a recurrent state; the others attend with q/k
//!   head norms and half-split RoPE.
//! - `gemma4`: gemma3's block with the sliding layers listed by the file, their heads of
//!   another size (and RoPE over other sizes) than the global layers'; values RMS-normed
//!   per head and scores not scaled by 1/√head_dim; per-layer inputs (a row of
//!   `per_layer_token_embd` per token plus a projection of its embedding) gated into the
//!   residual after each FFN, then a per-layer output scale; the last
//!   `attention.shared_kv_layers` layers attend over the K/V of the last earlier layer of
//!   their kind and keep none of their own; logits soft-capped (`final_logit_softcapping`).
//! - `qwen35`: three layers of every four are gated delta-net linear attention
//!   (`delta_net.rs`, a recurrent state per layer); the fourth attends with q/k head norms,
//!   a sigmoid gate on its output (`attn_q` gives query and gate per head) and RoPE over
//!   the first `rope.dimension_count` values of each head only. The norm before the FFN
//!   is named `post_attention_norm`.
//!
//! This file holds the model's parts; `load.rs` reads them from a GGUF (and the facts the
//! fit check needs from a header alone), `forward.rs` runs them.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor, D};

use super::cpu::kernels::Kernels;
use super::cpu::qlinear::QLinear as Linear;
use super::kv_type::KvDtype;
use super::state::{LayerMemory, State, MAX_CHECKPOINTS};
use super::weights::{MappedFile, MappedTensor};
use super::{Cause, EngineError, Result};
use crate::memory::{ModelFacts, PrefillShape};

mod arch;
mod delta_net;
mod forward;
mod load;
mod short_conv;
pub use arch::{Activation, ArchTraits, SlidingWindows, SUPPORTED_ARCHITECTURES};
use delta_net::{DeltaNet, DeltaNetShape};
pub use forward::argmax;
use load::Loader;
pub use load::{file_facts, header_facts, read_gguf, FileFacts};
use short_conv::ShortConv;

/// Upper bound for the RoPE tables when a file claims a huge context.
const MAX_ROPE_POSITIONS: usize = 32_768;

/// Prompt tokens one forward pass takes at most (see [`Model::forward`]); the memory
/// accounting reserves the activations of this many (`memory::prefill_scratch_bytes`).
pub const PREFILL_CHUNK: usize = 256;

/// Shape facts of a loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub name: String,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub embedding_length: usize,
    /// Width of the feed-forward layer (`ffn_up` rows).
    pub ffn_length: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rope_freq_base: f32,
    /// Values of each head RoPE rotates, the first ones: all of them but in qwen35.
    pub rope_dim: usize,
    pub rms_eps: f32,
    /// Interleaved (llama) or half-split (qwen2, qwen3, gemma3: "neox") rotary pairs.
    pub rope_neox: bool,
    /// Positions a sliding-window layer looks back over, itself included (gemma3).
    pub sliding_window: Option<usize>,
    /// The dtype of the attention/FFN matrices, e.g. Q4_1.
    pub weights_dtype: GgmlDType,
    /// Set when the file says it was requantized from another type (our `quantize`).
    pub requantized_from: Option<String>,
    pub file_bytes: u64,
    /// Weights copied into the process's own memory: matrices our kernels do not read in
    /// the file's layout (rewritten by `qlinear::repack`, or run by candle), the vectors,
    /// and everything on a GPU.
    pub heap_weight_bytes: u64,
    /// Weights read in place from the mapped file (`engine::weights`): clean pages the OS
    /// may drop and read again, not counted by jetsam.
    pub mapped_weight_bytes: u64,
    /// Of `mapped_weight_bytes`, tables read a row per token and never multiplied
    /// (gemma4's `per_layer_token_embd`): a chat touches the rows of the tokens it holds
    /// only, so the fit check does not count them as resident.
    pub lookup_table_bytes: u64,
    /// The matrices copied to the heap rather than read in place, with their types: the
    /// named exceptions to the mapping (empty when everything runs in place).
    pub copied_matrices: Vec<String>,
    /// What runs on candle's ops although our kernels were chosen (logged once at load).
    pub candle_fallbacks: Vec<String>,
}

/// One block: a mixer over positions (attention, or a hybrid model's recurrent layer)
/// and a gated FFN, each after an RMSNorm and added to the residual.
struct Layer {
    /// The norm before the mixer (`attn_norm` in the file whatever the mixer).
    attn_norm: Tensor,
    mixer: Mixer,
    /// RMSNorm of the mixer's and the FFN's output before the residual add (gemma3).
    post_attn_norm: Option<Tensor>,
    post_ffn_norm: Option<Tensor>,
    ffn_norm: Tensor,
    w_gate: Linear,
    w_up: Linear,
    w_down: Linear,
    /// Gemma 4: the gate and projection of this layer's per-layer input.
    input: Option<LayerInput>,
    /// Gemma 4: the layer's output is multiplied by this one value (`layer_output_scale`).
    out_scale: Option<Tensor>,
}

/// How a Gemma 4 layer adds its per-layer input: `x + norm(proj(gelu(gate(x)) · input))`.
struct LayerInput {
    /// `inp_gate`: width → per-layer width.
    gate: Linear,
    /// `proj`: per-layer width → width.
    projection: Linear,
    /// `post_norm`.
    norm: Tensor,
}

/// Gemma 4's per-layer inputs: for each token and layer a vector of `width` values, a
/// row of the token's in a table (looked up, like the token embeddings) plus a projection
/// of its embedding, as llama.cpp's `project_per_layer_inputs`.
struct PerLayerInputs {
    /// `per_layer_token_embd`: a row of `layers × width` per token.
    table: Embeddings,
    /// `per_layer_model_proj`: model width → `layers × width`.
    projection: Linear,
    /// `per_layer_proj_norm`, over each layer's `width` values.
    norm: Tensor,
    width: usize,
    layers: usize,
}

impl PerLayerInputs {
    /// The inputs of `ids` whose scaled embeddings are `x` `(n, model width)`: `(layers, n,
    /// width)`, a layer's contiguous.
    fn of(&self, ids: &[u32], x: &Tensor, eps: f32, device: &Device) -> candle_core::Result<Tensor> {
        let (n, width) = (ids.len(), x.dim(1)?);
        let shape = (n, self.layers, self.width);
        let rows = (self.table.lookup(ids, device)?.reshape(shape)? * (self.width as f64).sqrt())?;
        let projected = (self.projection.forward(x)? * (1.0 / (width as f64).sqrt()))?.reshape(shape)?;
        let projected = candle_nn::ops::rms_norm(&projected, &self.norm, eps)?;
        ((projected + rows)? * std::f64::consts::FRAC_1_SQRT_2)?.transpose(0, 1)?.contiguous()
    }
}

/// What mixes information across positions in a layer.
// One per layer, made once at load and never moved: the sizes of the variants do not matter.
#[allow(clippy::large_enum_variant)]
enum Mixer {
    Attention(Attention),
    /// LFM2's gated short convolution.
    ShortConv(ShortConv),
    /// Qwen3.5's gated delta-net linear attention.
    DeltaNet(DeltaNet),
}

impl Mixer {
    /// What the layer keeps in a [`State`] between calls.
    fn memory(&self) -> LayerMemory {
        match self {
            Mixer::Attention(a) => a.kv_source.map_or(LayerMemory::KeysValues, LayerMemory::SharedKeysValues),
            Mixer::ShortConv(s) => s.memory(),
            Mixer::DeltaNet(d) => d.memory(),
        }
    }

    /// The mixer's weight matrices, by their names in the file after `blk.N.`.
    fn matrices(&self) -> Vec<(&'static str, &Linear)> {
        match self {
            Mixer::Attention(a) => [("attn_q", Some(&a.wq)), ("attn_k", a.wk.as_ref()), ("attn_v", a.wv.as_ref())]
                .into_iter()
                .filter_map(|(name, l)| Some((name, l?)))
                .chain([("attn_output", &a.wo)])
                .collect(),
            Mixer::ShortConv(s) => vec![("shortconv.in_proj", &s.in_proj), ("shortconv.out_proj", &s.out_proj)],
            Mixer::DeltaNet(d) => d.matrices(),
        }
    }

    /// The mixer's vectors (norms, biases), copied to the heap as f32.
    fn vectors(&self) -> Vec<&Tensor> {
        match self {
            // (gemma4's value norm is ones made at load, not a weight of the file)
            Mixer::Attention(a) => [&a.q_norm, &a.k_norm, &a.bq, &a.bk, &a.bv].into_iter().flatten().collect(),
            Mixer::ShortConv(s) => s.vectors(),
            Mixer::DeltaNet(d) => d.vectors(),
        }
    }
}

/// Grouped-query self-attention over the K/V the layer keeps in the [`State`].
struct Attention {
    wq: Linear,
    /// `None` in a layer that reads another layer's K/V.
    wk: Option<Linear>,
    /// `None` also where the keys serve as values (Gemma 4 without `attn_v`).
    wv: Option<Linear>,
    wo: Linear,
    /// qwen2 has biases on q, k, v.
    bq: Option<Tensor>,
    bk: Option<Tensor>,
    bv: Option<Tensor>,
    /// RMSNorm over each q / k head before RoPE (qwen3, gemma3).
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    /// RMSNorm over each v head before it is cached: ones, no weight in the file (gemma4).
    v_norm: Option<Tensor>,
    head_dim: usize,
    /// Scores are multiplied by this: 1/√head_dim, or 1 (gemma4).
    scale: f64,
    /// The earlier layer whose K/V this one attends over, keeping none of its own (gemma4).
    kv_source: Option<usize>,
    /// Sliding-window layers see the last `window` positions only.
    window: Option<usize>,
    /// Index into [`Model::ropes`]; `None` for a layer without positional rotation
    /// (SmolLM3's every fourth, "NoPE").
    rope: Option<usize>,
    /// `attn_q` gives each head's query and then a gate of the same size; the output is
    /// multiplied by the gate's sigmoid before `attn_output` (qwen35).
    gated: bool,
}

/// One RoPE frequency set: `1 / base^(2i/d)` over the `d` rotated values of a head
/// (divided by the file's `rope_freqs` factors where it has them, times a linear scaling
/// factor where it says so).
struct Rope {
    inv_freq: Tensor,
}

impl Rope {
    fn new(rope_dim: usize, base: f32, factors: Option<&[f32]>, scale: f32, device: &Device) -> Result<Rope> {
        let inv_freq: Vec<f32> = (0..rope_dim / 2)
            .map(|i| {
                let f = 1f32 / base.powf((2 * i) as f32 / rope_dim as f32);
                let factor = factors.and_then(|f| f.get(i)).copied().unwrap_or(1.0);
                f / factor * scale
            })
            .collect();
        Ok(Rope { inv_freq: Tensor::from_vec(inv_freq, (1, rope_dim / 2), device)? })
    }

    /// cos and sin of the angles at positions `pos..pos + n`: `(n, rope_dim / 2)` each.
    fn at(&self, pos: usize, n: usize) -> Result<(Tensor, Tensor)> {
        let device = self.inv_freq.device();
        let t = Tensor::arange(pos as u32, (pos + n) as u32, device)?.to_dtype(DType::F32)?.reshape((n, 1))?;
        let freqs = t.matmul(&self.inv_freq)?;
        Ok((freqs.cos()?, freqs.sin()?))
    }
}

/// The token-embedding table, looked up a row per token.
enum Embeddings {
    /// Rows dequantized straight from the mapped file (the CPU).
    Mapped(MappedTensor),
    /// candle's copy: the tied output layer's where it copied the table (a type our
    /// kernels do not read in place, candle's path, a GPU), else the table's own on a GPU.
    Owned(Arc<QTensor>),
}

impl Embeddings {
    /// `(ids.len(), width)` f32 rows on `device`.
    fn lookup(&self, ids: &[u32], device: &Device) -> candle_core::Result<Tensor> {
        match self {
            Embeddings::Mapped(t) => {
                let width = t.dims()[1];
                Tensor::from_vec(t.rows_f32(ids)?, (ids.len(), width), device)
            }
            Embeddings::Owned(q) => q.embedding(&Tensor::new(ids, device)?),
        }
    }
}

pub struct Model {
    pub config: ModelConfig,
    path: PathBuf,
    device: Device,
    embeddings: Embeddings,
    layers: Vec<Layer>,
    output_norm: Tensor,
    output: Linear,
    /// RoPE frequencies: `[global]`, or `[global, sliding-window]` (gemma3).
    ropes: Vec<Rope>,
    /// The most positions a State may hold (the file's context, capped).
    positions: usize,
    /// Embeddings are multiplied by this (gemma3: √width).
    embedding_scale: Option<f64>,
    /// Gemma 4's per-layer inputs.
    per_layer: Option<PerLayerInputs>,
    /// Logits become `cap · tanh(logits / cap)` (gemma4's `final_logit_softcapping`).
    final_softcap: Option<f64>,
    activation: Activation,
    /// `Candle` keeps every op on candle's own kernels (bit-faithful to the reference);
    /// the others also take the plain-Rust attention kernels of `engine::cpu::attention`.
    kernels: Kernels,
}

impl Model {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Positions the RoPE tables cover: the most tokens a State may hold.
    pub fn max_positions(&self) -> usize {
        self.positions
    }

    /// Bytes one token adds to the KV cache with the given element type: the keys and
    /// values of its attention layers that keep every position (a sliding-window layer
    /// keeps its window only: [`Model::window_kv_bytes`]).
    pub fn kv_bytes_per_token(&self, kv: impl Into<KvDtype>) -> u64 {
        self.bytes_per_row(kv.into(), false)
    }

    /// Bytes of one position of the keys and values of the layers with their own that
    /// slide (`sliding`) or keep every position.
    fn bytes_per_row(&self, kv: KvDtype, sliding: bool) -> u64 {
        let row_bytes: usize = self
            .layers
            .iter()
            .filter_map(|l| match &l.mixer {
                Mixer::Attention(a) if a.kv_source.is_none() && a.window.is_some() == sliding => {
                    Some(kv.row_bytes(a.head_dim))
                }
                _ => None,
            })
            .sum();
        (2 * row_bytes * self.config.n_kv_heads) as u64
    }

    /// Bytes the sliding-window layers' keys and values take at most (their window and
    /// slack, [`super::state::window_rows`], or the model's context if shorter); 0
    /// without such layers.
    pub fn window_kv_bytes(&self, kv: impl Into<KvDtype>) -> u64 {
        match self.config.sliding_window {
            Some(w) => self.bytes_per_row(kv.into(), true) * super::state::window_rows(w).min(self.positions) as u64,
            None => 0,
        }
    }

    /// Bytes of the K/V a state holds with `tokens` tokens (its capacity): every position
    /// of a global layer, at most [`super::state::window_rows`] of a sliding-window one.
    pub fn kv_bytes_at(&self, kv: impl Into<KvDtype>, tokens: usize) -> u64 {
        let kv = kv.into();
        let sliding_rows = self.config.sliding_window.map_or(tokens, |w| tokens.min(super::state::window_rows(w)));
        self.bytes_per_row(kv, false) * tokens as u64 + self.bytes_per_row(kv, true) * sliding_rows as u64
    }

    /// Bytes a state's recurrent layers hold at most: their tensors and
    /// [`MAX_CHECKPOINTS`] copies (0 for a plain transformer).
    pub fn recurrent_bytes(&self) -> u64 {
        let memory: Vec<LayerMemory> = self.layers.iter().map(|l| l.mixer.memory()).collect();
        (1 + MAX_CHECKPOINTS as u64) * super::state::recurrent_bytes_of(&memory)
    }

    /// What the fit check needs of this model, with a KV cache of `kv`.
    pub fn facts(&self, kv: impl Into<KvDtype>) -> ModelFacts {
        let kv = kv.into();
        let c = &self.config;
        let attention =
            super::cpu::attention::prefill_attention(self.kernels, self.device.is_cpu(), c.head_dim, c.sliding_window);
        ModelFacts {
            weights_bytes: c.heap_weight_bytes,
            mapped_bytes: c.mapped_weight_bytes - c.lookup_table_bytes,
            kv_bytes_per_token: self.kv_bytes_per_token(kv),
            window_kv_bytes: self.window_kv_bytes(kv),
            recurrent_bytes: self.recurrent_bytes(),
            context: self.max_positions(),
            prefill: PrefillShape {
                heads: c.n_heads,
                kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                width: c.embedding_length,
                ffn: c.ffn_length,
                attention,
            },
        }
    }

    /// A fresh, empty state able to hold up to `max_tokens` (memory is allocated lazily,
    /// in chunks, as the conversation grows).
    pub fn make_state(&self, max_tokens: usize, kv: impl Into<KvDtype>) -> State {
        let state = State::new(
            self.config.vocab_size,
            self.layers.iter().map(|l| l.mixer.memory()).collect(),
            self.config.n_kv_heads,
            self.layers
                .iter()
                .map(|l| match &l.mixer {
                    Mixer::Attention(a) => a.head_dim,
                    _ => self.config.head_dim,
                })
                .collect(),
            max_tokens.min(self.max_positions()),
            kv.into(),
            self.device.clone(),
        );
        // Sliding-window layers keep only their window (a layer reading another's K/V
        // keeps nothing; its source is of its own kind).
        let sliding: Vec<bool> = self
            .layers
            .iter()
            .map(|l| matches!(&l.mixer, Mixer::Attention(a) if a.window.is_some() && a.kv_source.is_none()))
            .collect();
        match self.config.sliding_window {
            Some(window) if sliding.contains(&true) => state.with_sliding_window(window, sliding),
            _ => state,
        }
    }
}
