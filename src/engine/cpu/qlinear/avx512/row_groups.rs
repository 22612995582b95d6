//! AVX-512 prefill on groups of sixteen weight rows: Q4_K, Q6_K, Q8_0 / Q4_0 / Q5_0 and
//! Q4_1.
//!
//! The interleaved kernels ([`super::Q4KInterleaved`], [`super::SignedInterleaved`])
//! hold 64 values of one weight row per register, so their sums come out per row and
//! activation row and are scaled and added one register at a time. Here a work unit's
//! rows are unpacked sixteen at a time so that one register holds four values of each of
//! sixteen rows; four activation bytes broadcast against it add their products straight
//! into the sixteen rows' lanes, and each scale's sum is converted and scaled once for
//! all sixteen:
//!
//! ```text
//!   isum  = Σ_p vpdpbusd(w_p, broadcast(a[the four values p]))   16 rows, one scale's values
//!   fsum += f32(isum) · [d·sc]_rows                                per scale
//!   acc  += fsum · d_a (− Q4_K's Σ_j [dmin·m_j]_rows · s_a,j)      per super-block
//! ```
//!
//! Q4_K: quants 0..=15 against the signed activations, eight positions per 32-value
//! sub-block. Q6_K: `q − 32` is the signed side, so the activations are taken as `a + 128`
//! (copied so per chunk) and each 16-value half's sum starts at `−128 · Σ (q − 32)`. The
//! 32-value signed formats likewise, eight blocks at a time as one super-block, with a
//! `d_a` per block (a multiply more per block and activation row), or one block at a time
//! where rows are not whole 256-value groups. Q4_1: quants 0..=15 against the signed
//! activations, one block at a time, its `m · s_a` one FMA per block.
//!
//! Where the activations are in the interleaved order the other AVX-512 prefill kernels
//! read (`Acts::interleaved`), they stay so: a scale's sum does not depend on the order of
//! its values, so the weights are unpacked in the activations' order
//! ([`activation_offset`]).
//!
//! The unpacking costs about as much as a few activation rows' products. K-quant prefills
//! of up to one tile of activation rows ([`UNPACKED_MIN_ROWS`]) read the groups from the
//! file instead ([`file_tile`]): each row's four quarter registers are gathered
//! from its block in the activations' order, its sixteen 16-value sums taken in one
//! register, and the sixteen rows' registers (and scales) transposed
//! ([`transpose_16x16`]) into the lanes the tile scales: the same numbers, the same f32
//! steps, the same bits without the unpacking.

use super::super::avx2::{
    load_f16_pair, prefetch_next_group, q4k_scales_mins, q6k_d, q6k_sub_block_quants, transpose_8x8_epi32,
};
use super::super::blocks::{drive, take_scratch, unpacked_rows, Acts, BlockQ4K, BlockQ4_1, BlockQ6K, QK, QK_K};
use super::{signed_interleaved_rows, signed_rows, Q4KInterleaved, SignedInterleaved, SignedPair, UnpackQ6K, Q4_1};
use super::{UNPACKED_Q4K, UNPACKED_SIGNED};
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::thread::LocalKey;

/// The fewest activation rows for which rows in the natural order (Q4_1, and the signed
/// formats' rows not of whole 256-value groups) are grouped: every prefill, as AVX2's
/// (a prompt fed in pieces must give the bits it gives fed whole; the file-layout
/// kernels, left to decode, sum in another order).
pub(in super::super) const GROUPED_MIN_ROWS: usize = 2;

/// Weight rows per group: one 512-bit register of i32 or f32 lanes.
const ROWS: usize = 16;

/// Activation rows per tile: their i32, f32 and accumulated sums take 24 of the 32
/// registers.
const COLS: usize = 8;

/// Values per chunk of a row: a group's chunk (~20 KiB) and a tile's activations (8 KiB)
/// stay in L1 together.
const CHUNK_VALUES: usize = 1024;

/// A K-quant format's sixteen-row groups.
trait RowGroup {
    /// The file's super-block (or the blocks taken as one).
    type Block;
    /// Values per `Block`: 256, or 32 for single signed blocks.
    const VALUES: usize = QK_K;
    /// Sixteen rows' super-blocks at one position, unpacked.
    type Group: Copy + 'static;
    /// Whether the tile reads activations as `a + 128` (unsigned bytes).
    const UNSIGNED_ACTS: bool;
    /// This thread's scratch of unpacked groups.
    fn scratch() -> &'static LocalKey<RefCell<Vec<Self::Group>>>;
    /// The super-blocks at `first`, `first + stride`, … (sixteen rows) into `out`.
    unsafe fn unpack(first: *const Self::Block, stride: usize, out: &mut Self::Group);
    /// One group's `sbs` super-blocks against `C` activation rows (`qs` as the tile reads
    /// them): per activation row, the sixteen weight rows' sums.
    unsafe fn tile<const C: usize>(
        group: *const Self::Group,
        qs: [*const u8; C],
        ds: [*const [f32; 2]; C],
        sbs: usize,
    ) -> [__m512; C];
    /// The rows after the last whole group, by the interleaved kernel.
    unsafe fn tail(
        w: *const Self::Block,
        nb: usize,
        rows: std::ops::Range<usize>,
        acts: &Acts<'_>,
        dst: *mut f32,
        ldd: usize,
    );
}

/// Where, in an interleaved super-block of activations, the four values of position `p`
/// of 32-value block `j` are: register `k = p % 4` holds values `4k..4k + 4` of each
/// 16-value half (`p / 4`) of every block, half `h` of block `j` in its lane `2j + h`.
/// Position `p` is thus values `16 (p / 4) + 4 (p % 4) ..`, i.e. `4p .. 4p + 4` of the
/// block.
#[inline(always)]
fn activation_offset(j: usize, p: usize) -> usize {
    64 * (p % 4) + 4 * (2 * j + p / 4)
}

