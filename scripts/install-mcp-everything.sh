#!/usr/bin/env bash
# Installs the reference TypeScript MCP server, pinned, into .tools/npm for
# the interop tests (internal/registry/interop_test.go).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=2026.8.31
dir=.tools/npm
pkg=$dir/node_modules/@modelcontextprotocol/server-everything/package.json
if [[ -f $pkg ]] && grep -q "\"version\": \"$VERSION\"" "$pkg"; then
  exit 0
fi
echo "installing @modelcontextprotocol/server-everything@$VERSION into $dir" >&2
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error \
  "@modelcontextprotocol/server-everything@$VERSION"
