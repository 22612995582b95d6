//! x86-64 AVX-512 kernels (AVX-512 F/BW/VNNI: Ice Lake, Zen 4 and later) for Q4_1, Q4_K,
//! Q6_K and the signed formats Q8_0, Q4_0, Q5_0: two 32-value blocks per 512-bit register.
//! Each is described at its type; Q4_1 and Q4_K here.
//!
//! Q4_1, per block pair, for each weight row × activation row of the tile:
//!
//! ```text
//!   dot   = vpdpbusd(weight nibbles, activation bytes)     16 × i32, lanes 0-7 block b, 8-15 block b+1
//!   acc  += f32(dot) · (d_w · d_a spread over those lanes)
//!   acc  += m_w · s_a                                       in lanes 1 and 3 only (masked FMA)
//! ```
//!
//! Five instructions per 64 multiply-adds where the AVX2 kernel spends six per 32: the
//! Q4_1 offset term rides in two spare lanes of the accumulator instead of a register of
//! its own, and the tile's 16 lanes are summed once at the end.
//!
//! Q4_K, in the file's layout: a 64-value group's 32 bytes, broadcast to both halves of a
//! register and the upper half shifted right by 4, are the group's two sub-blocks in the
//! order of their 64 activation bytes. Per super-block, weight row and activation row:
//!
//! ```text
//!   f     = [d·sc_j, dmin·m_j]_j · [d_a, s_a]_j              16 lanes, one multiply
//!   acc  -= f                                               odd lanes: the offsets
//!   per group g:
//!   acc  += f32(vpdpbusd(nibbles, activation bytes)) · (f's d·sc·d_a of 2g, 2g+1 spread)
//! ```
//!
//! Prefill against interleaved activations (Q4_K, Q6_K, and the signed formats' rows of
//! whole 256-value groups) runs on weights unpacked sixteen rows at a time
//! ([`row_groups`]); the interleaved kernels here take the rows after the last group.

#![allow(clippy::missing_safety_doc)]

use super::avx2::{prefetch_lead, q4k_scales_mins, q6k_d, signed_block_scales, SignedBlock};
use super::blocks::{
    drive, unpacked_rows, Acts, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8_0, TileKernel, Unpack, QK,
    QK_K,
};
use std::arch::x86_64::*;

mod row_groups;
/// Prefill on interleaved activations: sixteen rows at a time in [`row_groups`], the rest
/// by [`Q4KInterleaved`] and [`SignedInterleaved`].
pub(super) use row_groups::{
    q4_1_grouped_rows, q4k_file_rows, q4k_grouped_rows, q6k_file_rows, q6k_grouped_rows, signed_grouped_rows,
    GROUPED_MIN_ROWS, UNPACKED_MIN_ROWS,
};

/// The horizontal sums of a tile's accumulators. (Loops, not `map`: a closure is a
/// function of its own, compiled without the caller's AVX-512, and the reduction would not
/// be inlined.)
#[inline(always)]
unsafe fn sums<const R: usize, const C: usize>(acc: [[__m512; C]; R]) -> [[f32; C]; R] {
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
    out
}

/// A tile kernel that walks its rows two 32-value blocks (one register) at a time.
trait PairStep: TileKernel {
    /// Blocks `b` and `b + 1` (only `b` when `PAIR` is false) of every weight row against
    /// every activation row, into `acc`.
    unsafe fn step<const R: usize, const C: usize, const PAIR: bool>(
        acc: &mut [[__m512; C]; R],
        w: &[*const Self::Block; R],
        qs: &[*const i8; C],
        ds: &[*const [f32; 2]; C],
        b: usize,
        lead: usize,
    );
}

/// [`TileKernel::tile`] of a [`PairStep`] kernel: the pairs, then an odd last block in a
/// second instance of the step, so that the pairs' loop has no branch in it.
#[inline(always)]
unsafe fn pair_tile<K: PairStep, const R: usize, const C: usize>(
    w: [*const K::Block; R],
    qs: [*const i8; C],
    ds: [*const [f32; 2]; C],
    nb: usize,
) -> [[f32; C]; R] {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let lead = prefetch_lead(&w);
    let mut b = 0;
    while b + 1 < nb {
        K::step::<R, C, true>(&mut acc, &w, &qs, &ds, b, lead);
        b += 2;
    }
    if b < nb {
        K::step::<R, C, false>(&mut acc, &w, &qs, &ds, b, lead);
    }
    sums(acc)
}

