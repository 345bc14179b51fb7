"""Runs one model under qemu-user for :mod:`edgesdk.converters.board.emulate`: one warm-up, then two marked windows.

Executed by the emulated interpreter, which has numpy, onnxruntime and ai-edge-litert but not
edgesdk, so this file imports nothing else. Usage::

    python _guest_count.py MODEL INPUTS.npz RUNS [OPTIMIZED.onnx]

Single-threaded, so a count is one core's work. Between the marks (``syscall(4242, tag)``,
seen by the counting plugin) only ``run``/``invoke`` calls happen: ``RUNS`` of them in each of
the two windows. Prints one JSON line: the backend and its version.

A model the runtime here cannot load or run (the board's own build, which may reject what this
host's accepts) exits :data:`BOARD_ERROR_EXIT` with one stderr line ``edgesdk-board-error: TYPE:
MESSAGE``: the converter then rejects that variant, naming the error. An error in the counted runs
is reported the same way (after the first mark). With ``EDGESDK_GUEST_OUTPUTS`` set, the first
run's first output is saved there (``.npy``): the converter compares the board's answer with this
host's before it writes a bundle.

**Test-only fault hook.** ``EDGESDK_GUEST_FAULT=KIND:WHICH[,KIND:WHICH...]`` makes the run of
the model whose file name is ``WHICH``, or whose SHA-256 starts with ``WHICH`` (8 hex digits or
more), fail for real inside its counted window (after the first mark): ``segv`` reads the
unmapped first page (a genuine SIGSEGV of the emulated process, as a native kernel crash would
be), ``hang`` blocks forever reading a pipe nobody writes (as a kernel that loops would, until
the host's timeout). It exists so that tests can show the converter vetoing one crashing or
hanging variant and keeping the others; nothing in edgesdk sets it.
"""

import ctypes
import hashlib
import json
import os
import sys

import numpy as np

MARK = 4242
#: Exit status of a model the runtime refused (see the module doc).
BOARD_ERROR_EXIT = 3
BOARD_ERROR = "edgesdk-board-error: "


def main() -> None:
    """Load the model, warm up, count two windows of RUNS inferences between marks, print the backend."""
    model, inputs_path, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    optimized = sys.argv[4] if len(sys.argv) > 4 else None
    inputs = dict(np.load(inputs_path))
    try:
        run, backend, first_output = (_litert(model, inputs) if model.endswith(".tflite") else
                                      _onnxruntime(model, inputs, optimized))
        run()
        if os.environ.get("EDGESDK_GUEST_OUTPUTS"):
            np.save(os.environ["EDGESDK_GUEST_OUTPUTS"], np.asarray(first_output()))
    except Exception as exc:  # the board's runtime refused the model: say so in one line the host can read
        message = " ".join(str(exc).split())
        sys.stderr.write(f"{BOARD_ERROR}{type(exc).__name__}: {message}\n")
        sys.exit(BOARD_ERROR_EXIT)
    libc = ctypes.CDLL(None, use_errno=True)
    fault = _fault(model)
    try:
        for tag in range(3):
            libc.syscall(MARK, tag)
            if tag == 0 and fault:
                _fail(fault)
            if tag < 2:
                for _ in range(runs):
                    run()
    except Exception as exc:  # the board's runtime failed while counted: the same one line
        message = " ".join(str(exc).split())
        sys.stderr.write(f"{BOARD_ERROR}{type(exc).__name__} in the counted runs: {message}\n")
        sys.exit(BOARD_ERROR_EXIT)
    print(json.dumps(backend))


def _fault(model):  # type: ignore[no-untyped-def]
    """The test-only fault EDGESDK_GUEST_FAULT asks for this model (see the module doc), or None."""
    asked = os.environ.get("EDGESDK_GUEST_FAULT", "")
    wanted = [item.split(":", 1) for item in asked.split(",") if ":" in item]
    if not wanted:
        return None
    name = os.path.basename(model)
    if any(which == name for _, which in wanted):
        return next(kind for kind, which in wanted if which == name)
    with open(model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    return next((kind for kind, which in wanted if len(which) >= 8 and sha.startswith(which)), None)


def _fail(kind):  # type: ignore[no-untyped-def]
    sys.stderr.flush()
    if kind == "segv":
        ctypes.string_at(8, 1)  # the unmapped first page: SIGSEGV (string_at(0) reads nothing)
    elif kind == "hang":
        read_end, _ = os.pipe()
        os.read(read_end, 1)  # nobody writes: blocks until killed
    raise RuntimeError(f"EDGESDK_GUEST_FAULT: unknown kind {kind!r} (segv or hang)")


def _onnxruntime(model, inputs, optimized):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    if optimized:
        options.optimized_model_filepath = optimized
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    first = session.get_outputs()[0].name
    return ((lambda: session.run(None, inputs)), {"backend": "onnxruntime", "version": ort.__version__},
            lambda: session.run([first], inputs)[0])


def _litert(model, inputs):  # type: ignore[no-untyped-def]
    from ai_edge_litert import __version__ as version
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=model, num_threads=1)  # XNNPACK is LiteRT's default CPU delegate
    interpreter.allocate_tensors()
    litert_feed(interpreter, inputs)
    output = interpreter.get_output_details()[0]["index"]
    return interpreter.invoke, {"backend": "litert", "version": version}, lambda: interpreter.get_tensor(output)


def litert_feed(interpreter, inputs):  # type: ignore[no-untyped-def]
    """Set ``inputs`` on a LiteRT interpreter: NCHW arrays moved to NHWC where the model takes that, quantized for a
    full-integer model's input (also used by ``_guest_outputs.py``)."""
    details = interpreter.get_input_details()
    by_name = {d["name"]: d for d in details}
    for i, (name, value) in enumerate(inputs.items()):
        detail = by_name.get(name, details[i])
        shape = tuple(detail["shape"])
        if value.shape != shape and value.ndim == 4 and value.transpose(0, 2, 3, 1).shape == shape:
            value = value.transpose(0, 2, 3, 1)  # onnx2tf's models take NHWC
        scale, zero_point = detail["quantization"]
        if scale and np.issubdtype(detail["dtype"], np.integer):  # a full-integer model's quantized input
            limits = np.iinfo(detail["dtype"])
            value = np.clip(np.round(value / scale + zero_point), limits.min, limits.max)
        interpreter.set_tensor(detail["index"], np.ascontiguousarray(value, dtype=detail["dtype"]))


if __name__ == "__main__":
    main()