/// Sixteen rows' 32 values, one register each, stored as eight registers of four values
/// of every row (`out[p]`, bytes `4r..4r + 4`: row `r`'s values `4p..4p + 4`).
#[inline(always)]
unsafe fn store_transposed(rows: &[__m256i; ROWS], out: &mut [[u8; 64]; 8]) {
    for half in 0..2 {
        let mut eight = [_mm256_setzero_si256(); 8];
        eight.copy_from_slice(&rows[8 * half..8 * half + 8]);
        for (p, q) in transpose_8x8_epi32(eight).iter().enumerate() {
            _mm256_store_si256(out[p].as_mut_ptr().add(32 * half) as *mut __m256i, *q);
        }
    }
}

/// `vpdpbusd(acc, w, broadcast(four bytes at a))`: the four values of every row at `w`
/// against the same four activations (`UNSIGNED`: `a` the unsigned side).
#[inline(always)]
unsafe fn dot4<const UNSIGNED: bool>(acc: __m512i, w: *const [u8; 64], a: *const u8) -> __m512i {
    let w = _mm512_load_si512(w as *const __m512i);
    let a = _mm512_set1_epi32(std::ptr::read_unaligned(a as *const i32));
    if UNSIGNED {
        _mm512_dpbusd_epi32(acc, a, w)
    } else {
        _mm512_dpbusd_epi32(acc, w, a)
    }
}

/// The fewest activation rows for which the K-quant rows are unpacked: below it, one
/// tile's worth, the groups are read from the file ([`file_columns`]), where the unpacking
/// would cost more than it saves (a prompt read ahead while typing comes a few tokens at a
/// time). Measured on Llama-1B-shaped Q4_K_M pieces: read from the file, 8 tokens took
/// 94-111 ms against 111-128 unpacked; 12 tokens (two tiles) were no faster (142-155
/// against 130-150 in an earlier version).
pub(in super::super) const UNPACKED_MIN_ROWS: usize = COLS + 1;

/// A K-quant format whose groups can also be read straight from the file ([`file_tile`]).
trait FileRows: RowGroup {
    /// Whether the quarters' unsigned quants are `q` where the tile takes `q − 32` (Q6_K),
    /// so that 32 times the activations' sum of each half comes off.
    const UNSIGNED_OFFSET: bool;
    /// A row's super-block as four quarter registers of unsigned quants (lane `l` of
    /// quarter `k`: its values `16l + 4k ..+ 4`, the activations' interleaved order) and its
    /// sixteen scales as `unpack` computes them, in one register.
    unsafe fn row_quarters(blk: *const Self::Block) -> ([__m512i; 4], __m512);
    /// `tile`'s f32 steps for one super-block up to the activations' `d`, which
    /// [`file_tile`] applies: `sums[c][l]` the sixteen rows' sums of half `l` against
    /// activation row `c`, `scales[l]` the rows' scale `l` (lanes: rows), `ds` the
    /// activation rows' scales of the super-block; what goes straight into `acc` (Q4_K's
    /// mins) goes there, and the scaled sums are returned.
    unsafe fn scale_sums<const C: usize>(
        acc: &mut [__m512; C],
        sums: &[[__m512i; ROWS]; C],
        scales: &[__m512i; ROWS],
        ds: [*const [f32; 2]; C],
    ) -> [__m512; C];
}

/// The 16 x 16 matrix of 32-bit elements `x[row][lane]`, transposed (`out[lane][row]`).
#[inline(always)]
unsafe fn transpose_16x16(x: &[__m512i; ROWS]) -> [__m512i; ROWS] {
    // per 128-bit block, pairs of rows interleaved: [a0 b0 a1 b1] and [a2 b2 a3 b3]
    let mut pairs = [_mm512_setzero_si512(); ROWS];
    for i in 0..8 {
        pairs[2 * i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
        pairs[2 * i + 1] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
    }
    // per 128-bit block b, `quads[4i + q]` holds rows 4i..4i + 4 of element 4b + q
    let mut quads = [_mm512_setzero_si512(); ROWS];
    for i in 0..4 {
        let [lo01, hi01, lo23, hi23] = [pairs[4 * i], pairs[4 * i + 1], pairs[4 * i + 2], pairs[4 * i + 3]];
        quads[4 * i] = _mm512_unpacklo_epi64(lo01, lo23);
        quads[4 * i + 1] = _mm512_unpackhi_epi64(lo01, lo23);
        quads[4 * i + 2] = _mm512_unpacklo_epi64(hi01, hi23);
        quads[4 * i + 3] = _mm512_unpackhi_epi64(hi01, hi23);
    }
    // element 4b + q: block b of quads[q], quads[4 + q], quads[8 + q], quads[12 + q]
    let mut out = [_mm512_setzero_si512(); ROWS];
    for q in 0..4 {
        let even01 = _mm512_shuffle_i32x4::<0x88>(quads[q], quads[4 + q]);
        let odd01 = _mm512_shuffle_i32x4::<0xDD>(quads[q], quads[4 + q]);
        let even23 = _mm512_shuffle_i32x4::<0x88>(quads[8 + q], quads[12 + q]);
        let odd23 = _mm512_shuffle_i32x4::<0xDD>(quads[8 + q], quads[12 + q]);
        out[q] = _mm512_shuffle_i32x4::<0x88>(even01, even23);
        out[8 + q] = _mm512_shuffle_i32x4::<0xDD>(even01, even23);
        out[4 + q] = _mm512_shuffle_i32x4::<0x88>(odd01, odd23);
        out[12 + q] = _mm512_shuffle_i32x4::<0xDD>(odd01, odd23);
    }
    out
}

/// `$f` of `($l, $k)` for the sixteen lanes `l` of quarter `k` (0..4) of an interleaved
/// super-block, as a table `[[u32; 16]; 4]`; or of lane `$l` alone, `[u32; 16]`.
macro_rules! quarter_lanes {
    (|$l:ident| $f:expr) => {
        quarter_lanes!(|$l, _k| $f)[0]
    };
    (|$l:ident, $k:ident| $f:expr) => {{
        let mut t = [[0u32; 16]; 4];
        let mut $k = 0usize;
        while $k < 4 {
            let mut $l = 0usize;
            while $l < 16 {
                t[$k][$l] = ($f) as u32;
                $l += 1;
            }
            $k += 1;
        }
        t
    }};
}

/// Lane `l` of an interleaved quarter `k` holds values `16l + 4k ..+ 4` of the super-block:
/// of Q4_K's sub-block `l / 2`, the low (even) or high (odd) nibbles of the 32 bytes at
/// `32 · (l / 4)`, so the 32-bit word `8 · (l / 4) + 4 · (l % 2) + k` of `qs`, shifted by
/// [`Q4K_NIBBLE_SHIFTS`].
const Q4K_QUARTER_WORDS: [[u32; 16]; 4] = quarter_lanes!(|l, k| 8 * (l / 4) + 4 * (l % 2) + k);
const Q4K_NIBBLE_SHIFTS: [u32; 16] = quarter_lanes!(|l| 4 * ((l / 2) % 2));

/// As [`Q4K_QUARTER_WORDS`] for Q6_K, whose 32-value block `b = l / 2` finds its low bits
/// and high bits where [`BlockQ6K::sub_block`] says: the words of `ql` and of `qh`, the
/// low nibble's shift and the rotation that brings the two high bits to bits 4 and 5.
const Q6K_QL_WORDS: [[u32; 16]; 4] = quarter_lanes!(|l, k| 16 * (l / 8) + 8 * ((l / 2) % 2) + 4 * (l % 2) + k);
const Q6K_QH_WORDS: [[u32; 16]; 4] = quarter_lanes!(|l, k| 8 * (l / 8) + 4 * (l % 2) + k);
const Q6K_QL_SHIFTS: [u32; 16] = quarter_lanes!(|l| 4 * (((l / 2) % 4) / 2));
const Q6K_QH_ROTATIONS: [u32; 16] = quarter_lanes!(|l| (4 + 32 - 2 * ((l / 2) % 4)) % 32);

/// A constant table as a register.
#[inline(always)]
unsafe fn lanes(t: &[u32; 16]) -> __m512i {
    _mm512_loadu_si512(t.as_ptr() as *const __m512i)
}

struct Q4KGroups;

/// Sixteen Q4_K rows' super-blocks unpacked: `q[j][p]` holds the four values of position
/// `p` of sub-block `j` of every row (bytes `4r..4r + 4`: row `r`, values `4p..4p + 4`);
/// `scales[j]` the rows' `d · sc_j`, `mins[j]` their `dmin · m_j`. 5,120 bytes where the
/// file holds 16 · 144.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Q4KGroup {
    q: [[[u8; 64]; 8]; 8],
    scales: [[f32; ROWS]; 8],
    mins: [[f32; ROWS]; 8],
}

