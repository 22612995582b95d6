//! The KV cache's element type, and the q8_0 rows a quantized cache keeps.
//!
//! A q8_0 cache stores each key and value row of `head_dim` values as ggml's
//! `block_q8_0` blocks (llama.cpp's `-ctk q8_0 -ctv q8_0`):
//!
//! ```text
//!   row = head_dim / 32 blocks × [ d: f16 (little-endian) | qs: 32 × i8 ]   (34 bytes each)
//!   x[32b + i] ≈ d_b · qs_b[i],   d_b = max|x| / 127,   qs = round(x / d_b)
//! ```
//!
//! 34 bytes per 32 values: 17/32 of an f16 cache. The buffers are candle `U8` tensors
//! `(1, n_kv_heads, capacity, row_bytes)`; the fused CPU kernels read the blocks in place,
//! everything else (candle's attention path, the context shift, saved chats) goes through
//! [`dequantize`] and [`quantize`].

use candle_core::{DType, Device, Tensor};
use half::f16;

use crate::memory::RamTier;

/// Values per q8_0 block.
pub const Q8_0_VALUES: usize = 32;
/// Bytes per q8_0 block: the f16 scale and 32 quants.
pub const Q8_0_BYTES: usize = 34;

/// KV cache element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
    /// ggml's `block_q8_0`: 32 values in 34 bytes; head sizes must be multiples of 32.
    Q8_0,
}

impl From<DType> for KvDtype {
    /// The cache type of a float dtype: F32 stays F32, every other (F16, BF16) is F16.
    fn from(dtype: DType) -> Self {
        match dtype {
            DType::F32 | DType::F64 => KvDtype::F32,
            _ => KvDtype::F16,
        }
    }
}

impl KvDtype {
    /// The cache type a memory tier uses unless told otherwise: q8_0 on 6 GB phones, whose
    /// KV allowance (`memory::fit::kv_allowance_bytes`) then holds 32/17 as many tokens,
    /// f16 elsewhere. q8_0 costs 0.3 % of perplexity on SmolLM2-135M and Gemma 3 270M
    /// (bench/runs/2026-12-02-epyc-2core/kv-q8_0.md), well inside the 1 % we allow.
    pub fn for_tier(tier: RamTier) -> KvDtype {
        match tier {
            RamTier::Phone6Gb => KvDtype::Q8_0,
            RamTier::Phone8Gb | RamTier::Desktop => KvDtype::F16,
        }
    }

    /// The name `--kv` takes and the settings panel shows.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8_0 => "q8_0",
        }
    }

    /// The dtype of the candle tensors that hold the cache (bytes for q8_0).
    pub fn storage_dtype(self) -> DType {
        match self {
            KvDtype::F32 => DType::F32,
            KvDtype::F16 => DType::F16,
            KvDtype::Q8_0 => DType::U8,
        }
    }

    /// The cache type whose tensors are of `dtype` (the inverse of
    /// [`KvDtype::storage_dtype`]).
    pub fn of_storage(dtype: DType) -> Option<KvDtype> {
        [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0].into_iter().find(|kv| kv.storage_dtype() == dtype)
    }

    /// Elements of [`KvDtype::storage_dtype`] one row of `head_dim` values takes.
    pub fn row_width(self, head_dim: usize) -> usize {
        match self {
            KvDtype::F32 | KvDtype::F16 => head_dim,
            KvDtype::Q8_0 => head_dim / Q8_0_VALUES * Q8_0_BYTES,
        }
    }

    /// Bytes one row of `head_dim` values takes.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        self.row_width(head_dim) * self.storage_dtype().size_in_bytes()
    }

    /// Bytes this type takes where an f16 cache takes `f16_bytes` (of rows of whole q8_0
    /// blocks: head sizes that are multiples of 32).
    pub fn bytes_of_f16(self, f16_bytes: u64) -> u64 {
        match self {
            KvDtype::F32 => 2 * f16_bytes,
            KvDtype::F16 => f16_bytes,
            KvDtype::Q8_0 => f16_bytes / (2 * Q8_0_VALUES as u64) * Q8_0_BYTES as u64,
        }
    }

    /// Refuses head sizes this type cannot store (q8_0 needs whole blocks of 32).
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), String> {
        if self == KvDtype::Q8_0 && !head_dim.is_multiple_of(Q8_0_VALUES) {
            return Err(format!(
                "a q8_0 KV cache needs head sizes that are multiples of {Q8_0_VALUES}; this model has heads of {head_dim} (use --kv f16)"
            ));
        }
        Ok(())
    }

    /// `x` (f32 or f16, last dimension `head_dim`) in this type's storage, on `x`'s device.
    pub fn store(self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            KvDtype::F32 | KvDtype::F16 => x.to_dtype(self.storage_dtype()),
            KvDtype::Q8_0 => quantize(x),
        }
    }

    /// Stored rows `x` as f32 `(…, head_dim)`.
    pub fn load(self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            KvDtype::F32 | KvDtype::F16 => x.to_dtype(DType::F32),
            KvDtype::Q8_0 => dequantize(x),
        }
    }
}

