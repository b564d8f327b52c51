#!/usr/bin/env bash
# Runs the benchmarks side by side in one run and ends with a table of the
# goals they state (internal/benchgoal): each goal's measured value and
# whether it is met. The whole output is kept in .dev/bench.txt.
# Usage: scripts/bench.sh [go test flags, e.g. -bench Query]
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .dev
out=.dev/bench.txt
pkgs=(./internal/registry ./internal/server ./internal/auth ./internal/oauth ./internal/sampling)
flags=(-run '^$' -bench . -benchtime 2s -timeout 30m)
if [ $# -gt 0 ]; then flags=(-run '^$' -benchtime 2s -timeout 30m "$@"); fi
echo "benchmarks of $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores" | tee "$out"
status=0
go test "${flags[@]}" "${pkgs[@]}" 2>&1 | tee -a "$out" || status=$?
echo
echo "Goals (from this run):"
goals=$(grep -h 'GOAL ' "$out" | sed 's/^.*GOAL //' | sort -u || true)
if [ -z "$goals" ]; then
  echo "  (no goal was measured)"
else
  echo "$goals" | sed 's/^/  /'
  met=$(echo "$goals" | grep -c ' met$' || true)
  echo "  $met of $(echo "$goals" | wc -l) goals met"
fi
exit $status
