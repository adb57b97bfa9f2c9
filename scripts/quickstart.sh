#!/usr/bin/env bash
# Runs the product locally: hub with an embedded store, two demo agents and demo apiservers.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-tools.sh
export PATH="$HOME/.local/bin:$PATH"
pnpm build >/dev/null
exec node client/dist/cli/main.js quickstart "$@"
