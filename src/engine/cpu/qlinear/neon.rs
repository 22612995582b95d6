//! aarch64 kernels (Apple A-series / M-series): NEON with the `sdot` dot-product
//! instruction when the CPU has it (A11+/M1+; detected at run time, because the
//! `aarch64-apple-ios` target does not enable it by default), plain NEON widening
//! multiplies otherwise. `vdotq_s32` is still unstable in Rust, so `sdot` is emitted
//! with inline assembly, as candle does.
//!
//! Per 32-value block the dot product is split into two 16-lane halves (low and high
//! nibbles for Q4_1), giving four i32 partial sums; four blocks' sums, pairwise added, are
//! converted and scaled in f32 by one instruction each. Q4_K and Q6_K keep a super-block in
//! integers: the activations share one scale over its 256 values (`ActScale::SuperBlock`),
//! so each sub-block's dot product is multiplied by its integer scale and summed in i32,
//! and only the super-block's sum is converted and scaled in f32. f16 scales convert with
//! FCVT/FCVTL, which base ARMv8 has.
//!
//! Speed here is counted in instructions under qemu (`bench/neon_insns.sh`): there is no
//! ARM machine to time them on.

#![allow(clippy::missing_safety_doc)]

use super::blocks::{
    drive, ActScale, Acts, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8_0, TileKernel, QK, QK_K,
};
use std::arch::aarch64::*;
use std::marker::PhantomData;

/// `h` as f32, with FCVT: base ARMv8 floating point, one instruction. (`half` asks at run
/// time, on every call, whether the CPU has FEAT_FP16, which neither aarch64-apple-ios nor
/// aarch64-unknown-linux-gnu enables at compile time, and converts in software without it:
/// tens of instructions per block scale.)
#[inline(always)]
unsafe fn f32_of(h: half::f16) -> f32 {
    let out: f32;
    std::arch::asm!(
        "fcvt {out:s}, {h:h}",
        out = lateout(vreg) out,
        h = in(vreg) h.to_bits() as i16,
        options(pure, nomem, nostack, preserves_flags)
    );
    out
}

/// `x` rounded to the nearest f16 (ties to even, as `half::f16::from_f32`) and back, with
/// two FCVTs.
#[inline(always)]
unsafe fn round_f16(x: f32) -> f32 {
    let out: f32;
    std::arch::asm!(
        "fcvt {x:h}, {x:s}",
        "fcvt {x:s}, {x:h}",
        x = inout(vreg) x => out,
        options(pure, nomem, nostack, preserves_flags)
    );
    out
}