thread_local! {
    /// This thread's unpacked weight rows of [`unpacked_rows`], one per block type.
    static UNPACKED_Q4K: std::cell::RefCell<Vec<UnpackedQ4K>> = const { std::cell::RefCell::new(Vec::new()) };
    static UNPACKED_SIGNED: std::cell::RefCell<Vec<UnpackedSigned>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct Q4_1;

/// `[d, m]` of block `b` and `[d, m]` of block `b + 1` (zeros when `pair` is false), as
/// `[d_b, m_b, d_b1, m_b1]` in f32.
#[inline(always)]
unsafe fn weight_scales(blk: *const BlockQ4_1, pair: bool) -> __m128 {
    let first = std::ptr::read_unaligned(blk as *const i32);
    let second = if pair { std::ptr::read_unaligned(blk.add(1) as *const i32) } else { 0 };
    _mm_cvtph_ps(_mm_setr_epi32(first, second, 0, 0))
}

/// The 32 (or 64) quants of block `b` (and `b + 1`), one byte (0..=15) each, in the
/// order of the activation bytes: per block, low nibbles then high nibbles; zeros for a
/// missing block.
#[inline(always)]
unsafe fn weight_quants(blk: *const BlockQ4_1, pair: bool) -> __m512i {
    let qs = (*blk).qs.as_ptr();
    nibble_pair(qs, qs.wrapping_add(size_of::<BlockQ4_1>()), pair)
}

/// The 16 bytes at `first` (and at `second` when `pair`) as 32 (64) nibbles, one byte
/// each: per block, the low nibbles then the high ones; zeros for a missing block.
#[inline(always)]
unsafe fn nibble_pair(first: *const u8, second: *const u8, pair: bool) -> __m512i {
    let low = _mm_loadu_si128(first as *const __m128i);
    let both = if pair {
        let high = _mm_loadu_si128(second as *const __m128i);
        _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(low), 0xFF00, high)
    } else {
        _mm512_maskz_broadcast_i32x4(0x00FF, low)
    };
    // in each block's 256 bits: the low half keeps the bytes, the high half shifts them
    // right by 4; the mask drops the bits shifted across
    let shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    _mm512_and_si512(_mm512_srlv_epi64(both, shift), _mm512_set1_epi8(0x0F))
}

impl PairStep for Q4_1 {
    #[inline(always)]
    unsafe fn step<const R: usize, const C: usize, const PAIR: bool>(
        acc: &mut [[__m512; C]; R],
        w: &[*const Self::Block; R],
        qs: &[*const i8; C],
        ds: &[*const [f32; 2]; C],
        b: usize,
        lead: usize,
    ) {
        // lanes 0-7 take element 0 (block b's scale), lanes 8-15 element 2 (block b+1's)
        let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
        let mut qx = [_mm512_setzero_si512(); R];
        let mut dm = [_mm512_setzero_ps(); R];
        let mut dw = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let blk = w[r].add(b);
            _mm_prefetch::<_MM_HINT_T0>((blk as *const i8).wrapping_add(lead));
            qx[r] = weight_quants(blk, PAIR);
            dm[r] = _mm512_zextps128_ps512(weight_scales(blk, PAIR));
            dw[r] = _mm512_permutexvar_ps(spread, dm[r]);
        }
        for c in 0..C {
            let (qy, dsa) = if PAIR {
                (_mm512_loadu_si512(qs[c].add(b * QK) as *const __m512i), _mm_loadu_ps(ds[c].add(b) as *const f32))
            } else {
                let qy = _mm256_loadu_si256(qs[c].add(b * QK) as *const __m256i);
                (_mm512_zextsi256_si512(qy), _mm_castpd_ps(_mm_load_sd(ds[c].add(b) as *const f64)))
            };
            // [d_a, s_a, d_a1, s_a1]
            let dsa = _mm512_zextps128_ps512(dsa);
            let da = _mm512_permutexvar_ps(spread, dsa);
            for r in 0..R {
                let dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qx[r], qy));
                acc[r][c] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw[r], da), acc[r][c]);
                // lanes 1 and 3: m_w · s_a of each block
                acc[r][c] = _mm512_mask3_fmadd_ps(dm[r], dsa, acc[r][c], 0b1010);
            }
        }
    }
}

impl TileKernel for Q4_1 {
    type Block = BlockQ4_1;
    /// 2 × 8 accumulators plus the row and column operands fit the 32 registers (measured:
    /// ~10% faster prefill matmuls than 2 × 4).
    const PREFILL_COLS: usize = 8;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const BlockQ4_1; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        pair_tile::<Self, R, C>(w, qs, ds, nb)
    }
}

tile_entry!(avx512, q4_1_rows, Q4_1, BlockQ4_1);

struct Q4K;

/// A super-block's `[d·sc_0, dmin·m_0, d·sc_1, dmin·m_1, …]`, the layout of the
/// activations' `(d_a, s_a)` pairs.
#[inline(always)]
unsafe fn q4k_weight_scales(blk: *const BlockQ4K) -> __m512 {
    let sm = q4k_scales_mins(blk);
    // [sc_0, m_0, sc_1, m_1, …]
    let pairs = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(sm, _mm_srli_si128::<8>(sm))));
    let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
    _mm512_mul_ps(pairs, _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_castps_pd(dd))))
}

/// Group `g`'s 32 bytes as 64 quants (0..=15): sub-block `2g` (low nibbles) in the lower
/// 256 bits, `2g + 1` (high nibbles) in the upper.
#[inline(always)]
unsafe fn q4k_group_quants(blk: *const BlockQ4K, g: usize) -> __m512i {
    let raw = _mm512_broadcast_i64x4(_mm256_loadu_si256((*blk).qs.as_ptr().add(QK * g) as *const __m256i));
    let shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    _mm512_and_si512(_mm512_srlv_epi64(raw, shift), _mm512_set1_epi8(0x0F))
}

