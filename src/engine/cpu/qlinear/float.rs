//! F32, F16 and BF16 weights, read in place.
//!
//! candle's `QMatMul` turns such a matrix into an f32 tensor when it is built: an F16
//! file then takes twice its size in memory, and decode multiplies against the copy.
//! Here the weight's own bytes are read: each row is widened to f32 a chunk at a time
//! (F16C on x86-64) and dotted with the f32 activations, every activation row against the
//! chunk while it is in L1. Sums are in f32 (llama.cpp rounds the activations to f16
//! first; we keep them exact).

use candle_core::quantized::GgmlDType;

use crate::engine::cpu::kernels::Isa;
use crate::engine::cpu::pool::{self, SendPtr};

/// The element type of a float weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FloatKind {
    F32,
    F16,
    Bf16,
}

impl FloatKind {
    pub(super) fn of(dtype: GgmlDType) -> Option<FloatKind> {
        match dtype {
            GgmlDType::F32 => Some(FloatKind::F32),
            GgmlDType::F16 => Some(FloatKind::F16),
            GgmlDType::BF16 => Some(FloatKind::Bf16),
            _ => None,
        }
    }

    pub(super) fn bytes(self) -> usize {
        match self {
            FloatKind::F32 => 4,
            FloatKind::F16 | FloatKind::Bf16 => 2,
        }
    }
}

/// Weight rows per parallel work unit.
const UNIT_ROWS: usize = 16;
/// Values of a weight row widened at a time.
const CHUNK: usize = 256;

/// One product: `dst (m x n) = x (m x k) · Wᵀ` for a row-major `W` (`n x k`) of `kind`.
#[derive(Clone, Copy)]
struct Product<'a> {
    kind: FloatKind,
    w: &'a [u8],
    n: usize,
    k: usize,
    x: &'a [f32],
    m: usize,
}

/// `dst (m x n) = x (m x k) · Wᵀ` for a row-major `W` (`n x k`) of `kind` in `w`.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(kind: FloatKind, isa: Isa, w: &[u8], n: usize, k: usize, x: &[f32], m: usize, dst: &mut [f32]) {
    assert_eq!(w.len(), n * k * kind.bytes());
    assert_eq!((x.len(), dst.len()), (m * k, m * n));
    let p = Product { kind, w, n, k, x, m };
    let dst_ptr = SendPtr(dst.as_mut_ptr());
    pool::for_each_chunk(n.div_ceil(UNIT_ROWS), m * k * n, |units| {
        let rows = units.start * UNIT_ROWS..n.min(units.end * UNIT_ROWS);
        // SAFETY: each unit writes only dst[i * n + r] for its own rows r, which no other
        // unit touches.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst_ptr.get(), m * n) };
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni) {
            // SAFETY: these instruction sets imply AVX2, FMA and F16C (`Isa::detect`).
            return unsafe {
                if m == 1 && kind == FloatKind::F16 {
                    f16_decode_rows_avx2(w, k, rows, x, dst)
                } else if m > 1 && isa == Isa::Avx512Vnni && kind != FloatKind::Bf16 {
                    rows_avx512(p, rows, dst)
                } else {
                    rows_avx2(p, rows, dst)
                }
            };
        }
        let _ = isa;
        rows_body::<false>(p, rows, dst)
    });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2(p: Product<'_>, rows: std::ops::Range<usize>, dst: &mut [f32]) {
    rows_body::<true>(p, rows, dst)
}

