//! x86-64 kernels: AVX2 + FMA + F16C (every x86-64 CPU since Haswell / Zen 1), with an
//! AVX-VNNI variant (`vpdpbusd`, Alder Lake / Zen 4 and later) selected at run time.
//!
//! Per 32-value block: the weight quants are widened to 32 bytes once per tile row,
//! multiplied with the activation bytes (`maddubs` + `madd`, or one `dpbusd`), converted to
//! f32 and accumulated with the product of the two block scales. The Q4_1 offset term
//! `m * s` rides along in a 128-bit accumulator: one `mul` of the packed `(d_w, m_w)` pair
//! with the packed `(d_a, s_a)` pair gives both the scale and the offset product.
//!
//! Q4_K and Q6_K are read in the file's layout against activations with one scale per
//! super-block (`ActScale::SuperBlock`), so a super-block's products stay in integers:
//! per 32-value sub-block, `maddubs` gives pair sums that `madd` (or AVX-VNNI's
//! `vpdpwssd`) multiplies by the sub-block's integer scale and adds up, and the sum is
//! converted and multiplied by `d_w * d_a` once per super-block. Q4_K's 64-value group
//! bytes are masked into the low-nibble sub-block and shifted and masked into the
//! high-nibble one; its eight `dmin * m_j * s_a` offsets are subtracted from the f32
//! sum's lanes with one multiply-add per super-block; Q6_K's `q - 32` is the pair sums
//! of `q` less 32 times the activations' (`maddubs(32, a)`, once per activation block).
//! Their prefill of four or more activation rows runs on weights unpacked into groups of
//! eight rows instead ([`row_groups`]), where one scale serves several registers; their
//! decode (one activation row) has tiles of its own that keep every sum in registers and
//! unpack each super-block's scales once ([`q4k_decode`], [`q6k_decode`]), and reads one
//! weight row at a time: one long stream for the hardware prefetcher
//! (`TileKernel::DECODE_ONE_ROW`).

#![allow(clippy::missing_safety_doc)]

use super::blocks::{
    drive, prefill_blocks, unpacked_rows, ActScale, Acts, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ6K,
    BlockQ8_0, TileKernel, Unpack, QK, QK_K,
};
use std::arch::x86_64::*;
use std::marker::PhantomData;

mod row_groups;
pub(super) use row_groups::{
    q4k_grouped_rows, q4k_grouped_rows_vnni, q6k_grouped_rows, q6k_grouped_rows_vnni, transpose_8x8_epi32,
    GROUPED_MIN_ROWS,
};

/// The 8 x i32 partial dot product of 32 unsigned bytes with 32 signed bytes.
trait DotU8I8 {
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i;
}

/// `maddubs` + `madd`: exact for |u * s| pair sums below 2^15 (Q4: 2*15*127; Q8 via the
/// sign trick: 2*127*127).
struct Madd;
impl DotU8I8 for Madd {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
}

/// AVX-VNNI `vpdpbusd`: one instruction, no intermediate saturation.
struct Vnni;
impl DotU8I8 for Vnni {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
    }
}

/// `acc + sum(scale · (u · s))` over pairs of byte products: the K-quant sub-block sums
/// with the weights' integer sub-block scales (i16) applied before they leave integers.
/// `u` are at most 6-bit (0..=63), so a pair of products fits an i16 (2 · 63 · 127).
trait ScaledDot {
    /// `acc` plus the scaled pair sums of `maddubs(u, s)`.
    #[inline(always)]
    unsafe fn scaled_dot(acc: __m256i, u: __m256i, s: __m256i, scale: __m256i) -> __m256i {
        Self::scaled(acc, _mm256_maddubs_epi16(u, s), scale)
    }
    /// The same of `maddubs(u, s) - less` (pair sums of `less` were taken from `s` alike).
    #[inline(always)]
    unsafe fn scaled_dot_less(acc: __m256i, u: __m256i, s: __m256i, less: __m256i, scale: __m256i) -> __m256i {
        Self::scaled(acc, _mm256_sub_epi16(_mm256_maddubs_epi16(u, s), less), scale)
    }
    /// `acc + madd(pairs, scale)`.
    unsafe fn scaled(acc: __m256i, pairs: __m256i, scale: __m256i) -> __m256i;
}

impl ScaledDot for Madd {
    #[inline(always)]
    unsafe fn scaled(acc: __m256i, pairs: __m256i, scale: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, scale))
    }
}

/// AVX-VNNI `vpdpwssd` does the `madd` and the add in one.
impl ScaledDot for Vnni {
    #[inline(always)]
    unsafe fn scaled(acc: __m256i, pairs: __m256i, scale: __m256i) -> __m256i {
        _mm256_dpwssd_avx_epi32(acc, pairs, scale)
    }
}

#[inline(always)]
unsafe fn hsum(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// The horizontal sums of a tile's accumulators. (Loops, not `map`: a closure is compiled
/// without the caller's AVX2, and the reduction would not be inlined.)
#[inline(always)]
unsafe fn sums<const R: usize, const C: usize>(acc: [[__m256; C]; R]) -> [[f32; C]; R] {
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = hsum(acc[r][c]);
        }
    }
    out
}

