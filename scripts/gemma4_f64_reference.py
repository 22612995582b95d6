#!/usr/bin/env python3
"""A third opinion on the tiny Gemma 4 file's logits: its forward pass in float64 NumPy,
written from llama.cpp's graph (`src/models/gemma4.cpp`), compared with ours
(`pocketchat logits`) and with llama.cpp's (the fixture `tests/fixtures/
llamacpp_reference.json`, `tiny.gemma4`). `--f16-gelu` rounds the GELU's input and output
to f16 as llama.cpp's CPU table does (`ggml_vec_gelu_f32`, `ggml_vec_geglu_f32`).

  POCKETCHAT_TINY_DIR=/tmp/g4 cargo test --no-default-features --test llamacpp_conformance \\
      -- tiny_models_of_every_family_give_llama_cpp_logits
  cargo build --no-default-features
  python3 scripts/gemma4_f64_reference.py /tmp/g4/tiny-gemma4.gguf [--f16-gelu]

Prints, per position, the largest difference of ours and of llama.cpp's from this one.
"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np
from gguf import GGUFReader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENS = [5, 17, 200, 3, 99, 42, 7, 255, 256, 1, 64, 128]  # the conformance test's prompt


def forward(path, f16_gelu):
    r = GGUFReader(path)
    t = {x.name: np.array(x.data, dtype=np.float64) for x in r.tensors}

    def meta(key):
        f = r.fields["gemma4." + key]
        values = [f.parts[i] for i in f.data]
        return [v[0].item() for v in values] if len(values) > 1 else values[0][0].item()

    n_layer, width = meta("block_count"), meta("embedding_length")
    heads, kv_heads = meta("attention.head_count"), meta("attention.head_count_kv")
    window, per_layer = meta("attention.sliding_window"), meta("embedding_length_per_layer_input")
    eps, cap = meta("attention.layer_norm_rms_epsilon"), meta("final_logit_softcapping")
    sliding = [bool(x) for x in meta("attention.sliding_window_pattern")]
    own = n_layer - meta("attention.shared_kv_layers")
    n = len(TOKENS)

    def gelu(x):
        if f16_gelu:
            h = x.astype(np.float16).astype(np.float64)
            y = (0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * h * (1 + 0.044715 * h * h)))).astype(np.float16)
            return np.where(x >= 10, x, np.where(x <= -10, 0, y.astype(np.float64)))
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)))

    def rms(x, w=None):
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
        return y if w is None else y * w

    def rope(x, base, factors):  # (n, heads, hd), half-split pairs
        half = x.shape[-1] // 2
        angles = np.arange(n)[:, None] * (base ** (-np.arange(half) * 2 / x.shape[-1]) / factors)[None, :]
        c, s = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], -1)

    emb = t["token_embd.weight"]
    x = emb[TOKENS] * np.sqrt(width)
    rows = t["per_layer_token_embd.weight"][TOKENS].reshape(n, n_layer, per_layer) * np.sqrt(per_layer)
    proj = (x @ t["per_layer_model_proj.weight"].T / np.sqrt(width)).reshape(n, n_layer, per_layer)
    inputs = (rms(proj, t["per_layer_proj_norm.weight"]) + rows) / np.sqrt(2)
    cache = {}
    for i in range(n_layer):
        p, sl = f"blk.{i}.", sliding[i]
        hd = meta("attention.key_length_swa") if sl else meta("attention.key_length")
        base = meta("rope.freq_base_swa") if sl else meta("rope.freq_base")
        factors = np.ones(hd // 2) if sl else t["rope_freqs.weight"]
        h = rms(x, t[p + "attn_norm.weight"])
        q = rope(rms((h @ t[p + "attn_q.weight"].T).reshape(n, heads, hd), t[p + "attn_q_norm.weight"]), base, factors)
        if i < own:
            k = (h @ t[p + "attn_k.weight"].T).reshape(n, kv_heads, hd)
            v = (h @ t[p + "attn_v.weight"].T).reshape(n, kv_heads, hd) if p + "attn_v.weight" in t else k
            cache[i] = (rope(rms(k, t[p + "attn_k_norm.weight"]), base, factors), rms(v))
        k, v = cache[i if i < own else own - (2 if sl else 1)]
        out = np.zeros((n, heads, hd))
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = q[:, head, :] @ k[:, kv, :].T  # scale 1
            for a in range(n):
                for b in range(n):
                    if b > a or (sl and a - b >= window):
                        scores[a, b] = -np.inf
            probs = np.exp(scores - scores.max(1, keepdims=True))
            out[:, head, :] = (probs / probs.sum(1, keepdims=True)) @ v[:, kv, :]
        x = x + rms(out.reshape(n, -1) @ t[p + "attn_output.weight"].T, t[p + "post_attention_norm.weight"])
        h = rms(x, t[p + "ffn_norm.weight"])
        ffn = (gelu(h @ t[p + "ffn_gate.weight"].T) * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
        x = x + rms(ffn, t[p + "post_ffw_norm.weight"])
        gated = gelu(x @ t[p + "inp_gate.weight"].T) * inputs[:, i, :]
        x = x + rms(gated @ t[p + "proj.weight"].T, t[p + "post_norm.weight"])
        x = x * t[p + "layer_output_scale.weight"][0]
    logits = rms(x, t["output_norm.weight"]) @ emb.T
    return np.tanh(logits / cap) * cap


def ours(path):
    binary = os.path.join(REPO, "target", "debug", "pocketchat")
    with tempfile.NamedTemporaryFile(suffix=".f32") as out:
        run = subprocess.run([binary, "logits", "--model", path, "--tokens", ",".join(map(str, TOKENS)),
                              "--out", out.name, "--kv", "f32"], capture_output=True, text=True, check=True)
        meta = json.loads(run.stdout.strip().splitlines()[-1])
        return np.fromfile(out.name, dtype="<f4").reshape(meta["positions"], meta["vocab"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path")
    ap.add_argument("--f16-gelu", action="store_true")
    args = ap.parse_args()
    reference = forward(args.path, args.f16_gelu)
    with open(os.path.join(REPO, "tests", "fixtures", "llamacpp_reference.json")) as f:
        llama = np.array(json.load(f)["tiny"]["gemma4"]["logits"])
    for name, rows in [("ours", ours(args.path)), ("llama.cpp", llama)]:
        diffs = np.abs(rows - reference).max(1)
        print(f"{name:>9}: " + " ".join(f"{d:.1e}" for d in diffs) + f"  (largest logit {np.abs(reference).max():.2f})")


if __name__ == "__main__":
    main()
