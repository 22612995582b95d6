//! Our kernels against candle's `QMatMul` (the reference), the scalar path against the SIMD
//! paths, and the activation quantization against candle's bit for bit.

use super::*;
use blocks::BlockQ4K;
use candle_core::quantized::k_quants::{self, GgmlType};
use candle_core::{Device, IndexOp};

/// Deterministic xorshift generator; `normal()` is a cheap bell curve (sum of uniforms).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.uniform()).sum::<f32>() * 0.866
    }
    fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.normal() * scale).collect()
    }
}

fn tensor(v: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn random_weight(rng: &mut Rng, n: usize, k: usize, dtype: GgmlDType) -> Arc<QTensor> {
    let w = tensor(rng.vec(n * k, 0.05), &[n, k]);
    Arc::new(QTensor::quantize(&w, dtype).unwrap())
}

/// Activations with the spread of a real residual stream: most values small, a few
/// channels large, one row all zeros when there are enough rows.
fn random_acts(rng: &mut Rng, m: usize, k: usize) -> Vec<f32> {
    let mut x = rng.vec(m * k, 1.0);
    for i in 0..m {
        x[i * k + (i * 7) % k] *= 20.0;
    }
    if m > 2 {
        x[k..2 * k].fill(0.0);
    }
    x
}

/// max |a - b| / max |b|.
fn rel_err(ours: &Tensor, reference: &Tensor) -> f32 {
    assert_eq!(ours.dims(), reference.dims());
    let a = ours.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = reference.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    let diff = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

fn candle_forward(w: &Arc<QTensor>, x: &Tensor) -> Tensor {
    QMatMul::from_arc(w.clone()).unwrap().forward(x).unwrap()
}

/// Our forward with a given instruction set (bypassing detection).
fn forward_with(lin: &QLinear, isa: Isa, x: &Tensor) -> Tensor {
    assert!(lin.uses_own_kernel());
    let (m, k) = x.dims2().unwrap();
    assert_eq!(k, lin.in_features());
    let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut dst = matmul_many(&[lin], isa, &xs, m).unwrap();
    tensor(dst.pop().unwrap(), &[m, lin.out_features()])
}

const SHAPES: [(usize, usize); 3] = [(576, 576), (1536, 576), (576, 1536)];
const ROWS: [usize; 4] = [1, 3, 17, 130];

#[test]
fn detects_an_instruction_set() {
    let isa = Isa::detect();
    eprintln!("qlinear kernels: {isa:?} (all: {:?})", Isa::all_supported());
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        assert_ne!(isa, Isa::Scalar);
    }
}

/// Rows whose products `x / d` land exactly on .5 (ties round away from zero), zeros,
/// huge and tiny values.
fn quantization_rows(rng: &mut Rng) -> Vec<Vec<f32>> {
    let mut rows = vec![];
    for trial in 0..300 {
        let mut x = rng.vec(96, if trial % 3 == 0 { 300.0 } else { 1.0 });
        if trial % 4 == 0 {
            // amax = 127 gives d = 1 and id = 1, so halves are exact ties
            x[0] = 127.0;
            for v in &mut x[1..32] {
                *v = ((rng.next_u64() % 255) as f32 - 127.0) / 2.0;
            }
        }
        if trial % 5 == 0 {
            x[32..64].fill(0.0);
        }
        if trial % 7 == 0 {
            x[64..].iter_mut().for_each(|v| *v *= 1e-30);
        }
        rows.push(x);
    }
    rows
}

fn our_quantize(isa: Isa, x: &[f32], with_sum: bool) -> (Vec<i8>, Vec<[f32; 2]>) {
    quantize_scaled(isa, x, ActFormat { with_sum, scale: ActScale::Block })
}

fn quantize_scaled(isa: Isa, x: &[f32], act: ActFormat) -> (Vec<i8>, Vec<[f32; 2]>) {
    let mut qs = vec![0i8; x.len()];
    let mut ds = vec![[0f32; 2]; x.len() / QK];
    isa.quantize_row(x, &mut qs, &mut ds, act);
    (qs, ds)
}

/// Activations with one scale per 256 values: every instruction set's bit for bit the
/// scalar one's, one `d` per super-block, quants within ±127 with the span's largest
/// magnitude at ±127, and `s` the block's own `d * sum(q)`.
#[test]
fn super_block_quantization_is_one_scale_per_256() {
    let mut rng = Rng(0x5eed_0010);
    // eight 96-value rows make three super-blocks, each with the rows' ties, zeros,
    // huge and tiny values
    for x in quantization_rows(&mut rng).chunks_exact(8).map(|rows| rows.concat()) {
        for with_sum in [false, true] {
            let act = ActFormat { with_sum, scale: ActScale::SuperBlock };
            let (qs, ds) = quantize_scaled(Isa::Scalar, &x, act);
            for isa in Isa::all_supported() {
                assert_eq!(quantize_scaled(isa, &x, act), (qs.clone(), ds.clone()), "{isa:?}");
            }
            for (sb, (q, ds)) in qs.chunks_exact(QK_K).zip(ds.chunks_exact(QK_K / QK)).enumerate() {
                assert!(ds.iter().all(|d| d[0] == ds[0][0]), "super-block {sb}: one d");
                let amax = x[sb * QK_K..][..QK_K].iter().fold(0f32, |a, v| a.max(v.abs()));
                let top = q.iter().map(|&v| (v as i32).abs()).max().unwrap();
                assert!(top == if amax > 0.0 { 127 } else { 0 }, "super-block {sb}: largest |q| {top}");
                for (b, d) in ds.iter().enumerate() {
                    let sum: i32 = q[b * QK..][..QK].iter().map(|&v| v as i32).sum();
                    let s = (half::f16::from_f32(sum as f32) * half::f16::from_f32(d[0])).to_f32();
                    assert_eq!(d[1], if with_sum { s } else { 0.0 }, "super-block {sb} block {b}: s");
                }
            }
        }
    }
}

#[test]
fn q8_1_quantization_is_candles_bit_for_bit() {
    let mut rng = Rng(0x5eed_0001);
    for x in quantization_rows(&mut rng) {
        let mut theirs = vec![k_quants::BlockQ8_1::zeros(); x.len() / QK];
        k_quants::BlockQ8_1::from_float(&x, &mut theirs);
        // BlockQ8_1 is #[repr(C)] { d: f16, s: f16, qs: [i8; 32] } (36 bytes)
        let bytes = unsafe { std::slice::from_raw_parts(theirs.as_ptr() as *const u8, theirs.len() * 36) };
        for isa in Isa::all_supported() {
            let (qs, ds) = our_quantize(isa, &x, true);
            for (b, blk) in bytes.chunks_exact(36).enumerate() {
                let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                let s = half::f16::from_le_bytes([blk[2], blk[3]]).to_f32();
                let q: Vec<i8> = blk[4..].iter().map(|&v| v as i8).collect();
                assert_eq!(ds[b][0].to_bits(), d.to_bits(), "{isa:?} d of block {b}");
                assert_eq!(ds[b][1].to_bits(), s.to_bits(), "{isa:?} s of block {b}");
                assert_eq!(&qs[b * QK..(b + 1) * QK], &q[..], "{isa:?} qs of block {b}");
            }
        }
    }
}

#[test]
fn q8_0_quantization_matches_candle() {
    let mut rng = Rng(0x5eed_0002);
    for x in quantization_rows(&mut rng) {
        let mut theirs = vec![k_quants::BlockQ8_0::zeros(); x.len() / QK];
        k_quants::BlockQ8_0::from_float(&x, &mut theirs);
        let bytes = unsafe { std::slice::from_raw_parts(theirs.as_ptr() as *const u8, theirs.len() * 34) };
        for isa in Isa::all_supported() {
            let (qs, ds) = our_quantize(isa, &x, false);
            for (b, blk) in bytes.chunks_exact(34).enumerate() {
                let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                assert_eq!(ds[b][0].to_bits(), d.to_bits(), "{isa:?} d of block {b}");
                for (j, (&ours, &theirs)) in qs[b * QK..].iter().zip(&blk[2..]).enumerate() {
                    // candle's aarch64 Q8_0 quantizer is its own NEON code; allow it to
                    // settle exact ties the other way
                    let tol = if cfg!(target_arch = "x86_64") { 0 } else { 1 };
                    assert!(
                        (ours as i32 - theirs as i8 as i32).abs() <= tol,
                        "{isa:?} q[{j}] of block {b}: {ours} vs {}",
                        theirs as i8
                    );
                }
            }
        }
    }
}

#[test]
fn q4_1_matches_candle() {
    let mut rng = Rng(0x5eed_0003);
    for (n, k) in SHAPES {
        let w = random_weight(&mut rng, n, k, GgmlDType::Q4_1);
        let lin = QLinear::new(w.clone(), Kernels::Fast).unwrap();
        assert!(lin.uses_own_kernel());
        assert_eq!((lin.out_features(), lin.in_features()), (n, k));
        assert_eq!(lin.dtype(), GgmlDType::Q4_1);
        for m in ROWS {
            let x = tensor(random_acts(&mut rng, m, k), &[m, k]);
            let reference = candle_forward(&w, &x);
            let ours = lin.forward(&x).unwrap();
            let err = rel_err(&ours, &reference);
            assert!(err <= 1e-5, "Q4_1 n={n} k={k} m={m}: rel err {err:e}");
            // the scalar path is candle's arithmetic term for term
            let scalar = forward_with(&lin, Isa::Scalar, &x);
            let err_scalar = rel_err(&scalar, &reference);
            assert!(err_scalar <= 1e-6, "scalar n={n} k={k} m={m}: {err_scalar:e}");
            eprintln!("Q4_1 {n}x{k} m={m}: simd {err:.1e}, scalar {err_scalar:.1e}");
        }
    }
}

#[test]
fn every_instruction_set_agrees_with_scalar() {
    let mut rng = Rng(0x5eed_0004);
    for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q5_0, GgmlDType::Q6K] {
        // weight rows: whole decode and prefill tiles, and every remainder of them; for the
        // 32-value formats, rows of every remainder of four blocks (NEON's step) with and
        // without whole steps, and of whole 256-value chunks (AVX-512's interleaved
        // prefill) with no tail, an even and an odd one; and rows longer than a prefill
        // tile's chunk (`PREFILL_CHUNK_BLOCKS`), with a short last chunk; and AVX-512's groups
        // of sixteen rows with a tail (and Q6_K in AVX2's groups of eight)
        let shapes: &[(usize, usize)] = if dtype == GgmlDType::Q6K {
            &[(576, 512), (37, 256), (6, 768), (3, 1024), (5, 2304), (21, 2304)]
        } else {
            &[
                (576, 576),
                (37, 160),
                (6, 224),
                (3, 128),
                (5, 96),
                (2, 32),
                (7, 512),
                (9, 800),
                (3, 2080),
                (19, 2304),
                (40, 1024),
            ]
        };
        for &(n, k) in shapes {
            let w = random_weight(&mut rng, n, k, dtype);
            let lin = QLinear::new(w, Kernels::Fast).unwrap();
            assert_eq!(lin.dtype(), dtype, "read in the file's layout");
            // every remainder of 4- and 8-row prefill tiles, and a long prompt
            for m in [1, 2, 3, 4, 5, 6, 7, 8, 9, 14, 130] {
                let x = tensor(random_acts(&mut rng, m, k), &[m, k]);
                let scalar = forward_with(&lin, Isa::Scalar, &x);
                for isa in Isa::all_supported() {
                    let err = rel_err(&forward_with(&lin, isa, &x), &scalar);
                    assert!(err <= 1e-5, "{dtype:?} {isa:?} n={n} k={k} m={m}: {err:e}");
                }
            }
        }
    }
}

