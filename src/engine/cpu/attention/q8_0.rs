//! q8_0 rows of the cache (ggml's `block_q8_0`, see `engine::kv_type`) widened to f32 as
//! the kernels reach them: `x = d · q` per block of 32, eight values per instruction with
//! AVX2, the compiler's vectorization of the plain loop elsewhere. Both give the same
//! floats (`d` and `q` are exact in f32 and their product is rounded once), and the same
//! as `kv_type::dequantize_row`.

#[cfg(target_arch = "x86_64")]
use super::AVX2;
use super::{Level, PORTABLE};
use crate::engine::cpu::qlinear::blocks::BlockQ8_0;

/// Values per block.
pub(super) const VALUES: usize = 32;

/// `blocks` as f32 into `out` (`32 · blocks.len()` values), in the caller's level: inlined
/// into a function compiled for it.
#[inline(always)]
pub(super) fn dequantize<const L: Level>(blocks: &[BlockQ8_0], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * VALUES);
    #[cfg(target_arch = "x86_64")]
    if L != PORTABLE {
        use std::arch::x86_64::{
            _mm256_cvtepi32_ps, _mm256_cvtepi8_epi32, _mm256_mul_ps, _mm256_set1_ps, _mm256_storeu_ps, _mm_cvtph_ps,
            _mm_cvtsi32_si128, _mm_cvtss_f32, _mm_loadl_epi64,
        };
        for (b, out) in blocks.iter().zip(out.chunks_exact_mut(VALUES)) {
            // SAFETY: levels above PORTABLE run inside functions compiled with AVX2 and
            // F16C; each block holds 32 quants and `out` 32 floats; unaligned loads and
            // stores.
            unsafe {
                let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(b.d.to_bits() as i32)));
                let d = _mm256_set1_ps(d);
                for i in (0..VALUES).step_by(8) {
                    let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.qs.as_ptr().add(i).cast()));
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
                }
            }
        }
        return;
    }
    for (b, out) in blocks.iter().zip(out.chunks_exact_mut(VALUES)) {
        let d = b.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = d * q as f32;
        }
    }
}

/// [`dequantize`] for a caller not compiled for level `L` (the prefill's per-layer
/// conversion): enters a function compiled for it.
pub(super) fn dequantize_at<const L: Level>(blocks: &[BlockQ8_0], out: &mut [f32]) {
    match L {
        // SAFETY: levels above PORTABLE come from `Isa::detect`: this CPU has AVX2 and
        // F16C (AVX-512 machines too).
        #[cfg(target_arch = "x86_64")]
        AVX2 | super::AVX512 => unsafe { dequantize_avx2(blocks, out) },
        _ => dequantize::<PORTABLE>(blocks, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn dequantize_avx2(blocks: &[BlockQ8_0], out: &mut [f32]) {
    dequantize::<AVX2>(blocks, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_widens_as_the_reference() {
        let x: Vec<f32> = (0..96).map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.37).collect();
        let mut bytes = vec![0u8; 3 * 34];
        crate::engine::kv_type::quantize_row(&x, &mut bytes);
        let mut want = vec![0f32; 96];
        crate::engine::kv_type::dequantize_row(&bytes, &mut want);
        let blocks: Vec<BlockQ8_0> = bytes
            .chunks_exact(34)
            .map(|b| BlockQ8_0 {
                d: half::f16::from_le_bytes([b[0], b[1]]),
                qs: std::array::from_fn(|i| b[2 + i] as i8),
            })
            .collect();
        let mut got = vec![0f32; 96];
        dequantize_at::<PORTABLE>(&blocks, &mut got);
        assert_eq!(got, want);
        #[cfg(target_arch = "x86_64")]
        if crate::engine::cpu::kernels::Isa::all_supported().contains(&crate::engine::cpu::kernels::Isa::Avx2) {
            got.fill(0.0);
            dequantize_at::<AVX2>(&blocks, &mut got);
            assert_eq!(got, want);
        }
    }
}
