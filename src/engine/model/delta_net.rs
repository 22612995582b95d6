//! Gated delta-net linear attention: Qwen3.5's three layers of every four (llama.cpp's
//! `qwen35.cpp` `build_layer_attn_linear` and `delta-net-base.cpp`, the op
//! `ggml_gated_delta_net` of `ggml-cpu/ops.cpp`).
//!
//! ```text
//!   x ─ attn_qkv ─ causal conv1d (kernel K, per channel) ─ silu ─┬ q, k: L2-normed per head
//!                                                                └ v
//!   x ─ ssm_alpha + ssm_dt ─ softplus · ssm_a ─ g (decay, per value head)
//!   x ─ ssm_beta ─ sigmoid ─ β (write strength, per value head)
//!   per value head h, with key head h mod k_heads:
//!       S ← S·exp(g);  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀq / √d
//!   o ─ RMSNorm(ssm_norm) · silu(x ─ attn_gate) ─ ssm_out
//! ```
//!
//! What a layer keeps between calls (a [`LayerMemory::Recurrent`] state): the last `K - 1`
//! inputs of the convolution, `(conv_channels, K - 1)`, and one `d × d` matrix per value
//! head, `(v_heads, d, d)` stored as llama.cpp stores it (row `j` holds `S[·][j]`). Both
//! are f32 and of a fixed size whatever the length.
//!
//! The recurrence runs token by token, prompt tokens included, each value head on its own
//! (heads in parallel on the engine's pool): exact, and a small share of a forward's work
//! (`v_heads · d²` per token and layer against the projections' `width · conv_channels`
//! and more). llama.cpp's chunked form (`build_delta_net_chunking`, 64 tokens as matrix
//! products) is the later speed-up for long prompts.

use std::sync::Mutex;

use candle_core::{Device, Tensor};

use super::{Linear, Loader};
use crate::engine::cpu::kernels::Kernels;
use crate::engine::cpu::pool::for_each_chunk;
use crate::engine::state::{LayerMemory, State};
use crate::engine::Result;

/// The sizes of a delta-net layer, from the file's `ssm.*` metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DeltaNetShape {
    /// Taps of the causal convolution (`ssm.conv_kernel`).
    pub kernel: usize,
    /// Query/key heads (`ssm.group_count`).
    pub k_heads: usize,
    /// Value heads, one state matrix each (`ssm.time_step_rank`).
    pub v_heads: usize,
    /// Size of every head, keys and values alike (`ssm.state_size`).
    pub head_dim: usize,
}

impl DeltaNetShape {
    /// Reads and checks the shape in the metadata.
    pub fn read(ld: &Loader) -> Result<DeltaNetShape> {
        let shape = DeltaNetShape {
            kernel: ld.meta_u32("ssm.conv_kernel")?,
            k_heads: ld.meta_u32("ssm.group_count")?,
            v_heads: ld.meta_u32("ssm.time_step_rank")?,
            head_dim: ld.meta_u32("ssm.state_size")?,
        };
        let inner = ld.meta_u32("ssm.inner_size")?;
        let ok = shape.kernel >= 1
            && shape.kernel <= 64
            && shape.k_heads > 0
            && shape.v_heads.is_multiple_of(shape.k_heads)
            && (1..=1024).contains(&shape.head_dim)
            && inner == shape.v_heads * shape.head_dim;
        if !ok {
            return Err(ld.bad(format!("unsupported delta-net shape {shape:?} with an inner size of {inner}")));
        }
        Ok(shape)
    }

    fn key_width(&self) -> usize {
        self.k_heads * self.head_dim
    }

    fn value_width(&self) -> usize {
        self.v_heads * self.head_dim
    }

    /// Channels of the convolution: queries, keys and values.
    fn conv_channels(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }

    /// The tensors a layer keeps: the convolution's last inputs and the state matrices.
    pub fn memory(&self) -> LayerMemory {
        LayerMemory::Recurrent(vec![
            vec![self.conv_channels(), self.kernel - 1],
            vec![self.v_heads, self.head_dim, self.head_dim],
        ])
    }

    /// The layer's tensors are in the file with the shapes this implies.
    pub fn check(&self, ld: &Loader, layer: usize, width: usize) -> Result<()> {
        let p = format!("blk.{layer}");
        ld.expect_shape(&format!("{p}.attn_qkv.weight"), &[self.conv_channels(), width])?;
        ld.expect_shape(&format!("{p}.attn_gate.weight"), &[self.value_width(), width])?;
        ld.expect_shape(&format!("{p}.ssm_beta.weight"), &[self.v_heads, width])?;
        ld.expect_shape(&format!("{p}.ssm_alpha.weight"), &[self.v_heads, width])?;
        ld.expect_shape(&format!("{p}.ssm_out.weight"), &[width, self.value_width()])?;
        ld.expect_shape(&format!("{p}.ssm_conv1d.weight"), &[self.conv_channels(), self.kernel])?;
        ld.expect_shape(&format!("{p}.ssm_dt.bias"), &[self.v_heads])?;
        ld.expect_shape(&format!("{p}.ssm_a"), &[self.v_heads])?;
        ld.expect_shape(&format!("{p}.ssm_norm.weight"), &[self.head_dim])
    }
}