impl TileKernel for Q4K {
    type Block = BlockQ4K;
    const BLOCKS_PER: usize = QK_K / QK;
    const PREFILL_COLS: usize = 8;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const BlockQ4K; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        // `nb` counts 32-value blocks; the loops below walk super-blocks.
        let nb = nb / Self::BLOCKS_PER;
        // group g's scale: lanes 0-7 take element 4g (d·sc·d_a of sub-block 2g), 8-15
        // element 4g + 2 (of sub-block 2g + 1)
        let spread: [__m512i; 4] = std::array::from_fn(|g| {
            let (a, b) = (4 * g as i32, 4 * g as i32 + 2);
            _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b)
        });
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let lead = prefetch_lead(&w);
        for b in 0..nb {
            let mut f = [[_mm512_setzero_ps(); C]; R];
            let mut wsc = [_mm512_setzero_ps(); R];
            for r in 0..R {
                let blk = w[r].add(b);
                let p = (blk as *const i8).wrapping_add(lead);
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128));
                wsc[r] = q4k_weight_scales(blk);
            }
            for c in 0..C {
                let dsa = _mm512_loadu_ps(ds[c].add(b * Self::BLOCKS_PER) as *const f32);
                for r in 0..R {
                    f[r][c] = _mm512_mul_ps(wsc[r], dsa);
                    // odd lanes: dmin·m_j·s_a
                    acc[r][c] = _mm512_mask_sub_ps(acc[r][c], 0xAAAA, acc[r][c], f[r][c]);
                }
            }
            for (g, spread) in spread.iter().enumerate() {
                let qx: [__m512i; R] = std::array::from_fn(|r| q4k_group_quants(w[r].add(b), g));
                for c in 0..C {
                    let qy = _mm512_loadu_si512(qs[c].add(b * QK_K + 2 * QK * g) as *const __m512i);
                    for r in 0..R {
                        let dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qx[r], qy));
                        acc[r][c] = _mm512_fmadd_ps(dot, _mm512_permutexvar_ps(*spread, f[r][c]), acc[r][c]);
                    }
                }
            }
        }
        sums(acc)
    }
}

tile_entry!(avx512, q4k_rows, Q4K, BlockQ4K);

/// Q4_K against activations whose super-blocks are in the sub-block-interleaved order
/// (`Acts::interleaved`, prefill only): register `k` (0..4) of a super-block holds values
/// `4k..4k + 4` of each of its sixteen 16-value halves of sub-blocks, so every register's
/// lanes `2j, 2j + 1` belong to 32-value sub-block `j`. The weights are put in the same
/// order when a work unit's rows are unpacked ([`UnpackedQ4K`], once per prefill rather
/// than once per tile of activation rows). The scale of a lane is then the same in all
/// four registers, so a super-block's products stay in integers, and two activation rows
/// share one accumulator ([`fold_pair`]). Per super-block, weight row and pair of
/// activation rows `c`, `c'`:
///
/// ```text
///   dot_c = Σ_k vpdpbusd(q_k, activation bytes of c, k)      16 × i32, lanes 2j, 2j+1: sub-block j
///   dot   = fold(dot_c, dot_c')                              lane 2j: c's sub-block j, 2j+1: c''s
///   acc  += f32(dot) · [d·sc_j]_lanes · [d_a c, d_a c']       (one d_a per super-block and row)
///   acc  -= [dmin·m_j]_lanes · [s_a c j, s_a c' j]           the offsets
/// ```
///
/// against the natural order's per group `vpdpbusd`, convert, scale spread and FMA.
struct Q4KInterleaved;

/// Register `k` of a super-block's quants in the interleaved order: lane `l` holds values
/// `16 (l % 2) + 4k .. + 4` of sub-block `j = l / 2`, i.e. nibble `j % 2` of the `qs` bytes
/// at `32 (j / 2) + 16 (l % 2) + 4k`.
#[inline(always)]
unsafe fn q4k_interleaved_quants(lo: __m512i, hi: __m512i, k: i32) -> __m512i {
    // lane l = 4g + 2h + half: group g, nibble h, half of the sub-block
    let pick = _mm512_setr_epi32(
        k,
        4 + k,
        k,
        4 + k,
        8 + k,
        12 + k,
        8 + k,
        12 + k,
        16 + k,
        20 + k,
        16 + k,
        20 + k,
        24 + k,
        28 + k,
        24 + k,
        28 + k,
    );
    let shift = _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4);
    _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutex2var_epi32(lo, pick, hi), shift), _mm512_set1_epi8(0x0F))
}

/// `start` plus the products of a super-block's four interleaved weight registers `q`
/// with its four activation registers at `a`, lane by lane.
#[inline(always)]
unsafe fn dot_quarters(start: __m512i, q: &[__m512i; 4], a: *const i8) -> __m512i {
    let mut dot = start;
    for (k, q) in q.iter().enumerate() {
        dot = _mm512_dpbusd_epi32(dot, *q, _mm512_loadu_si512(a.add(64 * k) as *const __m512i));
    }
    dot
}

/// Two activation rows' super-block dots `d0`, `d1` (lanes `2j`, `2j + 1`: sub-block `j`)
/// folded into one register: lane `2j` the sub-block's sum for the first row, `2j + 1` for
/// the second. Four integer operations for half the float work after them and half the
/// accumulators, so that a tile of two weight rows takes eight activation rows.
#[inline(always)]
unsafe fn fold_pair(d0: __m512i, d1: __m512i) -> __m512i {
    let x = _mm512_mask_blend_epi32(0xAAAA, d0, d1);
    let y = _mm512_mask_blend_epi32(0xAAAA, d1, d0);
    _mm512_add_epi32(x, _mm512_shuffle_epi32::<_MM_PERM_CDAB>(y))
}

