//! Single-token decode attention in plain Rust, for the CPU with an f32 KV cache.
//!
//! For one new token, self-attention is a few dot products and axpys per cached position.
//! Candle spends about a dozen small ops (narrow, squeeze, to_dtype, matmul, scale,
//! softmax, matmul, reshape, transpose, contiguous…) on it per layer, each with its own
//! allocation and dispatch. Late in a conversation the cost is reading the cache itself
//! (2.5K positions of SmolLM2 are 3.9 MB of K/V per layer), so:
//!
//! ```text
//!   unit = one K/V head × one chunk of CHUNK cached positions
//!     every query head of the group reads each K and V row once, while it is in cache
//!     s_h,j = q_h · k_j / √hd;  m_h = max_j s_h,j;  l_h = Σ_j e^(s_h,j − m_h);
//!     o_h = Σ_j e^(s_h,j − m_h) v_j                      (partial softmax of the chunk)
//!   units run on the barrier pool (long caches), then per head the chunks merge:
//!     M = max_u m_u;  out_h = Σ_u e^(m_u − M) o_u / Σ_u e^(m_u − M) l_u
//! ```
//!
//! Several new tokens take [`super::prefill`]; other devices and f16 caches keep the
//! candle path in `engine::model`.

use candle_core::{DType, Device, Tensor};

use super::{cpu_f32, exp, for_each_unit, mul_add, Dims};
use crate::engine::qlinear::SendPtr;

/// Cached positions per unit.
const CHUNK: usize = 256;

/// Attention of the one new token at position `d.pos` against positions `0..=d.pos`.
///
/// `q`: `(n_heads, hd)` after RoPE; `k`, `v`: `(n_kv_heads, capacity, hd)`;
/// `out`: `(n_heads · hd)`, heads in order. Same math as the candle path
/// (`q @ kᵀ · scale → softmax → @ v`) in f32, summed in another order.
pub(crate) fn decode_attention(q: &[f32], k: &[f32], v: &[f32], d: Dims, out: &mut [f32]) {
    assert!(d.n_kv_heads > 0 && d.n_heads.is_multiple_of(d.n_kv_heads), "heads must split into kv groups");
    assert!(d.n == 1 && d.pos < d.capacity, "one new token inside the cache");
    assert_eq!(q.len(), d.n_heads * d.head_dim);
    assert_eq!(out.len(), d.n_heads * d.head_dim);
    assert!(k.len() >= d.n_kv_heads * d.capacity * d.head_dim && v.len() >= d.n_kv_heads * d.capacity * d.head_dim);
    match d.head_dim {
        64 => decode::<64>(q, k, v, d, out),
        128 => decode::<128>(q, k, v, d, out),
        other => unreachable!("head size {other} is checked by the caller"),
    }
}

/// One chunk's softmax partial for one query head.
#[derive(Clone, Copy)]
struct Partial<const HD: usize> {
    max: f32,
    sum: f32,
    o: [f32; HD],
}

fn decode<const HD: usize>(q: &[f32], k: &[f32], v: &[f32], d: Dims, out: &mut [f32]) {
    let group = d.n_heads / d.n_kv_heads;
    let len = d.pos + 1;
    let chunks = len.div_ceil(CHUNK);
    let scale = 1.0 / (HD as f32).sqrt();
    let q: Vec<[f32; HD]> = q.as_chunks::<HD>().0.iter().map(|q| q.map(|x| x * scale)).collect();
    let empty = Partial { max: f32::NEG_INFINITY, sum: 0.0, o: [0.0; HD] };
    // partials[(kv · chunks + chunk) · group + h]
    let mut partials = vec![empty; d.n_kv_heads * chunks * group];
    let partials_ptr = SendPtr(partials.as_mut_ptr());
    for_each_unit(d.n_kv_heads * chunks, d.n_heads * len * HD, |u| {
        let (kv, chunk) = (u / chunks, u % chunks);
        let positions = chunk * CHUNK..len.min((chunk + 1) * CHUNK);
        let rows = (kv * d.capacity + positions.start) * HD..(kv * d.capacity + positions.end) * HD;
        // SAFETY: unit u writes only its own `group` partials; `partials` outlives the call.
        let mine = unsafe { std::slice::from_raw_parts_mut(partials_ptr.get().add(u * group), group) };
        chunk_partials::<HD>(&q[kv * group..(kv + 1) * group], &k[rows.clone()], &v[rows], mine);
    });
    for (h, out) in out.chunks_exact_mut(HD).enumerate() {
        let (kv, g) = (h / group, h % group);
        let parts: Vec<&Partial<HD>> = (0..chunks).map(|c| &partials[(kv * chunks + c) * group + g]).collect();
        let max = parts.iter().fold(f32::NEG_INFINITY, |m, p| m.max(p.max));
        let mut sum = 0.0;
        out.fill(0.0);
        for p in parts {
            let w = exp(p.max - max);
            sum += w * p.sum;
            for (o, &x) in out.iter_mut().zip(&p.o) {
                *o = mul_add(w, x, *o);
            }
        }
        out.iter_mut().for_each(|o| *o /= sum);
    }
}