/// One delta-net layer's weights.
pub(super) struct DeltaNet {
    shape: DeltaNetShape,
    /// Queries, keys and values before the convolution: `conv_channels × width`.
    w_qkv: Linear,
    /// The output gate `z`: `value_width × width`.
    w_gate: Linear,
    /// Per value head: write strength β and decay input α.
    w_beta: Linear,
    w_alpha: Linear,
    w_out: Linear,
    /// `(conv_channels, kernel)`.
    conv: Tensor,
    /// Added to α before the softplus (`ssm_dt.bias`).
    dt_bias: Tensor,
    /// `-exp(A_log)`, the decay rate per value head (`ssm_a`).
    a: Tensor,
    /// RMSNorm over each value head's output (`ssm_norm`, used as stored).
    norm: Tensor,
}

impl DeltaNet {
    pub fn load(ld: &mut Loader, layer: usize, shape: DeltaNetShape, kernels: Kernels) -> Result<DeltaNet> {
        let p = format!("blk.{layer}");
        Ok(DeltaNet {
            shape,
            w_qkv: ld.linear(&format!("{p}.attn_qkv.weight"), kernels)?,
            w_gate: ld.linear(&format!("{p}.attn_gate.weight"), kernels)?,
            w_beta: ld.linear(&format!("{p}.ssm_beta.weight"), kernels)?,
            w_alpha: ld.linear(&format!("{p}.ssm_alpha.weight"), kernels)?,
            w_out: ld.linear(&format!("{p}.ssm_out.weight"), kernels)?,
            conv: ld.vector(&format!("{p}.ssm_conv1d.weight"))?,
            dt_bias: ld.vector(&format!("{p}.ssm_dt.bias"))?,
            a: ld.vector(&format!("{p}.ssm_a"))?,
            norm: ld.vector(&format!("{p}.ssm_norm.weight"))?,
        })
    }

    pub fn memory(&self) -> LayerMemory {
        self.shape.memory()
    }

    /// The matrices, by their names in the file after `blk.N.`.
    pub fn matrices(&self) -> Vec<(&'static str, &Linear)> {
        vec![
            ("attn_qkv", &self.w_qkv),
            ("attn_gate", &self.w_gate),
            ("ssm_beta", &self.w_beta),
            ("ssm_alpha", &self.w_alpha),
            ("ssm_out", &self.w_out),
        ]
    }

    pub fn vectors(&self) -> Vec<&Tensor> {
        vec![&self.conv, &self.dt_bias, &self.a, &self.norm]
    }

    /// Runs the `(n, width)` normed hidden states `h` of layer `index` through the layer,
    /// from and to its recurrent state in `state`; returns `(n, width)`.
    pub fn forward(&self, index: usize, h: &Tensor, state: &mut State, eps: f32) -> Result<Tensor> {
        let n = h.dim(0)?;
        let [qkv, z, beta, alpha]: [Tensor; 4] =
            Linear::forward_many(&[&self.w_qkv, &self.w_gate, &self.w_beta, &self.w_alpha], h)?
                .try_into()
                .expect("four layers, four outputs");
        let rows = |t: &Tensor| -> candle_core::Result<Vec<f32>> { t.flatten_all()?.to_vec1::<f32>() };
        let [conv_state, matrices] = state.recurrent(index) else {
            unreachable!("a delta-net layer keeps two tensors")
        };
        let (mut conv_state, mut matrices) = (rows(conv_state)?, rows(matrices)?);
        let s = self.shape;
        // The convolution runs along the tokens, channel by channel; then every value head
        // runs its recurrence over the tokens on its own, heads in parallel.
        let mut mixed = rows(&qkv)?;
        convolve(s, &rows(&self.conv)?, &mut conv_state, &mut mixed, eps);
        let weights = Weights {
            z: &rows(&z)?,
            beta: &rows(&beta)?,
            alpha: &rows(&alpha)?,
            dt_bias: &rows(&self.dt_bias)?,
            a: &rows(&self.a)?,
            norm: &rows(&self.norm)?,
        };
        let heads: Vec<Mutex<Head>> = matrices
            .chunks_mut(s.head_dim * s.head_dim)
            .map(|matrix| Mutex::new(Head { matrix, out: vec![0.0; n * s.head_dim] }))
            .collect();
        let macs = n * s.v_heads * s.head_dim * s.head_dim * 3;
        for_each_chunk(s.v_heads, macs, |range| {
            for h in range {
                let mut head = heads[h].lock().unwrap_or_else(|e| e.into_inner());
                recur(s, h, n, &mixed, &weights, &mut head, eps);
            }
        });
        let mut out = vec![0f32; n * s.value_width()];
        for (h, head) in heads.into_iter().enumerate() {
            let head = head.into_inner().unwrap_or_else(|e| e.into_inner());
            for (t, o) in head.out.chunks(s.head_dim).enumerate() {
                let at = t * s.value_width() + h * s.head_dim;
                out[at..at + s.head_dim].copy_from_slice(o);
            }
        }
        let device = h.device();
        state.set_recurrent(
            index,
            vec![
                Tensor::from_vec(conv_state, (s.conv_channels(), s.kernel - 1), &Device::Cpu)?.to_device(device)?,
                Tensor::from_vec(matrices, (s.v_heads, s.head_dim, s.head_dim), &Device::Cpu)?.to_device(device)?,
            ],
        );
        let out = Tensor::from_vec(out, (n, s.value_width()), &Device::Cpu)?.to_device(device)?;
        Ok(self.w_out.forward(&out.to_dtype(h.dtype())?)?)
    }
}

