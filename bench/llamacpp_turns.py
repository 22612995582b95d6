#!/usr/bin/env python3
"""llama.cpp on the multi-turn workload of `pocketchat bench --turns K`.

bench/llamacpp_peer.py times one prefill and one decode; this times a
conversation the way `pocketchat bench --turns K` does: K turns on one context, each
feeding P new token ids (the same ids as ours) and then decoding G tokens greedily, and
reports the time to first token of every turn. llama.cpp keeps its KV cache between
`eval` calls, so this is its persistent-cache behaviour, settings as in the peer script
(llama-cpp-python defaults, n_batch 512). Prints one JSON line.

  python3 bench/llamacpp_turns.py MODEL.gguf --prompt-tokens 128 --gen 128 --turns 10 --threads 2
"""
import argparse, json, os, sys, time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    from llama_cpp import Llama
    import numpy as np
    n_ctx = a.turns * (a.prompt_tokens + a.gen + 1)
    llm = Llama(model_path=a.model, n_ctx=n_ctx, n_threads=a.threads, n_threads_batch=a.threads,
                n_batch=512, verbose=False, logits_all=False)
    vocab = llm.n_vocab()

    def ids(turn):
        # The formula of `pocketchat bench`; turn 0 is llamacpp_peer.py's prompt.
        return [((i + turn * a.prompt_tokens) * 37) % (vocab - 100) + 1 for i in range(1, a.prompt_tokens + 1)]

    def next_id():
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))

    ttft_ms, decode_tok_s = [], []
    for turn in range(a.turns):
        t = time.perf_counter()
        llm.eval(ids(turn))
        nxt = next_id()
        ttft_ms.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        for _ in range(a.gen):
            llm.eval([nxt])
            nxt = next_id()
        decode_tok_s.append(a.gen / (time.perf_counter() - t))
    print(json.dumps({
        "engine": "llama.cpp", "threads": a.threads, "prompt_tokens": a.prompt_tokens,
        "gen_tokens": a.gen, "turns": a.turns, "context_tokens": llm.n_tokens,
        "ttft_ms": [round(x, 2) for x in ttft_ms],
        "decode_tok_s": [round(x, 2) for x in decode_tok_s],
    }))


if __name__ == "__main__":
    sys.exit(main())
