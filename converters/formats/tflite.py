"""TFLite variants of an ONNX model, made by onnx2tf in a tool environment of its own.

**The tool environment** (:mod:`edgesdk.converters.formats.onnx2tf_tool`): onnx2tf runs in a virtualenv of
its own, made on first use, as a subprocess, offline.

**The variants** (files in ``out_dir``):

- ``model_fp32.tflite`` (``fp32``): float32 weights and compute; checked against ONNX
  Runtime on the evaluation inputs (``parity_max_abs_diff``).
- ``model_fp16.tflite`` (``fp16``): float16 weights, half the size; dequantized to
  float32 at load time (XNNPACK may compute in fp16 where the CPU supports it).
- ``model_int8_dynamic.tflite`` (``int8_dynamic``): int8 weights, activations quantized
  on the fly by the kernels (dynamic-range quantization); no calibration data needed.
- ``model_int8_full.tflite`` (``int8_full``, only with ``calibration``): int8 weights and
  activations, activation ranges calibrated on your data; float32 input and output (a
  QUANTIZE op at the entry, DEQUANTIZE at the exit), so it takes the same inputs as fp32.

**Activations.** HardSwish and HardSigmoid are rewritten before onnx2tf into Mul/Add/Clip(0, 6)
(see ``_xnnpack_activations``): onnx2tf's own forms become TFLite ops that LiteRT's XNNPACK
delegate does not run in int8, which made full-int8 models with them slower than FP32.

**Layout.** onnx2tf turns 3-, 4- and 5-D inputs channels-last (NCHW becomes NHWC),
which is what TFLite kernels run fastest; edgesdk keeps that. :attr:`TFLiteResult.inputs`
reports each input's TFLite layout and shape; :meth:`TFLiteInput.to_tflite` transposes
NCHW data to match. Input tensors are renamed to the ONNX input names; output tensor
names are onnx2tf's.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from edgesdk.converters.formats.onnx2tf_tool import ONNX2TF_VERSION, Onnx2TfTool, ToolRun
from edgesdk.converters.formats.onnx_model import load_onnx, save_onnx
from edgesdk.converters.planning.data import check_arrays
from edgesdk.converters.quiet import held_output
from edgesdk.errors import ConversionError, DataError, UnsupportedOpError
from edgesdk.files import write_atomic
from edgesdk.runtime.tensors import TensorSpec

__all__ = ["TFLiteInput", "TFLiteResult", "convert_to_tflite", "VARIANTS"]

log = logging.getLogger(__name__)

#: edgesdk's variant name -> the suffix of the file onnx2tf writes for it.
VARIANTS: Mapping[str, str] = {"fp32": "float32", "fp16": "float16", "int8_dynamic": "dynamic_range_quant",
                               "int8_full": "integer_quant"}

#: The newest ONNX IR version onnx2tf's pinned onnxsim 0.4.36 checks (its onnxruntime 1.23 reads 11).
_TOOL_MAX_IR_VERSION = 10
#: For models whose inputs are all 3-channel images, onnx2tf reads this file from its working
#: directory (or downloads it) even with -cind: it guesses layouts from its outputs. edgesdk
#: writes the user's own samples there, NHWC float32; onnx2tf resizes them to the input H x W.
_SAMPLE_IMAGES = "calibration_image_sample_data_20x128x128x3_float32.npy"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class TFLiteInput:
    """How one ONNX input appears in the TFLite models (``None`` marks a dynamic dim)."""

    name: str
    onnx_shape: tuple[int | None, ...]
    tflite_shape: tuple[int | None, ...]
    #: ``tflite_array = onnx_array.transpose(perm)``.
    perm: tuple[int, ...]

    @property
    def layout(self) -> str:
        """``NWC``/``NHWC``/``NDHWC`` when onnx2tf made the input channels-last, else ``as ONNX``."""
        if self.perm == tuple(range(len(self.perm))):
            return "as ONNX"
        return {3: "NWC", 4: "NHWC", 5: "NDHWC"}[len(self.perm)]

    def to_tflite(self, array: np.ndarray) -> np.ndarray:
        """Lay out batch-first ONNX-layout data (e.g. NCHW) as the TFLite input takes it."""
        return np.ascontiguousarray(array.transpose(self.perm))


@dataclass(frozen=True)
class TFLiteResult:
    """The TFLite files made from one ONNX model, how their inputs are laid out, and their FP32 parity."""

    #: Variant name (see :data:`VARIANTS`) -> file in ``out_dir``; only the variants onnx2tf produced.
    models: Mapping[str, Path]
    inputs: tuple[TFLiteInput, ...]
    #: max |TFLite FP32 - ONNX Runtime FP32| over every output on ``eval_inputs``; None without them.
    parity_max_abs_diff: float | None
    log_path: Path
    #: Wall time of the conversion and parity check (not of a first-time tool install).
    seconds: float
    converter: str = f"onnx2tf {ONNX2TF_VERSION}"


def _tf_name(onnx_name: str) -> str:
    """The name onnx2tf gives a tensor in TensorFlow (its ``sanitizing``)."""
    return re.sub("^/", "wa/", onnx_name.replace(":", "__"))


def _channels_last(rank: int) -> tuple[int, ...]:
    """onnx2tf's default input transposition: 3-, 4-, 5-D inputs go channels-last."""
    return (0, *range(2, rank), 1) if 3 <= rank <= 5 else tuple(range(rank))


