# Sourced by bench/neon_insns.sh and bench/neon_token_insns.sh: the aarch64 cross build's
# settings (those of scripts/check-aarch64.sh, in target/aarch64) and the counting plugin,
# built with the host's C compiler. Sets repo, target, sysroot and plugin.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu
export CARGO_TARGET_DIR="$repo/target/aarch64"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar

plugin="$CARGO_TARGET_DIR/insn_count.so"
mkdir -p "$CARGO_TARGET_DIR"
cc -shared -fPIC -O2 -o "$plugin" "$repo/bench/qemu/insn_count.c"
