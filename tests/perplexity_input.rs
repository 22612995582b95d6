//! `pocketchat perplexity --chunks N` reads and tokenizes only what its chunks need
//! (issue #34, item 9: a 98 MB file grew to 9.8 GB before the first chunk), and the
//! tokens it scores are exactly the whole file's first tokens, on both tokenizer kinds.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use pocketchat::engine::perplexity::text_tokens;
use pocketchat::engine::tokenizer::TextTokenizer;

fn tokenizer(model: &Path) -> TextTokenizer {
    let (content, _) = pocketchat::engine::model::read_gguf(model).unwrap();
    TextTokenizer::from_gguf(&content).unwrap()
}

/// The two real models of the suite: SmolLM2 (BPE) and Gemma 3 (SentencePiece).
fn models() -> Vec<PathBuf> {
    let dir = pocketchat::catalog::models_dir();
    let models = vec![common::default_model(), dir.join("gemma-3-270m-q4_k_m.gguf")];
    for m in &models {
        assert!(m.is_file(), "{} is missing: run scripts/fetch-model.sh", m.display());
    }
    models
}

/// A text of `bytes` bytes or more: prose with blank lines, runs of spaces, digits and
/// non-ASCII letters, so that cuts land in every kind of place.
fn text_of(bytes: usize, newlines: bool) -> String {
    let prose = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/perplexity.txt")).unwrap();
    let mut text = String::new();
    let mut i = 0usize;
    while text.len() < bytes {
        let part = format!("{prose}\n\n  Σελίδα {i}: café — naïve   übung 12345.\r\n");
        text.push_str(&if newlines { part } else { part.replace(['\n', '\r'], " ") });
        i += 1;
    }
    text
}

#[test]
fn the_chunks_tokens_are_the_whole_files_first_tokens() {
    let dir = tempfile::tempdir().unwrap();
    for model in models() {
        let tok = tokenizer(&model);
        let bos = tok.added_bos();
        for newlines in [true, false] {
            let path = dir.path().join("text.txt");
            let text = text_of(600_000, newlines);
            std::fs::write(&path, &text).unwrap();
            let whole: Vec<u32> = bos.into_iter().chain(tok.encode_text(&text).unwrap()).collect();
            assert_eq!(text_tokens(&path, &tok, 128, None).unwrap(), whole, "without --chunks: the whole file");
            // 1 chunk still needs two chunks' tokens; 300 × 128 is more than the first
            // read (64 KiB) gives, so the prefix grows.
            for (ctx, chunks) in [(64, 1), (128, 3), (512, 40), (128, 300)] {
                let needed = chunks.max(2) * ctx;
                let got = text_tokens(&path, &tok, ctx, Some(chunks)).unwrap();
                assert_eq!(got.len(), needed, "{}: ctx {ctx} × {chunks}", model.display());
                assert_eq!(got, whole[..needed], "{}: ctx {ctx} × {chunks}, newlines {newlines}", model.display());
            }
            // More chunks than the file has: all of it, as before.
            assert_eq!(text_tokens(&path, &tok, 512, Some(100_000)).unwrap(), whole);
        }
    }
}

/// The peak resident memory of `pocketchat perplexity --chunks 1` on a large file stays
/// near the model's size; before, it grew with the file (about 100 bytes per byte).
#[test]
fn one_chunk_of_a_large_file_takes_the_memory_of_one_chunk() {
    let model = common::default_model();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.txt");
    let text = text_of(24 << 20, true);
    std::fs::write(&path, &text).unwrap();
    drop(text);
    // Waited for with wait4, which also gives its peak memory, rather than Child::wait.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(env!("CARGO_BIN_EXE_pocketchat"))
        .args(["perplexity", "--ctx", "64", "--chunks", "1", "--json", "--threads", "2", "--model"])
        .arg(&model)
        .arg("--file")
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, peak) = wait_with_peak_rss(child.id() as libc::pid_t);
    assert!(status == 0, "exit status {status}");
    let model_bytes = std::fs::metadata(&model).unwrap().len();
    println!("peak RSS {:.1} MB (model {:.1} MB)", peak as f64 / 1e6, model_bytes as f64 / 1e6);
    // The model (mapped, dequantized in parts), the tokenizer and one chunk: far below
    // the 2+ GB that tokenizing 24 MB of text takes.
    assert!(peak < 3 * model_bytes + (300 << 20), "peak RSS {peak} B on a 24 MB file, model {model_bytes} B");
}

/// Waits for `pid` and returns its exit status and its peak resident set, in bytes.
fn wait_with_peak_rss(pid: libc::pid_t) -> (i32, u64) {
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child with valid pointers.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4");
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -1 };
    (code, usage.ru_maxrss as u64 * 1024)
}
