//! Whether a model fits a device, and the token budget it gets there: computed from the
//! model's own size and shape instead of fixed per tier.
//!
//! ```text
//! usable   = ceiling × 90 %                     (10 % kept for what no model predicts)
//! fixed    = weights in the heap + runtime overhead + the prefill's per-layer activations
//!            + a hybrid model's recurrent state and its checkpoints
//!            + the sliding-window layers' K/V (their window and slack, whatever the length)
//! per_tok  = KV bytes per token of the other layers + the prefill's attention per token
//! memory   = (usable − fixed) / per_tok          (dirty memory: what jetsam counts)
//! resident = (usable − fixed − mapped weights) / per_tok
//! cap      = (the tier's KV allowance − the sliding layers' K/V) / KV bytes per token
//! budget   = min(model context, cap, memory)
//! ```
//!
//! A model whose `resident` is below [`MIN_CHAT_TOKENS`] does not fit: weights read in
//! place from the mapped file are not dirty, but they must stay resident to run at speed.
//! Among a model's variants the app takes the most bits that fit. The allowance is what a
//! class of device gives the cache: 128 MiB on a 6 GB phone (about 1K tokens for a ~2.5B
//! model, the seed's rule), 384 MiB on an 8 GB one (2K for a ~1.8B), 1 GiB on a desktop; a
//! small model's cheap tokens let it reach its full context.

use super::{PrefillShape, RamTier, GIB, MIB};

/// Below this many tokens a context cannot hold a prompt and its reply: no fit.
pub const MIN_CHAT_TOKENS: usize = 512;
/// Share of the ceiling planned for; the rest absorbs what no model predicts
/// (fragmentation, the OS's own variance).
const USABLE_PERCENT: u64 = 90;
/// Tokens per prefill chunk, as the engine feeds them.
const PREFILL_CHUNK: usize = 256;

/// What the fit check needs to know of a model: from the catalog before it is
/// downloaded, from the file once it is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelFacts {
    /// Bytes of the weights in the process's own (dirty) memory: what is copied out of
    /// the file. Jetsam counts these.
    pub weights_bytes: u64,
    /// Bytes of the weights read in place from the mapped file: clean pages, resident
    /// when touched but not counted by jetsam and dropped by the OS under pressure.
    pub mapped_bytes: u64,
    /// KV cache bytes per token (see [`super::kv_bytes_per_token`]): the attention
    /// layers' that keep every position (not the sliding-window layers').
    pub kv_bytes_per_token: u64,
    /// Bytes of the sliding-window layers' K/V (Gemma's), which hold their window and
    /// slack at most (`engine::state::window_rows`): fixed per chat, as counted here
    /// whatever the budget; 0 without such layers.
    pub window_kv_bytes: u64,
    /// Bytes of the recurrent state of a hybrid model's other layers (short convolutions,
    /// gated delta-net) with its turn checkpoints: fixed per chat whatever its length; 0
    /// for a plain transformer.
    pub recurrent_bytes: u64,
    /// The model's own context length.
    pub context: usize,
    /// What the prefill's activations depend on (its widths, and how attention runs).
    pub prefill: PrefillShape,
}

/// What limits the token budget, for the settings panel ("why").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetLimit {
    /// The model's own context length.
    ModelContext,
    /// The tier's KV allowance.
    TierCap,
    /// What the memory ceiling leaves after the weights.
    Memory,
}

impl BudgetLimit {
    pub fn explain(self) -> &'static str {
        match self {
            BudgetLimit::ModelContext => "the model's full context",
            BudgetLimit::TierCap => "this device class's cache allowance",
            BudgetLimit::Memory => "what memory leaves after the weights",
        }
    }
}

/// How a model sits on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitClass {
    /// Fits with the budget its context or the tier allows.
    Fits,
    /// Fits, but memory is what limits its budget.
    Tight,
    /// Cannot hold [`MIN_CHAT_TOKENS`] under the ceiling.
    TooLarge,
}

impl FitClass {
    pub fn label(self) -> &'static str {
        match self {
            FitClass::Fits => "fits",
            FitClass::Tight => "tight",
            FitClass::TooLarge => "too large",
        }
    }
}

/// The verdict for one model on one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fit {
    pub class: FitClass,
    /// Token budget (0 when too large).
    pub budget: usize,
    pub limit: BudgetLimit,
    /// Predicted footprint at that budget (at [`MIN_CHAT_TOKENS`] when too large).
    pub footprint_bytes: u64,
    pub ceiling_bytes: u64,
}

impl Fit {
    pub fn fits(&self) -> bool {
        self.class != FitClass::TooLarge
    }
}

