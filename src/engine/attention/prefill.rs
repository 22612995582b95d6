//! Attention of several new tokens against the cache, fused and tiled (the flash-attention
//! scheme on the CPU).
//!
//! The candle path builds the whole score matrix, `(n_heads · n) × L` floats per layer
//! (11.8 MB for 128 new tokens after 2,432 cached ones), then scales it, adds a causal
//! mask, softmaxes it and multiplies it by V: five passes over a buffer far larger than
//! the caches, each a fresh allocation. That is why the time to first token grew with the
//! conversation. Here every score lives only in a small block:
//!
//! ```text
//!   unit = one K/V head × up to TOKENS new tokens; its rows are the `group` query heads
//!          that share the K/V head, for each of those tokens
//!   for each block of BLOCK_KEYS keys up to the unit's last allowed position:
//!       kᵀ block                        (hd × BLOCK_KEYS, transposed once per layer)
//!       s = q · kᵀ                      (ROWS × BLOCK_KEYS register tile, q pre-scaled by 1/√hd)
//!       causal: key j is seen by the query at position p only if j ≤ p
//!       online softmax: m' = max(m, max s); o ← o·e^(m−m'); l ← l·e^(m−m') + Σ e^(s−m')
//!       o += e^(s−m') · v block
//!   out = o / l
//! ```
//!
//! Units run on candle's barrier pool. The sums run in another order than candle's
//! (per key block, with a polynomial `exp`), so results agree with the candle path to
//! float rounding, not bit for bit; see the tests.

use candle_core::{DType, Device, Tensor};

use super::{cpu_f32, exp, for_each_unit, mul_add, Dims};
use crate::engine::qlinear::SendPtr;

/// New tokens per work unit.
const TOKENS: usize = 16;
/// Query rows per register tile.
const ROWS: usize = 4;
/// Keys per block, and value columns per strip. A tile of ROWS × this many accumulators
/// then takes half the vector registers: 16 of 32 with AVX-512 (measured here: 64 keys ran
/// about 5% faster than 32), 8 of 16 with AVX2, 16 of 32 with NEON (not measured). A
/// multiple of 16, the lanes of [`lanes`].
#[cfg(target_feature = "avx512f")]
const BLOCK_KEYS: usize = 64;
#[cfg(not(target_feature = "avx512f"))]
const BLOCK_KEYS: usize = 16;

/// The fast path on candle tensors: `q` is `(1, n_heads, n, hd)` after RoPE, `k` and `v`
/// the cache buffers `(1, n_kv_heads, capacity, hd)` with the new tokens' entries written
/// at `pos..pos + n`. Returns `(n, n_heads · hd)`.
///
/// `None` when anything is not as expected (not CPU, not f32, not contiguous, a head size
/// other than 64 or 128); the caller then takes the candle path.
pub(crate) fn try_prefill_attention(q: &Tensor, k: &Tensor, v: &Tensor, pos: usize) -> Option<Tensor> {
    if !matches!(q.device(), Device::Cpu) || [q, k, v].iter().any(|t| t.dtype() != DType::F32) {
        return None;
    }
    let (one, n_heads, n, head_dim) = q.dims4().ok()?;
    let (one_k, n_kv_heads, capacity, hd_k) = k.dims4().ok()?;
    if one != 1 || one_k != 1 || hd_k != head_dim || v.dims() != k.dims() || !matches!(head_dim, 64 | 128) {
        return None;
    }
    if n == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 || pos + n > capacity {
        return None;
    }
    let dims = Dims { n_heads, n_kv_heads, head_dim, capacity, pos, n };
    let mut out = vec![0.0f32; n * n_heads * head_dim];
    {
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let q = cpu_f32(&qs, ql, n_heads * n * head_dim)?;
        let k = cpu_f32(&ks, kl, n_kv_heads * capacity * head_dim)?;
        let v = cpu_f32(&vs, vl, n_kv_heads * capacity * head_dim)?;
        prefill_attention(q, k, v, dims, &mut out);
    }
    Tensor::from_vec(out, (n, n_heads * head_dim), &Device::Cpu).ok()
}

