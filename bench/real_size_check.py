#!/usr/bin/env python3
"""Our forward pass against llama.cpp's on files with the exact shapes of the models people
chat with (bench/shaped_model.py: real vocabulary, seeded random weights), in F16, Q8_0
and Q4_K_M.

For each file: the logits at every position of a 64-token prompt (a fixed English text,
tokenized by llama.cpp) by llama-cpp-python (`logits_all`, f32 cache) and by
`pocketchat logits` (f32 cache), compared as the tiny-file check does (largest difference
within 1e-3 of the largest logit); then 32 tokens of greedy continuation from each, equal
up to the first step where llama.cpp's top-2 margin is not clear (below 10x that
tolerance). Writes a Markdown table (stdout, or --out) and exits 1 if a file fails.

An F16 file is compared with llama.cpp's logits of its F32 widening (the same weights,
written by llama.cpp's quantizer with ftype F32), not of the F16 file itself: for F16
weights ggml rounds the activations to f16 before every product (the F16 type's
`vec_dot_type`), which moves its logits by ~2e-3 of the largest at these depths, and that
rounding makes the result chaotic (a 1-ulp f16 flip in one layer flips others in the
next), so no engine that is not bit-identical to ggml can come closer to llama.cpp's F16
logits than they are to the exact ones (bench/runs/2026-12-02-epyc-2core/f16-logits.md).
We keep f32 activations. The table shows both distances.

Quantized files cannot meet the F16 tolerance against another engine: activations are
rounded to 8 bits before each product (Q8_0 blocks here, Q8_K for llama.cpp's K-quants),
and in these random-weight files a one-step rounding difference moves the logits as much
as the weights' own quantization does. So a quantized file is checked for *accuracy*
instead: its distance from llama.cpp's F16 logits of the same model must be within
`ACCURACY_SLACK` of llama.cpp's own quantized file's distance.

  cargo build --release --no-default-features
  python3 bench/real_size_check.py --dir /work/shaped [--models llama-3.2-1b,...] [--types F16,Q8_0]

Missing files are written first (F16 by bench/shaped_model.py, then llama.cpp's quantizer);
`--delete-quantized` removes each quantized file (and F32 widening) after its check (disk is
tight: the four models' files take ~20 GB, their F32 widenings twice their F16 files).
"""
import argparse, json, os, subprocess, sys, tempfile, time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import shaped_model  # noqa: E402

MODELS = ["llama-3.2-1b", "qwen2.5-1.5b", "qwen3-0.6b", "gemma-3-1b"]
TYPES = ["F16", "Q8_0", "Q4_K_M"]
PROMPT_TOKENS = 64
GREEDY = 32
TOLERANCE = 1e-3  # of the largest |logit|, as tests/llamacpp_conformance.rs
ACCURACY_SLACK = 1.10  # ours from llama.cpp's F16 logits / llama.cpp's quantized file from them
TEXT = (
    "The lighthouse keeper climbed the narrow stairs every evening at dusk. From the top he "
    "could see the harbour, the fishing boats coming home, and the long line of the coast "
    "running north towards the cliffs. He wrote three things in his logbook each night: the "
    "wind, the weather, and the number of ships that passed. In forty years he had missed "
    "only one night, when the storm of 1953 tore the door off its hinges."
)


def ensure_file(shape, qtype, directory):
    s = shaped_model.SHAPES[shape]
    f16 = os.path.join(directory, f"{s['file']}.F16.gguf")
    if not os.path.exists(f16):
        print(f"writing {f16}", file=sys.stderr)
        shaped_model.write_f16(f16, s, shaped_model.DEFAULT_LLAMA_CPP, 0)
    if qtype == "F16":
        return f16, False
    if qtype == "F32":
        path = os.path.join(directory, f"{s['file']}.F32.gguf")
        if os.path.exists(path):
            return path, False
        print(f"widening {path}", file=sys.stderr)
        shaped_model.quantize(f16, path, 0, 2)  # LLAMA_FTYPE_ALL_F32: exact
        return path, True
    path = os.path.join(directory, f"{s['file']}.{qtype}.gguf")
    if os.path.exists(path):
        return path, False
    print(f"quantizing {path}", file=sys.stderr)
    shaped_model.quantize(f16, path, shaped_model.QUANTS[qtype], 2)
    return path, True


def llama_cpp_run(path, threads):
    from llama_cpp import Llama
    t = time.time()
    llm = Llama(model_path=path, n_ctx=PROMPT_TOKENS + GREEDY + 8, n_batch=PROMPT_TOKENS, logits_all=True,
                verbose=False, n_threads=threads, type_k=0, type_v=0)
    load_s = time.time() - t
    ids = llm.tokenize(TEXT.encode(), add_bos=True, special=False)[:PROMPT_TOKENS]
    if len(ids) < PROMPT_TOKENS:
        raise SystemExit(f"{path}: the text is only {len(ids)} tokens")
    llm.eval(ids)
    prompt = np.array([llm.scores[i] for i in range(PROMPT_TOKENS)], dtype=np.float32)
    greedy, margins = [], []
    last = prompt[-1]
    for _ in range(GREEDY):
        top2 = np.sort(last)[-2:]
        margins.append(float(top2[1] - top2[0]))
        greedy.append(int(np.argmax(last)))
        llm.eval([greedy[-1]])
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    del llm
    return ids, prompt, greedy, margins, load_s


