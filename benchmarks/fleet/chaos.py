"""Chaos: a fleet under seeded faults, and a checker that proves the invariants over the run's history.

Each seed runs benchmarks/fleet/chaos_run.py: two `edgesdk server` replicas on PostgreSQL, a real
mosquitto, the simulated fleet, six rollouts (good ones, one that fails its canary, a signed
rollback, an operator's abort) and the seed's faults (benchmarks/fleet/chaos_faults.py: replica kills
aimed at the lease holder, broker and PostgreSQL restarts, devices cut off, crashing mid-install,
receiving corrupted chunks, slow, duty-cycled, offline at a push, provisioned during the run or
naming another group, a replica with a wrong clock). The checker (benchmarks/fleet/chaos_checker.py)
then reads the history; on a violation the seed and a minimal history print, and ``--seeds N``
reruns the same schedule. Each fault must also have taken effect (a crash that happened, a chunk
refused, a kill that hit the lease holder of a running rollout...): one that did not is listed,
and fails its goal rather than the checker (the run's schedule missed, not the server).

Then the same run with bugs planted in the replicas (benchmarks/fleet/planted_server.py), which the
checker must catch: ``no-reconcile`` and ``no-fence`` (two drivers of one rollout, without the
compare-and-set); and ``ignore-lease``, which the compare-and-set makes harmless (the checker
passes, and the replicas' logs count the moves it refused).

    python benchmarks/fleet/chaos.py [--quick] [--devices 1000] [--seeds 1 2 3] [--faults 24] [--plants BUG ...]
                               [--plant BUG] [--keep DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.fleet.chaos_run import FAULT_KINDS, SEQUENCE, ChaosConfig, ChaosResult, run_chaos  # noqa: E402
from benchmarks.fleet.planted_server import BUGS  # noqa: E402
from benchmarks.shared.common import emit, goal, log  # noqa: E402

#: The planted bugs checked by default (the full run): the first two must be caught, the last shown harmless.
PLANTS = ("no-reconcile", "no-fence", "ignore-lease")


def _run(config: ChaosConfig, keep: Path | None = None) -> ChaosResult:
    name = f"seed-{config.seed}" + (f"-{config.plant}" if config.plant else "")
    work = keep / name if keep is not None else Path(tempfile.mkdtemp(prefix=f"chaos-{config.seed}-"))
    work.mkdir(parents=True, exist_ok=keep is None)
    log(f"chaos seed {config.seed}: {config.devices} devices, {config.faults} faults over {config.horizon_s:g} s"
        + (f", planted bug {config.plant}" if config.plant else ""))
    try:
        result = run_chaos(config, work)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    if keep is not None and result.history is not None:  # the servers' logs stay beside it
        (work / "history.json").write_text(json.dumps(_plain(result.history), indent=1))
        log(f"seed {config.seed}: the run's servers' logs and history.json are in {work}")
    if result.violations:
        log(f"seed {config.seed}: the checker found {len(result.violations)} violations "
            f"{result.to_json()['violations_by_invariant']}; rerun with --seeds {config.seed}")
        for lines in result.minimal:
            log("\n".join(lines))
    else:
        log(f"seed {config.seed}: the checker passed ({result.wall_s:.0f} s)")
    for effect in result.ineffective:
        log(f"seed {config.seed}: fault {effect['kind']} ({effect['when']}) had no effect: {effect['evidence']}")
    return result


def _plain(value: Any) -> Any:
    """``value`` as JSON-ready data (records as dicts, tuple keys joined with a slash)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {"/".join(k) if isinstance(k, tuple) else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def _plant_goals(plants: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    goals = []
    if "no-reconcile" in plants:
        r = plants["no-reconcile"]
        n = r["violations_by_invariant"].get("convergence", 0)
        goals.append(goal("planted no-reconcile: the checker fails, devices off the release named (convergence "
                          "violations)", ">= 1", n, not r["checker_passed"] and n >= 1))
    if "no-fence" in plants:
        r = plants["no-fence"]
        n = r["stages_sent_twice"]
        goals.append(goal("planted no-fence (two drivers, no compare-and-set): the checker fails, a stage sent more "
                          "than once", ">= 1", n, not r["checker_passed"] and n >= 1))
    if "ignore-lease" in plants:
        r = plants["ignore-lease"]
        goals.append(goal("planted ignore-lease: harmless under the compare-and-set (the checker passes; moves it "
                          "refused)", "passes, >= 1 refused", r["refused_moves"],
                          r["checker_passed"] and r["refused_moves"] >= 1))
    return goals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke size: 60 devices, 12 faults, one seed, no "
                                                             "planted bugs")
    parser.add_argument("--devices", type=int, default=None, help="simulated devices (default 1000; 60 with --quick)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds to run (default 1 2 3)")
    parser.add_argument("--faults", type=int, default=None, help="faults per seed (default 24; 12 with --quick)")
    parser.add_argument("--converge-s", type=float, default=None,
                        help="a device online this long after the release changed must run it (default 60; 10 "
                             "with --quick)")
    parser.add_argument("--plants", choices=BUGS, nargs="*", default=None,
                        help=f"planted bugs to check after the seeds, on the first seed (default {' '.join(PLANTS)}; "
                             "none with --quick)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each run's directory (servers' logs) here, with its whole history as history.json")
    parser.add_argument("--plant", choices=BUGS, default=None,
                        help="run every seed with this bug planted (the checker must fail)")
    args = parser.parse_args()
    devices = args.devices or (60 if args.quick else 1000)
    seeds = args.seeds or ([1] if args.quick else [1, 2, 3])
    faults = args.faults or (12 if args.quick else 24)
    horizon = 12.0 if args.quick else 60.0
    converge = args.converge_s or (10.0 if args.quick else 60.0)
    plants = args.plants if args.plants is not None else ([] if args.quick else list(PLANTS))
    base = ChaosConfig(devices=devices, faults=faults, horizon_s=horizon, converge_s=converge,
                       settle_s=30.0 if args.quick else 60.0, plant=args.plant)
    runs = [_run(replace(base, seed=seed), args.keep).to_json() for seed in seeds]
    planted = {bug: _run(replace(base, seed=seeds[0], plant=bug), args.keep).to_json() for bug in plants}
    kinds = set().union(*(r["fault_kinds"] for r in runs))
    ineffective = sum(len(r["faults_ineffective"]) for r in runs)
    goals = [goal(f"chaos, {devices} devices, {faults} faults ({len(kinds)} kinds) over {len(SEQUENCE)} rollouts, "
                  f"seeds {seeds}: the checker passes on every seed (seeds passed)", f"{len(runs)} of {len(runs)}, "
                  ">= 1000 devices, >= 3 seeds, >= 20 faults of every kind", sum(r["checker_passed"] for r in runs),
                  all(r["checker_passed"] for r in runs) and devices >= 1000 and len(seeds) >= 3 and faults >= 20
                  and kinds == set(FAULT_KINDS) and len(SEQUENCE) >= 6),
             goal("scheduled faults that had no effect (every seed)", "0", ineffective, ineffective == 0),
             goal("seeds where a kill hit the lease holder of a running rollout", f"{len(runs)} of {len(runs)}",
                  sum(any(f.get("hit_holder") for f in r["schedule"]) for r in runs),
                  all(any(f.get("hit_holder") for f in r["schedule"]) for r in runs)),
             *_plant_goals(planted),
             goal("each seed's run, s", "<= 600", max(r["wall_s"] for r in [*runs, *planted.values()]),
                  all(r["wall_s"] <= 600 for r in [*runs, *planted.values()]))]
    emit("chaos", {"devices": devices, "seeds": seeds, "faults": faults, "horizon_s": horizon,
                   "converge_s": converge, "sequence": [list(s) for s in SEQUENCE], "plant": args.plant,
                   "plants": plants}, {"runs": runs, "planted": planted}, goals)


if __name__ == "__main__":
    main()