/// `q`: `(n_heads, n, hd)`; `k`, `v`: `(n_kv_heads, capacity, hd)`; `out`: `(n, n_heads · hd)`.
/// `head_dim` must be 64 or 128.
pub(crate) fn prefill_attention(q: &[f32], k: &[f32], v: &[f32], d: Dims, out: &mut [f32]) {
    assert!(d.n_kv_heads > 0 && d.n_heads.is_multiple_of(d.n_kv_heads), "heads must split into kv groups");
    assert!(d.n > 0 && d.pos + d.n <= d.capacity, "new tokens must fit the cache");
    assert_eq!(q.len(), d.n_heads * d.n * d.head_dim);
    assert_eq!(out.len(), d.n * d.n_heads * d.head_dim);
    assert!(k.len() >= d.n_kv_heads * d.capacity * d.head_dim && v.len() >= d.n_kv_heads * d.capacity * d.head_dim);

    KEYS_T.with(|cell| {
        let mut kt = cell.borrow_mut();
        transpose_keys(k, d, &mut kt);
        attend(q, &kt, v, d, out);
    });
}

thread_local! {
    /// The transposed keys of the layer being computed, reused across layers and forwards.
    static KEYS_T: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Fills `kt` with the live keys of every K/V head as blocks of `hd × BLOCK_KEYS`
/// (zero-padded), so the score tiles read keys along their vector lanes; done once per
/// layer, not once per unit.
fn transpose_keys(k: &[f32], d: Dims, kt: &mut Vec<f32>) {
    let hd = d.head_dim;
    let blocks = (d.pos + d.n).div_ceil(BLOCK_KEYS);
    let block_len = hd * BLOCK_KEYS;
    kt.clear();
    kt.resize(d.n_kv_heads * blocks * block_len, 0.0);
    let kt_ptr = SendPtr(kt.as_mut_ptr());
    for_each_unit(d.n_kv_heads * blocks, d.n_kv_heads * (d.pos + d.n) * hd, |u| {
        let (kv, block) = (u / blocks, u % blocks);
        let first = block * BLOCK_KEYS;
        let width = BLOCK_KEYS.min(d.pos + d.n - first);
        let keys = &k[(kv * d.capacity + first) * hd..][..width * hd];
        // SAFETY: unit u writes only its own block; `kt` outlives the pool call.
        let dst = unsafe { std::slice::from_raw_parts_mut(kt_ptr.get().add(u * block_len), block_len) };
        for (c, key) in keys.chunks_exact(hd).enumerate() {
            for (dst, &x) in dst.chunks_exact_mut(BLOCK_KEYS).zip(key) {
                dst[c] = x;
            }
        }
    });
}

/// The units of the module docs, given the transposed keys.
fn attend(q: &[f32], kt: &[f32], v: &[f32], d: Dims, out: &mut [f32]) {
    let token_blocks = d.n.div_ceil(TOKENS);
    let kt_per_head = kt.len() / d.n_kv_heads;
    let out_ptr = SendPtr(out.as_mut_ptr());
    let macs = d.n_heads * d.n * (d.pos + d.n) * d.head_dim;
    for_each_unit(d.n_kv_heads * token_blocks, macs, |u| {
        let (kv, block) = (u / token_blocks, u % token_blocks);
        let tokens = block * TOKENS..d.n.min((block + 1) * TOKENS);
        let kt = &kt[kv * kt_per_head..][..kt_per_head];
        match d.head_dim {
            64 => unit::<64>(q, kt, v, d, kv, tokens, out_ptr),
            128 => unit::<128>(q, kt, v, d, kv, tokens, out_ptr),
            other => unreachable!("head size {other} is checked by the caller"),
        }
    });
}

/// One unit: K/V head `kv`, new tokens `tokens`, every query head of the group; writes
/// their rows of `out`.
#[allow(clippy::too_many_arguments)]
fn unit<const HD: usize>(
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    d: Dims,
    kv: usize,
    tokens: std::ops::Range<usize>,
    out: SendPtr<f32>,
) {
    let group = d.n_heads / d.n_kv_heads;
    let n_tok = tokens.len();
    let rows = group * n_tok;
    let padded = rows.div_ceil(ROWS) * ROWS;
    let scale = 1.0 / (HD as f32).sqrt();

    // Row r is query head `kv·group + r / n_tok` at new token `tokens.start + r % n_tok`;
    // padding rows are zero queries allowed to see every key, and are dropped at the end.
    let mut qs = vec![[0.0f32; HD]; padded];
    let mut limit = vec![d.pos + tokens.end; padded];
    for r in 0..rows {
        let (head, t) = (kv * group + r / n_tok, tokens.start + r % n_tok);
        let src = &q[(head * d.n + t) * HD..][..HD];
        for (dst, &x) in qs[r].iter_mut().zip(src) {
            *dst = x * scale;
        }
        limit[r] = d.pos + t + 1;
    }
    let n_keys = d.pos + tokens.end;
    let values = &v[kv * d.capacity * HD..][..n_keys * HD];
    let kt = kt.as_chunks::<BLOCK_KEYS>().0.as_chunks::<HD>().0;
    let kt = &kt[..n_keys.div_ceil(BLOCK_KEYS)];

    let mut acc = Accumulators { o: vec![[0.0f32; HD]; padded], max: vec![f32::NEG_INFINITY; padded], sum: vec![0.0; padded] };
    key_loop::<HD>(&qs, &limit, kt, values, &mut acc);

    for r in 0..rows {
        let (head, t) = (kv * group + r / n_tok, tokens.start + r % n_tok);
        let inv = 1.0 / acc.sum[r];
        // SAFETY: `out` is `(n, n_heads · HD)` and outlives the pool call; this row's slot
        // (token t, head `head`) belongs to this unit alone.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add((t * d.n_heads + head) * HD), HD) };
        for (dst, &o) in dst.iter_mut().zip(&acc.o[r]) {
            *dst = o * inv;
        }
    }
}

/// Per-row running state of the online softmax.
struct Accumulators<const HD: usize> {
    /// Σ e^(s − max) · v so far.
    o: Vec<[f32; HD]>,
    /// Largest score so far.
    max: Vec<f32>,
    /// Σ e^(s − max) so far.
    sum: Vec<f32>,
}

/// `BLOCK_KEYS` keys transposed: `[d][c]` is component `d` of key `c`.
type KeysT<const HD: usize> = [[f32; BLOCK_KEYS]; HD];

/// The key-block loop of the module docs over `q.len()` rows (a multiple of [`ROWS`]).
#[inline(always)]
fn key_loop<const HD: usize>(
    q: &[[f32; HD]],
    limit: &[usize],
    kt: &[KeysT<HD>],
    values: &[f32],
    acc: &mut Accumulators<HD>,
) {
    let n_keys = values.len() / HD;
    for (block, kt) in kt.iter().enumerate() {
        let start = block * BLOCK_KEYS;
        let width = BLOCK_KEYS.min(n_keys - start);
        let block_values = &values[start * HD..(start + width) * HD];
        for r0 in (0..q.len()).step_by(ROWS) {
            let mut s = scores::<HD>(&q[r0..r0 + ROWS], kt);
            for (i, s) in s.iter_mut().enumerate() {
                let r = r0 + i;
                let seen = width.min(limit[r].saturating_sub(start));
                softmax_step::<HD>(s, seen, &mut acc.max[r], &mut acc.sum[r], &mut acc.o[r]);
            }
            accumulate_values::<HD>(&s, block_values, &mut acc.o[r0..r0 + ROWS]);
        }
    }
}

/// `s[r][c] = q[r] · kᵀ[·][c]`: a register tile of ROWS × BLOCK_KEYS sums.
///
/// The innermost loops here and in [`accumulate_values`] index fixed-size arrays on
/// purpose: written with `zip`, LLVM kept the same loop scalar once it was inlined into
/// the unit (measured: 3× slower prefill attention).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn scores<const HD: usize>(q: &[[f32; HD]], kt: &KeysT<HD>) -> [[f32; BLOCK_KEYS]; ROWS] {
    let mut s = [[0.0f32; BLOCK_KEYS]; ROWS];
    for (d, kt_d) in kt.iter().enumerate() {
        for (s_r, q_r) in s.iter_mut().zip(q) {
            let x = q_r[d];
            for c in 0..BLOCK_KEYS {
                s_r[c] = mul_add(x, kt_d[c], s_r[c]);
            }
        }
    }
    s
}

