//! DRY ("don't repeat yourself"), as llama.cpp defines it (`llama_sampler_dry_*` in
//! `src/llama-sampling.cpp`, after p-e-w's proposal in text-generation-webui).
//!
//! For the token history `h` (its last `penalty_last_n` tokens), a candidate token `t` is
//! penalized when `h + [t]` would end with a sequence already present earlier in `h`: if
//! the longest such earlier sequence has `n` tokens before `t` (not counting `t`) and
//! `n >= allowed_length`, the logit of `t` loses `multiplier * base^(n - allowed_length)`.
//! The longer a loop runs, the more expensive its next token; repeating a word or a short
//! phrase costs nothing.
//!
//! **Sequence breakers** are strings (`"\n"`, `":"`, `"\""`, `"*"` by default) that end a
//! repeat: a match may not reach back past the most recent breaker in the history, so the
//! repeated structure of a list or of dialogue is not penalized. A breaker is a string, not
//! a token, so it is mapped to tokens the way llama.cpp does ([`Breakers::new`]): every
//! token whose text contains the breaker is a breaker on its own, and a token whose text
//! *ends* with the start of the breaker is a breaker when the tokens after it spell the
//! rest (the rest tokenized once, at most [`MAX_TAIL_TOKENS`] tokens). A token that is a
//! breaker on its own is never penalized itself.
//!
//! The repeat lengths are found with the Z-algorithm over the reversed history, in linear
//! time, so a history of the whole context costs one pass per token.

use std::collections::HashMap;

/// Longest breaker kept, in bytes (llama.cpp's `MAX_CHAR_LEN`).
pub const MAX_BREAKER_BYTES: usize = 40;
/// Longest tail of a breaker that spans tokens, in tokens (llama.cpp's `MAX_SEQ_LEN`).
pub const MAX_TAIL_TOKENS: usize = 20;
/// `ln(f32::MAX)`: `base^exponent` is kept below it so the penalty stays finite.
const FLOAT_MAX_LOG: f32 = 88.722_84;

/// llama.cpp's default sequence breakers (`common_params_sampling::dry_sequence_breakers`).
pub const DEFAULT_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];

/// The sequence breakers mapped to tokens: for each head token, the tails that must follow
/// it (an empty tail: the token alone is a breaker).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Breakers {
    heads: HashMap<u32, Vec<Vec<u32>>>,
}

impl Breakers {
    /// Maps `breakers` to tokens. `token_bytes` holds every vocabulary entry's text (raw
    /// bytes, as the detokenizer would give them; index = id); `tokenize` gives the tokens
    /// of a text with special-token strings read as plain text. Empty breakers are skipped;
    /// a longer one is cut to [`MAX_BREAKER_BYTES`].
    pub fn new(breakers: &[String], token_bytes: &[Vec<u8>], mut tokenize: impl FnMut(&str) -> Vec<u32>) -> Self {
        let mut out = Breakers::default();
        for breaker in breakers {
            let breaker = truncate_at_char(breaker, MAX_BREAKER_BYTES);
            if breaker.is_empty() {
                continue;
            }
            let b = breaker.as_bytes();
            for (id, word) in token_bytes.iter().enumerate() {
                let id = id as u32;
                if contains(word, b) {
                    out.add(id, Vec::new());
                    continue;
                }
                // Each place where the word ends with a start of the breaker.
                for pos in (0..word.len()).filter(|&p| word[p] == b[0]) {
                    let overlap = word.len() - pos;
                    if overlap >= b.len() || word[pos..] != b[..overlap] {
                        continue;
                    }
                    // The rest, tokenized on its own; a rest that starts inside a character
                    // cannot be spelled by whole tokens of text.
                    let Ok(rest) = std::str::from_utf8(&b[overlap..]) else { continue };
                    let mut tail = tokenize(rest);
                    tail.truncate(MAX_TAIL_TOKENS);
                    out.add(id, tail);
                }
            }
        }
        out
    }

    fn add(&mut self, head: u32, tail: Vec<u32>) {
        let tails = self.heads.entry(head).or_default();
        if !tails.contains(&tail) {
            tails.push(tail);
        }
    }

    /// Whether `id` is a breaker on its own (and so never penalized).
    fn is_single_token(&self, id: u32) -> bool {
        self.heads.get(&id).is_some_and(|tails| tails.iter().any(Vec::is_empty))
    }

