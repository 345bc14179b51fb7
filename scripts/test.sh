#!/usr/bin/env bash
# Set up, lint (ruff, mypy) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev >&2
.venv/bin/ruff check .
.venv/bin/python scripts/typecheck.py
exec .venv/bin/python -m pytest "$@"
