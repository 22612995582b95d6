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
//!       causal: key j is seen by the query at position p only if j ≤ p (and, in a
//!       sliding-window layer, p − j < window)
//!       online softmax: m' = max(m, max s); o ← o·e^(m−m'); l ← l·e^(m−m') + Σ e^(s−m')
//!       o += e^(s−m') · v block
//!   out = o / l
//! ```
//!
//! An f16 or q8_0 cache is converted to f32 once per layer, while the keys are transposed.
//! Units run on candle's barrier pool. The sums run in another order than candle's
//! (per key block, with a polynomial `exp`), so results agree with the candle path to
//! float rounding, not bit for bit; see the tests.

use super::{exp, fold_lanes, for_each_unit, lanes, max, mul_add, Dims, Kv, Level, LANES, PORTABLE};
#[cfg(target_arch = "x86_64")]
use super::{AVX2, AVX512};
use crate::engine::cpu::pool::SendPtr;

/// New tokens per work unit.
const TOKENS: usize = 16;
/// Query rows per register tile.
const ROWS: usize = 4;
/// Keys per block (`B` below), and value columns per strip, for a level. A tile of ROWS ×
/// this many accumulators then takes half the vector registers: 16 of 32 with AVX-512
/// (measured here: 64 keys ran about 5% faster than 32), 8 of 16 with AVX2, 16 of 32 with
/// NEON (not measured). A multiple of 16, the lanes of `lanes`.
#[cfg(target_arch = "x86_64")]
const BLOCK_KEYS_AVX512: usize = 64;
const BLOCK_KEYS: usize = 16;

/// `q`: `(n_heads, n, hd)`; `k`, `v`: `(n_kv_heads, capacity, hd)`; `out`: `(n, n_heads · hd)`.
/// `head_dim` must be 64, 128, 256 or 512.
pub(crate) fn prefill_attention(q: &[f32], k: Kv, v: Kv, d: Dims, out: &mut [f32], level: Level) {
    assert!(d.n_kv_heads > 0 && d.n_heads.is_multiple_of(d.n_kv_heads), "heads must split into kv groups");
    assert!(d.n > 0 && d.pos + d.n <= d.capacity, "new tokens must fit the cache");
    assert_eq!(q.len(), d.n_heads * d.n * d.head_dim);
    assert_eq!(out.len(), d.n * d.n_heads * d.head_dim);
    assert!(k.len() >= d.n_kv_heads * d.capacity * d.head_dim && v.len() >= d.n_kv_heads * d.capacity * d.head_dim);

    match level {
        #[cfg(target_arch = "x86_64")]
        AVX512 => with_level::<BLOCK_KEYS_AVX512, AVX512>(q, k, v, d, out),
        #[cfg(target_arch = "x86_64")]
        AVX2 => with_level::<BLOCK_KEYS, AVX2>(q, k, v, d, out),
        _ => with_level::<BLOCK_KEYS, PORTABLE>(q, k, v, d, out),
    }
}

/// The kernel with blocks of `B` keys, its units compiled for level `L`.
///
/// Key blocks start at multiples of `B` in *positions*, not buffer rows: a sliding layer's
/// buffer starts at any position ([`Dims::phase`] past a multiple of 64), so its keys are
/// laid out after `phase` empty rows that no query sees. Every block then holds the same
/// positions as in a buffer that keeps every position, and the sums run in the same order:
/// the windowed cache gives the full cache's logits bit for bit.
fn with_level<const B: usize, const L: Level>(q: &[f32], k: Kv, v: Kv, d: Dims, out: &mut [f32]) {
    let phase = d.phase % B;
    SCRATCH.with(|cell| {
        let (kt, v_f32) = &mut *cell.borrow_mut();
        let in_place = matches!(v, Kv::F32(_)) && phase == 0;
        prepare::<B, L>(k, v, d, phase, !in_place, kt, v_f32);
        // The units count in the laid-out rows.
        let laid_out = Dims { pos: d.pos + phase, ..d };
        match v {
            // f32 values are read in place, `capacity` positions apart per head.
            Kv::F32(v) if in_place => attend::<B, L>(q, kt, v, d.capacity, laid_out, out),
            _ => attend::<B, L>(q, kt, v_f32, phase + d.pos + d.n, laid_out, out),
        }
    });
}