/// `(d, m)` (or `(d, first byte pair)`) of a block as `[d, m, 0, 0]` in f32.
#[inline(always)]
pub(super) unsafe fn load_f16_pair(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)))
}

/// `(d, s)` of an activation block as `[d, s, 0, 0]`.
#[inline(always)]
unsafe fn load_ds(p: *const [f32; 2]) -> __m128 {
    _mm_castpd_ps(_mm_load_sd(p as *const f64))
}

/// How far ahead of each weight row the tiles ask for cache lines. The weight rows are
/// short (360 bytes for SmolLM2's 576-wide matrices) and each thread jumps between row
/// ranges, so the hardware prefetcher never ramps up: measured here, decode went from
/// ~150 to ~235 tok/s with 4 KiB (2 KiB: ~215, 8 KiB: the same as 4). Prefetches never
/// fault, so reaching past a matrix's end is harmless.
pub(super) const PREFETCH_BYTES: usize = 4096;

/// How far ahead of each of a tile's rows to prefetch: [`PREFETCH_BYTES`], or the same
/// place in the next tile's rows where the tile spans more than that.
#[inline(always)]
pub(super) fn prefetch_lead<B, const R: usize>(w: &[*const B; R]) -> usize {
    if R < 2 {
        return PREFETCH_BYTES;
    }
    let stride = (w[1] as usize).wrapping_sub(w[0] as usize);
    (R * stride).clamp(PREFETCH_BYTES, 1 << 16)
}

/// Asks for the cache lines of the block at `blk` in the next group of `rows` weight rows
/// (the same place `rows * stride` blocks on), as [`prefetch_lead`] leads a tile: for the
/// prefills that read row groups from the file.
#[inline(always)]
pub(super) unsafe fn prefetch_next_group<B>(blk: *const B, rows: usize, stride: usize) {
    let lead = (rows * stride * std::mem::size_of::<B>()).clamp(PREFETCH_BYTES, 1 << 16);
    let p = (blk as *const i8).wrapping_add(lead);
    for line in (0..std::mem::size_of::<B>()).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line));
    }
}

pub(super) struct Q4_1<D>(PhantomData<D>);

impl<D: DotU8I8> TileKernel for Q4_1<D> {
    type Block = BlockQ4_1;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const BlockQ4_1; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        let mask = _mm256_set1_epi8(0x0F);
        // low 128 bits keep the bytes (low nibbles: values 0..16), high 128 bits shift them
        // right by 4 (high nibbles: values 16..32); the mask drops the bits shifted across
        let shift = _mm256_setr_epi64x(0, 0, 4, 4);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut ms = [[_mm_setzero_ps(); C]; R];
        let lead = prefetch_lead(&w);
        for b in 0..nb {
            let mut qx = [_mm256_setzero_si256(); R];
            let mut dm = [_mm_setzero_ps(); R];
            for r in 0..R {
                let blk = w[r].add(b);
                _mm_prefetch::<_MM_HINT_T0>((blk as *const i8).wrapping_add(lead));
                let raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((*blk).qs.as_ptr() as *const __m128i));
                qx[r] = _mm256_and_si256(_mm256_srlv_epi64(raw, shift), mask);
                dm[r] = load_f16_pair(blk as *const u8);
            }
            for c in 0..C {
                let qy = _mm256_loadu_si256(qs[c].add(b * QK) as *const __m256i);
                let dsy = load_ds(ds[c].add(b));
                for r in 0..R {
                    let p = _mm256_cvtepi32_ps(D::dot(qx[r], qy));
                    // [d_w * d_a, m_w * s_a, 0, 0]
                    let prod = _mm_mul_ps(dm[r], dsy);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), p, acc[r][c]);
                    ms[r][c] = _mm_add_ps(ms[r][c], prod);
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                let m = _mm_cvtss_f32(_mm_movehdup_ps(ms[r][c]));
                out[r][c] = hsum(acc[r][c]) + m;
            }
        }
        out
    }
}

/// A weight format whose 32-value blocks unpack to signed bytes `q` under one f16 scale
/// `d` (`w = d * q`), in the order of the activation bytes.
pub(super) trait SignedBlock {
    type Block;
    /// Whether unpacking a block costs more than a few instructions (Q5_0's fifth bits):
    /// the AVX2 tile then spreads it over eight activation rows of one weight row instead
    /// of four of two.
    const COSTLY_UNPACK: bool = false;
    /// The 32 signed quants of `blk`.
    unsafe fn quants(blk: *const Self::Block) -> __m256i;
}

impl SignedBlock for BlockQ8_0 {
    type Block = BlockQ8_0;
    #[inline(always)]
    unsafe fn quants(blk: *const BlockQ8_0) -> __m256i {
        _mm256_loadu_si256((*blk).qs.as_ptr() as *const __m256i)
    }
}

/// The 32 nibbles (0..=15) of a Q4_0 / Q5_0 block, low nibbles then high ones.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    let raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs as *const __m128i));
    _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F))
}

impl SignedBlock for BlockQ4_0 {
    type Block = BlockQ4_0;
    #[inline(always)]
    unsafe fn quants(blk: *const BlockQ4_0) -> __m256i {
        _mm256_sub_epi8(nibbles((*blk).qs.as_ptr()), _mm256_set1_epi8(8))
    }
}

