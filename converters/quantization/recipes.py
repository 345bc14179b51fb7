"""Recipes: accuracy-keeping methods combined into static INT8 variants the planner chooses between.

A recipe is pre-transforms of the FP32 model (cross-layer equalization, SmoothQuant-style
migration), one calibration method, post-fixes of the QDQ model (bias correction, adaptive
rounding) and the graph fixes for known traps (:mod:`.graph_fixes`). Which one keeps a model's
accuracy depends on the model (equalization needs ReLU-joined convs, SmoothQuant MatMuls with
outlier channels, the trap fix a mixed-range output), so :func:`build_recipes` builds each
recipe's variant and the pipeline measures them like any other.

Only variants that differ are returned: a recipe whose methods changed nothing on this model
(every :class:`~.methods.MethodResult` with ``changed == 0`` and no trap found) is the plain
static variant again, and a recipe whose methods that did change something are the same as an
earlier recipe's is that variant again; neither is built twice or measured (each measured
variant is later counted under emulation, minutes on a real model). A method whose module is
missing skips its recipe, with the reason logged.

A pre-transform changes the FP32 weights, so the transformed model is calibrated again (one
streaming pass, the recipe's method only) and is the float source of that variant: the mixed
search must put its blocks back in float from the transformed model, not the original.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgesdk.converters.formats.onnx_model import save_onnx
from edgesdk.converters.quantization.calibrate import calibrate
from edgesdk.converters.quantization.config import CalibrationMethod, QuantizationConfig
from edgesdk.converters.quantization.graph_fixes import find_traps, ranges_from_cache
from edgesdk.converters.quantization.methods import MethodResult
from edgesdk.converters.quantization.quantize import quantize_static_int8
from edgesdk.errors import EdgeSDKError

__all__ = ["Recipe", "RecipeVariant", "RECIPES", "build_recipes", "ADAROUND_BUDGET_S"]

log = logging.getLogger(__name__)

#: Wall seconds adaptive rounding may spend on one model.
ADAROUND_BUDGET_S = 300.0
_PRE = ("cle", "smoothquant")
_POST = ("bias_correction", "empirical_bias_correction", "adaround")


@dataclass(frozen=True)
class Recipe:
    """Methods combined into one static INT8 variant; ``name`` ends its label (``onnx-int8-static-<name>``)."""

    name: str
    #: Rewrites of the FP32 model before calibration, in order: "cle", "smoothquant".
    pre: tuple[str, ...] = ()
    #: Edits of the QDQ model after quantization, in order: "bias_correction", "empirical_bias_correction",
    #: "adaround".
    post: tuple[str, ...] = ()
    #: Graph-fix strategy for known traps (:data:`.graph_fixes.STRATEGIES`), or None for none.
    fixes: str | None = "concat"

    def __post_init__(self) -> None:
        from edgesdk.errors import ConversionError

        unknown = [m for m in self.pre if m not in _PRE] + [m for m in self.post if m not in _POST]
        if unknown:
            raise ConversionError(f"recipe {self.name!r}: unknown method(s) {unknown}; pre-transforms are "
                                  f"{list(_PRE)}, post-fixes {list(_POST)}")


#: Cheapest first: a later recipe that comes out the same as an earlier one is not built again. Empirical bias
#: correction is not among them: layer by layer it runs the model once per layer (over 20 minutes on the OCR
#: recognizer on a busy 2-core host); a caller may still name it in a recipe of its own.
RECIPES = (
    Recipe("fix"),
    Recipe("fix-head", fixes="head"),
    Recipe("bc", post=("bias_correction",)),
    Recipe("cle-bc", pre=("cle",), post=("bias_correction",)),
    Recipe("sq-bc", pre=("smoothquant",), post=("bias_correction",)),
    Recipe("cle-ada", pre=("cle",), post=("adaround",)),
)


@dataclass(frozen=True)
class RecipeVariant:
    """One recipe's static INT8 file and what was applied to make it."""

    recipe: Recipe
    path: Path
    #: The FP32 model this variant was quantized from (the transformed one after a pre-transform).
    fp32_path: Path
    method: CalibrationMethod
    #: Methods that changed something, in the order they ran (e.g. ``("cle", "bias_correction")``).
    applied: tuple[str, ...]
    #: One line per method that ran (changed something or not), for the report.
    notes: tuple[str, ...]
    float_nodes: tuple[str, ...] = ()
    seconds: float = 0.0
    results: tuple[MethodResult, ...] = field(default=(), repr=False)

    @property
    def label(self) -> str:
        """The variant's name in the report: ``onnx-int8-static-<recipe>``."""
        return f"onnx-int8-static-{self.recipe.name}"

    def config(self) -> dict[str, Any]:
        """What a manifest records about this variant beyond the quantization config."""
        return {"calibration_method": self.method.value, "recipe": self.recipe.name,
                "methods": list(self.applied), "float_nodes": list(self.float_nodes)}


