//! The merge loop both tokenizers run (llama.cpp's BPE and SentencePiece sessions): the
//! text as a linked list of symbols, every adjacent pair that may merge in a priority
//! queue, the best pair merged first (the leftmost among equals) until none is left.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A byte range of the text being merged, linked to its neighbours (`-1`: none).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Symbol {
    pub start: usize,
    pub len: usize,
    pub prev: isize,
    pub next: isize,
}

impl Symbol {
    /// One symbol per character of `text`, linked in order.
    pub(crate) fn chars(text: &str) -> Vec<Symbol> {
        let n = text.chars().count() as isize;
        text.char_indices()
            .enumerate()
            .map(|(i, (start, c))| {
                let i = i as isize;
                Symbol { start, len: c.len_utf8(), prev: i - 1, next: if i + 1 == n { -1 } else { i + 1 } }
            })
            .collect()
    }

    pub(crate) fn text<'a>(&self, text: &'a str) -> &'a str {
        &text[self.start..self.start + self.len]
    }
}

/// Merges `symbols` of `text` in place. `priority(joined, split)` says whether the two
/// symbols that make `joined` (the left one is `joined[..split]`) may merge, and how
/// urgently: higher first. Merged-away symbols are left with length 0.
pub(crate) fn merge<P: Ord>(text: &str, symbols: &mut [Symbol], priority: impl Fn(&str, usize) -> Option<P>) {
    let mut queue = BinaryHeap::new();
    let try_pair = |symbols: &[Symbol], queue: &mut BinaryHeap<Pair<P>>, left: isize, right: isize| {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (&symbols[left as usize], &symbols[right as usize]);
        let joined = &text[l.start..r.start + r.len];
        if let Some(priority) = priority(joined, l.len) {
            queue.push(Pair { left, right, priority, len: joined.len() });
        }
    };
    for i in 1..symbols.len() as isize {
        try_pair(symbols, &mut queue, i - 1, i);
    }
    while let Some(pair) = queue.pop() {
        let (l, r) = (pair.left as usize, pair.right as usize);
        // Skip pairs whose symbols were merged into others since they were queued.
        if symbols[l].len == 0 || symbols[r].len == 0 || symbols[l].len + symbols[r].len != pair.len {
            continue;
        }
        symbols[l].len += symbols[r].len;
        symbols[r].len = 0;
        symbols[l].next = symbols[r].next;
        let after = symbols[r].next;
        if after >= 0 {
            symbols[after as usize].prev = pair.left;
        }
        let (prev, next) = (symbols[l].prev, symbols[l].next);
        try_pair(symbols, &mut queue, prev, pair.left);
        try_pair(symbols, &mut queue, pair.left, next);
    }
}

/// A candidate merge of two adjacent symbols.
struct Pair<P> {
    left: isize,
    right: isize,
    priority: P,
    len: usize,
}

/// Highest priority first; of equal ones, the leftmost (llama.cpp's order).
impl<P: Ord> Ord for Pair<P> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority.cmp(&other.priority).then_with(|| other.left.cmp(&self.left))
    }
}

impl<P: Ord> PartialOrd for Pair<P> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<P: Ord> PartialEq for Pair<P> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<P: Ord> Eq for Pair<P> {}
