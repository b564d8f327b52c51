#!/usr/bin/env bash
# Pinned developer tools, installed with `go install` into .tools/bin.
# Usage: scripts/tools.sh NAME...   (buf, protoc-gen-go, protoc-gen-go-grpc, grpcurl, helm)
# gen.sh sources this file for install_tool.
set -euo pipefail

TOOLS_BIN="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.tools/bin"

declare -A TOOL_PKG=(
  [buf]=github.com/bufbuild/buf/cmd/buf@v1.75.0
  [protoc-gen-go]=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
  [protoc-gen-go-grpc]=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
  [grpcurl]=github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4
  # helm lints and renders deploy/helm/connector-svc (make chart); built from source, about 2 min the first time.
  [helm]=helm.sh/helm/v3/cmd/helm@v3.22.0
)

# install_tool NAME: go install the pinned version unless .tools/bin has it.
install_tool() {
  local name=$1 pkg=${TOOL_PKG[$1]:?unknown tool $1} stamp="$TOOLS_BIN/.$1.version"
  mkdir -p "$TOOLS_BIN"
  if [[ -x "$TOOLS_BIN/$name" && "$(cat "$stamp" 2>/dev/null)" == "$pkg" ]]; then
    return
  fi
  echo "installing $pkg" >&2
  GOBIN="$TOOLS_BIN" go install "$pkg"
  echo "$pkg" >"$stamp"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  for t in "$@"; do install_tool "$t"; done
fi