/// Four i32 partial sums of `a . b` over 32 signed bytes given as two 16-byte halves.
trait DotI8 {
    unsafe fn dot(a0: int8x16_t, b0: int8x16_t, a1: int8x16_t, b1: int8x16_t) -> int32x4_t;
    /// Four i32 partial sums of `a . b` over 16 signed bytes.
    unsafe fn dot16(a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// `sdot` (ARMv8.2 dot product).
struct Sdot;
impl DotI8 for Sdot {
    #[inline(always)]
    unsafe fn dot(a0: int8x16_t, b0: int8x16_t, a1: int8x16_t, b1: int8x16_t) -> int32x4_t {
        let mut acc = vdupq_n_s32(0);
        std::arch::asm!(
            "sdot {acc:v}.4s, {a0:v}.16b, {b0:v}.16b",
            "sdot {acc:v}.4s, {a1:v}.16b, {b1:v}.16b",
            acc = inout(vreg) acc,
            a0 = in(vreg) a0,
            b0 = in(vreg) b0,
            a1 = in(vreg) a1,
            b1 = in(vreg) b1,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }
    #[inline(always)]
    unsafe fn dot16(a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let mut acc = vdupq_n_s32(0);
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }
}

/// Baseline NEON: widening multiplies and pairwise adds (|products| < 2^15, exact).
struct Mull;
impl DotI8 for Mull {
    #[inline(always)]
    unsafe fn dot(a0: int8x16_t, b0: int8x16_t, a1: int8x16_t, b1: int8x16_t) -> int32x4_t {
        let p0 = vmull_s8(vget_low_s8(a0), vget_low_s8(b0));
        let p1 = vmull_high_s8(a0, b0);
        let p2 = vmull_s8(vget_low_s8(a1), vget_low_s8(b1));
        let p3 = vmull_high_s8(a1, b1);
        let s = vpaddlq_s16(p0);
        let s = vpadalq_s16(s, p1);
        let s = vpadalq_s16(s, p2);
        vpadalq_s16(s, p3)
    }
    #[inline(always)]
    unsafe fn dot16(a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let p1 = vmull_high_s8(a, b);
        vpadalq_s16(vpaddlq_s16(p0), p1)
    }
}

/// A 32-value block format: its quants as bytes (two 16-byte halves, in the order of the
/// activation bytes; signed, or Q4_1's 0..=15) under an f16 scale `d` that starts the block
/// (`w = d · q`), and for Q4_1 an f16 offset `m` right after it (`w = d · q + m`).
pub(super) trait Block32 {
    type Block;
    /// Whether the block has the offset `m` (at byte 2).
    const MIN: bool = false;
    unsafe fn quants(blk: &Self::Block) -> (int8x16_t, int8x16_t);
}

const _: () = assert!(
    std::mem::offset_of!(BlockQ4_1, d) == 0
        && std::mem::offset_of!(BlockQ4_1, m) == 2
        && std::mem::offset_of!(BlockQ8_0, d) == 0
        && std::mem::offset_of!(BlockQ4_0, d) == 0
        && std::mem::offset_of!(BlockQ5_0, d) == 0
);

/// The f16 at byte `at` of four consecutive blocks of `stride` bytes from `p`, as f32:
/// four lane loads and one FCVTL (base ARMv8 Advanced SIMD).
#[inline(always)]
unsafe fn f16x4(p: *const u8, stride: usize, at: usize) -> float32x4_t {
    let h = vld1_dup_u16(p.add(at) as *const u16);
    let h = vld1_lane_u16::<1>(p.add(stride + at) as *const u16, h);
    let h = vld1_lane_u16::<2>(p.add(2 * stride + at) as *const u16, h);
    let h = vld1_lane_u16::<3>(p.add(3 * stride + at) as *const u16, h);
    let out: float32x4_t;
    std::arch::asm!(
        "fcvtl {out:v}.4s, {h:v}.4h",
        out = lateout(vreg) out,
        h = in(vreg) h,
        options(pure, nomem, nostack, preserves_flags)
    );
    out
}

/// The f16 at byte `at` of the block at `p`, as f32.
#[inline(always)]
unsafe fn f16_at(p: *const u8, at: usize) -> f32 {
    f32_of(half::f16::from_bits(std::ptr::read_unaligned(p.add(at) as *const u16)))
}

impl Block32 for BlockQ4_1 {
    type Block = BlockQ4_1;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn quants(blk: &BlockQ4_1) -> (int8x16_t, int8x16_t) {
        let raw = vld1q_u8(blk.qs.as_ptr());
        (vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))), vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)))
    }
}

impl Block32 for BlockQ8_0 {
    type Block = BlockQ8_0;
    #[inline(always)]
    unsafe fn quants(blk: &BlockQ8_0) -> (int8x16_t, int8x16_t) {
        (vld1q_s8(blk.qs.as_ptr()), vld1q_s8(blk.qs.as_ptr().add(QK / 2)))
    }
}

impl Block32 for BlockQ4_0 {
    type Block = BlockQ4_0;
    #[inline(always)]
    unsafe fn quants(blk: &BlockQ4_0) -> (int8x16_t, int8x16_t) {
        let raw = vld1q_u8(blk.qs.as_ptr());
        let eight = vdupq_n_s8(8);
        (
            vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))), eight),
            vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)), eight),
        )
    }
}

