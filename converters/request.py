"""What :func:`~edgesdk.converters.pipeline.convert` is asked to do: a frozen, validated request.

A conversion takes minutes; a mistyped version or an ``--out`` that already holds a
bundle must fail in a second, not at the end. So every part checks itself when it is
built (:mod:`.arguments` has the single-value checks, shared with the CLI's options)::

    ConversionRequest(
        Source("model.onnx"),                        # or a PyTorch module + example_inputs
        Target("rk3588", mode="latency"),            # the board, and where its latencies come from
        Data(calibration={"input": x_cal}, evaluation={"input": x_eval}, labels=y_eval,
             holdout=0.3),                           # 30% of x_eval only checks the chosen variant
        Output("out", name="digits", version="1.4.0"),
        bounds=Bounds(max_accuracy_drop=0.5, fps=5, power_budget_w=3.0),  # what it must meet
        formats=("onnx", "tflite"),
    )

Checks that need the model (data shapes and dtypes against its inputs) run in
``convert()`` once the model is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.converters.arguments import (
    check_accuracy_drop,
    check_fps,
    check_holdout,
    check_holdout_min,
    check_holdout_seed,
    check_input_shapes,
    check_name,
    check_out_dir,
    check_private_key,
    check_version,
    parse_formats,
)
from edgesdk.converters.board.power import PowerBudget, check_feasible
from edgesdk.converters.planning.metrics import check_metric
from edgesdk.converters.quantization.config import QuantizationConfig
from edgesdk.errors import ConversionError, DataError
from edgesdk.runtime.profiles import DeviceProfile, RuntimeMode, load_profile
from edgesdk.runtime.scheduling import plan_cores

__all__ = ["BoardMeasure", "Source", "Target", "Data", "Bounds", "Output", "ConversionRequest"]

#: measure_on(model path, evaluation inputs) -> what a board of the fleet measured
#: (:func:`edgesdk.converters.board.remote.board_measure` makes one).
BoardMeasure = Callable[[Path, Mapping[str, np.ndarray]], Any]


@dataclass(frozen=True)
class Source:
    """The model to convert: an ``.onnx``/``.tflite`` path, or a PyTorch module exported with ``example_inputs``.

    ``input_shapes`` fixes dynamic input dims (input name -> dims, e.g. ``{"input": [1, 3, 224, 224]}``).
    A ``.tflite`` file is measured and bundled as given (no variants are built from it).
    """

    model: str | os.PathLike[str] | Any
    example_inputs: Sequence[Any] | None = None
    input_shapes: Mapping[str, Sequence[int]] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.model, (str, os.PathLike)):
            object.__setattr__(self, "model", Path(self.model))
        elif self.example_inputs is None:
            raise ConversionError("a PyTorch module needs example_inputs to be exported, e.g. "
                                  "[torch.zeros(1, 3, 224, 224)]")
        object.__setattr__(self, "input_shapes", check_input_shapes(self.input_shapes))

    @property
    def path(self) -> Path | None:
        """The model file, or None for a PyTorch module."""
        return self.model if isinstance(self.model, Path) else None

    @property
    def is_tflite(self) -> bool:
        """A ``.tflite`` file, passed through as given."""
        return self.path is not None and self.path.suffix == ".tflite"


@dataclass(frozen=True)
class Target:
    """The board (a profile name, YAML path or :class:`DeviceProfile`), its power mode, and its latencies' source.

    A variant's board latency is counted on the board's own core type under qemu-user
    (:mod:`edgesdk.converters.board.emulate`) when the emulator is set up (``emulate``: None, the
    default, uses it when present; True requires it; False never), and otherwise scaled from
    this host's measurement (``host``: this machine's profile, detected when None).
    ``board_figures`` maps a variant's model SHA-256 to a latency measured on the board
    (``edgesdk bench --json``'s ``p50_ms``); ``measure_on`` runs every variant on a device of
    the fleet instead, and its latency, memory and outputs replace this host's.
    """

    profile: str | os.PathLike[str] | DeviceProfile
    mode: str = "latency"
    board_figures: Mapping[str, float] | None = None
    measure_on: BoardMeasure | None = None
    host: DeviceProfile | None = None
    emulate: bool | None = None
    #: A variant's model SHA-256 -> energy per inference above idle (mJ) measured on the board
    #: (``edgesdk bench --energy --json``); it replaces the power model at the measured point.
    board_energy: Mapping[str, float] | None = None
    #: The loaded profile (set at construction).
    board: DeviceProfile = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        board = load_profile(self.profile)
        if self.emulate not in (None, True, False):
            raise ConversionError(f"emulate must be None, True or False, got {self.emulate!r}")
        mode = RuntimeMode.parse(self.mode).value
        plan_cores(board, mode, available=frozenset(range(1024)))  # a mode the profile cannot schedule fails here
        object.__setattr__(self, "board", board)
        object.__setattr__(self, "mode", mode)

    def host_profile(self) -> DeviceProfile:
        """The profile of the machine measuring the variants: ``host``, or this machine's, detected."""
        from edgesdk.runtime.detect import detect_device

        return self.host or detect_device()


@dataclass(frozen=True)
class Data:
    """Calibration and evaluation inputs (input name -> batch-first array), labels and the accuracy metric.

    ``labels`` are class ids for ``evaluation``, one per sample. ``metric`` is a name
    (``top1_accuracy``, which needs labels, ``top1_agreement``, ``cosine``,
    ``max_abs_error``), a callable, or None (top-1 accuracy with labels, else agreement).

    ``holdout`` is the share of the evaluation samples held out of every choice the
    conversion makes and used only to check the chosen variant (0 to 0.5; 0: no check);
    ``holdout_seed`` fixes which ones; a split is made only with at least ``holdout_min``
    samples on each side (see :func:`edgesdk.converters.planning.data.split_evaluation` for the
    rule). When ``calibration`` is ``evaluation`` itself, only the selection part calibrates.
    """

    calibration: Mapping[str, np.ndarray]
    evaluation: Mapping[str, np.ndarray]
    labels: np.ndarray | None = None
    metric: str | Callable[..., float] | None = None
    holdout: float = 0.3
    holdout_seed: int = 0
    holdout_min: int = 20

    def __post_init__(self) -> None:
        check_metric(self.metric, has_labels=self.labels is not None)
        object.__setattr__(self, "holdout", check_holdout(self.holdout))
        object.__setattr__(self, "holdout_seed", check_holdout_seed(self.holdout_seed))
        object.__setattr__(self, "holdout_min", check_holdout_min(self.holdout_min))
        if self.labels is not None and self.evaluation:
            first = next(iter(self.evaluation.values()))
            if hasattr(first, "__len__") and len(self.labels) != len(first):
                raise DataError(f"{len(self.labels)} labels for {len(first)} evaluation samples; give one class id "
                                "per sample")


@dataclass(frozen=True)
class Bounds:
    """What the chosen variant must meet besides the board's memory budget.

    ``max_accuracy_drop`` is the accepted drop vs FP32 in the metric's unit (points for
    top-1). ``fps`` is the frame rate the board must sustain (None: any); or, for a device
    that sleeps between bursts, ``wake_every_s`` with ``frames_per_wake``. ``power_budget_w``
    (average watts) or ``energy_budget_mwh_per_h`` bounds the board's average power at that
    rate; the planner then moves the model between power modes and thread counts to meet it
    (:mod:`edgesdk.converters.board.power`).
    """

    max_accuracy_drop: float = 0.5
    fps: float | None = None
    power_budget_w: float | None = None
    energy_budget_mwh_per_h: float | None = None
    wake_every_s: float | None = None
    frames_per_wake: int | None = None
    #: What the choice minimises among what fits: "latency" (default) or "energy"
    #: (:data:`edgesdk.converters.board.power.OBJECTIVES`).
    objective: str = "latency"

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_accuracy_drop", check_accuracy_drop(self.max_accuracy_drop))
        object.__setattr__(self, "fps", check_fps(self.fps))
        self.budget  # noqa: B018 - validates the power fields together

    @property
    def budget(self) -> PowerBudget:
        """The rate and power limit, as the planner takes them."""
        return PowerBudget(self.fps, self.power_budget_w, self.energy_budget_mwh_per_h, self.wake_every_s,
                           self.frames_per_wake, self.objective)


@dataclass(frozen=True)
class Output:
    """Where the conversion goes and what its bundle is called.

    ``out_dir`` gets ``variants/`` (every file built) and ``bundle/``; one that already
    holds them is refused unless ``force``. ``private_key`` (Ed25519,
    :func:`edgesdk.runtime.signing.load_private_key`) signs the bundle; ``preprocessing`` is saved in
    its manifest as given. What devices read there (:mod:`edgesdk.runtime.preprocess`) is an
    :meth:`~edgesdk.runtime.preprocess.ImagePreprocessing.as_dict` (``color``, ``scale``, ``mean``,
    ``std``, ``layout``: how an image becomes the model input, whatever form the data had) and
    ``labels``, the class names in class-id order.
    """

    out_dir: str | os.PathLike[str]
    name: str = "model"
    version: str = "1.0.0"
    force: bool = False
    private_key: Any = None
    preprocessing: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.name)
        check_version(self.version)
        check_private_key(self.private_key)
        object.__setattr__(self, "out_dir", check_out_dir(self.out_dir, self.force))

    @property
    def path(self) -> Path:
        """``out_dir`` as a Path."""
        return Path(self.out_dir)


@dataclass(frozen=True)
class ConversionRequest:
    """One conversion: the model, the board, the data, where it goes, the bounds, the formats (see the module doc).

    ``quantization`` overrides the board's preset (:meth:`QuantizationConfig.for_profile`).
    Every part is checked when it is built, so a bad request fails before any work.
    """

    source: Source
    target: Target
    data: Data
    output: Output
    bounds: Bounds = Bounds()
    formats: tuple[str, ...] = ("onnx",)
    quantization: QuantizationConfig | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "formats", parse_formats(self.formats))
        check_feasible(self.target.board, self.bounds.budget)  # a budget below idle fails now, not after minutes

    @property
    def config(self) -> QuantizationConfig:
        """The quantization settings: ``quantization``, or the board's preset."""
        return self.quantization or QuantizationConfig.for_profile(self.target.board)
