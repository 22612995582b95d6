//! Fast quantized linear layers for the CPU.
//!
//! candle 0.11 has SIMD dot kernels for Q4_0, Q8_0 and the K-quants but none for Q4_1, the
//! format of the default model, so its Q4_1 matmul runs ggml's scalar reference code.
//! [`QLinear`] runs its own kernels for Q4_1 (and Q8_0) weights on the CPU and hands every
//! other case to candle's [`QMatMul`]:
//!
//! ```text
//! x (m x k, f32) --quantize each row once--> Q8_1 / Q8_0 rows  (ggml's rounding, bit-exact)
//!                                               |
//! W (n x k, Q4_1 / Q8_0) -- rows split across candle's barrier pool (large matmuls only)
//!                                               v
//!        decode (m = 1): 4 weight rows share every activation load, each weight byte is
//!                        read once;
//!        prefill (m > 1): 4 activation rows share every unpacked weight block, tiles of
//!                         16 weight rows x 4 activation rows stay in L1
//!                                               v
//!                                      y (m x n, f32)
//! ```
//!
//! Kernels: AVX2 (+ AVX-VNNI when present) on x86-64, NEON (+ `sdot` when present) on
//! aarch64, and a portable scalar path that reproduces candle's `vec_dot_unopt` arithmetic
//! term for term. Results agree with candle's to float rounding (the SIMD paths sum the 32
//! products of a block in a different order; see the tests).
//!
//! The environment variable `POCKETCHAT_QLINEAR` (read when a layer is built) selects
//! `candle` (always candle's `QMatMul`) or `scalar` (our portable kernel); anything else,
//! or unset, means the fastest kernel this CPU supports.

mod blocks;
mod scalar;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(test)]
mod tests;

use blocks::{Acts, BlockQ4_1, BlockQ8_0, QK};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{CpuStorage, DType, Layout, Module, Result, Shape, Tensor};
use std::cell::RefCell;
use std::sync::Arc;

/// Which implementation a [`QLinear`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QLinearBackend {
    /// Our kernels where they apply (CPU, Q4_1 / Q8_0), candle's `QMatMul` elsewhere.
    #[default]
    Auto,
    /// Always candle's `QMatMul`.
    Candle,
    /// Our portable scalar kernel where ours applies (for checks and debugging).
    Scalar,
}

impl QLinearBackend {
    /// Reads `POCKETCHAT_QLINEAR` (`candle`, `scalar`; anything else means `Auto`).
    pub fn from_env() -> Self {
        match std::env::var("POCKETCHAT_QLINEAR").as_deref() {
            Ok("candle") => Self::Candle,
            Ok("scalar") => Self::Scalar,
            _ => Self::Auto,
        }
    }
}

/// Instruction set a kernel is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code)] // each architecture constructs only its own variants
pub(crate) enum Isa {
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// [`Isa::Avx2`] plus AVX-VNNI `vpdpbusd`.
    AvxVnni,
    /// aarch64 NEON.
    Neon,
    /// NEON plus the `sdot` dot-product instruction.
    NeonDot,
}

