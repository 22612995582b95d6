//! `pocketchat tokenize`, `perplexity`, `logits` and `bench`: the engine's measurements.

use anyhow::Result;
use clap::Args;
use pocketchat::engine::{model::argmax, Model};
use pocketchat::memory;
use std::path::PathBuf;
use std::time::Instant;

use super::args::{kernels, use_compute_threads, ComputeArgs, ModelArg};

#[derive(Args)]
pub(crate) struct PerplexityArgs {
    #[command(flatten)]
    pub(crate) model: ModelArg,
    /// The text to score (UTF-8; invalid bytes are replaced)
    #[arg(long, value_name = "TEXT")]
    pub(crate) file: PathBuf,
    /// Tokens per chunk; the second half of each is scored
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub(crate) ctx: u32,
    /// Score at most this many chunks [default: every whole chunk of the text]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) chunks: Option<u32>,
    #[command(flatten)]
    pub(crate) compute: ComputeArgs,
    /// Print {"ppl": …, "tokens_scored": …, "chunks": …} instead of words
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) model: ModelArg,
    /// Prompt tokens per turn
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub(crate) prompt_tokens: u32,
    /// Generated tokens per turn
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub(crate) gen: u32,
    /// Turns on the same cache
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) turns: u32,
    #[command(flatten)]
    pub(crate) compute: ComputeArgs,
    /// One line of JSON instead of pretty JSON
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct LogitsArgs {
    #[command(flatten)]
    pub(crate) model: ModelArg,
    /// The prompt's token ids, comma-separated (no BOS is added)
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) tokens: Vec<u32>,
    /// Then decode this many tokens greedily, one forward per token
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub(crate) greedy: u32,
    /// Where to write the prompt's logits: little-endian f32, one row of the vocabulary per
    /// position
    #[arg(long, value_name = "FILE")]
    pub(crate) out: PathBuf,
    #[command(flatten)]
    pub(crate) compute: ComputeArgs,
}

#[derive(Args)]
pub(crate) struct TokenizeArgs {
    #[command(flatten)]
    pub(crate) model: ModelArg,
    #[arg(required = true)]
    pub(crate) text: Vec<String>,
}

pub(crate) fn tokenize(args: &TokenizeArgs) -> Result<()> {
    let text = args.text.join(" ");
    let (content, _) = pocketchat::engine::model::read_gguf(&args.model.path()?)?;
    let tok = pocketchat::engine::tokenizer::TextTokenizer::from_gguf(&content)?;
    outln!("{}", serde_json::to_string(&tok.encode(&text)?)?);
    Ok(())
}

/// `pocketchat logits`: the logits at every position of a prompt (to `--out`) and a greedy
/// continuation (printed as `{"positions", "vocab", "greedy"}`), for comparing the forward
/// pass with another engine's on the same file (`bench/real_size_check.py`).
pub(crate) fn logits(args: &LogitsArgs) -> Result<()> {
    use std::io::Write;
    let _ = use_compute_threads(args.compute.threads)?;
    let model = Model::load(&args.model.path()?, &candle_core::Device::Cpu, kernels(args.compute.kernel)?, |_| {})?;
    let budget = args.tokens.len() + args.greedy as usize;
    let mut state = model.make_state(budget, args.compute.kv.dtype());
    let rows = model.forward_all(&args.tokens, &mut state)?.to_dtype(candle_core::DType::F32)?;
    let (positions, vocab) = rows.dims2()?;
    let values = rows.flatten_all()?.to_vec1::<f32>()?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(&args.out)?);
    values.iter().try_for_each(|v| out.write_all(&v.to_le_bytes()))?;
    out.flush()?;
    let mut next = argmax(&rows.get(positions - 1)?)?;
    let mut greedy = Vec::with_capacity(args.greedy as usize);
    for _ in 0..args.greedy {
        greedy.push(next);
        next = argmax(&model.forward(&[next], &mut state)?)?;
    }
    outln!("{}", serde_json::json!({ "positions": positions, "vocab": vocab, "greedy": greedy }));
    Ok(())
}

/// `pocketchat perplexity`: see `engine::perplexity` for how it is computed.
pub(crate) fn perplexity(args: &PerplexityArgs) -> Result<()> {
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
    let kv = args.compute.kv.dtype();
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

/// The synthetic workload shared with `bench/llamacpp_peer.py`: prefill P fixed
/// ids, decode G greedy tokens; then further turns of P new ids + G tokens on the same
/// State, timing the first token of each.
pub(crate) fn bench(args: &BenchArgs) -> Result<()> {
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
    let mut state = model.make_state(max, kv);
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
        "candle_fallbacks": model.config.candle_fallbacks,
        "first_generated_ids": first_ids,
    });
    if args.json {
        outln!("{report}");
    } else {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}
