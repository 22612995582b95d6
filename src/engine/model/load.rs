//! Loading a model: the GGUF header read and checked against the architecture's
//! traits, each layer's plan, the tensors mapped or copied for their kernels, and the
//! facts the fit check reads from a header alone ([`file_facts`]).

use super::*;

/// Opens and parses a GGUF header, mapping IO and format errors to user-facing ones.
/// A FIFO or a device given as the model is refused unopened (it would block or never end).
pub fn read_gguf(path: &Path) -> Result<(gguf_file::Content, BufReader<File>)> {
    let file = crate::files::open_regular(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => EngineError::ModelMissing { path: path.to_path_buf() },
        std::io::ErrorKind::InvalidInput => EngineError::BadModelFile {
            path: path.to_path_buf(),
            message: match std::fs::metadata(path) {
                Ok(m) => format!("it is {}, not a regular file", crate::files::kind_of(&m)),
                Err(_) => "it is not a regular file".into(),
            },
        },
        _ => EngineError::ModelLoad { path: path.to_path_buf(), source: Cause::new(e) },
    })?;
    let mut reader = BufReader::new(file);
    let content = crate::gguf::read(&mut reader)
        .map_err(|e| EngineError::BadModelFile { path: path.to_path_buf(), message: e.to_string() })?;
    Ok((content, reader))
}

/// What the fit check needs of a model file, read from its GGUF header alone (nothing is
/// loaded): its shape, its size, and its average bits per weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FileFacts {
    pub facts: ModelFacts,
    pub bits_per_weight: f64,
}

/// Reads [`FileFacts`] from the header of the GGUF at `path`, for a KV cache of `kv` and
/// the CPU running `kernels`.
pub fn file_facts(path: &Path, kv: impl Into<KvDtype>, kernels: Kernels) -> Result<FileFacts> {
    let (content, _) = read_gguf(path)?;
    header_facts(path, &content, kv, kernels)
}

/// [`file_facts`] of a header already read (`content`, of the file at `path`).
pub fn header_facts(
    path: &Path,
    content: &gguf_file::Content,
    kv: impl Into<KvDtype>,
    kernels: Kernels,
) -> Result<FileFacts> {
    let kv = kv.into();
    let arch = architecture(path, content)?;
    // The loader's own metadata readers (and defaults); nothing is loaded.
    let ld = Loader { path, content, map: None, device: &Device::Cpu, arch };
    let heads = ld.meta_u32("attention.head_count")?;
    let layers = ld.meta_u32("block_count")?;
    let width = ld.meta_u32("embedding_length")?;
    let layer_kv_heads = ld.kv_heads_per_layer(layers, heads)?;
    let kv_heads = shared_kv_heads(&layer_kv_heads).unwrap_or(heads);
    let memory = ld.layer_memory(&layer_kv_heads, width)?;
    // An architecture the engine does not run is sized as llama (the catalog lists such files).
    let traits = ArchTraits::of(&ld.arch).or_else(|| ArchTraits::of("llama")).expect("llama has traits");
    let plan = ld.layer_plan(&traits, layers)?;
    // The widest heads: the prefill scratch of the layers that have them.
    let head_dim = plan.layer_head_dims().into_iter().max().unwrap_or(0);
    let context = ld.meta_u32("context_length").unwrap_or(4096).clamp(1, MAX_ROPE_POSITIONS);
    // The widest FFN (gemma4's layers sharing K/V have wider ones).
    let ffn = (0..plan.delta_net.len())
        .filter_map(|i| content.tensor_infos.get(&format!("blk.{i}.ffn_up.weight")))
        .filter_map(|t| t.shape.dims().first().copied())
        .max()
        .unwrap_or(4 * width);
    let weights: u64 = content.tensor_infos.values().map(|t| t.shape.elem_count() as u64).sum();
    let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    // What the engine will copy to its heap: the matrices its kernels do not read in the
    // file's layout (as rewritten for them), and the vectors (as f32).
    let tied = !content.tensor_infos.contains_key("output.weight");
    let (mut heap, mut mapped) = (0u64, 0u64);
    for (name, t) in &content.tensor_infos {
        let elements = t.shape.elem_count() as u64;
        let file = elements / t.ggml_dtype.block_size() as u64 * t.ggml_dtype.type_size() as u64;
        let [_, columns] = *t.shape.dims() else {
            // The RoPE factors are folded into the model's frequencies, not kept.
            if name != "rope_freqs.weight" {
                heap += elements * 4;
            }
            continue;
        };
        // gemma4's per-layer table is only ever looked up: mapped, a row per token touched,
        // not counted as resident (`ModelConfig::lookup_table_bytes`).
        if name == "per_layer_token_embd.weight" {
            continue;
        }
        let copied = crate::engine::cpu::qlinear::heap_bytes(t.ggml_dtype, elements, columns, kernels, true);
        // The table is looked up in place unless the tied output layer copies it.
        let in_place = copied == 0 || (name == "token_embd.weight" && !tied);
        if in_place {
            mapped += file;
        } else {
            heap += copied;
        }
    }
    let window = match traits.sliding_windows {
        Some(_) => Some(ld.meta_u32("attention.sliding_window")?.max(1)),
        None => None,
    };
    let attention = crate::engine::cpu::attention::prefill_attention(kernels, true, head_dim, window);
    // A hybrid's recurrent layers keep no K/V but a fixed-size state (and its checkpoints);
    // gemma4's last layers none: they read an earlier layer's.
    let memory: Vec<LayerMemory> = plan.memory_over(memory);
    // The sliding-window layers keep their window and slack at most (`State`'s window).
    let row_bytes = |sliding: bool| -> u64 {
        memory
            .iter()
            .zip(plan.layer_head_dims())
            .zip(&plan.sliding)
            .filter(|((m, _), &s)| **m == LayerMemory::KeysValues && (s && window.is_some()) == sliding)
            .map(|((_, head_dim), _)| 2 * (kv_heads * kv.row_bytes(head_dim)) as u64)
            .sum()
    };
    let window_rows = window.map_or(0, |w| crate::engine::state::window_rows(w).min(context));
    let facts = ModelFacts {
        weights_bytes: heap,
        mapped_bytes: mapped,
        kv_bytes_per_token: row_bytes(false),
        window_kv_bytes: row_bytes(true) * window_rows as u64,
        recurrent_bytes: (1 + MAX_CHECKPOINTS as u64) * crate::engine::state::recurrent_bytes_of(&memory),
        context,
        prefill: PrefillShape { heads, kv_heads, head_dim, width, ffn, attention },
    };
    Ok(FileFacts { facts, bits_per_weight: file_bytes as f64 * 8.0 / weights.max(1) as f64 })
}

