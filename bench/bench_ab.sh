#!/usr/bin/env bash
# Alternates `pocketchat bench` between builds (A B C A B C …) and prints, per build, the
# best and the median of: turn-1 prefill tok/s, turn-1 decode tok/s, the last turn's time
# to first token (ms) and its decode tok/s. Alternating spreads the machine's noise over
# every build; on a noisy VM the best runs are the steadier figure.
#
#   bench/bench_ab.sh ROUNDS BINARY... -- BENCH_ARGS...
#   bench/bench_ab.sh 5 /tmp/pc-before target/release/pocketchat -- --gen 128 --kv f16 --threads 2
set -euo pipefail
rounds=$1; shift
bins=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do bins+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
out=$(mktemp); trap 'rm -f "$out"' EXIT
for _ in $(seq "$rounds"); do
  for b in "${bins[@]}"; do
    printf '%s ' "$b" >>"$out"
    "$b" bench "$@" --json 2>/dev/null | tail -1 | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
print(d["prefill_tok_s"], d["decode_tok_s"], d["ttft_ms"][-1], d["decode_tok_s_by_turn"][-1])' >>"$out"
  done
done
python3 - "$out" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    b, *v = line.split()
    rows.setdefault(b, []).append([float(x) for x in v])
for b, r in rows.items():
    c = list(zip(*r))
    print(f"{b}: best prefill {max(c[0]):.0f} decode {max(c[1]):.1f} last-ttft {min(c[2]):.1f} ms "
          f"last-decode {max(c[3]):.1f} | median {statistics.median(c[0]):.0f} {statistics.median(c[1]):.1f} "
          f"{statistics.median(c[2]):.1f} {statistics.median(c[3]):.1f} ({len(r)} runs)")
PY
