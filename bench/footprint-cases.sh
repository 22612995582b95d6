#!/usr/bin/env bash
# Peak RSS against the predicted footprint on the cases of tests/footprint.rs, with the
# release binary, one row per case (tab-separated) on stdout:
#
#   cargo build --release --no-default-features
#   bench/footprint-cases.sh > bench/runs/DATE-HOST/footprint.tsv
#
# The inputs are made here: a ~200 KB prompt of words on one line, and a 2 MB line of
# letters and digits without spaces. Gemma 3 270M must be fetched
# (scripts/fetch-model.sh gemma-3-270m-q4_k_m).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${BIN:-target/release/pocketchat}
smol=models/SmolLM2-135M-Instruct.Q4_1.gguf
gemma=models/gemma-3-270m-q4_k_m.gguf
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import random, sys
words = ["lighthouse", "keeper", "storm", "the", "of", "waves", "night", "ship", "light", "and"]
text, i = "", 7
while len(text) < 200_000:
    i = (i * 31 + 17) % 1009
    text += words[i % len(words)] + " "
open(f"{sys.argv[1]}/long.txt", "w").write(text + "\n")
random.seed(1)
line = "".join(random.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(2_000_000))
open(f"{sys.argv[1]}/paste.txt", "w").write(line + "\n")
PY
printf 'case\tpeak_rss_mb\tpredicted_mb\tslack_mb\n'
row() {
  local name=$1 input=$2; shift 2
  "$bin" chat --stats --max-tokens 8 "$@" < "$input" 2>&1 >/dev/null | grep '^\[turn' | tail -1 |
    python3 -c "
import re, sys
l = sys.stdin.read(); p = int(re.search(r'peak_rss (\d+)', l).group(1)); q = int(re.search(r'predicted (\d+)', l).group(1))
print(f'$name\t{p/1e6:.1f}\t{q/1e6:.1f}\t{(q-p)/1e6:.1f}')"
}
for kernel in fast avx2 candle; do
  row "SmolLM2 6gb f32 --kernel $kernel" "$work/long.txt" --model $smol --follow-policy-quant --tier 6gb --kv f32 --kernel $kernel
done
row "SmolLM2 6gb f16" "$work/long.txt" --model $smol --follow-policy-quant --tier 6gb
row "SmolLM2 8gb f32" "$work/long.txt" --model $smol --follow-policy-quant --tier 8gb --kv f32
row "SmolLM2 8gb f16" "$work/long.txt" --model $smol --follow-policy-quant --tier 8gb
row "SmolLM2 6gb, 2 MB line without spaces" "$work/paste.txt" --model $smol --follow-policy-quant --tier 6gb
row "Gemma 3 270M --budget 8192 f16" "$work/long.txt" --model $gemma --budget 8192
row "Gemma 3 270M --budget 8192 f32" "$work/long.txt" --model $gemma --budget 8192 --kv f32
export POCKETCHAT_CHATS_DIR=$work/chats
mkdir -p "$POCKETCHAT_CHATS_DIR"
row "SmolLM2 6gb chat filled and saved" "$work/long.txt" --model $smol --follow-policy-quant --tier 6gb --chat long
echo "And what did the keeper see?" > "$work/next.txt"
row "SmolLM2 6gb chat resumed from its cache" "$work/next.txt" --model $smol --follow-policy-quant --tier 6gb --chat long