/// The activation side of a folded pair of rows (see [`fold_pair`]) from their
/// super-block's `[d_a, s_a]_j` (`dsa1` `None`: one row, the odd lanes zero): `d_a` of the
/// first row in the even lanes and the second's in the odd, and `s_a` of sub-block `j` of
/// each likewise in lanes `2j`, `2j + 1`.
#[inline(always)]
unsafe fn pair_scales(dsa0: __m512, dsa1: Option<__m512>) -> (__m512, __m512) {
    let swapped0 = _mm512_permute_ps::<0xB1>(dsa0);
    match dsa1 {
        Some(dsa1) => (
            _mm512_mask_blend_ps(0xAAAA, dsa0, _mm512_permute_ps::<0xB1>(dsa1)),
            _mm512_mask_blend_ps(0xAAAA, swapped0, dsa1),
        ),
        None => (_mm512_maskz_mov_ps(0x5555, dsa0), _mm512_maskz_mov_ps(0x5555, swapped0)),
    }
}

/// A Q4_K super-block unpacked for [`Q4KInterleaved`]: its 256 quants one byte each in
/// the interleaved order, and its `[d·sc_j, d·sc_j]_j` and `[dmin·m_j, dmin·m_j]_j` as f32.
/// 384 bytes where the file's block takes 144, so a prefill unpacks only the 16 rows of
/// its work unit at a time, into a scratch that stays in L1/L2 (at most 16 · 384 B per
/// super-block of a row, 192 KiB per thread for rows of 8,192).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct UnpackedQ4K {
    q: [[u8; 64]; 4],
    scales: [f32; 16],
    mins: [f32; 16],
}

impl Unpack for Q4KInterleaved {
    type Src = BlockQ4K;
    type Out = UnpackedQ4K;
    const PER: usize = 1;

    #[inline(always)]
    unsafe fn unpack(blk: *const BlockQ4K, out: &mut UnpackedQ4K) {
        let lo = _mm512_loadu_si512((*blk).qs.as_ptr() as *const __m512i);
        let hi = _mm512_loadu_si512((*blk).qs.as_ptr().add(64) as *const __m512i);
        for (k, q) in out.q.iter_mut().enumerate() {
            _mm512_store_si512(q.as_mut_ptr() as *mut __m512i, q4k_interleaved_quants(lo, hi, k as i32));
        }
        let sm = q4k_scales_mins(blk);
        // [d, dmin]
        let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
        // [sc_0, sc_0, sc_1, sc_1, …] and [m_0, m_0, m_1, m_1, …]
        let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(sm, sm)));
        let m_only = _mm_srli_si128::<8>(sm);
        let m = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(m_only, m_only)));
        _mm512_store_ps(out.scales.as_mut_ptr(), _mm512_mul_ps(sc, _mm512_broadcastss_ps(dd)));
        _mm512_store_ps(out.mins.as_mut_ptr(), _mm512_mul_ps(m, _mm512_broadcastss_ps(_mm_movehdup_ps(dd))));
    }
}

impl TileKernel for Q4KInterleaved {
    type Block = UnpackedQ4K;
    const BLOCKS_PER: usize = QK_K / QK;
    const PREFILL_COLS: usize = 8;

    /// Activation rows go in pairs (`c`, `c + 1`) folded into one accumulator,
    /// `acc[r][c]`: its even lanes are row `c`'s, its odd lanes row `c + 1`'s (an odd last
    /// row alone in the even lanes).
    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const UnpackedQ4K; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        for sb in 0..nb / Self::BLOCKS_PER {
            let blk: [&UnpackedQ4K; R] = std::array::from_fn(|r| &*w[r].add(sb));
            let qx: [[__m512i; 4]; R] = std::array::from_fn(|r| {
                std::array::from_fn(|k| _mm512_load_si512(blk[r].q[k].as_ptr() as *const __m512i))
            });
            let b = sb * Self::BLOCKS_PER;
            let mut c = 0;
            while c < C {
                let pair = c + 1 < C;
                let dsa0 = _mm512_loadu_ps(ds[c].add(b) as *const f32);
                let dsa1 = if pair { Some(_mm512_loadu_ps(ds[c + 1].add(b) as *const f32)) } else { None };
                let (da, sa) = pair_scales(dsa0, dsa1);
                let a0 = qs[c].add(b * QK);
                for r in 0..R {
                    let d0 = dot_quarters(_mm512_setzero_si512(), &qx[r], a0);
                    let d1 =
                        if pair { dot_quarters(_mm512_setzero_si512(), &qx[r], qs[c + 1].add(b * QK)) } else { d0 };
                    let dot = fold_pair(d0, d1);
                    let scales = _mm512_load_ps(blk[r].scales.as_ptr());
                    let mins = _mm512_load_ps(blk[r].mins.as_ptr());
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scales, da), acc[r][c]);
                    acc[r][c] = _mm512_fnmadd_ps(mins, sa, acc[r][c]);
                }
                c += 2;
            }
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            let mut c = 0;
            while c < C {
                out[r][c] = _mm512_mask_reduce_add_ps(0x5555, acc[r][c]);
                if c + 1 < C {
                    out[r][c + 1] = _mm512_mask_reduce_add_ps(0xAAAA, acc[r][c]);
                }
                c += 2;
            }
        }
        out
    }
}

