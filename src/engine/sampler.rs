//! The token sampler: picks the next token of a chat reply from one row of logits.
//!
//! Greedy decoding (always the most likely token) is deterministic, but in chat it tends to
//! fall into loops and to give flat, repetitive replies. Sampling from the model's
//! distribution fixes that, but the raw distribution has a long tail of thousands of
//! unlikely tokens whose combined mass is large enough to derail a reply now and then. The
//! filters below cut that tail in complementary ways, and the penalties push back on loops:
//!
//! - **Repetition and presence penalties** lower the logits of tokens already present in
//!   the last `penalty_window` tokens. The repetition penalty follows llama.cpp: a positive
//!   logit is divided by the penalty, a negative one multiplied by it, so the token always
//!   becomes less likely. The presence penalty is subtracted once per distinct token,
//!   however often it occurs. Both are off by default: over a chat's history they push
//!   down exactly the words a faithful answer repeats from the question.
//! - **DRY** ("don't repeat yourself", llama.cpp's `llama_sampler_dry`, see [`dry`]) lowers
//!   only the token that would *extend* a sequence already present in the history, by
//!   `dry_multiplier * dry_base^(length - dry_allowed_length)`, so a loop gets more
//!   expensive the longer it runs while single repeated words cost nothing. On by default.
//! - **Top-k** keeps the `k` most likely tokens. It bounds the work of every later step:
//!   it is done with a partial selection (`select_nth_unstable_by`), which costs a linear
//!   pass instead of sorting a vocabulary of ~50k entries for every token.
//! - **Temperature** scales the logits before the softmax: below 1 it sharpens the
//!   distribution, above 1 it flattens it. A temperature of zero or less means greedy.
//! - **Min-p** drops tokens whose probability is below `min_p` times that of the most
//!   likely token, so the cut follows the model's confidence: strict when one token
//!   dominates, lenient when many are plausible.
//! - **Top-p** (nucleus) keeps the smallest set of most likely tokens whose cumulative
//!   probability reaches `top_p`.
//!
//! The steps run in this order:
//!
//! 1. penalties, on the logits of the tokens in the window, then DRY;
//! 2. if the temperature is zero or less, return the argmax (ties go to the lowest id);
//! 3. top-k, by partial selection;
//! 4. softmax with the temperature, subtracting the largest logit first for stability;
//! 5. min-p;
//! 6. top-p, after sorting the survivors by probability (min-p has usually made them few);
//! 7. renormalize over the survivors and draw one with the sampler's seeded PRNG.
//!
//! Penalties come first so that they act on the raw logits, as in llama.cpp, and so that
//! greedy decoding honours them too. Top-k comes before the softmax so that `exp` runs on
//! `k` entries rather than on the whole vocabulary. The temperature is applied before min-p
//! and top-p so that those filters judge the distribution that is actually sampled from
//! (llama.cpp's default chain applies it last instead), and min-p runs before top-p so that
//! the sort top-p needs works on as few tokens as possible. Every step keeps at least one
//! token.
//!
//! Logits are read defensively: a NaN logit is treated as `-inf` and can never be picked,
//! `+inf` is treated as the largest finite value, and a row with no usable logit at all
//! returns the lowest id instead of panicking.
//!
//! The PRNG is a small xoshiro256** seeded through SplitMix64, written out here so that a
//! seed gives the same tokens whatever the versions of the crates around it.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::quantized::gguf_file::Value;
use serde::{Deserialize, Serialize};

pub mod dry;

pub use dry::{Breakers, DEFAULT_BREAKERS};

/// Highest temperature [`SamplingParams::sanitized`] lets through.
const MAX_TEMPERATURE: f32 = 5.0;
/// Range [`SamplingParams::sanitized`] clamps the repetition penalty to.
const REPEAT_PENALTY_RANGE: (f32, f32) = (0.1, 10.0);
/// Range [`SamplingParams::sanitized`] clamps the presence penalty to (OpenAI's range).
const PRESENCE_PENALTY_RANGE: (f32, f32) = (-2.0, 2.0);
/// Range [`SamplingParams::sanitized`] clamps DRY's multiplier to.
const DRY_MULTIPLIER_RANGE: (f32, f32) = (0.0, 10.0);
/// Range [`SamplingParams::sanitized`] clamps DRY's base to (below 1 the penalty would
/// shrink as a repeat grows).
const DRY_BASE_RANGE: (f32, f32) = (1.0, 10.0);

// Recommended sampling settings a GGUF may carry. The names are llama.cpp's: `Keys.General`
// (`SAMPLING_TEMP` etc.) in gguf-py/gguf/constants.py and `LLM_KV_GENERAL_SAMPLING_*` in
// src/llama-arch.cpp. gguf-py's writer (`add_sampling_*` in gguf_writer.py) stores top_k and
// penalty_last_n as INT32 and the others as FLOAT32; llama.cpp reads them back in
// `common_init_sampler_from_model` (common/common.cpp) through their string form with
// strtol/strtof, so it accepts any numeric type, and so do we. The other keys of that family
// (`sequence`, `xtc_*`, `mirostat*`) configure samplers this module does not have. llama.cpp
// defines no key for DRY, so DRY's defaults are always `SamplingParams::default()`'s.
const KEY_TEMP: &str = "general.sampling.temp";
const KEY_TOP_K: &str = "general.sampling.top_k";
const KEY_TOP_P: &str = "general.sampling.top_p";
const KEY_MIN_P: &str = "general.sampling.min_p";
const KEY_PENALTY_REPEAT: &str = "general.sampling.penalty_repeat";
const KEY_PENALTY_LAST_N: &str = "general.sampling.penalty_last_n";

