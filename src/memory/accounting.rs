//! Memory accounting: what the KV cache costs per token, what the whole app is
//! predicted to need at full budget, and how far this turn's budget may go given the
//! live headroom the OS reports.
//!
//! All functions are pure so the engine can show the figures in `Stats` and the tests
//! can check them without a model.

use super::MIB;

/// Memory the process needs besides weights and KV cache: allocator slack, tokenizer,
/// activations for one step, thread stacks, the UI. Measured on SmolLM2-135M on CPU.
pub const RUNTIME_OVERHEAD_BYTES: u64 = 48 * MIB;

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

/// Activations of one prefill chunk of `chunk` tokens at a full context of `budget`:
/// its f32 attention scores against every cached position, and one layer's per-token
/// activations (the residual, norms, q/k/v, attention output: ~8 rows of `width`; gate,
/// up and their product: ~4 rows of `ffn`).
///
/// ```text
/// chunk · (n_heads · budget + 8 · width + 4 · ffn) · 4 B
/// SmolLM2-135M, 256-token chunks, 4,096 tokens: 256 · (36,864 + 4,608 + 6,144) · 4 = 48.8 MB
/// ```
pub fn prefill_scratch_bytes(chunk: usize, n_heads: usize, width: usize, ffn: usize, budget: usize) -> u64 {
    let per_token = (n_heads as u64)
        .saturating_mul(budget as u64)
        .saturating_add(8u64.saturating_mul(width as u64))
        .saturating_add(4u64.saturating_mul(ffn as u64));
    (chunk as u64).saturating_mul(per_token).saturating_mul(4)
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
        assert_eq!(f, 94 * MIB + 46_080 * 1024 + 7 + 48 * MIB);
        assert_eq!(predicted_footprint(u64::MAX, u64::MAX, usize::MAX, u64::MAX), u64::MAX);
    }

    #[test]
    fn prefill_scratch_grows_with_the_chunk_and_the_context() {
        assert_eq!(prefill_scratch_bytes(256, 9, 576, 1536, 4096), 256 * (9 * 4096 + 8 * 576 + 4 * 1536) * 4);
        assert_eq!(prefill_scratch_bytes(usize::MAX, usize::MAX, 1, 1, usize::MAX), u64::MAX);
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
