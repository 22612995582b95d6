//! llama.cpp's own tokenizer conformance suite (`tests/test-tokenizer-0`): every
//! vocabulary-only file `ggml-vocab-NAME.gguf` with cases (`.inp`, `.out`) that
//! `scripts/fetch-llamacpp-suite.sh` puts in `models/llamacpp-suite/` (or
//! `$POCKETCHAT_LLAMACPP_SUITE`). Each case is tokenized as llama.cpp's test does it: no
//! BOS/EOS added, special-token strings read as text.
//!
//! A vocabulary either gives the expected ids for every case or is refused at load with a
//! message; wrong ids fail the test. The table it prints is the one in docs/models.md:
//!
//!     cargo test --no-default-features --test tokenizer_suite -- --nocapture

use std::path::PathBuf;

use pocketchat::engine::model::read_gguf;
use pocketchat::engine::tokenizer::TextTokenizer;

/// The vocabularies issue 30 names; the suite must hold all of them.
const VOCABULARIES: &[&str] = &[
    "llama-bpe",
    "qwen2",
    "qwen35",
    "gemma-4",
    "llama-spm",
    "phi-3",
    "gpt-2",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "mpt",
    "starcoder",
    "refact",
    "command-r",
    "bert-bge",
];

/// Vocabularies we refuse on purpose (the message must say why): BERT's WordPiece.
const REFUSED: &[&str] = &["bert-bge"];

/// The line between cases in an `.inp` file (llama.cpp's `read_tests`).
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn suite_dir() -> PathBuf {
    match std::env::var_os("POCKETCHAT_LLAMACPP_SUITE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/llamacpp-suite"),
    }
}

/// The cases of `ggml-vocab-NAME.gguf`: texts and their expected ids, read as llama.cpp's
/// test reads them (the input split at [`SEPARATOR`], one line of ids per case).
fn cases(gguf: &std::path::Path) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| {
        let path = PathBuf::from(format!("{}.{ext}", gguf.display()));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (inp, out) = (read("inp"), read("out"));
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(SEPARATOR) {
            Some(at) => {
                texts.push(rest[..at].to_string());
                rest = &rest[at + SEPARATOR.len()..];
            }
            None => {
                texts.push(rest.to_string());
                rest = "";
            }
        }
    }
    let ids: Vec<Vec<u32>> =
        out.lines().map(|line| line.split_whitespace().map(|id| id.parse().unwrap()).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{}: cases and expected ids differ in number", gguf.display());
    texts.into_iter().zip(ids).collect()
}

/// What one vocabulary gave.
enum Outcome {
    Passed { passed: usize, cases: usize, first_failure: Option<String> },
    Refused(String),
}

fn run(name: &str) -> Outcome {
    let path = suite_dir().join(format!("ggml-vocab-{name}.gguf"));
    let cases = cases(&path);
    let (content, _) = read_gguf(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let tokenizer = match TextTokenizer::from_gguf(&content) {
        Ok(t) => t,
        Err(e) => return Outcome::Refused(e.to_string()),
    };
    let mut passed = 0;
    let mut first_failure = None;
    for (text, expected) in &cases {
        let ids = tokenizer.encode_text(text).unwrap();
        if &ids == expected {
            passed += 1;
        } else if first_failure.is_none() {
            first_failure = Some(format!("{text:?}: {ids:?}, expected {expected:?}"));
        }
    }
    Outcome::Passed { passed, cases: cases.len(), first_failure }
}

#[test]
fn every_vocabulary_gives_llama_cpps_ids_or_is_refused() {
    let dir = suite_dir();
    assert!(
        dir.join(format!("ggml-vocab-{}.gguf.inp", VOCABULARIES[0])).is_file(),
        "llama.cpp's tokenizer suite is not in {}: run scripts/fetch-llamacpp-suite.sh",
        dir.display()
    );
    let mut failures = Vec::new();
    println!("| vocabulary | cases | result |\n|---|---|---|");
    for name in VOCABULARIES {
        match run(name) {
            Outcome::Passed { passed, cases, first_failure } => {
                println!("| {name} | {cases} | {passed}/{cases} pass |");
                if let Some(failure) = first_failure {
                    failures.push(format!("{name}: {passed}/{cases}; first wrong: {failure}"));
                }
                if REFUSED.contains(name) {
                    failures.push(format!("{name} loads, but is listed as refused: update REFUSED"));
                }
            }
            Outcome::Refused(message) => {
                println!("| {name} | - | refused: {} |", message.replace('|', "\\|"));
                if !REFUSED.contains(name) {
                    failures.push(format!("{name} is refused: {message}"));
                }
                if !message.contains("tokenizer.ggml.model") || !message.contains("tokenizer.ggml.pre") {
                    failures.push(format!("{name}: the refusal does not name the model and pre: {message}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// SmolLM's pre-tokenizer (`smollm`) isolates every digit before GPT-2's split, so a
/// white-space run before a digit stays whole: "\n\n  0" is ["\n\n  ", "0"], where GPT-2's
/// split alone would give ["\n\n ", " 0"]. Ids from llama.cpp (llama-cpp-python 0.3.36,
/// `tokenize(add_bos=False, special=False)`) on the default model.
#[test]
fn the_default_models_smollm_split_isolates_digits_like_llama_cpp() {
    let path = pocketchat::catalog::models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.is_file(), "{} is missing: run scripts/fetch-model.sh", path.display());
    let (content, _) = read_gguf(&path).unwrap();
    let tokenizer = TextTokenizer::from_gguf(&content).unwrap();
    let cases: &[(&str, &[u32])] = &[
        ("\n\n  0", &[39892, 32]),
        (
            "  1. Indented item 12\n  2. Next 2024-12-02",
            &[
                256, 33, 30, 1218, 6574, 5033, 216, 33, 34, 11181, 34, 30, 9528, 216, 34, 32, 34, 36, 29, 33, 34, 29,
                32, 34,
            ],
        ),
        ("Price: $1,234.56 (x3)", &[27148, 42, 1885, 33, 28, 34, 35, 36, 30, 37, 38, 365, 104, 35, 25]),
    ];
    for (text, expected) in cases {
        assert_eq!(tokenizer.encode_text(text).unwrap(), *expected, "{text:?}");
        assert_eq!(tokenizer.decode(expected).unwrap(), *text);
    }
}

/// Texts test-tokenizer-0 leaves out, on the suite's BPE vocabularies: special-token
/// strings read as text and parsed, odd Unicode, code and white space. llama.cpp's ids
/// are stored by `scripts/llamacpp_tokenizer_cases.py`.
#[test]
fn bpe_vocabularies_read_special_tokens_like_llama_cpp() {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llamacpp_tokenizer_cases.json");
    let cases: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    let vocabularies = cases.as_object().unwrap();
    assert!(vocabularies.len() >= 12, "{} vocabularies in the fixture", vocabularies.len());
    for (file, cases) in vocabularies {
        let path = suite_dir().join(file);
        assert!(path.is_file(), "{} is missing: run scripts/fetch-llamacpp-suite.sh", path.display());
        let (content, _) = read_gguf(&path).unwrap();
        let tokenizer = TextTokenizer::from_gguf(&content).unwrap();
        for case in cases.as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            assert_eq!(tokenizer.encode_text(text).unwrap(), ids(&case["text_ids"]), "{file}, as text: {text:?}");
            assert_eq!(tokenizer.encode(text).unwrap(), ids(&case["special_ids"]), "{file}, parsed: {text:?}");
        }
    }
}