impl Block32 for BlockQ5_0 {
    type Block = BlockQ5_0;
    /// The fifth bits: the four `qh` bytes spread so that byte `i` of each half holds the
    /// `qh` byte of its bit, tested against bit `i % 8`; a quant is its nibble less 16 where
    /// the bit is clear.
    #[inline(always)]
    unsafe fn quants(blk: &BlockQ5_0) -> (int8x16_t, int8x16_t) {
        let raw = vld1q_u8(blk.qs.as_ptr());
        let qh = vreinterpretq_u8_u32(vdupq_n_u32(std::ptr::read_unaligned(blk.qh.as_ptr() as *const u32)));
        let bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
        let spread = |first: u64| {
            let idx = vreinterpretq_u8_u64(vcombine_u64(vdup_n_u64(first), vdup_n_u64(first + 0x0101_0101_0101_0101)));
            vtstq_u8(vqtbl1q_u8(qh, idx), bits)
        };
        let sixteen = vdupq_n_u8(16);
        let less =
            |nibbles: uint8x16_t, set: uint8x16_t| vreinterpretq_s8_u8(vsubq_u8(nibbles, vbicq_u8(sixteen, set)));
        (less(vandq_u8(raw, vdupq_n_u8(0x0F)), spread(0)), less(vshrq_n_u8::<4>(raw), spread(0x0202_0202_0202_0202)))
    }
}

/// Tiles of 32-value block formats (Q4_1, Q8_0, Q4_0, Q5_0) against Q8_0 activations, four
/// blocks at a time. Each block's dot product is four i32 partial sums; pairwise adding
/// the four blocks' twice gives one vector of the four blocks' sums, which one convert and
/// one multiply-add scale:
///
/// ```text
///   acc += f32([dot_0, dot_1, dot_2, dot_3]) · [d_w · d_a]_0..4  (+ [m_w]_0..4 · [s_a]_0..4 for Q4_1)
/// ```
///
/// The last `nb % 4` blocks go one at a time.
pub(super) struct Blocks<W, D>(PhantomData<(W, D)>);

impl<W: Block32, D: DotI8> TileKernel for Blocks<W, D> {
    type Block = W::Block;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const W::Block; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        let stride = std::mem::size_of::<W::Block>();
        let mut acc = [[vdupq_n_f32(0.0); C]; R];
        let mut b = 0;
        while b + 4 <= nb {
            // after block i: `one` holds block 0's (2's) sums, `sums` the pairwise sums so far
            let mut one = [[vdupq_n_s32(0); C]; R];
            let mut sums = [[vdupq_n_s32(0); C]; R];
            // (a macro, so that each block's step is its own straight-line code)
            macro_rules! block {
                ($i:literal) => {{
                    let x: [(int8x16_t, int8x16_t); R] = std::array::from_fn(|r| W::quants(&*w[r].add(b + $i)));
                    for c in 0..C {
                        let y = qs[c].add((b + $i) * QK);
                        let (y0, y1) = (vld1q_s8(y), vld1q_s8(y.add(QK / 2)));
                        for r in 0..R {
                            let dot = D::dot(x[r].0, y0, x[r].1, y1);
                            match $i {
                                0 | 2 => one[r][c] = dot,
                                1 => sums[r][c] = vpaddq_s32(one[r][c], dot),
                                _ => sums[r][c] = vpaddq_s32(sums[r][c], vpaddq_s32(one[r][c], dot)),
                            }
                        }
                    }
                }};
            }
            block!(0);
            block!(1);
            block!(2);
            block!(3);
            let dw: [float32x4_t; R] = std::array::from_fn(|r| f16x4(w[r].add(b) as *const u8, stride, 0));
            let mw: [float32x4_t; R] =
                std::array::from_fn(
                    |r| if W::MIN { f16x4(w[r].add(b) as *const u8, stride, 2) } else { vdupq_n_f32(0.0) },
                );
            for c in 0..C {
                // (d_a, s_a) of the four blocks, deinterleaved
                let da = vld2q_f32(ds[c].add(b) as *const f32);
                for r in 0..R {
                    acc[r][c] = vfmaq_f32(acc[r][c], vcvtq_f32_s32(sums[r][c]), vmulq_f32(dw[r], da.0));
                    if W::MIN {
                        acc[r][c] = vfmaq_f32(acc[r][c], mw[r], da.1);
                    }
                }
            }
            b += 4;
        }
        let mut tail = [[0f32; C]; R];
        while b < nb {
            let x: [(int8x16_t, int8x16_t); R] = std::array::from_fn(|r| W::quants(&*w[r].add(b)));
            let dw: [f32; R] = std::array::from_fn(|r| f16_at(w[r].add(b) as *const u8, 0));
            let mw: [f32; R] = std::array::from_fn(|r| if W::MIN { f16_at(w[r].add(b) as *const u8, 2) } else { 0.0 });
            for c in 0..C {
                let y = qs[c].add(b * QK);
                let (y0, y1) = (vld1q_s8(y), vld1q_s8(y.add(QK / 2)));
                let [dy, sy] = *ds[c].add(b);
                for r in 0..R {
                    let p = vcvtq_f32_s32(D::dot(x[r].0, y0, x[r].1, y1));
                    acc[r][c] = vfmaq_n_f32(acc[r][c], p, dw[r] * dy);
                    tail[r][c] += mw[r] * sy;
                }
            }
            b += 1;
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                out[r][c] = vaddvq_f32(acc[r][c]) + tail[r][c];
            }
        }
        out
    }
}

