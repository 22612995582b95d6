# Sourced by bench/neon_insns.sh and bench/neon_token_insns.sh: the aarch64 cross build's
# settings (those of scripts/check-aarch64.sh, in target/aarch64) and the counting plugin,
# built with the host's C compiler. Sets repo, target, sysroot, plugin and commit, and
# defines `counted`.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu
export CARGO_TARGET_DIR="$repo/target/aarch64"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar

plugin="$CARGO_TARGET_DIR/insn_count.so"
mkdir -p "$CARGO_TARGET_DIR"
cc -shared -fPIC -O2 -o "$plugin" "$repo/bench/qemu/insn_count.c"

# The commit the counts are of; `+` where src/ has changes not committed.
commit=$(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD -- src || echo +)

# Runs an aarch64 program on emulated CPU $1 with the counting plugin (its `insns N` line
# goes to stderr). One thread for candle too: the plugin's counter is not atomic, and qemu
# runs guest threads on host threads at once, so a second thread would lose counts.
counted() {
  local cpu=$1
  shift
  RAYON_NUM_THREADS=1 qemu-aarch64 -cpu "$cpu" -L "$sysroot" -plugin "$plugin" "$@"
}
