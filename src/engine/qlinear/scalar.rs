//! Portable kernels: the reference the SIMD paths are tested against and the fallback on
//! CPUs without them. The arithmetic is candle's `vec_dot_unopt` term for term, so this
//! path reproduces candle's CPU results bit for bit.

use super::blocks::{BlockQ4_1, BlockQ8_0, TileKernel, QK};
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
