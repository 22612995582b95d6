//! What the command line writes, and where: an output never replaces what it must not
//! (`quantize --out` onto its own source, onto a file that is not ours, into a folder
//! that is not there), a reader that goes away (`| head`) ends a command quietly, a chat
//! title cannot send escape sequences to the terminal, a `--session` that is a FIFO or a
//! device is refused at once, and `chat` waits for its last save before it exits.
//! All with the real binary on real files.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file;
use candle_core::quantized::GgmlDType;
use common::*;

fn pocketchat() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pocketchat"));
    c.env("POCKETCHAT_NO_FETCH", "1").env_remove("RUST_BACKTRACE").env_remove("POCKETCHAT_LOG");
    c
}

/// Runs `cmd` with `stdin`, killing it after `limit` (a hang is a failure, not a stuck
/// test run).
fn run(mut cmd: Command, stdin: &[u8], limit: Duration) -> Output {
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("the pocketchat binary");
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out_thread = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_thread = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("pocketchat {:?} did not end within {limit:?}", cmd.get_args().collect::<Vec<_>>());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output { status, stdout: out_thread.join().unwrap(), stderr: err_thread.join().unwrap() }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

/// A small Q4_0 model (random weights) to requantize.
fn q4_model(dir: &Path) -> PathBuf {
    let spec = TinySpec {
        n_layers: 1,
        weight_dtype: GgmlDType::Q4_0,
        arch: "llama",
        tokenizer_model: "gpt2",
        meta_overrides: Vec::new(),
    };
    let written = write_tiny_gguf(dir, &spec, 7);
    let path = dir.join("q.gguf");
    std::fs::rename(written, &path).unwrap();
    path
}

fn quantize(model: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut c = pocketchat();
    c.args(["quantize", "--model", model.to_str().unwrap(), "--out", out.to_str().unwrap()]).args(extra);
    run(c, b"", Duration::from_secs(300))
}

fn is_requantized_gguf(path: &Path) -> bool {
    let mut f = std::fs::File::open(path).unwrap();
    let c = gguf_file::Content::read(&mut f).unwrap();
    c.metadata.get("pocketchat.requantized").and_then(|v| v.to_bool().ok()).unwrap_or(false)
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part") || n.ends_with(".tmp"))
        .collect()
}

/// Issue #34, item 3: `quantize --out` onto its own source exited 0 and turned the
/// source into its Q8_0 copy; a text file and another GGUF were overwritten; a missing
/// folder was made.
#[test]
fn quantize_never_replaces_its_source_or_a_file_that_is_not_ours() {
    let dir = tempfile::tempdir().unwrap();
    let src = q4_model(dir.path());
    let original = std::fs::read(&src).unwrap();

    // The source itself, by its name, through a symbolic link and through a hard link.
    let symlink = dir.path().join("link.gguf");
    std::os::unix::fs::symlink(&src, &symlink).unwrap();
    let hardlink = dir.path().join("hard.gguf");
    std::fs::hard_link(&src, &hardlink).unwrap();
    for out in [&src, &symlink, &hardlink] {
        for force in [&[][..], &["--force"]] {
            let o = quantize(&src, out, force);
            assert_eq!(o.status.code(), Some(1), "{} {force:?}: {}", out.display(), text(&o.stderr));
            assert!(text(&o.stderr).contains("is the source file"), "{}", text(&o.stderr));
            assert_eq!(std::fs::read(&src).unwrap(), original, "the source was changed via {}", out.display());
        }
    }

    // A file that is not a GGUF of ours: kept, unless --force.
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, b"my notes").unwrap();
    let other = dir.path().join("other.gguf");
    std::fs::copy(&src, &other).unwrap();
    for foreign in [&notes, &other] {
        let before = std::fs::read(foreign).unwrap();
        let o = quantize(&src, foreign, &[]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        let err = text(&o.stderr);
        assert!(err.contains(&foreign.display().to_string()) && err.contains("--force"), "{err}");
        assert_eq!(std::fs::read(foreign).unwrap(), before, "{} was replaced", foreign.display());
    }
    let o = quantize(&src, &notes, &["--force"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(is_requantized_gguf(&notes));

    // A GGUF this program wrote may be written again.
    let ours = dir.path().join("ours.gguf");
    let o = quantize(&src, &ours, &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), ours.display().to_string());
    let o = quantize(&src, &ours, &[]);
    assert!(o.status.success(), "replacing our own output: {}", text(&o.stderr));

    // No folder is made; a FIFO is not written to (nor waited on), even with --force.
    let nested = dir.path().join("missing").join("dir").join("x.gguf");
    let o = quantize(&src, &nested, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("does not exist"), "{}", text(&o.stderr));
    assert!(!dir.path().join("missing").exists(), "a folder was made");
    let fifo = dir.path().join("fifo.gguf");
    mkfifo(&fifo);
    let o = quantize(&src, &fifo, &["--force"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("FIFO"), "{}", text(&o.stderr));

    assert_eq!(std::fs::read(&src).unwrap(), original);
    assert!(leftovers(dir.path()).is_empty(), "left behind: {:?}", leftovers(dir.path()));
}

/// Issue #34, item 10: `models --json | head -c 300` panicked on the broken pipe (exit
/// 101). Every command that prints ends quietly when its reader has gone.
#[test]
fn a_closed_output_ends_a_command_quietly() {
    let model = default_model();
    let chats = tempfile::tempdir().unwrap();
    let store = pocketchat::chats::ChatStore::open(chats.path(), 0).unwrap();
    for i in 0..50 {
        store.create(&format!("chat number {i}")).unwrap();
    }
    let model = model.to_str().unwrap();
    let commands: &[&[&str]] = &[
        &["models", "--json"],
        &["models"],
        &["chats"],
        &["chats", "--json"],
        &["tokenize", "--model", model, "hello there"],
    ];
    for args in commands {
        let mut c = pocketchat();
        c.args(*args).env("POCKETCHAT_CHATS_DIR", chats.path());
        c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        // The reader goes away before anything is written: every write is a broken pipe.
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = text(&o.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
    }
}

/// Issue #34, "Messages": a first message's escape sequences became the chat's title and
/// `chats` printed them raw (clearing the screen, setting the window title).
#[test]
fn chat_titles_are_printed_without_control_characters() {
    let chats = tempfile::tempdir().unwrap();
    let store = pocketchat::chats::ChatStore::open(chats.path(), 0).unwrap();
    let hostile = "\u{1b}]0;pwned\u{7}\u{1b}[2JHello\u{9b}31m\u{202e}there";
    store.create(hostile).unwrap();
    let mut c = pocketchat();
    c.arg("chats").env("POCKETCHAT_CHATS_DIR", chats.path());
    let o = run(c, b"", Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("Hello") && out.contains("there"), "{out:?}");
    let bad: Vec<char> = out.chars().filter(|c| (c.is_control() && *c != '\n') || *c == '\u{202e}').collect();
    assert!(bad.is_empty(), "control characters printed: {bad:?} in {out:?}");

    let mut c = pocketchat();
    c.args(["chats", "--json"]).env("POCKETCHAT_CHATS_DIR", chats.path());
    let o = run(c, b"", Duration::from_secs(60));
    assert!(!text(&o.stdout).contains('\u{1b}'), "raw ESC in the JSON");
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The store itself keeps no control characters in titles (`chats::clean_name`).
    let title = list[0]["title"].as_str().unwrap();
    assert!(title.contains("Hello") && !title.chars().any(char::is_control), "{title:?}");
}

/// Issue #34, items 8 and 17: a FIFO given to `--session` blocked the start forever;
/// `--session /dev/null` wrote `/dev/null-2` and a lock file into `/dev`. Both are
/// refused before anything is opened, as is a session in a folder that is not there.
#[test]
fn a_session_that_is_not_a_regular_file_is_refused_at_once() {
    let model = default_model();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("chat.pcstate");
    mkfifo(&fifo);
    let missing = dir.path().join("no-such-folder").join("chat.pcstate");
    let before_dev: Vec<_> = std::fs::read_dir("/dev").unwrap().map(|e| e.unwrap().file_name()).collect();
    for (session, why) in [
        (fifo.as_path(), "is a FIFO"),
        (Path::new("/dev/null"), "/dev/null is a device"),
        (dir.path(), "is a folder"),
        (missing.as_path(), "does not exist"),
    ] {
        let mut c = pocketchat();
        c.args(["chat", "--model", model.to_str().unwrap(), "--max-tokens", "2", "--session"]).arg(session);
        let o = run(c, b"hi\n", Duration::from_secs(120));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{}: {err}", session.display());
        assert!(err.contains("--session") && err.contains(why), "{}: {err}", session.display());
    }
    // The same for the model: a FIFO is refused, not waited on.
    let mut c = pocketchat();
    c.args(["tokenize", "--model"]).arg(&fifo).arg("hi");
    let o = run(c, b"", Duration::from_secs(120));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("it is a FIFO (named pipe), not a regular file"), "{}", text(&o.stderr));
    let after_dev: Vec<_> = std::fs::read_dir("/dev").unwrap().map(|e| e.unwrap().file_name()).collect();
    let new: Vec<_> = after_dev.iter().filter(|n| !before_dev.contains(n)).collect();
    assert!(new.is_empty(), "written into /dev: {new:?}");
    assert!(!dir.path().join("no-such-folder").exists(), "a folder was made");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["chat.pcstate"], "nothing is written beside the FIFO");
}

/// Issue #34, item 8, in the chats folder: FIFOs in the place of a chat's record, its
/// cache and its lock are never waited on: the record is listed as unreadable, and as no
/// file can hold a chat, a new chat by name still starts. With a FIFO as the folder's
/// lock, the list still shows and a chat by name is refused, naming it.
#[test]
fn fifos_in_the_chats_folder_are_never_waited_on() {
    let model = default_model();
    let chats = tempfile::tempdir().unwrap();
    let id = "20260101-000000-0001";
    for name in [format!("{id}.json"), format!("{id}.pcstate"), format!(".{id}.pcstate.lock")] {
        mkfifo(&chats.path().join(name));
    }
    let list = || {
        let mut c = pocketchat();
        c.arg("chats").env("POCKETCHAT_CHATS_DIR", chats.path());
        run(c, b"", Duration::from_secs(60))
    };
    let o = list();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains(&format!("{id}  unreadable")), "{}", text(&o.stdout));
    let chat = || {
        let mut c = pocketchat();
        c.args(["chat", "--model", model.to_str().unwrap(), "--max-tokens", "2", "--chat", "fresh"]);
        c.env("POCKETCHAT_CHATS_DIR", chats.path());
        run(c, b"hi\n", Duration::from_secs(120))
    };
    let o = chat();
    assert!(o.status.success(), "{}", text(&o.stderr));
    std::fs::remove_file(chats.path().join(".chats.lock")).unwrap();
    mkfifo(&chats.path().join(".chats.lock"));
    assert!(list().status.success());
    let o = chat();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(".chats.lock is a FIFO (named pipe), not a regular file"), "{err}");
}

