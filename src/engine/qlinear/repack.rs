//! Weights in formats our kernels do not read, rewritten at load time into one they do,
//! as llama.cpp repacks Q4_0 for its ARM kernels:
//!
//! - **Q4_0 → Q4_1, exactly.** A Q4_0 value is `d * (q - 8)`; as Q4_1 (`d * q + m`) that
//!   is the same nibbles with `m = -8 d`, and `-8 d` is exact in f16 (a power of two
//!   times a finite f16 that stays finite).
//! - **Q5_0 → Q8_0, exactly.** A Q5_0 value is `d * (q - 16)` with a 5-bit `q`: the
//!   integer `q - 16` (-16..15) is an 8-bit value under the same scale. Q5_0 is most of a
//!   Q4_K_M file's matrices where rows are not a multiple of 256 (SmolLM2's, Gemma 3
//!   270M's), and candle's own Q5_0 kernel is scalar.
//! - **Q5_1 → Q8_0, to 8-bit rounding.** A Q5_1 value is `d * q + m`: the block's 32
//!   values are quantized again to Q8_0 (round to nearest, scale `max |w| / 127`). The
//!   added error is at most half an 8-bit step, a quarter of the 5-bit step or less, so the
//!   error grows by about 3 % in RMS (perplexity, README: within 1 % of llama.cpp's).
//!   Q5_1 is most of a Q5_K_M file's matrices where rows are not a multiple of 256.
//!
//! Q4_K needs no rewrite: our kernels read it in the file's layout (`Kind::Q4K`).
//!
//! The cost is memory: Q4_1 takes 5 bits a weight where Q4_0 takes 4.5, so a repacked
//! matrix is 11 % larger; Q8_0 takes 8.5 where Q5_0 takes 5.5 (55 % larger) and Q5_1 6
//! (42 % larger). `Model::facts` counts it.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Result;
use half::f16;

use super::blocks::QK;

/// Bytes of a Q4_0 block (`d`, 16 bytes of nibbles) and a Q4_1 block (`d`, `m`, 16 bytes).
const Q4_0_BYTES: usize = 18;
const Q4_1_BYTES: usize = 20;
/// Bytes of a Q5_0 block (`d`, 4 bytes of fifth bits, 16 of nibbles), a Q5_1 block (`d`,
/// `m`, the same bits) and a Q8_0 block.
const Q5_0_BYTES: usize = 22;
const Q5_1_BYTES: usize = 24;
const Q8_0_BYTES: usize = 34;

/// Bytes a tensor of `dtype` with `elements` values grows by when [`for_our_kernels`]
/// rewrites it.
pub fn growth_bytes(dtype: GgmlDType, elements: u64) -> u64 {
    match dtype {
        GgmlDType::Q4_0 => elements / QK as u64 * (Q4_1_BYTES - Q4_0_BYTES) as u64,
        GgmlDType::Q5_0 => elements / QK as u64 * (Q8_0_BYTES - Q5_0_BYTES) as u64,
        GgmlDType::Q5_1 => elements / QK as u64 * (Q8_0_BYTES - Q5_1_BYTES) as u64,
        _ => 0,
    }
}

/// `w` rewritten for our kernels when it is a CPU Q4_0 tensor (as Q4_1) or a Q5_0 or Q5_1
/// one (as Q8_0); `None` otherwise, or when a scale would not stay finite in f16.
pub fn for_our_kernels(w: &QTensor) -> Result<Option<Arc<QTensor>>> {
    if !w.device().is_cpu() {
        return Ok(None);
    }
    let data = w.data()?;
    let (out, dtype) = match w.dtype() {
        GgmlDType::Q4_0 => (q4_0_to_q4_1(&data), GgmlDType::Q4_1),
        GgmlDType::Q5_0 => (Some(q5_0_to_q8_0(&data)), GgmlDType::Q8_0),
        GgmlDType::Q5_1 => (q5_1_to_q8_0(w)?, GgmlDType::Q8_0),
        _ => return Ok(None),
    };
    let Some(out) = out else { return Ok(None) };
    let storage = QStorage::from_data(Cow::Owned(out), &w.device(), dtype)?;
    Ok(Some(Arc::new(QTensor::new(storage, w.shape().clone())?)))
}

fn q4_0_to_q4_1(data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len() / Q4_0_BYTES * Q4_1_BYTES);
    for block in data.chunks_exact(Q4_0_BYTES) {
        let d = f16::from_le_bytes([block[0], block[1]]);
        let m = f16::from_f32(-8.0 * d.to_f32());
        if !m.is_finite() {
            return None;
        }
        out.extend_from_slice(&block[..2]);
        out.extend_from_slice(&m.to_le_bytes());
        out.extend_from_slice(&block[2..]);
    }
    Some(out)
}

/// ggml's Q5_0 layout: value `j` (0..16) is the low nibble of `qs[j]` with bit `j` of `qh`
/// as its fifth bit; value `j + 16` the high nibble with bit `j + 16`.
fn q5_0_to_q8_0(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() / Q5_0_BYTES * Q8_0_BYTES);
    for block in data.chunks_exact(Q5_0_BYTES) {
        let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
        let qs = &block[6..22];
        let value = |nibble: u8, bit: usize| (nibble | ((((qh >> bit) & 1) as u8) << 4)) as i8 - 16;
        out.extend_from_slice(&block[..2]);
        out.extend((0..QK / 2).map(|j| value(qs[j] & 0xF, j) as u8));
        out.extend((0..QK / 2).map(|j| value(qs[j] >> 4, j + QK / 2) as u8));
    }
    out
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
    fn q4_0_becomes_the_same_values_in_q4_1() {
        let q = QTensor::quantize(&weights(8, 512), GgmlDType::Q4_0).unwrap();
        let r = for_our_kernels(&q).unwrap().expect("repacked");
        assert_eq!(r.dtype(), GgmlDType::Q4_1);
        assert_eq!(r.shape(), q.shape());
        assert_eq!(values(&r), values(&q), "exact");
        assert_eq!(r.data().unwrap().len(), q.data().unwrap().len() / Q4_0_BYTES * Q4_1_BYTES);
    }

    #[test]
    fn q5_0_becomes_the_same_values_in_q8_0() {
        let q = QTensor::quantize(&weights(8, 512), GgmlDType::Q5_0).unwrap();
        let r = for_our_kernels(&q).unwrap().expect("repacked");
        assert_eq!(r.dtype(), GgmlDType::Q8_0);
        assert_eq!(values(&r), values(&q), "exact");
        assert_eq!(
            r.data().unwrap().len() as u64 - q.data().unwrap().len() as u64,
            growth_bytes(GgmlDType::Q5_0, 8 * 512)
        );
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
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4K] {
            let q = QTensor::quantize(&weights(2, 256), dtype).unwrap();
            assert!(for_our_kernels(&q).unwrap().is_none(), "{dtype:?}");
            assert_eq!(growth_bytes(dtype, 2 * 256), 0, "{dtype:?}");
        }
    }
}
