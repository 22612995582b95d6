#!/usr/bin/env python3
"""GGUF files with the exact shapes of models people chat with, and random weights.

Writes an F16 GGUF with a real model's tensor names, shapes and hyper-parameters, its
real vocabulary (every `tokenizer.ggml.*` key copied from llama.cpp's vocabulary-only
`ggml-vocab-*.gguf`) and chat template, and seeded random weights (normal, std 0.02, so
activations stay finite; norms 1). Then llama.cpp's own quantizer turns it into Q4_K_M and
Q8_0, so the quantized files have the tensor types the published ones have and their
sizes within a few KB. Speed and memory measured on them are those of the real model;
what they generate is noise.

  python3 bench/shaped_model.py llama-3.2-1b --out /work/shaped
  python3 bench/shaped_model.py qwen3-0.6b --out /work/shaped
  python3 bench/shaped_model.py qwen2.5-1.5b --out /work/shaped
  python3 bench/shaped_model.py gemma-3-1b --out /work/shaped
  python3 bench/shaped_model.py lfm2.5-1.2b --out /work/shaped --quants Q4_K_M
  python3 bench/shaped_model.py qwen3.5-0.8b --out /work/shaped
    -> DIR/Llama-3.2-1B-shaped.{F16,Q4_K_M,Q8_0}.gguf, DIR/Qwen3-0.6B-shaped.{...}.gguf, ...

Deterministic for a --seed (one generator per tensor, seeded with [seed, tensor index]).
Needs the `gguf` and `llama_cpp` (llama-cpp-python) packages and llama.cpp's vocab files
(--llama-cpp DIR: a llama.cpp source tree, such as llama-cpp-python's sdist's
vendor/llama.cpp, for models/ggml-vocab-*.gguf and models/templates/*.jinja).

Shapes: the models' config.json (hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, head_dim, vocab_size, rope_theta, rope_scaling,
rms_norm_eps, max_position_embeddings, tie_word_embeddings), written the way llama.cpp's
convert_hf_to_gguf.py writes them (conversion/base.py, llama.py, qwen.py, lfm2.py) and
checked against the tensors src/models/llama.cpp, qwen3.cpp, lfm2.cpp and qwen35.cpp create.

LFM2.5 1.2B: 16 layers, 10 short convolutions and 6 GQA attention layers (the model
card), attention at layers 2, 5, 8, 10, 12 and 14 (LFM2's `layer_types`), width 2048, FFN
8192 (llama.cpp's `n_ff` of the 1.2B type), 32 heads of 64 and 8 K/V heads, a 3-tap
convolution (`conv_L_cache`), RoPE base 1e6, tied embeddings. No LFM2 vocabulary file is
in llama.cpp's suite: Qwen2's (151,936 tokens, ChatML markers) stands in for its 65,536,
so the embedding table is larger than the real model's; the layers are its own.

Qwen3.5 (`qwen35`, src/models/qwen35.cpp, conversion/qwen.py's Qwen3NextModel): every
fourth layer gated attention (attn_q twice as wide, q/k norms, RoPE over 64 of 256 values),
the others gated delta-net (attn_qkv, attn_gate, ssm_conv1d in F32 as ggml's ssm_conv needs,
ssm_a = -exp(A_log), ssm_dt, ssm_alpha, ssm_beta, ssm_norm, ssm_out); the norm before the
FFN is `post_attention_norm`. Its shape is the text config of Qwen/Qwen3.5-0.8B (hidden 1024,
24 layers, FFN 3584, 8 heads / 2 KV heads of 256, linear attention 16 key and 16 value heads
of 128, conv kernel 4, vocabulary 248,320 tied, rope_theta 1e7, partial_rotary_factor 0.25,
mrope_section [11, 11, 10]). llama.cpp's ggml-vocab-qwen35.gguf has 151,936 tokens (Qwen2's
with the qwen35 pre-tokenizer); the rows past them are unused `<|extra_N|>` tokens so the
embedding table has the real model's 248,320 rows.
"""
import argparse, ctypes, math, os, sys, time

