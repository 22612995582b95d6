//! What the model screen shows, as plain data: every catalog entry and every other GGUF
//! in the models folder, with its fit on this device, and the downloads in flight. Built
//! by [`scan`] from the disk and changed only by the model bridge ([`super::bridge`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::DType;

use crate::catalog::{self, listing, Catalog, Progress, Source};
use crate::engine::model::file_facts;
use crate::engine::sampler::SamplingOverrides;
use crate::engine::Kernels;
use crate::memory::{self, RamTier};
use crate::ui::copy;
use crate::ui::fmt::format_bytes;

/// The prefix of the key of a file that is in the models folder but not in the catalog
/// (added by URL or copied in).
pub const FILE_KEY_PREFIX: &str = "file:";

/// How a model that is not on the device can be had.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// Downloaded in the app from this URL (with progress, resume and checks).
    Url(String),
    /// Not downloadable in the app; the words say how instead.
    Elsewhere(String),
    /// A file in the models folder that the catalog does not know.
    Local,
}

/// One row of the model screen.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelItem {
    /// The catalog id, or [`FILE_KEY_PREFIX`] + file name.
    pub key: String,
    pub name: String,
    /// "135M params · Q4_1 · 93.5 MiB", in words.
    pub detail: String,
    pub path: PathBuf,
    /// "fits", "tight" or "too large" on this device.
    pub fit: &'static str,
    pub fits: bool,
    /// Token budget on this device (0 when too large) and what sets it.
    pub budget: usize,
    pub budget_why: &'static str,
    /// Of its model's several published files, the one this device's tier gets (the most
    /// bits that fit): the one offered here. `false` for a model of one file.
    pub tier_pick: bool,
    pub downloaded: bool,
    /// A `.part` of an interrupted download is there: *Download* resumes it.
    pub partial: bool,
    pub origin: Origin,
    /// Why this engine cannot run it (yet), when it cannot.
    pub not_yet: Option<String>,
    /// The catalog's name for the settings panel and the engine (`None` for other files).
    pub display_name: Option<String>,
    /// The catalog's recommended sampling (empty for other files).
    pub recommended_sampling: SamplingOverrides,
}

/// A download the screen shows.
#[derive(Debug, Clone, PartialEq)]
pub enum Transfer {
    Running(Progress),
    Failed(String),
}

/// The model screen's state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelsView {
    pub items: Vec<ModelItem>,
    pub transfers: BTreeMap<String, Transfer>,
    /// The last thing that happened, in words ("Downloaded …", an error).
    pub notice: Option<String>,
}

impl ModelsView {
    pub fn item(&self, key: &str) -> Option<&ModelItem> {
        self.items.iter().find(|i| i.key == key)
    }

    pub fn downloading(&self, key: &str) -> bool {
        matches!(self.transfers.get(key), Some(Transfer::Running(_)))
    }
}

/// Every GGUF in `dir` that the catalog does not name first (the user's own), then the
/// catalog's entries in its order, each with its fit on `tier`.
pub fn scan(catalog: &Catalog, dir: &Path, tier: RamTier) -> Vec<ModelItem> {
    let known: Vec<&str> = catalog.models.iter().map(|e| e.file.as_str()).collect();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x.eq_ignore_ascii_case("gguf")))
        .filter(|p| !p.file_name().and_then(|n| n.to_str()).is_some_and(|n| known.contains(&n)))
        .collect();
    files.sort();
    let mut items: Vec<ModelItem> = files.iter().map(|p| local_item(p, tier)).collect();
    for (entry, row) in catalog.models.iter().zip(listing::rows(catalog, tier, dir)) {
        let path = entry.path_in(dir);
        let origin = match entry.source() {
            Ok(Source::Url(url)) => Origin::Url(url),
            _ => Origin::Elsewhere(copy::fetched_elsewhere(&entry.id)),
        };
        let size = if row.bytes_known { format_bytes(row.bytes) } else { format!("~{}", format_bytes(row.bytes)) };
        items.push(ModelItem {
            key: row.id.clone(),
            name: row.name.clone(),
            detail: copy::catalog_detail(&format_params(row.params), &row.quant, &size, &row.license),
            partial: catalog::download::part_path(&path).is_file(),
            path,
            fit: row.fit,
            fits: row.fits,
            budget: row.budget,
            budget_why: row.budget_limit,
            tier_pick: row.for_this_tier && catalog.variants_of(entry).len() > 1,
            downloaded: row.downloaded,
            origin,
            not_yet: row.not_yet,
            display_name: Some(row.name),
            recommended_sampling: entry.sampling,
        });
    }
    items
}