impl SignedBlock for BlockQ5_0 {
    type Block = BlockQ5_0;
    const COSTLY_UNPACK: bool = true;
    /// ggml's trick: byte `i` all ones where bit `i` of `qh` is set; the nibble OR 0xF0
    /// where it is not is the nibble - 16 as a signed byte.
    #[inline(always)]
    unsafe fn quants(blk: *const BlockQ5_0) -> __m256i {
        let qh = std::ptr::read_unaligned((*blk).qh.as_ptr() as *const i32);
        let spread = _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303);
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread);
        let set = _mm256_cmpeq_epi8(
            _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)),
            _mm256_set1_epi64x(-1),
        );
        _mm256_or_si256(nibbles((*blk).qs.as_ptr()), _mm256_andnot_si256(set, _mm256_set1_epi8(0xF0u8 as i8)))
    }
}

/// Signed-weight tiles (Q8_0, Q4_0, Q5_0) against Q8_0 activations.
pub(super) struct Signed<W, D>(PhantomData<(W, D)>);

impl<W: SignedBlock, D: DotU8I8> TileKernel for Signed<W, D> {
    type Block = W::Block;
    const PREFILL_COLS: usize = if W::COSTLY_UNPACK { 8 } else { 4 };
    const PAIRED_ROWS: bool = !W::COSTLY_UNPACK;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const W::Block; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let lead = prefetch_lead(&w);
        for b in 0..nb {
            let mut qx = [_mm256_setzero_si256(); R];
            let mut ax = [_mm256_setzero_si256(); R];
            let mut dw = [_mm256_setzero_ps(); R];
            for r in 0..R {
                let blk = w[r].add(b);
                _mm_prefetch::<_MM_HINT_T0>((blk as *const i8).wrapping_add(lead));
                qx[r] = W::quants(blk);
                ax[r] = _mm256_sign_epi8(qx[r], qx[r]);
                // every block starts with d; lane 1 (the next two bytes read as f16) is
                // never used
                dw[r] = _mm256_broadcastss_ps(load_f16_pair(blk as *const u8));
            }
            for c in 0..C {
                let qy = _mm256_loadu_si256(qs[c].add(b * QK) as *const __m256i);
                let dy = _mm256_broadcast_ss(&*(ds[c].add(b) as *const f32));
                for r in 0..R {
                    // |x| * (y * sign(x)) == x * y
                    let p = _mm256_cvtepi32_ps(D::dot(ax[r], _mm256_sign_epi8(qy, qx[r])));
                    acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dy), p, acc[r][c]);
                }
            }
        }
        sums(acc)
    }
}

/// The scales `d` of the eight signed blocks at `blk` (Q8_0, Q4_0, Q5_0), as f32.
#[inline(always)]
pub(super) unsafe fn signed_block_scales<B>(blk: *const B) -> __m256 {
    let mut d = [0u16; 8];
    for (j, d) in d.iter_mut().enumerate() {
        // every signed block starts with its f16 scale
        *d = std::ptr::read_unaligned(blk.add(j) as *const u16);
    }
    _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr() as *const __m128i))
}

/// Eight signed blocks (Q8_0, Q4_0, Q5_0: 256 values) unpacked for
/// [`SignedInterleaved`]: register `k` (0..8) holds values `4k..4k + 4` of each block, so
/// lane `l` is block `l` in all eight, as in [`super::blocks::interleave_blocks`]; `abs` the
/// same registers' absolute values (the unsigned operand of every product: taken once per
/// work unit, not once per tile of activation rows); and lane `l`'s scale `d` as f32.
/// Unpacked once per work unit ([`unpacked_rows`]).
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(super) struct UnpackedSigned8 {
    q: [[i32; 8]; 8],
    abs: [[i32; 8]; 8],
    scales: [f32; 8],
}

/// Eight Q8_0, Q4_0 or Q5_0 blocks as one [`UnpackedSigned8`].
pub(super) struct UnpackSigned8<W>(PhantomData<W>);

impl<W: SignedBlock> Unpack for UnpackSigned8<W> {
    type Src = W::Block;
    type Out = UnpackedSigned8;
    const PER: usize = 8;

    #[inline(always)]
    unsafe fn unpack(blk: *const W::Block, out: &mut UnpackedSigned8) {
        // block `l`'s 4-byte piece `k` is element `k` of row `l`: the transpose puts it in
        // lane `l` of register `k`
        let mut natural = [_mm256_setzero_si256(); 8];
        for (j, block) in natural.iter_mut().enumerate() {
            *block = W::quants(blk.add(j));
        }
        for (k, q) in transpose_8x8_epi32(natural).into_iter().enumerate() {
            _mm256_store_si256(out.q[k].as_mut_ptr() as *mut __m256i, q);
            // (-128 as unsigned is 128: its products stay exact)
            _mm256_store_si256(out.abs[k].as_mut_ptr() as *mut __m256i, _mm256_sign_epi8(q, q));
        }
        _mm256_store_ps(out.scales.as_mut_ptr(), signed_block_scales(blk));
    }
}