thread_local! {
    /// The layer's transposed keys, and its values as f32 when the cache is not; reused
    /// across layers and forwards.
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Fills `kt` with the live keys of every K/V head, after `phase` empty rows, as blocks
/// of `hd × B` (zero-padded), so the score tiles read keys along their vector lanes, and,
/// when `copy_values`, `v_f32` with the live values as f32 `(n_kv_heads, phase + pos + n,
/// hd)`, after the same empty rows. Once per layer, not once per unit.
fn prepare<const B: usize, const L: Level>(
    k: Kv,
    v: Kv,
    d: Dims,
    phase: usize,
    copy_values: bool,
    kt: &mut Vec<f32>,
    v_f32: &mut Vec<f32>,
) {
    let (hd, live) = (d.head_dim, d.pos + d.n);
    let laid_out = phase + live;
    let blocks = laid_out.div_ceil(B);
    let block_len = hd * B;
    kt.clear();
    kt.resize(d.n_kv_heads * blocks * block_len, 0.0);
    v_f32.clear();
    if copy_values {
        v_f32.resize(d.n_kv_heads * laid_out * hd, 0.0);
    }
    let (kt_ptr, v_ptr) = (SendPtr(kt.as_mut_ptr()), SendPtr(v_f32.as_mut_ptr()));
    for_each_unit(d.n_kv_heads * blocks, d.n_kv_heads * live * hd, |u| {
        let (kv, block) = (u / blocks, u % blocks);
        // Laid-out rows `slots` of the block hold buffer rows `first..first + width`.
        let slots = (block * B).max(phase)..((block + 1) * B).min(laid_out);
        let (first, width) = (slots.start - phase, slots.len());
        let rows = (kv * d.capacity + first) * hd..(kv * d.capacity + first + width) * hd;
        let mut k_f32 = Vec::new();
        let keys = k.f32s::<L>(rows.clone(), &mut k_f32);
        // SAFETY: unit u writes only its own key block and its own value rows; both
        // buffers outlive the pool call.
        let dst = unsafe { std::slice::from_raw_parts_mut(kt_ptr.get().add(u * block_len), block_len) };
        for (c, key) in keys.chunks_exact(hd).enumerate() {
            for (dst, &x) in dst.chunks_exact_mut(B).zip(key) {
                dst[slots.start - block * B + c] = x;
            }
        }
        if copy_values {
            let at = (kv * laid_out + slots.start) * hd;
            let dst = unsafe { std::slice::from_raw_parts_mut(v_ptr.get().add(at), width * hd) };
            v.convert::<L>(rows, dst);
        }
    });
}

/// The units of the module docs, given the transposed keys and f32 values whose heads
/// start `v_stride` positions apart.
fn attend<const B: usize, const L: Level>(q: &[f32], kt: &[f32], v: &[f32], v_stride: usize, d: Dims, out: &mut [f32]) {
    let token_blocks = d.n.div_ceil(TOKENS);
    let kt_per_head = kt.len() / d.n_kv_heads;
    let out_ptr = SendPtr(out.as_mut_ptr());
    let macs = d.n_heads * d.n * (d.pos + d.n) * d.head_dim;
    for_each_unit(d.n_kv_heads * token_blocks, macs, |u| {
        let (kv, block) = (u / token_blocks, u % token_blocks);
        let tokens = block * TOKENS..d.n.min((block + 1) * TOKENS);
        let kt = &kt[kv * kt_per_head..][..kt_per_head];
        match d.head_dim {
            64 => unit_at::<64, B, L>(q, kt, &v[kv * v_stride * 64..], d, kv, tokens, out_ptr),
            128 => unit_at::<128, B, L>(q, kt, &v[kv * v_stride * 128..], d, kv, tokens, out_ptr),
            256 => unit_at::<256, B, L>(q, kt, &v[kv * v_stride * 256..], d, kv, tokens, out_ptr),
            512 => unit_at::<512, B, L>(q, kt, &v[kv * v_stride * 512..], d, kv, tokens, out_ptr),
            other => unreachable!("head size {other} is checked by the caller"),
        }
    });
}

/// The arguments of one unit.
type UnitArgs<'a> = (&'a [f32], &'a [f32], &'a [f32], Dims, usize, std::ops::Range<usize>, SendPtr<f32>);

