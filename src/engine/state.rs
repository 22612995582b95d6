//! The KV cache as an object of its own (Core ML calls it `MLState`): per-layer key and
//! value buffers plus the token ids they encode. It outlives single calls and chat turns;
//! the model only appends to it.
//!
//! Buffers are `(1, n_kv_heads, capacity, head_dim)` and written in place. Capacity grows
//! in chunks of [`GROWTH_CHUNK`] tokens up to `max_tokens` (the budget), so a long chat
//! never pays a `Tensor::cat` per token, and a short one never holds a full-budget buffer.

use candle_core::{DType, Device, Tensor};

use super::Result;

/// Tokens added to the capacity each time the cache grows.
pub const GROWTH_CHUNK: usize = 256;

/// Granularity of [`State::shrink_to_fit`]: finer than growth, so an eviction gives
/// memory back even when the budget is a single chunk.
pub const SHRINK_QUANTUM: usize = 32;

struct LayerKv {
    k: Tensor,
    v: Tensor,
}

pub struct State {
    /// Token ids must be below this (the model's embedding rows).
    vocab_size: usize,
    n_kv_heads: usize,
    head_dim: usize,
    max_tokens: usize,
    dtype: DType,
    device: Device,
    capacity: usize,
    layers: Vec<Option<LayerKv>>,
    tokens: Vec<u32>,
}

impl State {
    pub(crate) fn new(
        vocab_size: usize,
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        max_tokens: usize,
        dtype: DType,
        device: Device,
    ) -> State {
        State {
            vocab_size,
            n_kv_heads,
            head_dim,
            max_tokens,
            dtype,
            device,
            capacity: 0,
            layers: (0..n_layers).map(|_| None).collect(),
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

    /// `(n_kv_heads, head_dim)` of every layer's buffers.
    pub fn shape(&self) -> (usize, usize) {
        (self.n_kv_heads, self.head_dim)
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Changes the most tokens this state may hold; shrinking below `len()` is refused.
    pub fn set_max_tokens(&mut self, max_tokens: usize) {
        self.max_tokens = max_tokens.max(self.len());
    }

    /// Bytes the K/V buffers occupy now.
    pub fn bytes(&self) -> u64 {
        self.bytes_for(self.capacity)
    }

    fn bytes_for(&self, capacity: usize) -> u64 {
        (2 * self.layers.len() * self.n_kv_heads * capacity * self.head_dim * self.dtype.size_in_bytes()) as u64
    }

    /// Forgets all tokens; buffers stay allocated for the next conversation.
    pub fn reset(&mut self) {
        self.tokens.clear();
    }

    /// Keeps the first `n` tokens.
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
    }

    /// Reallocates the buffers to fit the current tokens (rounded up to [`SHRINK_QUANTUM`])
    /// and returns the bytes given back.
    pub fn shrink_to_fit(&mut self) -> Result<u64> {
        let target = self.len().div_ceil(SHRINK_QUANTUM) * SHRINK_QUANTUM;
        if target >= self.capacity {
            return Ok(0);
        }
        let before = self.bytes();
        self.resize(target)?;
        Ok(before - self.bytes())
    }

    /// Makes sure `needed` tokens fit, growing by whole chunks.
    pub(crate) fn reserve(&mut self, needed: usize) -> Result<()> {
        if needed <= self.capacity {
            return Ok(());
        }
        let target = (needed.div_ceil(GROWTH_CHUNK) * GROWTH_CHUNK).min(self.max_tokens.max(needed));
        self.resize(target)
    }

    fn resize(&mut self, capacity: usize) -> Result<()> {
        let len = self.len();
        let shape = (1, self.n_kv_heads, capacity, self.head_dim);
        for slot in self.layers.iter_mut() {
            if capacity == 0 {
                *slot = None;
                continue;
            }
            let k = Tensor::zeros(shape, self.dtype, &self.device)?;
            let v = Tensor::zeros(shape, self.dtype, &self.device)?;
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

    /// Writes `k`, `v` of shape `(1, n_kv_heads, n, head_dim)` at position `pos` of layer `index`.
    pub(crate) fn write(&mut self, index: usize, pos: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let layer = self.layers[index].as_ref().expect("reserve() runs before write()");
        layer.k.slice_set(&k.to_dtype(self.dtype)?, 2, pos)?;
        layer.v.slice_set(&v.to_dtype(self.dtype)?, 2, pos)?;
        Ok(())
    }

    /// Keys and values of the first `len` positions of a layer as f32 `(n_kv_heads, len, head_dim)`.
    pub(crate) fn live(&self, index: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let layer = self.layers[index].as_ref().expect("reserve() runs before live()");
        let k = layer.k.narrow(2, 0, len)?.squeeze(0)?.to_dtype(DType::F32)?;
        let v = layer.v.narrow(2, 0, len)?.squeeze(0)?.to_dtype(DType::F32)?;
        Ok((k, v))
    }

    /// The whole K/V buffers of a layer, `(1, n_kv_heads, capacity, head_dim)` in the
    /// cache dtype; positions past the live ones hold stale data.
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
    /// them re-rotated.
    pub(crate) fn shift_out(
        &mut self,
        start: usize,
        end: usize,
        rotate_keys: impl Fn(usize, &Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<()> {
        let tail = self.len() - end;
        for (index, layer) in self.layers.iter().enumerate() {
            let Some(layer) = layer else { continue };
            let k = layer.k.narrow(2, end, tail)?.squeeze(0)?.to_dtype(DType::F32)?.contiguous()?;
            let k = rotate_keys(index, &k)?.unsqueeze(0)?.to_dtype(self.dtype)?.contiguous()?;
            let v = layer.v.narrow(2, end, tail)?.copy()?.contiguous()?;
            layer.k.slice_set(&k, 2, start)?;
            layer.v.slice_set(&v, 2, start)?;
        }
        self.tokens.drain(start..end);
        Ok(())
    }

    /// Per-layer K/V of the live tokens, for saving: `(k, v)` each `(n_kv, len, hd)`, one
    /// layer at a time (copying every layer at once would double the cache's memory at
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

    /// Writes layer `index`'s saved K/V (shapes as from [`State::export`]).
    pub(crate) fn import_layer(&mut self, index: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        self.write(index, 0, &k.unsqueeze(0)?, &v.unsqueeze(0)?)
    }

    /// Ends an import: the cache now holds `tokens`.
    pub(crate) fn finish_import(&mut self, tokens: Vec<u32>) {
        self.tokens = tokens;
    }
}