/// The memory ceiling of a tier: an estimate of the jetsam limit of the class.
pub fn ceiling_bytes(tier: RamTier) -> u64 {
    match tier {
        RamTier::Phone6Gb => 3 * GIB,
        RamTier::Phone8Gb | RamTier::Desktop => 4 * GIB,
    }
}

/// KV bytes a tier gives the cache at most.
pub fn kv_allowance_bytes(tier: RamTier) -> u64 {
    match tier {
        RamTier::Phone6Gb => 128 * MIB,
        RamTier::Phone8Gb => 384 * MIB,
        RamTier::Desktop => GIB,
    }
}

/// Predicted footprint of `model` with a cache of `budget` tokens.
pub fn footprint_at(model: &ModelFacts, budget: usize) -> u64 {
    let scratch = super::prefill_scratch_bytes(PREFILL_CHUNK, &model.prefill, budget);
    super::predicted_footprint(model.weights_bytes, model.kv_bytes_per_token, budget, scratch)
        .saturating_add(model.recurrent_bytes)
        .saturating_add(model.window_kv_bytes)
}

/// The fit check: see the module doc for the arithmetic.
pub fn fit(model: &ModelFacts, tier: RamTier) -> Fit {
    let ceiling = ceiling_bytes(tier);
    let usable = ceiling / 100 * USABLE_PERCENT;
    // footprint(b) = fixed + per_token · b: predicted_footprint and prefill_scratch_bytes
    // are linear in the budget.
    let fixed = footprint_at(model, 0);
    let per_token = footprint_at(model, 1).saturating_sub(fixed).max(1);
    // Tokens are budgeted against dirty memory, what jetsam counts. Whether the model fits
    // at all also counts its mapped weights: they must stay resident to run at speed (a
    // model whose pages the OS keeps dropping reads its weights from flash every token).
    let memory = usize::try_from(usable.saturating_sub(fixed) / per_token).unwrap_or(usize::MAX);
    let with_mapped = fixed.saturating_add(model.mapped_bytes);
    let resident = usize::try_from(usable.saturating_sub(with_mapped) / per_token).unwrap_or(usize::MAX);
    let allowance = kv_allowance_bytes(tier).saturating_sub(model.window_kv_bytes);
    let cap = usize::try_from(allowance / model.kv_bytes_per_token.max(1)).unwrap_or(usize::MAX);
    let (budget, limit) =
        [(model.context, BudgetLimit::ModelContext), (cap, BudgetLimit::TierCap), (memory, BudgetLimit::Memory)]
            .into_iter()
            .min_by_key(|(tokens, _)| *tokens)
            .expect("three candidates");
    if resident < MIN_CHAT_TOKENS.min(model.context) {
        let footprint_bytes = footprint_at(model, MIN_CHAT_TOKENS).saturating_add(model.mapped_bytes);
        return Fit {
            class: FitClass::TooLarge,
            budget: 0,
            limit: BudgetLimit::Memory,
            footprint_bytes,
            ceiling_bytes: ceiling,
        };
    }
    let class = if limit == BudgetLimit::Memory { FitClass::Tight } else { FitClass::Fits };
    Fit { class, budget, limit, footprint_bytes: footprint_at(model, budget), ceiling_bytes: ceiling }
}

