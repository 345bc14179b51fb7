"""Planning the engine that will run: a board's GPU through ONNX Runtime's TensorRT and CUDA providers.

On a Jetson, :class:`~edgesdk.Runtime` takes the TensorRT (else CUDA) provider whenever the
board's onnxruntime has it, so a plan made on the CPU cores describes a run that will not
happen. :func:`accelerator_candidates` adds, for a profile whose accelerator lists those
providers and its data-sheet ceilings (``peak_tflops``, ``memory_gbps``), one candidate per
engine each ONNX variant can be built into:

* ``onnx-fp32`` -> **TensorRT fp32** (TF32 on Ampere) and the **CUDA fallback** (the provider a
  build without TensorRT uses: every node its own kernel, nothing fused);
* ``onnx-fp16`` -> **TensorRT fp16** (``trt_fp16_enable``);
* QDQ int8 (``onnx-int8-static-*``, ``onnx-mixed-*``) -> **TensorRT int8** by explicit
  quantization (``trt_int8_enable``, the converter's scales): the nodes fed by a
  DequantizeLinear run at int8, the float blocks of a mixed variant at fp32. Only where the
  accelerator lists an int8 peak (Maxwell, the Jetson Nano's GPU, has no INT8 path);
* int8 dynamic and TFLite variants: none (TensorRT has no dynamic quantization; the LiteRT
  GPU delegate is not costed).

The CPU variants stay candidates; the planner weighs both and the table shows where each runs.

**Latency**: measured on the board (``--measure-on``) when the board's runtime ran that file
on the accelerator, else the roofline estimate of :mod:`.gpu_estimate` at each power mode's
GPU clock, labelled ``estimated GPU roofline (<engine>)``. **Energy**: the accelerator's
``active_watts`` in the mode times the latency. **Accuracy**: the drop of the same file measured
with this host's CPU kernels (same weights and scales); TensorRT's own kernels are checked on the
device by the bundle's health check, which the agent's install runs (and which builds the engine).
**Memory**: the file's measurement on this host (Jetson memory is shared by CPU and GPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.converters.board.gpu_estimate import EngineCost, node_costs, with_shapes
from edgesdk.converters.planning.planner import Candidate, estimate_on_board
from edgesdk.runtime.backends.tensorrt import CUDA_PROVIDER, GPU_PROVIDERS, TRT_PROVIDER
from edgesdk.runtime.profiles import Accelerator, DeviceProfile

__all__ = ["planned_accelerator", "engine_costs", "accelerator_candidates"]

#: The TensorRT engine precision each variant precision is built into.
_TRT_PRECISION = {"fp32": "fp32", "fp16": "fp16", "int8_static": "int8", "mixed": "int8"}
_SUFFIX = {TRT_PROVIDER: "tensorrt", CUDA_PROVIDER: "cuda"}


def planned_accelerator(board: DeviceProfile) -> Accelerator | None:
    """The board's accelerator the planner costs: the first with a TensorRT or CUDA provider and data-sheet ceilings."""
    for acc in board.accelerators:
        if acc.peak_tflops and acc.memory_gbps and set(GPU_PROVIDERS) & set(acc.onnxruntime_providers):
            return acc
    return None


def engine_costs(path: Path, precision: str, accelerator: Accelerator,
                 shapes: Mapping[str, tuple[int, ...]]) -> list[EngineCost]:
    """The engines the variant at ``path`` (of ``precision``) can be built into on ``accelerator`` (module doc), with
    its nodes' costs at the input ``shapes`` (one sample)."""
    import onnx

    from edgesdk.converters.formats.onnx_model import fix_input_shapes

    providers = accelerator.onnxruntime_providers
    trt = _TRT_PRECISION.get(precision)
    if trt == "int8" and "int8" not in accelerator.peak_tflops:
        trt = None
    wanted = [p for p in providers if (p == TRT_PROVIDER and trt) or (p == CUDA_PROVIDER and precision == "fp32")]
    if not wanted:
        return []
    model = with_shapes(fix_input_shapes(onnx.load(str(path)), shapes))  # once for every engine and precision
    engines = []
    for provider in wanted:
        if provider == TRT_PROVIDER:
            assert trt is not None
            engines.append(EngineCost(accelerator.name, f"TensorRT {trt}", provider, _groups(model, trt)))
        else:
            engines.append(EngineCost(accelerator.name, "CUDA fp32", provider,
                                      (("fp32", tuple(node_costs(model, "fp32", fuse=False, shaped=True))),)))
    return engines


def _groups(model: Any, precision: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """Nodes of ``model`` (shapes inferred) by the precision TensorRT runs them at: for int8, the nodes whose data input
    a DequantizeLinear produces (explicit quantization), the others at fp32."""
    if precision != "int8":
        return ((precision, tuple(node_costs(model, precision, shaped=True))),)
    dequantized = {out for node in model.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    quantized = [bool(node.input) and node.input[0] in dequantized for node in model.graph.node]
    at_int8, at_fp32 = node_costs(model, "int8", shaped=True), node_costs(model, "fp32", shaped=True)
    return (("int8", tuple(c for c, q in zip(at_int8, quantized) if q)),
            ("fp32", tuple(c for c, q in zip(at_fp32, quantized) if not q)))


def accelerator_candidates(cpu: Iterable[Candidate], board: DeviceProfile, mode: str,
                           sample: Mapping[str, np.ndarray]) -> list[Candidate]:
    """One candidate per (ONNX variant, engine) the board's accelerator can run (module doc); [] without one.

    ``sample`` (one row per input) gives the shapes the roofline is costed at. A variant the board measured through
    the fleet (``--measure-on``) with one of these providers keeps that figure for that engine.
    """
    acc = planned_accelerator(board)
    if acc is None:
        return []
    shapes = {name: tuple(np.asarray(value).shape) for name, value in sample.items()}
    made = []
    for c in cpu:
        if c.format != "onnx":
            continue
        m = c.measurement
        for engine in engine_costs(Path(c.path), c.precision, acc, shapes):
            measured = m.latency_p50_ms if m.measured_on != "this host" and m.accelerator == engine.provider else None
            estimate = estimate_on_board(m.latency_p50_ms, board, 1, board, mode, measured_ms=measured, engine=engine,
                                         measured_energy_mj=m.energy_mj if measured is not None else None,
                                         measured_energy_basis=m.energy_basis)
            made.append(replace(
                c, name=f"{c.name}+{_SUFFIX[engine.provider]}", estimate=estimate, accelerator=acc.name,
                engine=engine.engine, provider=engine.provider, power=None, chosen=False,
                notes=(*c.notes, f"accuracy of this file on this host's CPU; {engine.engine} kernels are checked by "
                                 "the health check the device's install runs")))
    return made
