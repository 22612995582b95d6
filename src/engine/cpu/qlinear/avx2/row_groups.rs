//! AVX2 K-quant prefill on groups of eight weight rows.
//!
//! In the file's layout one register holds 32 values of one row, so every `maddubs` needs
//! a `madd` of its own to apply the sub-block's scale: two multiplies per 32 products, and
//! the ports that run both are the bound ([`super::Q4K`], [`super::Q6K`]). Here a work
//! unit's rows are first unpacked, eight at a time, so that one register holds four values
//! of each of eight rows. The registers of one scale's values then add their pair
//! products in i16 and take the scale once, and the sums come out as the eight rows'
//! lanes, with no horizontal reduction:
//!
//! ```text
//!   s16  += maddubs(w_g, broadcast(a[4g .. 4g + 4]))   lanes 2r, 2r + 1: row r
//!   isum += madd(s16, [sc_r, sc_r]_r)                   per scale's values
//!   acc  += f32(isum) · d_r · d_a  (− Q4_K's mins)      per super-block
//! ```
//!
//! Q4_K (quants 0..=15, sub-blocks of 32): eight registers per scale, exact in i16
//! (8 · 2 · 15 · 127 < 2^15). Q6_K (q − 32 in -32..=31, sub-blocks of 16): the weights
//! are the signed side, so the activations are taken as unsigned bytes `a + 128` and the
//! weights' part of that, `128 · Σ sc · Σ w`, a constant of each row, is subtracted from
//! the start; two registers per i16 sum (2 · 2 · 255 · 32 < 2^15).
//!
//! By instruction count the unpacking costs about as much as a few activation rows'
//! products of the same weights. Every prefill (two or more rows) sums in this order
//! ([`GROUPED_MIN_ROWS`]), so that a row's sums do not depend on how the prompt was split;
//! below [`UNPACKED_MIN_ROWS`] the groups are read from the file instead
//! ([`RowGroup::file_tile`]): each row's integer sum is taken whole and then scaled in the
//! same steps, the same bits without the unpacking.

use super::super::blocks::{drive, take_scratch, Acts, BlockQ4K, BlockQ6K, TileKernel, QK, QK_K};
use super::{
    load_f16_pair, prefetch_next_group, q4k_scales_mins, q6k_d, q6k_sub_block_quants, q6k_sub_block_scales, Madd,
    ScaledDot, Vnni, Q4K, Q6K,
};
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::thread::LocalKey;

/// The fewest activation rows for which the grouped kernels are used: every prefill. A
/// prompt fed in pieces (a draft read ahead a few words at a time) must give the bits it
/// gives fed whole, and the grouped and file-layout kernels sum in different orders.
pub(in super::super) const GROUPED_MIN_ROWS: usize = 2;

/// The fewest activation rows for which the rows are unpacked: below it ([`file_columns`])
/// the unpacking costs more than it saves (on a Llama-1B Q4_K_M file a three-token piece of
/// a draft read ahead took ~1.8x as long unpacked, a four-token piece 98-101 ms against
/// 81-98 read from the file; six tokens, read as tiles of four and two, were slower).
const UNPACKED_MIN_ROWS: usize = 5;

/// Activation rows per tile: their i16, i32 and f32 sums take 12 of the 16 registers.
const COLS: usize = 4;

/// Super-blocks per chunk of a row (1,024 values): a unit's two groups of a chunk (20 KiB)
/// and a tile's activations (4 KiB) stay in L1 together. (Chunks of 8 were ~7 % slower
/// on 2,048-wide rows here: the groups spilled to L2 for every tile.)
const CHUNK_SBS: usize = 4;

