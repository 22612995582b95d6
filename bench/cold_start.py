#!/usr/bin/env python3
"""Time to the first token from a cold page cache: pocketchat against llama.cpp.

For each pair, both engines run once each (alternating which goes first) after
`sync; echo 3 > /proc/sys/vm/drop_caches` (needs root), so every run reads the model from
disk. Each reports, in-process, the model load and the prefill of a short prompt; their
sum is the time to the first token the user waits for after opening the model (the
interpreter's own start-up is left out of llama.cpp's figure).

  python3 bench/cold_start.py MODEL.gguf [MODEL2.gguf ...] --pairs 3 --threads 2

Prints one line per model: the median load, prefill and sum for each engine, and the
ratio llama.cpp / ours of the sums (above 1: ours is faster). `--tsv` prints rows instead.
"""
import argparse, datetime, json, os, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "bench", "llamacpp_peer.py")


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def ours(binary, model, threads, prompt, kernel):
    cmd = [binary, "bench", "--model", model, "--threads", str(threads), "--prompt-tokens", str(prompt),
           "--gen", "1", "--json"]
    if kernel:
        cmd += ["--kernel", kernel]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return r["load_s"], r["ttft_ms"][0] / 1e3


def peer(model, threads, prompt):
    cmd = [sys.executable, PEER, model, "--threads", str(threads), "--prompt-tokens", str(prompt), "--gen", "1"]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return r["load_s"], prompt / r["prefill_tok_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--kernel", default=None, help="pocketchat's --kernel (fast, avx2, ...)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "pocketchat"))
    ap.add_argument("--tsv", action="store_true")
    a = ap.parse_args()
    if a.tsv:
        print("date\tmodel\tkernel\tours_load_s\tours_prefill_s\tours_first_token_s\t"
              "llamacpp_load_s\tllamacpp_prefill_s\tllamacpp_first_token_s\tratio_llamacpp_over_ours\tload_avg")
    for model in a.models:
        runs = {"ours": [], "llama.cpp": []}
        for i in range(a.pairs):
            order = ["ours", "llama.cpp"] if i % 2 == 0 else ["llama.cpp", "ours"]
            for engine in order:
                drop_caches()
                if engine == "ours":
                    runs[engine].append(ours(a.bin, model, a.threads, a.prompt_tokens, a.kernel))
                else:
                    runs[engine].append(peer(model, a.threads, a.prompt_tokens))
        med = {e: (statistics.median(l for l, _ in r), statistics.median(p for _, p in r),
                   statistics.median(l + p for l, p in r)) for e, r in runs.items()}
        ratio = med["llama.cpp"][2] / med["ours"][2]
        name = os.path.basename(model)
        if a.tsv:
            o, p = med["ours"], med["llama.cpp"]
            print(f"{datetime.date.today()}\t{name}\t{a.kernel or 'fast'}\t{o[0]:.3f}\t{o[1]:.3f}\t{o[2]:.3f}\t"
                  f"{p[0]:.3f}\t{p[1]:.3f}\t{p[2]:.3f}\t{ratio:.2f}\t{os.getloadavg()[0]:.1f}")
        else:
            for e, (load, prefill, total) in med.items():
                print(f"{name} {e:9}: load {load:.3f} s + prefill {prefill:.3f} s = {total:.3f} s")
            print(f"{name}: llama.cpp / ours = {ratio:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
