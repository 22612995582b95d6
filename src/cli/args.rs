//! The flags the commands share: the model, the engine's settings, how to compute.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use pocketchat::chats::{self, ChatStore};
use pocketchat::engine::sampler::{self, SamplingOverrides};
use pocketchat::engine::{EngineConfig, Kernels, KvDtype, TrimMode};
use pocketchat::{catalog, memory};
use std::path::PathBuf;

/// How a one-shot command (`bench`, `perplexity`) computes.
#[derive(Args)]
pub(crate) struct ComputeArgs {
    /// Compute threads, capped at the cores there are [default: every core]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) threads: Option<u32>,
    #[arg(long, value_enum, default_value_t = Kv::F16)]
    pub(crate) kv: Kv,
    #[arg(long, value_enum)]
    pub(crate) kernel: Option<Kernel>,
}

#[derive(Args, Clone)]
pub(crate) struct ModelArg {
    /// The GGUF model file [default: the catalog's default model, fetched when missing]
    #[arg(long, value_name = "PATH")]
    pub(crate) model: Option<PathBuf>,
}

#[derive(Args, Clone)]
pub(crate) struct EngineArgs {
    #[command(flatten)]
    pub(crate) model: ModelArg,
    /// Sampling temperature; 0 decodes greedily [default: the model's, else 0.8]
    #[arg(long, value_parser = unit_range(0.0, 5.0), allow_negative_numbers = true)]
    pub(crate) temperature: Option<f32>,
    /// Sample from the K most likely tokens only; 0 turns it off [default: the model's, else 40]
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub(crate) top_k: Option<u32>,
    /// Sample from the smallest set of tokens whose probability reaches P [default: the
    /// model's, else 0.95]
    #[arg(long, value_parser = unit_range(0.0, 1.0), allow_negative_numbers = true)]
    pub(crate) top_p: Option<f32>,
    /// Drop tokens less likely than P times the most likely one [default: the model's, else 0.05]
    #[arg(long, value_parser = unit_range(0.0, 1.0), allow_negative_numbers = true)]
    pub(crate) min_p: Option<f32>,
    /// Penalty for tokens repeated in the last 64; 1 turns it off [default: the model's, else 1
    /// (off)]
    #[arg(long, value_parser = unit_range(0.1, 10.0), allow_negative_numbers = true)]
    pub(crate) repeat_penalty: Option<f32>,
    /// DRY: penalty of a token that would extend a repeat of the allowed length; 0 turns DRY
    /// off [default: 0.8; 0 with --temperature 0]
    #[arg(long, value_parser = unit_range(0.0, 10.0), allow_negative_numbers = true)]
    pub(crate) dry_multiplier: Option<f32>,
    /// DRY: the penalty grows by this factor with each token of a repeat [default: 1.75]
    #[arg(long, value_parser = unit_range(1.0, 10.0), allow_negative_numbers = true)]
    pub(crate) dry_base: Option<f32>,
    /// DRY: repeats this many tokens long are free [default: 2]
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=1_000_000), allow_negative_numbers = true)]
    pub(crate) dry_allowed_length: Option<u32>,
    /// DRY: how many recent tokens are searched for repeats; 0 turns DRY off, -1 is the whole
    /// context [default: -1]
    #[arg(long, value_parser = clap::value_parser!(i64).range(-1..=100_000_000), allow_negative_numbers = true)]
    pub(crate) dry_penalty_last_n: Option<i64>,
    /// DRY: a string that ends a repeat (escapes \n, \t, \", \\ are read); repeat the flag
    /// for several, `none` for none [default: "\n" ":" "\"" "*"]
    #[arg(long = "dry-sequence-breaker", value_name = "STRING")]
    pub(crate) dry_sequence_breakers: Vec<String>,
    /// Seed of the sampler: the same seed gives the same reply [default: 299792458]
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// The longest reply, in tokens
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) max_tokens: Option<u32>,
    /// Token budget of the conversation (at most the model's context)
    #[arg(long, value_parser = clap::value_parser!(u32).range(128..=1_048_576))]
    pub(crate) budget: Option<u32>,
    /// Load a model the fit check says is too large for this device's memory
    #[arg(long)]
    pub(crate) allow_too_large: bool,
    /// Memory tier instead of the detected one
    #[arg(long, value_parser = tier)]
    pub(crate) tier: Option<memory::RamTier>,
    /// KV cache element type [default: f16; for the app and with --follow-policy-quant, the
    /// memory tier's: q8_0 on 6 GB phones, f16 otherwise]
    #[arg(long, value_enum)]
    pub(crate) kv: Option<Kv>,
    /// How the context is cut when it fills up
    #[arg(long, value_enum, default_value_t = Trim::Shift)]
    pub(crate) trim: Trim,
    /// CPU kernels: fast (SIMD, detected at run time), avx2 (fast, limited to AVX2), portable,
    /// candle [default: fast, or POCKETCHAT_KERNELS]
    #[arg(long, value_enum)]
    pub(crate) kernel: Option<Kernel>,
    /// Follow the memory tier (as the app always does): without --model, load the published
    /// file of the default model that it chooses (a file named by --model is loaded as it
    /// is); without --kv, its KV cache type
    #[arg(long)]
    pub(crate) follow_policy_quant: bool,
    /// Compute threads, capped at the cores there are [default: every core, or
    /// POCKETCHAT_THREADS; the app: see docs/development.md]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) threads: Option<u32>,
    /// Save the conversation to FILE after each reply and restore it at start (a file
    /// that is not a conversation of this model is never replaced; FILE must be a regular
    /// file or absent, in a folder that exists)
    #[arg(long, value_name = "FILE")]
    pub(crate) session: Option<PathBuf>,
    /// The size cap of the saved chats' caches, in MB (the oldest are dropped first;
    /// their text is kept) [default: 256]
    #[arg(long, value_name = "MB", value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub(crate) chat_cache_mb: Option<u64>,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Kv {
    F32,
    F16,
    /// ggml's q8_0 blocks (17/32 of f16's memory; head sizes must be multiples of 32).
    #[value(name = "q8_0")]
    Q8_0,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Trim {
    Shift,
    Reprefill,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Kernel {
    Fast,
    Avx2,
    Portable,
    Candle,
}

/// A value parser for a finite number in `lo..=hi`.
pub(crate) fn unit_range(lo: f32, hi: f32) -> impl Fn(&str) -> Result<f32, String> + Clone + Send + Sync + 'static {
    move |s: &str| match s.parse::<f32>() {
        Ok(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x),
        _ => Err(format!("give a number from {lo} to {hi}")),
    }
}

