//! GGML block layouts (byte-compatible with candle's / llama.cpp's) and the quantized
//! activation rows the kernels consume.
//!
//! This file and the per-architecture kernel files depend only on `core` and `half`, so the
//! NEON kernels can be type-checked for Apple targets in a tiny standalone crate.

use half::f16;

/// Values per quantization block (Q4_0, Q4_1, Q5_0, Q8_0, Q8_1) and per activation block.
pub const QK: usize = 32;
/// Values per K-quant super-block (Q6_K).
pub const QK_K: usize = 256;

/// `block_q4_0`: `w = d * (q - 8)`, `q` in 0..=15; low nibbles hold values 0..16, high 16..32.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// `block_q5_0`: `w = d * (q - 16)`, `q` in 0..=31: value `j < 16` is the low nibble of
/// `qs[j]` with bit `j` of `qh` (little-endian u32) as its fifth bit, value `j + 16` the
/// high nibble with bit `j + 16`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// `block_q6_K`: 256 values `w = d * scales[i / 16] * (q - 32)`, `q` in 0..=63. Each
/// 128-value half `h` holds 64 bytes of `ql` and 32 of `qh`; its 32-value block `j`
/// (0..4) takes the low (`j < 2`) or high nibbles of `ql[64h + 32 (j % 2)..][..32]` and
/// bits `2j, 2j + 1` of `qh[32h..][..32]` as bits 4 and 5. So 32-value block `b` (0..8)
/// of a super-block is 32 bytes of each and the two scales `scales[2b]`, `scales[2b + 1]`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl BlockQ6K {
    /// Where 32-value block `b` (0..8) finds its low bits (`ql` bytes, nibble shift) and
    /// its high bits (`qh` bytes, bit shift).
    #[inline(always)]
    pub fn sub_block(b: usize) -> (usize, u32, usize, u32) {
        let (h, j) = (b / 4, b % 4);
        (64 * h + 32 * (j % 2), 4 * (j / 2) as u32, 32 * h, 2 * j as u32)
    }
}

/// `block_q4_1`: `w = d * q + m`, `q` in 0..=15; low nibbles hold values 0..16, high 16..32.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

/// `block_q8_0`: `w = d * q`, `q` in -127..=127.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// `block_q4_K`: 256 values in eight sub-blocks of 32; sub-block `j`'s values are
/// `d * sc_j * q - dmin * m_j` with 6-bit `sc_j`, `m_j` packed into `scales` (ggml's
/// `get_scale_min_k4`) and `q` in 0..=15. The 32 bytes of `qs` at `32 * g` hold sub-block
/// `2g` in their low nibbles and `2g + 1` in their high ones, value `i` in byte `i`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// Byte tables for the kernels' unpacking of a Q4_K super-block's 12 scale bytes q0..q12
/// in one 16-byte register (`avx2::q4k_scales_mins`, `neon::q4k_scales_mins`; 0xFF picks
/// a zero byte in both shuffles), the SIMD twin of [`BlockQ4K::scales_mins`]:
///
/// ```text
///   scales 0..4: q0..4 & 63;   4..8: (q8..12 & 15) | (q0..4 >> 6) << 4
///   mins   0..4: q4..8 & 63;   4..8: (q8..12 >> 4) | (q4..8 >> 6) << 4
/// ```
pub mod q4k_scale_tables {
    /// The bytes holding each output's low bits.
    pub const LOW: [u8; 16] = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11];
    /// The bytes holding the top two bits of outputs 4..8 of each half.
    pub const TOP: [u8; 16] = [0xFF, 0xFF, 0xFF, 0xFF, 0, 1, 2, 3, 0xFF, 0xFF, 0xFF, 0xFF, 4, 5, 6, 7];
    /// The low bits kept of `LOW`'s bytes as they are ...
    pub const KEEP: [u8; 16] = [63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0];
    /// ... and shifted right by 4 (the mins 4..8).
    pub const KEEP_SHIFTED: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15];
}