/// Signed weights against activations in the order of [`super::blocks::interleave_blocks`]
/// (prefill of rows of whole 256-value groups): the eight products of a lane belong to one
/// block, so they are summed in integers and converted and scaled once per 256 values,
/// where [`Signed`] converts and scales every 32:
///
/// ```text
///   isum += dot(|w_k|, a_k · sign(w_k))          k = 0..8, 8 × i32: lane l block l
///   acc  += f32(isum) · [d_w l · d_a l]_l
/// ```
pub(super) struct SignedInterleaved<D>(PhantomData<D>);

impl<D: DotU8I8> TileKernel for SignedInterleaved<D> {
    type Block = UnpackedSigned8;
    const BLOCKS_PER: usize = QK_K / QK;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const UnpackedSigned8; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        // the `d_a` of `q4k_act_scales`' lane order back in block order
        let block_order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
        for g in 0..nb / Self::BLOCKS_PER {
            let blk: [&UnpackedSigned8; R] = std::array::from_fn(|r| &*w[r].add(g));
            let mut isum = [[_mm256_setzero_si256(); C]; R];
            for k in 0..QK_K / QK {
                let mut qx = [_mm256_setzero_si256(); R];
                let mut ax = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    qx[r] = _mm256_load_si256(blk[r].q[k].as_ptr() as *const __m256i);
                    ax[r] = _mm256_load_si256(blk[r].abs[k].as_ptr() as *const __m256i);
                }
                for c in 0..C {
                    let a = _mm256_loadu_si256(qs[c].add(g * QK_K + QK * k) as *const __m256i);
                    for r in 0..R {
                        // |x| * (y * sign(x)) == x * y
                        isum[r][c] = _mm256_add_epi32(isum[r][c], D::dot(ax[r], _mm256_sign_epi8(a, qx[r])));
                    }
                }
            }
            for c in 0..C {
                let (da, _) = q4k_act_scales(ds[c].add(g * Self::BLOCKS_PER));
                let da = _mm256_permutevar8x32_ps(da, block_order);
                for r in 0..R {
                    let scale = _mm256_mul_ps(_mm256_load_ps(blk[r].scales.as_ptr()), da);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]), scale, acc[r][c]);
                }
            }
        }
        sums(acc)
    }
}

thread_local! {
    /// This thread's unpacked weight rows of [`signed_interleaved_rows`].
    static UNPACKED_SIGNED8: std::cell::RefCell<Vec<UnpackedSigned8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Prefill of Q8_0, Q4_0 or Q5_0 rows of at least one 256-value group on the interleaved
/// activations: the whole groups by [`SignedInterleaved`], the blocks after them (rows of
/// 576 or 640 values) by [`Signed`], AVX2.
///
/// # Safety
/// As [`drive`]; `nb` is at least 8; the CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn signed_interleaved_rows<W: SignedBlock>(
    w: *const W::Block,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    unpacked_rows::<SignedInterleaved<Madd>, UnpackSigned8<W>>(&UNPACKED_SIGNED8, w, nb, rows.clone(), acts, dst, ldd);
    prefill_blocks::<Signed<W, Madd>>(w, nb, nb / 8 * 8..nb, rows, acts, dst, ldd)
}

/// [`signed_interleaved_rows`] with AVX-VNNI.
///
/// # Safety
/// As [`drive`]; `nb` is at least 8; the CPU has AVX2, FMA, F16C and AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn signed_interleaved_rows_vnni<W: SignedBlock>(
    w: *const W::Block,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    unpacked_rows::<SignedInterleaved<Vnni>, UnpackSigned8<W>>(&UNPACKED_SIGNED8, w, nb, rows.clone(), acts, dst, ldd);
    prefill_blocks::<Signed<W, Vnni>>(w, nb, nb / 8 * 8..nb, rows, acts, dst, ldd)
}

/// Q6_K tiles against activations with one scale per super-block. Per 32-value block, for
/// each weight row:
///
/// ```text
///   q    = low nibbles | high bits << 4          32 bytes, 0..=63
///   p16  = maddubs(q, a) - maddubs(32, a)        16 x i16 pair sums of (q - 32) * a, exact
///                                                (|.| <= 2 * 63 * 127); the second term is
///                                                the activation's, shared by all rows
///   isum += madd(p16, [sc_a x 8, sc_b x 8])      8 x i32: lanes 0-3 the first 16 values
/// ```
///
/// and per super-block `acc += f32(isum) * d * d_a`.
pub(super) struct Q6K<D>(PhantomData<D>);

/// A Q6_K block's `d` in f32: F16C, not `half`'s to_f32 (a call with a run-time CPU
/// check), and two bytes read, not four: `d` ends the block.
#[inline(always)]
pub(super) unsafe fn q6k_d(blk: *const BlockQ6K) -> f32 {
    let d = std::ptr::read_unaligned(&(*blk).d as *const _ as *const u16) as i32;
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(d)))
}

/// A one-activation-row tile's accumulators as [`TileKernel::tile`]'s result (`C` is 1).
#[inline(always)]
unsafe fn decode_sums<const R: usize, const C: usize>(acc: [__m256; R]) -> [[f32; C]; R] {
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        out[r][0] = hsum(acc[r]);
    }
    out
}