/// Sampling settings; `Default` is the chat default.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; zero or less means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose cumulative probability reaches `top_p`; 1.0 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0.0 = off.
    pub min_p: f32,
    /// Repetition penalty (llama.cpp semantics: positive logits divided, negative
    /// multiplied); 1.0 = off.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of each token present in the window; 0.0 = off.
    pub presence_penalty: f32,
    /// How many of the most recent tokens the penalties look at; 0 = none,
    /// `usize::MAX` = all of them.
    pub penalty_window: usize,
    /// DRY: the penalty of a token that extends a repeat of `dry_allowed_length` tokens;
    /// 0.0 = off (see [`dry`]).
    pub dry_multiplier: f32,
    /// DRY: the penalty grows by this factor with each token of the repeat past the
    /// allowed length.
    pub dry_base: f32,
    /// DRY: repeats this long (in tokens) or shorter are free.
    pub dry_allowed_length: usize,
    /// DRY: how many of the most recent tokens are searched for repeats; 0 = off,
    /// `usize::MAX` = the whole context (llama.cpp's -1).
    pub dry_penalty_last_n: usize,
    /// Seed of the PRNG that draws the token.
    pub seed: u64,
}

impl Default for SamplingParams {
    /// llama.cpp's filters (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), no token
    /// repetition penalty (llama.cpp's default too) and DRY on with llama.cpp's recommended
    /// values (multiplier 0.8, base 1.75, allowed length 2, the whole context). A penalty of
    /// 1.1 over the last 64 tokens, prompt included, pushed down the words a faithful answer
    /// repeats from the question: after "What is the capital of Germany?", "And of Italy?"
    /// named Rome in 0 of 3 seeds with it (bench/runs/2026-12-02-epyc-2core/sampling.md).
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            penalty_window: 64,
            dry_multiplier: 0.8,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: usize::MAX,
            seed: 299_792_458,
        }
    }
}

impl SamplingParams {
    /// Plain greedy decoding: argmax, every filter and penalty off.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            dry_multiplier: 0.0,
            ..Self::default()
        }
    }

    /// Defaults from a GGUF's metadata where it carries them (`general.sampling.*` keys
    /// written by recent llama.cpp converters), else `Default`'s value for each field.
    ///
    /// A key of the wrong type (bool, array, unparsable string, fractional integer) or with
    /// a non-finite value is ignored. `top_k <= 0` means off and `penalty_last_n = -1`
    /// means the whole history, as in llama.cpp. The result is [`sanitized`](Self::sanitized).
    pub fn from_gguf(metadata: &HashMap<String, Value>) -> Self {
        Self::from_gguf_over(Self::default(), metadata)
    }

    /// [`from_gguf`](Self::from_gguf) over `base` instead of `Default`: the GGUF's keys
    /// replace the fields they carry, `base` gives the rest (the model's recommended
    /// settings from the catalog, below the file's own).
    pub fn from_gguf_over(base: SamplingParams, metadata: &HashMap<String, Value>) -> Self {
        let mut p = base;
        if let Some(v) = read_key(metadata, KEY_TEMP, as_f32) {
            p.temperature = v;
        }
        if let Some(v) = read_key(metadata, KEY_TOP_K, as_i64) {
            p.top_k = usize::try_from(v).unwrap_or(0);
        }
        if let Some(v) = read_key(metadata, KEY_TOP_P, as_f32) {
            p.top_p = v;
        }
        if let Some(v) = read_key(metadata, KEY_MIN_P, as_f32) {
            p.min_p = v;
        }
        if let Some(v) = read_key(metadata, KEY_PENALTY_REPEAT, as_f32) {
            p.repeat_penalty = v;
        }
        match read_key(metadata, KEY_PENALTY_LAST_N, as_i64) {
            Some(-1) => p.penalty_window = usize::MAX,
            Some(v) if v >= 0 => p.penalty_window = usize::try_from(v).unwrap_or(usize::MAX),
            Some(v) => tracing::debug!(key = KEY_PENALTY_LAST_N, value = v, "ignoring negative GGUF sampling value"),
            None => {}
        }
        p.sanitized()
    }

    /// Clamps/validates values from outside (UI, CLI, saved settings, model files): a
    /// non-finite value is replaced by the default one and an out-of-range one clamped.
    /// Never panics.
    ///
    /// Ranges: temperature 0..=5 (negative becomes 0, i.e. greedy), `top_p` and `min_p`
    /// 0..=1, repetition penalty 0.1..=10 (zero or less becomes the default 1.0), presence
    /// penalty -2..=2, DRY multiplier 0..=10 and base 1..=10. `top_k`, `penalty_window`,
    /// DRY's allowed length and window, and `seed` take any value.
    pub fn sanitized(self) -> Self {
        let d = Self::default();
        let repeat_penalty = if self.repeat_penalty > 0.0 { self.repeat_penalty } else { d.repeat_penalty };
        Self {
            temperature: clamp_or(self.temperature, d.temperature, 0.0, MAX_TEMPERATURE),
            top_p: clamp_or(self.top_p, d.top_p, 0.0, 1.0),
            min_p: clamp_or(self.min_p, d.min_p, 0.0, 1.0),
            repeat_penalty: clamp_or(repeat_penalty, d.repeat_penalty, REPEAT_PENALTY_RANGE.0, REPEAT_PENALTY_RANGE.1),
            presence_penalty: clamp_or(
                self.presence_penalty,
                d.presence_penalty,
                PRESENCE_PENALTY_RANGE.0,
                PRESENCE_PENALTY_RANGE.1,
            ),
            dry_multiplier: clamp_or(
                self.dry_multiplier,
                d.dry_multiplier,
                DRY_MULTIPLIER_RANGE.0,
                DRY_MULTIPLIER_RANGE.1,
            ),
            dry_base: clamp_or(self.dry_base, d.dry_base, DRY_BASE_RANGE.0, DRY_BASE_RANGE.1),
            ..self
        }
    }

    /// DRY's part of the settings.
    fn dry(&self) -> dry::DryParams {
        dry::DryParams {
            multiplier: self.dry_multiplier,
            base: self.dry_base,
            allowed_length: self.dry_allowed_length,
            last_n: self.dry_penalty_last_n,
        }
    }

    /// Whether either penalty changes anything.
    fn penalties_active(&self) -> bool {
        self.penalty_window > 0 && (self.repeat_penalty != 1.0 || self.presence_penalty != 0.0)
    }
}

/// `value` clamped to `lo..=hi`, or `default` when it is not finite.
fn clamp_or(value: f32, default: f32, lo: f32, hi: f32) -> f32 {
    if value.is_finite() {
        value.clamp(lo, hi)
    } else {
        default
    }
}