/// The rows' dot products, written once for both entry points (`FMA`: fused multiply-adds
/// and F16C, only where the caller enabled them). A block of [`UNIT_ROWS`] weight rows is
/// widened a chunk at a time (16 KB, kept in L1), and every group of [`ACTS`] activation
/// rows is dotted with all of it, [`ROWS`] weight rows per call: each activation load
/// serves four weight rows, each weight load three activation rows.
#[inline(always)]
fn rows_body<const FMA: bool>(p: Product<'_>, rows: std::ops::Range<usize>, dst: &mut [f32]) {
    let Product { kind, w, n, k, x, m } = p;
    let bytes = kind.bytes();
    let mut wide = [[[0f32; CHUNK]; ROWS]; UNIT_ROWS / ROWS];
    for block in rows.clone().step_by(UNIT_ROWS) {
        let block = block..rows.end.min(block + UNIT_ROWS);
        for i in 0..m {
            dst[i * n + block.start..i * n + block.end].fill(0.0);
        }
        for start in (0..k).step_by(CHUNK) {
            let len = CHUNK.min(k - start);
            for (r, chunk) in block.clone().zip(wide.iter_mut().flatten()) {
                let row = &w[r * k * bytes..(r + 1) * k * bytes];
                widen::<FMA>(kind, &row[start * bytes..(start + len) * bytes], &mut chunk[..len]);
            }
            // The last one or two activation rows repeat the last row, computed and not
            // written.
            let mut i = 0;
            while i < m {
                let xs = |a: usize| {
                    let at = (i + a).min(m - 1) * k + start;
                    &x[at..at + len]
                };
                let acts = [xs(0), xs(1), xs(2)];
                let acts_done = ACTS.min(m - i);
                for (g, group) in wide.iter().enumerate() {
                    let first = block.start + g * ROWS;
                    if first >= block.end {
                        break;
                    }
                    let count = ROWS.min(block.end - first);
                    let sums = dot_rows_for::<FMA>(group, len, acts);
                    for (a, sums) in sums.iter().enumerate().take(acts_done) {
                        for (j, s) in sums.iter().enumerate().take(count) {
                            dst[(i + a) * n + first + j] += s;
                        }
                    }
                }
                i += acts_done;
            }
        }
    }
}

/// Weight rows sharing each activation load.
const ROWS: usize = 4;
/// Activation rows sharing each weight load (with [`ROWS`]: 12 accumulators, 3 activation
/// registers and one weight register, AVX2's 16).
const ACTS: usize = 3;

/// Decode (one activation row) of an F16 matrix: each weight row widened in registers and
/// multiplied at once, four rows sharing each activation load, 4 KiB fetched ahead of
/// each row (rows this short never get the hardware prefetcher going; the quantized
/// kernels do the same).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_decode_rows_avx2(w: &[u8], k: usize, rows: std::ops::Range<usize>, x: &[f32], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let full = k / 16 * 16;
    // the same place in the next four rows, or 4 KiB where four rows are shorter
    let lead = (ROWS * k * 2).clamp(4096, 1 << 16);
    let mut r = rows.start;
    while r < rows.end {
        let count = ROWS.min(rows.end - r);
        // Past the last row of the range, repeat it (computed, not written).
        let base: [*const u8; ROWS] = std::array::from_fn(|j| w.as_ptr().add((r + j.min(count - 1)) * k * 2));
        let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
        for c in (0..full).step_by(16) {
            // SAFETY: c + 16 <= k: inside each row and inside `x`.
            let (x0, x1) = (_mm256_loadu_ps(x.as_ptr().add(c)), _mm256_loadu_ps(x.as_ptr().add(c + 8)));
            for (p, acc) in base.iter().zip(acc.iter_mut()) {
                let p = p.add(2 * c);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(lead) as *const i8);
                let w0 = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                let w1 = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
                acc[0] = _mm256_fmadd_ps(w0, x0, acc[0]);
                acc[1] = _mm256_fmadd_ps(w1, x1, acc[1]);
            }
        }
        for (j, acc) in acc.iter().enumerate().take(count) {
            let row = &w[(r + j) * k * 2..(r + j + 1) * k * 2];
            let tail: f32 =
                (full..k).map(|c| half::f16::from_le_bytes([row[2 * c], row[2 * c + 1]]).to_f32() * x[c]).sum();
            dst[r + j] = hsum(_mm256_add_ps(acc[0], acc[1])) + tail;
        }
        r += count;
    }
}

/// Weight rows per AVX-512 dot-product call.
#[cfg(target_arch = "x86_64")]
const ROWS_512: usize = 4;
/// Activation rows per AVX-512 call: with [`ROWS_512`], 24 accumulators, 6 activation
/// registers and one weight register of the 32.
#[cfg(target_arch = "x86_64")]
const ACTS_512: usize = 6;