impl Isa {
    /// The best instruction set this CPU supports (detected once).
    pub(crate) fn detect() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
                {
                    if is_x86_feature_detected!("avxvnni") {
                        return Isa::AvxVnni;
                    }
                    return Isa::Avx2;
                }
            }
            #[cfg(target_arch = "aarch64")]
            {
                if std::arch::is_aarch64_feature_detected!("neon") {
                    if std::arch::is_aarch64_feature_detected!("dotprod") {
                        return Isa::NeonDot;
                    }
                    return Isa::Neon;
                }
            }
            Isa::Scalar
        })
    }

    /// Every instruction set this CPU can run, best first (for tests).
    #[cfg(test)]
    pub(crate) fn all_supported() -> Vec<Isa> {
        let best = Isa::detect();
        let mut v = vec![best];
        match best {
            Isa::AvxVnni => v.push(Isa::Avx2),
            Isa::NeonDot => v.push(Isa::Neon),
            _ => {}
        }
        if best != Isa::Scalar {
            v.push(Isa::Scalar);
        }
        v
    }

    fn quantize_row(self, x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]], with_sum: bool) {
        match self {
            // SAFETY: `Isa::detect` only returns instruction sets this CPU supports.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::AvxVnni => unsafe { avx2::quantize_row(x, qs, ds, with_sum) },
            #[cfg(target_arch = "aarch64")]
            Isa::Neon | Isa::NeonDot => unsafe { neon::quantize_row(x, qs, ds, with_sum) },
            _ => scalar::quantize_row(x, qs, ds, with_sum),
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
        let (w41, w80) = (w as *const BlockQ4_1, w as *const BlockQ8_0);
        match (self, kind) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q4_1) => avx2::q4_1_rows(w41, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q4_1) => avx2::q4_1_rows_vnni(w41, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Kind::Q8_0) => avx2::q8_0_rows(w80, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, Kind::Q8_0) => avx2::q8_0_rows_vnni(w80, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon, Kind::Q4_1) => neon::q4_1_rows(w41, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::NeonDot, Kind::Q4_1) => neon::q4_1_rows_dot(w41, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon, Kind::Q8_0) => neon::q8_0_rows(w80, nb, rows, acts, dst, ldd),
            #[cfg(target_arch = "aarch64")]
            (Isa::NeonDot, Kind::Q8_0) => neon::q8_0_rows_dot(w80, nb, rows, acts, dst, ldd),
            (_, Kind::Q4_1) => drive::<scalar::ScalarQ4_1>(w41, nb, rows, acts, dst, ldd),
            (_, Kind::Q8_0) => drive::<scalar::ScalarQ8_0>(w80, nb, rows, acts, dst, ldd),
        }
    }
}

/// Weight formats with our own kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Q4_1 weights against Q8_1 activations.
    Q4_1,
    /// Q8_0 weights against Q8_0 activations.
    Q8_0,
}

impl Kind {
    fn of(dtype: GgmlDType) -> Option<Kind> {
        match dtype {
            GgmlDType::Q4_1 => Some(Kind::Q4_1),
            GgmlDType::Q8_0 => Some(Kind::Q8_0),
            _ => None,
        }
    }
    fn block_bytes(self) -> usize {
        match self {
            Kind::Q4_1 => std::mem::size_of::<BlockQ4_1>(),
            Kind::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
        }
    }
    /// Q8_1 activations carry `s = d * sum(q)` for the Q4_1 offset term.
    fn with_sum(self) -> bool {
        self == Kind::Q4_1
    }
}

enum Backend {
    Ours { kind: Kind, isa: Isa },
    Candle(QMatMul),
}

/// A linear layer `y = x W^T` over a quantized GGUF weight `W` (`out_features x in_features`),
/// without bias.
pub struct QLinear {
    w: Arc<QTensor>,
    backend: Backend,
    out_features: usize,
    in_features: usize,
}

impl std::fmt::Debug for QLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match &self.backend {
            Backend::Ours { isa, .. } => format!("{isa:?}"),
            Backend::Candle(_) => "candle".to_string(),
        };
        f.debug_struct("QLinear")
            .field("dtype", &self.w.dtype())
            .field("out_features", &self.out_features)
            .field("in_features", &self.in_features)
            .field("backend", &backend)
            .finish()
    }
}

/// Matmuls below this many multiply-accumulates run on the calling thread: waking the pool
/// costs more than it saves (a 576 x 576 decode step is ~330k MACs, ~10 us on one core).
const PAR_MIN_MACS: usize = 256 * 1024;
/// Weight rows per parallel work unit (a multiple of the tile sizes, 4 and 2).
const UNIT_ROWS: usize = 16;
/// Activation values below which the rows are quantized on the calling thread.
const PAR_MIN_QUANT: usize = 64 * 1024;

