//! Perplexity computed exactly as llama.cpp's `llama-perplexity` does, so the two engines'
//! figures compare (and a kernel that is wrong shows up as a higher number):
//!
//! - the text is tokenized once, with BOS first when the model adds one (with a chunk
//!   limit, only the prefix those chunks need: [`text_tokens`]);
//! - it is cut into chunks of `ctx` tokens (what is left over is not used; at least two
//!   chunks' worth of tokens is required, as llama.cpp requires);
//! - each chunk runs on a fresh cache, its first token replaced by BOS when the model adds
//!   one;
//! - the negative log-likelihood of each token is summed over the second half of each
//!   chunk only (`first = ctx / 2`; the logits at positions `first .. ctx - 1` predict the
//!   tokens after them), so every scored token has at least `ctx / 2` tokens of context.
//!
//! `ppl = exp(total NLL / tokens scored)`.

use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::{DType, D};

use super::model::{Model, PREFILL_CHUNK};
use super::text::tokenizer::TextTokenizer;
use super::EngineError;

/// The result, as `pocketchat perplexity --json` prints it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PerplexityReport {
    pub ppl: f64,
    pub tokens_scored: usize,
    pub chunks: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    #[error("the text has {tokens} tokens; perplexity at --ctx {ctx} needs at least {needed} (two chunks)")]
    TooShort { tokens: usize, ctx: usize, needed: usize },
    #[error("--ctx {ctx} is outside 16..={max} (the model's context)")]
    BadContext { ctx: usize, max: usize },
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The tokens [`perplexity`] scores in the text file at `path` (invalid UTF-8 replaced):
/// BOS first when the model adds one, then the text's tokens.
///
/// With `max_chunks`, only the first `max(max_chunks, 2) × ctx` tokens are needed, and
/// only a prefix of the file is read and tokenized: one that grows (doubling) until two
/// cuts of it, at different places, agree on those tokens — so they are the tokens the
/// whole file gives (a cut changes only the tokens next to it). Memory then follows the
/// chunks asked for, not the file's size. Without it, the whole file is tokenized.
pub fn text_tokens(
    path: &Path,
    tokenizer: &TextTokenizer,
    ctx: usize,
    max_chunks: Option<usize>,
) -> Result<Vec<u32>, PerplexityError> {
    let read_error = |source| PerplexityError::Read { path: path.to_path_buf(), source };
    let bos = tokenizer.added_bos();
    let with_bos = |ids: Vec<u32>| -> Vec<u32> { bos.into_iter().chain(ids).collect() };
    let encode = |bytes: &[u8]| tokenizer.encode_text(&String::from_utf8_lossy(bytes));
    let mut file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    let Some(needed) = max_chunks.map(|c| c.max(2).saturating_mul(ctx)) else {
        file.read_to_end(&mut bytes).map_err(read_error)?;
        return Ok(with_bos(encode(&bytes)?));
    };
    let needed = needed.saturating_sub(bos.is_some() as usize);
    // Text runs 3-5 bytes a token: twice that is usually enough at the first try.
    let mut want = needed.saturating_mul(8).max(1 << 16);
    loop {
        let more = want.saturating_sub(bytes.len()) as u64;
        let got = (&mut file).take(more).read_to_end(&mut bytes).map_err(read_error)?;
        if (got as u64) < more {
            // The whole file is here.
            return Ok(with_bos(encode(&bytes)?));
        }
        let long = encode(&bytes[..cut_before(&bytes, bytes.len())])?;
        if long.len() > needed {
            let short = encode(&bytes[..cut_before(&bytes, bytes.len() * 3 / 4)])?;
            let agree = long.iter().zip(&short).take_while(|(a, b)| a == b).count();
            if agree >= needed {
                return Ok(with_bos(long[..needed].to_vec()));
            }
        }
        want = want.saturating_mul(2);
    }
}

/// A place at or before `at` to cut `bytes` whose text before it reads the same as in the
/// whole (never inside a UTF-8 sequence): after the last newline, else before the last
/// byte that starts a character.
fn cut_before(bytes: &[u8], at: usize) -> usize {
    let head = &bytes[..at.min(bytes.len())];
    if let Some(i) = head.iter().rposition(|&b| b == b'\n') {
        if i + 1 >= head.len() / 2 {
            return i + 1;
        }
    }
    // 0b10xx_xxxx continues a character; anything else starts one.
    let at = at.min(bytes.len());
    (0..=at).rev().find(|&i| i == bytes.len() || bytes[i] & 0xC0 != 0x80).unwrap_or(0)
}

