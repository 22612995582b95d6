//! What sets one architecture apart, decided in one place: [`ArchTraits::of`] is a single
//! `match` on the GGUF's `general.architecture`, as llama.cpp's `load_hparams` is. The
//! loader and the forward read these flags and never compare architecture names; the
//! sizes (heads, widths, windows, RoPE bases) come from the file's own metadata.

/// GGUF `general.architecture` values this engine loads: those [`ArchTraits::of`] knows.
pub const SUPPORTED_ARCHITECTURES: &[&str] =
    &["llama", "qwen2", "qwen3", "gemma3", "gemma4", "smollm3", "lfm2", "qwen35"];

/// The FFN's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// Tanh-approximated GELU (Gemma).
    Gelu,
}

/// Layers that attend over a sliding window (`ARCH.attention.sliding_window` tokens) with
/// RoPE of their own base, interleaved with global layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindows {
    /// Every `pattern`-th layer is global, the others slide (llama.cpp's `set_swa_pattern`).
    /// `None`: the file says, with a flag per layer in `attention.sliding_window_pattern`,
    /// and gives the sliding layers' head size (`attention.key_length_swa`), rotated
    /// values (`rope.dimension_count_swa`) and RoPE base (`rope.freq_base_swa`) (Gemma 4).
    pub pattern: Option<usize>,
    /// The sliding layers' RoPE base (llama.cpp's `rope_freq_base_train_swa`) where the
    /// file does not give one.
    pub rope_base: f32,
}

impl SlidingWindows {
    /// Whether layer `i` (from 0) is a sliding-window layer, where a pattern decides.
    pub fn slides(&self, i: usize) -> Option<bool> {
        self.pattern.map(|p| i % p < p - 1)
    }
}

/// An architecture's differences from plain llama. Optional tensors (q/k biases, q/k head
/// norms, post-attention and post-FFN norms) are not listed: the loader takes them when
/// the file has them, as llama.cpp's graphs do for these families.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ArchTraits {
    /// Half-split ("neox") rotary pairs instead of interleaved ones.
    pub rope_neox: bool,
    /// Sliding-window layers, where the family has them.
    pub sliding_windows: Option<SlidingWindows>,
    /// Token embeddings multiplied by √width.
    pub scale_embeddings: bool,
    pub activation: Activation,
    /// Every `n`-th layer (counting from 1) attends without rotary embeddings (SmolLM3's
    /// "NoPE" layers, llama.cpp's `n_no_rope_layer_step`).
    pub no_rope_every: Option<usize>,
    /// The final RMSNorm's tensor (LFM2's is `token_embd_norm`, a name kept from its
    /// converter).
    pub output_norm: &'static str,
    /// Layers with no K/V heads (`attention.head_count_kv` 0 in the per-layer list) mix
    /// with a short gated convolution (LFM2).
    pub short_conv: bool,
    /// Qwen3.5's hybrid: gated delta-net layers (`engine::model::delta_net`) between the
    /// attention layers, which gate their output (`attn_q` is twice as wide: query and gate
    /// per head) and whose pre-FFN norm is named `post_attention_norm`.
    pub delta_net: bool,
    /// Gemma 4's attention: values RMS-normalized per head (without a weight) before they
    /// are cached, and scores not divided by √head_dim (the q/k norms set their scale).
    pub normed_values: bool,
    /// Logits become `cap · tanh(logits / cap)` with the file's `final_logit_softcapping`,
    /// or this cap where it gives none (llama.cpp's default, 30, for gemma4).
    pub final_softcap: Option<f32>,
}