/// Q6_K tiles against Q8_0 activations, 64 values (two 32-value blocks) at a time. Within
/// each 128-value half of a super-block, blocks `2p` and `2p + 1` take their low four bits
/// from the same 64 `ql` bytes (low nibbles for p = 0, high for p = 1) and their top two
/// from the same 32 `qh` bytes, so one shift-and-insert (`vsliq_n_u8`) per 16 values
/// rebuilds the quants. Their four 16-value dot products, pairwise added twice, are one
/// vector of four sums whose four scales are consecutive bytes of `scales`:
///
/// ```text
///   sum  += [dot_0, dot_1, dot_2, dot_3] · [sc_4p', …, sc_4p'+3]     i32, per super-block
///   acc  += f32(sum) · d · d_a                                        once per super-block
/// ```
///
/// (The activations share one `d_a` over a super-block, `ActScale::SuperBlock`. |sum| per
/// lane stays under 16 · 16 · 32 · 127 · 128 < 2^31.)
pub(super) struct Q6K<D>(PhantomData<D>);

/// The 64 quants less 32 of blocks `2P`, `2P + 1` of half `h` of `blk`, as four 16-byte
/// vectors in the order of their activations.
#[inline(always)]
unsafe fn q6k_pair<const P: usize>(blk: &BlockQ6K, h: usize) -> [int8x16_t; 4] {
    let (ql, qh) = (blk.ql.as_ptr().add(64 * h), blk.qh.as_ptr().add(32 * h));
    let three = vdupq_n_u8(3);
    let (h0, h1) = (vld1q_u8(qh), vld1q_u8(qh.add(16)));
    let low: [uint8x16_t; 4] = std::array::from_fn(|i| vld1q_u8(ql.add(16 * i)));
    let q = if P == 0 {
        // low nibbles; top bits 0-1 (block 2P) and 2-3 (block 2P + 1) of qh
        [
            vsliq_n_u8::<4>(low[0], vandq_u8(h0, three)),
            vsliq_n_u8::<4>(low[1], vandq_u8(h1, three)),
            vsliq_n_u8::<4>(low[2], vandq_u8(vshrq_n_u8::<2>(h0), three)),
            vsliq_n_u8::<4>(low[3], vandq_u8(vshrq_n_u8::<2>(h1), three)),
        ]
    } else {
        // high nibbles; top bits 4-5 and 6-7
        [
            vsliq_n_u8::<4>(vshrq_n_u8::<4>(low[0]), vandq_u8(vshrq_n_u8::<4>(h0), three)),
            vsliq_n_u8::<4>(vshrq_n_u8::<4>(low[1]), vandq_u8(vshrq_n_u8::<4>(h1), three)),
            vsliq_n_u8::<4>(vshrq_n_u8::<4>(low[2]), vshrq_n_u8::<6>(h0)),
            vsliq_n_u8::<4>(vshrq_n_u8::<4>(low[3]), vshrq_n_u8::<6>(h1)),
        ]
    };
    q.map(|v| vsubq_s8(vreinterpretq_s8_u8(v), vdupq_n_s8(32)))
}

