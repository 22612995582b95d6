//! Portable kernels: the reference the SIMD paths are tested against and the fallback on
//! CPUs without them. For Q4_1 and Q8_0 the arithmetic is candle's `vec_dot_unopt` term
//! for term, so this path reproduces candle's CPU results bit for bit; Q4_K (which candle
//! multiplies against 256-value Q8_K activations) is the plain Q4_K formula against our
//! 32-value Q8_1 ones.

use super::blocks::{BlockQ4K, BlockQ4_1, BlockQ8_0, TileKernel, QK, QK_K};
use half::f16;

/// Quantizes one row to Q8_1 exactly as candle's `BlockQ8_1::from_float` (ggml's
/// `quantize_row_q8_1_ref`): `d = amax / 127`, `q = round(x / d)` (half away from zero),
/// `s = f16(f16(sum q) * f16(d))`. With `with_sum == false` this is Q8_0 (`s = 0`).
pub fn quantize_row(x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]], with_sum: bool) {
    debug_assert_eq!(x.len(), qs.len());
    debug_assert_eq!(x.len(), ds.len() * QK);
    for ((x, q), ds) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(ds.iter_mut()) {
        let mut amax = 0f32;
        for &v in x {
            amax = amax.max(v.abs());
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let dh = f16::from_f32(d);
        let mut sum = 0i32;
        for (q, &v) in q.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        let s = if with_sum { (f16::from_f32(sum as f32) * dh).to_f32() } else { 0.0 };
        *ds = [dh.to_f32(), s];
    }
}

/// Portable Q4_1 x Q8_1 tiles.
pub struct ScalarQ4_1;

impl TileKernel for ScalarQ4_1 {
    type Block = BlockQ4_1;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const BlockQ4_1; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        let mut out = [[0f32; C]; R];
        for (r, w) in w.iter().enumerate() {
            let w = std::slice::from_raw_parts(*w, nb);
            for c in 0..C {
                let q = std::slice::from_raw_parts(qs[c], nb * QK);
                let ds = std::slice::from_raw_parts(ds[c], nb);
                out[r][c] = dot_q4_1(w, q, ds);
            }
        }
        out
    }
}

/// One Q4_1 row against one Q8_1 row; candle's `BlockQ4_1::vec_dot_unopt` term for term.
#[inline]
pub fn dot_q4_1(w: &[BlockQ4_1], qs: &[i8], ds: &[[f32; 2]]) -> f32 {
    let mut sumf = 0f32;
    for ((blk, q), &[dy, sy]) in w.iter().zip(qs.chunks_exact(QK)).zip(ds) {
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            let v0 = (blk.qs[j] & 0x0F) as i32;
            let v1 = (blk.qs[j] >> 4) as i32;
            sumi += v0 * q[j] as i32 + v1 * q[j + QK / 2] as i32;
        }
        sumf += sumi as f32 * blk.d.to_f32() * dy + blk.m.to_f32() * sy;
    }
    sumf
}

/// Portable Q8_0 x Q8_0 tiles.
pub struct ScalarQ8_0;

impl TileKernel for ScalarQ8_0 {
    type Block = BlockQ8_0;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const BlockQ8_0; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        let mut out = [[0f32; C]; R];
        for (r, w) in w.iter().enumerate() {
            let w = std::slice::from_raw_parts(*w, nb);
            for c in 0..C {
                let q = std::slice::from_raw_parts(qs[c], nb * QK);
                let ds = std::slice::from_raw_parts(ds[c], nb);
                out[r][c] = dot_q8_0(w, q, ds);
            }
        }
        out
    }
}

/// One Q8_0 row against one Q8_0 row; candle's `BlockQ8_0::vec_dot_unopt` term for term.
#[inline]
pub fn dot_q8_0(w: &[BlockQ8_0], qs: &[i8], ds: &[[f32; 2]]) -> f32 {
    let mut sumf = 0f32;
    for ((blk, q), &[dy, _]) in w.iter().zip(qs.chunks_exact(QK)).zip(ds) {
        let sumi: i32 = blk.qs.iter().zip(q).map(|(&a, &b)| a as i32 * b as i32).sum();
        sumf += sumi as f32 * blk.d.to_f32() * dy;
    }
    sumf
}

/// Portable Q4_K x Q8_1 tiles.
pub struct ScalarQ4K;

impl TileKernel for ScalarQ4K {
    type Block = BlockQ4K;
    const SUB_BLOCKS: usize = QK_K / QK;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const BlockQ4K; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        let mut out = [[0f32; C]; R];
        for (r, w) in w.iter().enumerate() {
            let w = std::slice::from_raw_parts(*w, nb);
            for c in 0..C {
                let q = std::slice::from_raw_parts(qs[c], nb * QK_K);
                let ds = std::slice::from_raw_parts(ds[c], nb * Self::SUB_BLOCKS);
                out[r][c] = dot_q4_k(w, q, ds);
            }
        }
        out
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8): ggml's `get_scale_min_k4`, spelled
/// out one sub-block at a time (the SIMD kernels use [`BlockQ4K::scales_mins`]).
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// One Q4_K row against one Q8_1 row. Sub-block `j` of a super-block contributes
/// `d * sc_j * d_a * sum(q * a) - dmin * m_j * s_a`, with `(d_a, s_a)` the scale pair of
/// the activation block under it: the exact Q4_K product, but for the activations' own
/// 8-bit rounding and `s_a`'s f16 rounding.
#[inline]
pub fn dot_q4_k(w: &[BlockQ4K], qs: &[i8], ds: &[[f32; 2]]) -> f32 {
    let mut sumf = 0f32;
    for ((blk, q), ds) in w.iter().zip(qs.chunks_exact(QK_K)).zip(ds.chunks_exact(QK_K / QK)) {
        let (d, dmin) = (blk.d.to_f32(), blk.dmin.to_f32());
        for (j, (q, &[da, sa])) in q.chunks_exact(QK).zip(ds).enumerate() {
            let (sc, m) = scale_min_k4(j, &blk.scales);
            let (group, shift) = (&blk.qs[QK * (j / 2)..QK * (j / 2) + QK], 4 * (j % 2));
            let sumi: i32 = group.iter().zip(q).map(|(&b, &a)| ((b >> shift) & 0xF) as i32 * a as i32).sum();
            sumf += d * sc as f32 * da * sumi as f32 - dmin * m as f32 * sa;
        }
    }
    sumf
}