/// Issue #34, item 15: `chat` returned from `main` without waiting for the engine
/// thread, whose save at shutdown was cut off by the exit (a `.NAME.PID.N.tmp` file was
/// left when the exit came during the write). Now the thread is joined first: it always
/// reaches its end ("engine thread stopped" in the log) and leaves no temporary file.
/// A long prompt makes the save take long enough that an exit without the join cuts it.
#[test]
fn chat_waits_for_its_last_save_before_it_exits() {
    let model = default_model();
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("talk.pcstate");
    let words = ["the", "sea", "is", "wide", "and", "deep", "with", "fish", "near", "coast"];
    let prompt: String = (0..1500).map(|i| words[(i * 7 + i / 3) % words.len()]).collect::<Vec<_>>().join(" ");
    for round in 0..2 {
        let mut c = pocketchat();
        c.args(["chat", "--model", model.to_str().unwrap(), "--max-tokens", "1", "--temperature", "0", "--session"])
            .arg(&session)
            .env("POCKETCHAT_LOG", "pocketchat=info");
        let o = run(c, format!("{prompt}\n").as_bytes(), Duration::from_secs(300));
        let err = text(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains("engine thread stopped"), "round {round}: the engine thread was cut off:\n{err}");
        let left = leftovers(dir.path());
        assert!(left.is_empty(), "round {round}: temporary files left: {left:?}");
        assert_eq!(err.contains("restored a conversation"), round > 0, "round {round}: {err}");
    }
}