impl<D: DotI8> TileKernel for Q6K<D> {
    type Block = BlockQ6K;
    const BLOCKS_PER: usize = 8;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const BlockQ6K; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        let mut acc = [[vdupq_n_f32(0.0); C]; R];
        for sb in 0..nb / Self::BLOCKS_PER {
            // each weight row's sixteen scales as i32, read back four at a time
            let mut sc = [[0i32; 16]; R];
            for r in 0..R {
                let bytes = vld1q_s8((*w[r].add(sb)).scales.as_ptr());
                let (lo, hi) = (vmovl_s8(vget_low_s8(bytes)), vmovl_high_s8(bytes));
                let p = sc[r].as_mut_ptr();
                vst1q_s32(p, vmovl_s16(vget_low_s16(lo)));
                vst1q_s32(p.add(4), vmovl_high_s16(lo));
                vst1q_s32(p.add(8), vmovl_s16(vget_low_s16(hi)));
                vst1q_s32(p.add(12), vmovl_high_s16(hi));
            }
            let mut sum = [[vdupq_n_s32(0); C]; R];
            macro_rules! pair {
                ($h:literal, $p:literal) => {{
                    let x: [[int8x16_t; 4]; R] = std::array::from_fn(|r| q6k_pair::<$p>(&*w[r].add(sb), $h));
                    // blocks 4h + 2p and 4h + 2p + 1 of the super-block: 64 activation bytes
                    let at = sb * QK_K + 128 * $h + 64 * $p;
                    for c in 0..C {
                        let y: [int8x16_t; 4] = std::array::from_fn(|i| vld1q_s8(qs[c].add(at + 16 * i)));
                        for r in 0..R {
                            let first = vpaddq_s32(D::dot16(x[r][0], y[0]), D::dot16(x[r][1], y[1]));
                            let second = vpaddq_s32(D::dot16(x[r][2], y[2]), D::dot16(x[r][3], y[3]));
                            let scales = vld1q_s32(sc[r].as_ptr().add(8 * $h + 4 * $p));
                            sum[r][c] = vmlaq_s32(sum[r][c], vpaddq_s32(first, second), scales);
                        }
                    }
                }};
            }
            pair!(0, 0);
            pair!(0, 1);
            pair!(1, 0);
            pair!(1, 1);
            let dw: [f32; R] = std::array::from_fn(|r| f32_of((*w[r].add(sb)).d));
            for c in 0..C {
                let da = (*ds[c].add(sb * Self::BLOCKS_PER))[0];
                for r in 0..R {
                    acc[r][c] = vfmaq_n_f32(acc[r][c], vcvtq_f32_s32(sum[r][c]), dw[r] * da);
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                out[r][c] = vaddvq_f32(acc[r][c]);
            }
        }
        out
    }
}

/// Q4_K tiles against Q8_0 activations, in the file's layout: a 64-value group's 32 bytes,
/// masked and shifted, are its two sub-blocks. Each sub-block's dot product times its
/// 6-bit scale `sc_j` is summed in i32 over the super-block, and once per super-block
///
/// ```text
///   acc += f32(sum) · d · d_a  -  Σ_j dmin · m_j · s_a_j
/// ```
///
/// (the activations share one `d_a` over a super-block, `ActScale::SuperBlock`; the
/// offsets take two vector multiply-adds of -dmin · m_j). |sum| per lane stays under
/// 8 · 8 · 15 · 127 · 63 < 2^31.
pub(super) struct Q4K<D>(PhantomData<D>);

/// [`BlockQ4K::scales_mins`] in one register, computed there (as `avx2::q4k_scales_mins`):
/// the eight 6-bit scales in bytes 0..8, the mins in 8..16.
#[inline(always)]
pub(super) unsafe fn q4k_scales_mins(blk: *const BlockQ4K) -> uint8x16_t {
    use super::blocks::q4k_scale_tables::{KEEP, KEEP_SHIFTED, LOW, TOP};
    // the 12 bytes q0..q12 of `scales` (and 4 bytes of `qs`, unused)
    let q = vld1q_u8((*blk).scales.as_ptr());
    let low = vqtbl1q_u8(q, vld1q_u8(LOW.as_ptr()));
    let top = vqtbl1q_u8(q, vld1q_u8(TOP.as_ptr()));
    let low = vorrq_u8(
        vandq_u8(low, vld1q_u8(KEEP.as_ptr())),
        vandq_u8(vshrq_n_u8::<4>(low), vld1q_u8(KEEP_SHIFTED.as_ptr())),
    );
    vorrq_u8(low, vshlq_n_u8::<4>(vshrq_n_u8::<6>(top)))
}

