#!/usr/bin/env bash
# End-to-end check of the desktop app: builds pocketchat, then runs tests/app_e2e.rs,
# which starts the real app on the default model under Xvfb, types a prompt with
# xdotool, clicks "Simulate memory warning" mid-reply, sends a second prompt, and passes
# only when both replies finished and the eviction notice was shown. Screenshots and the
# app's QA status land in target/e2e/.
#
#   scripts/e2e.sh              # debug build
#   scripts/e2e.sh --release    # release build (faster replies)
#
# Needs: xvfb (xvfb-run), xdotool, x11-apps (xwd), imagemagick (convert), and the model
# (models/SmolLM2-135M-Instruct.Q4_1.gguf, or POCKETCHAT_MODEL=PATH).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

if ! command -v xvfb-run >/dev/null 2>&1; then
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  echo "!! SKIPPED: xvfb-run is not installed; the end-to-end app test did NOT run."
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  exit 0
fi
for tool in xdotool xwd convert; do
  command -v "$tool" >/dev/null 2>&1 || { echo "e2e: $tool is missing (apt install xdotool x11-apps imagemagick)" >&2; exit 1; }
done

model="${POCKETCHAT_MODEL:-$repo/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ ! -f "$model" ]; then
  echo "e2e: no model at $model — run: cargo run --release -- fetch" >&2
  exit 1
fi
export POCKETCHAT_MODEL="$model"

cargo test --features desktop,qa "$@" --test app_e2e -- --nocapture --test-threads=1
echo "e2e: screenshots and status in $(ls -d "$repo"/target/e2e 2>/dev/null || echo target/e2e)"
