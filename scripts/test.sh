#!/usr/bin/env bash
# The test suite, from a fresh clone: installs what it needs, builds, runs the tests.
#   bash scripts/test.sh --all     every test (what CI runs: .ci/run)
#   bash scripts/test.sh           the default run: all but the slowest real-stack files (a few minutes less)
# Other arguments go to vitest (e.g. a file or -t NAME) and then select from the whole suite in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
if [ "${1:-}" = "--all" ]; then
  all=1
  shift
fi
source scripts/ensure-tools.sh
echo "==> build"
pnpm build
# The layers of the code (.dependency-cruiser.cjs) and the linter (biome.json): a broken rule fails the run.
echo "==> layers and lint"
pnpm -s check-layers
pnpm -s lint
# The previous release, for the version-skew tests (docs/upgrades.md): built from git history once, then cached.
echo "==> previous release ($(node -p "require('./test/previous-release.json').version"))"
bash scripts/build-release.sh "$(node -p "require('./test/previous-release.json').commit")" >/dev/null
# The real control plane of test/e2e/real-apiserver.test.ts (etcd, kube-apiserver, kube-controller-manager)
# and ANP's programs of test/e2e/anp-real.test.ts, built from Go modules once per pinned version into
# ~/.cache/cluster-proxy (the first build takes minutes).
echo "==> real peers"
bash scripts/build-real-peers.sh
# The older Node the SDK's test dials from, installed before the tests (a download beside them slowed them).
echo "==> older Node for the SDK: $(bash scripts/ensure-older-node.sh)"
echo "==> test"
# Raise the open-file limit for the many-connection tests (best effort).
ulimit -n 65536 2>/dev/null || true
results="$(mktemp -d)"
status=0
# The packaging tests (npm pack + install, the OCI image build) saturate CPU and disk for minutes; they run
# after the rest, on their own, so they do not skew the timing-sensitive end-to-end tests beside them.
PACKAGING=(test/e2e/install.test.ts test/e2e/image.test.ts)
# The slowest files on real control planes (a minute or more of several apiservers and OCM's programs each), whose
# fast stand-in twins run by default: only with --all.
REAL_STACK_EXTRA=(test/e2e/real-ocm-migration.test.ts test/e2e/real-ocm-upgrade.test.ts test/e2e/real-ha.test.ts test/e2e/real-gateway.test.ts)
if [ $# -gt 0 ]; then
  pnpm exec vitest run --reporter=default --reporter=json --outputFile.json="$results/all.json" "$@" || status=$?
else
  excludes=()
  for f in "${PACKAGING[@]}"; do excludes+=(--exclude "$f"); done
  if [ "$all" = 0 ]; then
    for f in "${REAL_STACK_EXTRA[@]}"; do excludes+=(--exclude "$f"); done
    echo "(default run: ${REAL_STACK_EXTRA[*]} run with --all)"
  fi
  pnpm exec vitest run --reporter=default --reporter=json --outputFile.json="$results/main.json" "${excludes[@]}" || status=$?
  echo "==> packaging tests"
  pnpm exec vitest run --reporter=default --reporter=json --outputFile.json="$results/packaging.json" "${PACKAGING[@]}" || status=$?
fi
# One plain summary line that any CI can read.
node -e '
const fs = require("fs");
let p = 0, f = 0, s = 0, files = 0;
for (const name of fs.readdirSync(process.argv[1])) {
  const r = JSON.parse(fs.readFileSync(`${process.argv[1]}/${name}`, "utf8"));
  p += r.numPassedTests; f += r.numFailedTests; s += r.numPendingTests + r.numTodoTests; files++;
}
if (files > 0) console.log(`${p} passed, ${f} failed, ${s} skipped`);
' "$results"
exit $status
