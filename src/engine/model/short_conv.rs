//! LFM2's short gated convolution, the mixer of its layers without attention (llama.cpp's
//! `build_shortconv_block` in `src/models/lfm2.cpp`):
//!
//! ```text
//!   b, c, x = split₃(in_proj · h)                   (n, 3·width) → three (n, width)
//!   u       = b ⊙ x
//!   conv[t] = Σₖ w[:, k] ⊙ u[t − (L−1) + k]          k = 0..L, per channel (depthwise)
//!   out     = out_proj · (c ⊙ conv)
//! ```
//!
//! `L` is the file's `shortconv.l_cache`. The convolution reaches `L − 1` inputs back, so
//! the layer keeps the last `L − 1` rows of `u` in the [`State`] as its recurrent state
//! (zeros before the first token), `(L − 1, width)` in f32: the whole of what it
//! remembers, whatever the length.

use candle_core::Tensor;

use super::super::cpu::kernels::Kernels;
use super::super::cpu::qlinear::QLinear as Linear;
use super::super::state::{LayerMemory, State};
use super::{Loader, Result};

pub(super) struct ShortConv {
    /// `(3·width, width)`: b, c and x, in that order.
    pub(super) in_proj: Linear,
    pub(super) out_proj: Linear,
    /// The depthwise kernel transposed to `(L, width)`, f32: row `k` weighs the input
    /// `L − 1 − k` positions back.
    kernel: Tensor,
    width: usize,
}

impl ShortConv {
    /// The tensors of layer `p` (`blk.N`) and their shapes for a `width`-wide model with a
    /// kernel of `l_cache` taps, as candle reads them (rows first).
    pub(super) fn expected_shapes(p: &str, width: usize, l_cache: usize) -> [(String, Vec<usize>); 3] {
        [
            (format!("{p}.shortconv.in_proj.weight"), vec![3 * width, width]),
            (format!("{p}.shortconv.out_proj.weight"), vec![width, width]),
            (format!("{p}.shortconv.conv.weight"), vec![width, l_cache]),
        ]
    }

    pub(super) fn load(ld: &mut Loader<'_>, p: &str, width: usize, kernels: Kernels) -> Result<ShortConv> {
        let kernel = ld.vector(&format!("{p}.shortconv.conv.weight"))?;
        Ok(ShortConv {
            in_proj: ld.linear(&format!("{p}.shortconv.in_proj.weight"), kernels)?,
            out_proj: ld.linear(&format!("{p}.shortconv.out_proj.weight"), kernels)?,
            kernel: kernel.t()?.contiguous()?,
            width,
        })
    }

    fn taps(&self) -> usize {
        self.kernel.dim(0).expect("a 2-D kernel")
    }

    /// The last `L − 1` inputs of the convolution.
    pub(super) fn memory(&self) -> LayerMemory {
        Self::memory_of(self.taps(), self.width)
    }

    /// What a layer of `taps` taps over `width` channels keeps: its last `taps − 1` inputs.
    pub(super) fn memory_of(taps: usize, width: usize) -> LayerMemory {
        LayerMemory::Recurrent(vec![vec![taps - 1, width]])
    }

    pub(super) fn vectors(&self) -> Vec<&Tensor> {
        vec![&self.kernel]
    }

    /// Mixes `h` `(n, width)` of layer `index`, reading and replacing its state.
    pub(super) fn forward(&self, index: usize, h: &Tensor, state: &mut State) -> Result<Tensor> {
        let (n, width) = (h.dim(0)?, self.width);
        let bcx = self.in_proj.forward(h)?;
        let b = bcx.narrow(1, 0, width)?;
        let c = bcx.narrow(1, width, width)?;
        let x = bcx.narrow(1, 2 * width, width)?;
        let u = (b * x)?;
        let kept = self.taps() - 1;
        // The previous inputs, then this call's: (L − 1 + n, width).
        let inputs = Tensor::cat(&[&state.recurrent(index)[0], &u], 0)?;
        // Summed tap by tap from the oldest, as ggml's ssm_conv does.
        let mut conv = inputs.narrow(0, 0, n)?.broadcast_mul(&self.kernel.narrow(0, 0, 1)?)?;
        for k in 1..self.taps() {
            conv = (conv + inputs.narrow(0, k, n)?.broadcast_mul(&self.kernel.narrow(0, k, 1)?)?)?;
        }
        state.set_recurrent(index, vec![inputs.narrow(0, n, kept)?.contiguous()?]);
        Ok(self.out_proj.forward(&(c * conv)?)?)
    }
}
