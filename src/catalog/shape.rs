//! What the fit check needs of a catalog model's architecture ([`Shape`]), from its
//! published `config.json`, and the memory that follows from it as this engine holds it:
//! keys and values per token of the layers that keep every position, the fixed cache of
//! the sliding-window layers (their window and the engine's slack,
//! `engine::state::window_rows`), and the recurrent state of a hybrid's other layers
//! with the engine's turn checkpoints. llama.cpp's window cache is given for comparison
//! ([`Shape::window_cache_bytes`]).

use serde::Deserialize;

/// Tokens llama.cpp's sliding-window cache holds beyond the window: one micro-batch
/// (its default `n_ubatch`), the whole rounded up to 256 cells (`llama-kv-cache-iswa.cpp`).
const WINDOW_CACHE_SLACK: usize = 512;

/// The architecture figures the fit check reads ([`crate::memory::fit`]). The fields after
/// `context` describe layers that are not plain attention; absent, every layer keeps keys
/// and values of `kv_heads` × `head_dim` per token.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Shape {
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub width: usize,
    pub ffn: usize,
    /// The model's context length in tokens.
    pub context: usize,
    /// The layers (from 0) that keep keys and values of their own; `None`: every layer.
    /// A hybrid model lists its attention layers (the others are recurrent); Gemma 4 its
    /// layers before those that reuse an earlier layer's keys and values.
    #[serde(default)]
    pub attention_layers: Option<Vec<usize>>,
    /// The f32 tensors one recurrent layer keeps, as shapes (the engine's
    /// `LayerMemory::Recurrent`): every layer not in `attention_layers` keeps them.
    /// Short convolution (LFM2): `[L_cache − 1, width]`; gated delta-net (Qwen3.5): its
    /// convolution's `[channels, kernel − 1]` and the `[v_heads, d_k, d_v]` state.
    #[serde(default)]
    pub recurrent_state: Vec<Vec<usize>>,
    /// Attention layers that see only the last `window` positions (Gemma 4).
    #[serde(default)]
    pub sliding_window: Option<SlidingWindow>,
    /// Head size of the global (not sliding) attention layers where it differs from
    /// `head_dim` (Gemma 4's `global_head_dim`).
    #[serde(default)]
    pub global_head_dim: Option<usize>,
    /// Width of the per-layer input embeddings (Gemma 4's `hidden_size_per_layer_input`):
    /// a table of `vocab` × `layers` × this many weights of which each token reads one row,
    /// so most of it need not stay resident.
    #[serde(default)]
    pub per_layer_input: Option<PerLayerInput>,
}

/// Gemma 4's per-layer input embeddings: `vocab` rows of `layers` × `width` weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct PerLayerInput {
    pub width: usize,
    pub vocab: usize,
}

/// Sliding-window attention layers: every `global_every`-th layer (counting from 1) is
/// global, the others see the last `window` positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct SlidingWindow {
    pub window: usize,
    pub global_every: usize,
}

impl SlidingWindow {
    /// Whether layer `i` (from 0) slides.
    pub fn slides(&self, i: usize) -> bool {
        !(i + 1).is_multiple_of(self.global_every)
    }
}

impl Shape {
    /// Whether layer `i` keeps keys and values of its own.
    pub fn keeps_kv(&self, i: usize) -> bool {
        self.attention_layers.as_ref().is_none_or(|l| l.contains(&i))
    }

    /// Whether layer `i` keeps a recurrent state instead (a hybrid's other layers).
    pub fn is_recurrent(&self, i: usize) -> bool {
        !self.keeps_kv(i) && !self.recurrent_state.is_empty()
    }

    /// Parameters of the per-layer input embedding table (0 without one).
    pub fn per_layer_input_params(&self) -> u64 {
        self.per_layer_input.map_or(0, |p| (p.vocab as u64) * (self.layers as u64) * (p.width as u64))
    }

    fn slides(&self, i: usize) -> bool {
        self.sliding_window.is_some_and(|w| w.slides(i))
    }

    /// Bytes one position adds to the cache of the layers with keys and values of their
    /// own that keep every position, each with its head size (Gemma 4's global layers
    /// have wider heads). The sliding-window layers keep their window only
    /// ([`Shape::window_kv_bytes`]).
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> u64 {
        self.row_bytes(false, dtype_bytes)
    }

    /// Bytes of the sliding-window layers' cache as this engine holds it at most: their
    /// window and slack (`engine::state::window_rows`), or the context if shorter.
    pub fn window_kv_bytes(&self, dtype_bytes: usize) -> u64 {
        let Some(w) = self.sliding_window else { return 0 };
        let rows = crate::engine::state::window_rows(w.window).min(self.context) as u64;
        self.row_bytes(true, dtype_bytes).saturating_mul(rows)
    }

    /// Bytes of one position of the layers with K/V of their own that slide (`sliding`)
    /// or keep every position.
    fn row_bytes(&self, sliding: bool, dtype_bytes: usize) -> u64 {
        (0..self.layers)
            .filter(|&i| self.keeps_kv(i) && self.slides(i) == sliding)
            .map(|i| crate::memory::kv_bytes_per_token(1, self.kv_heads, self.head_dim_of(i), dtype_bytes))
            .sum()
    }