import numpy as np

DEFAULT_LLAMA_CPP = "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"

# Qwen2.5/Qwen3's added tokens (tokenizer.json's added_tokens), which llama.cpp's
# ggml-vocab-qwen2.gguf (made from Qwen1.5) has as [PAD...]; 151643-151645 it has.
QWEN3_ADDED_TOKENS = {
    151646: "<|object_ref_start|>", 151647: "<|object_ref_end|>", 151648: "<|box_start|>",
    151649: "<|box_end|>", 151650: "<|quad_start|>", 151651: "<|quad_end|>",
    151652: "<|vision_start|>", 151653: "<|vision_end|>", 151654: "<|vision_pad|>",
    151655: "<|image_pad|>", 151656: "<|video_pad|>", 151657: "<tool_call>",
    151658: "</tool_call>", 151659: "<|fim_prefix|>", 151660: "<|fim_middle|>",
    151661: "<|fim_suffix|>", 151662: "<|fim_pad|>", 151663: "<|repo_name|>",
    151664: "<|file_sep|>", 151665: "<tool_response>", 151666: "</tool_response>",
    151667: "<think>", 151668: "</think>",
}

SHAPES = {
    # meta-llama/Llama-3.2-1B-Instruct config.json
    "llama-3.2-1b": dict(
        file="Llama-3.2-1B-shaped", arch="llama", name="Llama 3.2 1B Instruct (shaped, random weights)",
        size_label="1B", vocab_file="ggml-vocab-llama-bpe.gguf",
        template="meta-llama-Llama-3.2-3B-Instruct.jinja",  # the 1B's template is the same
        n_layer=16, n_embd=2048, n_ff=8192, n_head=32, n_head_kv=8, head_dim=64,
        n_vocab=128256, n_ctx=131072, rope_base=500000.0, rms_eps=1e-5, tied=True,
        qk_norm=False, llama3_rope=dict(factor=32.0, low_freq_factor=1.0,
                                        high_freq_factor=4.0, original_ctx=8192),
        tokens=dict(bos=128000, eos=128009, add_bos=True, added={}),
    ),
    # Qwen/Qwen3-0.6B config.json
    "qwen3-0.6b": dict(
        file="Qwen3-0.6B-shaped", arch="qwen3", name="Qwen3 0.6B (shaped, random weights)",
        size_label="0.6B", vocab_file="ggml-vocab-qwen2.gguf",
        template="Qwen-Qwen3-0.6B.jinja",
        n_layer=28, n_embd=1024, n_ff=3072, n_head=16, n_head_kv=8, head_dim=128,
        n_vocab=151936, n_ctx=40960, rope_base=1000000.0, rms_eps=1e-6, tied=True,
        qk_norm=True, llama3_rope=None,
        tokens=dict(bos=151643, eos=151645, pad=151643, add_bos=False, added=QWEN3_ADDED_TOKENS),
    ),
    # Qwen/Qwen2.5-1.5B-Instruct config.json (biases on q, k and v; Qwen2.5's added tokens
    # end at 151664)
    "qwen2.5-1.5b": dict(
        file="Qwen2.5-1.5B-shaped", arch="qwen2", name="Qwen2.5 1.5B Instruct (shaped, random weights)",
        size_label="1.5B", vocab_file="ggml-vocab-qwen2.gguf",
        template="Qwen-Qwen2.5-7B-Instruct.jinja",  # the 1.5B's template is the same
        n_layer=28, n_embd=1536, n_ff=8960, n_head=12, n_head_kv=2, head_dim=128,
        n_vocab=151936, n_ctx=32768, rope_base=1000000.0, rms_eps=1e-6, tied=True,
        qk_norm=False, qkv_bias=True, llama3_rope=None,
        tokens=dict(bos=151643, eos=151645, pad=151643, add_bos=False,
                    added={i: t for i, t in QWEN3_ADDED_TOKENS.items() if i <= 151664}),
    ),
    # google/gemma-3-1b-it config.json: q/k head norms, norms after attention and after the
    # FFN, five of six layers over a 512-token window. Gemma 3's vocabulary is the one of
    # the Gemma 3 270M file (scripts/fetch-model.sh gemma-3-270m-q4_k_m); llama.cpp ships
    # no Gemma 3 template, so the file has none.
    "gemma-3-1b": dict(
        file="Gemma-3-1B-shaped", arch="gemma3", name="Gemma 3 1B it (shaped, random weights)",
        size_label="1B", vocab_model="models/gemma-3-270m-q4_k_m.gguf", template=None,
        n_layer=26, n_embd=1152, n_ff=6912, n_head=4, n_head_kv=1, head_dim=256,
        n_vocab=262144, n_ctx=32768, rope_base=1000000.0, rms_eps=1e-6, tied=True,
        qk_norm=True, post_norms=True, sliding_window=512, llama3_rope=None,
        tokens=dict(bos=2, eos=1, pad=0, unknown=3, add_bos=True, added={}),
    ),
    # LiquidAI/LFM2.5-1.2B-Instruct (see the module doc for where each figure comes from)
    "lfm2.5-1.2b": dict(
        file="LFM2.5-1.2B-shaped", arch="lfm2", name="LFM2.5 1.2B Instruct (shaped, random weights)",
        size_label="1.2B", vocab_file="ggml-vocab-qwen2.gguf", template="LFM2.5-Instruct.jinja",
        n_layer=16, n_embd=2048, n_ff=8192, n_head=32, n_head_kv=8, head_dim=64,
        n_vocab=151936, n_ctx=32768, rope_base=1000000.0, rms_eps=1e-5, tied=True,
        qk_norm=True, llama3_rope=None, attention_layers=[2, 5, 8, 10, 12, 14], conv_l_cache=3,
        tokens=dict(bos=151643, eos=151645, add_bos=True, added={}),
    ),
}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SHAPES["qwen3.5-0.8b"] = dict(
    file="Qwen3.5-0.8B-shaped", arch="qwen35", name="Qwen3.5 0.8B (shaped, random weights)",
    size_label="0.8B", vocab_file="ggml-vocab-qwen35.gguf", template="Qwen3.5-4B.jinja",
    n_layer=24, n_embd=1024, n_ff=3584, n_head=8, n_head_kv=2, head_dim=256,
    n_vocab=248320, n_ctx=262144, rope_base=10000000.0, rms_eps=1e-6, tied=True,
    qk_norm=True, llama3_rope=None,
    tokens=dict(bos=151643, eos=151645, pad=151643, add_bos=False, added=QWEN3_ADDED_TOKENS),
    hybrid=dict(rope_dim=64, sections=[11, 11, 10, 0], full_attention_interval=4,
                conv_kernel=4, k_heads=16, v_heads=16, ssm_head=128),
)

