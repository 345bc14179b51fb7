#!/usr/bin/env bash
# Set up, lint (ruff, mypy) and run the whole test suite in parallel. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev >&2
.venv/bin/ruff check .
.venv/bin/python scripts/typecheck.py
# One worker per core; --dist loadscope keeps each module (and its module-scoped fixtures, such as the
# README's one doc session) on one worker. Fixtures shared across modules are file-locked caches
# (tests/shared_cache.py), built once per run whatever the number of workers.
exec .venv/bin/python -m pytest -n auto --dist loadscope "$@"