/// Issue #34, "Messages": an error printed its cause twice ("cannot open X: No such file
/// or directory (os error 2): No such file or directory (os error 2)"). Each error names
/// its path and says its cause once.
#[test]
fn an_error_names_its_path_and_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let text_file = dir.path().join("missing.txt");
    let model = default_model();
    let runs: [(Vec<&str>, &Path); 2] = [
        (vec!["quantize", "--model", missing.to_str().unwrap()], &missing),
        (
            vec![
                "perplexity",
                "--model",
                model.to_str().unwrap(),
                "--chunks",
                "1",
                "--file",
                text_file.to_str().unwrap(),
            ],
            &text_file,
        ),
    ];
    for (args, path) in runs {
        let mut c = pocketchat();
        c.args(&args);
        let o = run(c, b"", Duration::from_secs(120));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(&path.display().to_string()), "{args:?}: the path is missing: {err}");
        assert_eq!(err.matches("No such file or directory").count(), 1, "{args:?}: {err}");
    }
}

/// Issue #31, item 5: `models --json` lists the small models of 2026 with their fit and
/// budget on every tier, and the hybrids' fixed recurrent state beside their (smaller)
/// keys and values per token.
#[test]
fn models_json_lists_the_new_models_with_their_fit_on_every_tier() {
    let models = tempfile::tempdir().unwrap();
    let mut c = pocketchat();
    c.args(["models", "--json", "--tier", "6gb"]).env("POCKETCHAT_MODELS_DIR", models.path());
    let o = run(c, b"", Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let row = |id: &str| rows.iter().find(|r| r["id"] == id).unwrap_or_else(|| panic!("no {id} in the listing"));
    let ids = [
        "qwen3.5-0.8b-q4_k_m",
        "qwen3.5-0.8b-q8_0",
        "qwen3.5-2b-q4_k_m",
        "qwen3.5-2b-q8_0",
        "qwen3.5-4b-q4_k_m",
        "qwen3.5-4b-q8_0",
        "gemma-4-e2b-it-q4_k_m",
        "gemma-4-e2b-it-q8_0",
        "gemma-4-e4b-it-q4_k_m",
        "gemma-4-e4b-it-q8_0",
        "lfm2.5-1.2b-instruct-q4_k_m",
        "lfm2.5-1.2b-instruct-q8_0",
        "smollm3-3b-q4_k_m",
        "smollm3-3b-q8_0",
    ];
    for id in ids {
        let r = row(id);
        let tiers = r["tiers"].as_array().unwrap_or_else(|| panic!("{id}: no tiers in {r}"));
        let names: Vec<&str> = tiers.iter().map(|t| t["tier"].as_str().unwrap()).collect();
        assert_eq!(names, ["6gb", "8gb", "desktop"], "{id}");
        for t in tiers {
            let (fits, budget) = (t["fits"].as_bool().unwrap(), t["budget"].as_u64().unwrap());
            assert_eq!(fits, budget >= 512, "{id} on {}: {t}", t["tier"]);
            assert!(t["fit"].is_string() && t["footprint_bytes"].as_u64().unwrap() > 0, "{id}: {t}");
        }
        // The row's own fields are its 6 GB tier's.
        assert_eq!(r["budget"], tiers[0]["budget"], "{id}");
    }
    // A desktop takes every one of these models in one of its files (Qwen3.5-4B's 8-bit
    // file, 4.5 GB, is over the 4 GiB ceiling).
    for (q4, q8) in ids.iter().step_by(2).zip(ids.iter().skip(1).step_by(2)) {
        let fits = |id: &str| row(id)["tiers"][2]["fits"].as_bool().unwrap();
        assert!(fits(q4) || fits(q8), "neither {q4} nor {q8} fits a desktop");
    }
    // A hybrid: fewer keys and values per token than its layers would hold, and a fixed
    // recurrent state (with checkpoints) in its footprint; a plain transformer has none.
    let qwen = row("qwen3.5-2b-q4_k_m");
    // (On the 6 GB tier listed: its q8_0 cache, 34 bytes per 32 values.)
    assert_eq!(qwen["kv_bytes_per_token"], 6 * 2 * 2 * 256 / 32 * 34);
    assert!(qwen["recurrent_bytes"].as_u64().unwrap() > 0);
    assert_eq!(row("smollm3-3b-q4_k_m")["recurrent_bytes"], 0);
    // SmolLM3 and Gemma 4 it runs; Gemma 4's sliding layers keep every position here.
    assert_eq!(row("smollm3-3b-q8_0")["runs"], true);
    assert_eq!(row("gemma-4-e2b-it-q4_k_m")["runs"], true);
    assert_eq!(row("gemma-4-e2b-it-q4_k_m")["recurrent_bytes"], 0);
}