/// Online-softmax update of one row for one key block whose first `seen` keys it may see:
/// turns `s` into the block's weights `e^(s − max)` (0 for unseen keys) and rescales the
/// row's running sums to the new maximum. Branch-free over the block so it vectorizes.
#[inline(always)]
fn softmax_step<const HD: usize>(s: &mut [f32; BLOCK_KEYS], seen: usize, max: &mut f32, sum: &mut f32, o: &mut [f32; HD]) {
    if seen == 0 {
        s.fill(0.0);
        return;
    }
    for (c, s) in s.iter_mut().enumerate() {
        *s = if c < seen { *s } else { f32::NEG_INFINITY };
    }
    let new_max = max.max(lanes(s, f32::NEG_INFINITY, f32::max));
    for s in s.iter_mut() {
        *s = exp(*s - new_max);
    }
    let block_sum = lanes(s, 0.0, |a, b| a + b);
    if new_max > *max {
        let shrink = exp(*max - new_max); // 0 for the first block (max = -inf)
        *sum *= shrink;
        o.iter_mut().for_each(|x| *x *= shrink);
        *max = new_max;
    }
    *sum += block_sum;
}

/// Folds a block with `op` in 16 independent lanes, then folds the lanes: the compiler
/// keeps the lanes in one SIMD register instead of a serial chain.
#[inline(always)]
fn lanes(s: &[f32; BLOCK_KEYS], init: f32, op: impl Fn(f32, f32) -> f32) -> f32 {
    const LANES: usize = 16;
    let mut acc = [init; LANES];
    for chunk in s.chunks_exact(LANES) {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a = op(*a, x);
        }
    }
    acc.into_iter().fold(init, op)
}

