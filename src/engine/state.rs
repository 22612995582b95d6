//! The KV cache as an object of its own (Core ML calls it `MLState`): per-layer key and
//! value buffers plus the token ids they encode. It outlives single calls and chat turns;
//! the model only appends to it.
//!
//! A hybrid model's other layers (short convolutions, gated delta-net) keep a *recurrent*
//! state instead: a few tensors each call reads and replaces, of a fixed size whatever the
//! length. It cannot drop its last tokens, so the state keeps copies of it
//! ([`State::checkpoint`], taken at turn boundaries) and [`State::truncate`] goes back to
//! the latest copy at or before the cut: the caller re-feeds the tokens between the two.
//!
//! Buffers are `(1, n_kv_heads, capacity, head_dim)` (for a q8_0 cache, `head_dim / 32 · 34`
//! bytes per row: see [`KvDtype`]) and written in place. Capacity grows
//! in chunks of [`GROWTH_CHUNK`] tokens up to `max_tokens` (the budget), so a long chat
//! never pays a `Tensor::cat` per token, and a short one never holds a full-budget buffer.
//!
//! A sliding-window layer (Gemma's, whose queries see the last `window` positions) keeps
//! at most `window + `[`WINDOW_SLACK`] rows: a contiguous run of the latest positions
//! `base..len`. When a write would pass its end, the last `window - 1` rows move to the
//! front and `base` advances (a copy of the window every [`WINDOW_SLACK`] tokens):
//!
//! ```text
//!   global layer:  [ 0 ........................................ len )
//!   sliding layer:              [ base ........... len )   (≤ window + slack rows)
//! ```
//!
//! Going back to a length whose window is no longer held cannot be done in place:
//! [`State::truncate`] then empties the state and the caller re-feeds everything (the
//! deeper layers' keys depend on the whole window before each position).

use candle_core::{DType, Device, Tensor};

use super::kv_type::KvDtype;
use super::{Cause, EngineError, Result};

/// Tokens added to the capacity each time the cache grows.
pub const GROWTH_CHUNK: usize = 256;

/// Granularity of [`State::shrink_to_fit`]: finer than growth, so an eviction gives
/// memory back even when the budget is a single chunk.
pub const SHRINK_QUANTUM: usize = 32;

/// Checkpoints of the recurrent state kept at most: the latest turn boundaries.
pub const MAX_CHECKPOINTS: usize = 4;

/// Rows a sliding-window layer holds beyond its window: the most tokens one write may add
/// (less one), and how often the window moves to the front. At least a prefill chunk.
pub const WINDOW_SLACK: usize = 256;

/// Rows a sliding-window layer of `window` positions holds at most.
pub fn window_rows(window: usize) -> usize {
    window + WINDOW_SLACK
}

struct LayerKv {
    k: Tensor,
    v: Tensor,
}

/// What one layer keeps between calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerMemory {
    /// Keys and values of every position (attention).
    KeysValues,
    /// Tensors of these shapes, replaced by each call (zeros before the first token).
    Recurrent(Vec<Vec<usize>>),
    /// Nothing of its own: the layer attends over the keys and values of the earlier
    /// layer of this index (Gemma 4's last layers).
    SharedKeysValues(usize),
}

/// The recurrent tensors of every layer (`None` for attention layers) after `len` tokens.
struct Checkpoint {
    len: usize,
    layers: Vec<Option<Vec<Tensor>>>,
}

pub struct State {
    /// Token ids must be below this (the model's embedding rows).
    vocab_size: usize,
    n_kv_heads: usize,
    /// Each layer's head size (Gemma 4's sliding and global layers differ).
    head_dims: Vec<usize>,
    max_tokens: usize,
    kv: KvDtype,
    device: Device,
    capacity: usize,
    /// Positions a sliding-window layer's queries see (`None`: every layer keeps every
    /// position).
    window: Option<usize>,
    /// During an import: the saved sliding layers' first position, and the saved length.
    import_from: usize,
    import_len: usize,
    /// Per layer, whether it slides over `window` positions (and holds only those).
    sliding: Vec<bool>,
    /// The first position the sliding layers hold (their row 0).
    base: usize,
    /// K/V buffers of the attention layers (`None` before the first reserve, and for
    /// recurrent layers).
    layers: Vec<Option<LayerKv>>,
    memory: Vec<LayerMemory>,
    /// The recurrent layers' tensors now; `None` for attention layers, and for zeros not
    /// yet allocated (each [`State::reserve`] allocates them).
    recurrent: Vec<Option<Vec<Tensor>>>,
    /// Copies of `recurrent` at earlier lengths, oldest first.
    checkpoints: Vec<Checkpoint>,
    tokens: Vec<u32>,
}

