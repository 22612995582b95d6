#!/usr/bin/env python3
"""How far our logits are from llama.cpp's on one text, position by position.

Feeds the text (BOS added, llama.cpp's tokenization) to llama.cpp (llama-cpp-python,
logits_all) and to `pocketchat logits` (f32 KV) for each BINARY:KERNEL given, and prints,
over all positions: the largest and the mean absolute difference over the ten tokens
llama.cpp scores highest, the RMS difference over the whole vocabulary, and how often the
two pick the same next token (near-ties make this one noisy).

  python3 bench/logits_vs_llamacpp.py --model models/gemma-3-270m-q4_k_m.gguf \\
      --text "The capital of France is" target/release/pocketchat:fast target/release/pocketchat:avx2
"""
import argparse, os, subprocess, sys, tempfile

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("runs", nargs="+", help="BINARY:KERNEL, e.g. target/release/pocketchat:fast")
    a = ap.parse_args()
    from llama_cpp import Llama
    llm = Llama(model_path=a.model, n_ctx=2048, n_threads=a.threads, verbose=False, logits_all=True)
    ids = llm.tokenize(a.text.encode(), add_bos=True, special=True)
    vocab = llm.n_vocab()
    llm.eval(ids)
    ref = np.array(llm.scores[:len(ids)], dtype=np.float32)
    top10 = np.argsort(-ref, axis=1)[:, :10]
    print(f"{a.model}: {len(ids)} positions")
    print(f"{'run':<40}{'top-10 max':>11}{'top-10 mean':>12}{'rms':>8}{'same pick':>10}")
    for run in a.runs:
        binary, kernel = run.rsplit(":", 1)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "logits.bin")
            subprocess.run([binary, "logits", "--model", a.model, "--tokens", ",".join(map(str, ids)),
                            "--out", out, "--kv", "f32", "--kernel", kernel, "--threads", str(a.threads)],
                           check=True, capture_output=True)
            ours = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)[:, :vocab]
        diff = np.abs(np.take_along_axis(ours, top10, 1) - np.take_along_axis(ref, top10, 1))
        rms = np.sqrt(((ours - ref) ** 2).mean(1)).mean()
        same = (ours.argmax(1) == ref.argmax(1)).mean()
        print(f"{run:<40}{diff.max():>11.3f}{diff.mean():>12.3f}{rms:>8.3f}{same:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
