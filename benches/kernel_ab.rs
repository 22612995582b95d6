//! The fast kernels (the best instruction set this CPU has) against the AVX2 path, on the
//! matrices of a real file, in alternation within one process: on a shared machine both
//! see the same load, so their ratio holds where absolute rates wander.
//!
//! ```text
//! cargo bench --no-default-features --bench kernel_ab -- MODEL.gguf [TENSOR...]
//! ```
//!
//! Per tensor and activation rows `m` (1: decode, 128: prefill), prints the median
//! G multiply-adds per second of each path over alternating ~20 ms batches, and the ratio.
//! One thread unless `POCKETCHAT_THREADS` says otherwise. The matrix stays in cache
//! across calls, so decode figures here are compute rates, not the memory-bound rate of a
//! whole model (`pocketchat bench` measures that).

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use pocketchat::engine::qlinear::QLinear;
use pocketchat::engine::Kernels;
use std::sync::Arc;
use std::time::Instant;

const DEFAULT_TENSORS: [&str; 4] =
    ["blk.0.attn_q.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_down.weight", "output.weight"];

/// Seconds per call of `f`, one batch of about 20 ms.
fn batch(calls: usize, f: &impl Fn()) -> f64 {
    let t = Instant::now();
    for _ in 0..calls {
        f();
    }
    t.elapsed().as_secs_f64() / calls as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let wanted: usize = std::env::var("POCKETCHAT_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(1);
    let threads = pocketchat::engine::pool::global().set_threads(wanted);
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let Some(path) = args.first() else {
        anyhow::bail!("usage: cargo bench --no-default-features --bench kernel_ab -- MODEL.gguf [TENSOR...]");
    };
    let names: Vec<String> = match &args[1..] {
        [] => DEFAULT_TENSORS.iter().map(|s| s.to_string()).collect(),
        rest => rest.to_vec(),
    };
    let mut file = std::fs::File::open(path)?;
    let content = gguf_file::Content::read(&mut file)?;
    println!("{path}, {threads} thread(s); fast = {}", Kernels::Fast.describe());
    println!(
        "{:<24} {:>6} {:>12} {:>4} {:>10} {:>10} {:>7}",
        "tensor", "dtype", "shape", "m", "fast G/s", "avx2 G/s", "ratio"
    );
    for name in &names {
        if !content.tensor_infos.contains_key(name.as_str()) {
            println!("{name}: not in the file");
            continue;
        }
        let w = Arc::new(content.tensor(&mut file, name, &Device::Cpu)?);
        let (fast, avx2) = (QLinear::new(w.clone(), Kernels::Fast)?, QLinear::new(w.clone(), Kernels::Avx2)?);
        let (n, k) = (fast.out_features(), fast.in_features());
        for m in [1usize, 128] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?;
            let run_fast = || drop(fast.forward(&x).unwrap());
            let run_avx2 = || drop(avx2.forward(&x).unwrap());
            let calls = ((0.02 / batch(1, &run_fast)) as usize).max(1);
            let (mut a, mut b) = (vec![], vec![]);
            for _ in 0..15 {
                a.push(batch(calls, &run_fast));
                b.push(batch(calls, &run_avx2));
            }
            let macs = (m * n * k) as f64 / 1e9;
            let (ga, gb) = (macs / median(a), macs / median(b));
            println!(
                "{:<24} {:>6} {:>12} {:>4} {:>10.1} {:>10.1} {:>6.2}x",
                name,
                format!("{:?}", fast.dtype()),
                format!("{n}x{k}"),
                m,
                ga,
                gb,
                ga / gb
            );
        }
    }
    Ok(())
}
