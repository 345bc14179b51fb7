#!/usr/bin/env bash
# Build the documentation site into site/ (`bash scripts/docs.sh`), or serve it at http://127.0.0.1:8000 and rebuild
# on every change (`bash scripts/docs.sh serve`), or build it and refresh docs/site.png, its start page as headless
# chromium shows it (`bash scripts/docs.sh screenshot`; Debian's chromium). Extra arguments go to mkdocs. From a fresh clone it first makes
# .venv with edgesdk and the [docs] extra (scripts/setup.sh dev, as the test command runs it, includes that extra).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if ! .venv/bin/python -c 'import mkdocs, material, mkdocstrings_handlers.python, edgesdk' 2>/dev/null; then
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[docs]"
fi
command="${1:-build}"
shift || true
# Material prints a notice about its end of life on every build; the pinned versions are what the suite checks.
export NO_MKDOCS_2_WARNING=1
if [ "$command" = screenshot ]; then
  .venv/bin/mkdocs build --strict --quiet "$@"
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,900 \
    --screenshot="$PWD/docs/site.png" "file://$PWD/site/index.html"
  exit
fi
exec .venv/bin/mkdocs "$command" --strict "$@"
