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
results="$(mktemp -d)/vitest.json"
status=0
pnpm exec vitest run --reporter=default --reporter=json --outputFile.json="$results" "$@" || status=$?
# One plain summary line that any CI can read.
if [ -f "$results" ]; then
  node -e 'const r=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));console.log(`${r.numPassedTests} passed, ${r.numFailedTests} failed, ${r.numPendingTests+r.numTodoTests} skipped`)' "$results"
fi
exit $status
