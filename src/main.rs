//! The `pocketchat` command: the app (default), a headless terminal chat, the benchmark,
//! the tokenizer, and model fetching/quantizing.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use pocketchat::chats::{self, ChatStore};
use pocketchat::engine::sampler::{self, SamplingOverrides};
use pocketchat::engine::{
    model::argmax, Command, DoneReason, Engine, EngineConfig, EngineEvent, EngineEvents, Kernels, KvDtype, Model,
    TrimMode,
};
use pocketchat::{catalog, memory};

#[macro_use]
mod cli_output;
mod chats_cli;
use cli_output::{error_text, printable, OutputClosed};

/// On-device chat with a persistent KV cache. Without a command: the chat app.
#[derive(Parser)]
#[command(name = "pocketchat", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    #[command(flatten)]
    app: EngineArgs,
}

#[derive(Subcommand)]
enum Sub {
    /// The chat app (desktop builds; the default)
    App(EngineArgs),
    /// Terminal chat: one prompt per line from the terminal or a pipe; `/warn` simulates a
    /// memory warning between replies; Ctrl-C stops the reply
    Chat(ChatArgs),
    /// Prefill and decode tok/s and the time to first token per turn on a synthetic prompt
    Bench(BenchArgs),
    /// Token ids of TEXT as a JSON array (special tokens parsed)
    Tokenize(TokenizeArgs),
    /// The saved chats, most recent first; or export, import or search them
    Chats(ChatsArgs),
    /// Download a catalog model by id, or any GGUF by URL (default: the default model)
    Fetch(FetchArgs),
    /// The model catalog with each model's fit for this device (or --tier)
    Models(ModelsArgs),
    /// Write a copy of a model file in another type (default Q8_0), on request only
    Quantize(QuantizeArgs),
    /// Perplexity of the model on a text file, computed as llama.cpp's llama-perplexity
    Perplexity(PerplexityArgs),
}

/// How a one-shot command (`bench`, `perplexity`) computes.
#[derive(Args)]
struct ComputeArgs {
    /// Compute threads, capped at the cores there are [default: every core]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    threads: Option<u32>,
    #[arg(long, value_enum, default_value_t = Kv::F16)]
    kv: Kv,
    #[arg(long, value_enum)]
    kernel: Option<Kernel>,
}

