#!/usr/bin/env bash
# Builds another version of this repository from its git history, for the skew tests (docs/upgrades.md):
#   bash scripts/build-release.sh REF      (a tag such as v0.1.0, or a commit)
# prints the directory of the build (its CLI is DIR/cli/dist/main.js). The source comes from `git archive`
# (no worktree to clean up), installed from pnpm's store and built with its own pnpm build; cached in
# .cluster-proxy/releases/COMMIT (ignored by git) and reused while that folder is complete.
# Run with the toolchain on PATH (scripts/ensure-tools.sh; scripts/test.sh sources it).
set -euo pipefail
cd "$(dirname "$0")/.."
ref="${1:?usage: build-release.sh REF}"
commit="$(git rev-parse --verify --quiet "$ref^{commit}")" || { echo "build-release: $ref is not a commit of this repository (a shallow clone lacks history: git fetch --unshallow)" >&2; exit 1; }
dir="$PWD/.cluster-proxy/releases/$commit"
if [ -f "$dir/.built" ] && [ -f "$dir/cli/dist/main.js" ]; then
  echo "$dir"
  exit 0
fi
started=$(date +%s)
rm -rf "$dir"
mkdir -p "$dir"
git archive "$commit" | tar -x -C "$dir"
(
  cd "$dir"
  pnpm install --frozen-lockfile --prefer-offline --reporter=silent >&2
  pnpm build >&2
)
touch "$dir/.built"
echo "==> built $ref ($commit) in $(( $(date +%s) - started )) s" >&2
echo "$dir"
