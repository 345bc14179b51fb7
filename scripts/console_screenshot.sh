#!/usr/bin/env bash
# Refresh docs/console.png, the README's console screenshot, from the browser test
# (tests/ota/test_console_browser.py: a real server, mosquitto and agents, in Debian's chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
shots="$(mktemp -d)"
trap 'rm -rf "$shots"' EXIT
EDGESDK_SCREENSHOTS="$shots" .venv/bin/python -m pytest tests/ota/test_console_browser.py -q -p no:cacheprovider
cp "$shots/rollout-live.png" docs/console.png
echo "wrote docs/console.png (the other pages' screenshots were in $shots)"