#[derive(Args)]
struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArg,
    /// The text to score (UTF-8; invalid bytes are replaced)
    #[arg(long, value_name = "TEXT")]
    file: PathBuf,
    /// Tokens per chunk; the second half of each is scored
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    ctx: u32,
    /// Score at most this many chunks [default: every whole chunk of the text]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    chunks: Option<u32>,
    #[command(flatten)]
    compute: ComputeArgs,
    /// Print {"ppl": …, "tokens_scored": …, "chunks": …} instead of words
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone)]
struct ModelArg {
    /// The GGUF model file [default: the catalog's default model, fetched when missing]
    #[arg(long, value_name = "PATH")]
    model: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct EngineArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Sampling temperature; 0 decodes greedily [default: the model's, else 0.8]
    #[arg(long, value_parser = unit_range(0.0, 5.0), allow_negative_numbers = true)]
    temperature: Option<f32>,
    /// Sample from the K most likely tokens only; 0 turns it off [default: the model's, else 40]
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    top_k: Option<u32>,
    /// Sample from the smallest set of tokens whose probability reaches P [default: the
    /// model's, else 0.95]
    #[arg(long, value_parser = unit_range(0.0, 1.0), allow_negative_numbers = true)]
    top_p: Option<f32>,
    /// Drop tokens less likely than P times the most likely one [default: the model's, else 0.05]
    #[arg(long, value_parser = unit_range(0.0, 1.0), allow_negative_numbers = true)]
    min_p: Option<f32>,
    /// Penalty for tokens repeated in the last 64; 1 turns it off [default: the model's, else 1
    /// (off)]
    #[arg(long, value_parser = unit_range(0.1, 10.0), allow_negative_numbers = true)]
    repeat_penalty: Option<f32>,
    /// DRY: penalty of a token that would extend a repeat of the allowed length; 0 turns DRY
    /// off [default: 0.8; 0 with --temperature 0]
    #[arg(long, value_parser = unit_range(0.0, 10.0), allow_negative_numbers = true)]
    dry_multiplier: Option<f32>,
    /// DRY: the penalty grows by this factor with each token of a repeat [default: 1.75]
    #[arg(long, value_parser = unit_range(1.0, 10.0), allow_negative_numbers = true)]
    dry_base: Option<f32>,
    /// DRY: repeats this many tokens long are free [default: 2]
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=1_000_000), allow_negative_numbers = true)]
    dry_allowed_length: Option<u32>,
    /// DRY: how many recent tokens are searched for repeats; 0 turns DRY off, -1 is the whole
    /// context [default: -1]
    #[arg(long, value_parser = clap::value_parser!(i64).range(-1..=100_000_000), allow_negative_numbers = true)]
    dry_penalty_last_n: Option<i64>,
    /// DRY: a string that ends a repeat (escapes \n, \t, \", \\ are read); repeat the flag
    /// for several, `none` for none [default: "\n" ":" "\"" "*"]
    #[arg(long = "dry-sequence-breaker", value_name = "STRING")]
    dry_sequence_breakers: Vec<String>,
    /// Seed of the sampler: the same seed gives the same reply [default: 299792458]
    #[arg(long)]
    seed: Option<u64>,
    /// The longest reply, in tokens
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_tokens: Option<u32>,
    /// Token budget of the conversation (at most the model's context)
    #[arg(long, value_parser = clap::value_parser!(u32).range(128..=1_048_576))]
    budget: Option<u32>,
    /// Load a model the fit check says is too large for this device's memory
    #[arg(long)]
    allow_too_large: bool,
    /// Memory tier instead of the detected one
    #[arg(long, value_parser = tier)]
    tier: Option<memory::RamTier>,
    /// KV cache element type
    #[arg(long, value_enum, default_value_t = Kv::F16)]
    kv: Kv,
    /// How the context is cut when it fills up
    #[arg(long, value_enum, default_value_t = Trim::Shift)]
    trim: Trim,
    /// CPU kernels: fast (SIMD, detected at run time), avx2 (fast, limited to AVX2), portable,
    /// candle [default: fast, or POCKETCHAT_KERNELS]
    #[arg(long, value_enum)]
    kernel: Option<Kernel>,
    /// Without --model: the published file of the default model that the memory tier
    /// chooses (the app always does). A file named by --model is loaded as it is
    #[arg(long)]
    follow_policy_quant: bool,
    /// Compute threads, capped at the cores there are [default: every core, or
    /// POCKETCHAT_THREADS; the app: see docs/development.md]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    threads: Option<u32>,
    /// Save the conversation to FILE after each reply and restore it at start (a file
    /// that is not a conversation of this model is never replaced; FILE must be a regular
    /// file or absent, in a folder that exists)
    #[arg(long, value_name = "FILE")]
    session: Option<PathBuf>,
    /// The size cap of the saved chats' caches, in MB (the oldest are dropped first;
    /// their text is kept) [default: 256]
    #[arg(long, value_name = "MB", value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    chat_cache_mb: Option<u64>,
}

#[derive(Args)]
struct ChatArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Print each turn's figures (tokens, memory, speed)
    #[arg(long)]
    stats: bool,
    /// Send a memory warning at the first token of every Nth reply
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    simulate_warning_every: Option<u32>,
    /// Kill the process when its footprint passes BYTES (a jetsam stand-in)
    #[arg(long, value_name = "BYTES")]
    jetsam_ceiling: Option<u64>,
    /// Continue the saved chat of this name, or start one (the app's chat list)
    #[arg(long, value_name = "NAME", conflicts_with = "session")]
    chat: Option<String>,
}

#[derive(Args)]
struct ChatsArgs {
    /// JSON instead of a table (also what --export, --import and --grep print)
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    transfer: chats_cli::TransferArgs,
}

#[derive(Args)]
struct FetchArgs {
    /// A catalog id (`pocketchat models` lists them) or an http(s) URL of a GGUF file
    #[arg(value_name = "ID|URL")]
    target: Option<String>,
}

