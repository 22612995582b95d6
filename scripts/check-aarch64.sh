#!/usr/bin/env bash
# Runs pocketchat's aarch64 kernels (NEON, and NEON with `sdot`) on an x86-64 Linux
# machine, under qemu's user-mode emulation:
#
#   scripts/check-aarch64.sh             # the kernel unit tests, then the greedy reply check
#   scripts/check-aarch64.sh --unit-only # the kernel unit tests only
#
# 1. The unit tests of the kernels (`engine::cpu::qlinear`, `engine::cpu::attention`,
#    `engine::cpu::kernels`), built for aarch64-unknown-linux-gnu without the UI, on two
#    emulated CPUs: `max` has dotprod, so detection picks NeonDot and the tests run
#    NeonDot, Neon and Scalar side by side (`Isa::all_supported`); `cortex-a53` has none,
#    so detection must pick Neon.
# 2. A greedy reply (--temperature 0) of the default model to a fixed prompt: the aarch64
#    binary's text, with the sdot kernels and with the plain NEON ones, must equal the
#    x86-64 binary's (built here too). Each binary's kernel choice is read from
#    `pocketchat bench`.
#
# Needs the rustup target aarch64-unknown-linux-gnu, a cross linker (Debian:
# gcc-aarch64-linux-gnu, libc6-dev-arm64-cross) and qemu-aarch64 (qemu-user); .ci/run
# installs them. Where one is missing this prints SKIPPED, except under CI=true, where
# that is a failure: CI must run these kernels. The build goes to target/aarch64, apart
# from the host's builds, and nothing here changes how the host builds.
set -euo pipefail

mode=full
for arg in "$@"; do
  case "$arg" in
    --unit-only) mode=unit ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (expected --unit-only)" >&2; exit 2 ;;
  esac
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu
linker=aarch64-linux-gnu-gcc

missing() {
  if [ "${CI:-}" = true ]; then
    echo "FAILED: aarch64 check: $* (CI=true: .ci/run installs it, so this must run)"
    exit 1
  fi
  echo "SKIPPED: aarch64 check: $*"
  exit 0
}

command -v qemu-aarch64 >/dev/null 2>&1 || missing "no qemu-aarch64 (apt-get install qemu-user)"
command -v "$linker" >/dev/null 2>&1 || missing "no $linker (apt-get install gcc-aarch64-linux-gnu)"
[ -e "$sysroot/lib/ld-linux-aarch64.so.1" ] || missing "no aarch64 C library in $sysroot (apt-get install libc6-dev-arm64-cross)"
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  rustup target add "$target" >/dev/null 2>&1 || missing "rustup could not add target $target"
fi

export CARGO_TARGET_DIR="$repo/target/aarch64"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="$linker"
export CC_aarch64_unknown_linux_gnu="$linker" AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
emulate() {
  local cpu=$1
  shift
  qemu-aarch64 -cpu "$cpu" -L "$sysroot" "$@"
}

status=0
fail() {
  echo "FAILED: $*"
  status=1
}

kernel_tests=(engine::cpu::qlinear engine::cpu::attention engine::cpu::kernels)
# candle 0.11's own aarch64 kernels for Q4_0, Q8_0 and the K-quants use `sdot` without
# checking that the CPU has it (a SIGILL on cortex-a53), so the tests that compare ours
# against them run on `max` only; on cortex-a53 the NEON kernels are checked against
# the scalar ones. (A new test that calls candle's quantized matmul belongs here too: on
# cortex-a53 it kills the whole test binary with SIGILL, which fails this check.)
candle_sdot_tests=(q8_0_matches_reference real_gguf_tensors_match_candle other_formats_and_the_candle_switch
                   q4_k_scalar_matches_candles_dequantized_weights real_q4_k_tensors_run_in_place_and_match_candle
                   q6_k_matches_dequantized_matmul)