struct Q6KGroups;

/// Sixteen Q6_K rows' super-blocks unpacked: `q[j][p]` holds `q − 32` of the four values
/// of position `p` of 32-value block `j` of every row; `scales[h]` the rows' `d · sc_h` of
/// 16-value half `h`, and `start[h]` their `−128 · Σ (q − 32)` over it. 6,144 bytes where
/// the file holds 16 · 210.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Q6KGroup {
    q: [[[u8; 64]; 8]; 8],
    scales: [[f32; ROWS]; 16],
    start: [[i32; ROWS]; 16],
}

/// Q8_0, Q4_0 or Q5_0 rows, `N` blocks taken as one super-block: eight against
/// interleaved activations (rows of whole 256-value groups), one against the natural
/// order (any other row length).
struct SignedGroups<W, const N: usize>(PhantomData<W>);

/// Sixteen rows' `N` signed blocks unpacked: `q[j][p]` holds the quants of position `p`
/// of block `j` of every row; `scales[j]` the rows' `d` of block `j`, and `start[j]` their
/// `−128 · Σ q` over it. 768 bytes per block where the file holds 16 · 34 (Q8_0).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct SignedGroup<const N: usize> {
    q: [[[u8; 64]; 8]; N],
    scales: [[f32; ROWS]; N],
    start: [[i32; ROWS]; N],
}

struct Q4_1Groups;

/// Sixteen Q4_1 rows' block unpacked: `q[p]` holds the quants (0..=15) of position `p` of
/// every row; `scales` the rows' `d`, `mins` their `m`. 640 bytes where the file holds
/// 16 · 20.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Q4_1Group {
    q: [[u8; 64]; 8],
    scales: [f32; ROWS],
    mins: [f32; ROWS],
}

thread_local! {
    static Q4_1_GROUPS: RefCell<Vec<Q4_1Group>> = const { RefCell::new(Vec::new()) };
    static Q4K_GROUPS: RefCell<Vec<Q4KGroup>> = const { RefCell::new(Vec::new()) };
    static Q6K_GROUPS: RefCell<Vec<Q6KGroup>> = const { RefCell::new(Vec::new()) };
    static SIGNED_GROUPS: RefCell<Vec<SignedGroup<8>>> = const { RefCell::new(Vec::new()) };
    static SIGNED_BLOCKS: RefCell<Vec<SignedGroup<1>>> = const { RefCell::new(Vec::new()) };
}

/// `−128 · Σ` of the signed quants at `q` (four positions, sixteen rows each), the start
/// of a sum against activations taken as `a + 128`.
#[inline(always)]
unsafe fn start_of(q: &[[u8; 64]]) -> __m512i {
    let mut sum = _mm512_setzero_si512();
    for p in q {
        sum = dot4::<true>(sum, p, [1u8; 4].as_ptr());
    }
    _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sum))
}

/// A Q4_K super-block's eight `d · sc_j` (lanes 0..8) and eight `dmin · m_j` (8..16):
/// what the groups keep of each row ([`Q4KGroups`]' `unpack` and `file_tile` alike).
#[inline(always)]
unsafe fn q4k_row_scales(blk: *const BlockQ4K) -> __m512 {
    let scales_mins = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q4k_scales_mins(blk)));
    let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
    let d_then_dmin = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    _mm512_mul_ps(scales_mins, _mm512_permutexvar_ps(d_then_dmin, _mm512_castps128_ps512(dd)))
}