/// Eight 6-bit values (bytes) times `x`, as two f32 vectors.
#[inline(always)]
unsafe fn scaled_bytes(v: uint8x8_t, x: f32) -> [float32x4_t; 2] {
    let h = vmovl_u8(v);
    [vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(h))), x), vmulq_n_f32(vcvtq_f32_u32(vmovl_high_u16(h)), x)]
}

impl<D: DotI8> TileKernel for Q4K<D> {
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
        let mask = vdupq_n_u8(0x0F);
        let mut acc = [[vdupq_n_f32(0.0); C]; R];
        for b in 0..nb {
            // each weight row's scales and mins, unpacked, read back as bytes
            let mut sm = [[0u8; 16]; R];
            for r in 0..R {
                vst1q_u8(sm[r].as_mut_ptr(), q4k_scales_mins(w[r].add(b)));
            }
            let mut sum = [[vdupq_n_s32(0); C]; R];
            for g in 0..QK_K / 64 {
                let mut lo = [[vdupq_n_s8(0); 2]; R];
                let mut hi = [[vdupq_n_s8(0); 2]; R];
                for r in 0..R {
                    let q = (*w[r].add(b)).qs.as_ptr().add(QK * g);
                    let (raw0, raw1) = (vld1q_u8(q), vld1q_u8(q.add(16)));
                    lo[r] = [vreinterpretq_s8_u8(vandq_u8(raw0, mask)), vreinterpretq_s8_u8(vandq_u8(raw1, mask))];
                    hi[r] = [vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw0)), vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw1))];
                }
                for c in 0..C {
                    let a = qs[c].add(b * QK_K + 2 * QK * g);
                    let y: [int8x16_t; 4] = std::array::from_fn(|i| vld1q_s8(a.add(16 * i)));
                    for r in 0..R {
                        let (sc0, sc1) = (sm[r][2 * g] as i32, sm[r][2 * g + 1] as i32);
                        sum[r][c] = vmlaq_n_s32(sum[r][c], D::dot(lo[r][0], y[0], lo[r][1], y[1]), sc0);
                        sum[r][c] = vmlaq_n_s32(sum[r][c], D::dot(hi[r][0], y[2], hi[r][1], y[3]), sc1);
                    }
                }
            }
            // the scaled sums, less the offsets Σ dmin · m_j · s_a_j (computed here, after
            // the groups, so that nothing of them stays live across the groups' registers)
            for r in 0..R {
                let blk = &*w[r].add(b);
                // -dmin · m_j, so that the offsets are multiply-adds
                let (dw, dmn) = (f32_of(blk.d), scaled_bytes(vld1_u8(sm[r].as_ptr().add(8)), -f32_of(blk.dmin)));
                for c in 0..C {
                    let p = ds[c].add(b * Self::BLOCKS_PER) as *const f32;
                    // (d_a, s_a) of sub-blocks 0..4 and 4..8, deinterleaved
                    let (lo, hi) = (vld2q_f32(p), vld2q_f32(p.add(8)));
                    acc[r][c] = vfmaq_f32(acc[r][c], dmn[0], lo.1);
                    acc[r][c] = vfmaq_f32(acc[r][c], dmn[1], hi.1);
                    acc[r][c] = vfmaq_n_f32(acc[r][c], vcvtq_f32_s32(sum[r][c]), dw * vgetq_lane_f32::<0>(lo.0));
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                out[r][c] = vaddvq_f32(acc[r][c]);
            }
        }
        out
    }
}

#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn q4k_rows_dot(
    w: *const BlockQ4K,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Q4K<Sdot>>(w, nb, rows, acts, dst, ldd)
}

#[target_feature(enable = "neon")]
pub(super) unsafe fn q4k_rows(
    w: *const BlockQ4K,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Q4K<Mull>>(w, nb, rows, acts, dst, ldd)
}

#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn q4_1_rows_dot(
    w: *const BlockQ4_1,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Blocks<BlockQ4_1, Sdot>>(w, nb, rows, acts, dst, ldd)
}