/// Of a model's variants (e.g. its 4-bit and 8-bit files), the index of the one with
/// the most bits that fits `tier`, and its fit. `None` when none fits.
pub fn best_variant(variants: &[(u8, ModelFacts)], tier: RamTier) -> Option<(usize, Fit)> {
    variants
        .iter()
        .enumerate()
        .map(|(i, (bits, facts))| (i, *bits, fit(facts, tier)))
        .filter(|(_, _, f)| f.fits())
        .max_by_key(|(_, bits, _)| *bits)
        .map(|(i, _, f)| (i, f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{kv_bytes_per_token, PrefillAttention};

    /// A ~2.6B model shaped like Gemma 2 2B (26 layers, 4 KV heads of 256, 8 heads,
    /// width 2,304, FFN 9,216, context 8K) at its published Q4_K_M and Q8_0 sizes.
    fn gemma2_2b(weights_bytes: u64) -> ModelFacts {
        ModelFacts {
            weights_bytes,
            mapped_bytes: 0,
            recurrent_bytes: 0,
            window_kv_bytes: 0,
            kv_bytes_per_token: kv_bytes_per_token(26, 4, 256, 2),
            context: 8192,
            // the heaviest prefill: candle's attention ops over the whole context
            prefill: PrefillShape {
                heads: 8,
                kv_heads: 4,
                head_dim: 256,
                width: 2304,
                ffn: 9216,
                attention: PrefillAttention::Materialized { window: None },
            },
        }
    }

    /// A ~1.7B model shaped like SmolLM2 1.7B (24 layers, 32 KV heads of 64, width
    /// 2,048, FFN 8,192, context 8K) at its Q4_K_M and Q8_0 sizes.
    fn smollm2_1_7b(weights_bytes: u64) -> ModelFacts {
        ModelFacts {
            weights_bytes,
            mapped_bytes: 0,
            recurrent_bytes: 0,
            window_kv_bytes: 0,
            kv_bytes_per_token: kv_bytes_per_token(24, 32, 64, 2),
            context: 8192,
            prefill: PrefillShape {
                heads: 32,
                kv_heads: 32,
                head_dim: 64,
                width: 2048,
                ffn: 8192,
                attention: PrefillAttention::Fused { window: None },
            },
        }
    }

    fn smollm2_135m() -> ModelFacts {
        ModelFacts {
            weights_bytes: 98_362_432,
            mapped_bytes: 0,
            recurrent_bytes: 0,
            window_kv_bytes: 0,
            kv_bytes_per_token: kv_bytes_per_token(30, 3, 64, 2),
            context: 8192,
            prefill: PrefillShape {
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
                width: 576,
                ffn: 1536,
                attention: PrefillAttention::Fused { window: None },
            },
        }
    }

    #[test]
    fn the_seeds_table_6gb_takes_a_2_5b_model_at_4_bit_with_about_1k_tokens() {
        let q4 = gemma2_2b(1_708_582_752);
        let q8 = gemma2_2b(2_784_495_968);
        let f8 = fit(&q8, RamTier::Phone6Gb);
        assert_eq!(f8.class, FitClass::TooLarge, "{f8:?}");
        let (i, f4) = best_variant(&[(4, q4), (8, q8)], RamTier::Phone6Gb).unwrap();
        assert_eq!(i, 0);
        assert!((1000..=1400).contains(&f4.budget), "{f4:?}");
        assert_eq!(f4.limit, BudgetLimit::TierCap);
        assert!(f4.footprint_bytes <= f4.ceiling_bytes);
    }

    #[test]
    fn the_seeds_table_8gb_takes_a_1_8b_model_at_8_bit_with_2k_tokens() {
        let q4 = smollm2_1_7b(1_055_609_824);
        let q8 = smollm2_1_7b(1_820_414_944);
        let (i, f) = best_variant(&[(4, q4), (8, q8)], RamTier::Phone8Gb).unwrap();
        assert_eq!(i, 1, "8-bit fits an 8 GB phone");
        assert_eq!(f.budget, 2048);
        assert_eq!(f.class, FitClass::Fits);
    }

    #[test]
    fn a_small_model_gets_its_full_context_where_the_allowance_allows() {
        for tier in [RamTier::Phone8Gb, RamTier::Desktop] {
            let f = fit(&smollm2_135m(), tier);
            assert_eq!((f.budget, f.limit), (8192, BudgetLimit::ModelContext), "{tier:?}");
        }
        let f = fit(&smollm2_135m(), RamTier::Phone6Gb);
        assert!(f.budget > 4096 && f.limit == BudgetLimit::TierCap, "{f:?}");
    }

    #[test]
    fn memory_limits_a_model_that_nearly_fills_the_ceiling() {
        // 2.6 GB of weights on a 6 GB phone: a little room is left for the cache.
        let f = fit(&gemma2_2b(2_600_000_000), RamTier::Phone6Gb);
        assert_eq!((f.class, f.limit), (FitClass::Tight, BudgetLimit::Memory), "{f:?}");
        assert!(f.budget >= MIN_CHAT_TOKENS && f.budget < 1260);
        assert!(f.footprint_bytes <= f.ceiling_bytes / 100 * 90);
    }

    #[test]
    fn a_huge_model_fits_nowhere_and_nothing_overflows() {
        let huge = ModelFacts { weights_bytes: u64::MAX, ..smollm2_135m() };
        for tier in RamTier::ALL {
            assert_eq!(fit(&huge, tier).class, FitClass::TooLarge);
        }
        assert_eq!(best_variant(&[(4, huge)], RamTier::Desktop), None);
        let no_heads = PrefillShape { heads: 0, ..smollm2_135m().prefill };
        let odd = ModelFacts { kv_bytes_per_token: 0, prefill: no_heads, ..smollm2_135m() };
        assert_eq!(fit(&odd, RamTier::Desktop).budget, 8192);
    }
}
