//! Running a model: the forward pass over a [`State`] (attention, mixers, FFN, logits)
//! and the K/V shift that drops old turns.

use super::*;
use crate::engine::cpu::norm;

impl Model {
    /// Runs `tokens` at positions `state.len()..`, appends their K/V to `state`, and
    /// returns the logits of the last token: shape `(vocab,)`.
    ///
    /// A long prompt runs in chunks of [`PREFILL_CHUNK`] tokens, so its activations (and
    /// the process's peak memory) stay those of one chunk however long it is.
    pub fn forward(&self, tokens: &[u32], state: &mut State) -> Result<Tensor> {
        if state.len() + tokens.len() > state.max_tokens() {
            return Err(EngineError::ContextFull { budget: state.max_tokens() });
        }
        // The whole prompt's cache at once: growing it chunk by chunk copied every earlier
        // chunk again each time and left freed buffers behind (peak RSS over the
        // prediction at 8K tokens of f32 cache).
        state.reserve(state.len() + tokens.len())?;
        let mut hidden = None;
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            hidden = Some(self.forward_hidden(chunk, state)?);
        }
        let hidden = hidden.ok_or(EngineError::EmptyPrompt)?;
        let last = hidden.narrow(0, hidden.dim(0)? - 1, 1)?;
        let logits = self.logits(&last)?;
        Ok(logits.squeeze(0)?.to_dtype(DType::F32)?)
    }

    /// The output layer over final hidden states `(n, width)`, soft-capped where the
    /// family does it.
    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let logits = self.output.forward(hidden)?;
        Ok(match self.final_softcap {
            Some(cap) => ((logits / cap)?.tanh()? * cap)?,
            None => logits,
        })
    }

    /// Like [`Model::forward`] but returns the logits of every token: `(n, vocab)`.
    /// Used by tests to compare against a from-scratch run.
    pub fn forward_all(&self, tokens: &[u32], state: &mut State) -> Result<Tensor> {
        let hidden = self.forward_hidden(tokens, state)?;
        self.logits(&hidden)
    }

    /// The final hidden states of `tokens`, `(n, width)`, in as many calls as the
    /// sliding-window layers take (see [`State::max_write`]).
    fn forward_hidden(&self, tokens: &[u32], state: &mut State) -> Result<Tensor> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if state.len() + tokens.len() > state.max_tokens() {
            return Err(EngineError::ContextFull { budget: state.max_tokens() });
        }
        let step = state.max_write();
        if tokens.len() <= step {
            // every decode step and most prefills: one call, nothing to gather
            return self.forward_part(tokens, state);
        }
        let parts = tokens.chunks(step).map(|part| self.forward_part(part, state)).collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&parts, 0)?)
    }

    fn forward_part(&self, tokens: &[u32], state: &mut State) -> Result<Tensor> {
        let n = tokens.len();
        let pos = state.len();
        state.reserve(pos + n)?;
        state.make_room(n)?;
        let mut x = self.embeddings.lookup(tokens, &self.device)?; // (n, d)
        if let Some(scale) = self.embedding_scale {
            x = (x * scale)?;
        }
        let inputs = match &self.per_layer {
            Some(p) => Some(p.of(tokens, &x, self.config.rms_eps, &self.device)?),
            None => None,
        };
        let angles = self.ropes.iter().map(|r| r.at(pos, n)).collect::<Result<Vec<_>>>()?;
        // Built on first use, one per window size: the fast attention kernels mask as they go.
        let masks = [std::cell::OnceCell::new(), std::cell::OnceCell::new()];
        let eps = self.config.rms_eps;
        let norm = |x: &Tensor, w: &Option<Tensor>| -> candle_core::Result<Tensor> {
            match w {
                Some(w) => candle_nn::ops::rms_norm(x, w, eps),
                None => Ok(x.clone()),
            }
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let h = self.rms_norm(&x, &layer.attn_norm)?;
            let mixed = match &layer.mixer {
                Mixer::Attention(a) => {
                    let angles = a.rope.map(|r| &angles[r]);
                    let mask = &masks[usize::from(a.window.is_some())];
                    self.attention(i, a, &h, state, pos, angles, mask)?
                }
                Mixer::ShortConv(s) => s.forward(i, &h, state)?,
                Mixer::DeltaNet(d) => d.forward(i, &h, state, eps)?,
            };
            let h;
            (x, h) = self.add_rms_norm(&x, &norm(&mixed, &layer.post_attn_norm)?, &layer.ffn_norm)?;
            let [gate, up]: [Tensor; 2] =
                Linear::forward_many(&[&layer.w_gate, &layer.w_up], &h)?.try_into().expect("two layers, two outputs");
            let mlp = layer.w_down.forward(&self.gated_product(&gate, &up, self.activation)?)?;
            x = (x + norm(&mlp, &layer.post_ffn_norm)?)?;
            if let (Some(input), Some(inputs)) = (&layer.input, &inputs) {
                let gated = self.gated_product(&input.gate.forward(&x)?, &inputs.get(i)?, Activation::Gelu)?;
                x = (&x + candle_nn::ops::rms_norm(&input.projection.forward(&gated)?, &input.norm, eps)?)?;
            }
            if let Some(scale) = &layer.out_scale {
                x = x.broadcast_mul(scale)?;
            }
        }
        state.commit(tokens);
        self.rms_norm(&x, &self.output_norm)
    }

    /// RMSNorm of `x`'s rows: ours, on the thread pool, where our CPU kernels run (the same
    /// bits as candle's), candle's elsewhere.
    fn rms_norm(&self, x: &Tensor, alpha: &Tensor) -> Result<Tensor> {
        let eps = self.config.rms_eps;
        if self.kernels.isa().is_none() || !ours_can_norm(x, alpha) {
            return Ok(candle_nn::ops::rms_norm(x, alpha, eps)?);
        }
        let (x_c, alpha_c) = (x.contiguous()?, alpha.contiguous()?);
        let normed = with_cpu_values(&x_c, |x| with_cpu_values(&alpha_c, |a| norm::rms_norm(x, a, eps)))??;
        Ok(Tensor::from_vec(normed, x.shape(), x.device())?)
    }

    /// `x + delta` and the RMSNorm of its rows, in one pass where our CPU kernels run.
    fn add_rms_norm(&self, x: &Tensor, delta: &Tensor, alpha: &Tensor) -> Result<(Tensor, Tensor)> {
        if self.kernels.isa().is_none()
            || !ours_can_norm(x, alpha)
            || !ours_can_norm(delta, alpha)
            || x.shape() != delta.shape()
        {
            let sum = (x + delta)?;
            let normed = candle_nn::ops::rms_norm(&sum, alpha, self.config.rms_eps)?;
            return Ok((sum, normed));
        }
        let (x_c, delta_c, alpha_c) = (x.contiguous()?, delta.contiguous()?, alpha.contiguous()?);
        let (sum, normed) = with_cpu_values(&x_c, |x| {
            with_cpu_values(&delta_c, |d| {
                with_cpu_values(&alpha_c, |a| norm::add_rms_norm(x, d, a, self.config.rms_eps))
            })
        })???;
        Ok((Tensor::from_vec(sum, x.shape(), x.device())?, Tensor::from_vec(normed, x.shape(), x.device())?))
    }

    /// `activation(gate) · up`: our vectorized kernel in one pass where our CPU kernels
    /// run, candle's ops elsewhere.
    fn gated_product(&self, gate: &Tensor, up: &Tensor, activation: Activation) -> Result<Tensor> {
        use crate::engine::cpu::activation::{gated_product_of, Gate};
        let f32_cpu = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32;
        match self.kernels.isa() {
            Some(isa) if f32_cpu(gate) && f32_cpu(up) && gate.shape() == up.shape() => {
                let act = match activation {
                    Activation::Silu => Gate::Silu,
                    Activation::Gelu => Gate::GeluTanh,
                };
                let (gate_c, up_c) = (gate.contiguous()?, up.contiguous()?);
                let values =
                    with_cpu_values(&gate_c, |g| with_cpu_values(&up_c, |u| gated_product_of(g, u, act, isa)))??;
                Ok(Tensor::from_vec(values, gate.shape(), gate.device())?)
            }
            _ => {
                let gate = match activation {
                    Activation::Silu => candle_nn::ops::silu(gate)?,
                    Activation::Gelu => gate.gelu()?,
                };
                Ok((gate * up)?)
            }
        }
    }

    fn group(&self) -> usize {
        self.config.n_heads / self.config.n_kv_heads
    }

    /// Self-attention of one layer. Queries of the `group` heads that share a K/V head are
    /// stacked along the row axis, so shared heads are read in place, never repeated:
    ///
    /// ```text
    ///   q: (n_kv, group·n, hd) @ kᵀ: (n_kv, hd, L) → scores (n_kv, group·n, L)
    /// ```
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        index: usize,
        layer: &Attention,
        h: &Tensor,
        state: &mut State,
        pos: usize,
        angles: Option<&(Tensor, Tensor)>,
        mask: &std::cell::OnceCell<Tensor>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let hd = layer.head_dim;
        let n = h.dim(0)?;
        let with_bias = |t: Tensor, b: &Option<Tensor>| -> candle_core::Result<Tensor> {
            match b {
                Some(b) => t.broadcast_add(b),
                None => Ok(t),
            }
        };
        // One activation quantization and one parallel region for q, k and v (those the
        // layer has).
        let linears: Vec<&Linear> =
            [Some(&layer.wq), layer.wk.as_ref(), layer.wv.as_ref()].into_iter().flatten().collect();
        let mut outputs = Linear::forward_many(&linears, h)?.into_iter();
        let q = with_bias(outputs.next().expect("a query per layer"), &layer.bq)?;
        // A gated layer's q rows hold each head's query, then its gate.
        let (q, gate) = if layer.gated {
            let both = q.reshape((n, c.n_heads, 2, hd))?;
            let gate = both.narrow(2, 1, 1)?.reshape((n, c.n_heads * hd))?;
            (both.narrow(2, 0, 1)?.reshape((n, c.n_heads * hd))?, Some(gate))
        } else {
            (q, None)
        };
        let head_norm = |t: Tensor, w: &Option<Tensor>| -> candle_core::Result<Tensor> {
            match w {
                Some(w) => candle_nn::ops::rms_norm(&t, w, c.rms_eps),
                None => Ok(t),
            }
        };
        let rope = |t: Tensor| match angles {
            None => Ok(t),
            Some((cos, sin)) => rotate(&t, cos, sin, c.rope_neox),
        };
        // (n, heads·hd) → (1, heads, n, hd)
        let q = rope(head_norm(q.reshape((1, n, c.n_heads, hd))?, &layer.q_norm)?.transpose(1, 2)?.contiguous()?)?;
        // A layer with K/V of its own writes them; one sharing an earlier layer's reads those.
        let source = match layer.kv_source {
            Some(source) => source,
            None => {
                let k = with_bias(outputs.next().expect("keys in a layer with K/V"), &layer.bk)?;
                // Without `attn_v` the keys, before their norm, are the values (gemma4).
                let v = match outputs.next() {
                    Some(v) => with_bias(v, &layer.bv)?,
                    None => k.clone(),
                };
                let k =
                    head_norm(k.reshape((1, n, c.n_kv_heads, hd))?, &layer.k_norm)?.transpose(1, 2)?.contiguous()?;
                let v =
                    head_norm(v.reshape((1, n, c.n_kv_heads, hd))?, &layer.v_norm)?.transpose(1, 2)?.contiguous()?;
                state.write(index, pos, &rope(k)?, &v)?;
                index
            }
        };
        let output = |out: Tensor| -> Result<Tensor> {
            let out = match &gate {
                Some(gate) => (out * candle_nn::ops::sigmoid(gate)?)?,
                None => out,
            };
            Ok(layer.wo.forward(&out)?)
        };
        if let Some(isa) = self.kernels.isa() {
            // On the CPU: plain-Rust kernels instead of a dozen candle ops
            // (sums in another order than candle's gemm, so not with candle's kernels).
            // They divide the scores by √hd: a layer scaled otherwise has its queries
            // scaled to make up for it.
            let default_scale = 1.0 / (hd as f64).sqrt();
            let q = match layer.scale == default_scale {
                true => q.clone(),
                false => (&q * (layer.scale / default_scale))?,
            };
            let (k_buf, v_buf) = state.buffers(source);
            let held_from = state.held_from(source);
            if let Some(out) =
                crate::engine::cpu::attention::try_attention(&q, k_buf, v_buf, pos, held_from, layer.window, isa)
            {
                return output(out);
            }
        }
        // candle's ops. The first position a sliding-window layer's queries can see:
        let first = layer.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let windowed = layer.window.is_some_and(|w| pos + n > w);
        if n > 1 && mask.get().is_none() {
            let window = layer.window.filter(|_| windowed);
            let _ = mask.set(attention_mask(n, pos, first, window, self.group(), &self.device)?);
        }
        let mask = mask.get();
        let (keys, values) = state.live(source, first, pos + n)?; // (n_kv, L, hd) in f32
        let group = self.group();
        let q = q.reshape((c.n_kv_heads, group * n, hd))?;
        // Each step consumes the previous scores so at most two score matrices are alive at
        // once (a long prefill's scores are the largest scratch buffers of a forward).
        let probs = softmax_owned(masked(scaled(q.matmul(&keys.t()?)?, layer.scale)?, mask)?)?;
        let out = probs.matmul(&values)?; // (n_kv, group·n, hd)
        let out = out.reshape((c.n_heads, n, hd))?.transpose(0, 1)?.reshape((n, c.n_heads * hd))?;
        output(out)
    }

    /// Drops tokens `start..end` from `state` without recomputing the rest: the later
    /// K/V entries move down by `end - start` positions and their keys are rotated back by
    /// that many positions (RoPE is a rotation, so this is exact for the rotation itself).
    pub fn shift_out(&self, state: &mut State, start: usize, end: usize) -> Result<()> {
        let _span = tracing::info_span!("shift", start, end).entered();
        if state.is_recurrent() {
            // A recurrent layer's state holds every token it read: nothing to move down.
            return Err(EngineError::Inference(Cause::msg("a recurrent state cannot be shifted: rebuild it")));
        }
        if !state.can_shift_out(start, end) {
            // The sliding-window layers would lack the window before the new end.
            return Err(EngineError::Inference(Cause::msg("the window would not be held after the shift: rebuild it")));
        }
        let delta = end - start;
        if delta == 0 {
            return Ok(());
        }
        let tail = state.len() - end;
        if tail > 0 {
            // Rotation by -delta: cos(-a) = cos(a), sin(-a) = -sin(a); each layer by its own
            // frequencies.
            let mut back = Vec::with_capacity(self.ropes.len());
            for rope in &self.ropes {
                let half = rope.inv_freq.dim(1)?;
                let (cos, sin) = rope.at(delta, 1)?;
                back.push((
                    cos.broadcast_as((tail, half))?.contiguous()?,
                    sin.neg()?.broadcast_as((tail, half))?.contiguous()?,
                ));
            }
            let neox = self.config.rope_neox;
            state.shift_out(start, end, |layer, k| {
                let Mixer::Attention(attention) = &self.layers[layer].mixer else { return Ok(k.clone()) };
                let Some(rope) = attention.rope else { return Ok(k.clone()) };
                let (cos, sin) = &back[rope];
                rotate(&k.unsqueeze(0)?, cos, sin, neox)?.squeeze(0)
            })?;
        } else {
            state.truncate(start);
        }
        Ok(())
    }
}

