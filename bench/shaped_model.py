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
  python3 bench/shaped_model.py qwen3.5-0.8b --out /work/shaped
    -> DIR/Llama-3.2-1B-shaped.{F16,Q4_K_M,Q8_0}.gguf, DIR/Qwen3-0.6B-shaped.{...}.gguf,
       DIR/Qwen3.5-0.8B-shaped.{...}.gguf

Deterministic for a --seed (one generator per tensor, seeded with [seed, tensor index]).
Needs the `gguf` and `llama_cpp` (llama-cpp-python) packages and llama.cpp's vocab files
(--llama-cpp DIR: a llama.cpp source tree, such as llama-cpp-python's sdist's
vendor/llama.cpp, for models/ggml-vocab-*.gguf and models/templates/*.jinja).

Shapes: the models' config.json (hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, head_dim, vocab_size, rope_theta, rope_scaling,
rms_norm_eps, max_position_embeddings, tie_word_embeddings), written the way llama.cpp's
convert_hf_to_gguf.py writes them (conversion/base.py, llama.py, qwen.py) and checked
against the tensors src/models/llama.cpp and src/models/qwen3.cpp create.

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
}

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
    kind: "rope" (rope factors), "norm" (ones, F32), "weight" (random, F16), "f32" (random,
    F32) or "decay" (qwen35's ssm_a, negative, F32)."""
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
        plan.append((b + "attn_q.weight", (q_dim, s["n_embd"]), "weight"))
        plan.append((b + "attn_k.weight", (kv_dim, s["n_embd"]), "weight"))
        plan.append((b + "attn_v.weight", (kv_dim, s["n_embd"]), "weight"))
        plan.append((b + "attn_output.weight", (s["n_embd"], q_dim), "weight"))
        if s["qk_norm"]:
            plan.append((b + "attn_q_norm.weight", (s["head_dim"],), "norm"))
            plan.append((b + "attn_k_norm.weight", (s["head_dim"],), "norm"))
        plan.append((b + "ffn_norm.weight", (s["n_embd"],), "norm"))
        plan.append((b + "ffn_gate.weight", (s["n_ff"], s["n_embd"]), "weight"))
        plan.append((b + "ffn_up.weight", (s["n_ff"], s["n_embd"]), "weight"))
        plan.append((b + "ffn_down.weight", (s["n_embd"], s["n_ff"]), "weight"))
    plan.append(("output_norm.weight", (s["n_embd"],), "norm"))
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
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    if s["arch"] == "llama":  # LlamaModel.set_gguf_parameters adds these two
        w.add_vocab_size(s["n_vocab"])
        w.add_rope_dimension_count(s["head_dim"])
    if h := s.get("hybrid"):  # Qwen3NextModel.set_gguf_parameters (conversion/qwen.py)
        w.add_ssm_conv_kernel(h["conv_kernel"])
        w.add_ssm_state_size(h["ssm_head"])
        w.add_ssm_group_count(h["k_heads"])
        w.add_ssm_time_step_rank(h["v_heads"])
        w.add_ssm_inner_size(h["ssm_head"] * h["v_heads"])
        w.add_full_attention_interval(h["full_attention_interval"])
        w.add_rope_dimension_count(h["rope_dim"])
        w.add_rope_dimension_sections(h["sections"])
    copy_tokenizer(w, os.path.join(llama_cpp_dir, "models", s["vocab_file"]), s)
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
        elif kind == "decay":  # -exp(A_log) with A in [1, 16], as Qwen3-Next initializes A
            data = -np.random.default_rng([seed, index]).uniform(1, 16, shape).astype(np.float32)
        elif kind == "f32":
            data = np.random.default_rng([seed, index]).standard_normal(shape, dtype=np.float32) * 0.1
        else:
            rng = np.random.default_rng([seed, index])
            data = rng.standard_normal(shape, dtype=np.float32)
            data *= WEIGHT_STD
            data = data.astype(np.float16)
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
