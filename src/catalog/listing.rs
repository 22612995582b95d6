//! The catalog as `pocketchat models` and the app's model screen show it: each entry
//! with its fit on a tier ([`crate::memory::fit`]) and on every tier, whether it is the
//! file of its model that the tier gets, whether it is downloaded, and whether this engine
//! runs it yet.

use std::path::Path;

use serde::Serialize;

use super::{Catalog, ModelEntry};
use crate::memory::{self, RamTier};

/// One catalog entry on one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelRow {
    pub id: String,
    pub name: String,
    pub params: u64,
    pub quant: String,
    pub bits: u8,
    /// File size: the catalog's, else estimated from the parameters ([`ModelRow::bytes_known`]).
    pub bytes: u64,
    pub bytes_known: bool,
    pub license: String,
    /// Fits this tier's memory ceiling with at least [`memory::fit::MIN_CHAT_TOKENS`].
    pub fits: bool,
    /// `fits`, `tight` or `too large`.
    pub fit: &'static str,
    /// Token budget on this tier (0 when too large).
    pub budget: usize,
    /// What sets the budget, in words.
    pub budget_limit: &'static str,
    /// The published file of its model that this tier gets ([`Catalog::for_tier`]): the
    /// one offered for this device.
    pub for_this_tier: bool,
    /// Predicted footprint at that budget.
    pub footprint_bytes: u64,
    pub ceiling_bytes: u64,
    /// Bytes each token adds to the cache (f16 keys and values of the layers that keep
    /// them over the whole context).
    pub kv_bytes_per_token: u64,
    /// Bytes fixed per chat whatever its length, counted in the footprint: a hybrid
    /// model's recurrent state with its turn checkpoints, and sliding-window caches.
    pub recurrent_bytes: u64,
    /// The fit on each tier, smallest first.
    pub tiers: Vec<TierFit>,
    /// The file is in the models folder.
    pub downloaded: bool,
    /// This engine loads it (architecture and tokenizer supported).
    pub runs: bool,
    /// Why not, when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_yet: Option<String>,
}

/// One catalog entry on one tier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierFit {
    /// The tier's id (`6gb`, `8gb`, `desktop`).
    pub tier: &'static str,
    pub fits: bool,
    /// `fits`, `tight` or `too large`.
    pub fit: &'static str,
    /// Token budget on that tier (0 when too large).
    pub budget: usize,
    pub budget_limit: &'static str,
    pub footprint_bytes: u64,
    pub ceiling_bytes: u64,
    /// The published file of its model that this tier gets.
    pub for_this_tier: bool,
}

/// Every entry of `catalog` on `tier`, with downloads looked for in `dir`.
pub fn rows(catalog: &Catalog, tier: RamTier, dir: &Path) -> Vec<ModelRow> {
    catalog.models.iter().map(|e| row(catalog, e, tier, dir)).collect()
}

fn tier_fit(catalog: &Catalog, entry: &ModelEntry, tier: RamTier) -> TierFit {
    let fit = memory::fit(&entry.facts_for(tier), tier);
    TierFit {
        tier: tier.id(),
        fits: fit.fits(),
        fit: fit.class.label(),
        budget: fit.budget,
        budget_limit: if fit.fits() { fit.limit.explain() } else { "does not fit" },
        footprint_bytes: fit.footprint_bytes,
        ceiling_bytes: fit.ceiling_bytes,
        for_this_tier: catalog.for_tier(entry, tier).id == entry.id,
    }
}