/// A Q6_K super-block's sixteen `d · sc_h` ([`Q6KGroups`]' `unpack` and `file_tile` alike).
#[inline(always)]
unsafe fn q6k_row_scales(blk: *const BlockQ6K) -> __m512 {
    let scales = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((*blk).scales.as_ptr() as *const __m128i)));
    _mm512_mul_ps(scales, _mm512_set1_ps(q6k_d(blk)))
}

impl RowGroup for Q4KGroups {
    type Block = BlockQ4K;
    type Group = Q4KGroup;
    const UNSIGNED_ACTS: bool = false;

    fn scratch() -> &'static LocalKey<RefCell<Vec<Q4KGroup>>> {
        &Q4K_GROUPS
    }

    #[inline(always)]
    unsafe fn unpack(first: *const BlockQ4K, stride: usize, out: &mut Q4KGroup) {
        for r in 0..ROWS {
            let blk = first.add(r * stride);
            let mut sm = [0u8; 16];
            _mm_storeu_si128(sm.as_mut_ptr() as *mut __m128i, q4k_scales_mins(blk));
            let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
            let (d, dmin) = (_mm_cvtss_f32(dd), _mm_cvtss_f32(_mm_movehdup_ps(dd)));
            for j in 0..QK_K / QK {
                out.scales[j][r] = d * sm[j] as f32;
                out.mins[j][r] = dmin * sm[8 + j] as f32;
            }
        }
        let mask = _mm256_set1_epi8(0x0F);
        for j in 0..QK_K / QK {
            // sub-block j: the low (even j) or high nibbles of the 32 bytes at 32 * (j / 2)
            let mut rows = [_mm256_setzero_si256(); ROWS];
            for (r, row) in rows.iter_mut().enumerate() {
                let at = (*first.add(r * stride)).qs.as_ptr().add(QK * (j / 2));
                let raw = _mm256_loadu_si256(at as *const __m256i);
                let raw = if j % 2 == 0 { raw } else { _mm256_srli_epi16::<4>(raw) };
                *row = _mm256_and_si256(raw, mask);
            }
            store_transposed(&rows, &mut out.q[j]);
        }
    }

    #[inline(always)]
    unsafe fn tile<const C: usize>(
        group: *const Q4KGroup,
        qs: [*const u8; C],
        ds: [*const [f32; 2]; C],
        sbs: usize,
    ) -> [__m512; C] {
        let mut acc = [_mm512_setzero_ps(); C];
        for sb in 0..sbs {
            let blk = &*group.add(sb);
            let mut fsum = [_mm512_setzero_ps(); C];
            for j in 0..QK_K / QK {
                let mut isum = [_mm512_setzero_si512(); C];
                for p in 0..8 {
                    let at = sb * QK_K + activation_offset(j, p);
                    for c in 0..C {
                        isum[c] = dot4::<false>(isum[c], &blk.q[j][p], qs[c].add(at));
                    }
                }
                let scales = _mm512_load_ps(blk.scales[j].as_ptr());
                let mins = _mm512_load_ps(blk.mins[j].as_ptr());
                for c in 0..C {
                    fsum[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), scales, fsum[c]);
                    // s_a of sub-block j: the activations' sum there
                    acc[c] = _mm512_fnmadd_ps(mins, _mm512_set1_ps((*ds[c].add(sb * 8 + j))[1]), acc[c]);
                }
            }
            for c in 0..C {
                // one d_a per super-block (`ActScale::SuperBlock`)
                acc[c] = _mm512_fmadd_ps(fsum[c], _mm512_set1_ps((*ds[c].add(sb * 8))[0]), acc[c]);
            }
        }
        acc
    }

    #[inline(always)]
    unsafe fn tail(
        w: *const BlockQ4K,
        nb: usize,
        rows: std::ops::Range<usize>,
        acts: &Acts<'_>,
        dst: *mut f32,
        ldd: usize,
    ) {
        unpacked_rows::<Q4KInterleaved, Q4KInterleaved>(&UNPACKED_Q4K, w, nb, rows, acts, dst, ldd)
    }
}

impl RowGroup for Q6KGroups {
    type Block = BlockQ6K;
    type Group = Q6KGroup;
    const UNSIGNED_ACTS: bool = true;

    fn scratch() -> &'static LocalKey<RefCell<Vec<Q6KGroup>>> {
        &Q6K_GROUPS
    }

    #[inline(always)]
    unsafe fn unpack(first: *const BlockQ6K, stride: usize, out: &mut Q6KGroup) {
        let offset = _mm256_set1_epi8(32);
        for r in 0..ROWS {
            let mut scales = [0f32; 16];
            _mm512_storeu_ps(scales.as_mut_ptr(), q6k_row_scales(first.add(r * stride)));
            for (h, scale) in scales.iter().enumerate() {
                out.scales[h][r] = *scale;
            }
        }
        for j in 0..QK_K / QK {
            let mut rows = [_mm256_setzero_si256(); ROWS];
            for (r, row) in rows.iter_mut().enumerate() {
                *row = _mm256_sub_epi8(q6k_sub_block_quants(first.add(r * stride), j), offset);
            }
            store_transposed(&rows, &mut out.q[j]);
            // per half, −128 · Σ (q − 32) of every row over its four positions
            for half in 0..2 {
                let start = start_of(&out.q[j][4 * half..4 * half + 4]);
                _mm512_store_si512(out.start[2 * j + half].as_mut_ptr() as *mut __m512i, start);
            }
        }
    }

    #[inline(always)]
    unsafe fn tile<const C: usize>(
        group: *const Q6KGroup,
        qs: [*const u8; C],
        ds: [*const [f32; 2]; C],
        sbs: usize,
    ) -> [__m512; C] {
        let mut acc = [_mm512_setzero_ps(); C];
        for sb in 0..sbs {
            let blk = &*group.add(sb);
            let mut fsum = [_mm512_setzero_ps(); C];
            for h in 0..QK_K / 16 {
                let (j, half) = (h / 2, h % 2);
                let start = _mm512_load_si512(blk.start[h].as_ptr() as *const __m512i);
                let mut isum = [start; C];
                for p in 4 * half..4 * half + 4 {
                    let at = sb * QK_K + activation_offset(j, p);
                    for c in 0..C {
                        isum[c] = dot4::<true>(isum[c], &blk.q[j][p], qs[c].add(at));
                    }
                }
                let scales = _mm512_load_ps(blk.scales[h].as_ptr());
                for c in 0..C {
                    fsum[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), scales, fsum[c]);
                }
            }
            for c in 0..C {
                // one d_a per super-block (`ActScale::SuperBlock`)
                acc[c] = _mm512_fmadd_ps(fsum[c], _mm512_set1_ps((*ds[c].add(sb * 8))[0]), acc[c]);
            }
        }
        acc
    }

    #[inline(always)]
    unsafe fn tail(
        w: *const BlockQ6K,
        nb: usize,
        rows: std::ops::Range<usize>,
        acts: &Acts<'_>,
        dst: *mut f32,
        ldd: usize,
    ) {
        unpacked_rows::<SignedInterleaved, UnpackQ6K>(&UNPACKED_SIGNED, w, nb, rows, acts, dst, ldd)
    }
}

