#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs, builds, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-tools.sh
export PATH="$HOME/.local/bin:$PATH"
echo "==> build"
pnpm build
echo "==> test"
# Raise the open-file limit for the many-connection tests (best effort).
ulimit -n 65536 2>/dev/null || true
pnpm exec vitest run "$@"
