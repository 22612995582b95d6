#!/usr/bin/env python3
"""Why llama.cpp's logits on an F16 file are ~2e-3 (of the largest) away from ours: it rounds
the activations to f16 before every product with F16 weights, and that rounding is chaotic.

On a `llama` F16 file (bench/shaped_model.py llama-3.2-1b), at position 0 (one token: the
attention output is V itself, so only the matmuls, norms and SwiGLU count), this prints:

1. the output head: llama.cpp's own last hidden state (after the final norm, read with
   `embedding=True`) times the F16 output matrix, exactly and with the hidden state rounded
   to f16 first, against llama.cpp's logits: the rounded one is llama.cpp's to float noise;
2. the whole forward pass in numpy: exact (f64), f32, and with every matmul input rounded to
   f16 (accumulated in f64, and in f32), against llama.cpp's logits and against each other,
   and ours (`pocketchat logits`);

The two f16-rounding passes differ from each other by about as much as either differs from
the exact one: a 1-ulp difference in one f16 rounding moves the next layer's inputs enough to
flip others. So no engine that is not bit-identical to ggml can match its F16 logits more
closely than they match the exact ones; ours, with f32 activations, is within ~1e-5 of the
exact pass. bench/real_size_check.py therefore compares F16 files with llama.cpp's run of
their F32 widening.

  python3 bench/f16_rounding.py /work/shaped/Llama-3.2-1B-shaped.F16.gguf [--binary target/release/pocketchat]
"""
import argparse, json, os, subprocess, tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--binary", default=os.path.join(os.path.dirname(HERE), "target", "release", "pocketchat"))
    a = ap.parse_args()
    import gguf
    import llama_cpp
    from llama_cpp import Llama

    r = gguf.GGUFReader(a.model)
    tensors = {t.name: t for t in r.tensors}

    def w(name):
        t = tensors[name]
        return np.asarray(t.data).reshape([int(x) for x in reversed(t.shape)])

    def kv(key):
        f = r.fields[key]
        return f.parts[f.data[0]][0]

    arch = r.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "llama", "a llama-architecture file"
    layers, heads = int(kv("llama.block_count")), int(kv("llama.attention.head_count"))
    kv_heads, eps = int(kv("llama.attention.head_count_kv")), float(kv("llama.attention.layer_norm_rms_epsilon"))
    emb = w("token_embd.weight")
    head = w("output.weight") if "output.weight" in tensors else emb
    hd = emb.shape[1] // heads
    tok = int(kv("tokenizer.ggml.bos_token_id"))

    def forward(dtype, round16):
        def mm(m, x):
            if round16:
                x = x.astype(np.float16)
            return m.astype(dtype) @ x.astype(dtype)

        def norm(x, g):
            return x / np.sqrt((x.astype(np.float64) ** 2).mean() + eps).astype(dtype) * g.astype(dtype)

        h = emb[tok].astype(dtype)
        for i in range(layers):
            b = f"blk.{i}."
            v = mm(w(b + "attn_v.weight"), norm(h, w(b + "attn_norm.weight")))
            group = heads // kv_heads
            att = np.concatenate([v[(j // group) * hd:(j // group + 1) * hd] for j in range(heads)])
            h = h + mm(w(b + "attn_output.weight"), att)
            x = norm(h, w(b + "ffn_norm.weight"))
            g, u = mm(w(b + "ffn_gate.weight"), x), mm(w(b + "ffn_up.weight"), x)
            h = h + mm(w(b + "ffn_down.weight"), g / (1 + np.exp(-g)) * u)
        return mm(head, norm(h, w("output_norm.weight"))).astype(np.float64)

    def llama_cpp_run(**kw):
        llm = Llama(model_path=a.model, n_ctx=64, n_batch=64, verbose=False, n_threads=2, type_k=0, type_v=0, **kw)
        llm.eval([tok])
        return llm

    llm = llama_cpp_run(logits_all=True)
    theirs = np.array(llm.scores[0], dtype=np.float64)
    del llm
    llm = llama_cpp_run(embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE)
    hidden = np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_ith(llm.ctx, 0), shape=(emb.shape[1],)).copy()
    del llm
    scale = np.abs(theirs).max()
    print(f"position 0, largest logit {scale:.3f}; max |difference| of the logits:")
    f64 = head.astype(np.float64)
    print(f"1. llama.cpp's last hidden state x output matrix, exact:       {np.abs(f64 @ hidden - theirs).max():.2e}")
    print(f"   the same, hidden state rounded to f16 first:                {np.abs(f64 @ hidden.astype(np.float16) - theirs).max():.2e}")
    exact = forward(np.float64, False)
    runs = {"f32": forward(np.float32, False), "f16 inputs, f64 sums": forward(np.float64, True),
            "f16 inputs, f32 sums": forward(np.float32, True)}
    with tempfile.NamedTemporaryFile(suffix=".f32") as out:
        cmd = [a.binary, "logits", "--model", a.model, "--tokens", str(tok), "--out", out.name, "--kv", "f32"]
        meta = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
        runs["pocketchat"] = np.fromfile(out.name, dtype="<f4").reshape(meta["positions"], meta["vocab"])[0]
    print(f"2. {'pass':22} {'vs llama.cpp':>12} {'vs exact':>10}")
    print(f"   {'exact (f64)':22} {np.abs(exact - theirs).max():12.2e} {0:10.2e}")
    for name, x in runs.items():
        print(f"   {name:22} {np.abs(x - theirs).max():12.2e} {np.abs(x - exact).max():10.2e}")
    a16, b16 = runs["f16 inputs, f64 sums"], runs["f16 inputs, f32 sums"]
    print(f"   the two f16-input passes from each other: {np.abs(a16 - b16).max():.2e}")


if __name__ == "__main__":
    main()