/// The partial softmax of the `group` (pre-scaled) queries `q` over one chunk of keys and
/// values, each `(positions, HD)`.
fn chunk_partials<const HD: usize>(q: &[[f32; HD]], keys: &[f32], values: &[f32], out: &mut [Partial<HD>]) {
    let keys = keys.as_chunks::<HD>().0;
    let values = values.as_chunks::<HD>().0;
    let mut scores = vec![[0.0f32; CHUNK]; q.len()];
    for (j, k_j) in keys.iter().enumerate() {
        for (s, q_h) in scores.iter_mut().zip(q) {
            s[j] = dot(q_h, k_j);
        }
    }
    for (s, p) in scores.iter_mut().zip(out.iter_mut()) {
        let s = &mut s[..keys.len()];
        p.max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        s.iter_mut().for_each(|x| *x = exp(*x - p.max));
        p.sum = s.iter().sum();
    }
    for (j, v_j) in values.iter().enumerate() {
        for (p, s) in out.iter_mut().zip(&scores) {
            axpy(s[j], v_j, &mut p.o);
        }
    }
}

/// `a · b` in 16 independent lanes folded as a tree (a serial sum of the lanes would be a
/// chain of 15 dependent adds per key).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // indexed fixed-size loops vectorize reliably
fn dot<const HD: usize>(a: &[f32; HD], b: &[f32; HD]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0.0f32; LANES];
    for i in (0..HD).step_by(LANES) {
        for l in 0..LANES {
            acc[l] = mul_add(a[i + l], b[i + l], acc[l]);
        }
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// `y += a·x`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn axpy<const HD: usize>(a: f32, x: &[f32; HD], y: &mut [f32; HD]) {
    for i in 0..HD {
        y[i] = mul_add(a, x[i], y[i]);
    }
}

/// The fast path on candle tensors: `q` is `(1, n_heads, 1, hd)`, `k` and `v` are the
/// cache buffers `(1, n_kv_heads, capacity, hd)`; returns `(1, n_heads · hd)`.
///
/// `None` when anything is not as expected (not CPU, not f32, not contiguous, a head size
/// other than 64 or 128); the caller then takes the candle path.
pub(crate) fn try_decode_attention(q: &Tensor, k: &Tensor, v: &Tensor, len: usize) -> Option<Tensor> {
    if !matches!(q.device(), Device::Cpu) || [q, k, v].iter().any(|t| t.dtype() != DType::F32) {
        return None;
    }
    let (one, n_heads, n, head_dim) = q.dims4().ok()?;
    let (one_k, n_kv_heads, capacity, hd_k) = k.dims4().ok()?;
    if one != 1 || n != 1 || one_k != 1 || hd_k != head_dim || v.dims() != k.dims() || !matches!(head_dim, 64 | 128) {
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
        let dims = Dims { n_heads, n_kv_heads, head_dim, capacity, pos: len - 1, n: 1 };
        decode_attention(q, k, v, dims, &mut out);
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
        // SmolLM2's shape and a 128-wide one; one chunk, a partial chunk, several chunks
        // (merged across the pool).
        for (n_heads, n_kv, hd) in [(9, 3, 64), (4, 2, 128)] {
            let capacity = 1100;
            let q = Tensor::randn(0f32, 3.0, (1, n_heads, 1, hd), &dev).unwrap();
            let k = Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap();
            let v = Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap();
            for len in [1, 7, 200, 256, 257, 1100] {
                let fast = try_decode_attention(&q, &k, &v, len).expect("fast path applies");
                let want = reference(&q, &k, &v, n_heads / n_kv, len);
                assert_eq!(fast.dims(), &[1, n_heads * hd]);
                let diff = (fast - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                assert!(diff <= 2e-5, "heads {n_heads}/{n_kv} hd {hd} len {len}: max abs diff {diff}");
            }
        }
    }

    #[test]
    fn declines_what_it_cannot_do() {
        let dev = Device::Cpu;
        let q = Tensor::zeros((1, 4, 1, 64), DType::F32, &dev).unwrap();
        let k = Tensor::zeros((1, 2, 16, 64), DType::F32, &dev).unwrap();
        // f16 cache, two query tokens, a non-contiguous cache view, len past capacity, an
        // odd head size.
        assert!(try_decode_attention(&q, &k.to_dtype(DType::F16).unwrap(), &k, 3).is_none());
        let q2 = Tensor::zeros((1, 4, 2, 64), DType::F32, &dev).unwrap();
        assert!(try_decode_attention(&q2, &k, &k, 3).is_none());
        let odd = Tensor::zeros((1, 2, 16, 8), DType::F32, &dev).unwrap();
        assert!(try_decode_attention(&Tensor::zeros((1, 4, 1, 8), DType::F32, &dev).unwrap(), &odd, &odd, 3).is_none());
        let kt = Tensor::zeros((1, 2, 64, 16), DType::F32, &dev).unwrap().transpose(2, 3).unwrap();
        assert!(try_decode_attention(&q, &kt, &kt, 3).is_none());
        assert!(try_decode_attention(&q, &k, &k, 17).is_none());
        assert!(try_decode_attention(&q, &k, &k, 3).is_some());
    }
}
