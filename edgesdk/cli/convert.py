"""``edgesdk convert MODEL --profile P ...`` (needs the [convert] extra)."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from edgesdk.errors import DataError, EdgeSDKError

#: A stage's running count ("calibrating (12/256 samples)"): one line per stage when stderr is not a terminal.
_COUNT = re.compile(r" \(\d+/\d+[^)]*\)$")
_LABEL_WIDTH = 52


def _checked(check: Callable[[Any], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback running one of the library's argument checks: a bad value is a usage error naming it."""
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        try:
            return check(value)
        except EdgeSDKError as exc:
            raise click.BadParameter(str(exc)) from None
    return callback


def _shapes(values: tuple[str, ...]) -> dict[str, list[int]] | None:
    from edgesdk.converters.arguments import check_input_shapes

    shapes = {}
    for value in values:
        name, _, dims = value.partition("=")
        try:
            shapes[name.strip()] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise click.BadParameter(f"{value!r}: use NAME=D1,D2,... e.g. input=1,3,224,224") from None
    return check_input_shapes(shapes)


def _floats(value: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: use comma-separated numbers, e.g. 0.485,0.456,0.406") from None


def _prep_check(setting: str) -> Callable[[Any], Any]:
    """A check of one preprocessing setting alone (``--mean 0.5,0.5``, ``--std 0``) before the model is read."""
    def check(value: Any) -> Any:
        from edgesdk.runtime.preprocess import ImagePreprocessing

        value = _floats(value) if setting in ("mean", "std") else value
        ImagePreprocessing(**{setting: value})
        return value
    return check


def _preprocessing(spec: Any, stated: dict[str, Any], image_folder: bool) -> Any:
    """The :class:`ImagePreprocessing` to record for ``spec``: None with arrays and nothing stated."""
    from edgesdk.runtime.preprocess import ImagePreprocessing

    if not image_folder and all(v is None for v in stated.values()):
        return None
    try:
        return ImagePreprocessing.for_input(spec, **stated)
    except DataError as exc:
        if not any(v is not None for v in stated.values()):
            raise  # an image folder for a model that takes no image: the data's error, as without the flags
        given = " ".join(f"--{k} {','.join(map(str, v)) if isinstance(v, tuple) else v}"
                         for k, v in stated.items() if v is not None)
        raise click.BadParameter(f"{given} does not fit the model input: {exc}", param_hint="'--color' / '--scale' / "
                                 "'--mean' / '--std' / '--layout'") from None


class _Stages:
    """convert()'s progress on stderr: a bar labelled with the stage on a terminal, else one line per stage."""

    def __init__(self) -> None:
        self.last = ""
        self.bar: Any = None
        #: Seconds spent in each stage (by its label without counts), in the order they began.
        self.timings: dict[str, float] = {}
        self._since: tuple[str, float] | None = None

    def _clock(self, line: str) -> None:
        now = time.monotonic()
        if self._since is not None and self._since[0] != line:
            self.timings[self._since[0]] = self.timings.get(self._since[0], 0.0) + now - self._since[1]
        if self._since is None or self._since[0] != line:
            self._since = (line, now)

    def summary(self) -> str:
        """``stages: loading 0.4 s, ...`` with the time of each stage so far (the current one ends now)."""
        if self._since is not None:
            self._clock("")
        return "stages: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.timings.items() if name)

    def __call__(self, stage: str, done: int, total: int) -> None:
        line = _COUNT.sub("", stage)
        self._clock(line)
        if self.bar is None:
            if line != self.last:
                click.echo(line, err=True)
        else:
            if len(stage) > _LABEL_WIDTH and line != self.last:  # too long for the bar's label: a line of its own
                click.echo(f"\r\x1b[K{stage}", err=True)
            self.bar.label = f"{stage[:_LABEL_WIDTH]:<{_LABEL_WIDTH}}"
            self.bar.pos = min(100, int(100 * done / max(total, 1)))
            self.bar.render_progress()
        self.last = line


def _board_figures(paths: tuple[str, ...]) -> tuple[dict[str, float], dict[str, float]]:
    """Latency (p50 ms) and, where the board's sensor measured it, energy per inference (mJ), by model SHA-256."""
    figures, energy = {}, {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            sha = data["info"]["model_sha256"]
            figures[sha] = float(data["p50_ms"])
            measured = (data.get("energy") or {}).get("energy_per_inference_mj")
            if measured is not None:
                energy[sha] = float(measured)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"{path}: not an `edgesdk bench --json` result ({exc}); run that command on the board") \
                from exc
    return figures, energy


def _table(report: dict[str, Any]) -> str:
    from edgesdk.converters.board.board_latency import latency_band

    header = ("", "variant", "size KiB", "peak MiB", "host p50/p95 ms", "runs on (power mode)",
              "board latency", "basis", "mJ", "avg W",
              "int8/DQ-float", f"drop ({report['metric_unit']})", "held-out drop", "accuracy on", "host-board diff",
              "verdict")
    rows = [header]
    for v in report["variants"]:
        verdict = "CHOSEN" if v["chosen"] else ("; ".join(v["rejected"]) or "fits (not chosen)")
        p = v["power"]
        band = latency_band(report["profile"], p["basis"])
        energy = "" if p["energy_basis"].startswith("measured on board") else "~"
        rows.append(("*" if v["chosen"] else "", v["name"], f"{v['size_bytes'] / 1024:.1f}",
                     f"{v['peak_memory_mb']:.1f}", f"{v['latency_p50_ms']:.3f}/{v['latency_p95_ms']:.3f}",
                     _runs_on(v),
                     band.describe(p["latency_ms"]), band.label, f"{energy}{p['energy_mj']:.2f}",
                     "-" if p["avg_watts"] is None else f"{energy}{p['avg_watts']:.2f}", _fused(v),
                     *_accuracy(v), verdict))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header) - 1)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
    return "\n".join(lines)