/// Prefill of F16 and F32 weights with AVX-512, llama.cpp's tinyBLAS tile: [`ROWS_512`]
/// weight rows, widened to f32 as they are loaded, against [`ACTS_512`] activation rows
/// over the whole row, so each of the 24 sums is reduced once (widening a chunk ahead
/// and reducing per chunk, as the AVX2 path does, spends more on the reductions than on
/// the multiply-adds at this width).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn rows_avx512(p: Product<'_>, rows: std::ops::Range<usize>, dst: &mut [f32]) {
    let Product { kind, w, n, k, x, m } = p;
    let bytes = kind.bytes();
    // a block of rows stays in L2 while every activation row passes it
    for block in rows.clone().step_by(UNIT_ROWS) {
        let block = block..rows.end.min(block + UNIT_ROWS);
        let mut i = 0;
        while i < m {
            let acts_done = ACTS_512.min(m - i);
            // past the last activation row, repeat it (computed, not written)
            let acts: [*const f32; ACTS_512] = std::array::from_fn(|a| x.as_ptr().add((i + a).min(m - 1) * k));
            let mut r = block.start;
            while r < block.end {
                let count = ROWS_512.min(block.end - r);
                let base: [*const u8; ROWS_512] =
                    std::array::from_fn(|j| w.as_ptr().add((r + j.min(count - 1)) * k * bytes));
                let sums = match kind {
                    FloatKind::F16 => dot_tile_avx512::<true>(base, acts, k),
                    _ => dot_tile_avx512::<false>(base, acts, k),
                };
                for (a, sums) in sums.iter().enumerate().take(acts_done) {
                    for (j, s) in sums.iter().enumerate().take(count) {
                        dst[(i + a) * n + r + j] = *s;
                    }
                }
                r += count;
            }
            i += acts_done;
        }
    }
}

/// The [`ROWS_512`] x [`ACTS_512`] dot products of rows of `k` values: weight rows of f16
/// (`F16`) or f32 at `w`, activation rows of f32 at `x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
#[inline]
unsafe fn dot_tile_avx512<const F16: bool>(
    w: [*const u8; ROWS_512],
    x: [*const f32; ACTS_512],
    k: usize,
) -> [[f32; ROWS_512]; ACTS_512] {
    use std::arch::x86_64::*;
    let load = |row: *const u8, c: usize| -> __m512 {
        if F16 {
            _mm512_cvtph_ps(_mm256_loadu_si256(row.add(2 * c) as *const __m256i))
        } else {
            _mm512_loadu_ps(row.add(4 * c) as *const f32)
        }
    };
    let value = |row: *const u8, c: usize| -> f32 {
        if F16 {
            half::f16::from_le_bytes([*row.add(2 * c), *row.add(2 * c + 1)]).to_f32()
        } else {
            std::ptr::read_unaligned(row.add(4 * c) as *const f32)
        }
    };
    let mut acc = [[_mm512_setzero_ps(); ROWS_512]; ACTS_512];
    let full = k / 16 * 16;
    for c in (0..full).step_by(16) {
        let a: [__m512; ACTS_512] = std::array::from_fn(|a| _mm512_loadu_ps(x[a].add(c)));
        for (j, row) in w.iter().enumerate() {
            let wv = load(*row, c);
            for (acc, a) in acc.iter_mut().zip(&a) {
                acc[j] = _mm512_fmadd_ps(wv, *a, acc[j]);
            }
        }
    }
    let mut sums = [[0f32; ROWS_512]; ACTS_512];
    for (a, xa) in x.iter().enumerate() {
        for (j, row) in w.iter().enumerate() {
            sums[a][j] = _mm512_reduce_add_ps(acc[a][j]) + (full..k).map(|c| value(*row, c) * *xa.add(c)).sum::<f32>();
        }
    }
    sums
}

/// The sum of a vector's eight lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn hsum(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)))
}

/// `Σ w[j][c] x[a][c]` over `c < len` for each of the [`ROWS`] rows and [`ACTS`]
/// activation rows `a`, in f32.
#[inline(always)]
fn dot_rows_for<const FMA: bool>(w: &[[f32; CHUNK]; ROWS], len: usize, x: [&[f32]; ACTS]) -> [[f32; ROWS]; ACTS] {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: `FMA` is set only inside `rows_avx2`, which enables AVX2 and FMA.
        return unsafe { dot_rows_avx2(w, len, x) };
    }
    x.map(|x| dot_rows(w, len, x))
}

/// Portable: 8 lanes a row, which the compiler may keep in vector registers.
#[inline(always)]
fn dot_rows(w: &[[f32; CHUNK]; ROWS], len: usize, x: &[f32]) -> [f32; ROWS] {
    const LANES: usize = 8;
    let mut acc = [[0f32; LANES]; ROWS];
    let full = len / LANES * LANES;
    for c in (0..full).step_by(LANES) {
        for (row, acc) in w.iter().zip(acc.iter_mut()) {
            for l in 0..LANES {
                acc[l] += row[c + l] * x[c + l];
            }
        }
    }
    let mut sums = [0f32; ROWS];
    for ((sum, acc), row) in sums.iter_mut().zip(&acc).zip(w) {
        *sum = acc.iter().sum::<f32>() + (full..len).map(|c| row[c] * x[c]).sum::<f32>();
    }
    sums
}