/// The K/V head count every attention layer shares (`None` when they differ, or without
/// attention layers).
fn shared_kv_heads(layer_kv_heads: &[usize]) -> Option<usize> {
    let mut attention = layer_kv_heads.iter().copied().filter(|&h| h > 0);
    let first = attention.next()?;
    attention.all(|h| h == first).then_some(first)
}

/// The file's `general.architecture`.
fn architecture(path: &Path, content: &gguf_file::Content) -> Result<String> {
    content.metadata.get("general.architecture").and_then(|v| v.to_string().ok()).cloned().ok_or_else(|| {
        EngineError::BadModelFile {
            path: path.to_path_buf(),
            message: "no `general.architecture` in the metadata".into(),
        }
    })
}

/// What each layer of a model is, decided from the architecture and the metadata.
struct LayerPlan {
    /// `Some` for a gated delta-net layer (qwen35), `None` for attention.
    delta_net: Vec<Option<DeltaNetShape>>,
    /// The name of the norm before the FFN (after `blk.N.`, before `.weight`).
    ffn_norm: &'static str,
    /// Whether each layer attends over a sliding window.
    sliding: Vec<bool>,
    /// The earlier layer whose K/V a layer reads instead of keeping its own (gemma4).
    kv_source: Vec<Option<usize>>,
    /// Head sizes of the global and of the sliding layers (they differ in gemma4).
    head_dims: HeadDims,
}

/// Head sizes and rotated values of the global and the sliding-window layers.
#[derive(Debug, Clone, Copy)]
struct HeadDims {
    global: usize,
    sliding: usize,
    rope_global: usize,
    rope_sliding: usize,
}

impl LayerPlan {
    /// What each layer the forward runs keeps in a [`State`]: a delta-net layer its
    /// recurrent state, a layer reading another's K/V nothing, the others what `kept`
    /// (from the K/V heads per layer) says.
    fn memory_over(&self, kept: Vec<LayerMemory>) -> Vec<LayerMemory> {
        self.delta_net
            .iter()
            .zip(&self.kv_source)
            .zip(kept)
            .map(|((d, source), m)| match (d, source) {
                (Some(shape), _) => shape.memory(),
                (None, Some(source)) => LayerMemory::SharedKeysValues(*source),
                (None, None) => m,
            })
            .collect()
    }

    /// Layer `i`'s head size.
    fn head_dim(&self, i: usize) -> usize {
        if self.sliding[i] {
            self.head_dims.sliding
        } else {
            self.head_dims.global
        }
    }

    /// Every layer's head size.
    fn layer_head_dims(&self) -> Vec<usize> {
        (0..self.sliding.len()).map(|i| self.head_dim(i)).collect()
    }
}

pub(super) struct Loader<'a> {
    path: &'a Path,
    content: &'a gguf_file::Content,
    /// The file's tensors (`None` when only the metadata is read).
    map: Option<Arc<MappedFile>>,
    device: &'a Device,
    arch: String,
}