/// Signed-weight tiles (Q8_0, Q4_0, Q5_0) against Q8_0 activations, two blocks per
/// register. `vpdpbusd` multiplies unsigned by signed bytes, so per weight row the quants
/// become their magnitudes and a sign mask, and each activation register takes the
/// weights' signs (one masked subtraction) before the product:
///
/// ```text
///   dot   = vpdpbusd(|q_w|, q_a · sign(q_w))       16 × i32, lanes 0-7 block b, 8-15 block b+1
///   acc  += f32(dot) · (d_w · d_a spread over those lanes)
/// ```
struct Signed<W>(std::marker::PhantomData<W>);

/// `d` of block `b` in lanes 0-7 and of block `b + 1` in lanes 8-15 (0 when `pair` is
/// false): every signed block starts with its f16 scale.
#[inline(always)]
unsafe fn signed_scales<B>(blk: *const B, pair: bool) -> __m512 {
    let first = std::ptr::read_unaligned(blk as *const u16) as i32;
    let second = if pair { std::ptr::read_unaligned(blk.add(1) as *const u16) as i32 } else { 0 };
    // [d_b, 0, d_b1, 0]
    let ds = _mm512_zextps128_ps512(_mm_cvtph_ps(_mm_setr_epi32(first, second, 0, 0)));
    _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2), ds)
}

/// A signed block pair as `vpdpbusd` takes it: the quants' magnitudes and a mask of the
/// negative ones.
pub(super) trait SignedPair: SignedBlock {
    /// Of block `b` in bytes 0-31 and, when `PAIR`, block `b + 1` in bytes 32-63 (zeros
    /// otherwise).
    #[inline(always)]
    unsafe fn magnitudes_signs<const PAIR: bool>(blk: *const Self::Block) -> (__m512i, __mmask64) {
        let low = _mm512_castsi256_si512(Self::quants(blk));
        let q = if PAIR { _mm512_inserti64x4::<1>(low, Self::quants(blk.add(1))) } else { low };
        (_mm512_abs_epi8(q), _mm512_movepi8_mask(q))
    }
}

impl SignedPair for BlockQ8_0 {}

impl SignedPair for BlockQ4_0 {
    /// `q - 8`: the nibbles below 8 are the negative ones.
    #[inline(always)]
    unsafe fn magnitudes_signs<const PAIR: bool>(blk: *const BlockQ4_0) -> (__m512i, __mmask64) {
        let qs = (*blk).qs.as_ptr();
        let q = _mm512_sub_epi8(nibble_pair(qs, qs.wrapping_add(size_of::<BlockQ4_0>()), PAIR), _mm512_set1_epi8(8));
        (_mm512_abs_epi8(q), _mm512_movepi8_mask(q))
    }
}

impl SignedPair for BlockQ5_0 {
    /// `q - 16` with `q = nibble | fifth bit << 4`: where the fifth bit is set the value is
    /// the nibble itself, where it is not the value is negative and its magnitude is
    /// `16 - nibble`. The 32 fifth bits of a block are a byte mask as they stand.
    #[inline(always)]
    unsafe fn magnitudes_signs<const PAIR: bool>(blk: *const BlockQ5_0) -> (__m512i, __mmask64) {
        let qs = (*blk).qs.as_ptr();
        let nibbles = nibble_pair(qs, qs.wrapping_add(size_of::<BlockQ5_0>()), PAIR);
        let first = std::ptr::read_unaligned((*blk).qh.as_ptr() as *const u32) as u64;
        let second = if PAIR { std::ptr::read_unaligned((*blk.add(1)).qh.as_ptr() as *const u32) as u64 } else { 0 };
        let fifth = _cvtu64_mask64(first | second << 32);
        let live: __mmask64 = if PAIR { !0 } else { 0xFFFF_FFFF };
        let mag = _mm512_mask_mov_epi8(_mm512_sub_epi8(_mm512_set1_epi8(16), nibbles), fifth, nibbles);
        (_mm512_maskz_mov_epi8(live, mag), !fifth & live)
    }
}

impl<W: SignedPair> PairStep for Signed<W> {
    #[inline(always)]
    unsafe fn step<const R: usize, const C: usize, const PAIR: bool>(
        acc: &mut [[__m512; C]; R],
        w: &[*const Self::Block; R],
        qs: &[*const i8; C],
        ds: &[*const [f32; 2]; C],
        b: usize,
        lead: usize,
    ) {
        // lanes 0-7 take element 0 (block b's d_a), lanes 8-15 element 2 (block b+1's)
        let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
        let mut mag = [_mm512_setzero_si512(); R];
        let mut neg = [0 as __mmask64; R];
        let mut dw = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let blk = w[r].add(b);
            // a pair of blocks may span more than a cache line: ask for each block's
            _mm_prefetch::<_MM_HINT_T0>((blk as *const i8).wrapping_add(lead));
            _mm_prefetch::<_MM_HINT_T0>((blk.add(1) as *const i8).wrapping_add(lead));
            (mag[r], neg[r]) = W::magnitudes_signs::<PAIR>(blk);
            dw[r] = signed_scales(blk, PAIR);
        }
        for c in 0..C {
            let (qy, dsa) = if PAIR {
                (_mm512_loadu_si512(qs[c].add(b * QK) as *const __m512i), _mm_loadu_ps(ds[c].add(b) as *const f32))
            } else {
                let qy = _mm256_loadu_si256(qs[c].add(b * QK) as *const __m256i);
                (_mm512_zextsi256_si512(qy), _mm_castpd_ps(_mm_load_sd(ds[c].add(b) as *const f64)))
            };
            let da = _mm512_permutexvar_ps(spread, _mm512_zextps128_ps512(dsa));
            for r in 0..R {
                let signed = _mm512_mask_sub_epi8(qy, neg[r], _mm512_setzero_si512(), qy);
                let dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), mag[r], signed));
                acc[r][c] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw[r], da), acc[r][c]);
            }
        }
    }
}

