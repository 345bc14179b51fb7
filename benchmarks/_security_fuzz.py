"""The fuzz suite's long profile (issue 36): every network parser of ``tests/fuzz/targets.py`` under Hypothesis,
many more examples than CI runs, counting what each parser accepted, refused and let escape.

The property is the CI suite's: an input is accepted as a typed record or refused with an
EdgeSDKError. Here an escape is counted rather than stopping the run, so one run reports every
kind of escape with its first input. Peak RSS is read before and after (``ru_maxrss``, a high-water
mark: growth means some input made a parser hold more memory than any before it), after a warm-up of 20
inputs per parser, so the imports and fixtures each parser needs are not counted. The archive
target unpacks into ``<work>/slot`` and the run checks nothing appeared beside it.
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings

from benchmarks._common import goal, log
from edgesdk.errors import EdgeSDKError
from tests.fuzz.targets import TARGETS, Target


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _fuzz(target: Target, examples: int) -> dict[str, Any]:
    tally: dict[str, Any] = {"tried": 0, "accepted": 0, "refused": 0, "escaped": 0, "escapes": {}}

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(target.inputs())
    def run(value: Any) -> None:
        tally["tried"] += 1
        try:
            target.parse(value)
            tally["accepted"] += 1
        except EdgeSDKError:
            tally["refused"] += 1
        except Exception as exc:  # noqa: BLE001 (an escape is what this counts)
            tally["escaped"] += 1
            tally["escapes"].setdefault(type(exc).__name__, f"{exc!s:.200} <- {value!r:.300}")

    started = time.monotonic()
    run()
    tally["seconds"] = round(time.monotonic() - started, 1)
    return tally


def run(total_examples: int, atheris_runs: int = 0) -> dict[str, Any]:
    """Fuzz every target with ``total_examples`` split evenly, then the command and tar parsers for
    ``atheris_runs`` executions each with atheris (0: not); ``{"results", "goals"}``."""
    per_target = max(1, total_examples // len(TARGETS))
    with tempfile.TemporaryDirectory(prefix="edgesdk-fuzz-") as work:
        before = set(Path(work).iterdir())
        for target in TARGETS.values():  # imports, keys, the sample bundle: not what hostile input costs
            _fuzz(target, 20)
        rss_before = _peak_rss_mb()
        parsers = {}
        for name, target in TARGETS.items():
            log(f"fuzzing {name}: {per_target} examples")
            parsers[name] = _fuzz(target, per_target)
        rss_growth = _peak_rss_mb() - rss_before
        outside = [str(p) for p in set(Path(work).iterdir()) - before]
    tried = sum(p["tried"] for p in parsers.values())
    escaped = sum(p["escaped"] for p in parsers.values())
    results = {"parsers": parsers, "tried": tried, "escaped": escaped, "peak_rss_growth_mb": round(rss_growth, 1),
               "written_outside_the_work_dir": outside}
    goals = [goal("hostile inputs tried across the parsers", ">= 100000", tried, tried >= 100_000),
             goal("unhandled exceptions (anything but an EdgeSDKError)", "0", escaped, escaped == 0),
             goal("writes outside the slot", "0", len(outside), not outside),
             goal("peak RSS growth over the run (MB)", "<= 50", rss_growth, rss_growth <= 50)]
    if atheris_runs:
        from benchmarks import _security_atheris

        log(f"atheris: the command and tar parsers, {atheris_runs} executions each")
        results["atheris"] = found = _security_atheris.run(atheris_runs)
        if found.get("available"):
            escapes = sum(len(found[t].get("escapes", {})) + ("error" in found[t]) for t in ("command", "archive"))
            goals.append(goal("atheris (libFuzzer) on the command and tar parsers: kinds of escape", "0", escapes,
                              escapes == 0))
    return {"results": results, "goals": goals}
