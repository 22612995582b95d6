//! Single-token decode attention in plain Rust, for the CPU.
//!
//! For one new token, self-attention is a few dot products and axpys per cached position.
//! Candle spends about a dozen small ops (narrow, squeeze, to_dtype, matmul, scale,
//! softmax, matmul, reshape, transpose, contiguous…) on it per layer, each with its own
//! allocation and dispatch. Late in a conversation attention is a large share of a decode
//! step (2.5K positions of SmolLM2 are 3.9 MB of f32 K/V per layer), so:
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
//! An f16 or q8_0 cache is read in place, each row widened to f32 once as it is reached
//! (half, or 17/64, of the bytes of an f32 cache to stream, which is what
//! late-conversation decode waits on) and then read by every query head of the group.

use super::{exp, for_each_unit, lanes, max, mul_add, prefetch, q8_0, Dims, Kv, Level, PORTABLE};
#[cfg(target_arch = "x86_64")]
use super::{AVX2, AVX512};
use crate::engine::cpu::pool::SendPtr;
use crate::engine::cpu::qlinear::blocks::BlockQ8_0;
use half::f16;

/// Cached positions per unit.
const CHUNK: usize = 128;
/// How far ahead (4 KiB) the K and V rows are prefetched: the hardware prefetcher did not
/// keep up with these reads here (decode at a 2K context ~115 → ~130 tok/s).
const AHEAD_BYTES: usize = 4096;