def _accuracy(row: dict[str, Any]) -> tuple[str, str, str, str]:
    """The drops the planner judged (the board's when the variant ran there), whose outputs they are from, and how far
    its board outputs are from this host's (reported, not a veto)."""
    board = row.get("board_drop") is not None
    drop, held = ((row["board_drop"], row["board_holdout_drop"]) if board
                  else (row["accuracy_drop"], row["holdout_drop"]))
    difference = row.get("host_board_difference")
    return (f"{drop:.3f}", "-" if held is None else f"{held:.3f}", row.get("accuracy_basis", "this host"),
            "-" if difference is None else f"{difference:.3g}")


def _basis_lines(report: dict[str, Any]) -> str:
    """What each basis label in the table means, and what its band is."""
    from edgesdk.converters.board.board_latency import BASIS_LABELS, latency_band

    bases = {latency_band(report["profile"], v["power"]["basis"]).label for v in report["variants"]}
    lines = [f"basis {label}: {BASIS_LABELS[label]}" for label in sorted(bases)]
    lines.append("board latency +/-N% = the 90th percentile of that basis's error on this board "
                 "against published figures held out of its calibration "
                 "(benchmarks/converter/calibration.py); unvalidated = nothing checks it; variants "
                 "within each other's band are ties, settled by accuracy, then size")
    if report["board_estimates"]:
        lines.append(f"board figures: {report['board_estimates']}")
    lines.append("~ on mJ and W = modelled, not measured on the board")
    return "\n".join(lines)


def _runs_on(row: dict[str, Any]) -> str:
    """``cpu x4 (performance)``, or on an accelerator ``ampere-gpu TensorRT fp16 (15w)``."""
    p = row["power"]
    where = row["runs_on"] if p.get("accelerator") else f"cpu x{p['threads']}"
    return f"{where} ({p['power_mode']})"


def _notes(report: dict[str, Any]) -> list[str]:
    """The variants' notes worth a line under the table: the blocks a mixed variant kept in float."""
    return [f"{v['name']}: {note}" for v in report["variants"] for note in v["notes"] if "kept in float" in note]


