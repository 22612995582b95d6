//! Portable kernels: the reference the SIMD paths are tested against and the fallback on
//! CPUs without them. For Q4_0, Q4_1, Q5_0 and Q8_0 the arithmetic is candle's
//! `vec_dot_unopt` term for term, so this path reproduces candle's CPU results bit for bit;
//! Q4_K and Q6_K (which candle multiplies against 256-value Q8_K activations) are the plain
//! formulas against our 32-value activations.

use super::blocks::{ActScale, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8_0, TileKernel, QK, QK_K};
use half::f16;

/// Quantizes one row to Q8_1 exactly as candle's `BlockQ8_1::from_float` (ggml's
/// `quantize_row_q8_1_ref`): `d = amax / 127`, `q = round(x / d)` (half away from zero),
/// `s = f16(f16(sum q) * f16(d))`. With `with_sum == false` this is Q8_0 (`s = 0`).
/// [`ActScale::SuperBlock`] takes `amax` over each 256 values instead of each 32, so the
/// eight blocks of a super-block share one `d` (as ggml's Q8_K does).
pub fn quantize_row(x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]], with_sum: bool, scale: ActScale) {
    debug_assert_eq!(x.len(), qs.len());
    debug_assert_eq!(x.len(), ds.len() * QK);
    let span = scale.values();
    for ((x, q), ds) in x.chunks_exact(span).zip(qs.chunks_exact_mut(span)).zip(ds.chunks_exact_mut(span / QK)) {
        let mut amax = 0f32;
        for &v in x {
            amax = amax.max(v.abs());
        }
        for ((x, q), ds) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).zip(ds.iter_mut()) {
            *ds = quantize_block(x, amax, q, with_sum);
        }
    }
}

/// One block of [`quantize_row`] with the `amax` of its span: returns `(d, s)`.
fn quantize_block(x: &[f32], amax: f32, q: &mut [i8], with_sum: bool) -> [f32; 2] {
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let dh = f16::from_f32(d);
    let mut sum = 0i32;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
        sum += *q as i32;
    }
    let s = if with_sum { (f16::from_f32(sum as f32) * dh).to_f32() } else { 0.0 };
    [dh.to_f32(), s]
}

