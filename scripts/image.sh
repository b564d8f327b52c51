#!/usr/bin/env bash
# Builds connector-svc's container image with ko (github.com/google/ko), without a Docker engine, then checks it.
#
#   scripts/image.sh           the image as a tarball, .dev/image/connector-svc.tar (docker load / podman load take
#                              it), checked offline by deploy/image (labels, user, entrypoint, files)  [make image]
#   scripts/image.sh --push    built the same way and pushed to $KO_DOCKER_REPO (a registry you can push to, logged
#                              in with docker login or a credential helper); prints the pushed reference with its
#                              digest                                                                  [make image-push]
#
# The base. By default (IMAGE_BASE=local) the base is made here, from nothing, as a distroless "static" image is:
# /etc/passwd and /etc/group with the nonroot user (65532), /etc/nsswitch.conf, /tmp, /home/nonroot, and the CA
# certificates of this machine (/etc/ssl/certs/ca-certificates.crt), in one layer; no shell, no package manager, no
# libc, no Node.js. ko pulls base images from a registry, and none with base images is reachable where CI runs, so
# this script serves the made base from a registry of its own (crane registry serve, in memory, on 127.0.0.1, for
# the length of the build). IMAGE_BASE=<reference> builds on a base pulled from a registry instead, e.g.
# gcr.io/distroless/static-debian12:nonroot (what .ko.yaml names for a plain `ko build`), or
# node:22.21.1-bookworm-slim to have npx for stdio connectors as the Dockerfile's image has.
#
# Settings: VERSION (default: git describe --tags --always --dirty), REVISION (git rev-parse HEAD), SOURCE_DATE_EPOCH
# (the commit's time: the image's created time), KO_DOCKER_REPO (default connector-svc for the tarball; required for
# --push), IMAGE_TARBALL (default .dev/image/connector-svc.tar), IMAGE_PLATFORM (default linux/amd64).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tools.sh
# Pinned like the other tools (scripts/tools.sh); crane is the go-containerregistry release ko v0.19.1 builds with.
TOOL_PKG[ko]=github.com/google/ko@v0.19.1
TOOL_PKG[crane]=github.com/google/go-containerregistry/cmd/crane@v0.21.7

push=false
case "${1:-}" in
  --push) push=true ;;
  "") ;;
  *) echo "usage: scripts/image.sh [--push]" >&2; exit 2 ;;
esac

install_tool ko
install_tool crane
KO="$TOOLS_BIN/ko"
CRANE="$TOOLS_BIN/crane"

VERSION="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}"
REVISION="${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
CREATED="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
TAG="${VERSION#v}"                 # v-less, as the chart's appVersion names it
IMAGE_TARBALL="${IMAGE_TARBALL:-.dev/image/connector-svc.tar}"
IMAGE_PLATFORM="${IMAGE_PLATFORM:-linux/amd64}"
IMAGE_BASE="${IMAGE_BASE:-local}"
local_base=false; [[ "$IMAGE_BASE" == local ]] && local_base=true
SOURCE_URL="https://github.com/connector-svc/connector-svc"
export VERSION REVISION SOURCE_DATE_EPOCH

if $push; then
  : "${KO_DOCKER_REPO:?set KO_DOCKER_REPO to the repository to push to, e.g. registry.example.com/connector-svc}"
  case "$KO_DOCKER_REPO" in ko.local*|kind.local*)
    echo "KO_DOCKER_REPO=$KO_DOCKER_REPO loads into a Docker engine or kind; name a registry to push to" >&2; exit 2 ;;
  esac
else
  # Not ko.local: ko would load that into a Docker engine, and there is none.
  KO_DOCKER_REPO="${KO_DOCKER_REPO:-connector-svc}"
fi
export KO_DOCKER_REPO