/// The call's per-token projections and the layer's small vectors, as plain slices.
struct Weights<'a> {
    /// `(n, value_width)`, `(n, v_heads)`, `(n, v_heads)`.
    z: &'a [f32],
    beta: &'a [f32],
    alpha: &'a [f32],
    dt_bias: &'a [f32],
    a: &'a [f32],
    norm: &'a [f32],
}

/// One value head's state matrix and its outputs for the call's tokens, `(n, head_dim)`.
struct Head<'a> {
    matrix: &'a mut [f32],
    out: Vec<f32>,
}

/// The causal convolution of the `(n, conv_channels)` projections `mixed` in place, after
/// the kept inputs of `conv_state` (which move on by `n`), then silu, then the L2 norm of
/// each query and key head as llama.cpp computes it: `x / √(Σx² + ε)`.
fn convolve(s: DeltaNetShape, conv: &[f32], conv_state: &mut [f32], mixed: &mut [f32], eps: f32) {
    let (taps, kept, channels) = (s.kernel, s.kernel - 1, s.conv_channels());
    let mut window = vec![0f32; s.kernel];
    for token in mixed.chunks_mut(channels) {
        for (c, y) in token.iter_mut().enumerate() {
            let past = &mut conv_state[c * kept..(c + 1) * kept];
            window[..kept].copy_from_slice(past);
            window[kept] = *y;
            let sum: f32 = window.iter().zip(&conv[c * taps..(c + 1) * taps]).map(|(x, w)| x * w).sum();
            if kept > 0 {
                past.copy_from_slice(&window[1..]);
            }
            *y = silu(sum);
        }
        for head in token[..2 * s.key_width()].chunks_mut(s.head_dim) {
            let scale = 1.0 / (dot(head, head) + eps).sqrt();
            head.iter_mut().for_each(|x| *x *= scale);
        }
    }
}

/// Value head `h`'s recurrence over the call's `n` tokens, with key head `h mod k_heads`,
/// then its gated RMSNorm: `rms_norm(o) · ssm_norm · silu(z)`.
fn recur(s: DeltaNetShape, h: usize, n: usize, mixed: &[f32], w: &Weights, head: &mut Head, eps: f32) {
    let d = s.head_dim;
    let kh = h % s.k_heads;
    let scale = 1.0 / (d as f32).sqrt();
    for t in 0..n {
        let token = &mixed[t * s.conv_channels()..(t + 1) * s.conv_channels()];
        let q = &token[kh * d..(kh + 1) * d];
        let k = &token[s.key_width() + kh * d..s.key_width() + (kh + 1) * d];
        let v = &token[2 * s.key_width() + h * d..2 * s.key_width() + (h + 1) * d];
        let decay = (softplus(w.alpha[t * s.v_heads + h] + w.dt_bias[h]) * w.a[h]).exp();
        let beta = sigmoid(w.beta[t * s.v_heads + h]);
        let o = &mut head.out[t * d..(t + 1) * d];
        // Row j of the matrix is column j of S, and each row's update needs only itself:
        // decay, δ = β (v[j] − Σᵢ S[i][j] k[i]), S[·][j] += δ k, o[j] = Σᵢ S[i][j] q[i] / √d.
        for (j, row) in head.matrix.chunks_mut(d).enumerate() {
            row.iter_mut().for_each(|x| *x *= decay);
            let delta = (v[j] - dot(row, k)) * beta;
            row.iter_mut().zip(k).for_each(|(x, k)| *x += delta * k);
            o[j] = dot(row, q) * scale;
        }
        let mean = o.iter().map(|x| (x * x) as f64).sum::<f64>() / d as f64;
        let inv = 1.0 / (mean as f32 + eps).sqrt();
        let z = &w.z[t * s.value_width() + h * d..t * s.value_width() + (h + 1) * d];
        for ((x, n), z) in o.iter_mut().zip(w.norm).zip(z) {
            *x = *x * inv * n * silu(*z);
        }
    }
}

/// A dot product in 16 independent lanes, so that it vectorizes.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let (a16, b16) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = a16.remainder().iter().zip(b16.remainder()).map(|(a, b)| a * b).sum();
    for (a, b) in a16.zip(b16) {
        for i in 0..16 {
            lanes[i] += a[i] * b[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// ggml's softplus: `ln(1 + eˣ)`, `x` itself past 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}