impl FileRows for Q4KGroups {
    const UNSIGNED_OFFSET: bool = false;

    #[inline(always)]
    unsafe fn row_quarters(blk: *const BlockQ4K) -> ([__m512i; 4], __m512) {
        let (mask, shifts) = (_mm512_set1_epi8(0x0F), lanes(&Q4K_NIBBLE_SHIFTS));
        let q = (*blk).qs.as_ptr();
        let (low, high) = (_mm512_loadu_si512(q as *const __m512i), _mm512_loadu_si512(q.add(64) as *const __m512i));
        let mut quarters = [_mm512_setzero_si512(); 4];
        for (quarter, words) in quarters.iter_mut().zip(&Q4K_QUARTER_WORDS) {
            let words = _mm512_permutex2var_epi32(low, lanes(words), high);
            *quarter = _mm512_and_si512(_mm512_srlv_epi32(words, shifts), mask);
        }
        (quarters, q4k_row_scales(blk))
    }

    #[inline(always)]
    unsafe fn scale_sums<const C: usize>(
        acc: &mut [__m512; C],
        sums: &[[__m512i; ROWS]; C],
        scales: &[__m512i; ROWS],
        ds: [*const [f32; 2]; C],
    ) -> [__m512; C] {
        // `scales[j]`: sub-block j's d · sc_j, `scales[8 + j]` its dmin · m_j
        let mut fsum = [_mm512_setzero_ps(); C];
        for j in 0..QK_K / QK {
            let (sc, mins) = (_mm512_castsi512_ps(scales[j]), _mm512_castsi512_ps(scales[8 + j]));
            for c in 0..C {
                let isum = _mm512_add_epi32(sums[c][2 * j], sums[c][2 * j + 1]);
                fsum[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, fsum[c]);
                acc[c] = _mm512_fnmadd_ps(mins, _mm512_set1_ps((*ds[c].add(j))[1]), acc[c]);
            }
        }
        fsum
    }
}

impl FileRows for Q6KGroups {
    const UNSIGNED_OFFSET: bool = true;

    #[inline(always)]
    unsafe fn row_quarters(blk: *const BlockQ6K) -> ([__m512i; 4], __m512) {
        let (low4, top2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        let (ql_shifts, qh_rotations) = (lanes(&Q6K_QL_SHIFTS), lanes(&Q6K_QH_ROTATIONS));
        let ql = (*blk).ql.as_ptr();
        let (ql0, ql1) = (_mm512_loadu_si512(ql as *const __m512i), _mm512_loadu_si512(ql.add(64) as *const __m512i));
        let qh = _mm512_loadu_si512((*blk).qh.as_ptr() as *const __m512i);
        let mut quarters = [_mm512_setzero_si512(); 4];
        for (k, quarter) in quarters.iter_mut().enumerate() {
            let low = _mm512_permutex2var_epi32(ql0, lanes(&Q6K_QL_WORDS[k]), ql1);
            let low = _mm512_and_si512(_mm512_srlv_epi32(low, ql_shifts), low4);
            let high = _mm512_permutexvar_epi32(lanes(&Q6K_QH_WORDS[k]), qh);
            let high = _mm512_and_si512(_mm512_rolv_epi32(high, qh_rotations), top2);
            *quarter = _mm512_or_si512(low, high);
        }
        (quarters, q6k_row_scales(blk))
    }

    #[inline(always)]
    unsafe fn scale_sums<const C: usize>(
        _acc: &mut [__m512; C],
        sums: &[[__m512i; ROWS]; C],
        scales: &[__m512i; ROWS],
        _ds: [*const [f32; 2]; C],
    ) -> [__m512; C] {
        // `scales[h]`: 16-value half h's d · sc_h
        let mut fsum = [_mm512_setzero_ps(); C];
        for (h, sc) in scales.iter().enumerate() {
            for c in 0..C {
                fsum[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[c][h]), _mm512_castsi512_ps(*sc), fsum[c]);
            }
        }
        fsum
    }
}