impl ArchTraits {
    /// The name of the norm before the FFN (`blk.N.NAME.weight`): qwen35 names it
    /// `post_attention_norm` (llama.cpp's `attn_post_norm`), as it comes after attention.
    pub fn ffn_norm(&self) -> &'static str {
        if self.delta_net {
            "post_attention_norm"
        } else {
            "ffn_norm"
        }
    }

    /// The traits of `general.architecture = arch`; `None` for one this engine cannot run.
    pub fn of(arch: &str) -> Option<ArchTraits> {
        let llama = ArchTraits {
            rope_neox: false,
            sliding_windows: None,
            scale_embeddings: false,
            activation: Activation::Silu,
            no_rope_every: None,
            output_norm: "output_norm",
            short_conv: false,
            delta_net: false,
            normed_values: false,
            final_softcap: None,
        };
        match arch {
            "llama" => Some(llama),
            "smollm3" => Some(ArchTraits { no_rope_every: Some(4), ..llama }),
            // Biases on q, k and v (qwen2) or RMSNorms over the q and k heads (qwen3).
            "qwen2" | "qwen3" => Some(ArchTraits { rope_neox: true, ..llama }),
            "gemma3" => Some(ArchTraits {
                rope_neox: true,
                sliding_windows: Some(SlidingWindows { pattern: Some(6), rope_base: 10_000.0 }),
                scale_embeddings: true,
                activation: Activation::Gelu,
                ..llama
            }),
            // Besides gemma3's block: sliding layers listed by the file with heads of their
            // own size; per-layer token embeddings (`per_layer_token_embd`) added after each
            // FFN; the last `attention.shared_kv_layers` layers reuse an earlier layer's
            // K/V; `final_logit_softcapping`. Read from the file where it has them.
            "gemma4" => Some(ArchTraits {
                rope_neox: true,
                sliding_windows: Some(SlidingWindows { pattern: None, rope_base: 10_000.0 }),
                scale_embeddings: true,
                activation: Activation::Gelu,
                normed_values: true,
                final_softcap: Some(30.0),
                ..llama
            }),
            // Short gated convolutions in the layers whose `attention.head_count_kv` is 0
            // (`model::short_conv`), q/k head norms in the others. The mixture-of-experts
            // variant (`lfm2moe`) is not run.
            "lfm2" => Some(ArchTraits { rope_neox: true, output_norm: "token_embd_norm", short_conv: true, ..llama }),
            "qwen35" => Some(ArchTraits { rope_neox: true, delta_net: true, ..llama }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_architecture_has_traits_and_no_other() {
        for arch in SUPPORTED_ARCHITECTURES {
            assert!(ArchTraits::of(arch).is_some(), "{arch}");
        }
        assert_eq!(ArchTraits::of("mamba"), None);
    }

    #[test]
    fn qwen35_has_delta_net_layers_and_its_ffn_norm_is_named_post_attention_norm() {
        let qwen35 = ArchTraits::of("qwen35").unwrap();
        assert!(qwen35.delta_net && qwen35.rope_neox);
        assert_eq!(qwen35.ffn_norm(), "post_attention_norm");
        assert_eq!(ArchTraits::of("gemma3").unwrap().ffn_norm(), "ffn_norm");
    }

    #[test]
    fn gemma4_reads_its_sliding_layers_from_the_file_and_caps_its_logits() {
        let gemma4 = ArchTraits::of("gemma4").unwrap();
        let windows = gemma4.sliding_windows.unwrap();
        assert_eq!((windows.pattern, windows.slides(3)), (None, None));
        assert!(gemma4.normed_values && gemma4.scale_embeddings && gemma4.rope_neox);
        assert_eq!((gemma4.activation, gemma4.final_softcap), (Activation::Gelu, Some(30.0)));
        assert!(!ArchTraits::of("gemma3").unwrap().normed_values);
    }

    #[test]
    fn gemma3_slides_on_five_layers_of_six() {
        let w = ArchTraits::of("gemma3").unwrap().sliding_windows.unwrap();
        let sliding: Vec<bool> = (0..12).map(|i| w.slides(i).unwrap()).collect();
        assert_eq!(sliding, [true, true, true, true, true, false, true, true, true, true, true, false]);
    }
}
