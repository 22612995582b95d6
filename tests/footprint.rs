//! The predicted footprint (`memory::predicted_footprint`, what the budgets that keep us
//! under jetsam are computed from) is an upper bound of the real peak RSS: a 200 KB
//! prompt at every budget the tiers give, and a 100-turn conversation, on the real model.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `pocketchat chat --stats` over `input` and returns `(peak RSS, predicted)` of the
/// last turn (the peak is the process's high-water mark, so the last turn's is the
/// whole run's).
fn peak_and_predicted(args: &[&str], input: &str) -> (u64, u64) {
    let model = common::default_model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pocketchat"))
        .args(["chat", "--model", model.to_str().unwrap(), "--follow-policy-quant", "--stats"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let last = stderr.lines().rfind(|l| l.starts_with("[turn ")).unwrap_or_else(|| panic!("no turn: {stderr}"));
    let field = |name: &str| -> u64 {
        let rest = &last[last.find(name).unwrap_or_else(|| panic!("no {name} in {last}")) + name.len()..];
        rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    (field("peak_rss "), field("predicted "))
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

#[test]
fn a_long_prompt_stays_under_the_predicted_footprint_at_every_budget() {
    let prompt = long_prompt();
    // The 135M model gets its full 8,192-token context on 8gb and desktop alike (the same
    // policy), so desktop is left out; on 6gb the cache allowance sets the budget.
    for tier in ["6gb", "8gb"] {
        for kv in ["f32", "f16"] {
            let (peak, predicted) = peak_and_predicted(&["--tier", tier, "--kv", kv, "--max-tokens", "8"], &prompt);
            eprintln!("{tier} {kv}: peak RSS {:.1} MB, predicted {:.1} MB", peak as f64 / 1e6, predicted as f64 / 1e6);
            assert!(peak <= predicted, "{tier} {kv}: peak RSS {peak} B over the predicted {predicted} B");
        }
    }
}

#[test]
fn a_hundred_turns_stay_under_the_predicted_footprint() {
    let input: String = (0..100).map(|i| format!("Tell me one fact about the number {i}.\n")).collect();
    let (peak, predicted) = peak_and_predicted(&["--tier", "6gb", "--max-tokens", "24"], &input);
    eprintln!("100 turns, 6gb: peak RSS {:.1} MB, predicted {:.1} MB", peak as f64 / 1e6, predicted as f64 / 1e6);
    assert!(peak <= predicted, "peak RSS {peak} B over the predicted {predicted} B");
}