/// Reads `key` with `convert`, logging (at debug level) a value it rejects.
fn read_key<T>(metadata: &HashMap<String, Value>, key: &str, convert: fn(&Value) -> Option<T>) -> Option<T> {
    let value = metadata.get(key)?;
    let out = convert(value);
    if out.is_none() {
        tracing::debug!(key, ?value, "ignoring GGUF sampling value of the wrong type or not finite");
    }
    out
}

/// A finite number stored as any numeric type or as a numeric string.
fn as_f64(v: &Value) -> Option<f64> {
    let x = match v {
        Value::U8(x) => f64::from(*x),
        Value::I8(x) => f64::from(*x),
        Value::U16(x) => f64::from(*x),
        Value::I16(x) => f64::from(*x),
        Value::U32(x) => f64::from(*x),
        Value::I32(x) => f64::from(*x),
        Value::U64(x) => *x as f64,
        Value::I64(x) => *x as f64,
        Value::F32(x) => f64::from(*x),
        Value::F64(x) => *x,
        Value::String(s) => s.trim().parse().ok()?,
        Value::Bool(_) | Value::Array(_) => return None,
    };
    x.is_finite().then_some(x)
}

/// A finite number that also fits an `f32`.
fn as_f32(v: &Value) -> Option<f32> {
    let x = as_f64(v)? as f32;
    x.is_finite().then_some(x)
}

/// A whole number stored as an integer, a whole float or a numeric string.
fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::U64(x) => i64::try_from(*x).ok(),
        Value::I64(x) => Some(*x),
        _ => {
            let x = as_f64(v)?;
            (x.fract() == 0.0 && x.abs() <= 9.0e15).then_some(x as i64)
        }
    }
}

/// One token still in the running.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u32,
    /// Logit after the penalties; never NaN or `+inf`.
    logit: f32,
    /// Probability after the softmax (relative once filters have removed tokens).
    prob: f32,
}

/// Settings chosen on the command line or in the app: each one set replaces the model's
/// default ([`SamplingParams::from_gguf`]); the others keep it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingOverrides {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub dry_multiplier: Option<f32>,
    pub dry_base: Option<f32>,
    pub dry_allowed_length: Option<usize>,
    pub dry_penalty_last_n: Option<usize>,
    pub seed: Option<u64>,
}

impl SamplingOverrides {
    /// Greedy decoding, whatever the model suggests.
    pub fn greedy() -> Self {
        SamplingOverrides { temperature: Some(0.0), ..Default::default() }
    }

    /// `defaults` with every set field replaced, then sanitized. When the temperature
    /// that results is zero (greedy), every penalty is off unless set here: greedy means
    /// the model's most likely token, as in llama.cpp.
    pub fn apply(&self, defaults: SamplingParams) -> SamplingParams {
        let mut p = SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(defaults.repeat_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(defaults.presence_penalty),
            penalty_window: defaults.penalty_window,
            dry_multiplier: self.dry_multiplier.unwrap_or(defaults.dry_multiplier),
            dry_base: self.dry_base.unwrap_or(defaults.dry_base),
            dry_allowed_length: self.dry_allowed_length.unwrap_or(defaults.dry_allowed_length),
            dry_penalty_last_n: self.dry_penalty_last_n.unwrap_or(defaults.dry_penalty_last_n),
            seed: self.seed.unwrap_or(defaults.seed),
        }
        .sanitized();
        if p.temperature <= 0.0 {
            let off = SamplingParams::greedy();
            p.repeat_penalty = self.repeat_penalty.map_or(off.repeat_penalty, |_| p.repeat_penalty);
            p.presence_penalty = self.presence_penalty.map_or(off.presence_penalty, |_| p.presence_penalty);
            p.dry_multiplier = self.dry_multiplier.map_or(off.dry_multiplier, |_| p.dry_multiplier);
        }
        p
    }
}

/// Picks next tokens with the filters described in the module docs.
///
/// One sampler per reply (or per conversation) keeps the draws reproducible for a seed; its
/// buffers are reused from one token to the next.
pub struct Sampler {
    params: SamplingParams,
    /// DRY's sequence breakers, as tokens of the model's vocabulary.
    breakers: Arc<Breakers>,
    dry_scratch: dry::Scratch,
    rng: Rng,
    /// The candidates of the current call; kept to reuse the allocation.
    candidates: Vec<Candidate>,
    /// The distinct token ids of the penalty window; kept to reuse the allocation.
    window: Vec<u32>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").field("params", &self.params).finish_non_exhaustive()
    }
}

impl Sampler {
    /// A sampler for `params` (sanitized first), its PRNG seeded with `params.seed`, with
    /// no DRY sequence breakers.
    pub fn new(params: SamplingParams) -> Self {
        Self::with_breakers(params, Arc::default())
    }

    /// [`new`](Self::new) with DRY's sequence breakers (see [`Breakers::new`]).
    pub fn with_breakers(params: SamplingParams, breakers: Arc<Breakers>) -> Self {
        let params = params.sanitized();
        Self {
            params,
            breakers,
            dry_scratch: dry::Scratch::default(),
            rng: Rng::new(params.seed),
            candidates: Vec::new(),
            window: Vec::new(),
        }
    }

    /// The settings in use (after sanitizing).
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from `logits` (one row, f32, len = vocab). `recent` = the token
    /// ids before it (the penalties look at the last `penalty_window`; ids outside the
    /// vocabulary are ignored; DRY looks at the last `dry_penalty_last_n`). An empty row
    /// returns 0.
    pub fn sample(&mut self, logits: &[f32], recent: &[u32]) -> u32 {
        let p = self.params;
        self.penalize(logits, recent);
        let Some(best) = argmax(&self.candidates) else { return 0 };
        if p.temperature <= 0.0 || best.logit == f32::NEG_INFINITY {
            return best.id;
        }
        top_k(&mut self.candidates, p.top_k);
        softmax(&mut self.candidates, p.temperature);
        min_p(&mut self.candidates, p.min_p);
        top_p(&mut self.candidates, p.top_p);
        draw(&self.candidates, &mut self.rng).unwrap_or(best.id)
    }