impl State {
    /// A state for a model whose layers keep `memory` and have heads of `head_dims` (one
    /// entry per layer each).
    pub(crate) fn new(
        vocab_size: usize,
        memory: Vec<LayerMemory>,
        n_kv_heads: usize,
        head_dims: Vec<usize>,
        max_tokens: usize,
        kv: KvDtype,
        device: Device,
    ) -> State {
        debug_assert_eq!(memory.len(), head_dims.len());
        State {
            vocab_size,
            n_kv_heads,
            head_dims,
            max_tokens,
            kv,
            device,
            capacity: 0,
            window: None,
            import_from: 0,
            import_len: 0,
            sliding: vec![false; memory.len()],
            base: 0,
            layers: memory.iter().map(|_| None).collect(),
            recurrent: memory.iter().map(|_| None).collect(),
            memory,
            checkpoints: Vec::new(),
            tokens: Vec::new(),
        }
    }

    /// Makes the layers marked in `sliding` keep only the last positions their queries see
    /// (`window`, itself included); called on an empty state.
    pub(crate) fn with_sliding_window(mut self, window: usize, sliding: Vec<bool>) -> State {
        debug_assert!(self.is_empty() && self.capacity == 0 && sliding.len() == self.memory.len());
        self.window = Some(window.max(1));
        self.sliding = sliding;
        self
    }

    /// Makes every layer keep every position, as before sliding layers kept only their
    /// window: the reference the windowed cache is checked against. On an empty state
    /// only (a no-op otherwise).
    pub fn keep_every_position(&mut self) {
        if self.is_empty() {
            self.window = None;
            self.sliding.iter_mut().for_each(|s| *s = false);
            self.resize(self.capacity).expect("same size");
        }
    }

    /// Positions a sliding-window layer keeps and sees (`None` without such layers, or
    /// with [`State::keep_every_position`]).
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Per layer, whether it holds only its window.
    pub fn sliding_layers(&self) -> &[bool] {
        &self.sliding
    }

    /// The first position the sliding-window layers hold: 0 until the conversation passes
    /// their rows (see [`window_rows`]).
    pub fn window_base(&self) -> usize {
        self.base
    }

    /// The first position layer `index` holds.
    pub(crate) fn held_from(&self, index: usize) -> usize {
        if self.sliding[index] {
            self.base
        } else {
            0
        }
    }

    /// Rows layer `index`'s buffers have at `capacity`.
    fn rows_at(&self, index: usize, capacity: usize) -> usize {
        match (self.sliding[index], self.window) {
            (true, Some(w)) => capacity.min(window_rows(w)),
            _ => capacity,
        }
    }

    /// The most new tokens one write may add: a sliding layer must keep the window
    /// before the first of them.
    pub(crate) fn max_write(&self) -> usize {
        match self.window {
            Some(_) if self.sliding.contains(&true) => WINDOW_SLACK + 1,
            _ => usize::MAX,
        }
    }

    /// Tokens that can be added before the sliding-window layers' window moves (and the
    /// positions before it can no longer be gone back to in place); unbounded without
    /// such layers.
    pub fn room_before_window_moves(&self) -> usize {
        match self.window {
            Some(w) if self.sliding.contains(&true) => window_rows(w).saturating_sub(self.len() - self.base),
            _ => usize::MAX,
        }
    }

    /// Whether a state of `len` tokens whose sliding layers hold from `base` on still
    /// holds the window its next token's queries need.
    fn holds_window(&self, base: usize, len: usize) -> bool {
        base == 0 || self.window.is_some_and(|w| len >= base + w - 1)
    }

    /// Token ids this state may hold are below this.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Token ids the cache encodes, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Tokens the buffers can hold without growing.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The most tokens this state may ever hold (the budget it was made for).
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// `(n_kv_heads, head_dim)` of every layer's buffers: the largest head size where
    /// layers differ (see [`State::stored_head_dims`]).
    pub fn shape(&self) -> (usize, usize) {
        (self.n_kv_heads, self.head_dims.iter().copied().max().unwrap_or(0))
    }