def _fused(row: dict[str, Any]) -> str:
    """Convs/MatMuls ONNX Runtime ran as int8 kernels / left as DQ->float->Q on the emulated board ("-": not known)."""
    counted = [c for c in row.get("emulated", []) if "int8_kernels" in c]
    return f"{counted[0]['int8_kernels']}/{counted[0]['dq_float_q']}" if counted else "-"


def _split_line(report: dict[str, Any]) -> str:
    """What the two drops were measured on, or why there is no held-out check."""
    split = report["holdout"]
    if split is None or not split["holdout_samples"]:
        return (split or {}).get("holdout_note") or "no held-out check"
    return (f"drop: on {split['selection_samples']} selection samples (what every choice saw); held-out drop: on "
            f"{split['holdout_samples']} samples nothing was chosen on (seed {split['holdout_seed']}), which checks the "
            "chosen variant")


def _holdout(value: float) -> float:
    from edgesdk.converters.arguments import check_holdout

    return check_holdout(value)


def _holdout_seed(value: int) -> int:
    from edgesdk.converters.arguments import check_holdout_seed

    return check_holdout_seed(value)


def _holdout_min(value: int) -> int:
    from edgesdk.converters.arguments import check_holdout_min

    return check_holdout_min(value)


def _formats(value: str) -> tuple[str, ...]:
    from edgesdk.converters.arguments import parse_formats

    return parse_formats(value)


def _version(value: str) -> str:
    from edgesdk.converters.arguments import check_version

    return check_version(value)


def _name(value: str) -> str:
    from edgesdk.converters.arguments import check_name

    return check_name(value)


def _accuracy_drop(value: float) -> float:
    from edgesdk.converters.arguments import check_accuracy_drop

    return check_accuracy_drop(value)


def _fps(value: float) -> float | None:
    from edgesdk.converters.arguments import check_fps

    return check_fps(value)


@click.command()
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--profile", required=True, help="Target device profile name or YAML path.")
@click.option("--mode", type=click.Choice(["latency", "balanced", "power"]), default="latency", show_default=True)
@click.option("--calibration", type=click.Path(exists=True), required=False,
              help="Calibration data: .npy, .npz (one array per input) or an image folder (default: --eval).")
@click.option("--eval", "evaluation", type=click.Path(exists=True), required=True, help="Evaluation data (same forms).")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False),
              help=".npy of integer class ids for --eval (their names: --class-names).")
@click.option("--metric", type=click.Choice(["top1_agreement", "top1_accuracy", "cosine", "max_abs_error"]),
              help="Accuracy metric (default: top1_accuracy with labels, else top1_agreement).")
@click.option("--max-accuracy-drop", type=float, default=0.5, show_default=True, callback=_checked(_accuracy_drop),
              help="Largest accepted drop vs FP32, in the metric's unit (points for top-1).")
@click.option("--holdout", type=float, default=0.3, show_default=True, callback=_checked(_holdout),
              help="Share of --eval held out of every choice, to check the chosen variant on (0 to 0.5; 0: no check).")
@click.option("--holdout-seed", type=int, default=0, show_default=True, callback=_checked(_holdout_seed),
              help="Seed of the held-out split (the same seed, the same samples).")
@click.option("--holdout-min", type=int, default=20, show_default=True, callback=_checked(_holdout_min),
              help="Fewest samples held out, and left to choose with; with fewer than twice this, no split.")
@click.option("--formats", default="onnx", show_default=True, callback=_checked(_formats),
              help="Comma-separated: onnx, tflite.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Output directory: OUT/variants and OUT/bundle, moved in only once complete.")
@click.option("--force", is_flag=True, help="Replace the conversion an existing --out holds (once the new one is done).")
@click.option("--name", default=None, callback=_checked(_name), help="Bundle name (default: the model file's stem).")
@click.option("--version", "bundle_version", default="1.0.0", show_default=True, callback=_checked(_version),
              help="Bundle version: dotted integers such as 1.4.0.")
@click.option("--input-shape", "input_shapes", multiple=True, callback=_checked(_shapes),
              help="Fix a dynamic input's dims (symbolic, or written as -1 or 0): NAME=D1,D2,...")
