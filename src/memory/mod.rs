//! Memory awareness: which RAM tier this device is in, the policy (weight quantization,
//! token budget, memory ceiling) that follows from it, what the process uses now, and
//! the platform monitors that turn OS memory pressure into engine commands.
//!
//! Nothing here imports the UI; the engine and the app both use it.

mod policy;
mod tier;

pub use policy::{Policy, WeightQuant};
pub use tier::{classify, RamTier, TierReport};

pub const MIB: u64 = 1024 * 1024;
pub const GIB: u64 = 1024 * MIB;