work="$(mktemp -d)"
registry_pid=""
cleanup() {
  if [[ -n "$registry_pid" ]]; then kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

if $local_base; then
  certs=/etc/ssl/certs/ca-certificates.crt
  [[ -s "$certs" ]] || { echo "error: $certs is missing: install ca-certificates (the image's CA bundle comes from it)" >&2; exit 1; }
  root="$work/rootfs"
  mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$root/etc/group"
  echo 'hosts: files dns' >"$root/etc/nsswitch.conf"
  cp "$certs" "$root/etc/ssl/certs/ca-certificates.crt"
  chmod 0755 "$root/etc" "$root/etc/ssl" "$root/etc/ssl/certs" "$root/home"
  chmod 0644 "$root/etc/passwd" "$root/etc/group" "$root/etc/nsswitch.conf" "$root/etc/ssl/certs/ca-certificates.crt"
  chmod 1777 "$root/tmp"
  chmod 0700 "$root/home/nonroot"
  # Root owns everything but the nonroot user's home; fixed times and order, so the layer depends on the CA
  # bundle alone.
  tarflags=(--sort=name --mtime=@0 --numeric-owner --format=gnu -C "$root")
  tar -cf "$work/base.tar" --owner=0 --group=0 --exclude=home/nonroot "${tarflags[@]}" etc tmp home
  tar -rf "$work/base.tar" --owner=65532 --group=65532 "${tarflags[@]}" home/nonroot
  gzip -n -9 "$work/base.tar"

  "$CRANE" registry serve --address 127.0.0.1:0 >"$work/registry.log" 2>&1 &
  registry_pid=$!
  port=""
  for _ in $(seq 100); do
    port="$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/registry.log")"
    [[ -n "$port" ]] && break
    kill -0 "$registry_pid" 2>/dev/null || { cat "$work/registry.log" >&2; exit 1; }
    sleep 0.1
  done
  [[ -n "$port" ]] || { echo "error: crane registry serve did not say its port:" >&2; cat "$work/registry.log" >&2; exit 1; }
  base="127.0.0.1:$port/connector-svc-base:static"
  crane() { "$CRANE" "$@" 2>>"$work/crane.log" || { cat "$work/crane.log" >&2; return 1; }; }
  crane append --oci-empty-base -f "$work/base.tar.gz" -t "$base" >/dev/null
  crane mutate "$base" --set-platform "$IMAGE_PLATFORM" --user 65532:65532 --workdir /home/nonroot \
    -e PATH=/usr/local/bin:/usr/bin:/bin -e SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt -t "$base" >/dev/null
  IMAGE_BASE="127.0.0.1:$port/connector-svc-base@$(crane digest "$base")"
fi
export KO_DEFAULTBASEIMAGE="$IMAGE_BASE"

labels=(
  "org.opencontainers.image.title=connector-svc"
  # ko splits --image-label at commas: none in a value.
  "org.opencontainers.image.description=Persistent MCP connector agents for a chat backend over gRPC"
  "org.opencontainers.image.licenses=Apache-2.0"
  "org.opencontainers.image.source=$SOURCE_URL"
  "org.opencontainers.image.version=$VERSION"
  "org.opencontainers.image.revision=$REVISION"
  "org.opencontainers.image.created=$CREATED"
)
args=(build ./cmd/connector-svc --bare --tags "$TAG" --platform "$IMAGE_PLATFORM" --image-user 65532:65532 --sbom none)
for l in "${labels[@]}"; do args+=(--image-label "$l"); done

start=$SECONDS
if $push; then
  ref="$("$KO" "${args[@]}" --push=true)"
  echo "pushed $ref ($((SECONDS - start)) s); with the chart: --set image.repository=$KO_DOCKER_REPO --set image.digest=${ref##*@}"
else
  mkdir -p "$(dirname "$IMAGE_TARBALL")"
  "$KO" "${args[@]}" --push=false --tarball "$IMAGE_TARBALL" >/dev/null
  echo "built $KO_DOCKER_REPO:$TAG into $IMAGE_TARBALL ($(du -k "$IMAGE_TARBALL" | cut -f1) KiB, $((SECONDS - start)) s) on base $IMAGE_BASE"
  go run ./deploy/image -tarball "$IMAGE_TARBALL" -version "$VERSION" -revision "$REVISION" -source "$SOURCE_URL" \
    -local-base="$local_base"
fi