    /// The tails that must follow `head` for it to end a repeat (an empty tail: `head` is
    /// a breaker on its own); none when `head` starts no breaker.
    pub fn tails(&self, head: u32) -> &[Vec<u32>] {
        self.heads.get(&head).map_or(&[], Vec::as_slice)
    }

    /// How many head tokens there are (for logs and tests).
    pub fn len(&self) -> usize {
        self.heads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }
}

/// The breakers of command-line arguments, as llama.cpp reads `--dry-sequence-breaker`:
/// the given ones replace the defaults, each one breaker with its escapes (`\n`, `\t`,
/// `\"`, …) read, and `none` drops the ones given before it.
pub fn breakers_from_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for arg in args {
        if arg == "none" {
            out.clear();
        } else {
            out.push(unescape(arg));
        }
    }
    out
}

/// `s` with the escapes llama.cpp's `string_process_escapes` knows read: `\n`, `\r`,
/// `\t`, `\'`, `\"`, `\\` and `\xHH`; any other backslash stays as it is.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.peek().copied() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('\'') => out.push('\''),
            Some('"') => out.push('"'),
            Some('\\') => out.push('\\'),
            Some('x') => {
                let hex: String = chars.clone().skip(1).take(2).collect();
                match u8::from_str_radix(&hex, 16) {
                    Ok(b) if hex.len() == 2 && b.is_ascii() => {
                        out.push(char::from(b));
                        chars.next();
                        chars.next();
                    }
                    _ => {
                        out.push('\\');
                        continue;
                    }
                }
            }
            _ => {
                out.push('\\');
                continue;
            }
        }
        chars.next();
    }
    out
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn truncate_at_char(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// DRY's settings (see [`super::SamplingParams`]).
#[derive(Debug, Clone, Copy)]
pub struct DryParams {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
    /// How many of the most recent tokens are searched; `usize::MAX` = all.
    pub last_n: usize,
}

impl DryParams {
    /// Whether DRY changes anything (llama.cpp: multiplier 0, base below 1 or an empty
    /// window turn it off).
    pub fn active(&self) -> bool {
        self.multiplier != 0.0 && self.base >= 1.0 && self.last_n > 0
    }
}

/// Buffers reused from one token to the next.
#[derive(Debug, Default)]
pub struct Scratch {
    reversed: Vec<u32>,
    z: Vec<usize>,
    /// For each token that would extend a repeat, the longest such repeat.
    longest: HashMap<u32, usize>,
}

/// The DRY penalty of each token that gets one, for the next token after `history`:
/// `(token, amount to subtract from its logit)`, in no particular order.
pub fn penalties(history: &[u32], p: &DryParams, breakers: &Breakers, scratch: &mut Scratch) -> Vec<(u32, f32)> {
    if !p.active() {
        return Vec::new();
    }
    let window = &history[history.len().saturating_sub(p.last_n)..];
    let n = window.len();
    if n <= p.allowed_length {
        return Vec::new();
    }
    // `r[i]` is the token `i` places from the end (`r[0]` the last one).
    scratch.reversed.clear();
    scratch.reversed.extend(window.iter().rev());
    let r = &scratch.reversed;

    // Step 1: a repeat may not reach back past the most recent breaker. A breaker whose
    // head is `i` places from the end and whose tail of `len` tokens follows it leaves
    // room for repeats of `i - len` tokens.
    let mut limit = n;
    for i in 0..n {
        let Some(tails) = breakers.heads.get(&r[i]) else { continue };
        let longest = tails
            .iter()
            .filter(|tail| tail.len() <= i && tail.iter().enumerate().all(|(k, &t)| r[i - 1 - k] == t))
            .map(Vec::len)
            .max();
        if let Some(len) = longest {
            limit = i - len;
            break;
        }
    }
    if limit < p.allowed_length {
        return Vec::new();
    }

    // Step 2: `z[k]` = how many tokens ending `k` places before the end match the tokens
    // at the very end (the longest common prefix of `r` and `r[k..]`).
    z_function(r, &mut scratch.z);

    // Step 3: the token that followed each such earlier sequence would extend the repeat.
    scratch.longest.clear();
    for k in 1..n {
        let len = scratch.z[k].min(limit);
        if len >= p.allowed_length {
            let next = r[k - 1];
            let e = scratch.longest.entry(next).or_insert(len);
            *e = (*e).max(len);
        }
    }

    // Step 4: the penalty grows with the length, the exponent capped so it stays finite.
    let max_exponent = if p.base > 1.000_001 { (FLOAT_MAX_LOG / p.base.ln()) as usize } else { 0 };
    scratch
        .longest
        .iter()
        .filter(|(&id, _)| !breakers.is_single_token(id))
        .map(|(&id, &len)| {
            let mut exponent = len - p.allowed_length;
            if max_exponent > 0 {
                exponent = exponent.min(max_exponent);
            }
            (id, p.multiplier * p.base.powi(exponent as i32))
        })
        .collect()
}

/// The Z-array of `s`: `z[k]` = length of the longest common prefix of `s` and `s[k..]`
/// (`z[0]` = 0). Linear time.
fn z_function(s: &[u32], z: &mut Vec<usize>) {
    let n = s.len();
    z.clear();
    z.resize(n, 0);
    // [left, right) is the rightmost match found so far.
    let (mut left, mut right) = (0, 0);
    for k in 1..n {
        let mut len = if k < right { (right - k).min(z[k - left]) } else { 0 };
        while k + len < n && s[len] == s[k + len] {
            len += 1;
        }
        z[k] = len;
        if k + len > right {
            (left, right) = (k, k + len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Z-array by its definition, quadratic.
    fn z_naive(s: &[u32]) -> Vec<usize> {
        (0..s.len())
            .map(|k| if k == 0 { 0 } else { s.iter().zip(&s[k..]).take_while(|(a, b)| a == b).count() })
            .collect()
    }

    #[test]
    fn z_function_matches_its_definition() {
        let mut z = Vec::new();
        let mut state = 12345u64;
        for len in 0..60 {
            let s: Vec<u32> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((state >> 33) % 3) as u32
                })
                .collect();
            z_function(&s, &mut z);
            assert_eq!(z, z_naive(&s), "{s:?}");
        }
        z_function(&[7; 9], &mut z);
        assert_eq!(z, vec![0, 8, 7, 6, 5, 4, 3, 2, 1]);
    }

    #[test]
    fn breakers_map_to_tokens_as_llama_cpp_does() {
        // A toy vocabulary: 0 "a", 1 "\n", 2 "x\ny", 3 "<", 4 "|", 5 "end", 6 "|>", 7 "b<|".
        let vocab: Vec<Vec<u8>> =
            ["a", "\n", "x\ny", "<", "|", "end", "|>", "b<|"].iter().map(|s| s.as_bytes().to_vec()).collect();
        let tokenize = |s: &str| -> Vec<u32> {
            // Greedy longest match over the toy vocabulary.
            let mut out = Vec::new();
            let mut rest = s.as_bytes();
            while !rest.is_empty() {
                let (id, len) = vocab
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| rest.starts_with(w))
                    .map(|(i, w)| (i as u32, w.len()))
                    .max_by_key(|&(_, l)| l)
                    .expect("toy vocabulary spells it");
                out.push(id);
                rest = &rest[len..];
            }
            out
        };
        let b = Breakers::new(&["\n".into(), "<|end|>".into(), String::new()], &vocab, tokenize);
        // "\n": tokens 1 and 2 contain it.
        assert_eq!(b.heads[&1], vec![Vec::<u32>::new()]);
        assert_eq!(b.heads[&2], vec![Vec::<u32>::new()]);
        // "<|end|>": "<" is followed by "|end|>" = [4, 5, 6]; "|" ends with "|"? No: the
        // breaker starts with "<". "b<|" ends with "<|", followed by "end|>" = [5, 6].
        assert_eq!(b.heads[&3], vec![vec![4, 5, 6]]);
        assert_eq!(b.heads[&7], vec![vec![5, 6]]);
        assert_eq!(b.len(), 4);
        assert!(b.is_single_token(1) && !b.is_single_token(3));
    }

    #[test]
    fn breaker_arguments_read_escapes_and_none() {
        let args = |a: &[&str]| breakers_from_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(args(&["\\n", ":", "\\\"", "*"]), vec!["\n", ":", "\"", "*"]);
        assert_eq!(args(&["a\\tb\\\\c", "\\x41\\q", "\\"]), vec!["a\tb\\c", "A\\q", "\\"]);
        assert!(args(&["none"]).is_empty());
        assert_eq!(args(&["*", "none", ":"]), vec![":"]);
    }
}