#[derive(Args)]
struct ModelsArgs {
    /// Memory tier instead of the detected one
    #[arg(long, value_parser = tier)]
    tier: Option<memory::RamTier>,
    /// One JSON array instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Prompt tokens per turn
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    prompt_tokens: u32,
    /// Generated tokens per turn
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    gen: u32,
    /// Turns on the same cache
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    turns: u32,
    #[command(flatten)]
    compute: ComputeArgs,
    /// One line of JSON instead of pretty JSON
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TokenizeArgs {
    #[command(flatten)]
    model: ModelArg,
    #[arg(required = true)]
    text: Vec<String>,
}

#[derive(Args)]
struct QuantizeArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Where to write [default: beside the source, `…Q8_0-from-Q4_1.gguf`]
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// The type to write: Q8_0 (the 8-bit variant: only 4/5-bit matrices change), or any of
    /// F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K for every 2-D tensor
    /// (to test each kernel on one model)
    #[arg(long = "type", value_name = "TYPE", default_value = "Q8_0", value_parser = quant_type)]
    quant: String,
    /// Replace an existing --out that is not a GGUF pocketchat wrote (never the source
    /// itself, nor anything but a regular file)
    #[arg(long)]
    force: bool,
}

/// A `--type` of `pocketchat quantize`, in llama.cpp's spelling (any case).
fn quant_type(s: &str) -> Result<String, String> {
    let upper = s.trim().to_ascii_uppercase();
    if catalog::QUANT_TYPES.iter().any(|(name, _)| *name == upper) {
        Ok(upper)
    } else {
        let known: Vec<&str> = catalog::QUANT_TYPES.iter().map(|(n, _)| *n).collect();
        Err(format!("unknown type `{s}` (one of {})", known.join(", ")))
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Kv {
    F32,
    F16,
}

#[derive(Clone, Copy, ValueEnum)]
enum Trim {
    Shift,
    Reprefill,
}

#[derive(Clone, Copy, ValueEnum)]
enum Kernel {
    Fast,
    Avx2,
    Portable,
    Candle,
}

/// A value parser for a finite number in `lo..=hi`.
fn unit_range(lo: f32, hi: f32) -> impl Fn(&str) -> Result<f32, String> + Clone + Send + Sync + 'static {
    move |s: &str| match s.parse::<f32>() {
        Ok(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x),
        _ => Err(format!("give a number from {lo} to {hi}")),
    }
}

fn tier(s: &str) -> Result<memory::RamTier, String> {
    memory::RamTier::parse(s).ok_or_else(|| "use 6gb, 8gb or desktop".into())
}

impl Kv {
    fn dtype(self) -> KvDtype {
        match self {
            Kv::F32 => KvDtype::F32,
            Kv::F16 => KvDtype::F16,
        }
    }
}

/// `--kernel`, else `POCKETCHAT_KERNELS`, else fast.
fn kernels(choice: Option<Kernel>) -> Result<Kernels> {
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
fn threads(flag: Option<u32>) -> Result<Option<usize>> {
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
    fn path(&self) -> Result<PathBuf> {
        self.path_for(None)
    }

    /// The model to load on `tier`: `--model` or `POCKETCHAT_MODEL` exactly as named;
    /// else the published file of the default model that the tier gets (the default
    /// file itself without a tier), fetched when missing.
    fn path_for(&self, tier: Option<memory::RamTier>) -> Result<PathBuf> {
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
fn chats_dir() -> PathBuf {
    match std::env::var_os("POCKETCHAT_CHATS_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => catalog::models_dir().join("chats"),
    }
}

impl EngineArgs {
    /// The chat store with `--chat-cache-mb`'s cap.
    fn chat_store(&self) -> Result<ChatStore> {
        let cap = self.chat_cache_mb.map_or(chats::DEFAULT_CACHE_CAP_BYTES, |mb| mb * 1_000_000);
        let dir = chats_dir();
        ChatStore::open(&dir, cap).with_context(|| format!("opening the chats folder {}", dir.display()))
    }

    /// The engine's configuration; `follow_tier` (the app, `--follow-policy-quant`) loads
    /// the default model's published file that the memory tier gets when no file is named.
    fn config(&self, follow_tier: bool) -> Result<EngineConfig> {
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
        c.kv_dtype = self.kv.dtype();
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

/// Exit codes: 0 success, 1 a runtime error (printed once, plain), 2 a usage error
/// (clap's message, with a suggestion for a misspelled flag).
fn main() -> ExitCode {
    let ansi = std::io::stderr().is_terminal();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("POCKETCHAT_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    tame_candle_pool();
    let cli = Cli::parse();
    let result = match cli.command {
        None => app(&cli.app),
        Some(Sub::App(args)) => app(&args),
        Some(Sub::Chat(args)) => chat(&args),
        Some(Sub::Bench(args)) => bench(&args),
        Some(Sub::Tokenize(args)) => tokenize(&args),
        Some(Sub::Perplexity(args)) => perplexity(&args),
        Some(Sub::Chats(args)) if args.transfer.any() => chats_cli::run(&args.transfer, &chats_dir(), args.json),
        Some(Sub::Chats(args)) => list_chats(&args),
        Some(Sub::Fetch(args)) => fetch(&args),
        Some(Sub::Models(args)) => list_models(&args),
        Some(Sub::Quantize(args)) => quantize(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<OutputClosed>() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

fn quantize(args: &QuantizeArgs) -> Result<()> {
    let src = args.model.path()?;
    let dst = args.out.clone().unwrap_or_else(|| catalog::quant_sibling_path(&src, &args.quant));
    let (_, dtype) = catalog::QUANT_TYPES
        .iter()
        .find(|(name, _)| *name == args.quant)
        .with_context(|| format!("unknown type {}", args.quant))?;
    let replace = if args.force { catalog::Replace::AnyFile } else { catalog::Replace::OursOnly };
    catalog::quantize(&src, &dst, *dtype, replace)?;
    outln!("{}", dst.display());
    Ok(())
}

/// candle's own thread pool (its larger element-wise ops during a prefill, and its
/// kernels for quant types ours do not cover) sits beside the engine's pool
/// (`engine::cpu::pool`). Its size comes from `RAYON_NUM_THREADS`: a value above the cores
/// available is lowered to them, as more threads than cores stall it whenever a core is
/// busy. Its idle workers spin 25,000 times before they park, taking a core from the
/// engine's pool between candle's ops; unless `CANDLE_BARRIER_POOL_SPIN_LIMIT` says
/// otherwise they spin a few microseconds. Runs first in `main`, before any other thread
/// exists.
fn tame_candle_pool() {
    let cores = pocketchat::engine::cpu::pool::available_cores();
    for var in ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"] {
        if std::env::var(var).ok().and_then(|v| v.parse::<usize>().ok()).is_some_and(|n| n > cores) {
            std::env::set_var(var, cores.to_string());
        }
    }
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "2000");
    }
}

#[cfg(feature = "ui")]
fn app(args: &EngineArgs) -> Result<()> {
    let mut config = args.config(true)?;
    if config.threads.is_none() {
        config.threads = pocketchat::ui::app::threads_beside_the_window();
    }
    // The chats survive the app being closed or killed (`--session FILE` keeps one
    // conversation in FILE instead).
    if config.state_file.is_none() {
        config.chats = Some(args.chat_store()?);
    }
    pocketchat::ui::launch(config);
    Ok(())
}

#[cfg(not(feature = "ui"))]
fn app(_args: &EngineArgs) -> Result<()> {
    bail!("this build has no UI (built without the `desktop` or `mobile` feature); try `pocketchat chat`")
}

/// Set by SIGINT; the chat turns it into `Command::Stop` so Ctrl-C stops the reply only.
static CTRL_C: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    CTRL_C.store(true, Ordering::SeqCst);
}

/// `pocketchat chat`: the engine thread is shut down and waited for on every way out
/// (the input's end, an error, a closed output), so its last save is finished and no
/// temporary file is left.
fn chat(args: &ChatArgs) -> Result<()> {
    let mut config = args.engine.config(false)?;
    if let Some(name) = &args.chat {
        let store = args.engine.chat_store()?;
        // Found by its whole name (else made), and locked for this process: a chat open in
        // another pocketchat is refused here, naming that process.
        let id = store.open_named(name)?.id;
        config.chats = Some(store);
        config.open_chat = Some(id);
    }
    let (handle, mut events, thread) = Engine::start(config);
    let result = converse(args, &handle, &mut events);
    thread.shutdown();
    result
}

/// The terminal chat itself, on a started engine.
fn converse(args: &ChatArgs, handle: &pocketchat::engine::EngineHandle, events: &mut EngineEvents) -> Result<()> {
    let show_stats = args.stats;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    {
        let handle = handle.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(50));
            if CTRL_C.swap(false, Ordering::SeqCst) && handle.send(Command::Stop).is_err() {
                break;
            }
        });
    }
    let warn_handle = handle.clone();
    let _monitor = memory::MemoryMonitor::start(move |reason| {
        let _ = warn_handle.send(Command::MemoryWarning { reason });
    });

    // Wait for the model (and a restored conversation, which comes before the first Stats).
    loop {
        match events.recv_blocking() {
            Some(EngineEvent::Ready(info)) => {
                eprintln!("[{} · {} · {}]", info.name, info.weights_quant, info.device);
            }
            Some(EngineEvent::Policy { report, policy }) => {
                eprintln!(
                    "[{}: {} weights · {} tokens, {} · {:.1} GiB ceiling]",
                    report.effective().label(),
                    policy.quant.label(),
                    policy.token_budget,
                    policy.why(),
                    policy.ceiling_bytes as f64 / memory::GIB as f64
                );
            }
            Some(EngineEvent::Restored { messages, tokens }) => {
                eprintln!(
                    "[restored a conversation of {} messages, {tokens} tokens, without re-prefill]",
                    messages.len()
                );
            }
            Some(EngineEvent::ChatOpened { title, messages, tokens, resumed, .. }) if !messages.is_empty() => {
                let how =
                    if resumed { "its cache restored without re-prefill" } else { "re-read at the first message" };
                eprintln!("[chat “{}”: {} messages, {tokens} tokens, {how}]", printable(&title), messages.len());
            }
            Some(EngineEvent::Notice { message }) => eprintln!("[{}]", printable(&message)),
            Some(EngineEvent::Stats(_)) => break,
            Some(EngineEvent::Failed { error }) => bail!("{error}"),
            Some(_) => {}
            None => bail!("the engine stopped"),
        }
    }
    if let Some(ceiling) = args.jetsam_ceiling {
        start_jetsam_watchdog(ceiling);
    }
    let warn_every = args.simulate_warning_every.map(|n| n as usize);
    let mut turn = 0usize;
    let interactive = std::io::stdin().is_terminal();
    let mut stdin = std::io::stdin().lock();
    let mut bytes = Vec::new();
    loop {
        if interactive {
            eprint!("> ");
        }
        bytes.clear();
        if stdin.read_until(b'\n', &mut bytes)? == 0 {
            break;
        }
        let line = match String::from_utf8(bytes.clone()) {
            Ok(line) => line,
            Err(_) => {
                eprintln!("[that line was not valid UTF-8: the bad bytes were replaced with \u{FFFD}]");
                String::from_utf8_lossy(&bytes).into_owned()
            }
        };
        let line = line.strip_suffix('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).unwrap_or(&line).to_string();
        if line.trim().is_empty() {
            continue;
        }
        if line.trim() == "/warn" {
            handle.send(Command::MemoryWarning { reason: "simulated from the terminal".into() })?;
        } else {
            handle.send(Command::Send { text: line })?;
        }
        // Print events until this command has been answered: a reply ends with Done (or
        // Failed), an eviction with Evicted; the Stats that follow close the turn.
        let mut answered = false;
        let mut first_token = true;
        loop {
            let Some(event) = events.recv_blocking() else { bail!("the engine stopped") };
            match event {
                EngineEvent::Token { text } => {
                    if first_token && warn_every.is_some_and(|n| (turn + 1).is_multiple_of(n)) {
                        handle.send(Command::MemoryWarning {
                            reason: "simulated mid-reply (--simulate-warning-every)".into(),
                        })?;
                    }
                    first_token = false;
                    out!("{text}");
                }
                EngineEvent::Done { reason } => {
                    outln!();
                    if reason != DoneReason::EndOfTurn {
                        eprintln!("[reply ended: {reason:?}]");
                    }
                    answered = true;
                }
                EngineEvent::Trimmed { dropped_tokens, kept_tokens } => {
                    eprintln!("[context trimmed: {dropped_tokens} tokens dropped, {kept_tokens} kept]")
                }
                EngineEvent::Evicted { reason, before_tokens, after_tokens, freed_bytes } => {
                    eprintln!(
                        "[memory warning ({reason}): context {before_tokens} → {after_tokens} tokens, {:.1} MB freed]",
                        freed_bytes as f64 / 1e6
                    );
                    answered = true;
                }
                EngineEvent::Notice { message } => eprintln!("[{}]", printable(&message)),
                EngineEvent::Saved { bytes, ms, .. } if show_stats => {
                    eprintln!("[saved {bytes} B in {ms:.0} ms]")
                }
                EngineEvent::Failed { error } => {
                    eprintln!("[error: {error}]");
                    answered = true;
                }
                EngineEvent::Stats(s) if answered => {
                    turn += 1;
                    if show_stats {
                        eprintln!(
                            "[turn {turn}] generated {} · context {}/{} tokens · kv {} B · rss {} B · footprint {} B · peak_rss {} B · predicted {} B · mapped {} B · ttft {:.0} ms · prefill {} tok in {:.0} ms · decode {:.1} tok/s",
                            s.generated_tokens,
                            s.context_tokens,
                            s.budget,
                            s.kv_bytes,
                            s.rss_bytes,
                            memory::process::footprint_bytes().unwrap_or(0),
                            memory::process::peak_rss_bytes().unwrap_or(0),
                            s.predicted_footprint_bytes,
                            s.mapped_weights_bytes,
                            s.ttft_ms,
                            s.prefill_tokens,
                            s.prefill_ms,
                            s.decode_tok_s
                        );
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// A stand-in for iOS jetsam on machines without it: kills the process the moment its
/// footprint (anonymous resident memory, what jetsam counts) passes `ceiling` bytes.
fn start_jetsam_watchdog(ceiling: u64) {
    std::thread::spawn(move || loop {
        if let Some(f) = memory::process::footprint_bytes() {
            if f > ceiling {
                eprintln!("[jetsam] footprint {f} B passed the ceiling of {ceiling} B: killed");
                // SAFETY: raising a signal on our own process.
                unsafe { libc::raise(libc::SIGKILL) };
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    });
}

fn list_chats(args: &ChatsArgs) -> Result<()> {
    let dir = chats_dir();
    let chats = if dir.is_dir() { ChatStore::open(&dir, 0)?.list() } else { Vec::new() };
    if args.json {
        outln!("{}", serde_json::to_string(&chats)?);
        return Ok(());
    }
    if chats.is_empty() {
        eprintln!("No saved chats in {}.", dir.display());
    }
    for c in &chats {
        if let Some(why) = &c.unreadable {
            outln!("{}  unreadable: {}", c.id, printable(why));
            continue;
        }
        let cache = if c.cache_bytes > 0 {
            format!("cache {:.1} MB", c.cache_bytes as f64 / 1e6)
        } else {
            "no cache".to_string()
        };
        let title = printable(&c.title);
        outln!("{}  {title:<48}  {:>3} messages  {:>5} tokens  {cache}", c.id, c.messages, c.tokens);
    }
    Ok(())
}

fn list_models(args: &ModelsArgs) -> Result<()> {
    let tier = args.tier.or_else(memory::tier_from_env).unwrap_or_else(|| memory::TierReport::probe().effective());
    let rows = catalog::listing::rows(catalog::catalog(), tier, &catalog::models_dir());
    if args.json {
        outln!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    outln!(
        "Models for the {} (ceiling {:.1} GB; * the file of a model this tier gets):",
        tier.label(),
        memory::fit::ceiling_bytes(tier) as f64 / 1e9
    );
    for r in &rows {
        let size = format!("{}{:.2} GB", if r.bytes_known { "" } else { "~" }, r.bytes as f64 / 1e9);
        let fit =
            if r.fits { format!("{} · {} tokens ({})", r.fit, r.budget, r.budget_limit) } else { r.fit.to_string() };
        let state = match (&r.not_yet, r.downloaded) {
            (Some(why), _) => format!("not yet: {why}"),
            (None, true) => "downloaded".to_string(),
            (None, false) => String::new(),
        };
        // Of a model's several published files, the one this tier gets.
        let pick = r.for_this_tier && rows.iter().filter(|o| o.name == r.name).count() > 1;
        let pick = if pick { "*" } else { " " };
        outln!("{:<30} {:>6}{pick} {:>10}  {fit:<58} {state}", r.id, r.quant, size);
    }
    Ok(())
}

/// `pocketchat fetch [ID|URL]`: downloads with a progress bar on stderr; prints the path.
fn fetch(args: &FetchArgs) -> Result<()> {
    let dir = catalog::models_dir();
    let options = catalog::DownloadOptions::default();
    // Ctrl-C stops the download and keeps its .part for the next run to resume.
    cancel_on_ctrl_c(options.cancel.clone());
    let mut bar = ProgressBar::default();
    let path = match args.target.as_deref() {
        None => {
            let tier = memory::tier_from_env().unwrap_or_else(|| memory::TierReport::probe().effective());
            catalog::ensure_entry(catalog::default_for_tier(tier), &dir)?
        }
        Some(url) if url.starts_with("https://") || url.starts_with("http://") => {
            let name = catalog::file_name_of_url(url).map_err(anyhow::Error::msg)?;
            let request =
                catalog::DownloadRequest { url: url.to_string(), dest: dir.join(name), bytes: None, sha256: None };
            catalog::download(&request, &options, &mut |p| bar.show(p))?
        }
        Some(id) => {
            let entry = catalog::entry(id)?;
            match entry.source() {
                Ok(catalog::Source::Url(_)) => catalog::download_entry(entry, &dir, &options, &mut |p| bar.show(p))?,
                _ => catalog::ensure_entry(entry, &dir)?,
            }
        }
    };
    bar.finish();
    outln!("{}", path.display());
    Ok(())
}

/// Sets `cancel` on Ctrl-C (SIGINT) instead of letting it kill the process.
fn cancel_on_ctrl_c(cancel: std::sync::Arc<AtomicBool>) {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(50));
        if CTRL_C.load(Ordering::SeqCst) {
            cancel.store(true, Ordering::Relaxed);
        }
    });
}

/// A one-line progress bar on stderr; on a pipe, a line every 10 %.
#[derive(Default)]
struct ProgressBar {
    last_tenth: Option<u64>,
    drawn: bool,
}

impl ProgressBar {
    fn show(&mut self, p: &catalog::Progress) {
        use std::io::IsTerminal;
        let mb = |b: u64| b as f64 / 1e6;
        let text = if p.verifying {
            format!("verifying {:.1} MB (sha256, GGUF) …", mb(p.bytes))
        } else {
            let eta = p.eta.map(|e| format!(" · {}s left", e.as_secs())).unwrap_or_default();
            match (p.fraction(), p.total) {
                (Some(f), Some(t)) => {
                    let filled = (f * 30.0) as usize;
                    format!(
                        "[{}{}] {:>3.0}% {:.1}/{:.1} MB · {:.1} MB/s{eta}",
                        "#".repeat(filled),
                        "-".repeat(30 - filled),
                        f * 100.0,
                        mb(p.bytes),
                        mb(t),
                        p.bytes_per_sec / 1e6
                    )
                }
                _ => format!("{:.1} MB · {:.1} MB/s", mb(p.bytes), p.bytes_per_sec / 1e6),
            }
        };
        if std::io::stderr().is_terminal() {
            eprint!("\r\x1b[2K{text}");
            self.drawn = true;
        } else {
            let tenth = p.fraction().map(|f| (f * 10.0) as u64);
            if p.verifying || tenth != self.last_tenth {
                self.last_tenth = tenth;
                eprintln!("{text}");
            }
        }
    }

    fn finish(&self) {
        if self.drawn {
            eprintln!();
        }
    }
}

fn tokenize(args: &TokenizeArgs) -> Result<()> {
    let text = args.text.join(" ");
    let (content, _) = pocketchat::engine::model::read_gguf(&args.model.path()?)?;
    let tok = pocketchat::engine::tokenizer::TextTokenizer::from_gguf(&content)?;
    outln!("{}", serde_json::to_string(&tok.encode(&text)?)?);
    Ok(())
}

/// Sets the compute threads for a one-shot command (`bench`, `perplexity`): `asked`, or
/// every core, capped at the cores there are. Returns the count in use.
fn use_compute_threads(asked: Option<u32>) -> Result<usize> {
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

/// `pocketchat perplexity`: see `engine::perplexity` for how it is computed.
fn perplexity(args: &PerplexityArgs) -> Result<()> {
    use pocketchat::engine::perplexity::perplexity as score;
    use pocketchat::engine::tokenizer::TextTokenizer;
    let _ = use_compute_threads(args.compute.threads)?;
    let path = args.model.path()?;
    let (content, _) = pocketchat::engine::model::read_gguf(&path)?;
    let tok = TextTokenizer::from_gguf(&content)?;
    drop(content);
    let ctx = args.ctx as usize;
    // Only as much of the text as the chunks asked for is read and tokenized.
    let chunks = args.chunks.map(|c| c as usize);
    let tokens = pocketchat::engine::perplexity::text_tokens(&args.file, &tok, ctx, chunks)?;
    let model = Model::load(&path, &candle_core::Device::Cpu, kernels(args.compute.kernel)?, |_| {})?;
    let bos = tok.added_bos();
    let t = Instant::now();
    let kv = args.compute.kv.dtype().dtype();
    let report = score(&model, &tokens, ctx, chunks, bos, kv, |done, ppl| {
        if !args.json {
            eprint!("[{done}]{ppl:.4},");
        }
    })?;
    if args.json {
        outln!("{}", serde_json::to_string(&report)?);
    } else {
        eprintln!();
        outln!(
            "perplexity {:.4} over {} tokens in {} chunks of {ctx} ({:.1} s)",
            report.ppl,
            report.tokens_scored,
            report.chunks,
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The synthetic workload shared with `scripts/llamacpp_peer.py`: prefill P fixed
/// ids, decode G greedy tokens; then further turns of P new ids + G tokens on the same
/// State, timing the first token of each.
fn bench(args: &BenchArgs) -> Result<()> {
    let threads = use_compute_threads(args.compute.threads)?;
    let (prompt_tokens, gen, turns) = (args.prompt_tokens as usize, args.gen as usize, args.turns as usize);
    let kv = args.compute.kv.dtype();
    let path = args.model.path()?;
    let kernels = kernels(args.compute.kernel)?;
    let t = Instant::now();
    let model = Model::load(&path, &candle_core::Device::Cpu, kernels, |_| {})?;
    let load_s = t.elapsed().as_secs_f64();
    let vocab = model.config.vocab_size;
    let max = turns * (prompt_tokens + gen + 1);
    let mut state = model.make_state(max, kv.dtype());
    let ids = |turn: usize| -> Vec<u32> {
        (1..=prompt_tokens).map(|i| (((i + turn * prompt_tokens) * 37) % (vocab - 100) + 1) as u32).collect()
    };
    let (mut prefill_tok_s, mut decode_tok_s) = (0.0, 0.0);
    let (mut ttft_ms, mut decode_by_turn) = (Vec::new(), Vec::new());
    let mut first_ids = Vec::new();
    for turn in 0..turns {
        let t = Instant::now();
        let logits = model.forward(&ids(turn), &mut state)?;
        let mut next = argmax(&logits)?;
        let prefill_s = t.elapsed().as_secs_f64();
        ttft_ms.push(prefill_s * 1e3);
        let mut generated = vec![next];
        let t = Instant::now();
        for _ in 0..gen {
            next = argmax(&model.forward(&[next], &mut state)?)?;
            generated.push(next);
        }
        let decode_s = t.elapsed().as_secs_f64();
        decode_by_turn.push(gen as f64 / decode_s);
        if turn == 0 {
            prefill_tok_s = prompt_tokens as f64 / prefill_s;
            decode_tok_s = gen as f64 / decode_s;
            first_ids = generated[..generated.len().min(8)].to_vec();
        }
    }
    let report = serde_json::json!({
        "engine": "pocketchat",
        "threads": threads,
        "kernels": kernels.describe(),
        "kv": format!("{:?}", args.compute.kv.dtype()),
        "load_s": load_s,
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen,
        "turns": turns,
        "prefill_tok_s": prefill_tok_s,
        "decode_tok_s": decode_tok_s,
        "ttft_ms": ttft_ms,
        "decode_tok_s_by_turn": decode_by_turn,
        "context_tokens": state.len(),
        "kv_bytes": state.bytes(),
        "peak_rss_bytes": memory::process::peak_rss_bytes(),
        "footprint_bytes": memory::process::footprint_bytes(),
        "heap_weight_bytes": model.config.heap_weight_bytes,
        "mapped_weight_bytes": model.config.mapped_weight_bytes,
        "copied_matrices": model.config.copied_matrices,
        "first_generated_ids": first_ids,
    });
    if args.json {
        outln!("{report}");
    } else {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}
