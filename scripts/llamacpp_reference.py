#!/usr/bin/env python3
"""llama.cpp's answers on our fixtures, for tests/llamacpp_conformance.rs, and the
perplexity of every quant type against ours.

llama.cpp (llama-cpp-python, built as docs/performance.md says) is too slow to build in CI, so
its outputs are stored as a small fixture that CI compares against; this script writes
it again:

  python3 scripts/llamacpp_reference.py write            # tests/fixtures/llamacpp_reference.json

For every model file given (default: SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M
Q4_K_M from models/, both fetched by scripts/fetch-model.sh) it records the file's
sha256, the token ids of each text of tests/fixtures/tokenizer_texts.json (special
tokens read as text, and parsed), and the perplexity computed as llama-perplexity does
(see `perplexity` below) at ctx 512 of tests/fixtures/pep-0001.txt (PEP 1 of python/peps, ba4deeb: 41 KB of English with
indented and numbered lines, placed in the public domain). For the BPE splits of Llama 3
(`llama-bpe`) and Qwen 2/3 (`qwen2`), whose files no hub here serves, it records the ids of
the same texts with the default model's vocabulary and that split
(`tokenizer.ggml.pre` overridden). And for one tiny random-weight f32 file per family
(every family of the Rust test `tiny_models_of_every_family_give_llama_cpp_logits`, which
this runs with POCKETCHAT_TINY_DIR set; its own comparison may fail while the fixture is
being rewritten), the logits at every position of a 12-token prompt.

  python3 scripts/llamacpp_reference.py tiny             # only the tiny files' logits

  python3 scripts/llamacpp_reference.py perplexity       # only the perplexities

  python3 scripts/llamacpp_reference.py quant-types      # needs target/release/pocketchat

makes every quant type llama.cpp's quantizer writes from the default model (in
/tmp/pocketchat-quants, or --dir), and prints the perplexity of each, and of Gemma 3 270M's
file, by llama.cpp and by `pocketchat perplexity`, and the difference (default: ctx 512 on
pep-0001.txt; --ctx, --text, --kernel; --json FILE also writes the rows).

  python3 scripts/llamacpp_reference.py kv-types         # needs target/release/pocketchat

prints the perplexity of the default model and Gemma 3 270M with an f16 and a q8_0 KV
cache (`-ctk q8_0 -ctv q8_0`, which needs flash attention: both of llama.cpp's runs use it),
by llama.cpp and by `pocketchat perplexity --kv`, and q8_0's cost against f16 (same
--ctx, --text, --binary options).
"""
import argparse, hashlib, json, math, os, shutil, subprocess, sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
# The perplexity text (in tests/fixtures) and chunk size.
PPL_TEXT, PPL_CTX = "pep-0001.txt", 512
PRE_TOKENIZERS = ["llama-bpe", "qwen2"]
TINY_TOKENS = [5, 17, 200, 3, 99, 42, 7, 255, 256, 1, 64, 128]
TINY_DIR = "/tmp/pocketchat-tiny"
# llama.cpp's quantizer's file types (llama_ftype) by the names `pocketchat quantize` uses.
QUANT_TYPES = {"F32": 0, "F16": 1, "BF16": 32, "Q4_0": 2, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_M": 12,
               "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def need_llama_cpp():
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("llama_cpp is not installed; see docs/performance.md (Benchmark against llama.cpp) for the build line")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# llama.cpp's threads (--threads): its results do not depend on them; on a machine shared
# with other work, 1 is much faster than 2, whose threads wait for each other at every op.
THREADS = 2


# ggml's type ids of the KV caches `kv-types` compares.
GGML_KV_TYPES = {"f16": 1, "q8_0": 8}


def load(path, ctx, **kwargs):
    from llama_cpp import Llama
    return Llama(model_path=path, n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, logits_all=True,
                 verbose=False, n_threads=THREADS, **kwargs)


def token_ids(llm, texts):
    return {t["name"]: {"text": llm.tokenize(t["text"].encode(), add_bos=False, special=False),
                        "special": llm.tokenize(t["text"].encode(), add_bos=False, special=True)}
            for t in texts}


def perplexity(llm, text, ctx):
    """As llama-perplexity: the text tokenized once (with BOS when the model adds one), cut
    into chunks of `ctx` tokens, a fresh cache per chunk whose first token becomes BOS when
    the model adds one, the negative log-likelihood summed over each chunk's second half."""
    import llama_cpp
    import numpy as np
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model)))
    ids = llm.tokenize(text.encode(), add_bos=add_bos, special=False)
    chunks = len(ids) // ctx
    nll, count = 0.0, 0
    for c in range(chunks):
        toks = list(ids[c * ctx:(c + 1) * ctx])
        if add_bos:
            toks[0] = llm.token_bos()
        llm.reset()
        llm.eval(toks)
        for j in range(ctx // 2, ctx - 1):
            logits = np.asarray(llm.scores[j], dtype=np.float64)
            top = logits.max()
            nll += top + math.log(np.exp(logits - top).sum()) - logits[toks[j + 1]]
            count += 1
    return {"ctx": ctx, "ppl": math.exp(nll / count), "tokens_scored": count, "chunks": chunks}


def catalog_file(model_id):
    with open(os.path.join(REPO, "models", "catalog.json")) as f:
        cat = json.load(f)
    entry = next(m for m in cat["models"] if m["id"] == (model_id or cat["default"]))
    models_dir = os.environ.get("POCKETCHAT_MODELS_DIR") or os.path.join(REPO, "models")
    return os.path.join(models_dir, entry["file"])


def write(args):
    need_llama_cpp()
    import llama_cpp
    with open(os.path.join(FIXTURES, "tokenizer_texts.json")) as f:
        texts = json.load(f)["texts"]
    models = args.models or [catalog_file(None), catalog_file("gemma-3-270m-q4_k_m")]
    out = {"llama_cpp_python": llama_cpp.__version__, "models": {}}
    for path in models:
        llm = load(path, PPL_CTX)
        out["models"][os.path.basename(path)] = {
            "sha256": sha256(path),
            "tokens": token_ids(llm, texts),
            "perplexity": perplexities(path),
        }
    from llama_cpp import Llama
    default = catalog_file(None)
    out["pre_tokenizers"] = {"vocabulary": os.path.basename(default), "splits": {}}
    for pre in PRE_TOKENIZERS:
        llm = Llama(model_path=default, vocab_only=True, verbose=False,
                    kv_overrides={"tokenizer.ggml.pre": pre})
        out["pre_tokenizers"]["splits"][pre] = token_ids(llm, texts)
    out["tiny"] = tiny_logits()
    target = os.path.join(FIXTURES, "llamacpp_reference.json")
    with open(target, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {target}")


def perplexities(path):
    """llama.cpp's perplexity of PPL_TEXT with the model at `path`."""
    with open(os.path.join(FIXTURES, PPL_TEXT)) as f:
        r = perplexity(load(path, PPL_CTX), f.read(), PPL_CTX)
    print(f"{os.path.basename(path)}: {PPL_TEXT} at ctx {PPL_CTX}: ppl {r['ppl']:.4f} ({r['chunks']} chunks)")
    return dict(text=PPL_TEXT, **r)


def refresh_perplexities(args):
    """Refreshes only the perplexities in the fixture (a new text, a new ctx)."""
    need_llama_cpp()
    target = os.path.join(FIXTURES, "llamacpp_reference.json")
    with open(target) as f:
        out = json.load(f)
    models_dir = os.path.dirname(catalog_file(None))
    for name, model in out["models"].items():
        path = os.path.join(models_dir, name)
        if sha256(path) != model["sha256"]:
            sys.exit(f"{path} is not the file the fixture was made from")
        model["perplexity"] = perplexities(path)
    out.pop("ppl_text", None)  # written by older versions: the text is now in each entry
    with open(target, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {target}")


def tiny_logits():
    from llama_cpp import Llama
    env = dict(os.environ, POCKETCHAT_TINY_DIR=TINY_DIR)
    shutil.rmtree(TINY_DIR, ignore_errors=True)
    subprocess.run(["cargo", "test", "--no-default-features", "--test", "llamacpp_conformance", "--",
                    "tiny_models_of_every_family_give_llama_cpp_logits"], cwd=REPO, env=env)
    out = {}
    # Every family the Rust test wrote (its `TINY` list).
    archs = sorted(f[len("tiny-"):-len(".gguf")] for f in os.listdir(TINY_DIR)
                   if f.startswith("tiny-") and f.endswith(".gguf"))
    for arch in archs:
        path = os.path.join(TINY_DIR, f"tiny-{arch}.gguf")
        llm = Llama(model_path=path, n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=2,
                    type_k=0, type_v=0)  # f32 cache: the Rust side runs one
        llm.eval(TINY_TOKENS)
        rows = [[round(float(x), 5) for x in llm.scores[i]] for i in range(len(TINY_TOKENS))]
        out[arch] = {"sha256": sha256(path), "logits": rows}
        print(f"tiny {arch}: last row max {max(rows[-1]):.4f}")
    return out


def tiny(args):
    """Refreshes only the tiny files' logits in the fixture (a new family, a new seed)."""
    need_llama_cpp()
    target = os.path.join(FIXTURES, "llamacpp_reference.json")
    with open(target) as f:
        out = json.load(f)
    out["tiny"] = tiny_logits()
    with open(target, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {target}")


def quant_types(args):
    need_llama_cpp()
    import llama_cpp
    source = catalog_file(None)
    os.makedirs(args.dir, exist_ok=True)
    text = os.path.join(FIXTURES, args.text) if not os.path.isabs(args.text) else args.text
    with open(text) as f:
        ppl_text = f.read()
    binary = args.binary
    files = []
    for name in args.types or QUANT_TYPES:
        path = os.path.join(args.dir, f"SmolLM2-135M-Instruct.{name}-from-Q4_1.gguf")
        if not os.path.exists(path):
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = QUANT_TYPES[name]
            params.allow_requantize = True
            if llama_cpp.llama_model_quantize(source.encode(), path.encode(), params) != 0:
                print(f"{name:8} llama.cpp could not quantize")
                continue
        files.append((f"SmolLM2 {name}", path))
    if not args.types:
        files.append(("Gemma 3 270M Q4_K_M", catalog_file("gemma-3-270m-q4_k_m")))
    print(f"{os.path.basename(text)}, ctx {args.ctx}")
    print(f"{'file':22} {'llama.cpp':>10} {'pocketchat':>11} {'diff':>8}")
    rows = []
    for label, path in files:
        ref = perplexity(load(path, args.ctx), ppl_text, args.ctx)
        cmd = [binary, "perplexity", "--model", path, "--file", text, "--ctx", str(args.ctx), "--json"]
        if args.kernel:
            cmd += ["--kernel", args.kernel]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{label:22} {ref['ppl']:10.4f} {'failed':>11}  {run.stderr.strip().splitlines()[-1:]}")
            rows.append(dict(file=label, llama_cpp=ref["ppl"], pocketchat=None))
            continue
        ours = json.loads(run.stdout.strip().splitlines()[-1])
        assert ours["tokens_scored"] == ref["tokens_scored"], (ours, ref)
        diff = 100 * (ours["ppl"] / ref["ppl"] - 1)
        print(f"{label:22} {ref['ppl']:10.4f} {ours['ppl']:11.4f} {diff:+7.2f}%", flush=True)
        rows.append(dict(file=label, gguf=os.path.basename(path), llama_cpp=round(ref["ppl"], 4),
                         pocketchat=round(ours["ppl"], 4), difference_percent=round(diff, 2),
                         tokens_scored=ref["tokens_scored"], chunks=ref["chunks"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(command="python3 " + " ".join(sys.argv), text=os.path.basename(text), ctx=args.ctx,
                           kernel=args.kernel or "default", llama_cpp_python=llama_cpp.__version__,
                           source=os.path.basename(source), rows=rows), f, indent=1)
            f.write("\n")


def kv_types(args):
    """llama.cpp's and our perplexity with each KV cache type, on the two reference files."""
    need_llama_cpp()
    text = args.text if os.path.isabs(args.text) else os.path.join(FIXTURES, args.text)
    with open(text, encoding="utf-8") as f:
        ppl_text = f.read()
    models = [catalog_file(None), catalog_file("gemma-3-270m-q4_k_m")]
    print(f"{'model':40} {'kv':5} {'llama.cpp':>10} {'ours':>10}")
    for path in models:
        rows = {}
        for kv, ggml_type in GGML_KV_TYPES.items():
            llm = load(path, args.ctx, flash_attn=True, type_k=ggml_type, type_v=ggml_type)
            theirs = perplexity(llm, ppl_text, args.ctx)["ppl"]
            del llm
            cmd = [args.binary, "perplexity", "--model", path, "--file", text, "--ctx", str(args.ctx), "--kv", kv,
                   "--json"]
            ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["ppl"]
            rows[kv] = (theirs, ours)
            print(f"{os.path.basename(path):40} {kv:5} {theirs:10.4f} {ours:10.4f}", flush=True)
        (tf, of), (tq, oq) = rows["f16"], rows["q8_0"]
        print(f"{'':40} q8_0 vs f16: llama.cpp {100 * (tq / tf - 1):+.2f}%, ours {100 * (oq / of - 1):+.2f}%")


def main():
    global THREADS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write tests/fixtures/llamacpp_reference.json")
    w.add_argument("models", nargs="*", help="GGUF files (default: the default model and Gemma 3 270M)")
    sub.add_parser("tiny", help="refresh only the tiny random-weight files' logits in the fixture")
    per = sub.add_parser("perplexity", help="refresh only llama.cpp's perplexities in the fixture")
    q = sub.add_parser("quant-types", help="perplexity of every quant type, llama.cpp vs ours")
    q.add_argument("--dir", default="/tmp/pocketchat-quants")
    q.add_argument("--ctx", type=int, default=PPL_CTX)
    q.add_argument("--text", default=PPL_TEXT, help="a file in tests/fixtures, or a path")
    q.add_argument("--kernel", help="pocketchat's --kernel (default: the fastest for this CPU)")
    q.add_argument("--json", help="also write the rows to this file")
    q.add_argument("--binary", default=os.path.join(REPO, "target", "release", "pocketchat"),
                   help="pocketchat to run (target/debug's computes the same: our crate and candle are built at "
                        "opt-level 3 in the dev profile)")
    q.add_argument("types", nargs="*", help=f"of {', '.join(QUANT_TYPES)} (default: all)")
    kv = sub.add_parser("kv-types", help="perplexity with an f16 and a q8_0 KV cache, llama.cpp vs ours")
    kv.add_argument("--ctx", type=int, default=PPL_CTX)
    kv.add_argument("--text", default=PPL_TEXT, help="a file in tests/fixtures, or a path")
    kv.add_argument("--binary", default=os.path.join(REPO, "target", "release", "pocketchat"),
                    help="pocketchat to run (target/debug's computes the same)")
    for sp in (w, q, per, kv):
        sp.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")
    args = p.parse_args()
    THREADS = getattr(args, "threads", THREADS)
    commands = {"write": write, "tiny": tiny, "perplexity": refresh_perplexities, "quant-types": quant_types,
                "kv-types": kv_types}
    commands[args.command](args)


if __name__ == "__main__":
    main()