pub(crate) fn tier(s: &str) -> Result<memory::RamTier, String> {
    memory::RamTier::parse(s).ok_or_else(|| "use 6gb, 8gb or desktop".into())
}

impl Kv {
    pub(crate) fn dtype(self) -> KvDtype {
        match self {
            Kv::F32 => KvDtype::F32,
            Kv::F16 => KvDtype::F16,
            Kv::Q8_0 => KvDtype::Q8_0,
        }
    }
}

/// `--kernel`, else `POCKETCHAT_KERNELS`, else fast.
pub(crate) fn kernels(choice: Option<Kernel>) -> Result<Kernels> {
    let chosen = match choice {
        Some(Kernel::Fast) => Kernels::Fast,
        Some(Kernel::Avx2) => Kernels::Avx2,
        Some(Kernel::Portable) => Kernels::Portable,
        Some(Kernel::Candle) => Kernels::Candle,
        None => match std::env::var("POCKETCHAT_KERNELS") {
            Err(_) => Kernels::Fast,
            Ok(name) => Kernels::parse(&name)
                .with_context(|| format!("POCKETCHAT_KERNELS={name:?}: use one of {}", Kernels::NAMES))?,
        },
    };
    chosen.available().map_err(anyhow::Error::msg)
}

/// `--threads`, else `POCKETCHAT_THREADS`.
pub(crate) fn threads(flag: Option<u32>) -> Result<Option<usize>> {
    if let Some(n) = flag {
        return Ok(Some(n as usize));
    }
    match std::env::var("POCKETCHAT_THREADS") {
        Err(_) => Ok(None),
        Ok(t) => match t.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => bail!("POCKETCHAT_THREADS={t:?}: give a whole number of at least 1"),
        },
    }
}

impl ModelArg {
    /// The model to use: `--model`, else the default model (fetched when missing).
    pub(crate) fn path(&self) -> Result<PathBuf> {
        self.path_for(None)
    }

