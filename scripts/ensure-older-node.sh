#!/usr/bin/env bash
# The older Node the SDK's test dials from (test/e2e/sdk-install.test.ts): 22.16, whose node:http2 takes request
# headers only as an object. Installed once from npm's node package into ~/.cache/cluster-proxy, outside the
# checkout; prints the binary's path.
set -euo pipefail
version=22.16.0
dir="${XDG_CACHE_HOME:-$HOME/.cache}/cluster-proxy/node-$version"
bin="$dir/node_modules/node/bin/node"
if [ "$("$bin" --version 2>/dev/null)" != "v$version" ]; then
  npm install --prefix "$dir" --no-save --no-audit --no-fund --loglevel=error "node@$version" >/dev/null
  [ "$("$bin" --version 2>/dev/null)" = "v$version" ] \
    || { echo "error: npm's node@$version did not install a working node binary in $dir" >&2; exit 1; }
fi
echo "$bin"