/// Q4_K: every instruction set's kernel against the scalar one, at every remainder of the
/// decode tile (4 rows), the prefill tiles (2 weight rows x 4 or 8 activation rows, AVX2's
/// groups of 8 weight rows x 4 activation rows, or AVX-512's groups of 16 x 8, with a
/// tail) and the 16-row work units, with rows of one to four super-blocks and of nine (a
/// prefill tile's 2,048-value chunk and one more).
#[test]
fn q4_k_every_instruction_set_agrees_with_scalar() {
    let mut rng = Rng(0x5eed_000c);
    for (n, k) in [(6, 256), (37, 512), (35, 768), (130, 1024), (19, 2304)] {
        let w = random_weight(&mut rng, n, k, GgmlDType::Q4K);
        let lin = QLinear::new(w, Kernels::Fast).unwrap();
        assert_eq!(lin.dtype(), GgmlDType::Q4K, "runs in the file's layout");
        assert!(lin.uses_own_kernel());
        for m in (1..=9).chain([14, 17, 130]) {
            let x = tensor(random_acts(&mut rng, m, k), &[m, k]);
            let scalar = forward_with(&lin, Isa::Scalar, &x);
            for isa in Isa::all_supported() {
                let err = rel_err(&forward_with(&lin, isa, &x), &scalar);
                assert!(err <= 1e-5, "Q4_K {isa:?} n={n} k={k} m={m}: {err:e}");
            }
        }
    }
}

