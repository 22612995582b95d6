//! Weights in formats our kernels do not read, rewritten at load time into one they do,
//! as llama.cpp repacks Q4_0 for its ARM kernels (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K
//! are read in the file's own layout and never rewritten):
//!
//! - **Q5_1 → Q8_0, to 8-bit rounding.** A Q5_1 value is `d * q + m`: the block's 32
//!   values are quantized again to Q8_0 (round to nearest, scale `max |w| / 127`). The
//!   added error is at most half an 8-bit step, a quarter of the 5-bit step or less, so the
//!   error grows by about 3 % in RMS (perplexity, docs/models.md: within 1 % of llama.cpp's).
//!   Q5_1 is most of a Q5_K_M file's matrices where rows are not a multiple of 256.
//!
//! The cost is memory: Q8_0 takes 8.5 bits a weight where Q5_1 takes 6, so a rewritten
//! matrix is 42 % larger, on the heap rather than in the mapped file. `Model::facts`
//! counts it.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Result;

use super::blocks::QK;

/// Bytes of a Q5_1 block (`d`, `m`, 4 bytes of fifth bits, 16 of nibbles) and a Q8_0 block.
const Q5_1_BYTES: usize = 24;
const Q8_0_BYTES: usize = 34;

/// Bytes a tensor of `dtype` with `elements` values grows by when [`for_our_kernels`]
/// rewrites it.
pub fn growth_bytes(dtype: GgmlDType, elements: u64) -> u64 {
    match dtype {
        GgmlDType::Q5_1 => elements / QK as u64 * (Q8_0_BYTES - Q5_1_BYTES) as u64,
        _ => 0,
    }
}

/// `w` rewritten for our kernels when it is a CPU Q5_1 tensor (as Q8_0); `None` otherwise,
/// or when a value is not finite.
pub fn for_our_kernels(w: &QTensor) -> Result<Option<Arc<QTensor>>> {
    if !w.device().is_cpu() {
        return Ok(None);
    }
    let (out, dtype) = match w.dtype() {
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
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q5_0, GgmlDType::Q4K, GgmlDType::Q6K] {
            let q = QTensor::quantize(&weights(2, 256), dtype).unwrap();
            assert!(for_our_kernels(&q).unwrap().is_none(), "{dtype:?}");
            assert_eq!(growth_bytes(dtype, 512), 0, "{dtype:?}");
        }
    }
}
