//! Every quantization type the engine reads, on the real default model: the Q4_1 file is
//! requantized to each type with `catalog::quantize_to` (candle's quantizer; K-quants fall
//! back per tensor where rows are not whole 256-blocks, as llama.cpp's quantizer does),
//! loaded by the engine with its fast kernels (matrices of the types they read read in place
//! from the mapped file, the others copied and rewritten for them or for candle's), and its
//! logits compared with candle-transformers' reference llama on the same file. The memory
//! the header alone predicts (`file_facts`: heap and mapped weights) is what the load
//! holds. The files are not llama.cpp's own (that comparison needs llama-cpp-python; issue 12).

mod common;

use std::collections::BTreeMap;

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::{DType, Device, Tensor};
use pocketchat::catalog::{quantize_to, QUANT_TYPES};
use pocketchat::engine::model::file_facts;
use pocketchat::engine::{Kernels, Model};

/// "The capital of France is Paris. The capital of Italy is", as SmolLM2 tokenizes it.
const PROMPT: [u32; 12] = [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 7158, 314];

#[test]
fn every_quant_type_loads_and_matches_the_reference_llama() {
    let source = common::default_model();
    let dir = tempfile::tempdir().unwrap();
    eprintln!("{:6} {:>11} {:>11} {:>11} {:>9} {:>7}  tensors", "type", "bytes", "heap", "mapped", "cosine", "argmax");
    for (name, dtype) in QUANT_TYPES {
        let path = dir.path().join(format!("m.{name}.gguf"));
        let report = quantize_to(&source, &path, *dtype).unwrap_or_else(|e| panic!("{name}: {e}"));

        let mut f = std::fs::File::open(&path).unwrap();
        let content = gguf_file::Content::read(&mut f).unwrap();
        let mut mix: BTreeMap<String, usize> = BTreeMap::new();
        for info in content.tensor_infos.values().filter(|i| i.shape.dims().len() == 2) {
            *mix.entry(format!("{:?}", info.ggml_dtype)).or_default() += 1;
        }
        let down = content.tensor_infos["blk.0.ffn_down.weight"].ggml_dtype;
        assert_eq!(down, *dtype, "{name}: ffn_down's rows (1,536) are whole blocks of every type");
        let mut reference =
            candle_transformers::models::quantized_llama::ModelWeights::from_gguf(content, &mut f, &Device::Cpu)
                .unwrap_or_else(|e| panic!("{name}: reference: {e}"));
        let input = Tensor::new(&PROMPT, &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        let expected: Vec<f32> = reference.forward(&input, 0).unwrap().squeeze(0).unwrap().to_vec1().unwrap();

        let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
        let loaded = model.facts(DType::F32);
        let predicted = file_facts(&path, DType::F32, Kernels::Fast).unwrap().facts;
        assert_eq!(predicted.mapped_bytes, loaded.mapped_bytes, "{name}: mapped weights");
        // The header also counts vectors the model does not keep (e.g. rope factors).
        assert!(
            predicted.weights_bytes >= loaded.weights_bytes
                && predicted.weights_bytes - loaded.weights_bytes < 64 * 1024,
            "{name}: heap weights predicted {} B, held {} B",
            predicted.weights_bytes,
            loaded.weights_bytes
        );
        if matches!(dtype, GgmlDType::Q4_1 | GgmlDType::Q8_0 | GgmlDType::F16 | GgmlDType::F32) {
            assert!(model.config.copied_matrices.is_empty(), "{name}: copied {:?}", model.config.copied_matrices);
            assert!(
                loaded.weights_bytes < report.bytes / 50,
                "{name}: {} B of weights on the heap",
                loaded.weights_bytes
            );
        }
        let mut state = model.make_state(64, DType::F32);
        let ours: Vec<f32> = model.forward(&PROMPT, &mut state).unwrap().to_vec1().unwrap();

        let argmax = |l: &[f32]| l.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
        let dot: f64 = ours.iter().zip(&expected).map(|(a, b)| *a as f64 * *b as f64).sum();
        let norm = |l: &[f32]| l.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
        let cosine = dot / (norm(&ours) * norm(&expected));
        eprintln!(
            "{name:6} {:>11} {:>11} {:>11} {cosine:>9.6} {:>7}  {mix:?}",
            report.bytes,
            loaded.weights_bytes,
            loaded.mapped_bytes,
            if argmax(&ours) == argmax(&expected) { "same" } else { "DIFFERS" }
        );
        // The 2- and 3-bit files of a 135M model are too degraded (perplexity 222 and 56
        // on README.md, against 40 for the 4-bit source) for their logits to be stable:
        // float rounding differences between two correct engines move them, and which
        // one moves depends on the rounding (with candle's Q4_0 kernel for their 181 Q4_0
        // tensors Q3_K agreed to 0.9933 and Q2_K to 1.0000; with ours, Q3_K to 0.9990 and
        // Q2_K to 0.9873). They must load and agree roughly; every other type must agree
        // closely and pick the same next token.
        if matches!(dtype, GgmlDType::Q2K | GgmlDType::Q3K) {
            assert!(cosine > 0.98, "{name}: cosine similarity of the logits {cosine}");
        } else {
            assert_eq!(argmax(&ours), argmax(&expected), "{name}: greedy next token");
            assert!(cosine > 0.998, "{name}: cosine similarity of the logits {cosine}");
        }
        if matches!(dtype, GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K | GgmlDType::Q2K | GgmlDType::Q3K) {
            assert!(mix.len() >= 2, "{name}: rows of 576 fall back to another type: {mix:?}");
        }
    }
}
