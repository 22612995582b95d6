//! Issue 29, item 4: the memory policy loads real files. On a desktop (8-bit) tier the
//! app used to write `…Q8_0-from-Q4_1.gguf` beside the Q4_1 file it was given and load
//! that instead: 47 % more memory for the same information. Now a named file is loaded as
//! it is, whatever the tier, in the engine and in the terminal chat, and nothing is
//! written beside it. All on the real default model.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use pocketchat::engine::{Engine, EngineConfig, EngineEvent};
use pocketchat::memory::{RamTier, WeightQuant};

/// A folder holding only a link to the default Q4_1 file: whatever is made beside the
/// file shows up here.
fn folder_with_the_q4_1_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join(default_model().file_name().unwrap());
    std::os::unix::fs::symlink(default_model().canonicalize().unwrap(), &model).unwrap();
    (dir, model)
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn the_engine_on_a_desktop_tier_loads_the_q4_1_file_it_is_given() {
    let (dir, model) = folder_with_the_q4_1_file();
    let mut config = EngineConfig::new(&model);
    config.tier_override = Some(RamTier::Desktop);
    let (handle, mut events) = Engine::spawn(config);
    let (mut info, mut notices) = (None, Vec::new());
    let policy = loop {
        match events.recv_blocking().expect("engine stopped") {
            EngineEvent::Ready(i) => info = Some(i),
            EngineEvent::Notice { message } => notices.push(message),
            EngineEvent::Policy { policy, .. } => break policy,
            EngineEvent::Failed { error } => panic!("{error}"),
            _ => {}
        }
    };
    let info = info.expect("Ready before Policy");
    assert_eq!((info.path.as_str(), info.weights_quant.as_str()), (model.to_str().unwrap(), "Q4_1"));
    assert_eq!(policy.tier, RamTier::Desktop);
    assert_eq!(policy.quant, WeightQuant::Q4, "the policy names the weights loaded");
    assert_eq!(policy.fit_warning(&info.name), None, "it fits: no warning");
    handle.send(pocketchat::engine::Command::Shutdown).unwrap();
    while events.recv_blocking().is_some() {}
    assert!(notices.is_empty(), "{notices:?}");
    assert_eq!(files_in(dir.path()), [model.file_name().unwrap().to_str().unwrap()], "nothing written beside it");
}

/// `pocketchat chat --tier desktop --follow-policy-quant --model X.Q4_1.gguf`: the flag
/// once made the 8-bit copy; a named file is what is loaded.
#[test]
fn the_terminal_chat_on_a_desktop_tier_loads_the_q4_1_file_and_writes_no_copy() {
    let (dir, model) = folder_with_the_q4_1_file();
    for extra in [&[][..], &["--follow-policy-quant"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pocketchat"))
            .args(["chat", "--tier", "desktop", "--max-tokens", "4", "--temperature", "0", "--model"])
            .arg(&model)
            .args(extra)
            .env("POCKETCHAT_NO_FETCH", "1")
            .env("POCKETCHAT_CHATS_DIR", dir.path().join("chats"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        writeln!(child.stdin.take().unwrap(), "Hello").unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{extra:?}: {stderr}");
        // "[SmolLM2-135M-Instruct · Q4_1 · cpu]", then "[Desktop class: 4-bit weights · …]".
        assert!(stderr.lines().any(|l| l.starts_with('[') && l.contains(" · Q4_1 · ")), "{extra:?}: {stderr}");
        assert!(stderr.contains("[Desktop class: 4-bit weights · "), "{extra:?}: {stderr}");
        assert!(!stderr.contains("requantized") && !stderr.contains("too large"), "{extra:?}: {stderr}");
        let written: Vec<String> = files_in(dir.path()).into_iter().filter(|n| n.ends_with(".gguf")).collect();
        assert_eq!(written, [model.file_name().unwrap().to_str().unwrap()], "{extra:?}: no copy beside the file");
    }
}
