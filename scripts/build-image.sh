#!/usr/bin/env bash
# Builds the cluster-proxy OCI image without a Docker daemon, with buildah (Debian's package; storage vfs,
# isolation chroot, so it works unprivileged-ish in containers and CI):
#   bash scripts/build-image.sh [OUT_DIR]        (default .cluster-proxy/image)
# FROM scratch: the Node runtime of this machine (the `node` binary and the shared libraries `ldd` lists)
# and the CLI installed from `node scripts/pack.mjs`'s tarball into /app. Result: the image
# $CLUSTER_PROXY_IMAGE (default localhost/cluster-proxy:VERSION) in buildah's local storage, and
# OUT_DIR/cluster-proxy.oci.tar (an OCI archive: `podman load`, `skopeo copy oci-archive:… docker://…`).
# deploy/Dockerfile builds the same CLI on node:24-slim where Docker Hub is reachable (it is not on our
# build machines).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="$(mkdir -p "${1:-.cluster-proxy/image}" && cd "${1:-.cluster-proxy/image}" && pwd)"
VERSION="$(node -p "require('./cli/package.json').version")"
TAG="${CLUSTER_PROXY_IMAGE:-localhost/cluster-proxy:$VERSION}"
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot

if ! command -v buildah >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> apt-get install buildah"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null; }
  else
    echo "build-image: buildah is not installed (Debian: apt-get install buildah)" >&2
    exit 1
  fi
fi

stage="$(mktemp -d)"
container=""
cleanup() {
  [ -n "$container" ] && buildah rm "$container" >/dev/null 2>&1 || true
  rm -rf "$stage"
}
trap cleanup EXIT

echo "==> pack"
node scripts/pack.mjs "$stage/pack" >/dev/null
rootfs="$stage/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/app" "$rootfs/tmp" "$rootfs/home/nonroot"
chmod 1777 "$rootfs/tmp"

echo "==> node runtime from $(command -v node) ($(node --version))"
node_bin="$(readlink -f "$(command -v node)")"
cp "$node_bin" "$rootfs/usr/local/bin/node"
for lib in $(ldd "$node_bin" | grep -o '/[^ ]*'); do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$rootfs/etc/group"
# Group 0 owns what the process may write, group-writable: OpenShift runs the image as an arbitrary UID in group 0.
chown 65532:0 "$rootfs/home/nonroot"
chmod 0775 "$rootfs/home/nonroot"

echo "==> cluster-proxy into /app (npm install --offline: every dependency is in the tarball)"
npm install -g --prefix "$rootfs/app" --offline --cache "$stage/npm-cache" --no-audit --no-fund --loglevel=error "$stage"/pack/*.tgz >/dev/null

echo "==> buildah: from scratch, commit $TAG"
container="$(buildah from scratch)"
buildah copy --quiet "$container" "$rootfs" / >/dev/null
buildah config \
  --entrypoint '["/usr/local/bin/node", "--max-semi-space-size=2", "--initial-old-space-size=64", "/app/lib/node_modules/cluster-proxy/bin/cluster-proxy.js"]' \
  --cmd '["--help"]' \
  --user 65532:65532 --workingdir /home/nonroot \
  --env NODE_ENV=production --env PATH=/app/bin:/usr/local/bin --env HOME=/home/nonroot \
  --label org.opencontainers.image.title=cluster-proxy --label "org.opencontainers.image.version=$VERSION" \
  "$container"
buildah commit --quiet --format oci --rm "$container" "$TAG" >/dev/null
container=""
rm -f "$OUT/cluster-proxy.oci.tar"
buildah push --quiet "$TAG" "oci-archive:$OUT/cluster-proxy.oci.tar:$TAG" >/dev/null
echo "==> $TAG ($(du -h "$OUT/cluster-proxy.oci.tar" | cut -f1)): $OUT/cluster-proxy.oci.tar"