def our_run(binary, path, ids, threads, kernel):
    with tempfile.NamedTemporaryFile(suffix=".f32") as out:
        cmd = [binary, "logits", "--model", path, "--tokens", ",".join(map(str, ids)), "--greedy", str(GREEDY),
               "--out", out.name, "--kv", "f32", "--threads", str(threads)]
        if kernel:
            cmd += ["--kernel", kernel]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed")
        meta = json.loads(run.stdout.strip().splitlines()[-1])
        rows = np.fromfile(out.name, dtype="<f4").reshape(meta["positions"], meta["vocab"])
    return rows, meta["greedy"]


def check(binary, shape, qtype, directory, threads, kernel, delete, f16_logits):
    path, made = ensure_file(shape, qtype, directory)
    try:
        ids, theirs, their_greedy, margins, _ = llama_cpp_run(path, threads)
        ours, our_greedy = our_run(binary, path, ids, threads, kernel)
    finally:
        if made and delete:
            os.remove(path)
    ours = ours[:, : theirs.shape[1]]
    if qtype == "F16":
        # llama.cpp's own F16 logits carry its f16 rounding of the activations (module doc):
        # the reference is its run of the F32 widening of the same weights.
        f32, made = ensure_file(shape, "F32", directory)
        try:
            ids32, exact, their_greedy, margins, _ = llama_cpp_run(f32, threads)
        finally:
            if made and delete:
                os.remove(f32)
        assert ids32 == ids
        scale = float(np.abs(exact).max())
        diff = float(np.abs(ours - exact).max())
        clear = next((i for i, m in enumerate(margins) if m < 10 * TOLERANCE * scale), GREEDY)
        same = next((i for i, (a, b) in enumerate(zip(our_greedy, their_greedy)) if a != b), GREEDY)
        return dict(diff=diff, scale=scale, clear=clear, same=same, theirs=theirs, ok=diff <= TOLERANCE * scale
                    and same >= clear, f16_vs_f32=float(np.abs(theirs - exact).max()))
    scale = float(np.abs(theirs).max())
    diff = float(np.abs(ours - theirs).max())
    clear = next((i for i, m in enumerate(margins) if m < 10 * TOLERANCE * scale), GREEDY)
    same = next((i for i, (a, b) in enumerate(zip(our_greedy, their_greedy)) if a != b), GREEDY)
    r = dict(diff=diff, scale=scale, clear=clear, same=same, theirs=theirs)
    if qtype == "F16":
        r["ok"] = diff <= TOLERANCE * scale and same >= clear
    else:
        r["their_error"] = float(np.abs(theirs - f16_logits).max())
        r["our_error"] = float(np.abs(ours - f16_logits).max())
        r["ok"] = r["our_error"] <= ACCURACY_SLACK * r["their_error"] and same >= clear
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="where the shaped files are (or are written)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "pocketchat"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kernel", help="pocketchat's --kernel (default: the fastest for this CPU)")
    ap.add_argument("--delete-quantized", action="store_true", help="remove quantized files this run made")
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    lines = [f"Prompt {PROMPT_TOKENS} tokens, greedy {GREEDY}; tolerance {TOLERANCE:g} of the largest logit; "
             f"kernel {a.kernel or 'default'}; llama-cpp-python, f32 cache on both sides. F16 rows: ours "
             "against llama.cpp's run of the F32 widening (its own F16 logits' distance from those in the "
             "second column).", "",
             "| file | type | max difference / largest logit | from llama.cpp's F16 logits: theirs, ours "
             "| greedy: clear steps | equal steps | result |",
             "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    failed = False
    for shape in a.models.split(","):
        f16_logits = None
        # F16 first: the quantized files are measured against its llama.cpp logits.
        for qtype in sorted(a.types.split(","), key=lambda t: t != "F16"):
            try:
                if qtype != "F16" and f16_logits is None:
                    f16_logits = llama_cpp_run(ensure_file(shape, "F16", a.dir)[0], a.threads)[1]
                r = check(a.binary, shape, qtype, a.dir, a.threads, a.kernel, a.delete_quantized, f16_logits)
                if qtype == "F16":
                    f16_logits = r["theirs"]
                errors = (f"{r['their_error']:.3f}, {r['our_error']:.3f}" if "our_error" in r
                          else f"llama.cpp F16 from its F32: {r['f16_vs_f32']:.2e}")
                line = (f"| {shape} | {qtype} | {r['diff']:.2e} / {r['scale']:.2f} | {errors} | {r['clear']} | "
                        f"{r['same']} | {'ok' if r['ok'] else 'DIFFERS'} |")
                failed |= not r["ok"]
            except Exception as e:  # one file's failure is a row, not the end of the run
                line = f"| {shape} | {qtype} | – | – | – | – | error: {e} |"
                failed = True
            lines.append(line)
            print(line, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
