"""The convert tables the README quotes: a real detector planned for a Jetson Orin Nano (GPU engines beside the CPU).

The detector of ``benchmarks/shared/models.py`` (YOLOv8n at 320x320 from nudenet 3.4.2, fetched with
pinned SHA-256s; photographs for data, F1 agreement with FP32 as the metric) is converted with
``edgesdk.converters.convert`` for each board asked, and the table ``edgesdk convert`` prints is
kept with its JSON report. No goals: it records what the planner chose and why.

    python benchmarks/converter/convert_tables.py [--profiles jetson-orin-nano] [--emulate]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmarks.shared.common import emit, log  # noqa: E402
from benchmarks.shared.models import DATA, MODELS, fetch  # noqa: E402
from edgesdk.cli.convert import _table  # noqa: E402
from edgesdk.converters import Bounds, ConversionRequest, Data, Output, Source, Target, convert  # noqa: E402

MODEL, CALIBRATION, EVALUATION, BOUND, HOLDOUT = "detector", 64, 60, 1.0, 0.3


def table(profile: str, work: Path, emulate: bool) -> dict:
    """Convert the detector for ``profile``; its table lines, chosen variant, reason and wall time."""
    spec = MODELS[MODEL]
    request = ConversionRequest(
        Source(fetch(MODEL), input_shapes={spec.input_name: spec.shape}), Target(profile, emulate=emulate),
        Data({spec.input_name: DATA[MODEL](CALIBRATION, 1)}, {spec.input_name: DATA[MODEL](EVALUATION, 2)},
             metric=spec.metric, holdout=HOLDOUT),
        Output(work / profile, name=MODEL), Bounds(max_accuracy_drop=BOUND))
    started = time.perf_counter()
    report = convert(request, progress=lambda stage, done, total: log(f"  {stage}") if done == 0 else None).to_dict()
    return {"table": _table(report).splitlines(), "chosen": report["chosen"], "reason": report["reason"],
            "planned": report["planned"], "convert_s": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="jetson-orin-nano", help="comma-separated board profiles")
    parser.add_argument("--emulate", action="store_true", help="count the CPU variants on the emulated cores (slow)")
    args = parser.parse_args()
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    with tempfile.TemporaryDirectory(prefix="edgesdk-tables-") as tmp:
        results = {}
        for profile in profiles:
            log(f"{MODEL}: convert for {profile}")
            results[profile] = table(profile, Path(tmp), args.emulate)
    emit("convert_tables", {"model": MODEL, "profiles": profiles, "emulate": args.emulate, "bound": BOUND,
                            "calibration": CALIBRATION, "evaluation": EVALUATION, "holdout": HOLDOUT}, results, [])


if __name__ == "__main__":
    main()