/// The SIMD kernels' unpacking of Q4_K's 6-bit scales and mins, all eight at once, gives
/// ggml's `get_scale_min_k4` for every bit pattern of every byte.
#[test]
fn q4_k_scales_and_mins_unpack_as_ggml_does() {
    let mut rng = Rng(0x5eed_000f);
    for trial in 0..2000 {
        let mut blk = BlockQ4K { d: half::f16::ONE, dmin: half::f16::ONE, scales: [0; 12], qs: [0; 128] };
        for (i, b) in blk.scales.iter_mut().enumerate() {
            *b = match trial {
                0 => 0xFF,
                1 => 1 << (i % 8),
                _ => rng.next_u64() as u8,
            };
        }
        let expected: Vec<(u8, u8)> = (0..8).map(|j| scalar::scale_min_k4(j, &blk.scales)).collect();
        let sm = blk.scales_mins();
        let ours: Vec<(u8, u8)> = (0..8).map(|j| (sm[j], sm[8 + j])).collect();
        assert_eq!(ours, expected, "scales {:?}", blk.scales);
        #[cfg(target_arch = "x86_64")]
        if Isa::detect().has_avx2() {
            #[target_feature(enable = "avx2")]
            unsafe fn unpack(blk: &BlockQ4K, out: &mut [u8; 16]) {
                use std::arch::x86_64::*;
                _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, avx2::q4k_scales_mins(blk));
            }
            let mut x86 = [0u8; 16];
            // SAFETY: the CPU has AVX2 (which includes SSSE3's byte shuffle).
            unsafe { unpack(&blk, &mut x86) };
            assert_eq!(x86, sm, "scales {:?}", blk.scales);
        }
        #[cfg(target_arch = "aarch64")]
        {
            let mut arm = [0u8; 16];
            // SAFETY: NEON is part of every aarch64 CPU.
            unsafe { std::arch::aarch64::vst1q_u8(arm.as_mut_ptr(), neon::q4k_scales_mins(&blk)) };
            assert_eq!(arm, sm, "scales {:?}", blk.scales);
        }
    }
}

/// `w` with every nibble zeroed: candle dequantizes it to `-dmin * m_j` throughout each
/// sub-block `j`, the min term alone.
fn q4_k_mins_only(w: &QTensor) -> QTensor {
    let mut bytes = w.data().unwrap().into_owned();
    for sb in bytes.chunks_exact_mut(std::mem::size_of::<BlockQ4K>()) {
        sb[16..].fill(0);
    }
    let storage = candle_core::quantized::QStorage::from_data(bytes.into(), &Device::Cpu, GgmlDType::Q4K).unwrap();
    QTensor::new(storage, w.shape().clone()).unwrap()
}

