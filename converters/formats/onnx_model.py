"""Loading, exporting, shape-fixing and shrinking ONNX models (before any quantization).

**Dynamic dims.** A dim is dynamic when it is symbolic (``dim_param: "batch"``), has no
value at all, or has a value below 1: older exporters write ``dim_value: -1`` (or ``0``)
for a dynamic dim, e.g. PP-OCR v2's text-direction classifier. :func:`load_onnx` turns
such dims of the graph's inputs and outputs into symbolic ones (``x_dim0``), as ONNX
Runtime, the quantizer and onnx2tf read them; :func:`fix_input_shapes` fixes any dynamic
dim to the size asked for. Only a dim with a value >= 1 is fixed, and a different size for
it is an error.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgesdk.errors import ConversionError, ModelFormatError
from edgesdk.files import atomic_path

__all__ = ["load_onnx", "save_onnx", "export_torch", "fix_input_shapes", "is_dynamic_dim", "simplify", "MIN_OPSET"]

#: Per-channel QDQ quantization needs opset 13; older models are converted up.
MIN_OPSET = 13


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:
        raise ConversionError("converting needs the [convert] extra: pip install 'edgesdk[convert]'") from exc
    return onnx


def load_onnx(path: str | os.PathLike[str]) -> Any:
    """Load and check an ONNX model; run shape inference; bring the opset up to MIN_OPSET."""
    onnx = _onnx()
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelFormatError(f"{path}: cannot read model: {exc.strerror}") from exc
    if data[4:8] == b"TFL3":
        raise ModelFormatError(f"{path}: this is a TFLite model, not ONNX; pass the ONNX source, or give the .tflite "
                               "file to the planner as is")
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # protobuf DecodeError and friends
        raise ModelFormatError(f"{path}: not an ONNX model ({type(exc).__name__}: {exc}); export it again") from exc
    if not model.graph.node:
        raise ModelFormatError(f"{path}: not an ONNX model (no graph nodes); export it again")
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ModelFormatError(f"{path}: the ONNX checker rejects this model: {first}; fix the exporter or the graph") \
            from exc
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        from onnx import version_converter

        try:
            model = version_converter.convert_version(model, MIN_OPSET)
        except Exception as exc:
            raise ConversionError(f"{path}: opset {opset} could not be raised to {MIN_OPSET} ({exc}); re-export "
                                  f"with opset >= {MIN_OPSET}") from exc
    _symbolic_dims(model)
    return onnx.shape_inference.infer_shapes(model, strict_mode=False)


def _symbolic_dims(model: Any) -> None:
    """Dims of the graph's inputs and outputs written as -1 or 0 become symbolic (``<tensor>_dim<axis>``), in place."""
    for value in (*model.graph.input, *model.graph.output):
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value < 1:
                dim.Clear()
                dim.dim_param = f"{value.name}_dim{axis}"


def save_onnx(model: Any, path: str | os.PathLike[str]) -> Path:
    """Save atomically: a half-written model never appears under ``path``."""
    onnx = _onnx()
    with atomic_path(path) as tmp:
        onnx.save(model, str(tmp))
    return Path(path)


def export_torch(
    module: Any,
    example_inputs: Sequence[Any],
    path: str | os.PathLike[str],
    input_names: Sequence[str] = ("input",),
    output_names: Sequence[str] = ("output",),
    dynamic_batch: bool = False,
) -> Path:
    """Export a PyTorch ``nn.Module`` with the torch.export-based exporter (needs onnxscript)."""
    try:
        import torch
    except ImportError as exc:
        raise ConversionError("exporting a PyTorch module needs torch installed") from exc
    module = module.eval()
    dynamic_shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=1, max=4096)
        dynamic_shapes = tuple({0: batch} for _ in example_inputs)
    try:
        with warnings.catch_warnings():
            # torch's exporter emits its own internal deprecation warnings; they are not the user's to fix.
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, tuple(example_inputs), input_names=list(input_names),
                                        output_names=list(output_names), dynamic_shapes=dynamic_shapes, dynamo=True,
                                        verbose=False)
    except Exception as exc:
        raise ConversionError(f"torch.onnx.export failed for {type(module).__name__}: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0]}") from exc
    if program is None:
        raise ConversionError(f"torch.onnx.export returned no program for {type(module).__name__}")
    return save_onnx(program.model_proto, path)


def is_dynamic_dim(dim: Any) -> bool:
    """True for a symbolic dim, a dim without a value, or one written as -1 or 0 (see the module doc)."""
    return not dim.HasField("dim_value") or dim.dim_value < 1


def fix_input_shapes(model: Any, shapes: Mapping[str, Sequence[int]]) -> Any:
    """Replace dynamic input dims (module doc) by the user's fixed shapes (symbolic shape inference needs them)."""
    onnx = _onnx()
    inputs = {i.name: i for i in model.graph.input}
    for name, shape in shapes.items():
        if name not in inputs:
            raise ConversionError(f"cannot fix shape of {name!r}: the model's inputs are {sorted(inputs)}")
        dims = inputs[name].type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise ConversionError(f"input {name!r} has rank {len(dims)}, the fixed shape {list(shape)} has {len(shape)}")
        if clash := next(((d, size) for d, size in zip(dims, shape) if not is_dynamic_dim(d) and d.dim_value != size),
                         None):
            raise ConversionError(f"input {name!r} has the shape {_dims(dims)}: its fixed dim {clash[0].dim_value} "
                                  f"cannot become {clash[1]}; give {name}={','.join(map(str, _fixed(dims, shape)))} "
                                  "(only dynamic dims, shown as ?, can be fixed)")
        for dim, size in zip(dims, shape):
            dim.Clear()
            dim.dim_value = int(size)
    for output in model.graph.output:  # -1/0 written by an old exporter: let shape inference fill them in
        for dim in output.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value < 1:
                dim.Clear()
    for value in list(model.graph.value_info):
        model.graph.value_info.remove(value)
    return onnx.shape_inference.infer_shapes(model, strict_mode=False)


def _dims(dims: Any) -> str:
    """``[?, 3, 48, ?]``: the dims as they read in messages."""
    return "[" + ", ".join("?" if is_dynamic_dim(d) else str(d.dim_value) for d in dims) + "]"


def _fixed(dims: Any, shape: Sequence[int]) -> list[int]:
    """``shape`` with the model's fixed dims in place of the ones asked for."""
    return [size if is_dynamic_dim(d) else int(d.dim_value) for d, size in zip(dims, shape)]


def simplify(model: Any) -> Any:
    """Shrink the graph, keeping it portable.

    onnxslim (pure Python, no native build) folds constants and removes dead or redundant
    nodes; then ONNX Runtime's *basic* offline optimizations fuse Conv+BatchNorm/Add/Mul.
    Extended/layout levels are not used: they emit ORT-only contrib ops that LiteRT/onnx2tf
    and other runtimes cannot read.
    """
    onnx = _onnx()
    import onnxruntime as ort

    try:
        import onnxslim
    except ImportError as exc:
        raise ConversionError("simplifying needs onnxslim: pip install 'edgesdk[convert]'") from exc
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            slim = onnxslim.slim(model)
    except Exception as exc:
        raise ConversionError(f"onnxslim failed: {type(exc).__name__}: {exc}") from exc
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save(slim, str(src))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(dst)
        try:
            ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ConversionError(f"onnxruntime could not optimize the model: {exc}") from exc
        optimized = onnx.load(str(dst))
    return onnx.shape_inference.infer_shapes(optimized, strict_mode=False)