/// A K-quant format's eight-row groups.
trait RowGroup {
    /// The file's super-block.
    type Block;
    /// Eight rows' super-blocks at one position, unpacked.
    type Group: Copy + 'static;
    /// The file-layout kernel, for the rows after the last whole group.
    type Tail<D: ScaledDot>: TileKernel<Block = Self::Block>;
    /// Whether the tile reads activations as `a + 128` (unsigned bytes).
    const UNSIGNED_ACTS: bool;
    /// This thread's scratch of unpacked groups.
    fn scratch() -> &'static LocalKey<RefCell<Vec<Self::Group>>>;
    /// The super-blocks at `first`, `first + stride`, … (eight rows) into `out`.
    unsafe fn unpack(first: *const Self::Block, stride: usize, out: &mut Self::Group);
    /// One group's `sbs` super-blocks against `C` activation rows (`qs` as the tile
    /// reads them): per activation row, the eight weight rows' sums.
    unsafe fn tile<D: ScaledDot, const C: usize>(
        group: *const Self::Group,
        qs: [*const u8; C],
        ds: [*const [f32; 2]; C],
        sbs: usize,
    ) -> [__m256; C];
    /// [`Self::tile`]'s sums from the file's blocks (the eight rows at `first`, `first +
    /// stride`, …), not unpacked, against signed activations: each row's integer sum of a
    /// super-block is the same number summed in another order, and the f32 steps are
    /// `tile`'s, so the outputs are the same bits. For prefills of too few activation
    /// rows to pay for the unpacking ([`UNPACKED_MIN_ROWS`]).
    unsafe fn file_tile<D: ScaledDot, const C: usize>(
        first: *const Self::Block,
        stride: usize,
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        sbs: usize,
    ) -> [__m256; C];
}

/// The 8 x 8 matrix of 32-bit elements `x[row][element]`, transposed.
#[inline(always)]
pub(in super::super) unsafe fn transpose_8x8_epi32(x: [__m256i; 8]) -> [__m256i; 8] {
    // pairs of rows interleaved: [a0 b0 a1 b1 | a4 b4 a5 b5] and [a2 b2 a3 b3 | a6 b6 a7 b7]
    let lo01 = _mm256_unpacklo_epi32(x[0], x[1]);
    let hi01 = _mm256_unpackhi_epi32(x[0], x[1]);
    let lo23 = _mm256_unpacklo_epi32(x[2], x[3]);
    let hi23 = _mm256_unpackhi_epi32(x[2], x[3]);
    let lo45 = _mm256_unpacklo_epi32(x[4], x[5]);
    let hi45 = _mm256_unpackhi_epi32(x[4], x[5]);
    let lo67 = _mm256_unpacklo_epi32(x[6], x[7]);
    let hi67 = _mm256_unpackhi_epi32(x[6], x[7]);
    // four rows' elements e and e + 4: [a0 b0 c0 d0 | a4 b4 c4 d4], ...
    let e04 = _mm256_unpacklo_epi64(lo01, lo23);
    let e15 = _mm256_unpackhi_epi64(lo01, lo23);
    let e26 = _mm256_unpacklo_epi64(hi01, hi23);
    let e37 = _mm256_unpackhi_epi64(hi01, hi23);
    let f04 = _mm256_unpacklo_epi64(lo45, lo67);
    let f15 = _mm256_unpackhi_epi64(lo45, lo67);
    let f26 = _mm256_unpacklo_epi64(hi45, hi67);
    let f37 = _mm256_unpackhi_epi64(hi45, hi67);
    [
        _mm256_permute2x128_si256::<0x20>(e04, f04),
        _mm256_permute2x128_si256::<0x20>(e15, f15),
        _mm256_permute2x128_si256::<0x20>(e26, f26),
        _mm256_permute2x128_si256::<0x20>(e37, f37),
        _mm256_permute2x128_si256::<0x31>(e04, f04),
        _mm256_permute2x128_si256::<0x31>(e15, f15),
        _mm256_permute2x128_si256::<0x31>(e26, f26),
        _mm256_permute2x128_si256::<0x31>(e37, f37),
    ]
}

