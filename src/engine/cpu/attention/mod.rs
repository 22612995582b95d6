//! Self-attention in plain Rust for the CPU, over an f32, f16 or q8_0 KV cache, used by
//! pocketchat's kernel sets (`Kernels::Fast` and `Portable`); `Kernels::Candle` and every
//! case these decline take the candle path in `engine::model`.
//!
//! - [`decode`]: one new token, split over chunks of the cached positions.
//! - [`prefill`]: several new tokens, a fused tiled kernel that never materializes the
//!   score matrix.
//!
//! The kernels are written once, generic over a [`Level`]: each work unit is entered
//! through a function compiled with that level's `#[target_feature]`s, and everything it
//! calls is `#[inline(always)]`, so the compiler vectorizes the same code for AVX-512, for
//! AVX2 + FMA, or for the target's baseline (NEON on aarch64), whatever the build's
//! `target-cpu`. The level comes from the run-time [`Isa`] detection.

mod decode;
mod prefill;
mod q8_0;

use std::ops::Range;

use candle_core::{CpuStorage, DType, Device, Layout, Storage, Tensor};
use half::slice::HalfFloatSliceExt;

use crate::engine::cpu::kernels::{Isa, Kernels};
use crate::engine::cpu::qlinear::blocks::BlockQ8_0;
use crate::engine::kv_type::KvDtype;
use crate::memory::PrefillAttention;

/// The instruction set a kernel instance is compiled for (a const parameter).
pub(crate) type Level = u8;
/// The target's baseline: SSE2 on x86-64, NEON (with FMA) on aarch64.
pub(crate) const PORTABLE: Level = 0;
/// x86-64 AVX2 + FMA + F16C.
pub(crate) const AVX2: Level = 1;
/// [`AVX2`] plus AVX-512 F/BW.
pub(crate) const AVX512: Level = 2;

/// The attention level for the matmul kernels' instruction set.
pub(crate) fn level(isa: Isa) -> Level {
    match isa {
        Isa::Avx512Vnni => AVX512,
        Isa::Avx2 | Isa::AvxVnni => AVX2,
        Isa::Scalar | Isa::Neon | Isa::NeonDot => PORTABLE,
    }
}

/// Whether the fused kernels take heads of this size.
fn fused_head_dim(head_dim: usize) -> bool {
    matches!(head_dim, 64 | 128 | 256 | 512)
}

/// How a model's prefill attention runs with these kernels, for the memory accounting:
/// fused where [`try_attention`] accepts the heads, candle's ops over the whole context
/// otherwise.
pub(crate) fn prefill_attention(
    kernels: Kernels,
    on_cpu: bool,
    head_dim: usize,
    window: Option<usize>,
) -> PrefillAttention {
    if on_cpu && kernels.isa().is_some() && fused_head_dim(head_dim) {
        PrefillAttention::Fused { window }
    } else {
        PrefillAttention::Materialized { window }
    }
}

/// What of a model's attention runs on candle's ops although our kernels were chosen, in
/// words for the load log and `bench` (empty when nothing does, or when candle's kernels
/// or a GPU were chosen for everything).
pub(crate) fn candle_fallbacks(kernels: Kernels, on_cpu: bool, head_dim: usize) -> Vec<String> {
    if !on_cpu || kernels.isa().is_none() || fused_head_dim(head_dim) {
        return Vec::new();
    }
    vec![format!("attention (heads of {head_dim}; the fused kernels take 64, 128, 256 and 512)")]
}