/// AVX2 + FMA: one 8-lane accumulator per weight row and activation row (twelve
/// independent chains hide the FMA latency); each weight load serves [`ACTS`] activation
/// rows, each activation load [`ROWS`] weight rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot_rows_avx2(w: &[[f32; CHUNK]; ROWS], len: usize, x: [&[f32]; ACTS]) -> [[f32; ROWS]; ACTS] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); ROWS]; ACTS];
    let full = len / 8 * 8;
    for c in (0..full).step_by(8) {
        // SAFETY: c + 8 <= len, which every activation slice and every chunk hold.
        let a: [__m256; ACTS] = std::array::from_fn(|a| _mm256_loadu_ps(x[a].as_ptr().add(c)));
        for (j, row) in w.iter().enumerate() {
            let wv = _mm256_loadu_ps(row.as_ptr().add(c));
            for (acc, a) in acc.iter_mut().zip(&a) {
                acc[j] = _mm256_fmadd_ps(wv, *a, acc[j]);
            }
        }
    }
    let mut sums = [[0f32; ROWS]; ACTS];
    for a in 0..ACTS {
        for (j, row) in w.iter().enumerate() {
            sums[a][j] = hsum(acc[a][j]) + (full..len).map(|c| row[c] * x[a][c]).sum::<f32>();
        }
    }
    sums
}

/// `out[j]` = element `j` of `src` as f32.
#[inline(always)]
fn widen<const F16C: bool>(kind: FloatKind, src: &[u8], out: &mut [f32]) {
    match kind {
        FloatKind::F32 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        FloatKind::Bf16 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        FloatKind::F16 => {
            #[cfg(target_arch = "x86_64")]
            if F16C {
                // SAFETY: F16C is enabled in the caller (`rows_avx2`); 8 values at a time
                // from `src` (2 bytes each) into `out`, the rest one by one below.
                unsafe {
                    use std::arch::x86_64::{_mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
                    let full = out.len() / 8 * 8;
                    for j in (0..full).step_by(8) {
                        let h = _mm_loadu_si128(src.as_ptr().add(2 * j) as *const _);
                        _mm256_storeu_ps(out.as_mut_ptr().add(j), _mm256_cvtph_ps(h));
                    }
                    for (o, b) in out[full..].iter_mut().zip(src[2 * full..].chunks_exact(2)) {
                        *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                    }
                }
                return;
            }
            for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind, through both entry points, equals an f64 reference, at widths with and
    /// without a remainder past the last whole chunk and lane group.
    #[test]
    fn float_rows_match_an_f64_reference() {
        let isas = [Isa::Scalar, Isa::detect()];
        for (n, k, m) in [(5, 256, 1), (33, 576, 3), (17, 37, 2), (7, 37, 1), (33, 576, 1), (19, 80, 13)] {
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1013) as f32 / 506.0 - 1.0) * 0.5).collect();
            let x: Vec<f32> = (0..m * k).map(|i| (i * 104_729 % 997) as f32 / 498.0 - 1.0).collect();
            for kind in [FloatKind::F32, FloatKind::F16, FloatKind::Bf16] {
                let (bytes, values): (Vec<u8>, Vec<f32>) = match kind {
                    FloatKind::F32 => (w.iter().flat_map(|v| v.to_le_bytes()).collect(), w.clone()),
                    FloatKind::F16 => {
                        let h: Vec<half::f16> = w.iter().map(|&v| half::f16::from_f32(v)).collect();
                        (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.iter().map(|v| v.to_f32()).collect())
                    }
                    FloatKind::Bf16 => {
                        let h: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
                        (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.iter().map(|v| v.to_f32()).collect())
                    }
                };
                for isa in isas {
                    let mut dst = vec![f32::NAN; m * n];
                    matmul(kind, isa, &bytes, n, k, &x, m, &mut dst);
                    for i in 0..m {
                        for r in 0..n {
                            let expected: f64 = (0..k).map(|j| values[r * k + j] as f64 * x[i * k + j] as f64).sum();
                            let got = dst[i * n + r] as f64;
                            assert!(
                                (got - expected).abs() <= 1e-4 * (1.0 + expected.abs()),
                                "{kind:?} {isa:?} {n}x{k} m={m}: {got} vs {expected}"
                            );
                        }
                    }
                }
            }
        }
    }
}