/// Eight rows' integer sums, each as eight i32 partial sums (`x[row]`), as one register
/// of the rows' totals (lane `r`: row `r`).
#[inline(always)]
unsafe fn row_totals(x: [__m256i; 8]) -> __m256i {
    // per 128-bit half, [row 0, 1, 2, 3] and [row 4, 5, 6, 7] of the half's four lanes
    let low = _mm256_hadd_epi32(_mm256_hadd_epi32(x[0], x[1]), _mm256_hadd_epi32(x[2], x[3]));
    let high = _mm256_hadd_epi32(_mm256_hadd_epi32(x[4], x[5]), _mm256_hadd_epi32(x[6], x[7]));
    _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(low, high), _mm256_permute2x128_si256::<0x31>(low, high))
}

/// Eight rows' 32 values, one register each, as eight registers of four values of every
/// row (`out[g]`, bytes `4r..4r + 4`: row `r`'s values `4g..4g + 4`).
#[inline(always)]
unsafe fn store_transposed(rows: [__m256i; 8], out: &mut [[u8; 32]; 8]) {
    for (g, q) in transpose_8x8_epi32(rows).iter().enumerate() {
        _mm256_store_si256(out[g].as_mut_ptr() as *mut __m256i, *q);
    }
}

/// `maddubs(w, broadcast(four bytes at a))`: four values of each of eight rows against
/// the same four activations.
#[inline(always)]
unsafe fn products(w: *const [u8; 32], a: *const u8) -> __m256i {
    let a = _mm256_set1_epi32(std::ptr::read_unaligned(a as *const i32));
    _mm256_maddubs_epi16(_mm256_load_si256(w as *const __m256i), a)
}

struct Q4KGroups;

/// A Q4_K super-block's eight sub-block scales, its `d`, and its eight `dmin · m_j`: what
/// the groups keep of each row ([`Q4KGroups`]' `unpack` and `file_tile` alike).
#[inline(always)]
unsafe fn q4k_row_scales(blk: *const BlockQ4K) -> ([u8; 8], f32, [f32; 8]) {
    let mut sm = [0u8; 16];
    _mm_storeu_si128(sm.as_mut_ptr() as *mut __m128i, q4k_scales_mins(blk));
    let dd = load_f16_pair(blk as *const u8);
    let dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
    let scales = std::array::from_fn(|j| sm[j]);
    let mins = std::array::from_fn(|j| dmin * sm[8 + j] as f32);
    (scales, _mm_cvtss_f32(dd), mins)
}

/// Eight Q4_K rows' super-blocks unpacked: `q[j][g]` holds values `4g..4g + 4` of
/// sub-block `j` of every row (bytes `4r..4r + 4`: row `r`); `scales[j]` sub-block `j`'s
/// scale of row `r` in i16 lanes `2r` and `2r + 1`; `d` the rows' `d`, `mins[j]` their
/// `dmin · m_j`. 2,592 bytes where the file holds 8 · 144.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Q4KGroup {
    q: [[[u8; 32]; 8]; 8],
    scales: [[i16; 16]; 8],
    d: [f32; 8],
    mins: [[f32; 8]; 8],
}

thread_local! {
    static Q4K_GROUPS: RefCell<Vec<Q4KGroup>> = const { RefCell::new(Vec::new()) };
    static Q6K_GROUPS: RefCell<Vec<Q6KGroup>> = const { RefCell::new(Vec::new()) };
}

impl RowGroup for Q4KGroups {
    type Block = BlockQ4K;
    type Group = Q4KGroup;
    type Tail<D: ScaledDot> = Q4K<D>;
    const UNSIGNED_ACTS: bool = false;