/// Perplexity of `tokens` (already tokenized, BOS first when `bos` is set) in chunks of
/// `ctx`, at most `max_chunks` of them. `on_chunk(done, ppl so far)` follows the progress.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    ctx: usize,
    max_chunks: Option<usize>,
    bos: Option<u32>,
    kv: impl Into<crate::engine::kv_type::KvDtype>,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<PerplexityReport, PerplexityError> {
    let max = model.max_positions();
    if !(16..=max).contains(&ctx) {
        return Err(PerplexityError::BadContext { ctx, max });
    }
    if tokens.len() < 2 * ctx {
        return Err(PerplexityError::TooShort { tokens: tokens.len(), ctx, needed: 2 * ctx });
    }
    let chunks = (tokens.len() / ctx).min(max_chunks.unwrap_or(usize::MAX)).max(1);
    let kv = kv.into();
    let first = ctx / 2;
    let (mut nll, mut scored) = (0.0f64, 0usize);
    for c in 0..chunks {
        let _span = tracing::info_span!("perplexity_chunk", chunk = c).entered();
        let mut chunk = tokens[c * ctx..(c + 1) * ctx].to_vec();
        if let Some(bos) = bos {
            chunk[0] = bos;
        }
        let mut state = model.make_state(ctx, kv);
        // The first half only builds the cache; its logits are not scored.
        model.forward(&chunk[..first], &mut state)?;
        let mut start = first;
        while start < ctx - 1 {
            let end = (start + PREFILL_CHUNK).min(ctx - 1);
            let logits = model.forward_all(&chunk[start..end], &mut state)?;
            nll += chunk_nll(&logits, &chunk[start + 1..=end])?;
            scored += end - start;
            start = end;
        }
        on_chunk(c + 1, (nll / scored as f64).exp());
    }
    Ok(PerplexityReport { ppl: (nll / scored as f64).exp(), tokens_scored: scored, chunks })
}

/// Sum over rows of `-log softmax(logits[row])[targets[row]]`, in f64.
fn chunk_nll(logits: &candle_core::Tensor, targets: &[u32]) -> Result<f64, EngineError> {
    let logits = logits.to_dtype(DType::F32)?;
    let max = logits.max_keepdim(D::Minus1)?;
    let rows: Vec<Vec<f32>> = logits.to_vec2()?;
    let max: Vec<f32> = max.flatten_all()?.to_vec1()?;
    let mut total = 0.0f64;
    for ((row, m), &target) in rows.iter().zip(max).zip(targets) {
        let m = m as f64;
        let sum: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
        let target = *row
            .get(target as usize)
            .ok_or_else(|| EngineError::Inference(super::Cause::msg(format!("token {target} is outside the logits"))))?
            as f64;
        total += m + sum.ln() - target;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn cuts_fall_after_a_newline_or_before_a_character() {
        let text = "one two\nthree\u{e9}\u{e9}".as_bytes();
        assert_eq!(cut_before(text, text.len()), 8, "after the newline");
        let no_newline = "abc\u{e9}\u{e9}".as_bytes();
        // "abc" then é (2 bytes) é (2 bytes): at 6 is the second é's second byte.
        assert_eq!(cut_before(no_newline, 6), 5);
        assert_eq!(cut_before(no_newline, 5), 5);
        assert_eq!(cut_before(no_newline, 4), 3);
        assert_eq!(cut_before(b"", 0), 0);
    }

    #[test]
    fn the_nll_of_a_row_is_its_log_softmax() {
        let logits = Tensor::new(&[[0.0f32, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0]], &Device::Cpu).unwrap();
        let nll = chunk_nll(&logits, &[2, 0]).unwrap();
        let expected = 4f64.ln() + (1.0 + 3.0 * (-10f64).exp()).ln();
        assert!((nll - expected).abs() < 1e-9, "{nll} vs {expected}");
        assert!(chunk_nll(&logits, &[9, 0]).is_err(), "a target outside the vocabulary is an error");
    }
}