/// The quants (0..64) of 32-value sub-block `4h + K` of a Q6_K super-block: the low
/// (`K < 2`) or high nibbles of `ql` bytes `64h + 32(K % 2)..`, and bits `2K..2K + 2` of
/// `qh` bytes `32h..` moved to bits 4 and 5 (ggml's `dequantize_row_q6_K` order).
#[inline(always)]
unsafe fn q6k_quants<const K: usize>(blk: *const BlockQ6K, h: usize, low4: __m256i, bits45: __m256i) -> __m256i {
    let ql = _mm256_loadu_si256((*blk).ql.as_ptr().add(64 * h + 32 * (K % 2)) as *const __m256i);
    let qh = _mm256_loadu_si256((*blk).qh.as_ptr().add(32 * h) as *const __m256i);
    let lo = if K < 2 { ql } else { _mm256_srli_epi16::<4>(ql) };
    // 16-bit shifts: what crosses into the other byte is masked off with the rest
    let hi = match K {
        0 => _mm256_slli_epi16::<4>(qh),
        1 => _mm256_slli_epi16::<2>(qh),
        2 => qh,
        _ => _mm256_srli_epi16::<2>(qh),
    };
    _mm256_or_si256(_mm256_and_si256(lo, low4), _mm256_and_si256(hi, bits45))
}

/// [`Q6K`]'s tile for one activation row (decode): every sum in registers, each
/// sub-block's two scales one broadcast load and one shuffle from scales widened once per
/// super-block, and no run-time shifts.
#[inline(always)]
unsafe fn q6k_decode<D: ScaledDot, const R: usize>(
    w: [*const BlockQ6K; R],
    q: *const i8,
    ds: *const [f32; 2],
    super_blocks: usize,
) -> [__m256; R] {
    let low4 = _mm256_set1_epi8(0x0F);
    let bits45 = _mm256_set1_epi8(0x30);
    let offset = _mm256_set1_epi8(32);
    // an i32 of two i16 scales to the first over the low 128 bits, the second over the high
    #[rustfmt::skip]
    let spread = _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
    );
    let mut acc = [_mm256_setzero_ps(); R];
    let lead = prefetch_lead(&w);
    for sb in 0..super_blocks {
        // the activations share one d over the super-block (`ActScale::SuperBlock`)
        let da = (*ds.add(sb * QK_K / QK))[0];
        let mut sc16 = [[0i16; 16]; R];
        for r in 0..R {
            let blk = w[r].add(sb);
            let p = (blk as *const i8).wrapping_add(lead);
            for line in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line));
            }
            let scales = _mm_loadu_si128((*blk).scales.as_ptr() as *const __m128i);
            _mm256_storeu_si256(sc16[r].as_mut_ptr() as *mut __m256i, _mm256_cvtepi8_epi16(scales));
        }
        let mut isum = [_mm256_setzero_si256(); R];
        let qb = q.add(sb * QK_K);
        macro_rules! sub_block {
            ($h:expr, $k:literal) => {{
                let j = 4 * $h + $k;
                let a = _mm256_loadu_si256(qb.add(QK * j) as *const __m256i);
                // q - 32 against the activations: the products of q, less 32 times theirs
                let off = _mm256_maddubs_epi16(offset, a);
                for r in 0..R {
                    let qx = q6k_quants::<$k>(w[r].add(sb), $h, low4, bits45);
                    let pair = std::ptr::read_unaligned(sc16[r].as_ptr().add(2 * j) as *const i32);
                    let scale = _mm256_shuffle_epi8(_mm256_set1_epi32(pair), spread);
                    isum[r] = D::scaled_dot_less(isum[r], qx, a, off, scale);
                }
            }};
        }
        for h in 0..2 {
            sub_block!(h, 0);
            sub_block!(h, 1);
            sub_block!(h, 2);
            sub_block!(h, 3);
        }
        for r in 0..R {
            let dw = q6k_d(w[r].add(sb));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(dw * da), acc[r]);
        }
    }
    acc
}

/// The quants (0..=63) of 32-value sub-block `j` of a Q6_K super-block, in
/// [`BlockQ6K::sub_block`]'s order.
#[inline(always)]
pub(super) unsafe fn q6k_sub_block_quants(blk: *const BlockQ6K, j: usize) -> __m256i {
    let (ql_at, ql_shift, qh_at, qh_shift) = BlockQ6K::sub_block(j);
    let (ql_shift, qh_shift) = (_mm_cvtsi32_si128(ql_shift as i32), _mm_cvtsi32_si128(qh_shift as i32));
    let ql = _mm256_loadu_si256((*blk).ql.as_ptr().add(ql_at) as *const __m256i);
    let lo = _mm256_and_si256(_mm256_srl_epi16(ql, ql_shift), _mm256_set1_epi8(0x0F));
    let qh = _mm256_loadu_si256((*blk).qh.as_ptr().add(qh_at) as *const __m256i);
    let hi = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srl_epi16(qh, qh_shift), _mm256_set1_epi8(0x03)));
    _mm256_or_si256(lo, hi)
}

/// Sub-block `j`'s two 16-value scales of a Q6_K super-block as i16, the first over
/// lanes 0..8 (values 0..16), the second over 8..16.
#[inline(always)]
pub(super) unsafe fn q6k_sub_block_scales(blk: *const BlockQ6K, j: usize) -> __m256i {
    let spread = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let pair = std::ptr::read_unaligned((*blk).scales.as_ptr().add(2 * j) as *const u16);
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(_mm_cvtsi32_si128(pair as i32), spread))
}

