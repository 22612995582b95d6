//! The command line takes bad input the way a user would hope: misspelled or unknown
//! flags and out-of-range values are usage errors (exit 2) that say what is wrong, runtime
//! errors are printed once, in plain text, with exit 1, and odd input on stdin is read,
//! not fatal.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::*;

fn pocketchat(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pocketchat"))
        .args(args)
        .env("POCKETCHAT_NO_FETCH", "1")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the pocketchat binary");
    // A process that refuses its arguments exits before reading: ignore a broken pipe.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn misspelled_flags_and_bad_values_are_usage_errors() {
    let model = default_model();
    let model = model.to_str().unwrap();
    let out = pocketchat(&["chat", "--model", model, "--max-token", "5"], b"");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--max-tokens"), "no suggestion: {}", stderr(&out));
    for bad in [
        &["--threads", "0"][..],
        &["--temperature", "nan"],
        &["--temperature", "-1"],
        &["--temperature", "inf"],
        &["--top-p", "1.5"],
        &["--min-p", "-0.1"],
        &["--repeat-penalty", "0"],
        &["--dry-multiplier", "-0.5"],
        &["--dry-base", "0.5"],
        &["--dry-allowed-length", "-1"],
        &["--dry-penalty-last-n", "-2"],
        &["--top-k", "many"],
        &["--max-tokens", "0"],
        &["--budget", "30"],
        &["--kv", "f8"],
        &["--tier", "4gb"],
    ] {
        let mut args = vec!["chat", "--model", model];
        args.extend_from_slice(bad);
        let out = pocketchat(&args, b"hello\n");
        assert_eq!(out.status.code(), Some(2), "{bad:?} was accepted: {}", stderr(&out));
        assert!(stderr(&out).contains(bad[0]), "{bad:?}: {}", stderr(&out));
    }
    let out = pocketchat(&["bench", "--model", model, "--prompt-tokens", "9223372036854775807"], b"");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = pocketchat(&["chat", "--help"], b"");
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("--session"));
}

#[test]
fn a_runtime_error_is_printed_once_in_plain_text() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    for (path, says) in [(&missing, "missing.gguf"), (&empty, "cut short")] {
        let out = pocketchat(&["chat", "--model", path.to_str().unwrap()], b"hello\n");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.matches(says).count(), 1, "printed {} times: {err}", err.matches(says).count());
        assert!(!err.contains('\u{1b}'), "terminal colours in a pipe: {err:?}");
    }
}

#[test]
fn odd_input_is_read_and_a_budget_past_the_context_is_capped() {
    let model = default_model();
    // SmolLM2 has an 8,192-token context.
    let args = ["chat", "--model", model.to_str().unwrap(), "--max-tokens", "4", "--budget", "9000"];
    let out = pocketchat(&args, b"Hello \xff\xfe there\nSay hi.\n");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("not valid UTF-8"), "{err}");
    let replies = String::from_utf8_lossy(&out.stdout);
    assert_eq!(replies.lines().filter(|l| !l.trim().is_empty()).count(), 2, "two replies: {replies:?} {err}");
}

#[test]
fn more_threads_than_cores_and_a_folder_as_session_file_are_handled() {
    let model = default_model();
    let model = model.to_str().unwrap();
    let out = pocketchat(
        &["bench", "--model", model, "--threads", "1000", "--prompt-tokens", "8", "--gen", "4", "--json"],
        b"",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cores = pocketchat::engine::pool::available_cores() as u64;
    assert!(report["threads"].as_u64().unwrap() <= cores, "{report}");

    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("conversation");
    std::fs::create_dir(&folder).unwrap();
    let out =
        pocketchat(&["chat", "--model", model, "--max-tokens", "4", "--session", folder.to_str().unwrap()], b"hi\n");
    // Refused at once (issue #34: nothing but a regular file is a session), and nothing
    // is written beside it.
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--session") && err.contains("conversation is a folder, not a regular file"), "{err}");
    assert!(folder.is_dir() && !dir.path().join("conversation-2").exists());
}

#[test]
fn a_named_chat_goes_on_across_runs_and_chats_lists_it() {
    let model = default_model();
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str], stdin: &[u8]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pocketchat"))
            .args(args)
            .env("POCKETCHAT_CHATS_DIR", dir.path())
            .env("POCKETCHAT_NO_FETCH", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the pocketchat binary");
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    };
    let chat = ["chat", "--model", model.to_str().unwrap(), "--chat", "trip plans", "--max-tokens", "8"];
    let first = run(&chat, b"Where is Lisbon?\n");
    assert!(first.status.success(), "{}", stderr(&first));
    let again = run(&chat, b"And Porto?\n");
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("“trip plans”: 2 messages") && stderr(&again).contains("without re-prefill"),
        "the second run resumed the chat from its cache: {}",
        stderr(&again)
    );
    let list = run(&["chats", "--json"], b"");
    assert!(list.status.success(), "{}", stderr(&list));
    let chats: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(chats.as_array().map(Vec::len), Some(1), "{chats}");
    assert_eq!(chats[0]["title"], "trip plans");
    assert_eq!(chats[0]["messages"], 4);
    assert!(chats[0]["cache_bytes"].as_u64() > Some(0));
    let table = run(&["chats"], b"");
    assert!(String::from_utf8_lossy(&table.stdout).contains("trip plans"));
}

/// `pocketchat perplexity --json` prints one object with ppl, tokens_scored and chunks.
#[test]
fn perplexity_prints_json() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pocketchat"))
        .args(["perplexity", "--ctx", "64", "--chunks", "2", "--json", "--file"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["chunks"].as_u64(), v["tokens_scored"].as_u64()), (Some(2), Some(62)), "{v}");
    let ppl = v["ppl"].as_f64().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{v}");
}
