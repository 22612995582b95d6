//! One tensor's matmul run COUNT times on one kernel set, and nothing else: for counting the
//! instructions a kernel executes under an emulator, where time means nothing
//! (`bench/neon_insns.sh` runs it twice under qemu with two counts and takes the
//! difference, so loading the file drops out).
//!
//! ```text
//! cargo bench --no-default-features --bench kernel_count -- MODEL.gguf TENSOR M COUNT [KERNELS]
//! ```
//!
//! `M` activation rows (1: decode, 128: prefill); `KERNELS` as `--kernel` takes them
//! (default `fast`). One thread.

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use pocketchat::engine::qlinear::QLinear;
use pocketchat::engine::Kernels;
use std::sync::Arc;

fn main() -> anyhow::Result<()> {
    pocketchat::engine::pool::global().set_threads(1);
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let usage = "usage: kernel_count MODEL.gguf TENSOR M COUNT [fast|avx2|portable|candle]";
    let [path, name, m, count, rest @ ..] = args.as_slice() else { anyhow::bail!(usage) };
    let (m, count): (usize, usize) = (m.parse()?, count.parse()?);
    let kernels = match rest {
        [] => Kernels::Fast,
        [k] => Kernels::parse(k).ok_or_else(|| anyhow::anyhow!("unknown kernels {k}; {usage}"))?,
        _ => anyhow::bail!(usage),
    };
    let mut file = std::fs::File::open(path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let w = Arc::new(content.tensor(&mut file, name, &Device::Cpu)?);
    let lin = QLinear::new(w, kernels)?;
    let x = Tensor::randn(0f32, 1.0, (m, lin.in_features()), &Device::Cpu)?;
    for _ in 0..count {
        drop(lin.forward(&x)?);
    }
    eprintln!(
        "{name} {:?} {}x{} m={m}, {count} calls, kernels {}",
        lin.dtype(),
        lin.out_features(),
        lin.in_features(),
        kernels.describe()
    );
    Ok(())
}
