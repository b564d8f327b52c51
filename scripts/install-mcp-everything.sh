#!/usr/bin/env bash
# Installs the reference TypeScript MCP server, pinned, into .tools/npm for
# the interop tests (internal/registry/interop_test.go), and the TypeScript
# SDK it is built on, pinned too: its OAuth example server is what the
# OAuth interop test and the README's OAuth section run.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=2026.8.31
SDK_VERSION=1.32.2
dir=.tools/npm
pkg=$dir/node_modules/@modelcontextprotocol/server-everything/package.json
sdk=$dir/node_modules/@modelcontextprotocol/sdk/package.json
if [[ -f $pkg && -f $sdk ]] && grep -q "\"version\": \"$VERSION\"" "$pkg" && grep -q "\"version\": \"$SDK_VERSION\"" "$sdk"; then
  exit 0
fi
echo "installing @modelcontextprotocol/server-everything@$VERSION into $dir" >&2
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error \
  "@modelcontextprotocol/server-everything@$VERSION" "@modelcontextprotocol/sdk@$SDK_VERSION"
