//! Requantizing a GGUF with candle, for `pocketchat quantize` only: a 4-bit file to Q8_0
//! ([`quantize_q8_0`]), and to any type the engine reads, to test each kernel on one
//! model ([`quantize_to`]). Nothing runs it on its own, and the memory policy never
//! loads its output in place of the file it was made from.
//!
//! The 8-bit file cannot hold more information than the 4-bit one it is made from: each
//! Q4_0/Q4_1 weight matrix is dequantized and quantized again to Q8_0, which represents
//! the 4-bit values almost exactly. What changes is the kernel that runs (candle's SIMD
//! Q8_0 dot product instead of the scalar Q4_1 one) and the memory it takes. The file
//! says so: `general.quantized_from` names the source quantization and
//! `pocketchat.requantized` is true.
//!
//! ```text
//!   tensor                    in (Q4_1 file)   out
//!   blk.N.attn_q.weight  2-D  Q4_1        ──▶  Q8_0   (dequantize → quantize)
//!   token_embd.weight    2-D  Q8_0        ──▶  Q8_0   (copied; requantized if 4/5-bit or float)
//!   blk.N.attn_norm      1-D  F32         ──▶  F32    (copied)
//! ```

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use super::{CatalogError, PartFile};

/// GGUF `general.file_type` for "mostly Q8_0" (llama.cpp's `LLAMA_FTYPE_MOSTLY_Q8_0`).
const FILE_TYPE_MOSTLY_Q8_0: u32 = 7;
/// candle's `gguf_file::write` aligns tensor data to 32 bytes.
const WRITE_ALIGNMENT: u32 = 32;

/// What [`quantize_q8_0`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantizeReport {
    /// The file written.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Tensors requantized to Q8_0.
    pub requantized: usize,
    /// Tensors copied unchanged.
    pub copied: usize,
    /// The quantization most requantized tensors had, e.g. `Q4_1`.
    pub quantized_from: String,
}

/// Writes `dst`, an 8-bit copy of the GGUF `src`: 2-D Q4_0/Q4_1 weight matrices (and the
/// token embedding, unless it is already 8-bit or better-than-4-bit quantized) become
/// Q8_0, everything else is copied, all metadata is kept and
/// `general.quantized_from` / `pocketchat.requantized` are added. `dst` appears only
/// when complete (written as a `.part` file, then renamed).
pub fn quantize_q8_0(src: &Path, dst: &Path) -> Result<QuantizeReport, CatalogError> {
    quantize(src, dst, GgmlDType::Q8_0, Replace::OursOnly)
}

/// Which existing file an output may replace. Never the source itself (the same file on
/// disk, also through a link) nor anything that is not a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// Only a GGUF this program wrote (`pocketchat.requantized`).
    OursOnly,
    /// Any regular file (`pocketchat quantize --force`).
    AnyFile,
}

/// [`quantize_q8_0`] when `target` is Q8_0, else [`quantize_to`]; `replace` says which
/// existing `dst` may be replaced.
pub fn quantize(src: &Path, dst: &Path, target: GgmlDType, replace: Replace) -> Result<QuantizeReport, CatalogError> {
    if target == GgmlDType::Q8_0 {
        rewrite(src, dst, target, replace, &|name, dtype, dims| {
            should_requantize(name, dtype, dims).then_some(GgmlDType::Q8_0)
        })
    } else {
        rewrite(src, dst, target, replace, &move |_, dtype, dims| {
            let [_, cols] = dims else { return None };
            let fits = |t: GgmlDType| cols.is_multiple_of(t.block_size());
            let pick = [target, fallback(target)].into_iter().find(|t| fits(*t))?;
            (pick != dtype).then_some(pick)
        })
    }
}