    fn scratch() -> &'static LocalKey<RefCell<Vec<Q4KGroup>>> {
        &Q4K_GROUPS
    }

    #[inline(always)]
    unsafe fn unpack(first: *const BlockQ4K, stride: usize, out: &mut Q4KGroup) {
        for r in 0..8 {
            let (scales, d, mins) = q4k_row_scales(first.add(r * stride));
            out.d[r] = d;
            for j in 0..8 {
                out.scales[j][2 * r] = scales[j] as i16;
                out.scales[j][2 * r + 1] = scales[j] as i16;
                out.mins[j][r] = mins[j];
            }
        }
        let mask = _mm256_set1_epi8(0x0F);
        for j in 0..QK_K / QK {
            // sub-block j: the low (even j) or high nibbles of the 32 bytes at 32 * (j / 2)
            let mut rows = [_mm256_setzero_si256(); 8];
            for (r, row) in rows.iter_mut().enumerate() {
                let at = (*first.add(r * stride)).qs.as_ptr().add(QK * (j / 2));
                let raw = _mm256_loadu_si256(at as *const __m256i);
                let raw = if j % 2 == 0 { raw } else { _mm256_srli_epi16::<4>(raw) };
                *row = _mm256_and_si256(raw, mask);
            }
            store_transposed(rows, &mut out.q[j]);
        }
    }

    #[inline(always)]
    unsafe fn tile<D: ScaledDot, const C: usize>(
        group: *const Q4KGroup,
        qs: [*const u8; C],
        ds: [*const [f32; 2]; C],
        sbs: usize,
    ) -> [__m256; C] {
        let mut acc = [_mm256_setzero_ps(); C];
        for sb in 0..sbs {
            let blk = &*group.add(sb);
            let mut isum = [_mm256_setzero_si256(); C];
            for j in 0..QK_K / QK {
                let mut s16 = [_mm256_setzero_si256(); C];
                for g in 0..QK / 4 {
                    for c in 0..C {
                        let p = products(&blk.q[j][g], qs[c].add(sb * QK_K + j * QK + 4 * g));
                        s16[c] = _mm256_add_epi16(s16[c], p);
                    }
                }
                let scale = _mm256_load_si256(blk.scales[j].as_ptr() as *const __m256i);
                for c in 0..C {
                    isum[c] = D::scaled(isum[c], s16[c], scale);
                }
            }
            let d = _mm256_load_ps(blk.d.as_ptr());
            for c in 0..C {
                // one d_a per super-block (`ActScale::SuperBlock`), s_a per sub-block
                let ds = ds[c].add(sb * QK_K / QK);
                let f = _mm256_mul_ps(d, _mm256_set1_ps((*ds)[0]));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), f, acc[c]);
                for j in 0..QK_K / QK {
                    let mins = _mm256_load_ps(blk.mins[j].as_ptr());
                    acc[c] = _mm256_fnmadd_ps(mins, _mm256_set1_ps((*ds.add(j))[1]), acc[c]);
                }
            }
        }
        acc
    }
    #[inline(always)]
    unsafe fn file_tile<D: ScaledDot, const C: usize>(
        first: *const BlockQ4K,
        stride: usize,
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        sbs: usize,
    ) -> [__m256; C] {
        let mask = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); C];
        for sb in 0..sbs {
            // per activation row, each weight row's sum as eight partial sums
            let mut partial = [[_mm256_setzero_si256(); 8]; C];
            // `unpack`'s `d` and `mins`, computed as it does
            let mut d = [0f32; 8];
            let mut mins = [[0f32; 8]; 8];
            for r in 0..8 {
                let blk = first.add(r * stride + sb);
                prefetch_next_group(blk, 8, stride);
                let (scales, dr, row_mins) = q4k_row_scales(blk);
                d[r] = dr;
                for j in 0..QK_K / QK {
                    mins[j][r] = row_mins[j];
                }
                for (j, &sc) in scales.iter().enumerate() {
                    // sub-block j: the low (even j) or high nibbles of the 32 bytes at 32 * (j / 2)
                    let raw = _mm256_loadu_si256((*blk).qs.as_ptr().add(QK * (j / 2)) as *const __m256i);
                    let raw = if j % 2 == 0 { raw } else { _mm256_srli_epi16::<4>(raw) };
                    let q = _mm256_and_si256(raw, mask);
                    let scale = _mm256_set1_epi16(sc as i16);
                    for c in 0..C {
                        let a = _mm256_loadu_si256(qs[c].add(sb * QK_K + QK * j) as *const __m256i);
                        partial[c][r] = D::scaled_dot(partial[c][r], q, a, scale);
                    }
                }
            }
            // from here as `tile`
            let d = _mm256_loadu_ps(d.as_ptr());
            for c in 0..C {
                let ds = ds[c].add(sb * QK_K / QK);
                let f = _mm256_mul_ps(d, _mm256_set1_ps((*ds)[0]));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(row_totals(partial[c])), f, acc[c]);
                for j in 0..QK_K / QK {
                    let mins = _mm256_loadu_ps(mins[j].as_ptr());
                    acc[c] = _mm256_fnmadd_ps(mins, _mm256_set1_ps((*ds.add(j))[1]), acc[c]);
                }
            }
        }
        acc
    }
}

