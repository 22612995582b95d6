//! Perplexity computed exactly as llama.cpp's `llama-perplexity` does, so the two engines'
//! figures compare (and a kernel that is wrong shows up as a higher number):
//!
//! - the text is tokenized once, with BOS first when the model adds one;
//! - it is cut into chunks of `ctx` tokens (what is left over is not used; at least two
//!   chunks' worth of tokens is required, as llama.cpp requires);
//! - each chunk runs on a fresh cache, its first token replaced by BOS when the model adds
//!   one;
//! - the negative log-likelihood of each token is summed over the second half of each
//!   chunk only (`first = ctx / 2`; the logits at positions `first .. ctx - 1` predict the
//!   tokens after them), so every scored token has at least `ctx / 2` tokens of context.
//!
//! `ppl = exp(total NLL / tokens scored)`.

use candle_core::{DType, D};

use super::model::{Model, PREFILL_CHUNK};
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
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Perplexity of `tokens` (already tokenized, BOS first when `bos` is set) in chunks of
/// `ctx`, at most `max_chunks` of them. `on_chunk(done, ppl so far)` follows the progress.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    ctx: usize,
    max_chunks: Option<usize>,
    bos: Option<u32>,
    kv: DType,
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
    fn the_nll_of_a_row_is_its_log_softmax() {
        let logits = Tensor::new(&[[0.0f32, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0]], &Device::Cpu).unwrap();
        let nll = chunk_nll(&logits, &[2, 0]).unwrap();
        let expected = 4f64.ln() + (1.0 + 3.0 * (-10f64).exp()).ln();
        assert!((nll - expected).abs() < 1e-9, "{nll} vs {expected}");
        assert!(chunk_nll(&logits, &[9, 0]).is_err(), "a target outside the vocabulary is an error");
    }
}
