#!/usr/bin/env bash
# Puts `cluster-proxy` on the PATH of new login shells: a symlink to this checkout's built CLI in npm's
# global bin directory (where `npm install -g` puts commands; /usr/bin or /usr/local/bin when run as root),
# else ~/.local/bin. CLUSTER_PROXY_BIN_DIR overrides the directory. Run after `pnpm build`.
# For a copy that does not depend on this checkout: node scripts/pack.mjs, then npm install -g the tarball.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$PWD/cli/dist/main.js"
[ -f "$target" ] || { echo "install-cli: $target is missing; run pnpm build first" >&2; exit 1; }
chmod +x "$target"
bin="${CLUSTER_PROXY_BIN_DIR:-}"
if [ -z "$bin" ]; then
  prefix="$(npm prefix -g 2>/dev/null || true)"
  bin="${prefix:+$prefix/bin}"
fi
if [ -z "$bin" ] || ! { mkdir -p "$bin" 2>/dev/null && [ -w "$bin" ]; }; then
  bin="$HOME/.local/bin"
  mkdir -p "$bin"
fi
ln -sfn "$target" "$bin/cluster-proxy"
echo "==> cluster-proxy on PATH: $bin/cluster-proxy -> $target"
case ":$(bash -lc 'echo "$PATH"' 2>/dev/null):" in
  *":$bin:"*) ;;
  *) echo "note: $bin is not on a login shell's PATH; add it there: export PATH=\"$bin:\$PATH\"" ;;
esac
