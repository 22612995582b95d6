#!/usr/bin/env bash
# Instructions that pocketchat's aarch64 kernels (and candle's, the reference) execute
# per matmul, counted under qemu's user-mode emulation: there is no ARM machine here to
# time them on, and an emulator's time means nothing, but the instruction count of a
# kernel with no data-dependent branches repeats to about 0.1 %.
#
#   bench/neon_insns.sh MODEL.gguf TENSOR... > OUT.tsv
#
# Per tensor and activation rows m (1: decode, 128: prefill) and per kernel set:
#   fast on -cpu max        NeonDot (sdot)
#   fast on -cpu cortex-a53 Neon (widening multiplies)
#   candle on -cpu max      candle's own aarch64 kernels (ggml's NEON vec_dot ported)
# it runs benches/kernel_count.rs with 1 and 3 calls and prints half the difference,
# the instructions of one call (quantizing the input included), and that per 1000
# multiply-adds. Needs what scripts/check-aarch64.sh needs, and a host C compiler for
# the counting plugin (bench/qemu/insn_count.c).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,16p' "$0"; exit 2; }
model=$1
shift
source "$(dirname "${BASH_SOURCE[0]}")/qemu/setup.sh"
bin=$(cd "$repo" && cargo bench --target "$target" --no-default-features --bench kernel_count --no-run \
  --message-format=json 2>/dev/null | grep -o '"executable":"[^"]*kernel_count[^"]*"' | cut -d'"' -f4 | tail -1)
[ -x "$bin" ] || { echo "could not build benches/kernel_count.rs for $target" >&2; exit 1; }

# The instructions of a run of `count` calls, and the kernels it ran, tab-separated.
insns() {
  local cpu=$1 tensor=$2 m=$3 count=$4 kernels=$5
  counted "$cpu" "$bin" "$model" "$tensor" "$m" "$count" "$kernels" 2>&1 |
    awk '/ calls, kernels /{sub(/.* kernels /, ""); k = $0} /^insns /{n = $2} END{print n "\t" k}'
}

printf 'commit\tmodel\ttensor\tm\tkernels\tcpu\tinsns_per_call\tinsns_per_1000_macs\n'
for tensor in "$@"; do
  weights=$(python3 - "$model" "$tensor" <<'PY'
import sys, gguf
t = next(t for t in gguf.GGUFReader(sys.argv[1]).tensors if t.name == sys.argv[2])
print(int(t.shape[0]) * int(t.shape[1]))
PY
)
  for m in 1 128; do
    for run in "fast max" "fast cortex-a53" "candle max"; do
      read -r kernels cpu <<<"$run"
      IFS=$'\t' read -r one _ <<<"$(insns "$cpu" "$tensor" "$m" 1 "$kernels")"
      IFS=$'\t' read -r three ran <<<"$(insns "$cpu" "$tensor" "$m" 3 "$kernels")"
      per_call=$(( (three - one) / 2 ))
      per_kmac=$(python3 -c "print(f'{$per_call * 1000 / ($weights * $m):.1f}')")
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$commit" "$(basename "$model")" "$tensor" "$m" "$ran" "$cpu" \
        "$per_call" "$per_kmac"
    done
  done
done
