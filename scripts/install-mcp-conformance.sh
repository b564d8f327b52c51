#!/usr/bin/env bash
# Installs the official MCP conformance suite (@modelcontextprotocol/conformance),
# the TypeScript SDK, and what the suite's vendored fixture server runs on
# (tsx, express, cors, zod), pinned by internal/mcpserve/testdata/node/package-lock.json,
# into that directory's node_modules, for the mcpserve tests
# (internal/mcpserve/mcpservetest drives the MCP endpoint with them). Does
# nothing when every dependency package.json pins is installed at its version.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=internal/mcpserve/testdata/node
if node -e '
  const fs = require("fs");
  const deps = JSON.parse(fs.readFileSync(process.argv[1] + "/package.json", "utf8")).dependencies;
  for (const [name, version] of Object.entries(deps)) {
    const pkg = process.argv[1] + "/node_modules/" + name + "/package.json";
    if (!fs.existsSync(pkg) || JSON.parse(fs.readFileSync(pkg, "utf8")).version !== version) process.exit(1);
  }
' "$dir" 2>/dev/null; then
  exit 0
fi
echo "installing the MCP conformance suite and TypeScript SDK (pinned) into $dir/node_modules" >&2
npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
