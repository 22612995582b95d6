//! The CPU's f32 multiply-add peak, the ceiling the attention kernels are measured against:
//! a register-only loop of independent 512-bit FMAs on every thread at once.
//!
//! ```text
//! cargo bench --no-default-features --bench cpu_peak [-- THREADS]
//! ```
//!
//! x86-64 with AVX-512 only (elsewhere it says so and exits).

fn main() {
    let threads: usize = std::env::args().skip(1).find(|a| a != "--bench").and_then(|a| a.parse().ok()).unwrap_or(2);
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        let rates: Vec<f64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads).map(|_| s.spawn(|| unsafe { x86::fma_rate(400_000_000) })).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let total: f64 = rates.iter().sum();
        println!(
            "f32 FMA peak, {threads} threads: {:.1} G multiply-adds/s ({:.1} per thread)",
            total / 1e9,
            total / 1e9 / threads as f64
        );
        return;
    }
    println!("cpu_peak measures 512-bit FMAs: x86-64 with AVX-512 only");
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Multiply-adds per second of `macs` f32 multiply-adds on this thread: 12 independent
    /// accumulators hide the FMA latency.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma_rate(macs: u64) -> f64 {
        const ACCS: usize = 12;
        let iters = macs / (ACCS as u64 * 16);
        let mut acc = [_mm512_setzero_ps(); ACCS];
        let (x, y) = (_mm512_set1_ps(1.000_000_1), _mm512_set1_ps(0.999_999_9));
        let t = std::time::Instant::now();
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, x, y);
            }
        }
        let s = t.elapsed().as_secs_f64();
        // keep the result alive so the loop is not optimized away
        std::hint::black_box(acc.iter().map(|a| _mm512_reduce_add_ps(*a)).sum::<f32>());
        (iters * ACCS as u64 * 16) as f64 / s
    }
}