impl BlockQ4K {
    /// The eight 6-bit scales (bytes 0..8) and the eight mins (bytes 8..16), in sub-block
    /// order: ggml's `get_scale_min_k4` for all eight at once, in 32-bit words: the
    /// reference for the kernels, which do the same in a vector register
    /// (`avx2::q4k_scales_mins`, `neon::q4k_scales_mins`).
    #[cfg(test)]
    pub fn scales_mins(&self) -> [u8; 16] {
        const LOW6: u32 = 0x3f3f_3f3f;
        const LOW4: u32 = 0x0f0f_0f0f;
        const LOW2: u32 = 0x0303_0303;
        let word =
            |i: usize| u32::from_le_bytes([self.scales[i], self.scales[i + 1], self.scales[i + 2], self.scales[i + 3]]);
        let (a, b, c) = (word(0), word(4), word(8));
        let scales = [a & LOW6, (c & LOW4) | (((a >> 6) & LOW2) << 4)];
        let mins = [b & LOW6, ((c >> 4) & LOW4) | (((b >> 6) & LOW2) << 4)];
        let mut out = [0u8; 16];
        for (i, w) in scales.iter().chain(&mins).enumerate() {
            out[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        out
    }
}

/// Over how many values an activation row's 8-bit scale `d` is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActScale {
    /// One `d` per 32-value block (ggml's Q8_0 / Q8_1): the finest rounding.
    Block,
    /// One `d` per 256 values, repeated in each of their eight blocks (ggml's Q8_K, what
    /// llama.cpp multiplies K-quant weights by): the K-quant kernels then sum a whole
    /// super-block's sub-block products, scaled by the weights' integer sub-block scales,
    /// in integers and convert to f32 once per super-block instead of once per 32 values.
    SuperBlock,
}

impl ActScale {
    /// Values that share one `d`.
    pub fn values(self) -> usize {
        match self {
            ActScale::Block => QK,
            ActScale::SuperBlock => QK_K,
        }
    }
}

/// `m` activation rows of `k = nb * 32` values, quantized once per forward:
///
/// ```text
/// qs: [m][k]  i8     row-major, block b of row i at i * k + 32 * b
/// ds: [m][nb] [f32; 2] = (d, s): the block scale and, for Q8_1, s = d * sum(q)
///                      (both rounded through f16 exactly as ggml stores them)
/// ```
///
/// Unlike ggml's `block_q8_1` the scales live apart from the quants, already widened to
/// f32, so a kernel loads `(d, s)` with one 64-bit load and the quants 32-byte aligned.
#[derive(Clone, Copy)]
pub struct Acts<'a> {
    pub qs: &'a [i8],
    pub ds: &'a [[f32; 2]],
    pub m: usize,
    pub nb: usize,
    /// Each 256-value super-block's quants in the sub-block-interleaved order of
    /// [`interleave_super_blocks`] (for the AVX-512 prefill kernels only: Q4_K, Q6_K, and
    /// Q8_0 / Q4_0 / Q5_0 rows of whole 256-value groups), or, for the AVX2 prefill of those
    /// three (rows of at least one group), of [`interleave_blocks`]; the values after a
    /// row's last whole group stay in the natural order.
    pub interleaved: bool,
}

/// Reorders each 256 quants of `qs` so that its 64-byte quarter `k` holds values
/// `4k..4k + 4` of each of its sixteen 16-value sub-blocks: byte `64k + 4l + t` takes
/// value `16l + 4k + t`, a transpose of the super-block's 4-byte pieces (16 × 4 to
/// 4 × 16). A 512-bit register of a quarter then meets sub-block `l` in its 32-bit lane
/// `l` (and a 32-value block `j` in lanes `2j, 2j + 1`), the same lane in all four.
pub fn interleave_super_blocks(qs: &mut [i8]) {
    transpose_pieces::<16>(qs);
}

/// Reorders each whole 256 quants of `qs` (eight 32-value blocks; a shorter rest stays
/// as it is) for the AVX2 prefill kernels: 32-byte register `k` holds values `4k..4k + 4`
/// of each block, so its 32-bit lane `l` meets block `l`, the same lane in all eight (a
/// transpose of the blocks' 4-byte pieces, 8 × 8).
pub fn interleave_blocks(qs: &mut [i8]) {
    transpose_pieces::<8>(qs);
}

/// Each 256 quants of `qs` as registers of `LANES` 4-byte lanes: piece `k` of lane `l`
/// (the natural order's piece `(64 / LANES) · l + k`) moves to lane `l` of register `k`.
/// (`LANES` a constant: with a run-time count each piece cost two divisions, and the
/// pass ~1.3 % of a 1B model's AVX-512 prefill.)
fn transpose_pieces<const LANES: usize>(qs: &mut [i8]) {
    const PIECES: usize = QK_K / 4;
    let per_lane = PIECES / LANES;
    for group in qs.chunks_exact_mut(QK_K) {
        let mut natural = [0u32; PIECES];
        for (piece, bytes) in natural.iter_mut().zip(group.chunks_exact(4)) {
            *piece = u32::from_ne_bytes([bytes[0] as u8, bytes[1] as u8, bytes[2] as u8, bytes[3] as u8]);
        }
        for (at, bytes) in group.chunks_exact_mut(4).enumerate() {
            let (k, l) = (at / LANES, at % LANES);
            for (b, v) in bytes.iter_mut().zip(natural[per_lane * l + k].to_ne_bytes()) {
                *b = v as i8;
            }
        }
    }
}

