//! Microbenchmark: `pocketchat::engine::qlinear::QLinear` against candle's `QMatMul` on the
//! SmolLM2-135M matmul shapes, for decode (m = 1) and prefill (m = 128).
//!
//! ```text
//! cargo bench --no-default-features --bench qlinear_bench [-- MODEL.gguf]
//! ```
//!
//! Uses the real tensors of the default model when the file is there (random weights of
//! the same format otherwise) and 2 threads unless `POCKETCHAT_THREADS` says otherwise
//! (candle's kernels get the same count through `RAYON_NUM_THREADS`). Prints
//! microseconds per call (median of batches).

use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use pocketchat::engine::qlinear::QLinear;
use pocketchat::engine::Kernels;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEFAULT_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/SmolLM2-135M-Instruct.Q4_1.gguf");

/// (label, tensor name in the GGUF, out_features, in_features, dtype when synthesized)
const SHAPES: [(&str, &str, usize, usize, GgmlDType); 5] = [
    ("q/o 576x576", "blk.0.attn_q.weight", 576, 576, GgmlDType::Q4_1),
    ("k/v 192x576", "blk.0.attn_k.weight", 192, 576, GgmlDType::Q4_1),
    ("up/gate 1536x576", "blk.0.ffn_up.weight", 1536, 576, GgmlDType::Q4_1),
    ("down 576x1536", "blk.0.ffn_down.weight", 576, 1536, GgmlDType::Q4_1),
    ("output 49152x576", "token_embd.weight", 49152, 576, GgmlDType::Q8_0),
];

/// Median microseconds per call over batches that each run ~50 ms.
fn time_us(mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    f();
    let one = t.elapsed().max(Duration::from_nanos(100));
    let per_batch = ((Duration::from_millis(50).as_secs_f64() / one.as_secs_f64()) as usize).clamp(1, 20_000);
    let batches = if one > Duration::from_millis(200) { 3 } else { 7 };
    let mut samples: Vec<f64> = (0..batches)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per_batch {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / per_batch as f64
        })
        .collect();
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    samples[samples.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let wanted: usize = std::env::var("POCKETCHAT_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(2);
    let threads = pocketchat::engine::pool::global().set_threads(wanted);
    // before candle builds its thread pool
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    let path = std::env::args().skip(1).find(|a| a != "--bench").unwrap_or_else(|| DEFAULT_MODEL.to_string());

    let mut weights: BTreeMap<&str, Arc<QTensor>> = BTreeMap::new();
    match std::fs::File::open(&path) {
        Ok(mut file) => {
            let content = gguf_file::Content::read(&mut file)?;
            let mut census: BTreeMap<String, usize> = BTreeMap::new();
            for info in content.tensor_infos.values() {
                *census.entry(format!("{:?}", info.ggml_dtype)).or_default() += 1;
            }
            println!("model: {path}");
            println!("tensor dtypes: {census:?}");
            for (_, name, ..) in SHAPES {
                if content.tensor_infos.contains_key(name) {
                    let t = content.tensor(&mut file, name, &Device::Cpu)?;
                    println!("  {name}: {:?} {:?}", t.dtype(), t.shape());
                    weights.insert(name, Arc::new(t));
                }
            }
        }
        Err(e) => println!("model {path} not readable ({e}); using random weights"),
    }

    println!(
        "threads: {threads}; our kernels: {:?}",
        QLinear::new(
            Arc::new(QTensor::quantize(
                &Tensor::zeros((4, 32), candle_core::DType::F32, &Device::Cpu)?,
                GgmlDType::Q4_1
            )?),
            Kernels::Fast
        )?
    );
    println!();
    println!("{:<18} {:>5} {:>6} {:>12} {:>12} {:>8}", "shape", "dtype", "m", "candle µs", "ours µs", "speedup");
    let mut seed = 1u32;
    for (label, name, n, k, dtype) in SHAPES {
        let w = match weights.get(name) {
            Some(w) => w.clone(),
            None => {
                let v: Vec<f32> = (0..n * k)
                    .map(|_| {
                        seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                        (seed >> 8) as f32 / (1u32 << 24) as f32 * 0.1 - 0.05
                    })
                    .collect();
                Arc::new(QTensor::quantize(&Tensor::from_vec(v, (n, k), &Device::Cpu)?, dtype)?)
            }
        };
        let candle = QMatMul::from_arc(w.clone())?;
        let ours = QLinear::new(w.clone(), Kernels::Fast)?;
        for m in [1usize, 128] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?;
            let t_candle = time_us(|| {
                candle.forward(&x).unwrap();
            });
            let t_ours = time_us(|| {
                ours.forward(&x).unwrap();
            });
            println!(
                "{:<18} {:>5} {:>6} {:>12.1} {:>12.1} {:>7.2}x",
                label,
                format!("{:?}", w.dtype()),
                m,
                t_candle,
                t_ours,
                t_candle / t_ours
            );
        }
    }

    // the projections that share an input, fused into one call on our side
    let fused: [(&str, &[&str]); 2] = [
        ("q+k+v fused", &["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"]),
        ("gate+up fused", &["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]),
    ];
    if let Ok(mut file) = std::fs::File::open(&path) {
        let content = gguf_file::Content::read(&mut file)?;
        for (label, names) in fused {
            let mut candle = vec![];
            let mut ours = vec![];
            for name in names {
                let w = Arc::new(content.tensor(&mut file, name, &Device::Cpu)?);
                candle.push(QMatMul::from_arc(w.clone())?);
                ours.push(QLinear::new(w, Kernels::Fast)?);
            }
            let ours: Vec<&QLinear> = ours.iter().collect();
            let k = ours[0].in_features();
            for m in [1usize, 128] {
                let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?;
                let t_candle = time_us(|| {
                    for c in &candle {
                        c.forward(&x).unwrap();
                    }
                });
                let t_ours = time_us(|| {
                    QLinear::forward_many(&ours, &x).unwrap();
                });
                println!(
                    "{:<18} {:>5} {:>6} {:>12.1} {:>12.1} {:>7.2}x",
                    label,
                    "Q4_1",
                    m,
                    t_candle,
                    t_ours,
                    t_candle / t_ours
                );
            }
        }
    }
    Ok(())
}
