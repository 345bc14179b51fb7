"""Chaos: a fleet under seeded faults, and a checker that proves the invariants over the run's history.

Each seed runs benchmarks/_chaos_run.py: two `edgesdk server` replicas on PostgreSQL, a real
mosquitto, the simulated fleet, six rollouts (good ones, one that fails its canary, a signed
rollback, an operator's abort) and the seed's faults (replica kill -9 and restart, broker and
PostgreSQL restarts, devices cut off, crashing mid-install, receiving corrupted chunks or slow,
a replica with a wrong clock). The checker (benchmarks/_chaos_checker.py) then reads the
history; on a violation the seed and a minimal history print, and ``--seeds N`` reruns the
same schedule.

    python benchmarks/chaos.py [--quick] [--devices 1000] [--seeds 1 2 3] [--faults 24] [--plant BUG]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._chaos_run import SEQUENCE, ChaosConfig, run_chaos  # noqa: E402
from benchmarks._common import emit, goal, log  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke size: 60 devices, 10 faults, one seed")
    parser.add_argument("--devices", type=int, default=None, help="simulated devices (default 1000; 60 with --quick)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds to run (default 1 2 3)")
    parser.add_argument("--faults", type=int, default=None, help="faults per seed (default 24; 10 with --quick)")
    parser.add_argument("--plant", choices=("ignore-lease", "no-revert"), default=None,
                        help="run replicas with this bug planted (the checker must fail)")
    args = parser.parse_args()
    devices = args.devices or (60 if args.quick else 1000)
    seeds = args.seeds or ([1] if args.quick else [1, 2, 3])
    faults = args.faults or (10 if args.quick else 24)
    horizon = 30.0 if args.quick else 60.0
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        work = Path(tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
        log(f"chaos seed {seed}: {devices} devices, {faults} faults over {horizon:g} s"
            + (f", planted bug {args.plant}" if args.plant else ""))
        try:
            result = run_chaos(ChaosConfig(devices=devices, seed=seed, faults=faults, horizon_s=horizon,
                                           plant=args.plant), work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        runs.append(result.to_json())
        if result.violations:
            log(f"seed {seed}: the checker found {len(result.violations)} violations; rerun with --seeds {seed}")
            for lines in result.minimal:
                log("\n".join(lines))
        else:
            log(f"seed {seed}: the checker passed ({result.wall_s:.0f} s)")
    goals = [goal(f"chaos, {devices} devices, {faults} faults over {len(SEQUENCE)} rollouts, seeds {seeds}: the "
                  "checker passes on every seed (seeds passed)", f"{len(runs)} of {len(runs)}",
                  sum(r["checker_passed"] for r in runs),
                  all(r["checker_passed"] for r in runs) and faults >= 20 and len(SEQUENCE) >= 6),
             goal("each seed's run, s", "<= 600", max(r["wall_s"] for r in runs),
                  all(r["wall_s"] <= 600 for r in runs))]
    emit("chaos", {"devices": devices, "seeds": seeds, "faults": faults, "horizon_s": horizon,
                   "sequence": [list(s) for s in SEQUENCE], "plant": args.plant}, {"runs": runs}, goals)


if __name__ == "__main__":
    main()
