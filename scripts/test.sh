#!/usr/bin/env bash
# Set up, lint (ruff, mypy) and run the whole test suite in parallel. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev >&2
.venv/bin/ruff check .
.venv/bin/python scripts/typecheck.py
# Two workers per core, at most 8: most of the suite waits (on brokers, servers, agents and their timeouts) rather
# than computes, so one worker per core left the cores half idle (here, 2 cores: 606 s with 2 workers, 442 s with 4);
# the cap keeps a big runner's memory in bounds (a TensorFlow conversion takes about 2 GB).
# --dist loadscope keeps each module (and its module-scoped fixtures, such as the README's one doc session) on one
# worker. Fixtures shared across modules are file-locked caches (tests/shared_cache.py), built once per run whatever
# the number of workers. --durations shows where the time goes.
workers=$(( $(nproc) * 2 ))
exec .venv/bin/python -m pytest -n "$(( workers < 8 ? workers : 8 ))" --dist loadscope --durations=20 "$@"