/// A file the catalog does not know: its fit from its own header.
fn local_item(path: &Path, tier: RamTier) -> ModelItem {
    let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut item = ModelItem {
        key: format!("{FILE_KEY_PREFIX}{file}"),
        name: file.trim_end_matches(".gguf").to_string(),
        detail: copy::added_file(&format_bytes(bytes)),
        path: path.to_path_buf(),
        fit: "unknown",
        fits: false,
        budget: 0,
        budget_why: "",
        tier_pick: false,
        downloaded: true,
        partial: false,
        origin: Origin::Local,
        not_yet: None,
        display_name: None,
        recommended_sampling: SamplingOverrides::default(),
    };
    // The app computes with the default kernels (the catalog's fit assumes them too).
    match file_facts(path, DType::F16, Kernels::default()) {
        Ok(f) => {
            let fit = memory::fit(&f.facts, tier);
            item.detail = copy::added_file_bits(f.bits_per_weight, &format_bytes(bytes));
            item.fit = fit.class.label();
            item.fits = fit.fits();
            item.budget = fit.budget;
            item.budget_why = if fit.fits() { fit.limit.explain() } else { copy::DOES_NOT_FIT };
        }
        Err(e) => item.not_yet = Some(e.to_string()),
    }
    item
}

/// The row of a file being added by URL, before it is on the disk.
pub fn pending_item(name: &str, url: &str, dir: &Path) -> ModelItem {
    let path = dir.join(name);
    ModelItem {
        key: format!("{FILE_KEY_PREFIX}{name}"),
        name: name.trim_end_matches(".gguf").to_string(),
        detail: copy::from_url(url),
        partial: catalog::download::part_path(&path).is_file(),
        path,
        fit: "unknown",
        fits: false,
        budget: 0,
        budget_why: "",
        tier_pick: false,
        downloaded: false,
        origin: Origin::Url(url.to_string()),
        not_yet: None,
        display_name: None,
        recommended_sampling: SamplingOverrides::default(),
    }
}

fn format_params(params: u64) -> String {
    if params >= 1_000_000_000 {
        format!("{:.1}B", params as f64 / 1e9)
    } else {
        format!("{}M", params / 1_000_000)
    }
}

/// "12.0 of 93.5 MiB · 2.1 MiB/s · 40 s left", or "Verifying…".
pub fn progress_words(p: &Progress) -> String {
    if p.verifying {
        return copy::VERIFYING_NOW.to_string();
    }
    let mut words = match p.total {
        Some(total) => copy::used_of(&format_bytes(p.bytes), &format_bytes(total)),
        None => format_bytes(p.bytes),
    };
    if p.bytes_per_sec > 0.0 {
        words.push_str(&copy::per_second(&format_bytes(p.bytes_per_sec as u64)));
    }
    if let Some(eta) = p.eta {
        words.push_str(&copy::seconds_left(eta.as_secs().max(1)));
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_users_files_come_first_then_the_catalog_with_fit() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mine.gguf"), b"not a gguf").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
        let catalog = catalog::catalog();
        let items = scan(catalog, dir.path(), RamTier::Phone6Gb);
        assert_eq!(items.len(), catalog.models.len() + 1);
        let mine = &items[0];
        assert_eq!((mine.key.as_str(), mine.origin.clone(), mine.downloaded), ("file:mine.gguf", Origin::Local, true));
        assert!(mine.not_yet.as_deref().unwrap_or("").contains("not a usable GGUF"), "{mine:?}");
        let first = &items[1];
        assert_eq!(first.key, catalog.models[0].id);
        assert!(first.fits && first.budget > 0 && !first.downloaded, "{first:?}");
        let url = items.iter().find(|i| matches!(i.origin, Origin::Url(_))).expect("a downloadable entry");
        assert!(url.detail.contains('~'), "an estimated size says so: {}", url.detail);
        // Offered for this device: of SmolLM2-360M's two files the 8-bit one, of Gemma 3
        // 4B's the 4-bit one; the default model has a single file, nothing to pick.
        let picked = |key: &str| items.iter().find(|i| i.key == key).unwrap().tier_pick;
        assert!(picked("smollm2-360m-instruct-q8_0") && !picked("smollm2-360m-instruct-q4_k_m"));
        assert!(picked("gemma-3-4b-it-q4_k_m") && !picked("gemma-3-4b-it-q8_0"));
        assert!(!first.tier_pick);
    }

    #[test]
    fn progress_reads_as_words() {
        let p = Progress {
            bytes: 12 << 20,
            total: Some(96 << 20),
            bytes_per_sec: 2.0 * (1 << 20) as f64,
            eta: Some(Duration::from_secs(42)),
            verifying: false,
        };
        assert_eq!(progress_words(&p), "12.0 MiB of 96.0 MiB · 2.0 MiB/s · 42 s left");
        assert_eq!(progress_words(&Progress { verifying: true, ..p }), "Verifying…");
    }
}
