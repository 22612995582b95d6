#!/usr/bin/env python3
"""pocketchat vs llama.cpp on the same GGUF, measured alternately in one run.

Runs `pocketchat bench` (A) and ../shared/bench/llamacpp_peer.py (B) as A B A B ... for
--pairs pairs on the same model, prompt length, generation length and thread count, and
prints the median of each metric and the ratio ours / llama.cpp (above 1.0 means
pocketchat is faster for tok/s). Peak RSS is measured the same way for both, from the
process's rusage (the peer's includes its Python interpreter and numpy).

With --turns K > 1 each pair also runs scripts/llamacpp_turns.py (C), llama.cpp on the
same K-turn conversation as `pocketchat bench --turns K`, and prints both engines' time to
first token of turn 1 and turn K and decode speed at turn K.

  cargo build --release --no-default-features   # the headless binary: no GTK/WebKit in its RSS
  python3 scripts/bench_vs_llamacpp.py --prompt-tokens 128 --gen 128 --threads 2 --pairs 3

llama.cpp comes from the llama-cpp-python package; the peer script's docstring says how
to install it. Exit status: 0 on success, 2 when llama_cpp is not importable, 1 when a
run fails.
"""
import argparse, ast, json, os, statistics, subprocess, sys, threading, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_model():
    with open(os.path.join(REPO, "models", "catalog.json")) as f:
        cat = json.load(f)
    entry = next(m for m in cat["models"] if m["id"] == cat["default"])
    models_dir = os.environ.get("POCKETCHAT_MODELS_DIR") or os.path.join(REPO, "models")
    return os.path.join(models_dir, entry["file"])


def peer_install_help(peer):
    try:
        with open(peer) as f:
            doc = ast.get_docstring(ast.parse(f.read())) or ""
    except OSError:
        doc = ""
    lines = [l for l in doc.splitlines() if "pip install" in l or "CMAKE_ARGS" in l]
    return "\n".join(lines) or "pip install llama-cpp-python"