/// The scalar Q4_K kernel against candle's own Q4_K dequantization and f32 matmuls:
///
/// - `exact`: the same math from candle's values, `sum((w - w_min) * d_a * q_a) +
///   sum_j w_min_j * s_a_j` with `w_min` the weight's min terms alone (its nibbles zeroed)
///   and `(d_a, q_a, s_a)` our activation blocks: equal to f32 summation order (1e-5);
/// - `rounded`: `w` times the activations rounded as ours are (`d_a * q_a`); this differs
///   from `exact` by the f16 rounding of `s_a = d_a * sum(q_a)` in the min term (relative
///   2^-11 of that term, measured up to 3e-4 of the largest output): within 1e-3;
/// - `float`: `w` times the activations as they were, which adds the activations' 8-bit
///   rounding. Ours and candle's kernel both round them with one scale per 256 values
///   (ours `amax / 127`, candle's Q8_K `max / -128`), measured 9e-3 to 3e-2 with this
///   test's outlier channels: within 10 % of candle's.
#[test]
fn q4_k_scalar_matches_candles_dequantized_weights() {
    let mut rng = Rng(0x5eed_000d);
    for (n, k) in [(64, 256), (576, 1024), (130, 2048)] {
        let w = random_weight(&mut rng, n, k, GgmlDType::Q4K);
        let lin = QLinear::new(w.clone(), Kernels::Portable).unwrap();
        assert!(lin.uses_own_kernel() && lin.dtype() == GgmlDType::Q4K);
        let wf = w.dequantize(&Device::Cpu).unwrap();
        let w_min = q4_k_mins_only(&w).dequantize(&Device::Cpu).unwrap();
        // one min per 32-value block: (nb, n)
        let mins = w_min.reshape((n, k / QK, QK)).unwrap().i((.., .., 0)).unwrap().t().unwrap();
        for m in [1, 3, 17] {
            let xs = random_acts(&mut rng, m, k);
            let (mut xq, mut s) = (vec![], vec![]);
            for row in xs.chunks(k) {
                let (qs, ds) =
                    quantize_scaled(Isa::Scalar, row, ActFormat { with_sum: true, scale: ActScale::SuperBlock });
                xq.extend(qs.iter().enumerate().map(|(i, &q)| q as f32 * ds[i / QK][0]));
                s.extend(ds.iter().map(|d| d[1]));
            }
            let (xq, s) = (tensor(xq, &[m, k]), tensor(s, &[m, k / QK]));
            let x = tensor(xs, &[m, k]);
            let ours = forward_with(&lin, Isa::Scalar, &x);
            let wt = wf.t().unwrap();
            let exact = (xq.matmul(&(&wf - &w_min).unwrap().t().unwrap()).unwrap() + s.matmul(&mins).unwrap()).unwrap();
            let (err_exact, err_rounded) = (rel_err(&ours, &exact), rel_err(&ours, &xq.matmul(&wt).unwrap()));
            let float = x.matmul(&wt).unwrap();
            let (err_float, err_candle) = (rel_err(&ours, &float), rel_err(&candle_forward(&w, &x), &float));
            eprintln!(
                "Q4_K {n}x{k} m={m}: exact {err_exact:.1e}, rounded acts {err_rounded:.1e}, \
                 f32 acts {err_float:.1e} (candle {err_candle:.1e})"
            );
            assert!(err_exact <= 1e-5, "Q4_K n={n} k={k} m={m}: {err_exact:e} against the same math");
            assert!(err_rounded <= 1e-3, "Q4_K n={n} k={k} m={m}: {err_rounded:e} against d * q activations");
            assert!(err_float <= 1.1 * err_candle, "Q4_K n={n} k={k} m={m}: {err_float:e}, candle {err_candle:e}");
        }
    }
}

/// Q8_0 against the ggml reference (candle's Q8_0 activation quantization and scalar dot):
/// candle's own forward takes other routes on some CPUs (an AVX512-VNNI repacked kernel
/// with Q8_K activations when k is a multiple of 256), so it is compared where it does not.
#[test]
fn q8_0_matches_reference() {
    let mut rng = Rng(0x5eed_0005);
    for (n, k) in SHAPES {
        let w = random_weight(&mut rng, n, k, GgmlDType::Q8_0);
        let lin = QLinear::new(w.clone(), Kernels::Fast).unwrap();
        assert!(lin.uses_own_kernel());
        let data = w.data().unwrap();
        let blocks = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const k_quants::BlockQ8_0, n * k / QK) };
        for m in ROWS {
            let xs = random_acts(&mut rng, m, k);
            let mut reference = vec![0f32; m * n];
            for i in 0..m {
                let mut a = vec![k_quants::BlockQ8_0::zeros(); k / QK];
                k_quants::BlockQ8_0::from_float(&xs[i * k..(i + 1) * k], &mut a);
                for r in 0..n {
                    let row = &blocks[r * k / QK..(r + 1) * k / QK];
                    reference[i * n + r] = k_quants::BlockQ8_0::vec_dot_unopt(k, row, &a);
                }
            }
            let x = tensor(xs, &[m, k]);
            let reference = tensor(reference, &[m, n]);
            let ours = lin.forward(&x).unwrap();
            let err = rel_err(&ours, &reference);
            assert!(err <= 1e-5, "Q8_0 n={n} k={k} m={m}: rel err {err:e}");
            if k % 256 != 0 {
                let err = rel_err(&ours, &candle_forward(&w, &x));
                assert!(err <= 1e-5, "Q8_0 vs candle n={n} k={k} m={m}: {err:e}");
            }
        }
    }
}

