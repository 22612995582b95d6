//! The policy in force: weight quantization, token budget and memory ceiling, and why.
//!
//! Before a model is known, [`Policy::for_tier`] gives the tier's defaults (the seed's
//! rule for ~2B models). Once the engine knows the model, [`Policy::for_model`] computes
//! the budget from the model's own size and shape with [`super::fit`].
//!
//! Which file is loaded is chosen among a model's published files only
//! ([`choose_variant`]): an 8-bit copy of 4-bit weights carries no more information than
//! them and needs half as much memory again, so the policy never asks for one. A file
//! named explicitly is loaded as it is; the policy then only sets its budget.

use super::fit::{self, BudgetLimit, FitClass, ModelFacts};
use super::RamTier;

/// Bits per weight of the model file to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightQuant {
    /// 4-bit (Q4_1, Q4_K_M and the other 4- and 5-bit files).
    Q4,
    /// 8-bit (Q8_0, or more).
    Q8,
}

impl WeightQuant {
    pub fn label(self) -> &'static str {
        match self {
            WeightQuant::Q4 => "4-bit",
            WeightQuant::Q8 => "8-bit",
        }
    }

    pub fn bits(self) -> u8 {
        match self {
            WeightQuant::Q4 => 4,
            WeightQuant::Q8 => 8,
        }
    }

    /// The class of a file with this many bits per weight (8 or more is 8-bit).
    pub fn from_bits(bits: f64) -> WeightQuant {
        if bits >= 7.5 {
            WeightQuant::Q8
        } else {
            WeightQuant::Q4
        }
    }
}

/// What the loaded model may use on this device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub tier: RamTier,
    pub quant: WeightQuant,
    /// Maximum tokens in the KV cache (context + reply).
    pub token_budget: usize,
    /// Memory the app should stay under (an estimate of the jetsam limit for the class).
    pub ceiling_bytes: u64,
    /// What set the budget: the settings panel's "why".
    pub limit: BudgetLimit,
    /// How the model sits under the ceiling.
    pub fit: FitClass,
}

impl Policy {
    /// The tier's defaults before a model is known: 4-bit with 1K tokens on 6 GB
    /// phones, 8-bit with 2K on 8 GB ones, 8-bit with 4K on desktops.
    pub fn for_tier(tier: RamTier) -> Policy {
        let (quant, token_budget) = match tier {
            RamTier::Phone6Gb => (WeightQuant::Q4, 1024),
            RamTier::Phone8Gb => (WeightQuant::Q8, 2048),
            RamTier::Desktop => (WeightQuant::Q8, 4096),
        };
        Policy {
            tier,
            quant,
            token_budget,
            ceiling_bytes: fit::ceiling_bytes(tier),
            limit: BudgetLimit::TierCap,
            fit: FitClass::Fits,
        }
    }

    /// The policy for a model of `quant` weights described by `facts`: its budget is
    /// `min(model context, tier allowance, what the ceiling leaves)`. A model that does
    /// not fit gets [`fit::MIN_CHAT_TOKENS`] (loaded only on an explicit override).
    pub fn for_model(tier: RamTier, quant: WeightQuant, facts: &ModelFacts) -> Policy {
        let f = fit::fit(facts, tier);
        let token_budget = if f.fits() { f.budget } else { fit::MIN_CHAT_TOKENS.min(facts.context.max(1)) };
        Policy { tier, quant, token_budget, ceiling_bytes: f.ceiling_bytes, limit: f.limit, fit: f.class }
    }

    /// The warning for a loaded model that this tier's fit check does not pass cleanly
    /// (tight or too large), in words; `None` when it fits.
    pub fn fit_warning(&self, name: &str) -> Option<String> {
        let (tier, tokens) = (self.tier.label(), self.token_budget);
        let ceiling = self.ceiling_bytes as f64 / super::GIB as f64;
        match self.fit {
            FitClass::Fits => None,
            FitClass::Tight => Some(format!(
                "{name} fits this device only tightly ({tier}, {ceiling:.1} GiB ceiling): memory limits its budget \
                 to {tokens} tokens"
            )),
            FitClass::TooLarge => Some(format!(
                "{name} is too large for this device ({tier}, {ceiling:.1} GiB ceiling): loaded as asked, with \
                 {tokens} tokens; the system may close the app"
            )),
        }
    }

    /// The settings panel's one-line "why" of the budget.
    pub fn why(&self) -> &'static str {
        match self.fit {
            FitClass::TooLarge => "the model is too large for this device (loaded on override)",
            _ => self.limit.explain(),
        }
    }
}