/// [`RowGroup::tile`]'s sums from the file's super-blocks (the sixteen rows at `first`,
/// `first + stride`, …), not unpacked, against the signed interleaved activations: each
/// row's sixteen 16-value sums are the tile's integers taken in another order, brought into
/// its lanes by [`transpose_16x16`], and the f32 steps are `tile`'s
/// ([`FileRows::scale_sums`]), so the outputs are the same bits.
#[inline(always)]
unsafe fn file_tile<G: FileRows, const C: usize>(
    first: *const G::Block,
    stride: usize,
    qs: [*const i8; C],
    ds: [*const [f32; 2]; C],
    sbs: usize,
) -> [__m512; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    for sb in 0..sbs {
        let a = |c: usize, k: usize| qs[c].add(sb * QK_K + 64 * k) as *const __m512i;
        // what the unsigned quants' products carry beyond the tile's: 32 · Σ a per half
        let mut offset = [_mm512_setzero_si512(); C];
        if G::UNSIGNED_OFFSET {
            for (c, offset) in offset.iter_mut().enumerate() {
                for k in 0..4 {
                    *offset = _mm512_dpbusd_epi32(*offset, _mm512_set1_epi8(1), _mm512_loadu_si512(a(c, k)));
                }
                *offset = _mm512_slli_epi32::<5>(*offset);
            }
        }
        // per activation row, each weight row's sums of its sixteen 16-value halves
        let mut halves = [[_mm512_setzero_si512(); ROWS]; C];
        let mut row_scales = [_mm512_setzero_si512(); ROWS];
        for r in 0..ROWS {
            let blk = first.add(r * stride + sb);
            prefetch_next_group(blk, ROWS, stride);
            let (quarters, scales) = G::row_quarters(blk);
            row_scales[r] = _mm512_castps_si512(scales);
            for c in 0..C {
                let mut dots = _mm512_sub_epi32(_mm512_setzero_si512(), offset[c]);
                for (k, quarter) in quarters.iter().enumerate() {
                    dots = _mm512_dpbusd_epi32(dots, *quarter, _mm512_loadu_si512(a(c, k)));
                }
                halves[c][r] = dots;
            }
        }
        // the sixteen rows in the lanes, as `tile` takes them
        let scales = transpose_16x16(&row_scales);
        let mut sums = [[_mm512_setzero_si512(); ROWS]; C];
        for c in 0..C {
            sums[c] = transpose_16x16(&halves[c]);
        }
        let ds = ds.map(|d| d.add(sb * (QK_K / QK)));
        let fsum = G::scale_sums(&mut acc, &sums, &scales, ds);
        for c in 0..C {
            acc[c] = _mm512_fmadd_ps(fsum[c], _mm512_set1_ps((*ds[c])[0]), acc[c]);
        }
    }
    acc
}

/// The scratch of [`SignedGroups`] with `N` blocks per group.
trait SignedScratch<const N: usize> {
    fn scratch() -> &'static LocalKey<RefCell<Vec<SignedGroup<N>>>>;
}

impl<W> SignedScratch<8> for SignedGroups<W, 8> {
    fn scratch() -> &'static LocalKey<RefCell<Vec<SignedGroup<8>>>> {
        &SIGNED_GROUPS
    }
}

impl<W> SignedScratch<1> for SignedGroups<W, 1> {
    fn scratch() -> &'static LocalKey<RefCell<Vec<SignedGroup<1>>>> {
        &SIGNED_BLOCKS
    }
}

impl<W: SignedPair, const N: usize> RowGroup for SignedGroups<W, N>
where
    SignedGroups<W, N>: SignedScratch<N>,
{
    type Block = [W::Block; N];
    type Group = SignedGroup<N>;
    const VALUES: usize = N * QK;
    const UNSIGNED_ACTS: bool = true;

    fn scratch() -> &'static LocalKey<RefCell<Vec<SignedGroup<N>>>> {
        <Self as SignedScratch<N>>::scratch()
    }

    #[inline(always)]
    unsafe fn unpack(first: *const [W::Block; N], stride: usize, out: &mut SignedGroup<N>) {
        for r in 0..ROWS {
            let blk = first.add(r * stride) as *const W::Block;
            for j in 0..N {
                // every signed block starts with its f16 scale
                let d = std::ptr::read_unaligned(blk.add(j) as *const u16) as i32;
                out.scales[j][r] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(d)));
            }
        }
        for j in 0..N {
            let mut rows = [_mm256_setzero_si256(); ROWS];
            for (r, row) in rows.iter_mut().enumerate() {
                *row = W::quants((first.add(r * stride) as *const W::Block).add(j));
            }
            store_transposed(&rows, &mut out.q[j]);
            _mm512_store_si512(out.start[j].as_mut_ptr() as *mut __m512i, start_of(&out.q[j]));
        }
    }

    #[inline(always)]
    unsafe fn tile<const C: usize>(
        group: *const SignedGroup<N>,
        qs: [*const u8; C],
        ds: [*const [f32; 2]; C],
        sbs: usize,
    ) -> [__m512; C] {
        let mut acc = [_mm512_setzero_ps(); C];
        for sb in 0..sbs {
            let blk = &*group.add(sb);
            for j in 0..N {
                let start = _mm512_load_si512(blk.start[j].as_ptr() as *const __m512i);
                let mut isum = [start; C];
                for p in 0..8 {
                    // a single block is in the natural order: position p at 4p
                    let at = sb * N * QK + if N == 1 { 4 * p } else { activation_offset(j, p) };
                    for c in 0..C {
                        isum[c] = dot4::<true>(isum[c], &blk.q[j][p], qs[c].add(at));
                    }
                }
                let scales = _mm512_load_ps(blk.scales[j].as_ptr());
                for c in 0..C {
                    // d_a of block j (`ActScale::Block`)
                    let dot = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[c]), scales);
                    acc[c] = _mm512_fmadd_ps(dot, _mm512_set1_ps((*ds[c].add(sb * N + j))[0]), acc[c]);
                }
            }
        }
        acc
    }

    #[inline(always)]
    unsafe fn tail(
        w: *const [W::Block; N],
        nb: usize,
        rows: std::ops::Range<usize>,
        acts: &Acts<'_>,
        dst: *mut f32,
        ldd: usize,
    ) {
        if N == 1 {
            signed_rows::<W>(w as *const W::Block, nb, rows, acts, dst, ldd)
        } else {
            signed_interleaved_rows::<W>(w as *const W::Block, nb, rows, acts, dst, ldd)
        }
    }
}

impl RowGroup for Q4_1Groups {
    type Block = BlockQ4_1;
    type Group = Q4_1Group;
    const VALUES: usize = QK;
    const UNSIGNED_ACTS: bool = false;