/// Q4_0 and Q5_0 against the ggml reference (candle's Q8_0 activation quantization and
/// its scalar dot), as for Q8_0: the scalar path bit for bit, the SIMD paths to rounding.
#[test]
fn q4_0_and_q5_0_match_reference() {
    fn reference<T: GgmlType<VecDotType = k_quants::BlockQ8_0>>(w: &QTensor, xs: &[f32], m: usize) -> Vec<f32> {
        let (n, k) = w.shape().dims2().unwrap();
        let data = w.data().unwrap();
        assert_eq!(data.len(), n * k / QK * std::mem::size_of::<T>());
        let blocks = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const T, n * k / QK) };
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            let mut a = vec![k_quants::BlockQ8_0::zeros(); k / QK];
            k_quants::BlockQ8_0::from_float(&xs[i * k..(i + 1) * k], &mut a);
            for r in 0..n {
                out[i * n + r] = T::vec_dot_unopt(k, &blocks[r * k / QK..(r + 1) * k / QK], &a);
            }
        }
        out
    }
    let mut rng = Rng(0x5eed_000c);
    for dtype in [GgmlDType::Q4_0, GgmlDType::Q5_0] {
        for (n, k) in SHAPES {
            let w = random_weight(&mut rng, n, k, dtype);
            let lin = QLinear::new(w.clone(), Kernels::Fast).unwrap();
            assert!(lin.uses_own_kernel());
            assert_eq!(lin.heap_bytes(), w.storage_size_in_bytes() as u64, "{dtype:?} is not rewritten");
            for m in ROWS {
                let xs = random_acts(&mut rng, m, k);
                let expected = match dtype {
                    GgmlDType::Q4_0 => reference::<k_quants::BlockQ4_0>(&w, &xs, m),
                    _ => reference::<k_quants::BlockQ5_0>(&w, &xs, m),
                };
                let x = tensor(xs, &[m, k]);
                let expected = tensor(expected, &[m, n]);
                let err = rel_err(&lin.forward(&x).unwrap(), &expected);
                assert!(err <= 1e-5, "{dtype:?} n={n} k={k} m={m}: rel err {err:e}");
                let scalar = forward_with(&lin, Isa::Scalar, &x);
                assert_eq!(rel_err(&scalar, &expected), 0.0, "{dtype:?} scalar n={n} k={k} m={m}");
            }
        }
    }
}

/// Q6_K against candle's dequantized weights times the input as our kernels see it (one
/// scale per 256 values, dequantized), in f32: equal to float rounding. Against the f32
/// input itself the difference is that 8-bit quantization of the activations, the same
/// granularity as candle's own Q6_K kernel (Q8_K): within 10 % of its error.
#[test]
fn q6_k_matches_dequantized_matmul() {
    let mut rng = Rng(0x5eed_000d);
    for (n, k) in [(576, 512), (1536, 768), (64, 2048)] {
        let w = random_weight(&mut rng, n, k, GgmlDType::Q6K);
        let lin = QLinear::new(w.clone(), Kernels::Fast).unwrap();
        assert!(lin.uses_own_kernel());
        assert_eq!((lin.dtype(), lin.heap_bytes()), (GgmlDType::Q6K, w.storage_size_in_bytes() as u64));
        let dense_t = w.dequantize(&Device::Cpu).unwrap().t().unwrap();
        for m in ROWS {
            let xs = random_acts(&mut rng, m, k);
            let mut seen = vec![0f32; m * k];
            for (x, y) in xs.chunks_exact(k).zip(seen.chunks_exact_mut(k)) {
                let (qs, ds) =
                    quantize_scaled(Isa::Scalar, x, ActFormat { with_sum: false, scale: ActScale::SuperBlock });
                for (i, (y, q)) in y.iter_mut().zip(qs).enumerate() {
                    *y = q as f32 * ds[i / QK][0];
                }
            }
            let x = tensor(xs, &[m, k]);
            let scalar = forward_with(&lin, Isa::Scalar, &x);
            let err = rel_err(&scalar, &tensor(seen, &[m, k]).matmul(&dense_t).unwrap());
            assert!(err <= 1e-5, "Q6_K scalar n={n} k={k} m={m}: rel err {err:e}");
            let exact = x.matmul(&dense_t).unwrap();
            let (err, err_candle) = (rel_err(&scalar, &exact), rel_err(&candle_forward(&w, &x), &exact));
            eprintln!("Q6_K {n}x{k} m={m}: against f32 input {err:.1e}, candle's kernel {err_candle:.1e}");
            assert!(
                err <= 1.1 * err_candle,
                "Q6_K scalar n={n} k={k} m={m}: {err:e} against the f32 input, candle {err_candle:e}"
            );
            let err = rel_err(&lin.forward(&x).unwrap(), &scalar);
            assert!(err <= 1e-5, "Q6_K fast n={n} k={k} m={m}: rel err {err:e} against scalar");
        }
    }
}