    /// Per layer, the head size of the keys and values it keeps, 0 for a layer that keeps
    /// none (a recurrent layer, or a Gemma 4 layer reading an earlier layer's): what
    /// [`State::export`] gives, in order.
    pub fn stored_head_dims(&self) -> Vec<usize> {
        self.memory
            .iter()
            .zip(&self.head_dims)
            .map(|(m, &d)| if *m == LayerMemory::KeysValues { d } else { 0 })
            .collect()
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The cache's element type.
    pub fn dtype(&self) -> KvDtype {
        self.kv
    }

    /// Changes the most tokens this state may hold; shrinking below `len()` is refused.
    pub fn set_max_tokens(&mut self, max_tokens: usize) {
        self.max_tokens = max_tokens.max(self.len());
    }

    /// Bytes the state occupies now: the K/V buffers, the recurrent tensors and their
    /// checkpoints.
    pub fn bytes(&self) -> u64 {
        self.kv_bytes() + self.recurrent_bytes()
    }

    /// Bytes of the K/V buffers (a sliding-window layer's at most its window's rows).
    pub fn kv_bytes(&self) -> u64 {
        let row_bytes: usize = self
            .stored_head_dims()
            .iter()
            .enumerate()
            .map(|(i, &head_dim)| self.kv.row_bytes(head_dim) * self.rows_at(i, self.capacity))
            .sum();
        (2 * self.n_kv_heads * row_bytes) as u64
    }

    /// Bytes of the recurrent tensors and their checkpoints (0 without recurrent layers).
    pub fn recurrent_bytes(&self) -> u64 {
        let copies = 1 + self.checkpoints.len() as u64;
        copies * recurrent_bytes_of(&self.memory)
    }

    /// Whether some layers keep a recurrent state (which cannot drop its last tokens).
    pub fn is_recurrent(&self) -> bool {
        self.memory.iter().any(|m| matches!(m, LayerMemory::Recurrent(_)))
    }

    /// What each layer keeps.
    pub fn memory(&self) -> &[LayerMemory] {
        &self.memory
    }

    /// Forgets all tokens and checkpoints; buffers stay allocated for the next conversation.
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.base = 0;
        self.checkpoints.clear();
        self.zero_recurrent();
    }

    fn zero_recurrent(&mut self) {
        self.recurrent.iter_mut().for_each(|slot| *slot = None);
    }

    /// Keeps at most the first `n` tokens and returns how many it kept: `n` (or `len()`
    /// when shorter) for a plain transformer. A recurrent state goes back to its latest
    /// checkpoint at or before `n` (to nothing without one) and forgets later ones; the
    /// caller re-feeds the tokens from there to `n`. So does a state whose sliding-window
    /// layers no longer hold the window before `n`: it goes back to nothing.
    pub fn truncate(&mut self, n: usize) -> usize {
        if n >= self.len() {
            return self.len();
        }
        if !self.holds_window(self.base, n) {
            self.reset();
            return 0;
        }
        if !self.is_recurrent() {
            self.tokens.truncate(n);
            return n;
        }
        self.checkpoints.retain(|c| c.len <= n);
        match self.checkpoints.last() {
            Some(c) => {
                self.recurrent = c.layers.clone();
                self.tokens.truncate(c.len);
            }
            None => {
                self.zero_recurrent();
                self.tokens.clear();
            }
        }
        if !self.holds_window(self.base, self.len()) {
            self.reset();
        }
        self.len()
    }

    /// Copies the recurrent state at the current length, so that a later
    /// [`State::truncate`] to this length or past it needs not re-feed what came before.
    /// Keeps the latest [`MAX_CHECKPOINTS`]; nothing for a plain transformer. The copies
    /// are new tensors: the layers replace, never write into, their recurrent tensors.
    /// None is taken of an empty state: truncating to nothing needs none.
    pub fn checkpoint(&mut self) {
        if !self.is_recurrent() || self.is_empty() {
            return;
        }
        let len = self.len();
        self.checkpoints.retain(|c| c.len != len);
        self.checkpoints.push(Checkpoint { len, layers: self.recurrent.clone() });
        if self.checkpoints.len() > MAX_CHECKPOINTS {
            self.checkpoints.remove(0);
        }
    }

    /// Lengths at which checkpoints are kept, oldest first.
    pub fn checkpoint_lengths(&self) -> Vec<usize> {
        self.checkpoints.iter().map(|c| c.len).collect()
    }

    /// Layer `index`'s recurrent tensors, in the order of its [`LayerMemory::Recurrent`]
    /// shapes.
    pub(crate) fn recurrent(&self, index: usize) -> &[Tensor] {
        self.recurrent[index].as_deref().expect("reserve() runs before recurrent(), on a recurrent layer")
    }