/// RoPE over the first `2 · cos.dim(1)` values of each head of `x` `(1, heads, n,
/// head_dim)`; the others pass as they are (qwen35's partial rotation).
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor, neox: bool) -> candle_core::Result<Tensor> {
    let rope_dim = 2 * cos.dim(1)?;
    let head_dim = x.dim(3)?;
    let apply = |t: &Tensor| {
        if neox {
            candle_nn::rotary_emb::rope(t, cos, sin)
        } else {
            candle_nn::rotary_emb::rope_i(t, cos, sin)
        }
    };
    if rope_dim == head_dim {
        return apply(x);
    }
    let rotated = apply(&x.narrow(3, 0, rope_dim)?.contiguous()?)?;
    Tensor::cat(&[&rotated, &x.narrow(3, rope_dim, head_dim - rope_dim)?], 3)?.contiguous()
}

fn scaled(scores: Tensor, scale: f64) -> candle_core::Result<Tensor> {
    scores * scale
}

fn masked(scores: Tensor, mask: Option<&Tensor>) -> candle_core::Result<Tensor> {
    match mask {
        Some(m) => scores.broadcast_add(m),
        None => Ok(scores),
    }
}

fn softmax_owned(scores: Tensor) -> candle_core::Result<Tensor> {
    candle_nn::ops::softmax_last_dim(&scores)
}