    /// Loads `logits` into the candidates (in id order) and applies the penalties, then DRY.
    fn penalize(&mut self, logits: &[f32], recent: &[u32]) {
        let p = self.params;
        load_candidates(&mut self.candidates, logits);
        if p.penalties_active() {
            distinct_window(&mut self.window, recent, p.penalty_window);
            apply_penalties(&mut self.candidates, &self.window, p.repeat_penalty, p.presence_penalty);
        }
        for (id, penalty) in dry::penalties(recent, &p.dry(), &self.breakers, &mut self.dry_scratch) {
            if let Some(c) = self.candidates.get_mut(id as usize) {
                c.logit = clean_logit(c.logit - penalty);
            }
        }
    }
}

/// A logit safe to compute with: NaN becomes `-inf`, `+inf` the largest finite value.
fn clean_logit(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x.min(f32::MAX)
    }
}

/// Fills `out` with one candidate per vocabulary entry, in id order.
fn load_candidates(out: &mut Vec<Candidate>, logits: &[f32]) {
    out.clear();
    out.extend(logits.iter().enumerate().map(|(id, &x)| Candidate { id: id as u32, logit: clean_logit(x), prob: 0.0 }));
}

/// Fills `out` with the distinct ids among the last `window` entries of `recent`.
fn distinct_window(out: &mut Vec<u32>, recent: &[u32], window: usize) {
    out.clear();
    out.extend_from_slice(&recent[recent.len().saturating_sub(window)..]);
    out.sort_unstable();
    out.dedup();
}

/// Penalizes each token of `window` (distinct ids) once. `candidates` must still be in id
/// order, one per vocabulary entry.
fn apply_penalties(candidates: &mut [Candidate], window: &[u32], repeat: f32, presence: f32) {
    for &id in window {
        let Some(c) = candidates.get_mut(id as usize) else { continue };
        let x = if c.logit > 0.0 { c.logit / repeat } else { c.logit * repeat };
        c.logit = clean_logit(x - presence);
    }
}

/// `a` before `b` when `a` is more likely; ties go to the lower id.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// The candidate with the largest logit, the lowest id among equals; `None` when empty.
fn argmax(candidates: &[Candidate]) -> Option<Candidate> {
    candidates.iter().copied().reduce(|best, c| if c.logit > best.logit { c } else { best })
}

/// Keeps the `k` candidates with the largest logits (in no particular order); 0 = all.
fn top_k(candidates: &mut Vec<Candidate>, k: usize) {
    if k == 0 || k >= candidates.len() {
        return;
    }
    candidates.select_nth_unstable_by(k - 1, by_logit_desc);
    candidates.truncate(k);
}

/// Turns logits into probabilities at `temperature` (> 0), dropping the tokens whose
/// probability underflows to zero (the most likely one always stays).
fn softmax(candidates: &mut Vec<Candidate>, temperature: f32) {
    let Some(max) = argmax(candidates).map(|c| c.logit) else { return };
    let mut total = 0.0f64;
    for c in candidates.iter_mut() {
        c.prob = ((c.logit - max) / temperature).exp();
        total += f64::from(c.prob);
    }
    candidates.retain(|c| c.prob > 0.0);
    for c in candidates.iter_mut() {
        c.prob = (f64::from(c.prob) / total) as f32;
    }
}

/// Drops candidates less likely than `ratio` times the most likely one; 0 = off.
fn min_p(candidates: &mut Vec<Candidate>, ratio: f32) {
    if ratio <= 0.0 {
        return;
    }
    let Some(max) = candidates.iter().map(|c| c.prob).reduce(f32::max) else { return };
    let threshold = (ratio * max).min(max);
    candidates.retain(|c| c.prob >= threshold);
}

/// Keeps the smallest set of most likely candidates whose cumulative probability, relative
/// to all survivors, reaches `p`, and leaves them sorted most likely first; 1.0 = off.
fn top_p(candidates: &mut Vec<Candidate>, p: f32) {
    if p >= 1.0 || candidates.len() <= 1 {
        return;
    }
    candidates.sort_unstable_by(|a, b| b.prob.total_cmp(&a.prob).then(a.id.cmp(&b.id)));
    let total: f64 = candidates.iter().map(|c| f64::from(c.prob)).sum();
    let target = f64::from(p) * total;
    let mut cumulative = 0.0f64;
    let mut keep = candidates.len();
    for (i, c) in candidates.iter().enumerate() {
        cumulative += f64::from(c.prob);
        if cumulative >= target {
            keep = i + 1;
            break;
        }
    }
    candidates.truncate(keep);
}

/// Draws one candidate in proportion to its probability, renormalized over the
/// candidates given; `None` when there are none.
fn draw(candidates: &[Candidate], rng: &mut Rng) -> Option<u32> {
    let total: f64 = candidates.iter().map(|c| f64::from(c.prob)).sum();
    let target = rng.next_f64() * total;
    let mut cumulative = 0.0f64;
    for c in candidates {
        cumulative += f64::from(c.prob);
        if target < cumulative {
            return Some(c.id);
        }
    }
    // Rounding can leave `target` just past the sum: the last candidate is the one meant.
    candidates.last().map(|c| c.id)
}

/// xoshiro256** (Blackman and Vigna), seeded through SplitMix64 as its authors recommend.
#[derive(Debug, Clone)]
struct Rng {
    s: [u64; 4],
}