impl<D: ScaledDot> TileKernel for Q6K<D> {
    type Block = BlockQ6K;
    const DECODE_ONE_ROW: bool = true;
    const BLOCKS_PER: usize = 8;

    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const BlockQ6K; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R] {
        if C == 1 {
            return decode_sums(q6k_decode::<D, R>(w, qs[0], ds[0], nb / Self::BLOCKS_PER));
        }
        let offset = _mm256_set1_epi8(32);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let lead = prefetch_lead(&w);
        for sb in 0..nb / Self::BLOCKS_PER {
            // the activations share one d over the super-block (`ActScale::SuperBlock`)
            let da: [f32; C] = std::array::from_fn(|c| (*ds[c].add(sb * Self::BLOCKS_PER))[0]);
            let mut isum = [[_mm256_setzero_si256(); C]; R];
            for j in 0..Self::BLOCKS_PER {
                let b = sb * Self::BLOCKS_PER + j;
                let mut qx = [_mm256_setzero_si256(); R];
                let mut sc = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    let blk = w[r].add(sb);
                    // 8 blocks' prefetches 27 bytes apart touch every line of the 210 bytes
                    _mm_prefetch::<_MM_HINT_T0>((blk as *const i8).wrapping_add(lead + 27 * j));
                    qx[r] = q6k_sub_block_quants(blk, j);
                    sc[r] = q6k_sub_block_scales(blk, j);
                }
                for c in 0..C {
                    let qy = _mm256_loadu_si256(qs[c].add(b * QK) as *const __m256i);
                    // q - 32 against the activations: the products of q, less 32 times theirs
                    let off = _mm256_maddubs_epi16(offset, qy);
                    for r in 0..R {
                        isum[r][c] = D::scaled_dot_less(isum[r][c], qx[r], qy, off, sc[r]);
                    }
                }
            }
            for r in 0..R {
                let dw = q6k_d(w[r].add(sb));
                for c in 0..C {
                    let f = _mm256_set1_ps(dw * da[c]);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]), f, acc[r][c]);
                }
            }
        }
        sums(acc)
    }
}

pub(super) struct Q4K<D>(PhantomData<D>);

/// [`BlockQ4K::scales_mins`] in one register, computed there: the eight 6-bit scales in
/// bytes 0..8, the mins in 8..16.
#[inline(always)]
pub(super) unsafe fn q4k_scales_mins(blk: *const BlockQ4K) -> __m128i {
    use super::blocks::q4k_scale_tables::{KEEP, KEEP_SHIFTED, LOW, TOP};
    let table = |t: &[u8; 16]| _mm_loadu_si128(t.as_ptr() as *const __m128i);
    // the 12 bytes q0..q12 of `scales` (and 4 bytes of `qs`, unused)
    let q = _mm_loadu_si128((*blk).scales.as_ptr() as *const __m128i);
    let low = _mm_shuffle_epi8(q, table(&LOW));
    let top = _mm_shuffle_epi8(q, table(&TOP));
    let low =
        _mm_or_si128(_mm_and_si128(low, table(&KEEP)), _mm_and_si128(_mm_srli_epi16::<4>(low), table(&KEEP_SHIFTED)));
    // (x >> 6) << 4 of each byte: bits 6..8 moved to 4..6
    _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16::<2>(top), _mm_set1_epi8(0x30)))
}

/// A super-block's eight `d * sc_j` and eight `dmin * m_j`, in the lane order of
/// [`q4k_act_scales`].
#[inline(always)]
unsafe fn q4k_weight_scales(blk: *const BlockQ4K) -> (__m256, __m256) {
    let order = _mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15);
    let sm = _mm_shuffle_epi8(q4k_scales_mins(blk), order);
    let dd = load_f16_pair(blk as *const u8);
    let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm));
    let mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(sm)));
    (_mm256_mul_ps(sc, _mm256_broadcastss_ps(dd)), _mm256_mul_ps(mn, _mm256_broadcastss_ps(_mm_movehdup_ps(dd))))
}

/// The `d_a` and `s_a` of a super-block's eight activation blocks, in the lane order
/// 0, 1, 4, 5, 2, 3, 6, 7 (what the unpacking shuffle leaves).
#[inline(always)]
unsafe fn q4k_act_scales(ds: *const [f32; 2]) -> (__m256, __m256) {
    // [d0 s0 d1 s1 | d2 s2 d3 s3] and [d4 s4 d5 s5 | d6 s6 d7 s7]
    let (v0, v1) = (_mm256_loadu_ps(ds as *const f32), _mm256_loadu_ps(ds.add(4) as *const f32));
    (_mm256_shuffle_ps::<0b10_00_10_00>(v0, v1), _mm256_shuffle_ps::<0b11_01_11_01>(v0, v1))
}

