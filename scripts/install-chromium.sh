#!/usr/bin/env bash
# Installs Debian's Chromium for the console's browser tests (chromedp drives
# it headless; nothing is downloaded by the tests themselves). A no-op when a
# Chromium is on PATH already.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  echo "chromium: $(chromium --version 2>/dev/null || chromium-browser --version)"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y --no-install-recommends chromium >/tmp/chromium-install.log 2>&1; then
  $SUDO apt-get update >/dev/null
  $SUDO apt-get install -y --no-install-recommends chromium
fi
echo "chromium: $(chromium --version)"