impl<W: SignedPair> TileKernel for Signed<W> {
    type Block = W::Block;
    const PREFILL_COLS: usize = 8;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const W::Block; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        pair_tile::<Self, R, C>(w, qs, ds, nb)
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn signed_rows<B: SignedPair>(
    w: *const B::Block,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    drive::<Signed<B>>(w, nb, rows, acts, dst, ldd)
}

/// Q6_K tiles against 8-bit activations, two 32-value blocks (`2p`, `2p + 1` of a
/// super-block) per register: their low bits are 64 consecutive `ql` bytes under one
/// nibble shift, their high bits the same 32 `qh` bytes under shifts 2 apart, and their
/// four 16-value scales four consecutive bytes of `scales`. With `q` in 0..=63:
///
/// ```text
///   dot   = vpdpbusd(-vpdpbusd(32, a), q, a)           16 × i32 of Σ (q - 32) · a, 4 values a lane
///   acc  += f32(dot) · (d · sc · d_a, spread over the lanes of its 16 values)
/// ```
///
/// The activations share one `d_a` over a super-block (`ActScale::SuperBlock`), so the
/// sixteen `d · sc · d_a` of a weight row and activation row are computed once per
/// super-block and each pair only spreads them.
struct Q6K;

impl TileKernel for Q6K {
    type Block = BlockQ6K;
    const BLOCKS_PER: usize = 8;
    const PREFILL_COLS: usize = 8;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const BlockQ6K; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        let low4 = _mm512_set1_epi8(0x0F);
        let low2 = _mm512_set1_epi8(0x03);
        let offset = _mm512_set1_epi8(32);
        // pair p's four 16-value scales, four lanes each, out of a super-block's sixteen
        let scale_spread: [__m512i; 4] = std::array::from_fn(|p| {
            let s = 4 * p as i32;
            _mm512_setr_epi32(
                s,
                s,
                s,
                s,
                s + 1,
                s + 1,
                s + 1,
                s + 1,
                s + 2,
                s + 2,
                s + 2,
                s + 2,
                s + 3,
                s + 3,
                s + 3,
                s + 3,
            )
        });
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let lead = prefetch_lead(&w);
        for sb in 0..nb / Self::BLOCKS_PER {
            // d · scale · d_a of the super-block's sixteen 16-value groups, per weight row
            // and activation row (the activations share one d_a over the super-block,
            // `ActScale::SuperBlock`), read back by the pairs below as memory operands
            let mut factors = [[[0f32; 16]; C]; R];
            for r in 0..R {
                let blk = w[r].add(sb);
                let sc =
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((*blk).scales.as_ptr() as *const __m128i)));
                let scales = _mm512_mul_ps(sc, _mm512_set1_ps(q6k_d(blk)));
                for c in 0..C {
                    let da = _mm512_set1_ps((*ds[c].add(sb * Self::BLOCKS_PER))[0]);
                    _mm512_storeu_ps(factors[r][c].as_mut_ptr(), _mm512_mul_ps(scales, da));
                }
            }
            for (p, spread) in scale_spread.iter().enumerate() {
                let j = 2 * p;
                let b = sb * Self::BLOCKS_PER + j;
                // blocks j and j + 1 share the low bits' bytes run and shift; the high
                // bits' shift is 2 more for the second
                let (ql_at, ql_shift, qh_at, qh_shift) = BlockQ6K::sub_block(j);
                let ql_shift = _mm_cvtsi32_si128(ql_shift as i32);
                let qh_shift = qh_shift as i64;
                let (first, second) = (qh_shift, qh_shift + 2);
                let qh_shifts = _mm512_setr_epi64(first, first, first, first, second, second, second, second);
                let mut qx = [_mm512_setzero_si512(); R];
                for r in 0..R {
                    let blk = w[r].add(sb);
                    // four pairs' prefetches 52 bytes apart, and the last byte, touch every
                    // line of the 210 bytes
                    _mm_prefetch::<_MM_HINT_T0>((blk as *const i8).wrapping_add(lead + 26 * j));
                    if p == 3 {
                        _mm_prefetch::<_MM_HINT_T0>((blk as *const i8).wrapping_add(lead + 209));
                    }
                    let ql = _mm512_loadu_si512((*blk).ql.as_ptr().add(ql_at) as *const __m512i);
                    let lo = _mm512_and_si512(_mm512_srl_epi16(ql, ql_shift), low4);
                    let qh =
                        _mm512_broadcast_i64x4(_mm256_loadu_si256((*blk).qh.as_ptr().add(qh_at) as *const __m256i));
                    let hi = _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srlv_epi64(qh, qh_shifts), low2));
                    qx[r] = _mm512_or_si512(lo, hi);
                }
                for c in 0..C {
                    let qy = _mm512_loadu_si512(qs[c].add(b * QK) as *const __m512i);
                    let neg_off = _mm512_sub_epi32(
                        _mm512_setzero_si512(),
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, qy),
                    );
                    for r in 0..R {
                        let dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(neg_off, qx[r], qy));
                        let f = _mm512_permutexvar_ps(*spread, _mm512_loadu_ps(factors[r][c].as_ptr()));
                        acc[r][c] = _mm512_fmadd_ps(dot, f, acc[r][c]);
                    }
                }
            }
        }
        sums(acc)
    }
}