    /// Replaces layer `index`'s recurrent tensors with the ones after the call's tokens.
    pub(crate) fn set_recurrent(&mut self, index: usize, tensors: Vec<Tensor>) {
        debug_assert!(matches!(self.memory[index], LayerMemory::Recurrent(_)), "layer {index} is not recurrent");
        self.recurrent[index] = Some(tensors);
    }

    /// Reallocates the buffers to fit the current tokens (rounded up to [`SHRINK_QUANTUM`])
    /// and returns the bytes given back.
    pub fn shrink_to_fit(&mut self) -> Result<u64> {
        let target = self.len().div_ceil(SHRINK_QUANTUM) * SHRINK_QUANTUM;
        if target >= self.capacity {
            return Ok(0);
        }
        let before = self.kv_bytes();
        self.resize(target)?;
        Ok(before - self.kv_bytes())
    }

    /// Makes sure `needed` tokens fit, growing by whole chunks.
    pub(crate) fn reserve(&mut self, needed: usize) -> Result<()> {
        for &head_dim in self.stored_head_dims().iter().filter(|&&d| d > 0) {
            self.kv.check_head_dim(head_dim).map_err(|e| EngineError::Inference(Cause::msg(e)))?;
        }
        for (slot, memory) in self.recurrent.iter_mut().zip(&self.memory) {
            if slot.is_none() {
                *slot = zeros(memory, &self.device)?;
            }
        }
        if needed <= self.capacity {
            return Ok(());
        }
        let target = (needed.div_ceil(GROWTH_CHUNK) * GROWTH_CHUNK).min(self.max_tokens.max(needed));
        self.resize(target)
    }

    fn resize(&mut self, capacity: usize) -> Result<()> {
        let len = self.len();
        for i in 0..self.layers.len() {
            if capacity == 0 || self.memory[i] != LayerMemory::KeysValues {
                self.layers[i] = None;
                continue;
            }
            let rows = self.rows_at(i, capacity);
            if self.layers[i].as_ref().is_some_and(|l| l.k.dim(2).ok() == Some(rows)) {
                // A sliding layer already at its window's rows.
                continue;
            }
            let shape = (1, self.n_kv_heads, rows, self.kv.row_width(self.head_dims[i]));
            let k = Tensor::zeros(shape, self.kv.storage_dtype(), &self.device)?;
            let v = Tensor::zeros(shape, self.kv.storage_dtype(), &self.device)?;
            let held = len - self.held_from(i);
            if let Some(old) = self.layers[i].take() {
                if held > 0 {
                    k.slice_set(&old.k.narrow(2, 0, held)?.contiguous()?, 2, 0)?;
                    v.slice_set(&old.v.narrow(2, 0, held)?.contiguous()?, 2, 0)?;
                }
            }
            self.layers[i] = Some(LayerKv { k, v });
        }
        self.capacity = capacity;
        Ok(())
    }

    /// Makes room in the sliding-window layers for `n` new tokens after the current
    /// ones (at most [`State::max_write`]; [`State::reserve`] has made room in the
    /// others): when they would pass the end of the buffers, the last `window - 1` rows
    /// move to the front and the base advances.
    pub(crate) fn make_room(&mut self, n: usize) -> Result<()> {
        let Some(window) = self.window.filter(|_| self.sliding.contains(&true)) else { return Ok(()) };
        let len = self.len();
        if len + n - self.base <= window_rows(window).min(self.capacity) {
            return Ok(());
        }
        debug_assert!(n <= self.max_write(), "{n} new tokens past the window's slack");
        let base = (len + 1).saturating_sub(window).max(self.base);
        let (from, keep) = (base - self.base, len - base);
        for (layer, _) in self.layers.iter().zip(&self.sliding).filter(|(_, s)| **s) {
            let Some(layer) = layer else { continue };
            if keep > 0 {
                // Copied out first: the rows overlap their destination.
                let (k, v) = (owned_rows(&layer.k, from, keep)?, owned_rows(&layer.v, from, keep)?);
                layer.k.slice_set(&k, 2, 0)?;
                layer.v.slice_set(&v, 2, 0)?;
            }
        }
        self.base = base;
        Ok(())
    }

    /// Writes `k`, `v` of shape `(1, n_kv_heads, n, head_dim)` at position `pos` of layer
    /// `index` (quantized for a q8_0 cache).
    pub(crate) fn write(&mut self, index: usize, pos: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let row = pos - self.held_from(index);
        let layer = self.layers[index].as_ref().expect("reserve() runs before write()");
        layer.k.slice_set(&self.kv.store(k)?, 2, row)?;
        layer.v.slice_set(&self.kv.store(v)?, 2, row)?;
        Ok(())
    }

