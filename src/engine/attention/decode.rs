//! Single-token decode attention in plain Rust, for the CPU with an f32 KV cache.
//!
//! For one new token, self-attention is a handful of 64-wide dot products and axpys per
//! cached position. Candle spends about a dozen small ops (narrow, squeeze, to_dtype,
//! matmul, scale, softmax, matmul, reshape, transpose, contiguous…) on it per layer, each
//! with its own allocation and dispatch; one loop over the cache buffers is cheaper.
//! Several new tokens take [`super::prefill`]; other devices and f16 caches keep the
//! candle path in `engine::model`.

use std::cell::RefCell;

use candle_core::{DType, Device, Tensor};

use super::cpu_f32;

/// Attention of one query token against the first `len` cached positions.
///
/// ```text
///   q:   (n_heads, hd)                 the new token's queries, after RoPE
///   k,v: (n_kv_heads, capacity, hd)    whole cache buffers; positions 0..len are valid
///
///   head h reads kv head h / group, group = n_heads / n_kv_heads
///   scores_j = q_h · k_j / √hd         j < len
///   p        = softmax(scores)         (max subtracted first)
///   out_h    = Σ_j p_j v_j
///
///   out: (n_heads · hd)                heads concatenated in order
/// ```
///
/// Same math as the candle path (`q @ kᵀ · scale → softmax → @ v`), accumulated in f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_heads: usize,
    n_kv_heads: usize,
    capacity: usize,
    head_dim: usize,
    len: usize,
    out: &mut [f32],
) {
    assert!(n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads), "heads must split into kv groups");
    assert!(len > 0 && len <= capacity, "need 1..=capacity live positions");
    assert_eq!(q.len(), n_heads * head_dim);
    assert_eq!(out.len(), n_heads * head_dim);
    assert!(k.len() >= n_kv_heads * capacity * head_dim && v.len() >= n_kv_heads * capacity * head_dim);
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();

    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        scores.clear();
        scores.resize(len, 0.0);
        for (h, (q_h, out_h)) in q.chunks_exact(head_dim).zip(out.chunks_exact_mut(head_dim)).enumerate() {
            let kv = h / group;
            let base = kv * capacity * head_dim;
            let keys = &k[base..base + len * head_dim];
            let values = &v[base..base + len * head_dim];

            let mut max = f32::NEG_INFINITY;
            for (s, k_j) in scores.iter_mut().zip(keys.chunks_exact(head_dim)) {
                *s = dot(q_h, k_j) * scale;
                max = max.max(*s);
            }
            let mut sum = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let inv = 1.0 / sum;

            out_h.fill(0.0);
            for (&p, v_j) in scores.iter().zip(values.chunks_exact(head_dim)) {
                axpy(p * inv, v_j, out_h);
            }
        }
    });
}

thread_local! {
    /// Softmax scratch, reused across heads, layers and tokens.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Lanes of independent partial sums: lets the compiler keep 8 (or 16) wide SIMD
/// accumulators without reassociating a single float sum.
const LANES: usize = 16;

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (a_main, a_rest) = a.split_at(a.len() - a.len() % LANES);
    let (b_main, b_rest) = b.split_at(a_main.len());
    for (a, b) in a_main.chunks_exact(LANES).zip(b_main.chunks_exact(LANES)) {
        for i in 0..LANES {
            acc[i] += a[i] * b[i];
        }
    }
    let tail: f32 = a_rest.iter().zip(b_rest).map(|(a, b)| a * b).sum();
    acc.iter().sum::<f32>() + tail
}