impl QLinear {
    /// Takes ownership of a GGUF weight (`out_features x in_features`); the backend comes
    /// from `POCKETCHAT_QLINEAR` (see the module docs).
    pub fn from_qtensor(w: Arc<QTensor>) -> Result<Self> {
        Self::with_backend(w, QLinearBackend::from_env())
    }

    /// As [`QLinear::from_qtensor`] with an explicit backend choice.
    pub fn with_backend(w: Arc<QTensor>, choice: QLinearBackend) -> Result<Self> {
        let (out_features, in_features) = w.shape().dims2()?;
        let ours = match (choice, Kind::of(w.dtype())) {
            (QLinearBackend::Candle, _) | (_, None) => None,
            (_, Some(kind)) if Self::storage_ok(&w, kind)? => Some(Backend::Ours {
                kind,
                isa: if choice == QLinearBackend::Scalar {
                    Isa::Scalar
                } else {
                    Isa::detect()
                },
            }),
            _ => None,
        };
        let backend = match ours {
            Some(b) => b,
            None => Backend::Candle(QMatMul::from_arc(w.clone())?),
        };
        Ok(Self {
            w,
            backend,
            out_features,
            in_features,
        })
    }

    /// CPU storage holding exactly `n * k / 32` blocks, aligned for f16 reads.
    fn storage_ok(w: &QTensor, kind: Kind) -> Result<bool> {
        if !w.device().is_cpu() {
            return Ok(false);
        }
        let (n, k) = w.shape().dims2()?;
        let data = w.data()?;
        Ok(k.is_multiple_of(QK)
            && data.len() == n * (k / QK) * kind.block_bytes()
            && (data.as_ptr() as usize).is_multiple_of(std::mem::align_of::<half::f16>()))
    }

    /// `x`: `(.., in_features)` on any device; returns `(.., out_features)` in `x`'s dtype.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.backend {
            Backend::Candle(mm) => mm.forward(x),
            Backend::Ours { .. } => {
                if !x.device().is_cpu() {
                    candle_core::bail!(
                        "QLinear: input on {:?} but the weight is on the CPU",
                        x.device().location()
                    )
                }
                let x = x.contiguous()?;
                match x.dtype() {
                    DType::F32 => x.apply_op1_no_bwd(self),
                    dt => x.to_dtype(DType::F32)?.apply_op1_no_bwd(self)?.to_dtype(dt),
                }
            }
        }
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

    /// The weight this layer was built from.
    pub fn weight(&self) -> &Arc<QTensor> {
        &self.w
    }

    /// Whether this layer runs our kernels (false: candle's `QMatMul`).
    pub fn uses_own_kernel(&self) -> bool {
        matches!(self.backend, Backend::Ours { .. })
    }

    /// `dst (m x n) = x (m x k) W^T` on the CPU with our kernels.
    fn matmul_f32(&self, kind: Kind, isa: Isa, x: &[f32], m: usize, dst: &mut [f32]) -> Result<()> {
        let (n, k) = (self.out_features, self.in_features);
        assert_eq!(x.len(), m * k);
        assert_eq!(dst.len(), m * n);
        if m == 0 || n == 0 {
            return Ok(());
        }
        let nb = k / QK;
        let data = self.w.data()?;
        debug_assert_eq!(data.len(), n * nb * kind.block_bytes());
        let w = SendPtr(data.as_ptr() as *mut u8);

        with_scratch(m * k, m * nb, |qs, ds| {
            quantize_rows(isa, kind, x, k, qs, ds);
            let acts = Acts {
                qs: &*qs,
                ds: &*ds,
                m,
                nb,
            };
            let dst_ptr = SendPtr(dst.as_mut_ptr());
            let n_units = n.div_ceil(UNIT_ROWS);
            let run = |units: std::ops::Range<usize>| {
                let rows = units.start * UNIT_ROWS..n.min(units.end * UNIT_ROWS);
                // SAFETY: `w` holds n * nb blocks of `kind` (checked at construction), `acts`
                // holds m rows of nb blocks, each unit writes only dst[i * n + r] for its own
                // rows r, and `isa` came from `Isa::detect` (or is scalar).
                unsafe { isa.rows(kind, w.get(), nb, rows, &acts, dst_ptr.get(), n) }
            };
            let pool = candle_core::utils::barrier_pool();
            if m * n * k < PAR_MIN_MACS || pool.n_workers() == 0 || n_units == 1 {
                run(0..n_units);
            } else {
                pool.execute_chunked(n_units, run);
            }
        });
        Ok(())
    }
}

