"""The single-value checks of a conversion's arguments, each returning the value it accepts.

A conversion takes minutes; a mistyped version or an ``--out`` that already holds a
bundle must fail in a second, not at the end. The parts of a
:class:`~edgesdk.converters.request.ConversionRequest` run these checks when they are
built; the CLI runs them while it parses its options, so a bad option is a usage error
(exit 2) naming it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgesdk.errors import ConversionError, DataError, SignatureError
from edgesdk.runtime.bundle import parse_version, safe_name

__all__ = ["FORMATS", "OUTPUTS", "MAX_HOLDOUT", "parse_formats", "check_version", "check_name", "check_accuracy_drop",
           "check_fps", "check_input_shapes", "check_holdout", "check_holdout_seed", "check_holdout_min",
           "check_out_dir", "check_private_key"]

FORMATS = ("onnx", "tflite")
#: What a conversion writes into its output directory.
OUTPUTS = ("variants", "bundle")
#: The largest share of the evaluation samples held out: the variant is chosen on the rest, which stays the larger part.
MAX_HOLDOUT = 0.5


def parse_formats(formats: str | Sequence[str]) -> tuple[str, ...]:
    """``"onnx,tflite"`` or ``("onnx", "tflite")`` -> the known formats asked for, in order."""
    items = formats.split(",") if isinstance(formats, str) else list(formats)
    parsed = tuple(dict.fromkeys(str(f).strip() for f in items if str(f).strip()))
    if unknown := [f for f in parsed if f not in FORMATS]:
        raise ConversionError(f"unknown format(s) {unknown}; use {' and/or '.join(FORMATS)}, e.g. onnx,tflite")
    if not parsed:
        raise ConversionError(f"no format given; use {' and/or '.join(FORMATS)}")
    return parsed


def check_version(version: str) -> str:
    """A bundle version: dotted integers such as ``1.4.0`` (:func:`edgesdk.runtime.bundle.parse_version`)."""
    parse_version(version)
    return version


def check_name(name: str) -> str:
    """A bundle name: it becomes file and directory names on the server and the devices."""
    return safe_name(name, "bundle name")


def check_accuracy_drop(value: float) -> float:
    """The accepted accuracy drop vs FP32: a finite number >= 0, in the metric's unit."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConversionError(f"max accuracy drop {value!r} must be a number >= 0 in the metric's unit "
                              "(points for top-1, e.g. 0.5)")
    return float(value)


def check_fps(value: float | None) -> float | None:
    """The frame rate the board must sustain: None or a finite number > 0."""
    if value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0):
        raise ConversionError(f"fps {value!r} must be a number > 0 (frames per second, e.g. 30), or left out")
    return None if value is None else float(value)


def check_holdout(value: float) -> float:
    """The share of evaluation samples held out of every choice: 0 (no held-out check) to :data:`MAX_HOLDOUT`."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 <= value <= MAX_HOLDOUT):
        raise DataError(f"holdout {value!r} must be a fraction from 0 to {MAX_HOLDOUT} of the evaluation samples "
                        "(e.g. 0.3 holds out 30% to check the chosen variant on), or 0 for no held-out check")
    return float(value)


def check_holdout_seed(value: int) -> int:
    """The seed of the held-out split: an integer >= 0 (the same seed, the same split)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataError(f"holdout seed {value!r} must be an integer >= 0 (the same seed gives the same split)")
    return value


def check_holdout_min(value: int) -> int:
    """The fewest samples held out (and left to choose with) for a split to be made: an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DataError(f"holdout minimum {value!r} must be an integer >= 1 (the fewest samples held out, e.g. 20)")
    return value


def check_input_shapes(shapes: Mapping[str, Sequence[int]] | None) -> dict[str, list[int]] | None:
    """Fixed input shapes: input name -> dims, every dim an integer >= 1."""
    if not shapes:
        return None
    checked = {}
    for name, dims in shapes.items():
        if not name or isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or not dims or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
            raise ConversionError(f"input shape {name!r}: {dims!r} must be a list of integers >= 1 for a named input, "
                                  "e.g. input=1,3,224,224")
        checked[name] = list(dims)
    return checked


def check_out_dir(out_dir: str | os.PathLike[str], force: bool = False) -> Path:
    """The output directory: refused when it is a file, cannot be written, or holds a conversion and not ``force``."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConversionError(f"output directory {out} is a file; give a directory path")
    held = [name for name in OUTPUTS if (out / name).exists()]
    if held and not force:
        raise ConversionError(f"{out} already holds a conversion ({', '.join(f'{n}/' for n in held)}); pass --force "
                              "(force=True) to replace it once the new one is complete, or choose another directory")
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConversionError(f"cannot write in {existing} (for output directory {out}); choose a directory you can "
                              "write to")
    return out


def check_private_key(key: Any) -> Any:
    """None, or an Ed25519 private key (:func:`edgesdk.runtime.signing.load_private_key`)."""
    if key is None:
        return None
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError(f"private_key is a {type(key).__name__}; load an Ed25519 key with "
                             "edgesdk.runtime.signing.load_private_key(path) (create one with `edgesdk keys generate`)")
    return key