/// `o[r] += Σ_c p[r][c] · v[c]`, in column strips of BLOCK_KEYS so a strip's ROWS accumulators
/// stay in registers.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn accumulate_values<const HD: usize>(p: &[[f32; BLOCK_KEYS]; ROWS], v: &[f32], o: &mut [[f32; HD]]) {
    const STRIP: usize = BLOCK_KEYS;
    for col in (0..HD).step_by(STRIP) {
        let mut a = [[0.0f32; STRIP]; ROWS];
        for (a, o) in a.iter_mut().zip(o.iter()) {
            a.copy_from_slice(&o[col..col + STRIP]);
        }
        for (c, v_c) in v.chunks_exact(HD).take(BLOCK_KEYS).enumerate() {
            let v_c: &[f32; STRIP] = v_c[col..col + STRIP].try_into().expect("a strip of a row");
            for (a, p) in a.iter_mut().zip(p) {
                let w = p[c];
                for e in 0..STRIP {
                    a[e] = mul_add(w, v_c[e], a[e]);
                }
            }
        }
        for (a, o) in a.iter().zip(o.iter_mut()) {
            o[col..col + STRIP].copy_from_slice(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The candle path of `engine::model` for one layer, head by head:
    /// `softmax(q kᵀ / √hd + causal mask) v`.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, group: usize, pos: usize) -> Tensor {
        let (_, n_heads, n, hd) = q.dims4().unwrap();
        let len = pos + n;
        let mask: Vec<f32> =
            (0..n).flat_map(|i| (0..len).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 })).collect();
        let mask = Tensor::from_vec(mask, (n, len), &Device::Cpu).unwrap();
        let heads: Vec<Tensor> = (0..n_heads)
            .map(|h| {
                let q_h = q.narrow(1, h, 1).unwrap().squeeze(0).unwrap().squeeze(0).unwrap(); // (n, hd)
                let kv = h / group;
                let k_h = k.narrow(1, kv, 1).unwrap().narrow(2, 0, len).unwrap().squeeze(0).unwrap().squeeze(0).unwrap();
                let v_h = v.narrow(1, kv, 1).unwrap().narrow(2, 0, len).unwrap().squeeze(0).unwrap().squeeze(0).unwrap();
                let s = ((q_h.matmul(&k_h.t().unwrap()).unwrap() * (1.0 / (hd as f64).sqrt())).unwrap() + &mask).unwrap();
                candle_nn::ops::softmax_last_dim(&s).unwrap().matmul(&v_h.contiguous().unwrap()).unwrap() // (n, hd)
            })
            .collect();
        Tensor::cat(&heads, 1).unwrap() // (n, n_heads · hd)
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
    }

    #[test]
    fn matches_the_candle_path() {
        let dev = Device::Cpu;
        // SmolLM2's shape (9 heads over 3 K/V heads of 64) and a 128-wide one; token counts
        // that do and do not fill whole units, caches that do and do not fill whole key blocks.
        for (n_heads, n_kv, hd) in [(9, 3, 64), (4, 2, 128)] {
            let capacity = 320;
            let k = Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap();
            let v = Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap();
            for (pos, n) in [(0, 2), (0, 37), (5, 8), (100, 1), (250, 70)] {
                // Larger queries than unit variance so some rows are sharply peaked.
                let q = Tensor::randn(0f32, 3.0, (1, n_heads, n, hd), &dev).unwrap();
                let fast = try_prefill_attention(&q, &k, &v, pos).expect("fast path applies");
                let want = reference(&q, &k, &v, n_heads / n_kv, pos);
                assert_eq!(fast.dims(), &[n, n_heads * hd]);
                let diff = max_abs_diff(&fast, &want);
                assert!(diff <= 2e-5, "heads {n_heads}/{n_kv} hd {hd} pos {pos} n {n}: max abs diff {diff}");
            }
        }
    }

    #[test]
    fn declines_what_it_cannot_do() {
        let dev = Device::Cpu;
        let q = Tensor::zeros((1, 4, 3, 64), DType::F32, &dev).unwrap();
        let k = Tensor::zeros((1, 2, 16, 64), DType::F32, &dev).unwrap();
        assert!(try_prefill_attention(&q, &k.to_dtype(DType::F16).unwrap(), &k, 2).is_none());
        let odd_head = Tensor::zeros((1, 2, 16, 48), DType::F32, &dev).unwrap();
        assert!(try_prefill_attention(&Tensor::zeros((1, 4, 3, 48), DType::F32, &dev).unwrap(), &odd_head, &odd_head, 2).is_none());
        assert!(try_prefill_attention(&q, &k, &k, 14).is_none()); // 14 + 3 > 16
        assert!(try_prefill_attention(&q, &k, &k, 13).is_some());
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// Not a check: `cargo test --release --lib prefill_speed -- --ignored --nocapture`
    /// prints this kernel's multiply-add rate at turn 10 of the 128 + 128 bench.
    #[test]
    #[ignore]
    fn prefill_speed() {
        let (n_heads, n_kv, hd, pos, n) = (9, 3, 64, 2432, 128);
        let dev = Device::Cpu;
        let q = Tensor::randn(0f32, 1.0, (1, n_heads, n, hd), &dev).unwrap();
        let k = Tensor::randn(0f32, 1.0, (1, n_kv, pos + n, hd), &dev).unwrap();
        let v = Tensor::randn(0f32, 1.0, (1, n_kv, pos + n, hd), &dev).unwrap();
        try_prefill_attention(&q, &k, &v, pos).unwrap();
        let t = std::time::Instant::now();
        let layers = 30;
        for _ in 0..layers {
            try_prefill_attention(&q, &k, &v, pos).unwrap();
        }
        let s = t.elapsed().as_secs_f64();
        let macs = 2.0 * (n_heads * n * (pos + n / 2) * hd * layers) as f64;
        println!("{layers} layers: {:.1} ms, {:.1} G multiply-adds/s", s * 1e3, macs / s / 1e9);
    }
}