impl<'a> Acts<'a> {
    /// Activation rows `rows` alone.
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Acts<'a> {
        let (k, nb) = (self.nb * QK, self.nb);
        Acts {
            qs: &self.qs[rows.start * k..rows.end * k],
            ds: &self.ds[rows.start * nb..rows.end * nb],
            m: rows.len(),
            ..*self
        }
    }
    #[inline(always)]
    pub fn row_qs(&self, i: usize) -> *const i8 {
        debug_assert!(i < self.m);
        unsafe { self.qs.as_ptr().add(i * self.nb * QK) }
    }
    #[inline(always)]
    pub fn row_ds(&self, i: usize) -> *const [f32; 2] {
        debug_assert!(i < self.m);
        unsafe { self.ds.as_ptr().add(i * self.nb) }
    }
}

/// A tile kernel: `R` weight rows against `C` activation rows, all `nb` 32-value blocks.
/// Returns the `R x C` dot products.
pub trait TileKernel {
    type Block;
    /// 32-value blocks per `Block` (8 for the 256-value K-quant super-blocks).
    const BLOCKS_PER: usize = 1;
    /// Activation rows per prefill tile (4 or 8): as many as keep the tile's accumulators
    /// in registers.
    const PREFILL_COLS: usize = 4;
    /// Whether prefill tiles take two weight rows (false: one, for kernels whose weight
    /// unpacking costs more than what a second row's accumulators save; they take more
    /// activation rows instead).
    const PAIRED_ROWS: bool = true;
    /// Whether decode tiles take one weight row instead of [`DECODE_ROWS`]: a matrix read
    /// row after row is one long stream that the hardware prefetcher follows, where four
    /// rows at a time are four streams each as short as a row. For kernels whose single-row
    /// tile loses little to the shared activation loads (on an AVX2-only Zen 3, the whole
    /// model's decode of Q4_K_M files went 1.2-1.5x faster with Q4_K and Q6_K one row at a
    /// time; Q8_0 and Q4_1 showed no gain).
    const DECODE_ONE_ROW: bool = false;
    /// # Safety
    /// `nb` counts 32-value blocks and is a multiple of `BLOCKS_PER`; every `w[r]` points at
    /// `nb / BLOCKS_PER` blocks, every `qs[c]` at `32 * nb` quants and every `ds[c]` at `nb`
    /// scale pairs; the CPU supports the kernel's instruction set.
    unsafe fn tile<const R: usize, const C: usize>(
        w: [*const Self::Block; R],
        qs: [*const i8; C],
        ds: [*const [f32; 2]; C],
        nb: usize,
    ) -> [[f32; C]; R];
}

/// The 32-value blocks of a row a prefill tile takes at a time (2,048 values; a multiple of
/// the K-quants' eight).
pub const PREFILL_CHUNK_BLOCKS: usize = 64;

/// Weight rows per tile for single-row (decode) matmuls: these rows share each activation load.
pub const DECODE_ROWS: usize = 4;

/// Decode reads rows of at most this many bytes one at a time, whatever the kernel (see
/// [`TileKernel::DECODE_ONE_ROW`]): four such rows are four streams of at most 16 cache
/// lines. (Gemma 3 270M, whose 640-wide Q8_0 output matrix is 73 % of its bytes, decoded
/// ~1.3x faster so on an AVX2-only Zen 3; Llama-1B's 2,176-byte Q8_0 rows ~6 % slower.)
pub const DECODE_ONE_ROW_BYTES: usize = 1024;