def _min_ir_version(model: Any) -> int:
    from onnx import helper

    return int(helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True))


def _input_specs(model: Any) -> tuple[TensorSpec, ...]:
    from onnx import helper

    initializers = {i.name for i in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim)
        specs.append(TensorSpec(value.name, shape, np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))))
    return tuple(specs)


def _write_sample_images(work: Path, specs: tuple[TensorSpec, ...], data: Mapping[str, np.ndarray] | None) -> None:
    """Give onnx2tf the 20-image sample file it would otherwise download (see ``_SAMPLE_IMAGES``)."""
    for spec in specs:
        if len(spec.shape) != 4 or spec.shape[1] != 3:
            continue
        if data is not None:
            images = data[spec.name].transpose(0, 2, 3, 1)
        elif spec.shape[2] and spec.shape[3]:
            images = np.random.default_rng(0).random((20, spec.shape[2], spec.shape[3], 3))
        else:
            return  # dynamic H/W: onnx2tf does not read the file
        np.save(work / _SAMPLE_IMAGES, np.resize(images.astype(np.float32), (20, *images.shape[1:])))
        return


def _rename_inputs(data: bytes, specs: tuple[TensorSpec, ...]) -> bytes:
    """Name the TFLite input tensors after the ONNX inputs (onnx2tf calls them ``serving_default_<name>:0``)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as fb

    names = {}
    for spec in specs:
        names[_tf_name(spec.name)] = names[f"serving_default_{_tf_name(spec.name)}:0"] = spec.name
    model = fb.ModelT.InitFromPackedBuf(data, 0)
    graph = model.subgraphs[0]
    for index in graph.inputs:
        tensor = graph.tensors[index]
        current = tensor.name.decode()
        new = names.get(current, specs[0].name if len(specs) == 1 else None)
        if new is None:
            raise ConversionError(f"cannot tell which ONNX input {[s.name for s in specs]} the TFLite input "
                                  f"{current!r} is; rename the ONNX inputs to letters, digits and _ and convert again")
        tensor.name = new.encode()
    builder = flatbuffers.Builder(len(data) + 4096)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _failure(log_text: str, model: Any, run: ToolRun, log_path: Path) -> ConversionError:
    """Turn a failed onnx2tf run into UnsupportedOpError (ops named) or, failing that, ConversionError."""
    text = _ANSI.sub("", log_text)
    nodes: dict[str, list[str]] = {}  # op type -> node names
    # 1. No onnx2tf implementation for the op type.
    for op in re.findall(r"ERROR: (\S+) OP is not yet implemented", text):
        nodes[op] = [n.name or f"<unnamed #{i}>" for i, n in enumerate(model.graph.node) if n.op_type == op]
    # 2. The op's implementation raised; onnx2tf names the node, and logged its type just before.
    for node in re.findall(r"ERROR: onnx_op_name: (\S+)", text):
        typed = re.findall(rf"onnx_op_type: (\S+) onnx_op_name: {re.escape(node)}\s*$", text, re.M)
        op = typed[-1] if typed else next((n.op_type for n in model.graph.node if n.name == node), "unknown")
        nodes.setdefault(op, []).append(node)
    reasons = re.findall(r"^[\w.]+(?:Error|Exception): .*$", text, re.M)
    reason = f" ({reasons[-1].strip()})" if reasons else ""
    if nodes:
        listed = "; ".join(f"{op} (nodes: {', '.join(names) or '?'})" for op, names in nodes.items())
        return UnsupportedOpError(
            f"onnx2tf {ONNX2TF_VERSION} cannot convert ONNX op(s) {listed}{reason}. Replace them in the model (or "
            f"export without them) to get TFLite variants; the ONNX variants are not affected. Log: {log_path}",
            ops=tuple(nodes))
    # 3. TensorFlow ops that onnx2tf emitted but TFLite has no kernel for (e.g. PyFunc from tf.numpy_function).
    custom = sorted({op.strip() for line in re.findall(r"^Custom ops: (.+)$", text, re.M) for op in line.split(",")})
    if custom:
        return UnsupportedOpError(
            f"onnx2tf {ONNX2TF_VERSION} converted the model, but TFLite has no kernel for the TensorFlow op(s) "
            f"{', '.join(custom)} it produced; the ONNX variants are not affected. Log: {log_path}", ops=tuple(custom))
    tail = " | ".join(line.strip() for line in text.strip().splitlines()[-3:])
    return ConversionError(f"`{' '.join(run.command)}` failed (exit {run.returncode}){reason}; log: {log_path}; "
                           f"last lines: {tail}")


def _xnnpack_activations(model: Any) -> int:
    """Rewrite ``model``'s HardSwish and HardSigmoid in place into ops XNNPACK runs in int8; return how many.

    onnx2tf writes HardSigmoid as ``RELU_0_TO_1(x * alpha + beta)`` and HardSwish as
    ``x * relu6(x + 3) / 6``, which the TFLite converter fuses into ``HARD_SWISH``. LiteRT's
    XNNPACK delegate takes neither in int8 (``HARD_SWISH`` only in float, ``RELU_0_TO_1`` not at
    all): each runs in LiteRT's own int8 kernel and cuts the graph into separate XNNPACK
    partitions. A PP-LCNet (30 HardSigmoid) ran 4x slower in full int8 than in FP32 (9.9 ms
    against 2.4 ms on one x86 core). Rewritten as

        HardSwish(x), x * HardSigmoid(x; 1/6, 1/2)  ->  Mul(Mul(x, 1/6), Clip(Add(x, 3), 0, 6))
        HardSigmoid(x; alpha, beta)                 ->  Mul(Clip(Add(Mul(x, 6 alpha), 6 beta), 0, 6), 1/6)

    the Clip becomes a RELU6 fused into the ADD (or the convolution before it), and with the
    1/6 on ``x`` the converter's HARD_SWISH pattern does not match: the same model ran in
    1.7 ms in int8 (one XNNPACK partition) and 2.2 ms in FP32. Models before opset 11 (Clip
    with attributes) are left as they are.
    """
    from onnx import helper, numpy_helper

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    graph = model.graph
    if opset < 11 or not any(n.op_type in ("HardSwish", "HardSigmoid") for n in graph.node):
        return 0
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for tensor in node.input:
            consumers.setdefault(tensor, []).append(node)
    outputs = {o.name for o in graph.output}
    used = {i.name for i in graph.initializer} | {t for n in graph.node for t in (*n.input, *n.output)}
    constants: dict[float, str] = {}

    def constant(value: float) -> str:
        value = float(np.float32(value))
        if value not in constants:
            name = f"edgesdk_xnnpack_{len(constants)}"
            while name in used:
                name += "_"
            used.add(name)
            graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), name))
            constants[value] = name
        return constants[value]

    def fresh(name: str) -> str:
        while name in used:
            name += "_"
        used.add(name)
        return name

    merged: set[int] = set()  # ids of the Muls folded into a HardSwish
    rewritten: list[Any] = []
    count = 0
    for node in graph.node:
        if id(node) in merged:
            continue
        if node.op_type not in ("HardSwish", "HardSigmoid") or node.domain not in ("", "ai.onnx"):
            rewritten.append(node)
            continue
        count += 1
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        x, y, base = node.input[0], node.output[0], node.name or node.output[0]
        alpha = float(np.float32(attrs.get("alpha", 0.2))) if node.op_type == "HardSigmoid" else None
        beta = float(attrs.get("beta", 0.5))
        readers = consumers.get(y, [])
        if node.op_type == "HardSigmoid" and alpha == float(np.float32(1 / 6)) and beta == 0.5 and len(readers) == 1 \
                and y not in outputs and readers[0].op_type == "Mul" and sorted(readers[0].input) == sorted([x, y]):
            merged.add(id(readers[0]))
            y, base = readers[0].output[0], readers[0].name or base
            alpha = None
        if alpha is None:  # HardSwish
            scaled, shifted, clipped = fresh(f"{base}/x_6"), fresh(f"{base}/x_3"), fresh(f"{base}/relu6")
            rewritten += [helper.make_node("Mul", [x, constant(1 / 6)], [scaled], name=fresh(f"{base}/mul_sixth")),
                          helper.make_node("Add", [x, constant(3.0)], [shifted], name=fresh(f"{base}/add_3")),
                          helper.make_node("Clip", [shifted, constant(0.0), constant(6.0)], [clipped],
                                           name=fresh(f"{base}/clip")),
                          helper.make_node("Mul", [scaled, clipped], [y], name=fresh(f"{base}/mul"))]
        else:
            scaled, shifted, clipped = fresh(f"{base}/x_a"), fresh(f"{base}/x_a_b"), fresh(f"{base}/relu6")
            rewritten += [helper.make_node("Mul", [x, constant(6 * alpha)], [scaled], name=fresh(f"{base}/mul_alpha")),
                          helper.make_node("Add", [scaled, constant(6 * beta)], [shifted], name=fresh(f"{base}/add_beta")),
                          helper.make_node("Clip", [shifted, constant(0.0), constant(6.0)], [clipped],
                                           name=fresh(f"{base}/clip")),
                          helper.make_node("Mul", [clipped, constant(1 / 6)], [y], name=fresh(f"{base}/mul_sixth"))]
    del graph.node[:]
    graph.node.extend(rewritten)
    return count


def _layouts(tflite_path: Path, specs: tuple[TensorSpec, ...]) -> tuple[TFLiteInput, ...]:
    """Each input's TFLite shape, checked against onnx2tf's transposition rule."""
    from edgesdk.runtime.backends.litert import import_litert

    details = {d["name"]: d for d in import_litert().interpreter(model_path=str(tflite_path)).get_input_details()}
    inputs = []
    for spec in specs:
        tflite_shape = tuple(None if d < 0 else int(d) for d in details[spec.name]["shape_signature"])
        perm = _channels_last(len(spec.shape))
        expected = tuple(spec.shape[p] for p in perm)
        if len(tflite_shape) != len(expected) or any(e is not None and e != t for e, t in zip(expected, tflite_shape)):
            raise ConversionError(f"onnx2tf made input {spec.name!r} {list(tflite_shape)} from ONNX {list(spec.shape)}; "
                                  f"edgesdk expected {list(expected)} and cannot feed it")
        inputs.append(TFLiteInput(spec.name, spec.shape, tflite_shape, perm))
    return tuple(inputs)


def _parity(onnx_path: Path, tflite_path: Path, inputs: tuple[TFLiteInput, ...],
            eval_inputs: Mapping[str, np.ndarray]) -> float:
    """max |TFLite - ONNX Runtime| over all outputs, in batches the TFLite model takes."""
    import onnxruntime as ort

    from edgesdk.runtime.backends.litert import import_litert

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    output_names = [o.name for o in session.get_outputs()]
    by_tf_name = {_tf_name(n): n for n in output_names}
    runner = _runner(import_litert().interpreter(model_path=str(tflite_path)), inputs, output_names)
    n = len(eval_inputs[inputs[0].name])
    step = inputs[0].tflite_shape[0] or n  # a static TFLite batch (often 1) is run chunk by chunk
    if n % step:
        raise DataError(f"the TFLite model takes batches of {step}; give a multiple of {step} evaluation samples, "
                        f"not {n}")
    worst = 0.0
    for start in range(0, n, step):
        feeds = {i.name: eval_inputs[i.name][start:start + step] for i in inputs}
        expected = dict(zip(output_names, session.run(None, feeds)))
        got = runner(**{_tf_name(i.name): i.to_tflite(feeds[i.name]) for i in inputs})
        for key, value in got.items():
            if key not in by_tf_name:
                raise ConversionError(f"the TFLite FP32 model has output {key!r}, which is no ONNX output "
                                      f"({output_names}); cannot check parity")
            reference = expected[by_tf_name[key]]
            if reference.shape != value.shape:  # onnx2tf may leave an output channels-last
                reference = reference.transpose(_channels_last(reference.ndim))
            if reference.shape != value.shape:
                raise ConversionError(f"TFLite output {key!r} has shape {value.shape}, ONNX Runtime's "
                                      f"{expected[by_tf_name[key]].shape}; cannot check parity")
            worst = max(worst, float(np.max(np.abs(value.astype(np.float64) - reference), initial=0.0)))
    return worst


def _runner(interpreter: Any, inputs: tuple[TFLiteInput, ...],
            output_names: list[str]) -> Callable[..., dict[str, np.ndarray]]:
    """Call the model as ``runner(**{tf input name: array}) -> {tf output name: array}``.

    Through its SignatureDef when it has one; onnx2tf writes some models without any (PP-OCRv4's
    text detector), and LiteRT's signature runner then refuses to start, so those run through
    the interpreter's own tensors, matched by name (or by position when there is one of each).
    """
    if interpreter.get_signature_list():
        return cast("Callable[..., dict[str, np.ndarray]]", interpreter.get_signature_runner())
    interpreter.allocate_tensors()
    ins, outs = interpreter.get_input_details(), interpreter.get_output_details()

    def matched(details: list[dict[str, Any]], names: list[str], what: str) -> dict[str, int]:
        found = {}
        for name in names:
            hits = [d["index"] for d in details if name in d["name"]]
            if len(hits) != 1 and len(details) == len(names) == 1:
                hits = [details[0]["index"]]
            if len(hits) != 1:
                raise ConversionError(
                    f"the TFLite FP32 model has no SignatureDef and its {what} tensors "
                    f"{[d['name'] for d in details]} do not name {name!r} once; cannot check parity")
            found[name] = hits[0]
        return found

    by_input = matched(ins, [_tf_name(i.name) for i in inputs], "input")
    by_output = matched(outs, [_tf_name(n) for n in output_names], "output")

    def run(**feeds: np.ndarray) -> dict[str, np.ndarray]:
        for name, value in feeds.items():
            interpreter.set_tensor(by_input[name], value)
        interpreter.invoke()
        return {name: interpreter.get_tensor(index) for name, index in by_output.items()}

    return run


def convert_to_tflite(
    onnx_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    calibration: Mapping[str, np.ndarray] | None = None,
    eval_inputs: Mapping[str, np.ndarray] | None = None,
    tool: Onnx2TfTool | None = None,
    timeout_s: float = 1800,
) -> TFLiteResult:
    """Convert an ONNX model to the TFLite variants described in the module docstring.

    ``calibration`` and ``eval_inputs`` map ONNX input names to batch-first arrays in the
    ONNX layout and dtype (NCHW images stay NCHW; edgesdk transposes them for TFLite).
    ``calibration`` enables ``int8_full``; ``eval_inputs`` enables the FP32 parity check.
    The tool environment is installed first if needed (see :class:`Onnx2TfTool`).

    Raises :class:`UnsupportedOpError` naming the ONNX op types and nodes onnx2tf cannot
    convert, :class:`DataError` for data that does not fit the model, and
    :class:`ConversionError` for any other failure (with the onnx2tf log's path).
    """
    tool = (tool or Onnx2TfTool()).ensure()
    started = time.perf_counter()
    onnx_path, out = Path(onnx_path), Path(out_dir)
    model = load_onnx(onnx_path)
    specs = _input_specs(model)
    if calibration is not None:
        calibration = check_arrays(calibration, specs, "calibration data")
    if eval_inputs is not None:
        eval_inputs = check_arrays(eval_inputs, specs, "evaluation data")
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "onnx2tf.log"
    models: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="edgesdk-onnx2tf-") as tmp:
        work = Path(tmp)
        # Newer onnx packages stamp a newer IR version than the opsets need; the tool's older stack refuses those.
        model.ir_version = min(model.ir_version, max(_TOOL_MAX_IR_VERSION, _min_ir_version(model)))
        if _xnnpack_activations(model):
            log.info("HardSwish/HardSigmoid rewritten for XNNPACK's int8 kernels before onnx2tf")
        save_onnx(model, work / "model.onnx")  # a copy: onnx2tf's onnxsim step rewrites its input in place
        args = ["-i", "model.onnx", "-o", "out", "-osd", "-odrqt"]
        if calibration is not None:
            args.append("-oiqt")
            for i, spec in enumerate(specs):
                np.save(work / f"calibration_{i}.npy", calibration[spec.name].transpose(_channels_last(len(spec.shape))))
                args += ["-cind", _tf_name(spec.name), f"calibration_{i}.npy", "0", "1"]  # mean 0, std 1: as given
        _write_sample_images(work, specs, calibration if calibration is not None else eval_inputs)
        run = tool.run(args, work, timeout_s)
        log_text = run.log_path.read_text(errors="replace")
        write_atomic(log_path, log_text.encode())
        if run.returncode != 0 or not (work / "out" / "model_float32.tflite").exists():
            raise _failure(log_text, model, run, log_path)
        for variant, suffix in VARIANTS.items():
            produced = work / "out" / f"model_{suffix}.tflite"
            if produced.exists():
                models[variant] = write_atomic(out / f"model_{variant}.tflite",
                                                _rename_inputs(produced.read_bytes(), specs))
            elif variant != "int8_full" or calibration is not None:
                log.warning("onnx2tf did not produce the %s variant; see %s", variant, log_path)
    with held_output("checking the TFLite model against ONNX Runtime"):
        inputs = _layouts(models["fp32"], specs)
        parity = _parity(onnx_path, models["fp32"], inputs, eval_inputs) if eval_inputs is not None else None
    return TFLiteResult(models, inputs, parity, log_path, time.perf_counter() - started)
