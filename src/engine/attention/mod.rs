//! Self-attention in plain Rust for the CPU with an f32 KV cache, used by the fast
//! kernel set (`MatmulKernel::Fast`); every other case takes the candle path in
//! `engine::model`.
//!
//! - [`decode`]: one new token, split over chunks of the cached positions.
//! - [`prefill`]: several new tokens, a fused tiled kernel that never materializes the
//!   score matrix.

mod decode;
mod prefill;

pub(crate) use decode::try_decode_attention;
pub(crate) use prefill::try_prefill_attention;

use candle_core::{CpuStorage, Storage};

/// The `count` contiguous f32 elements a CPU tensor's layout points at.
fn cpu_f32<'a>(storage: &'a Storage, layout: &candle_core::Layout, count: usize) -> Option<&'a [f32]> {
    match storage {
        Storage::Cpu(CpuStorage::F32(data)) if layout.is_contiguous() => {
            data.get(layout.start_offset()..layout.start_offset() + count)
        }
        _ => None,
    }
}

/// Below this many multiply-adds in a call, one thread does it all (a pool hand-off costs
/// more than it saves).
const PAR_MIN_MACS: usize = 1 << 18;

/// Sizes of one layer's attention: `n` new tokens after `pos` cached ones.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Positions each cache buffer holds.
    pub capacity: usize,
    /// Cached positions before the new tokens.
    pub pos: usize,
    /// New tokens; their K/V are already in the cache at `pos..pos + n`.
    pub n: usize,
}

/// Runs `f(unit)` for `units` units, on the pool when there is `macs` work enough for it.
fn for_each_unit(units: usize, macs: usize, f: impl Fn(usize) + Sync) {
    let pool = candle_core::utils::barrier_pool();
    if macs < PAR_MIN_MACS || pool.n_workers() == 0 || units == 1 {
        (0..units).for_each(f);
    } else {
        pool.execute_chunked(units, |range| range.for_each(&f));
    }
}

/// `a · b + c`: one fused instruction where the target has it (aarch64 always; x86-64 when
/// built with FMA, as `.cargo/config.toml` does for this machine's CPU), otherwise a
/// multiply and an add (`f32::mul_add` would be a slow libm call there).
#[inline(always)]
fn mul_add(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(any(target_feature = "fma", target_arch = "aarch64"))]
    {
        a.mul_add(b, c)
    }
    #[cfg(not(any(target_feature = "fma", target_arch = "aarch64")))]
    {
        a * b + c
    }
}

/// `e^x` for `x ≤ 0` (larger x are clamped at 88), in branch-free arithmetic the compiler
/// vectorizes; within 4 ulp of `f32::exp` on that range, and 0 below -87.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n · LN2_HI is exact for |n| < 2^11 (Cody–Waite reduction).
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5 · 2^23 rounds to an integer and leaves it in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let below = x < -87.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO; // |r| ≤ ln2 / 2
    // e^r by its Taylor series to r^6 (relative error < 2e-7 on |r| ≤ 0.347), Horner form.
    let p = [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0];
    let mut e = 1.0 / 720.0;
    for c in p {
        e = mul_add(e, r, c);
    }
    let n = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let e = e * f32::from_bits(((n + 127) << 23) as u32);
    if below {
        0.0
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_four_ulp() {
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (got, want) = (exp(x), x.exp());
            assert!((got - want).abs() <= 4.0 * f32::EPSILON * want, "exp({x}) = {got}, want {want}");
            x += 0.001_3;
        }
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(0.0), 1.0);
    }
}
