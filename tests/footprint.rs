//! The predicted footprint (`memory::predicted_footprint`, what the budgets that keep us
//! under jetsam are computed from) is an upper bound of the real peak dirty memory
//! (`RssAnon`, sampled every 2 ms), and with the weights read in place from the mapped
//! file it bounds the peak RSS (`VmHWM`), on the real models: a 200 KB prompt at every
//! budget the tiers give and on every kernel path (candle's at a budget of 1,024), Gemma 3
//! at a budget of 8,192, a 2 MB pasted line without spaces, a chat resumed from its saved
//! cache, and a 100-turn conversation.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What one run used and what it predicted, in bytes.
struct Measured {
    /// `VmHWM`: the process's peak resident set, file pages included.
    peak_rss: u64,
    /// The highest `RssAnon` (dirty memory) seen while sampling the process.
    peak_dirty: u64,
    /// The predicted footprint (dirty memory) of the last turn.
    predicted: u64,
    /// Weights read in place from the mapped file.
    mapped: u64,
    /// The token budget the run had (the `B` of the stats' `context A/B tokens`).
    budget: usize,
}

/// Runs `pocketchat chat --stats` over `input` on the default model with the weights the
/// tier chooses.
fn peak_and_predicted(args: &[&str], input: &str) -> Measured {
    let model = common::default_model();
    run_chat(&model, &[&["--follow-policy-quant"], args].concat(), input, None)
}

/// The largest `RssAnon` of process `pid`, read every 2 ms until `done`.
fn sample_dirty(pid: u32, done: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !done.load(Ordering::Relaxed) {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { break };
            let anon = status
                .lines()
                .find_map(|l| l.strip_prefix("RssAnon:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
            peak = peak.max(anon.unwrap_or(0) * 1024);
            std::thread::sleep(Duration::from_millis(2));
        }
        peak
    })
}

/// Runs `pocketchat chat --stats` on `model` (chats kept in `chats_dir` when given) and
/// returns the last turn's figures (the peak RSS is the process's high-water mark, so the
/// last turn's is the whole run's).
fn run_chat(model: &Path, args: &[&str], input: &str, chats_dir: Option<&Path>) -> Measured {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pocketchat"));
    command.args(["chat", "--model", model.to_str().unwrap(), "--stats"]).args(args);
    if let Some(dir) = chats_dir {
        command.env("POCKETCHAT_CHATS_DIR", dir);
    }
    let mut child = command.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let sampler = sample_dirty(child.id(), done.clone());
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    done.store(true, Ordering::Relaxed);
    let peak_dirty = sampler.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let last = stderr.lines().rfind(|l| l.starts_with("[turn ")).unwrap_or_else(|| panic!("no turn: {stderr}"));
    let field = |name: &str| -> u64 {
        let rest = &last[last.find(name).unwrap_or_else(|| panic!("no {name} in {last}")) + name.len()..];
        rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    let budget = last.split("context ").nth(1).and_then(|r| r.split(['/', ' ']).nth(1)).and_then(|b| b.parse().ok());
    let budget = budget.unwrap_or_else(|| panic!("no context A/B in {last}"));
    Measured {
        peak_rss: field("peak_rss "),
        peak_dirty,
        predicted: field("predicted "),
        mapped: field("mapped "),
        budget,
    }
}

/// The dirty peak under the predicted footprint, and the whole peak under it plus the
/// mapped weights.
fn assert_under(case: &str, m: Measured) {
    let mb = |b: u64| b as f64 / 1e6;
    eprintln!(
        "{case}: peak dirty {:.1} MB, predicted {:.1} MB; peak RSS {:.1} MB, predicted + mapped {:.1} MB",
        mb(m.peak_dirty),
        mb(m.predicted),
        mb(m.peak_rss),
        mb(m.predicted + m.mapped)
    );
    assert!(m.peak_dirty > 0, "{case}: RssAnon was never read");
    assert!(m.peak_dirty <= m.predicted, "{case}: peak dirty {} B over the predicted {} B", m.peak_dirty, m.predicted);
    assert!(
        m.peak_rss <= m.predicted + m.mapped,
        "{case}: peak RSS {} B over the predicted {} B + {} B mapped",
        m.peak_rss,
        m.predicted,
        m.mapped
    );
}

/// The kernel paths besides the default one that this CPU can run: AVX2 where the default
/// is AVX-512 (many machines have only AVX2), and candle's own kernels everywhere.
fn other_kernel_paths() -> Vec<&'static str> {
    let mut paths = vec!["candle"];
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
        paths.push("avx2");
    }
    paths
}

/// ~200 KB of words on one line: far over every tier's budget, so the prompt is cut to
/// the budget and prefilled in full.
fn long_prompt() -> String {
    let words = ["lighthouse", "keeper", "storm", "the", "of", "waves", "night", "ship", "light", "and"];
    let mut text = String::new();
    let mut i = 7usize;
    while text.len() < 200_000 {
        i = (i * 31 + 17) % 1009;
        text.push_str(words[i % words.len()]);
        text.push(' ');
    }
    text.push('\n');
    text
}