QUANTS = {"Q4_K_M": 15, "Q8_0": 7}  # llama_ftype: LLAMA_FTYPE_MOSTLY_Q4_K_M, _Q8_0
WEIGHT_STD = 0.02


def llama3_rope_factors(head_dim, base, factor, low_freq_factor, high_freq_factor, original_ctx):
    """rope_freqs.weight as convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors makes it."""
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_freq_wavelen = original_ctx / low_freq_factor
    high_freq_wavelen = original_ctx / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(1.0)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def tensor_plan(s):
    """(name, numpy shape (rows, cols), kind) in the order the converter writes them.
    kind: "rope" (rope factors), "norm" (ones, F32), "bias" (random, F32), "weight" (random,
    F16), "f32" (random, F32) or "decay" (qwen35's ssm_a, negative, F32)."""
    plan = []
    if s["llama3_rope"]:
        plan.append(("rope_freqs.weight", (s["head_dim"] // 2,), "rope"))
    plan.append(("token_embd.weight", (s["n_vocab"], s["n_embd"]), "weight"))
    q_dim, kv_dim = s["n_head"] * s["head_dim"], s["n_head_kv"] * s["head_dim"]
    h = s.get("hybrid")
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        if h:
            plan.extend(hybrid_layer_plan(s, h, i))
            continue
        plan.append((b + "attn_norm.weight", (s["n_embd"],), "norm"))
        if "attention_layers" in s and i not in s["attention_layers"]:
            # LFM2's short convolution (src/models/lfm2.cpp): in_proj to b, c, x; a depthwise
            # kernel of conv_l_cache taps, kept F32 (ggml_ssm_conv reads F32 only).
            plan.append((b + "shortconv.in_proj.weight", (3 * s["n_embd"], s["n_embd"]), "weight"))
            plan.append((b + "shortconv.out_proj.weight", (s["n_embd"], s["n_embd"]), "weight"))
            plan.append((b + "shortconv.conv.weight", (s["n_embd"], s["conv_l_cache"]), "conv"))
            plan.append((b + "ffn_norm.weight", (s["n_embd"],), "norm"))
            plan.append((b + "ffn_gate.weight", (s["n_ff"], s["n_embd"]), "weight"))
            plan.append((b + "ffn_up.weight", (s["n_ff"], s["n_embd"]), "weight"))
            plan.append((b + "ffn_down.weight", (s["n_embd"], s["n_ff"]), "weight"))
            continue
        plan.append((b + "attn_q.weight", (q_dim, s["n_embd"]), "weight"))
        plan.append((b + "attn_k.weight", (kv_dim, s["n_embd"]), "weight"))
        plan.append((b + "attn_v.weight", (kv_dim, s["n_embd"]), "weight"))
        plan.append((b + "attn_output.weight", (s["n_embd"], q_dim), "weight"))
        if s.get("qkv_bias"):
            plan.append((b + "attn_q.bias", (q_dim,), "bias"))
            plan.append((b + "attn_k.bias", (kv_dim,), "bias"))
            plan.append((b + "attn_v.bias", (kv_dim,), "bias"))
        if s["qk_norm"]:
            plan.append((b + "attn_q_norm.weight", (s["head_dim"],), "norm"))
            plan.append((b + "attn_k_norm.weight", (s["head_dim"],), "norm"))
        if s.get("post_norms"):
            plan.append((b + "post_attention_norm.weight", (s["n_embd"],), "norm"))
        plan.append((b + "ffn_norm.weight", (s["n_embd"],), "norm"))
        plan.append((b + "ffn_gate.weight", (s["n_ff"], s["n_embd"]), "weight"))
        plan.append((b + "ffn_up.weight", (s["n_ff"], s["n_embd"]), "weight"))
        plan.append((b + "ffn_down.weight", (s["n_embd"], s["n_ff"]), "weight"))
        if s.get("post_norms"):
            plan.append((b + "post_ffw_norm.weight", (s["n_embd"],), "norm"))
    # LFM2's final norm keeps its converter's name.
    plan.append(("token_embd_norm.weight" if s["arch"] == "lfm2" else "output_norm.weight", (s["n_embd"],), "norm"))
    if not s["tied"]:
        plan.append(("output.weight", (s["n_vocab"], s["n_embd"]), "weight"))
    return plan


def hybrid_layer_plan(s, h, i):
    """One Qwen3.5 layer, as llama_model_qwen35::load_arch_tensors creates it."""
    b, d = f"blk.{i}.", s["n_embd"]
    plan = [(b + "attn_norm.weight", (d,), "norm"), (b + "post_attention_norm.weight", (d,), "norm")]
    if (i + 1) % h["full_attention_interval"] == 0:
        q_dim, kv_dim = s["n_head"] * s["head_dim"], s["n_head_kv"] * s["head_dim"]
        plan += [(b + "attn_q.weight", (2 * q_dim, d), "weight"),  # query and gate per head
                 (b + "attn_k.weight", (kv_dim, d), "weight"),
                 (b + "attn_v.weight", (kv_dim, d), "weight"),
                 (b + "attn_output.weight", (d, q_dim), "weight"),
                 (b + "attn_q_norm.weight", (s["head_dim"],), "norm"),
                 (b + "attn_k_norm.weight", (s["head_dim"],), "norm")]
    else:
        key, value = h["k_heads"] * h["ssm_head"], h["v_heads"] * h["ssm_head"]
        conv = 2 * key + value
        plan += [(b + "attn_qkv.weight", (conv, d), "weight"),
                 (b + "attn_gate.weight", (value, d), "weight"),
                 (b + "ssm_conv1d.weight", (conv, h["conv_kernel"]), "f32"),
                 (b + "ssm_dt.bias", (h["v_heads"],), "f32"),
                 (b + "ssm_a", (h["v_heads"],), "decay"),
                 (b + "ssm_beta.weight", (h["v_heads"], d), "weight"),
                 (b + "ssm_alpha.weight", (h["v_heads"], d), "weight"),
                 (b + "ssm_norm.weight", (h["ssm_head"],), "norm"),
                 (b + "ssm_out.weight", (d, value), "weight")]
    plan += [(b + "ffn_gate.weight", (s["n_ff"], d), "weight"),
             (b + "ffn_up.weight", (s["n_ff"], d), "weight"),
             (b + "ffn_down.weight", (d, s["n_ff"]), "weight")]
    return plan


def copy_tokenizer(writer, vocab_path, s):
    """Every tokenizer.ggml.* key of the vocab file, with the model's own special ids."""
    import gguf
    reader = gguf.GGUFReader(vocab_path)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.ggml.") or key.endswith("_token_id"):
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if key == "tokenizer.ggml.tokens":
                value = list(value)
                for i, text in s["tokens"]["added"].items():
                    value[i] = text
                # A vocabulary file smaller than the model's table: unused rows to its size.
                value += [f"<|extra_{i}|>" for i in range(len(value), s["n_vocab"])]
            elif key == "tokenizer.ggml.token_type":
                value = list(value)
                for i, text in s["tokens"]["added"].items():
                    special = text.startswith("<|") and text.endswith("|>")
                    value[i] = int(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
                value += [int(gguf.TokenType.UNUSED)] * (s["n_vocab"] - len(value))
            writer.add_key_value(key, value, vtype, sub_type=sub)
        else:
            writer.add_key_value(key, value, vtype)
    tok = s["tokens"]
    writer.add_bos_token_id(tok["bos"])
    writer.add_eos_token_id(tok["eos"])
    if "pad" in tok:
        writer.add_pad_token_id(tok["pad"])
    if "unknown" in tok:
        writer.add_unk_token_id(tok["unknown"])
    writer.add_add_bos_token(tok["add_bos"])


def write_f16(path, s, llama_cpp_dir, seed):
    import gguf
    w = gguf.GGUFWriter(path, s["arch"])
    w.add_type("model")
    w.add_name(s["name"])
    w.add_size_label(s["size_label"])
    w.add_block_count(s["n_layer"])
    w.add_context_length(s["n_ctx"])
    w.add_embedding_length(s["n_embd"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    if "attention_layers" in s:
        # One K/V head count per layer, 0 for a convolution (conversion/lfm2.py).
        w.add_head_count_kv([s["n_head_kv"] if i in s["attention_layers"] else 0 for i in range(s["n_layer"])])
        w.add_vocab_size(s["n_vocab"])
        w.add_shortconv_l_cache(s["conv_l_cache"])
    else:
        w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    if s["arch"] == "llama":  # LlamaModel.set_gguf_parameters adds these two
        w.add_vocab_size(s["n_vocab"])
        w.add_rope_dimension_count(s["head_dim"])
    if s.get("sliding_window"):
        w.add_sliding_window(s["sliding_window"])
    if h := s.get("hybrid"):  # Qwen3NextModel.set_gguf_parameters (conversion/qwen.py)
        w.add_ssm_conv_kernel(h["conv_kernel"])
        w.add_ssm_state_size(h["ssm_head"])
        w.add_ssm_group_count(h["k_heads"])
        w.add_ssm_time_step_rank(h["v_heads"])
        w.add_ssm_inner_size(h["ssm_head"] * h["v_heads"])
        w.add_full_attention_interval(h["full_attention_interval"])
        w.add_rope_dimension_count(h["rope_dim"])
        w.add_rope_dimension_sections(h["sections"])
    if "vocab_model" in s:
        vocab = os.path.join(REPO, s["vocab_model"])
        if not os.path.exists(vocab):
            raise SystemExit(f"shaped_model: {vocab} is missing (scripts/fetch-model.sh fetches it)")
    else:
        vocab = os.path.join(llama_cpp_dir, "models", s["vocab_file"])
    copy_tokenizer(w, vocab, s)
    if s["template"]:
        with open(os.path.join(llama_cpp_dir, "models", "templates", s["template"])) as f:
            w.add_chat_template(f.read())

    plan = tensor_plan(s)
    for name, shape, kind in plan:
        dtype = np.float16 if kind == "weight" else np.float32  # f32: ggml's ssm_conv, biases
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for index, (name, shape, kind) in enumerate(plan):
        if kind == "rope":
            r = s["llama3_rope"]
            data = llama3_rope_factors(s["head_dim"], s["rope_base"], r["factor"],
                                       r["low_freq_factor"], r["high_freq_factor"], r["original_ctx"])
        elif kind == "norm":
            data = np.ones(shape, dtype=np.float32)
        elif kind == "bias":
            data = np.random.default_rng([seed, index]).standard_normal(shape, dtype=np.float32) * WEIGHT_STD
        elif kind == "decay":  # -exp(A_log) with A in [1, 16], as Qwen3-Next initializes A
            data = -np.random.default_rng([seed, index]).uniform(1, 16, shape).astype(np.float32)
        elif kind == "f32":
            data = np.random.default_rng([seed, index]).standard_normal(shape, dtype=np.float32) * 0.1
        else:
            rng = np.random.default_rng([seed, index])
            data = rng.standard_normal(shape, dtype=np.float32)
            data *= WEIGHT_STD
            data = data.astype(np.float16 if kind == "weight" else np.float32)
        w.write_tensor_data(data)
        del data
    w.close()


def quantize(src, dst, ftype, threads):
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"shaped_model: llama_model_quantize({src} -> {dst}) returned {rc}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--out", required=True, help="directory for the .gguf files")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="quantizer threads")
    ap.add_argument("--llama-cpp", default=DEFAULT_LLAMA_CPP,
                    help="llama.cpp source tree (models/ggml-vocab-*.gguf, models/templates)")
    ap.add_argument("--quants", default=",".join(QUANTS), help="comma-separated, of " + ",".join(QUANTS))
    a = ap.parse_args()

    s = SHAPES[a.shape]
    os.makedirs(a.out, exist_ok=True)
    f16 = os.path.join(a.out, f"{s['file']}.F16.gguf")
    t = time.time()
    write_f16(f16, s, a.llama_cpp, a.seed)
    print(f"{f16}: {os.path.getsize(f16):,} B ({time.time() - t:.0f} s)")
    for q in filter(None, a.quants.split(",")):
        dst = os.path.join(a.out, f"{s['file']}.{q}.gguf")
        t = time.time()
        quantize(f16, dst, QUANTS[q], a.threads)
        print(f"{dst}: {os.path.getsize(dst):,} B ({time.time() - t:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
