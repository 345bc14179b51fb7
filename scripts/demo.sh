#!/usr/bin/env bash
# Set up and run the end-to-end demo: build a model, detect the device, run and benchmark it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev >&2
exec .venv/bin/python examples/quickstart.py "$@"