/// A portable tile kernel over a row dot product `$dot(weight blocks, quants, scales)`.
macro_rules! scalar_tiles {
    ($(#[$doc:meta])* $name:ident, $block:ty, $per:expr, $dot:ident) => {
        $(#[$doc])*
        pub struct $name;

        impl TileKernel for $name {
            type Block = $block;
            const BLOCKS_PER: usize = $per;

            #[inline(always)]
            unsafe fn tile<const R: usize, const C: usize>(
                w: [*const $block; R],
                qs: [*const i8; C],
                ds: [*const [f32; 2]; C],
                nb: usize,
            ) -> [[f32; C]; R] {
                let mut out = [[0f32; C]; R];
                for (r, w) in w.iter().enumerate() {
                    let w = std::slice::from_raw_parts(*w, nb / $per);
                    for c in 0..C {
                        let q = std::slice::from_raw_parts(qs[c], nb * QK);
                        let ds = std::slice::from_raw_parts(ds[c], nb);
                        out[r][c] = $dot(w, q, ds);
                    }
                }
                out
            }
        }
    };
}

scalar_tiles!(
    /// Portable Q4_1 x Q8_1 tiles.
    ScalarQ4_1, BlockQ4_1, 1, dot_q4_1
);
scalar_tiles!(
    /// Portable Q8_0 x Q8_0 tiles.
    ScalarQ8_0, BlockQ8_0, 1, dot_q8_0
);
scalar_tiles!(
    /// Portable Q4_0 x Q8_0 tiles.
    ScalarQ4_0, BlockQ4_0, 1, dot_q4_0
);
scalar_tiles!(
    /// Portable Q5_0 x Q8_0 tiles.
    ScalarQ5_0, BlockQ5_0, 1, dot_q5_0
);
scalar_tiles!(
    /// Portable Q6_K x Q8_0 tiles.
    ScalarQ6K, BlockQ6K, 8, dot_q6_k
);

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

/// One Q4_0 row against one Q8_0 row; candle's `BlockQ4_0::vec_dot_unopt` term for term.
#[inline]
pub fn dot_q4_0(w: &[BlockQ4_0], qs: &[i8], ds: &[[f32; 2]]) -> f32 {
    let mut sumf = 0f32;
    for ((blk, q), &[dy, _]) in w.iter().zip(qs.chunks_exact(QK)).zip(ds) {
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            let v0 = (blk.qs[j] & 0x0F) as i32 - 8;
            let v1 = (blk.qs[j] >> 4) as i32 - 8;
            sumi += v0 * q[j] as i32 + v1 * q[j + QK / 2] as i32;
        }
        sumf += sumi as f32 * blk.d.to_f32() * dy;
    }
    sumf
}

/// One Q5_0 row against one Q8_0 row; candle's `BlockQ5_0::vec_dot_unopt` term for term.
#[inline]
pub fn dot_q5_0(w: &[BlockQ5_0], qs: &[i8], ds: &[[f32; 2]]) -> f32 {
    let mut sumf = 0f32;
    for ((blk, q), &[dy, _]) in w.iter().zip(qs.chunks_exact(QK)).zip(ds) {
        let qh = u32::from_le_bytes(blk.qh);
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            let v0 = ((blk.qs[j] & 0x0F) as i32 | (((qh >> j) & 1) << 4) as i32) - 16;
            let v1 = ((blk.qs[j] >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32) - 16;
            sumi += v0 * q[j] as i32 + v1 * q[j + QK / 2] as i32;
        }
        sumf += sumi as f32 * blk.d.to_f32() * dy;
    }
    sumf
}

/// One Q6_K row against one Q8_0 row (activations quantized per 32 values, not per 256 as
/// candle's Q8_K): per 32-value block `d * d_a * (sc_a * dot(first 16) + sc_b * dot(second
/// 16))`, the integer part exact.
#[inline]
pub fn dot_q6_k(w: &[BlockQ6K], qs: &[i8], ds: &[[f32; 2]]) -> f32 {
    let mut sumf = 0f32;
    for (b, (q, &[dy, _])) in qs.chunks_exact(QK).zip(ds).enumerate() {
        let blk = &w[b / 8];
        let (ql_at, ql_shift, qh_at, qh_shift) = BlockQ6K::sub_block(b % 8);
        let value = |l: usize| {
            let lo = (blk.ql[ql_at + l] >> ql_shift) & 0x0F;
            let hi = (blk.qh[qh_at + l] >> qh_shift) & 3;
            (lo | (hi << 4)) as i32 - 32
        };
        let half = |from: usize| (from..from + QK / 2).map(|l| value(l) * q[l] as i32).sum::<i32>();
        let sumi = blk.scales[2 * (b % 8)] as i32 * half(0) + blk.scales[2 * (b % 8) + 1] as i32 * half(QK / 2);
        sumf += sumi as f32 * (blk.d.to_f32() * dy);
    }
    sumf
}

/// Portable Q4_K x Q8_1 tiles.
pub struct ScalarQ4K;

impl TileKernel for ScalarQ4K {
    type Block = BlockQ4K;
    const BLOCKS_PER: usize = QK_K / QK;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const BlockQ4K; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        // `nb` counts 32-value blocks; the loops below walk super-blocks.
        let nb = nb / Self::BLOCKS_PER;
        let mut out = [[0f32; C]; R];
        for (r, w) in w.iter().enumerate() {
            let w = std::slice::from_raw_parts(*w, nb);
            for c in 0..C {
                let q = std::slice::from_raw_parts(qs[c], nb * QK_K);
                let ds = std::slice::from_raw_parts(ds[c], nb * Self::BLOCKS_PER);
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