/// Which of a model's published files (`variants`: each one's bits and facts) `tier`
/// loads: the one with the most bits that fits ([`fit::best_variant`]), else the
/// smallest (whose fit check then says why it does not fit). `None` only when there is
/// no file. The 8-bit tiers get 8-bit weights only where the model publishes them.
pub fn choose_variant(variants: &[(WeightQuant, ModelFacts)], tier: RamTier) -> Option<usize> {
    let by_bits: Vec<(u8, ModelFacts)> = variants.iter().map(|(q, f)| (q.bits(), *f)).collect();
    fit::best_variant(&by_bits, tier)
        .map(|(i, _)| i)
        .or_else(|| variants.iter().enumerate().min_by_key(|(_, (_, f))| f.weights_bytes).map(|(i, _)| i))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M's shape with `weights_bytes` of weights.
    fn smollm2_135m(weights_bytes: u64) -> ModelFacts {
        ModelFacts {
            weights_bytes,
            mapped_bytes: 0,
            recurrent_bytes: 0,
            window_kv_bytes: 0,
            kv_bytes_per_token: crate::memory::kv_bytes_per_token(30, 3, 64, 2),
            context: 8192,
            prefill: crate::memory::PrefillShape {
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
                width: 576,
                ffn: 1536,
                attention: crate::memory::PrefillAttention::Fused { window: None },
            },
        }
    }

    #[test]
    fn an_8_bit_tier_gets_a_published_8_bit_file_and_else_the_4_bit_one() {
        let (q4, q8) = (smollm2_135m(98_362_432), smollm2_135m(144_811_168));
        for tier in [RamTier::Phone6Gb, RamTier::Phone8Gb, RamTier::Desktop] {
            // Both published: the most bits that fit (the small model fits everywhere).
            assert_eq!(choose_variant(&[(WeightQuant::Q4, q4), (WeightQuant::Q8, q8)], tier), Some(1), "{tier:?}");
            // Only the 4-bit file published: the 4-bit file, on the 8-bit tiers too.
            assert_eq!(choose_variant(&[(WeightQuant::Q4, q4)], tier), Some(0), "{tier:?}");
        }
        assert_eq!(Policy::for_tier(RamTier::Desktop).quant, WeightQuant::Q8, "the desktop tier would take 8-bit");
        assert_eq!(choose_variant(&[], RamTier::Desktop), None);
    }

    #[test]
    fn a_variant_over_the_ceiling_is_passed_over_and_the_smallest_stands_when_none_fits() {
        let (q4, q8) = (smollm2_135m(2_000_000_000), smollm2_135m(3_400_000_000));
        let both = [(WeightQuant::Q8, q8), (WeightQuant::Q4, q4)];
        // 3.4 GB is over a 6 GB phone's 3 GiB ceiling, 2 GB is not.
        assert_eq!(choose_variant(&both, RamTier::Phone6Gb), Some(1));
        assert_eq!(choose_variant(&both, RamTier::Desktop), Some(0));
        let huge = [(WeightQuant::Q8, smollm2_135m(9_000_000_000)), (WeightQuant::Q4, smollm2_135m(5_000_000_000))];
        assert_eq!(choose_variant(&huge, RamTier::Desktop), Some(1), "none fits: the smallest, to say why");
    }

    #[test]
    fn tiers_get_the_agreed_defaults_before_a_model_is_known() {
        let p6 = Policy::for_tier(RamTier::Phone6Gb);
        assert_eq!((p6.quant, p6.token_budget), (WeightQuant::Q4, 1024));
        let p8 = Policy::for_tier(RamTier::Phone8Gb);
        assert_eq!((p8.quant, p8.token_budget), (WeightQuant::Q8, 2048));
        let pd = Policy::for_tier(RamTier::Desktop);
        assert_eq!((pd.quant, pd.token_budget), (WeightQuant::Q8, 4096));
    }

    #[test]
    fn a_model_gets_the_budget_its_fit_allows_and_says_why() {
        let small = ModelFacts {
            weights_bytes: 100_000_000,
            mapped_bytes: 0,
            recurrent_bytes: 0,
            window_kv_bytes: 0,
            kv_bytes_per_token: crate::memory::kv_bytes_per_token(30, 3, 64, 2),
            context: 8192,
            prefill: crate::memory::PrefillShape {
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
                width: 576,
                ffn: 1536,
                attention: crate::memory::PrefillAttention::Fused { window: None },
            },
        };
        let p = Policy::for_model(RamTier::Phone8Gb, WeightQuant::Q8, &small);
        assert_eq!((p.token_budget, p.limit, p.fit), (8192, BudgetLimit::ModelContext, FitClass::Fits));
        assert_eq!(p.why(), "the model's full context");
        assert_eq!(p.fit_warning("SmolLM2"), None);
        let huge = ModelFacts { weights_bytes: 5_000_000_000, ..small };
        let p = Policy::for_model(RamTier::Phone6Gb, WeightQuant::Q4, &huge);
        assert_eq!((p.fit, p.token_budget), (FitClass::TooLarge, fit::MIN_CHAT_TOKENS));
        assert!(p.why().contains("too large"));
        assert_eq!(
            p.fit_warning("Big").as_deref(),
            Some(
                "Big is too large for this device (6 GB class, 3.0 GiB ceiling): loaded as asked, with 512 tokens; \
                 the system may close the app"
            )
        );
        // 2.7 GB of weights leave a 6 GB phone's ceiling room for fewer tokens than its
        // cache allowance: tight, and said so.
        let p = Policy::for_model(
            RamTier::Phone6Gb,
            WeightQuant::Q8,
            &ModelFacts { weights_bytes: 2_700_000_000, ..small },
        );
        assert_eq!((p.fit, p.limit), (FitClass::Tight, BudgetLimit::Memory));
        let warning = p.fit_warning("Snug").unwrap();
        assert!(warning.starts_with("Snug fits this device only tightly (6 GB class"), "{warning}");
        assert!(warning.contains(&format!("{} tokens", p.token_budget)), "{warning}");
    }

    #[test]
    fn bits_name_the_class() {
        assert_eq!(WeightQuant::from_bits(5.0), WeightQuant::Q4);
        assert_eq!(WeightQuant::from_bits(8.5), WeightQuant::Q8);
        assert_eq!(WeightQuant::from_bits(16.0), WeightQuant::Q8);
    }
}