#[test]
fn real_gguf_tensors_match_candle() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut file = std::fs::File::open(path)
        .unwrap_or_else(|e| panic!("{path}: {e} — run scripts/fetch-model.sh (scripts/test does)"));
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut rng = Rng(0x5eed_0006);
    for (name, rows) in [
        ("blk.0.ffn_up.weight", &[1usize, 3, 17, 130][..]),
        ("blk.0.ffn_down.weight", &[1, 17][..]),
        ("blk.0.attn_k.weight", &[1, 5][..]),
        ("token_embd.weight", &[1, 2][..]),
    ] {
        let w = Arc::new(content.tensor(&mut file, name, &Device::Cpu).unwrap());
        let lin = QLinear::new(w.clone(), Kernels::Fast).unwrap();
        assert!(lin.uses_own_kernel(), "{name} is {:?}", w.dtype());
        let k = lin.in_features();
        for &m in rows {
            let x = tensor(random_acts(&mut rng, m, k), &[m, k]);
            let err = rel_err(&lin.forward(&x).unwrap(), &candle_forward(&w, &x));
            eprintln!("{name} {:?} {:?} m={m}: rel err {err:.1e}", w.dtype(), w.shape());
            assert!(err <= 1e-5, "{name} m={m}: rel err {err:e}");
        }
    }
}

/// Gemma 3 270M's Q4_K matrices (attention outputs, k = 1024; half the FFN downs,
/// k = 2048; the rest of its matrices have rows of 640) run in the file's layout, as near
/// the f32 product as candle's kernel (both round the input per 256 values; within 10 %).
#[test]
fn real_q4_k_tensors_run_in_place_and_match_candle() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/models/gemma-3-270m-q4_k_m.gguf");
    let mut file = std::fs::File::open(path)
        .unwrap_or_else(|e| panic!("{path}: {e} — run scripts/fetch-model.sh gemma-3-270m-q4_k_m"));
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut rng = Rng(0x5eed_000e);
    for name in ["blk.0.attn_output.weight", "blk.2.ffn_down.weight"] {
        let w = Arc::new(content.tensor(&mut file, name, &Device::Cpu).unwrap());
        assert_eq!(w.dtype(), GgmlDType::Q4K, "{name}");
        let lin = QLinear::new(w.clone(), Kernels::Fast).unwrap();
        assert!(lin.uses_own_kernel() && lin.dtype() == GgmlDType::Q4K, "{name}");
        assert_eq!(lin.heap_bytes(), w.storage_size_in_bytes() as u64, "not rewritten");
        let k = lin.in_features();
        let wt = w.dequantize(&Device::Cpu).unwrap().t().unwrap();
        for m in [1, 7, 33] {
            let x = tensor(random_acts(&mut rng, m, k), &[m, k]);
            let float = x.matmul(&wt).unwrap();
            let ours = lin.forward(&x).unwrap();
            let (err, err_candle) = (rel_err(&ours, &float), rel_err(&candle_forward(&w, &x), &float));
            eprintln!("{name} {:?} m={m}: rel err {err:.1e} (candle {err_candle:.1e})", w.shape());
            assert!(err <= 1.1 * err_candle, "{name} m={m}: {err:e}, candle {err_candle:e}");
            for isa in Isa::all_supported() {
                let err = rel_err(&forward_with(&lin, isa, &x), &forward_with(&lin, Isa::Scalar, &x));
                assert!(err <= 1e-5, "{name} {isa:?} m={m}: {err:e} from the scalar kernel");
            }
        }
    }
}

#[test]
fn shapes_dtypes_and_layouts() {
    let mut rng = Rng(0x5eed_0007);
    // (candle's Q4_1 dot wants an even number of blocks per row)
    let w = random_weight(&mut rng, 64, 128, GgmlDType::Q4_1);
    let lin = QLinear::new(w.clone(), Kernels::Fast).unwrap();
    // (batch, seq, k) in, (batch, seq, n) out
    let x = tensor(rng.vec(2 * 5 * 128, 1.0), &[2, 5, 128]);
    let y = lin.forward(&x).unwrap();
    assert_eq!(y.dims(), &[2, 5, 64]);
    let flat = lin.forward(&x.reshape((10, 128)).unwrap()).unwrap();
    assert_eq!(rel_err(&y.reshape((10, 64)).unwrap(), &flat), 0.0);
    assert!(rel_err(&y, &candle_forward(&w, &x)) <= 1e-5);
    // a single vector
    let v = lin.forward(&x.i((0, 0)).unwrap().unsqueeze(0).unwrap()).unwrap();
    assert_eq!(v.dims(), &[1, 64]);
    // non-contiguous input
    let xt = tensor(rng.vec(128 * 3, 1.0), &[128, 3]).t().unwrap();
    assert!(!xt.is_contiguous());
    let err = rel_err(&lin.forward(&xt).unwrap(), &candle_forward(&w, &xt.contiguous().unwrap()));
    assert!(err <= 1e-5);
    // f16 / bf16 input: computed in f32, returned in the input dtype
    for dt in [DType::F16, DType::BF16] {
        let xh = x.to_dtype(dt).unwrap();
        let y = lin.forward(&xh).unwrap();
        assert_eq!(y.dtype(), dt);
        let reference = candle_forward(&w, &xh.to_dtype(DType::F32).unwrap());
        assert!(rel_err(&y.to_dtype(DType::F32).unwrap(), &reference) <= 1e-2);
    }
    // wrong width is an error, not a panic
    assert!(lin.forward(&tensor(vec![0.0; 96], &[1, 96])).is_err());
}