for cpu in max cortex-a53; do
  skip=()
  case "$cpu" in
    max) want=NeonDot ;;
    *)
      want=Neon
      for t in "${candle_sdot_tests[@]}"; do skip+=(--skip "$t"); done
      ;;
  esac
  echo "==> cargo test --target $target --no-default-features --lib ${kernel_tests[*]}, on qemu-aarch64 -cpu $cpu (detection must pick $want)"
  # The runner is not part of cargo's fingerprint: the second CPU reuses the build.
  if ! out=$(CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu -L $sysroot" \
    cargo test --target "$target" --no-default-features --lib -- "${kernel_tests[@]}" ${skip[@]+"${skip[@]}"} --nocapture 2>&1); then
    printf '%s\n' "$out"
    fail "kernel tests on -cpu $cpu"
    continue
  fi
  # The tests' names, their summary and the detected instruction set; not the build log
  # or the tests' own measurements.
  grep -E '^(test |test result:|running |qlinear kernels:)' <<<"$out" || true
  grep -q "qlinear kernels: $want " <<<"$out" || fail "-cpu $cpu: detection did not pick $want"
done

if [ "$mode" = unit ]; then
  exit "$status"
fi

model=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || { echo "FAILED: $model is missing (scripts/fetch-model.sh)"; exit 1; }
# A prompt whose greedy reply is the same with every x86-64 kernel set (fast, avx2,
# portable, candle): no near tie that a different summation order could tip. (Until
# 2026-12-03 it was "List the planets of the solar system.", whose "1. Mercury" against
# "1. Earth" became such a tie when SiLU moved to our own vectorized exponential: the
# portable kernels on both architectures tipped one way, AVX2 and AVX-512 the other.)
prompt="Name three primary colors."
reply_args=(chat --model "$model" --temperature 0 --max-tokens 16 --threads 2)

echo "==> greedy reply: aarch64 under qemu against x86-64"
cargo build --target "$target" --no-default-features --bin pocketchat
# The host binary in the host's own target folder, built as the engine pass of
# scripts/test builds it for the integration tests (so nothing is compiled again there;
# `cargo build` would rebuild the dependencies without the dev-dependencies' features).
host_dir="$repo/target"
CARGO_TARGET_DIR="$host_dir" cargo test --no-run --no-default-features --test cli_input
arm_bin="$CARGO_TARGET_DIR/$target/debug/pocketchat"
host_bin="$host_dir/debug/pocketchat"

reply() {
  local err
  err=$(mktemp)
  if ! "$@" "${reply_args[@]}" <<<"$prompt" 2>"$err"; then
    cat "$err" >&2
    rm -f "$err"
    return 1
  fi
  rm -f "$err"
}
# `pocketchat bench` names the kernels it ran and the greedy ids it generated after a
# one-token prompt (4 of them: all four x86-64 kernel sets agree on those).
bench_of() {
  "$@" bench --model "$model" --prompt-tokens 1 --gen 3 --threads 2 --json 2>/dev/null || true
}
# A field of bench's one-line JSON: `"kernels":"fast (Neon)"` gives `"fast (Neon)"`.
field() { grep -oE "\"$1\":(\"[^\"]*\"|\[[^]]*\])" | cut -d: -f2- || true; }

want_text=$(reply "$host_bin") || { fail "x86-64 reply"; exit 1; }
host_bench=$(bench_of "$host_bin")
want_ids=$(field first_generated_ids <<<"$host_bench")
echo "x86-64 $(field kernels <<<"$host_bench"): ids $want_ids, reply: $want_text"
for cpu in max cortex-a53; do
  case "$cpu" in
    max) want='"fast (NeonDot)"' ;;
    *) want='"fast (Neon)"' ;;
  esac
  arm_bench=$(bench_of emulate "$cpu" "$arm_bin")
  kernels=$(field kernels <<<"$arm_bench")
  ids=$(field first_generated_ids <<<"$arm_bench")
  if ! text=$(reply emulate "$cpu" "$arm_bin"); then
    fail "aarch64 -cpu $cpu reply"
    continue
  fi
  echo "aarch64 -cpu $cpu ${kernels:-(no bench)}: ids $ids, reply: $text"
  [ "$kernels" = "$want" ] || fail "-cpu $cpu ran ${kernels:-nothing}, not $want"
  [ -n "$ids" ] && [ "$ids" = "$want_ids" ] || fail "-cpu $cpu: the greedy ids differ from x86-64's"
  [ "$text" = "$want_text" ] || fail "-cpu $cpu: the greedy reply differs from x86-64's"
done

[ "$status" -eq 0 ] && echo "OK: aarch64 kernels under qemu"
exit "$status"
