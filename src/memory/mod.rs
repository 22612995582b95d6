//! Memory awareness: which RAM tier this device is in, the policy (weight quantization,
//! token budget, memory ceiling) that follows from it, what the process uses now, and
//! the platform monitors that turn OS memory pressure into engine commands.
//!
//! Nothing here imports the UI; the engine and the app both use it.
//!
//! - `tier` and `detect`: classify physical memory into a [`RamTier`]; build a
//!   [`TierReport`] from the probes and the `POCKETCHAT_TIER` override.
//! - `policy`: what each tier may use.
//! - [`fit`]: whether a model fits a tier, and the token budget computed from its size.
//! - [`probe`]: physical memory and CPU capability per platform.
//! - [`process`]: this process's resident set, peak, footprint and live headroom.
//! - [`accounting`]: KV bytes per token, predicted footprint, the per-turn budget.
//! - [`monitor`]: OS memory-pressure signals as callbacks.

pub mod accounting;
mod detect;
mod files;
pub mod fit;
pub mod monitor;
mod policy;
pub mod probe;
pub mod process;
mod tier;

pub use accounting::{
    budget_for_headroom, kv_bytes_per_token, predicted_footprint, prefill_scratch_bytes, PrefillAttention,
    PrefillShape, HEADROOM_SAFETY_BYTES, MIN_TOKEN_BUDGET, RUNTIME_OVERHEAD_BYTES,
};
pub use detect::{tier_from_env, TIER_ENV};
pub use fit::{fit, BudgetLimit, Fit, FitClass, ModelFacts};
pub use monitor::{MemoryMonitor, MonitorConfig};
pub use policy::{choose_variant, Policy, WeightQuant};
pub use process::{available_bytes, footprint_bytes, peak_rss_bytes, release_free_memory, rss_bytes};
pub use tier::{classify, RamTier, TierReport};

pub const MIB: u64 = 1024 * 1024;
pub const GIB: u64 = 1024 * MIB;
