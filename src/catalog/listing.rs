//! The catalog as `pocketchat models` and the app's model screen show it: each entry
//! with its fit on a tier ([`crate::memory::fit`]), whether it is the file of its model
//! that the tier gets, whether it is downloaded, and whether this engine runs it yet.

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
    /// The file is in the models folder.
    pub downloaded: bool,
    /// This engine loads it (architecture and tokenizer supported).
    pub runs: bool,
    /// Why not, when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_yet: Option<String>,
}

/// Every entry of `catalog` on `tier`, with downloads looked for in `dir`.
pub fn rows(catalog: &Catalog, tier: RamTier, dir: &Path) -> Vec<ModelRow> {
    catalog.models.iter().map(|e| row(e, catalog.for_tier(e, tier).id == e.id, tier, dir)).collect()
}

fn row(entry: &ModelEntry, for_this_tier: bool, tier: RamTier, dir: &Path) -> ModelRow {
    let fit = memory::fit(&entry.facts(), tier);
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
        for_this_tier,
        footprint_bytes: fit.footprint_bytes,
        ceiling_bytes: fit.ceiling_bytes,
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
        // Every shipped family (llama, qwen2, qwen3, gemma3) and tokenizer runs here now.
        assert!(rows.iter().all(|r| r.runs && r.not_yet.is_none()), "{:?}", rows.iter().find(|r| !r.runs));
        let mut other = super::super::entry("gemma-3-1b-it-q4_k_m").unwrap().clone();
        other.arch = "mamba".into();
        assert!(other.runs_here().unwrap_err().contains("`mamba`"));
        other.arch = "llama".into();
        other.tokenizer = "tekken".into();
        assert!(other.runs_here().unwrap_err().contains("`tekken`"));
        let json = serde_json::to_value(small).unwrap();
        for key in ["id", "name", "params", "bits", "bytes", "fits", "budget", "for_this_tier"] {
            assert!(json.get(key).is_some(), "{key} in {json}");
        }
    }
}
