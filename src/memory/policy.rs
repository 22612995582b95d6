//! The policy each tier gets: weight quantization, token budget and memory ceiling.

use super::RamTier;

/// Bits per weight of the model file to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightQuant {
    /// 4-bit (the catalog's Q4_1 file).
    Q4,
    /// 8-bit (Q8_0).
    Q8,
}

impl WeightQuant {
    pub fn label(self) -> &'static str {
        match self {
            WeightQuant::Q4 => "4-bit",
            WeightQuant::Q8 => "8-bit",
        }
    }
}

/// What a tier is allowed to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub tier: RamTier,
    pub quant: WeightQuant,
    /// Maximum tokens in the KV cache (context + reply).
    pub token_budget: usize,
    /// Memory the app should stay under (an estimate of the jetsam limit for the class).
    pub ceiling_bytes: u64,
}

impl Policy {
    pub fn for_tier(tier: RamTier) -> Policy {
        let (quant, token_budget) = match tier {
            RamTier::Phone6Gb => (WeightQuant::Q4, 1024),
            RamTier::Phone8Gb => (WeightQuant::Q8, 2048),
            RamTier::Desktop => (WeightQuant::Q8, 4096),
        };
        Policy { tier, quant, token_budget, ceiling_bytes: super::fit::ceiling_bytes(tier) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_get_the_agreed_policy() {
        let p6 = Policy::for_tier(RamTier::Phone6Gb);
        assert_eq!((p6.quant, p6.token_budget), (WeightQuant::Q4, 1024));
        let p8 = Policy::for_tier(RamTier::Phone8Gb);
        assert_eq!((p8.quant, p8.token_budget), (WeightQuant::Q8, 2048));
        let pd = Policy::for_tier(RamTier::Desktop);
        assert_eq!((pd.quant, pd.token_budget), (WeightQuant::Q8, 4096));
    }
}
