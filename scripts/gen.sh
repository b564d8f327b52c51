#!/usr/bin/env bash
# Regenerates gen/ from proto/ with the pinned tools of scripts/tools.sh.
# Usage: scripts/gen.sh          (buf lint, then generate)
#        scripts/gen.sh --lint   (buf lint only)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tools.sh
for t in buf protoc-gen-go protoc-gen-go-grpc; do install_tool "$t"; done
export PATH="$TOOLS_BIN:$PATH"

buf lint
if [[ "${1:-}" == "--lint" ]]; then
  exit 0
fi
rm -rf gen
buf generate
echo "generated gen/ from proto/" >&2
