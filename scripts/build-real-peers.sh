#!/usr/bin/env bash
# Builds the real Kubernetes control plane the tests run against (test/src/fixtures/real-kube.ts): etcd,
# kube-apiserver and kube-controller-manager, from their Go modules at the versions pinned in
# test/real-k8s/go.mod (the one place the pins live); and OCM's hub and klusterlet programs, OCM's cluster-proxy
# addon manager and Helm
# (test/src/fixtures/real-ocm.ts, test/e2e/real-ocm.test.ts) pinned in test/real-ocm/go.mod. Each binary goes to
# $CLUSTER_PROXY_PEERS_CACHE (default ~/.cache/cluster-proxy/real-peers)/<name>-<version>/<name>, outside
# git and shared by every clone on the machine, and is built only when that file is missing, so a moved pin
# builds anew and everything else is reused; current.json there then names the binaries of
# the current pins (what the fixture starts). Prints what it did and how long it took.
#
#   bash scripts/build-real-peers.sh                      # build what is missing
#   bash scripts/build-real-peers.sh --pin k8s.io/kubernetes@v1.35.4   # move a pin (also go.etcd.io/etcd/server/v3@v3.6.5,
#                                                                     # open-cluster-management.io/ocm@…, helm.sh/helm/v3@…)
#
# Needs a Go toolchain of at least the go.mod's `go` line: the machine's `go` when it has one of 1.21 or later
# (it fetches a newer toolchain itself when go.mod asks for one), else Go's own toolchain module from the Go
# module proxy, unpacked once into that cache's go-<version>/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
MOD="$ROOT/test/real-k8s"
# Outside the checkout, so every clone on this machine (CI's fresh one too) reuses the builds.
CACHE="${CLUSTER_PROXY_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cluster-proxy/real-peers}"
BOOTSTRAP_GO=1.26.8
mkdir -p "$CACHE"

# A Go toolchain: go 1.21+ switches to the toolchain go.mod needs by itself (GOTOOLCHAIN=auto).
go_ok() { command -v go >/dev/null 2>&1 && go version 2>/dev/null | grep -Eq 'go1\.(2[1-9]|[3-9][0-9])'; }
if ! go_ok; then
  gdir="$CACHE/go-$BOOTSTRAP_GO"
  if [ ! -x "$gdir/go/bin/go" ]; then
    echo "==> fetching the Go $BOOTSTRAP_GO toolchain from the Go module proxy into $gdir"
    arch="$(uname -m)"; case "$arch" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; esac
    zip="$CACHE/go-$BOOTSTRAP_GO.zip"
    curl -fsSL -o "$zip" "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go$BOOTSTRAP_GO.linux-$arch.zip"
    rm -rf "$gdir.tmp" && mkdir -p "$gdir.tmp"
    python3 -c 'import sys, zipfile, os
z = zipfile.ZipFile(sys.argv[1])
for i in z.infolist():
    p = z.extract(i, sys.argv[2])
    mode = (i.external_attr >> 16) & 0o777
    if mode: os.chmod(p, mode)' "$zip" "$gdir.tmp"
    # The module zip holds golang.org/toolchain@v0.0.1-go…/ with GOROOT's content inside.
    mv "$gdir.tmp"/golang.org/toolchain@*/ "$gdir.tmp/go" && rm -rf "$gdir.tmp/golang.org"
    rm -rf "$gdir" && mv "$gdir.tmp" "$gdir" && rm -f "$zip"
  fi
  export PATH="$gdir/go/bin:$PATH"
  export GOTOOLCHAIN=local
fi

