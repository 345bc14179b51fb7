"""End-to-end demo of what edgesdk does today, on real libraries and a locally trained model.

1. train a small digit classifier (scikit-learn's bundled digits) and write it as ONNX and TFLite;
2. detect this device and pick its profile;
3. run both files with edgesdk.Runtime (ONNX Runtime and LiteRT) and check their accuracy;
4. benchmark them here, and show how the power modes would schedule threads on each shipped board;
5. convert the model for an RK3588 board: build, measure and choose a variant, write a signed bundle,
   verify it and run its health check;
6. update a fleet: a real MQTT broker, the OTA server and 20 device agents, each with an app; push the
   bundle from the CLI with a 10% canary, push a new release judged on the apps' traffic, then push a
   release whose health check fails and watch the canary roll back by itself while the apps keep answering.

    python examples/quickstart.py [--out demo-output] [--runs 200]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import edgesdk
from edgesdk.runtime.bench import benchmark
from edgesdk.runtime.detect import detect
from edgesdk.runtime.scheduling import plan_cores
from edgesdk.testing import load_digits_data, train_digits_mlp, write_mlp_onnx, write_mlp_tflite

MIN_ACCURACY = 0.93


def main() -> int:
    parser = argparse.ArgumentParser(description="edgesdk end-to-end demo")
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    print("== 1. build a model")
    data = load_digits_data()
    weights = train_digits_mlp(data)
    models = [write_mlp_onnx(weights, args.out / "digits.onnx"), write_mlp_tflite(weights, args.out / "digits.tflite")]
    for path in models:
        print(f"   wrote {path} ({path.stat().st_size / 1024:.1f} KiB)")

    print("\n== 2. detect this device")
    found = detect()
    t = found.topology
    print(f"   {t.model or '(no device tree)'}, {t.arch}, {len(t.cpus)} CPUs, {t.mem_total_mb} MiB RAM")
    print(f"   profile {found.profile.name}: {found.reason}")

    print("\n== 3. run with edgesdk.Runtime")
    ok = True
    for path in models:
        with edgesdk.Runtime(path, profile=found.profile, mode="latency") as rt:
            accuracy = float((rt.predict(data.x_test).argmax(axis=1) == data.y_test).mean())
            try:
                rt.predict(data.x_test.astype(np.float64))
            except edgesdk.InputError as exc:
                rejected = str(exc).split(";")[0]
            info = rt.info
        ok &= accuracy >= MIN_ACCURACY
        print(f"   {path.name}: {info.backend} ({info.backend_version}) on {info.accelerator}, "
              f"{info.threads} threads on cores {list(info.cores)}; accuracy {accuracy:.3f}")
        print(f"     bad input is refused: {rejected}")

    print(f"\n== 4. benchmark here ({args.runs} runs, batch 1)")
    for path in models:
        r = benchmark(path, profile=found.profile, mode="latency", runs=args.runs, warmup=20)
        print(f"   {path.name:<14} p50 {r.p50_ms:.3f} ms  p95 {r.p95_ms:.3f} ms  p99 {r.p99_ms:.3f} ms  "
              f"{r.throughput_per_s:,.0f}/s  peak RSS {r.peak_rss_mb:.0f} MiB")

    print("\n   how each power mode schedules threads on the shipped boards:")
    everything = frozenset(range(64))  # plan as on the board itself, not on this host
    for profile in edgesdk.list_profiles():
        plans = [plan_cores(profile, mode, available=everything) for mode in ("latency", "balanced", "power")]
        cells = "  ".join(f"{p.mode.value}: {p.threads}t on {list(p.cores)}" for p in plans)
        print(f"   {profile.name:<18} {cells}")

    print("\n== 5. convert for rk3588 and bundle")
    from edgesdk.converters import ConversionRequest, Data, Output, Source, Target, convert
    from edgesdk.runtime.bundle import read_bundle
    from edgesdk.runtime.signing import generate_keypair, load_private_key, load_public_key

    keys = args.out / "keys"
    if not (keys / "edgesdk.key").exists():
        generate_keypair(keys)
    out = args.out / "convert"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    report = convert(ConversionRequest(
        Source(models[0]), Target("rk3588"),
        Data(calibration={"input": data.x_train[:256]}, evaluation={"input": data.x_test}, labels=data.y_test),
        Output(out, name="digits", version="1.0.0", private_key=load_private_key(keys / "edgesdk.key"))))
    for c in report.plan.candidates:
        verdict = "CHOSEN" if c.chosen else "; ".join(c.rejected) or "fits, slower"
        print(f"   {c.name:<28} {c.measurement.size_bytes / 1024:6.1f} KiB  host {c.measurement.latency_p50_ms:.3f} ms  "
              f"rk3588 ~{c.estimate.latency_ms:.3f} ms  drop {c.accuracy_drop:.2f} pt  {verdict}")
    bundle = read_bundle(report.bundle.path, public_key=load_public_key(keys / "edgesdk.pub"), require_signature=True)
    inputs, expected = bundle.health_sample()
    with edgesdk.Runtime(bundle.path, profile=found.profile) as rt:
        result = rt.predict(inputs)
    healthy = bool(np.allclose(result, expected[rt.outputs[0].name], atol=bundle.manifest.health_check.atol,
                               rtol=bundle.manifest.health_check.rtol))
    ok &= healthy
    print(f"   bundle {bundle.path}: {bundle.manifest.variant}, signed by {', '.join(bundle.signed_by)}, "
          f"health check {'passed' if healthy else 'FAILED'}")

    print("\n== 6. update a fleet over MQTT")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fleet

    fleet_dir = args.out / "fleet"
    if fleet_dir.exists():
        import shutil

        shutil.rmtree(fleet_dir)
    ok &= fleet.run(report.bundle.path, keys, fleet_dir)

    print("\nresult:", "OK" if ok else "FAILED (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