    /// Keys and values of positions `first..end` of a layer as f32
    /// `(n_kv_heads, end - first, head_dim)`; `first` at or after [`State::held_from`].
    pub(crate) fn live(&self, index: usize, first: usize, end: usize) -> Result<(Tensor, Tensor)> {
        let layer = self.layers[index].as_ref().expect("reserve() runs before live()");
        let from = self.held_from(index);
        if first < from {
            let msg = format!("position {first} is no longer held (layer {index} holds from {from})");
            return Err(EngineError::Inference(Cause::msg(msg)));
        }
        let k = self.kv.load(&layer.k.narrow(2, first - from, end - first)?.squeeze(0)?)?;
        let v = self.kv.load(&layer.v.narrow(2, first - from, end - first)?.squeeze(0)?)?;
        Ok((k, v))
    }

    /// The whole K/V buffers of a layer, `(1, n_kv_heads, capacity, row)` in the cache's
    /// storage (a row is `head_dim` values, or for q8_0 `head_dim / 32 · 34` bytes);
    /// positions past the live ones hold stale data.
    pub(crate) fn buffers(&self, index: usize) -> (&Tensor, &Tensor) {
        let layer = self.layers[index].as_ref().expect("reserve() runs before buffers()");
        (&layer.k, &layer.v)
    }

    /// Records the token ids whose K/V were just written by every layer.
    pub(crate) fn commit(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }

    /// The first position the sliding layers would hold after positions `start..end` are
    /// shifted out.
    fn base_after_shift(&self, start: usize, end: usize) -> usize {
        match self.base {
            b if b <= start => b,
            b if b < end => start,
            b => b - (end - start),
        }
    }

    /// Whether [`State::shift_out`] of `start..end` leaves the sliding layers the window
    /// their next queries need (else the caller re-feeds what it keeps).
    pub fn can_shift_out(&self, start: usize, end: usize) -> bool {
        start <= end
            && end <= self.len()
            && self.holds_window(self.base_after_shift(start, end), self.len() - (end - start))
    }

