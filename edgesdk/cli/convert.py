"""``edgesdk convert MODEL --profile P ...`` (needs the [convert] extra)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from edgesdk.errors import DataError


def _shapes(values: tuple[str, ...]) -> dict[str, list[int]] | None:
    shapes = {}
    for value in values:
        name, _, dims = value.partition("=")
        try:
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise click.BadParameter(f"{value!r}: use NAME=D1,D2,... e.g. input=1,3,224,224") from None
    return shapes or None


def _board_figures(paths: tuple[str, ...]) -> dict[str, float]:
    figures = {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            figures[data["info"]["model_sha256"]] = float(data["p50_ms"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{path}: not an `edgesdk bench --json` result ({exc}); run that command on the board") \
                from exc
    return figures


def _table(report: dict[str, Any]) -> str:
    header = ("", "variant", "size KiB", "peak MiB", "measured ms", "board ms", "mJ", f"drop ({report['metric_unit']})",
              "verdict")
    rows = [header]
    for v in report["variants"]:
        verdict = "CHOSEN" if v["chosen"] else ("; ".join(v["rejected"]) or "fits (slower)")
        basis = "" if v["estimate_basis"] == "measured on board" else "~"
        rows.append(("*" if v["chosen"] else "", v["name"], f"{v['size_bytes'] / 1024:.1f}",
                     f"{v['peak_memory_mb']:.1f}", f"{v['latency_p50_ms']:.3f}",
                     f"{basis}{v['board_latency_ms']:.3f}", f"{basis}{v['energy_mj']:.2f}",
                     f"{v['accuracy_drop']:.3f}", verdict))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header) - 1)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
    return "\n".join(lines)


@click.command()
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--profile", required=True, help="Target device profile name or YAML path.")
@click.option("--mode", type=click.Choice(["latency", "balanced", "power"]), default="latency", show_default=True)
@click.option("--calibration", type=click.Path(exists=True), required=False,
              help="Calibration data: .npy, .npz (one array per input) or an image folder (default: --eval).")
@click.option("--eval", "evaluation", type=click.Path(exists=True), required=True, help="Evaluation data (same forms).")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False), help=".npy of integer class ids for --eval.")
@click.option("--metric", type=click.Choice(["top1_agreement", "top1_accuracy", "cosine", "max_abs_error"]),
              help="Accuracy metric (default: top1_accuracy with labels, else top1_agreement).")
@click.option("--max-accuracy-drop", type=float, default=0.5, show_default=True,
              help="Largest accepted drop vs FP32, in the metric's unit (points for top-1).")
@click.option("--formats", default="onnx", show_default=True, help="Comma-separated: onnx, tflite.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True)
@click.option("--name", default=None, help="Bundle name (default: the model file's stem).")
@click.option("--version", "bundle_version", default="1.0.0", show_default=True)
@click.option("--input-shape", "input_shapes", multiple=True, help="Fix a dynamic input: NAME=D1,D2,...")
@click.option("--fps", type=float, default=None, help="Frame rate the board must sustain in the power mode.")
@click.option("--board-figures", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="`edgesdk bench --json` output measured on the board; replaces the estimate for that model.")
@click.option("--measure-on", "measure_on", default=None, metavar="DEVICE",
              help="Measure every variant on this device of the fleet (through the OTA server) instead of estimating.")
@click.option("--server", "server_url", envvar="EDGESDK_SERVER", default="http://127.0.0.1:8080", show_default=True,
              help="OTA server admin URL, for --measure-on (env EDGESDK_SERVER).")
@click.option("--token", envvar="EDGESDK_TOKEN", help="Admin token for --measure-on (env EDGESDK_TOKEN).")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False), help="File with the admin token.")
@click.option("--sign", "key", type=click.Path(exists=True, dir_okay=False), help="Ed25519 private key to sign with.")
@click.option("--color", type=click.Choice(["RGB", "BGR", "GRAY"]), default="RGB", show_default=True,
              help="Image folders: channel order.")
@click.option("--scale", type=float, default=1 / 255, show_default=True, help="Image folders: pixel scale.")
@click.option("--mean", default="0,0,0", show_default=True, help="Image folders: per-channel mean after scaling.")
@click.option("--std", default="1,1,1", show_default=True, help="Image folders: per-channel std after scaling.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def convert(model: str, profile: str, mode: str, calibration: str | None, evaluation: str, labels: str | None,
            metric: str | None, max_accuracy_drop: float, formats: str, out_dir: str, name: str | None,
            bundle_version: str, input_shapes: tuple[str, ...], fps: float | None, board_figures: tuple[str, ...],
            measure_on: str | None, server_url: str, token: str | None, token_file: str | None, key: str | None,
            color: str, scale: float, mean: str, std: str, as_json: bool) -> None:
    """Build, measure and choose the variant of MODEL that fits PROFILE; write a bundle to OUT/bundle."""
    from edgesdk.converters.data import ImagePreprocessing, load_arrays, load_labels
    from edgesdk.converters.pipeline import convert as run_convert
    from edgesdk.model_file import read_model
    from edgesdk.profiles import load_profile
    from edgesdk.runtime import Runtime

    board = load_profile(profile)
    prep = ImagePreprocessing(color=color, scale=scale, mean=tuple(float(v) for v in mean.split(",")),
                              std=tuple(float(v) for v in std.split(",")))
    read_model(model)  # a wrong extension or corrupt header fails here, before any work
    with Runtime(model, profile=board, mode=mode) as rt:
        specs = rt.inputs
    eval_arrays = load_arrays(evaluation, specs, prep)
    calib_arrays = load_arrays(calibration, specs, prep) if calibration else eval_arrays
    label_array = load_labels(labels, len(next(iter(eval_arrays.values())))) if labels else None
    private_key = None
    if key:
        from edgesdk.signing import load_private_key

        private_key = load_private_key(key)
    board_measure = None
    if measure_on:
        from edgesdk.cli.fleet import admin_client
        from edgesdk.converters.remote import board_measure as remote

        board_measure = remote(admin_client(server_url, token, token_file), measure_on, mode)
    is_image_folder = Path(evaluation).is_dir()
    # One bar per stage: the label says which stage runs, the bar how far it is (samples, blocks).
    with click.progressbar(length=100, label="converting", file=sys.stderr, show_eta=False, width=24) as bar:
        def progress(stage: str, done: int, total: int) -> None:
            bar.label = f"{stage:<52}"
            bar.update(int(100 * done / max(total, 1)) - bar.pos)

        report = run_convert(
            model, board, calibration=calib_arrays, evaluation=eval_arrays, out_dir=out_dir, mode=mode,
            labels=label_array, metric=metric, max_accuracy_drop=max_accuracy_drop,
            formats=[f.strip() for f in formats.split(",") if f.strip()], input_shapes=_shapes(input_shapes),
            name=name or Path(model).stem.replace(" ", "_"), version=bundle_version,
            board_figures=_board_figures(board_figures), target_fps=fps,
            preprocessing={"images": prep.as_dict()} if is_image_folder else {}, private_key=private_key,
            progress=progress, measure_on=board_measure,
        )
        bar.label = f"{'done':<52}"
        bar.update(100 - bar.pos)
    data = report.to_dict()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(_table(data))
    click.echo(f"\nchosen: {data['chosen']} — {data['reason']}")
    click.echo("~ = estimated for the board from this host's measurement (see `edgesdk convert --help`, planner docs)")
    if data["tflite_error"]:
        click.echo(f"TFLite variants not produced: {data['tflite_error']}")
    click.echo(f"bundle: {data['bundle']}" + (" (signed)" if private_key else ""))