@click.option("--fps", type=float, default=None, callback=_checked(_fps),
              help="Frame rate the board must sustain (continuous use).")
@click.option("--power-budget", "power_budget", type=float, default=None,
              help="Average board power allowed at --fps (or the wake cycle), in watts: a limit on the variant, power "
                   "mode and threads the planner may pick (what it minimises is --objective).")
@click.option("--energy-budget", "energy_budget", type=float, default=None, metavar="MWH_PER_H",
              help="The same limit as energy per hour, in mWh/h (a battery's unit; 1000 mWh/h = 1 W).")
@click.option("--objective", type=click.Choice(["latency", "energy"]), default="latency", show_default=True,
              help="What the planner minimises among what fits: latency (the fastest point and variant) or energy "
                   "(the lowest energy per inference that keeps the rate). A budget never changes it.")
@click.option("--wake-every", "wake_every", type=float, default=None, metavar="S",
              help="Duty-cycled device: it wakes every S seconds (sleeping between wakes where the board can).")
@click.option("--frames-per-wake", "frames_per_wake", type=click.IntRange(min=1), default=None, metavar="N",
              help="Duty-cycled device: frames it runs each wake (with --wake-every).")
@click.option("--board-figures", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="`edgesdk bench --json` output measured on the board; replaces the estimate for that model (and, "
                   "with `bench --energy`, its energy per inference).")
@click.option("--emulate/--no-emulate", "emulate", default=None,
              help="Board latency from instructions counted on the board's core under qemu-user (default: when "
                   "`edgesdk emulator setup` was run; --emulate fails without it; --no-emulate scales host timings).")
@click.option("--measure-on", "measure_on", default=None, metavar="DEVICE",
              help="Measure every variant on this device of the fleet (through the OTA server) instead of estimating.")
@click.option("--server", "server_url", envvar="EDGESDK_SERVER", default="http://127.0.0.1:8080", show_default=True,
              help="OTA server admin URL, for --measure-on (env EDGESDK_SERVER).")
@click.option("--token", envvar="EDGESDK_TOKEN", help="Admin token for --measure-on (env EDGESDK_TOKEN).")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False), help="File with the admin token.")
@click.option("--sign", "key", type=click.Path(exists=True, dir_okay=False), help="Ed25519 private key to sign with.")
@click.option("--measure-sign-key", "measure_keys", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="For --measure-on: a private key of the fleet root's bundles role to sign each measurement archive "
                   "with (repeat up to its threshold; default: the --sign key). A device with a root of trust measures "
                   "only archives its bundles threshold signed.")
@click.option("--color", type=click.Choice(["RGB", "BGR", "GRAY"]), default=None,
              help="Preprocessing: channel order the model takes (default: GRAY for a 1-channel input, else RGB).")
@click.option("--scale", type=float, default=None, callback=_checked(_prep_check("scale")),
              help="Preprocessing: pixel scale (default: 1/255).")
@click.option("--mean", default=None, callback=_checked(_prep_check("mean")),
              help="Preprocessing: per-channel mean after scaling, 1 or 3 comma-separated values (default: 0).")
@click.option("--std", default=None, callback=_checked(_prep_check("std")),
              help="Preprocessing: per-channel std after scaling, 1 or 3 non-zero values (default: 1).")
@click.option("--layout", type=click.Choice(["NCHW", "NHWC"]), default=None,
              help="Preprocessing: the image input's layout (default: from its shape).")