/// Runs weight rows `rows` (each `nb` 32-value blocks long, `nb / K::BLOCKS_PER` of
/// `K::Block`) against all activation rows, writing `dst[i * ldd + r]`.
///
/// Decode (`m == 1`) walks the rows four at a time so that one activation load serves four
/// weight rows (or one at a time: `K::DECODE_ONE_ROW`, or rows of at most
/// [`DECODE_ONE_ROW_BYTES`] on x86-64); prefill keeps a tile of `K::PREFILL_COLS`
/// activation rows hot in L1 and walks the rows of this unit in pairs (or one by one,
/// `K::PAIRED_ROWS`), so each weight block is unpacked once per tile, a chunk of
/// [`PREFILL_CHUNK_BLOCKS`] at a time.
///
/// # Safety
/// `w` points at `rows.end * nb / K::BLOCKS_PER` blocks; `dst` is valid for writes at every
/// `i * ldd + r` (`i < acts.m`, `r` in `rows`) and no other thread writes those elements;
/// the CPU supports `K`'s instruction set.
#[inline(always)]
pub unsafe fn drive<K: TileKernel>(
    w: *const K::Block,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    debug_assert!(nb.is_multiple_of(K::BLOCKS_PER));
    let row_blocks = nb / K::BLOCKS_PER;
    let wrow = |r: usize| w.add(r * row_blocks);
    let m = acts.m;
    if m == 1 {
        let (q, d) = (acts.row_qs(0), acts.row_ds(0));
        // (the short-row rule is measured on x86-64 only; NEON keeps four rows)
        let short =
            cfg!(target_arch = "x86_64") && row_blocks * std::mem::size_of::<K::Block>() <= DECODE_ONE_ROW_BYTES;
        let one_row = K::DECODE_ONE_ROW || short;
        let mut r = rows.start;
        while !one_row && r + DECODE_ROWS <= rows.end {
            let out = K::tile::<DECODE_ROWS, 1>([wrow(r), wrow(r + 1), wrow(r + 2), wrow(r + 3)], [q], [d], nb);
            for (j, o) in out.iter().enumerate() {
                *dst.add(r + j) = o[0];
            }
            r += DECODE_ROWS;
        }
        while r < rows.end {
            *dst.add(r) = K::tile::<1, 1>([wrow(r)], [q], [d], nb)[0][0];
            r += 1;
        }
        return;
    }
    prefill_blocks::<K>(w, row_blocks, 0..nb, rows, acts, dst, ldd);
}

/// The prefill half of [`drive`], over blocks `blocks` of each weight row (32-value blocks,
/// multiples of `K::BLOCKS_PER`; rows `row_stride` of `K::Block` apart): it writes `dst`
/// when `blocks` starts at 0 and adds to it otherwise, so that the blocks after a row's
/// whole 256-value groups, which AVX2's interleaved signed prefill leaves in the file's
/// layout, add to what the groups gave.
///
/// # Safety
/// As [`drive`], with every row `row_stride` blocks apart and `blocks` within them.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn prefill_blocks<K: TileKernel>(
    w: *const K::Block,
    row_stride: usize,
    blocks: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) {
    let wrow = |r: usize| w.add(r * row_stride);
    let m = acts.m;
    // each tile of activation rows walks the rows' values a chunk at a time, so that the
    // tile's activations (up to 8 rows of 2,048 bytes) stay in L1 however long the rows
    let chunk = PREFILL_CHUNK_BLOCKS.max(K::BLOCKS_PER);
    macro_rules! cols {
        ($c:literal, $i0:expr) => {{
            let i0 = $i0;
            let mut k0 = blocks.start;
            while k0 < blocks.end {
                let kn = (blocks.end - k0).min(chunk);
                let qs: [*const i8; $c] = std::array::from_fn(|c| acts.row_qs(i0 + c).add(k0 * QK));
                let ds: [*const [f32; 2]; $c] = std::array::from_fn(|c| acts.row_ds(i0 + c).add(k0));
                let wrow = |r: usize| wrow(r).add(k0 / K::BLOCKS_PER);
                // the first chunk writes the outputs, later ones add to them
                let put = |at: *mut f32, v: f32| *at = if k0 == 0 { v } else { *at + v };
                let mut r = rows.start;
                while K::PAIRED_ROWS && r + 2 <= rows.end {
                    let out = K::tile::<2, $c>([wrow(r), wrow(r + 1)], qs, ds, kn);
                    for (j, o) in out.iter().enumerate() {
                        for (c, v) in o.iter().enumerate() {
                            put(dst.add((i0 + c) * ldd + r + j), *v);
                        }
                    }
                    r += 2;
                }
                while r < rows.end {
                    let out = K::tile::<1, $c>([wrow(r)], qs, ds, kn);
                    for (c, v) in out[0].iter().enumerate() {
                        put(dst.add((i0 + c) * ldd + r), *v);
                    }
                    r += 1;
                }
                k0 += kn;
            }
        }};
    }
    let mut i0 = 0;
    while i0 + K::PREFILL_COLS <= m {
        match K::PREFILL_COLS {
            8 => cols!(8, i0),
            _ => cols!(4, i0),
        }
        i0 += K::PREFILL_COLS;
    }
    match m - i0 {
        0 => {}
        1 => cols!(1, i0),
        2 => cols!(2, i0),
        3 => cols!(3, i0),
        4 => cols!(4, i0),
        5 => cols!(5, i0),
        6 => cols!(6, i0),
        7 => cols!(7, i0),
        _ => unreachable!(),
    }
}