/// [`unit`] compiled for level `L`'s instruction set.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn unit_at<const HD: usize, const B: usize, const L: Level>(
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    d: Dims,
    kv: usize,
    tokens: std::ops::Range<usize>,
    out: SendPtr<f32>,
) {
    let args = (q, kt, v, d, kv, tokens, out);
    match L {
        // SAFETY: levels above PORTABLE come from `Isa::detect`: this CPU has their
        // instructions.
        #[cfg(target_arch = "x86_64")]
        AVX512 => unsafe { unit_avx512::<HD, B>(args) },
        #[cfg(target_arch = "x86_64")]
        AVX2 => unsafe { unit_avx2::<HD, B>(args) },
        _ => unit::<HD, B, PORTABLE>(args),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
fn unit_avx512<const HD: usize, const B: usize>(args: UnitArgs<'_>) {
    unit::<HD, B, AVX512>(args)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn unit_avx2<const HD: usize, const B: usize>(args: UnitArgs<'_>) {
    unit::<HD, B, AVX2>(args)
}

/// One unit: K/V head `kv` (whose values start `v`), new tokens `tokens`, every query
/// head of the group; writes their rows of `out`.
#[inline(always)]
fn unit<const HD: usize, const B: usize, const L: Level>((q, kt, v, d, kv, tokens, out): UnitArgs<'_>) {
    let group = d.n_heads / d.n_kv_heads;
    let n_tok = tokens.len();
    let rows = group * n_tok;
    let padded = rows.div_ceil(ROWS) * ROWS;
    let scale = 1.0 / (HD as f32).sqrt();

    // Row r is query head `kv·group + r / n_tok` at new token `tokens.start + r % n_tok`,
    // and sees keys `first[r]..limit[r]`; padding rows are zero queries allowed to see
    // every key the unit reads, and are dropped at the end.
    let mut qs = vec![[0.0f32; HD]; padded];
    let mut first = vec![d.first_seen(d.pos + tokens.start); padded];
    let mut limit = vec![d.pos + tokens.end; padded];
    for r in 0..rows {
        let (head, t) = (kv * group + r / n_tok, tokens.start + r % n_tok);
        let src = &q[(head * d.n + t) * HD..][..HD];
        for (dst, &x) in qs[r].iter_mut().zip(src) {
            *dst = x * scale;
        }
        first[r] = d.first_seen(d.pos + t);
        limit[r] = d.pos + t + 1;
    }
    let n_keys = d.pos + tokens.end;
    let values = &v[..n_keys * HD];
    let kt = kt.as_chunks::<B>().0.as_chunks::<HD>().0;
    let kt = &kt[..n_keys.div_ceil(B)];

    let mut acc = Accumulators {
        o: vec![[0.0f32; HD]; padded],
        max: vec![f32::NEG_INFINITY; padded],
        sum: vec![[0.0; LANES]; padded],
    };
    key_loop::<HD, B, L>(&qs, (&first, &limit), kt, values, &mut acc);

    for r in 0..rows {
        let (head, t) = (kv * group + r / n_tok, tokens.start + r % n_tok);
        let inv = 1.0 / fold_lanes(acc.sum[r], |a, b| a + b);
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
    /// Σ e^(s − max) so far, in LANES partial sums: folding them once at the end
    /// instead of per block keeps a horizontal add out of the key loop.
    sum: Vec<[f32; LANES]>,
}

/// `B` keys transposed: `[d][c]` is component `d` of key `c`.
type KeysT<const HD: usize, const B: usize> = [[f32; B]; HD];

/// The key-block loop of the module docs over `q.len()` rows (a multiple of [`ROWS`]),
/// row `r` seeing keys `first[r]..limit[r]`. Blocks before every row's first key are
/// skipped (a sliding-window layer's rows before its window).
#[inline(always)]
fn key_loop<const HD: usize, const B: usize, const L: Level>(
    q: &[[f32; HD]],
    (first, limit): (&[usize], &[usize]),
    kt: &[KeysT<HD, B>],
    values: &[f32],
    acc: &mut Accumulators<HD>,
) {
    let n_keys = values.len() / HD;
    let first_block = first.iter().min().map_or(0, |&f| f / B);
    for (block, kt) in kt.iter().enumerate().skip(first_block) {
        let start = block * B;
        let width = B.min(n_keys - start);
        let block_values = &values[start * HD..(start + width) * HD];
        for r0 in (0..q.len()).step_by(ROWS) {
            let mut s = scores::<HD, B, L>(&q[r0..r0 + ROWS], kt);
            for (i, s) in s.iter_mut().enumerate() {
                let r = r0 + i;
                let end = width.min(limit[r].saturating_sub(start));
                let seen = first[r].saturating_sub(start).min(end)..end;
                softmax_step::<HD, B, L>(s, seen, &mut acc.max[r], &mut acc.sum[r], &mut acc.o[r]);
            }
            accumulate_values::<HD, B, L>(&s, block_values, &mut acc.o[r0..r0 + ROWS]);
        }
    }
}

/// `s[r][c] = q[r] · kᵀ[·][c]`: a register tile of ROWS × B sums.
///
/// The innermost loops here and in [`accumulate_values`] index fixed-size arrays on
/// purpose: written with `zip`, LLVM kept the same loop scalar once it was inlined into
/// the unit (measured: 3× slower prefill attention).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn scores<const HD: usize, const B: usize, const L: Level>(q: &[[f32; HD]], kt: &KeysT<HD, B>) -> [[f32; B]; ROWS] {
    #[cfg(target_arch = "x86_64")]
    if L == AVX512 {
        // SAFETY: AVX512 units run only where `Isa::detect` found AVX-512 F.
        return unsafe { scores_avx512::<HD, B>(q, kt) };
    }
    let mut s = [[0.0f32; B]; ROWS];
    for (d, kt_d) in kt.iter().enumerate() {
        for (s_r, q_r) in s.iter_mut().zip(q) {
            let x = q_r[d];
            for c in 0..B {
                s_r[c] = mul_add::<L>(x, kt_d[c], s_r[c]);
            }
        }
    }
    s
}

/// [`scores`] with its ROWS × B sums held in AVX-512 registers by name. The portable
/// loop, compiled for AVX-512 with B = 64, kept its sixteen accumulators on the stack:
/// every multiply-add read and wrote memory (`perf annotate`), and prefill attention took
/// 13 % of a 128-token Qwen3-0.6B prefill, three times the AVX2 path's share. The same
/// multiply-adds in the same order: the scores are bit for bit the portable loop's.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn scores_avx512<const HD: usize, const B: usize>(q: &[[f32; HD]], kt: &KeysT<HD, B>) -> [[f32; B]; ROWS] {
    use std::arch::x86_64::{
        __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
    };
    const WIDE: usize = 16;
    const { assert!(B.is_multiple_of(WIDE) && B <= 4 * WIDE) };
    let q: &[[f32; HD]; ROWS] = q.try_into().expect("a tile of ROWS query rows");
    let mut acc: [[__m512; 4]; ROWS] = [[_mm512_setzero_ps(); 4]; ROWS];
    for (d, kt_d) in kt.iter().enumerate() {
        let mut keys = [_mm512_setzero_ps(); 4];
        for j in 0..B / WIDE {
            keys[j] = _mm512_loadu_ps(kt_d.as_ptr().add(j * WIDE));
        }
        for r in 0..ROWS {
            let x = _mm512_set1_ps(q[r][d]);
            for j in 0..B / WIDE {
                acc[r][j] = _mm512_fmadd_ps(x, keys[j], acc[r][j]);
            }
        }
    }
    let mut s = [[0.0f32; B]; ROWS];
    for r in 0..ROWS {
        for j in 0..B / WIDE {
            _mm512_storeu_ps(s[r].as_mut_ptr().add(j * WIDE), acc[r][j]);
        }
    }
    s
}

/// Online-softmax update of one row for one key block whose keys `seen` it may see:
/// turns `s` into the block's weights `e^(s − max)` (0 for unseen keys) and rescales the
/// row's running sums to the new maximum. Branch-free over the block so it vectorizes.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn softmax_step<const HD: usize, const B: usize, const L: Level>(
    s: &mut [f32; B],
    seen: std::ops::Range<usize>,
    row_max: &mut f32,
    sum: &mut [f32; LANES],
    o: &mut [f32; HD],
) {
    if seen.is_empty() {
        s.fill(0.0);
        return;
    }
    // Only the blocks at a unit's causal edge, or at a window's start, are partly seen.
    s[..seen.start].fill(f32::NEG_INFINITY);
    s[seen.end..].fill(f32::NEG_INFINITY);
    let new_max = max(*row_max, lanes(s, f32::NEG_INFINITY, max));
    for s in s.iter_mut() {
        *s = exp::<L>(*s - new_max);
    }
    if new_max > *row_max {
        let shrink = exp::<L>(*row_max - new_max); // 0 for the first block (max = -inf)
        sum.iter_mut().for_each(|x| *x *= shrink);
        o.iter_mut().for_each(|x| *x *= shrink);
        *row_max = new_max;
    }
    // On a local copy, indexed: LLVM left the same loop scalar over `sum` in place.
    let mut lanes = *sum;
    for chunk in s.as_chunks::<LANES>().0 {
        for i in 0..LANES {
            lanes[i] += chunk[i];
        }
    }
    *sum = lanes;
}

/// `o[r] += Σ_c p[r][c] · v[c]`, in column strips of B (as wide as a key block) so a
/// strip's ROWS accumulators
/// stay in registers.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn accumulate_values<const HD: usize, const B: usize, const L: Level>(
    p: &[[f32; B]; ROWS],
    v: &[f32],
    o: &mut [[f32; HD]],
) {
    #[cfg(target_arch = "x86_64")]
    if L == AVX512 {
        // SAFETY: as in `scores`.
        return unsafe { accumulate_values_avx512::<HD, B>(p, v, o) };
    }
    for col in (0..HD).step_by(B) {
        let mut a = [[0.0f32; B]; ROWS];
        for (a, o) in a.iter_mut().zip(o.iter()) {
            a.copy_from_slice(&o[col..col + B]);
        }
        for (c, v_c) in v.chunks_exact(HD).take(B).enumerate() {
            let v_c: &[f32; B] = v_c[col..col + B].try_into().expect("a strip of a row");
            for (a, p) in a.iter_mut().zip(p) {
                let w = p[c];
                for e in 0..B {
                    a[e] = mul_add::<L>(w, v_c[e], a[e]);
                }
            }
        }
        for (a, o) in a.iter().zip(o.iter_mut()) {
            o[col..col + B].copy_from_slice(a);
        }
    }
}