tile_entry!(avx512, q6_k_rows, Q6K, BlockQ6K);

/// Signed weights (Q6_K, and Q8_0 / Q4_0 / Q5_0 rows of whole 256-value groups) against
/// activations in the sub-block-interleaved order (`Acts::interleaved`, prefill only), as
/// [`Q4KInterleaved`]: lane `l` of each of a group's four registers belongs to 16-value
/// sub-block `l`, so the four products of a lane share one scale and a group's products
/// stay in integers. The weights are unpacked per work unit ([`UnpackedSigned`]), signed
/// (Q6_K's `q - 32`), so the activations take the unsigned side of `vpdpbusd` (`a + 128`,
/// shared by the weight rows) and the weights' correction starts each sum. Per 256
/// values, weight row and activation row:
///
/// ```text
///   dot   = offset + Σ_k vpdpbusd(a_k + 128, q_k)        = Σ_k a_k q_k
///   acc  += f32(dot) · [scale_l]_l · [d_a of block l / 2]_l
/// ```
///
/// Against the natural order's one `vpdpbusd`, convert, multiply and FMA per 64 values
/// of Q8_0, a convert, multiply and FMA per 256.
struct SignedInterleaved;

/// Register `k` of a Q6_K super-block's quants in the interleaved order: lane `l` holds
/// values `16l + 4k .. + 4`, from 32-value block `b = l / 2` of [`BlockQ6K::sub_block`]'s
/// layout at byte `16 (l % 2) + 4k` of its runs.
#[inline(always)]
unsafe fn q6k_interleaved_quants(ql_lo: __m512i, ql_hi: __m512i, qh: __m512i, k: i32) -> __m512i {
    // lane l: block b = l / 2 = 4n + q; its ql run starts at dword 16n + 8 (q % 2), nibble
    // q / 2; its qh run at dword 8n, bits 2q
    let (mut ql_at, mut ql_shift, mut qh_at, mut qh_shift) = ([0i32; 16], [0i32; 16], [0i32; 16], [0i32; 16]);
    for l in 0..16 {
        let (n, q, half) = (l as i32 / 8, (l as i32 / 2) % 4, l as i32 % 2);
        ql_at[l] = 16 * n + 8 * (q % 2) + 4 * half + k;
        ql_shift[l] = 4 * (q / 2);
        qh_at[l] = 8 * n + 4 * half + k;
        qh_shift[l] = 2 * q;
    }
    let load = |a: &[i32; 16]| _mm512_loadu_si512(a.as_ptr() as *const __m512i);
    let low = _mm512_srlv_epi32(_mm512_permutex2var_epi32(ql_lo, load(&ql_at), ql_hi), load(&ql_shift));
    let high = _mm512_srlv_epi32(_mm512_permutexvar_epi32(load(&qh_at), qh), load(&qh_shift));
    _mm512_or_si512(
        _mm512_and_si512(low, _mm512_set1_epi8(0x0F)),
        _mm512_slli_epi32::<4>(_mm512_and_si512(high, _mm512_set1_epi8(0x03))),
    )
}

/// 256 signed weights unpacked for [`SignedInterleaved`] (a Q6_K super-block, or eight
/// Q8_0 / Q4_0 / Q5_0 blocks): the quants one byte each (-128..=127) in the interleaved
/// order, so that lane `l` of each of the four registers holds values of 16-value
/// sub-block `l`; each lane's scale (`d·sc_l` of Q6_K, `d` of the 32-value block `l / 2`
/// otherwise) as f32; and per lane `-128 · Σ q` of its 16 values. 384 bytes, unpacked per
/// work unit, as [`UnpackedQ4K`].
///
/// `vpdpbusd` multiplies unsigned by signed bytes, so the tile shifts the activations to
/// unsigned (`a + 128`) and starts each lane's sum at `offset`:
/// `Σ (a + 128) q - 128 Σ q = Σ a q`. The correction depends on the weights only, so it
/// is computed here, once per work unit, not per activation row.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct UnpackedSigned {
    q: [[i8; 64]; 4],
    scales: [f32; 16],
    offset: [i32; 16],
}

/// Stores the interleaved signed quants `q` with their lanes' correction (see
/// [`UnpackedSigned`]).
#[inline(always)]
unsafe fn store_signed(q: [__m512i; 4], out: &mut UnpackedSigned) {
    let mut sum = _mm512_setzero_si512();
    for (k, q) in q.into_iter().enumerate() {
        sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi8(1), q);
        _mm512_store_si512(out.q[k].as_mut_ptr() as *mut __m512i, q);
    }
    _mm512_store_si512(
        out.offset.as_mut_ptr() as *mut __m512i,
        _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sum)),
    );
}

/// Eight Q8_0, Q4_0 or Q5_0 blocks (256 values) as one [`UnpackedSigned`].
struct UnpackSigned<W>(std::marker::PhantomData<W>);