#[test]
fn other_formats_and_the_candle_switch_use_candle_and_the_rest_run_ours_in_their_own_layout() {
    let mut rng = Rng(0x5eed_0008);
    let x = tensor(rng.vec(3 * 256, 1.0), &[3, 256]);
    // Q4_0, Q5_0, Q4_K and Q6_K run ours in their own layout: close to candle's own
    // kernels for them (the K-quants' activations quantized per 32 instead of per 256).
    for (dtype, runs_as) in [
        (GgmlDType::Q4K, GgmlDType::Q4K),
        (GgmlDType::Q4_0, GgmlDType::Q4_0),
        (GgmlDType::Q5_0, GgmlDType::Q5_0),
        (GgmlDType::Q6K, GgmlDType::Q6K),
    ] {
        let w = random_weight(&mut rng, 32, 256, dtype);
        let lin = QLinear::new(w.clone(), Kernels::Fast).unwrap();
        assert!(lin.uses_own_kernel(), "{dtype:?}");
        assert_eq!(lin.dtype(), runs_as);
        // Q6_K: candle quantizes the activations per 256 values, we per 32
        let tolerance = if dtype == GgmlDType::Q6K { 3e-2 } else { 1e-2 };
        let err = rel_err(&lin.forward(&x).unwrap(), &candle_forward(&w, &x));
        assert!(err <= tolerance, "{dtype:?}: {err}");
    }
    let w = random_weight(&mut rng, 32, 96, GgmlDType::Q5_1);
    let lin = QLinear::new(w.clone(), Kernels::Fast).unwrap();
    assert_eq!(lin.dtype(), GgmlDType::Q8_0, "Q5_1 is rewritten");
    let w = random_weight(&mut rng, 32, 256, GgmlDType::Q3K);
    let lin = QLinear::new(w.clone(), Kernels::Fast).unwrap();
    assert!(!lin.uses_own_kernel());
    assert_eq!(lin.dtype(), GgmlDType::Q3K);
    assert_eq!(rel_err(&lin.forward(&x).unwrap(), &candle_forward(&w, &x)), 0.0);
    // Float weights are read in place (`float`): candle's f32 matmul to summation order.
    for dtype in [GgmlDType::F32, GgmlDType::F16, GgmlDType::BF16] {
        let w = random_weight(&mut rng, 32, 256, dtype);
        let lin = QLinear::new(w.clone(), Kernels::Fast).unwrap();
        assert!(lin.uses_own_kernel(), "{dtype:?}");
        assert_eq!(lin.dtype(), dtype);
        let err = rel_err(&lin.forward(&x).unwrap(), &candle_forward(&w, &x));
        assert!(err <= 1e-5, "{dtype:?}: {err}");
    }
    let w = random_weight(&mut rng, 32, 256, GgmlDType::Q4_1);
    let lin = QLinear::new(w.clone(), Kernels::Candle).unwrap();
    assert!(!lin.uses_own_kernel());
    assert_eq!(rel_err(&lin.forward(&x).unwrap(), &candle_forward(&w, &x)), 0.0);
    let lin = QLinear::new(w, Kernels::Portable).unwrap();
    assert!(lin.uses_own_kernel());
    assert!(format!("{lin:?}").contains("Scalar"));
}

#[test]
fn concurrent_callers_get_their_own_results() {
    let mut rng = Rng(0x5eed_0009);
    let w = random_weight(&mut rng, 1536, 576, GgmlDType::Q4_1);
    let lin = Arc::new(QLinear::new(w.clone(), Kernels::Fast).unwrap());
    let inputs: Vec<Tensor> =
        (0..4).map(|i| tensor(random_acts(&mut rng, 1 + i * 5, 576), &[1 + i * 5, 576])).collect();
    let expected: Vec<Tensor> = inputs.iter().map(|x| lin.forward(x).unwrap()).collect();
    std::thread::scope(|s| {
        for (x, want) in inputs.iter().zip(&expected) {
            let lin = lin.clone();
            s.spawn(move || {
                for _ in 0..20 {
                    assert_eq!(rel_err(&lin.forward(x).unwrap(), want), 0.0);
                }
            });
        }
    });
}

#[test]
fn forward_many_equals_separate_forwards() {
    let mut rng = Rng(0x5eed_000a);
    let k = 768;
    let q = QLinear::new(random_weight(&mut rng, 576, k, GgmlDType::Q4_1), Kernels::Fast).unwrap();
    let kp = QLinear::new(random_weight(&mut rng, 192, k, GgmlDType::Q4_1), Kernels::Fast).unwrap();
    let v = QLinear::new(random_weight(&mut rng, 200, k, GgmlDType::Q8_0), Kernels::Fast).unwrap();
    let other = QLinear::new(random_weight(&mut rng, 64, k, GgmlDType::Q4_0), Kernels::Fast).unwrap();
    // K-quants, whose input takes one scale per super-block: fused among themselves, and
    // mixed with the others (then each group quantizes its own)
    let kq = QLinear::new(random_weight(&mut rng, 96, k, GgmlDType::Q4K), Kernels::Fast).unwrap();
    let k6 = QLinear::new(random_weight(&mut rng, 40, k, GgmlDType::Q6K), Kernels::Fast).unwrap();
    for m in [1, 2, 7, 33] {
        let x = tensor(random_acts(&mut rng, m, k), &[1, m, k]);
        let groups =
            [vec![&q, &kp, &v], vec![&kp], vec![&v, &q], vec![&q, &other, &kp], vec![&kq, &k6], vec![&q, &kq, &v, &k6]];
        for layers in groups {
            let fused = QLinear::forward_many(&layers, &x).unwrap();
            assert_eq!(fused.len(), layers.len());
            for (l, y) in layers.iter().zip(&fused) {
                assert_eq!(y.dims(), &[1, m, l.out_features()]);
                assert_eq!(rel_err(y, &l.forward(&x).unwrap()), 0.0, "m={m}");
            }
        }
    }
    assert!(QLinear::forward_many(&[], &tensor(vec![0.0; k], &[1, k])).unwrap().is_empty());
}

