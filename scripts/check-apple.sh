#!/usr/bin/env bash
# Type-checks pocketchat for iOS and macOS from a Linux machine.
#
#   scripts/check-apple.sh                # full app: iOS (mobile,metal), macOS (desktop,metal)
#   scripts/check-apple.sh --engine-only  # library without UI: --no-default-features --features metal
#
# There is no Apple SDK here, so this is `cargo check` only: C code that crates build is
# "compiled" by a stand-in (scripts/apple-check-cc) that writes empty objects, and
# SDKROOT points at an empty folder. It proves the Rust code (objc2, dispatch2, libc
# mach calls, cfg branches) type-checks for Apple targets; it does not link or run.
set -euo pipefail

mode=full
for arg in "$@"; do
  case "$arg" in
    --engine-only) mode=engine ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (expected --engine-only)" >&2; exit 2 ;;
  esac
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cc="$repo/scripts/apple-check-cc"

# A check that cannot run is SKIPPED here, and a failure under CI=true: CI installs the
# targets, so green must mean checked.
skip() {
  if [ "${CI:-}" = true ]; then
    echo "FAILED: Apple check: $* (CI=true: .ci/run installs it, so this must run)"
    exit 1
  fi
  echo "SKIPPED: Apple check: $*"
  exit 0
}

targets=(aarch64-apple-ios aarch64-apple-darwin)
if ! rustup target add "${targets[@]}" >/dev/null 2>&1; then
  # Already installed targets are fine even when rustup cannot reach the network.
  installed="$(rustup target list --installed 2>/dev/null || true)"
  for t in "${targets[@]}"; do
    if ! grep -qx "$t" <<<"$installed"; then
      skip "rustup could not add target $t"
    fi
  done
fi

sdk="$(mktemp -d)"
trap 'rm -rf "$sdk"' EXIT
export SDKROOT="$sdk"
export CC_aarch64_apple_ios="$cc" AR_aarch64_apple_ios=ar
export CC_aarch64_apple_darwin="$cc" AR_aarch64_apple_darwin=ar
export CARGO_TARGET_DIR="$repo/target/apple-check"

cd "$repo"
status=0
check() {
  local target="$1"; shift
  echo "==> cargo check --target $target $*"
  if cargo check --lib --bins --target "$target" "$@"; then
    echo "OK: $target $*"
  else
    echo "FAILED: $target $*"
    status=1
  fi
}

if [ "$mode" = engine ]; then
  check aarch64-apple-ios --no-default-features --features metal
  check aarch64-apple-darwin --no-default-features --features metal
else
  check aarch64-apple-ios --no-default-features --features mobile,metal
  check aarch64-apple-darwin --features desktop,metal
fi
exit "$status"
