//! Self-attention in plain Rust for the CPU with an f32 KV cache, used by the fast
//! kernel set (`MatmulKernel::Fast`); every other case takes the candle path in
//! `engine::model`.
//!
//! - [`decode`]: one new token, a loop over the cached positions.
//! - [`prefill`]: several new tokens, a fused tiled kernel that never materializes the
//!   score matrix.

mod decode;
mod prefill;

pub(crate) use decode::try_decode_attention;
pub(crate) use prefill::try_prefill_attention;

use candle_core::{CpuStorage, Storage};

/// The `count` contiguous f32 elements a CPU tensor's layout points at.
fn cpu_f32<'a>(storage: &'a Storage, layout: &candle_core::Layout, count: usize) -> Option<&'a [f32]> {
    match storage {
        Storage::Cpu(CpuStorage::F32(data)) if layout.is_contiguous() => {
            data.get(layout.start_offset()..layout.start_offset() + count)
        }
        _ => None,
    }
}

