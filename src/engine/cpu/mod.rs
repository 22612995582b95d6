//! Computing on the CPU: which kernels run ([`kernels`], chosen once at run time for the
//! CPU at hand), the matmul kernels per quant type and instruction set ([`qlinear`]),
//! fused attention over the KV cache ([`attention`]), vectorized activations
//! ([`activation`]), RMSNorm with its residual sum ([`norm`]) and the thread pool they share
//! ([`pool`]). Nothing here knows a model architecture or a tokenizer.

pub(crate) mod activation;
pub(crate) mod attention;
pub mod kernels;
pub(crate) mod norm;
pub mod pool;
pub mod qlinear;
