#!/usr/bin/env bash
# Regenerates examples/ts/gen/ (the TypeScript client example's stubs) from
# proto/ with the pinned tools: buf from scripts/tools.sh, protoc-gen-es from
# examples/ts/node_modules (pinned in its package.json and package-lock.json).
# Usage: scripts/gen-ts.sh   (needs `npm ci --prefix examples/ts` first)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tools.sh
install_tool buf
export PATH="$TOOLS_BIN:$PATH"

if [[ ! -x examples/ts/node_modules/.bin/protoc-gen-es ]]; then
  echo "examples/ts/node_modules has no protoc-gen-es: run npm ci --prefix examples/ts" >&2
  exit 1
fi
cd examples/ts
buf generate # buf.gen.yaml: clean, then generate
echo "generated examples/ts/gen/ from proto/" >&2