def run_measured(cmd):
    """Runs cmd; returns (its last JSON stdout line, its peak RSS in bytes, wall seconds)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err, rss = communicate_rusage(p)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.stderr.write(err[-4000:])
        raise SystemExit(f"bench_vs_llamacpp: {' '.join(cmd)} failed with exit {p.returncode}")
    lines = [l for l in out.splitlines() if l.strip().startswith("{")]
    if not lines:
        sys.stderr.write(out[-2000:] + err[-2000:])
        raise SystemExit(f"bench_vs_llamacpp: no JSON line from {' '.join(cmd)}")
    return json.loads(lines[-1]), rss, wall


def communicate_rusage(p):
    """Reads both pipes to the end, then reaps the child with wait4 to get its own peak
    RSS (RUSAGE_CHILDREN would give the maximum over all children so far)."""
    if not hasattr(os, "wait4"):
        out, err = p.communicate()
        return out, err, None
    bufs = {}
    def drain(name, stream):
        bufs[name] = stream.read()
    ts = [threading.Thread(target=drain, args=(n, s)) for n, s in (("out", p.stdout), ("err", p.stderr))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = ru.ru_maxrss if sys.platform == "darwin" else ru.ru_maxrss * 1024
    return bufs["out"], bufs["err"], rss


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(v, unit=""):
    if v is None:
        return "-"
    if unit == "MB":
        return f"{v / 1e6:.1f}"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: the catalog's default)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--turns", type=int, default=10,
                    help="turns of one conversation, for time to first token per turn")
    ap.add_argument("--pairs", type=int, default=3, help="A B pairs (default 3)")
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "pocketchat"))
    ap.add_argument("--peer", default=os.path.join(REPO, "..", "shared", "bench", "llamacpp_peer.py"))
    ap.add_argument("--json", action="store_true", help="also print all runs as one JSON line")
    a = ap.parse_args()

    model = os.path.abspath(a.model or default_model())
    peer = os.path.abspath(a.peer)
    if not os.path.isfile(model):
        print(f"no model at {model}; fetch it with scripts/fetch-model.sh", file=sys.stderr)
        return 1
    if not os.path.isfile(a.bin):
        print(f"no binary at {a.bin}; build it with `cargo build --release --no-default-features`", file=sys.stderr)
        return 1
    if not os.path.isfile(peer):
        print(f"no peer script at {peer} (expected ../shared beside the checkout)", file=sys.stderr)
        return 1
    probe = subprocess.run([sys.executable, "-c", "import llama_cpp, numpy"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print("llama_cpp (llama-cpp-python) is not importable by "
              f"{sys.executable}. Install it with:\n\n{peer_install_help(peer)}\n",
              file=sys.stderr)
        return 2

    ours_cmd = [a.bin, "bench", "--model", model, "--prompt-tokens", str(a.prompt_tokens),
                "--gen", str(a.gen), "--threads", str(a.threads), "--turns", str(a.turns),
                "--json"]
    peer_cmd = [sys.executable, peer, model, "--prompt-tokens", str(a.prompt_tokens),
                "--gen", str(a.gen), "--threads", str(a.threads)]

    turns_cmd = [sys.executable, os.path.join(REPO, "scripts", "llamacpp_turns.py"), model,
                 "--prompt-tokens", str(a.prompt_tokens), "--gen", str(a.gen),
                 "--threads", str(a.threads), "--turns", str(a.turns)]
    runs = [("pocketchat", ours_cmd), ("llama.cpp", peer_cmd)]
    if a.turns > 1:
        runs.append(("llama.cpp turns", turns_cmd))
    ours, theirs, their_turns = [], [], []
    into_by_name = {"pocketchat": ours, "llama.cpp": theirs, "llama.cpp turns": their_turns}
    for i in range(a.pairs):
        for name, cmd in runs:
            into = into_by_name[name]
            res, rss, wall = run_measured(cmd)
            res["_rss"] = rss  # the same measurement for both
            res["_wall_s"] = wall
            into.append(res)
            print(f"pair {i + 1}/{a.pairs} {name:15s} prefill {res.get('prefill_tok_s', '-')} tok/s, "
                  f"decode {res.get('decode_tok_s')} tok/s, ttft {res.get('ttft_ms', '-')}, {wall:.1f} s",
                  file=sys.stderr)

    def col(runs, key):
        return median([r.get(key) for r in runs])

    def at_turn(runs, key, turn):
        return median([(r.get(key) or [None])[turn] for r in runs])

    rows = [
        ("prefill tok/s", col(ours, "prefill_tok_s"), col(theirs, "prefill_tok_s"), ""),
        ("decode tok/s", col(ours, "decode_tok_s"), col(theirs, "decode_tok_s"), ""),
        ("peak RSS MB", col(ours, "_rss"), col(theirs, "_rss"), "MB"),
        ("wall s", col(ours, "_wall_s"), col(theirs, "_wall_s"), ""),
    ]
    print(f"\nmodel {os.path.basename(model)}, prompt {a.prompt_tokens}, gen {a.gen}, "
          f"threads {a.threads}, {a.pairs} pairs (A B{' C' if their_turns else ''} alternating), medians")
    print(f"{'metric':<16}{'pocketchat':>12}{'llama.cpp':>12}{'ours/peer':>11}")
    for name, o, t, unit in rows:
        ratio = f"{o / t:.2f}x" if o is not None and t else "-"
        print(f"{name:<16}{fmt(o, unit):>12}{fmt(t, unit):>12}{ratio:>11}")
    if their_turns:
        k = a.turns
        o1, ok = at_turn(ours, "ttft_ms", 0), at_turn(ours, "ttft_ms", -1)
        p1, pk = at_turn(their_turns, "ttft_ms", 0), at_turn(their_turns, "ttft_ms", -1)
        od, pd = at_turn(ours, "decode_tok_s_by_turn", -1), at_turn(their_turns, "decode_tok_s", -1)
        print(f"\n{k} turns of {a.prompt_tokens} new + {a.gen} generated tokens on one context "
              f"({k * (a.prompt_tokens + a.gen + 1)} tokens at the end), medians")
        print(f"{'metric':<22}{'pocketchat':>12}{'llama.cpp':>12}{'peer/ours':>11}")
        for name, o, t in ((f"TTFT turn 1 ms", o1, p1), (f"TTFT turn {k} ms", ok, pk)):
            print(f"{name:<22}{o:>12.1f}{t:>12.1f}{t / o:>10.2f}x")
        print(f"{f'turn {k} / turn 1':<22}{ok / o1:>11.2f}x{pk / p1:>11.2f}x")
        print(f"{f'decode tok/s turn {k}':<22}{od:>12.1f}{pd:>12.1f}{'':>11}  ours/peer {od / pd:.2f}x")
    else:
        t1, tk = at_turn(ours, "ttft_ms", 0), at_turn(ours, "ttft_ms", -1)
        if t1 is not None and tk is not None:
            print(f"TTFT turn 1 {t1:.1f} ms")
    if ours and theirs:
        same = ours[0].get("first_generated_ids") == theirs[0].get("first_generated_ids")
        print(f"first generated ids: pocketchat {ours[0].get('first_generated_ids')}, "
              f"llama.cpp {theirs[0].get('first_generated_ids')} ({'same' if same else 'DIFFERENT'})")
    own = col(ours, "peak_rss_bytes")
    if own is not None:
        print(f"pocketchat's own peak_rss_bytes {own / 1e6:.1f} MB, kv {fmt(col(ours, 'kv_bytes'), 'MB')} MB")
    print("(peak RSS from rusage; llama.cpp's includes its Python interpreter and numpy;"
          " wall includes model load and, for pocketchat, all turns)")
    if a.json:
        print(json.dumps({"pocketchat": ours, "llama.cpp": theirs, "llama.cpp turns": their_turns}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
