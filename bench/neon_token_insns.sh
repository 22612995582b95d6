#!/usr/bin/env bash
# Instructions per prompt token and per generated token of a whole model on pocketchat's
# aarch64 build, counted under qemu (see bench/neon_insns.sh for why counts, not times):
#
#   bench/neon_token_insns.sh MODEL.gguf > OUT.tsv
#
# `pocketchat bench` on one thread runs three times per emulated CPU (-cpu max: NeonDot;
# cortex-a53: Neon): 32 prompt + 8 generated tokens, 96 + 8, and 32 + 40. The differences
# divided by 64 and 32 tokens are the instructions of one prompt token (prefill, at
# positions 32..96) and of one generated token (decode, at 40..72); loading drops out.
# Needs what scripts/check-aarch64.sh needs, and a host C compiler.
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,12p' "$0"; exit 2; }
model=$1
source "$(dirname "${BASH_SOURCE[0]}")/qemu/setup.sh"
(cd "$repo" && cargo build --release --target "$target" --no-default-features --bin pocketchat >&2)
bin="$CARGO_TARGET_DIR/$target/release/pocketchat"

# The instructions of one `pocketchat bench` run on one thread.
insns() {
  local cpu=$1 prompt=$2 gen=$3
  counted "$cpu" "$bin" bench --model "$model" --prompt-tokens "$prompt" --gen "$gen" --threads 1 --json \
    2>&1 >/dev/null | awk '/^insns /{print $2}'
}

printf 'commit\tmodel\tcpu\tinsns_per_prompt_token\tinsns_per_generated_token\n'
for cpu in max cortex-a53; do
  base=$(insns "$cpu" 32 8)
  long_prompt=$(insns "$cpu" 96 8)
  long_gen=$(insns "$cpu" 32 40)
  printf '%s\t%s\t%s\t%s\t%s\n' "$commit" "$(basename "$model")" "$cpu" \
    $(( (long_prompt - base) / 64 )) $(( (long_gen - base) / 32 ))
done
