//! Memory accounting: what the KV cache costs per token, what the whole app is
//! predicted to need at full budget, and how far this turn's budget may go given the
//! live headroom the OS reports.
//!
//! All functions are pure so the engine can show the figures in `Stats` and the tests
//! can check them without a model.

use super::MIB;

/// Memory the process needs besides weights, KV cache and a prefill's activations: the
/// binary and libraries, the tokenizer, thread stacks, allocator slack. Measured with
/// `pocketchat chat --stats` on SmolLM2-135M and Gemma 3 270M (2026-12-02, every kernel
/// path, prompts cut to budgets of 2,912–8,192 tokens): the peak RSS was at most 85 MB
/// above what the other terms count (candle's kernels, whose freed score matrices glibc
/// keeps as fragments); about 50 MB more is kept for what differs between machines
/// (a0cca04 peaked 50 MB higher on an AVX2 machine than here) and for a UI beside the
/// engine.
pub const RUNTIME_OVERHEAD_BYTES: u64 = 128 * MIB;

/// Headroom kept free when sizing a turn from live headroom, so that the allocation
/// spikes of a forward pass do not cross the OS limit.
pub const HEADROOM_SAFETY_BYTES: u64 = 64 * MIB;

/// No budget goes below this, however tight memory is: a context that cannot hold a
/// short prompt and reply is not a chat.
pub const MIN_TOKEN_BUDGET: usize = 128;

/// Bytes of KV cache per token: a K and a V vector of `n_kv_heads × head_dim` values in
/// every layer.
///
/// ```text
/// 2 (K, V) · n_layers · n_kv_heads · head_dim · dtype_bytes
/// SmolLM2-135M: 2 · 30 · 3 · 64 · 4 = 46,080 B (f32), 23,040 B (f16)
/// ```
pub fn kv_bytes_per_token(n_layers: usize, n_kv_heads: usize, head_dim: usize, dtype_bytes: usize) -> u64 {
    2u64.saturating_mul(n_layers as u64)
        .saturating_mul(n_kv_heads as u64)
        .saturating_mul(head_dim as u64)
        .saturating_mul(dtype_bytes as u64)
}

/// Predicted process footprint at a full context: weights + KV for `budget` tokens + the
/// largest prefill's activations ([`prefill_scratch_bytes`]) + [`RUNTIME_OVERHEAD_BYTES`].
/// An upper bound of the peak RSS (`tests/footprint.rs` checks it).
pub fn predicted_footprint(weights_bytes: u64, kv_bytes_per_token: u64, budget: usize, scratch_bytes: u64) -> u64 {
    weights_bytes
        .saturating_add(kv_bytes_per_token.saturating_mul(budget as u64))
        .saturating_add(scratch_bytes)
        .saturating_add(RUNTIME_OVERHEAD_BYTES)
}

/// How a prefill chunk's attention runs, which decides its largest buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillAttention {
    /// pocketchat's fused kernel (`engine::cpu::attention`), sliding-window layers
    /// included: no score matrix is built, but a layer's cached keys, and values of an
    /// f16 or q8_0 cache, are laid out as f32 once per layer (`window` does not change
    /// that: the global layers hold every position).
    Fused { window: Option<usize> },
    /// candle's ops on every layer (`--kernel candle`, Metal, head sizes the fused
    /// kernel does not take): score matrices over the whole context. With sliding-window
    /// layers, their mask (over the window and the chunk) is alive beside the global one.
    Materialized { window: Option<usize> },
}

/// What a prefill's activations depend on: the model's attention and layer widths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Hidden width and FFN width.
    pub width: usize,
    pub ffn: usize,
    pub attention: PrefillAttention,
}