impl Loader<'_> {
    pub(super) fn bad(&self, message: impl Into<String>) -> EngineError {
        EngineError::BadModelFile { path: self.path.to_path_buf(), message: message.into() }
    }

    fn meta(&self, key: &str) -> Result<&gguf_file::Value> {
        let full = format!("{}.{key}", self.arch);
        self.content.metadata.get(&full).ok_or_else(|| self.bad(format!("missing metadata `{full}`")))
    }

    pub(super) fn meta_u32(&self, key: &str) -> Result<usize> {
        self.meta(key)?.to_u32().map(|v| v as usize).map_err(|e| self.bad(e.to_string()))
    }

    /// Each layer's K/V head count: the file's `attention.head_count_kv`, one number for
    /// every layer or one per layer (LFM2's, 0 for a layer without attention); `heads`
    /// where the file says nothing.
    fn kv_heads_per_layer(&self, n_layers: usize, heads: usize) -> Result<Vec<usize>> {
        // Before anything is sized by it: a hostile `block_count` is refused here.
        self.check_layer_count(n_layers)?;
        let key = "attention.head_count_kv";
        let Ok(value) = self.meta(key) else { return Ok(vec![heads; n_layers]) };
        let count = |v: &gguf_file::Value| {
            v.to_u64()
                .ok()
                .or_else(|| v.to_u32().ok().map(u64::from))
                .or_else(|| v.to_i32().ok().and_then(|x| u64::try_from(x).ok()))
                .and_then(|x| usize::try_from(x).ok())
                .ok_or_else(|| self.bad(format!("`{}.{key}` holds {v:?}, not a count", self.arch)))
        };
        match value.to_vec() {
            Ok(list) if list.len() != n_layers => {
                Err(self.bad(format!("`{}.{key}` lists {} layers, `block_count` is {n_layers}", self.arch, list.len())))
            }
            Ok(list) => list.iter().map(count).collect(),
            Err(_) => Ok(vec![count(value)?; n_layers]),
        }
    }

    /// What each layer keeps in a [`State`], from its K/V head count: a layer without K/V
    /// heads is a short convolution where the architecture has them, and refused elsewhere.
    fn layer_memory(&self, layer_kv_heads: &[usize], width: usize) -> Result<Vec<LayerMemory>> {
        let short_conv = ArchTraits::of(&self.arch).is_some_and(|t| t.short_conv);
        if !layer_kv_heads.contains(&0) {
            return Ok(vec![LayerMemory::KeysValues; layer_kv_heads.len()]);
        }
        if !short_conv {
            return Err(self.bad("a layer has no K/V heads, and this architecture has no other kind of layer"));
        }
        let taps = self.meta_u32("shortconv.l_cache")?;
        if !(2..=64).contains(&taps) {
            return Err(self.bad(format!("unsupported short convolution of {taps} taps (`shortconv.l_cache`)")));
        }
        Ok(layer_kv_heads
            .iter()
            .map(|&h| if h == 0 { ShortConv::memory_of(taps, width) } else { LayerMemory::KeysValues })
            .collect())
    }

    fn meta_f32_or(&self, key: &str, default: f32) -> f32 {
        self.meta(key).and_then(|v| v.to_f32().map_err(|e| self.bad(e.to_string()))).unwrap_or(default)
    }

    /// Tensor `name` is in the file with dimensions `dims`.
    pub(super) fn expect_shape(&self, name: &str, dims: &[usize]) -> Result<()> {
        match self.content.tensor_infos.get(name).map(|t| t.shape.dims()) {
            None => Err(self.bad(format!("missing tensor `{name}`"))),
            Some(d) if d != dims => Err(self.bad(format!("tensor `{name}` is {d:?}, the metadata implies {dims:?}"))),
            Some(_) => Ok(()),
        }
    }

    /// What each of the `block_count` layers the forward runs is: attention, or (qwen35) a
    /// gated delta-net where `attention.recurrent_layers` says so, else on all but every
    /// `full_attention_interval`-th layer (4), as llama.cpp's `load_arch_hparams` decides.
    /// The `nextn_predict_layers` last blocks (a draft head) are left out.
    /// `block_count` was checked against the file ([`Loader::check_layer_count`]).
    fn layer_plan(&self, traits: &ArchTraits, block_count: usize) -> Result<LayerPlan> {
        let unused_blocks = self.meta_u32("nextn_predict_layers").unwrap_or(0).min(block_count);
        let n_layers = block_count - unused_blocks;
        let sliding = self.sliding_layers(traits, n_layers)?;
        let kv_source = self.kv_sources(&sliding)?;
        let head_dims = self.head_dims()?;
        if !traits.delta_net {
            return Ok(LayerPlan {
                delta_net: vec![None; n_layers],
                ffn_norm: traits.ffn_norm(),
                sliding,
                kv_source,
                head_dims,
            });
        }
        let shape = DeltaNetShape::read(self)?;
        let recurrent: Vec<bool> = match self.meta("attention.recurrent_layers") {
            Ok(gguf_file::Value::Array(flags)) => {
                flags.iter().take(n_layers).map(|f| matches!(f, gguf_file::Value::Bool(true))).collect()
            }
            _ => {
                let interval = self.meta_u32("full_attention_interval").unwrap_or(4).max(1);
                (0..n_layers).map(|i| (i + 1) % interval != 0).collect()
            }
        };
        if recurrent.len() != n_layers {
            return Err(self.bad(format!("`attention.recurrent_layers` has {} of {n_layers} layers", recurrent.len())));
        }
        Ok(LayerPlan {
            delta_net: recurrent.into_iter().map(|r| r.then_some(shape)).collect(),
            ffn_norm: traits.ffn_norm(),
            sliding,
            kv_source,
            head_dims,
        })
    }

    /// Which of `n_layers` layers attend over a sliding window: by the architecture's
    /// pattern, or by the file's flag per layer (`attention.sliding_window_pattern`).
    fn sliding_layers(&self, traits: &ArchTraits, n_layers: usize) -> Result<Vec<bool>> {
        let Some(windows) = traits.sliding_windows else { return Ok(vec![false; n_layers]) };
        if windows.pattern.is_some() {
            return Ok((0..n_layers).map(|i| windows.slides(i) == Some(true)).collect());
        }
        let key = "attention.sliding_window_pattern";
        let flags = match self.meta(key)? {
            gguf_file::Value::Array(flags) => flags,
            v => return Err(self.bad(format!("`{}.{key}` holds {v:?}, not a flag per layer", self.arch))),
        };
        if flags.len() < n_layers {
            return Err(self.bad(format!("`{}.{key}` has {} flags for {n_layers} layers", self.arch, flags.len())));
        }
        Ok(flags.iter().take(n_layers).map(|f| matches!(f, gguf_file::Value::Bool(true))).collect())
    }

    /// The layer each layer reads its K/V from when not its own: the last
    /// `attention.shared_kv_layers` layers read the last earlier layer of their kind
    /// (sliding or global), as llama.cpp's gemma4 cache does (`n_layer_kv_from_start`
    /// minus 2 for sliding layers, minus 1 for global ones).
    fn kv_sources(&self, sliding: &[bool]) -> Result<Vec<Option<usize>>> {
        let n_layers = sliding.len();
        let shared = self.meta_u32("attention.shared_kv_layers").unwrap_or(0);
        if shared == 0 {
            return Ok(vec![None; n_layers]);
        }
        let own = n_layers.checked_sub(shared).filter(|&own| own >= 2).ok_or_else(|| {
            self.bad(format!("{shared} of {n_layers} layers share K/V: two layers of their own at least are needed"))
        })?;
        (0..n_layers)
            .map(|i| {
                if i < own {
                    return Ok(None);
                }
                let source = own - if sliding[i] { 2 } else { 1 };
                if sliding[source] != sliding[i] {
                    return Err(self.bad(format!("layer {i} would read the K/V of layer {source}, of the other kind")));
                }
                Ok(Some(source))
            })
            .collect()
    }

    /// The global layers' head size (`attention.key_length`, else the width over the
    /// heads) and the sliding layers' (`attention.key_length_swa`, else the same), and
    /// the values each rotates (`rope.dimension_count`, `rope.dimension_count_swa`), as
    /// llama.cpp reads them for every architecture. Values must be as wide as keys.
    fn head_dims(&self) -> Result<HeadDims> {
        let width = self.meta_u32("embedding_length")?;
        let heads = self.meta_u32("attention.head_count")?;
        let global = match self.meta_u32("attention.key_length") {
            Ok(d) => d,
            Err(_) if heads > 0 && width % heads == 0 => width / heads,
            Err(_) => return Err(self.bad(format!("a width of {width} does not split into {heads} heads"))),
        };
        let sliding = self.meta_u32("attention.key_length_swa").unwrap_or(global);
        let values = self.meta_u32("attention.value_length").unwrap_or(global);
        let values_sliding = self.meta_u32("attention.value_length_swa").unwrap_or(values);
        for (keys, values) in [(global, values), (sliding, values_sliding)] {
            if keys == 0 || keys % 2 != 0 || keys > 1024 || values != keys {
                return Err(self.bad(format!("unsupported head size: keys {keys}, values {values}")));
            }
        }
        let rope_global = self.meta_u32("rope.dimension_count").unwrap_or(global);
        let rope_sliding = self.meta_u32("rope.dimension_count_swa").unwrap_or(rope_global);
        for (rope, head) in [(rope_global, global), (rope_sliding, sliding)] {
            if rope == 0 || !rope.is_multiple_of(2) || rope > head {
                return Err(self.bad(format!("unsupported rotary embedding size {rope} for heads of {head}")));
            }
        }
        Ok(HeadDims { global, sliding, rope_global, rope_sliding })
    }

    /// The figures in the metadata agree with the tensors in the file: every layer is
    /// there with the shapes they imply (checked before anything is allocated for them).
    /// `block_count` is the number of layers in the file (every layer has `attn_norm`).
    fn check_layer_count(&self, n_layers: usize) -> Result<()> {
        if n_layers == 0 {
            return Err(self.bad("the model has no layers (`block_count` is 0)"));
        }
        let present = self.content.tensor_infos.keys().filter(|n| n.ends_with(".attn_norm.weight")).count();
        if n_layers != present {
            return Err(self.bad(format!("`block_count` is {n_layers} but the file has {present} layers")));
        }
        Ok(())
    }

    /// `kv_heads` is each layer's K/V heads (0: a short convolution of `taps` taps); a
    /// gated layer's `attn_q` gives a gate as wide as its query too.
    fn check_shapes(
        &self,
        plan: &LayerPlan,
        width: usize,
        (heads, gated): (usize, bool),
        kv_heads: &[usize],
        taps: Option<usize>,
    ) -> Result<()> {
        if plan.delta_net.is_empty() {
            return Err(self.bad("the model has no layers to run"));
        }
        let shape = |name: &str| self.content.tensor_infos.get(name).map(|t| t.shape.dims().to_vec());
        match shape("token_embd.weight") {
            None => return Err(self.bad("missing tensor `token_embd.weight`")),
            Some(d) if d.len() != 2 || d[1] != width || d[0] == 0 => {
                return Err(self.bad(format!("tensor `token_embd.weight` is {d:?}, rows of {width} expected")))
            }
            Some(_) => {}
        }
        // K/V a layer need not have: a layer reading another's, or (gemma4) values that
        // are the keys.
        let optional = |name: &str, dims: &[usize], optional: bool| match optional && !self.has(name) {
            true => Ok(()),
            false => self.expect_shape(name, dims),
        };
        let values_optional = ArchTraits::of(&self.arch).is_some_and(|t| t.normed_values);
        for (i, (delta_net, &kv_heads)) in plan.delta_net.iter().zip(kv_heads).enumerate() {
            let p = format!("blk.{i}");
            let head_dim = plan.head_dim(i);
            let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
            let q_rows = if gated { 2 * q_width } else { q_width };
            let shared = plan.kv_source[i].is_some();
            match (delta_net, taps.filter(|_| kv_width == 0)) {
                (Some(shape), _) => shape.check(self, i, width)?,
                (None, Some(taps)) => {
                    for (name, dims) in ShortConv::expected_shapes(&p, width, taps) {
                        self.expect_shape(&name, &dims)?;
                    }
                }
                (None, None) => {
                    self.expect_shape(&format!("{p}.attn_q.weight"), &[q_rows, width])?;
                    optional(&format!("{p}.attn_k.weight"), &[kv_width, width], shared)?;
                    optional(&format!("{p}.attn_v.weight"), &[kv_width, width], shared || values_optional)?;
                    self.expect_shape(&format!("{p}.attn_output.weight"), &[width, q_width])?;
                }
            }
            self.expect_shape(&format!("{p}.attn_norm.weight"), &[width])?;
            self.expect_shape(&format!("{p}.{}.weight", plan.ffn_norm), &[width])?;
            let ffn = shape(&format!("{p}.ffn_up.weight")).unwrap_or_default();
            let hidden = ffn.first().copied().unwrap_or(0);
            self.expect_shape(&format!("{p}.ffn_up.weight"), &[hidden, width])?;
            self.expect_shape(&format!("{p}.ffn_gate.weight"), &[hidden, width])?;
            self.expect_shape(&format!("{p}.ffn_down.weight"), &[width, hidden])?;
        }
        Ok(())
    }

    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Tensor `name` in the mapped file.
    fn mapped(&self, name: &str) -> Result<MappedTensor> {
        let Some(info) = self.content.tensor_infos.get(name) else {
            return Err(self.bad(format!("missing tensor `{name}`")));
        };
        let map = self.map.as_ref().ok_or_else(|| self.bad("the file's tensors are not mapped"))?;
        map.tensor(info, self.content.tensor_data_offset).map_err(|e| self.bad(format!("tensor `{name}`: {e}")))
    }

    /// Tensor `name`, copied to the device.
    fn qtensor(&mut self, name: &str) -> Result<QTensor> {
        let t = self.mapped(name)?;
        let copy = t.to_qtensor(self.device).map_err(|e| self.bad(format!("tensor `{name}`: {e}")))?;
        t.release_pages();
        Ok(copy)
    }

    pub(super) fn vector(&mut self, name: &str) -> Result<Tensor> {
        let q = self.qtensor(name)?;
        q.dequantize(self.device).map_err(|e| self.bad(format!("tensor `{name}`: {e}")))
    }

    fn optional_vector(&mut self, name: &str) -> Result<Option<Tensor>> {
        if self.has(name) {
            self.vector(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// An RMSNorm weight of `len` values that some families have and others not.
    fn optional_norm(&mut self, name: &str, len: usize) -> Result<Option<Tensor>> {
        let norm = self.optional_vector(name)?;
        match &norm {
            Some(t) if t.dims() != [len] => {
                Err(self.bad(format!("tensor `{name}` is {:?}, {len} values expected", t.dims())))
            }
            _ => Ok(norm),
        }
    }

    /// Layer `i`'s (`p` = `blk.i`) attention.
    fn attention(
        &mut self,
        p: &str,
        plan: &LayerPlan,
        traits: &ArchTraits,
        sliding_window: Option<usize>,
        i: usize,
        kernels: Kernels,
    ) -> Result<Attention> {
        let head_dim = plan.head_dim(i);
        let sliding = sliding_window.filter(|_| plan.sliding[i]);
        let rotates = traits.no_rope_every.is_none_or(|every| !(i + 1).is_multiple_of(every));
        let kv_source = plan.kv_source[i];
        let optional_linear = |ld: &mut Self, name: String| match ld.has(&name) && kv_source.is_none() {
            true => ld.linear(&name, kernels).map(Some),
            false => Ok(None),
        };
        let wk = optional_linear(self, format!("{p}.attn_k.weight"))?;
        let wv = optional_linear(self, format!("{p}.attn_v.weight"))?;
        if kv_source.is_none() && (wk.is_none() || (wv.is_none() && !traits.normed_values)) {
            return Err(self.bad(format!("missing tensor `{p}.attn_{}.weight`", if wk.is_none() { "k" } else { "v" })));
        }
        Ok(Attention {
            q_norm: self.optional_norm(&format!("{p}.attn_q_norm.weight"), head_dim)?,
            k_norm: match kv_source {
                None => self.optional_norm(&format!("{p}.attn_k_norm.weight"), head_dim)?,
                Some(_) => None,
            },
            v_norm: match traits.normed_values && kv_source.is_none() {
                true => Some(Tensor::ones(head_dim, DType::F32, self.device)?),
                false => None,
            },
            head_dim,
            scale: if traits.normed_values { 1.0 } else { 1.0 / (head_dim as f64).sqrt() },
            kv_source,
            window: sliding,
            rope: rotates.then_some(usize::from(plan.sliding[i])),
            gated: traits.delta_net,
            wq: self.linear(&format!("{p}.attn_q.weight"), kernels)?,
            wk,
            wv,
            wo: self.linear(&format!("{p}.attn_output.weight"), kernels)?,
            bq: self.optional_vector(&format!("{p}.attn_q.bias"))?,
            bk: self.optional_vector(&format!("{p}.attn_k.bias"))?,
            bv: self.optional_vector(&format!("{p}.attn_v.bias"))?,
        })
    }

    pub(super) fn linear(&mut self, name: &str, kernels: Kernels) -> Result<Linear> {
        Linear::mapped(self.mapped(name)?, kernels, self.device).map_err(|e| self.bad(format!("tensor `{name}`: {e}")))
    }

    /// A table looked up a row per token: read in place on the CPU, copied to a GPU.
    fn embeddings(&self, table: MappedTensor) -> Result<Embeddings> {
        if self.device.is_cpu() {
            return Ok(Embeddings::Mapped(table));
        }
        let copy = table.to_qtensor(self.device).map_err(|e| self.bad(format!("embedding table: {e}")))?;
        table.release_pages();
        Ok(Embeddings::Owned(Arc::new(copy)))
    }

    /// Gemma 4's per-layer inputs of `width` values for each of `layers` layers.
    fn per_layer_inputs(
        &mut self,
        width: usize,
        layers: usize,
        model_width: usize,
        vocab: usize,
        kernels: Kernels,
    ) -> Result<PerLayerInputs> {
        self.expect_shape("per_layer_token_embd.weight", &[vocab, layers * width])?;
        self.expect_shape("per_layer_model_proj.weight", &[layers * width, model_width])?;
        let table = self.embeddings(self.mapped("per_layer_token_embd.weight")?)?;
        Ok(PerLayerInputs {
            table,
            projection: self.linear("per_layer_model_proj.weight", kernels)?,
            norm: self
                .optional_norm("per_layer_proj_norm.weight", width)?
                .ok_or_else(|| self.bad("missing tensor `per_layer_proj_norm.weight`"))?,
            width,
            layers,
        })
    }

    /// Layer `p`'s gate and projection of its per-layer input (gemma4).
    fn layer_input(&mut self, p: &str, width: usize, model_width: usize, kernels: Kernels) -> Result<LayerInput> {
        self.expect_shape(&format!("{p}.inp_gate.weight"), &[width, model_width])?;
        self.expect_shape(&format!("{p}.proj.weight"), &[model_width, width])?;
        self.expect_shape(&format!("{p}.post_norm.weight"), &[model_width])?;
        Ok(LayerInput {
            gate: self.linear(&format!("{p}.inp_gate.weight"), kernels)?,
            projection: self.linear(&format!("{p}.proj.weight"), kernels)?,
            norm: self.vector(&format!("{p}.post_norm.weight"))?,
        })
    }
}

/// What of the attention layers runs on candle's ops although our kernels were chosen,
/// for each head size the layers have.
fn candle_fallbacks(layers: &[Layer], kernels: Kernels, on_cpu: bool) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for layer in layers {
        let Mixer::Attention(a) = &layer.mixer else { continue };
        for line in crate::engine::cpu::attention::candle_fallbacks(kernels, on_cpu, a.head_dim) {
            if !all.contains(&line) {
                all.push(line);
            }
        }
    }
    all
}

/// The copied matrices as "Q6_K: output, blk.0.ffn_down, … (9)": per type, the first few
/// names and the count.
fn summarize_copied(copied: impl Iterator<Item = (String, GgmlDType)>) -> Vec<String> {
    let mut by_type: Vec<(GgmlDType, Vec<String>)> = Vec::new();
    for (name, dtype) in copied {
        match by_type.iter_mut().find(|(d, _)| *d == dtype) {
            Some((_, names)) => names.push(name),
            None => by_type.push((dtype, vec![name])),
        }
    }
    by_type
        .into_iter()
        .map(|(dtype, names)| {
            let shown = names.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
            let more = if names.len() > 3 { ", …" } else { "" };
            format!("{dtype:?}: {shown}{more} ({})", names.len())
        })
        .collect()
}

impl Model {
    /// Loads a GGUF file. `progress` is called with values in 0.0..=1.0 while tensors load.
    pub fn load(path: &Path, device: &Device, kernels: Kernels, progress: impl FnMut(f32)) -> Result<Model> {
        let (content, reader) = read_gguf(path)?;
        Model::load_read(path, &content, reader, device, kernels, progress)
    }

    /// [`Model::load`] of a file whose header was already read ([`read_gguf`]): `content`,
    /// and `reader` over the file.
    pub fn load_read(
        path: &Path,
        content: &gguf_file::Content,
        reader: BufReader<File>,
        device: &Device,
        kernels: Kernels,
        mut progress: impl FnMut(f32),
    ) -> Result<Model> {
        let _span = tracing::info_span!("load", path = %path.display()).entered();
        let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let arch = architecture(path, content)?;
        let Some(traits) = ArchTraits::of(&arch) else {
            return Err(EngineError::UnsupportedArchitecture(arch));
        };
        let map = MappedFile::map(reader.get_ref())
            .map_err(|e| EngineError::ModelLoad { path: path.to_path_buf(), source: Cause::new(e) })?;
        let mut ld = Loader { path, content, map: Some(map), device, arch: arch.clone() };
        // Multimodal towers (vision `v.`, audio `a.`, their projectors `mm.`) are not run: a
        // file that holds them is refused rather than read as text only without saying so.
        if let Some(name) = content.tensor_infos.keys().find(|n| ["v.", "a.", "mm."].iter().any(|p| n.starts_with(p))) {
            return Err(ld.bad(format!(
                "it holds a vision or audio tower (tensor `{name}`); only text models run: use a text-only file"
            )));
        }
        // Mixture-of-experts FFNs (Gemma 4 26B-A4B: a router `ffn_gate_inp` and experts) are
        // not run: their layers would otherwise run the shared FFN alone.
        if let Some(name) = content.tensor_infos.keys().find(|n| n.ends_with(".ffn_gate_inp.weight")) {
            return Err(ld.bad(format!("mixture-of-experts layers (tensor `{name}`) are not supported")));
        }

        let n_heads = ld.meta_u32("attention.head_count")?;
        let n_layers = ld.meta_u32("block_count")?;
        let embedding_length = ld.meta_u32("embedding_length")?;
        let layer_kv_heads = ld.kv_heads_per_layer(n_layers, n_heads)?;
        let memory = ld.layer_memory(&layer_kv_heads, embedding_length)?;
        let n_kv_heads = match shared_kv_heads(&layer_kv_heads) {
            Some(h) => h,
            None if layer_kv_heads.iter().any(|&h| h > 0) => {
                return Err(ld.bad(format!("attention layers with different K/V head counts: {layer_kv_heads:?}")))
            }
            None => n_heads,
        };
        let context_length = ld.meta_u32("context_length").unwrap_or(4096);
        let rms_eps = ld.meta_f32_or("attention.layer_norm_rms_epsilon", 1e-6);
        let rope_freq_base = ld.meta_f32_or("rope.freq_base", 10_000.0);
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(ld.bad(format!("inconsistent head counts: {n_heads} heads, {n_kv_heads} kv heads")));
        }
        let sliding_window = match traits.sliding_windows {
            Some(_) => Some(ld.meta_u32("attention.sliding_window")?.max(1)),
            None => None,
        };
        if traits.short_conv && ld.meta_u32("attention.sliding_window").is_ok_and(|w| w > 0) {
            return Err(ld.bad("LFM2 with sliding-window attention is not supported"));
        }
        // Head sizes (qwen3 and gemma3 heads are wider than the width over the heads;
        // gemma4's sliding and global layers differ) and the values RoPE rotates, the
        // first ones (llama.cpp's `n_rot`).
        let plan = ld.layer_plan(&traits, n_layers)?;
        let HeadDims { rope_global, rope_sliding, .. } = plan.head_dims;
        let n_layers = plan.delta_net.len();
        let head_dims = plan.layer_head_dims();
        let head_dim = head_dims.iter().copied().max().unwrap_or(0);

        let taps = memory.iter().find_map(|m| match m {
            LayerMemory::Recurrent(shapes) => Some(shapes[0][0] + 1),
            LayerMemory::KeysValues | LayerMemory::SharedKeysValues(_) => None,
        });
        ld.check_shapes(&plan, embedding_length, (n_heads, traits.delta_net), &layer_kv_heads, taps)?;
        let ffn_length = (0..n_layers)
            .filter_map(|i| content.tensor_infos.get(&format!("blk.{i}.ffn_up.weight")))
            .map(|t| t.shape.dims()[0])
            .max()
            .unwrap_or(0);
        let embeddings = ld.mapped("token_embd.weight")?;
        let vocab_size = embeddings.dims()[0];
        let per_layer_width = ld.meta_u32("embedding_length_per_layer_input").unwrap_or(0);
        let per_layer = match per_layer_width {
            0 => None,
            width => Some(ld.per_layer_inputs(width, n_layers, embedding_length, vocab_size, kernels)?),
        };
        progress(0.05);
        let memory = plan.memory_over(memory);
        let mut layers = Vec::with_capacity(n_layers);
        let mut weights_dtype = None;
        for (i, memory) in memory.iter().take(n_layers).enumerate() {
            let p = format!("blk.{i}");
            let mixer = match (plan.delta_net[i], memory) {
                (Some(shape), _) => Mixer::DeltaNet(DeltaNet::load(&mut ld, i, shape, kernels)?),
                (None, LayerMemory::Recurrent(_)) => {
                    Mixer::ShortConv(ShortConv::load(&mut ld, &p, embedding_length, kernels)?)
                }
                (None, LayerMemory::KeysValues | LayerMemory::SharedKeysValues(_)) => {
                    Mixer::Attention(ld.attention(&p, &plan, &traits, sliding_window, i, kernels)?)
                }
            };
            // qwen35's `post_attention_norm` is the norm before the FFN, not one after attention.
            let post_attn_norm = match plan.ffn_norm {
                "post_attention_norm" => None,
                _ => ld.optional_norm(&format!("{p}.post_attention_norm.weight"), embedding_length)?,
            };
            // The first layer's first matrix (q, or the convolution's input projection).
            weights_dtype.get_or_insert(mixer.matrices()[0].1.dtype());
            let input = match per_layer_width {
                0 => None,
                width => Some(ld.layer_input(&p, width, embedding_length, kernels)?),
            };
            let out_scale = ld.optional_norm(&format!("{p}.layer_output_scale.weight"), 1)?;
            layers.push(Layer {
                attn_norm: ld.vector(&format!("{p}.attn_norm.weight"))?,
                mixer,
                post_attn_norm,
                post_ffn_norm: ld.optional_norm(&format!("{p}.post_ffw_norm.weight"), embedding_length)?,
                ffn_norm: ld.vector(&format!("{p}.{}.weight", plan.ffn_norm))?,
                w_gate: ld.linear(&format!("{p}.ffn_gate.weight"), kernels)?,
                w_up: ld.linear(&format!("{p}.ffn_up.weight"), kernels)?,
                w_down: ld.linear(&format!("{p}.ffn_down.weight"), kernels)?,
                input,
                out_scale,
            });
            progress(0.05 + 0.9 * (i + 1) as f32 / n_layers as f32);
        }
        let output_norm = ld.vector(&format!("{}.weight", traits.output_norm))?;
        // Tied embeddings: the output projection reads the embedding table. The lookups
        // read the mapped table, or the output layer's copy where it made one.
        let output = if ld.has("output.weight") {
            ld.linear("output.weight", kernels)?
        } else {
            Linear::mapped(embeddings.clone(), kernels, device).map_err(|e| ld.bad(format!("token_embd: {e}")))?
        };
        let embeddings = match output.owned_weight() {
            // A tied table the output layer copied anyway: look up in that copy, so the
            // mapped table's pages need not stay resident beside it.
            Some(w) if !ld.has("output.weight") => {
                embeddings.release_pages();
                Embeddings::Owned(w.clone())
            }
            _ => ld.embeddings(embeddings)?,
        };
        let positions = context_length.clamp(1, MAX_ROPE_POSITIONS);
        // Llama 3.x files carry per-frequency factors; linear scaling applies to the
        // global layers only (as llama.cpp does for gemma3).
        let factors = match ld.optional_vector("rope_freqs.weight")? {
            Some(t) => Some(t.flatten_all()?.to_vec1::<f32>()?),
            None => None,
        };
        let linear = ld.meta("rope.scaling.type").ok().and_then(|v| v.to_string().ok()).is_some_and(|t| t == "linear");
        let scale = if linear { 1.0 / ld.meta_f32_or("rope.scaling.factor", 1.0).max(1e-6) } else { 1.0 };
        let mut ropes = vec![Rope::new(rope_global, rope_freq_base, factors.as_deref(), scale, device)?];
        if let Some(w) = traits.sliding_windows {
            let base = ld.meta_f32_or("rope.freq_base_swa", w.rope_base);
            ropes.push(Rope::new(rope_sliding, base, None, 1.0, device)?);
        }
        let name = content
            .metadata
            .get("general.name")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_else(|| path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default());
        let matrices = || {
            layers
                .iter()
                .enumerate()
                .flat_map(|(i, l): (usize, &Layer)| {
                    l.mixer
                        .matrices()
                        .into_iter()
                        .chain([("ffn_gate", &l.w_gate), ("ffn_up", &l.w_up), ("ffn_down", &l.w_down)])
                        .chain(
                            l.input.iter().flat_map(|input| [("inp_gate", &input.gate), ("proj", &input.projection)]),
                        )
                        .map(move |(name, l)| (format!("blk.{i}.{name}"), l))
                })
                .chain([("output".to_string(), &output)])
                .chain(per_layer.iter().map(|p| ("per_layer_model_proj".to_string(), &p.projection)))
        };
        let vectors: u64 = layers
            .iter()
            .flat_map(|l| {
                [Some(&l.attn_norm), Some(&l.ffn_norm), l.post_attn_norm.as_ref(), l.post_ffn_norm.as_ref()]
                    .into_iter()
                    .chain([l.input.as_ref().map(|i| &i.norm), l.out_scale.as_ref()])
                    .flatten()
                    .chain(l.mixer.vectors())
            })
            .chain([&output_norm])
            .chain(per_layer.iter().map(|p| &p.norm))
            .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
            .sum();
        let (embeddings_heap, embeddings_mapped) = match &embeddings {
            Embeddings::Owned(w) if ld.has("output.weight") => (w.storage_size_in_bytes() as u64, 0),
            // the output layer's copy, counted there
            Embeddings::Owned(_) => (0, 0),
            Embeddings::Mapped(_) if output.is_mapped() && !ld.has("output.weight") => (0, 0),
            Embeddings::Mapped(t) => (0, t.bytes().len() as u64),
        };
        // Gemma 4's per-layer table: read a row per token in place, like the embeddings.
        let (table_heap, table_mapped) = match per_layer.as_ref().map(|p| &p.table) {
            None => (0, 0),
            Some(Embeddings::Owned(w)) => (w.storage_size_in_bytes() as u64, 0),
            Some(Embeddings::Mapped(t)) => (0, t.bytes().len() as u64),
        };
        let mapped_weight_bytes =
            matrices().map(|(_, l)| l.mapped_bytes()).sum::<u64>() + embeddings_mapped + table_mapped;
        let heap_weight_bytes =
            matrices().map(|(_, l)| l.heap_bytes()).sum::<u64>() + vectors + embeddings_heap + table_heap;
        let copied_matrices = summarize_copied(matrices().filter(|(_, l)| !l.is_mapped()).map(|(n, l)| (n, l.dtype())));
        let requantized_from = content.metadata.get("general.quantized_from").and_then(|v| v.to_string().ok()).cloned();
        progress(1.0);
        let config = ModelConfig {
            rope_neox: traits.rope_neox,
            sliding_window,
            architecture: arch,
            name,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            embedding_length,
            ffn_length,
            vocab_size,
            context_length,
            rope_freq_base,
            rope_dim: rope_global,
            rms_eps,
            weights_dtype: weights_dtype.unwrap_or(GgmlDType::F32),
            requantized_from,
            file_bytes,
            heap_weight_bytes,
            mapped_weight_bytes,
            lookup_table_bytes: table_mapped,
            copied_matrices,
            candle_fallbacks: candle_fallbacks(&layers, kernels, device.is_cpu()),
        };
        tracing::info!(
            ?config.weights_dtype,
            n_layers,
            heap_weight_bytes = config.heap_weight_bytes,
            mapped_weight_bytes = config.mapped_weight_bytes,
            copied = ?config.copied_matrices,
            candle_fallbacks = ?config.candle_fallbacks,
            "model loaded"
        );
        Ok(Model {
            config,
            path: path.to_path_buf(),
            device: device.clone(),
            embeddings,
            layers,
            output_norm,
            output,
            ropes,
            positions,
            embedding_scale: traits.scale_embeddings.then(|| (embedding_length as f64).sqrt()),
            per_layer,
            final_softcap: traits
                .final_softcap
                .map(|cap| f64::from(ld.meta_f32_or("final_logit_softcapping", cap)))
                .filter(|&cap| cap > 0.0),
            activation: traits.activation,
            kernels,
        })
    }
}
