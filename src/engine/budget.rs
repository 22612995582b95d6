//! The rolling token budget: a pure planner that decides, before each turn, which whole
//! oldest turns to drop so that context + new prompt + reply reserve fits. The pinned
//! system prompt is never dropped.
//!
//! ```text
//!   [ pinned | turn 1 | turn 2 | turn 3 ] + new prompt + reserve  ≤ budget ?
//!              ^^^^^^^^^^^^^^^ dropped oldest-first until it fits
//! ```

/// What must happen before the next prompt is fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Everything fits as it is.
    Fits,
    /// Drop the `turns` oldest turns (`tokens` in all).
    DropTurns { turns: usize, tokens: usize },
    /// Even with every turn dropped the prompt does not fit: drop all turns and cut the
    /// prompt to at most `keep_prompt_tokens` tokens.
    CutPrompt { turns: usize, tokens: usize, keep_prompt_tokens: usize },
}

/// Tokens kept free for the reply: a quarter of the budget, at most `max_reply`.
pub fn reply_reserve(budget: usize, max_reply: usize) -> usize {
    (budget / 4).min(max_reply).max(1)
}

/// Plans the next turn. `turns` are the token lengths of the cached turns, oldest first.
pub fn plan(pinned: usize, turns: &[usize], new_prompt: usize, reserve: usize, budget: usize) -> Plan {
    let context: usize = pinned + turns.iter().sum::<usize>();
    if context + new_prompt + reserve <= budget {
        return Plan::Fits;
    }
    let mut dropped_tokens = 0;
    for (i, len) in turns.iter().enumerate() {
        dropped_tokens += len;
        if context - dropped_tokens + new_prompt + reserve <= budget {
            return Plan::DropTurns { turns: i + 1, tokens: dropped_tokens };
        }
    }
    let room = budget.saturating_sub(pinned + reserve);
    Plan::CutPrompt { turns: turns.len(), tokens: dropped_tokens, keep_prompt_tokens: room }
}

/// How many oldest turns to drop so the context is at most `target` tokens (all of them
/// when even that is not enough).
pub fn turns_to_fit(pinned: usize, turns: &[usize], target: usize) -> usize {
    let mut total: usize = pinned + turns.iter().sum::<usize>();
    let mut count = 0;
    for len in turns {
        if total <= target {
            break;
        }
        total -= len;
        count += 1;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_when_there_is_room() {
        assert_eq!(plan(30, &[100, 100], 50, 64, 1024), Plan::Fits);
    }

    #[test]
    fn drops_oldest_whole_turns_only_as_many_as_needed() {
        // 30 + 300 + 300 + 300 + 100 + 64 = 1094 > 1024: dropping one turn is enough.
        assert_eq!(plan(30, &[300, 300, 300], 100, 64, 1024), Plan::DropTurns { turns: 1, tokens: 300 });
        // Needs two.
        assert_eq!(plan(30, &[300, 300, 300], 400, 64, 1024), Plan::DropTurns { turns: 2, tokens: 600 });
    }

    #[test]
    fn never_drops_the_pinned_prompt_and_cuts_an_oversized_prompt() {
        assert_eq!(
            plan(30, &[100], 5000, 64, 1024),
            Plan::CutPrompt { turns: 1, tokens: 100, keep_prompt_tokens: 1024 - 30 - 64 }
        );
        // Budget smaller than the pinned prompt: nothing left for the prompt, no panic.
        assert_eq!(plan(2000, &[], 10, 64, 1024), Plan::CutPrompt { turns: 0, tokens: 0, keep_prompt_tokens: 0 });
    }

    #[test]
    fn eviction_target_drops_until_under() {
        assert_eq!(turns_to_fit(30, &[200, 200, 200], 512), 1);
        assert_eq!(turns_to_fit(30, &[200, 200, 200], 100), 3);
        assert_eq!(turns_to_fit(30, &[200], 1000), 0);
    }

    #[test]
    fn reserve_is_a_quarter_capped_by_max_reply() {
        assert_eq!(reply_reserve(1024, 512), 256);
        assert_eq!(reply_reserve(1024, 100), 100);
    }
}
