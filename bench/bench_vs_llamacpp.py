#!/usr/bin/env python3
"""pocketchat vs llama.cpp on the same GGUF, measured alternately in one run.

Runs `pocketchat bench` (A) and bench/llamacpp_peer.py (B) as A B A B ... for
--pairs pairs on the same model, prompt length, generation length and thread count, and
prints the median of each metric and the ratio ours / llama.cpp (above 1.0 means
pocketchat is faster for tok/s). Peak RSS is measured the same way for both, from the
process's rusage (the peer's includes its Python interpreter and numpy). So are the peaks
of its dirty anonymous memory (RssAnon) and its clean file pages (RssFile, such as
mmapped weights), sampled from /proc/PID/status every 20 ms; the Python baseline (RssAnon
and RssFile with llama_cpp and numpy imported, no model) is printed, not subtracted.

--kernel fast,avx2 runs pocketchat once per kernel in every pair (A1 A2 B); --tsv FILE
appends one line of medians per kernel, with the load average before and after.

With --turns K > 1 each pair also runs bench/llamacpp_turns.py (C), llama.cpp on the
same K-turn conversation as `pocketchat bench --turns K`, and prints both engines' time to
first token of turn 1 and turn K and decode speed at turn K.

  cargo build --release --no-default-features   # the headless binary: no GTK/WebKit in its RSS
  python3 bench/bench_vs_llamacpp.py --prompt-tokens 128 --gen 128 --threads 2 --pairs 3

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
    """Runs cmd; returns (its last JSON stdout line, its peak RSS in bytes, wall seconds,
    its sampled memory peaks: see MemorySampler)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    sampler = MemorySampler(p.pid)
    out, err, rss = communicate_rusage(p)
    wall = time.perf_counter() - t
    mem = sampler.stop()
    if p.returncode != 0:
        sys.stderr.write(err[-4000:])
        raise SystemExit(f"bench_vs_llamacpp: {' '.join(cmd)} failed with exit {p.returncode}")
    lines = [l for l in out.splitlines() if l.strip().startswith("{")]
    if not lines:
        sys.stderr.write(out[-2000:] + err[-2000:])
        raise SystemExit(f"bench_vs_llamacpp: no JSON line from {' '.join(cmd)}")
    return json.loads(lines[-1]), rss, wall, mem