#[test]
fn a_decode_job_gives_the_same_outputs_whatever_ranges_compute_them() {
    use crate::engine::cpu::pool::Detachable;
    let mut rng = Rng(0x5eed_000b);
    let k = 768;
    let block_scaled = [
        QLinear::new(random_weight(&mut rng, 200, k, GgmlDType::Q8_0), Kernels::Fast).unwrap(),
        QLinear::new(random_weight(&mut rng, 37, k, GgmlDType::Q4_1), Kernels::Fast).unwrap(),
        QLinear::new(random_weight(&mut rng, 21, k, GgmlDType::Q4_0), Kernels::Fast).unwrap(),
        QLinear::new(random_weight(&mut rng, 576, k, GgmlDType::Q5_0), Kernels::Fast).unwrap(),
    ];
    let super_block_scaled = [
        QLinear::new(random_weight(&mut rng, 200, k, GgmlDType::Q4K), Kernels::Fast).unwrap(),
        QLinear::new(random_weight(&mut rng, 37, k, GgmlDType::Q6K), Kernels::Fast).unwrap(),
        QLinear::new(random_weight(&mut rng, 21, k, GgmlDType::Q4K), Kernels::Fast).unwrap(),
        QLinear::new(random_weight(&mut rng, 576, k, GgmlDType::Q6K), Kernels::Fast).unwrap(),
    ];
    let x = random_acts(&mut rng, 1, k);
    for (layers, isa) in [&block_scaled, &super_block_scaled]
        .into_iter()
        .flat_map(|layers| Isa::all_supported().into_iter().map(move |isa| (layers, isa)))
    {
        let refs: Vec<&QLinear> = layers.iter().collect();
        let job = DecodeRows::new(&refs, isa, &x).unwrap();
        assert_eq!(job.outputs(), 200 + 37 + 21 + 576);
        let mut whole = vec![f32::NAN; job.outputs()];
        job.compute(0..job.items(), &mut whole);
        // each layer's outputs, in order
        let mut at = 0;
        for l in layers {
            let alone = forward_with(l, isa, &tensor(x.clone(), &[1, k]));
            let alone: Vec<f32> = alone.flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(whole[at..at + l.out_features()], alone[..], "{isa:?}");
            at += l.out_features();
        }
        // in pieces that cross the layers' boundaries anywhere
        for step in [1, 3, 7, 13] {
            let mut pieces = vec![f32::NAN; job.outputs()];
            for start in (0..job.items()).step_by(step) {
                let units = start..job.items().min(start + step);
                let out = job.output_range(units.clone());
                job.compute(units, &mut pieces[out]);
            }
            assert_eq!(pieces, whole, "{isa:?}, {step} units at a time");
        }
    }
}

/// A prompt fed in pieces (the composer reads a draft ahead a few words at a time) gives
/// every row the bits it gets fed whole: all prefill (two or more activation rows) takes the
/// same kernel whatever the number of rows, and each activation row's sums do not depend on
/// the others. (Decode, one row, takes its own kernels and rounds differently.)
#[test]
fn prefill_outputs_do_not_depend_on_how_the_rows_are_split() {
    let mut rng = Rng(0x5eed_0010);
    let formats = [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q5_0, GgmlDType::Q4K, GgmlDType::Q6K];
    for dtype in formats {
        // 37 rows: AVX-512's groups of sixteen and AVX2's of eight, with a tail; 640 values
        // (AVX-512: the natural order; AVX2: two whole 256-value groups and a tail), 1,024
        // (whole groups) and, for the K-quants, 2,048 (two of AVX2's chunks of a row)
        let widths: &[usize] =
            if matches!(dtype, GgmlDType::Q4K | GgmlDType::Q6K) { &[1024, 2048] } else { &[640, 1024] };
        for &k in widths {
            let lin = QLinear::new(random_weight(&mut rng, 37, k, dtype), Kernels::Fast).unwrap();
            let x = random_acts(&mut rng, 17, k);
            for isa in Isa::all_supported() {
                let whole: Vec<f32> =
                    forward_with(&lin, isa, &tensor(x.clone(), &[17, k])).flatten_all().unwrap().to_vec1().unwrap();
                let mut pieces = Vec::new();
                let mut i0 = 0;
                // K-quant pieces of up to eight rows read the groups from the file on AVX-512
                // (AVX2: up to four); seventeen rows unpack them
                for m in [2, 3, 4, 8] {
                    let part = tensor(x[i0 * k..(i0 + m) * k].to_vec(), &[m, k]);
                    pieces.extend(forward_with(&lin, isa, &part).flatten_all().unwrap().to_vec1::<f32>().unwrap());
                    i0 += m;
                }
                assert_eq!(i0, 17);
                let differ = whole.iter().zip(&pieces).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(differ, 0, "{dtype:?} {isa:?} k={k}: {differ} of {} outputs differ", whole.len());
            }
        }
    }
}
