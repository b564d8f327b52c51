#!/usr/bin/env bash
# Regenerates gen/ from proto/ with pinned tool versions.
# Usage: scripts/gen.sh          (generate)
#        scripts/gen.sh --lint   (buf lint only)
set -euo pipefail
cd "$(dirname "$0")/.."

BUF_VERSION=v1.75.0
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

bin="$PWD/.tools/bin"
mkdir -p "$bin"
export PATH="$bin:$PATH"

# install NAME PACKAGE VERSION: go install unless .tools/bin already has that version.
install() {
  local name=$1 pkg=$2 version=$3 stamp="$bin/.$1.version"
  if [[ -x "$bin/$name" && "$(cat "$stamp" 2>/dev/null)" == "$version" ]]; then
    return
  fi
  echo "installing $name $version" >&2
  GOBIN="$bin" go install "$pkg@$version"
  echo "$version" >"$stamp"
}

install buf github.com/bufbuild/buf/cmd/buf "$BUF_VERSION"
install protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
install protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"

buf lint
if [[ "${1:-}" == "--lint" ]]; then
  exit 0
fi
rm -rf gen
buf generate
echo "generated gen/ from proto/" >&2
