//! One quantized linear layer: pocketchat's CPU kernel where it applies
//! ([`super::qlinear`]), candle's `QMatMul` everywhere else or when asked.

use std::sync::Arc;

use candle_core::quantized::QTensor;

use super::model::MatmulKernel;
use super::qlinear::{QLinear, QLinearBackend};

pub type Linear = QLinear;

pub fn linear(w: Arc<QTensor>, kernel: MatmulKernel) -> candle_core::Result<Linear> {
    let backend = match kernel {
        MatmulKernel::Fast => QLinearBackend::Auto,
        MatmulKernel::Candle => QLinearBackend::Candle,
    };
    QLinear::with_backend(w, backend)
}