/// Activations of one prefill chunk of `chunk` tokens at a full context of `budget`, in
/// f32: one layer's per-token rows (the residual, norms, q/k/v, attention output: ~8
/// rows of the wider of `width` and `heads · head_dim`; gate, up and their product: ~4
/// rows of `ffn`), plus the cached K and V as f32 over the `budget`, and, where candle's
/// ops compute the attention, two score matrices alive at once and the additive mask of
/// the query rows of one K/V head (`group = heads / kv_heads`):
///
/// ```text
/// chunk · (8 · max(width, heads · head_dim) + 4 · ffn) · 4 B
///   + 2 · kv_heads · budget · head_dim · 4 B
///   + (2 · heads · chunk · budget + group · chunk · budget) · 4 B (Materialized)
///   + group · chunk · (window + chunk) · 4 B (Materialized with a window: its own mask)
/// Gemma 3 270M, 256-token chunks, 8,192 tokens: 16.8 + 16.8 (Fused)
///   + 67.1 + 33.6 (Materialized) = 134.2 MB
/// ```
///
/// Linear in `budget`, so the fit check can take a fixed part and a per-token part.
pub fn prefill_scratch_bytes(chunk: usize, shape: &PrefillShape, budget: usize) -> u64 {
    let (chunk, budget) = (chunk as u64, budget as u64);
    let (heads, kv_heads, head_dim) = (shape.heads as u64, shape.kv_heads.max(1) as u64, shape.head_dim as u64);
    let row = (shape.width as u64).max(heads.saturating_mul(head_dim));
    let activations =
        chunk.saturating_mul(8u64.saturating_mul(row).saturating_add(4u64.saturating_mul(shape.ffn as u64)));
    let group = (heads / kv_heads).max(1);
    let kv_f32 = 2u64.saturating_mul(kv_heads).saturating_mul(head_dim);
    let per_position = match shape.attention {
        PrefillAttention::Fused { .. } => kv_f32,
        PrefillAttention::Materialized { .. } => {
            2u64.saturating_mul(heads).saturating_add(group).saturating_mul(chunk).saturating_add(kv_f32)
        }
    };
    let window_mask = match shape.attention {
        PrefillAttention::Materialized { window: Some(w) } => {
            group.saturating_mul(chunk).saturating_mul((w as u64).saturating_add(chunk))
        }
        _ => 0,
    };
    activations.saturating_add(budget.saturating_mul(per_position)).saturating_add(window_mask).saturating_mul(4)
}