@click.option("--class-names", "class_names", type=click.Path(exists=True, dir_okay=False),
              help="Class names in class-id order, one per line or a JSON list; recorded in the bundle. Their count "
                   "must match the model's class output.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def convert(**params: Any) -> None:
    """Build, measure and choose the variant of MODEL that fits PROFILE; write a bundle to OUT/bundle.

    Every option is checked before any work starts: a bad value is a usage error (exit 2).

    Preprocessing (--color, --scale, --mean, --std, --layout) is how an image becomes the
    model's input; the bundle's manifest records it for the device. Image folders are
    transformed with it; .npy/.npz arrays are taken as already transformed, and with them
    nothing is recorded unless a preprocessing option is given. --class-names are recorded too (as its `labels`).

    Third-party output (the quantizer's prints, LiteRT's INFO lines) shows only with
    `edgesdk -v convert ...`, or in the error when a step fails.
    """
    from edgesdk.converters.quiet import warnings_once

    with warnings_once():
        _convert(**params)  # every option by name, as parsed and checked above


def _convert(model: str, profile: str, mode: str, calibration: str | None, evaluation: str, labels: str | None,
             metric: str | None, max_accuracy_drop: float, holdout: float, holdout_seed: int,
             holdout_min: int, formats: tuple[str, ...], out_dir: str, force: bool,
             name: str | None, bundle_version: str, input_shapes: dict[str, list[int]] | None, fps: float | None,
             power_budget: float | None, energy_budget: float | None, objective: str, wake_every: float | None,
             frames_per_wake: int | None, board_figures: tuple[str, ...], emulate: bool | None,
             measure_on: str | None, server_url: str, token: str | None,
             token_file: str | None, key: str | None, measure_keys: tuple[str, ...], color: str | None,
             scale: float | None, mean: tuple[float, ...] | None, std: tuple[float, ...] | None, layout: str | None,
             class_names: str | None, as_json: bool) -> None:
    from edgesdk.converters import Bounds, ConversionRequest, Data, Output, Source, Target
    from edgesdk.converters import convert as run_convert
    from edgesdk.converters.arguments import check_name
    from edgesdk.converters.board.power import check_feasible
    from edgesdk.converters.planning.data import check_class_names, load_arrays, load_class_names, load_labels, model_inputs
    from edgesdk.converters.planning.metrics import check_metric
    from edgesdk.converters.quiet import held_output
    from edgesdk.runtime.model_file import read_model
    from edgesdk.runtime.runtime import Runtime

    try:
        names = load_class_names(class_names) if class_names else None
    except DataError as exc:
        raise click.BadParameter(str(exc), param_hint="'--class-names'") from None
    if name is None:
        try:
            name = check_name(Path(model).stem.replace(" ", "_"))
        except EdgeSDKError as exc:
            raise click.BadParameter(f"{exc} (the default is the model file's name)", param_hint="'--name'") from None
    private_key, measure_signers = None, []
    if key or measure_keys:
        from edgesdk.runtime.signing import load_private_key

        private_key = load_private_key(key) if key else None
        measure_signers = [load_private_key(k) for k in measure_keys] or ([private_key] if private_key else [])
    is_image_folder = Path(evaluation).is_dir()
    try:
        output = Output(out_dir, name=name, version=bundle_version, force=force, private_key=private_key)
    except EdgeSDKError as exc:
        raise click.BadParameter(str(exc), param_hint="'--out'") from None
    try:
        check_metric(metric, has_labels=labels is not None)
    except EdgeSDKError as exc:
        raise click.BadParameter(str(exc), param_hint="'--metric'") from None
    try:
        bounds = Bounds(max_accuracy_drop, fps, power_budget, energy_budget, wake_every, frames_per_wake, objective)
    except EdgeSDKError as exc:
        raise click.BadParameter(str(exc), param_hint="'--fps' / '--power-budget' / '--energy-budget' / "
                                 "'--wake-every' / '--frames-per-wake'") from None
    latencies, energies = _board_figures(board_figures)
    target = Target(profile, mode, board_figures=latencies, emulate=emulate, board_energy=energies)
    check_feasible(target.board, bounds.budget)  # a budget below the board's idle power fails before any work
    if measure_on:
        from edgesdk.cli.fleet import admin_client
        from edgesdk.converters.board.remote import board_measure as remote

        target = replace(target, measure_on=remote(admin_client(server_url, token, token_file), measure_on,
                                                   target.mode, sign_keys=measure_signers))
    read_model(model)  # a wrong extension or corrupt header fails here, before any work
    with held_output("loading the model"), Runtime(model, profile=target.board, mode=target.mode) as rt:
        specs = model_inputs(rt.inputs, input_shapes)  # -1/0 dims are dynamic; --input-shape fixes them
        outputs = rt.outputs
    stated = {"color": color, "scale": scale, "mean": mean, "std": std, "layout": layout}
    if len(specs) != 1 and any(v is not None for v in stated.values()):
        raise click.BadParameter(f"they describe one image input; the model has {len(specs)}: "
                                 f"{', '.join(s.describe() for s in specs)}; leave them out",
                                 param_hint="'--color' / '--scale' / '--mean' / '--std' / '--layout'")
    prep = _preprocessing(specs[0], stated, is_image_folder or bool(calibration and Path(calibration).is_dir()))
    eval_arrays = load_arrays(evaluation, specs, prep)
    calib_arrays = load_arrays(calibration, specs, prep) if calibration else eval_arrays
    label_array = load_labels(labels, len(next(iter(eval_arrays.values())))) if labels else None
    if names is not None:
        try:
            check_class_names(names, outputs, label_array, where=str(class_names))
        except DataError as exc:
            raise click.BadParameter(str(exc), param_hint="'--class-names'") from None
    recorded = {**(prep.as_dict() if prep else {}), **({"labels": list(names)} if names else {})}
    output = replace(output, preprocessing=recorded)
    request = ConversionRequest(Source(model, input_shapes=input_shapes), target,
                                Data(calib_arrays, eval_arrays, label_array, metric, holdout=holdout,
                                     holdout_seed=holdout_seed, holdout_min=holdout_min), output,
                                bounds, formats)
    stages = _Stages()
    with contextlib.ExitStack() as stack:
        if sys.stderr.isatty():
            # One bar per stage: the label says which stage runs, the bar how far it is (samples, blocks).
            stages.bar = stack.enter_context(click.progressbar(length=100, label=f"{'converting':<{_LABEL_WIDTH}}",
                                                               file=sys.stderr, show_eta=False, width=24))
        report = run_convert(request, stages)
    data = report.to_dict()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(_table(data))
    for line in _notes(data):
        click.echo(line)
    click.echo(_split_line(data))
    if data["reference_score"] is not None:
        unit = "%" if data["metric_unit"] == "points" else f" {data['metric_unit']}"
        click.echo(f"FP32 {data['metric']}: {data['reference_score']:.4g}{unit} (every drop is from it)")
    click.echo(f"objective: {data['objective']} (--objective); host ms = this host's median/95th percentile over "
               "its timed runs, not the board's")
    click.echo(f"\nchosen: {data['chosen']} — {data['reason']}")
    planned = data["planned"]
    engine = f"on {planned['runs_on']}" if planned["runs_on"] != "cpu" else f"with {planned['threads']} thread(s)"
    click.echo(f"planned for power mode {planned['power_mode']} {engine} (runtime mode "
               f"{planned['runtime_mode']}); mJ = energy per inference above idle, avg W = the board's average power "
               "at the asked rate")
    click.echo(_basis_lines(data))
    if any(v["estimate_basis"].startswith("estimated GPU roofline") for v in data["variants"]):
        from edgesdk.converters.board.gpu_estimate import EFFICIENCY, PER_KERNEL_US

        click.echo(f"GPU rows: a roofline of each layer's FLOPs and bytes against the accelerator's data-sheet peaks at "
                   f"the power mode's GPU clock, / {EFFICIENCY} efficiency + {PER_KERNEL_US:g} us per kernel (fitted on "
                   "published TensorRT figures, benchmarks/converter/calibration.py); accuracy from this host's CPU run of the "
                   "same file")
    click.echo("int8/DQ-float = Convs and MatMuls ONNX Runtime runs as int8 kernels / leaves as DequantizeLinear -> "
               "float -> QuantizeLinear, in the graph it optimizes on the emulated board")
    if data["tflite_error"]:
        click.echo(f"TFLite variants not produced: {data['tflite_error']}")
    click.echo(f"bundle: {data['bundle']}" + (" (signed)" if private_key else ""))
    click.echo(stages.summary())
