"""Runs one model on a range of evaluation samples under qemu-user for
:mod:`edgesdk.converters.board.board_outputs`.

Executed by the emulated interpreter, which has numpy, onnxruntime and ai-edge-litert but not
edgesdk, so this file imports nothing of edgesdk (only its sibling guest script, for LiteRT's input
feeding and the error protocol).
Usage::

    python _guest_outputs.py MODEL INPUTS.npz OUTPUT.npy

Single-threaded; every row of the inputs is one sample, run alone (batch 1, as this host's
measurement runs a model with a fixed batch). After each sample one line ``edgesdk-sample N`` is
printed (the host's progress and its no-progress timeout); at the end the first output of every
sample, concatenated along the batch axis, is saved to ``OUTPUT.npy``. A model the runtime cannot
load or run exits ``BOARD_ERROR_EXIT`` with one stderr line ``edgesdk-board-error: TYPE: MESSAGE``,
as ``_guest_count.py`` does.
"""

import sys

import numpy as np

# The sibling guest script: the guest runs this file by path, so its folder is on sys.path.
from _guest_count import (  # type: ignore[import-not-found]
    BOARD_ERROR,
    BOARD_ERROR_EXIT,
    litert_feed,
)


def main() -> None:
    """Run every sample, print progress, save the first outputs."""
    model, inputs_path, output_path = sys.argv[1], sys.argv[2], sys.argv[3]
    inputs = dict(np.load(inputs_path))
    count = len(next(iter(inputs.values())))
    try:
        run = _litert(model) if model.endswith(".tflite") else _onnxruntime(model)
        outputs = []
        for n in range(count):
            outputs.append(np.asarray(run({k: v[n : n + 1] for k, v in inputs.items()})))
            sys.stdout.write(f"edgesdk-sample {n}\n")
            sys.stdout.flush()
    except (
        Exception
    ) as exc:  # the board's runtime refused the model: say so in one line the host can read
        message = " ".join(str(exc).split())
        sys.stderr.write(f"{BOARD_ERROR}{type(exc).__name__}: {message}\n")
        sys.exit(BOARD_ERROR_EXIT)
    np.save(output_path, np.concatenate(outputs))


def _onnxruntime(model):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    first = session.get_outputs()[0].name
    return lambda feeds: session.run([first], feeds)[0]


def _litert(model):  # type: ignore[no-untyped-def]
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(
        model_path=model, num_threads=1
    )  # XNNPACK, LiteRT's default CPU delegate
    interpreter.allocate_tensors()
    output = interpreter.get_output_details()[0]["index"]

    def run(feeds):  # type: ignore[no-untyped-def]
        litert_feed(interpreter, feeds)
        interpreter.invoke()
        return interpreter.get_tensor(output)

    return run


if __name__ == "__main__":
    main()
