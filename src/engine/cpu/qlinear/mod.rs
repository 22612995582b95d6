//! Fast quantized linear layers for the CPU.
//!
//! candle 0.11 has SIMD dot kernels for Q4_0, Q8_0 and the K-quants but none for Q4_1, the
//! format of the default model, so its Q4_1 matmul runs ggml's scalar reference code.
//! [`QLinear`] runs its own kernels for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K weights on the
//! CPU, each read in the file's own block layout (in place from the mapped file, see
//! `engine::weights`), and hands every other case to candle's [`QMatMul`]:
//!
//! ```text
//! x (m x k, f32) --quantize each row once--> Q8_1 / Q8_0 rows  (ggml's rounding, bit-exact;
//!                                            one scale per 256 values for the K-quants)
//!                                               |
//! W (n x k, GGUF blocks) -- rows split across the engine's pool (`engine::cpu::pool`, large
//!                           matmuls only; decode as a detached job, `DecodeRows`)
//!                                               v
//!        decode (m = 1): 4 weight rows share every activation load, each weight byte is
//!                        read once;
//!        prefill (m > 1): 4 activation rows (8 with AVX-512) share every unpacked
//!                         weight block; tiles of 16 weight rows x those rows stay in L1
//!                                               v
//!                                      y (m x n, f32)
//! ```
//!
//! Kernels: AVX2 (+ AVX-VNNI when present, and software prefetch 4 KiB ahead of each
//! weight row, or one tile ahead where a tile's rows span more, which took decode from ~150
//! to ~230 tok/s on SmolLM2 and Llama-3.2-1B Q8_0's from 14 to 34) and AVX-512 VNNI (two
//! blocks per register, every format above: prefill matmuls 1.4-2.4x the AVX2 path) on x86-64,
//! NEON (+ `sdot` when present) on aarch64, and a portable scalar path. For Q4_1 and Q8_0
//! the scalar path reproduces candle's `vec_dot_unopt` arithmetic term for term, and the
//! SIMD paths agree with it to float rounding (they sum the 32 products of a block in a
//! different order; see the tests).
//!
//! The K-quants are read in the file's own layout (super-blocks of 256 values) against
//! activations in the same 32-value blocks, whose scale `d_a` is taken over 256 values
//! (`ActScale::SuperBlock`, the granularity of ggml's Q8_K, which llama.cpp and candle
//! use for these weights): a Q4_K sub-block `j` gives
//! `d * sc_j * d_a * sum(q * a) - dmin * m_j * s_a`, a Q6_K block of 32 values
//! `d * d_a * (sc_a * dot(first 16) + sc_b * dot(second 16))`. With one `d_a` per
//! super-block the AVX2 and NEON kernels sum `sc_j * sum(q * a)` over the whole
//! super-block in integers and convert to f32 once. Candle's Q8_K rounds `max / -128` where ours rounds
//! `amax / 127`, so the two agree to that rounding, not bit for bit. A layer is a weight's
//! rows of `nb = k / 32` activation blocks whatever its kind; `Kind::row_bytes` gives a
//! row's bytes.
//!
//! Only Q5_1 is rewritten when the layer is built, as Q8_0 (to 8-bit rounding; `repack`).
//! F32, F16 and BF16 weights are read in place by `float` (candle would keep an f32 copy
//! of them).
//!
//! Which of these runs is the model's [`Kernels`] choice: `fast` (the best this CPU
//! supports, detected at run time), `portable` (the scalar kernel) or `candle` (always
//! candle's `QMatMul`).

/// `pub(super) unsafe fn $name(...)`: [`blocks::drive`] with tile kernel `$kernel`, compiled
/// for one x86-64 instruction set: `avx2` (AVX2 + FMA + F16C), `vnni` (and AVX-VNNI) or
/// `avx512` (AVX-512 F/BW/VNNI). The kernel files import `drive` and `Acts`.
#[cfg(target_arch = "x86_64")]
macro_rules! tile_entry {
    (avx2, $name:ident, $kernel:ty, $block:ty) => {
        tile_entry!(@ "avx2,fma,f16c", $name, $kernel, $block);
    };
    (vnni, $name:ident, $kernel:ty, $block:ty) => {
        tile_entry!(@ "avx2,fma,f16c,avxvnni", $name, $kernel, $block);
    };
    (avx512, $name:ident, $kernel:ty, $block:ty) => {
        tile_entry!(@ "avx512f,avx512bw,avx512vnni,avx2,fma,f16c", $name, $kernel, $block);
    };
    (@ $features:literal, $name:ident, $kernel:ty, $block:ty) => {
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(
            w: *const $block,
            nb: usize,
            rows: std::ops::Range<usize>,
            acts: &Acts<'_>,
            dst: *mut f32,
            ldd: usize,
        ) {
            drive::<$kernel>(w, nb, rows, acts, dst, ldd)
        }
    };
}

pub(crate) mod blocks;
mod float;
mod repack;
mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(test)]
mod tests;

use blocks::{ActScale, Acts, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8_0, QK, QK_K};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Result, Tensor};
pub(crate) use repack::growth_bytes;
use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use crate::engine::weights::MappedTensor;

use crate::engine::cpu::kernels::{Isa, Kernels};
use crate::engine::cpu::pool::{self, SendPtr};

