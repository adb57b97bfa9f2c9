#!/usr/bin/env bash
# Installs what the project needs on a fresh machine that has only Node 20 and npm: Node 24 (npm's `node`
# package ships the binary), pnpm (from the npm registry), node modules, and the Debian packages the tests
# and benchmarks use. Sourced: everything after it (pnpm, vitest, the processes tests spawn, the bench)
# runs on the Node it puts first on PATH.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.local/bin:$PATH"

# Node: the supported LTS line. A machine whose node is older gets this exact version inside the checkout
# (.cluster-proxy/ is ignored by git), installed once and reused.
NODE_VERSION=24.21.0
NODE_MIN_MAJOR=24
if [ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -lt "$NODE_MIN_MAJOR" ]; then
  node_dir="$PWD/.cluster-proxy/node-$NODE_VERSION"
  if [ "$("$node_dir/node_modules/node/bin/node" --version 2>/dev/null)" != "v$NODE_VERSION" ]; then
    echo "==> installing node $NODE_VERSION (npm's node package) into $node_dir"
    rm -rf "$node_dir"
    mkdir -p "$node_dir"
    npm install --prefix "$node_dir" --no-save --no-audit --no-fund --loglevel=error "node@$NODE_VERSION" >/dev/null
    [ "$("$node_dir/node_modules/node/bin/node" --version 2>/dev/null)" = "v$NODE_VERSION" ] \
      || { echo "error: npm's node@$NODE_VERSION did not install a working node binary" >&2; return 1 2>/dev/null || exit 1; }
  fi
  # npm runs on the node first on PATH and would take that node's directory as its global prefix: keep the
  # machine's (where `npm install -g` and scripts/install-cli.sh put commands on a login shell's PATH).
  npm_prefix="${NPM_CONFIG_PREFIX:-$(npm prefix -g 2>/dev/null || true)}"
  [ -n "$npm_prefix" ] && export NPM_CONFIG_PREFIX="$npm_prefix"
  export PATH="$node_dir/node_modules/node/bin:$PATH"
  hash -r
fi
echo "==> node $(node --version) ($(command -v node))"

PNPM_VERSION=10.34.8
if ! command -v pnpm >/dev/null 2>&1 || [ "$(pnpm --version 2>/dev/null)" != "$PNPM_VERSION" ]; then
  echo "==> installing pnpm $PNPM_VERSION"
  # corepack's signature check fails on some machines; npm is always there.
  npm install -g "pnpm@$PNPM_VERSION" >/dev/null 2>&1 || npm install -g --prefix "$HOME/.local" "pnpm@$PNPM_VERSION" >/dev/null
  hash -r
fi

# Debian packages: python3 (blackhole fixture, Python client test), curl (real-client tests), squid
# (the corporate proxy), iproute2 (network namespaces), haproxy (the load balancer of the HA test). Best effort when not root.
need=()
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v squid >/dev/null 2>&1 || [ -x /usr/sbin/squid ] || need+=(squid)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
if [ "${CLUSTER_PROXY_SKIP_APT:-}" != "1" ] && [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> apt-get install ${need[*]}"
    # Install from the cached lists first; refresh them only if that fails.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; }
  else
    echo "warning: missing ${need[*]} and cannot apt-get install them" >&2
  fi
fi

# Optional tools, each checked by one test that says why it skipped without it, so a failed install only
# warns: systemd-analyze (the drop-ins of `proxy-config render --format systemd`), buildah (the OCI image).
optional=()
command -v systemd-analyze >/dev/null 2>&1 || optional+=(systemd)
command -v buildah >/dev/null 2>&1 || optional+=(buildah)
if [ "${CLUSTER_PROXY_SKIP_APT:-}" != "1" ] && [ ${#optional[@]} -gt 0 ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> apt-get install ${optional[*]} (optional)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${optional[@]}" >/dev/null 2>&1 \
    || echo "warning: could not install ${optional[*]}; the tests that use them will say so" >&2
fi

echo "==> pnpm install"
pnpm install --frozen-lockfile --reporter=silent
