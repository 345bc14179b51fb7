"""The fuzz suite's long profile (issue 36): every network parser of ``tests/fuzz/targets.py`` under Hypothesis,
many more examples than CI runs, counting what each parser accepted, refused and let escape.

The property is the CI suite's: an input is accepted as a typed record or refused with an
EdgeSDKError. Here an escape is counted rather than stopping the run, so one run reports every
kind of escape with its first input.

**Writes outside the slot**: the archive target unpacks each input into a fresh ``slot`` beside it and
fails (an escape named ``written outside the slot``) when anything else appears; after the run no case
directory may be left in the archive work directory.

**Memory**: Hypothesis's engine holds its own bookkeeping while it generates (tens of MB over thousands of
examples, measured with tracemalloc: the parsers' own peak per input is at most about 1.5 MB), so the
process that generates cannot tell the parsers' memory from the engine's. Every input is therefore also
written to a corpus, and a child process that only parses replays it, one input at a time: its peak RSS
(``ru_maxrss``) after a warm-up of 20 inputs per parser, against the peak at the end, is the growth the
hostile inputs caused.
"""

from __future__ import annotations

import json
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings

from benchmarks.shared.common import goal, log
from tests.fuzz.targets import ARCHIVES, TARGETS, OutOfBounds, Target, exercise

ROOT = Path(__file__).resolve().parents[2]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _fuzz(target: Target, examples: int, corpus: Any = None) -> dict[str, Any]:
    tally: dict[str, Any] = {"tried": 0, "accepted": 0, "refused": 0, "escaped": 0, "out_of_bounds": 0,
                             "escapes": {}}

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(target.inputs())
    def run(value: Any) -> None:
        tally["tried"] += 1
        if corpus is not None:
            pickle.dump((target.name, value), corpus)
        try:
            tally["accepted" if exercise(target, value) else "refused"] += 1
        except OutOfBounds as exc:  # accepted, but outside the bounds its record must keep
            tally["out_of_bounds"] += 1
            tally["escapes"].setdefault("OutOfBounds", f"{exc!s:.500}")
        except Exception as exc:  # noqa: BLE001 (an escape is what this counts)
            tally["escaped"] += 1
            tally["escapes"].setdefault(type(exc).__name__, f"{exc!s:.200} <- {value!r:.300}")

    started = time.monotonic()
    run()
    tally["seconds"] = round(time.monotonic() - started, 1)
    return tally


def _replay(corpus: Path) -> dict[str, Any]:
    """In a process of its own: parse every input of ``corpus`` once; peak RSS growth after the warm-up."""
    seen: dict[str, int] = {}
    warm: float | None = None
    with open(corpus, "rb") as f:
        while True:
            try:
                name, value = pickle.load(f)
            except EOFError:
                break
            seen[name] = seen.get(name, 0) + 1
            if warm is None and len(seen) == len(TARGETS) and min(seen.values()) > 20:
                warm = _peak_rss_mb()  # every parser has run 20 inputs: its imports and fixtures are in
            try:
                TARGETS[name].parse(value)
            except Exception:  # noqa: BLE001, S110 (counted by the generating run; here only memory is measured)
                pass
    return {"replayed": sum(seen.values()), "peak_rss_after_warmup_mb": warm, "peak_rss_end_mb": _peak_rss_mb()}


def run(total_examples: int, atheris_runs: int = 0) -> dict[str, Any]:
    """Fuzz every target with ``total_examples`` split evenly, replay the inputs in a child for memory, then the
    command and tar parsers for ``atheris_runs`` executions each with atheris (0: not); ``{"results", "goals"}``."""
    per_target = max(1, -(-total_examples // len(TARGETS)))  # rounded up: the total is a floor
    parsers = {}
    with tempfile.TemporaryDirectory(prefix="edgesdk-fuzz-") as work:
        corpus = Path(work) / "corpus.pickle"
        with open(corpus, "wb") as f:
            # Interleaved in rounds, so the replay's warm-up has every parser in it early.
            rounds = max(1, per_target // 500)
            for r in range(rounds):
                for name, target in TARGETS.items():
                    if r == 0:
                        log(f"fuzzing {name}: {per_target} examples in {rounds} rounds")
                    tally = _fuzz(target, per_target // rounds + (per_target % rounds if r == 0 else 0), f)
                    total = parsers.setdefault(name, {"tried": 0, "accepted": 0, "refused": 0, "escaped": 0,
                                                      "out_of_bounds": 0, "escapes": {}, "seconds": 0.0})
                    for key in ("tried", "accepted", "refused", "escaped", "out_of_bounds", "seconds"):
                        total[key] += tally[key]
                    for kind, first in tally["escapes"].items():
                        total["escapes"].setdefault(kind, first)
        log("replaying the corpus in a child process for its memory")
        child = subprocess.run([sys.executable, "-m", "benchmarks.security.security_fuzz", str(corpus)], capture_output=True,
                               text=True, cwd=ROOT, timeout=3600)
        memory = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else \
            {"error": child.stderr[-2000:]}
    leftovers = [p.name for p in ARCHIVES.work.iterdir() if p.name not in ("model.onnx", "bundle")] \
        if "valid" in vars(ARCHIVES) else []
    outside = sum(1 for p in parsers.values() for kind in p["escapes"] if kind == "AssertionError") + len(leftovers)
    tried = sum(p["tried"] for p in parsers.values())
    escaped = sum(p["escaped"] for p in parsers.values())
    out_of_bounds = sum(p["out_of_bounds"] for p in parsers.values())
    growth = (memory["peak_rss_end_mb"] - memory["peak_rss_after_warmup_mb"]
              if memory.get("peak_rss_after_warmup_mb") is not None else float("inf"))
    results = {"parsers": parsers, "tried": tried, "escaped": escaped, "out_of_bounds": out_of_bounds, "replay": memory,
               "peak_rss_growth_mb": round(growth, 1), "archive_work_leftovers": leftovers}
    goals = [goal("hostile inputs tried across the parsers", ">= 100000", tried, tried >= 100_000),
             goal("unhandled exceptions (anything but an EdgeSDKError)", "0", escaped, escaped == 0),
             goal("accepted records out of their bounds (binding, expiry, ranges)", "0", out_of_bounds,
                  out_of_bounds == 0),
             goal("writes outside the slot", "0", outside, outside == 0),
             goal("peak RSS growth parsing every input, after a warm-up (MB)", "<= 50", growth, growth <= 50)]
    if atheris_runs:
        from benchmarks.security import security_atheris

        log(f"atheris: the command and tar parsers, {atheris_runs} executions each")
        results["atheris"] = found = security_atheris.run(atheris_runs)
        if found.get("available"):
            escapes = sum(len(found[t].get("escapes", {})) + ("error" in found[t]) for t in ("command", "archive"))
            goals.append(goal("atheris (libFuzzer) on the command and tar parsers: kinds of escape", "0", escapes,
                              escapes == 0))
    return {"results": results, "goals": goals}


if __name__ == "__main__":
    print(json.dumps(_replay(Path(sys.argv[1]))))