    fn scratch() -> &'static LocalKey<RefCell<Vec<Q4_1Group>>> {
        &Q4_1_GROUPS
    }

    #[inline(always)]
    unsafe fn unpack(first: *const BlockQ4_1, stride: usize, out: &mut Q4_1Group) {
        let mask = _mm_set1_epi8(0x0F);
        let mut rows = [_mm256_setzero_si256(); ROWS];
        for (r, row) in rows.iter_mut().enumerate() {
            let blk = first.add(r * stride);
            let dm = load_f16_pair(blk as *const u8);
            out.scales[r] = _mm_cvtss_f32(dm);
            out.mins[r] = _mm_cvtss_f32(_mm_movehdup_ps(dm));
            // values 0..16 in the low nibbles, 16..32 in the high
            let raw = _mm_loadu_si128((*blk).qs.as_ptr() as *const __m128i);
            let (low, high) = (_mm_and_si128(raw, mask), _mm_and_si128(_mm_srli_epi16::<4>(raw), mask));
            *row = _mm256_set_m128i(high, low);
        }
        store_transposed(&rows, &mut out.q);
    }

    #[inline(always)]
    unsafe fn tile<const C: usize>(
        group: *const Q4_1Group,
        qs: [*const u8; C],
        ds: [*const [f32; 2]; C],
        blocks: usize,
    ) -> [__m512; C] {
        let mut acc = [_mm512_setzero_ps(); C];
        for b in 0..blocks {
            let blk = &*group.add(b);
            let mut isum = [_mm512_setzero_si512(); C];
            for p in 0..8 {
                for c in 0..C {
                    isum[c] = dot4::<false>(isum[c], &blk.q[p], qs[c].add(b * QK + 4 * p));
                }
            }
            let (scales, mins) = (_mm512_load_ps(blk.scales.as_ptr()), _mm512_load_ps(blk.mins.as_ptr()));
            for c in 0..C {
                // d_w · d_a · Σ q_w q_a + m_w · s_a, s_a = d_a · Σ q_a
                let [da, sa] = *ds[c].add(b);
                let dot = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[c]), scales);
                acc[c] = _mm512_fmadd_ps(dot, _mm512_set1_ps(da), acc[c]);
                acc[c] = _mm512_fmadd_ps(mins, _mm512_set1_ps(sa), acc[c]);
            }
        }
        acc
    }

    #[inline(always)]
    unsafe fn tail(
        w: *const BlockQ4_1,
        nb: usize,
        rows: std::ops::Range<usize>,
        acts: &Acts<'_>,
        dst: *mut f32,
        ldd: usize,
    ) {
        drive::<Q4_1>(w, nb, rows, acts, dst, ldd)
    }
}

/// Activation rows `i0..i0 + C` against every unpacked group (`sbs` per group), a chunk of
/// super-blocks at a time; group `g`'s outputs go to `dst[i * ldd + row0 + 16g ..]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn columns<G: RowGroup, const C: usize>(
    groups: &[G::Group],
    sbs: usize,
    acts: &Acts<'_>,
    i0: usize,
    dst: *mut f32,
    ldd: usize,
    row0: usize,
) {
    // the chunk's activations as unsigned bytes `a + 128`, for the kernels that read them
    // so (written before they are read; not zeroed)
    let mut unsigned = std::mem::MaybeUninit::<[[u8; CHUNK_VALUES]; C]>::uninit();
    let unsigned = unsigned.as_mut_ptr() as *mut [u8; CHUNK_VALUES];
    let mut s0 = 0;
    while s0 < sbs {
        let n = (sbs - s0).min(CHUNK_VALUES / G::VALUES);
        let mut qs: [*const u8; C] = [std::ptr::null(); C];
        for (c, q) in qs.iter_mut().enumerate() {
            let src = acts.row_qs(i0 + c).add(s0 * G::VALUES) as *const u8;
            *q = src;
            if G::UNSIGNED_ACTS {
                let flip = _mm256_set1_epi8(-128);
                for i in (0..n * G::VALUES).step_by(32) {
                    let v = _mm256_xor_si256(_mm256_loadu_si256(src.add(i) as *const __m256i), flip);
                    _mm256_storeu_si256((unsigned.add(c) as *mut u8).add(i) as *mut __m256i, v);
                }
                *q = unsigned.add(c) as *const u8;
            }
        }
        let mut ds: [*const [f32; 2]; C] = [std::ptr::null(); C];
        for (c, d) in ds.iter_mut().enumerate() {
            *d = acts.row_ds(i0 + c).add(s0 * (G::VALUES / QK));
        }
        for g in 0..groups.len() / sbs {
            let acc = G::tile::<C>(groups.as_ptr().add(g * sbs + s0), qs, ds, n);
            for (c, sums) in acc.iter().enumerate() {
                // the first chunk writes the outputs, later ones add to them
                let out = dst.add((i0 + c) * ldd + row0 + ROWS * g);
                let sums = if s0 == 0 { *sums } else { _mm512_add_ps(*sums, _mm512_loadu_ps(out)) };
                _mm512_storeu_ps(out, sums);
            }
        }
        s0 += n;
    }
}

/// A tile's sums (lane `r`: weight row `row + r`) into the outputs of activation rows
/// `i0..`: the first chunk of a row writes them, later ones add to them.
#[inline(always)]
unsafe fn put_sums<const C: usize>(acc: [__m512; C], dst: *mut f32, ldd: usize, i0: usize, row: usize, first: bool) {
    for (c, sums) in acc.iter().enumerate() {
        let out = dst.add((i0 + c) * ldd + row);
        let sums = if first { *sums } else { _mm512_add_ps(*sums, _mm512_loadu_ps(out)) };
        _mm512_storeu_ps(out, sums);
    }
}

/// [`columns`] with the K-quant groups read from the file ([`file_tile`]): the
/// sixteen rows from `row0 + 16g` of the weight `w` for `g` in `0..groups`, against the
/// `C` activation rows, in [`columns`]' chunks (so that the outputs are summed alike).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn file_columns<G: FileRows, const C: usize>(
    w: *const G::Block,
    sbs: usize,
    groups: usize,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
    row0: usize,
) {
    for g in 0..groups {
        let mut s0 = 0;
        while s0 < sbs {
            let n = (sbs - s0).min(CHUNK_VALUES / QK_K);
            let qs: [*const i8; C] = std::array::from_fn(|c| acts.row_qs(c).add(s0 * QK_K));
            let ds: [*const [f32; 2]; C] = std::array::from_fn(|c| acts.row_ds(c).add(s0 * (QK_K / QK)));
            let acc = file_tile::<G, C>(w.add((row0 + ROWS * g) * sbs + s0), sbs, qs, ds, n);
            put_sums(acc, dst, ldd, 0, row0 + ROWS * g, s0 == 0);
            s0 += n;
        }
    }
}