struct Q6KGroups;

/// Eight Q6_K rows' super-blocks unpacked: `q[j][g]` holds `q - 32` of values
/// `4g..4g + 4` of 32-value block `j` of every row (bytes `4r..4r + 4`: row `r`);
/// `scales[h]` the scale of 16-value half `h` of row `r` in i16 lanes `2r` and `2r + 1`;
/// `d` the rows' `d`; `offset` each row's `128 · Σ_h sc_h · Σ_{i in h} (q_i - 32)`.
/// 2,624 bytes where the file holds 8 · 210.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Q6KGroup {
    q: [[[u8; 32]; 8]; 8],
    scales: [[i16; 16]; 16],
    d: [f32; 8],
    offset: [i32; 8],
}

impl RowGroup for Q6KGroups {
    type Block = BlockQ6K;
    type Group = Q6KGroup;
    type Tail<D: ScaledDot> = Q6K<D>;
    const UNSIGNED_ACTS: bool = true;

    fn scratch() -> &'static LocalKey<RefCell<Vec<Q6KGroup>>> {
        &Q6K_GROUPS
    }

    #[inline(always)]
    unsafe fn unpack(first: *const BlockQ6K, stride: usize, out: &mut Q6KGroup) {
        let (offset, ones) = (_mm256_set1_epi8(32), _mm256_set1_epi8(1));
        // per row, Σ_h sc_h · Σ (q - 32) over half h, as 8 x i32 lanes (summed below)
        let mut weight_sums = [_mm256_setzero_si256(); 8];
        for j in 0..QK_K / QK {
            let mut rows = [_mm256_setzero_si256(); 8];
            for (r, row) in rows.iter_mut().enumerate() {
                let blk = first.add(r * stride);
                *row = _mm256_sub_epi8(q6k_sub_block_quants(blk, j), offset);
                // Σ (q - 32) per 16 values: pair sums, then per half in madd with the scales
                let pairs = _mm256_maddubs_epi16(ones, *row);
                weight_sums[r] =
                    _mm256_add_epi32(weight_sums[r], _mm256_madd_epi16(pairs, q6k_sub_block_scales(blk, j)));
            }
            store_transposed(rows, &mut out.q[j]);
        }
        for (r, sums) in weight_sums.iter().enumerate() {
            let blk = first.add(r * stride);
            out.d[r] = q6k_d(blk);
            let mut lanes = [0i32; 8];
            _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, *sums);
            out.offset[r] = 128 * lanes.iter().sum::<i32>();
            for h in 0..QK_K / 16 {
                out.scales[h][2 * r] = (*blk).scales[h] as i16;
                out.scales[h][2 * r + 1] = (*blk).scales[h] as i16;
            }
        }
    }

    #[inline(always)]
    unsafe fn tile<D: ScaledDot, const C: usize>(
        group: *const Q6KGroup,
        qs: [*const u8; C],
        ds: [*const [f32; 2]; C],
        sbs: usize,
    ) -> [__m256; C] {
        let mut acc = [_mm256_setzero_ps(); C];
        for sb in 0..sbs {
            let blk = &*group.add(sb);
            let offset = _mm256_load_si256(blk.offset.as_ptr() as *const __m256i);
            let mut isum = [_mm256_sub_epi32(_mm256_setzero_si256(), offset); C];
            for j in 0..QK_K / QK {
                for half in 0..2 {
                    let scale = _mm256_load_si256(blk.scales[2 * j + half].as_ptr() as *const __m256i);
                    // two registers per i16 sum: 2 · 2 · 255 · 32 < 2^15
                    for pair in 0..2 {
                        let g = 4 * half + 2 * pair;
                        for c in 0..C {
                            let a = qs[c].add(sb * QK_K + j * QK + 4 * g);
                            let s16 = _mm256_add_epi16(
                                products_unsigned(&blk.q[j][g], a),
                                products_unsigned(&blk.q[j][g + 1], a.add(4)),
                            );
                            isum[c] = D::scaled(isum[c], s16, scale);
                        }
                    }
                }
            }
            let d = _mm256_load_ps(blk.d.as_ptr());
            for c in 0..C {
                let f = _mm256_mul_ps(d, _mm256_set1_ps((*ds[c].add(sb * QK_K / QK))[0]));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), f, acc[c]);
            }
        }
        acc
    }

    #[inline(always)]
    unsafe fn file_tile<D: ScaledDot, const C: usize>(
        first: *const BlockQ6K,
        stride: usize,
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        sbs: usize,
    ) -> [__m256; C] {
        let mut acc = [_mm256_setzero_ps(); C];
        for sb in 0..sbs {
            // q - 32 against the activations: the products of q, less 32 times theirs
            let mut less = [[_mm256_setzero_si256(); C]; QK_K / QK];
            for (j, less) in less.iter_mut().enumerate() {
                for c in 0..C {
                    let a = _mm256_loadu_si256(qs[c].add(sb * QK_K + QK * j) as *const __m256i);
                    less[c] = _mm256_maddubs_epi16(_mm256_set1_epi8(32), a);
                }
            }
            let mut partial = [[_mm256_setzero_si256(); 8]; C];
            let mut d = [0f32; 8];
            for r in 0..8 {
                let blk = first.add(r * stride + sb);
                prefetch_next_group(blk, 8, stride);
                d[r] = q6k_d(blk);
                for (j, less) in less.iter().enumerate() {
                    let (q, sc) = (q6k_sub_block_quants(blk, j), q6k_sub_block_scales(blk, j));
                    for c in 0..C {
                        let a = _mm256_loadu_si256(qs[c].add(sb * QK_K + QK * j) as *const __m256i);
                        partial[c][r] = D::scaled_dot_less(partial[c][r], q, a, less[c], sc);
                    }
                }
            }
            // from here as `tile`
            let d = _mm256_loadu_ps(d.as_ptr());
            for c in 0..C {
                let f = _mm256_mul_ps(d, _mm256_set1_ps((*ds[c].add(sb * QK_K / QK))[0]));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(row_totals(partial[c])), f, acc[c]);
            }
        }
        acc
    }
}

