//! One quantized linear layer, run by our own CPU kernel where it is faster
//! ([`super::qlinear`]) or by candle's `QMatMul` everywhere else.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Module, Tensor};

use super::model::MatmulKernel;

pub struct Linear {
    dtype: GgmlDType,
    inner: QMatMul,
}

impl Linear {
    pub fn new(w: Arc<QTensor>, _kernel: MatmulKernel) -> candle_core::Result<Linear> {
        let dtype = w.dtype();
        Ok(Linear { dtype, inner: QMatMul::from_arc(w)? })
    }

    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.inner.forward(x)
    }
}