/// The `groups` groups of sixteen rows from `row0` of the weight `w` unpacked into this
/// thread's scratch, then against all activation rows a tile at a time ([`columns`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn unpacked_columns<G: RowGroup>(
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
        let first = w.add((row0 + ROWS * g) * sbs);
        for sb in 0..sbs {
            G::unpack(first.add(sb), sbs, &mut unpacked[g * sbs + sb]);
        }
    }
    let mut i0 = 0;
    while i0 < acts.m {
        let n = (acts.m - i0).min(COLS);
        match n {
            8 => columns::<G, 8>(unpacked, sbs, acts, i0, dst, ldd, row0),
            7 => columns::<G, 7>(unpacked, sbs, acts, i0, dst, ldd, row0),
            6 => columns::<G, 6>(unpacked, sbs, acts, i0, dst, ldd, row0),
            5 => columns::<G, 5>(unpacked, sbs, acts, i0, dst, ldd, row0),
            4 => columns::<G, 4>(unpacked, sbs, acts, i0, dst, ldd, row0),
            3 => columns::<G, 3>(unpacked, sbs, acts, i0, dst, ldd, row0),
            2 => columns::<G, 2>(unpacked, sbs, acts, i0, dst, ldd, row0),
            _ => columns::<G, 1>(unpacked, sbs, acts, i0, dst, ldd, row0),
        }
        i0 += n;
    }
    G::scratch().with(|cell| cell.replace(scratch));
}

/// Weight rows `rows` against all (interleaved) activation rows: whole groups of sixteen
/// unpacked and run as above, the last `rows.len() % 16` by the interleaved kernel.
#[inline(always)]
unsafe fn grouped_rows<G: RowGroup>(
    w: *const G::Block,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    let sbs = nb / (G::VALUES / QK);
    let groups = rows.len() / ROWS;
    unpacked_columns::<G>(w, sbs, groups, acts, dst, ldd, rows.start);
    let tail = rows.start + ROWS * groups..rows.end;
    if !tail.is_empty() {
        G::tail(w, nb, tail, acts, dst, ldd);
    }
}

/// [`grouped_rows`] with the K-quant groups read from the file ([`file_tile`],
/// the same bits), for prefills of fewer than [`UNPACKED_MIN_ROWS`] activation rows.
#[inline(always)]
unsafe fn file_rows<G: FileRows>(
    w: *const G::Block,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    debug_assert!(acts.m < UNPACKED_MIN_ROWS);
    let sbs = nb / (QK_K / QK);
    let groups = rows.len() / ROWS;
    const _: () = assert!(UNPACKED_MIN_ROWS == COLS + 1, "file_columns takes one tile's rows");
    let row0 = rows.start;
    match acts.m {
        8 => file_columns::<G, 8>(w, sbs, groups, acts, dst, ldd, row0),
        7 => file_columns::<G, 7>(w, sbs, groups, acts, dst, ldd, row0),
        6 => file_columns::<G, 6>(w, sbs, groups, acts, dst, ldd, row0),
        5 => file_columns::<G, 5>(w, sbs, groups, acts, dst, ldd, row0),
        4 => file_columns::<G, 4>(w, sbs, groups, acts, dst, ldd, row0),
        3 => file_columns::<G, 3>(w, sbs, groups, acts, dst, ldd, row0),
        2 => file_columns::<G, 2>(w, sbs, groups, acts, dst, ldd, row0),
        _ => file_columns::<G, 1>(w, sbs, groups, acts, dst, ldd, row0),
    }
    let tail = rows.start + ROWS * groups..rows.end;
    if !tail.is_empty() {
        G::tail(w, nb, tail, acts, dst, ldd);
    }
}

macro_rules! grouped_entry {
    ($name:ident, $rows:ident, $group:ty, $block:ty) => {
        /// Prefill in groups of sixteen rows (see the module's comment).
        ///
        /// # Safety
        /// As [`super::super::blocks::drive`], with `acts` interleaved for the K-quants
        /// (never for Q4_1), and for the `*_file_rows` entries fewer than
        /// [`UNPACKED_MIN_ROWS`] activation rows; the CPU has AVX-512 F/BW/VNNI.
        #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
        pub(in super::super) unsafe fn $name(
            w: *const $block,
            nb: usize,
            rows: std::ops::Range<usize>,
            acts: &Acts<'_>,
            dst: *mut f32,
            ldd: usize,
        ) {
            $rows::<$group>(w, nb, rows, acts, dst, ldd)
        }
    };
}

grouped_entry!(q4_1_grouped_rows, grouped_rows, Q4_1Groups, BlockQ4_1);
grouped_entry!(q4k_grouped_rows, grouped_rows, Q4KGroups, BlockQ4K);
grouped_entry!(q6k_grouped_rows, grouped_rows, Q6KGroups, BlockQ6K);
// entries of their own, not branches of the ones above: with the branch there, the
// unpacked Q4_K tiles of long prefills were compiled ~15 % slower
grouped_entry!(q4k_file_rows, file_rows, Q4KGroups, BlockQ4K);
grouped_entry!(q6k_file_rows, file_rows, Q6KGroups, BlockQ6K);

/// Q8_0, Q4_0 or Q5_0 prefill in groups of sixteen rows (see the module's comment):
/// eight blocks at a time against interleaved activations (rows of whole 256-value
/// groups), else one at a time in the natural order.
///
/// # Safety
/// As [`super::super::blocks::drive`] (`nb` a multiple of 8 when `acts` are interleaved);
/// the CPU has AVX-512 F/BW/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn signed_grouped_rows<W: SignedPair>(
    w: *const W::Block,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    if acts.interleaved {
        grouped_rows::<SignedGroups<W, 8>>(w as *const [W::Block; 8], nb, rows, acts, dst, ldd)
    } else {
        grouped_rows::<SignedGroups<W, 1>>(w as *const [W::Block; 1], nb, rows, acts, dst, ldd)
    }
}