/// `maddubs(broadcast(four bytes at a), w)`: four unsigned activations against four signed
/// values of each of eight rows.
#[inline(always)]
unsafe fn products_unsigned(w: *const [u8; 32], a: *const u8) -> __m256i {
    let a = _mm256_set1_epi32(std::ptr::read_unaligned(a as *const i32));
    _mm256_maddubs_epi16(a, _mm256_load_si256(w as *const __m256i))
}

/// Activation rows `i0..i0 + C` against every unpacked group (`groups`, `sbs` per group),
/// a chunk of super-blocks at a time; group `g`'s outputs go to `dst[i * ldd + row0 + 8g ..]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn columns<G: RowGroup, D: ScaledDot, const C: usize>(
    groups: &[G::Group],
    sbs: usize,
    acts: &Acts<'_>,
    i0: usize,
    dst: *mut f32,
    ldd: usize,
    row0: usize,
) {
    // the chunk's activations as unsigned bytes `a + 128`, for the kernels that read them
    // so (written before they are read; not zeroed, which would cost a tenth of the tile)
    let mut unsigned = std::mem::MaybeUninit::<[[u8; CHUNK_SBS * QK_K]; C]>::uninit();
    let unsigned = unsigned.as_mut_ptr() as *mut [u8; CHUNK_SBS * QK_K];
    let mut s0 = 0;
    while s0 < sbs {
        let n = (sbs - s0).min(CHUNK_SBS);
        let mut qs: [*const u8; C] = [std::ptr::null(); C];
        for (c, q) in qs.iter_mut().enumerate() {
            let src = acts.row_qs(i0 + c).add(s0 * QK_K) as *const u8;
            *q = src;
            if G::UNSIGNED_ACTS {
                let flip = _mm256_set1_epi8(-128);
                for i in (0..n * QK_K).step_by(32) {
                    let v = _mm256_xor_si256(_mm256_loadu_si256(src.add(i) as *const __m256i), flip);
                    _mm256_storeu_si256((unsigned.add(c) as *mut u8).add(i) as *mut __m256i, v);
                }
                *q = unsigned.add(c) as *const u8;
            }
        }
        let mut ds: [*const [f32; 2]; C] = [std::ptr::null(); C];
        for (c, d) in ds.iter_mut().enumerate() {
            *d = acts.row_ds(i0 + c).add(s0 * (QK_K / QK));
        }
        for g in 0..groups.len() / sbs {
            let acc = G::tile::<D, C>(groups.as_ptr().add(g * sbs + s0), qs, ds, n);
            put_sums(acc, dst, ldd, i0, row0 + 8 * g, s0 == 0);
        }
        s0 += n;
    }
}