    /// The model to load on `tier`: `--model` or `POCKETCHAT_MODEL` exactly as named;
    /// else the published file of the default model that the tier gets (the default
    /// file itself without a tier), fetched when missing.
    pub(crate) fn path_for(&self, tier: Option<memory::RamTier>) -> Result<PathBuf> {
        if let Some(p) = &self.model {
            return Ok(p.clone());
        }
        let path = catalog::default_model_path();
        let dir = catalog::models_dir();
        if path != catalog::default_entry().path_in(&dir) {
            return Ok(path); // POCKETCHAT_MODEL
        }
        let entry = tier.map_or_else(catalog::default_entry, catalog::default_for_tier);
        let path = entry.path_in(&dir);
        if !path.exists() && std::env::var_os("POCKETCHAT_NO_FETCH").is_none() {
            eprintln!("The model {} is missing; fetching it into {} …", entry.file, dir.display());
            return catalog::ensure_entry(entry, &dir).with_context(|| format!("fetching {}", entry.id));
        }
        Ok(path)
    }
}

/// The app's chats: `POCKETCHAT_CHATS_DIR`, else `chats/` in the models folder.
pub(crate) fn chats_dir() -> PathBuf {
    match std::env::var_os("POCKETCHAT_CHATS_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => catalog::models_dir().join("chats"),
    }
}

impl EngineArgs {
    /// The chat store with `--chat-cache-mb`'s cap.
    pub(crate) fn chat_store(&self) -> Result<ChatStore> {
        let cap = self.chat_cache_mb.map_or(chats::DEFAULT_CACHE_CAP_BYTES, |mb| mb * 1_000_000);
        let dir = chats_dir();
        ChatStore::open(&dir, cap).with_context(|| format!("opening the chats folder {}", dir.display()))
    }

    /// The engine's configuration; `follow_tier` (the app, `--follow-policy-quant`) loads
    /// the default model's published file that the memory tier gets when no file is named,
    /// and the tier's KV cache type when `--kv` names none.
    pub(crate) fn config(&self, follow_tier: bool) -> Result<EngineConfig> {
        let tier_override = self.tier.or_else(memory::tier_from_env);
        let tier = (follow_tier || self.follow_policy_quant)
            .then(|| memory::TierReport::probe().with_override(tier_override).effective());
        let mut c = EngineConfig::new(self.model.path_for(tier)?);
        c.display_name = catalog::display_name(&c.model_path);
        c.recommended_sampling = catalog::recommended_sampling(&c.model_path);
        c.sampling = SamplingOverrides {
            temperature: self.temperature,
            top_k: self.top_k.map(|k| k as usize),
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: None,
            dry_multiplier: self.dry_multiplier,
            dry_base: self.dry_base,
            dry_allowed_length: self.dry_allowed_length.map(|n| n as usize),
            dry_penalty_last_n: self.dry_penalty_last_n.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            seed: self.seed,
        };
        if !self.dry_sequence_breakers.is_empty() {
            c.dry_sequence_breakers = sampler::dry::breakers_from_args(&self.dry_sequence_breakers);
        }
        if let Some(n) = self.max_tokens {
            c.max_tokens = n as usize;
        }
        c.budget_override = self.budget.map(|b| b as usize);
        c.allow_too_large = self.allow_too_large;
        c.tier_override = tier_override;
        c.kv_dtype = match (self.kv, tier) {
            (Some(kv), _) => kv.dtype(),
            (None, Some(tier)) => KvDtype::for_tier(tier),
            (None, None) => KvDtype::F16,
        };
        c.kernels = kernels(self.kernel)?;
        c.threads = threads(self.threads)?;
        if let Some(path) = &self.session {
            pocketchat::engine::persist::check_state_path(path).map_err(|why| anyhow::anyhow!("--session: {why}"))?;
        }
        c.state_file = self.session.clone();
        c.trim_mode = match self.trim {
            Trim::Shift => TrimMode::Shift,
            Trim::Reprefill => TrimMode::Reprefill,
        };
        Ok(c)
    }
}

/// Sets the compute threads for a one-shot command (`bench`, `perplexity`): `asked`, or
/// every core, capped at the cores there are. Returns the count in use.
pub(crate) fn use_compute_threads(asked: Option<u32>) -> Result<usize> {
    let asked = threads(asked)?.unwrap_or_else(pocketchat::engine::cpu::pool::available_cores);
    let threads = pocketchat::engine::cpu::pool::global().set_threads(asked);
    if threads < asked {
        eprintln!("[{asked} threads asked for; {threads}, the cores available, are used]");
    }
    // candle's own kernels (the larger element-wise ops of a prefill) get the same count;
    // set before candle builds its pool.
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    Ok(threads)
}
