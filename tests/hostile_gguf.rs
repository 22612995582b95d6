//! Hostile GGUF files (a few KB each, written by the test) get a clear error: no panic,
//! no abort, no giant allocation, no model that loads and then fails at every prompt.

mod common;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::Device;
use common::*;
use pocketchat::engine::{EngineError, Kernels, Model};

fn tiny_with(dir: &Path, meta: Vec<(&str, Value)>) -> PathBuf {
    let meta_overrides = meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    write_tiny_gguf(dir, &TinySpec { meta_overrides, ..Default::default() }, 5)
}

/// Loads `path` and returns the error's text; fails the test if it loads.
fn load_error(path: &Path) -> String {
    match Model::load(path, &Device::Cpu, Kernels::Fast, |_| {}) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e @ EngineError::BadModelFile { .. }) => e.to_string(),
        Err(e) => panic!("{}: not a bad-file error: {e:?}", path.display()),
    }
}

/// Rewrites the tensor info of `name` in a GGUF v2/v3 file: its dims and data offset.
fn patch_tensor(path: &Path, name: &str, patch: impl FnOnce(&mut Vec<u64>, &mut u64)) {
    let mut bytes = std::fs::read(path).unwrap();
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    let at = bytes.windows(key.len()).position(|w| w == key).expect("tensor info") + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let dims_at = at + 4;
    let mut dims: Vec<u64> = (0..n_dims)
        .map(|i| u64::from_le_bytes(bytes[dims_at + 8 * i..dims_at + 8 * i + 8].try_into().unwrap()))
        .collect();
    let offset_at = dims_at + 8 * n_dims + 4;
    let mut offset = u64::from_le_bytes(bytes[offset_at..offset_at + 8].try_into().unwrap());
    patch(&mut dims, &mut offset);
    for (i, d) in dims.iter().enumerate() {
        bytes[dims_at + 8 * i..dims_at + 8 * i + 8].copy_from_slice(&d.to_le_bytes());
    }
    bytes[offset_at..offset_at + 8].copy_from_slice(&offset.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_zero_or_odd_alignment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for alignment in [0u32, 3, 1 << 30] {
        let path = tiny_with(dir.path(), vec![("general.alignment", Value::U32(alignment))]);
        let e = load_error(&path);
        assert!(e.contains("alignment"), "{alignment}: {e}");
    }
}

#[test]
fn layer_counts_that_disagree_with_the_tensors_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for blocks in [u32::MAX, 0, 3] {
        let path = tiny_with(dir.path(), vec![("llama.block_count", Value::U32(blocks))]);
        let e = load_error(&path);
        assert!(e.contains("block_count") || e.contains("layers"), "{blocks}: {e}");
    }
}

#[test]
fn tensors_whose_sizes_overflow_or_leave_the_file_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_with(dir.path(), vec![]);
    let good = std::fs::read(&path).unwrap();
    // Dimensions whose product wraps past 2^64 (back to a plausible size).
    patch_tensor(&path, "blk.0.attn_q.weight", |dims, _| {
        dims[0] = 1 << 62;
        dims[1] = 4 * 256;
    });
    assert!(load_error(&path).contains("overflow"));
    // Data past the end of the file.
    std::fs::write(&path, &good).unwrap();
    patch_tensor(&path, "blk.1.ffn_down.weight", |_, offset| *offset += 1 << 40);
    assert!(load_error(&path).contains("past the end"));
}

#[test]
fn shapes_that_disagree_with_the_metadata_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_with(dir.path(), vec![]);
    let good = std::fs::read(&path).unwrap();
    // q projection with half the rows (the data still lies inside the file).
    patch_tensor(&path, "blk.0.attn_q.weight", |dims, _| dims[1] /= 2);
    assert!(load_error(&path).contains("attn_q"));
    // Embedding rows narrower than the model's width.
    std::fs::write(&path, &good).unwrap();
    patch_tensor(&path, "token_embd.weight", |dims, _| {
        dims[0] /= 2;
        dims[1] *= 2;
    });
    assert!(load_error(&path).contains("token_embd"));
    // A width in the metadata that the tensors do not have.
    let head_dim = (EMBED * 2 / HEADS) as u32;
    let path = tiny_with(
        dir.path(),
        vec![
            ("llama.embedding_length", Value::U32(EMBED as u32 * 2)),
            ("llama.rope.dimension_count", Value::U32(head_dim)),
        ],
    );
    let e = load_error(&path);
    assert!(e.contains("token_embd"), "{e}");
}

#[test]
fn the_cli_reports_a_hostile_file_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_with(dir.path(), vec![("general.alignment", Value::U32(0))]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pocketchat"))
        .args(["tokenize", "--model"])
        .arg(&path)
        .arg("hello")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(101), "panicked: {stderr}");
    assert!(!out.status.success() && stderr.contains("alignment"), "{stderr}");
}

/// A tensor in a type this engine does not read (llama.cpp's IQ4_NL, say) is named with
/// its type, before candle's reader fails on it without saying which tensor.
#[test]
fn an_unsupported_tensor_type_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_with(dir.path(), vec![]);
    let mut bytes = std::fs::read(&path).unwrap();
    let name = "blk.0.ffn_down.weight";
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    let at = bytes.windows(key.len()).position(|w| w == key).expect("tensor info") + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let type_at = at + 4 + 8 * n_dims;
    bytes[type_at..type_at + 4].copy_from_slice(&20u32.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let error = load_error(&path);
    assert!(error.contains("tensor `blk.0.ffn_down.weight` is IQ4_NL (type 20)"), "{error}");
    assert!(error.contains("Q2_K to Q6_K"), "{error}");
}