impl Rng {
    fn new(seed: u64) -> Self {
        let mut state = seed;
        Self { s: std::array::from_fn(|_| splitmix64(&mut state)) }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`, from the top 53 bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// One step of SplitMix64 (Steele, Lea and Flood).
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sampling only (no filters, no penalties) at temperature 1.
    fn plain() -> SamplingParams {
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingParams::greedy() }
    }

    /// How often each token comes out of `draws` samples.
    fn histogram(params: SamplingParams, logits: &[f32], draws: usize) -> Vec<usize> {
        let mut sampler = Sampler::new(params);
        let mut counts = vec![0; logits.len()];
        for _ in 0..draws {
            counts[sampler.sample(logits, &[]) as usize] += 1;
        }
        counts
    }

    /// Logits whose softmax at temperature 1 is `probs`.
    fn logits_of(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    fn candidates(logits: &[f32]) -> Vec<Candidate> {
        let mut c = Vec::new();
        load_candidates(&mut c, logits);
        c
    }

    fn ids(candidates: &[Candidate]) -> Vec<u32> {
        let mut ids: Vec<u32> = candidates.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn greedy_is_argmax_with_ties_to_the_lowest_id() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[1.0, 3.0, 3.0, 2.0], &[]), 1);
        assert_eq!(s.sample(&[-5.0, -1.0, -3.0], &[]), 1);
        let mut negative_temp = Sampler::new(SamplingParams { temperature: -1.0, ..SamplingParams::default() });
        assert_eq!(negative_temp.sample(&[0.0, 0.5, 9.0], &[]), 2);
    }

    #[test]
    fn top_k_keeps_only_k() {
        let mut c = candidates(&[1.0, 5.0, 3.0, 4.0, 2.0]);
        top_k(&mut c, 2);
        assert_eq!(ids(&c), vec![1, 3]);

        let counts = histogram(SamplingParams { top_k: 2, ..plain() }, &[5.0, 4.9, 4.8, 4.7, 4.6], 2000);
        assert!(counts[0] > 0 && counts[1] > 0, "{counts:?}");
        assert_eq!(counts[2..].iter().sum::<usize>(), 0, "{counts:?}");
    }

    #[test]
    fn top_k_ties_keep_the_lowest_ids() {
        let mut c = candidates(&[1.0, 1.0, 1.0, 1.0]);
        top_k(&mut c, 2);
        assert_eq!(ids(&c), vec![0, 1]);
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus() {
        let logits = logits_of(&[0.05, 0.5, 0.15, 0.3]);
        let mut c = candidates(&logits);
        softmax(&mut c, 1.0);
        top_p(&mut c, 0.75);
        // 0.5 < 0.75, 0.5 + 0.3 >= 0.75.
        assert_eq!(ids(&c), vec![1, 3]);

        let mut c = candidates(&logits);
        softmax(&mut c, 1.0);
        top_p(&mut c, 0.9);
        assert_eq!(ids(&c), vec![1, 2, 3]);

        let counts = histogram(SamplingParams { top_p: 0.75, ..plain() }, &logits, 2000);
        assert_eq!(counts[0] + counts[2], 0, "{counts:?}");
        assert!(counts[1] > counts[3] && counts[3] > 0, "{counts:?}");
    }

    #[test]
    fn min_p_drops_tokens_below_the_ratio() {
        let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
        let mut c = candidates(&logits);
        softmax(&mut c, 1.0);
        min_p(&mut c, 0.2); // threshold 0.1
        assert_eq!(ids(&c), vec![0, 1, 2]);
        min_p(&mut c, 0.5); // threshold 0.25
        assert_eq!(ids(&c), vec![0, 1]);

        let counts = histogram(SamplingParams { min_p: 0.5, ..plain() }, &logits, 2000);
        assert_eq!(counts[2] + counts[3], 0, "{counts:?}");
        assert!(counts[0] > 0 && counts[1] > 0, "{counts:?}");
    }

    #[test]
    fn filters_always_keep_one_token() {
        let mut c = candidates(&[2.0, 1.0, 0.0]);
        softmax(&mut c, 1.0);
        min_p(&mut c, 1.0);
        top_p(&mut c, 0.0);
        assert_eq!(ids(&c), vec![0]);
        let strict = SamplingParams { top_k: 1, top_p: 0.0, min_p: 1.0, ..plain() };
        assert_eq!(histogram(strict, &[0.0, 2.0, 1.0], 50)[1], 50);
    }

    #[test]
    fn lower_temperature_concentrates() {
        // Token 0's probability: 0.867 at temperature 0.5, 0.563 at 1.5.
        let logits = [2.0, 1.0, 0.0];
        let draws = 4000;
        let cold = histogram(SamplingParams { temperature: 0.5, ..plain() }, &logits, draws)[0] as f64 / draws as f64;
        let warm = histogram(SamplingParams { temperature: 1.5, ..plain() }, &logits, draws)[0] as f64 / draws as f64;
        assert!((cold - 0.867).abs() < 0.04, "cold {cold}");
        assert!((warm - 0.563).abs() < 0.04, "warm {warm}");
    }

    #[test]
    fn repeat_penalty_lowers_a_repeated_token_below_an_alternative() {
        let p = SamplingParams { repeat_penalty: 1.1, ..SamplingParams::greedy() };
        let mut s = Sampler::new(p);
        // Positive logits are divided: 2.0 / 1.1 = 1.82 < 1.9.
        assert_eq!(s.sample(&[2.0, 1.9], &[]), 0);
        assert_eq!(s.sample(&[2.0, 1.9], &[0]), 1);
        // Negative logits are multiplied: -1.0 * 1.1 = -1.1 < -1.05.
        assert_eq!(s.sample(&[-1.0, -1.05], &[]), 0);
        assert_eq!(s.sample(&[-1.0, -1.05], &[0]), 1);
    }

    #[test]
    fn presence_penalty_is_subtracted_once_per_token() {
        let mut strong = Sampler::new(SamplingParams { presence_penalty: 0.5, ..SamplingParams::greedy() });
        assert_eq!(strong.sample(&[1.0, 0.8], &[0]), 1);
        // 0.1 once (not three times) leaves 0.9 > 0.8.
        let mut weak = Sampler::new(SamplingParams { presence_penalty: 0.1, ..SamplingParams::greedy() });
        assert_eq!(weak.sample(&[1.0, 0.8], &[0, 0, 0]), 0);
    }

    #[test]
    fn penalties_look_only_at_the_window() {
        let logits = [2.0, 1.9, 0.0, 0.0];
        let with_window = |n| SamplingParams { repeat_penalty: 1.5, penalty_window: n, ..SamplingParams::greedy() };
        // Token 0 is three tokens back.
        assert_eq!(Sampler::new(with_window(2)).sample(&logits, &[0, 2, 3]), 0);
        assert_eq!(Sampler::new(with_window(3)).sample(&logits, &[0, 2, 3]), 1);
        assert_eq!(Sampler::new(with_window(usize::MAX)).sample(&logits, &[0, 2, 3]), 1);
        assert_eq!(Sampler::new(with_window(0)).sample(&logits, &[0]), 0);
        // Ids outside the vocabulary are ignored.
        assert_eq!(Sampler::new(with_window(8)).sample(&logits, &[7, u32::MAX]), 0);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_different_tokens() {
        let flat = [0.0f32; 64];
        let run = |seed| {
            let mut s = Sampler::new(SamplingParams { seed, ..plain() });
            (0..50).map(|_| s.sample(&flat, &[])).collect::<Vec<u32>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        // Default filters too.
        let run_default = |seed| {
            let mut s = Sampler::new(SamplingParams { seed, ..SamplingParams::default() });
            (0..50).map(|_| s.sample(&flat, &[])).collect::<Vec<u32>>()
        };
        assert_eq!(run_default(1), run_default(1));
        assert_ne!(run_default(1), run_default(2));
    }

    #[test]
    fn prng_matches_the_reference_outputs() {
        // SplitMix64 from state 0, and xoshiro256** from state [1, 2, 3, 4], as published.
        let mut state = 0;
        assert_eq!(splitmix64(&mut state), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(&mut state), 0x6E78_9E6A_A1B9_65F4);
        let mut rng = Rng { s: [1, 2, 3, 4] };
        let first: Vec<u64> = (0..4).map(|_| rng.next_u64()).collect();
        assert_eq!(first, vec![11520, 0, 1509978240, 1215971899390074240]);
        let mut rng = Rng::new(299_792_458);
        assert!((0..1000).map(|_| rng.next_f64()).all(|x| (0.0..1.0).contains(&x)));
    }

    #[test]
    fn nan_is_never_picked_and_nothing_panics() {
        let nan = f32::NAN;
        let inf = f32::INFINITY;
        assert_eq!(Sampler::new(SamplingParams::greedy()).sample(&[nan, 1.0, nan], &[]), 1);
        let counts = histogram(plain(), &[nan, 0.0, nan, 0.0, nan], 500);
        assert_eq!(counts[0] + counts[2] + counts[4], 0, "{counts:?}");

        // +inf wins every draw, and a penalty cannot turn it into NaN.
        let counts = histogram(plain(), &[1.0, inf, 2.0], 200);
        assert_eq!(counts[1], 200);
        let p = SamplingParams { repeat_penalty: 0.5, presence_penalty: -2.0, ..plain() };
        assert_eq!(Sampler::new(p).sample(&[1.0, inf, 3.0], &[1, 2]), 1);

        // Nothing usable: the lowest id, no panic.
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[nan, nan, nan], &[]), 0);
        assert_eq!(s.sample(&[-inf, -inf, -inf], &[0, 1]), 0);
        assert_eq!(s.sample(&[nan, -inf, -inf], &[]), 0);
        assert_eq!(s.sample(&[], &[3]), 0);
        // Only one finite logit left among -inf and NaN.
        assert_eq!(s.sample(&[-inf, nan, -3.0, -inf], &[]), 2);
    }

    #[test]
    fn large_vocabulary_takes_the_partial_selection_path() {
        const VOCAB: usize = 49_152;
        let mut rng = Rng::new(42);
        let logits: Vec<f32> = (0..VOCAB).map(|_| (rng.next_f64() * 20.0 - 10.0) as f32).collect();
        let mut order: Vec<u32> = (0..VOCAB as u32).collect();
        order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        let mut expected: Vec<u32> = order[..40].to_vec();
        expected.sort_unstable();

        let mut c = candidates(&logits);
        top_k(&mut c, 40);
        assert_eq!(c.len(), 40);
        assert_eq!(ids(&c), expected);

        let mut s = Sampler::new(SamplingParams { top_k: 40, top_p: 1.0, min_p: 0.0, ..SamplingParams::default() });
        for _ in 0..100 {
            let t = s.sample(&logits, &[]);
            assert!(expected.binary_search(&t).is_ok(), "{t} is not in the top 40");
        }
    }

    fn metadata(entries: &[(&str, Value)]) -> HashMap<String, Value> {
        entries.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn from_gguf_reads_numeric_types_and_ignores_bad_ones() {
        let d = SamplingParams::default();
        assert_eq!(SamplingParams::from_gguf(&HashMap::new()), d);

        let p = SamplingParams::from_gguf(&metadata(&[
            (KEY_TEMP, Value::F64(0.7)),
            (KEY_TOP_K, Value::I32(20)),
            (KEY_TOP_P, Value::F32(0.8)),
            (KEY_MIN_P, Value::String("0.1".into())),
            (KEY_PENALTY_REPEAT, Value::F32(1.05)),
            (KEY_PENALTY_LAST_N, Value::U32(128)),
        ]));
        assert_eq!(p.temperature, 0.7);
        assert_eq!(p.top_k, 20);
        assert_eq!(p.top_p, 0.8);
        assert_eq!(p.min_p, 0.1);
        assert_eq!(p.repeat_penalty, 1.05);
        assert_eq!(p.penalty_window, 128);
        assert_eq!((p.presence_penalty, p.seed), (d.presence_penalty, d.seed));

        let p = SamplingParams::from_gguf(&metadata(&[
            (KEY_TEMP, Value::I8(1)),
            (KEY_TOP_K, Value::F32(64.0)),
            (KEY_TOP_P, Value::U8(1)),
            (KEY_PENALTY_LAST_N, Value::I64(-1)),
        ]));
        assert_eq!((p.temperature, p.top_k, p.top_p, p.penalty_window), (1.0, 64, 1.0, usize::MAX));
        assert_eq!(SamplingParams::from_gguf(&metadata(&[(KEY_TOP_K, Value::I32(-1))])).top_k, 0);
        assert_eq!(SamplingParams::from_gguf(&metadata(&[(KEY_TOP_K, Value::U64(u64::MAX))])).top_k, d.top_k);

        let bad = SamplingParams::from_gguf(&metadata(&[
            (KEY_TEMP, Value::F32(f32::NAN)),
            (KEY_TOP_K, Value::F32(40.5)),
            (KEY_TOP_P, Value::F64(f64::INFINITY)),
            (KEY_MIN_P, Value::String("lots".into())),
            (KEY_PENALTY_REPEAT, Value::Bool(true)),
            (KEY_PENALTY_LAST_N, Value::Array(vec![Value::I32(3)])),
            ("general.sampling.mirostat", Value::I32(2)),
        ]));
        assert_eq!(bad, d);
        assert_eq!(SamplingParams::from_gguf(&metadata(&[(KEY_TEMP, Value::F64(1e300))])).temperature, d.temperature);
        assert_eq!(SamplingParams::from_gguf(&metadata(&[(KEY_PENALTY_LAST_N, Value::I32(-5))])).penalty_window, 64);
        // Out of range values are clamped.
        assert_eq!(SamplingParams::from_gguf(&metadata(&[(KEY_TOP_P, Value::F32(1.5))])).top_p, 1.0);
    }

    #[test]
    fn sanitized_fixes_bad_values() {
        let d = SamplingParams::default();
        assert_eq!(d.sanitized(), d);
        assert_eq!(SamplingParams::greedy().sanitized(), SamplingParams::greedy());
        let p = SamplingParams {
            temperature: f32::NAN,
            top_k: 7,
            top_p: 1.5,
            min_p: -0.1,
            repeat_penalty: 0.0,
            presence_penalty: f32::INFINITY,
            penalty_window: 3,
            dry_multiplier: f32::NAN,
            dry_base: 0.5,
            dry_allowed_length: 4,
            dry_penalty_last_n: 7,
            seed: 9,
        }
        .sanitized();
        assert_eq!(
            p,
            SamplingParams {
                temperature: d.temperature,
                top_k: 7,
                top_p: 1.0,
                min_p: 0.0,
                repeat_penalty: d.repeat_penalty,
                presence_penalty: 0.0,
                penalty_window: 3,
                dry_multiplier: d.dry_multiplier,
                dry_base: 1.0,
                dry_allowed_length: 4,
                dry_penalty_last_n: 7,
                seed: 9,
            }
        );
        let p = SamplingParams {
            temperature: -2.0,
            top_p: f32::NEG_INFINITY,
            min_p: 3.0,
            repeat_penalty: 100.0,
            presence_penalty: -7.0,
            ..d
        }
        .sanitized();
        assert_eq!((p.temperature, p.top_p, p.min_p), (0.0, d.top_p, 1.0));
        assert_eq!((p.repeat_penalty, p.presence_penalty), (10.0, -2.0));
        assert_eq!(SamplingParams { temperature: 50.0, ..d }.sanitized().temperature, MAX_TEMPERATURE);
        assert_eq!(SamplingParams { repeat_penalty: f32::NAN, ..d }.sanitized().repeat_penalty, d.repeat_penalty);
        // The sampler works on sanitized values.
        assert_eq!(Sampler::new(SamplingParams { top_p: 9.0, ..d }).params().top_p, 1.0);
    }

    #[test]
    fn params_round_trip_through_json_and_missing_fields_default() {
        let p = SamplingParams { top_k: 12, seed: 5, ..SamplingParams::default() };
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<SamplingParams>(&json).unwrap(), p);
        let partial: SamplingParams = serde_json::from_str(r#"{"temperature": 0.3}"#).unwrap();
        assert_eq!(partial, SamplingParams { temperature: 0.3, ..SamplingParams::default() });
    }

    /// A toy vocabulary for DRY: 0 "a", 1 " The", 2 " capital", 3 " of", 4 " Italy",
    /// 5 " France", 6 "\n", 7 "<", 8 "|", 9 "z".
    const TOY_VOCAB: [&str; 10] = ["a", " The", " capital", " of", " Italy", " France", "\n", "<", "|", "z"];

    /// The toy vocabulary's breakers for "\n" and "<|": token 6 alone, and token 7 when
    /// token 8 follows ("<" ends with the start of "<|", the rest "|" is token 8).
    fn toy_breakers() -> Arc<Breakers> {
        let bytes: Vec<Vec<u8>> = TOY_VOCAB.iter().map(|t| t.as_bytes().to_vec()).collect();
        let tokenize = |s: &str| vec![TOY_VOCAB.iter().position(|t| *t == s).expect("one toy token") as u32];
        Arc::new(Breakers::new(&["\n".into(), "<|".into()], &bytes, tokenize))
    }

    /// The logits after penalties and DRY (no filter), by id.
    fn penalized(params: SamplingParams, breakers: Arc<Breakers>, logits: &[f32], history: &[u32]) -> Vec<f32> {
        let mut s = Sampler::with_breakers(params, breakers);
        s.penalize(logits, history);
        s.candidates.iter().map(|c| c.logit).collect()
    }

    fn assert_close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() < 1e-5, "token {i}: got {g}, want {w} (all: {got:?})");
        }
    }

    /// DRY on hand-made logits and history, every expected number worked out by hand from
    /// llama.cpp's definition (`llama_sampler_dry_apply`): a token that would extend a
    /// repeat of `n >= allowed_length` tokens loses `multiplier * base^(n - allowed_length)`;
    /// `n` may not reach back past the most recent sequence breaker; a token that is a
    /// breaker on its own is never penalized.
    #[test]
    fn dry_matches_llama_cpp_on_hand_made_logits() {
        let logits = [0.5, 1.0, 1.5, 2.0, 3.0, 2.5, 2.2, -1.0, 0.0, 0.7];
        // Index:      0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20
        let history = [7, 8, 1, 2, 3, 4, 0, 1, 2, 3, 5, 2, 3, 6, 3, 8, 7, 8, 1, 2, 3];
        // llama.cpp's recommended values: multiplier 0.8, base 1.75, allowed length 2.
        let params = SamplingParams { dry_multiplier: 0.8, dry_base: 1.75, dry_allowed_length: 2, ..plain() };
        // The history ends with [1, 2, 3] (indices 18-20). Earlier, it was followed by:
        // - 4 (index 5) after [7, 8, 1, 2, 3] (indices 0-4): a repeat of 5 tokens;
        // - 5 (index 10) after [0, 1, 2, 3] (indices 6-9): [1, 2, 3] matches, 3 tokens;
        // - 6 (index 13) after [5, 2, 3] (indices 10-12): [2, 3] matches, 2 tokens;
        // - 8 (index 15) after [6, 3] (indices 13-14): [3] matches, 1 token (under 2: free).
        //
        // With the breakers "\n" (token 6) and "<|" (tokens 7, 8): the most recent breaker
        // is "<|" at indices 16-17, so a repeat counts at most the 3 tokens after it.
        // - token 4: min(5, 3) = 3 -> 0.8 * 1.75^(3 - 2) = 1.4;  3.0 - 1.4 = 1.6
        // - token 5: 3              -> 0.8 * 1.75^1      = 1.4;  2.5 - 1.4 = 1.1
        // - token 6: 2, but "\n" is a breaker on its own: not penalized, stays 2.2
        let want = [0.5, 1.0, 1.5, 2.0, 1.6, 1.1, 2.2, -1.0, 0.0, 0.7];
        assert_close(&penalized(params, toy_breakers(), &logits, &history), &want);

        // Without breakers, nothing caps the repeats and token 6 is an ordinary token:
        // - token 4: 5 -> 0.8 * 1.75^3 = 0.8 * 5.359375 = 4.2875;  3.0 - 4.2875 = -1.2875
        // - token 5: 3 -> 1.4;                                    2.5 - 1.4    =  1.1
        // - token 6: 2 -> 0.8 * 1.75^0 = 0.8;                     2.2 - 0.8    =  1.4
        let want = [0.5, 1.0, 1.5, 2.0, -1.2875, 1.1, 1.4, -1.0, 0.0, 0.7];
        assert_close(&penalized(params, Arc::default(), &logits, &history), &want);

        // Allowed length 3: only repeats of 3 or more count, the exponent is n - 3.
        // - token 4: 5 -> 0.8 * 1.75^2 = 2.45;  3.0 - 2.45 = 0.55
        // - token 5: 3 -> 0.8 * 1.75^0 = 0.8;   2.5 - 0.8  = 1.7
        let longer = SamplingParams { dry_allowed_length: 3, ..params };
        let want = [0.5, 1.0, 1.5, 2.0, 0.55, 1.7, 2.2, -1.0, 0.0, 0.7];
        assert_close(&penalized(longer, Arc::default(), &logits, &history), &want);

        // Penalty window of the last 10 tokens [2, 3, 6, 3, 8, 7, 8, 1, 2, 3]: [1, 2, 3] is
        // followed by nothing in it; [2, 3] by 6, a breaker. Nothing is penalized.
        let window = SamplingParams { dry_penalty_last_n: 10, ..params };
        assert_close(&penalized(window, toy_breakers(), &logits, &history), &logits);

        // Off: multiplier 0, window 0, or a history no longer than the allowed length.
        for off in
            [SamplingParams { dry_multiplier: 0.0, ..params }, SamplingParams { dry_penalty_last_n: 0, ..params }]
        {
            assert_close(&penalized(off, toy_breakers(), &logits, &history), &logits);
        }
        assert_close(&penalized(params, Arc::default(), &logits, &[3, 3]), &logits);

        // The sampler honours it: greedy with DRY set picks 6 (2.2) instead of 4 (3.0).
        let greedy_dry = SamplingParams { dry_multiplier: 0.8, ..SamplingParams::greedy() };
        assert_eq!(Sampler::with_breakers(greedy_dry, toy_breakers()).sample(&logits, &history), 6);
        assert_eq!(Sampler::with_breakers(SamplingParams::greedy(), toy_breakers()).sample(&logits, &history), 4);
    }

    #[test]
    fn dry_loop_penalty_stays_finite() {
        // A loop of 3,000 copies of one token with base 10: 10^2998 would overflow, the
        // exponent is capped (llama.cpp: at ln(f32::MAX) / ln(base) = 38), so the logit
        // becomes very negative but finite, and the other token wins.
        let history = vec![1u32; 3000];
        let p = SamplingParams { dry_multiplier: 1.0, dry_base: 10.0, ..SamplingParams::greedy() };
        let got = penalized(p, Arc::default(), &[0.0, 5.0], &history);
        assert!(got[1].is_finite() && got[1] < -1e37, "{got:?}");
        assert_eq!(Sampler::new(p).sample(&[0.0, 5.0], &history), 0);
    }

    #[test]
    fn greedy_turns_every_penalty_off_unless_set() {
        let d = SamplingParams { repeat_penalty: 1.3, presence_penalty: 0.5, ..SamplingParams::default() };
        let greedy = SamplingOverrides::greedy().apply(d);
        assert_eq!((greedy.repeat_penalty, greedy.presence_penalty, greedy.dry_multiplier), (1.0, 0.0, 0.0));
        // The default sampling keeps them.
        let sampled = SamplingOverrides::default().apply(d);
        assert_eq!((sampled.repeat_penalty, sampled.presence_penalty, sampled.dry_multiplier), (1.3, 0.5, 0.8));
        // Set explicitly, they stay on with greedy too.
        let set = SamplingOverrides {
            repeat_penalty: Some(1.2),
            dry_multiplier: Some(0.5),
            dry_allowed_length: Some(3),
            ..SamplingOverrides::greedy()
        }
        .apply(d);
        assert_eq!((set.repeat_penalty, set.presence_penalty, set.dry_multiplier), (1.2, 0.0, 0.5));
        assert_eq!(set.dry_allowed_length, 3);
        // A model whose own default temperature is 0 is greedy the same way.
        let zero = SamplingOverrides::default().apply(SamplingParams { temperature: 0.0, ..d });
        assert_eq!((zero.repeat_penalty, zero.dry_multiplier), (1.0, 0.0));
    }

    #[test]
    fn defaults_are_dry_on_and_the_token_penalty_off() {
        let d = SamplingParams::default();
        assert_eq!((d.repeat_penalty, d.presence_penalty), (1.0, 0.0));
        assert_eq!((d.dry_multiplier, d.dry_base, d.dry_allowed_length), (0.8, 1.75, 2));
        assert_eq!(d.dry_penalty_last_n, usize::MAX);
        assert_eq!(DEFAULT_BREAKERS, ["\n", ":", "\"", "*"]);
    }
}