impl Isa {
    /// Whether this instruction set's prefill kernel for `kind` and rows of `k` values
    /// reads activations in the sub-block-interleaved order
    /// ([`blocks::interleave_super_blocks`]): AVX-512 Q4_K and Q6_K, and Q8_0, Q4_0 and
    /// Q5_0 rows of whole 256-value groups, whose products over 256 values then stay in
    /// integers; AVX2 the same three signed formats, in its own order
    /// ([`blocks::interleave_blocks`]), in rows of at least one group (the blocks after the
    /// last whole group stay in the natural order).
    fn interleaves(self, kind: Kind, k: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self == Isa::Avx512Vnni {
            return match kind {
                Kind::Q4K | Kind::Q6K => true,
                Kind::Q8_0 | Kind::Q4_0 | Kind::Q5_0 => k.is_multiple_of(QK_K),
                Kind::Q4_1 => false,
            };
        }
        #[cfg(target_arch = "x86_64")]
        if matches!(self, Isa::Avx2 | Isa::AvxVnni) {
            return matches!(kind, Kind::Q8_0 | Kind::Q4_0 | Kind::Q5_0) && k >= QK_K;
        }
        let _ = (self, kind, k);
        false
    }

    fn quantize_row(self, x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]], act: ActFormat) {
        let ActFormat { with_sum, scale } = act;
        match self {
            // SAFETY: `Isa::detect` only returns instruction sets this CPU supports.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => unsafe { avx2::quantize_row(x, qs, ds, with_sum, scale) },
            #[cfg(target_arch = "aarch64")]
            Isa::Neon | Isa::NeonDot => unsafe { neon::quantize_row(x, qs, ds, with_sum, scale) },
            _ => scalar::quantize_row(x, qs, ds, with_sum, scale),
        }
    }

    /// # Safety
    /// As [`blocks::drive`]; `self` is supported by this CPU.
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows(
        self,
        kind: Kind,
        w: *const u8,
        nb: usize,
        rows: std::ops::Range<usize>,
        acts: &Acts<'_>,
        dst: *mut f32,
        ldd: usize,
    ) {
        use blocks::drive;
        debug_assert!(
            !acts.interleaved || Isa::interleaves(self, kind, nb * QK),
            "{self:?} {kind:?} takes the natural order"
        );
        let (w41, w80, w4k) = (w as *const BlockQ4_1, w as *const BlockQ8_0, w as *const BlockQ4K);
        let (w40, w50, w6k) = (w as *const BlockQ4_0, w as *const BlockQ5_0, w as *const BlockQ6K);
        match (self, kind) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q4_1) => avx2::q4_1_rows(w41, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q4_1) => avx2::q4_1_rows_vnni(w41, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q4_1) if acts.m >= avx512::GROUPED_MIN_ROWS => {
                avx512::q4_1_grouped_rows(w41, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q4_1) => avx512::q4_1_rows(w41, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q4K) if acts.m >= avx2::GROUPED_MIN_ROWS => {
                avx2::q4k_grouped_rows(w4k, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q4K) if acts.m >= avx2::GROUPED_MIN_ROWS => {
                avx2::q4k_grouped_rows_vnni(w4k, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q4K) => avx2::q4k_rows(w4k, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q4K) => avx2::q4k_rows_vnni(w4k, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q4K) if acts.interleaved && acts.m < avx512::UNPACKED_MIN_ROWS => {
                avx512::q4k_file_rows(w4k, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q4K) if acts.interleaved => avx512::q4k_grouped_rows(w4k, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q4K) => avx512::q4k_rows(w4k, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q8_0) if acts.interleaved => {
                avx512::signed_grouped_rows::<BlockQ8_0>(w80, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q4_0) if acts.interleaved => {
                avx512::signed_grouped_rows::<BlockQ4_0>(w40, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q5_0) if acts.interleaved => {
                avx512::signed_grouped_rows::<BlockQ5_0>(w50, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q8_0) if acts.m >= avx512::GROUPED_MIN_ROWS => {
                avx512::signed_grouped_rows::<BlockQ8_0>(w80, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q8_0) => avx512::signed_rows::<BlockQ8_0>(w80, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q4_0) if acts.m >= avx512::GROUPED_MIN_ROWS => {
                avx512::signed_grouped_rows::<BlockQ4_0>(w40, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q4_0) => avx512::signed_rows::<BlockQ4_0>(w40, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q5_0) if acts.m >= avx512::GROUPED_MIN_ROWS => {
                avx512::signed_grouped_rows::<BlockQ5_0>(w50, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q5_0) => avx512::signed_rows::<BlockQ5_0>(w50, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q8_0) if acts.interleaved => {
                avx2::signed_interleaved_rows::<BlockQ8_0>(w80, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q4_0) if acts.interleaved => {
                avx2::signed_interleaved_rows::<BlockQ4_0>(w40, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q5_0) if acts.interleaved => {
                avx2::signed_interleaved_rows::<BlockQ5_0>(w50, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q8_0) if acts.interleaved => {
                avx2::signed_interleaved_rows_vnni::<BlockQ8_0>(w80, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q4_0) if acts.interleaved => {
                avx2::signed_interleaved_rows_vnni::<BlockQ4_0>(w40, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q5_0) if acts.interleaved => {
                avx2::signed_interleaved_rows_vnni::<BlockQ5_0>(w50, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q8_0) => avx2::q8_0_rows_vnni(w80, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q8_0) => avx2::q8_0_rows(w80, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q4_0) => avx2::q4_0_rows_vnni(w40, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q4_0) => avx2::q4_0_rows(w40, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q5_0) => avx2::q5_0_rows_vnni(w50, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q5_0) => avx2::q5_0_rows(w50, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q6K) if acts.interleaved && acts.m < avx512::UNPACKED_MIN_ROWS => {
                avx512::q6k_file_rows(w6k, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q6K) if acts.interleaved => avx512::q6k_grouped_rows(w6k, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, Kind::Q6K) => avx512::q6_k_rows(w6k, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q6K) if acts.m >= avx2::GROUPED_MIN_ROWS => {
                avx2::q6k_grouped_rows(w6k, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q6K) if acts.m >= avx2::GROUPED_MIN_ROWS => {
                avx2::q6k_grouped_rows_vnni(w6k, nb, rows, acts, dst, ldd)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q6K) => avx2::q6_k_rows(w6k, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q6K) => avx2::q6_k_rows_vnni(w6k, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon, Kind::Q4_1) => neon::q4_1_rows(w41, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::NeonDot, Kind::Q4_1) => neon::q4_1_rows_dot(w41, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon, Kind::Q4K) => neon::q4k_rows(w4k, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::NeonDot, Kind::Q4K) => neon::q4k_rows_dot(w4k, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon, Kind::Q8_0) => neon::q8_0_rows(w80, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::NeonDot, Kind::Q8_0) => neon::q8_0_rows_dot(w80, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon, Kind::Q4_0) => neon::q4_0_rows(w40, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::NeonDot, Kind::Q4_0) => neon::q4_0_rows_dot(w40, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon, Kind::Q5_0) => neon::q5_0_rows(w50, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::NeonDot, Kind::Q5_0) => neon::q5_0_rows_dot(w50, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon, Kind::Q6K) => neon::q6_k_rows(w6k, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::NeonDot, Kind::Q6K) => neon::q6_k_rows_dot(w6k, nb, rows, acts, dst, ldd),
            (_, Kind::Q4_1) => drive::<scalar::ScalarQ4_1>(w41, nb, rows, acts, dst, ldd),
            (_, Kind::Q8_0) => drive::<scalar::ScalarQ8_0>(w80, nb, rows, acts, dst, ldd),
            (_, Kind::Q4K) => drive::<scalar::ScalarQ4K>(w4k, nb, rows, acts, dst, ldd),
            (_, Kind::Q4_0) => drive::<scalar::ScalarQ4_0>(w40, nb, rows, acts, dst, ldd),
            (_, Kind::Q5_0) => drive::<scalar::ScalarQ5_0>(w50, nb, rows, acts, dst, ldd),
            (_, Kind::Q6K) => drive::<scalar::ScalarQ6K>(w6k, nb, rows, acts, dst, ldd),
        }
    }
}

/// Weight formats with our own kernels, each read in the file's own block layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Q4_1 weights against Q8_1 activations.
    Q4_1,
    /// Q8_0 weights against Q8_0 activations.
    Q8_0,
    /// Q4_K weights (256-value super-blocks, in the file's layout) against Q8_1
    /// activations, one activation block per 32-value sub-block.
    Q4K,
    /// Q4_0 weights against Q8_0 activations.
    Q4_0,
    /// Q5_0 weights against Q8_0 activations.
    Q5_0,
    /// Q6_K weights (256-value super-blocks) against Q8_0 activations.
    Q6K,
}

impl Kind {
    fn of(dtype: GgmlDType) -> Option<Kind> {
        match dtype {
            GgmlDType::Q4_1 => Some(Kind::Q4_1),
            GgmlDType::Q8_0 => Some(Kind::Q8_0),
            GgmlDType::Q4_0 => Some(Kind::Q4_0),
            GgmlDType::Q5_0 => Some(Kind::Q5_0),
            GgmlDType::Q4K => Some(Kind::Q4K),
            GgmlDType::Q6K => Some(Kind::Q6K),
            _ => None,
        }
    }
    /// Values per block of the format (a row holds whole blocks).
    fn block_values(self) -> usize {
        match self {
            Kind::Q4K | Kind::Q6K => QK_K,
            Kind::Q4_1 | Kind::Q8_0 | Kind::Q4_0 | Kind::Q5_0 => QK,
        }
    }
    /// Bytes of a weight row of `nb` 32-value blocks (`nb` a multiple of
    /// `block_values() / 32`).
    fn row_bytes(self, nb: usize) -> usize {
        let per = self.block_values() / QK;
        debug_assert!(nb.is_multiple_of(per));
        let block = match self {
            Kind::Q4_1 => std::mem::size_of::<BlockQ4_1>(),
            Kind::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
            Kind::Q4_0 => std::mem::size_of::<BlockQ4_0>(),
            Kind::Q5_0 => std::mem::size_of::<BlockQ5_0>(),
            Kind::Q4K => std::mem::size_of::<BlockQ4K>(),
            Kind::Q6K => std::mem::size_of::<BlockQ6K>(),
        };
        nb / per * block
    }
    /// Q8_1 activations carry `s = d * sum(q)` for the Q4_1 offset and Q4_K min terms.
    fn with_sum(self) -> bool {
        matches!(self, Kind::Q4_1 | Kind::Q4K)
    }
    /// The K-quants take activations with one scale per super-block (see [`ActScale`]).
    fn act_scale(self) -> ActScale {
        match self {
            Kind::Q4K | Kind::Q6K => ActScale::SuperBlock,
            Kind::Q4_1 | Kind::Q8_0 | Kind::Q4_0 | Kind::Q5_0 => ActScale::Block,
        }
    }
}

/// How a forward quantizes its input once for all the layers that read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ActFormat {
    with_sum: bool,
    scale: ActScale,
}

impl ActFormat {
    /// The input format of layers of `kinds`, which share one [`Kind::act_scale`]: with
    /// sums if any needs them (the others ignore them).
    fn for_kinds(mut kinds: impl Iterator<Item = Kind>) -> ActFormat {
        let first = kinds.next().expect("at least one layer");
        let mut act = ActFormat { with_sum: first.with_sum(), scale: first.act_scale() };
        for kind in kinds {
            assert_eq!(kind.act_scale(), act.scale, "layers fused over one input take the same scales");
            act.with_sum |= kind.with_sum();
        }
        act
    }
}

/// `bytes` hold exactly the rows of an `n x k` weight of `kind` (rows whole blocks of it),
/// aligned for their f16 scales.
fn layout_ok(bytes: &[u8], n: usize, k: usize, kind: Kind) -> bool {
    k.is_multiple_of(kind.block_values())
        && bytes.len() == n * kind.row_bytes(k / QK)
        && (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<half::f16>())
}

enum Backend {
    Ours { kind: Kind, isa: Isa },
    Float { kind: float::FloatKind, isa: Isa },
    Candle(QMatMul),
}

/// Where a layer's weight bytes live.
#[derive(Clone)]
enum Weight {
    /// In the mapped GGUF file, read in place: clean pages, not the process's own memory.
    Mapped(MappedTensor),
    /// In candle's storage on the heap (or a GPU): rewritten for our kernels, or run by
    /// candle.
    Owned(Arc<QTensor>),
}

impl Weight {
    fn dtype(&self) -> GgmlDType {
        match self {
            Weight::Mapped(t) => t.dtype(),
            Weight::Owned(w) => w.dtype(),
        }
    }

    /// The weight's blocks (borrowed: a CPU tensor's storage or the mapping).
    fn bytes(&self) -> Result<Cow<'_, [u8]>> {
        match self {
            Weight::Mapped(t) => Ok(Cow::Borrowed(t.bytes())),
            Weight::Owned(w) => w.data(),
        }
    }
}

/// A linear layer `y = x W^T` over a quantized GGUF weight `W` (`out_features x in_features`),
/// without bias.
pub struct QLinear {
    w: Weight,
    /// Bytes of the weight held in the process's own memory (0 when it is read in place
    /// from the mapped file).
    heap_bytes: u64,
    backend: Backend,
    out_features: usize,
    in_features: usize,
}

impl std::fmt::Debug for QLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match &self.backend {
            Backend::Ours { isa, .. } | Backend::Float { isa, .. } => format!("{isa:?}"),
            Backend::Candle(_) => "candle".to_string(),
        };
        f.debug_struct("QLinear")
            .field("dtype", &self.w.dtype())
            .field("mapped", &matches!(self.w, Weight::Mapped(_)))
            .field("out_features", &self.out_features)
            .field("in_features", &self.in_features)
            .field("backend", &backend)
            .finish()
    }
}

/// Weight rows per parallel work unit (a multiple of the tile sizes, 4 and 2).
const UNIT_ROWS: usize = 16;
/// Activation values below which the rows are quantized on the calling thread.
const PAR_MIN_QUANT: usize = 64 * 1024;

/// Whether a weight of `dtype` with rows of `columns` values runs in place from the mapped
/// file on the CPU under `kernels`: our kernels read its blocks as the file lays them out. Otherwise it is
/// copied to the heap (rewritten for our kernels, or for candle's).
pub(crate) fn runs_in_place(dtype: GgmlDType, columns: usize, kernels: Kernels) -> bool {
    kernels.isa().is_some()
        && ((Kind::of(dtype).is_some() && columns.is_multiple_of(dtype.block_size()))
            || float::FloatKind::of(dtype).is_some())
}

/// Bytes a weight of `dtype` (`elements` values in rows of `columns`) takes in the
/// process's own memory: none when
/// it runs in place ([`runs_in_place`]), else its size after any rewrite for our kernels.
pub(crate) fn heap_bytes(dtype: GgmlDType, elements: u64, columns: usize, kernels: Kernels, on_cpu: bool) -> u64 {
    if on_cpu && runs_in_place(dtype, columns, kernels) {
        return 0;
    }
    let file = elements / dtype.block_size() as u64 * dtype.type_size() as u64;
    let grown = if kernels.isa().is_some() { growth_bytes(dtype, elements) } else { 0 };
    file + grown
}

impl QLinear {
    /// A layer over a weight in the mapped GGUF file: read in place where our kernels take
    /// its layout on the CPU ([`runs_in_place`]), else copied once to `device` and built as
    /// [`QLinear::new`] does.
    pub fn mapped(t: MappedTensor, kernels: Kernels, device: &Device) -> Result<Self> {
        let &[out_features, in_features] = t.dims() else {
            candle_core::bail!("a weight matrix expected, found shape {:?}", t.dims())
        };
        if let (true, Some(isa)) = (device.is_cpu(), kernels.isa()) {
            let bytes = t.bytes();
            let backend = match (Kind::of(t.dtype()), float::FloatKind::of(t.dtype())) {
                (Some(kind), _) if layout_ok(bytes, out_features, in_features, kind) => {
                    Some(Backend::Ours { kind, isa })
                }
                (_, Some(kind)) if (bytes.as_ptr() as usize).is_multiple_of(kind.bytes()) => {
                    Some(Backend::Float { kind, isa })
                }
                _ => None,
            };
            if let Some(backend) = backend {
                return Ok(Self { w: Weight::Mapped(t), heap_bytes: 0, backend, out_features, in_features });
            }
        }
        let copy = t.to_qtensor(device)?;
        t.release_pages();
        Self::new(Arc::new(copy), kernels)
    }

    /// Takes ownership of a GGUF weight (`out_features x in_features`); ours runs where
    /// `kernels` and the weight allow it, candle's `QMatMul` elsewhere.
    pub fn new(w: Arc<QTensor>, kernels: Kernels) -> Result<Self> {
        let (out_features, in_features) = w.shape().dims2()?;
        // Q4_0 runs on our Q4_1 kernels, Q5_0 and Q5_1 on our Q8_0 ones, rewritten once
        // here (see `repack`).
        let w = match kernels.isa().map(|_| repack::for_our_kernels(&w)).transpose()?.flatten() {
            Some(r) => r,
            None => w,
        };
        let heap_bytes = w.storage_size_in_bytes() as u64;
        let ours = match (kernels.isa(), Kind::of(w.dtype()), float::FloatKind::of(w.dtype())) {
            (Some(isa), Some(kind), _) if Self::storage_ok(&w, kind)? => Some(Backend::Ours { kind, isa }),
            (Some(isa), _, Some(kind)) if w.device().is_cpu() => Some(Backend::Float { kind, isa }),
            _ => None,
        };
        let backend = match ours {
            Some(b) => b,
            None => Backend::Candle(QMatMul::from_arc(w.clone())?),
        };
        Ok(Self { w: Weight::Owned(w), heap_bytes, backend, out_features, in_features })
    }

    /// CPU storage holding exactly `n` rows of whole blocks, aligned for f16 reads.
    fn storage_ok(w: &QTensor, kind: Kind) -> Result<bool> {
        if !w.device().is_cpu() {
            return Ok(false);
        }
        let (n, k) = w.shape().dims2()?;
        let data = w.data()?;
        Ok(k.is_multiple_of(kind.block_values())
            && data.len() == n * kind.row_bytes(k / QK)
            && (data.as_ptr() as usize).is_multiple_of(std::mem::align_of::<half::f16>()))
    }

    /// `x`: `(.., in_features)` on any device; returns `(.., out_features)` in `x`'s dtype.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.backend {
            Backend::Candle(mm) => mm.forward(x),
            Backend::Ours { isa, .. } => {
                let mut out = fused_forward(&[self], *isa, x)?;
                Ok(out.pop().expect("one layer, one output"))
            }
            Backend::Float { kind, isa } => self.float_forward(*kind, *isa, x),
        }
    }

    /// Several layers over the same input, e.g. q/k/v or gate/up: one activation
    /// quantization and one parallel region for each group of them that takes the same
    /// quantized input, which saves a pool hand-off per extra layer in decode. Returns the
    /// outputs in `layers` order; layers our kernels do not run (or inputs they cannot
    /// take) go through [`QLinear::forward`] one by one.
    pub fn forward_many(layers: &[&QLinear], x: &Tensor) -> Result<Vec<Tensor>> {
        let m = x.dims().split_last().map_or(0, |(_, batch)| batch.iter().product::<usize>());
        // what a layer's input is quantized as: Q8_0 and Q4_1 share their scales, the
        // K-quants take one per super-block, AVX-512 prefill an interleaved order
        let input = |l: &QLinear| match l.backend {
            Backend::Ours { isa, kind } if x.device().is_cpu() => {
                Some((isa, l.in_features, kind.act_scale(), m > 1 && isa.interleaves(kind, l.in_features)))
            }
            _ => None,
        };
        let mut outs: Vec<Option<Tensor>> = vec![None; layers.len()];
        for i in 0..layers.len() {
            if outs[i].is_some() {
                continue;
            }
            let Some(key) = input(layers[i]) else {
                outs[i] = Some(layers[i].forward(x)?);
                continue;
            };
            let group: Vec<usize> =
                (i..layers.len()).filter(|&j| outs[j].is_none() && input(layers[j]) == Some(key)).collect();
            let members: Vec<&QLinear> = group.iter().map(|&j| layers[j]).collect();
            for (j, y) in group.into_iter().zip(fused_forward(&members, key.0, x)?) {
                outs[j] = Some(y);
            }
        }
        Ok(outs.into_iter().map(|y| y.expect("every layer computed")).collect())
    }

    /// [`QLinear::forward`] for float weights.
    fn float_forward(&self, kind: float::FloatKind, isa: Isa, x: &Tensor) -> Result<Tensor> {
        let (k, n) = (self.in_features, self.out_features);
        let dims = x.dims();
        if !x.device().is_cpu() || dims.last() != Some(&k) {
            candle_core::bail!(
                "QLinear: input {:?} on {:?} for a {n} x {k} CPU weight",
                x.shape(),
                x.device().location()
            )
        }
        let in_dtype = x.dtype();
        let xs: Vec<f32> = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let m = xs.len() / k;
        let mut dst = vec![0f32; m * n];
        float::matmul(kind, isa, &self.w.bytes()?, n, k, &xs, m, &mut dst);
        let mut out_dims = dims[..dims.len() - 1].to_vec();
        out_dims.push(n);
        Tensor::from_vec(dst, out_dims, &candle_core::Device::Cpu)?.to_dtype(in_dtype)
    }

    pub fn dtype(&self) -> GgmlDType {
        self.w.dtype()
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Bytes of the weight held in the process's own memory: 0 when it is read in place
    /// from the mapped file, else its size (after any rewrite for our kernels).
    pub fn heap_bytes(&self) -> u64 {
        self.heap_bytes
    }

    /// Whether the weight is read in place from the mapped file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.w, Weight::Mapped(_))
    }

    /// Bytes of the weight read in place from the mapped file (0 when copied).
    pub fn mapped_bytes(&self) -> u64 {
        match &self.w {
            Weight::Mapped(t) => t.bytes().len() as u64,
            Weight::Owned(_) => 0,
        }
    }

    /// The weight in candle's storage, when it was copied there (not read in place).
    pub fn owned_weight(&self) -> Option<&Arc<QTensor>> {
        match &self.w {
            Weight::Owned(w) => Some(w),
            Weight::Mapped(_) => None,
        }
    }

    /// Whether this layer runs our kernels (false: candle's `QMatMul`).
    pub fn uses_own_kernel(&self) -> bool {
        matches!(self.backend, Backend::Ours { .. } | Backend::Float { .. })
    }

    fn kind(&self) -> Kind {
        match self.backend {
            Backend::Ours { kind, .. } => kind,
            Backend::Float { .. } | Backend::Candle(_) => unreachable!("kind() of a layer off the quantized kernels"),
        }
    }
}

/// Our forward for layers that all run our kernels with `isa` and share `in_features`.
fn fused_forward(layers: &[&QLinear], isa: Isa, x: &Tensor) -> Result<Vec<Tensor>> {
    let k = layers[0].in_features;
    if !x.device().is_cpu() {
        candle_core::bail!("QLinear: input on {:?} but the weight is on the CPU", x.device().location())
    }
    let dims = x.dims();
    let Some((&xk, batch)) = dims.split_last() else {
        candle_core::bail!("QLinear: input must have at least one dimension")
    };
    if xk != k {
        candle_core::bail!("QLinear: input {:?} does not end in in_features = {k}", x.shape())
    }
    let in_dtype = x.dtype();
    let xf = x.to_dtype(DType::F32)?.contiguous()?;
    let m: usize = batch.iter().product();
    let dsts = {
        let (storage, layout) = xf.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else { candle_core::bail!("QLinear: expected CPU storage") };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("QLinear: input is not contiguous {layout:?}")
        };
        let xs = &cpu.as_slice::<f32>()?[start..end];
        matmul_many(layers, isa, xs, m)?
    };
    layers
        .iter()
        .zip(dsts)
        .map(|(l, dst)| {
            let mut out_dims = batch.to_vec();
            out_dims.push(l.out_features);
            let y = Tensor::from_vec(dst, out_dims, &candle_core::Device::Cpu)?;
            if in_dtype == DType::F32 {
                Ok(y)
            } else {
                y.to_dtype(in_dtype)
            }
        })
        .collect()
}

/// `x (m x k) W_j^T` (m x n_j) for every layer `j`, on the CPU with our kernels: `x` is
/// quantized once (Q8_1, which also serves Q8_0 weights: same quants and scales) and the
/// weight rows of all layers are shared out in one parallel region.
fn matmul_many(layers: &[&QLinear], isa: Isa, x: &[f32], m: usize) -> Result<Vec<Vec<f32>>> {
    let k = layers[0].in_features;
    assert_eq!(x.len(), m * k);
    let total_rows: usize = layers.iter().map(|l| l.out_features).sum();
    if m != 1 || k * total_rows < pool::PAR_MIN_MACS {
        return matmul_units(layers, isa, x, m);
    }
    // Decode: a detached job, so a descheduled worker's rows are computed again instead of
    // waited for (see `pool`).
    let job = DecodeRows::new(layers, isa, x)?;
    let mut flat = vec![0f32; total_rows];
    pool::global().run_detached(job, &mut flat);
    if layers.len() == 1 {
        return Ok(vec![flat]);
    }
    let mut rest = &flat[..];
    let split = layers.iter().map(|l| {
        let (head, tail) = rest.split_at(l.out_features);
        rest = tail;
        head.to_vec()
    });
    Ok(split.collect())
}

/// [`matmul_many`] as one parallel job over work units of [`UNIT_ROWS`] weight rows (all
/// but decode's large matmuls). The outputs are written into uninitialized buffers:
/// zeroing them first, only to overwrite every value, took ~2 % of a 1B model's prefill
/// on two threads, on one of them while the other waited.
fn matmul_units(layers: &[&QLinear], isa: Isa, x: &[f32], m: usize) -> Result<Vec<Vec<f32>>> {
    let k = layers[0].in_features;
    let nb = k / QK;
    let total_rows: usize = layers.iter().map(|l| l.out_features).sum();
    let mut dsts: Vec<Vec<f32>> = layers.iter().map(|l| Vec::with_capacity(m * l.out_features)).collect();
    if m == 0 {
        return Ok(dsts);
    }
    let units = LayerUnits::new(layers);
    let mut datas = Vec::with_capacity(layers.len());
    for l in layers {
        assert_eq!(l.in_features, k);
        let data = l.w.bytes()?;
        debug_assert_eq!(data.len(), l.out_features * l.kind().row_bytes(nb));
        datas.push(data);
    }
    let weights: Vec<SendPtr<u8>> = datas.iter().map(|d| SendPtr(d.as_ptr() as *mut u8)).collect();
    // (the unit tests fill the buffers with NaN first: an output no kernel wrote shows)
    #[cfg(test)]
    for (dst, l) in dsts.iter_mut().zip(layers) {
        dst.resize(m * l.out_features, f32::NAN);
        dst.clear();
    }
    let dst_ptrs: Vec<SendPtr<f32>> = dsts.iter_mut().map(|d| SendPtr(d.as_mut_ptr())).collect();
    let act = ActFormat::for_kinds(layers.iter().map(|l| l.kind()));

    // prefill of layers that all take the interleaved order reads it (see `Isa::interleaves`;
    // decode keeps the natural order, that of `DecodeRows`)
    let interleaved = m > 1 && layers.iter().all(|l| isa.interleaves(l.kind(), k));

    with_scratch(m * k, m * nb, |qs, ds| {
        quantize_rows(isa, act, interleaved, x, k, qs, ds);
        let acts = Acts { qs: &*qs, ds: &*ds, m, nb, interleaved };
        let run = |range: std::ops::Range<usize>| {
            for (j, rows) in units.rows_of(range) {
                // decode streams each weight row once, so a whole range goes in one call;
                // prefill walks all activation rows per unit, so the unit's weights must
                // stay in L1 across them: one call per unit
                let step = if m == 1 { rows.len() } else { UNIT_ROWS };
                let n = layers[j].out_features;
                for r in rows.clone().step_by(step.max(1)) {
                    // SAFETY: layer j's weight holds n * nb blocks of its kind (checked at
                    // construction) and `datas` keeps it borrowed; `acts` holds m rows of nb
                    // blocks; dst_j has room for m * n values, and each unit writes only
                    // dst_j[i * n + r] for its own rows r;
                    // `isa` came from `Isa::detect` (or is scalar).
                    unsafe {
                        isa.rows(
                            layers[j].kind(),
                            weights[j].get(),
                            nb,
                            r..rows.end.min(r + step),
                            &acts,
                            dst_ptrs[j].get(),
                            n,
                        )
                    }
                }
            }
        };
        pool::for_each_chunk(units.total(), m * k * total_rows, run);
    });
    for (dst, l) in dsts.iter_mut().zip(layers) {
        // SAFETY: the job has ended (`Pool::run` waits for every worker that joined it), and
        // its units, which cover every row of every layer, wrote dst_j[i * n + r] for all
        // i < m (each tile writes its outputs before any later chunk adds to them)
        unsafe { dst.set_len(m * l.out_features) };
    }
    Ok(dsts)
}

/// Several layers' weight rows cut into parallel work units of `UNIT_ROWS` rows, layer
/// after layer (a unit never spans two layers); their rows are counted the same way, the
/// layers' outputs one after the other.
struct LayerUnits {
    /// First unit of each layer, then the total.
    unit_start: Vec<usize>,
    /// First row of each layer, then the total.
    row_start: Vec<usize>,
}

impl LayerUnits {
    fn new(layers: &[&QLinear]) -> LayerUnits {
        let (mut unit_start, mut row_start) = (vec![0], vec![0]);
        for l in layers {
            unit_start.push(unit_start[unit_start.len() - 1] + l.out_features.div_ceil(UNIT_ROWS));
            row_start.push(row_start[row_start.len() - 1] + l.out_features);
        }
        LayerUnits { unit_start, row_start }
    }

    fn total(&self) -> usize {
        self.unit_start[self.unit_start.len() - 1]
    }

    /// The layer of unit `u` (the number of layers for the end).
    fn layer_of(&self, u: usize) -> usize {
        self.unit_start.partition_point(|&s| s <= u) - 1
    }

    /// Where unit `u` starts among all the layers' rows (the total for the end).
    fn first_row(&self, u: usize) -> usize {
        let j = self.layer_of(u);
        match self.row_start.get(j + 1) {
            Some(&next) => next.min(self.row_start[j] + (u - self.unit_start[j]) * UNIT_ROWS),
            None => self.row_start[j],
        }
    }

    /// `units` split at the layers' ends: each layer's part, as the layer and its rows
    /// within that layer.
    fn rows_of(&self, units: std::ops::Range<usize>) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + '_ {
        (self.layer_of(units.start)..self.unit_start.len() - 1)
            .take_while(move |&j| self.unit_start[j] < units.end)
            .map(move |j| {
                let (from, to) = (units.start.max(self.unit_start[j]), units.end.min(self.unit_start[j + 1]));
                let rows = self.row_start[j + 1] - self.row_start[j];
                (j, (from - self.unit_start[j]) * UNIT_ROWS..rows.min((to - self.unit_start[j]) * UNIT_ROWS))
            })
    }
}

/// One decode step's product of an activation row with several layers' weights, owning
/// what it reads (the weights by `Arc`, the quantized row in its own buffers) so that the
/// pool may run it detached: its outputs are the layers' outputs one after the other.
struct DecodeRows {
    isa: Isa,
    nb: usize,
    qs: Vec<i8>,
    ds: Vec<[f32; 2]>,
    layers: Vec<DecodeLayer>,
    units: LayerUnits,
}

struct DecodeLayer {
    /// Keeps `data` alive.
    _w: Weight,
    data: SendPtr<u8>,
    kind: Kind,
}

impl DecodeRows {
    fn new(layers: &[&QLinear], isa: Isa, x: &[f32]) -> Result<DecodeRows> {
        let k = x.len();
        let nb = k / QK;
        let (mut qs, mut ds) = (vec![0i8; k], vec![[0f32; 2]; nb]);
        isa.quantize_row(x, &mut qs, &mut ds, ActFormat::for_kinds(layers.iter().map(|l| l.kind())));
        let mut owned = Vec::with_capacity(layers.len());
        for l in layers {
            assert_eq!(l.in_features, k);
            let data = l.w.bytes()?;
            debug_assert_eq!(data.len(), l.out_features * l.kind().row_bytes(nb));
            owned.push(DecodeLayer {
                // CPU storage or the mapping: `data` borrows bytes alive as long as `_w`.
                data: SendPtr(data.as_ptr() as *mut u8),
                _w: l.w.clone(),
                kind: l.kind(),
            });
        }
        Ok(DecodeRows { isa, nb, qs, ds, layers: owned, units: LayerUnits::new(layers) })
    }
}

impl pool::Detachable for DecodeRows {
    fn items(&self) -> usize {
        self.units.total()
    }

    fn outputs(&self) -> usize {
        self.units.first_row(self.units.total())
    }

    fn output_range(&self, units: std::ops::Range<usize>) -> std::ops::Range<usize> {
        self.units.first_row(units.start)..self.units.first_row(units.end)
    }

    fn compute(&self, units: std::ops::Range<usize>, out: &mut [f32]) {
        let base = self.units.first_row(units.start);
        assert_eq!(out.len(), self.units.first_row(units.end) - base);
        let acts = Acts { qs: &self.qs, ds: &self.ds, m: 1, nb: self.nb, interleaved: false };
        for (j, rows) in self.units.rows_of(units) {
            let l = &self.layers[j];
            let row_bytes = l.kind.row_bytes(self.nb);
            // SAFETY: layer j's weight holds its rows of nb blocks of its kind (checked at
            // construction) and `_w` keeps it alive; `rows` lie within them; their outputs
            // are `out[row_start[j] + rows.start - base ..][..rows.len()]`, inside `out`
            // (asserted above); `isa` came from `Isa::detect` (or is scalar).
            unsafe {
                let w = l.data.get().add(rows.start * row_bytes);
                let dst = out.as_mut_ptr().add(self.units.row_start[j] + rows.start - base);
                self.isa.rows(l.kind, w, self.nb, 0..rows.len(), &acts, dst, rows.len());
            }
        }
    }
}

/// Quantizes `x`'s rows into `qs`/`ds`, across the pool when there are many.
fn quantize_rows(isa: Isa, act: ActFormat, interleaved: bool, x: &[f32], k: usize, qs: &mut [i8], ds: &mut [[f32; 2]]) {
    let m = x.len() / k;
    let nb = k / QK;
    let quantize_row = |x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]]| {
        isa.quantize_row(x, qs, ds, act);
        if interleaved {
            if isa == Isa::Avx512Vnni {
                blocks::interleave_super_blocks(qs);
            } else {
                blocks::interleave_blocks(qs);
            }
        }
    };
    if x.len() < PAR_MIN_QUANT || m == 1 {
        for ((x, qs), ds) in x.chunks_exact(k).zip(qs.chunks_exact_mut(k)).zip(ds.chunks_exact_mut(nb)) {
            quantize_row(x, qs, ds);
        }
        return;
    }
    let (qs_ptr, ds_ptr) = (SendPtr(qs.as_mut_ptr()), SendPtr(ds.as_mut_ptr()));
    pool::global().run(m, |rows| {
        for i in rows {
            // SAFETY: row i's quants and scales are disjoint from every other row's.
            let (qs, ds) = unsafe {
                (
                    std::slice::from_raw_parts_mut(qs_ptr.get().add(i * k), k),
                    std::slice::from_raw_parts_mut(ds_ptr.get().add(i * nb), nb),
                )
            };
            quantize_row(&x[i * k..(i + 1) * k], qs, ds);
        }
    });
}

/// Runs `f` on this thread's reusable activation buffers (`qs_len` quants, `ds_len` scale
/// pairs), so steady-state forwards allocate nothing but their outputs.
fn with_scratch<R>(qs_len: usize, ds_len: usize, f: impl FnOnce(&mut [i8], &mut [[f32; 2]]) -> R) -> R {
    thread_local! {
        static SCRATCH: RefCell<(Vec<i8>, Vec<[f32; 2]>)> =
            const { RefCell::new((Vec::new(), Vec::new())) };
    }
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => {
            let (qs, ds) = &mut *s;
            if qs.len() < qs_len {
                qs.resize(qs_len, 0);
            }
            if ds.len() < ds_len {
                ds.resize(ds_len, [0.0; 2]);
            }
            f(&mut qs[..qs_len], &mut ds[..ds_len])
        }
        // re-entered on this thread: use fresh buffers
        Err(_) => f(&mut vec![0; qs_len], &mut vec![[0.0; 2]; ds_len]),
    })
}
