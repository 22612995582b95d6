//! The CPU's ceilings the kernels are measured against, on every thread at once:
//!
//! - the f32 multiply-add peak (attention): a register-only loop of independent 512-bit
//!   FMAs, x86-64 with AVX-512 only;
//! - the memory read rate (decode, which streams every weight once per token): each thread
//!   sums its share of a buffer as large as a 1B model's weights.
//!
//! ```text
//! cargo bench --no-default-features --bench cpu_peak [-- THREADS]
//! ```

fn main() {
    let threads: usize = std::env::args().skip(1).find(|a| a != "--bench").and_then(|a| a.parse().ok()).unwrap_or(2);
    fma_peak(threads);
    read_rate(threads, 800 << 20);
}

fn fma_peak(threads: usize) {
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
    println!("the FMA peak is measured with 512-bit FMAs: x86-64 with AVX-512 only");
}

/// Reads `bytes` of memory five times, split over `threads`, and prints the rate: the best
/// of three such passes.
fn read_rate(threads: usize, bytes: usize) {
    let data = vec![1u64; bytes / 8];
    let per = data.len().div_ceil(threads);
    let best = (0..3)
        .map(|_| {
            let t = std::time::Instant::now();
            std::thread::scope(|s| {
                for part in data.chunks(per) {
                    s.spawn(move || {
                        // Eight independent sums: the loop vectorizes and is bound by loads.
                        let mut acc = [0u64; 8];
                        for _ in 0..5 {
                            for chunk in part.chunks_exact(8) {
                                for (a, &x) in acc.iter_mut().zip(chunk) {
                                    *a = a.wrapping_add(x);
                                }
                            }
                        }
                        std::hint::black_box(acc);
                    });
                }
            });
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    println!("memory read, {threads} threads: {:.1} GB/s", 5.0 * bytes as f64 / best / 1e9);
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