/// Quantizes `x` to q8_0 exactly as ggml's `quantize_row_q8_0_ref`: `d = max|x| / 127`,
/// `q = round(x / d)` (halves away from zero), `d` stored as f16. `x.len()` is a multiple
/// of 32 and `out` holds `x.len() / 32 · 34` bytes.
pub fn quantize_row(x: &[f32], out: &mut [u8]) {
    debug_assert_eq!(x.len() / Q8_0_VALUES * Q8_0_BYTES, out.len());
    for (x, block) in x.chunks_exact(Q8_0_VALUES).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        for (q, &v) in block[2..].iter_mut().zip(x) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// The values of q8_0 blocks `blocks` (a multiple of 34 bytes) into `out`: `d · q`.
pub fn dequantize_row(blocks: &[u8], out: &mut [f32]) {
    debug_assert_eq!(blocks.len() / Q8_0_BYTES * Q8_0_VALUES, out.len());
    for (block, out) in blocks.chunks_exact(Q8_0_BYTES).zip(out.chunks_exact_mut(Q8_0_VALUES)) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        for (o, &q) in out.iter_mut().zip(&block[2..]) {
            *o = d * q as i8 as f32;
        }
    }
}

/// `x` `(…, head_dim)` as q8_0 rows: a `U8` tensor `(…, head_dim / 32 · 34)` on `x`'s device
/// (quantized on the CPU).
pub fn quantize(x: &Tensor) -> candle_core::Result<Tensor> {
    let mut dims = x.dims().to_vec();
    let head_dim = dims.pop().unwrap_or(0);
    if !head_dim.is_multiple_of(Q8_0_VALUES) {
        candle_core::bail!("q8_0 rows of {head_dim} values: not a multiple of {Q8_0_VALUES}");
    }
    let values: Vec<f32> = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    let mut bytes = vec![0u8; values.len() / Q8_0_VALUES * Q8_0_BYTES];
    quantize_row(&values, &mut bytes);
    dims.push(head_dim / Q8_0_VALUES * Q8_0_BYTES);
    Tensor::from_vec(bytes, dims, &Device::Cpu)?.to_device(x.device())
}

/// q8_0 rows `x` (a `U8` tensor `(…, row_bytes)`) as f32 `(…, row_bytes / 34 · 32)` on `x`'s
/// device.
pub fn dequantize(x: &Tensor) -> candle_core::Result<Tensor> {
    let mut dims = x.dims().to_vec();
    let row_bytes = dims.pop().unwrap_or(0);
    if x.dtype() != DType::U8 || !row_bytes.is_multiple_of(Q8_0_BYTES) {
        candle_core::bail!("not q8_0 rows: {:?} {:?}", x.dtype(), x.dims());
    }
    let bytes: Vec<u8> = x.flatten_all()?.to_vec1()?;
    let mut values = vec![0f32; bytes.len() / Q8_0_BYTES * Q8_0_VALUES];
    dequantize_row(&bytes, &mut values);
    dims.push(row_bytes / Q8_0_BYTES * Q8_0_VALUES);
    Tensor::from_vec(values, dims, &Device::Cpu)?.to_device(x.device())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::k_quants::{BlockQ8_0, GgmlType};

    #[test]
    fn rows_are_ggml_block_q8_0() {
        // Against candle's BlockQ8_0 (ggml's quantize_row_q8_0_ref), byte for byte,
        // including an all-zero block and exact halves.
        let mut x: Vec<f32> = (0..128).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173).collect();
        x[32..64].fill(0.0);
        x[64] = 127.0;
        x[65] = 0.5;
        x[66] = -1.5;
        let mut ours = vec![0u8; 4 * Q8_0_BYTES];
        quantize_row(&x, &mut ours);
        let mut theirs = vec![BlockQ8_0::zeros(); 4];
        BlockQ8_0::from_float(&x, &mut theirs);
        // SAFETY: BlockQ8_0 is repr(C) { f16, [i8; 32] }: 34 plain bytes.
        let theirs = unsafe { std::slice::from_raw_parts(theirs.as_ptr().cast::<u8>(), 4 * Q8_0_BYTES) };
        assert_eq!(ours, theirs);
        let mut back = vec![0f32; 128];
        dequantize_row(&ours, &mut back);
        for (b, x) in x.chunks(32).zip(back.chunks(32)) {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, y) in b.iter().zip(x) {
                assert!((a - y).abs() <= amax / 254.0 * 1.01 + 1e-6, "{a} → {y}");
            }
        }
    }

    #[test]
    fn tensors_round_trip_in_shape() {
        let x = Tensor::randn(0f32, 1.0, (1, 3, 5, 64), &Device::Cpu).unwrap();
        let q = KvDtype::Q8_0.store(&x).unwrap();
        assert_eq!((q.dtype(), q.dims()), (DType::U8, &[1, 3, 5, 68][..]));
        let y = KvDtype::Q8_0.load(&q).unwrap();
        assert_eq!(y.dims(), x.dims());
        let err = (y - &x).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(err < 0.03, "{err}");
        assert_eq!(KvDtype::Q8_0.row_bytes(256), 272);
        assert_eq!(KvDtype::F16.row_bytes(256), 512);
        assert!(KvDtype::Q8_0.check_head_dim(48).unwrap_err().contains("multiples of 32"));
        assert!(KvDtype::F16.check_head_dim(48).is_ok());
        assert_eq!(RamTier::ALL.map(KvDtype::for_tier), [KvDtype::Q8_0, KvDtype::F16, KvDtype::F16]);
        for kv in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0] {
            assert_eq!(kv.bytes_of_f16(KvDtype::F16.row_bytes(192) as u64), kv.row_bytes(192) as u64, "{kv:?}");
        }
    }
}