/// The token budget for this turn: the tier's budget, lowered when the live headroom
/// (less [`HEADROOM_SAFETY_BYTES`]) cannot hold that many more tokens of KV cache.
///
/// `current_capacity_tokens` is how many tokens the cache already holds memory for;
/// those are paid for, so only growth beyond them has to fit in the headroom:
///
/// ```text
/// budget = min(tier_budget, capacity + (headroom − 64 MiB) / kv_bytes_per_token)
///          but never below MIN_TOKEN_BUDGET (128)
/// ```
///
/// Returns the budget and, when it is below the tier's, a sentence saying why, for the
/// UI notice and the log. Unknown headroom (`None`, as on macOS) keeps the tier budget.
pub fn budget_for_headroom(
    tier_budget: usize,
    current_capacity_tokens: usize,
    kv_bytes_per_token: u64,
    headroom_bytes: Option<u64>,
) -> (usize, Option<String>) {
    let Some(headroom) = headroom_bytes else {
        return (tier_budget, None);
    };
    if kv_bytes_per_token == 0 {
        return (tier_budget, None);
    }
    let usable = headroom.saturating_sub(HEADROOM_SAFETY_BYTES);
    let more_tokens = usize::try_from(usable / kv_bytes_per_token).unwrap_or(usize::MAX);
    let fits = current_capacity_tokens.saturating_add(more_tokens);
    if fits >= tier_budget {
        return (tier_budget, None);
    }
    let budget = fits.max(MIN_TOKEN_BUDGET);
    if budget >= tier_budget {
        // The tier's own budget is below the floor; nothing was lowered.
        return (tier_budget, None);
    }
    let why = format!(
        "only {} MiB of memory is free, so this turn's context is limited to {budget} tokens \
         (instead of {tier_budget})",
        headroom / MIB
    );
    (budget, Some(why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::GIB;

    #[test]
    fn smollm2_kv_per_token() {
        assert_eq!(kv_bytes_per_token(30, 3, 64, 4), 46_080);
        assert_eq!(kv_bytes_per_token(30, 3, 64, 2), 23_040);
    }

    #[test]
    fn kv_per_token_saturates_instead_of_overflowing() {
        assert_eq!(kv_bytes_per_token(usize::MAX, usize::MAX, 2, 2), u64::MAX);
    }

    #[test]
    fn footprint_adds_weights_kv_and_overhead() {
        // 94 MiB of Q4_1 weights, f32 KV at the 6 GB class budget of 1,024 tokens.
        let f = predicted_footprint(94 * MIB, 46_080, 1024, 7);
        assert_eq!(f, 94 * MIB + 46_080 * 1024 + 7 + RUNTIME_OVERHEAD_BYTES);
        assert_eq!(predicted_footprint(u64::MAX, u64::MAX, usize::MAX, u64::MAX), u64::MAX);
    }

    /// SmolLM2-135M's shape: 9 heads and 3 K/V heads of 64, width 576, FFN 1,536.
    fn smollm2(attention: PrefillAttention) -> PrefillShape {
        PrefillShape { heads: 9, kv_heads: 3, head_dim: 64, width: 576, ffn: 1536, attention }
    }

    #[test]
    fn the_fused_kernel_needs_no_score_matrix_only_the_cache_as_f32() {
        let activations = 256 * (8 * 576 + 4 * 1536) * 4;
        let kv_f32 = 2 * 3 * 64 * 4;
        for window in [None, Some(512)] {
            let fused = smollm2(PrefillAttention::Fused { window });
            assert_eq!(prefill_scratch_bytes(256, &fused, 4096), activations + 4096 * kv_f32);
            assert_eq!(prefill_scratch_bytes(256, &fused, 0), activations);
        }
    }

    #[test]
    fn candle_attention_holds_two_score_matrices_the_mask_and_f32_kv() {
        let candle = smollm2(PrefillAttention::Materialized { window: None });
        let activations = 256 * (8 * 576 + 4 * 1536) * 4;
        let per_position = (2 * 9 * 256 + 3 * 256 + 2 * 3 * 64) * 4;
        assert_eq!(prefill_scratch_bytes(256, &candle, 4096), activations + 4096 * per_position);
    }

    #[test]
    fn gemma3_heads_wider_than_the_model_count_in_the_rows() {
        // Gemma 3 270M: 4 heads and 1 K/V head of 256, width 640, FFN 2,048.
        let gemma = PrefillShape {
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            width: 640,
            ffn: 2048,
            attention: PrefillAttention::Materialized { window: None },
        };
        let expected = 256 * (8 * 1024 + 4 * 2048) * 4 + 8192 * (2 * 4 * 256 + 4 * 256 + 2 * 256) * 4;
        assert_eq!(prefill_scratch_bytes(256, &gemma, 8192), expected);
        // Its sliding-window layers' mask (window 512) is alive beside the global one.
        let windowed = PrefillShape { attention: PrefillAttention::Materialized { window: Some(512) }, ..gemma };
        assert_eq!(prefill_scratch_bytes(256, &windowed, 8192), expected + 4 * 256 * (512 + 256) * 4);
    }

    #[test]
    fn prefill_scratch_saturates_instead_of_overflowing() {
        let huge = PrefillShape { heads: usize::MAX, ..smollm2(PrefillAttention::Materialized { window: Some(512) }) };
        assert_eq!(prefill_scratch_bytes(usize::MAX, &huge, usize::MAX), u64::MAX);
    }

    #[test]
    fn unknown_headroom_keeps_tier_budget() {
        assert_eq!(budget_for_headroom(2048, 0, 46_080, None), (2048, None));
    }

    #[test]
    fn ample_headroom_keeps_tier_budget() {
        assert_eq!(budget_for_headroom(2048, 100, 46_080, Some(GIB)), (2048, None));
    }

    #[test]
    fn tight_headroom_lowers_budget_and_says_why() {
        // 64 MiB safety + room for exactly 300 more f32 tokens.
        let headroom = HEADROOM_SAFETY_BYTES + 300 * 46_080;
        let (budget, why) = budget_for_headroom(2048, 200, 46_080, Some(headroom));
        assert_eq!(budget, 500);
        let why = why.expect("a lowered budget is explained");
        assert!(why.contains("500 tokens"), "{why}");
        assert!(why.contains("2048"), "{why}");
    }

    #[test]
    fn no_headroom_floors_at_minimum() {
        let (budget, why) = budget_for_headroom(1024, 0, 46_080, Some(0));
        assert_eq!(budget, MIN_TOKEN_BUDGET);
        assert!(why.is_some());
    }

    #[test]
    fn capacity_already_paid_for_counts() {
        // No headroom beyond safety, but the cache already holds 900 tokens.
        let (budget, _) = budget_for_headroom(1024, 900, 46_080, Some(HEADROOM_SAFETY_BYTES));
        assert_eq!(budget, 900);
    }

    #[test]
    fn tier_budget_below_floor_is_not_reported_as_lowered() {
        assert_eq!(budget_for_headroom(64, 0, 46_080, Some(0)), (64, None));
    }

    #[test]
    fn zero_bytes_per_token_is_not_a_division_by_zero() {
        assert_eq!(budget_for_headroom(1024, 0, 0, Some(0)), (1024, None));
    }
}