/// Attention of the one new token in row `d.pos` against rows `0..=d.pos` (the last
/// `d.window` of them with a window).
///
/// `q`: `(n_heads, hd)` after RoPE; `k`, `v`: `(n_kv_heads, capacity, hd)`;
/// `out`: `(n_heads · hd)`, heads in order. Same math as the candle path
/// (`q @ kᵀ · scale → softmax → @ v`) in f32, summed in another order.
pub(crate) fn decode_attention(q: &[f32], k: Kv, v: Kv, d: Dims, out: &mut [f32], level: Level) {
    assert!(d.n_kv_heads > 0 && d.n_heads.is_multiple_of(d.n_kv_heads), "heads must split into kv groups");
    assert!(d.n == 1 && d.pos < d.capacity, "one new token inside the cache");
    assert_eq!(q.len(), d.n_heads * d.head_dim);
    assert_eq!(out.len(), d.n_heads * d.head_dim);
    assert!(k.len() >= d.n_kv_heads * d.capacity * d.head_dim && v.len() >= d.n_kv_heads * d.capacity * d.head_dim);
    match d.head_dim {
        64 => decode::<64>(q, k, v, d, out, level),
        128 => decode::<128>(q, k, v, d, out, level),
        256 => decode::<256>(q, k, v, d, out, level),
        512 => decode::<512>(q, k, v, d, out, level),
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

fn decode<const HD: usize>(q: &[f32], k: Kv, v: Kv, d: Dims, out: &mut [f32], level: Level) {
    let group = d.n_heads / d.n_kv_heads;
    let (first, len) = (d.first_seen(d.pos), d.pos + 1);
    let chunks = (len - first).div_ceil(CHUNK);
    let scale = 1.0 / (HD as f32).sqrt();
    let q: Vec<[f32; HD]> = q.as_chunks::<HD>().0.iter().map(|q| q.map(|x| x * scale)).collect();
    let empty = Partial { max: f32::NEG_INFINITY, sum: 0.0, o: [0.0; HD] };
    // partials[(kv · chunks + chunk) · group + h]
    let mut partials = vec![empty; d.n_kv_heads * chunks * group];
    let partials_ptr = SendPtr(partials.as_mut_ptr());
    // Decode's multiply-adds each come with a cache read, so it pays to split them over
    // the pool from a quarter of the usual amount (measured: ~3% faster decode at a few
    // hundred cached tokens, none slower at 2K).
    for_each_unit(d.n_kv_heads * chunks, 4 * d.n_heads * (len - first) * HD, |u| {
        let (kv, chunk) = (u / chunks, u % chunks);
        let positions = first + chunk * CHUNK..len.min(first + (chunk + 1) * CHUNK);
        let rows = (kv * d.capacity + positions.start) * HD..(kv * d.capacity + positions.end) * HD;
        // SAFETY: unit u writes only its own `group` partials; `partials` outlives the call.
        let mine = unsafe { std::slice::from_raw_parts_mut(partials_ptr.get().add(u * group), group) };
        let q = &q[kv * group..(kv + 1) * group];
        match (k, v) {
            (Kv::F32(k), Kv::F32(v)) => chunk_partials_at::<HD, f32>(level, q, &k[rows.clone()], &v[rows], mine),
            (Kv::F16(k), Kv::F16(v)) => chunk_partials_at::<HD, f16>(level, q, &k[rows.clone()], &v[rows], mine),
            (Kv::Q8_0(k), Kv::Q8_0(v)) => {
                let blocks = rows.start / q8_0::VALUES..rows.end / q8_0::VALUES;
                chunk_partials_at::<HD, BlockQ8_0>(level, q, &k[blocks.clone()], &v[blocks], mine)
            }
            _ => unreachable!("K and V share a dtype (checked by try_attention)"),
        }
    });
    for (h, out) in out.chunks_exact_mut(HD).enumerate() {
        let (kv, g) = (h / group, h % group);
        let parts = || (0..chunks).map(|c| &partials[(kv * chunks + c) * group + g]);
        let max = parts().fold(f32::NEG_INFINITY, |m, p| m.max(p.max));
        let mut sum = 0.0;
        out.fill(0.0);
        for p in parts() {
            let w = exp::<PORTABLE>(p.max - max);
            sum += w * p.sum;
            for (o, &x) in out.iter_mut().zip(&p.o) {
                *o = mul_add::<PORTABLE>(w, x, *o);
            }
        }
        out.iter_mut().for_each(|o| *o /= sum);
    }
}

/// [`chunk_partials`] compiled for `level`'s instruction set.
fn chunk_partials_at<const HD: usize, E: CacheElem>(
    level: Level,
    q: &[[f32; HD]],
    keys: &[E],
    values: &[E],
    out: &mut [Partial<HD>],
) {
    match level {
        // SAFETY: levels above PORTABLE come from `Isa::detect`: this CPU has their
        // instructions.
        #[cfg(target_arch = "x86_64")]
        AVX512 => unsafe { chunk_partials_avx512::<HD, E>(q, keys, values, out) },
        #[cfg(target_arch = "x86_64")]
        AVX2 => unsafe { chunk_partials_avx2::<HD, E>(q, keys, values, out) },
        _ => chunk_partials::<HD, E, PORTABLE>(q, keys, values, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
fn chunk_partials_avx512<const HD: usize, E: CacheElem>(
    q: &[[f32; HD]],
    keys: &[E],
    values: &[E],
    out: &mut [Partial<HD>],
) {
    chunk_partials::<HD, E, AVX512>(q, keys, values, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn chunk_partials_avx2<const HD: usize, E: CacheElem>(
    q: &[[f32; HD]],
    keys: &[E],
    values: &[E],
    out: &mut [Partial<HD>],
) {
    chunk_partials::<HD, E, AVX2>(q, keys, values, out)
}

/// The partial softmax of the `group` (pre-scaled) queries `q` over one chunk of keys and
/// values, each `(positions, HD)` values.
#[inline(always)]
fn chunk_partials<const HD: usize, E: CacheElem, const L: Level>(
    q: &[[f32; HD]],
    keys: &[E],
    values: &[E],
    out: &mut [Partial<HD>],
) {
    let keys = keys.chunks_exact(HD / E::VALUES);
    let values = values.chunks_exact(HD / E::VALUES);
    let n_keys = keys.len();
    let mut scores = vec![[0.0f32; CHUNK]; q.len()];
    for (j, k_j) in keys.enumerate() {
        prefetch(k_j.as_ptr().cast::<u8>().wrapping_add(AHEAD_BYTES), size_of_val(k_j));
        E::as_f32::<HD, L>(k_j, |k_j| {
            for (s, q_h) in scores.iter_mut().zip(q) {
                s[j] = dot::<HD, L>(q_h, k_j);
            }
        });
    }
    for (s, p) in scores.iter_mut().zip(out.iter_mut()) {
        let s = &mut s[..n_keys];
        p.max = lanes(s, f32::NEG_INFINITY, max);
        s.iter_mut().for_each(|x| *x = exp::<L>(*x - p.max));
        p.sum = lanes(s, 0.0, |a, b| a + b);
    }
    for (j, v_j) in values.enumerate() {
        prefetch(v_j.as_ptr().cast::<u8>().wrapping_add(AHEAD_BYTES), size_of_val(v_j));
        E::as_f32::<HD, L>(v_j, |v_j| {
            for (p, s) in out.iter_mut().zip(&scores) {
                axpy::<HD, L>(s[j], v_j, &mut p.o);
            }
        });
    }
}

/// An element type of the cache.
trait CacheElem: Copy {
    /// Values one element holds (32 for a q8_0 block).
    const VALUES: usize = 1;
    /// Calls `f` with `row` (`HD / VALUES` elements) as f32: the row itself, or a copy
    /// widened once for every query head of the group to read.
    fn as_f32<const HD: usize, const L: Level>(row: &[Self], f: impl FnOnce(&[f32; HD]));
}

impl CacheElem for f32 {
    #[inline(always)]
    fn as_f32<const HD: usize, const L: Level>(row: &[f32], f: impl FnOnce(&[f32; HD])) {
        f(row.try_into().expect("rows of HD values"))
    }
}

impl CacheElem for BlockQ8_0 {
    const VALUES: usize = q8_0::VALUES;

    /// On the stack, eight values at a time with AVX2.
    #[inline(always)]
    fn as_f32<const HD: usize, const L: Level>(row: &[BlockQ8_0], f: impl FnOnce(&[f32; HD])) {
        let mut wide = [0.0; HD];
        q8_0::dequantize::<L>(row, &mut wide);
        f(&wide)
    }
}

impl CacheElem for f16 {
    /// On the stack: with F16C eight at a time, inlined into the unit (`half`'s slice
    /// conversion is a call per row, whose run-time check costs more than the row);
    /// otherwise with `half`'s conversion.
    #[inline(always)]
    fn as_f32<const HD: usize, const L: Level>(row: &[f16], f: impl FnOnce(&[f32; HD])) {
        debug_assert_eq!(row.len(), HD);
        let mut wide = [0.0; HD];
        #[cfg(target_arch = "x86_64")]
        if L != PORTABLE {
            use std::arch::x86_64::{_mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
            for i in (0..HD).step_by(8) {
                // SAFETY: levels above PORTABLE run inside functions compiled with F16C
                // and AVX; HD is a multiple of 8 and the loads and stores are unaligned.
                unsafe {
                    let halves = _mm_loadu_si128(row.as_ptr().add(i).cast());
                    _mm256_storeu_ps(wide.as_mut_ptr().add(i), _mm256_cvtph_ps(halves));
                }
            }
            return f(&wide);
        }
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(row, &mut wide);
        f(&wide)
    }
}

/// `a · b`. With AVX-512: 16-wide multiply-adds and one horizontal add per key (written
/// with intrinsics: the portable loop below came out as 2-wide operations there).
/// Otherwise in 16 independent lanes, then the lanes added as a tree (a serial sum of the
/// lanes would be a chain of 15 dependent adds per key).
#[inline(always)]
fn dot<const HD: usize, const L: Level>(a: &[f32; HD], b: &[f32; HD]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if L == AVX512 {
        use std::arch::x86_64::{_mm512_fmadd_ps, _mm512_loadu_ps, _mm512_reduce_add_ps, _mm512_setzero_ps};
        // SAFETY: the AVX512 level runs inside functions compiled with AVX-512F; both
        // arrays hold HD floats, a multiple of 16, and the loads are unaligned ones.
        return unsafe {
            let mut acc = _mm512_setzero_ps();
            for i in (0..HD).step_by(16) {
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(a.as_ptr().add(i)), _mm512_loadu_ps(b.as_ptr().add(i)), acc);
            }
            _mm512_reduce_add_ps(acc)
        };
    }
    let mut acc = [0.0f32; 16];
    for (x, y) in a.as_chunks::<16>().0.iter().zip(b.as_chunks::<16>().0) {
        for ((acc, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *acc = mul_add::<L>(x, y, *acc);
        }
    }
    let half: [f32; 8] = std::array::from_fn(|l| acc[l] + acc[l + 8]);
    let quarter: [f32; 4] = std::array::from_fn(|l| half[l] + half[l + 4]);
    (quarter[0] + quarter[2]) + (quarter[1] + quarter[3])
}

/// `y += a·x`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn axpy<const HD: usize, const L: Level>(a: f32, x: &[f32; HD], y: &mut [f32; HD]) {
    for i in 0..HD {
        y[i] = mul_add::<L>(a, x[i], y[i]);
    }
}