/// Quantizes `x`'s rows into `qs`/`ds`, across the pool when there are many.
fn quantize_rows(isa: Isa, kind: Kind, x: &[f32], k: usize, qs: &mut [i8], ds: &mut [[f32; 2]]) {
    let m = x.len() / k;
    let nb = k / QK;
    let pool = candle_core::utils::barrier_pool();
    if x.len() < PAR_MIN_QUANT || m == 1 || pool.n_workers() == 0 {
        for ((x, qs), ds) in x
            .chunks_exact(k)
            .zip(qs.chunks_exact_mut(k))
            .zip(ds.chunks_exact_mut(nb))
        {
            isa.quantize_row(x, qs, ds, kind.with_sum());
        }
        return;
    }
    let (qs_ptr, ds_ptr) = (SendPtr(qs.as_mut_ptr()), SendPtr(ds.as_mut_ptr()));
    pool.execute_chunked(m, |rows| {
        for i in rows {
            // SAFETY: row i's quants and scales are disjoint from every other row's.
            let (qs, ds) = unsafe {
                (
                    std::slice::from_raw_parts_mut(qs_ptr.get().add(i * k), k),
                    std::slice::from_raw_parts_mut(ds_ptr.get().add(i * nb), nb),
                )
            };
            isa.quantize_row(&x[i * k..(i + 1) * k], qs, ds, kind.with_sum());
        }
    });
}

/// A raw pointer the pool's workers may share; each writes a disjoint part.
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    // a method, so closures capture the Sync wrapper and not its raw field
    fn get(self) -> *mut T {
        self.0
    }
}

/// Runs `f` on this thread's reusable activation buffers (`qs_len` quants, `ds_len` scale
/// pairs), so steady-state forwards allocate nothing but their output.
fn with_scratch<R>(qs_len: usize, ds_len: usize, f: impl FnOnce(&mut [i8], &mut [[f32; 2]]) -> R) -> R {
    thread_local! {
        static SCRATCH: RefCell<(Vec<i8>, Vec<[f32; 2]>)> = const { RefCell::new((Vec::new(), Vec::new())) };
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

impl candle_core::CustomOp1 for QLinear {
    fn name(&self) -> &'static str {
        "pocketchat-qlinear"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let Backend::Ours { kind, isa } = self.backend else {
            candle_core::bail!("QLinear: custom op used without our kernel")
        };
        let dims = layout.shape().dims();
        let Some((&k, batch)) = dims.split_last() else {
            candle_core::bail!("QLinear: input must have at least one dimension")
        };
        if k != self.in_features {
            candle_core::bail!(
                "QLinear: input {:?} does not end in in_features = {}",
                layout.shape(),
                self.in_features
            )
        }
        let x = match storage {
            CpuStorage::F32(x) => x,
            _ => candle_core::bail!("QLinear: expected f32 input"),
        };
        let m: usize = batch.iter().product();
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("QLinear: input is not contiguous {layout:?}")
        };
        let x = &x[start..end];
        let mut dst = vec![0f32; m * self.out_features];
        self.matmul_f32(kind, isa, x, m, &mut dst)?;
        let mut out_dims = batch.to_vec();
        out_dims.push(self.out_features);
        Ok((CpuStorage::F32(dst), Shape::from(out_dims)))
    }
}