/// Attention of the `n` new tokens in `q` against the cache, on the CPU: `q` is
/// `(1, n_heads, n, hd)` after RoPE; `k` and `v` are the cache buffers
/// `(1, n_kv_heads, capacity, hd)` (f32 or f16; for q8_0 `U8` rows of `hd / 32 · 34`
/// bytes) whose row 0 holds position `held_from` and whose positions `held_from..pos + n`
/// are live, the new tokens' entries included. With a `window` (a sliding-window layer,
/// whose buffers hold a run of the latest positions) the query at position `p` sees
/// positions `p + 1 - window ..= p` only, which must be held. Returns `(n, n_heads · hd)`,
/// the same for any `held_from` that holds what the queries see.
///
/// Same math as the candle path (`softmax(q kᵀ / √hd + causal mask) v`) in f32, summed in
/// another order. `None` when anything is not as expected (not CPU, not contiguous, a
/// head size other than 64, 128, 256 or 512, …); the caller then takes the candle path. `isa` must
/// be one this CPU supports (from [`Isa::detect`], or [`Isa::Scalar`]).
pub(crate) fn try_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    pos: usize,
    held_from: usize,
    window: Option<usize>,
    isa: Isa,
) -> Option<Tensor> {
    if !matches!(q.device(), Device::Cpu) || q.dtype() != DType::F32 || v.dtype() != k.dtype() {
        return None;
    }
    let (one, n_heads, n, head_dim) = q.dims4().ok()?;
    let (one_k, n_kv_heads, capacity, row) = k.dims4().ok()?;
    let kv = KvDtype::of_storage(k.dtype())?;
    if one != 1 || one_k != 1 || row != kv.row_width(head_dim) || v.dims() != k.dims() || !fused_head_dim(head_dim) {
        return None;
    }
    let window = window.map(|w| w.max(1));
    let seen_from = window.map_or(0, |w| (pos + 1).saturating_sub(w));
    if n == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 || held_from > seen_from {
        return None;
    }
    let pos = pos - held_from;
    if pos + n > capacity {
        return None;
    }
    let dims = Dims { n_heads, n_kv_heads, head_dim, capacity, pos, n, window, phase: held_from % 64 };
    let mut out = vec![0.0f32; n * n_heads * head_dim];
    {
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let Kv::F32(q) = Kv::of(&qs, ql, n_heads * n * head_dim)? else { return None };
        let k = Kv::of(&ks, kl, n_kv_heads * capacity * head_dim)?;
        let v = Kv::of(&vs, vl, n_kv_heads * capacity * head_dim)?;
        if n == 1 {
            decode::decode_attention(q, k, v, dims, &mut out, level(isa));
        } else {
            prefill::prefill_attention(q, k, v, dims, &mut out, level(isa));
        }
    }
    Tensor::from_vec(out, (n, n_heads * head_dim), &Device::Cpu).ok()
}

/// A contiguous CPU buffer of f32 or f16 values, or of q8_0 blocks of 32 values.
#[derive(Clone, Copy)]
enum Kv<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
    Q8_0(&'a [BlockQ8_0]),
}

impl<'a> Kv<'a> {
    /// The `count` values a CPU tensor's layout points at (f32, f16, or q8_0 blocks in a
    /// `U8` tensor, starting `count / 32` blocks in); `None` for other dtypes, devices and
    /// non-contiguous layouts.
    fn of(storage: &'a Storage, layout: &Layout, count: usize) -> Option<Self> {
        if !layout.is_contiguous() {
            return None;
        }
        let range = layout.start_offset()..layout.start_offset() + count;
        match storage {
            Storage::Cpu(CpuStorage::F32(data)) => data.get(range).map(Kv::F32),
            Storage::Cpu(CpuStorage::F16(data)) => data.get(range).map(Kv::F16),
            Storage::Cpu(CpuStorage::U8(data)) => {
                let blocks = count / q8_0::VALUES;
                let bytes = data.get(layout.start_offset()..layout.start_offset() + blocks * size_of::<BlockQ8_0>())?;
                if !count.is_multiple_of(q8_0::VALUES) || !bytes.as_ptr().cast::<BlockQ8_0>().is_aligned() {
                    return None;
                }
                // SAFETY: BlockQ8_0 is `repr(C)` { f16, [i8; 32] }, 34 bytes that any bit
                // pattern fills; the pointer is aligned for it and the bytes cover
                // `blocks` of them and outlive the borrow.
                Some(Kv::Q8_0(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), blocks) }))
            }
            _ => None,
        }
    }

    /// Values held.
    fn len(&self) -> usize {
        match self {
            Kv::F32(x) => x.len(),
            Kv::F16(x) => x.len(),
            Kv::Q8_0(x) => x.len() * q8_0::VALUES,
        }
    }

    /// Values `range` as f32: borrowed, or converted into `scratch`. A q8_0 range starts
    /// and ends on whole blocks.
    fn f32s<'s, const L: Level>(&self, range: Range<usize>, scratch: &'s mut Vec<f32>) -> &'s [f32]
    where
        'a: 's,
    {
        if let Kv::F32(x) = *self {
            return &x[range];
        }
        scratch.clear();
        scratch.resize(range.len(), 0.0);
        self.convert::<L>(range, scratch);
        scratch
    }

    /// Values `range` as f32 into `out`. A q8_0 range starts and ends on whole blocks.
    fn convert<const L: Level>(&self, range: Range<usize>, out: &mut [f32]) {
        match *self {
            Kv::F32(x) => out.copy_from_slice(&x[range]),
            Kv::F16(x) => x[range].convert_to_f32_slice(out),
            Kv::Q8_0(x) => {
                debug_assert!(range.start.is_multiple_of(q8_0::VALUES) && range.end.is_multiple_of(q8_0::VALUES));
                q8_0::dequantize_at::<L>(&x[range.start / q8_0::VALUES..range.end / q8_0::VALUES], out)
            }
        }
    }
}