#[target_feature(enable = "neon")]
pub(super) unsafe fn q4_1_rows(
    w: *const BlockQ4_1,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Blocks<BlockQ4_1, Mull>>(w, nb, rows, acts, dst, ldd)
}

#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn q8_0_rows_dot(
    w: *const BlockQ8_0,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Blocks<BlockQ8_0, Sdot>>(w, nb, rows, acts, dst, ldd)
}

#[target_feature(enable = "neon")]
pub(super) unsafe fn q8_0_rows(
    w: *const BlockQ8_0,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Blocks<BlockQ8_0, Mull>>(w, nb, rows, acts, dst, ldd)
}

#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn q4_0_rows_dot(
    w: *const BlockQ4_0,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Blocks<BlockQ4_0, Sdot>>(w, nb, rows, acts, dst, ldd)
}

#[target_feature(enable = "neon")]
pub(super) unsafe fn q4_0_rows(
    w: *const BlockQ4_0,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Blocks<BlockQ4_0, Mull>>(w, nb, rows, acts, dst, ldd)
}

#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn q5_0_rows_dot(
    w: *const BlockQ5_0,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Blocks<BlockQ5_0, Sdot>>(w, nb, rows, acts, dst, ldd)
}

#[target_feature(enable = "neon")]
pub(super) unsafe fn q5_0_rows(
    w: *const BlockQ5_0,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Blocks<BlockQ5_0, Mull>>(w, nb, rows, acts, dst, ldd)
}

#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn q6_k_rows_dot(
    w: *const BlockQ6K,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Q6K<Sdot>>(w, nb, rows, acts, dst, ldd)
}

#[target_feature(enable = "neon")]
pub(super) unsafe fn q6_k_rows(
    w: *const BlockQ6K,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Q6K<Mull>>(w, nb, rows, acts, dst, ldd)
}

/// NEON twin of [`super::scalar::quantize_row`], bit-identical to it (`vrndaq_f32` rounds
/// half away from zero, as `f32::round` does).
#[target_feature(enable = "neon")]
pub(super) unsafe fn quantize_row(x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]], with_sum: bool, scale: ActScale) {
    debug_assert_eq!(x.len(), qs.len());
    debug_assert_eq!(x.len(), ds.len() * QK);
    let per = scale.values() / QK;
    for (span, ds) in ds.chunks_exact_mut(per).enumerate() {
        let first = span * per;
        let mut amax = 0f32;
        for b in first..first + per {
            let xp = x.as_ptr().add(b * QK);
            let mut a = vabsq_f32(vld1q_f32(xp));
            for j in 1..8 {
                a = vmaxq_f32(a, vabsq_f32(vld1q_f32(xp.add(4 * j))));
            }
            amax = amax.max(vmaxvq_f32(a));
        }
        for (b, ds) in (first..).zip(ds.iter_mut()) {
            *ds = quantize_block(x.as_ptr().add(b * QK), amax, qs.as_mut_ptr().add(b * QK), with_sum);
        }
    }
}

/// The 32 values at `xp` quantized with the `amax` of their span into `qp`; returns
/// `(d, s)` (see [`super::scalar::quantize_row`]).
#[inline(always)]
unsafe fn quantize_block(xp: *const f32, amax: f32, qp: *mut i8, with_sum: bool) -> [f32; 2] {
    let v: [float32x4_t; 8] = std::array::from_fn(|j| vld1q_f32(xp.add(4 * j)));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q: [int32x4_t; 8] = std::array::from_fn(|j| vcvtq_s32_f32(vrndaq_f32(vmulq_n_f32(v[j], id))));
    let sum = if with_sum {
        let s = q.iter().fold(vdupq_n_s32(0), |s, qj| vaddq_s32(s, *qj));
        vaddvq_s32(s)
    } else {
        0
    };
    let h: [int16x8_t; 4] = std::array::from_fn(|j| vcombine_s16(vmovn_s32(q[2 * j]), vmovn_s32(q[2 * j + 1])));
    vst1q_s8(qp, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
    vst1q_s8(qp.add(16), vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));

    // as ggml stores them: d in f16, and s = f16(f16(sum) · d)
    let dh = round_f16(d);
    let s = if with_sum { round_f16(round_f16(sum as f32) * dh) } else { 0.0 };
    [dh, s]
}