impl<W: SignedPair> Unpack for UnpackSigned<W> {
    type Src = W::Block;
    type Out = UnpackedSigned;
    const PER: usize = 8;

    #[inline(always)]
    unsafe fn unpack(blk: *const W::Block, out: &mut UnpackedSigned) {
        // pair p: blocks 2p (dwords 0-7) and 2p + 1 (dwords 8-15)
        let mut pairs = [_mm512_setzero_si512(); 4];
        for (p, pair) in pairs.iter_mut().enumerate() {
            let low = _mm512_castsi256_si512(W::quants(blk.add(2 * p)));
            *pair = _mm512_inserti64x4::<1>(low, W::quants(blk.add(2 * p + 1)));
        }
        // register k, lane l = 2j + h: dword 4h + k of block j, i.e. of pair j / 2 at
        // 8 (j % 2) + 4h + k; lanes 0-7 (blocks 0-3) from pairs 0, 1, lanes 8-15 from 2, 3
        let mut q = [_mm512_setzero_si512(); 4];
        for (k, q) in q.iter_mut().enumerate() {
            let mut at = [0i32; 16];
            for (l, at) in at.iter_mut().enumerate() {
                let (j, h) = ((l / 2) % 4, l % 2);
                *at = (16 * (j / 2) + 8 * (j % 2) + 4 * h + k) as i32;
            }
            let at = _mm512_loadu_si512(at.as_ptr() as *const __m512i);
            let low = _mm512_permutex2var_epi32(pairs[0], at, pairs[1]);
            let high = _mm512_permutex2var_epi32(pairs[2], at, pairs[3]);
            *q = _mm512_mask_blend_epi32(0xFF00, low, high);
        }
        store_signed(q, out);
        let d = _mm512_castps256_ps512(signed_block_scales(blk));
        let spread = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        _mm512_store_ps(out.scales.as_mut_ptr(), _mm512_permutexvar_ps(spread, d));
    }
}

/// A Q6_K super-block as an [`UnpackedSigned`], its quants less 32.
struct UnpackQ6K;

impl Unpack for UnpackQ6K {
    type Src = BlockQ6K;
    type Out = UnpackedSigned;
    const PER: usize = 1;

    #[inline(always)]
    unsafe fn unpack(blk: *const BlockQ6K, out: &mut UnpackedSigned) {
        let ql_lo = _mm512_loadu_si512((*blk).ql.as_ptr() as *const __m512i);
        let ql_hi = _mm512_loadu_si512((*blk).ql.as_ptr().add(64) as *const __m512i);
        let qh = _mm512_loadu_si512((*blk).qh.as_ptr() as *const __m512i);
        let mut q = [_mm512_setzero_si512(); 4];
        for (k, q) in q.iter_mut().enumerate() {
            *q = _mm512_sub_epi8(q6k_interleaved_quants(ql_lo, ql_hi, qh, k as i32), _mm512_set1_epi8(32));
        }
        store_signed(q, out);
        let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((*blk).scales.as_ptr() as *const __m128i)));
        _mm512_store_ps(out.scales.as_mut_ptr(), _mm512_mul_ps(sc, _mm512_set1_ps(q6k_d(blk))));
    }
}

impl TileKernel for SignedInterleaved {
    type Block = UnpackedSigned;
    const BLOCKS_PER: usize = QK_K / QK;
    const PREFILL_COLS: usize = 8;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const UnpackedSigned; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        for sb in 0..nb / Self::BLOCKS_PER {
            let blk: [&UnpackedSigned; R] = std::array::from_fn(|r| &*w[r].add(sb));
            let qx: [[__m512i; 4]; R] = std::array::from_fn(|r| {
                std::array::from_fn(|k| _mm512_load_si512(blk[r].q[k].as_ptr() as *const __m512i))
            });
            for c in 0..C {
                let b = sb * Self::BLOCKS_PER;
                let a = qs[c].add(b * QK);
                // the activations as unsigned bytes, a + 128, shared by the weight rows
                let au: [__m512i; 4] = std::array::from_fn(|k| {
                    _mm512_xor_si512(_mm512_loadu_si512(a.add(64 * k) as *const __m512i), _mm512_set1_epi8(-128))
                });
                // lanes 2j, 2j + 1: d_a of block j
                let da = _mm512_moveldup_ps(_mm512_loadu_ps(ds[c].add(b) as *const f32));
                for r in 0..R {
                    let mut dot = _mm512_load_si512(blk[r].offset.as_ptr() as *const __m512i);
                    for k in 0..4 {
                        dot = _mm512_dpbusd_epi32(dot, au[k], qx[r][k]);
                    }
                    let scales = _mm512_load_ps(blk[r].scales.as_ptr());
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scales, da), acc[r][c]);
                }
            }
        }
        sums(acc)
    }
}

/// Prefill of Q8_0, Q4_0 or Q5_0 rows whose length is a multiple of 256, on the
/// interleaved activations: eight blocks at a time unpacked as one [`UnpackedSigned`].
///
/// # Safety
/// As [`drive`]; `nb` is a multiple of 8; the CPU has AVX-512 F/BW/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn signed_interleaved_rows<W: SignedPair>(
    w: *const W::Block,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    unpacked_rows::<SignedInterleaved, UnpackSigned<W>>(&UNPACKED_SIGNED, w, nb, rows, acts, dst, ldd)
}