/// [`accumulate_values`] with its strip's ROWS × B sums held in AVX-512 registers by name,
/// for the reason [`scores_avx512`] gives; the same multiply-adds in the same order.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn accumulate_values_avx512<const HD: usize, const B: usize>(
    p: &[[f32; B]; ROWS],
    v: &[f32],
    o: &mut [[f32; HD]],
) {
    use std::arch::x86_64::{
        __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
    };
    const WIDE: usize = 16;
    const { assert!(B.is_multiple_of(WIDE) && B <= 4 * WIDE && HD.is_multiple_of(B)) };
    let o: &mut [[f32; HD]; ROWS] = o.try_into().expect("a tile of ROWS output rows");
    let keys = (v.len() / HD).min(B);
    for col in (0..HD).step_by(B) {
        let mut acc: [[__m512; 4]; ROWS] = [[_mm512_setzero_ps(); 4]; ROWS];
        for r in 0..ROWS {
            for j in 0..B / WIDE {
                acc[r][j] = _mm512_loadu_ps(o[r].as_ptr().add(col + j * WIDE));
            }
        }
        for c in 0..keys {
            let v_c = &v[c * HD + col..][..B];
            let mut vals = [_mm512_setzero_ps(); 4];
            for j in 0..B / WIDE {
                vals[j] = _mm512_loadu_ps(v_c.as_ptr().add(j * WIDE));
            }
            for r in 0..ROWS {
                let w = _mm512_set1_ps(p[r][c]);
                for j in 0..B / WIDE {
                    acc[r][j] = _mm512_fmadd_ps(w, vals[j], acc[r][j]);
                }
            }
        }
        for r in 0..ROWS {
            for j in 0..B / WIDE {
                _mm512_storeu_ps(o[r].as_mut_ptr().add(col + j * WIDE), acc[r][j]);
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::engine::cpu::kernels::Isa;

    /// A reproducible value in [-2, 2) for index `i` (no RNG: the test compares two kernels).
    fn value(i: usize, salt: u64) -> f32 {
        let x = (i as u64 ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
        (x >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    }

    #[test]
    fn avx512_register_tiles_sum_as_the_portable_loops() {
        if !Isa::all_supported().contains(&Isa::Avx512Vnni) {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        // The AVX2 level runs the portable loops with the same fused multiply-adds; at the
        // AVX-512 block width both levels must give the same bits. Partial key blocks,
        // partial token units, a window, a phase, and every head size.
        for hd in [64, 128, 256, 512] {
            for (pos, n, window, phase) in
                [(0, 1, None, 0), (0, 37, None, 0), (70, 21, None, 0), (150, 40, Some(100), 17)]
            {
                let (n_heads, n_kv_heads, capacity) = (4, 2, 256);
                let d = Dims { n_heads, n_kv_heads, head_dim: hd, capacity, pos, n, window, phase };
                let q: Vec<f32> = (0..n_heads * n * hd).map(|i| value(i, 1)).collect();
                let k: Vec<f32> = (0..n_kv_heads * capacity * hd).map(|i| value(i, 2)).collect();
                let v: Vec<f32> = (0..n_kv_heads * capacity * hd).map(|i| value(i, 3)).collect();
                let run = |level: Level| {
                    let mut out = vec![0.0f32; n * n_heads * hd];
                    match level {
                        AVX512 => with_level::<BLOCK_KEYS_AVX512, AVX512>(&q, Kv::F32(&k), Kv::F32(&v), d, &mut out),
                        _ => with_level::<BLOCK_KEYS_AVX512, AVX2>(&q, Kv::F32(&k), Kv::F32(&v), d, &mut out),
                    }
                    out
                };
                let (tiles, loops) = (run(AVX512), run(AVX2));
                let differ = tiles.iter().zip(&loops).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(differ, 0, "hd {hd} pos {pos} n {n} window {window:?}: {differ} outputs differ");
            }
        }
    }
}