/// `y += a·x`.
#[inline]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// The fast path on candle tensors: `q` is `(1, n_heads, 1, hd)`, `k` and `v` are the
/// cache buffers `(1, n_kv_heads, capacity, hd)`; returns `(1, n_heads · hd)`.
///
/// `None` when anything is not as expected (not CPU, not f32, not contiguous, odd shapes);
/// the caller then takes the candle path.
pub(crate) fn try_decode_attention(q: &Tensor, k: &Tensor, v: &Tensor, len: usize) -> Option<Tensor> {
    if !matches!(q.device(), Device::Cpu) || q.dtype() != DType::F32 || k.dtype() != DType::F32 || v.dtype() != DType::F32 {
        return None;
    }
    let (one, n_heads, n, head_dim) = q.dims4().ok()?;
    let (one_k, n_kv_heads, capacity, hd_k) = k.dims4().ok()?;
    if one != 1 || n != 1 || one_k != 1 || hd_k != head_dim || v.dims() != k.dims() {
        return None;
    }
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 || len == 0 || len > capacity {
        return None;
    }
    let mut out = vec![0.0f32; n_heads * head_dim];
    {
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let q = cpu_f32(&qs, ql, n_heads * head_dim)?;
        let k = cpu_f32(&ks, kl, n_kv_heads * capacity * head_dim)?;
        let v = cpu_f32(&vs, vl, n_kv_heads * capacity * head_dim)?;
        decode_attention(q, k, v, n_heads, n_kv_heads, capacity, head_dim, len, &mut out);
    }
    Tensor::from_vec(out, (1, n_heads * head_dim), &Device::Cpu).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::D;

    /// The same math with candle ops, head by head.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, group: usize, len: usize) -> Tensor {
        let (_, n_heads, _, hd) = q.dims4().unwrap();
        let scale = 1.0 / (hd as f64).sqrt();
        let heads: Vec<Tensor> = (0..n_heads)
            .map(|h| {
                let q_h = q.narrow(1, h, 1).unwrap().squeeze(0).unwrap().squeeze(0).unwrap(); // (1, hd)
                let kv = h / group;
                let k_h = k.narrow(1, kv, 1).unwrap().narrow(2, 0, len).unwrap().squeeze(0).unwrap().squeeze(0).unwrap();
                let v_h = v.narrow(1, kv, 1).unwrap().narrow(2, 0, len).unwrap().squeeze(0).unwrap().squeeze(0).unwrap();
                let scores = (q_h.matmul(&k_h.t().unwrap()).unwrap() * scale).unwrap(); // (1, len)
                let p = candle_nn::ops::softmax_last_dim(&scores).unwrap();
                p.matmul(&v_h.contiguous().unwrap()).unwrap() // (1, hd)
            })
            .collect();
        Tensor::cat(&heads, D::Minus1).unwrap()
    }

    #[test]
    fn matches_candle_ops() {
        let dev = Device::Cpu;
        let (n_heads, n_kv, hd, capacity) = (9, 3, 64, 256);
        let q = Tensor::randn(0f32, 1.0, (1, n_heads, 1, hd), &dev).unwrap();
        let k = Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap();
        let v = Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap();
        for len in [1, 7, 200] {
            let fast = try_decode_attention(&q, &k, &v, len).expect("fast path applies");
            let want = reference(&q, &k, &v, n_heads / n_kv, len);
            assert_eq!(fast.dims(), &[1, n_heads * hd]);
            let diff = (fast - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff <= 1e-5, "len {len}: max abs diff {diff}");
        }
    }

    #[test]
    fn declines_what_it_cannot_do() {
        let dev = Device::Cpu;
        let q = Tensor::zeros((1, 4, 1, 8), DType::F32, &dev).unwrap();
        let k = Tensor::zeros((1, 2, 16, 8), DType::F32, &dev).unwrap();
        // f16 cache, two query tokens, a non-contiguous cache view, len past capacity.
        assert!(try_decode_attention(&q, &k.to_dtype(DType::F16).unwrap(), &k, 3).is_none());
        let q2 = Tensor::zeros((1, 4, 2, 8), DType::F32, &dev).unwrap();
        assert!(try_decode_attention(&q2, &k, &k, 3).is_none());
        let kt = Tensor::zeros((1, 2, 8, 16), DType::F32, &dev).unwrap().transpose(2, 3).unwrap();
        assert!(try_decode_attention(&q, &kt, &kt, 3).is_none());
        assert!(try_decode_attention(&q, &k, &k, 17).is_none());
        assert!(try_decode_attention(&q, &k, &k, 3).is_some());
    }
}
