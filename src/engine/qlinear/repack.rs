//! Weights in formats our kernels do not read, rewritten at load time into one they do,
//! as llama.cpp repacks Q4_0 for its ARM kernels (Q4_0, Q5_0, Q6_K, Q4_1 and Q8_0 are read
//! in the file's own layout and never rewritten):
//!
//! - **Q5_1 → Q8_0, to 8-bit rounding.** A Q5_1 value is `d * q + m`: the block's 32
//!   values are quantized again to Q8_0 (round to nearest, scale `max |w| / 127`). The
//!   added error is at most half an 8-bit step, a quarter of the 5-bit step or less, so the
//!   error grows by about 3 % in RMS (perplexity, README: within 1 % of llama.cpp's).
//!   Q5_1 is most of a Q5_K_M file's matrices where rows are not a multiple of 256.
//! - **Q4_K → Q4_1, to f16 rounding.** Each 32-value sub-block of a Q4_K super-block is
//!   `d * sc * q - dmin * m` with 6-bit `sc`, `m`: a Q4_1 block with `d' = d * sc` and
//!   `m' = -dmin * m`, each rounded to f16 (a relative error of at most 2^-11, far below
//!   the 4-bit quantization's own). The nibbles are reordered from Q4_K's layout (a
//!   64-value group's 32 bytes hold sub-block 2g in the low nibbles, 2g+1 in the high)
//!   to Q4_1's (value i low, value i + 16 high).
//!
//! The cost is memory: Q4_1 takes 5 bits a weight where Q4_K takes 4.5, so a repacked
//! matrix is 11 % larger; Q8_0 takes 8.5 where Q5_1 takes 6 (42 % larger).
//! `Model::facts` counts it.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Result;
use half::f16;

use super::blocks::QK;

/// Bytes of a Q4_1 block (`d`, `m`, 16 bytes of nibbles) and a Q4_K super-block (`d`,
/// `dmin`, 12 bytes of scales, 128 of nibbles).
const Q4_1_BYTES: usize = 20;
const Q4_K_BYTES: usize = 144;
/// Bytes of a Q5_1 block (`d`, `m`, 4 bytes of fifth bits, 16 of nibbles) and a Q8_0 block.
const Q5_1_BYTES: usize = 24;
const Q8_0_BYTES: usize = 34;
/// Values per K-quant super-block.
const QK_K: usize = 256;

/// Bytes a tensor of `dtype` with `elements` values grows by when [`for_our_kernels`]
/// rewrites it.
pub fn growth_bytes(dtype: GgmlDType, elements: u64) -> u64 {
    match dtype {
        GgmlDType::Q5_1 => elements / QK as u64 * (Q8_0_BYTES - Q5_1_BYTES) as u64,
        GgmlDType::Q4K => elements / QK_K as u64 * ((QK_K / QK * Q4_1_BYTES) - Q4_K_BYTES) as u64,
        _ => 0,
    }
}

/// `w` rewritten for our kernels when it is a CPU Q4_K tensor (as Q4_1) or a Q5_1 one (as
/// Q8_0); `None` otherwise, or when a scale would not stay finite in f16.
pub fn for_our_kernels(w: &QTensor) -> Result<Option<Arc<QTensor>>> {
    if !w.device().is_cpu() {
        return Ok(None);
    }
    let data = w.data()?;
    let (out, dtype) = match w.dtype() {
        GgmlDType::Q4K => (q4_k_to_q4_1(&data), GgmlDType::Q4_1),
        GgmlDType::Q5_1 => (q5_1_to_q8_0(w)?, GgmlDType::Q8_0),
        _ => return Ok(None),
    };
    let Some(out) = out else { return Ok(None) };
    let storage = QStorage::from_data(Cow::Owned(out), &w.device(), dtype)?;
    Ok(Some(Arc::new(QTensor::new(storage, w.shape().clone())?)))
}

/// Q5_1's values through candle's dequantization, quantized again as Q8_0 (ggml's
/// rounding); `None` when a value is not finite.
fn q5_1_to_q8_0(w: &QTensor) -> Result<Option<Vec<u8>>> {
    let values = w.dequantize(&w.device())?.flatten_all()?;
    if values.to_vec1::<f32>()?.iter().any(|v| !v.is_finite()) {
        return Ok(None);
    }
    let q = QTensor::quantize(&values, GgmlDType::Q8_0)?;
    Ok(Some(q.data()?.into_owned()))
}

/// The 6-bit scale and min of sub-block `j` (0..8), as ggml's `get_scale_min_k4` unpacks them.
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn q4_k_to_q4_1(data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len() / Q4_K_BYTES * (QK_K / QK) * Q4_1_BYTES);
    for sb in data.chunks_exact(Q4_K_BYTES) {
        let d = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
        let dmin = f16::from_le_bytes([sb[2], sb[3]]).to_f32();
        let (scales, qs) = (&sb[4..16], &sb[16..144]);
        for j in 0..QK_K / QK {
            let (sc, m) = scale_min(j, scales);
            let (bd, bm) = (f16::from_f32(d * sc as f32), f16::from_f32(-dmin * m as f32));
            if !bd.is_finite() || !bm.is_finite() {
                return None;
            }
            // Sub-block j: the low (even j) or high (odd j) nibbles of group j / 2's 32 bytes.
            let group = &qs[32 * (j / 2)..32 * (j / 2) + 32];
            let value = |i: usize| if j % 2 == 0 { group[i] & 0xF } else { group[i] >> 4 };
            out.extend_from_slice(&bd.to_le_bytes());
            out.extend_from_slice(&bm.to_le_bytes());
            out.extend((0..QK / 2).map(|i| value(i) | (value(i + QK / 2) << 4)));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    fn weights(rows: usize, cols: usize) -> Tensor {
        let v: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1013) as f32 / 506.0 - 1.0) * 0.3).collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
    }

    fn values(q: &QTensor) -> Vec<f32> {
        q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn q4_k_becomes_q4_1_to_f16_rounding() {
        let q = QTensor::quantize(&weights(4, 1024), GgmlDType::Q4K).unwrap();
        let r = for_our_kernels(&q).unwrap().expect("repacked");
        let (a, b) = (values(&q), values(&r));
        let max = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(err <= max * 2e-3, "max abs difference {err} (max |w| {max})");
    }

    #[test]
    fn q5_1_becomes_q8_0_to_8_bit_rounding() {
        let q = QTensor::quantize(&weights(8, 512), GgmlDType::Q5_1).unwrap();
        let r = for_our_kernels(&q).unwrap().expect("repacked");
        assert_eq!(r.dtype(), GgmlDType::Q8_0);
        let (a, b) = (values(&q), values(&r));
        // Half an 8-bit step of each block's largest value.
        for (x, y) in a.chunks(QK).zip(b.chunks(QK)) {
            let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
            assert!(err <= max / 127.0 * 0.5 + max * 1e-3, "max abs difference {err} (max |w| {max})");
        }
        assert_eq!(
            r.data().unwrap().len() as u64 - q.data().unwrap().len() as u64,
            growth_bytes(GgmlDType::Q5_1, 8 * 512)
        );
    }

    #[test]
    fn other_types_are_left_alone() {
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q5_0, GgmlDType::Q6K] {
            let q = QTensor::quantize(&weights(2, 256), dtype).unwrap();
            assert!(for_our_kernels(&q).unwrap().is_none(), "{dtype:?}");
            assert_eq!(growth_bytes(dtype, 512), 0, "{dtype:?}");
        }
    }
}