if [ "${1:-}" = "--pin" ]; then
  # MODULE@VERSION: kubernetes also moves its staging modules (k8s.io/api … at v0.X.Y for v1.X.Y).
  spec="${2:?usage: --pin MODULE@VERSION}"; module="${spec%@*}"; version="${spec#*@}"
  case "$module" in
    open-cluster-management.io/*|helm.sh/*)
      # OCM's module and some of its dependencies are not in sum.golang.org: go.sum holds what the proxy served.
      cd "$ROOT/test/real-ocm"
      export GONOSUMDB="${GONOSUMDB:+$GONOSUMDB,}open-cluster-management.io,sigs.k8s.io/about-api"
      go mod edit -require="$module@$version"
      go mod tidy
      echo "pinned $module@$version; now: bash scripts/build-real-peers.sh"
      exit 0 ;;
  esac
  cd "$MOD"
  go mod edit -require="$module@$version"
  if [ "$module" = "k8s.io/kubernetes" ]; then
    go mod download "k8s.io/kubernetes@$version"
    upstream="$(go env GOMODCACHE)/k8s.io/kubernetes@$version/go.mod"
    staging="v0.${version#v1.}"
    for m in $(sed -n '/^replace (/,/^)/p' "$upstream" | awk '$2 == "=>" && $3 ~ /^\.\/staging/ {print $1}'); do
      go mod edit -replace="$m=$m@$staging"
    done
  fi
  go mod tidy
  echo "pinned $module@$version; now: bash scripts/build-real-peers.sh"
  exit 0
fi

cd "$MOD"
version_of() { go list -m -f '{{.Version}}' "$1"; }
KUBE_VERSION="$(version_of k8s.io/kubernetes)"
ETCD_VERSION="$(version_of go.etcd.io/etcd/server/v3)"
# name, version, Go package[, module directory (default test/real-k8s)]
PEERS=(
  "etcd $ETCD_VERSION go.etcd.io/etcd/server/v3"
  "kube-apiserver $KUBE_VERSION k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager $KUBE_VERSION k8s.io/kubernetes/cmd/kube-controller-manager"
)
# -ldflags per binary name (version stamps).
declare -A LDFLAGS=()
# "key": "version" pairs for current.json's versions.
VERSIONS=("\"kubernetes\": \"$KUBE_VERSION\"" "\"etcd\": \"$ETCD_VERSION\"")

# --- OCM's hub and klusterlet programs and Helm (test/real-ocm/go.mod) ---------------------------------
OCM_MOD="$ROOT/test/real-ocm"
OCM_VERSION="$(cd "$OCM_MOD" && version_of open-cluster-management.io/ocm)"
HELM_VERSION="$(cd "$OCM_MOD" && version_of helm.sh/helm/v3)"
for p in registration work addon placement; do
  PEERS+=("ocm-$p $OCM_VERSION open-cluster-management.io/ocm/cmd/$p $OCM_MOD")
  # What OCM's own build stamps (its Makefile: pkg/version), so the programs report their release.
  ov=open-cluster-management.io/ocm/pkg/version; om="${OCM_VERSION#v}"
  LDFLAGS[ocm-$p]="-X $ov.versionFromGit=$OCM_VERSION -X $ov.majorFromGit=${om%%.*} -X $ov.minorFromGit=$(echo "$om" | cut -d. -f2)"
done
# OCM's own cluster-proxy addon manager (what OCM's cluster-proxy chart runs on the hub): the migration test
# (test/e2e/real-ocm-migration.test.ts) moves a hub from it to ours and back.
OCM_CP_VERSION="$(cd "$OCM_MOD" && version_of open-cluster-management.io/cluster-proxy)"
PEERS+=("ocm-cluster-proxy $OCM_CP_VERSION open-cluster-management.io/cluster-proxy/cmd/addon-manager $OCM_MOD")
PEERS+=("helm $HELM_VERSION helm.sh/helm/v3/cmd/helm $OCM_MOD")
LDFLAGS[helm]="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
VERSIONS+=("\"ocm\": \"$OCM_VERSION\"" "\"ocm-cluster-proxy\": \"$OCM_CP_VERSION\"" "\"helm\": \"$HELM_VERSION\"")
# --------------------------------------------------------------------------------------------------------

# One build at a time (test files may ask at once); whoever waited finds the binaries there.
exec 9>"$CACHE/.lock"
flock 9
start=$SECONDS
built=()
for p in "${PEERS[@]}"; do
  read -r name version pkg dir <<<"$p"
  out="$CACHE/$name-$version"
  [ -x "$out/$name" ] && continue
  echo "==> building $name $version ($pkg)"
  mkdir -p "$out"
  tmp="$(mktemp -d "$CACHE/.build-XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  # -trimpath: the binaries do not depend on where the checkout is. Kubernetes' own build stamps its version
  # (kube-apiserver's /version, the clients' user agent); a plain go build would say v0.0.0-master.
  ldflags="${LDFLAGS[$name]:-}"
  if [ "$version" = "$KUBE_VERSION" ]; then
    minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
    for vp in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $vp.gitVersion=$KUBE_VERSION -X $vp.gitMajor=1 -X $vp.gitMinor=$minor -X $vp.gitTreeState=clean"
    done
  fi
  (cd "${dir:-$MOD}" && nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$tmp/$name" "$pkg")
  mv "$tmp/$name" "$out/$name"
  rmdir "$tmp"
  trap - EXIT
  built+=("$name")
done
if [ ${#built[@]} -gt 0 ]; then
  echo "==> real peers: built ${built[*]} in $((SECONDS - start)) s (${VERSIONS[*]//\"/}) into $CACHE"
else
  echo "==> real peers: ${VERSIONS[*]//\"/} already built in $CACHE ($((SECONDS - start)) s)"
fi
# ---- ANP's own programs (test/anp-go): proxy-server, proxy-agent and our konnectivity-probe, built against
# sigs.k8s.io/apiserver-network-proxy at two versions: go.mod pins the current release, claimed.mod (-modfile)
# the version our compatibility claim names (docs/testing.md says why). Same cache layout: <name>-<version>/<name>.
ANP_MOD="$ROOT/test/anp-go"
ANP_PEERS=()
anp_start=$SECONDS
anp_built=()
for modfile in go.mod claimed.mod; do
  anp_version="$(cd "$ANP_MOD" && GONOSUMDB=sigs.k8s.io/apiserver-network-proxy go list -modfile="$modfile" -m -f '{{.Version}}' sigs.k8s.io/apiserver-network-proxy)"
  for p in "proxy-server sigs.k8s.io/apiserver-network-proxy/cmd/server" \
    "proxy-agent sigs.k8s.io/apiserver-network-proxy/cmd/agent" \
    "konnectivity-probe ./cmd/konnectivity-probe"; do
    read -r name pkg <<<"$p"
    dir="$name-$anp_version"
    # Our own program is also keyed by its source, so an edit to it builds anew.
    if [ "$name" = konnectivity-probe ]; then
      dir+="-$(cat "$ANP_MOD/$modfile" "$ANP_MOD"/cmd/konnectivity-probe/*.go | sha256sum | cut -c1-12)"
    fi
    ANP_PEERS+=("$name-$anp_version $name $dir")
    out="$CACHE/$dir"
    [ -x "$out/$name" ] && continue
    echo "==> building $name $anp_version ($pkg, $modfile)"
    mkdir -p "$out"
    tmp="$(mktemp -d "$CACHE/.build-XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    # ANP's tags are not in the checksum database; go.sum / claimed.sum pin the hashes instead.
    (cd "$ANP_MOD" && GONOSUMDB=sigs.k8s.io/apiserver-network-proxy GOFLAGS="-mod=readonly -buildvcs=false" \
      nice -n 10 go build -modfile="$modfile" -trimpath -o "$tmp/$name" "$pkg")
    mv "$tmp/$name" "$out/$name"
    rmdir "$tmp"
    trap - EXIT
    anp_built+=("$dir")
  done
done
echo "==> ANP peers: ${anp_built[*]:-nothing to build} ($((SECONDS - anp_start)) s) into $CACHE"
# ---- end of ANP's programs

# What the fixture reads: the pins now in go.mod and their binaries.
{
  echo "{"
  vs="$(printf '%s, ' "${VERSIONS[@]}")"
  echo "  \"versions\": { ${vs%, } },"
  echo "  \"binaries\": {"
  for i in "${!PEERS[@]}"; do
    read -r name version _ <<<"${PEERS[$i]}"
    sep=,; [ "$i" -eq $((${#PEERS[@]} - 1)) ] && sep=
    echo "    \"$name\": \"$CACHE/$name-$version/$name\"$sep"
  done
  echo "  },"
  # ANP's programs by name and version: "anp": { "proxy-server-v0.36.0": "…", … }
  echo "  \"anp\": {"
  for i in "${!ANP_PEERS[@]}"; do
    read -r key name dir <<<"${ANP_PEERS[$i]}"
    sep=,; [ "$i" -eq $((${#ANP_PEERS[@]} - 1)) ] && sep=
    echo "    \"$key\": \"$CACHE/$dir/$name\"$sep"
  done
  echo "  }"
  echo "}"
} >"$CACHE/current.json.tmp"
mv "$CACHE/current.json.tmp" "$CACHE/current.json"
