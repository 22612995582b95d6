//! Elementwise activations on the CPU, vectorized: a gated FFN's `act(gate) · up` in one
//! pass. candle's GELU calls libm's `tanhf` one value at a time (9 % of Gemma 3 1B's
//! prefill) and its SiLU libm's `expf`; each product is then a second pass into a new
//! buffer.

use super::attention::{exp, level, Level, PORTABLE};
#[cfg(target_arch = "x86_64")]
use super::attention::{AVX2, AVX512};
use super::kernels::Isa;
use super::pool::{self, SendPtr};

/// The activation of a gated FFN's gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// `x · sigmoid(x)`.
    Silu,
    /// GELU, tanh form (`gelu_pytorch_tanh`, candle's and llama.cpp's `gelu`):
    /// `0.5 x (1 + tanh(u))` with `u = √(2/π) (x + 0.044715 x³)`, computed as
    /// `x · sigmoid(2u)`, the same function.
    GeluTanh,
}

/// `gate ← act(gate) · up`, value by value.
pub(crate) fn gated_product(gate: &mut [f32], up: &[f32], act: Gate, isa: Isa) {
    assert_eq!(gate.len(), up.len(), "a gate value per up value");
    match (level(isa), act) {
        // SAFETY: `level` gives AVX2 and AVX512 only for instruction sets `Isa::detect`
        // found on this CPU.
        #[cfg(target_arch = "x86_64")]
        (AVX512, Gate::Silu) => unsafe { gated_avx512::<false>(gate, up) },
        #[cfg(target_arch = "x86_64")]
        (AVX512, Gate::GeluTanh) => unsafe { gated_avx512::<true>(gate, up) },
        #[cfg(target_arch = "x86_64")]
        (AVX2, Gate::Silu) => unsafe { gated_avx2::<false>(gate, up) },
        #[cfg(target_arch = "x86_64")]
        (AVX2, Gate::GeluTanh) => unsafe { gated_avx2::<true>(gate, up) },
        (_, Gate::Silu) => gated::<PORTABLE, false>(gate, up),
        (_, Gate::GeluTanh) => gated::<PORTABLE, true>(gate, up),
    }
}

/// Values per parallel unit of [`gated_product_of`] (16 KiB of each input).
const GATED_UNIT: usize = 4096;

/// `act(gate) · up` as a new buffer, on the thread pool: each unit copies its gate values
/// into the output and runs [`gated_product`] there, so neither input is copied whole
/// first, and a prefill's million values are not left to one core while the others wait.
pub(crate) fn gated_product_of(gate: &[f32], up: &[f32], act: Gate, isa: Isa) -> Vec<f32> {
    assert_eq!(gate.len(), up.len(), "a gate value per up value");
    let n = gate.len();
    let mut out: Vec<f32> = Vec::with_capacity(n);
    let dst = SendPtr(out.as_mut_ptr());
    // (about as much work per value as 16 multiply-adds: the exponential and the products)
    pool::for_each_chunk(n.div_ceil(GATED_UNIT), 16 * n, |units| {
        let values = units.start * GATED_UNIT..(units.end * GATED_UNIT).min(n);
        // SAFETY: `out` has room for n values and each unit writes only its own `values`,
        // copied in from `gate` before they are read as a slice
        let part = unsafe {
            let at = dst.get().add(values.start);
            std::ptr::copy_nonoverlapping(gate[values.clone()].as_ptr(), at, values.len());
            std::slice::from_raw_parts_mut(at, values.len())
        };
        gated_product(part, &up[values], act, isa);
    });
    // SAFETY: the job has ended (`for_each_chunk` returns when every unit has), and its
    // units cover all n values
    unsafe { out.set_len(n) };
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
fn gated_avx512<const GELU: bool>(gate: &mut [f32], up: &[f32]) {
    gated::<AVX512, GELU>(gate, up)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn gated_avx2<const GELU: bool>(gate: &mut [f32], up: &[f32]) {
    gated::<AVX2, GELU>(gate, up)
}

/// `x · sigmoid(z) · up` with `z = x` (SiLU) or `z = 2u` (GELU). Branch-free per value, so
/// the loop vectorizes at level `L`; the sigmoid takes `e^(-|z|)`, so the exponential
/// stays in the range where it is accurate.
#[inline(always)]
fn gated<const L: Level, const GELU: bool>(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let z = if GELU { 2.0 * (SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)) } else { x };
        // sigmoid(z) = 1 / (1 + e^(-z)), or e^z / (1 + e^z) below 0
        let e = exp::<L>(-z.abs());
        let s = if z >= 0.0 { 1.0 } else { e } / (1.0 + e);
        *g = x * s * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every level against the formulas in f64, over the range activations reach and
    /// beyond it; NaN stays NaN.
    #[test]
    fn gated_products_match_the_formulas() {
        let xs: Vec<f32> =
            (-4000..=4000).map(|i| i as f32 * 0.005).chain([-90.0, -60.0, -20.0, 20.0, 60.0, 90.0]).collect();
        let up: Vec<f32> = (0..xs.len()).map(|i| 0.25 + (i % 7) as f32 * 0.5).collect();
        let silu = |x: f64| x / (1.0 + (-x).exp());
        let gelu = |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
        for isa in [Isa::Scalar, Isa::detect()] {
            for (act, f) in [(Gate::Silu, &silu as &dyn Fn(f64) -> f64), (Gate::GeluTanh, &gelu)] {
                let mut got = xs.clone();
                gated_product(&mut got, &up, act, isa);
                for ((x, g), u) in xs.iter().zip(&got).zip(&up) {
                    let want = f(*x as f64) * *u as f64;
                    let err = (*g as f64 - want).abs();
                    assert!(err <= 6e-7 * (1.0 + want.abs()), "{act:?}({x}) · {u} = {g}, want {want} ({isa:?})");
                }
            }
            let mut nan = [f32::NAN];
            gated_product(&mut nan, &[1.0], Gate::GeluTanh, isa);
            assert!(nan[0].is_nan());
        }
    }
}