fn row(catalog: &Catalog, entry: &ModelEntry, tier: RamTier, dir: &Path) -> ModelRow {
    let facts = entry.facts_for(tier);
    let fit = memory::fit(&facts, tier);
    let runs = entry.runs_here();
    ModelRow {
        id: entry.id.clone(),
        name: entry.name.clone(),
        params: entry.params,
        quant: entry.quant.clone(),
        bits: entry.bits,
        bytes: entry.estimated_bytes(),
        bytes_known: entry.bytes.is_some(),
        license: entry.license.clone(),
        fits: fit.fits(),
        fit: fit.class.label(),
        budget: fit.budget,
        budget_limit: if fit.fits() { fit.limit.explain() } else { "does not fit" },
        for_this_tier: catalog.for_tier(entry, tier).id == entry.id,
        footprint_bytes: fit.footprint_bytes,
        ceiling_bytes: fit.ceiling_bytes,
        kv_bytes_per_token: facts.kv_bytes_per_token,
        recurrent_bytes: facts.recurrent_bytes,
        tiers: RamTier::ALL.iter().map(|&t| tier_fit(catalog, entry, t)).collect(),
        downloaded: entry.path_in(dir).is_file(),
        runs: runs.is_ok(),
        not_yet: runs.err(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_catalog_on_a_6gb_phone() {
        let dir = tempfile::tempdir().unwrap();
        let rows = rows(super::super::catalog(), RamTier::Phone6Gb, dir.path());
        let row = |id: &str| rows.iter().find(|r| r.id == id).unwrap_or_else(|| panic!("no {id}"));
        let small = row("smollm2-135m-instruct-q4_1");
        assert!(small.fits && small.runs && !small.downloaded && small.bytes_known);
        // ~4B at 8-bit is over a 6 GB phone's ceiling; its 4-bit file fits.
        assert!(!row("gemma-3-4b-it-q8_0").fits);
        assert_eq!(row("gemma-3-4b-it-q8_0").budget, 0);
        assert!(row("gemma-3-4b-it-q4_k_m").fits);
        // What the tier gets of each model: Gemma 3 4B's 4-bit file, SmolLM2-360M's 8-bit
        // one, and the default model's only (4-bit) file.
        assert!(row("gemma-3-4b-it-q4_k_m").for_this_tier && !row("gemma-3-4b-it-q8_0").for_this_tier);
        assert!(row("smollm2-360m-instruct-q8_0").for_this_tier && !row("smollm2-360m-instruct-q4_k_m").for_this_tier);
        assert!(small.for_this_tier);
        // An entry runs exactly when the engine lists its architecture (every tokenizer of
        // the catalog is supported); the others say why not.
        let catalog = super::super::catalog();
        for (r, e) in rows.iter().zip(&catalog.models) {
            let listed = crate::engine::SUPPORTED_ARCHITECTURES.contains(&e.arch.as_str());
            assert_eq!(r.runs, listed, "{}", r.id);
            assert_eq!(r.not_yet.is_some(), !listed, "{}", r.id);
        }
        assert!(row("smollm3-3b-q4_k_m").runs, "smollm3 is supported");
        assert!(row("gemma-4-e2b-it-q4_k_m").runs, "gemma4 is supported");
        // Every row carries its fit on each tier, the row's own tier among them.
        for r in &rows {
            assert_eq!(r.tiers.iter().map(|t| t.tier).collect::<Vec<_>>(), ["6gb", "8gb", "desktop"], "{}", r.id);
            let own = &r.tiers[0];
            assert_eq!((own.fits, own.budget, own.for_this_tier), (r.fits, r.budget, r.for_this_tier), "{}", r.id);
        }
        let mut other = super::super::entry("gemma-3-1b-it-q4_k_m").unwrap().clone();
        other.arch = "mamba".into();
        assert!(other.runs_here().unwrap_err().contains("`mamba`"));
        other.arch = "llama".into();
        other.tokenizer = "tekken".into();
        assert!(other.runs_here().unwrap_err().contains("`tekken`"));
        let json = serde_json::to_value(small).unwrap();
        for key in
            ["id", "name", "params", "bits", "bytes", "fits", "budget", "for_this_tier", "tiers", "recurrent_bytes"]
        {
            assert!(json.get(key).is_some(), "{key} in {json}");
        }
    }
}