/// [`Q4K`]'s tile for one activation row (decode), where nothing amortizes a super-block's
/// scale unpacking: every sum stays in registers, each row's 32 bytes of a 64-value group
/// are loaded once for both nibbles, the scales and mins are unpacked once per super-block,
/// and the offsets go into the same f32 lanes as the scaled sums.
#[inline(always)]
unsafe fn q4k_decode<D: ScaledDot, const R: usize>(
    w: [*const BlockQ4K; R],
    q: *const i8,
    ds: *const [f32; 2],
    super_blocks: usize,
) -> [__m256; R] {
    let mask = _mm256_set1_epi8(0x0F);
    // the mins (bytes 8..16 of `q4k_scales_mins`) in the lane order of `q4k_act_scales`
    let min_order = _mm_setr_epi8(8, 9, 12, 13, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    let mut acc = [_mm256_setzero_ps(); R];
    let lead = prefetch_lead(&w);
    for b in 0..super_blocks {
        let ds = ds.add(b * QK_K / QK);
        // the activations share one d over the super-block (`ActScale::SuperBlock`)
        let da = (*ds)[0];
        let (_, sa) = q4k_act_scales(ds);
        // each sub-block scale twice in an i32, read back one at a time as a broadcast (a
        // load alone, where broadcasting one i16 from memory also takes a shuffle)
        let mut sc32 = [[0i32; 8]; R];
        let mut dw = [0f32; R];
        for r in 0..R {
            let blk = w[r].add(b);
            let p = (blk as *const i8).wrapping_add(lead);
            _mm_prefetch::<_MM_HINT_T0>(p);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128));
            let sm = q4k_scales_mins(blk);
            let sc = _mm_cvtepu8_epi16(sm);
            _mm_storeu_si128(sc32[r].as_mut_ptr() as *mut __m128i, _mm_unpacklo_epi16(sc, sc));
            _mm_storeu_si128(sc32[r].as_mut_ptr().add(4) as *mut __m128i, _mm_unpackhi_epi16(sc, sc));
            let dd = load_f16_pair(blk as *const u8);
            dw[r] = _mm_cvtss_f32(dd);
            let mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_shuffle_epi8(sm, min_order)));
            let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dd));
            acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(mins, dmin), sa, acc[r]);
        }
        let mut isum = [_mm256_setzero_si256(); R];
        let qb = q.add(b * QK_K);
        for g in 0..QK_K / 64 {
            // 64 values: the low nibbles of the group's 32 bytes are sub-block 2g, the high 2g + 1
            let a_lo = _mm256_loadu_si256(qb.add(64 * g) as *const __m256i);
            let a_hi = _mm256_loadu_si256(qb.add(64 * g + 32) as *const __m256i);
            for r in 0..R {
                let raw = _mm256_loadu_si256((*w[r].add(b)).qs.as_ptr().add(32 * g) as *const __m256i);
                let lo = _mm256_and_si256(raw, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), mask);
                isum[r] = D::scaled_dot(isum[r], lo, a_lo, _mm256_set1_epi32(sc32[r][2 * g]));
                isum[r] = D::scaled_dot(isum[r], hi, a_hi, _mm256_set1_epi32(sc32[r][2 * g + 1]));
            }
        }
        for r in 0..R {
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(dw[r] * da), acc[r]);
        }
    }
    acc
}

impl<D: ScaledDot> TileKernel for Q4K<D> {
    type Block = BlockQ4K;
    const DECODE_ONE_ROW: bool = true;
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
        if C == 1 {
            return decode_sums(q4k_decode::<D, R>(w, qs[0], ds[0], nb));
        }
        let mask = _mm256_set1_epi8(0x0F);
        // f32 sums, touched once per super-block: kept in memory so that the registers
        // hold the integer sums of the sub-block loop
        let mut acc = [[[0f32; 8]; C]; R];
        let lead = prefetch_lead(&w);
        for b in 0..nb {
            // the activations share one d over the super-block (`ActScale::SuperBlock`)
            let da: [f32; C] = std::array::from_fn(|c| (*ds[c].add(b * Self::BLOCKS_PER))[0]);
            let mut dw = [0f32; R];
            // sub-block scales as i16, read back one at a time as broadcasts
            let mut sc16 = [[0i16; 8]; R];
            for r in 0..R {
                let blk = w[r].add(b);
                let p = (blk as *const i8).wrapping_add(lead);
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128));
                _mm_storeu_si128(sc16[r].as_mut_ptr() as *mut __m128i, _mm_cvtepu8_epi16(q4k_scales_mins(blk)));
                dw[r] = _mm_cvtss_f32(load_f16_pair(blk as *const u8));
                let wmin = q4k_weight_scales(blk).1;
                for c in 0..C {
                    let (_, sa) = q4k_act_scales(ds[c].add(b * Self::BLOCKS_PER));
                    let a = acc[r][c].as_mut_ptr();
                    _mm256_storeu_ps(a, _mm256_fnmadd_ps(wmin, sa, _mm256_loadu_ps(a)));
                }
            }
            let mut isum = [[_mm256_setzero_si256(); C]; R];
            #[allow(clippy::needless_range_loop)] // j also places the quants
            for j in 0..QK_K / QK {
                // sub-block j: the low (even j) or high nibbles of the 32 bytes at 32 * (j / 2)
                let mut qx = [_mm256_setzero_si256(); R];
                let mut sc = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    let raw = _mm256_loadu_si256((*w[r].add(b)).qs.as_ptr().add(QK * (j / 2)) as *const __m256i);
                    let raw = if j % 2 == 0 { raw } else { _mm256_srli_epi16::<4>(raw) };
                    qx[r] = _mm256_and_si256(raw, mask);
                    sc[r] = _mm256_set1_epi16(sc16[r][j]);
                }
                for c in 0..C {
                    let a = _mm256_loadu_si256(qs[c].add(b * QK_K + QK * j) as *const __m256i);
                    for r in 0..R {
                        isum[r][c] = D::scaled_dot(isum[r][c], qx[r], a, sc[r]);
                    }
                }
            }
            for r in 0..R {
                for c in 0..C {
                    let f = _mm256_set1_ps(dw[r] * da[c]);
                    let a = acc[r][c].as_mut_ptr();
                    _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]), f, _mm256_loadu_ps(a)));
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                out[r][c] = hsum(_mm256_loadu_ps(acc[r][c].as_ptr()));
            }
        }
        out
    }
}

