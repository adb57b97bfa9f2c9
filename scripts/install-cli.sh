#!/usr/bin/env bash
# Puts `cluster-proxy` on the PATH of new login shells: a small launcher in npm's global bin directory (where
# `npm install -g` puts commands; /usr/bin or /usr/local/bin when run as root), else ~/.local/bin, that runs
# this checkout's built CLI on the Node.js this script ran with (quickstart.sh and test.sh put a supported one
# first on PATH): a new shell whose own `node` is older still runs the command on the supported one.
# CLUSTER_PROXY_BIN_DIR overrides the directory. Run after `pnpm build`.
# For a copy that does not depend on this checkout: node scripts/pack.mjs, then npm install -g the tarball.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$PWD/cli/dist/main.js"
[ -f "$target" ] || { echo "install-cli: $target is missing; run pnpm build first" >&2; exit 1; }
node_bin="$(command -v node || true)"
major="$("${node_bin:-false}" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
if [ "$major" -lt 24 ]; then
  echo "install-cli: the node first on PATH (${node_bin:-none}) is older than Node.js 24; run bash scripts/quickstart.sh, which installs one" >&2
  exit 1
fi
node_bin="$(cd "$(dirname "$node_bin")" && pwd -P)/$(basename "$node_bin")"
case "$PWD$node_bin" in *"'"*) echo "install-cli: a path with a single quote ($PWD, $node_bin) cannot go into the launcher" >&2; exit 1 ;; esac
# The node flags of the CLI's first line (its garbage-collector settings: cli/README.md).
flags="$(sed -n '1s|^#!.*env -S node||p' "$target")"
bin="${CLUSTER_PROXY_BIN_DIR:-}"
if [ -z "$bin" ]; then
  prefix="$(npm prefix -g 2>/dev/null || true)"
  bin="${prefix:+$prefix/bin}"
fi
if [ -z "$bin" ] || ! { mkdir -p "$bin" 2>/dev/null && [ -w "$bin" ]; }; then
  bin="$HOME/.local/bin"
  mkdir -p "$bin"
fi
launcher="$bin/cluster-proxy"
rm -f "$launcher"
cat > "$launcher" <<LAUNCHER
#!/bin/sh
# cluster-proxy from $PWD (scripts/install-cli.sh): its build, on the Node.js it was installed with.
exec '$node_bin'$flags '$target' "\$@"
LAUNCHER
chmod +x "$launcher"
echo "==> cluster-proxy on PATH: $launcher (runs $target on $node_bin)"
case ":$(bash -lc 'echo "$PATH"' 2>/dev/null):" in
  *":$bin:"*) ;;
  *) echo "note: $bin is not on a login shell's PATH; add it there: export PATH=\"$bin:\$PATH\"" ;;
esac