    /// Layer `i`'s head size.
    fn head_dim_of(&self, i: usize) -> usize {
        match self.slides(i) {
            true => self.head_dim,
            false => self.global_head_dim.unwrap_or(self.head_dim),
        }
    }

    /// The widest heads of any layer: what the prefill's scratch is sized by.
    pub fn widest_head_dim(&self) -> usize {
        self.head_dim.max(self.global_head_dim.unwrap_or(0))
    }

    /// Bytes of the sliding-window layers' cache as llama.cpp holds it (for comparison
    /// with [`Shape::window_kv_bytes`]): the window and one micro-batch, rounded up to 256
    /// positions, whatever the conversation's length.
    pub fn window_cache_bytes(&self, dtype_bytes: usize) -> u64 {
        let Some(w) = self.sliding_window else { return 0 };
        let layers = (0..self.layers).filter(|&i| self.keeps_kv(i) && w.slides(i)).count();
        let cells = (w.window + WINDOW_CACHE_SLACK).div_ceil(256) * 256;
        let cells = cells.min(self.context) as u64;
        crate::memory::kv_bytes_per_token(layers, self.kv_heads, self.head_dim, dtype_bytes).saturating_mul(cells)
    }

    /// Bytes of the recurrent layers' state with the engine's turn checkpoints, as
    /// [`crate::engine::Model::recurrent_bytes`] counts them for a loaded file.
    pub fn recurrent_bytes(&self) -> u64 {
        use crate::engine::state::{recurrent_bytes_of, LayerMemory, MAX_CHECKPOINTS};
        let memory: Vec<LayerMemory> = (0..self.layers)
            .map(|i| match self.is_recurrent(i) {
                true => LayerMemory::Recurrent(self.recurrent_state.clone()),
                false => LayerMemory::KeysValues,
            })
            .collect();
        (1 + MAX_CHECKPOINTS as u64).saturating_mul(recurrent_bytes_of(&memory))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::catalog;
    use crate::engine::state::MAX_CHECKPOINTS;
    use crate::memory::{self, RamTier};

    fn shape_of(id: &str) -> Shape {
        catalog().get(id).unwrap_or_else(|| panic!("no {id}")).shape.clone()
    }

    /// Qwen3.5-0.8B (config.json): 6 of 24 layers attend (2 KV heads of 256); the 18
    /// gated delta-net layers keep a 6,144 × 3 convolution state and a 16 × 128 × 128
    /// state matrix in f32, copied at each of the engine's turn checkpoints.
    #[test]
    fn a_gated_delta_net_hybrid_counts_its_attention_layers_and_its_state() {
        let s = shape_of("qwen3.5-0.8b-q4_k_m");
        assert_eq!(s.kv_bytes_per_token(2), 6 * 2 * 2 * 256 * 2);
        let per_layer = (3 * 6144 + 16 * 128 * 128) * 4;
        assert_eq!(s.recurrent_bytes(), (1 + MAX_CHECKPOINTS as u64) * 18 * per_layer);
        assert_eq!(s.window_cache_bytes(2), 0);
    }

    /// LFM2.5-1.2B: 6 GQA layers of 16; the 10 short-convolution layers keep
    /// (L_cache − 1) × width = 2 × 2,048 f32 each.
    #[test]
    fn a_short_convolution_hybrid_keeps_two_positions_of_width_per_conv_layer() {
        let s = shape_of("lfm2.5-1.2b-instruct-q8_0");
        assert_eq!(s.kv_bytes_per_token(2), 6 * 2 * 8 * 64 * 2);
        assert_eq!(s.recurrent_bytes(), (1 + MAX_CHECKPOINTS as u64) * 10 * 2 * 2048 * 4);
    }

    /// Gemma 4 E2B as this engine holds it: of its 35 layers the last 20 reuse earlier
    /// layers' keys and values; the first 15 keep theirs: layers 4, 9 and 14 are global
    /// (one KV head of 512) and keep every position, the 12 others slide over 512
    /// positions (heads of 256) and keep 512 + 256 (llama.cpp: 512 + one 512-token
    /// micro-batch).
    #[test]
    fn gemma4_counts_its_global_layers_per_token_and_its_sliding_layers_window() {
        let s = shape_of("gemma-4-e2b-it-q4_k_m");
        assert_eq!(s.kv_bytes_per_token(2), 2 * 3 * 512 * 2);
        assert_eq!(s.window_kv_bytes(2), 12 * 2 * 256 * 2 * 768);
        assert_eq!(s.window_cache_bytes(2), 12 * 2 * 256 * 2 * 1024);
        assert_eq!(s.recurrent_bytes(), 0);
        assert_eq!(s.widest_head_dim(), 512);
        let entry = catalog().get("gemma-4-e2b-it-q4_k_m").unwrap();
        let facts = entry.facts();
        assert_eq!((facts.recurrent_bytes, facts.window_kv_bytes), (0, s.window_kv_bytes(2)));
        // The footprint counts the window's cache whatever the budget.
        let no_window = memory::ModelFacts { window_kv_bytes: 0, ..facts };
        let at = |f: &memory::ModelFacts| memory::fit::footprint_at(f, 4096);
        assert_eq!(at(&facts) - at(&no_window), facts.window_kv_bytes);
        // E4B: 24 of 42 layers keep K/V, every sixth global (4 of them); two KV heads.
        let e4b = shape_of("gemma-4-e4b-it-q4_k_m");
        assert_eq!(e4b.kv_bytes_per_token(2), 2 * 2 * 4 * 512 * 2);
        assert_eq!(e4b.window_kv_bytes(2), 2 * 2 * 20 * 256 * 2 * 768);
        // The per-layer input table (262,144 × 35 × 256 weights) is mapped, not resident.
        assert_eq!(s.per_layer_input_params(), 262_144 * 35 * 256);
        assert!(facts.mapped_bytes < entry.estimated_bytes() * 6 / 10, "{facts:?}");
    }

    /// Gemma 3 as the catalog gives it (no window in its shape): five layers of six slide
    /// over the family's widest window, 1,024 positions, so a token costs a sixth of the
    /// cache of a model keeping every position, and the budget is larger.
    #[test]
    fn gemma3_entries_count_five_of_six_layers_at_their_window() {
        let gemma = catalog().models.iter().find(|m| m.arch == "gemma3").expect("a gemma3 entry").clone();
        assert!(gemma.shape.sliding_window.is_none());
        let facts = gemma.facts();
        let s = &gemma.shape;
        let every = s.kv_bytes_per_token(2);
        let global = s.layers / 6;
        assert_eq!(facts.kv_bytes_per_token, every / s.layers as u64 * global as u64);
        let sliding = (s.layers - global) as u64 * every / s.layers as u64;
        assert_eq!(facts.window_kv_bytes, sliding * (1024 + 256).min(s.context) as u64);
        // A 6 GB phone's cache allowance holds more of its tokens than if every layer
        // kept every position.
        let full = memory::ModelFacts { kv_bytes_per_token: every, window_kv_bytes: 0, ..facts };
        let tier = memory::RamTier::Phone6Gb;
        let (windowed, all) = (memory::fit::fit(&facts, tier).budget, memory::fit::fit(&full, tier).budget);
        assert!(windowed > all, "{windowed} tokens windowed, {all} keeping every position");
    }

    /// A plain transformer's shape (no field after `context`) keeps keys and values in
    /// every layer and no other state: the catalog's older entries mean what they meant.
    #[test]
    fn an_entry_without_the_new_fields_is_a_plain_transformer() {
        let json =
            r#"{"layers": 30, "heads": 9, "kv_heads": 3, "head_dim": 64, "width": 576, "ffn": 1536, "context": 8192}"#;
        let s: Shape = serde_json::from_str(json).unwrap();
        assert_eq!(s.kv_bytes_per_token(2), memory::kv_bytes_per_token(30, 3, 64, 2));
        assert_eq!((s.recurrent_bytes(), s.window_cache_bytes(2)), (0, 0));
    }

    /// The point of a hybrid on a phone: its few attention layers make each token cheap,
    /// so it gets a larger budget than a transformer of the same size and shape with
    /// keys and values in every layer, though its fixed state is in the footprint.
    #[test]
    fn a_hybrid_gets_a_larger_budget_than_the_same_model_all_attention() {
        for id in ["qwen3.5-2b-q4_k_m", "qwen3.5-4b-q4_k_m", "lfm2.5-1.2b-instruct-q4_k_m"] {
            let hybrid = catalog().get(id).unwrap().clone();
            let mut plain = hybrid.clone();
            plain.shape.attention_layers = None;
            plain.shape.recurrent_state.clear();
            let (h, p) = (hybrid.facts(), plain.facts());
            assert!(h.kv_bytes_per_token < p.kv_bytes_per_token, "{id}");
            assert!(h.recurrent_bytes > 0 && p.recurrent_bytes == 0, "{id}");
            // The footprint at any budget counts the recurrent state and its checkpoints.
            let no_state = memory::ModelFacts { recurrent_bytes: 0, ..h };
            assert_eq!(
                memory::fit::footprint_at(&h, 1000) - memory::fit::footprint_at(&no_state, 1000),
                h.recurrent_bytes,
                "{id}"
            );
            // Wherever it fits (Qwen3.5-4B at 4 bits is over a 6 GB phone's ceiling).
            let tiers: Vec<RamTier> = RamTier::ALL.into_iter().filter(|&t| memory::fit(&h, t).fits()).collect();
            assert!(tiers.contains(&RamTier::Desktop), "{id}");
            for tier in tiers {
                let (fh, fp) = (memory::fit(&h, tier), memory::fit(&p, tier));
                assert!(fh.budget > fp.budget, "{id} on {tier:?}: hybrid {} vs plain {}", fh.budget, fp.budget);
                assert!(fh.footprint_bytes >= h.weights_bytes + h.recurrent_bytes, "{id} on {tier:?}");
            }
        }
    }
}