    /// Removes positions `start..end`, moving the later entries down. `rotate_keys` gets a
    /// layer's index and its moved keys as f32 `(n_kv_heads, tail, head_dim)` and returns
    /// them re-rotated (a q8_0 cache's keys are dequantized, rotated and quantized again;
    /// its values move as they are). A sliding layer moves the later positions it holds
    /// (see [`State::can_shift_out`]).
    pub(crate) fn shift_out(
        &mut self,
        start: usize,
        end: usize,
        rotate_keys: impl Fn(usize, &Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<()> {
        let len = self.len();
        let base = self.base_after_shift(start, end);
        for (index, layer) in self.layers.iter().enumerate() {
            let Some(layer) = layer else { continue };
            let from = self.held_from(index);
            let (moved, to) = match self.sliding[index] {
                // Positions max(end, base).. move to the row of their new position.
                true => (end.max(from), end.max(from) - (end - start) - base),
                false => (end, start),
            };
            let tail = len - moved;
            if tail == 0 {
                continue;
            }
            let k = self.kv.load(&owned_rows(&layer.k, moved - from, tail)?.squeeze(0)?)?.contiguous()?;
            let k = self.kv.store(&rotate_keys(index, &k)?.unsqueeze(0)?)?.contiguous()?;
            let v = owned_rows(&layer.v, moved - from, tail)?;
            layer.k.slice_set(&k, 2, to)?;
            layer.v.slice_set(&v, 2, to)?;
        }
        self.tokens.drain(start..end);
        self.base = base;
        Ok(())
    }

    /// Per-layer K/V of the held positions, for saving: `(k, v)` each `(n_kv, len - from,
    /// row)` in the cache's storage (see [`State::buffers`]), where `from` is 0, or
    /// [`State::window_base`] for a sliding-window layer; one layer at a time (copying
    /// every layer at once would double the cache's memory at
    /// each save).
    pub(crate) fn export(&self) -> impl Iterator<Item = Result<(Tensor, Tensor)>> + '_ {
        let len = self.len();
        self.layers.iter().enumerate().filter(move |(_, l)| l.is_some() && len > 0).map(move |(i, l)| {
            let l = l.as_ref().expect("filtered");
            let held = len - self.held_from(i);
            Ok((l.k.narrow(2, 0, held)?.squeeze(0)?.contiguous()?, l.v.narrow(2, 0, held)?.squeeze(0)?.contiguous()?))
        })
    }

    /// Empties the cache and makes room for `tokens`, whose K/V [`State::import_layer`]
    /// then writes one layer at a time; the tokens count once every layer is written.
    /// The saved sliding layers hold from `saved_base` on (0 for a file of a full cache);
    /// this state's from that or later, as many as they have rows for.
    pub(crate) fn begin_import(&mut self, tokens: usize, saved_base: usize) -> Result<()> {
        self.reset();
        self.reserve(tokens)?;
        if let Some(w) = self.window {
            self.base = saved_base.max(tokens.saturating_sub(window_rows(w)));
        }
        self.import_from = saved_base;
        self.import_len = tokens;
        Ok(())
    }

    /// Writes layer `index`'s saved K/V (shapes as from [`State::export`]: positions from
    /// 0, or from the saved base for a sliding layer): float rows of `head_dim` values, or
    /// q8_0 rows (a `U8` tensor, as a q8_0 cache exports them), converted to this cache's
    /// type where it differs.
    pub(crate) fn import_layer(&mut self, index: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let saved_from = if self.sliding[index] { self.import_from } else { 0 };
        let from = self.held_from(index);
        let rows = self.import_len - from;
        let (k, v) =
            (k.narrow(1, from - saved_from, rows)?.unsqueeze(0)?, v.narrow(1, from - saved_from, rows)?.unsqueeze(0)?);
        let (k, v) = match (k.dtype(), self.kv) {
            (DType::U8, KvDtype::Q8_0) => (k.contiguous()?, v.contiguous()?),
            (DType::U8, _) => (self.kv.store(&KvDtype::Q8_0.load(&k)?)?, self.kv.store(&KvDtype::Q8_0.load(&v)?)?),
            _ => (self.kv.store(&k)?, self.kv.store(&v)?),
        };
        let layer = self.layers[index].as_ref().expect("begin_import() runs before import_layer()");
        layer.k.slice_set(&k.contiguous()?, 2, 0)?;
        layer.v.slice_set(&v.contiguous()?, 2, 0)?;
        Ok(())
    }

    /// The recurrent tensors of every recurrent layer (in layer order, each layer's in
    /// the order of its shapes), for saving: `(length, tensors)` now, then at each
    /// checkpoint, oldest first. Empty for a plain transformer or an empty state.
    pub(crate) fn recurrent_snapshots(&self) -> Vec<(usize, Vec<Tensor>)> {
        if !self.is_recurrent() || self.is_empty() {
            return Vec::new();
        }
        let flat = |layers: &[Option<Vec<Tensor>>]| layers.iter().flatten().flatten().cloned().collect::<Vec<_>>();
        std::iter::once((self.len(), flat(&self.recurrent)))
            .chain(self.checkpoints.iter().map(|c| (c.len, flat(&c.layers))))
            .collect()
    }

    /// Puts saved recurrent tensors back during an import (after
    /// [`State::begin_import`]), as [`State::recurrent_snapshots`] gave them: the first
    /// entry is the state now, the others its checkpoints. Shapes are checked.
    pub(crate) fn import_recurrent(&mut self, snapshots: Vec<(usize, Vec<Tensor>)>) -> Result<()> {
        let mut grouped = Vec::with_capacity(snapshots.len());
        for (len, tensors) in snapshots {
            let mut tensors = tensors.into_iter();
            let mut layers = Vec::with_capacity(self.memory.len());
            for memory in &self.memory {
                let LayerMemory::Recurrent(shapes) = memory else {
                    layers.push(None);
                    continue;
                };
                let mut layer = Vec::with_capacity(shapes.len());
                for shape in shapes {
                    let t = tensors.next().ok_or_else(|| EngineError::Inference(Cause::msg("too few tensors")))?;
                    if t.dims() != shape.as_slice() {
                        let msg = format!("a recurrent tensor is {:?}, {shape:?} expected", t.dims());
                        return Err(EngineError::Inference(Cause::msg(msg)));
                    }
                    layer.push(t.to_dtype(DType::F32)?.to_device(&self.device)?);
                }
                layers.push(Some(layer));
            }
            if tensors.next().is_some() {
                return Err(EngineError::Inference(Cause::msg("too many recurrent tensors")));
            }
            grouped.push((len, layers));
        }
        let mut grouped = grouped.into_iter();
        if let Some((_, now)) = grouped.next() {
            self.recurrent = now;
        }
        self.checkpoints = grouped.map(|(len, layers)| Checkpoint { len, layers }).collect();
        Ok(())
    }

    /// Ends an import: the cache now holds `tokens`.
    pub(crate) fn finish_import(&mut self, tokens: Vec<u32>) {
        self.tokens = tokens;
    }

    /// Whether a saved state of `len` tokens whose sliding layers hold from `base` on is
    /// one this state can continue (see [`State::begin_import`]).
    pub(crate) fn can_import(&self, len: usize, base: usize) -> bool {
        base <= len && (base == 0 || (self.window.is_some() && self.holds_window(base, len)))
    }
}

/// Rows `from..from + n` of a `(1, heads, rows, head_dim)` buffer in storage of their
/// own, contiguous: they may be written back into the buffer they come from.
fn owned_rows(t: &Tensor, from: usize, n: usize) -> candle_core::Result<Tensor> {
    let rows = t.narrow(2, from, n)?;
    if rows.is_contiguous() {
        rows.copy()
    } else {
        rows.contiguous()
    }
}

/// Zeros of a recurrent layer's shapes; `None` for an attention layer.
fn zeros(memory: &LayerMemory, device: &Device) -> Result<Option<Vec<Tensor>>> {
    match memory {
        LayerMemory::KeysValues | LayerMemory::SharedKeysValues(_) => Ok(None),
        LayerMemory::Recurrent(shapes) => {
            Ok(Some(shapes.iter().map(|s| Tensor::zeros(s.as_slice(), DType::F32, device)).collect::<Result<_, _>>()?))
        }
    }
}

/// Bytes of one copy of the recurrent tensors of layers keeping `memory` (f32).
pub fn recurrent_bytes_of(memory: &[LayerMemory]) -> u64 {
    let elements: usize = memory
        .iter()
        .map(|m| match m {
            LayerMemory::KeysValues | LayerMemory::SharedKeysValues(_) => 0,
            LayerMemory::Recurrent(shapes) => shapes.iter().map(|s| s.iter().product::<usize>()).sum(),
        })
        .sum();
    (elements * DType::F32.size_in_bytes()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two attention layers, the first sliding over `window` positions; heads of 2 values
    /// holding each position's number, so what a layer holds can be read back.
    fn windowed(window: usize, max_tokens: usize) -> State {
        let memory = vec![LayerMemory::KeysValues, LayerMemory::KeysValues];
        State::new(100, memory, 1, vec![2, 2], max_tokens, KvDtype::F32, Device::Cpu)
            .with_sliding_window(window, vec![true, false])
    }

    /// Feeds `n` tokens as the forward does: in parts of at most `max_write`, each room,
    /// then each layer's rows, then the ids.
    fn feed(state: &mut State, n: usize) {
        let part = n.min(state.max_write());
        if part < n {
            feed(state, part);
            return feed(state, n - part);
        }
        let pos = state.len();
        state.reserve(pos + n).unwrap();
        state.make_room(n).unwrap();
        let rows: Vec<f32> = (pos..pos + n).flat_map(|p| [p as f32, p as f32]).collect();
        let t = Tensor::from_vec(rows, (1, 1, n, 2), &Device::Cpu).unwrap();
        for layer in 0..2 {
            state.write(layer, pos, &t, &t).unwrap();
        }
        state.commit(&vec![1; n]);
    }

    fn positions(state: &State, layer: usize, first: usize) -> Vec<usize> {
        let (k, _) = state.live(layer, first, state.len()).unwrap();
        k.squeeze(0).unwrap().to_vec2::<f32>().unwrap().iter().map(|r| r[0] as usize).collect()
    }

    #[test]
    fn a_sliding_layer_holds_its_window_and_moves_it_to_the_front() {
        let (window, rows) = (4, window_rows(4));
        let mut state = windowed(window, 4096);
        feed(&mut state, rows);
        assert_eq!(state.window_base(), 0, "the rows are full, nothing moved yet");
        feed(&mut state, 1);
        assert_eq!(state.window_base(), rows + 1 - window, "the last window - 1 rows moved to the front");
        for _ in 0..3 * WINDOW_SLACK {
            feed(&mut state, 1);
        }
        let len = state.len();
        let base = state.window_base();
        assert!(len - base <= rows && len - base >= window - 1);
        assert_eq!(positions(&state, 0, len - window), (len - window..len).collect::<Vec<_>>());
        assert_eq!(positions(&state, 1, 0), (0..len).collect::<Vec<_>>(), "the global layer keeps every one");
        assert!(state.live(0, base - 1, len).is_err(), "a position before the base is gone");
        // The sliding layer's buffers stay at their rows; the global one's grow.
        let per_row = (2 * 2 * 4) as u64;
        assert_eq!(state.kv_bytes(), per_row * (state.capacity() + rows) as u64);
        // A write of more than the slack's worth at once is the caller's to split.
        assert_eq!(state.max_write(), WINDOW_SLACK + 1);
        feed(&mut state, WINDOW_SLACK + 1);
        let len = state.len();
        assert_eq!(
            positions(&state, 0, len - WINDOW_SLACK - window),
            (len - WINDOW_SLACK - window..len).collect::<Vec<_>>()
        );
    }

    #[test]
    fn truncating_past_the_held_window_empties_the_state() {
        let window = 4;
        let mut state = windowed(window, 4096);
        feed(&mut state, 1000);
        let base = state.window_base();
        assert!(base > 0);
        assert_eq!(state.truncate(base + window), base + window);
        assert_eq!(state.truncate(base + window - 1), base + window - 1, "the window before the next token is held");
        assert_eq!(state.truncate(base + window - 2), 0, "it is not: fed again from the start");
        assert_eq!((state.len(), state.window_base()), (0, 0));
        // From the start again, the same positions are held as before.
        feed(&mut state, 300);
        assert_eq!(positions(&state, 0, 296), vec![296, 297, 298, 299]);
    }

    #[test]
    fn a_shift_keeps_the_held_rows_where_the_window_survives() {
        let window = 4;
        let mut state = windowed(window, 4096);
        feed(&mut state, 600);
        let (len, base) = (state.len(), state.window_base());
        // Positions before the base: the held rows all move down unchanged.
        assert!(state.can_shift_out(10, 20));
        state.shift_out(10, 20, |_, k| Ok(k.clone())).unwrap();
        assert_eq!((state.len(), state.window_base()), (len - 10, base - 10));
        let held = positions(&state, 0, state.window_base());
        assert_eq!(held, (base..len).collect::<Vec<_>>(), "the same rows, now at 10 positions less");
        assert_eq!(positions(&state, 1, 0).len(), len - 10);
        // Reaching into the last window: refused.
        let len = state.len();
        assert!(!state.can_shift_out(10, len - 1));
        assert!(state.can_shift_out(0, len), "to nothing: nothing is needed");
    }

    #[test]
    fn keeping_every_position_grows_every_layer() {
        let mut state = windowed(4, 4096);
        state.keep_every_position();
        feed(&mut state, 1000);
        assert_eq!(state.window_base(), 0);
        assert_eq!(positions(&state, 0, 0), (0..1000).collect::<Vec<_>>());
        assert_eq!(state.max_write(), usize::MAX);
    }

    /// Saved K/V of one type written into a cache of another: q8_0 blocks are widened,
    /// float values quantized, each exactly as a write of those values would store them;
    /// blocks into a q8_0 cache are kept byte for byte.
    #[test]
    fn imports_convert_between_types() {
        use crate::engine::kv_type::{dequantize, quantize};
        let state = |kv| State::new(10, vec![LayerMemory::KeysValues], 2, vec![64], 16, kv, Device::Cpu);
        let x = Tensor::randn(0f32, 1.0, (2, 5, 64), &Device::Cpu).unwrap();
        let blocks = quantize(&x).unwrap();
        let widened = dequantize(&blocks).unwrap();
        let max_diff =
            |a: &Tensor, b: &Tensor| (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        for kv in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0] {
            let mut s = state(kv);
            s.begin_import(5, 0).unwrap();
            s.import_layer(0, &blocks, &blocks).unwrap();
            let (k, v) = s.live(0, 0, 5).unwrap();
            // f16 rounds the widened values once more (≤ 2⁻¹¹ relative).
            let want = if kv == KvDtype::F16 {
                widened.to_dtype(DType::F16).unwrap().to_dtype(DType::F32).unwrap()
            } else {
                widened.clone()
            };
            assert_eq!((max_diff(&k, &want), max_diff(&v, &want)), (0.0, 0.0), "{kv:?}");
            if kv == KvDtype::Q8_0 {
                s.finish_import(vec![1; 5]);
                let saved = s.export().next().unwrap().unwrap();
                assert_eq!(
                    saved.0.flatten_all().unwrap().to_vec1::<u8>().unwrap(),
                    blocks.flatten_all().unwrap().to_vec1::<u8>().unwrap()
                );
            }
        }
        let mut s = state(KvDtype::Q8_0);
        s.begin_import(5, 0).unwrap();
        let halves = x.to_dtype(DType::F16).unwrap();
        s.import_layer(0, &halves, &halves).unwrap();
        let want = dequantize(&quantize(&halves).unwrap()).unwrap();
        assert_eq!(max_diff(&s.live(0, 0, 5).unwrap().0, &want), 0.0);
    }
}