/// [`columns`] with the groups read from the file ([`RowGroup::file_tile`]): the eight
/// rows from `row0 + 8g` of the weight `w` for `g` in `0..groups`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn file_columns<G: RowGroup, D: ScaledDot, const C: usize>(
    w: *const G::Block,
    sbs: usize,
    groups: usize,
    acts: &Acts<'_>,
    i0: usize,
    dst: *mut f32,
    ldd: usize,
    row0: usize,
) {
    // group after group, each a chunk at a time (the chunks as `columns` takes them, so that
    // the outputs are summed alike): eight rows read from start to end, streams the
    // hardware prefetcher follows
    for g in 0..groups {
        let mut s0 = 0;
        while s0 < sbs {
            let n = (sbs - s0).min(CHUNK_SBS);
            let qs: [*const i8; C] = std::array::from_fn(|c| acts.row_qs(i0 + c).add(s0 * QK_K));
            let ds: [*const [f32; 2]; C] = std::array::from_fn(|c| acts.row_ds(i0 + c).add(s0 * (QK_K / QK)));
            let acc = G::file_tile::<D, C>(w.add((row0 + 8 * g) * sbs + s0), sbs, qs, ds, n);
            put_sums(acc, dst, ldd, i0, row0 + 8 * g, s0 == 0);
            s0 += n;
        }
    }
}

/// A tile's sums (lane `r`: weight row `row + r`) into the outputs of activation rows
/// `i0..`: the first chunk of a row writes them, later ones add to them.
#[inline(always)]
unsafe fn put_sums<const C: usize>(acc: [__m256; C], dst: *mut f32, ldd: usize, i0: usize, row: usize, first: bool) {
    for (c, sums) in acc.iter().enumerate() {
        let out = dst.add((i0 + c) * ldd + row);
        let sums = if first { *sums } else { _mm256_add_ps(*sums, _mm256_loadu_ps(out)) };
        _mm256_storeu_ps(out, sums);
    }
}

