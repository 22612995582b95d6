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
            layers: memory.iter().map(|_| None).collect(),
            recurrent: memory.iter().map(|_| None).collect(),
            memory,
            checkpoints: Vec::new(),
            tokens: Vec::new(),
        }
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

    /// Bytes of the K/V buffers.
    pub fn kv_bytes(&self) -> u64 {
        let row_bytes: usize = self.stored_head_dims().iter().map(|&d| self.kv.row_bytes(d)).sum();
        (2 * self.n_kv_heads * self.capacity * row_bytes) as u64
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
        self.checkpoints.clear();
        self.zero_recurrent();
    }

    fn zero_recurrent(&mut self) {
        self.recurrent.iter_mut().for_each(|slot| *slot = None);
    }

    /// Keeps at most the first `n` tokens and returns how many it kept: `n` (or `len()`
    /// when shorter) for a plain transformer. A recurrent state goes back to its latest
    /// checkpoint at or before `n` (to nothing without one) and forgets later ones; the
    /// caller re-feeds the tokens from there to `n`.
    pub fn truncate(&mut self, n: usize) -> usize {
        if n >= self.len() {
            return self.len();
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
        for ((slot, memory), &head_dim) in self.layers.iter_mut().zip(&self.memory).zip(&self.head_dims) {
            if capacity == 0 || *memory != LayerMemory::KeysValues {
                *slot = None;
                continue;
            }
            let shape = (1, self.n_kv_heads, capacity, self.kv.row_width(head_dim));
            let k = Tensor::zeros(shape, self.kv.storage_dtype(), &self.device)?;
            let v = Tensor::zeros(shape, self.kv.storage_dtype(), &self.device)?;
            if let Some(old) = slot.take() {
                if len > 0 {
                    k.slice_set(&old.k.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
                    v.slice_set(&old.v.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
                }
            }
            *slot = Some(LayerKv { k, v });
        }
        self.capacity = capacity;
        Ok(())
    }

    /// Writes `k`, `v` of shape `(1, n_kv_heads, n, head_dim)` at position `pos` of layer
    /// `index` (quantized for a q8_0 cache).
    pub(crate) fn write(&mut self, index: usize, pos: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let layer = self.layers[index].as_ref().expect("reserve() runs before write()");
        layer.k.slice_set(&self.kv.store(k)?, 2, pos)?;
        layer.v.slice_set(&self.kv.store(v)?, 2, pos)?;
        Ok(())
    }

    /// Keys and values of the first `len` positions of a layer as f32 `(n_kv_heads, len, head_dim)`.
    pub(crate) fn live(&self, index: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let layer = self.layers[index].as_ref().expect("reserve() runs before live()");
        let k = self.kv.load(&layer.k.narrow(2, 0, len)?.squeeze(0)?)?;
        let v = self.kv.load(&layer.v.narrow(2, 0, len)?.squeeze(0)?)?;
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

    /// Removes positions `start..end`, moving the later entries down. `rotate_keys` gets a
    /// layer's index and its moved keys as f32 `(n_kv_heads, tail, head_dim)` and returns
    /// them re-rotated (a q8_0 cache's keys are dequantized, rotated and quantized again;
    /// its values move as they are).
    pub(crate) fn shift_out(
        &mut self,
        start: usize,
        end: usize,
        rotate_keys: impl Fn(usize, &Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<()> {
        let tail = self.len() - end;
        for (index, layer) in self.layers.iter().enumerate() {
            let Some(layer) = layer else { continue };
            let k = self.kv.load(&layer.k.narrow(2, end, tail)?.squeeze(0)?)?.contiguous()?;
            let k = self.kv.store(&rotate_keys(index, &k)?.unsqueeze(0)?)?.contiguous()?;
            let v = layer.v.narrow(2, end, tail)?.copy()?.contiguous()?;
            layer.k.slice_set(&k, 2, start)?;
            layer.v.slice_set(&v, 2, start)?;
        }
        self.tokens.drain(start..end);
        Ok(())
    }

    /// Per-layer K/V of the live tokens, for saving: `(k, v)` each `(n_kv, len, row)` in the
    /// cache's storage (see [`State::buffers`]), one layer at a time (copying every layer at once would double the cache's memory at
    /// each save).
    pub(crate) fn export(&self) -> impl Iterator<Item = Result<(Tensor, Tensor)>> + '_ {
        let len = self.len();
        self.layers.iter().flatten().filter(move |_| len > 0).map(move |l| {
            Ok((l.k.narrow(2, 0, len)?.squeeze(0)?.contiguous()?, l.v.narrow(2, 0, len)?.squeeze(0)?.contiguous()?))
        })
    }

    /// Empties the cache and makes room for `tokens`, whose K/V [`State::import_layer`]
    /// then writes one layer at a time; the tokens count once every layer is written.
    pub(crate) fn begin_import(&mut self, tokens: usize) -> Result<()> {
        self.tokens.clear();
        self.reserve(tokens)
    }

    /// Writes layer `index`'s saved K/V `(n_kv, len, ·)`: float rows of `head_dim` values,
    /// or q8_0 rows (a `U8` tensor, as [`State::export`] gives a q8_0 cache's), converted
    /// to this cache's type where it differs.
    pub(crate) fn import_layer(&mut self, index: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let (k, v) = (k.unsqueeze(0)?, v.unsqueeze(0)?);
        match (k.dtype(), self.kv) {
            (DType::U8, KvDtype::Q8_0) => {
                let layer = self.layers[index].as_ref().expect("reserve() runs before import_layer()");
                layer.k.slice_set(&k, 2, 0)?;
                layer.v.slice_set(&v, 2, 0)?;
                Ok(())
            }
            (DType::U8, _) => {
                let (k, v) = (KvDtype::Q8_0.load(&k)?, KvDtype::Q8_0.load(&v)?);
                self.write(index, 0, &k, &v)
            }
            _ => self.write(index, 0, &k, &v),
        }
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
