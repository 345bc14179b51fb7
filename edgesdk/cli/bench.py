"""``edgesdk bench MODEL``."""

from __future__ import annotations

import json
import sys

import click


@click.command()
@click.argument("model", type=click.Path(exists=True))
@click.option("--profile", default=None, help="Profile name or YAML path (default: detect this board).")
@click.option("--mode", type=click.Choice(["latency", "balanced", "power"]), default=None,
              help="Core selection (default: a bundle's power mode, else latency).")
@click.option("--backend", type=click.Choice(["auto", "litert", "onnxruntime"]), default="auto", show_default=True)
@click.option("--accelerator", default="auto", show_default=True,
              help="auto, cpu, a kind (gpu, npu, dsp) or an accelerator name of the profile.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Override the mode's thread count.")
@click.option("--runs", type=click.IntRange(min=1), default=100, show_default=True)
# edgesdk.runtime.bench.WARMUP, written out so `edgesdk --help` does not import numpy (a test keeps them equal).
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True,
              help="Untimed predictions before timing (the warm-up every measurement uses).")
@click.option("--energy", is_flag=True,
              help="Also read the board's power sensor: an idle baseline, then --runs more predictions; prints the "
                   "energy per inference above idle (a board without a sensor says so).")
@click.option("--idle-s", type=click.FloatRange(min=0), default=20.0, show_default=True,
              help="With --energy: seconds of idle baseline, model loaded.")
@click.option("--rate", "rate_hz", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --energy: predictions per second in the active window (default: back to back).")
@click.option("--sysfs-root", default="/sys", show_default=True, help="With --energy: where sysfs is (for tests).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def bench(model: str, profile: str | None, mode: str | None, backend: str, accelerator: str, threads: int | None,
          runs: int, warmup: int, energy: bool, idle_s: float, rate_hz: float | None, sysfs_root: str,
          as_json: bool) -> None:
    """Measure MODEL's (a .tflite/.onnx file or a bundle directory) latency, throughput and peak memory here."""
    from edgesdk.runtime.bench import benchmark

    with click.progressbar(length=runs, label="benchmarking", file=sys.stderr) as bar:
        result = benchmark(model, profile=profile, mode=mode, backend=backend, accelerator=accelerator,
                           threads=threads, runs=runs, warmup=warmup, on_progress=bar.update, energy=energy,
                           idle_s=idle_s, rate_hz=rate_hz, sysfs_root=sysfs_root)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    info = result.info
    rows = [
        ("model", info.model),
        ("profile / mode", f"{info.profile} / {info.mode} (power mode {info.power_mode or '-'})"),
        ("backend", f"{info.backend} {info.backend_version}"),
        ("accelerator", info.accelerator),
        ("threads / cores", f"{info.threads} on {list(info.cores)}"),
        ("latency p50 / p95 / p99", f"{result.p50_ms:.3f} / {result.p95_ms:.3f} / {result.p99_ms:.3f} ms"),
        ("latency min / mean / max", f"{result.min_ms:.3f} / {result.mean_ms:.3f} / {result.max_ms:.3f} ms"),
        ("throughput", f"{result.throughput_per_s:.1f} inferences/s"),
        ("peak RSS", f"{result.peak_rss_mb:.1f} MiB"),
        ("runs (warm-up)", f"{result.runs} ({result.warmup})"),
    ]
    if result.energy is not None:
        e = result.energy
        rows.append(("energy", e["note"] if e.get("sensor") is None else
                     f"{e['energy_per_inference_mj']:.3f} mJ per inference above idle; idle {e['idle_watts']:.3f} W, "
                     f"active {e['active_watts']:.3f} W ({e['sensor']}, {e['scope']} scope, {e['samples']} samples)"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")
    for note in info.fallbacks:
        click.echo(f"fallback: {note}")