/// Sizes of one layer's attention: `n` new tokens after `pos` cached ones.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Positions each cache buffer holds.
    pub capacity: usize,
    /// Cached rows before the new tokens.
    pub pos: usize,
    /// New tokens; their K/V are already in the cache at `pos..pos + n`.
    pub n: usize,
    /// Rows a query sees, itself included (a sliding-window layer); `None`: every row
    /// before it.
    pub window: Option<usize>,
    /// The position of row 0 (a sliding layer's first held position) modulo 64.
    pub phase: usize,
}

impl Dims {
    /// The first row the query in row `row` sees.
    fn first_seen(&self, row: usize) -> usize {
        self.window.map_or(0, |w| (row + 1).saturating_sub(w))
    }
}

/// Runs `f(unit)` for `units` units, on the pool when there is `macs` work enough for it.
fn for_each_unit(units: usize, macs: usize, f: impl Fn(usize) + Sync) {
    crate::engine::cpu::pool::for_each_chunk(units, macs, |range| range.for_each(&f));
}

/// Independent partial results a fold keeps: one 512-bit register of f32.
const LANES: usize = 16;

/// Folds `s` with `op` in LANES independent lanes, then folds the lanes as a tree: the
/// compiler keeps the lanes in SIMD registers instead of one serial chain of dependent
/// operations.
#[inline(always)]
fn lanes(s: &[f32], init: f32, op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; LANES];
    let chunks = s.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a = op(*a, x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(rest) {
        *a = op(*a, x);
    }
    fold_lanes(acc, op)
}

/// Folds the lanes pairwise, halving the width each step: four dependent vector operations
/// rather than a chain of fifteen scalar ones.
#[inline(always)]
fn fold_lanes(mut acc: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = acc.len();
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] = op(acc[i], acc[i + width]);
        }
    }
    acc[0]
}

