//! Memory stays bounded on the real model, driven through the headless CLI as a user
//! would: a 200-turn soak under a small budget, memory warnings injected mid-reply, and a
//! jetsam stand-in that kills the process if its footprint passes a ceiling set just
//! above the predicted footprint.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use pocketchat::memory::{self, MIB};

struct Turn {
    generated: usize,
    context: usize,
    peak_rss: u64,
}

struct Run {
    turns: Vec<Turn>,
    trims: usize,
    evictions: usize,
    stderr: String,
}

fn field(line: &str, after: &str) -> u64 {
    let rest = &line[line.find(after).unwrap_or_else(|| panic!("no {after:?} in {line}")) + after.len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// Runs `pocketchat chat` over `prompts` with the given extra flags under the jetsam
/// stand-in and parses its `--stats` lines.
fn run_chat(prompts: &[String], budget: usize, extra: &[&str]) -> Run {
    let model = common::default_model();
    let file_bytes = std::fs::metadata(&model).unwrap().len();
    // SmolLM2-135M: 30 layers, 9 heads (3 for K/V) of 64, width 576, FFN 1536.
    let kv_per_token = memory::kv_bytes_per_token(30, 3, 64, 4);
    let shape = memory::PrefillShape {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        width: 576,
        ffn: 1536,
        attention: memory::PrefillAttention::Fused { window: None },
    };
    let scratch = memory::prefill_scratch_bytes(pocketchat::engine::model::PREFILL_CHUNK, &shape, budget);
    let ceiling = memory::predicted_footprint(file_bytes, kv_per_token, budget, scratch) + 16 * MIB;
    let mut child = Command::new(env!("CARGO_BIN_EXE_pocketchat"))
        .args(["chat", "--model", model.to_str().unwrap(), "--budget", &budget.to_string(), "--max-tokens", "16"])
        .args(["--stats", "--jetsam-ceiling", &ceiling.to_string()])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        for p in prompts {
            writeln!(stdin, "{p}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "chat exited with {:?} (ceiling {ceiling} B):\n{}", out.status, tail(&stderr));
    let turns = stderr
        .lines()
        .filter(|l| l.starts_with("[turn "))
        .map(|l| Turn {
            generated: field(l, "generated ") as usize,
            context: field(l, "context ") as usize,
            peak_rss: field(l, "peak_rss "),
        })
        .collect();
    Run {
        turns,
        trims: stderr.matches("[context trimmed").count(),
        evictions: stderr.matches("[memory warning").count(),
        stderr,
    }
}

fn tail(s: &str) -> String {
    s.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
}

fn prompts(n: usize) -> Vec<String> {
    let topics = ["cats", "the sea", "bread", "mountains", "trains", "music", "rain", "chess"];
    (0..n).map(|i| format!("Tell me one short fact about {} (question {i}).", topics[i % topics.len()])).collect()
}

#[test]
fn soak_200_turns_keeps_memory_flat_and_under_the_ceiling() {
    let budget = 256;
    let run = run_chat(&prompts(200), budget, &[]);
    assert_eq!(run.turns.len(), 200, "{}", tail(&run.stderr));
    assert!(run.turns.iter().all(|t| t.generated > 0), "a turn produced no reply");
    assert!(run.turns.iter().all(|t| t.context <= budget));
    assert!(run.trims > 0, "no trims were reported");
    let at_20 = run.turns[19].peak_rss as f64;
    let at_end = run.turns[199].peak_rss as f64;
    let growth = (at_end - at_20) / at_20;
    println!(
        "soak: 200 turns, {} trims, peak RSS at turn 20 {:.1} MB, at turn 200 {:.1} MB ({:+.2}%)",
        run.trims,
        at_20 / 1e6,
        at_end / 1e6,
        growth * 100.0
    );
    assert!(growth < 0.05, "peak RSS grew {:.1}% after turn 20", growth * 100.0);
}

#[test]
fn memory_warnings_mid_reply_are_survived_reported_and_followed_by_replies() {
    let run = run_chat(&prompts(24), 512, &["--simulate-warning-every", "3"]);
    assert_eq!(run.turns.len(), 24, "{}", tail(&run.stderr));
    assert_eq!(run.evictions, 8, "{}", tail(&run.stderr));
    assert!(run.turns.iter().all(|t| t.generated > 0), "a turn produced no reply");
    assert!(run.stderr.matches("[reply ended: MemoryWarning]").count() == 8);
    println!("warnings: 24 turns, {} evictions, every turn answered", run.evictions);
}
