#!/usr/bin/env bash
# Set up and run the whole test suite (unit + integration). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev >&2
exec .venv/bin/python -m pytest "$@"