def proc_status_bytes(path):
    """The kB fields of a /proc/PID/status file, in bytes ({} once the process is gone or
    a zombie, whose status has no memory lines)."""
    fields = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if rest.strip().endswith(" kB"):
                    fields[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return fields


class MemorySampler:
    """Samples /proc/PID/status every `interval` s while the process runs and keeps the
    peaks of RssAnon (dirty: heap, anonymous mappings; what the OS must keep or swap),
    RssFile (clean file pages, such as mmapped weights, which the OS can drop and
    re-read) and VmRSS. VmHWM only gives the total's peak; the two parts peak at their
    own moments, so their peaks need not add up to it. Spikes shorter than the interval
    can be missed. Linux only; elsewhere all peaks stay None."""

    KEYS = ("RssAnon", "RssFile", "RssShmem", "VmRSS", "VmHWM")

    def __init__(self, pid, interval=0.02):
        self.path = f"/proc/{pid}/status"
        self.interval = interval
        self.peaks = {k: None for k in self.KEYS}
        self.samples = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.is_set():
            fields = proc_status_bytes(self.path)
            if fields:
                self.samples += 1
                for k in self.KEYS:
                    if k in fields and (self.peaks[k] is None or fields[k] > self.peaks[k]):
                        self.peaks[k] = fields[k]
            self.done.wait(self.interval)

    def stop(self):
        self.done.set()
        self.thread.join()
        return dict(self.peaks, samples=self.samples)


def python_baseline():
    """RssAnon and RssFile of this Python with llama_cpp and numpy imported and no model
    loaded: what the llama.cpp peer's figures include besides llama.cpp itself."""
    code = ("import llama_cpp, numpy, json\n"
            "f = {l.split(':')[0]: int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.rstrip().endswith(' kB')}\n"
            "print(json.dumps({k: f.get(k) for k in ('RssAnon', 'RssFile', 'VmRSS')}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {}


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "-"


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


def mb(v):
    return None if v is None else round(v / 1e6, 1)


def append_tsv(path, row):
    """One line of medians, with a header line when the file is new or empty."""
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a") as f:
        if new:
            f.write("\t".join(row) + "\n")
        f.write("\t".join("-" if v is None else str(round(v, 2) if isinstance(v, float) else v)
                           for v in row.values()) + "\n")


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
    ap.add_argument("--peer", default=os.path.join(REPO, "bench", "llamacpp_peer.py"))
    ap.add_argument("--kernel", default=None,
                    help="pocketchat's --kernel (fast, avx2, portable, candle); default: its own. "
                         "Comma-separated for several, each run in every pair (A1 A2 B ...) "
                         "against the same llama.cpp runs")
    ap.add_argument("--json", action="store_true", help="also print all runs as one JSON line")
    ap.add_argument("--tsv", default=None,
                    help="append one line of medians to this TSV file (a header first if new)")
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
        print(f"no peer script at {peer} (expected bench/llamacpp_peer.py)", file=sys.stderr)
        return 1
    probe = subprocess.run([sys.executable, "-c", "import llama_cpp, numpy"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print("llama_cpp (llama-cpp-python) is not importable by "
              f"{sys.executable}. Install it with:\n\n{peer_install_help(peer)}\n",
              file=sys.stderr)
        return 2

    kernels = a.kernel.split(",") if a.kernel else [None]
    ours_cmds = [[a.bin, "bench", "--model", model, "--prompt-tokens", str(a.prompt_tokens),
                  "--gen", str(a.gen), "--threads", str(a.threads), "--turns", str(a.turns),
                  "--json"] + (["--kernel", k] if k else []) for k in kernels]
    ours_names = ["pocketchat"] if len(kernels) == 1 else [f"pocketchat {k}" for k in kernels]
    peer_cmd = [sys.executable, peer, model, "--prompt-tokens", str(a.prompt_tokens),
                "--gen", str(a.gen), "--threads", str(a.threads)]

    turns_cmd = [sys.executable, os.path.join(REPO, "bench", "llamacpp_turns.py"), model,
                 "--prompt-tokens", str(a.prompt_tokens), "--gen", str(a.gen),
                 "--threads", str(a.threads), "--turns", str(a.turns)]
    runs = list(zip(ours_names, ours_cmds)) + [("llama.cpp", peer_cmd)]
    if a.turns > 1:
        runs.append(("llama.cpp turns", turns_cmd))
    load_before = loadavg()
    baseline = python_baseline()
    variants = [(name, []) for name in ours_names]  # pocketchat's runs, one list per kernel
    ours, theirs, their_turns = variants[0][1], [], []
    into_by_name = {**dict(variants), "llama.cpp": theirs, "llama.cpp turns": their_turns}
    for i in range(a.pairs):
        for name, cmd in runs:
            into = into_by_name[name]
            res, rss, wall, mem = run_measured(cmd)
            res["_rss"] = rss  # the same measurement for both
            res["_wall_s"] = wall
            res["_rss_anon"], res["_rss_file"] = mem["RssAnon"], mem["RssFile"]
            res["_mem_samples"] = mem["samples"]
            into.append(res)
            print(f"pair {i + 1}/{a.pairs} {name:15s} prefill {res.get('prefill_tok_s', '-')} tok/s, "
                  f"decode {res.get('decode_tok_s')} tok/s, ttft {res.get('ttft_ms', '-')}, {wall:.1f} s, "
                  f"peak RssAnon {fmt(mem['RssAnon'], 'MB')} MB, RssFile {fmt(mem['RssFile'], 'MB')} MB",
                  file=sys.stderr)
    load_after = loadavg()

    def col(runs, key):
        return median([r.get(key) for r in runs])

    def at_turn(runs, key, turn):
        return median([(r.get(key) or [None])[turn] for r in runs])

    metrics = [("prefill tok/s", "prefill_tok_s", ""), ("decode tok/s", "decode_tok_s", ""),
               ("peak RSS MB", "_rss", "MB"), ("peak RssAnon MB", "_rss_anon", "MB"),
               ("peak RssFile MB", "_rss_file", "MB"), ("load s", "load_s", ""), ("wall s", "_wall_s", "")]
    print(f"\nmodel {os.path.basename(model)}, prompt {a.prompt_tokens}, gen {a.gen}, "
          f"threads {a.threads}, kernel {a.kernel or 'default'}, {a.pairs} pairs "
          f"(A B{' C' if their_turns else ''} alternating), medians; load average {load_before} "
          f"before, {load_after} after")
    width = max(12, *(len(n) + 2 for n, _ in variants))
    ratio_names = ["ours/peer"] if len(variants) == 1 else [f"{k}/peer" for k in kernels]
    print(f"{'metric':<16}" + "".join(f"{n:>{width}}" for n, _ in variants) + f"{'llama.cpp':>12}"
          + "".join(f"{r:>11}" for r in ratio_names))
    for name, key, unit in metrics:
        t = col(theirs, key)
        line = f"{name:<16}"
        ratios = ""
        for _, runs_ in variants:
            o = col(runs_, key)
            line += f"{fmt(o, unit):>{width}}"
            ratios += f"{f'{o / t:.2f}x' if o is not None and t else '-':>11}"
        print(line + f"{fmt(t, unit):>12}" + ratios)
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
    if theirs and theirs[0].get("cpu_features"):
        print(f"llama.cpp's CPU kernels: {theirs[0]['cpu_features']}")
    own = col(ours, "peak_rss_bytes")
    if own is not None:
        print(f"pocketchat's own peak_rss_bytes {own / 1e6:.1f} MB, kv {fmt(col(ours, 'kv_bytes'), 'MB')} MB")
    print("(peak RSS from rusage; llama.cpp's includes its Python interpreter and numpy;"
          " wall includes model load and, for pocketchat, all turns)")
    print("(peak RssAnon = dirty anonymous pages, peak RssFile = clean file pages such as"
          " mmapped weights, each the maximum of /proc/PID/status sampled every 20 ms, so each"
          " peaks at its own moment; llama.cpp's include Python's baseline, subtracted"
          f" nowhere: RssAnon {fmt(baseline.get('RssAnon'), 'MB')} MB, RssFile"
          f" {fmt(baseline.get('RssFile'), 'MB')} MB with llama_cpp and numpy imported)")
    for kernel, (_, ours_k) in zip(kernels, variants) if a.tsv else ():
        append_tsv(a.tsv, {
            "model": os.path.basename(model), "kernel": kernel or "default",
            "threads": a.threads, "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen,
            "pairs": a.pairs, "loadavg_before": load_before, "loadavg_after": load_after,
            **{f"{side}_{key}": val for side, runs_ in (("ours", ours_k), ("llamacpp", theirs))
               for key, val in (("load_s", col(runs_, "load_s")),
                                ("prefill_tok_s", col(runs_, "prefill_tok_s")),
                                ("decode_tok_s", col(runs_, "decode_tok_s")),
                                ("peak_rss_mb", mb(col(runs_, "_rss"))),
                                ("peak_rss_anon_mb", mb(col(runs_, "_rss_anon"))),
                                ("peak_rss_file_mb", mb(col(runs_, "_rss_file"))))},
            "python_baseline_rss_anon_mb": mb(baseline.get("RssAnon")),
            "python_baseline_rss_file_mb": mb(baseline.get("RssFile")),
            "same_first_ids": (ours_k[0].get("first_generated_ids") == theirs[0].get("first_generated_ids"))
            if ours_k and theirs else None,
            "llamacpp_cpu_features": theirs[0].get("cpu_features") if theirs else None,
        })
    if a.json:
        print(json.dumps({**dict(variants), "llama.cpp": theirs, "llama.cpp turns": their_turns}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