/// Ok when `dst` may be written: it is not `src` (same device and inode: also a hard or
/// symbolic link to it), its folder exists (none is made), and it is absent or a
/// regular file that `replace` allows replacing.
fn check_output(src: &Path, dst: &Path, replace: Replace) -> Result<(), CatalogError> {
    let refuse = |why: String| CatalogError::WontReplace { path: dst.to_path_buf(), why };
    let src_meta = std::fs::metadata(src).map_err(CatalogError::io("cannot open", src))?;
    match std::fs::metadata(dst) {
        Ok(meta) => {
            if same_file(&src_meta, &meta) {
                return Err(refuse(format!("it is the source file {} itself; give another --out", src.display())));
            }
            if !meta.is_file() {
                return Err(refuse(format!("it is {}, not a regular file", crate::files::kind_of(&meta))));
            }
            if replace == Replace::OursOnly && !is_our_gguf(dst) {
                return Err(refuse(
                    "it exists and is not a GGUF file pocketchat wrote; pass --force to replace it".into(),
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = match dst.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => Ok(()),
                Ok(m) => Err(refuse(format!("{} is {}, not a folder", dir.display(), crate::files::kind_of(&m)))),
                Err(_) => Err(refuse(format!("the folder {} does not exist (no folder is made)", dir.display()))),
            }
        }
        Err(e) => Err(CatalogError::io("cannot look at", dst)(e)),
    }
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

#[cfg(not(unix))]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    a.len() == b.len() && a.modified().ok() == b.modified().ok() && a.created().ok() == b.created().ok()
}

/// Whether `path` is a GGUF whose header says this program wrote it.
fn is_our_gguf(path: &Path) -> bool {
    let Ok(file) = crate::files::open_regular(path) else { return false };
    let Ok(content) = crate::gguf::read(&mut BufReader::new(file)) else { return false };
    content.metadata.get("pocketchat.requantized").and_then(|v| v.to_bool().ok()).unwrap_or(false)
}

/// The quantization types [`quantize_to`] writes, by llama.cpp's names.
pub const QUANT_TYPES: &[(&str, GgmlDType)] = &[
    ("F32", GgmlDType::F32),
    ("F16", GgmlDType::F16),
    ("BF16", GgmlDType::BF16),
    ("Q4_0", GgmlDType::Q4_0),
    ("Q4_1", GgmlDType::Q4_1),
    ("Q5_0", GgmlDType::Q5_0),
    ("Q5_1", GgmlDType::Q5_1),
    ("Q8_0", GgmlDType::Q8_0),
    ("Q2_K", GgmlDType::Q2K),
    ("Q3_K", GgmlDType::Q3K),
    ("Q4_K", GgmlDType::Q4K),
    ("Q5_K", GgmlDType::Q5K),
    ("Q6_K", GgmlDType::Q6K),
];

/// Writes `dst`, a copy of `src` with every 2-D tensor (weight matrices and the token
/// embedding) in `target`. A tensor whose rows are not a whole number of `target`'s
/// blocks (K-quants have blocks of 256; SmolLM2-135M's rows of 576 are not) takes the
/// type llama.cpp's quantizer falls back to — Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for
/// Q6_K, and Q4_0 for Q2_K/Q3_K (llama.cpp's IQ4_NL is not supported) — so the file is a
/// mix, as llama.cpp's own are. 1-D tensors are copied. For testing every kernel on one
/// model; the values can only lose precision against the source.
pub fn quantize_to(src: &Path, dst: &Path, target: GgmlDType) -> Result<QuantizeReport, CatalogError> {
    if target == GgmlDType::Q8_0 {
        // `quantize` reads Q8_0 as the 8-bit variant; this is every 2-D tensor in Q8_0.
        return rewrite(src, dst, target, Replace::OursOnly, &|_, dtype, dims| {
            (dims.len() == 2 && dtype != GgmlDType::Q8_0 && dims[1].is_multiple_of(GgmlDType::Q8_0.block_size()))
                .then_some(GgmlDType::Q8_0)
        });
    }
    quantize(src, dst, target, Replace::OursOnly)
}

/// What llama.cpp's quantizer writes when a tensor's rows do not fit a type's blocks.
fn fallback(target: GgmlDType) -> GgmlDType {
    match target {
        GgmlDType::Q2K | GgmlDType::Q3K => GgmlDType::Q4_0,
        GgmlDType::Q4K => GgmlDType::Q5_0,
        GgmlDType::Q5K => GgmlDType::Q5_1,
        GgmlDType::Q6K => GgmlDType::Q8_0,
        other => other,
    }
}

/// GGUF `general.file_type` (llama.cpp's `llama_ftype`) of a file mostly in `t`: the
/// pure ("_S") variant for K-quants.
fn file_type(t: GgmlDType) -> u32 {
    match t {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q8_0 => FILE_TYPE_MOSTLY_Q8_0,
        GgmlDType::Q5_0 => 8,
        GgmlDType::Q5_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 14,
        GgmlDType::Q5K => 16,
        GgmlDType::Q6K => 18,
        GgmlDType::BF16 => 32,
        _ => 0,
    }
}

/// The type a tensor (name, type, dims) is converted to; `None` copies it.
type TensorPlan = dyn Fn(&str, GgmlDType, &[usize]) -> Option<GgmlDType>;

/// Copies `src` to `dst`, converting each tensor to the type `plan(name, dtype, dims)`
/// names (`None`: copied as is). Fails when nothing changes, and when `dst` may not be
/// written ([`check_output`], checked before the work and again before the rename).
fn rewrite(
    src: &Path,
    dst: &Path,
    target: GgmlDType,
    replace: Replace,
    plan: &TensorPlan,
) -> Result<QuantizeReport, CatalogError> {
    let bad = |e: &dyn std::fmt::Display| CatalogError::BadGguf { path: src.to_path_buf(), message: e.to_string() };
    let file = crate::files::open_regular(src).map_err(CatalogError::io("cannot open", src))?;
    check_output(src, dst, replace)?;
    let mut reader = BufReader::new(file);
    let content = crate::gguf::read(&mut reader).map_err(|e| bad(&e))?;

    // Keep the source file's tensor order.
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort_by_key(|n| (content.tensor_infos[*n].offset, n.as_str()));

    let mut tensors: Vec<(&str, QTensor)> = Vec::with_capacity(names.len());
    let mut from_counts: BTreeMap<String, usize> = BTreeMap::new();
    for name in names {
        let qt = content.tensor(&mut reader, name, &Device::Cpu).map_err(|e| bad(&format!("tensor {name}: {e}")))?;
        let out = match plan(name, qt.dtype(), qt.shape().dims()) {
            Some(to) => {
                *from_counts.entry(dtype_name(qt.dtype())).or_default() += 1;
                requantize(&qt, to).map_err(|e| CatalogError::Quantize {
                    path: src.to_path_buf(),
                    message: format!("tensor {name}: {e}"),
                })?
            }
            None => qt,
        };
        tensors.push((name.as_str(), out));
    }
    let requantized = from_counts.values().sum::<usize>();
    let Some(quantized_from) = from_counts.iter().max_by_key(|(_, n)| **n).map(|(k, _)| k.clone()) else {
        let mut found: BTreeMap<String, usize> = BTreeMap::new();
        for (_, t) in &tensors {
            *found.entry(dtype_name(t.dtype())).or_default() += 1;
        }
        let found = found.iter().map(|(k, n)| format!("{n} × {k}")).collect::<Vec<_>>().join(", ");
        return Err(CatalogError::NothingToRequantize { path: src.to_path_buf(), found });
    };

    let metadata = output_metadata(&content.metadata, file_type(target), &quantized_from);
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();

    let part = PartFile::beside(dst);
    let file = File::create_new(part.path()).map_err(CatalogError::io("cannot create", part.path()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    gguf_file::write(&mut w, &meta_refs, &tensor_refs).map_err(|e| CatalogError::Quantize {
        path: src.to_path_buf(),
        message: format!("writing {}: {e}", part.path().display()),
    })?;
    let file = w.into_inner().map_err(|e| CatalogError::io("cannot write", part.path())(e.into_error()))?;
    file.sync_all().map_err(CatalogError::io("cannot write", part.path()))?;
    let bytes = file.metadata().map_err(CatalogError::io("cannot read", part.path()))?.len();
    drop(file);
    // What is at `dst` may have changed during the work.
    check_output(src, dst, replace)?;
    let path = part.commit()?;
    tracing::info!(src = %src.display(), dst = %path.display(), requantized, bytes, to = ?target, "requantized");
    Ok(QuantizeReport { path, bytes, requantized, copied: tensors.len() - requantized, quantized_from })
}

/// Whether a tensor becomes Q8_0: 2-D weight matrices stored in 4 or 5 bits, and the
/// token embedding when it is 4/5-bit or float. K-quants, Q8 and 1-D tensors stay.
fn should_requantize(name: &str, dtype: GgmlDType, dims: &[usize]) -> bool {
    let matrix = dims.len() == 2 && dims[1].is_multiple_of(GgmlDType::Q8_0.block_size());
    let low_bit = matches!(dtype, GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1);
    let float = matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
    matrix && (low_bit || (name == "token_embd.weight" && float))
}

fn requantize(qt: &QTensor, to: GgmlDType) -> candle_core::Result<QTensor> {
    let t = qt.dequantize(&Device::Cpu)?;
    QTensor::quantize(&t, to)
}

/// The source metadata, sorted by key (so the output is reproducible), with the file
/// type, alignment and provenance keys set for the requantized file.
fn output_metadata(
    src: &std::collections::HashMap<String, Value>,
    file_type: u32,
    quantized_from: &str,
) -> BTreeMap<String, Value> {
    let mut m: BTreeMap<String, Value> = src.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    m.insert("general.file_type".into(), Value::U32(file_type));
    if m.contains_key("general.alignment") {
        m.insert("general.alignment".into(), Value::U32(WRITE_ALIGNMENT));
    }
    m.insert("general.quantized_from".into(), Value::String(quantized_from.to_string()));
    m.insert("pocketchat.requantized".into(), Value::Bool(true));
    m
}

/// `Q4_1`, `Q8_0`, `F32`, `Q6K`, … as llama.cpp spells them (candle's Debug form).
fn dtype_name(d: GgmlDType) -> String {
    format!("{d:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    /// Writes a tiny GGUF: two Q4_1 matrices, a Q4_0 one, an F32 token embedding and an
    /// F32 norm.
    fn tiny_q4_gguf(path: &Path) -> Vec<(&'static str, Vec<f32>)> {
        let dev = Device::Cpu;
        let ramp = |n: usize, scale: f32| -> Vec<f32> {
            (0..n).map(|i| ((i * 7919 % 101) as f32 / 50.0 - 1.0) * scale).collect()
        };
        let w1 = Tensor::from_vec(ramp(4 * 64, 0.5), (4, 64), &dev).unwrap();
        let w2 = Tensor::from_vec(ramp(2 * 32, 2.0), (2, 32), &dev).unwrap();
        let w3 = Tensor::from_vec(ramp(3 * 32, 0.03), (3, 32), &dev).unwrap();
        let emb = Tensor::from_vec(ramp(8 * 32, 0.1), (8, 32), &dev).unwrap();
        let norm = Tensor::from_vec(ramp(64, 1.0), 64, &dev).unwrap();
        let q1 = QTensor::quantize(&w1, GgmlDType::Q4_1).unwrap();
        let q2 = QTensor::quantize(&w2, GgmlDType::Q4_0).unwrap();
        let q3 = QTensor::quantize(&w3, GgmlDType::Q4_1).unwrap();
        let qe = QTensor::quantize(&emb, GgmlDType::F32).unwrap();
        let qn = QTensor::quantize(&norm, GgmlDType::F32).unwrap();
        let flat = |q: &QTensor| q.dequantize(&dev).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let expected = vec![
            ("blk.0.attn_q.weight", flat(&q1)),
            ("blk.0.attn_k.weight", flat(&q2)),
            ("blk.0.attn_v.weight", flat(&q3)),
            ("token_embd.weight", flat(&qe)),
            ("blk.0.attn_norm.weight", flat(&qn)),
        ];
        let arch = Value::String("llama".into());
        let ftype = Value::U32(3);
        let tokens = Value::Array(vec![Value::String("a".into()), Value::String("b".into())]);
        let mut f = File::create(path).unwrap();
        gguf_file::write(
            &mut f,
            &[("general.architecture", &arch), ("general.file_type", &ftype), ("tokenizer.ggml.tokens", &tokens)],
            &[
                ("token_embd.weight", &qe),
                ("blk.0.attn_norm.weight", &qn),
                ("blk.0.attn_q.weight", &q1),
                ("blk.0.attn_k.weight", &q2),
                ("blk.0.attn_v.weight", &q3),
            ],
        )
        .unwrap();
        expected
    }

    #[test]
    fn q4_tensors_become_close_q8_0_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("tiny.Q4_1.gguf");
        let expected = tiny_q4_gguf(&src);
        let dst = super::super::quant_sibling_path(&src, "Q8_0");
        let report = quantize_q8_0(&src, &dst).unwrap();
        assert_eq!(report.path, dst);
        assert_eq!((report.requantized, report.copied), (4, 1));
        assert_eq!(report.quantized_from, "Q4_1", "the dominant source quantization");
        assert_eq!(report.bytes, std::fs::metadata(&dst).unwrap().len());

        let mut r = BufReader::new(File::open(&dst).unwrap());
        let c = gguf_file::Content::read(&mut r).unwrap();
        let dt = |n: &str| c.tensor_infos[n].ggml_dtype;
        assert_eq!(dt("blk.0.attn_q.weight"), GgmlDType::Q8_0);
        assert_eq!(dt("blk.0.attn_k.weight"), GgmlDType::Q8_0);
        assert_eq!(dt("blk.0.attn_v.weight"), GgmlDType::Q8_0);
        assert_eq!(dt("token_embd.weight"), GgmlDType::Q8_0);
        assert_eq!(dt("blk.0.attn_norm.weight"), GgmlDType::F32);
        for (name, want) in &expected {
            let got = c.tensor(&mut r, name, &Device::Cpu).unwrap();
            assert_eq!(got.shape().elem_count(), want.len());
            let got = got.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            // Q8_0 step is max|x|/127 per block of 32; half a step of error at most.
            assert!(err <= max / 127.0, "{name}: max abs error {err} (max |x| {max})");
        }
        let meta = |k: &str| c.metadata.get(k).unwrap_or_else(|| panic!("missing {k}"));
        assert_eq!(meta("general.architecture").to_string().unwrap(), "llama");
        assert_eq!(meta("general.file_type").to_u32().unwrap(), FILE_TYPE_MOSTLY_Q8_0);
        assert_eq!(meta("general.quantized_from").to_string().unwrap(), "Q4_1");
        assert!(meta("pocketchat.requantized").to_bool().unwrap());
        assert_eq!(meta("tokenizer.ggml.tokens").to_vec().unwrap().len(), 2);

        // Only the source and the result are left: no .part files.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);

        // Requantizing the result again has nothing to do and writes nothing.
        let again = dir.path().join("again.gguf");
        let err = quantize_q8_0(&dst, &again).unwrap_err();
        assert!(matches!(err, CatalogError::NothingToRequantize { .. }), "{err:?}");
        assert!(err.to_string().contains("4 × Q8_0"), "{err}");
        assert!(!again.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = quantize_q8_0(&dir.path().join("missing.gguf"), &dir.path().join("o.gguf")).unwrap_err();
        assert!(matches!(err, CatalogError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains("missing.gguf"), "{err}");

        let junk = dir.path().join("junk.gguf");
        std::fs::write(&junk, b"this is not a gguf file at all").unwrap();
        let err = quantize_q8_0(&junk, &dir.path().join("o.gguf")).unwrap_err();
        assert!(matches!(err, CatalogError::BadGguf { .. }), "{err:?}");

        // A truncated file: the header reads, a tensor does not.
        let src = dir.path().join("t.gguf");
        tiny_q4_gguf(&src);
        let bytes = std::fs::read(&src).unwrap();
        std::fs::write(&src, &bytes[..bytes.len() - 100]).unwrap();
        let err = quantize_q8_0(&src, &dir.path().join("o.gguf")).unwrap_err();
        assert!(matches!(err, CatalogError::BadGguf { .. }), "{err:?}");
        assert!(!dir.path().join("o.gguf").exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "no .part left");
    }

    #[test]
    fn which_tensors_are_requantized() {
        use GgmlDType::*;
        assert!(should_requantize("blk.0.ffn_up.weight", Q4_1, &[1536, 576]));
        assert!(should_requantize("blk.0.ffn_up.weight", Q4_0, &[1536, 576]));
        assert!(!should_requantize("blk.0.ffn_up.weight", Q6K, &[1536, 576]));
        assert!(!should_requantize("blk.0.attn_norm.weight", F32, &[576]));
        assert!(!should_requantize("output.weight", F16, &[49152, 576]));
        assert!(should_requantize("token_embd.weight", F16, &[49152, 576]));
        assert!(!should_requantize("token_embd.weight", Q8_0, &[49152, 576]));
        assert!(!should_requantize("blk.0.x.weight", Q4_1, &[3, 40]), "rows not a multiple of 32");
    }

    /// On the real default model (when present): the Q8_0 copy has its known size, every
    /// Q4_1 matrix became Q8_0, and values stay within Q8_0 rounding.
    #[test]
    fn real_default_model_requantizes_to_its_known_size() {
        let entry = super::super::default_entry();
        let src = entry.path_in(&super::super::models_dir());
        assert!(src.is_file(), "{} is missing — run scripts/fetch-model.sh (scripts/test does)", src.display());
        let dir = tempfile::tempdir().unwrap();
        let dst = super::super::quant_sibling_path(&entry.path_in(dir.path()), "Q8_0");
        let report = quantize_q8_0(&src, &dst).unwrap();
        assert_eq!(report.quantized_from, "Q4_1");
        assert_eq!(report.requantized, 210);
        assert_eq!(report.bytes, 144_811_168);

        let mut a = BufReader::new(File::open(&src).unwrap());
        let mut b = BufReader::new(File::open(&dst).unwrap());
        let ca = gguf_file::Content::read(&mut a).unwrap();
        let cb = gguf_file::Content::read(&mut b).unwrap();
        assert_eq!(ca.tensor_infos.len(), cb.tensor_infos.len());
        for (name, info) in &ca.tensor_infos {
            let out = &cb.tensor_infos[name];
            assert_eq!(out.shape, info.shape, "{name}");
            let want = if info.ggml_dtype == GgmlDType::Q4_1 { GgmlDType::Q8_0 } else { info.ggml_dtype };
            assert_eq!(out.ggml_dtype, want, "{name}");
        }
        let name = "blk.0.attn_q.weight";
        let x = ca.tensor(&mut a, name, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
        let y = cb.tensor(&mut b, name, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
        let max = x.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        let err = (x - y).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(err <= max / 127.0, "{name}: {err} vs max {max}");
        assert_eq!(ca.metadata.len() + 2, cb.metadata.len());

        // Both files run in candle-transformers' reference llama and agree: same greedy
        // next token, nearly the same logits.
        let logits = |path: &Path| {
            use candle_transformers::models::quantized_llama::ModelWeights;
            let mut r = BufReader::new(File::open(path).unwrap());
            let c = gguf_file::Content::read(&mut r).unwrap();
            let mut m = ModelWeights::from_gguf(c, &mut r, &Device::Cpu).unwrap();
            let ids: Vec<u32> = (1..=16u32).map(|i| (i * 37) % (49_152 - 100) + 1).collect();
            let x = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
            m.forward(&x, 0).unwrap().squeeze(0).unwrap().to_vec1::<f32>().unwrap()
        };
        let (l4, l8) = (logits(&src), logits(&dst));
        let argmax = |l: &[f32]| l.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
        assert_eq!(argmax(&l4), argmax(&l8), "greedy next token");
        let dot: f32 = l4.iter().zip(&l8).map(|(a, b)| a * b).sum();
        let norm = |l: &[f32]| l.iter().map(|a| a * a).sum::<f32>().sqrt();
        let cos = dot / (norm(&l4) * norm(&l8));
        assert!(cos > 0.999, "cosine similarity of the logits {cos}");
    }
}