/// How a prefill kernel's unpacked blocks are made from the file's (the x86-64 kernels').
#[cfg(target_arch = "x86_64")]
pub trait Unpack {
    /// The file's block.
    type Src;
    /// The unpacked block, of `PER` file blocks.
    type Out: Copy;
    const PER: usize;
    /// Unpacks the `PER` blocks at `src` into `out`. (A trait method, not a closure: a
    /// closure is compiled without its caller's instruction set, and its intrinsics would
    /// not be inlined.)
    unsafe fn unpack(src: *const Self::Src, out: &mut Self::Out);
}

/// This thread's `scratch` of unpacked blocks, taken out of its cell and at least `n`
/// long; the caller puts it back (`scratch.with(|cell| cell.replace(..))`). Taken out, not
/// used inside a closure: a closure is compiled without the caller's instruction set (a
/// nested call on this thread finds the cell empty and allocates its own). Grown, never
/// cleared: callers unpack every block they read, and zeroing a unit's whole scratch
/// first (up to 160 KiB) was ~6 % of a three-token prefill.
///
/// # Safety
/// A `T` of zero bytes is a valid `T` (plain bytes and numbers).
#[cfg(target_arch = "x86_64")]
pub unsafe fn take_scratch<T: Copy>(
    scratch: &'static std::thread::LocalKey<std::cell::RefCell<Vec<T>>>,
    n: usize,
) -> Vec<T> {
    let mut blocks = scratch.with(|cell| cell.take());
    if blocks.len() < n {
        blocks.resize(n, std::mem::zeroed());
    }
    blocks
}

/// The prefill of weight rows `rows` against interleaved activations with tile kernel
/// `K`: the rows are unpacked once, by `U`, into this thread's `scratch`, and then run
/// against every activation row, so the unpacking is not repeated per tile of activation
/// rows. Only the row's whole `K::BLOCKS_PER` blocks are: the blocks after them (AVX2's
/// signed rows of 576 or 640 values) are the caller's ([`prefill_blocks`]).
///
/// # Safety
/// As [`drive`] for `w`, with `nb` the 32-value blocks of a weight row.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn unpacked_rows<K: TileKernel, U: Unpack<Out = K::Block>>(
    scratch: &'static std::thread::LocalKey<std::cell::RefCell<Vec<U::Out>>>,
    w: *const U::Src,
    nb: usize,
    rows: std::ops::Range<usize>,
    acts: &Acts<'_>,
    dst: *mut f32,
    ldd: usize,
) where
    K::Block: Copy,
{
    // unpacked blocks per row, and the file's blocks per weight row
    let per_row = nb / K::BLOCKS_PER;
    let src_per_row = nb / (K::BLOCKS_PER / U::PER);
    let n = rows.len() * per_row;
    // SAFETY (of the zeroed blocks): the unpacked types are plain bytes and numbers
    let mut unpacked = take_scratch(scratch, n);
    for (i, out) in unpacked[..n].iter_mut().enumerate() {
        let (r, g) = (rows.start + i / per_row, i % per_row);
        U::unpack(w.add(r * src_per_row + g * U::PER), out);
    }
    // rows 0.. of the scratch are rows `rows` of the weight: `dst` shifts to match
    let (unpacked_w, dst) = (unpacked.as_ptr(), dst.add(rows.start));
    // The file's bytes after these rows are the next work unit's, which this thread most
    // often runs next: a share of them is prefetched before each tile of activation rows,
    // so that their unpacking finds them in cache instead of waiting on memory (~5 % of the
    // AVX2 Q8_0 prefill of a 1B model). Prefetches never fault: past the weight's end they
    // are only wasted.
    let next = w.wrapping_add(rows.end * src_per_row) as *const i8;
    let lines = rows.len() * src_per_row * std::mem::size_of::<U::Src>() / 64;
    let cols = K::PREFILL_COLS;
    let per_tile = lines.div_ceil(acts.m.div_ceil(cols));
    for (t, i0) in (0..acts.m).step_by(cols).enumerate() {
        for line in t * per_tile..((t + 1) * per_tile).min(lines) {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(next.wrapping_add(64 * line));
        }
        // the tiles `prefill_blocks` takes over all the rows, one at a time
        let tile = acts.rows(i0..(i0 + cols).min(acts.m));
        let blocks = 0..per_row * K::BLOCKS_PER;
        prefill_blocks::<K>(unpacked_w, per_row, blocks, 0..rows.len(), &tile, dst.add(i0 * ldd), ldd);
    }
    scratch.with(|cell| cell.replace(unpacked));
}