def build_recipes(fp32_path: Path, calibration: Mapping[str, np.ndarray], config: QuantizationConfig,
                  method: CalibrationMethod, work: Path, ranges: Path | None = None,
                  recipes: tuple[Recipe, ...] = RECIPES,
                  adaround_budget_s: float = ADAROUND_BUDGET_S) -> list[RecipeVariant]:
    """One static INT8 variant per recipe that changes something new, written in ``work``.

    ``ranges`` is the calibration cache of ``method`` on ``fp32_path`` (calibrated here when None).
    """
    work.mkdir(parents=True, exist_ok=True)
    sources = _Sources(fp32_path, calibration, config, method, work, ranges)
    built: list[RecipeVariant] = []
    seen: dict[tuple[Any, ...], str] = {}
    for recipe in recipes:
        try:
            variant = _build(recipe, sources, calibration, config, method, work, adaround_budget_s)
        except _Missing as missing:
            log.info("recipe %s skipped: %s", recipe.name, missing)
            continue
        except EdgeSDKError as exc:  # one recipe failing (a quantizer error, a method's) leaves the others
            log.warning("recipe %s failed: %s", recipe.name, exc)
            continue
        key = (variant.applied, variant.float_nodes)
        if not variant.applied and not variant.float_nodes:
            log.info("recipe %s skipped: its methods changed nothing on this model (%s)", recipe.name,
                     "; ".join(variant.notes))
            variant.path.unlink(missing_ok=True)
            continue
        if key in seen:
            log.info("recipe %s skipped: on this model it is recipe %s again", recipe.name, seen[key])
            variant.path.unlink(missing_ok=True)
            continue
        seen[key] = recipe.name
        built.append(variant)
    return built


class _Missing(Exception):
    """A method's module is not there (yet)."""


class _Sources:
    """The FP32 model and its calibration cache after each distinct chain of pre-transforms (made once)."""

    def __init__(self, fp32_path: Path, calibration: Mapping[str, np.ndarray], config: QuantizationConfig,
                 method: CalibrationMethod, work: Path, ranges: Path | None) -> None:
        self.calibration, self.config, self.method, self.work = calibration, config, method, work
        self.made: dict[tuple[str, ...], tuple[Path, Path, tuple[MethodResult, ...]]] = {}
        self.fp32_path = fp32_path
        self.original_ranges = ranges

    def _calibrate(self, path: Path, folder: str) -> Path:
        result = calibrate(path, self.calibration, (self.method,), self.work / folder,
                           percentile=self.config.percentile, symmetric=bool(self.config.activation_symmetric),
                           max_samples=self.config.max_calibration_samples)
        return result.caches[self.method]

    def get(self, pre: tuple[str, ...]) -> tuple[Path, Path, tuple[MethodResult, ...]]:
        """(FP32 path, its ranges, the pre-transforms' results) for a chain of pre-transforms."""
        if pre in self.made:
            return self.made[pre]
        results: list[MethodResult] = []
        model = None
        for name in pre:
            model = model if model is not None else onnx.load(str(self.fp32_path))
            result = _pre_method(name)(model, self.calibration)
            results.append(result)
            model = result.model
        if not any(r.changed for r in results):
            if self.original_ranges is None:
                self.original_ranges = self._calibrate(self.fp32_path, "calibration-original")
            made = (self.fp32_path, self.original_ranges, tuple(results))
        else:
            assert model is not None
            tag = "-".join(pre)
            path = save_onnx(model, self.work / f"fp32-{tag}.onnx")
            made = (path, self._calibrate(path, f"calibration-{tag}"), tuple(results))
        self.made[pre] = made
        return made


def _build(recipe: Recipe, sources: _Sources, calibration: Mapping[str, np.ndarray], config: QuantizationConfig,
           method: CalibrationMethod, work: Path, adaround_budget_s: float) -> RecipeVariant:
    started = time.perf_counter()
    posts = [_post_method(name, adaround_budget_s) for name in recipe.post]  # missing modules first
    fp32_path, ranges, pre_results = sources.get(recipe.pre)
    notes = [r.note for r in pre_results]
    float_nodes: tuple[str, ...] = ()
    fp32 = onnx.load(str(fp32_path))
    if recipe.fixes is not None:
        fix = find_traps(fp32, ranges_from_cache(ranges), recipe.fixes)
        float_nodes = fix.float_nodes
        notes.append(fix.note)
    path = work / f"onnx-int8-static-{recipe.name}.onnx"
    quantize_static_int8(fp32_path, path, ranges, config, method, float_nodes)
    results = list(pre_results)
    if posts:
        model = onnx.load(str(path))
        for post in posts:
            result = post(model, fp32, calibration)
            results.append(result)
            notes.append(result.note)
            model = result.model
        save_onnx(model, path)
    applied = tuple(name for name, r in zip((*recipe.pre, *recipe.post), results) if r.changed > 0)
    return RecipeVariant(recipe, path, fp32_path, method, applied, tuple(notes), float_nodes,
                         time.perf_counter() - started, tuple(results))


def _module(name: str) -> Any:
    try:
        return importlib.import_module(f"edgesdk.converters.quantization.{name}")
    except ModuleNotFoundError as exc:
        raise _Missing(f"edgesdk.converters.quantization.{name} is not available ({exc})") from None


def _pre_method(name: str) -> Callable[[onnx.ModelProto, Mapping[str, np.ndarray]], MethodResult]:
    if name == "cle":
        equalize = _module("equalize").equalize
        return lambda model, calibration: equalize(model)
    smooth = _module("smoothquant").smooth
    return lambda model, calibration: smooth(model, calibration)


def _post_method(name: str, budget_s: float) -> Callable[[onnx.ModelProto, onnx.ModelProto,
                                                           Mapping[str, np.ndarray]], MethodResult]:
    if name in ("bias_correction", "empirical_bias_correction"):
        return getattr(_module("bias_correction"), name)  # type: ignore[no-any-return]
    adaround = _module("adaround").adaround
    return lambda qdq, fp32, calibration: adaround(qdq, fp32, calibration, budget_s)