/// The model's whole context (`*.context_length`): no tier's budget goes past it.
fn context_length(model: &Path) -> usize {
    let (content, _) = pocketchat::engine::model::read_gguf(model).unwrap();
    let value = content.metadata.iter().find(|(k, _)| k.ends_with(".context_length")).map(|(_, v)| v.to_u32());
    value.unwrap_or_else(|| panic!("{} has no context_length", model.display())).unwrap() as usize
}

#[test]
fn a_long_prompt_stays_under_the_predicted_footprint_at_every_budget() {
    let prompt = long_prompt();
    let whole_context = context_length(&common::default_model());
    // The 135M model gets its full 8,192-token context on 8gb and desktop alike (the same
    // policy), so desktop is left out; on 6gb the cache allowance sets the budget. A KV type
    // whose 6gb budget is already the model's whole context gets the same budget on 8gb:
    // that run would repeat this one (each of these 8K-token prefills is ~1 min in CI).
    // f32's whole context is left to f16's: the cache's bytes are exact in the prediction
    // (checked at f32's 6gb budget), and what grows with the budget besides them, prefill
    // attention's f32 copy of a layer's keys, is larger for f16 (values converted too).
    for kv in ["f32", "f16", "q8_0"] {
        let six = peak_and_predicted(&["--tier", "6gb", "--kv", kv, "--max-tokens", "8"], &prompt);
        let six_budget = six.budget;
        assert_under(&format!("6gb {kv}, budget {six_budget}"), six);
        if six_budget >= whole_context || kv == "f32" {
            eprintln!("8gb {kv}: not run (6gb budget {six_budget}; see above)");
            continue;
        }
        let eight = peak_and_predicted(&["--tier", "8gb", "--kv", kv, "--max-tokens", "8"], &prompt);
        assert_under(&format!("8gb {kv}, budget {}", eight.budget), eight);
    }
}

#[test]
fn every_kernel_path_stays_under_the_predicted_footprint() {
    let prompt = long_prompt();
    for kernel in other_kernel_paths() {
        // candle's kernels prefill ~10x slower than ours (146 s for the 6gb budget's 2,912
        // tokens), so they run at a budget of 1,024. What they add to the prediction, the
        // score matrices of candle's attention (`PrefillAttention::Materialized`), is
        // linear in the budget and checked at 1,024 here, and at 8,192 on Gemma 3 below.
        let budget: &[&str] = if kernel == "candle" { &["--budget", "1024"] } else { &[] };
        let args = [&["--tier", "6gb", "--kv", "f32", "--max-tokens", "8", "--kernel", kernel][..], budget].concat();
        let case = format!("6gb f32 --kernel {kernel} {}", budget.join(" "));
        assert_under(case.trim_end(), peak_and_predicted(&args, &prompt));
    }
}

#[test]
fn gemma3_at_a_budget_of_8192_stays_under_the_predicted_footprint() {
    // Its 256-wide heads take candle's attention: score matrices over the whole context.
    let model = pocketchat::catalog::models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(model.is_file(), "{} is missing: run `scripts/fetch-model.sh gemma-3-270m-q4_k_m`", model.display());
    let args = ["--budget", "8192", "--max-tokens", "4"];
    assert_under("Gemma 3 270M, budget 8192", run_chat(&model, &args, &long_prompt(), None));
}

#[test]
fn a_pasted_line_without_spaces_stays_under_the_predicted_footprint() {
    // 2 MB of letters and digits in one line: one pre-token, cut before it is tokenized.
    let mut x = 12345u64;
    let mut line: String = (0..2_000_000)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            b"abcdefghijklmnopqrstuvwxyz0123456789"[(x >> 33) as usize % 36] as char
        })
        .collect();
    line.push('\n');
    // What this case checks is the 2 MB line read and cut before it is tokenized; a budget
    // of 1,024 keeps the prediction small (the bound tighter) and the prefill short.
    let args = ["--tier", "6gb", "--budget", "1024", "--max-tokens", "8"];
    assert_under("2 MB line, 6gb, budget 1024", peak_and_predicted(&args, &line));
}

#[test]
fn a_chat_resumed_from_its_saved_cache_stays_under_the_predicted_footprint() {
    // The first run fills the budget and saves the cache; the second restores it, trims it
    // for a new message, and saves it again.
    let chats = tempfile::tempdir().unwrap();
    let args = ["--tier", "6gb", "--chat", "long", "--max-tokens", "8"];
    let model = common::default_model();
    let args = [&["--follow-policy-quant"], &args[..]].concat();
    assert_under("a chat filled and saved", run_chat(&model, &args, &long_prompt(), Some(chats.path())));
    let resumed = run_chat(&model, &args, "And what did the keeper see?\n", Some(chats.path()));
    assert_under("the chat resumed from its cache", resumed);
}

#[test]
fn a_hundred_turns_stay_under_the_predicted_footprint() {
    let input: String = (0..100).map(|i| format!("Tell me one fact about the number {i}.\n")).collect();
    assert_under("100 turns, 6gb", peak_and_predicted(&["--tier", "6gb", "--max-tokens", "24"], &input));
}