/// The larger of `a` and `b`, without `f32::max`'s NaN rule (scores are never NaN), so
/// that a fold over it compiles to vector max instructions instead of scalar code.
#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// Asks for the cache lines of the `bytes` bytes at `p`: a hint, which never faults, so
/// `p` may point past the end of a buffer. A no-op off x86-64.
#[inline(always)]
fn prefetch(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch only hints the cache; any address is allowed.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line) as *const i8);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// `a · b + c`: one fused instruction where the level has it (aarch64 always, x86-64 from
/// [`AVX2`] up, or a build for a CPU with FMA), otherwise a multiply and an add
/// (`f32::mul_add` would be a slow libm call there).
#[inline(always)]
fn mul_add<const L: Level>(a: f32, b: f32, c: f32) -> f32 {
    if L != PORTABLE || cfg!(any(target_feature = "fma", target_arch = "aarch64")) {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `e^x` for `x ≤ 0` (larger x are clamped at 88), in branch-free arithmetic the compiler
/// vectorizes; within 4 ulp of `f32::exp` on that range, and 0 below -87.
#[inline(always)]
pub(crate) fn exp<const L: Level>(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n · LN2_HI is exact for |n| < 2^11 (Cody–Waite reduction).
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5 · 2^23 rounds to an integer and leaves it in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let below = x < -87.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO; // |r| ≤ ln2 / 2
                                         // e^r by its Taylor series to r^6 (relative error < 2e-7 on |r| ≤ 0.347), Horner form.
    let p = [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0];
    let mut e = 1.0 / 720.0;
    for c in p {
        e = mul_add::<L>(e, r, c);
    }
    let n = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let e = e * f32::from_bits(((n + 127) << 23) as u32);
    if below {
        0.0
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candle_fallbacks_name_other_head_sizes() {
        assert!(candle_fallbacks(Kernels::Fast, true, 64).is_empty());
        assert!(candle_fallbacks(Kernels::Candle, true, 96).is_empty(), "candle chosen: no fallback");
        assert!(candle_fallbacks(Kernels::Fast, false, 96).is_empty(), "a GPU: no fallback");
        let odd = candle_fallbacks(Kernels::Portable, true, 96);
        assert_eq!(odd.len(), 1);
        assert!(odd[0].contains("heads of 96"), "{odd:?}");
        assert!(candle_fallbacks(Kernels::Fast, true, 256).is_empty(), "Gemma 3, sliding layers too");
        assert!(candle_fallbacks(Kernels::Fast, true, 512).is_empty(), "Gemma 4's global layers");
    }

    /// The candle path of `engine::model` for one layer, head by head:
    /// `softmax(q kᵀ / √hd + causal mask) v`, with the cache read as f32.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, group: usize, pos: usize) -> Tensor {
        windowed_reference(q, k, v, group, pos, None)
    }

    /// [`reference`] with the mask of a sliding-window layer: the query in row `p` sees
    /// rows `p + 1 - window ..= p`.
    fn windowed_reference(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        group: usize,
        pos: usize,
        window: Option<usize>,
    ) -> Tensor {
        let (_, n_heads, n, hd) = q.dims4().unwrap();
        let len = pos + n;
        let (k, v) = (k.to_dtype(DType::F32).unwrap(), v.to_dtype(DType::F32).unwrap());
        let seen = |i: usize, j: usize| j <= pos + i && window.is_none_or(|w| pos + i - j < w);
        let mask: Vec<f32> =
            (0..n).flat_map(|i| (0..len).map(move |j| if seen(i, j) { 0.0 } else { f32::NEG_INFINITY })).collect();
        let mask = Tensor::from_vec(mask, (n, len), &Device::Cpu).unwrap();
        let heads: Vec<Tensor> = (0..n_heads)
            .map(|h| {
                let q_h = q.narrow(1, h, 1).unwrap().squeeze(0).unwrap().squeeze(0).unwrap(); // (n, hd)
                let kv = h / group;
                let k_h =
                    k.narrow(1, kv, 1).unwrap().narrow(2, 0, len).unwrap().squeeze(0).unwrap().squeeze(0).unwrap();
                let v_h =
                    v.narrow(1, kv, 1).unwrap().narrow(2, 0, len).unwrap().squeeze(0).unwrap().squeeze(0).unwrap();
                let s =
                    ((q_h.matmul(&k_h.t().unwrap()).unwrap() * (1.0 / (hd as f64).sqrt())).unwrap() + &mask).unwrap();
                candle_nn::ops::softmax_last_dim(&s).unwrap().matmul(&v_h.contiguous().unwrap()).unwrap()
                // (n, hd)
            })
            .collect();
        Tensor::cat(&heads, 1).unwrap() // (n, n_heads · hd)
    }

    /// One instruction set per attention level this CPU runs.
    fn levels() -> Vec<Isa> {
        let mut isas = Isa::all_supported();
        isas.dedup_by_key(|isa| level(*isa));
        isas
    }

    #[test]
    fn matches_the_candle_path_at_every_level() {
        let dev = Device::Cpu;
        // SmolLM2's shape (9 heads over 3 K/V heads of 64), a 128-, 256- and 512-wide one; f32,
        // f16 and q8_0 caches (against the candle path over the cache's values as f32); one
        // new token (decode: one chunk, a partial chunk, several chunks merged
        // across the pool) and several (prefill: token counts that do and do not fill whole
        // units, caches that do and do not fill whole key blocks).
        let cases =
            [(0, 1), (6, 1), (199, 1), (255, 1), (256, 1), (1099, 1), (0, 2), (0, 37), (5, 8), (250, 70), (1000, 100)];
        for (n_heads, n_kv, hd) in [(9, 3, 64), (4, 2, 128), (4, 1, 256), (2, 1, 512)] {
            let capacity = 1100;
            for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0] {
                let k = dtype.store(&Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap()).unwrap();
                let v = dtype.store(&Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap()).unwrap();
                let (k_f32, v_f32) = (dtype.load(&k).unwrap(), dtype.load(&v).unwrap());
                for (pos, n) in cases {
                    // Larger queries than unit variance so some rows are sharply peaked.
                    let q = Tensor::randn(0f32, 3.0, (1, n_heads, n, hd), &dev).unwrap();
                    let want = reference(&q, &k_f32, &v_f32, n_heads / n_kv, pos);
                    for isa in levels() {
                        let fast = try_attention(&q, &k, &v, pos, 0, None, isa).expect("fast path applies");
                        assert_eq!(fast.dims(), &[n, n_heads * hd]);
                        let diff =
                            (fast - &want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                        // A score sums `hd` products in another order than candle's: its
                        // rounding grows with the head (measured up to 2.1e-5 at 512).
                        let bound = 2e-5 * (hd as f32 / 256.0).max(1.0);
                        assert!(
                            diff <= bound,
                            "{isa:?}: heads {n_heads}/{n_kv} hd {hd} {dtype:?} pos {pos} n {n}: max abs diff {diff}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn sliding_windows_match_the_candle_path() {
        let dev = Device::Cpu;
        // Windows of one row, of less than a key block and unit, and of most of the cache;
        // decode and prefill at rows before and past the window, with chunks that straddle
        // its start.
        let cases = [(0, 1), (50, 1), (600, 1), (1099, 1), (0, 37), (250, 70), (700, 100), (1000, 100)];
        for (n_heads, n_kv, hd) in [(9, 3, 64), (4, 1, 256)] {
            let capacity = 1100;
            for dtype in [KvDtype::F32, KvDtype::Q8_0] {
                let k = dtype.store(&Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap()).unwrap();
                let v = dtype.store(&Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap()).unwrap();
                let (k_f32, v_f32) = (dtype.load(&k).unwrap(), dtype.load(&v).unwrap());
                for window in [1, 40, 512] {
                    for (pos, n) in cases {
                        let q = Tensor::randn(0f32, 3.0, (1, n_heads, n, hd), &dev).unwrap();
                        let want = windowed_reference(&q, &k_f32, &v_f32, n_heads / n_kv, pos, Some(window));
                        for isa in levels() {
                            let fast = try_attention(&q, &k, &v, pos, 0, Some(window), isa).expect("fast path applies");
                            let diff =
                                (fast - &want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                            assert!(
                                diff <= 2e-5,
                                "{isa:?}: heads {n_heads}/{n_kv} hd {hd} {dtype:?} window {window} pos {pos} n {n}: \
                                 max abs diff {diff}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A sliding layer's buffers hold positions from a base on: attention over them
    /// equals attention over buffers holding every position, bit for bit.
    #[test]
    fn a_window_held_from_a_base_matches_every_position_held() {
        let dev = Device::Cpu;
        let (n_heads, n_kv, hd, window) = (4, 1, 256, 512);
        for (pos, n, base) in [(1444, 256, 933), (1699, 1, 1188), (1000, 100, 489), (1000, 100, 300)] {
            let k = Tensor::randn(0f32, 1.0, (1, n_kv, pos + n, hd), &dev).unwrap();
            let v = Tensor::randn(0f32, 1.0, (1, n_kv, pos + n, hd), &dev).unwrap();
            let held = |t: &Tensor| t.narrow(2, base, pos + n - base).unwrap().contiguous().unwrap();
            let q = Tensor::randn(0f32, 3.0, (1, n_heads, n, hd), &dev).unwrap();
            for isa in levels() {
                let all = try_attention(&q, &k, &v, pos, 0, Some(window), isa).unwrap();
                let from_base = try_attention(&q, &held(&k), &held(&v), pos, base, Some(window), isa).unwrap();
                let diff = (all - from_base).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                assert_eq!(diff, 0.0, "{isa:?} pos {pos} n {n} base {base}: max abs diff {diff}");
            }
        }
    }

    /// A q8_0 cache against the candle path over the f32 values it was quantized from:
    /// equal to the quantization's error (each value within `max|x| / 254` of its block's),
    /// which a softmax over peaked scores amplifies a little.
    #[test]
    fn q8_0_matches_the_f32_path_to_quantization_tolerance() {
        let dev = Device::Cpu;
        let (n_heads, n_kv, hd, capacity) = (9, 3, 64, 600);
        let k = Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap();
        let v = Tensor::randn(0f32, 1.0, (1, n_kv, capacity, hd), &dev).unwrap();
        let (kq, vq) = (KvDtype::Q8_0.store(&k).unwrap(), KvDtype::Q8_0.store(&v).unwrap());
        for (pos, n) in [(0, 1), (300, 1), (599, 1), (0, 40), (500, 100)] {
            let q = Tensor::randn(0f32, 1.0, (1, n_heads, n, hd), &dev).unwrap();
            let want = reference(&q, &k, &v, n_heads / n_kv, pos);
            let got = try_attention(&q, &kq, &vq, pos, 0, None, Isa::detect()).expect("fast path applies");
            let diff = (got - &want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            // Values are N(0, 1) in blocks of 32 (|x| up to ~4): each is off by up to ~0.016,
            // and the keys' error moves the weights of a row over few keys a little more.
            assert!(diff <= 0.05, "pos {pos} n {n}: max abs diff {diff}");
        }
    }

    #[test]
    fn declines_what_it_cannot_do() {
        let dev = Device::Cpu;
        let zeros = |shape: (usize, usize, usize, usize)| Tensor::zeros(shape, DType::F32, &dev).unwrap();
        let (q, k) = (zeros((1, 4, 3, 64)), zeros((1, 2, 16, 64)));
        let isa = Isa::detect();
        assert!(try_attention(&q, &k, &k, 13, 0, None, isa).is_some());
        // K and V of different dtypes, new tokens past the cache, an odd head size, a
        // non-contiguous cache view, bf16.
        assert!(try_attention(&q, &k.to_dtype(DType::F16).unwrap(), &k, 2, 0, None, isa).is_none());
        assert!(try_attention(&q, &k, &k, 14, 0, None, isa).is_none());
        // Buffers that do not hold every position the queries see: a layer without a
        // window, and a window starting before the first position held.
        assert!(try_attention(&q, &k, &k, 13, 1, None, isa).is_none());
        assert!(try_attention(&q, &k, &k, 13, 11, Some(4), isa).is_none());
        assert!(try_attention(&q, &k, &k, 20, 10, Some(11), isa).is_some());
        let odd = zeros((1, 2, 16, 48));
        assert!(try_attention(&zeros((1, 4, 3, 48)), &odd, &odd, 2, 0, None, isa).is_none());
        let kt = zeros((1, 2, 64, 16)).transpose(2, 3).unwrap();
        assert!(try_attention(&q, &kt, &kt, 2, 0, None, isa).is_none());
        let bf = k.to_dtype(DType::BF16).unwrap();
        assert!(try_attention(&q, &bf, &bf, 2, 0, None, isa).is_none());
        // q8_0 rows of another head size, and bytes that are not whole rows.
        let q8 = KvDtype::Q8_0.store(&zeros((1, 2, 16, 128))).unwrap();
        assert!(try_attention(&q, &q8, &q8, 2, 0, None, isa).is_none());
        let ragged = Tensor::zeros((1, 2, 16, 64), DType::U8, &dev).unwrap();
        assert!(try_attention(&q, &ragged, &ragged, 2, 0, None, isa).is_none());
        assert!(try_attention(
            &q,
            &KvDtype::Q8_0.store(&k).unwrap(),
            &KvDtype::Q8_0.store(&k).unwrap(),
            13,
            0,
            None,
            isa
        )
        .is_some());
    }

    #[test]
    fn exp_is_within_four_ulp() {
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (got, want) = (exp::<PORTABLE>(x), x.exp());
            assert!((got - want).abs() <= 4.0 * f32::EPSILON * want, "exp({x}) = {got}, want {want}");
            x += 0.001_3;
        }
        assert_eq!(exp::<PORTABLE>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp::<PORTABLE>(0.0), 1.0);
    }

    /// Not a check: `cargo test --release --no-default-features --lib attention_speed --
    /// --ignored --nocapture` prints the prefill and decode kernels' multiply-add rates at
    /// turn 10 of the 128 + 128 bench (128 new tokens after 2,432; one after 2,559), over
    /// 30 layers (the best of five runs), for each cache type.
    #[test]
    #[ignore = "measurement only: prints timings, asserts none; run with --ignored --nocapture"]
    fn attention_speed() {
        let (n_heads, n_kv, hd, layers) = (9, 3, 64, 30);
        let dev = Device::Cpu;
        for (pos, n, reps) in [(2432, 128, 1), (2559, 1, 20)] {
            let q = Tensor::randn(0f32, 1.0, (1, n_heads, n, hd), &dev).unwrap();
            for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0] {
                let k = dtype.store(&Tensor::randn(0f32, 1.0, (1, n_kv, pos + n, hd), &dev).unwrap()).unwrap();
                let v = dtype.store(&Tensor::randn(0f32, 1.0, (1, n_kv, pos + n, hd), &dev).unwrap()).unwrap();
                let isa = Isa::detect();
                try_attention(&q, &k, &v, pos, 0, None, isa).unwrap();
                // The best of five forwards: the least disturbed by other work on the machine.
                let s = (0..5)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        for _ in 0..layers * reps {
                            try_attention(&q, &k, &v, pos, 0, None, isa).unwrap();
                        }
                        t.elapsed().as_secs_f64() / reps as f64
                    })
                    .fold(f64::INFINITY, f64::min);
                let macs = 2.0 * (n_heads * n * (pos + n / 2) * hd * layers) as f64;
                let what = if n == 1 { "decode" } else { "prefill" };
                println!(
                    "{what}, {dtype:?} cache, {layers} layers: {:.2} ms, {:.1} G multiply-adds/s",
                    s * 1e3,
                    macs / s / 1e9
                );
            }
        }
    }

    /// Not a check: `cargo test --release --no-default-features --lib wide_head_attention_speed
    /// -- --ignored --nocapture` prints a global layer with heads of 512 (Gemma 4's: 8 query
    /// heads over one K/V head, f16 cache), and one of 256 (Gemma 3 1B's: 4 over one), at
    /// turn 10 of the 128 + 128 bench, on the fused kernels and on candle's ops as
    /// `engine::model` runs them (the group's queries stacked, one matmul for the scores,
    /// the mask added, softmax, one matmul for the values).
    #[test]
    #[ignore = "measurement only: prints timings, asserts none; run with --ignored --nocapture"]
    fn wide_head_attention_speed() {
        let dev = Device::Cpu;
        for (n_heads, hd, pos, n, reps) in [(4, 256, 2432, 128, 1), (8, 512, 2432, 128, 1), (8, 512, 2559, 1, 20)] {
            let len = pos + n;
            let q = Tensor::randn(0f32, 1.0, (1, n_heads, n, hd), &dev).unwrap();
            let k = KvDtype::F16.store(&Tensor::randn(0f32, 1.0, (1, 1, len, hd), &dev).unwrap()).unwrap();
            let v = KvDtype::F16.store(&Tensor::randn(0f32, 1.0, (1, 1, len, hd), &dev).unwrap()).unwrap();
            let mask: Vec<f32> =
                (0..n).flat_map(|i| (0..len).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 })).collect();
            let mask = Tensor::from_vec(mask, (n, len), &dev).unwrap().repeat((n_heads, 1)).unwrap();
            let candle = || {
                let (k, v) = (
                    k.to_dtype(DType::F32).unwrap().squeeze(0).unwrap(),
                    v.to_dtype(DType::F32).unwrap().squeeze(0).unwrap(),
                );
                let q = q.reshape((1, n_heads * n, hd)).unwrap();
                let scores = q.matmul(&k.t().unwrap()).unwrap();
                let s = (scores * (1.0 / (hd as f64).sqrt())).unwrap().broadcast_add(&mask).unwrap();
                candle_nn::ops::softmax_last_dim(&s).unwrap().matmul(&v).unwrap()
            };
            let fused = || try_attention(&q, &k, &v, pos, 0, None, Isa::detect()).unwrap();
            let best = |f: &dyn Fn() -> Tensor| {
                (0..5)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        for _ in 0..reps {
                            f();
                        }
                        t.elapsed().as_secs_f64() / reps as f64
                    })
                    .fold(f64::INFINITY, f64::min)
            };
            let (a, b) = (best(&fused), best(&|| candle()));
            let what = if n == 1 { "decode" } else { "prefill" };
            println!(
                "{what} of {n} after {pos}, {n_heads} heads of {hd}: fused {:.2} ms, candle's ops {:.2} ms ({:.1}x)",
                a * 1e3,
                b * 1e3,
                b / a
            );
        }
    }
}