tile_entry!(avx2, q4k_rows, Q4K<Madd>, BlockQ4K);
tile_entry!(vnni, q4k_rows_vnni, Q4K<Vnni>, BlockQ4K);
tile_entry!(avx2, q4_1_rows, Q4_1<Madd>, BlockQ4_1);
tile_entry!(vnni, q4_1_rows_vnni, Q4_1<Vnni>, BlockQ4_1);
tile_entry!(avx2, q8_0_rows, Signed<BlockQ8_0, Madd>, BlockQ8_0);
tile_entry!(vnni, q8_0_rows_vnni, Signed<BlockQ8_0, Vnni>, BlockQ8_0);
tile_entry!(avx2, q4_0_rows, Signed<BlockQ4_0, Madd>, BlockQ4_0);
tile_entry!(vnni, q4_0_rows_vnni, Signed<BlockQ4_0, Vnni>, BlockQ4_0);
tile_entry!(avx2, q5_0_rows, Signed<BlockQ5_0, Madd>, BlockQ5_0);
tile_entry!(vnni, q5_0_rows_vnni, Signed<BlockQ5_0, Vnni>, BlockQ5_0);
tile_entry!(avx2, q6_k_rows, Q6K<Madd>, BlockQ6K);
tile_entry!(vnni, q6_k_rows_vnni, Q6K<Vnni>, BlockQ6K);

/// AVX2 twin of [`super::scalar::quantize_row`], bit-identical to it: same `amax`, same
/// `d` and `1 / d` computed in scalar f32, products `x * id` rounded half away from zero.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_row(x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]], with_sum: bool, scale: ActScale) {
    debug_assert_eq!(x.len(), qs.len());
    debug_assert_eq!(x.len(), ds.len() * QK);
    let per = scale.values() / QK;
    for (span, ds) in ds.chunks_exact_mut(per).enumerate() {
        let first = span * per;
        let mut amax = 0f32;
        for b in first..first + per {
            amax = amax.max(block_amax(x.as_ptr().add(b * QK)));
        }
        for (b, ds) in (first..).zip(ds.iter_mut()) {
            *ds = quantize_block(x.as_ptr().add(b * QK), amax, qs.as_mut_ptr().add(b * QK), with_sum);
        }
    }
}

/// The 32 values at `xp` as four registers.
#[inline(always)]
unsafe fn load_block(xp: *const f32) -> [__m256; 4] {
    [_mm256_loadu_ps(xp), _mm256_loadu_ps(xp.add(8)), _mm256_loadu_ps(xp.add(16)), _mm256_loadu_ps(xp.add(24))]
}

/// The largest magnitude of the 32 values at `xp`.
#[inline(always)]
unsafe fn block_amax(xp: *const f32) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let v = load_block(xp);
    let a01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
    let a23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
    let a = _mm256_max_ps(a01, a23);
    let a = _mm_max_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
    let a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    let a = _mm_max_ss(a, _mm_movehdup_ps(a));
    _mm_cvtss_f32(a)
}

/// The 32 values at `xp` quantized with the `amax` of their span into `qp`; returns
/// `(d, s)` (see [`super::scalar::quantize_row`]).
#[inline(always)]
unsafe fn quantize_block(xp: *const f32, amax: f32, qp: *mut i8, with_sum: bool) -> [f32; 2] {
    let sign = _mm256_set1_ps(-0.0);
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let v = load_block(xp);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let idv = _mm256_set1_ps(id);
    let mut qi = [_mm256_setzero_si256(); 4];
    for j in 0..4 {
        let p = _mm256_mul_ps(v[j], idv);
        // round half away from zero: trunc, then step away when |frac| >= 0.5
        let t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t));
        let step = _mm256_or_ps(_mm256_and_ps(p, sign), one);
        let r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), step));
        qi[j] = _mm256_cvttps_epi32(r);
    }
    let sum = if with_sum {
        let s = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
        let s = _mm_add_epi32(_mm256_extracti128_si256(s, 1), _mm256_castsi256_si128(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    } else {
        0
    };
    let p01 = _mm256_packs_epi32(qi[0], qi[1]);
    let p23 = _mm256_packs_epi32(qi[2], qi[3]);
    let p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
    _mm256_storeu_si256(qp as *mut __m256i, p);

    let dh = half::f16::from_f32(d);
    let s = if with_sum { (half::f16::from_f32(sum as f32) * dh).to_f32() } else { 0.0 };
    [dh.to_f32(), s]
}