/// The `groups` groups of eight rows from `row0` of the weight `w` unpacked into this
/// thread's scratch, then against all activation rows a tile at a time ([`columns`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn unpacked_columns<G: RowGroup, D: ScaledDot>(
    w: *const G::Block,
    sbs: usize,
    groups: usize,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
    row0: usize,
) {
    // SAFETY (of the zeroed groups): plain bytes and numbers
    let mut scratch = take_scratch(G::scratch(), groups * sbs);
    let unpacked = &mut scratch[..groups * sbs];
    for g in 0..groups {
        let first = w.add((row0 + 8 * g) * sbs);
        for sb in 0..sbs {
            G::unpack(first.add(sb), sbs, &mut unpacked[g * sbs + sb]);
        }
    }
    let mut i0 = 0;
    while i0 < acts.m {
        let n = (acts.m - i0).min(COLS);
        match n {
            4 => columns::<G, D, 4>(unpacked, sbs, acts, i0, dst, ldd, row0),
            3 => columns::<G, D, 3>(unpacked, sbs, acts, i0, dst, ldd, row0),
            2 => columns::<G, D, 2>(unpacked, sbs, acts, i0, dst, ldd, row0),
            _ => columns::<G, D, 1>(unpacked, sbs, acts, i0, dst, ldd, row0),
        }
        i0 += n;
    }
    G::scratch().with(|cell| cell.replace(scratch));
}

/// Weight rows `rows` against all activation rows: whole groups of eight unpacked and run
/// as above (or, for fewer than [`UNPACKED_MIN_ROWS`] activation rows, read from the file
/// in the same order), the last `rows.len() % 8` in the file's layout.
#[inline(always)]
unsafe fn grouped_rows<G: RowGroup, D: ScaledDot>(
    w: *const G::Block,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    let sbs = nb / (QK_K / QK);
    let groups = rows.len() / 8;
    const _: () = assert!(UNPACKED_MIN_ROWS == COLS + 1, "file_columns takes one tile's rows");
    match acts.m {
        1 => file_columns::<G, D, 1>(w, sbs, groups, acts, 0, dst, ldd, rows.start),
        2 => file_columns::<G, D, 2>(w, sbs, groups, acts, 0, dst, ldd, rows.start),
        3 => file_columns::<G, D, 3>(w, sbs, groups, acts, 0, dst, ldd, rows.start),
        m if m < UNPACKED_MIN_ROWS => file_columns::<G, D, 4>(w, sbs, groups, acts, 0, dst, ldd, rows.start),
        _ => unpacked_columns::<G, D>(w, sbs, groups, acts, dst, ldd, rows.start),
    }
    let tail = rows.start + 8 * groups..rows.end;
    if !tail.is_empty() {
        drive::<G::Tail<D>>(w, nb, tail, acts, dst, ldd);
    }
}

macro_rules! grouped_entry {
    ($features:literal, $name:ident, $group:ty, $block:ty, $dot:ty) => {
        /// Prefill in groups of eight rows (see the module's comment).
        ///
        /// # Safety
        /// As [`drive`]; the CPU has the instruction sets this function enables.
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn $name(
            w: *const $block,
            nb: usize,
            rows: std::ops::Range<usize>,
            acts: &Acts<'_>,
            dst: *mut f32,
            ldd: usize,
        ) {
            grouped_rows::<$group, $dot>(w, nb, rows, acts, dst, ldd)
        }
    };
}

grouped_entry!("avx2,fma,f16c", q4k_grouped_rows, Q4KGroups, BlockQ4K, Madd);
grouped_entry!("avx2,fma,f16c,avxvnni", q4k_grouped_rows_vnni, Q4KGroups, BlockQ4K, Vnni);
grouped_entry!("avx2,fma,f16c", q6k_grouped_rows, Q6KGroups, BlockQ6K, Madd);
grouped_entry!("avx2,fma,f16c,avxvnni", q6k_grouped_rows_vnni, Q6KGroups, BlockQ6K, Vnni);