/// Additive attention mask for `n` new queries after `pos` cached tokens, over the keys
/// from position `first` on, repeated for the `group` query heads stacked per K/V head:
/// `(group·n, pos + n - first)`, 0 or -inf. A query sees the keys at or before its own
/// position and, with a `window`, only the last `window` of them (itself included).
///
/// ```text
///            cached first..pos   new 0  new 1  new 2
///   new 0:     0 … 0              0     -inf   -inf
///   new 1:     0 … 0              0      0     -inf
///   new 2:     0 … 0              0      0      0
/// ```
fn attention_mask(
    n: usize,
    pos: usize,
    first: usize,
    window: Option<usize>,
    group: usize,
    device: &Device,
) -> Result<Tensor> {
    let l = pos + n - first;
    let mut data = Vec::with_capacity(group * n * l);
    for _ in 0..group {
        for i in 0..n {
            let query = pos + i;
            data.extend((first..pos + n).map(|key| {
                let seen = key <= query && window.is_none_or(|w| query - key < w);
                if seen {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            }));
        }
    }
    Ok(Tensor::from_vec(data, (group * n, l), device)?)
}

/// Greedy pick over logits, for tests and benches.
pub fn argmax(logits: &Tensor) -> Result<u32> {
    Ok(logits.argmax(D::Minus1)?.to_scalar::<u32>()?)
}

/// `f` of a contiguous f32 CPU tensor's values, read in place.
fn with_cpu_values<T>(t: &Tensor, f: impl FnOnce(&[f32]) -> T) -> candle_core::Result<T> {
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else { candle_core::bail!("expected a CPU tensor") };
    let Some((start, end)) = layout.contiguous_offsets() else { candle_core::bail!("expected a contiguous tensor") };
    Ok(f(&cpu.as_slice::<f32>()?[start..end]))
}

/// Whether [`Model::rms_norm`]'s own path takes `x` and `alpha`: f32 on the CPU, rows of
/// `alpha`'s length.
fn ours_can_norm(x: &Tensor, alpha: &Tensor) -> bool {
    let f32_cpu = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32;
    f32_cpu(x) && f32_cpu(alpha) && alpha.rank() == 1 && x.dims().last() == Some(&alpha.dims()[0])
}
